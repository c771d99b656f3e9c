/* Cross-module test: the GPT under the strategies, on a small text corpus written by the test, over real
 * shared-memory ranks (forked processes):
 *  - ddp with 2 workers x batch 4 ends with the parameters of 1 worker x batch 8 (AdamW, several
 *    gradient buckets, an epoch end with an uneven last batch);
 *  - --grad-accum 4 micro-batches of 2 give the step of one batch of 8;
 *  - a run stopped and resumed from its checkpoint ends bitwise equal to an uninterrupted one;
 *  - ps (1 server + 1 worker) trains it bitwise as one process does, localsgd runs it.
 * Tolerances: 2e-5 absolute on parameters of size ~0.02-1 (float rounding of other GEMM shapes). */
#include "core/test.h"
#include "dtrain/dtrain.h"
#include "parallel/parallel_testlib.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[64], g_data[160];
static const char *MODEL = "gpt:L=2,H=2,C=16,T=16";
enum { CAP = 1 << 16 };

/* 3001 bytes of varied English-like text: 187 windows of 16 (train) and some for validation. */
static void write_corpus(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-gpt-XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    char path[128];
    snprintf(path, sizeof path, "%s/corpus.txt", g_dir);
    dt_test_write_corpus(path, g_data, sizeof g_data);
}

typedef struct {
    const char *strategy;
    int batch, accum;
    int64_t steps;
    const char *save, *resume;
} run_cfg;

static dt_status train(const run_cfg *rc, dt_comm *comm, float *out, size_t *n) {
    dt_train_config cfg = dt_train_defaults();
    cfg.data = g_data;
    cfg.model = MODEL;
    cfg.epochs = 3;
    cfg.batch = rc->batch;
    cfg.grad_accum = rc->accum;
    cfg.max_steps = rc->steps;
    cfg.seed = 5;
    cfg.optim = dt_optim_defaults(DT_OPTIM_ADAMW);
    cfg.lr.base_lr = 3e-3f;
    cfg.comm = comm;
    cfg.strategy = rc->strategy;
    cfg.save = rc->save;
    cfg.resume = rc->resume;
    return dt_test_train_params(&cfg, out, CAP, n);
}

/* N forked ranks; the lowest training rank writes its parameters to path (ps: the server rank 0
 * holds the model after the run). Returns the number of failed ranks. */
static int run_ranks(int N, const run_cfg *rc, const char *path, const char *job) {
    for (int r = 0; r < N; r++)
        if (fork() == 0) {
            dt_comm *c = dt_test_rank_comm(r, N, job);
            static float p[CAP];
            size_t n = 0;
            dt_status s = train(rc, c, p, &n);
            if (s != DT_OK) {
                fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
                _exit(3);
            }
            if (r == 0 && dt_test_write_floats(path, p, n) != 0) _exit(5);
            dt_comm_destroy(c);
            _exit(0);
        }
    return dt_test_wait_children();
}

static size_t read_params(const char *path, float *p) { return dt_test_read_floats(path, p, CAP); }

static float g_ref[CAP], g_got[CAP];

static void test_ddp(void) {
    run_cfg one = {.batch = 8, .accum = 1, .steps = 30},
            two = {.strategy = "ddp(bucket_mb=0.01)", .batch = 4, .accum = 1, .steps = 30}; /* several buckets */
    size_t n = 0;
    CHECK_OK(train(&one, NULL, g_ref, &n));
    char path[128], job[64];
    snprintf(path, sizeof path, "%s/ddp", g_dir);
    snprintf(job, sizeof job, "gptddp%d", (int)getpid());
    CHECK(run_ranks(2, &two, path, job) == 0);
    size_t m = read_params(path, g_got);
    double d = m == n ? dt_test_maxdiff(g_ref, g_got, n) : 1e9;
    printf("gpt ddp: %zu params, max |1 worker x 8 - 2 workers x 4| = %.3g after 30 AdamW steps\n", n, d);
    CHECK_MSG(m == n && d < 2e-5, "max diff %g", d);
    /* and with --grad-accum 2 (micro-batches of 2): the allreduce sees the finished sum only */
    run_cfg acc = {.strategy = "ddp(bucket_mb=0.01)", .batch = 2, .accum = 2, .steps = 30};
    snprintf(path, sizeof path, "%s/ddpacc", g_dir);
    snprintf(job, sizeof job, "gptddpacc%d", (int)getpid());
    CHECK(run_ranks(2, &acc, path, job) == 0);
    m = read_params(path, g_got);
    d = m == n ? dt_test_maxdiff(g_ref, g_got, n) : 1e9;
    printf("gpt ddp + grad-accum: max |1 worker x 8 - 2 workers x 2 micro-batches of 2| = %.3g\n", d);
    CHECK_MSG(m == n && d < 2e-5, "max diff %g", d);
}

static void test_grad_accum(void) {
    run_cfg one = {.batch = 8, .accum = 1, .steps = 30}, acc = {.batch = 2, .accum = 4, .steps = 30};
    size_t n = 0, m = 0;
    CHECK_OK(train(&one, NULL, g_ref, &n));
    CHECK_OK(train(&acc, NULL, g_got, &m));
    double d = m == n ? dt_test_maxdiff(g_ref, g_got, n) : 1e9;
    printf("gpt grad-accum: max |batch 8 - 4 micro-batches of 2| = %.3g after 30 steps\n", d);
    CHECK_MSG(m == n && d < 2e-5, "max diff %g", d);
    /* and the mechanism is not a no-op: one micro-batch of 2 is another run */
    run_cfg two = {.batch = 2, .accum = 1, .steps = 30};
    CHECK_OK(train(&two, NULL, g_got, &m));
    CHECK(dt_test_maxdiff(g_ref, g_got, n) > 1e-3);
}

static void test_resume(void) {
    char ck[128];
    snprintf(ck, sizeof ck, "%s/half.safetensors", g_dir);
    run_cfg full = {.batch = 4, .accum = 1, .steps = 40}, half = {.batch = 4, .accum = 1, .steps = 17, .save = ck};
    run_cfg rest = {.batch = 4, .accum = 1, .steps = 40, .resume = ck};
    size_t n = 0, m = 0;
    CHECK_OK(train(&full, NULL, g_ref, &n));
    CHECK_OK(train(&half, NULL, g_got, &m));
    CHECK_OK(train(&rest, NULL, g_got, &m));
    CHECK_MSG(m == n && memcmp(g_ref, g_got, n * sizeof(float)) == 0, "resumed gpt differs from the uninterrupted run");
    printf("gpt resume: stopped at step 17 (mid-epoch), resumed to 40: bitwise %s\n",
           m == n && !memcmp(g_ref, g_got, n * sizeof(float)) ? "identical" : "DIFFERENT");
}

static void test_ps_localsgd(void) {
    run_cfg one = {.batch = 4, .accum = 1, .steps = 20},
            ps = {.strategy = "ps(servers=1,staleness=0)", .batch = 4, .accum = 1, .steps = 20};
    size_t n = 0;
    CHECK_OK(train(&one, NULL, g_ref, &n));
    char path[128], job[64];
    snprintf(path, sizeof path, "%s/ps", g_dir);
    snprintf(job, sizeof job, "gptps%d", (int)getpid());
    CHECK(run_ranks(2, &ps, path, job) == 0);
    size_t m = read_params(path, g_got);
    CHECK_MSG(m == n && memcmp(g_ref, g_got, n * sizeof(float)) == 0, "ps (1 server, 1 worker) differs from 1 process");
    run_cfg ls = {.strategy = "localsgd", .batch = 4, .accum = 1, .steps = 20};
    snprintf(job, sizeof job, "gptls%d", (int)getpid());
    snprintf(path, sizeof path, "%s/ls", g_dir);
    CHECK(run_ranks(2, &ls, path, job) == 0);
    CHECK(read_params(path, g_got) == n);
}

int main(void) {
    write_corpus();
    test_ddp();
    test_grad_accum();
    test_resume();
    test_ps_localsgd();
    dt_test_remove_dir(g_dir);
    return dt_test_summary("gpt_parallel_test");
}
