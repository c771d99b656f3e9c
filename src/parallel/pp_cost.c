/* Measured per-node cost for the pipeline cut (pp(cost=measured)): rank 0 of the job times each
 * node's forward and backward through the graph's node hooks on a probe batch of zeros (token id
 * 0, label 0 are valid for every model), a few times, and broadcasts the sums so that every rank
 * cuts the same way. The model's gradients and buffers are left as they were. */
#include "device/device.h"
#include "parallel/pp.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    double *fwd, *bwd;
    int last; /* the node whose forward is running (-1: none yet) */
    double t_last;
} probe;

static void on_forward(void *ctx, int node) {
    probe *p = ctx;
    const double now = dt_now();
    if (p->last >= 0) p->fwd[p->last] += now - p->t_last;
    p->last = node, p->t_last = now;
}

static void on_backward(void *ctx, int node) {
    probe *p = ctx;
    const double now = dt_now();
    p->bwd[node] += now - p->t_last;
    p->t_last = now;
}

dt_status dt_pp_time_nodes(dt_model *m, int B, int warmup, int reps, double *cost) {
    const int n = dt_model_num_nodes(m);
    const size_t xs = (size_t)B * (size_t)dt_model_input_values(m, 0),
                 ys = (size_t)B * (size_t)dt_model_input_values(m, 1);
    const size_t nb = dt_model_num_buffers(m);
    void *x = calloc(xs + 1, 4), *y = calloc(ys + 1, 4);
    float *saved = nb ? malloc(nb * sizeof(float)) : NULL;
    double *t = calloc(2 * (size_t)n, sizeof(double));
    dt_status st = x && y && t && (!nb || saved) ? DT_OK : dt_error(DT_ENOMEM, "pp: out of memory for the cost probe");
    dt_dev *d = dt_model_device(m); /* the buffers kept in a host copy, as on any device */
    if (st == DT_OK && nb) d->ops->download(d, saved, dt_model_buffers(m), nb * sizeof(float));
    probe p = {.fwd = t, .bwd = t + n};
    const dt_feed f = {.x = x, .y = ys ? y : NULL, .n = B};
    for (int r = -warmup; r < reps && st == DT_OK; r++) {
        if (r == 0) memset(t, 0, 2 * (size_t)n * sizeof(double)); /* warm-up passes are not counted */
        p.last = -1;
        dt_model_set_node_hooks(m, on_forward, NULL, &p);
        float loss;
        st = dt_model_run(m, &f, true, 0, &loss);
        if (p.last >= 0) p.fwd[p.last] += dt_now() - p.t_last;
        dt_model_set_node_hooks(m, NULL, on_backward, &p);
        p.t_last = dt_now();
        if (st == DT_OK) st = dt_model_backward_loss(m, 1.0f, NULL, NULL);
    }
    dt_model_set_node_hooks(m, NULL, NULL, NULL);
    dt_model_zero_grad(m);
    if (saved) d->ops->upload(d, dt_model_buffers(m), saved, nb * sizeof(float));
    for (int i = 0; st == DT_OK && i < n; i++) cost[i] = t[i] + t[n + i];
    free(x), free(y), free(saved), free(t);
    return st;
}

dt_status dt_pp_measure_costs(dt_model *m, dt_comm *comm, int B, int reps, double *cost) {
    dt_status st = dt_comm_rank(comm) == 0 ? dt_pp_time_nodes(m, B, 0, reps, cost) : DT_OK;
    int32_t ok = st == DT_OK, all = 0;
    DT_TRY(dt_comm_allreduce(comm, &ok, &all, 1, DT_I32, DT_OP_MIN));
    if (!all) return st != DT_OK ? st : dt_error(DT_EPEER, "pp: rank 0 could not measure the nodes' cost");
    return dt_comm_broadcast(comm, cost, (size_t)dt_model_num_nodes(m), DT_F64, 0);
}
