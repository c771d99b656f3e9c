/* Op: add, a + b of the same shape (a residual connection). Both inputs get the gradient. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

static dt_status add_infer(dt_model *m, dt_node *n) {
    const dt_node *a = dt_node_input(m, n, 0), *b = dt_node_input(m, n, 1);
    bool same = a->ndim == b->ndim && a->dtype == DT_F32 && b->dtype == DT_F32;
    for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
    if (!same) return dt_graph_fail(m, n, "inputs '%s' and '%s' differ in shape or are not f32", a->name, b->name);
    n->dtype = DT_F32, n->ndim = a->ndim, n->out_n = a->out_n;
    for (int i = 0; i < a->ndim; i++) n->shape[i] = a->shape[i];
    return DT_OK;
}

static dt_status add_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    c->be->add_forward(n->out, dt_node_in(m, n, 0), dt_node_in(m, n, 1), (size_t)c->B * n->out_n);
    return DT_OK;
}

static void add_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    (void)m;
    for (int j = 0; j < 2; j++)
        if (din[j]) c->dev->ops->copy(c->dev, din[j], n->grad, (size_t)c->B * n->out_n * sizeof(float));
}

static dt_status add_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in, const char **out) {
    (void)m, (void)n;
    *out = dt_onnx_node2(o, "Add", in[0], in[1]);
    return DT_OK;
}

const dt_op dt_op_add = {.name = "add",
                         .help = "a + b of the same shape (a residual connection)",
                         .syntax = NULL,
                         .min_in = 2,
                         .max_in = 2,
                         .infer = add_infer,
                         .forward = add_forward,
                         .backward = add_backward,
                         .onnx = add_onnx};
