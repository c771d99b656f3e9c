/* Parameter-server tests over real shared-memory ranks (forked processes), through the trainer:
 *  - one worker with staleness 0 ends with bitwise the parameters of single-process training
 *    (SGD with momentum and clipping, Adam), with 1 and with 2 servers (sharded), on the worker
 *    and in the model server 0 assembled; the same fully asynchronous (dynamic assignment);
 *  - dynamic assignment through the trainer: every epoch report counts each sample once; with
 *    --ps-overlap each gradient but the first is one update stale;
 *  - an injected straggler (--slow) under SSP: the clock gap the servers granted never exceeds
 *    the bound and reaches it;
 *  - a worker that dies mid-run is dropped: the others finish and server 0 reports it;
 *  - local SGD averaging after every step is data-parallel SGD (equal to 1 process up to
 *    rounding), and with H = 4 the replicas are identical after the final average.
 * Dynamic assignment on the strategy and server themselves (which samples each worker trained)
 * is ps_dynamic_test.c. */
#include "core/test.h"
#include "parallel/parallel_testlib.h"
#include "parallel/ps.h"
#include "parallel/strategy.h"
#include "run/train_aids.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[64];
static char g_csv[128];

static void write_data(void) { dt_test_write_toy_csv(g_dir, g_csv, "/tmp/dtrain-ps-XXXXXX", 7); }

enum { CAP = 4096 };

typedef struct {
    const char *strategy;
    int servers, staleness, sync_every;
    bool fixed;   /* ps: fixed shards (per-worker clocks) instead of dynamic assignment */
    bool overlap; /* ps: --ps-overlap */
    dt_optim_kind opt;
    float clip;
    int batch, epochs;
    int64_t steps;
    int slow_rank;
    float slow;
    int die_rank; /* this rank stops after die_steps steps and exits without a goodbye */
    int64_t die_steps;
} run_cfg;

/* What each rank hands back (shared memory). */
typedef struct {
    int ok;
    size_t n;
    float params[CAP];
    int max_gap, epochs_reported, alive;
    int64_t samples[8], wsamples[8][4]; /* per epoch reported: samples, per worker */
    float loss[8];                      /* per epoch reported: training loss */
    int64_t stale[DT_STALENESS_BINS];   /* staleness histogram over all reports */
    char note[256];
} result;

static result *g_res; /* [ranks], MAP_SHARED */

static void on_epoch(void *ctx, const dt_epoch_info *e) {
    result *r = ctx;
    if (r->epochs_reported < 8) {
        r->samples[r->epochs_reported] = e->nworkers > 0 ? 0 : -1;
        for (int i = 0; i < e->nworkers && i < 4; i++) {
            r->wsamples[r->epochs_reported][i] = e->workers[i].samples;
            r->samples[r->epochs_reported] += e->workers[i].samples;
        }
        r->loss[r->epochs_reported] = e->train_loss;
    }
    for (int k = 0; e->staleness && k < DT_STALENESS_BINS; k++) r->stale[k] += e->staleness[k];
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
    char spec[160], stale[16] = "inf"; /* the run's strategy spec */
    if (rc->staleness >= 0) snprintf(stale, sizeof stale, "%d", rc->staleness);
    if (!strcmp(rc->strategy, "ps"))
        snprintf(spec, sizeof spec, "ps(servers=%d,staleness=%s,shards=%s,overlap=%d)", rc->servers, stale,
                 rc->fixed ? "fixed" : "dynamic", rc->overlap ? 1 : 0);
    else if (!strcmp(rc->strategy, "localsgd") && rc->sync_every > 0)
        snprintf(spec, sizeof spec, "localsgd(sync_every=%d)", rc->sync_every);
    else snprintf(spec, sizeof spec, "%s", rc->strategy);
    cfg.strategy = comm ? spec : NULL;
    const dt_train_aids aids = {.slow_rank = rc->slow_rank, .slow_factor = rc->slow};
    cfg.aids = &aids;
    cfg.on_epoch = on_epoch, cfg.on_note = on_note, cfg.cb_ctx = out;
    int rank = comm ? dt_comm_rank(comm) : 0;
    *die = comm && rc->die_rank == rank && rc->die_steps > 0;
    if (*die) cfg.max_steps = rc->die_steps;
    dt_trainer *t;
    DT_TRY(dt_trainer_create(&t, &cfg));
    dt_status s = dt_trainer_run(t);
    if (*die) _exit(0); /* gone without destroying anything: the servers see a dead rank */
    out->n = dt_model_num_params(dt_trainer_model(t));
    if (s == DT_OK && out->n <= CAP) memcpy(out->params, dt_model_params(dt_trainer_model(t)), out->n * sizeof(float));
    dt_trainer_destroy(t);
    return s;
}

/* Runs N forked ranks; each leaves its result in g_res[rank]. Returns the failed ranks. */
static int run_ranks(int N, const run_cfg *rc, const char *job) {
    memset(g_res, 0, sizeof(result) * (size_t)N);
    for (int r = 0; r < N; r++) {
        if (fork() == 0) {
            dt_comm *c = dt_test_rank_comm(r, N, job);
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
    /* staleness 0 with fixed shards, then with dynamic assignment, then fully asynchronous */
    const char *modes[] = {"0 (fixed shards)", "0 (dynamic)", "inf (dynamic)"};
    for (int oi = 0; oi < 6; oi++) {
        const int stale = oi < 4 ? 0 : -1;
        /* 40 steps of batch 8 cross an epoch end (26 batches, the last of 3 samples) */
        run_cfg rc = {.strategy = "ps",
                      .servers = 1,
                      .staleness = stale,
                      .fixed = oi < 2,
                      .opt = opts[oi % 2],
                      .clip = oi % 2 == 0 ? 0.5f : 0,
                      .batch = 8,
                      .steps = 40};
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
            printf("bitwise %s%s: %d server(s) + 1 worker, staleness %s, 40 steps: worker %s, server-assembled %s "
                   "(max diff %.3g)\n",
                   dt_optim_name(opts[oi % 2]), oi % 2 == 0 ? " (momentum, clip)" : "", S, modes[oi / 2],
                   same_w ? "identical" : "DIFFERS", same_s ? "identical" : "DIFFERS",
                   dt_test_maxdiff(w->params, ref.params, ref.n));
            CHECK(same_w);
            CHECK(same_s);
            CHECK(s0->epochs_reported == 2);
        }
    }
}

static void test_staleness_bound(void) {
    /* 3 workers, the last 16x slower, 60 steps each. Fixed shards: SSP on the workers' own
     * clocks; the gap granted reaches the bound 2 and never passes it. */
    run_cfg rc = {.strategy = "ps",
                  .servers = 1,
                  .staleness = 2,
                  .fixed = true,
                  .opt = DT_OPTIM_ADAM,
                  .batch = 8,
                  .steps = 60,
                  .epochs = 30,
                  .slow_rank = 3,
                  .slow = 16};
    char job[64];
    snprintf(job, sizeof job, "pstest%dssp", (int)getpid());
    CHECK(run_ranks(4, &rc, job) == 0);
    int fixed = g_res[0].max_gap;
    printf("straggler (rank 3 x16), 3 workers x 60 steps, fixed shards, --staleness 2: largest clock gap granted %d\n",
           fixed);
    CHECK_MSG(fixed <= 2, "SSP let a worker run %d steps ahead (bound 2)", fixed);
    CHECK_MSG(fixed == 2, "the straggler never pushed the gap to the bound (%d)", fixed);
}

static void test_dead_worker(void) {
    /* rank 2 (a worker) stops answering after 15 of 60 steps and exits */
    run_cfg rc = {.strategy = "ps",
                  .servers = 1,
                  .staleness = 3,
                  .fixed = true,
                  .opt = DT_OPTIM_ADAM,
                  .batch = 8,
                  .steps = 60,
                  .die_rank = 2,
                  .die_steps = 15};
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

/* Through the trainer: 3 async workers with --slow 3:3; each epoch report holds every sample once. */
static void test_dynamic_trainer(void) {
    run_cfg rc = {.strategy = "ps",
                  .servers = 1,
                  .staleness = -1,
                  .opt = DT_OPTIM_ADAM,
                  .batch = 8,
                  .epochs = 2,
                  .slow_rank = 3,
                  .slow = 3};
    char job[64];
    snprintf(job, sizeof job, "pstest%ddyntr", (int)getpid());
    CHECK(run_ranks(4, &rc, job) == 0);
    const result *r = &g_res[0];
    printf("trainer, 3 async workers, rank 3 x3 slower, 2 epochs: %d reports; samples per epoch %lld %lld; "
           "last epoch per worker %lld / %lld / %lld\n",
           r->epochs_reported, (long long)r->samples[0], (long long)r->samples[1], (long long)r->wsamples[1][0],
           (long long)r->wsamples[1][1], (long long)r->wsamples[1][2]);
    /* (the slow share is checked above with real sleeps: this model's steps take microseconds, so
     * --slow's sleep is lost in the scheduling noise of a loaded machine) */
    CHECK(r->epochs_reported == 2 && r->samples[0] == 203 && r->samples[1] == 203);
}

/* Through the trainer, 1 server + 1 worker with --ps-overlap, 3 epochs: every epoch holds every
 * sample, each gradient but the first is exactly one update stale (computed on the parameters of
 * the exchange before the last), and the training loss falls; without overlap none is stale. */
static void test_overlap_trainer(void) {
    int64_t st[2][DT_STALENESS_BINS];
    for (int ov = 0; ov < 2; ov++) {
        run_cfg rc = {.strategy = "ps", .servers = 1, .staleness = -1, .opt = DT_OPTIM_ADAM, .batch = 8, .overlap = ov};
        char job[64];
        snprintf(job, sizeof job, "pstest%dovtr%d", (int)getpid(), ov);
        CHECK(run_ranks(2, &rc, job) == 0);
        const result *r = &g_res[0];
        memcpy(st[ov], r->stale, sizeof st[ov]);
        printf("trainer, 1 worker%s, 3 epochs: %d reports, samples %lld %lld %lld, train loss %.4f -> %.4f; "
               "staleness 0: %lld, 1: %lld, more: %lld\n",
               ov ? " with --ps-overlap" : "", r->epochs_reported, (long long)r->samples[0], (long long)r->samples[1],
               (long long)r->samples[2], r->loss[0], r->loss[2], (long long)r->stale[0], (long long)r->stale[1],
               (long long)(3 * 26 - r->stale[0] - r->stale[1]));
        CHECK(r->epochs_reported == 3 && r->samples[0] == 203 && r->samples[1] == 203 && r->samples[2] == 203);
        CHECK(r->loss[2] < r->loss[0]);
    }
    CHECK_MSG(st[0][0] == 3 * 26, "without overlap %lld of 78 gradients were fresh", (long long)st[0][0]);
    CHECK_MSG(st[1][0] == 1 && st[1][1] == 3 * 26 - 1, "overlap: %lld fresh, %lld one stale of 78", (long long)st[1][0],
              (long long)st[1][1]);
}

int main(void) {
    write_data();
    g_res = mmap(NULL, sizeof(result) * 8, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_res == MAP_FAILED) return 1;
    test_bitwise();
    test_dynamic_trainer();
    test_overlap_trainer();
    test_staleness_bound();
    test_dead_worker();
    test_localsgd();
    dt_test_remove_dir(g_dir);
    return dt_test_summary("ps_test");
}
