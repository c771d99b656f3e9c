/* Cross-module test: placement (dt_model_place through the strategy's entry.place): the bytes a rank is charged for
 * (core/mem.c's accounting, dt_mem_peak: deterministic, not the OS's resident set) under pp2 and
 * tp2 stay below a bound computed from the parameters that rank owns:
 *   16 bytes (f32 parameter, gradient, two Adam moments) x owned + the whole graph's activations
 *   at the batch + 1 MiB,
 * where owned is counted here from the graph itself: pp, the tensors the nodes of the rank's stage
 * use (the flops cut); tp, each tensor a tp-th where Megatron splits it, else whole. One worker is
 * charged for the whole model (at least 16 x P), and each pp2 / tp2 rank less than 3/4 of that.
 * tp2 x pp2 (4 ranks): owned is the tensors of the rank's stage, each a tp-th where Megatron
 * splits it; the bound is tighter, 16 x owned + what the rank's GPT shard's graph allocates at the
 * micro-batch (BATCH / 2: M = K) + 64 KiB, so a stage that held another stage's shards (8 bytes a
 * parameter of them) fails it; and each rank's peak is below 1/2 of 1 worker's and below every pp2
 * and tp2 rank's (it holds about a quarter of the model where they hold about a half).
 * pp's ZeRO-2 gives its stage's gradient pages back after each step, ZeRO-3 also its parameters
 * (test_pp_zero).
 * The runs train 2 steps without a test set, so no evaluation gathers the whole model. */
#include "core/test.h"
#include "dtrain/dtrain.h"
#include "dtrain/memplan.h"
#include "dtrain/models.h"
#include "parallel/parallel_testlib.h"
#include "parallel/pp.h"
#include "parallel/tp.h"

#include <string.h>
#include <unistd.h>

static const char *GPT = "gpt:L=2,H=4,C=128,T=16";
enum { BATCH = 4 };
static char g_dir[64], g_text[192];

/* Trains 2 steps under strategy (NULL: one worker) as rank r of n; writes dt_mem_peak and what it
 * holds after the last step (dt_mem_used, between steps) to path. */
static int run_rank(const char *strategy, int r, int n, const char *job, const char *path) {
    dt_comm *c = n > 1 ? dt_test_rank_comm(r, n, job) : NULL;
    dt_train_config cfg = dt_train_defaults();
    cfg.data = g_text, cfg.model = GPT, cfg.batch = BATCH, cfg.max_steps = 2, cfg.val_fraction = 0;
    cfg.strategy = strategy, cfg.comm = c, cfg.seed = 3;
    dt_trainer *t;
    dt_status s = dt_trainer_create(&t, &cfg);
    if (s == DT_OK) s = dt_trainer_run(t);
    const size_t peak = dt_mem_peak(), held = dt_mem_used();
    if (s == DT_OK) dt_trainer_destroy(t);
    dt_comm_destroy(c);
    if (s != DT_OK) {
        fprintf(stderr, "rank %d (%s): %s\n", r, strategy ? strategy : "1 worker", dt_last_error());
        return 3;
    }
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%zu %zu\n", peak, held) < 0 || fclose(f) != 0) return 4;
    return 0;
}

/* The charged peak of each of n forked ranks under strategy into peak[] (and what each held after
 * its last step into held[], unless NULL); false when one failed. */
static bool measure_held(const char *strategy, int n, const char *tag, size_t *peak, size_t *held) {
    char job[64], path[192];
    snprintf(job, sizeof job, "place%s%d", tag, (int)getpid());
    for (int r = 0; r < n; r++)
        if (fork() == 0) {
            snprintf(path, sizeof path, "%s/%s.%d", g_dir, tag, r);
            _exit(run_rank(strategy, r, n, job, path));
        }
    if (dt_test_wait_children() != 0) return false;
    for (int r = 0; r < n; r++) {
        snprintf(path, sizeof path, "%s/%s.%d", g_dir, tag, r);
        FILE *f = fopen(path, "r");
        size_t h = 0;
        if (!f || fscanf(f, "%zu %zu", &peak[r], &h) != 2) peak[r] = 0;
        if (held) held[r] = h;
        if (f) fclose(f);
    }
    return true;
}

static bool measure(const char *strategy, int n, const char *tag, size_t *peak) {
    return measure_held(strategy, n, tag, peak, NULL);
}

/* used[t]: tensor t is used by the nodes of stage k of the 2-stage flops cut. */
static void stage_used(dt_model *m, int k, bool used[256]) {
    int first[3];
    CHECK_OK(dt_pp_cut(m, 2, "", NULL, first));
    for (int i = first[k]; i < first[k + 1]; i++) {
        int ids[8];
        const int nt = dt_model_node_tensors(m, i, ids, 8);
        for (int j = 0; j < nt && j < 8; j++) used[ids[j]] = true;
    }
}

/* Parameters stage k of the 2-stage flops cut holds: the tensors its nodes use. */
static size_t pp_owned(dt_model *m, int k) {
    bool used[256] = {false};
    stage_used(m, k, used);
    size_t own = 0;
    for (int t = 0; t < dt_model_num_tensors(m) && t < 256; t++)
        if (used[t] && !dt_model_tensor(m, t)->is_buffer) own += dt_model_tensor(m, t)->numel;
    return own;
}

/* pp ZeRO-2 and ZeRO-3 over dp2 x pp2 against ZeRO-1 (pp_zero.c, pp_zero3.c). ZeRO-2: after a
 * step each rank holds its stage's gradients no longer, only its half of them (4 x owned / 2
 * bytes less, less a page per segment edge); its peak is ZeRO-1's plus that half (the step
 * accumulates the whole gradients before one reduce-scatter: 8 Psi + 12 Psi/N, not the paper's
 * 4 Psi + 12 Psi/N). ZeRO-3: after a step also only half of the parameters (less a page per
 * tensor edge), and a peak below ZeRO-2's by about as much (one node's tensors gathered). */
static void test_pp_zero(dt_model *m) {
    size_t p1[4] = {0}, h1[4] = {0}, p2[4] = {0}, h2[4] = {0}, p3[4] = {0}, h3[4] = {0};
    CHECK(measure_held("pp(stages=2,zero=1)", 4, "z1", p1, h1));
    CHECK(measure_held("pp(stages=2,zero=2)", 4, "z2", p2, h2));
    CHECK(measure_held("pp(stages=2,zero=3)", 4, "z3", p3, h3));
    for (int r = 0; r < 4; r++) {
        const double own = (double)pp_owned(m, r % 2), half = 4.0 * own / 2, slack = 65536;
        printf("dp2 x pp2 rank %d (stage %d, %.0f parameters): held after a step zero=1 %zu, zero=2 %zu, zero=3 %zu "
               "bytes (steps of ~%.0f); peak %zu, %zu, %zu\n",
               r, r % 2, own, h1[r], h2[r], h3[r], half, p1[r], p2[r], p3[r]);
        CHECK_MSG((double)h1[r] - (double)h2[r] >= half - slack,
                  "pp zero=2 rank %d holds %zu bytes after a step, "
                  "zero=1 %zu: the gradient pages were not given back",
                  r, h2[r], h1[r]);
        CHECK_MSG((double)p2[r] <= (double)p1[r] + half + slack,
                  "pp zero=2 rank %d peak %zu above zero=1's %zu + the "
                  "shard",
                  r, p2[r], p1[r]);
        CHECK_MSG((double)h2[r] - (double)h3[r] >= half - 4 * slack,
                  "pp zero=3 rank %d holds %zu bytes after a step, "
                  "zero=2 %zu: the parameter pages were not given back",
                  r, h3[r], h2[r]);
        CHECK_MSG((double)p3[r] <= (double)p2[r] - half / 2,
                  "pp zero=3 rank %d peak %zu not below zero=2's %zu by "
                  "a quarter of its parameters",
                  r, p3[r], p2[r]);
    }
}

/* Parameters a tp2 rank holds of the tensors used[] marks (NULL: all): split tensors halved, the
 * rest whole. */
static size_t tp_owned_of(dt_model *m, const bool *used) {
    size_t own = 0;
    for (int t = 0; t < dt_model_num_tensors(m); t++) {
        const dt_param_info *p = dt_model_tensor(m, t);
        const dt_tp_split k = dt_tp_split_of(m, p->name);
        if (p->is_buffer || (used && !used[t])) continue;
        own += k == DT_TP_REPL || k == DT_TP_RANK0 ? p->numel : p->numel / 2;
    }
    return own;
}

static size_t tp_owned(dt_model *m) { return tp_owned_of(m, NULL); }

/* Parameters a tp2 x pp2 rank of stage k holds: its stage's tensors (the 2-stage flops cut), split
 * ones halved. */
static size_t tppp_owned(dt_model *m, int k) {
    bool used[256] = {false};
    stage_used(m, k, used);
    return tp_owned_of(m, used);
}

static void check_rank(const char *what, int r, size_t peak, size_t owned, size_t act, size_t whole_peak, double below,
                       double slack) {
    const double bound = 16.0 * (double)owned + (double)act + slack;
    printf("%s rank %d: charged peak %zu bytes, bound 16 x %zu owned + %zu activations + %.0f KiB = %.0f; 1 worker "
           "%zu\n",
           what, r, peak, owned, act, slack / 1024, bound, whole_peak);
    CHECK_MSG(peak > 0 && (double)peak <= bound, "%s rank %d: peak %zu above the bound %.0f", what, r, peak, bound);
    CHECK_MSG((double)peak < (double)whole_peak * below, "%s rank %d: peak %zu is not below %.2f of 1 worker's %zu",
              what, r, peak, below, whole_peak);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-place-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    char path[128];
    snprintf(path, sizeof path, "%s/text.txt", g_dir);
    dt_test_write_corpus(path, g_text, sizeof g_text);
    size_t one[1] = {0}, pp[2] = {0}, tp[2] = {0}, tppp[4] = {0};
    CHECK(measure(NULL, 1, "one", one));
    CHECK(measure("pp(stages=2)", 2, "pp", pp));
    CHECK(measure("tp(tp=2)", 2, "tp", tp));
    CHECK(measure("pp(stages=2,tp=2)", 4, "tppp", tppp));
    dt_model *m = NULL; /* built after the forks: its own charge stays out of their peaks */
    CHECK_OK(dt_model_build(&m, GPT, 0, 0, 0));
    if (m) {
        const size_t P = dt_model_num_params(m), act = dt_model_activation_bytes(m, BATCH);
        printf("1 worker: charged peak %zu bytes for %zu parameters (16 x P = %zu)\n", one[0], P, 16 * P);
        CHECK_MSG(one[0] >= 16 * P, "1 worker holds %zu bytes, less than 16 x %zu", one[0], P);
        for (int r = 0; r < 2; r++) check_rank("pp2", r, pp[r], pp_owned(m, r), act, one[0], 0.75, 1048576);
        for (int r = 0; r < 2; r++) check_rank("tp2", r, tp[r], tp_owned(m), act, one[0], 0.75, 1048576);
        dt_gpt_config g;
        dt_model *shard = NULL; /* laid out unplaced: nothing written */
        CHECK_OK(dt_gpt_parse(GPT, &g));
        CHECK_OK(dt_gpt_create_sharded_unplaced(&shard, &g, 2));
        const size_t sact = shard ? dt_model_activation_bytes(shard, BATCH / 2) : 0;
        dt_model_destroy(shard);
        for (int r = 0; r < 4; r++) { /* rank = stage * 2 + tp index */
            check_rank("tp2 x pp2", r, tppp[r], tppp_owned(m, r / 2), sact, one[0], 0.5, 65536);
            for (int q = 0; q < 2; q++)
                CHECK_MSG(tppp[r] < pp[q] && tppp[r] < tp[q],
                          "tp2 x pp2 rank %d: peak %zu not below pp2 rank %d's "
                          "%zu and tp2 rank %d's %zu",
                          r, tppp[r], q, pp[q], q, tp[q]);
        }
        /* --dry-run's plan (run/memplan.c) counts the same parameters per rank */
        const dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
        for (int r = 0; r < 2; r++) {
            dt_mem_plan pl;
            dt_mem_layout lp = {.dp = 1, .tp = 1, .pp = 2, .microbatches = 2, .batch = BATCH};
            CHECK_OK(dt_mem_plan_rank(m, &oc, &lp, r, &pl));
            CHECK_MSG(pl.params == 4.0 * (double)pp_owned(m, r), "pp2 rank %d: plan %.0f bytes, owned %zu", r,
                      pl.params, pp_owned(m, r));
            dt_mem_layout lt = {.dp = 1, .tp = 2, .pp = 1, .microbatches = 1, .batch = BATCH};
            CHECK_OK(dt_mem_plan_rank(m, &oc, &lt, r, &pl));
            CHECK_MSG(pl.params == 4.0 * (double)tp_owned(m), "tp2 rank %d: plan %.0f bytes, owned %zu", r, pl.params,
                      tp_owned(m));
        }
        for (int r = 0; r < 4; r++) {
            dt_mem_plan pl;
            dt_mem_layout l = {.dp = 1, .tp = 2, .pp = 2, .microbatches = 2, .batch = BATCH};
            CHECK_OK(dt_mem_plan_rank(m, &oc, &l, r, &pl));
            CHECK_MSG(pl.params == 4.0 * (double)tppp_owned(m, r / 2) && pl.optim == 8.0 * (double)tppp_owned(m, r / 2),
                      "tp2 x pp2 rank %d: plan %.0f + %.0f bytes, owned %zu", r, pl.params, pl.optim,
                      tppp_owned(m, r / 2));
        }
    }
    if (m) test_pp_zero(m);
    dt_model_destroy(m);
    dt_test_remove_dir(g_dir);
    printf("placement_test: %d checks, %d failures\n", dt_test_checks, dt_test_failures);
    return dt_test_failures ? 1 : 0;
}
