/* Shared helpers of the pipeline tests (pp_test.c, tp_pp_test.c): a training run through the
 * trainer (AdamW lr 3e-3, --clip 0.5, seed 5) in this process or in N forked shared-memory ranks,
 * its running losses per step and final parameters, compared with one worker's within
 * DT_PP_TEST_TOL (2e-5 absolute: float rounding of other GEMM shapes and sums' orders; the
 * parameters are ~0.02-1, the losses ~4-5.5). Include after core/test.h and parallel_testlib.h. */
#ifndef DT_PARALLEL_PP_TESTLIB_H
#define DT_PARALLEL_PP_TESTLIB_H

#include "dtrain/dtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DT_PP_TEST_TOL 2e-5
enum { CAP = 1 << 18, STEPS = 20 };

typedef struct {
    const char *model, *data, *strategy;
    int batch;
    int64_t steps;
    const char *save, *resume, *metrics;
    int die_at; /* > 0: rank 0 exits abruptly after this step */
} run_cfg;

typedef struct {
    float loss[STEPS + 1]; /* the epoch's running mean loss after each step (rank 0) */
    int die_at;
} progress;

static void on_progress(void *ctx, const dt_progress_info *p) {
    progress *g = ctx;
    if (p->global_step >= 1 && p->global_step <= STEPS) g->loss[p->global_step] = p->loss;
    if (g->die_at && p->global_step == g->die_at) _exit(9); /* a crash, without leaving the job */
}

static dt_status train(const run_cfg *rc, dt_comm *comm, float *out, size_t *n, progress *pg) {
    dt_train_config cfg = dt_train_defaults();
    cfg.data = rc->data;
    cfg.model = rc->model;
    cfg.epochs = 3;
    cfg.batch = rc->batch;
    cfg.max_steps = rc->steps;
    cfg.seed = 5;
    cfg.optim = dt_optim_defaults(DT_OPTIM_ADAMW);
    cfg.lr.base_lr = 3e-3f;
    cfg.clip_norm = 0.5f;
    cfg.comm = comm;
    cfg.strategy = rc->strategy;
    cfg.save = rc->save;
    cfg.resume = rc->resume;
    cfg.metrics = rc->metrics;
    cfg.on_progress = on_progress;
    cfg.cb_ctx = pg;
    cfg.progress_interval_s = 0;
    pg->die_at = rc->die_at;
    return dt_test_train_params(&cfg, out, CAP, n);
}

/* N forked ranks; rank 0 writes its parameters, then its losses, to path; each failed rank its
 * message to path.err<R>. Returns the number of failed ranks. */
static int run_ranks(int N, const run_cfg *rc, const char *path) {
    static int job_no;
    char job[64];
    snprintf(job, sizeof job, "pptest%d_%d_%d", (int)getpid(), N, job_no++);
    for (int r = 0; r < N; r++)
        if (fork() == 0) {
            dt_comm *c = dt_test_rank_comm(r, N, job);
            static float p[CAP + STEPS + 1];
            static progress pg;
            size_t n = 0;
            dt_status s = train(rc, c, p, &n, &pg);
            if (s != DT_OK) {
                char ep[192];
                snprintf(ep, sizeof ep, "%s.err%d", path, r);
                FILE *f = fopen(ep, "w");
                if (f) fprintf(f, "%s\n", dt_last_error()), fclose(f);
                _exit(3);
            }
            memcpy(p + n, pg.loss, sizeof pg.loss);
            if (r == 0 && dt_test_write_floats(path, p, n + STEPS + 1) != 0) _exit(5);
            dt_comm_destroy(c);
            _exit(0);
        }
    return dt_test_wait_children();
}

/* The first line of what failed rank r of a run_ranks(.., path) said ("" when nothing). */
static void rank_error(const char *path, int r, char *msg, size_t cap) {
    char ep[192];
    snprintf(ep, sizeof ep, "%s.err%d", path, r);
    msg[0] = 0;
    FILE *f = fopen(ep, "r");
    if (!f) return;
    if (!fgets(msg, (int)cap, f)) msg[0] = 0;
    fclose(f);
}

static float g_ref[CAP + STEPS + 1], g_got[CAP + STEPS + 1];

/* The largest difference of parameters (within ptol) and of the losses of steps 1..steps (within
 * DT_PP_TEST_TOL). */
static void compare_within(const char *what, size_t n, const float *ref, const float *got, size_t m, int steps,
                           double ptol) {
    double dp = m == n + STEPS + 1 ? dt_test_maxdiff(ref, got, n) : 1e9, dl = 0;
    for (int k = 1; k <= steps && dp < 1e9; k++) {
        double d = (double)ref[n + k] - got[n + k];
        if (d < 0) d = -d;
        if (d > dl || d != d) dl = d != d ? 1e9 : d;
    }
    printf("%-34s max |param - 1 worker| %.2g, max |loss - 1 worker| %.2g over %d steps\n", what, dp, dl, steps);
    CHECK_MSG(dp < ptol && dl < DT_PP_TEST_TOL, "%s: parameters differ by %g, losses by %g", what, dp, dl);
}

static void compare(const char *what, size_t n, const float *ref, const float *got, size_t m, int steps) {
    compare_within(what, n, ref, got, m, steps, DT_PP_TEST_TOL);
}

/* One worker in this process: parameters then losses into out; *n the parameters. */
static void reference(const run_cfg *rc, float *out, size_t *n) {
    progress pg = {{0}, 0};
    CHECK_OK(train(rc, NULL, out, n, &pg));
    memcpy(out + *n, pg.loss, sizeof pg.loss);
}

/* A value "key": N in the last line of a metrics file, the first after "within": (NULL: anywhere). */
static double metric_in(const char *path, const char *within, const char *key) {
    static char buf[1 << 14];
    FILE *f = fopen(path, "r");
    buf[0] = 0;
    if (f) {
        while (fgets(buf, sizeof buf, f)) {}
        fclose(f);
    }
    char k[64];
    const char *from = buf;
    if (within) {
        snprintf(k, sizeof k, "\"%s\": ", within);
        from = strstr(buf, k);
        if (!from) return -1;
    }
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(from, k);
    return p ? atof(p + strlen(k)) : -1;
}

static double metric(const char *path, const char *key) { return metric_in(path, NULL, key); }

#endif
