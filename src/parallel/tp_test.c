/* Tensor parallelism and the mesh over real shared-memory ranks (forked processes), each layout
 * against one process at the same global batch of 8 on a GPT (gpt:L=2,H=4,C=32,T=16, V=256):
 *  - tp2, tp4 and dp2 x tp2 give the same loss at every one of 20 AdamW steps (|diff| <= 5e-6 of
 *    ~5.5 nats; seen <= 3e-7) and the same final whole parameters (max |diff| <= 5e-5 on values
 *    ~0.02-1, under 2% of one step of lr 3e-3; seen <= 2.2e-5): float rounding of other GEMM shapes
 *    and of the sums' order, which Adam's normalised steps amplify where a gradient is tiny;
 *  - the tp axis's byte counters equal Megatron's 4 b s h values x 2(t-1)/t per block per step;
 *  - --grad-accum 2 under tp2 and dp2 x tp2 gives the same steps;
 *  - --clip under tp clips by the norm of the whole gradient (same result as 1 process);
 *  - ZeRO 1, 2 and 3 over the dp axis (dp2 x tp2, tp(zero=N)): the same losses and parameters as
 *    1 process, and the whole optimizer moments a checkpoint gets (rank 0 after sync, gathered from
 *    the ZeRO shards) equal 1 process's (|diff| <= 5e-5); with --clip too; pp(tp=2,zero=4) is refused;
 *  - a stop (SIGTERM) seen by rank 0 alone stops the whole tp group after one step, checkpointed;
 *  - a tp rank that dies mid-run is reported by its peer with the rank and the operation;
 *  - a tp that does not divide the heads, width and vocabulary is refused saying what divides;
 *  - mesh coordinates: rank = (dp_i PP + pp_i) TP + tp_i;
 *  - the marks (dt_model_mark_tp): the GPT builder's give every tensor the split the nanoGPT
 *    module names gave before (c_attn ROWS3, c_fc and wte ROWS, c_proj COLS / RANK0, the rest
 *    REPL); the sequential builder marks linear -> elementwise -> linear pairs (not an unpaired
 *    linear, nor across a dropout) and its shard narrows the column-parallel linear; bad marks
 *    are refused naming the node.
 * Under the sanitizers (DTRAIN_SANITIZED) the runs take 6 steps. */
#include "nn/graph_parallel.h"
#include "core/test.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"
#include "parallel/mesh.h"
#include "parallel/parallel_testlib.h"
#include "parallel/strategy.h"
#include "parallel/tp.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *MODEL = "gpt:L=2,H=4,C=32,T=16";
enum { CAP = 1 << 17, GB = 8, T = 16, L = 2, C = 32, MAXSTEPS = 20 };
static int g_steps = MAXSTEPS, g_accum = 1;
static char g_dir[64];
static float g_mom[2 * CAP]; /* after train: the whole optimizer moments the state visitor gives rank 0 */

/* Global batch `step`: GB samples of T+1 tokens (ids, then the next ids as targets). */
static void batch(int64_t step, int32_t *x, int32_t *y) {
    for (int i = 0; i < GB; i++)
        for (int t = 0; t <= T; t++) {
            int32_t v = (int32_t)(dt_rng_u64(77, (uint64_t)step, (uint64_t)(i * (T + 1) + t)) % 256);
            if (t < T) x[i * T + t] = v;
            if (t > 0) y[i * T + t - 1] = v;
        }
}

/* A state piece "optim.<m|v>.<tensor>" into g_mom (moment k at k * CAP + the tensor's offset). */
static dt_status take_moment(void *ctx, const dt_state_piece *p) {
    dt_model *m = ctx;
    const int k = !strncmp(p->name, "optim.v.", 8) ? 1 : !strncmp(p->name, "optim.m.", 8) ? 0 : -1;
    const int i = k < 0 ? -1 : dt_model_find_tensor(m, p->name + 8);
    if (i >= 0 && dt_model_tensor(m, i)->offset + p->offset + p->buf.count <= CAP)
        memcpy(g_mom + (size_t)k * CAP + dt_model_tensor(m, i)->offset + p->offset, p->buf.data,
               p->buf.count * sizeof(float));
    return DT_OK;
}

typedef struct {
    double loss[MAXSTEPS]; /* this rank's loss sum per step */
    dt_tp_counters cnt;
    int steps;
} rank_out;

/* Trains g_steps steps of the global batch under spec (comm NULL: one process, "single"); this
 * rank takes samples [dp_i GB/dp, (dp_i+1) GB/dp). The whole parameters go to params. */
static dt_status train(const char *spec, dt_comm *comm, float clip, int die_after, float *params, size_t *n,
                       rank_out *out) {
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_strategy *s = NULL;
    DT_TRY(dt_model_build(&m, MODEL, 0, 0, 0));
    dt_model_init(m, 5);
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAMW);
    dt_status st = dt_optim_create(&o, &oc, dt_model_num_params(m));
    if (st == DT_OK) st = dt_strategy_create(&s, spec, comm, m, o, NULL);
    if (st == DT_OK) st = s->ops->init(s);
    static int32_t x[GB * T], y[GB * T];
    const int dw = s ? s->data_world : 1, dr = s ? s->data_rank : 0, per = GB / dw;
    for (int k = 0; st == DT_OK && k < g_steps; k++) {
        if (k == die_after) _exit(0); /* a rank that vanishes without a word */
        batch(k, x, y);
        dt_step_batch b = {.feed = {.x = x + dr * per * T, .y = y + dr * per * T, .n = per},
                           .n_global = GB,
                           .world = dw,
                           .accum = g_accum,
                           .step = k,
                           .lr = 3e-3f,
                           .clip = clip};
        dt_step_result r;
        st = dt_strategy_train_step(s, &b, &r);
        out->loss[k] = r.loss_sum;
    }
    out->steps = g_steps;
    if (st == DT_OK && s->ops->sync) st = s->ops->sync(s);
    memset(g_mom, 0, sizeof g_mom);
    if (st == DT_OK && (!comm || dt_comm_rank(comm) == 0)) st = dt_strategy_visit_state(s, take_moment, m);
    dt_tp_counters_of(s, &out->cnt);
    *n = dt_model_num_params(m);
    if (st == DT_OK && *n <= CAP) memcpy(params, dt_model_params(m), *n * sizeof(float));
    dt_strategy_destroy(s);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return st;
}

static float g_ref[CAP], g_got[CAP];
static size_t g_nref;
static rank_out g_ref_out;

/* Forks N ranks under spec; rank r writes its rank_out to DIR/<tag>.<r> and rank 0 the whole
 * parameters to DIR/<tag>.params. Returns the number of failed ranks. */
static int run_ranks(int N, const char *spec, const char *tag, float clip) {
    char job[64];
    snprintf(job, sizeof job, "tp%s%d", tag, (int)getpid());
    for (int r = 0; r < N; r++)
        if (fork() == 0) {
            dt_comm *c = dt_test_rank_comm(r, N, job);
            static float p[CAP];
            static rank_out ro;
            size_t n = 0;
            if (train(spec, c, clip, -1, p, &n, &ro) != DT_OK) {
                fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
                _exit(3);
            }
            char path[128];
            snprintf(path, sizeof path, "%s/%s.%d", g_dir, tag, r);
            if (dt_test_write_floats(path, (const float *)&ro, sizeof ro / sizeof(float)) != 0) _exit(5);
            snprintf(path, sizeof path, "%s/%s.params", g_dir, tag);
            if (r == 0 && dt_test_write_floats(path, p, n) != 0) _exit(5);
            snprintf(path, sizeof path, "%s/%s.moments", g_dir, tag);
            if (r == 0 && dt_test_write_floats(path, g_mom, 2 * CAP) != 0) _exit(5);
            dt_comm_destroy(c);
            _exit(0);
        }
    return dt_test_wait_children();
}

static void read_out(const char *tag, int r, rank_out *ro) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s.%d", g_dir, tag, r);
    memset(ro, 0, sizeof *ro);
    dt_test_read_floats(path, (float *)ro, sizeof *ro / sizeof(float));
}

/* tp x dp ranks against one process: losses per step, final parameters, byte counters. */
static void check_layout(int tp, int dp) {
    char spec[64], tag[16];
    snprintf(spec, sizeof spec, "tp(tp=%d,bucket_mb=0.01)", tp);
    snprintf(tag, sizeof tag, "t%dd%da%d", tp, dp, g_accum);
    CHECK(run_ranks(tp * dp, spec, tag, 0) == 0);
    double dl = 0;
    for (int k = 0; k < g_steps; k++) {
        double sum = 0;
        for (int d = 0; d < dp; d++) {
            rank_out ro;
            read_out(tag, dt_mesh_rank(tp, 1, 0, 0, d), &ro);
            sum += ro.loss[k];
        }
        dl = fmax(dl, fabs(sum / GB - g_ref_out.loss[k] / GB));
    }
    char path[128];
    snprintf(path, sizeof path, "%s/%s.params", g_dir, tag);
    const size_t m = dt_test_read_floats(path, g_got, CAP);
    const double dp_ = m == g_nref ? dt_test_maxdiff(g_ref, g_got, m) : 1e9;
    printf("tp%d x dp%d%s: max |loss - 1 worker| = %.3g over %d steps, max |params - 1 worker| = %.3g (%zu params)\n",
           tp, dp, g_accum > 1 ? " x 2 micro-batches" : "", dl, g_steps, dp_, m);
    CHECK_MSG(dl <= 5e-6, "tp%d dp%d loss diff %g", tp, dp, dl);
    CHECK_MSG(dp_ <= 5e-5, "tp%d dp%d param diff %g", tp, dp, dp_);
    /* Megatron: 4 allreduces of b s h values per block per step, 2(t-1)/t of them moved per rank */
    rank_out ro;
    read_out(tag, 0, &ro);
    const double per_block = 4.0 * (GB / dp) * T * C * sizeof(float) * 2.0 * (tp - 1) / tp;
    printf("tp%d x dp%d: tp bytes in blocks %llu = %d steps x %d blocks x %.0f (Megatron 4bsh x 2(t-1)/t), ops %llu, "
           "around blocks %llu, dp axis %llu\n",
           tp, dp, (unsigned long long)ro.cnt.block_bytes, g_steps, L, per_block, (unsigned long long)ro.cnt.block_ops,
           (unsigned long long)ro.cnt.other_bytes, (unsigned long long)ro.cnt.dp_bytes);
    CHECK((double)ro.cnt.block_bytes == per_block * L * g_steps);
    CHECK(ro.cnt.block_ops == (uint64_t)(4 * L * g_steps * g_accum)); /* per micro-batch */
    CHECK(dp == 1 ? ro.cnt.dp_bytes == 0 : ro.cnt.dp_bytes > 0);
}

/* --clip 0.05 (it clips at every step here) under tp2 equals one process with the same clip. */
static void check_clip(void) {
    static float ref[CAP];
    static rank_out ro;
    size_t n = 0;
    CHECK_OK(train("single", NULL, 0.05f, -1, ref, &n, &ro));
    CHECK(run_ranks(2, "tp(tp=2)", "clip", 0.05f) == 0);
    char path[128];
    snprintf(path, sizeof path, "%s/clip.params", g_dir);
    const size_t m = dt_test_read_floats(path, g_got, CAP);
    const double d = m == n ? dt_test_maxdiff(ref, g_got, n) : 1e9, moved = dt_test_maxdiff(ref, g_ref, n);
    printf("tp2 --clip 0.05: max |params - 1 worker with the clip| = %.3g (the clip moved them by %.3g)\n", d, moved);
    CHECK_MSG(d <= 5e-5, "clip diff %g", d);
    CHECK(moved > 1e-3); /* the clip acted */
}

/* ZeRO stage `zero` over the dp axis of dp2 x tp2 (clip > 0: --clip too) against one process:
 * losses, parameters, and the whole moments rank 0's checkpoint gets from the ZeRO shards. */
static void check_zero(int zero, float clip) {
    static float ref[CAP], ref_mom[2 * CAP], got_mom[2 * CAP];
    static rank_out ro1;
    size_t n = 0;
    CHECK_OK(train("single", NULL, clip, -1, ref, &n, &ro1));
    memcpy(ref_mom, g_mom, sizeof ref_mom);
    char spec[64], tag[16], path[128];
    snprintf(spec, sizeof spec, "tp(tp=2,bucket_mb=0.01,zero=%d)", zero);
    snprintf(tag, sizeof tag, "z%dc%d", zero, clip > 0);
    CHECK(run_ranks(4, spec, tag, clip) == 0);
    double dl = 0;
    for (int k = 0; k < g_steps; k++) {
        rank_out a, b;
        read_out(tag, dt_mesh_rank(2, 1, 0, 0, 0), &a), read_out(tag, dt_mesh_rank(2, 1, 0, 0, 1), &b);
        dl = fmax(dl, fabs((a.loss[k] + b.loss[k]) / GB - ro1.loss[k] / GB));
    }
    snprintf(path, sizeof path, "%s/%s.params", g_dir, tag);
    const size_t m = dt_test_read_floats(path, g_got, CAP);
    snprintf(path, sizeof path, "%s/%s.moments", g_dir, tag);
    const size_t mm = dt_test_read_floats(path, got_mom, 2 * CAP);
    const double dp_ = m == n ? dt_test_maxdiff(ref, g_got, n) : 1e9;
    const double dm = mm == 2 * CAP
                          ? fmax(dt_test_maxdiff(ref_mom, got_mom, n), dt_test_maxdiff(ref_mom + CAP, got_mom + CAP, n))
                          : 1e9;
    double big = 0; /* the moments are there (not all zeros) */
    for (size_t i = 0; i < n; i++) big = fmax(big, fabs(ref_mom[i]));
    printf("dp2 x tp2 zero=%d%s: max |loss - 1 worker| = %.3g, |params - 1 worker| = %.3g, |checkpoint moments - 1 "
           "worker's| = %.3g (largest m %.3g)\n",
           zero, clip > 0 ? " --clip 0.05" : "", dl, dp_, dm, big);
    CHECK_MSG(dl <= 5e-6, "zero=%d loss diff %g", zero, dl);
    CHECK_MSG(dp_ <= 5e-5, "zero=%d param diff %g", zero, dp_);
    CHECK_MSG(dm <= 5e-5 && big > 1e-4, "zero=%d moment diff %g", zero, dm);
}

/* A ZeRO stage past 3 for a pipeline of tp shards is refused, saying which stages exist. */
static void check_zero_refused(void) {
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_strategy *s = NULL;
    CHECK_OK(dt_model_build(&m, MODEL, 0, 0, 0));
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAMW);
    CHECK_OK(dt_optim_create(&o, &oc, dt_model_num_params(m)));
    CHECK(dt_strategy_create(&s, "pp(stages=2,tp=2,zero=4)", NULL, m, o, NULL) == DT_EINVAL && !s);
    printf("pp(tp=2,zero=4): %s\n", dt_last_error());
    CHECK(strstr(dt_last_error(), "zero=4") && strstr(dt_last_error(), "3 (and the parameters)"));
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

/* Rank 1 of an N-rank tp(2) mesh (N 2: tp2; N 4: dp2 x tp2) vanishes before step 3: every other
 * rank fails (no hang) with an error naming a dead or departed rank and the axis's collective. */
static void check_dead_rank(int N) {
    char job[64], path[128];
    snprintf(job, sizeof job, "tpdead%d_%d", N, (int)getpid());
    for (int r = 0; r < N; r++)
        if (fork() == 0) {
            dt_comm *c = dt_test_rank_comm(r, N, job);
            static float p[CAP];
            static rank_out ro;
            size_t n = 0;
            dt_status s = train("tp(tp=2)", c, 0, r == 1 ? 3 : -1, p, &n, &ro);
            snprintf(path, sizeof path, "%s/dead%d.%d", g_dir, N, r);
            FILE *f = fopen(path, "w");
            if (f) fprintf(f, "%s", s == DT_OK ? "ok" : dt_last_error()), fclose(f);
            _exit(s == DT_EPEER || s == DT_ETIMEDOUT ? 0 : 4);
        }
    const double t0 = dt_now();
    CHECK(dt_test_wait_children() == 0);
    for (int r = 0; r < N; r++) {
        if (r == 1) continue;
        char msg[1024] = "";
        snprintf(path, sizeof path, "%s/dead%d.%d", g_dir, N, r);
        FILE *f = fopen(path, "r");
        if (f) {
            size_t k = fread(msg, 1, sizeof msg - 1, f);
            msg[k] = 0;
            fclose(f);
        }
        printf("%d ranks, rank 1 killed before step 3: rank %d says \"%s\" (%.1f s)\n", N, r, msg, dt_now() - t0);
        CHECK_MSG((strstr(msg, "died") || strstr(msg, "left")) && strstr(msg, "allreduce") &&
                      (strstr(msg, "tensor parallel") || strstr(msg, "data-parallel axis")),
                  "rank %d: %s", r, msg);
        if (r == 0) CHECK_MSG(strstr(msg, "rank 1 died") && strstr(msg, "world rank 0+i"), "%s", msg);
    }
}

/* The stop flag (a SIGTERM) set on rank 0 alone: both tp ranks stop after the same step and the
 * gathered checkpoint is written (a tp group is one data rank, yet every rank votes). */
static volatile sig_atomic_t g_stop;
static void stop_at_3(void *ctx, const dt_progress_info *p) {
    (void)ctx;
    if (p->global_step >= 3) g_stop = 1;
}

static void check_stop(void) {
    char job[64], corpus[128], data[160], ck[128];
    snprintf(job, sizeof job, "tpstop%d", (int)getpid());
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", g_dir);
    snprintf(data, sizeof data, "text:%s", corpus);
    snprintf(ck, sizeof ck, "%s/stop.safetensors", g_dir);
    FILE *f = fopen(corpus, "w");
    for (int i = 0; f && i < 4000; i++) fputc("the lord said unto moses .\n"[dt_rng_u64(4, 1, (uint64_t)i) % 27], f);
    if (f) fclose(f);
    for (int r = 0; r < 2; r++)
        if (fork() == 0) {
            dt_comm *c = dt_test_rank_comm(r, 2, job);
            dt_train_config cfg = dt_train_defaults();
            cfg.data = data, cfg.model = MODEL, cfg.batch = 4, cfg.epochs = 100, cfg.comm = c,
            cfg.strategy = "tp(tp=2)";
            cfg.save = ck, cfg.stop = &g_stop, cfg.on_progress = stop_at_3, cfg.progress_interval_s = 1e-9;
            dt_trainer *t = NULL;
            dt_status s = dt_trainer_create(&t, &cfg);
            if (s == DT_OK) s = dt_trainer_run(t);
            if (s != DT_EINTR) fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
            dt_trainer_destroy(t);
            _exit(s == DT_EINTR ? 0 : 4);
        }
    const int failed = dt_test_wait_children();
    const bool saved = access(ck, R_OK) == 0;
    printf("tp2: stop flag on rank 0 only: %d rank(s) did not stop cleanly, checkpoint %s\n", failed,
           saved ? "written" : "MISSING");
    CHECK(failed == 0 && saved);
}

static void check_divisibility(void) {
    dt_gpt_config g;
    CHECK_OK(dt_gpt_parse(MODEL, &g));
    dt_model *m = NULL;
    CHECK(dt_gpt_create_sharded(&m, &g, 3) == DT_EINVAL && m == NULL);
    printf("tp3: %s\n", dt_last_error());
    CHECK(strstr(dt_last_error(), "`tp` 3") && strstr(dt_last_error(), "choose `tp` 1, 2, 4"));
    CHECK(dt_gpt_check_tp(&g, 4) == DT_OK && dt_gpt_check_tp(&g, 8) == DT_EINVAL);
    dt_mesh mesh;
    CHECK(dt_mesh_create(&mesh, NULL, 2, 1) == DT_EINVAL); /* 2 ranks per copy in a world of 1 */
}

static void check_mesh_order(void) {
    /* TP innermost, then PP, then DP: 2 x 2 x 2 */
    int tr, pr, dr;
    dt_mesh_coords(5, 2, 2, &tr, &pr, &dr);
    CHECK(tr == 1 && pr == 0 && dr == 1);
    for (int r = 0; r < 8; r++) {
        dt_mesh_coords(r, 2, 2, &tr, &pr, &dr);
        CHECK(dt_mesh_rank(2, 2, tr, pr, dr) == r);
    }
}

/* The split of tensor name in m. */
static dt_tp_split split(const dt_model *m, const char *name) {
    CHECK_MSG(dt_model_find_tensor(m, name) >= 0, "no tensor %s", name);
    return dt_tp_split_of(m, name);
}

static void check_marks(void) {
    dt_gpt_config g;
    CHECK_OK(dt_gpt_parse(MODEL, &g));
    dt_model *m = NULL, *s = NULL;
    CHECK_OK(dt_gpt_create(&m, &g));
    CHECK(split(m, "transformer.h.1.attn.c_attn.weight") == DT_TP_ROWS3);
    CHECK(split(m, "transformer.h.0.attn.c_attn.bias") == DT_TP_ROWS3);
    CHECK(split(m, "transformer.h.0.mlp.c_fc.weight") == DT_TP_ROWS);
    CHECK(split(m, "transformer.h.1.mlp.c_fc.bias") == DT_TP_ROWS);
    CHECK(split(m, "transformer.h.0.attn.c_proj.weight") == DT_TP_COLS);
    CHECK(split(m, "transformer.h.1.mlp.c_proj.bias") == DT_TP_RANK0);
    CHECK(split(m, "transformer.wte.weight") == DT_TP_ROWS && split(m, "transformer.wpe.weight") == DT_TP_REPL);
    CHECK(split(m, "transformer.h.0.ln_1.weight") == DT_TP_REPL && split(m, "transformer.ln_f.bias") == DT_TP_REPL);
    CHECK(dt_model_mark_tp(m, dt_model_num_nodes(m), DT_TP_MARK_ROW, 1) == DT_EINVAL);
    CHECK(dt_model_mark_tp(m, 1, DT_TP_MARK_ROW, 3) == DT_EINVAL && strstr(dt_last_error(), "parts"));
    dt_model_destroy(m);
    /* layers 0 and 3 a pair (through relu, tanh); 5 unpaired; 6 -> 8 not (a dropout between) */
    static const char *seq = "linear(8) relu tanh linear(6) relu linear(4) linear(6) dropout(0.1) linear(4)";
    CHECK_OK(dt_model_create_from_spec(&m, seq, 1, 2, 2));
    CHECK(split(m, "0.weight") == DT_TP_ROWS && split(m, "0.bias") == DT_TP_ROWS);
    CHECK(split(m, "3.weight") == DT_TP_COLS && split(m, "3.bias") == DT_TP_RANK0);
    CHECK(split(m, "5.weight") == DT_TP_REPL && split(m, "6.weight") == DT_TP_REPL);
    CHECK(split(m, "8.weight") == DT_TP_REPL);
    CHECK_OK(dt_model_create_tp_shard(&s, m, 2, false));
    const dt_param_info *w0 = dt_model_tensor(s, dt_model_find_tensor(s, "0.weight"));
    const dt_param_info *w3 = dt_model_tensor(s, dt_model_find_tensor(s, "3.weight"));
    CHECK(w0->shape[0] == 4 && w0->shape[1] == 4 && w3->shape[0] == 6 && w3->shape[1] == 4);
    CHECK(split(s, "0.weight") == DT_TP_ROWS && split(s, "3.bias") == DT_TP_RANK0);
    dt_model_destroy(s);
    CHECK(dt_model_create_tp_shard(&s, m, 3, false) == DT_EINVAL && s == NULL);
    CHECK(strstr(dt_last_error(), "linear(8)") && strstr(dt_last_error(), "`tp` 3"));
    dt_model_destroy(m);
    CHECK_OK(dt_model_create_from_spec(&m, "linear(8) linear(4)", 1, 2, 2));
    CHECK(!dt_model_has_tp_marks(m));
    dt_model_destroy(m);
}

int main(void) {
    if (getenv("DTRAIN_SANITIZED")) g_steps = 6;
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-tp-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    check_mesh_order();
    check_divisibility();
    check_marks();
    CHECK_OK(train("single", NULL, 0, -1, g_ref, &g_nref, &g_ref_out));
    check_layout(2, 1);
    check_layout(4, 1);
    check_layout(2, 2);
    g_accum = 2; /* micro-batches of 2 (tp2) and 1 (dp2 x tp2): the same steps */
    check_layout(2, 1);
    check_layout(2, 2);
    g_accum = 1;
    check_clip();
    check_zero(1, 0);
    check_zero(2, 0);
    check_zero(2, 0.05f);
    check_zero(3, 0);
    check_zero(3, 0.05f);
    check_zero_refused();
    check_stop();
    check_dead_rank(2);
    check_dead_rank(4);
    dt_test_remove_dir(g_dir);
    return dt_test_summary("tp_test");
}
