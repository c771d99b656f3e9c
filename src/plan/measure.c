/* The planner's probe of this machine's compute: each node's forward + backward timed through the
 * graph's node hooks at two batch sizes (the shapes the layouts run), the median of several passes,
 * fitted as t_fix + t_per x batch per node (parallel/pp_cost.c's node timing). The model's gradients and buffers are left as
 * they were. */
#include "plan/plan.h"
#include "parallel/pp.h"

#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds per node at batch B: the median over reps single passes (after one warm-up pass), so that
 * a pass another process preempted on this shared host does not count (the bench and --strategy
 * auto compare with the median step). */
static dt_status time_nodes(dt_model *m, int B, int reps, double *out) {
    const int n = dt_model_num_nodes(m);
    double *all = calloc((size_t)n * (size_t)reps, sizeof(double)), *col = calloc((size_t)reps, sizeof(double));
    dt_status st = all && col ? DT_OK : dt_error(DT_ENOMEM, "plan: out of memory for the probe");
    for (int r = 0; r < reps && st == DT_OK; r++) st = dt_pp_time_nodes(m, B, r == 0, 1, all + (size_t)r * n);
    for (int i = 0; i < n && st == DT_OK; i++) {
        for (int r = 0; r < reps; r++) col[r] = all[(size_t)r * n + i];
        qsort(col, (size_t)reps, sizeof *col, cmp_double);
        out[i] = reps % 2 ? col[reps / 2] : 0.5 * (col[reps / 2 - 1] + col[reps / 2]);
    }
    free(all), free(col);
    return st;
}

dt_status dt_plan_model_measure(dt_plan_model *pm, dt_model *m, int b1, int b2, int reps) {
    if (b1 < 1 || b2 <= b1 || reps < 1)
        return dt_error(DT_EINVAL, "plan: probe batches %d and %d: need 1 <= b1 < b2", b1, b2);
    const int n = pm->nodes;
    double *t1 = calloc((size_t)n, sizeof(double)), *t2 = calloc((size_t)n, sizeof(double));
    free(pm->t_fix), free(pm->t_per);
    pm->t_fix = calloc((size_t)n, sizeof(double)), pm->t_per = calloc((size_t)n, sizeof(double));
    dt_status st = t1 && t2 && pm->t_fix && pm->t_per ? DT_OK : dt_error(DT_ENOMEM, "plan: out of memory for the probe");
    if (st == DT_OK) st = time_nodes(m, b1, reps, t1);
    if (st == DT_OK) st = time_nodes(m, b2, reps, t2);
    for (int i = 0; st == DT_OK && i < n; i++) {
        double per = (t2[i] - t1[i]) / (b2 - b1);
        if (per < 0) per = 0;  /* noise: a node no slower at the larger batch is all fixed cost */
        double fix = t1[i] - per * b1;
        if (fix < 0) fix = 0, per = t2[i] / b2;
        pm->t_fix[i] = fix, pm->t_per[i] = per;
    }
    free(t1), free(t2);
    if (st != DT_OK) free(pm->t_fix), free(pm->t_per), pm->t_fix = pm->t_per = NULL;
    return st;
}
