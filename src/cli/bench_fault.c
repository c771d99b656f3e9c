/* dtrain bench fault: what fault tolerance costs.
 *  - recovery: a 2-worker elastic MLP job; a worker is killed with SIGKILL mid-run; the time from
 *    the kill to "training again" (first step of the restarted job) is measured from the job's
 *    own output lines, several times;
 *  - checkpoint overhead: samples/s of the MLP (batch 32, one worker) with and without a
 *    checkpoint every ~1 second (--checkpoint-every sized from the measured step rate),
 *    interleaved runs, as a ratio.
 * Prints a table and one JSON line. */
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A child process of pid `parent` (first found in /proc), or -1. */
static pid_t child_of(pid_t parent) {
    DIR *d = opendir("/proc");
    if (!d) return -1;
    struct dirent *e;
    pid_t found = -1;
    while (found < 0 && (e = readdir(d))) {
        char path[300], buf[512];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *rp = strrchr(buf, ')');
        int ppid;
        if (rp && sscanf(rp + 2, "%*c %d", &ppid) == 1 && ppid == parent) found = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return found;
}

/* One recovery trial: returns seconds from the kill to the restarted job's first step (or < 0). */
static double recovery_trial(const char *exe, const char *dir, double kill_after, double *detect_s) {
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        execl(exe, exe, "train", "--workers", "2", "--elastic", "1:2", "--model", "mlp", "--batch", "16", "--epochs",
              "50", "--checkpoint-dir", dir, "--checkpoint-every", "200", "--keep", "2", "--quiet", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    double t0 = dt_now(), t_kill = -1, t_back = -1;
    *detect_s = -1;
    char buf[8192];
    size_t have = 0;
    while (t_back < 0 && dt_now() - t0 < 60) {
        if (t_kill < 0 && dt_now() - t0 >= kill_after) {
            pid_t w = child_of(pid);
            if (w > 0 && kill(w, SIGKILL) == 0) t_kill = dt_now();
        }
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (poll(&p, 1, 20) <= 0) continue;
        ssize_t got = read(pfd[0], buf + have, sizeof buf - 1 - have);
        if (got <= 0) break;
        have += (size_t)got;
        buf[have] = '\0';
        char *nl;
        while ((nl = strchr(buf, '\n'))) {
            *nl = '\0';
            if (t_kill > 0 && *detect_s < 0 && strstr(buf, "killed by signal")) *detect_s = dt_now() - t_kill;
            if (t_kill > 0 && strstr(buf, "training again")) t_back = dt_now();
            size_t rest = have - (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, rest);
            have = rest;
            buf[have] = '\0';
        }
        if (have == sizeof buf - 1) have = 0;
    }
    kill(pid, SIGTERM);
    char drain[4096];
    while (read(pfd[0], drain, sizeof drain) > 0) {}
    close(pfd[0]);
    waitpid(pid, NULL, 0);
    return t_back > 0 ? t_back - t_kill : -1;
}

static const char USAGE[] =
    "Usage: dtrain bench fault [--trials N] [--runs N]\n\n"
    "Recovery time of an elastic 2-worker job after a worker is killed (kill -> training again),\n"
    "and the samples/s cost of a checkpoint every second on the MLP (batch 32, one worker).";

int dt_bench_fault(int argc, char **argv) {
    int trials = 3, runs = 3;
    const dt_flag flags[] = {
        {"trials", DT_FLAG_INT, &trials, "N", "recovery trials"},
        {"runs", DT_FLAG_INT, &runs, "N", "interleaved runs with and without checkpoints"},
    };
    int rc = dt_flags_parse(argc, argv, 1, flags, 2, USAGE, NULL, 0, NULL, NULL);
    if (rc) return rc < 0 ? 2 : 0;
    char exe[PATH_MAX];
    if (dt_bench_self(exe, sizeof exe)) return 1;
    char dir[] = "/tmp/dtrain-bench-fault-XXXXXX";
    if (!mkdtemp(dir)) return dt_cli_fail(NULL, "bench fault: cannot create a temporary directory");
    char cmd[PATH_MAX + 64];

    printf("# dtrain bench fault: recovery of a 2-worker elastic MLP job after kill -9 of a worker\n");
    dt_bench_print_machine();
    dt_bench_warn_cores(2);
    printf("%-6s %12s %12s\n", "trial", "detect_s", "recovery_s");
    double best = 1e9, sum = 0;
    int ok = 0;
    for (int i = 0; i < trials && i < 32; i++) {
        char d[PATH_MAX];
        snprintf(d, sizeof d, "%s/rec%d", dir, i);
        double det = -1;
        double r = recovery_trial(exe, d, 1.5 + 0.3 * i, &det);
        printf("%-6d %12.3f %12.3f\n", i + 1, det, r);
        fflush(stdout);
        if (r > 0) ok++, sum += r, best = r < best ? r : best;
    }

    printf("# checkpoint overhead: mlp, batch 32, 1 worker, 6 epochs; a checkpoint every ~1 s vs none\n");
    char line[4096], metrics[PATH_MAX], args[PATH_MAX + 256];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    if (dt_bench_train_run("--model mlp --batch 32 --epochs 6", metrics, line, sizeof line)) return 1;
    double rate = dt_bench_json_field(line, "samples_per_s");
    long every = (long)(rate / 32.0); /* steps per second */
    if (every < 1) every = 1;
    /* interleaved pairs (without, with): one overhead per pair, so the spread shows the noise */
    double with = 0, without = 0, ov[64], ov_sum = 0, ov_sq = 0, ov_min = 1e9, ov_max = -1e9;
    if (runs > 64) runs = 64;
    for (int i = 0; i < runs; i++) {
        if (dt_bench_train_run("--model mlp --batch 32 --epochs 6", metrics, line, sizeof line)) return 1;
        double a = dt_bench_json_field(line, "samples_per_s");
        snprintf(args, sizeof args,
                 "--model mlp --batch 32 --epochs 6 --checkpoint-dir '%s/ck%d' --checkpoint-every %ld", dir, i, every);
        if (dt_bench_train_run(args, metrics, line, sizeof line)) return 1;
        double b = dt_bench_json_field(line, "samples_per_s");
        without += a, with += b;
        ov[i] = 100.0 * (a - b) / a;
        ov_sum += ov[i], ov_sq += ov[i] * ov[i];
        ov_min = ov[i] < ov_min ? ov[i] : ov_min, ov_max = ov[i] > ov_max ? ov[i] : ov_max;
    }
    with /= runs, without /= runs;
    double ov_mean = ov_sum / runs, ov_sd = runs > 1 ? sqrt((ov_sq - runs * ov_mean * ov_mean) / (runs - 1)) : 0;
    int written = 0; /* checkpoints of the last run with them, the final one included */
    snprintf(args, sizeof args, "%s/ck%d", dir, runs - 1);
    DIR *d = opendir(args);
    for (struct dirent *e; d && (e = readdir(d));) written += strstr(e->d_name, ".safetensors") != NULL;
    if (d) closedir(d);
    printf("%-28s %12.0f samples/s\n", "no checkpoints", without);
    printf("%-28s %12.0f samples/s (every %ld steps, %d checkpoints per run)\n", "checkpoint every ~1 s", with, every,
           written);
    printf("%-28s %11.2f%% +- %.2f (sd over %d pairs; min %.2f, max %.2f)\n", "overhead", ov_mean, ov_sd, runs, ov_min,
           ov_max);
    if (runs > 1 && fabs(ov_mean) < 2 * ov_sd / sqrt(runs))
        printf("# the overhead is within the noise of this machine (|mean| < 2 standard errors)\n");
    printf("{\"bench\": \"fault\", \"recovery_s\": {\"trials\": %d, \"mean\": %.3f, \"best\": %.3f}, "
           "\"checkpoint\": {\"every_steps\": %ld, \"per_run\": %d, \"samples_per_s_without\": %.1f, "
           "\"samples_per_s_with\": %.1f, "
           "\"overhead_pct\": %.2f, \"overhead_pct_sd\": %.2f, \"overhead_pct_min\": %.2f, \"overhead_pct_max\": %.2f, "
           "\"pairs\": %d}}\n",
           ok, ok ? sum / ok : -1.0, ok ? best : -1.0, every, written, without, with, ov_mean, ov_sd, ov_min, ov_max,
           runs);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench fault: could not remove %s\n", dir);
    return ok == trials ? 0 : 1;
}
