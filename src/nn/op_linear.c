/* Op: linear (fully connected), out = in @ w^T + b with w (out, C), torch's nn.Linear layout.
 * Over the last dim of the input (rows = the other dims and the batch), or with spec.flatten over
 * all values of a sample (the sequential spec: a linear after a conv flattens implicitly). */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <stdio.h>
#include <string.h>

/* Input features and rows per sample. */
static void dims(const dt_model *m, const dt_node *n, int *C, int *rows) {
    const dt_node *in = dt_node_input(m, n, 0);
    *C = n->a.flatten ? (int)in->out_n : dt_shape_last(in);
    *rows = (int)(in->out_n / (size_t)*C);
}

static dt_status linear_infer(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    if (in->dtype != DT_F32) return dt_graph_fail(m, n, "takes f32 values, not ids (add an embedding first)");
    if (n->a.out <= 0) return dt_graph_fail(m, n, "needs out > 0 features (given %d)", n->a.out);
    int C, rows;
    dims(m, n, &C, &rows);
    if (n->a.flatten || in->ndim == 0) n->ndim = 1, n->shape[0] = n->a.out;
    else {
        n->ndim = in->ndim;
        for (int i = 0; i < in->ndim; i++) n->shape[i] = in->shape[i];
        n->shape[n->ndim - 1] = n->a.out;
    }
    n->dtype = DT_F32;
    n->out_n = (size_t)rows * n->a.out;
    int64_t shp[2] = {n->a.out, C};
    if (dt_graph_declare(m, n, "weight", false, 2, shp) < 0) return DT_EINVAL;
    if (n->a.bias && dt_graph_declare(m, n, "bias", false, 1, shp) < 0) return DT_EINVAL;
    return DT_OK;
}

static void linear_init(dt_model *m, dt_node *n, float *p, uint64_t seed) {
    int C, rows;
    dims(m, n, &C, &rows);
    const dt_param_info *w = &m->tensors[n->tensor[0]];
    uint64_t kw = dt_rng_key(DT_RNG_INIT, (uint64_t)n->layer * 2),
             kb = dt_rng_key(DT_RNG_INIT, (uint64_t)n->layer * 2 + 1);
    if (n->a.init_std > 0) {
        if (!n->a.tie) dt_rng_fill_normal(p + w->offset, w->numel, 0.0f, n->a.init_std, seed, kw);
        if (n->a.bias) memset(p + dt_node_tensor_off(m, n, 1), 0, (size_t)n->a.out * sizeof(float));
        return;
    }
    if (!n->a.tie) dt_init_kaiming_uniform(p + w->offset, w->numel, C, seed, kw);
    if (n->a.bias) dt_init_kaiming_uniform(p + dt_node_tensor_off(m, n, 1), (size_t)n->a.out, C, seed, kb);
}

static dt_status linear_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    int C, rows;
    dims(m, n, &C, &rows);
    const float *b = n->a.bias ? dt_node_param(m, n, c, 1) : NULL;
    const float *w = dt_node_param(m, n, c, 0);
    if (n->bf16) /* bf16 in and out (graph_layout.c) */
        c->be->linear_forward_bf16io(dt_node_out_bf16(n), dt_node_in_bf16_values(m, n, 0), w, b, c->B * rows, C,
                                     n->a.out);
    else if (dt_node_in_bf16(m, n, 0)) /* stored bf16 by the node before (graph_layout.c) */
        c->be->linear_forward_bf16(n->out, dt_node_in_bf16_values(m, n, 0), w, b, c->B * rows, C, n->a.out);
    else c->be->linear_forward(n->out, dt_node_in(m, n, 0), w, b, c->work, c->B * rows, C, n->a.out);
    return DT_OK;
}

static void linear_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    int C, rows;
    dims(m, n, &C, &rows);
    float *db = n->a.bias ? dt_node_grad(m, n, c, 1) : NULL;
    float *dw = dt_node_grad(m, n, c, 0);
    const float *w = dt_node_param(m, n, c, 0);
    if (n->grad_bf16) /* bf16 values in and a bf16 gradient (graph_layout.c) */
        c->be->linear_backward_bf16_grad(din[0], dw, db, (uint16_t *)(void *)n->grad, dt_node_in_bf16_values(m, n, 0),
                                         w, c->B * rows, C, n->a.out);
    else if (din[0] && dt_node_in_grad_bf16(m, n, 0)) /* bf16 values in, their gradient out bf16 */
        c->be->linear_backward_bf16_din((uint16_t *)(void *)din[0], dw, db, n->grad, dt_node_in_bf16_values(m, n, 0), w,
                                        c->B * rows, C, n->a.out);
    else if (dt_node_in_bf16(m, n, 0))
        c->be->linear_backward_bf16(din[0], dw, db, n->grad, dt_node_in_bf16_values(m, n, 0), w, c->B * rows, C,
                                    n->a.out);
    else c->be->linear_backward(din[0], dw, db, n->grad, dt_node_in(m, n, 0), w, c->work, c->B * rows, C, n->a.out);
}

static double linear_flops(const dt_model *m, const dt_node *n, int B, bool need_din) {
    int C, rows;
    dims(m, n, &C, &rows);
    double mac = (double)B * rows * (double)C * n->a.out;
    return 2 * mac * (need_din ? 3 : 2); /* forward, weight gradient, input gradient */
}

/* x @ W^T (+ bias): Gemm for a (N, in) input, else Transpose + MatMul (+ Add) over the last dim. */
static dt_status linear_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in, const char **out) {
    const dt_node *xn = dt_node_input(m, n, 0);
    const bool bias = n->ntensor > 1;
    const char *x = in[0], *w = o->param(o, m, n, 0, NULL, 0);
    if (n->a.flatten || xn->ndim <= 1) {
        if (xn->ndim > 1) { /* (N, C, H, W) -> (N, C*H*W) */
            dt_onnx_node *f = dt_onnx_op(o, "Flatten", &x, 1);
            o->attr_i(o, f, "axis", 1);
            x = dt_onnx_out(o, f);
        }
        const char *g[3] = {x, w, bias ? o->param(o, m, n, 1, NULL, 0) : NULL};
        dt_onnx_node *gemm = dt_onnx_op(o, "Gemm", g, bias ? 3 : 2);
        o->attr_i(o, gemm, "transB", 1);
        *out = dt_onnx_out(o, gemm);
        return DT_OK;
    }
    dt_onnx_node *t = dt_onnx_op(o, "Transpose", &w, 1);
    const int64_t perm[2] = {1, 0};
    o->attr_ints(o, t, "perm", perm, 2);
    const char *y = dt_onnx_node2(o, "MatMul", x, dt_onnx_out(o, t));
    *out = bias ? dt_onnx_node2(o, "Add", y, o->param(o, m, n, 1, NULL, 0)) : y;
    return DT_OK;
}

/* x -> (x - mean) / std folded into a weight (out, in...) and its bias: W / std, b - mean / std *
 * (the row sums of W); a linear's or (no padding) a conv's (dt_op fold_input_norm). */
bool dt_op_fold_affine(const dt_model *m, const dt_node *n, double mean, double std, float *params, const char **why) {
    (void)why;
    if (!n->a.bias || n->a.tie) return false;
    if (!params) return true;
    const dt_param_info *w = &m->tensors[n->tensor[0]], *b = &m->tensors[n->tensor[1]];
    const size_t rows = b->numel, cols = w->numel / rows; /* (out, in) or (out, in*k*k) */
    float *W = params + w->offset, *B = params + b->offset;
    for (size_t o = 0; o < rows; o++) {
        double sum = 0;
        for (size_t j = 0; j < cols; j++) sum += W[o * cols + j];
        B[o] = (float)((double)B[o] - mean / std * sum);
        for (size_t j = 0; j < cols; j++) W[o * cols + j] = (float)(W[o * cols + j] / std);
    }
    return true;
}

static bool linear_fold(const dt_model *m, const dt_node *n, double mean, double std, float *params, float *buffers,
                        const char **why) {
    (void)buffers;
    return dt_op_fold_affine(m, n, mean, std, params, why);
}

/* The table's scratch for a linear (the blas bf16/fp16 tables' rounded inputs), in floats. */
static size_t linear_workspace(const dt_model *m, const dt_node *n, int B) {
    int C, rows;
    dims(m, n, &C, &rows);
    return m->be->linear_workspace ? m->be->linear_workspace(B * rows, C, n->a.out) : 0;
}

static void linear_format(char *buf, size_t cap, const dt_layer_spec *l) {
    snprintf(buf, cap, "(%d%s)", l->out, l->bias ? "" : ",bias=0");
}

static const dt_op_syntax linear_syntax = {.alias = "dense",
                                           .args = "out | bias",
                                           .required = 1,
                                           .usage = "linear(out[,bias=0])",
                                           .alias_usage = "dense = linear",
                                           .format = linear_format};

const dt_op dt_op_linear = {.name = "linear",
                            .help = "fully connected: x W^T + b over the last dim (or the whole sample)",
                            .syntax = &linear_syntax,
                            .min_in = 1,
                            .max_in = 1,
                            .infer = linear_infer,
                            .init = linear_init,
                            .workspace = linear_workspace,
                            .forward = linear_forward,
                            .backward = linear_backward,
                            .flops = linear_flops,
                            .onnx = linear_onnx,
                            .fold_input_norm = linear_fold};

/* Op: matmul_t, out = in @ w^T with w (out, C) and no bias: the output head of a language model,
 * usually tied to the token embedding (spec.tie = "transformer.wte.weight"). The same kernels as
 * linear without a bias. */
static dt_status matmul_t_infer(dt_model *m, dt_node *n) {
    n->a.bias = false, n->a.flatten = false;
    return linear_infer(m, n);
}

const dt_op dt_op_matmul_t = {.name = "matmul_t",
                              .help = "x W^T without a bias: a language model's (tied) output head",
                              .syntax = NULL,
                              .min_in = 1,
                              .max_in = 1,
                              .infer = matmul_t_infer,
                              .init = linear_init,
                              .workspace = linear_workspace,
                              .forward = linear_forward,
                              .backward = linear_backward,
                              .flops = linear_flops,
                              .onnx = linear_onnx};
