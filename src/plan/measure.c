/* The planner's probe of this machine's compute: each node's forward + backward timed through the
 * graph's node hooks at two batch sizes (the shapes the layouts run), the median of several passes,
 * fitted as t_fix + t_per x batch per node (parallel/pp_cost.c's node timing); and the optimizer's
 * update of the model's values, timed here. The model's gradients and buffers are left as they were. */
#include "plan/plan.h"
#include "parallel/pp.h"

#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds per node at batch B: the median over up to reps single passes (after one warm-up pass),
 * at least 5 and, past them, while the passes have taken under DT_PLAN_MEASURE_S, so that a pass
 * another process preempted on this shared host does not count (the bench and --strategy auto
 * compare with the median step). The longer passes are the ones preempted: 5 of them were too few
 * (docs/plan.md). */
static dt_status time_nodes(dt_model *m, int B, int reps, double *out) {
    const int n = dt_model_num_nodes(m);
    double *all = calloc((size_t)n * (size_t)reps, sizeof(double)), *col = calloc((size_t)reps, sizeof(double));
    dt_status st = all && col ? DT_OK : dt_error(DT_ENOMEM, "plan: out of memory for the probe");
    const double t0 = dt_now();
    int done = 0;
    for (; done < reps && st == DT_OK && (done < 5 || dt_now() - t0 < DT_PLAN_MEASURE_S); done++)
        st = dt_pp_time_nodes(m, B, done == 0, 1, all + (size_t)done * n);
    for (int i = 0; i < n && st == DT_OK; i++) {
        for (int r = 0; r < done; r++) col[r] = all[(size_t)r * n + i];
        qsort(col, (size_t)done, sizeof *col, cmp_double);
        out[i] = done % 2 ? col[done / 2] : 0.5 * (col[done / 2 - 1] + col[done / 2]);
    }
    free(all), free(col);
    return st;
}

dt_status dt_plan_model_measure_optim(dt_plan_model *pm, const dt_optim_config *o, int reps) {
    const size_t n = pm->total_params > 1 ? (size_t)pm->total_params : 1;
    float *p = calloc(n, sizeof(float)), *g = calloc(n, sizeof(float));
    double *t = calloc((size_t)(reps > 0 ? reps : 1), sizeof(double));
    dt_optim *opt = NULL;
    dt_status st = p && g && t ? dt_optim_create(&opt, o, n) : dt_error(DT_ENOMEM, "plan: out of memory for the probe");
    for (size_t i = 0; st == DT_OK && i < n; i++) g[i] = 1e-3f * (float)(i % 7);
    for (int r = -1; st == DT_OK && r < reps; r++) { /* one warm-up step */
        const double a = dt_now();
        dt_optim_step(opt, p, g, 1e-3f);
        if (r >= 0) t[r] = dt_now() - a;
    }
    if (st == DT_OK && reps > 0) {
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        pm->opt_per = t[reps / 2] / (double)n;
    }
    dt_optim_destroy(opt), free(p), free(g), free(t);
    return st;
}

dt_status dt_plan_model_measure(dt_plan_model *pm, dt_model *m, int b1, int b2, int reps) {
    if (b1 < 1 || b2 <= b1 || reps < 1)
        return dt_error(DT_EINVAL, "plan: probe batches %d and %d: need 1 <= b1 < b2", b1, b2);
    const int n = pm->nodes;
    double *t1 = calloc((size_t)n, sizeof(double)), *t2 = calloc((size_t)n, sizeof(double));
    free(pm->t_fix), free(pm->t_per);
    pm->t_fix = calloc((size_t)n, sizeof(double)), pm->t_per = calloc((size_t)n, sizeof(double));
    dt_status st = t1 && t2 && pm->t_fix && pm->t_per ? DT_OK
                                                      : dt_error(DT_ENOMEM, "plan: out of memory for the probe");
    if (st == DT_OK) st = time_nodes(m, b1, reps, t1);
    if (st == DT_OK) st = time_nodes(m, b2, reps, t2);
    for (int i = 0; st == DT_OK && i < n; i++) {
        double per = (t2[i] - t1[i]) / (b2 - b1);
        if (per < 0) per = 0; /* noise: a node no slower at the larger batch is all fixed cost */
        double fix = t1[i] - per * b1;
        if (fix < 0) fix = 0, per = t2[i] / b2;
        pm->t_fix[i] = fix, pm->t_per[i] = per;
    }
    free(t1), free(t2);
    if (st != DT_OK) free(pm->t_fix), free(pm->t_per), pm->t_fix = pm->t_per = NULL;
    return st;
}

double dt_plan_other_s(double epoch_s, double compute_s, double data_wait_s, int64_t steps) {
    if (steps < 1) return 0;
    const double o = (epoch_s - compute_s - data_wait_s) / (double)steps;
    return o > 0 ? o : 0;
}
