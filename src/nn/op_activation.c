/* Ops: elementwise activations (relu, gelu, tanh, sigmoid). Backward of relu/gelu reads the
 * forward input, of tanh/sigmoid the forward output. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <math.h>

/* Same shape as the input (shared by every shape-preserving op). */
dt_status dt_op_same_shape(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    if (in->dtype != DT_F32) return dt_graph_fail(m, n, "takes f32 values");
    n->dtype = DT_F32, n->ndim = in->ndim, n->out_n = in->out_n;
    for (int i = 0; i < in->ndim; i++) n->shape[i] = in->shape[i];
    return DT_OK;
}

#define COUNT(c, n) ((size_t)(c)->B * (n)->out_n)

static void act(const dt_kernel_table *be, int kind, float *out, const float *x, size_t count) {
    switch (kind) {
    case DT_LAYER_RELU: be->relu_forward(out, x, count); break;
    case DT_LAYER_GELU: be->gelu_forward(out, x, count); break;
    case DT_LAYER_TANH: be->tanh_forward(out, x, count); break;
    default: be->sigmoid_forward(out, x, count); break;
    }
}

/* bf16 values (relu, gelu: graph_layout.c): a GELU rounds them in its own pass where the backend
 * has one (gelu_forward_bf16), else they go through the workspace in pieces. */
static bool act_rounds_itself(const dt_kernel_table *be, const dt_node *n) {
    return n->a.kind == DT_LAYER_GELU && be->gelu_forward_bf16;
}

/* A GELU whose x, values and gradients are all bf16 (graph_layout.c: between two bf16 linears)
 * stores its derivative with its values (saved: B * out_n bf16), sharing the forward's erf, so
 * that the backward only multiplies: the backward's erf and exp were 60 % of the GELU's time.
 * Training steps only: an evaluation's forward does not (and its x is still there). */
static bool act_keeps_grad(const dt_model *m, const dt_node *n) {
    return n->a.kind == DT_LAYER_GELU && n->bf16 && n->grad_bf16 && dt_node_in_bf16(m, n, 0) &&
           m->be->gelu_forward_bf16io_grad && m->be->gelu_backward_bf16io_from_grad;
}

static size_t act_saved(const dt_model *m, const dt_node *n, int B) {
    return act_keeps_grad(m, n) ? (size_t)B * n->out_n * sizeof(uint16_t) : 0;
}

static size_t act_workspace(const dt_model *m, const dt_node *n, int B) {
    (void)B;
    return n->bf16 && !act_rounds_itself(m->be, n) ? DT_BF16_PIECE : 0;
}

static dt_status act_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    const float *x = dt_node_in(m, n, 0);
    const size_t count = COUNT(c, n);
    if (!n->bf16) return act(c->be, n->a.kind, n->out, x, count), DT_OK;
    if (c->train && act_keeps_grad(m, n))
        return c->be->gelu_forward_bf16io_grad(dt_node_out_bf16(n), n->saved, dt_node_in_bf16_values(m, n, 0), count),
               DT_OK;
    if (dt_node_in_bf16(m, n, 0)) /* bf16 x too (graph_layout.c) */
        return c->be->gelu_forward_bf16io(dt_node_out_bf16(n), dt_node_in_bf16_values(m, n, 0), count), DT_OK;
    if (act_rounds_itself(c->be, n)) return c->be->gelu_forward_bf16(dt_node_out_bf16(n), x, count), DT_OK;
    for (size_t i = 0; i < count; i += DT_BF16_PIECE) {
        const size_t k = count - i < DT_BF16_PIECE ? count - i : DT_BF16_PIECE;
        act(c->be, n->a.kind, c->work, x + i, k);
        c->dev->ops->cast_f32_bf16(c->dev, dt_node_out_bf16(n) + i, c->work, k);
    }
    return DT_OK;
}

static void act_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    if (!din[0]) return;
    const float *x = dt_node_in(m, n, 0);
    switch (n->a.kind) {
    case DT_LAYER_RELU: c->be->relu_backward(din[0], n->grad, x, COUNT(c, n)); break;
    case DT_LAYER_GELU:
        if (c->train && act_keeps_grad(m, n))
            c->be->gelu_backward_bf16io_from_grad((uint16_t *)(void *)din[0], (const uint16_t *)(const void *)n->grad,
                                                  n->saved, COUNT(c, n));
        else if (n->grad_bf16) /* x, dout and din bf16 (graph_layout.c) */
            c->be->gelu_backward_bf16io((uint16_t *)(void *)din[0], (const uint16_t *)(const void *)n->grad,
                                        dt_node_in_bf16_values(m, n, 0), COUNT(c, n));
        else if (dt_node_in_grad_bf16(m, n, 0)) /* a bf16 linear's gradient (graph_layout.c) */
            c->be->gelu_backward_bf16((uint16_t *)(void *)din[0], n->grad, x, COUNT(c, n));
        else c->be->gelu_backward(din[0], n->grad, x, COUNT(c, n));
        break;
    case DT_LAYER_TANH: c->be->tanh_backward(din[0], n->grad, n->out, COUNT(c, n)); break;
    default: c->be->sigmoid_backward(din[0], n->grad, n->out, COUNT(c, n)); break;
    }
}

static dt_status act_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in, const char **out) {
    (void)m;
    const dt_layer_kind k = n->a.kind;
    *out = dt_onnx_node1(o, k == DT_LAYER_RELU ? "Relu" : k == DT_LAYER_TANH ? "Tanh" : "Sigmoid", in[0]);
    return DT_OK;
}

/* x * 0.5 * (1 + erf(x / sqrt(2))): dtrain's exact GELU (opset 17 has no Gelu op). */
static dt_status gelu_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in, const char **out) {
    (void)m, (void)n;
    const char *x = in[0];
    const char *e = dt_onnx_node1(o, "Erf", dt_onnx_node2(o, "Mul", x, dt_onnx_scalar(o, (float)M_SQRT1_2)));
    *out = dt_onnx_node2(o, "Mul", dt_onnx_node2(o, "Mul", x, dt_onnx_node2(o, "Add", e, dt_onnx_scalar(o, 1.0f))),
                         dt_onnx_scalar(o, 0.5f));
    return DT_OK;
}

static const dt_op_syntax relu_syntax = {.args = "|", .usage = "relu"};
static const dt_op_syntax gelu_syntax = {.args = "|", .usage = "gelu"};
static const dt_op_syntax tanh_syntax = {.args = "|", .usage = "tanh"};
static const dt_op_syntax sigmoid_syntax = {.args = "|", .usage = "sigmoid"};

const dt_op dt_op_relu = {.name = "relu",
                          .help = "max(x, 0)",
                          .syntax = &relu_syntax,
                          .min_in = 1,
                          .max_in = 1,
                          .infer = dt_op_same_shape,
                          .saved_bytes = act_saved,
                          .workspace = act_workspace,
                          .forward = act_forward,
                          .backward = act_backward,
                          .onnx = act_onnx};
const dt_op dt_op_gelu = {.name = "gelu",
                          .help = "x * Phi(x), the exact GELU (erf)",
                          .syntax = &gelu_syntax,
                          .min_in = 1,
                          .max_in = 1,
                          .infer = dt_op_same_shape,
                          .saved_bytes = act_saved,
                          .workspace = act_workspace,
                          .forward = act_forward,
                          .backward = act_backward,
                          .onnx = gelu_onnx};
const dt_op dt_op_tanh = {.name = "tanh",
                          .help = "tanh(x)",
                          .syntax = &tanh_syntax,
                          .min_in = 1,
                          .max_in = 1,
                          .infer = dt_op_same_shape,
                          .saved_bytes = act_saved,
                          .workspace = act_workspace,
                          .forward = act_forward,
                          .backward = act_backward,
                          .onnx = act_onnx};
const dt_op dt_op_sigmoid = {.name = "sigmoid",
                             .help = "1 / (1 + exp(-x))",
                             .syntax = &sigmoid_syntax,
                             .min_in = 1,
                             .max_in = 1,
                             .infer = dt_op_same_shape,
                             .saved_bytes = act_saved,
                             .workspace = act_workspace,
                             .forward = act_forward,
                             .backward = act_backward,
                             .onnx = act_onnx};
