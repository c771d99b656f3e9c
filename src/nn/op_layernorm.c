/* Op: layer normalisation over the last dim (GPT) or, with spec.flatten, over all values of a
 * sample (the sequential spec); weight and bias of that size, eps from the spec. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <stdio.h>
#include <string.h>

dt_status dt_op_same_shape(dt_model *m, dt_node *n);

static int width(const dt_node *n) { return n->a.flatten ? (int)n->out_n : dt_shape_last(n); }

static dt_status layernorm_infer(dt_model *m, dt_node *n) {
    DT_TRY(dt_op_same_shape(m, n));
    int64_t shp[1] = {width(n)};
    if (dt_graph_declare(m, n, "weight", false, 1, shp) < 0 || dt_graph_declare(m, n, "bias", false, 1, shp) < 0)
        return DT_EINVAL;
    return DT_OK;
}

static size_t layernorm_saved(const dt_model *m, const dt_node *n, int B) {
    (void)m;
    return 2 * (size_t)B * (n->out_n / (size_t)width(n)) * sizeof(float);
}

static void layernorm_init(dt_model *m, dt_node *n, float *p, uint64_t seed) {
    (void)seed;
    const size_t C = (size_t)width(n);
    float *w = p + dt_node_tensor_off(m, n, 0);
    for (size_t j = 0; j < C; j++) w[j] = 1.0f;
    memset(p + dt_node_tensor_off(m, n, 1), 0, C * sizeof(float));
}

/* Rows per piece of bf16 values (graph_layout.c), at least one. */
static int piece_rows(int C) { return C < DT_BF16_PIECE ? DT_BF16_PIECE / C : 1; }

static size_t layernorm_workspace(const dt_model *m, const dt_node *n, int B) {
    (void)m, (void)B;
    const int C = width(n);
    return n->bf16 ? (size_t)piece_rows(C) * C : 0;
}

static dt_status layernorm_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    const int C = width(n), N = c->B * (int)(n->out_n / (size_t)C);
    float *mean = n->saved, *rstd = mean + N;
    const float *in = dt_node_in(m, n, 0), *w = dt_node_param(m, n, c, 0), *b = dt_node_param(m, n, c, 1);
    if (!n->bf16) return c->be->layernorm_forward(n->out, mean, rstd, in, w, b, N, C, n->a.eps), DT_OK;
    for (int r = 0; r < N; r += piece_rows(C)) {
        const int k = N - r < piece_rows(C) ? N - r : piece_rows(C);
        const size_t at = (size_t)r * C;
        c->be->layernorm_forward(c->work, mean + r, rstd + r, in + at, w, b, k, C, n->a.eps);
        c->dev->ops->cast_f32_bf16(c->dev, dt_node_out_bf16(n) + at, c->work, (size_t)k * C);
    }
    return DT_OK;
}

static void layernorm_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    const int C = width(n), N = c->B * (int)(n->out_n / (size_t)C);
    const float *mean = n->saved, *rstd = mean + N;
    c->be->layernorm_backward(din[0], dt_node_grad(m, n, c, 0), dt_node_grad(m, n, c, 1), n->grad, dt_node_in(m, n, 0),
                              dt_node_param(m, n, c, 0), mean, rstd, N, C);
}

/* Over the whole sample (sequential: scale and bias shaped as the input's sample) or over the last
 * dim (GPT). */
static dt_status layernorm_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in,
                                const char **out) {
    const dt_node *xn = dt_node_input(m, n, 0);
    int64_t dims[4];
    int nd = 0;
    if (n->a.flatten)
        for (int d = 0; d < xn->ndim; d++) dims[nd++] = xn->shape[d];
    const char *ln[3] = {in[0], o->param(o, m, n, 0, dims, nd), o->param(o, m, n, 1, dims, nd)};
    dt_onnx_node *l = dt_onnx_op(o, "LayerNormalization", ln, 3);
    o->attr_i(o, l, "axis", n->a.flatten ? 1 : -1);
    o->attr_f(o, l, "epsilon", n->a.eps);
    *out = dt_onnx_out(o, l);
    return DT_OK;
}

static void layernorm_format(char *buf, size_t cap, const dt_layer_spec *l) { snprintf(buf, cap, "(eps=%g)", l->eps); }

static const dt_op_syntax layernorm_syntax = {.alias = "ln",
                                              .args = "| eps",
                                              .usage = "layernorm([eps=])",
                                              .alias_usage = "ln = layernorm",
                                              .format = layernorm_format};

const dt_op dt_op_layernorm = {.name = "layernorm",
                               .help = "layer normalisation (weight and bias), eps default 1e-5",
                               .syntax = &layernorm_syntax,
                               .min_in = 1,
                               .max_in = 1,
                               .infer = layernorm_infer,
                               .saved_bytes = layernorm_saved,
                               .workspace = layernorm_workspace,
                               .init = layernorm_init,
                               .forward = layernorm_forward,
                               .backward = layernorm_backward,
                               .onnx = layernorm_onnx};
