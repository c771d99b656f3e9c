/* dtrain bench tp: tensor parallelism against data parallelism and one worker on a GPT large
 * enough that communication is not free (default gpt:L=8,H=8,C=512,T=32), at one global batch, in
 * one run: tokens/s (and the ratio to 1 worker), every rank's peak RSS and its RSS at the end of
 * the run (tp frees the whole model's gradients and optimizer moments once the shards hold
 * them, but the trainer allocates them first, so the peak keeps them), the bytes each mesh axis
 * moved per step (the communicators' counters) and the check of the tp bytes inside the blocks
 * against Megatron's 4 b s h x 2(t-1)/t values per block per step. Each case forks its ranks
 * (shared memory) and trains through the library's trainer; a table, then one JSON line. */
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_RANKS = 8 };

typedef struct {
    double sps;        /* rank 0: samples/s of the steps after the first (warm-up: allocations) */
    double el1, el;    /* rank 0: the epoch's elapsed time after step 1 and after the last step */
    int64_t last;      /* rank 0: the last step seen */
    uint64_t bytes[3]; /* rank 0: tp, pp, dp bus bytes */
    int64_t steps;
    long rss_kb[MAX_RANKS]; /* every rank: peak RSS */
    long end_kb[MAX_RANKS]; /* every rank: RSS at the end of the run (the trainer still alive) */
    int failed;
    char err[256];
} case_result;

typedef struct {
    const char *name;
    int tp, ranks;
} bench_case;

static void on_epoch(void *ctx, const dt_epoch_info *e) {
    case_result *r = ctx;
    r->steps = e->steps;
    memcpy(r->bytes, e->comm_bytes, sizeof r->bytes);
}

static void on_progress(void *ctx, const dt_progress_info *p) {
    case_result *r = ctx;
    if (p->global_step == 1) r->el1 = p->elapsed_s;
    r->el = p->elapsed_s, r->last = p->global_step;
}

/* One rank of a case: trains, then records its peak RSS (rank 0 also the epoch figures). */
static void run_rank(const bench_case *k, int r, const char *data, const char *model, int gb, int steps,
                     case_result *res) {
    dt_comm *comm = NULL;
    char job[64], spec[64];
    snprintf(job, sizeof job, "benchtp%d%s", (int)getppid(), k->name);
    for (char *p = job; *p; p++)
        if (*p == 'x') *p = '_';
    dt_status s = DT_OK;
    if (k->ranks > 1) {
        dt_comm_config cc = dt_comm_config_default();
        cc.rank = r, cc.size = k->ranks, cc.job_id = job;
        s = dt_comm_create(&comm, &cc);
    }
    dt_train_config cfg = dt_train_defaults();
    cfg.data = data, cfg.model = model, cfg.val_fraction = 0, cfg.epochs = 1, cfg.max_steps = steps, cfg.seed = 1;
    cfg.batch = gb / (k->ranks / k->tp);
    cfg.optim = dt_optim_defaults(DT_OPTIM_ADAMW), cfg.lr.base_lr = 1e-3f, cfg.comm = comm;
    snprintf(spec, sizeof spec, "tp(tp=%d)", k->tp);
    cfg.strategy = k->tp > 1 ? spec : k->ranks > 1 ? "ddp" : NULL;
    cfg.on_epoch = on_epoch, cfg.on_progress = on_progress, cfg.progress_interval_s = 1e-9, cfg.cb_ctx = res;
    dt_trainer *t = NULL;
    if (s == DT_OK) s = dt_trainer_create(&t, &cfg);
    if (s == DT_OK) s = dt_trainer_run(t);
    long pages = 0, resident = 0;
    FILE *sf = fopen("/proc/self/statm", "r");
    if (sf && fscanf(sf, "%ld %ld", &pages, &resident) == 2) res->end_kb[r] = resident * (sysconf(_SC_PAGESIZE) / 1024);
    if (sf) fclose(sf);
    if (s != DT_OK) res->failed = 1, snprintf(res->err, sizeof res->err, "rank %d: %s", r, dt_cli_last_error());
    if (r == 0 && res->last > 1 && res->el > res->el1) res->sps = (double)(res->last - 1) * gb / (res->el - res->el1);
    dt_trainer_destroy(t);
    dt_comm_destroy(comm);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    res->rss_kb[r] = ru.ru_maxrss;
    _exit(s == DT_OK ? 0 : 1);
}

static int run_case(const bench_case *k, const char *data, const char *model, int gb, int steps, case_result *out) {
    case_result *res = mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) return dt_cli_fail(NULL, "bench tp: cannot map shared memory");
    memset(res, 0, sizeof *res);
    fflush(stdout);
    for (int r = 0; r < k->ranks; r++)
        if (fork() == 0) run_rank(k, r, data, model, gb, steps, res);
    int bad = 0, st;
    while (wait(&st) > 0) bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    *out = *res;
    munmap(res, sizeof *res);
    if (bad || out->failed || out->sps <= 0)
        return dt_cli_fail(NULL, "bench tp: case %s failed: %s", k->name, out->err[0] ? out->err : "a rank died");
    return 0;
}

static const char USAGE[] =
    "Usage: dtrain bench tp [--model GPT] [--batch GB] [--steps N]\n\n"
    "Tensor parallel (tp2, tp4, dp2 x tp2) against 1 worker and ddp (2, 4 ranks) on a GPT at one global\n"
    "batch of GB sequences: tokens/s and the ratio to 1 worker, each rank's peak RSS, the MB each mesh\n"
    "axis moved per step, and the tp bytes inside the blocks against Megatron's 4 b s h x 2(t-1)/t per\n"
    "block per step. Ranks are processes on this machine (shared memory); more ranks than cores share them.";

/* Writes a corpus of 64 KB of words to dir/corpus.txt; data gets "text:PATH". */
static int write_corpus(const char *dir, char *data, size_t cap) {
    char path[256];
    snprintf(path, sizeof path, "%s/corpus.txt", dir);
    snprintf(data, cap, "text:%s", path);
    const char *w[] = {"in ", "the ", "beginning ", "god ", "created ", "heaven ", "and ", "earth ", ".\n"};
    FILE *f = fopen(path, "w");
    for (int i = 0; f && ftell(f) < 65536; i++) fputs(w[dt_rng_u64(3, 1, (uint64_t)i) % 9], f);
    return f && fclose(f) == 0 ? 0 : dt_cli_fail(NULL, "bench tp: cannot write %s", path);
}

int dt_bench_tp(int argc, char **argv) {
    const char *model = "gpt:L=8,H=8,C=512,T=32";
    int gb = 8, steps = 6;
    const dt_flag flags[] = {
        {"model", DT_FLAG_STR, &model, "GPT", "the GPT spec"},
        {"batch", DT_FLAG_INT, &gb, "GB", "global batch (sequences per step, all ranks together)"},
        {"steps", DT_FLAG_INT, &steps, "N", "training steps per case"},
    };
    int rc = dt_flags_parse(argc, argv, 1, flags, 3, USAGE, NULL, 0, NULL, NULL);
    if (rc) return rc < 0 ? 2 : 0;
    dt_gpt_config g;
    if (dt_gpt_parse(model, &g) != DT_OK) return dt_cli_usage(NULL, "%s", dt_last_error());
    if (gb < 4 || gb % 4 || steps < 2)
        return dt_cli_usage(NULL, "--batch %d --steps %d: need a multiple of 4 and at least 2 steps", gb, steps);
    char dir[] = "/tmp/dtrain-bench-XXXXXX", data[300];
    if (!mkdtemp(dir)) return dt_cli_fail(NULL, "bench tp: cannot create a temporary directory");
    if (write_corpus(dir, data, sizeof data)) return 1;
    const bench_case cases[] = {{"1", 1, 1},   {"dp2", 1, 2}, {"dp4", 1, 4},
                                {"tp2", 2, 2}, {"tp4", 4, 4}, {"dp2xtp2", 2, 4}};
    printf("# dtrain bench tp: model %s, global batch %d x T %d tokens, %d steps per case (timed after the first),\n"
           "# adamw, shm transport; the machine may be shared: compare rows of this one run\n",
           model, gb, g.T, steps);
    dt_bench_print_machine();
    dt_bench_warn_cores(4); /* the 4-rank rows */
    printf("%-8s %5s %10s %7s %10s %10s %12s %12s  %s\n", "layout", "ranks", "tokens/s", "vs 1", "dp_MB/st", "tp_MB/st",
           "tp_B/step", "expected_B", "RSS MB per rank: peak/at end");
    char json[8192];
    int jn = snprintf(json, sizeof json, "{\"bench\": \"tp\", \"model\": \"%s\", \"global_batch\": %d, \"cases\": [",
                      model, gb);
    double base = 0;
    int status = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases && !status; c++) {
        const bench_case *k = &cases[c];
        if (k->tp > 1 && dt_gpt_check_tp(&g, k->tp) != DT_OK) continue;
        case_result r;
        if ((status = run_case(k, data, model, gb, steps, &r))) break;
        const double tps = r.sps * g.T, st = r.steps > 0 ? (double)r.steps : 1;
        if (k->ranks == 1) base = tps;
        /* expected tp bytes per step: Megatron's 4 b s h values per block, plus the embedding's and
         * head's b s h and the loss's 3 b s (row maxima, sums, target logits), x 2(t-1)/t each */
        const int b = gb / (k->ranks / k->tp);
        const double ring = k->tp > 1 ? 2.0 * (k->tp - 1) / k->tp : 0, bsh = (double)b * g.T * g.C * 4;
        const double meg = 4.0 * bsh * g.L * ring, want = meg + (2.0 * bsh + 3.0 * b * g.T * 4) * ring;
        char rss[160] = "", rss_json[128] = "", end_json[128] = "";
        for (int q = 0, rn = 0, jr = 0, je = 0; q < k->ranks; q++) {
            rn += snprintf(rss + rn, sizeof rss - (size_t)rn, "%s%.0f/%.0f", q ? " " : "", r.rss_kb[q] / 1024.0,
                           r.end_kb[q] / 1024.0);
            jr += snprintf(rss_json + jr, sizeof rss_json - (size_t)jr, "%s%.0f", q ? ", " : "", r.rss_kb[q] / 1024.0);
            je += snprintf(end_json + je, sizeof end_json - (size_t)je, "%s%.0f", q ? ", " : "", r.end_kb[q] / 1024.0);
        }
        printf("%-8s %5d %10.0f %6.2fx %10.3f %10.3f %12.0f %12.0f  %s\n", k->name, k->ranks, tps,
               base > 0 ? tps / base : 0, r.bytes[2] / st / 1e6, r.bytes[0] / st / 1e6, r.bytes[0] / st, want, rss);
        jn += snprintf(json + jn, sizeof json - (size_t)jn,
                       "%s{\"layout\": \"%s\", \"ranks\": %d, \"tp\": %d, \"tokens_per_s\": %.1f, \"vs_1\": %.3f, "
                       "\"dp_bytes_per_step\": %.0f, \"tp_bytes_per_step\": %.0f, \"tp_bytes_expected\": %.0f, "
                       "\"megatron_block_bytes_per_step\": %.0f, \"peak_rss_mb\": [%s], \"end_rss_mb\": [%s]}",
                       c ? ", " : "", k->name, k->ranks, k->tp, tps, base > 0 ? tps / base : 0, r.bytes[2] / st,
                       r.bytes[0] / st, want, meg, rss_json, end_json);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench tp: cannot remove %s\n", dir);
    if (!status) printf("%s]}\n", json);
    return status;
}
