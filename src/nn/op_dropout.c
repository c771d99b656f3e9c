/* Op: inverted dropout in training (p > 0), identity otherwise. The mask of element i is a pure
 * function of (seed, step, layer, i): counter-based, the same on any number of workers. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <stdio.h>

dt_status dt_op_same_shape(dt_model *m, dt_node *n);

static size_t dropout_saved(const dt_model *m, const dt_node *n, int B) {
    (void)m;
    return (size_t)B * n->out_n;
}

static dt_status dropout_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    const size_t cnt = (size_t)c->B * n->out_n;
    const float *x = dt_node_in(m, n, 0);
    if (c->train && n->a.p > 0)
        c->be->dropout_forward(n->out, n->saved, x, cnt, n->a.p, c->seed,
                               dt_rng_key(DT_RNG_DROPOUT, c->step * 256 + (uint64_t)n->layer));
    else c->dev->ops->copy(c->dev, n->out, x, cnt * sizeof(float));
    return DT_OK;
}

static void dropout_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    (void)m;
    if (!din[0]) return;
    const size_t cnt = (size_t)c->B * n->out_n;
    if (c->train && n->a.p > 0) c->be->dropout_backward(din[0], n->grad, n->saved, cnt, n->a.p);
    else c->dev->ops->copy(c->dev, din[0], n->grad, cnt * sizeof(float));
}

/* Evaluation: no dropout. */
static dt_status dropout_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in,
                              const char **out) {
    (void)m, (void)n;
    *out = dt_onnx_node1(o, "Identity", in[0]);
    return DT_OK;
}

static void dropout_format(char *buf, size_t cap, const dt_layer_spec *l) { snprintf(buf, cap, "(%g)", l->p); }

static const dt_op_syntax dropout_syntax = {.args = "p |", .usage = "dropout(p)", .format = dropout_format};

const dt_op dt_op_dropout = {.name = "dropout",
                             .help = "inverted dropout of probability p (default 0.5) in training",
                             .syntax = &dropout_syntax,
                             .min_in = 1,
                             .max_in = 1,
                             .infer = dt_op_same_shape,
                             .saved_bytes = dropout_saved,
                             .forward = dropout_forward,
                             .backward = dropout_backward,
                             .onnx = dropout_onnx,
                             .keeps_input_norm = true};
