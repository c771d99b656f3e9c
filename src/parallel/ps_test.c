/* Parameter-server tests over real shared-memory ranks (forked processes):
 *  - one worker with staleness 0 ends with bitwise the parameters of single-process training
 *    (SGD with momentum and clipping, Adam), with 1 and with 2 servers (sharded), on the worker
 *    and in the model server 0 assembled; the same fully asynchronous (dynamic assignment);
 *  - dynamic assignment (--staleness inf) on the real ps strategy and server with 3 workers, one
 *    3x slower by sleeping: every sample index is trained exactly once per epoch, the slow worker
 *    trains fewer batches, and a worker that dies holding a batch gets it handed to another;
 *    through the trainer, every epoch report counts each sample once; a resumed run trains each
 *    unit from its position on once, and --max-steps trains exactly the first units (with and
 *    without --ps-overlap);
 *  - an injected straggler (--slow) under SSP: the clock gap the servers granted never exceeds
 *    the bound and reaches it; without a bound the same run lets workers run far ahead;
 *  - a worker that dies mid-run is dropped: the others finish and server 0 reports it;
 *  - local SGD averaging after every step is data-parallel SGD (equal to 1 process up to
 *    rounding), and with H = 4 the replicas are identical after the final average. */
#include "core/test.h"
#include "parallel/parallel_testlib.h"
#include "parallel/ps.h"
#include "parallel/strategy.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_dir[64];
static char g_csv[128];

static void write_data(void) { dt_test_write_toy_csv(g_dir, g_csv, "/tmp/dtrain-ps-XXXXXX", 7); }

enum { CAP = 4096 };

typedef struct {
    const char *strategy;
    int servers, staleness, sync_every;
    bool fixed;          /* ps: fixed shards (per-worker clocks) instead of dynamic assignment */
    bool overlap;        /* ps: --ps-overlap */
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
    int64_t samples[8], wsamples[8][4];  /* per epoch reported: samples, per worker */
    float loss[8];                       /* per epoch reported: training loss */
    int64_t stale[DT_STALENESS_BINS];    /* staleness histogram over all reports */
    char note[256];
} result;

static result *g_res;  /* [ranks], MAP_SHARED */

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
    char spec[160], stale[16] = "inf";  /* the run's strategy spec */
    if (rc->staleness >= 0) snprintf(stale, sizeof stale, "%d", rc->staleness);
    if (!strcmp(rc->strategy, "ps"))
        snprintf(spec, sizeof spec, "ps(servers=%d,staleness=%s,shards=%s,overlap=%d)", rc->servers, stale,
                 rc->fixed ? "fixed" : "dynamic", rc->overlap ? 1 : 0);
    else if (!strcmp(rc->strategy, "localsgd") && rc->sync_every > 0)
        snprintf(spec, sizeof spec, "localsgd(sync_every=%d)", rc->sync_every);
    else
        snprintf(spec, sizeof spec, "%s", rc->strategy);
    cfg.strategy = comm ? spec : NULL;
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
        run_cfg rc = {.strategy = "ps", .servers = 1, .staleness = stale, .fixed = oi < 2, .opt = opts[oi % 2],
                      .clip = oi % 2 == 0 ? 0.5f : 0, .batch = 8, .steps = 40};
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
                   same_w ? "identical" : "DIFFERS",
                   same_s ? "identical" : "DIFFERS", dt_test_maxdiff(w->params, ref.params, ref.n));
            CHECK(same_w);
            CHECK(same_s);
            CHECK(s0->epochs_reported == 2);
        }
    }
}

static void test_staleness_bound(void) {
    /* 3 workers, the last 16x slower, 60 steps each. Fixed shards: SSP on the workers' own
     * clocks; the gap granted reaches the bound 2 and never passes it. */
    run_cfg rc = {.strategy = "ps", .servers = 1, .staleness = 2, .fixed = true, .opt = DT_OPTIM_ADAM, .batch = 8,
                  .steps = 60, .epochs = 30, .slow_rank = 3, .slow = 16};
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
    run_cfg rc = {.strategy = "ps", .servers = 1, .staleness = 3, .fixed = true, .opt = DT_OPTIM_ADAM, .batch = 8,
                  .steps = 60, .die_rank = 2, .die_steps = 15};
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

/* ---- dynamic assignment on the strategy itself: which samples each worker trained ---- */
enum { DN = 203, DB = 8, DUNITS = (DN + DB - 1) / DB, DEPOCHS = 3, DW = 3 };

typedef struct {
    int ok;
    int max_gap;                       /* server 0's largest round gap granted */
    int64_t stale[DT_STALENESS_BINS];  /* server 0's staleness histogram */
    int units[DW];                     /* units each worker trained (pushed) */
    int count[DEPOCHS][DN];            /* times each sample index was trained, over all workers */
    int ucount[DEPOCHS][DUNITS];       /* times each unit was trained */
    int reports, complete, rep_samples[DEPOCHS], rep_w[DEPOCHS][DW];
    volatile sig_atomic_t stop;        /* the servers' stop flag (a SIGTERM handler's, in a real run) */
    int left;                          /* workers that have left (dyn_job.stop_after) */
    dt_status serve_status;            /* server 0's serve() */
    char serve_msg[200];
} dyn_result;

static dyn_result *g_dyn;

static dt_status dyn_epoch(void *ctx, const dt_serve_epoch *e) {
    (void)ctx;
    if (g_dyn->reports < DEPOCHS) {
        g_dyn->rep_samples[g_dyn->reports] = (int)e->samples;
        for (int w = 0; w < DW; w++) g_dyn->rep_w[g_dyn->reports][w] = (int)e->workers[w].samples;
    }
    g_dyn->reports++;
    g_dyn->complete += e->complete;
    if (e->max_clock_gap > g_dyn->max_gap) g_dyn->max_gap = e->max_clock_gap;
    for (int k = 0; k < DT_STALENESS_BINS; k++) g_dyn->stale[k] += e->staleness[k];
    return DT_OK;
}

static void nap_ms(double ms) {
    struct timespec ts = {0, (long)(ms * 1e6)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* The harness's job: servers, staleness bound (< 0: none), the last worker's nap per step (the
 * others nap 2 ms), and a worker that exits after some units (die_w < 0: none). */
typedef struct {
    int servers, staleness;
    double slow_ms;
    int die_w, die_after;
    bool overlap;        /* --ps-overlap (the dying worker drains first: it dies holding two units) */
    int max_steps;       /* steps per worker (0: all epochs) */
    int start_in;        /* a resumed run: the position's step_in_epoch (rounds of DW units) in epoch 0 */
    int stop_after;      /* a stop as SIGTERM makes it, in the order that hid it once: the first
                          * workers leave after this many units, then the last sets the servers'
                          * stop flag while their serving thread sleeps, and leaves too (0: none) */
} dyn_job;

/* One rank of S servers + DW workers: the data set's single feature is the sample index, so a
 * batch says which samples it holds. The last worker sleeps slow_ms per step, the others 2 ms;
 * worker die_w (if >= 0) exits after die_after units, holding its next one. */
static int dyn_rank(int r, const char *job, const dyn_job *dj) {
    static float x[DN];
    static int32_t y[DN];
    for (int i = 0; i < DN; i++) x[i] = (float)i, y[i] = i % 4;
    dt_comm_config cc = dt_comm_config_default();
    cc.rank = r, cc.size = DW + dj->servers, cc.job_id = job, cc.timeout_s = 60;
    dt_comm *c = NULL;
    dt_dataset *ds = NULL;
    dt_loader *l = NULL;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_strategy *s = NULL;
    dt_status st = dt_comm_create(&c, &cc);
    if (st == DT_OK) st = dt_dataset_create(&ds, DT_F32, x, y, DN, 1, 1, 1, 4);
    dt_loader_config lc = {.batch = DB, .seed = 9, .shuffle = true, .world = 1};
    if (st == DT_OK) st = dt_loader_create(&l, ds, &lc);
    if (st == DT_OK && (st = dt_model_create_from_spec(&m, "linear(4)", 1, 1, 1)) == DT_OK) dt_model_init(m, 3);
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_SGD);
    if (st == DT_OK) st = dt_optim_create(&o, &oc, dt_model_num_params(m));
    char spec[128], stale[16] = "inf";
    if (dj->staleness >= 0) snprintf(stale, sizeof stale, "%d", dj->staleness);
    snprintf(spec, sizeof spec, "ps(servers=%d,staleness=%s,overlap=%d)", dj->servers, stale, dj->overlap ? 1 : 0);
    if (st == DT_OK) st = dt_strategy_create(&s, spec, c, m, o, NULL);
    if (st == DT_OK) st = s->ops->init(s);
    if (st == DT_OK && s->role == DT_ROLE_SERVER) {
        dt_serve_config cfg = {.steps_per_epoch = (int64_t)dt_sampler_batches(DN, DB, DW, false), .epochs = DEPOCHS,
                               .batch = DB, .progress_s = 1, .units_per_epoch = DUNITS, .on_epoch = dyn_epoch,
                               .max_steps = dj->max_steps, .start_step_in_epoch = dj->start_in};
        if (dj->stop_after) cfg.stop = &g_dyn->stop, cfg.progress_s = 600;  /* woken by the workers only */
        st = s->ops->serve(s, &cfg);
        if (r == 0) {
            g_dyn->serve_status = st;
            snprintf(g_dyn->serve_msg, sizeof g_dyn->serve_msg, "%s", st != DT_OK ? dt_last_error() : "");
        }
        if (dj->stop_after && st == DT_EINTR) st = DT_OK;
    } else if (st == DT_OK) {
        const int w = r - dj->servers;
        int64_t ep, u, step = 0;
        const dt_unit_plan plan = {.epoch = 0, .unit = (int64_t)dj->start_in * DW, .units_per_epoch = DUNITS,
                                   .epochs = DEPOCHS};
        if (!dt_strategy_hands_out_batches(s)) st = dt_error(DT_EINTERNAL, "ps dynamic hands out no batches");
        else s->ops->first_unit(s, &plan, &ep, &u);  /* seq w (overlap: and W + w held ahead) */
        if (st == DT_OK && (int)ep * DUNITS + u != dj->start_in * DW + w) st = dt_error(DT_EINTERNAL, "first unit");
        while (st == DT_OK && u >= 0 && ep < DEPOCHS && (!dj->max_steps || step < dj->max_steps)) {
            if (dj->stop_after && g_dyn->units[w] == dj->stop_after) {
                if (w < DW - 1) break;  /* leaves (the server notes it) */
                while (__atomic_load_n(&g_dyn->left, __ATOMIC_ACQUIRE) < DW - 1) nap_ms(1);
                nap_ms(100);  /* the server has booked the last push: its serving thread sleeps */
                g_dyn->stop = 1;
                nap_ms(100);
                break;  /* the last one leaving wakes the serving thread */
            }
            dt_batch b;
            if ((st = dt_loader_take(l, (uint64_t)ep, (size_t)u, &b)) != DT_OK) break;
            int idx[DB];
            for (int i = 0; i < b.n; i++) idx[i] = (int)b.x[i];
            nap_ms(w == DW - 1 ? dj->slow_ms : 2.0);
            s->ops->begin_step(s, step);
            dt_model_zero_grad(m);
            dt_model_grads(m)[0] = 1e-3f * (float)idx[0];
            s->cur.n = b.n, s->cur.epoch = ep, s->cur.loss_sum = 0, s->cur.busy_s = 0;
            dt_step_stats ss;
            if ((st = s->ops->step(s, 0.01f, 0, &ss)) != DT_OK) break;
            for (int i = 0; i < b.n; i++) __atomic_fetch_add(&g_dyn->count[ep][idx[i]], 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&g_dyn->ucount[ep][u], 1, __ATOMIC_RELAXED);
            g_dyn->units[w]++, step++;
            if (w == dj->die_w && g_dyn->units[w] == dj->die_after) {  /* holding its next unit (overlap: two) */
                if (dj->overlap && dt_ps_worker_drain(s) != DT_OK) _exit(4);
                _exit(0);
            }
            s->ops->next_unit(s, &ep, &u);
        }
    }
    if (st != DT_OK) fprintf(stderr, "dynamic rank %d: %s\n", r, dt_last_error());
    dt_strategy_destroy(s);
    if (dj->stop_after && r >= dj->servers) __atomic_fetch_add(&g_dyn->left, 1, __ATOMIC_RELEASE);
    dt_optim_free(o);
    dt_model_free(m);
    dt_loader_free(l);
    dt_dataset_free(ds);
    dt_comm_destroy(c);
    return st == DT_OK ? 0 : 3;
}

static int dyn_run(const char *tag, const dyn_job *dj) {
    memset(g_dyn, 0, sizeof *g_dyn);
    char job[64];
    snprintf(job, sizeof job, "pstest%d%s", (int)getpid(), tag);
    for (int r = 0; r < DW + dj->servers; r++)
        if (fork() == 0) _exit(dyn_rank(r, job, dj));
    int failed = 0, st;
    while (wait(&st) > 0) failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return failed;
}

/* Every sample index of every epoch trained exactly once; returns the first violation or -1. */
static int dyn_once(int *at_epoch) {
    for (int e = 0; e < DEPOCHS; e++)
        for (int i = 0; i < DN; i++)
            if (g_dyn->count[e][i] != 1) return *at_epoch = e, i;
    return -1;
}

static void test_dynamic(void) {
    int e = 0, bad;
    dyn_job dj = {.servers = 1, .staleness = -1, .slow_ms = 6, .die_w = -1};
    CHECK(dyn_run("dyn", &dj) == 0);
    bad = dyn_once(&e);
    printf("dynamic assignment, 3 workers (the last 3x slower), %d epochs of %d batches of %d: units trained %d / %d / "
           "%d; every sample once per epoch: %s; %d epoch reports, %d complete, samples %d %d %d\n",
           DEPOCHS, DUNITS, DB, g_dyn->units[0], g_dyn->units[1], g_dyn->units[2], bad < 0 ? "yes" : "NO",
           g_dyn->reports, g_dyn->complete, g_dyn->rep_samples[0], g_dyn->rep_samples[1], g_dyn->rep_samples[2]);
    CHECK_MSG(bad < 0, "sample %d of epoch %d trained %d times", bad, e, bad < 0 ? 1 : g_dyn->count[e][bad]);
    CHECK(g_dyn->units[0] + g_dyn->units[1] + g_dyn->units[2] == DEPOCHS * DUNITS);
    CHECK_MSG(g_dyn->units[2] < g_dyn->units[0] && g_dyn->units[2] < g_dyn->units[1],
              "the slow worker trained %d units, the others %d and %d", g_dyn->units[2], g_dyn->units[0], g_dyn->units[1]);
    CHECK(g_dyn->reports == DEPOCHS && g_dyn->complete == DEPOCHS);
    for (int k = 0; k < DEPOCHS; k++) {
        CHECK(g_dyn->rep_samples[k] == DN);
        CHECK(g_dyn->rep_w[k][0] + g_dyn->rep_w[k][1] + g_dyn->rep_w[k][2] == DN);
    }
    /* worker 1 dies after 4 units (early, so that a worker starved on a loaded machine still gets
     * there), holding the unit of its last answer: it goes to another; with 2 servers and a bound,
     * server 1 must not wait for the unit the dead worker held */
    for (int S = 1; S <= 2; S++) {
        dj = (dyn_job){.servers = S, .staleness = S == 1 ? -1 : 1, .slow_ms = 6, .die_w = 1, .die_after = 4};
        CHECK(dyn_run(S == 1 ? "dyndead" : "dyndead2", &dj) == 0);
        bad = dyn_once(&e);
        printf("dynamic assignment, %d server(s), staleness %d, worker 1 dies after 4 units: units %d / %d / %d; "
               "every sample once per epoch: %s; %d complete epochs\n", S, dj.staleness, g_dyn->units[0],
               g_dyn->units[1], g_dyn->units[2], bad < 0 ? "yes" : "NO", g_dyn->complete);
        CHECK_MSG(bad < 0, "sample %d of epoch %d trained %d times", bad, e, bad < 0 ? 1 : g_dyn->count[e][bad]);
        CHECK(g_dyn->units[1] == 4 && g_dyn->complete == DEPOCHS);
    }
}

static int max_stale(const int64_t *stale);

/* --ps-overlap on the dyn harness: 3 workers (the last 3x slower), 1 and 2 servers: every sample
 * once per epoch, all epochs complete; then worker 1 dies holding two units (its exchange
 * drained): both go to the others. */
static void test_overlap(void) {
    int e = 0, bad;
    for (int S = 1; S <= 2; S++) {
        dyn_job dj = {.servers = S, .staleness = -1, .slow_ms = 6, .die_w = -1, .overlap = true};
        CHECK(dyn_run(S == 1 ? "ovl" : "ovl2", &dj) == 0);
        bad = dyn_once(&e);
        printf("overlap, %d server(s), 3 workers (the last 3x slower): units trained %d / %d / %d; every sample once "
               "per epoch: %s; %d epoch reports, %d complete\n", S, g_dyn->units[0], g_dyn->units[1],
               g_dyn->units[2], bad < 0 ? "yes" : "NO", g_dyn->reports, g_dyn->complete);
        CHECK_MSG(bad < 0, "sample %d of epoch %d trained %d times", bad, e, bad < 0 ? 1 : g_dyn->count[e][bad]);
        CHECK(g_dyn->units[0] + g_dyn->units[1] + g_dyn->units[2] == DEPOCHS * DUNITS);
        CHECK(g_dyn->reports == DEPOCHS && g_dyn->complete == DEPOCHS);
        CHECK_MSG(max_stale(g_dyn->stale) >= 1, "no gradient was stale under overlap");
    }
    for (int S = 1; S <= 2; S++) {
        /* it dies early (after 4 of 78 units): on a loaded machine the others may otherwise take every
         * unit before a starved worker 1 gets to its tenth, and the death would not be tested */
        dyn_job dj = {.servers = S, .staleness = -1, .slow_ms = 6, .die_w = 1, .die_after = 4, .overlap = true};
        CHECK(dyn_run(S == 1 ? "ovldead" : "ovldead2", &dj) == 0);
        bad = dyn_once(&e);
        printf("overlap, %d server(s), worker 1 dies after 4 units holding two: units %d / %d / %d; every sample "
               "once per epoch: %s; %d complete epochs\n", S, g_dyn->units[0], g_dyn->units[1], g_dyn->units[2],
               bad < 0 ? "yes" : "NO", g_dyn->complete);
        CHECK_MSG(bad < 0, "sample %d of epoch %d trained %d times", bad, e, bad < 0 ? 1 : g_dyn->count[e][bad]);
        CHECK(g_dyn->units[1] == 4 && g_dyn->complete == DEPOCHS);
    }
}

/* Units (counted over the epochs, k = epoch * DUNITS + unit) from..to-1 trained once, the others
 * not at all; returns the first k off, or -1. */
static int dyn_units(int from, int to) {
    for (int k = 0; k < DEPOCHS * DUNITS; k++)
        if (g_dyn->ucount[k / DUNITS][k % DUNITS] != (k >= from && k < to)) return k;
    return -1;
}

/* A resumed dynamic run (the position: step_in_epoch 3 of epoch 0, so units 9.. of 26), with and
 * without --ps-overlap, 1 and 2 servers: it trains every unit from the position on once, and
 * reports 3 complete epochs, the first with the samples of its remaining units (the first epoch
 * was never complete: the rest of the run was reported as it). Then --max-steps 10 (30 units,
 * over an epoch end; the last worker 8x slower, so the fast ones stop first): exactly the first
 * 30 units are trained (with overlap the unit handed ahead of each worker's last step was left
 * untrained, and epoch 1 never completed), epoch 1 reported complete, epoch 2 with 4 units. */
static void test_dynamic_resume_max_steps(void) {
    for (int k = 0; k < 8; k++) {
        const bool ovl = k & 1, steps = k & 4;
        const int S = 1 + ((k >> 1) & 1);
        dyn_job dj = {.servers = S, .staleness = -1, .slow_ms = steps ? 16 : 4, .die_w = -1, .overlap = ovl,
                      .max_steps = steps ? 10 : 0, .start_in = steps ? 0 : 3};
        char tag[24];
        snprintf(tag, sizeof tag, "dynrm%d", k);
        CHECK(dyn_run(tag, &dj) == 0);
        const int from = 3 * dj.start_in, to = steps ? 30 : DEPOCHS * DUNITS;
        int bad = dyn_units(from, to);
        printf("dynamic%s, %d server(s), %s: units trained %d / %d / %d; units %d..%d once, no other: %s; %d epoch "
               "reports (%d complete), samples %d %d\n", ovl ? " --ps-overlap" : "", S,
               steps ? "--max-steps 10" : "resumed at unit 9", g_dyn->units[0], g_dyn->units[1], g_dyn->units[2],
               from, to - 1, bad < 0 ? "yes" : "NO", g_dyn->reports, g_dyn->complete, g_dyn->rep_samples[0],
               g_dyn->rep_samples[1]);
        CHECK_MSG(bad < 0, "unit %d of epoch %d trained %d times", bad % DUNITS, bad / DUNITS,
                  bad < 0 ? 0 : g_dyn->ucount[bad / DUNITS][bad % DUNITS]);
        if (steps) {
            CHECK(g_dyn->units[0] == 10 && g_dyn->units[1] == 10 && g_dyn->units[2] == 10);
            CHECK(g_dyn->reports == 2 && g_dyn->complete == 1);
            CHECK(g_dyn->rep_samples[0] == DN && g_dyn->rep_samples[1] == 4 * DB);
        } else {
            CHECK(g_dyn->reports == DEPOCHS && g_dyn->complete == DEPOCHS);
            CHECK(g_dyn->rep_samples[0] == DN - 9 * DB && g_dyn->rep_samples[1] == DN && g_dyn->rep_samples[2] == DN);
        }
    }
}

/* A stop (SIGTERM) that reaches the server while its workers are leaving is a stop, however the
 * leaves and the flag interleave. Once, in CI, all 3 workers of `dtrain train --strategy ps` left
 * before the serving thread looked at the flag, and the run failed with "all 3 workers are gone"
 * instead of writing its checkpoint: the loop read the live count before the flag. */
static void test_dynamic_stop(void) {
    dyn_job dj = {.servers = 1, .staleness = -1, .slow_ms = 2, .die_w = -1, .stop_after = 5};
    CHECK(dyn_run("dynstop", &dj) == 0);
    printf("stop while the workers leave (2 leave, the flag is set, the last leaves): server: %s\n",
           g_dyn->serve_msg);
    CHECK_MSG(g_dyn->serve_status == DT_EINTR && strstr(g_dyn->serve_msg, "stopped by a signal"),
              "server 0 returned %d: %s", (int)g_dyn->serve_status, g_dyn->serve_msg);
}

/* The largest staleness (updates a gradient missed) in a histogram; DT_STALENESS_BINS - 1 means
 * that or more. */
static int max_stale(const int64_t *stale) {
    int m = 0;
    for (int k = 0; k < DT_STALENESS_BINS; k++)
        if (stale[k]) m = k;
    return m;
}

/* Bounded staleness under dynamic assignment, 2 servers (so server 1's pull requests hold
 * answers too), the last worker much slower (50 ms a unit against 2): a batch is handed out at most s rounds ahead of the
 * oldest one out, and each gradient misses at most (2s+1)W - 1 = 14 updates (s = 2, W = 3);
 * s = 0 trains round by round (at most W - 1 = 2 missed); without a bound the fast workers
 * run far ahead. */
static void test_dynamic_bound(void) {
    const int bounds[] = {2, 0, -1};
    int gap[3], worst[3];
    for (int k = 0; k < 3; k++) {
        /* the straggler sleeps 50 ms a unit, the others 2 ms: on a loaded machine too the fast ones reach
         * the bound (and run past it without one) */
        dyn_job dj = {.servers = 2, .staleness = bounds[k], .slow_ms = 50, .die_w = -1};
        char tag[16];
        snprintf(tag, sizeof tag, "dynb%d", k);
        CHECK(dyn_run(tag, &dj) == 0);
        int e = 0;
        CHECK(dyn_once(&e) < 0 && g_dyn->complete == DEPOCHS);
        gap[k] = g_dyn->max_gap, worst[k] = max_stale(g_dyn->stale);
        printf("straggler (worker 2 sleeps 50 ms a unit), 2 servers + 3 workers, dynamic, --staleness %d: largest round gap %d, most "
               "updates a gradient missed %d%s; units trained %d / %d / %d\n", bounds[k], gap[k], worst[k],
               worst[k] == DT_STALENESS_BINS - 1 ? " or more" : "", g_dyn->units[0], g_dyn->units[1], g_dyn->units[2]);
    }
    CHECK_MSG(gap[0] <= 2 && worst[0] <= 14, "s = 2: round gap %d, staleness %d", gap[0], worst[0]);
    CHECK_MSG(gap[0] == 2, "the straggler never pushed the round gap to the bound (%d)", gap[0]);
    CHECK_MSG(gap[1] == 0 && worst[1] <= 2, "s = 0: round gap %d, staleness %d", gap[1], worst[1]);
    CHECK_MSG(gap[2] > 2, "without a bound the fast workers stayed within %d rounds", gap[2]);
}

/* Through the trainer: 3 async workers with --slow 3:3; each epoch report holds every sample once. */
static void test_dynamic_trainer(void) {
    run_cfg rc = {.strategy = "ps", .servers = 1, .staleness = -1, .opt = DT_OPTIM_ADAM, .batch = 8, .epochs = 2,
                  .slow_rank = 3, .slow = 3};
    char job[64];
    snprintf(job, sizeof job, "pstest%ddyntr", (int)getpid());
    CHECK(run_ranks(4, &rc, job) == 0);
    const result *r = &g_res[0];
    printf("trainer, 3 async workers, rank 3 x3 slower, 2 epochs: %d reports; samples per epoch %lld %lld; "
           "last epoch per worker %lld / %lld / %lld\n", r->epochs_reported, (long long)r->samples[0],
           (long long)r->samples[1], (long long)r->wsamples[1][0], (long long)r->wsamples[1][1],
           (long long)r->wsamples[1][2]);
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
               "staleness 0: %lld, 1: %lld, more: %lld\n", ov ? " with --ps-overlap" : "", r->epochs_reported,
               (long long)r->samples[0], (long long)r->samples[1], (long long)r->samples[2], r->loss[0], r->loss[2],
               (long long)r->stale[0], (long long)r->stale[1], (long long)(3 * 26 - r->stale[0] - r->stale[1]));
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
    g_dyn = mmap(NULL, sizeof *g_dyn, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_dyn == MAP_FAILED) return 1;
    test_bitwise();
    test_dynamic();
    test_dynamic_trainer();
    test_overlap();
    test_overlap_trainer();
    test_dynamic_resume_max_steps();
    test_dynamic_stop();
    test_staleness_bound();
    test_dynamic_bound();
    test_dead_worker();
    test_localsgd();
    dt_test_remove_dir(g_dir);
    return dt_test_summary("ps_test");
}
