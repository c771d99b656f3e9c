/* DDP tests over real shared-memory ranks (forked processes): N workers with per-worker batch b
 * end with the same parameters as an independent single-process reference at batch N*b (a plain
 * loop over the model, loss and optimizer calls: none of the trainer, loader batching or
 * strategy code) and as 1 worker of the trainer at batch N*b (SGD with momentum and Adam, N = 2,
 * 3, 4; the final epoch batch is partial and kept); the model spans 3 gradient buckets; replicas
 * stay bitwise identical, two identical runs are bitwise identical, and mismatched replicas are
 * refused at start. */
#include "core/test.h"
#include "backend/layers.h"
#include "parallel/parallel_testlib.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

enum { EPOCHS = 3 }; /* a run ends after EPOCHS epochs or run_cfg.steps steps, whichever is first */
static char g_dir[64];
static char g_csv[128];
/* several buckets even for this small model; the default update (shard, the ranks share a host)
 * and the allreduce's (test_equivalence runs both) */
static const char *g_spec = "ddp(bucket_mb=0.0005)";

static void write_data(void) { dt_test_write_toy_csv(g_dir, g_csv, "/tmp/dtrain-ddp-XXXXXX", 5); }

typedef struct {
    dt_optim_kind opt;
    int batch;
    int64_t steps;
    uint64_t seed;
    const char *model;
} run_cfg;

/* Trains with comm (NULL = one process) and copies the final parameters into out (cap floats). */
static dt_status train(const run_cfg *rc, dt_comm *comm, float *out, size_t cap, size_t *n) {
    dt_train_config cfg = dt_train_defaults();
    cfg.data = g_csv;
    cfg.model = rc->model;
    cfg.epochs = EPOCHS;
    cfg.batch = rc->batch;
    cfg.max_steps = rc->steps;
    cfg.seed = rc->seed;
    cfg.optim = dt_optim_defaults(rc->opt);
    if (rc->opt == DT_OPTIM_SGD) cfg.optim.momentum = 0.9f;
    cfg.lr.base_lr = rc->opt == DT_OPTIM_SGD ? 0.05f : 0.01f;
    cfg.comm = comm;
    cfg.strategy = comm ? g_spec : NULL;
    dt_trainer *t;
    DT_TRY(dt_trainer_create(&t, &cfg));
    dt_status s = dt_trainer_run(t);
    *n = dt_model_num_params(dt_trainer_model(t));
    if (s == DT_OK && *n <= cap) memcpy(out, dt_model_params(dt_trainer_model(t)), *n * sizeof(float));
    dt_trainer_destroy(t);
    return s;
}

enum { CAP = 4096 };

/* Model of the equivalence test and its bucket cap: layer sizes 208, 272, 272, 68 parameters
 * (12 features), so with a cap of 125 floats each of the first three layers closes a bucket of
 * its own (3 buckets). A bug that skips or misorders one bucket changes the result. */
#define MULTI_BUCKET_MODEL "linear(16) relu linear(16) relu linear(16) relu linear(4)"

/* The independent reference: one process, the epoch's shuffled order (dt_sampler_order) in
 * batches of G, the last partial batch of an epoch included, mean loss gradient, the optimizer,
 * for `steps` steps or EPOCHS epochs. */
static dt_status reference(const run_cfg *rc, int G, float *out, size_t cap, size_t *n) {
    dt_dataset *train = NULL, *test = NULL;
    DT_TRY(dt_dataset_open(&train, &test, g_csv));
    int C, H, W;
    dt_dataset_shape(train, &C, &H, &W);
    const size_t N = dt_dataset_len(train);
    const int V = dt_dataset_classes(train);
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_optim_config oc = dt_optim_defaults(rc->opt);
    if (rc->opt == DT_OPTIM_SGD) oc.momentum = 0.9f;
    const float lr = rc->opt == DT_OPTIM_SGD ? 0.05f : 0.01f;
    uint32_t *order = malloc(N * sizeof *order);
    float *x = malloc((size_t)G * C * H * W * sizeof *x), *probs = malloc((size_t)G * V * sizeof *probs);
    float *dl = malloc((size_t)G * V * sizeof *dl);
    int32_t *y = malloc((size_t)G * sizeof *y);
    dt_status s = order && x && probs && dl && y ? DT_OK : dt_error(DT_ENOMEM, "reference: out of memory");
    if (s == DT_OK) s = dt_model_create_from_spec(&m, rc->model, C, H, W);
    if (s == DT_OK) dt_model_init(m, rc->seed);
    if (s == DT_OK) s = dt_optim_create(&o, &oc, dt_model_num_params(m));
    int64_t step = 0;
    for (uint64_t epoch = 0; s == DT_OK && step < rc->steps && epoch < EPOCHS; epoch++) {
        dt_sampler_order(order, N, rc->seed, epoch, true);
        for (size_t b = 0; s == DT_OK && b * (size_t)G < N && step < rc->steps; b++, step++) {
            int cnt = (int)(N - b * (size_t)G < (size_t)G ? N - b * (size_t)G : (size_t)G);
            const float *logits;
            s = dt_dataset_batch(train, order + b * (size_t)G, cnt, x, y);
            dt_model_zero_grad(m);
            if (s == DT_OK) s = dt_model_forward(m, x, cnt, true, (uint64_t)step, &logits);
            if (s != DT_OK) break;
            dt_softmax_xent_forward(probs, logits, y, cnt, V);
            dt_softmax_xent_backward(dl, probs, y, cnt, V, 1.0f);
            if ((s = dt_model_backward(m, dl, NULL, NULL)) == DT_OK)
                dt_optim_step(o, dt_model_params(m), dt_model_grads(m), lr);
        }
    }
    if (s == DT_OK) {
        *n = dt_model_num_params(m);
        if (*n <= cap) memcpy(out, dt_model_params(m), *n * sizeof(float));
    }
    free(order), free(x), free(probs), free(dl), free(y);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    dt_dataset_destroy(train);
    dt_dataset_destroy(test);
    return s;
}

/* Runs N forked ranks; rank 0 writes its parameters to `path`. Each rank checks that its
 * replica equals everyone's (crc allreduce). Returns the number of failed ranks. */
static int run_ranks(int N, const run_cfg *rc, const char *path, const char *job) {
    for (int r = 0; r < N; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            dt_comm *c = dt_test_rank_comm(r, N, job);
            static float p[CAP];
            size_t n = 0;
            if (train(rc, c, p, CAP, &n) != DT_OK) {
                fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
                _exit(3);
            }
            int64_t crc = (int64_t)crc32(0, (const Bytef *)p, (uInt)(n * sizeof(float))), lo, hi;
            if (dt_comm_allreduce(c, &crc, &lo, 1, DT_I64, DT_OP_MIN) != DT_OK ||
                dt_comm_allreduce(c, &crc, &hi, 1, DT_I64, DT_OP_MAX) != DT_OK || lo != hi) {
                fprintf(stderr, "rank %d: replicas differ after training\n", r);
                _exit(4);
            }
            if (r == 0 && dt_test_write_floats(path, p, n) != 0) _exit(5);
            dt_comm_destroy(c);
            _exit(0);
        }
    }
    return dt_test_wait_children();
}

static size_t read_params(const char *path, float *p) { return dt_test_read_floats(path, p, CAP); }

static void test_equivalence(void) {
    static float ind[CAP], ref[CAP], got[CAP];
    const dt_optim_kind opts[] = {DT_OPTIM_SGD, DT_OPTIM_ADAM};
    /* the model really spans several buckets: three of its layers each reach the cap alone */
    dt_model *probe;
    CHECK_OK(dt_model_create_from_spec(&probe, MULTI_BUCKET_MODEL, 1, 1, 12));
    int big = 0;
    for (int i = 0; i < dt_model_num_tensors(probe); i++) {
        const dt_param_info *t = dt_model_tensor(probe, i);
        size_t layer_params = 0;
        for (int k = 0; k < dt_model_num_tensors(probe); k++)
            if (dt_model_tensor(probe, k)->layer == t->layer) layer_params += dt_model_tensor(probe, k)->numel;
        big += !strstr(t->name, "bias") && layer_params * sizeof(float) >= 0.0005 * 1048576.0;
    }
    dt_model_destroy(probe);
    CHECK_MSG(big == 3, "%d layers reach the bucket cap alone, want 3", big);
    static const char *const specs[] = {"ddp(bucket_mb=0.0005,update=full)", "ddp(bucket_mb=0.0005,update=shard)"};
    for (int oi = 0; oi < 4; oi++) {
        g_spec = specs[oi / 2];
        for (int N = 2; N <= 4; N++) {
            /* 203 samples, global batch 8N: 40 steps cross an epoch end with a partial last batch */
            run_cfg dist = {.opt = opts[oi % 2], .batch = 8, .steps = 40, .seed = 11, .model = MULTI_BUCKET_MODEL};
            run_cfg one = dist;
            one.batch = 8 * N;
            size_t n = 0, ni = 0;
            CHECK_OK(reference(&dist, 8 * N, ind, CAP, &ni));
            CHECK_OK(train(&one, NULL, ref, CAP, &n));
            CHECK(n == ni);
            double d1 = dt_test_maxdiff(ind, ref, n);
            char path[160], job[64];
            snprintf(path, sizeof path, "%s/p%d", g_dir, N);
            snprintf(job, sizeof job, "ddptest%d%d%d", (int)getpid(), oi, N);
            CHECK_MSG(run_ranks(N, &dist, path, job) == 0, "%d ranks failed", N);
            size_t m = read_params(path, got);
            CHECK(m == n && n > 0);
            double d = dt_test_maxdiff(ind, got, n);
            printf("equivalence %s %s N=%d: %zu params in 3 buckets, max |reference x %d - %d workers x 8| = %.3g, "
                   "|reference - trainer 1 worker| = %.3g\n",
                   g_spec, dt_optim_name(opts[oi % 2]), N, n, 8 * N, N, d, d1);
            CHECK_MSG(d < 2e-5, "%d workers differ from the reference by %g", N, d);
            CHECK_MSG(d1 < 1e-6, "the 1-worker trainer differs from the reference by %g", d1);
        }
    }
    g_spec = "ddp(bucket_mb=0.0005)"; /* the default update for the tests below */
}

static void test_determinism(void) {
    static float a[CAP], b[CAP];
    run_cfg rc = {.opt = DT_OPTIM_ADAM, .batch = 8, .steps = 30, .seed = 3, .model = "linear(16) relu linear(4)"};
    char pa[160], pb[160], job[64];
    snprintf(pa, sizeof pa, "%s/da", g_dir);
    snprintf(pb, sizeof pb, "%s/db", g_dir);
    snprintf(job, sizeof job, "ddpdet%da", (int)getpid());
    CHECK(run_ranks(3, &rc, pa, job) == 0);
    snprintf(job, sizeof job, "ddpdet%db", (int)getpid());
    CHECK(run_ranks(3, &rc, pb, job) == 0);
    size_t na = read_params(pa, a), nb = read_params(pb, b);
    CHECK_MSG(na == nb && na > 0 && memcmp(a, b, na * sizeof(float)) == 0, "two 3-rank runs differ");
    printf("determinism: two 3-rank runs bitwise identical (%zu params)\n", na);
}

/* Ranks started with different seeds must be refused, not silently diverge. */
static void test_mismatch(void) {
    char job[64];
    snprintf(job, sizeof job, "ddpmis%d", (int)getpid());
    for (int r = 0; r < 2; r++) {
        if (fork() == 0) {
            dt_comm *c = dt_test_rank_comm(r, 2, job);
            dt_train_config cfg = dt_train_defaults();
            cfg.data = g_csv;
            cfg.model = "linear(8) relu linear(4)";
            cfg.seed = 100 + (uint64_t)r;
            cfg.comm = c;
            dt_trainer *t;
            dt_status s = dt_trainer_create(&t, &cfg);
            int ok = s == DT_EMISMATCH && strstr(dt_last_error(), "rank 1") && strstr(dt_last_error(), "`seed`");
            if (!ok) fprintf(stderr, "rank %d: got %s: %s\n", r, dt_status_str(s), dt_last_error());
            if (s == DT_OK) dt_trainer_destroy(t);
            dt_comm_destroy(c);
            _exit(ok ? 0 : 1);
        }
    }
    int st, failed = 0;
    while (wait(&st) > 0) failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_MSG(failed == 0, "mismatched replicas not reported on %d ranks", failed);
}

int main(void) {
    write_data();
    test_equivalence();
    test_determinism();
    test_mismatch();
    dt_test_remove_dir(g_dir);
    return dt_test_summary("ddp_test");
}
