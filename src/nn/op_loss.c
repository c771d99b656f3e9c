/* Ops: the losses, nodes of the graph whose value is one number per batch.
 *  - xent: softmax cross-entropy of logits (.., V) against int32 targets, one per row (a label per
 *    sample, or a next token per position), mean over the rows whose target is not
 *    spec.ignore_index (torch's F.cross_entropy);
 *  - mse: mean squared error against an f32 target of the same shape.
 * Backward starts from d loss = n->dloss (1, a rank's weight in a global batch, or a loss scale). */
#include "nn/graph_internal.h"

static dt_status xent_infer(dt_model *m, dt_node *n) {
    const dt_node *x = dt_node_input(m, n, 0), *y = dt_node_input(m, n, 1);
    if (x->dtype != DT_F32 || y->dtype != DT_I32) return dt_graph_fail(m, n, "takes f32 logits and int32 targets");
    int V = dt_shape_last(x);
    if (x->out_n / (size_t)V != y->out_n)
        return dt_graph_fail(m, n, "%zu rows of logits but %zu targets per sample", x->out_n / (size_t)V, y->out_n);
    n->dtype = DT_F32, n->ndim = 0, n->out_n = 1;
    return DT_OK;
}

/* The probabilities (B rows of the logits), then the number of targets that counted: an int32 of
 * the device's memory that the forward writes and the backward reads (the host never needs it). */
static size_t xent_saved(const dt_model *m, const dt_node *n, int B) {
    return (size_t)B * dt_node_input(m, n, 0)->out_n * sizeof(float) + sizeof(int32_t);
}
/* Where the count of a run of N rows of V lies in n->saved: after the run's probabilities. */
static int32_t *xent_count(const dt_node *n, int N, int V) { return (int32_t *)((float *)n->saved + (size_t)N * V); }

static dt_status xent_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    const dt_node *x = dt_node_input(m, n, 0);
    const int V = dt_shape_last(x), N = c->B * (int)(x->out_n / (size_t)V), per = N / c->B;
    /* the targets checked where the host has them: the feed (a target computed by a node: as is) */
    const int32_t *y = dt_node_in_host(m, n, 1);
    for (int i = 0; y && i < N; i++)
        if (y[i] != n->a.ignore_index && (y[i] < 0 || y[i] >= V))
            return dt_error(DT_EINVAL,
                            "model: node '%s': target %d of sample %d, row %d is outside [0, %d) (the "
                            "classes)",
                            n->name, y[i], i / per, i % per, V);
    c->be->xent_forward(n->out, n->saved, x->out, (const int32_t *)dt_node_in(m, n, 1), N, V, n->a.ignore_index,
                        xent_count(n, N, V));
    return DT_OK;
}

static void xent_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    const dt_node *x = dt_node_input(m, n, 0);
    const int V = dt_shape_last(x), N = c->B * (int)(x->out_n / (size_t)V);
    if (din[0])
        c->be->xent_backward(din[0], n->saved, (const int32_t *)dt_node_in(m, n, 1), N, V, n->a.ignore_index,
                             xent_count(n, N, V), n->dloss);
}

const dt_op dt_op_xent = {.name = "xent",
                          .help = "loss: softmax cross-entropy of logits against int32 targets",
                          .syntax = NULL,
                          .min_in = 2,
                          .max_in = 2,
                          .infer = xent_infer,
                          .saved_bytes = xent_saved,
                          .forward = xent_forward,
                          .backward = xent_backward};

static dt_status mse_infer(dt_model *m, dt_node *n) {
    const dt_node *x = dt_node_input(m, n, 0), *y = dt_node_input(m, n, 1);
    if (x->dtype != DT_F32 || y->dtype != DT_F32 || x->out_n != y->out_n)
        return dt_graph_fail(m, n,
                             "takes f32 predictions and an f32 target of the same size (here %d and %d values a "
                             "sample; a model for one target a sample ends in linear(%d) mse)",
                             (int)x->out_n, (int)y->out_n, (int)y->out_n);
    n->dtype = DT_F32, n->ndim = 0, n->out_n = 1;
    return DT_OK;
}

static dt_status mse_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    const dt_node *x = dt_node_input(m, n, 0);
    c->be->mse_forward(n->out, x->out, dt_node_in(m, n, 1), (size_t)c->B * x->out_n);
    return DT_OK;
}

static void mse_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    const dt_node *x = dt_node_input(m, n, 0);
    if (din[0]) c->be->mse_backward(din[0], x->out, dt_node_in(m, n, 1), (size_t)c->B * x->out_n, n->dloss);
}

/* A spec's last word ("linear(16) relu linear(1) mse": regression); not listed among the layers. */
static const dt_op_syntax mse_syntax = {.args = "|"};

const dt_op dt_op_mse = {.name = "mse",
                         .help = "loss: mean squared error against an f32 target of the same shape",
                         .syntax = &mse_syntax,
                         .min_in = 2,
                         .max_in = 2,
                         .infer = mse_infer,
                         .forward = mse_forward,
                         .backward = mse_backward};
