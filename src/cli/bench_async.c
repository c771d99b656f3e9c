/* dtrain bench async: uneven workers. N workers (default 4) of which the last is FACTOR times
 * slower (--slow, default 3), training the reference MLP for the same number of epochs under
 * ddp, ddp + --balance dynamic, localsgd, ps with staleness 4 (dynamic assignment, the default,
 * and fixed shards) and fully asynchronous ps (also with --ps-overlap); samples/s (all training samples over the training
 * wall time), speed-up over ddp and final test accuracy, as a table and one JSON line. Each case
 * runs the real `dtrain train --workers N` command and reads its metrics. With --repeat R the
 * cases run R times, interleaved (so a burst of load hits every case alike), and the table shows
 * each case's median samples/s; the JSON line holds every run. */
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    double sps, acc, wall;
    double slow_share;  /* the slow worker's share of the samples in the last epoch */
} async_result;

/* The "share" of the worker entry with "rank": slow_rank in the workers array. */
static double share_of(const char *line, int rank) {
    char pat[48];
    snprintf(pat, sizeof pat, "{\"rank\": %d, ", rank);
    const char *p = strstr(line, pat);
    return p ? dt_bench_json_field(p, "share") : -1;
}

static int run_case(const char *exe, const char *common, const char *flags, int slow_rank, const char *metrics,
                    async_result *r) {
    char cmd[PATH_MAX * 4];
    snprintf(cmd, sizeof cmd, "'%s' train %s %s --quiet --metrics '%s' > /dev/null", exe, common, flags, metrics);
    double t0 = dt_now();
    if (system(cmd) != 0) return dt_cli_fail(NULL, "bench async: '%s' failed", cmd);
    r->wall = dt_now() - t0;
    FILE *f = fopen(metrics, "r");
    if (!f) return dt_cli_fail(NULL, "bench async: no metrics in %s", metrics);
    static char line[16384];
    double samples = 0, secs = 0;
    while (fgets(line, sizeof line, f)) {
        double sps = dt_bench_json_field(line, "samples_per_s"), es = dt_bench_json_field(line, "epoch_s");
        samples += sps * es, secs += es;
        r->acc = dt_bench_json_field(line, "test_acc");
        r->slow_share = share_of(line, slow_rank);
    }
    fclose(f);
    unlink(metrics);
    r->sps = secs > 0 ? samples / secs : 0;
    return r->sps > 0 ? 0 : dt_cli_fail(NULL, "bench async: unreadable metrics in %s", metrics);
}

static const char USAGE[] =
    "Usage: dtrain bench async [--workers N] [--factor F] [--epochs E] [--batch B] [--repeat R] [--data DIR]\n\n"
    "Uneven workers: N local workers, the last one F times slower (--slow), train the MLP for E\n"
    "epochs under ddp, ddp + --balance dynamic, localsgd(sync_every=8), ps(staleness=4) (the\n"
    "workers take batches from the server; a batch is held back while it is more than 4 global\n"
    "batches ahead of the oldest one in training), ps(staleness=4,shards=fixed) (classic SSP on\n"
    "each worker's own steps: the slow worker sets the pace), ps(staleness=inf) (1 server) and\n"
    "ps(staleness=inf,overlap=1) (push/pull in the background of the next batch).\n"
    "Prints samples/s, the speed-up over ddp, the slow worker's share of the samples and the final\n"
    "test accuracy. A last row runs ddp without a slow worker: the throughput this machine\n"
    "allows for the job (with more workers than cores it is CPU-bound, and a sleeping straggler frees\n"
    "a core for the others, so no strategy can gain more than that). --repeat R runs the whole list\n"
    "R times, interleaved, and reports each case's median samples/s (accuracy is deterministic for\n"
    "ddp and localsgd; for ps it varies with the timing).";

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double t[64];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

int dt_bench_async(int argc, char **argv) {
    const char *data = "fashion-mnist";
    int workers = 4, epochs = 2, batch = 64, repeat = 3;
    float factor = 3;
    const dt_flag flags[] = {
        {"data", DT_FLAG_STR, &data, "DIR", "data set"},
        {"workers", DT_FLAG_INT, &workers, "N", "workers (ps adds one server rank)"},
        {"factor", DT_FLAG_FLOAT, &factor, "F", "the last worker is F times slower"},
        {"epochs", DT_FLAG_INT, &epochs, "E", "epochs per case"},
        {"batch", DT_FLAG_INT, &batch, "B", "per-worker batch"},
        {"repeat", DT_FLAG_INT, &repeat, "R", "runs of every case, interleaved; the table shows medians"},
    };
    int rc = dt_flags_parse(argc, argv, 1, flags, 6, USAGE, NULL, 0, NULL, NULL);
    if (rc) return rc < 0 ? 2 : 0;
    if (workers < 2 || epochs < 1 || batch < 1 || !(factor >= 1) || repeat < 1 || repeat > 64)
        return dt_cli_usage(NULL, "bench async: need --workers >= 2, --epochs >= 1, --batch >= 1, --factor >= 1 and "
                                 "--repeat 1..64");
    char exe[PATH_MAX];
    if (dt_bench_self(exe, sizeof exe) != 0) return 1;
    char dir[] = "/tmp/dtrain-bench-XXXXXX";
    if (!mkdtemp(dir)) return dt_cli_fail(NULL, "bench async: cannot create a temporary directory");
    char common[PATH_MAX + 128];
    snprintf(common, sizeof common, "--data '%s' --model mlp --epochs %d --batch %d --workers %d", data, epochs,
             batch, workers);
    /* ddp-like ranks are 0..N-1; ps puts its server first, so the last worker is rank N */
    const struct {
        const char *name, *flags;
        bool ps, slow;
    } cases[] = {
        {"ddp", "--strategy ddp", false, true},
        {"ddp+balance", "--strategy ddp --balance dynamic", false, true},
        {"localsgd", "--strategy 'localsgd(sync_every=8)'", false, true},
        {"ps s=4", "--strategy 'ps(staleness=4)'", true, true},
        {"ps s=4 fixed", "--strategy 'ps(staleness=4,shards=fixed)'", true, true},
        {"ps async", "--strategy 'ps(staleness=inf)'", true, true},
        {"ps async+ovl", "--strategy 'ps(staleness=inf,overlap=1)'", true, true},
        /* the machine's capacity for this job: what no strategy can beat here */
        {"ddp no-slow", "--strategy ddp", false, false},
    };
    enum { NC = sizeof cases / sizeof *cases };
    static async_result res[NC][64];
    printf("# dtrain bench async: %d workers (rank of the last one %gx slower), mlp, batch %d per worker, %d epochs, "
           "adam 0.001, shm, %d run%s per case\n", workers, factor, batch, epochs, repeat, repeat > 1 ? "s" : "");
    int status = 0;
    for (int k = 0; k < repeat && !status; k++)
        for (int c = 0; c < NC && !status; c++) {
            int slow_rank = cases[c].ps ? workers : workers - 1;
            char fl[256], metrics[PATH_MAX];
            if (cases[c].slow) snprintf(fl, sizeof fl, "%s --slow %d:%g", cases[c].flags, slow_rank, factor);
            else snprintf(fl, sizeof fl, "%s", cases[c].flags);
            snprintf(metrics, sizeof metrics, "%s/case%d.jsonl", dir, c);
            status = run_case(exe, common, fl, slow_rank, metrics, &res[c][k]);
        }
    rmdir(dir);
    if (status) return status;
    printf("%-13s %12s %9s %11s %9s %8s\n", "strategy", "samples/s", "vs ddp", "slow share", "test_acc", "wall_s");
    static char json[32768];
    int jn = snprintf(json, sizeof json,
                      "{\"bench\": \"async\", \"workers\": %d, \"slow_factor\": %g, \"batch\": %d, \"epochs\": %d, "
                      "\"repeat\": %d, \"cases\": [", workers, factor, batch, epochs, repeat);
    double ddp_sps = 0, ddp_acc = 0;
    for (int c = 0; c < NC; c++) {
        double sps[64], acc[64], share[64], wall[64];
        for (int k = 0; k < repeat; k++)
            sps[k] = res[c][k].sps, acc[k] = res[c][k].acc, share[k] = res[c][k].slow_share, wall[k] = res[c][k].wall;
        double m_sps = median(sps, repeat), m_acc = median(acc, repeat);
        if (c == 0) ddp_sps = m_sps, ddp_acc = m_acc;
        printf("%-13s %12.0f %8.2fx %11.3f %9.4f %8.1f\n", cases[c].name, m_sps, m_sps / ddp_sps,
               median(share, repeat), m_acc, median(wall, repeat));
        jn += snprintf(json + jn, sizeof json - (size_t)jn,
                       "%s{\"strategy\": \"%s\", \"flags\": \"%s\", \"samples_per_s\": %.1f, \"vs_ddp\": %.3f, "
                       "\"slow_share\": %.4f, \"test_acc\": %.4f, \"acc_vs_ddp\": %.4f, \"runs\": [",
                       c ? ", " : "", cases[c].name, cases[c].flags, m_sps, m_sps / ddp_sps, median(share, repeat),
                       m_acc, m_acc - ddp_acc);
        for (int k = 0; k < repeat; k++)
            jn += snprintf(json + jn, sizeof json - (size_t)jn,
                           "%s{\"samples_per_s\": %.1f, \"test_acc\": %.4f, \"wall_s\": %.2f}", k ? ", " : "", sps[k],
                           acc[k], wall[k]);
        jn += snprintf(json + jn, sizeof json - (size_t)jn, "]}");
    }
    printf("%s]}\n", json);
    return 0;
}
