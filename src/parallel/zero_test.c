/* ZeRO over real shared-memory ranks (forked processes), against plain ddp at the same world
 * size and global batch, after 20 steps (to float rounding; the shards' reduce-scatter sums in
 * another order than the allreduce):
 *  - the MLP on a small CSV (4 buckets): stages 1, 2, 3 at 2, 3 and 4 ranks with SGD+momentum,
 *    Adam and AdamW (the whole product; under ASan 2 and 3 ranks with Adam);
 *  - a CNN with batchnorm on a small IDX image set: stages 1, 2, 3 at 3 ranks, SGD+momentum;
 *  - the GPT (tied embedding and head: one tensor in two layers' gathers) with --clip: stages
 *    1, 2, 3 at 2 and 4 ranks, AdamW;
 *  - every rank ends with the same parameters; the optimizer state of each rank is its shard;
 *  - a stage-3 checkpoint written at 4 ranks after 10 steps resumes at 2 ranks with stage 1 and
 *    at 1 rank without ZeRO, and both end at the parameters of an uninterrupted 4-rank ddp run;
 *  - shards: balanced chunks with the remainder to the last rank, every value owned once;
 *  - stage 3 places a rank's shards from set-up on (ddp's entry.place): the ranks' ranges cover
 *    the slab once, after dt_model_init the OS holds (mincore) only the rank's shard of the
 *    parameter slab, and its values are those of the whole model initialised on one worker;
 *  - memory is real: at 4 ranks the optimizer keeps a quarter of the state, and the bytes the
 *    allocator holds drop by the gradients (stage 2) and three quarters of the parameters
 *    (stage 3) once the strategy starts, and stay down through training steps. */
#include "core/test.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"
#include "parallel/parallel_testlib.h"
#include "parallel/strategy.h"
#include "parallel/zero.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

enum { CAP = 1 << 16 };
static char g_dir[64], g_csv[128], g_img[128], g_txt[256];
static bool g_asan;

typedef struct {
    const char *data, *model, *strategy;
    dt_optim_kind opt;
    int batch, accum;
    int64_t steps;
    float clip;
    const char *save, *resume;
} run_cfg;

static dt_status train(const run_cfg *rc, dt_comm *comm, float *out, size_t *n) {
    dt_train_config cfg = dt_train_defaults();
    cfg.data = rc->data;
    cfg.model = rc->model;
    cfg.epochs = 5;
    cfg.batch = rc->batch;
    cfg.grad_accum = rc->accum > 0 ? rc->accum : 1;
    cfg.max_steps = rc->steps;
    cfg.seed = 7;
    cfg.optim = dt_optim_defaults(rc->opt);
    if (rc->opt == DT_OPTIM_SGD) cfg.optim.momentum = 0.9f;
    cfg.lr.base_lr = rc->opt == DT_OPTIM_SGD ? 0.05f : 0.01f;
    cfg.clip_norm = rc->clip;
    cfg.comm = comm;
    cfg.strategy = comm ? rc->strategy : NULL;
    cfg.save = rc->save;
    cfg.resume = rc->resume;
    dt_trainer *t;
    DT_TRY(dt_trainer_create(&t, &cfg));
    dt_status s = dt_trainer_run(t);
    *n = dt_model_num_params(dt_trainer_model(t));
    if (s == DT_OK && *n <= CAP) memcpy(out, dt_model_params(dt_trainer_model(t)), *n * sizeof(float));
    dt_trainer_destroy(t);
    return s;
}

/* N forked ranks (N = 1: one process); rank r writes its parameters to path.r. Returns the
 * number of failed ranks. */
static int run_ranks(int N, const run_cfg *rc, const char *path, const char *job) {
    for (int r = 0; r < N; r++)
        if (fork() == 0) {
            dt_comm *c = N > 1 ? dt_test_rank_comm(r, N, job) : NULL;
            static float p[CAP];
            size_t n = 0;
            dt_status s = train(rc, c, p, &n);
            if (s != DT_OK) {
                fprintf(stderr, "rank %d (%s): %s\n", r, rc->strategy, dt_last_error());
                _exit(3);
            }
            char f[256];
            snprintf(f, sizeof f, "%s.%d", path, r);
            if (dt_test_write_floats(f, p, n) != 0) _exit(5);
            dt_comm_destroy(c);
            _exit(0);
        }
    return dt_test_wait_children();
}

static float g_ref[CAP], g_got[CAP];

/* Runs rc at N ranks under `strategy` and returns the largest difference of any rank's
 * parameters from ref[0..n) (a failed run: infinity). */
static double run_vs(run_cfg rc, const char *strategy, int N, const float *ref, size_t n, const char *tag) {
    char path[160], job[64], f[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, tag);
    snprintf(job, sizeof job, "z%d%s", (int)getpid(), tag);
    rc.strategy = strategy;
    if (run_ranks(N, &rc, path, job) != 0) return INFINITY;
    double worst = 0;
    for (int r = 0; r < N; r++) {
        snprintf(f, sizeof f, "%s.%d", path, r);
        size_t m = dt_test_read_floats(f, g_got, CAP);
        double d = m == n ? dt_test_maxdiff(ref, g_got, n) : INFINITY;
        if (d > worst) worst = d;
    }
    return worst;
}

/* ddp at N ranks into g_ref; returns the parameter count (0: failed). */
static size_t ddp_ref(run_cfg rc, const char *strategy, int N, const char *tag) {
    char path[160], job[64], f[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, tag);
    snprintf(job, sizeof job, "z%d%s", (int)getpid(), tag);
    rc.strategy = strategy;
    if (run_ranks(N, &rc, path, job) != 0) return 0;
    snprintf(f, sizeof f, "%s.0", path);
    return dt_test_read_floats(f, g_ref, CAP);
}

/* For each N and optimizer: ddp, then stages 1..3 against it. */
static void compare_stages(const char *what, run_cfg rc, const char *ddp, const int *Ns, int nN,
                           const dt_optim_kind *opts, int nopt, double tol) {
    for (int oi = 0; oi < nopt; oi++)
        for (int k = 0; k < nN; k++) {
            const int N = Ns[k];
            rc.opt = opts[oi];
            char tag[32], spec[96];
            snprintf(tag, sizeof tag, "%s%d%d", what, oi, N);
            size_t n = ddp_ref(rc, ddp, N, tag);
            CHECK_MSG(n > 0, "%s: ddp at %d ranks failed", what, N);
            if (n == 0) continue;
            for (int stage = 1; stage <= 3; stage++) {
                snprintf(spec, sizeof spec, "%.*s%szero=%d)", (int)strlen(ddp) - 1, ddp, strchr(ddp, '=') ? "," : "",
                         stage);
                snprintf(tag, sizeof tag, "%s%d%dz%d", what, oi, N, stage);
                double d = run_vs(rc, spec, N, g_ref, n, tag);
                printf("%s %s N=%d %s: max |zero - ddp| = %.3g over %zu params\n", what, dt_optim_name(opts[oi]), N,
                       spec, d, n);
                CHECK_MSG(d < tol, "%s %s at %d ranks differs from ddp by %g", what, spec, N, d);
            }
        }
}

static void test_mlp(void) {
    run_cfg rc = {
        .data = g_csv, .model = "linear(16) relu linear(16) relu linear(16) relu linear(4)", .batch = 4, .steps = 20};
    const int Ns[] = {2, 3, 4}, Na[] = {2, 3};
    const dt_optim_kind opts[] = {DT_OPTIM_SGD, DT_OPTIM_ADAM, DT_OPTIM_ADAMW}, oa[] = {DT_OPTIM_ADAM};
    if (g_asan) compare_stages("mlp", rc, "ddp(bucket_mb=0.0005)", Na, 2, oa, 1, 2e-5);
    else compare_stages("mlp", rc, "ddp(bucket_mb=0.0005)", Ns, 3, opts, 3, 2e-5);
}

/* 203 samples at 4 ranks x 5: the epoch's last global batch of 3 leaves one rank without samples,
 * whose stage-3 gathers are replayed so every rank issues the same ones. */
static void test_empty_rank(void) {
    run_cfg rc = {.data = g_csv,
                  .model = "linear(16) relu linear(16) relu linear(4)",
                  .opt = DT_OPTIM_ADAM,
                  .batch = 5,
                  .steps = 14};
    const int Ns[] = {4};
    const dt_optim_kind opts[] = {DT_OPTIM_ADAM};
    compare_stages("empty", rc, "ddp(bucket_mb=0.0005)", Ns, 1, opts, 1, 2e-5);
}

static void test_cnn(void) {
    run_cfg rc = {.data = g_img,
                  .model = "conv(4,3,pad=1) batchnorm relu maxpool(2) flatten linear(10)",
                  .batch = 4,
                  .steps = 20};
    const int Ns[] = {3};
    const dt_optim_kind opts[] = {DT_OPTIM_SGD};
    compare_stages("cnn", rc, "ddp(bucket_mb=0.001)", Ns, 1, opts, 1, 2e-5);
}

static void test_gpt(void) {
    run_cfg rc = {.data = g_txt, .model = "gpt:L=2,H=2,C=16,T=16", .batch = 2, .steps = g_asan ? 8 : 20, .clip = 0.5f};
    const int Ns[] = {2, 4};
    const dt_optim_kind opts[] = {DT_OPTIM_ADAMW};
    compare_stages("gpt", rc, "ddp(bucket_mb=0.01)", Ns, g_asan ? 1 : 2, opts, 1, 2e-5);
}

/* --grad-accum: the gathers of every micro-batch's passes, stage 3 against ddp with the same accumulation. */
static void test_accum(void) {
    run_cfg rc = {.data = g_txt,
                  .model = "gpt:L=2,H=2,C=16,T=16",
                  .opt = DT_OPTIM_ADAMW,
                  .batch = 2,
                  .accum = 2,
                  .steps = g_asan ? 4 : 10};
    size_t n = ddp_ref(rc, "ddp(bucket_mb=0.01)", 2, "acc");
    CHECK(n > 0);
    double d = run_vs(rc, "ddp(bucket_mb=0.01,zero=3)", 2, g_ref, n, "accz3");
    printf("grad-accum 2: zero=3 vs ddp at 2 ranks: %.3g\n", d);
    CHECK_MSG(d < 2e-5, "zero=3 with --grad-accum 2 differs from ddp by %g", d);
}

/* Save at 4 ranks stage 3 after 10 steps; resume at 2 ranks stage 1 and at 1 rank without
 * ZeRO (the same global batch of 16) to step 20: both equal an uninterrupted 4-rank ddp run. */
static void test_reshard(void) {
    char ck[160];
    snprintf(ck, sizeof ck, "%s/z3.safetensors", g_dir);
    run_cfg rc = {.data = g_csv,
                  .model = "linear(16) relu linear(16) relu linear(4)",
                  .opt = DT_OPTIM_ADAM,
                  .batch = 4,
                  .steps = 20};
    size_t n = ddp_ref(rc, "ddp(bucket_mb=0.0005)", 4, "rsref");
    CHECK(n > 0);
    run_cfg save = rc;
    save.steps = 10, save.save = ck;
    char path[160], job[64];
    snprintf(path, sizeof path, "%s/rs3", g_dir);
    snprintf(job, sizeof job, "z%drs3", (int)getpid());
    save.strategy = "ddp(bucket_mb=0.0005,zero=3)";
    CHECK_MSG(run_ranks(4, &save, path, job) == 0, "the stage-3 run that saves failed");
    run_cfg r2 = rc;
    r2.batch = 8, r2.resume = ck;
    double d2 = run_vs(r2, "ddp(bucket_mb=0.0005,zero=1)", 2, g_ref, n, "rs2");
    run_cfg r1 = rc;
    r1.batch = 16, r1.resume = ck;
    double d1 = run_vs(r1, NULL, 1, g_ref, n, "rs1");
    printf("reshard: saved at 4 ranks zero=3 step 10; resumed to 20 at 2 ranks zero=1: %.3g, at 1 rank: %.3g from "
           "4-rank ddp\n",
           d2, d1);
    CHECK_MSG(d2 < 2e-5, "resumed at 2 ranks zero=1 differs from ddp by %g", d2);
    CHECK_MSG(d1 < 2e-5, "resumed at 1 rank differs from ddp by %g", d1);
}

static void test_chunks(void) {
    for (int N = 1; N <= 5; N++)
        for (size_t n = 0; n < 23; n++) {
            size_t next = 0, lo = (size_t)-1, hi = 0;
            for (int r = 0; r < N; r++) {
                size_t off, len;
                dt_zero_chunk(n, r, N, &off, &len);
                CHECK_MSG(off == next, "n=%zu N=%d rank %d starts at %zu, want %zu", n, N, r, off, next);
                next = off + len;
                if (r < N - 1) lo = len < lo ? len : lo, hi = len > hi ? len : hi;
            }
            CHECK_MSG(next == n, "n=%zu N=%d: the shards cover %zu values", n, N, next);
            CHECK(N == 1 || hi - lo == 0);
        }
}

/* Pages of [p, p + bytes) the OS holds resident (mincore). */
static size_t resident_pages(const void *p, size_t bytes) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1), e = ((uintptr_t)p + bytes + pg - 1) & ~(uintptr_t)(pg - 1);
    size_t n = (e - a) / pg, k = 0;
    unsigned char *v = malloc(n);
    if (v && mincore((void *)a, e - a, v) == 0)
        for (size_t i = 0; i < n; i++) k += v[i] & 1;
    free(v);
    return k;
}

static void test_placed_setup(void) {
    static const char *spec = "linear(512) relu linear(512) relu linear(4)";
    const dt_strategy_entry *e;
    dt_strategy_opts so;
    dt_model *whole, *m;
    CHECK_OK(dt_strategy_parse("ddp(bucket_mb=0.25,zero=3)", &e, &so));
    CHECK_OK(dt_model_create_from_spec(&whole, spec, 1, 1, 12));
    if (dt_test_failures) return;
    dt_model_init(whole, 7);
    const size_t P = dt_model_num_params(whole), pg = (size_t)sysconf(_SC_PAGESIZE);
    const int N = 4;
    size_t covered = 0;
    for (int r = 0; r < N; r++) {
        dt_range *own = NULL;
        int nown = 0;
        bool all = true;
        const dt_status built = dt_model_build_unplaced(&m, spec, 1, 1, 12);
        CHECK_OK(built);
        if (built != DT_OK) break;
        CHECK_OK(dt_strategy_placement(e, &so, m, r, N, &own, &nown, &all));
        CHECK_MSG(!all && nown > 1, "rank %d: ZeRO-3 places %s", r, all ? "the whole model" : "one range");
        size_t mine = 0, bad = 0;
        for (int i = 0; i < nown; i++) {
            CHECK(own[i].lo < own[i].hi && own[i].hi <= P && (i == 0 || own[i - 1].hi <= own[i].lo));
            mine += own[i].hi - own[i].lo;
        }
        covered += mine;
        CHECK_OK(dt_model_place(m, own, nown));
        dt_model_init(m, 7);
        const float *a = dt_model_params(m), *b = dt_model_params(whole);
        for (int i = 0; i < nown; i++)
            for (size_t k = own[i].lo; k < own[i].hi; k++) bad += memcmp(&a[k], &b[k], sizeof *a) != 0;
        CHECK_MSG(bad == 0, "rank %d: %zu of its %zu placed values differ from one worker's init", r, bad, mine);
        /* a range keeps the pages it shares with its neighbours (one each side), and the slab's
         * first and last page depend on the allocator's alignment (ASan's differs): whole = 4P */
        const size_t held = resident_pages(a, P * sizeof(float)) * pg,
                     limit = mine * sizeof(float) + pg * (2 * (size_t)nown + 2);
        CHECK_MSG(held <= limit,
                  "rank %d: after init the OS holds %zu bytes of the parameters, its shard is %zu in %d "
                  "ranges (whole: %zu)",
                  r, held, mine * sizeof(float), nown, P * sizeof(float));
        free(own);
        dt_model_destroy(m);
    }
    CHECK_MSG(covered == P, "the ranks' placements cover %zu of %zu values", covered, P);
    dt_model_destroy(whole);
}

/* In a forked rank: the bytes dt_alloc holds before and after ZeRO-`stage` starts and after 3 steps. */
static int memory_rank(int stage, int r, int N, const char *job) {
    dt_comm *c = dt_test_rank_comm(r, N, job);
    dt_model *m;
    dt_optim *o;
    dt_strategy *s;
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
    if (dt_model_create_from_spec(&m, "linear(512) relu linear(512) relu linear(4)", 1, 1, 12) != DT_OK) return 2;
    dt_model_init(m, 1);
    if (dt_optim_create(&o, &oc, dt_model_num_params(m)) != DT_OK) return 2;
    const double P = (double)dt_model_num_params(m), before = (double)dt_mem_used();
    char spec[64];
    snprintf(spec, sizeof spec, "ddp(bucket_mb=0.25,zero=%d)", stage);
    if (dt_strategy_create(&s, spec, c, m, o, NULL) != DT_OK || s->ops->init(s) != DT_OK) return 3;
    const double after = (double)dt_mem_used();
    float x[8 * 12];
    int32_t y[8];
    for (int i = 0; i < 8 * 12; i++) x[i] = dt_rng_uniform(2, (uint64_t)r, (uint64_t)i);
    for (int i = 0; i < 8; i++) y[i] = i % 4;
    double worst = 0, gathered = 0;
    for (int k = 0; k < 3; k++) {
        dt_step_batch b = {
            .feed = {.x = x, .y = y, .n = 8}, .n_global = 8 * N, .world = N, .accum = 1, .step = k, .lr = 0.01f};
        dt_step_result res;
        if (dt_strategy_train_step(s, &b, &res) != DT_OK) return 4;
        if ((double)dt_mem_used() > worst) worst = (double)dt_mem_used();
        gathered = res.st.gathered_peak_bytes;
    }
    /* expected drop: 3/4 of the optimizer's 8P bytes; stage >= 2 the 4P of gradients less the 4P/N
     * shard they are reduced into; stage 3 3/4 of the parameters' 4P */
    const double want = 6 * P + (stage >= 2 ? 4 * P - 4 * P / N : 0) + (stage == 3 ? 3 * P : 0);
    int bad = 0;
    if (fabs((double)dt_optim_size(o) - P / N) > 4 * 3) bad |= 1; /* the shard: P/N within a few values a bucket */
    if (before - after < 0.95 * want) bad |= 2;
    if (worst - after > 0.5 * P * 4) bad |= 4; /* steps bring back less than half the parameter bytes */
    /* stage 3's gathered layers in flight (bench zero's gath_MB): some, never more than all not owned */
    if ((stage == 3) != (gathered > 0) || gathered > 4 * P * (N - 1) / N) bad |= 8;
    if (bad)
        fprintf(stderr,
                "rank %d zero=%d: P %.0f, optimizer %zu, held %.0f -> %.0f (drop %.0f, want %.0f), steps %.0f, "
                "gathered %.0f\n",
                r, stage, P, dt_optim_size(o), before, after, before - after, want, worst, gathered);
    dt_strategy_destroy(s);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    dt_comm_destroy(c);
    return bad ? 10 + bad : 0;
}

static void test_memory(void) {
    for (int stage = 1; stage <= 3; stage++) {
        char job[64];
        snprintf(job, sizeof job, "z%dmem%d", (int)getpid(), stage);
        for (int r = 0; r < 4; r++)
            if (fork() == 0) _exit(memory_rank(stage, r, 4, job));
        int failed = dt_test_wait_children();
        CHECK_MSG(failed == 0, "zero=%d at 4 ranks: %d ranks hold more memory than their shard", stage, failed);
        printf("memory zero=%d at 4 ranks: the allocator's bytes drop by the state not owned%s\n", stage,
               failed ? " (FAILED)" : "");
    }
}

/* A tiny IDX image set (8x8 u8, 10 classes, a class-dependent bright square) in DIR/img. */
static void write_idx(const char *dir, const char *name, int n, int dims, uint64_t seed) {
    char p[200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    unsigned char hdr[4] = {0, 0, 8, (unsigned char)dims};
    fwrite(hdr, 1, 4, f);
    int shape[3] = {n, 8, 8};
    for (int d = 0; d < dims; d++) {
        unsigned char b[4] = {(unsigned char)(shape[d] >> 24), (unsigned char)(shape[d] >> 16),
                              (unsigned char)(shape[d] >> 8), (unsigned char)shape[d]};
        fwrite(b, 1, 4, f);
    }
    for (int i = 0; i < n; i++) {
        int y = (int)(dt_rng_u64(seed, 1, (uint64_t)i) % 10);
        if (dims == 1) {
            fputc(y, f);
            continue;
        }
        for (int k = 0; k < 64; k++) {
            int v = (int)(dt_rng_u64(seed, 2, (uint64_t)(i * 64 + k)) % 80) +
                    ((k / 8) % 5 == y % 5 && k % 8 >= y / 2 ? 150 : 0);
            fputc(v > 255 ? 255 : v, f);
        }
    }
    fclose(f);
}

static void write_data(void) {
    dt_test_write_toy_csv(g_dir, g_csv, "/tmp/dtrain-zero-XXXXXX", 5);
    snprintf(g_img, sizeof g_img, "%s/img", g_dir);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_img);
    if (system(cmd) != 0) abort();
    write_idx(g_img, "train-images-idx3-ubyte", 150, 3, 3);
    write_idx(g_img, "train-labels-idx1-ubyte", 150, 1, 3);
    write_idx(g_img, "t10k-images-idx3-ubyte", 30, 3, 4);
    write_idx(g_img, "t10k-labels-idx1-ubyte", 30, 1, 4);
    char p[200];
    snprintf(p, sizeof p, "%s/corpus.txt", g_dir);
    dt_test_write_corpus(p, g_txt, sizeof g_txt);
}

int main(void) {
    g_asan = getenv("DTRAIN_SANITIZED") != NULL;
    write_data();
    test_chunks();
    test_placed_setup();
    test_memory();
    test_mlp();
    test_empty_rank();
    test_cnn();
    test_gpt();
    test_reshard();
    test_accum();
    dt_test_remove_dir(g_dir);
    return dt_test_summary("zero_test");
}
