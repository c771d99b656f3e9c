/* The tp x pp (x dp) mesh (pp_tp.c, pp_step.c with tp hooks): pipeline stages of tensor-parallel
 * GPT shards over real shared-memory ranks (forked processes), through the trainer, against one
 * worker at the same global batch of 8 on gpt:L=2,H=2,C=16,T=16 (AdamW, --clip 0.5, which acts):
 *  - tp2 x pp2 with both schedules and M in {1, 2, 4} gives the running loss of every one of 20
 *    steps and the final parameters of 1 worker within 2e-5 absolute (pp_testlib.h);
 *  - dp2 x tp2 x pp2 (8 ranks, 4 samples per model copy) the same parameters and epoch loss;
 *  - the tp axis's block byte counters of a stage equal Megatron's 4 b s h x 2(t-1)/t per block
 *    per micro-batch of its own blocks; the metrics keep the bubble and bytes per axis;
 *  - checkpoints across layouts: saved under tp2 x pp2 after 10 steps, resumed for 10 more on 1
 *    worker, dp4, tp2 and pp2, and saved on 1 worker, resumed under tp2 x pp2: each ends within
 *    2e-5 of the uninterrupted 1-worker run;
 *  - ZeRO 1, 2 and 3 over the DP axis of dp2 x tp2 x pp2 (pp_zero.c, pp_zero3.c on each rank's
 *    shard segments): 20 steps as 1 worker (parameters, epoch loss), and checkpoints across layouts:
 *    saved under it after 10 steps resumed on 1 worker, and a 1-worker one resumed under it;
 *  - a rank killed mid-run (stage 0, tp rank 0): every other rank fails, no hang, naming a rank
 *    and the operation; its tp peer and its pipeline neighbour name rank 0.
 * Under the sanitizers (DTRAIN_SANITIZED) a subset of the layouts runs. */
#include "core/test.h"
#include "dtrain/dtrain.h"
#include "parallel/parallel_testlib.h"
#include "parallel/pp.h"
#include "parallel/pp_testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_dir[64], g_text[160];
static const char *GPT = "gpt:L=2,H=2,C=16,T=16";
enum { GB = 8, T = 16, C = 16, L = 2 };
static bool g_light;
static size_t g_n;

/* Runs N ranks of spec at `batch` per model copy and compares with the 1-worker reference. */
static void layout(int N, const char *spec, int batch, int steps, const char *what, const char *metrics) {
    char path[128];
    snprintf(path, sizeof path, "%s/l%d", g_dir, (int)(dt_rng_u64(1, (uint64_t)N, (uint64_t)strlen(what)) % 100000));
    run_cfg rc = {.model = GPT, .data = g_text, .strategy = spec, .batch = batch, .steps = STEPS, .metrics = metrics};
    const int failed = run_ranks(N, &rc, path);
    CHECK_MSG(failed == 0, "%s: %d rank(s) failed", what, failed);
    if (failed) {
        char msg[512];
        rank_error(path, 0, msg, sizeof msg);
        printf("  rank 0: %s\n", msg);
    }
    compare(what, g_n, g_ref, g_got, dt_test_read_floats(path, g_got, CAP + STEPS + 1), steps);
}

static void test_layouts(void) {
    const int Ms[3] = {1, 2, 4};
    for (int sch = 0; sch < 2; sch++)
        for (int mi = 0; mi < 3; mi++) {
            if (g_light && !(sch == 1 && mi == 1)) continue;
            char spec[96], what[64], mpath[128];
            snprintf(spec, sizeof spec, "pp(stages=2,tp=2,microbatches=%d,schedule=%s)", Ms[mi],
                     sch ? "1f1b" : "gpipe");
            snprintf(what, sizeof what, "tp2 x pp2 %s M=%d:", sch ? "1f1b" : "gpipe", Ms[mi]);
            snprintf(mpath, sizeof mpath, "%s/m%d%d.json", g_dir, sch, mi);
            layout(4, spec, GB, STEPS, what, mpath);
            /* the metrics: the pipeline's bubble and in-flight count, the bytes of every axis */
            const double peak = metric_in(mpath, "pp", "peak_inflight"), bubble = metric_in(mpath, "pp", "bubble"),
                         tpk = metric_in(mpath, "pp", "tp"), ax_tp = metric_in(mpath, "comm_bytes", "tp"),
                         ax_pp = metric_in(mpath, "comm_bytes", "pp"), ax_dp = metric_in(mpath, "comm_bytes", "dp");
            const double want = sch ? (Ms[mi] < 2 ? Ms[mi] : 2) : Ms[mi];
            CHECK_MSG(peak == want && bubble >= 0 && bubble < 1 && tpk == 2,
                      "%s: in flight %g (want %g), bubble %g, "
                      "tp %g",
                      what, peak, want, bubble, tpk);
            CHECK_MSG(ax_tp > 0 && ax_pp > 0 && ax_dp == 0, "%s: bytes per axis tp %g, pp %g, dp %g", what, ax_tp,
                      ax_pp, ax_dp);
            /* Megatron: each block's 4 allreduces of b s h values per micro-batch, 2(t-1)/t of them moved per
             * rank; with M = 1 neither schedule recomputes a forward, so the stages' blocks (L of them)
             * moved exactly that */
            const double tb = metric_in(mpath, "pp", "tp_block_bytes"), ops = metric_in(mpath, "pp", "tp_block_ops");
            const double per_block = 4.0 * GB * T * C * sizeof(float) * 2.0 * (2 - 1) / 2;
            if (Ms[mi] == 1) {
                printf("%s tp block bytes over both stages %.0f = %d steps x %d blocks x %.0f (Megatron), %g ops\n",
                       what, tb, STEPS, L, per_block, ops);
                CHECK_MSG(tb == per_block * L * STEPS && ops == 4.0 * L * STEPS, "%s: tp block bytes %g, ops %g", what,
                          tb, ops);
            } else {
                CHECK_MSG(tb >= per_block * L * STEPS && ops >= 4.0 * L * Ms[mi] * STEPS,
                          "%s: tp block bytes %g, "
                          "ops %g",
                          what, tb, ops);
            }
        }
    /* the tp2 spelling of the same mesh: tp(tp=2,pp=2) is a pipeline of shards (M = K, 1F1B) */
    layout(4, "tp(tp=2,pp=2)", GB, STEPS, "tp(tp=2,pp=2):", NULL);
    /* stage 1 from transformer.wpe: it receives the tokens, maps them into its vocabulary slice
     * and masks the embedding's gradient with them; 3 uneven micro-batches of the 8 samples */
    if (!g_light)
        layout(4, "pp(stages=2,tp=2,microbatches=3,split=transformer.wpe)", GB, STEPS,
               "tp2 x pp2 split=transformer.wpe M=3:", NULL);
}

/* dp2 x tp2 x pp2: two model copies of 4 samples each = the global batch 8 of one worker. */
static void test_dp_mesh(void) {
    if (g_light) return;
    char m1[128], m8[128];
    snprintf(m1, sizeof m1, "%s/one.json", g_dir);
    snprintf(m8, sizeof m8, "%s/dp2tp2pp2.json", g_dir);
    run_cfg one = {.model = GPT, .data = g_text, .batch = GB, .steps = STEPS, .metrics = m1};
    static float ref[CAP + STEPS + 1];
    size_t n;
    reference(&one, ref, &n);
    /* rank 0's running loss is its copy's half of the batch: the epoch's loss over both is compared */
    layout(8, "pp(stages=2,tp=2,microbatches=2,schedule=1f1b)", GB / 2, 0, "dp2 x tp2 x pp2 1f1b M=2:", m8);
    const double l1 = metric(m1, "train_loss"), l8 = metric(m8, "train_loss"), dpb = metric_in(m8, "comm_bytes", "dp");
    printf("dp2 x tp2 x pp2: train_loss over 20 steps %.6f, 1 worker %.6f; dp axis bytes %.0f\n", l8, l1, dpb);
    CHECK(l1 > 0 && l8 > 0 && l1 - l8 < DT_PP_TEST_TOL && l8 - l1 < DT_PP_TEST_TOL && dpb > 0);
}

/* Saved under tp2 x pp2 after 10 steps, resumed under other layouts; saved on 1 worker, resumed
 * under tp2 x pp2: every run ends within the tolerance of 20 steps on 1 worker. */
static void test_resume(void) {
    char ck[128], path[128];
    snprintf(ck, sizeof ck, "%s/tp2pp2.safetensors", g_dir);
    snprintf(path, sizeof path, "%s/half", g_dir);
    run_cfg half = {.model = GPT,
                    .data = g_text,
                    .strategy = "pp(stages=2,tp=2,microbatches=2)",
                    .batch = GB,
                    .steps = 10,
                    .save = ck};
    CHECK(run_ranks(4, &half, path) == 0);
    struct {
        const char *what, *strategy;
        int ranks, batch;
    } to[] = {{"1 worker", NULL, 1, GB},
              {"dp4", "ddp", 4, GB / 4},
              {"tp2", "tp(tp=2)", 2, GB},
              {"pp2", "pp(stages=2,microbatches=4,schedule=gpipe)", 2, GB}};
    for (size_t i = 0; i < sizeof to / sizeof *to; i++) {
        if (g_light && i != 0) continue;
        run_cfg rest = {.model = GPT,
                        .data = g_text,
                        .strategy = to[i].strategy,
                        .batch = to[i].batch,
                        .steps = STEPS,
                        .resume = ck};
        size_t m = 0;
        if (to[i].ranks == 1) {
            progress pg = {{0}, 0};
            CHECK_OK(train(&rest, NULL, g_got, &m, &pg));
        } else {
            snprintf(path, sizeof path, "%s/rest%zu", g_dir, i);
            CHECK(run_ranks(to[i].ranks, &rest, path) == 0);
            m = dt_test_read_floats(path, g_got, CAP + STEPS + 1);
            m = m == g_n + STEPS + 1 ? g_n : 0;
        }
        const double d = m == g_n ? dt_test_maxdiff(g_ref, g_got, g_n) : 1e9;
        printf("resume: 10 steps tp2 x pp2 + 10 steps %s vs 20 steps 1 worker: max |param diff| %.2g\n", to[i].what, d);
        CHECK_MSG(d < DT_PP_TEST_TOL, "tp2 x pp2 -> %s resume differs by %g", to[i].what, d);
    }
    snprintf(ck, sizeof ck, "%s/one.safetensors", g_dir);
    run_cfg first = {.model = GPT, .data = g_text, .batch = GB, .steps = 10, .save = ck};
    progress pg = {{0}, 0};
    size_t m = 0;
    CHECK_OK(train(&first, NULL, g_got, &m, &pg));
    run_cfg again = {.model = GPT,
                     .data = g_text,
                     .strategy = "pp(stages=2,tp=2,microbatches=4,schedule=gpipe)",
                     .batch = GB,
                     .steps = STEPS,
                     .resume = ck};
    snprintf(path, sizeof path, "%s/again", g_dir);
    CHECK(run_ranks(4, &again, path) == 0);
    m = dt_test_read_floats(path, g_got, CAP + STEPS + 1);
    const double d = m == g_n + STEPS + 1 ? dt_test_maxdiff(g_ref, g_got, g_n) : 1e9;
    printf("resume: 10 steps 1 worker + 10 steps tp2 x pp2 vs 20 steps 1 worker: max |param diff| %.2g\n", d);
    CHECK_MSG(d < DT_PP_TEST_TOL, "1 worker -> tp2 x pp2 resume differs by %g", d);
}

/* The final parameters of N ranks under spec, trained 20 steps from the checkpoint resume (NULL:
 * from the start), or of 1 worker in this process (N 1), against the 1-worker run; *dl: its
 * epoch loss minus 1 worker's (from the metrics), when asked. */
static double params_vs_one(int N, const char *spec, int batch, const char *resume, const char *tag, double *dl) {
    char path[128], mp[128];
    snprintf(path, sizeof path, "%s/%s", g_dir, tag);
    snprintf(mp, sizeof mp, "%s/%s.json", g_dir, tag);
    run_cfg rc = {.model = GPT,
                  .data = g_text,
                  .strategy = spec,
                  .batch = batch,
                  .steps = STEPS,
                  .resume = resume,
                  .metrics = dl ? mp : NULL};
    size_t m = 0;
    if (N == 1) {
        progress pg = {{0}, 0};
        const dt_status st = train(&rc, NULL, g_got, &m, &pg);
        CHECK_MSG(st == DT_OK, "%s: %s", tag, dt_last_error());
        if (st != DT_OK) return 1e9;
    } else {
        const int failed = run_ranks(N, &rc, path);
        char msg[512];
        rank_error(path, 0, msg, sizeof msg);
        CHECK_MSG(failed == 0, "%s: %d rank(s) failed; rank 0: %s", tag, failed, msg);
        m = dt_test_read_floats(path, g_got, CAP + STEPS + 1);
        m = m == g_n + STEPS + 1 ? g_n : 0;
    }
    if (dl) {
        char m1[128];
        snprintf(m1, sizeof m1, "%s/zone.json", g_dir);
        const double a = metric(mp, "train_loss"), b = metric(m1, "train_loss");
        *dl = a > 0 && b > 0 ? a - b : 1e9;
    }
    return m == g_n ? dt_test_maxdiff(g_ref, g_got, g_n) : 1e9;
}

/* ZeRO 1, 2 and 3 over the DP axis of dp2 x tp2 x pp2 (each rank's shard tensors of its stage
 * cut over its 2 DP peers; stage 3's gathers in node hooks chained with the shard's): 20 steps as 1 worker (parameters,
 * epoch loss); saved after 10 steps, resumed on 1 worker; a 1-worker checkpoint of step 10 resumed under it. */
static void test_zero(void) {
    char one_ck[128], ck[128], spec[96], tag[32];
    snprintf(one_ck, sizeof one_ck, "%s/zone.safetensors", g_dir);
    char m1[128];
    snprintf(m1, sizeof m1, "%s/zone.json", g_dir);
    run_cfg one = {.model = GPT, .data = g_text, .batch = GB, .steps = STEPS, .metrics = m1};
    progress pg = {{0}, 0};
    size_t m = 0;
    CHECK_OK(train(&one, NULL, g_got, &m, &pg)); /* the 1-worker epoch loss */
    run_cfg first = {.model = GPT, .data = g_text, .batch = GB, .steps = 10, .save = one_ck};
    CHECK_OK(train(&first, NULL, g_got, &m, &pg));
    for (int z = 1; z <= 3; z++) {
        if (g_light && z != 3) continue;
        snprintf(spec, sizeof spec, "pp(stages=2,tp=2,microbatches=2,schedule=%s,zero=%d)", z == 1 ? "1f1b" : "gpipe",
                 z);
        double dl = 0;
        snprintf(tag, sizeof tag, "z%d", z);
        double d = params_vs_one(8, spec, GB / 2, NULL, tag, &dl);
        printf("dp2 x tp2 x pp2 zero=%d: max |param - 1 worker| %.2g, |epoch loss - 1 worker| %.2g over 20 steps\n", z,
               d, dl < 0 ? -dl : dl);
        CHECK_MSG(d < DT_PP_TEST_TOL && dl < DT_PP_TEST_TOL && -dl < DT_PP_TEST_TOL,
                  "dp2 x tp2 x pp2 zero=%d: params "
                  "differ by %g, loss by %g",
                  z, d, dl);
        snprintf(ck, sizeof ck, "%s/z%d.safetensors", g_dir, z);
        snprintf(tag, sizeof tag, "zh%d", z);
        char path[128];
        snprintf(path, sizeof path, "%s/%s", g_dir, tag);
        run_cfg half = {.model = GPT, .data = g_text, .strategy = spec, .batch = GB / 2, .steps = 10, .save = ck};
        CHECK(run_ranks(8, &half, path) == 0);
        d = params_vs_one(1, NULL, GB, ck, "zr1", NULL);
        printf("resume: 10 steps dp2 x tp2 x pp2 zero=%d + 10 steps 1 worker vs 20 steps 1 worker: max |param diff| "
               "%.2g\n",
               z, d);
        CHECK_MSG(d < DT_PP_TEST_TOL, "dp2 x tp2 x pp2 zero=%d -> 1 worker resume differs by %g", z, d);
        snprintf(tag, sizeof tag, "za%d", z);
        d = params_vs_one(8, spec, GB / 2, one_ck, tag, NULL);
        printf("resume: 10 steps 1 worker + 10 steps dp2 x tp2 x pp2 zero=%d vs 20 steps 1 worker: max |param diff| "
               "%.2g\n",
               z, d);
        CHECK_MSG(d < DT_PP_TEST_TOL, "1 worker -> dp2 x tp2 x pp2 zero=%d resume differs by %g", z, d);
    }
}

/* tp2 x pp2: world rank 0 (stage 0, tp rank 0) dies after step 3; every other rank fails (no
 * hang) naming a rank and the operation. */
static void test_killed_rank(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/kill", g_dir);
    run_cfg rc = {.model = GPT,
                  .data = g_text,
                  .strategy = "pp(stages=2,tp=2,microbatches=2,schedule=1f1b)",
                  .batch = GB,
                  .steps = 1000,
                  .die_at = 3};
    setenv("DTRAIN_TIMEOUT", "60", 1);
    const double t0 = dt_now();
    CHECK(run_ranks(4, &rc, path) == 4);
    for (int r = 1; r < 4; r++) {
        char msg[1024];
        rank_error(path, r, msg, sizeof msg);
        printf("killed world rank 0 (stage 0, tp 0), rank %d says (%.1f s): %s", r, dt_now() - t0,
               msg[0] ? msg : "(nothing)\n");
        CHECK_MSG((strstr(msg, "pipeline stage") || strstr(msg, "tensor parallel")) && strstr(msg, "rank ") &&
                      (strstr(msg, "receiving") || strstr(msg, "sending") || strstr(msg, "allreduce")) &&
                      (strstr(msg, "died") || strstr(msg, "left")),
                  "rank %d: %s", r, msg);
        /* its tp peer fails in a tp allreduce, its pipeline neighbour receiving from it: both name rank 0 */
        if (r == 1) CHECK_MSG(strstr(msg, "tensor parallel") && strstr(msg, "rank 0 died"), "rank 1: %s", msg);
        if (r == 2) CHECK_MSG(strstr(msg, "from stage 0 (rank 0)") != NULL, "rank 2 does not name rank 0: %s", msg);
        /* the transport's rank numbers are of the 2-rank pipeline group: the message says whose */
        if (r == 2) CHECK_MSG(strstr(msg, "world ranks 0, 2") != NULL, "rank 2's group is not named: %s", msg);
    }
}

int main(void) {
    g_light = getenv("DTRAIN_SANITIZED") != NULL;
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-tppp-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    char corpus[128];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", g_dir);
    dt_test_write_corpus(corpus, g_text, sizeof g_text);
    run_cfg one = {.model = GPT, .data = g_text, .batch = GB, .steps = STEPS};
    reference(&one, g_ref, &g_n);
    test_layouts();
    test_dp_mesh();
    test_resume();
    test_zero();
    test_killed_rank();
    dt_test_remove_dir(g_dir);
    return dt_test_summary("tp_pp_test");
}
