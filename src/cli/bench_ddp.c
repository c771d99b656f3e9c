/* dtrain bench ddp: data-parallel training throughput on the real data set for 1, 2 and 4
 * local workers (MLP at per-worker batch 32 and 128, CNN at 128), with each step split into
 * compute, communication wait and data wait, as a table and one JSON line. Each case runs the
 * real `dtrain train --workers N` command and reads its metrics. Beside the wall-clock rate it
 * reports the CPU time per sample of all processes of the run (every rank and thread), which a
 * shared machine's load barely moves: a second, shorter run of the case is subtracted, so
 * start-up, data decoding and evaluation cancel and only the training steps remain. */
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

typedef struct {
    double sps, compute_ms, comm_ms, data_ms;
    double cpu_us; /* CPU microseconds per trained sample, all ranks and threads */
} ddp_result;

/* CPU seconds (user + system) of the waited-for children so far: every rank of a run, since
 * each process waits for its own children */
static double children_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec * 1e-6;
}

/* One `dtrain train` run of `steps` steps: its last metrics line and the CPU seconds it took. */
static const char *g_strategy; /* --strategy SPEC passed to every run, or NULL */

static int train_once(const char *data, const char *model, int batch, int workers, int steps, const char *dir,
                      char *line, size_t cap, double *cpu_s) {
    char metrics[PATH_MAX], args[1024];
    snprintf(metrics, sizeof metrics, "%s/bench-%s-%d-%d.jsonl", dir, model, batch, workers);
    int an = snprintf(args, sizeof args, "--data '%s' --model %s --batch %d --workers %d --max-steps %d --epochs 1000",
                      data, model, batch, workers, steps);
    if (g_strategy && workers > 1) snprintf(args + an, sizeof args - (size_t)an, " --strategy '%s'", g_strategy);
    double c0 = children_cpu_s();
    int rc = dt_bench_train_run(args, metrics, line, cap);
    *cpu_s = children_cpu_s() - c0;
    return rc;
}

static int run_case(const char *data, const char *model, int batch, int workers, int steps, const char *dir,
                    ddp_result *r) {
    char line[4096];
    const int short_steps = steps / 5 > 10 ? steps / 5 : 10;
    double cpu_short, cpu_full;
    if (train_once(data, model, batch, workers, short_steps, dir, line, sizeof line, &cpu_short)) return 1;
    if (train_once(data, model, batch, workers, steps, dir, line, sizeof line, &cpu_full)) return 1;
    r->cpu_us = (cpu_full - cpu_short) * 1e6 / ((double)(steps - short_steps) * batch * workers);
    r->sps = dt_bench_json_field(line, "samples_per_s");
    r->compute_ms = dt_bench_json_field(line, "compute");
    r->comm_ms = dt_bench_json_field(line, "comm_wait");
    r->data_ms = dt_bench_json_field(line, "data_wait");
    return r->sps > 0 ? 0 : dt_cli_fail(NULL, "bench ddp: unreadable metrics line '%s'", line);
}

static const char USAGE[] =
    "Usage: dtrain bench ddp [--data DIR] [--workers LIST] [--seconds S] [--model NAME] [--strategy SPEC]\n\n"
    "Data-parallel throughput of `dtrain train --workers N` on the real data set: MLP at per-worker\n"
    "batch 32 and 128, CNN at 128; samples/s over all workers, speed-up over 1 worker, the\n"
    "per-step time split (compute, communication wait, data wait) of rank 0, and the CPU time per\n"
    "sample of all ranks and threads (cpu_us) with the speed-up it allows where every rank has a\n"
    "core of its own (cpu_scaling = workers x cpu_us(1 worker) / cpu_us; idle waits not counted),\n"
    "which the load of a shared machine barely moves. --strategy gives the runs of 2 or more workers a\n"
    "strategy spec (default: ddp's own), e.g. --strategy 'ddp(zero=1)'.";

int dt_bench_ddp(int argc, char **argv) {
    const char *data = "fashion-mnist", *workers_list = "1,2,4", *only = NULL;
    float seconds = 2;
    const dt_flag flags[] = {
        {"data", DT_FLAG_STR, &data, "DIR", "data set"},
        {"workers", DT_FLAG_STR, &workers_list, "LIST", "comma-separated worker counts"},
        {"seconds", DT_FLAG_FLOAT, &seconds, "S", "approximate training time per case"},
        {"model", DT_FLAG_STR, &only, "NAME", "only the cases of this model (mlp or cnn)"},
        {"strategy", DT_FLAG_STR, &g_strategy, "SPEC", "strategy spec of the multi-worker runs (default ddp)"},
    };
    int rc = dt_flags_parse(argc, argv, 1, flags, 5, USAGE, NULL, 0, NULL, NULL);
    if (rc) return rc < 0 ? 2 : 0;
    char dir[] = "/tmp/dtrain-bench-XXXXXX";
    if (!mkdtemp(dir)) return dt_cli_fail(NULL, "bench ddp: cannot create a temporary directory");
    int workers[8], nw = 0;
    for (const char *p = workers_list; *p && nw < 8;) {
        workers[nw++] = atoi(p);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    /* rough single-worker rates so each case runs about `seconds` */
    const struct {
        const char *model;
        int batch;
        double rate;
    } cases[] = {{"mlp", 32, 120000}, {"mlp", 128, 180000}, {"cnn", 128, 2400}};
    printf("# dtrain bench ddp: data %s, shm transport, %s, adam; samples/s over all workers\n", data,
           g_strategy ? g_strategy : "ddp");
    dt_bench_print_machine();
    for (int w = 0; w < nw; w++) dt_bench_warn_cores(workers[w]);
    printf("%-5s %6s %8s %12s %8s %11s %11s %11s %9s %11s\n", "model", "batch", "workers", "samples/s", "speedup",
           "compute_ms", "commwait_ms", "datawait_ms", "cpu_us", "cpu_scaling");
    char json[4096];
    int jn = snprintf(json, sizeof json, "{\"bench\": \"ddp\", \"cases\": [");
    int status = 0, done = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases && !status; c++) {
        if (only && strcmp(only, cases[c].model)) continue;
        double base = 0, base_cpu = 0;
        for (int w = 0; w < nw && !status; w++) {
            int steps = (int)(seconds * cases[c].rate / cases[c].batch);
            if (steps < 20) steps = 20;
            ddp_result r = {0};
            if ((status = run_case(data, cases[c].model, cases[c].batch, workers[w], steps, dir, &r))) break;
            if (workers[w] == 1) base = r.sps, base_cpu = r.cpu_us;
            double speedup = base > 0 ? r.sps / base : 0;
            double cpu_scaling = base_cpu > 0 && r.cpu_us > 0 ? workers[w] * base_cpu / r.cpu_us : 0;
            printf("%-5s %6d %8d %12.0f %7.2fx %11.3f %11.3f %11.3f %9.2f %10.2fx\n", cases[c].model, cases[c].batch,
                   workers[w], r.sps, speedup, r.compute_ms, r.comm_ms, r.data_ms, r.cpu_us, cpu_scaling);
            fflush(stdout);
            jn += snprintf(
                json + jn, sizeof json - (size_t)jn,
                "%s{\"model\": \"%s\", \"batch\": %d, \"workers\": %d, \"samples_per_s\": %.1f, "
                "\"speedup\": %.3f, \"step_ms\": {\"compute\": %.4f, \"comm_wait\": %.4f, \"data_wait\": %.4f}, "
                "\"cpu_us_per_sample\": %.3f, \"cpu_scaling\": %.3f}",
                done++ ? ", " : "", cases[c].model, cases[c].batch, workers[w], r.sps, speedup, r.compute_ms, r.comm_ms,
                r.data_ms, r.cpu_us, cpu_scaling);
        }
    }
    rmdir(dir);
    if (!status) printf("%s]}\n", json);
    return status;
}
