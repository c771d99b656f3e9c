/* Parameter-server tests over real shared-memory ranks (forked processes):
 *  - one worker with staleness 0 ends with bitwise the parameters of single-process training
 *    (SGD with momentum and clipping, Adam), with 1 and with 2 servers (sharded), on the worker
 *    and in the model server 0 assembled;
 *  - an injected straggler (--slow) under SSP: the clock gap the servers granted never exceeds
 *    the bound and reaches it; without a bound the same run lets workers run far ahead;
 *  - a worker that dies mid-run is dropped: the others finish and server 0 reports it;
 *  - local SGD averaging after every step is data-parallel SGD (equal to 1 process up to
 *    rounding), and with H = 4 the replicas are identical after the final average. */
#include "core/test.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[64];
static char g_csv[128];

/* A separable 4-class problem of 203 samples (the last batch of an epoch is short). */
static void write_data(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-ps-XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_csv, sizeof g_csv, "%s/toy_train.csv", g_dir);
    FILE *f = fopen(g_csv, "w");
    for (int i = 0; i < 203; i++) {
        int y = (int)(dt_rng_u64(7, 1, (uint64_t)i) % 4);
        fprintf(f, "%d", y);
        for (int k = 0; k < 12; k++)
            fprintf(f, ",%.5f", dt_rng_uniform(7, 2, (uint64_t)(i * 12 + k)) + (k % 4 == y ? 1.5f : 0.0f));
        fprintf(f, "\n");
    }
    fclose(f);
}

enum { CAP = 4096 };

typedef struct {
    const char *strategy;
    int servers, staleness, sync_every;
    dt_optim_kind opt;
    float clip;
    int batch, epochs;
    int64_t steps;
    int slow_rank;
    float slow;
    int die_rank;        /* this rank stops after die_steps steps and exits without a goodbye */
    int64_t die_steps;
} run_cfg;

/* What each rank hands back (shared memory). */
typedef struct {
    int ok;
    size_t n;
    float params[CAP];
    int max_gap, epochs_reported, alive;
    char note[256];
} result;

static result *g_res;  /* [ranks], MAP_SHARED */

static void on_epoch(void *ctx, const dt_epoch_info *e) {
    result *r = ctx;
    r->epochs_reported++;
    if (e->max_clock_gap > r->max_gap) r->max_gap = e->max_clock_gap;
    r->alive = 0;
    for (int i = 0; i < e->nworkers; i++) r->alive += e->workers[i].alive;
}

static void on_note(void *ctx, const char *msg) {
    result *r = ctx;
    if (!r->note[0]) snprintf(r->note, sizeof r->note, "%s", msg);
}

static dt_status train(const run_cfg *rc, dt_comm *comm, result *out, bool *die) {
    dt_train_config cfg = dt_train_defaults();
    cfg.data = g_csv;
    cfg.model = "linear(16) relu linear(4)";
    cfg.epochs = rc->epochs ? rc->epochs : 3;
    cfg.batch = rc->batch;
    cfg.max_steps = rc->steps;
    cfg.seed = 5;
    cfg.optim = dt_optim_defaults(rc->opt);
    if (rc->opt == DT_OPTIM_SGD) cfg.optim.momentum = 0.9f;
    cfg.lr.base_lr = rc->opt == DT_OPTIM_SGD ? 0.05f : 0.01f;
    cfg.clip_norm = rc->clip;
    cfg.comm = comm;
    cfg.strategy = comm ? rc->strategy : NULL;
    cfg.servers = rc->servers;
    cfg.staleness = rc->staleness;
    cfg.sync_every = rc->sync_every;
    cfg.slow_rank = rc->slow_rank, cfg.slow_factor = rc->slow;
    cfg.on_epoch = on_epoch, cfg.on_note = on_note, cfg.cb_ctx = out;
    int rank = comm ? dt_comm_rank(comm) : 0;
    *die = comm && rc->die_rank == rank && rc->die_steps > 0;
    if (*die) cfg.max_steps = rc->die_steps;
    dt_trainer *t;
    DT_TRY(dt_trainer_create(&t, &cfg));
    dt_status s = dt_trainer_run(t);
    if (*die) _exit(0);  /* gone without destroying anything: the servers see a dead rank */
    out->n = dt_model_num_params(dt_trainer_model(t));
    if (s == DT_OK && out->n <= CAP) memcpy(out->params, dt_model_params(dt_trainer_model(t)), out->n * sizeof(float));
    dt_trainer_free(t);
    return s;
}

/* Runs N forked ranks; each leaves its result in g_res[rank]. Returns the failed ranks. */
static int run_ranks(int N, const run_cfg *rc, const char *job) {
    memset(g_res, 0, sizeof(result) * (size_t)N);
    for (int r = 0; r < N; r++) {
        if (fork() == 0) {
            dt_comm_config cc = dt_comm_config_default();
            cc.rank = r, cc.size = N, cc.job_id = job, cc.timeout_s = 60;
            dt_comm *c;
            if (dt_comm_create(&c, &cc) != DT_OK) {
                fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
                _exit(2);
            }
            bool die;
            if (train(rc, c, &g_res[r], &die) != DT_OK) {
                fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
                _exit(3);
            }
            g_res[r].ok = 1;
            dt_comm_destroy(c);
            _exit(0);
        }
    }
    int failed = 0, st;
    while (wait(&st) > 0) failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return failed;
}

static void test_bitwise(void) {
    const dt_optim_kind opts[] = {DT_OPTIM_SGD, DT_OPTIM_ADAM};
    for (int oi = 0; oi < 2; oi++) {
        /* 40 steps of batch 8 cross an epoch end (26 batches, the last of 3 samples) */
        run_cfg rc = {.strategy = "ps", .servers = 1, .staleness = 0, .opt = opts[oi], .clip = oi == 0 ? 0.5f : 0,
                      .batch = 8, .steps = 40};
        static result ref;
        bool die;
        CHECK_OK(train(&rc, NULL, &ref, &die));
        for (int S = 1; S <= 2; S++) {
            rc.servers = S;
            char job[64];
            snprintf(job, sizeof job, "pstest%db%d%d", (int)getpid(), oi, S);
            CHECK_MSG(run_ranks(S + 1, &rc, job) == 0, "ps with %d server(s) failed", S);
            const result *w = &g_res[S], *s0 = &g_res[0];
            bool same_w = w->ok && w->n == ref.n && memcmp(w->params, ref.params, ref.n * sizeof(float)) == 0;
            bool same_s = s0->ok && s0->n == ref.n && memcmp(s0->params, ref.params, ref.n * sizeof(float)) == 0;
            printf("bitwise %s%s: %d server(s) + 1 worker, staleness 0, 40 steps: worker %s, server-assembled %s "
                   "(max diff %.3g)\n",
                   dt_optim_name(opts[oi]), oi == 0 ? " (momentum, clip)" : "", S, same_w ? "identical" : "DIFFERS",
                   same_s ? "identical" : "DIFFERS", dt_test_maxdiff(w->params, ref.params, ref.n));
            CHECK(same_w);
            CHECK(same_s);
            CHECK(s0->epochs_reported == 2);
        }
    }
}

static void test_staleness_bound(void) {
    /* 1 server, 3 workers, the last 16x slower, 60 steps each: SSP with bound 2, then unbounded */
    run_cfg rc = {.strategy = "ps", .servers = 1, .staleness = 2, .opt = DT_OPTIM_ADAM, .batch = 8, .steps = 60,
                  .epochs = 30, .slow_rank = 3, .slow = 16};
    char job[64];
    snprintf(job, sizeof job, "pstest%dssp", (int)getpid());
    CHECK(run_ranks(4, &rc, job) == 0);
    int bounded = g_res[0].max_gap;
    rc.staleness = -1;
    snprintf(job, sizeof job, "pstest%dasync", (int)getpid());
    CHECK(run_ranks(4, &rc, job) == 0);
    int unbounded = g_res[0].max_gap;
    printf("straggler (rank 3 x16), 3 workers x 60 steps: largest clock gap granted %d with --staleness 2, %d with "
           "--staleness inf\n", bounded, unbounded);
    CHECK_MSG(bounded <= 2, "SSP let a worker run %d steps ahead (bound 2)", bounded);
    CHECK_MSG(bounded == 2, "the straggler never pushed the gap to the bound (%d)", bounded);
    CHECK_MSG(unbounded > 2, "without a bound the fast workers stayed within %d steps", unbounded);
}

static void test_dead_worker(void) {
    /* rank 2 (a worker) stops answering after 15 of 60 steps and exits */
    run_cfg rc = {.strategy = "ps", .servers = 1, .staleness = 3, .opt = DT_OPTIM_ADAM, .batch = 8, .steps = 60,
                  .die_rank = 2, .die_steps = 15};
    char job[64];
    snprintf(job, sizeof job, "pstest%ddead", (int)getpid());
    int failed = run_ranks(4, &rc, job);
    printf("dead worker: %d rank(s) failed; server 0 says \"%s\"; %d of 3 workers alive at the end\n", failed,
           g_res[0].note, g_res[0].alive);
    CHECK(failed == 0);
    CHECK(g_res[0].ok && g_res[1].ok && g_res[3].ok);
    CHECK_MSG(strstr(g_res[0].note, "worker rank 2 died at step 15; continuing with 2 workers"), "note: %s",
              g_res[0].note);
    CHECK(g_res[0].alive == 2);
}

static void test_localsgd(void) {
    /* averaging after every step of equal parts is the data-parallel step: the local momentum
     * buffers are linear in the gradients, so their mean is the data-parallel buffer (12 full
     * global batches of 16) */
    run_cfg rc = {.strategy = "localsgd", .sync_every = 1, .opt = DT_OPTIM_SGD, .batch = 8, .steps = 12};
    run_cfg one = rc;
    one.batch = 16;
    static result ref;
    bool die;
    CHECK_OK(train(&one, NULL, &ref, &die));
    char job[64];
    snprintf(job, sizeof job, "pstest%dlsgd", (int)getpid());
    CHECK(run_ranks(2, &rc, job) == 0);
    double d = dt_test_maxdiff(g_res[0].params, ref.params, ref.n);
    bool same = g_res[1].n == ref.n && memcmp(g_res[0].params, g_res[1].params, ref.n * sizeof(float)) == 0;
    printf("localsgd H=1 (sgd momentum kept local), 2 x 8 vs 1 x 16: max diff %.3g; replicas %s\n", d,
           same ? "identical" : "DIFFER");
    CHECK(same);
    CHECK_MSG(d < 2e-5, "max diff %g", d);
    rc.sync_every = 4, rc.steps = 30;
    snprintf(job, sizeof job, "pstest%dlsgd4", (int)getpid());
    CHECK(run_ranks(3, &rc, job) == 0);
    same = memcmp(g_res[0].params, g_res[1].params, ref.n * sizeof(float)) == 0 &&
           memcmp(g_res[0].params, g_res[2].params, ref.n * sizeof(float)) == 0;
    printf("localsgd H=4, 3 ranks: replicas %s after the final average\n", same ? "identical" : "DIFFER");
    CHECK(same);
}

int main(void) {
    write_data();
    g_res = mmap(NULL, sizeof(result) * 8, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_res == MAP_FAILED) return 1;
    test_bitwise();
    test_staleness_bound();
    test_dead_worker();
    test_localsgd();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
    return dt_test_summary("ps_test");
}
