/* The planner's probe of this machine's compute: each node's forward + backward timed through the
 * graph's node hooks at two batch sizes (the shapes the layouts run), fitted as t_fix + t_per x
 * batch per node. The model's gradients and buffers are left as they were. */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    double *t;       /* [nodes] seconds summed over passes */
    int last;        /* the node whose forward is running (-1: none yet) */
    double t_last;
} probe;

static void on_forward(void *ctx, int node) {
    probe *p = ctx;
    const double now = dt_now();
    if (p->last >= 0) p->t[p->last] += now - p->t_last;
    p->last = node, p->t_last = now;
}

static void on_backward(void *ctx, int node) {
    probe *p = ctx;
    const double now = dt_now();
    p->t[node] += now - p->t_last;
    p->t_last = now;
}

/* Mean seconds per node of reps forward+backward passes at batch B (after one warm-up pass). */
static dt_status time_nodes(dt_model *m, int B, int reps, double *out) {
    const int n = dt_model_num_nodes(m);
    const size_t xs = (size_t)B * (size_t)dt_model_input_values(m, 0), ys = (size_t)B * (size_t)dt_model_input_values(m, 1);
    const size_t nb = dt_model_num_buffers(m);
    void *x = calloc(xs + 1, 4), *y = calloc(ys + 1, 4);
    float *saved = nb ? malloc(nb * sizeof(float)) : NULL;
    dt_status st = x && y && (!nb || saved) ? DT_OK : dt_error(DT_ENOMEM, "plan: out of memory for the probe");
    if (st == DT_OK && nb) memcpy(saved, dt_model_buffers(m), nb * sizeof(float));
    probe p = {.t = out};
    const dt_feed f = {.x = x, .y = ys ? y : NULL, .n = B};
    for (int r = -1; r < reps && st == DT_OK; r++) {
        if (r == 0) memset(out, 0, (size_t)n * sizeof(double));  /* the warm-up pass is not counted */
        p.last = -1;
        dt_model_set_node_hooks(m, on_forward, NULL, &p);
        float loss;
        st = dt_model_run(m, &f, true, 0, &loss);
        if (p.last >= 0) p.t[p.last] += dt_now() - p.t_last;
        dt_model_set_node_hooks(m, NULL, on_backward, &p);
        p.t_last = dt_now();
        if (st == DT_OK) st = dt_model_backward_loss(m, 1.0f, NULL, NULL);
    }
    dt_model_set_node_hooks(m, NULL, NULL, NULL);
    dt_model_zero_grad(m);
    if (saved) memcpy(dt_model_buffers(m), saved, nb * sizeof(float));
    for (int i = 0; st == DT_OK && i < n; i++) out[i] /= reps;
    free(x), free(y), free(saved);
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
