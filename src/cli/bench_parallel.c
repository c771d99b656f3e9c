/* dtrain bench parallel: model-parallel layouts of one GPT side by side in one run, each the
 * real `dtrain train` command on the same global batch: 1 worker, dp2, pp2 and pp4 (GPipe and
 * 1F1B at M micro-batches), dp2 x pp2 and tp2 x pp2 (stages of tensor-parallel shards). It prints
 * tokens/s and the ratio to 1 worker, the pipeline bubble measured from the stages' own timings
 * next to GPipe's (K-1)/(M+K-1), the peak activation memory a stage kept in flight (1F1B against
 * GPipe's), bytes sent and the largest per-rank peak RSS, as a table and one JSON line. The rows
 * live in one table (g_rows) so that other layouts (tensor parallel, meshes) add rows, not code. */
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One layout: `ranks` workers of per-rank batch global/dp under `strategy` (NULL: the default). */
typedef struct {
    const char *label;
    int ranks, dp;        /* dp: pipelines / replicas sharing the global batch */
    const char *strategy; /* printf format with %d = M where it has one */
    int pp;               /* stages (0: not a pipeline) */
    bool gpipe;
} layout;

static const layout g_rows[] = {
    {"1 worker", 1, 1, NULL, 0, false},
    {"dp2", 2, 2, "ddp", 0, false},
    {"pp2 gpipe", 2, 1, "pp(stages=2,microbatches=%d,schedule=gpipe)", 2, true},
    {"pp2 1f1b", 2, 1, "pp(stages=2,microbatches=%d,schedule=1f1b)", 2, false},
    {"pp4 gpipe", 4, 1, "pp(stages=4,microbatches=%d,schedule=gpipe)", 4, true},
    {"pp4 1f1b", 4, 1, "pp(stages=4,microbatches=%d,schedule=1f1b)", 4, false},
    {"dp2 x pp2 1f1b", 4, 2, "pp(stages=2,microbatches=%d,schedule=1f1b)", 2, false},
    {"tp2 x pp2 1f1b", 4, 1, "pp(stages=2,tp=2,microbatches=%d,schedule=1f1b)", 2, false},
};

typedef struct {
    double sps, bubble, ideal, act, inflight, bytes, rss;
} result;

static const char USAGE[] =
    "Usage: dtrain bench parallel [--model SPEC] [--batch B] [--microbatches M] [--steps N] [--ranks LIST]\n\n"
    "Model-parallel layouts of one GPT on the King James Bible, each at global batch B (default 16\n"
    "sequences): 1 worker, dp2, pp2/pp4 with GPipe and 1F1B at M micro-batches (default 8), dp2 x pp2,\n"
    "tp2 x pp2.\n"
    "tokens/s (and x 1 worker), the bubble measured from the trace next to (K-1)/(M+K-1), the peak\n"
    "activation bytes a stage kept in flight (and 1F1B / GPipe), bytes sent, and the largest peak RSS\n"
    "of a rank. --ranks 2 keeps the layouts of at most 2 ranks. Rows of 4 ranks on a machine of fewer\n"
    "cores share them: read their bubble and speed as an upper bound.";

static int run_row(const layout *l, const char *model, int batch, int M, int steps, const char *dir, result *r) {
    char metrics[PATH_MAX], args[1024], spec[128] = "", line[8192];
    snprintf(metrics, sizeof metrics, "%s/bench-parallel-%d-%d.jsonl", dir, l->ranks, (int)(l - g_rows));
    if (l->strategy) snprintf(spec, sizeof spec, l->strategy, M);
    snprintf(args, sizeof args,
             "--data kjv --model %s --batch %d --workers %d --max-steps %d --epochs 1000 "
             "--optimizer adamw --lr 1e-3 --val-fraction 0 --epoch-windows %d%s%s%s",
             model, batch / l->dp, l->ranks, steps, batch * (steps + 1), spec[0] ? " --strategy '" : "", spec,
             spec[0] ? "'" : "");
    if (dt_bench_train_run(args, metrics, line, sizeof line)) return 1;
    *r = (result){.sps = dt_bench_json_field(line, "samples_per_s"),
                  .bubble = dt_bench_json_field(line, "bubble"),
                  .ideal = dt_bench_json_field(line, "bubble_ideal"),
                  .act = dt_bench_json_field(line, "peak_act_bytes"),
                  .inflight = dt_bench_json_field(line, "peak_inflight"),
                  .bytes = dt_bench_json_field(line, "bytes_sent"),
                  .rss = dt_bench_json_field(line, "rss_max_mb")};
    return r->sps > 0 ? 0 : dt_cli_fail(NULL, "bench parallel: unreadable metrics line '%.200s'", line);
}

int dt_bench_parallel(int argc, char **argv) {
    const char *model = "gpt:L=4,H=4,C=256,T=64";
    int batch = 16, M = 8, steps = 6, max_ranks = 4;
    const dt_flag flags[] = {
        {"model", DT_FLAG_STR, &model, "SPEC", "the GPT (e.g. gpt:L=8,H=8,C=512,T=64)"},
        {"batch", DT_FLAG_INT, &batch, "B", "global batch (sequences per step)"},
        {"microbatches", DT_FLAG_INT, &M, "M", "micro-batches of the pipelines"},
        {"steps", DT_FLAG_INT, &steps, "N", "training steps per layout"},
        {"ranks", DT_FLAG_INT, &max_ranks, "R", "only layouts of at most R ranks"},
    };
    int rc = dt_flags_parse(argc, argv, 1, flags, 5, USAGE, NULL, 0, NULL, NULL);
    if (rc) return rc < 0 ? 2 : 0;
    if (batch < 4 || batch % 4 || M < 1 || steps < 1)
        return dt_cli_usage("e.g. --batch 16 --microbatches 8 --steps 6",
                            "bench parallel: --batch must be a multiple "
                            "of 4, --microbatches and --steps at least 1");
    char dir[] = "/tmp/dtrain-bench-XXXXXX";
    if (!mkdtemp(dir)) return dt_cli_fail(NULL, "bench parallel: cannot create a temporary directory");
    dt_bench_print_machine();
    printf("# dtrain bench parallel: %s, global batch %d, M=%d, %d steps, shm, 1 thread per rank\n", model, batch, M,
           steps);
    printf("%-16s %5s %10s %7s %7s %7s %12s %7s %12s %8s\n", "layout", "ranks", "tokens/s", "x1", "bubble", "ideal",
           "act_bytes", "/gpipe", "bytes_sent", "rss_mb");
    char json[8192];
    int jn = snprintf(json, sizeof json, "{\"bench\": \"parallel\", \"model\": \"%s\", \"batch\": %d, \"rows\": [",
                      model, batch);
    int status = 0, done = 0;
    const char *T = strstr(model, "T=");
    const int tokens = T ? atoi(T + 2) : 64;
    double base = 0, gpipe_act[DT_MAX_LAYERS] = {0};
    for (size_t i = 0; i < sizeof g_rows / sizeof *g_rows && !status; i++) {
        const layout *l = &g_rows[i];
        if (l->ranks > max_ranks) continue;
        result r;
        if ((status = run_row(l, model, batch, M, steps, dir, &r))) break;
        const double tps = r.sps * tokens;
        if (i == 0) base = tps;
        if (l->pp && l->gpipe) gpipe_act[l->pp] = r.act;
        const double rel = l->pp && gpipe_act[l->pp] > 0 ? r.act / gpipe_act[l->pp] : 0; /* of GPipe's, same K */
        printf("%-16s %5d %10.0f %6.2fx", l->label, l->ranks, tps, base > 0 ? tps / base : 0);
        if (l->pp) printf(" %7.3f %7.3f %12.0f %7.3f %12.0f", r.bubble, r.ideal, r.act, rel, r.bytes);
        else printf(" %7s %7s %12s %7s %12s", "-", "-", "-", "-", "-");
        if (r.rss > 0) printf(" %8.1f\n", r.rss);
        else printf(" %8s\n", "-");
        fflush(stdout);
        jn += snprintf(
            json + jn, sizeof json - (size_t)jn,
            "%s{\"layout\": \"%s\", \"ranks\": %d, \"tokens_per_s\": %.1f, \"vs_1\": %.3f, \"bubble\": %.4f, "
            "\"bubble_ideal\": %.4f, \"peak_act_bytes\": %.0f, \"act_vs_gpipe\": %.3f, \"bytes_sent\": %.0f, "
            "\"peak_rss_mb\": %.1f}",
            done++ ? ", " : "", l->label, l->ranks, tps, base > 0 ? tps / base : 0, r.bubble, r.ideal, r.act, rel,
            r.bytes, r.rss);
    }
    rmdir(dir);
    if (!status) printf("%s]}\n", json);
    return status;
}
