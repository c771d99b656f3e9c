/* dtrain bench async: uneven workers. N workers of which the last is FACTOR times slower (--slow,
 * default 3), training a model for the same number of epochs under ddp, ddp + --balance dynamic,
 * localsgd, ps with staleness 4 (dynamic assignment, the default, and fixed shards) and fully
 * asynchronous ps (also with --ps-overlap); samples/s (all training samples over the training
 * wall time), speed-up over ddp and final test accuracy, as a table per (model, worker count)
 * and one JSON line. The default workload is the CNN, whose steps are real work (tens of ms);
 * the MLP (0.1 ms steps, where coordination and the straggler's naps weigh most) is an extra
 * table. Each case runs the real `dtrain train --workers N` command and reads its metrics. The
 * cases run R times (--repeat), interleaved, so a burst of load hits every case alike; the table
 * shows each case's median samples/s with its spread over the repeats, and the speed-up over ddp
 * as the median of the per-repeat ratios with their range, so a difference smaller than the
 * spread shows as such. The JSON line holds every run. */
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_REPEAT = 64, MAX_LIST = 8 };

typedef struct {
    double sps, acc, wall;
    double slow_share; /* the slow worker's share of the samples in the last epoch */
} async_result;

/* ddp-like ranks are 0..N-1; ps puts its server first, so the last worker is rank N */
static const struct {
    const char *name, *flags;
    bool ps, slow;
} CASES[] = {
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
enum { NC = sizeof CASES / sizeof *CASES };

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
    "Usage: dtrain bench async [--model LIST] [--workers LIST] [--factor F] [--epochs E] [--samples N]\n"
    "                          [--batch B] [--repeat R] [--cases LIST] [--data DIR]\n\n"
    "Uneven workers: N local workers (each count of --workers, default 2 and 4), the last one F\n"
    "times slower (--slow), train each model of --model (default cnn, whose steps are real work,\n"
    "then mlp, whose 0.1 ms steps show what the coordination costs) for E epochs of N samples\n"
    "under ddp, ddp + --balance dynamic,\n"
    "localsgd(sync_every=8), ps(staleness=4) (the workers take batches from the server; a batch is\n"
    "held back while it is more than 4 global batches ahead of the oldest one in training),\n"
    "ps(staleness=4,shards=fixed) (classic SSP on each worker's own steps: the slow worker sets the\n"
    "pace), ps(staleness=inf) (1 server) and ps(staleness=inf,overlap=1) (push/pull in the\n"
    "background of the next batch). One table per model and worker count: samples/s (median over\n"
    "the repeats, and its spread: half the range over the median), the speed-up over ddp (the\n"
    "median of the repeats' ratios, each run over ddp's run of the same repeat, with their range;\n"
    "'>' or '<' marks a range that excludes 1, '~' one within the spread), the slow worker's share\n"
    "of the samples and the final test accuracy. A last row runs ddp without a slow worker: the\n"
    "throughput this machine allows for the job (with more ranks than cores it is CPU-bound, and a\n"
    "sleeping straggler frees a core for the others, so no strategy can gain more than that). The\n"
    "cases run R times, interleaved (accuracy is deterministic for ddp and localsgd; for ps it varies\n"
    "with the timing). --cases picks rows by name (ddp always runs: the ratios need it).";

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median, minimum and maximum of v[n]. */
static double stats(const double *v, int n, double *lo, double *hi) {
    double t[MAX_REPEAT];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    *lo = t[0], *hi = t[n - 1];
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static double load_average(void) {
    double load = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &load) != 1) load = -1;
    if (f) fclose(f);
    return load;
}

/* Splits a comma-separated list in place into up to MAX_LIST items; returns their count. */
static int split_list(char *s, char **item) {
    int n = 0;
    for (char *save = NULL, *t = strtok_r(s, ",", &save); t && n < MAX_LIST; t = strtok_r(NULL, ",", &save))
        item[n++] = t;
    return n;
}

typedef struct {
    const char *exe, *data, *dir;
    int epochs, batch, repeat;
    float factor;
    bool want[NC];
    char *json;
    size_t jcap, jn;
    int ngroups; /* groups reported so far */
} bench_ctx;

typedef struct {
    const char *model;
    int workers, samples;
    async_result res[NC][MAX_REPEAT];
} group;

static void json_add(bench_ctx *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void json_add(bench_ctx *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->json + b->jn, b->jcap - b->jn, fmt, ap);
    va_end(ap);
    if (k > 0) b->jn = b->jn + (size_t)k < b->jcap ? b->jn + (size_t)k : b->jcap - 1;
}

/* Runs every wanted case of group g R times, interleaved. */
static int run_group(bench_ctx *b, group *g) {
    char common[PATH_MAX + 256];
    int cn = snprintf(common, sizeof common, "--data '%s' --model '%s' --epochs %d --batch %d --workers %d", b->data,
                      g->model, b->epochs, b->batch, g->workers);
    if (g->samples > 0) snprintf(common + cn, sizeof common - (size_t)cn, " --epoch-windows %d", g->samples);
    for (int k = 0; k < b->repeat; k++)
        for (int c = 0; c < NC; c++) {
            if (!b->want[c]) continue;
            int slow_rank = CASES[c].ps ? g->workers : g->workers - 1;
            char fl[256], metrics[PATH_MAX];
            if (CASES[c].slow) snprintf(fl, sizeof fl, "%s --slow %d:%g", CASES[c].flags, slow_rank, b->factor);
            else snprintf(fl, sizeof fl, "%s", CASES[c].flags);
            snprintf(metrics, sizeof metrics, "%s/case%d.jsonl", b->dir, c);
            int rc = run_case(b->exe, common, fl, slow_rank, metrics, &g->res[c][k]);
            if (rc) return rc;
        }
    return 0;
}

/* Prints group g's table and adds its JSON object. */
static void report_group(bench_ctx *b, const group *g, double load0, double load1) {
    const int R = b->repeat;
    char per_epoch[32] = "all";
    if (g->samples > 0) snprintf(per_epoch, sizeof per_epoch, "%d", g->samples);
    printf("\n## %s, %d workers (the last one %gx slower), %d epoch%s of %s samples, batch %d per worker; "
           "load average %.2f before, %.2f after\n",
           g->model, g->workers, b->factor, b->epochs, b->epochs > 1 ? "s" : "", per_epoch, b->batch, load0, load1);
    printf("%-13s %10s %7s %8s %15s %11s %9s %8s\n", "strategy", "samples/s", "spread", "vs ddp", "range", "slow share",
           "test_acc", "wall_s");
    json_add(b,
             "%s{\"model\": \"%s\", \"workers\": %d, \"samples_per_epoch\": %d, \"load_before\": %.2f, "
             "\"load_after\": %.2f, \"cases\": [",
             b->ngroups++ ? ", " : "", g->model, g->workers, g->samples, load0, load1);
    bool first = true;
    for (int c = 0; c < NC; c++) {
        if (!b->want[c]) continue;
        double sps[MAX_REPEAT], ratio[MAX_REPEAT], acc[MAX_REPEAT], share[MAX_REPEAT], wall[MAX_REPEAT], lo, hi, rlo,
            rhi, x, y;
        for (int k = 0; k < R; k++) {
            const async_result *r = &g->res[c][k];
            sps[k] = r->sps, ratio[k] = r->sps / g->res[0][k].sps, acc[k] = r->acc, share[k] = r->slow_share,
            wall[k] = r->wall;
        }
        const double m = stats(sps, R, &lo, &hi), mr = stats(ratio, R, &rlo, &rhi), spread = 0.5 * (hi - lo) / m;
        const char mark = c == 0 || R < 2 ? ' ' : rlo > 1 ? '>' : rhi < 1 ? '<' : '~';
        char range[32];
        snprintf(range, sizeof range, "%.2f-%.2f %c", rlo, rhi, mark);
        printf("%-13s %10.0f %6.1f%% %7.2fx %15s %11.3f %9.4f %8.1f\n", CASES[c].name, m, 100 * spread, mr, range,
               stats(share, R, &x, &y), stats(acc, R, &x, &y), stats(wall, R, &x, &y));
        json_add(b,
                 "%s{\"strategy\": \"%s\", \"flags\": \"%s\", \"samples_per_s\": %.1f, \"spread\": %.4f, "
                 "\"vs_ddp\": %.3f, \"vs_ddp_min\": %.3f, \"vs_ddp_max\": %.3f, \"slow_share\": %.4f, "
                 "\"test_acc\": %.4f, \"runs\": [",
                 first ? "" : ", ", CASES[c].name, CASES[c].flags, m, spread, mr, rlo, rhi, stats(share, R, &x, &y),
                 stats(acc, R, &x, &y));
        for (int k = 0; k < R; k++)
            json_add(b, "%s{\"samples_per_s\": %.1f, \"vs_ddp\": %.3f, \"test_acc\": %.4f, \"wall_s\": %.2f}",
                     k ? ", " : "", sps[k], ratio[k], acc[k], wall[k]);
        json_add(b, "]}");
        first = false;
    }
    json_add(b, "]}");
    fflush(stdout);
}

/* Marks the cases named in list (ddp always). 0, or a usage error naming the unknown case. */
static int pick_cases(char *list, bool *want) {
    char *item[MAX_LIST * 2];
    int n = 0;
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t && n < MAX_LIST * 2; t = strtok_r(NULL, ",", &save))
        item[n++] = t;
    for (int c = 0; c < NC; c++) want[c] = c == 0;
    for (int i = 0; i < n; i++) {
        int c = 0;
        while (c < NC && strcmp(CASES[c].name, item[i]) != 0) c++;
        if (c == NC)
            return dt_cli_usage("names: ddp, ddp+balance, localsgd, 'ps s=4', 'ps s=4 fixed', 'ps async', "
                                "'ps async+ovl', 'ddp no-slow'",
                                "bench async: --cases: no case '%s'", item[i]);
        want[c] = true;
    }
    return 0;
}

int dt_bench_async(int argc, char **argv) {
    const char *data = "fashion-mnist", *models_s = "cnn,mlp", *workers_s = "2,4", *cases_s = NULL;
    int epochs = 2, batch = 64, repeat = 3, samples = -1;
    float factor = 3;
    const dt_flag flags[] = {
        {"data", DT_FLAG_STR, &data, "DIR", "data set"},
        {"model", DT_FLAG_STR, &models_s, "LIST", "models, one table each (the first is the main workload)"},
        {"workers", DT_FLAG_STR, &workers_s, "LIST", "worker counts, one table each (ps adds one server rank)"},
        {"factor", DT_FLAG_FLOAT, &factor, "F", "the last worker is F times slower"},
        {"epochs", DT_FLAG_INT, &epochs, "E", "epochs per case"},
        {"samples", DT_FLAG_INT, &samples, "N",
         "samples per epoch (--epoch-windows; 0 = all; default mlp all, "
         "others 8192)"},
        {"batch", DT_FLAG_INT, &batch, "B", "per-worker batch"},
        {"repeat", DT_FLAG_INT, &repeat, "R", "runs of every case, interleaved; the table shows medians and spreads"},
        {"cases", DT_FLAG_STR, &cases_s, "LIST", "the rows to run, by name (default all)"},
    };
    int rc = dt_flags_parse(argc, argv, 1, flags, 9, USAGE, NULL, 0, NULL, NULL);
    if (rc) return rc < 0 ? 2 : 0;
    if (epochs < 1 || batch < 1 || !(factor >= 1) || repeat < 1 || repeat > MAX_REPEAT || samples < -1)
        return dt_cli_usage(NULL,
                            "bench async: need --epochs >= 1, --batch >= 1, --factor >= 1, --samples >= 0 and "
                            "--repeat 1..%d",
                            MAX_REPEAT);
    static char models_buf[512], workers_buf[128], cases_buf[512];
    snprintf(models_buf, sizeof models_buf, "%s", models_s);
    snprintf(workers_buf, sizeof workers_buf, "%s", workers_s);
    char *models[MAX_LIST], *wl[MAX_LIST];
    int nm = split_list(models_buf, models), nw = split_list(workers_buf, wl), workers[MAX_LIST];
    for (int i = 0; i < nw; i++)
        if ((workers[i] = atoi(wl[i])) < 2)
            return dt_cli_usage("e.g. --workers 2,4", "bench async: --workers '%s': each count must be >= 2", wl[i]);
    if (nm < 1 || nw < 1) return dt_cli_usage("e.g. --model cnn,mlp --workers 2,4", "bench async: empty list");
    bench_ctx b = {.data = data, .epochs = epochs, .batch = batch, .repeat = repeat, .factor = factor};
    for (int c = 0; c < NC; c++) b.want[c] = true;
    if (cases_s) {
        snprintf(cases_buf, sizeof cases_buf, "%s", cases_s);
        if ((rc = pick_cases(cases_buf, b.want))) return rc;
    }
    char exe[PATH_MAX];
    if (dt_bench_self(exe, sizeof exe) != 0) return 1;
    char dir[] = "/tmp/dtrain-bench-XXXXXX";
    if (!mkdtemp(dir)) return dt_cli_fail(NULL, "bench async: cannot create a temporary directory");
    b.exe = exe, b.dir = dir;
    static char json[1 << 20];
    b.json = json, b.jcap = sizeof json;
    printf("# dtrain bench async: the last worker %gx slower (--slow), adam 0.001, shm, %d run%s per case, "
           "interleaved\n",
           factor, repeat, repeat > 1 ? "s" : "");
    dt_bench_print_machine();
    json_add(&b,
             "{\"bench\": \"async\", \"slow_factor\": %g, \"batch\": %d, \"epochs\": %d, \"repeat\": %d, "
             "\"groups\": [",
             factor, batch, epochs, repeat);
    static group g;
    for (int m = 0; m < nm && !rc; m++)
        for (int i = 0; i < nw && !rc; i++) {
            g.model = models[m], g.workers = workers[i];
            g.samples = samples >= 0 ? samples : strcmp(models[m], "mlp") == 0 ? 0 : 8192;
            double load0 = load_average();
            if (!(rc = run_group(&b, &g))) report_group(&b, &g, load0, load_average());
        }
    rmdir(dir);
    if (rc) return rc;
    json_add(&b, "]}");
    printf("%s\n", json);
    return 0;
}
