/* DDP tests over real shared-memory ranks (forked processes): N workers with per-worker batch b
 * end with the same parameters as 1 worker with batch N*b (SGD with momentum and Adam, N = 2, 3,
 * 4; the final epoch batch is uneven), replicas stay bitwise identical, two identical runs are
 * bitwise identical, and mismatched replicas are refused at start. */
#include "core/test.h"
#include "parallel/parallel_testlib.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

static char g_dir[64];
static char g_csv[128];

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
    cfg.epochs = 3;
    cfg.batch = rc->batch;
    cfg.max_steps = rc->steps;
    cfg.seed = rc->seed;
    cfg.optim = dt_optim_defaults(rc->opt);
    if (rc->opt == DT_OPTIM_SGD) cfg.optim.momentum = 0.9f;
    cfg.lr.base_lr = rc->opt == DT_OPTIM_SGD ? 0.05f : 0.01f;
    cfg.comm = comm;
    cfg.strategy = comm ? "ddp(bucket_mb=0.0005)" : NULL;  /* several buckets even for this small model */
    dt_trainer *t;
    DT_TRY(dt_trainer_create(&t, &cfg));
    dt_status s = dt_trainer_run(t);
    *n = dt_model_num_params(dt_trainer_model(t));
    if (s == DT_OK && *n <= cap) memcpy(out, dt_model_params(dt_trainer_model(t)), *n * sizeof(float));
    dt_trainer_free(t);
    return s;
}

enum { CAP = 4096 };

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
            if (r == 0) {
                FILE *f = fopen(path, "wb");
                fwrite(p, sizeof(float), n, f);
                fclose(f);
            }
            dt_comm_destroy(c);
            _exit(0);
        }
    }
    int failed = 0, st;
    while (wait(&st) > 0) failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return failed;
}

static size_t read_params(const char *path, float *p) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(p, sizeof(float), CAP, f);
    fclose(f);
    return n;
}

static void test_equivalence(void) {
    static float ref[CAP], got[CAP];
    const dt_optim_kind opts[] = {DT_OPTIM_SGD, DT_OPTIM_ADAM};
    for (int oi = 0; oi < 2; oi++) {
        for (int N = 2; N <= 4; N++) {
            /* 203 samples, global batch 8N: 40 steps cross an epoch end with an uneven last batch */
            run_cfg dist = {.opt = opts[oi], .batch = 8, .steps = 40, .seed = 11, .model = "linear(16) relu linear(4)"};
            run_cfg one = dist;
            one.batch = 8 * N;
            size_t n = 0;
            CHECK_OK(train(&one, NULL, ref, CAP, &n));
            char path[160], job[64];
            snprintf(path, sizeof path, "%s/p%d", g_dir, N);
            snprintf(job, sizeof job, "ddptest%d%d%d", (int)getpid(), oi, N);
            CHECK_MSG(run_ranks(N, &dist, path, job) == 0, "%d ranks failed", N);
            size_t m = read_params(path, got);
            CHECK(m == n && n > 0);
            double d = dt_test_maxdiff(ref, got, n);
            printf("equivalence %s N=%d: %zu params, max |1 worker x %d - %d workers x 8| = %.3g\n",
                   dt_optim_name(opts[oi]), N, n, 8 * N, N, d);
            CHECK_MSG(d < 2e-5, "max diff %g", d);
        }
    }
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
            int ok = s == DT_EMISMATCH && strstr(dt_last_error(), "rank 1") && strstr(dt_last_error(), "--seed");
            if (!ok) fprintf(stderr, "rank %d: got %s: %s\n", r, dt_status_str(s), dt_last_error());
            if (s == DT_OK) dt_trainer_free(t);
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
