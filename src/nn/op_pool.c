/* Ops: max and average pooling over (C,H,W) samples, windows K with stride S, no padding. A
 * maxpool right after a relu applies that relu to its own (smaller) output (n->fused_relu; the
 * blocked kernels in the same pass, an NCHW pool by relu's kernels after it). A
 * maxpool of blocked values (a conv chain, graph_layout.c) writes blocked or NCHW (n->blocked);
 * it reads bf16 ones and writes their gradient at bf16 where the conv before keeps them so. A
 * maxpool fused with the conv before it (n->fused_conv, graph_fuse.c) runs nothing itself: the
 * conv writes its values and window positions and reads its gradient. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <stdio.h>

static dt_status pool_infer(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    int C, H, W;
    dt_node_chw(in, &C, &H, &W);
    const dt_layer_spec *s = &n->a;
    if (in->dtype != DT_F32) return dt_graph_fail(m, n, "takes f32 values");
    if (s->k <= 0 || s->stride <= 0)
        return dt_graph_fail(m, n, "pool(%d, stride=%d) needs positive sizes", s->k, s->stride);
    if (H < s->k || W < s->k) return dt_graph_fail(m, n, "pool(%d) window is larger than its %dx%d input", s->k, H, W);
    n->dtype = DT_F32, n->ndim = 3;
    n->shape[0] = C, n->shape[1] = (H - s->k) / s->stride + 1, n->shape[2] = (W - s->k) / s->stride + 1;
    n->out_n = (size_t)C * n->shape[1] * n->shape[2];
    return DT_OK;
}

static size_t maxpool_saved(const dt_model *m, const dt_node *n, int B) {
    (void)m;
    return (size_t)B * n->out_n * (n->fused_conv ? 1 : sizeof(int32_t)); /* argmax, or conv_pool's window bytes */
}

/* Whether the blocked kernels pool n (bf16 or blocked f32 values): they apply a fused relu
 * themselves, its backward included (argmax -1). */
static bool pools_blocked(const dt_model *m, const dt_node *n) {
    return dt_node_in_bf16(m, n, 0) || dt_node_in_blocked(m, n, 0);
}

/* The blocked bf16 backward's scratch (floats), where the input's gradient is stored bf16. */
static size_t maxpool_workspace(const dt_model *m, const dt_node *n, int B) {
    if (n->fused_conv || !dt_node_in_grad_bf16(m, n, 0) || !m->be->maxpool2d_blocked_bf16_workspace) return 0;
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    return m->be->maxpool2d_blocked_bf16_workspace(B, C, H, W, n->a.k, n->a.stride, n->grad_bf16);
}

static dt_status maxpool_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    if (n->fused_conv) return DT_OK;
    if (dt_node_in_bf16(m, n, 0))
        c->be->maxpool2d_forward_blocked_bf16(n->out, n->saved, (const uint16_t *)dt_node_in(m, n, 0), c->B, C, H, W,
                                              n->a.k, n->a.stride, n->blocked, m->nhwc, n->fused_relu, n->bf16);
    else if (dt_node_in_blocked(m, n, 0))
        c->be->maxpool2d_forward_blocked(n->out, n->saved, dt_node_in(m, n, 0), c->B, C, H, W, n->a.k, n->a.stride,
                                         n->blocked, m->nhwc, n->fused_relu);
    else {
        c->be->maxpool2d_forward(n->out, n->saved, dt_node_in(m, n, 0), c->B, C, H, W, n->a.k, n->a.stride);
        if (n->fused_relu) c->be->relu_forward(n->out, n->out, (size_t)c->B * n->out_n);
    }
    return DT_OK;
}

static void maxpool_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    if (n->fused_conv) return;
    /* the fused relu's gradient on the pooled output, in place (the gradient is this node's) */
    if (n->fused_relu && !pools_blocked(m, n)) c->be->relu_backward(n->grad, n->grad, n->out, (size_t)c->B * n->out_n);
    if (din[0] && dt_node_in_grad_bf16(m, n, 0))
        c->be->maxpool2d_backward_blocked_bf16((uint16_t *)din[0], n->grad, n->saved, c->B, C, H, W, n->a.k,
                                               n->a.stride, n->blocked, m->nhwc, n->grad_bf16, c->work);
    else if (din[0] && dt_node_in_blocked(m, n, 0))
        c->be->maxpool2d_backward_blocked(din[0], n->grad, n->saved, c->B, C, H, W, n->a.k, n->a.stride, n->blocked,
                                          m->nhwc);
    else if (din[0]) c->be->maxpool2d_backward(din[0], n->grad, n->saved, c->B, C, H, W, n->a.k, n->a.stride);
}

/* MaxPool or AveragePool of kernel k, stride s (no padding). */
static dt_status pool_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in, const char **out) {
    (void)m;
    const int64_t ks[2] = {n->a.k, n->a.k}, st[2] = {n->a.stride, n->a.stride};
    dt_onnx_node *p = dt_onnx_op(o, n->a.kind == DT_LAYER_MAXPOOL2D ? "MaxPool" : "AveragePool", in, 1);
    o->attr_ints(o, p, "kernel_shape", ks, 2);
    o->attr_ints(o, p, "strides", st, 2);
    *out = dt_onnx_out(o, p);
    return DT_OK;
}

static void pool_finish(dt_layer_spec *l) {
    if (l->stride == 0) l->stride = l->k;
}

static void pool_format(char *buf, size_t cap, const dt_layer_spec *l) {
    snprintf(buf, cap, "(%d,stride=%d)", l->k, l->stride);
}

static const dt_op_syntax maxpool_syntax = {.alias = "maxpool2d",
                                            .args = "k | stride",
                                            .required = 1,
                                            .usage = "maxpool(k[,stride=])",
                                            .alias_usage = "maxpool2d",
                                            .finish = pool_finish,
                                            .format = pool_format};

const dt_op dt_op_maxpool2d = {.name = "maxpool",
                               .help = "2-d max pooling, window k, stride (default k), no padding",
                               .syntax = &maxpool_syntax,
                               .min_in = 1,
                               .max_in = 1,
                               .infer = pool_infer,
                               .saved_bytes = maxpool_saved,
                               .workspace = maxpool_workspace,
                               .forward = maxpool_forward,
                               .backward = maxpool_backward,
                               .onnx = pool_onnx,
                               .keeps_input_norm = true};

static dt_status avgpool_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    c->be->avgpool2d_forward(n->out, dt_node_in(m, n, 0), c->B, C, H, W, n->a.k, n->a.stride);
    return DT_OK;
}

static void avgpool_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    if (din[0]) c->be->avgpool2d_backward(din[0], n->grad, c->B, C, H, W, n->a.k, n->a.stride);
}

static const dt_op_syntax avgpool_syntax = {.alias = "avgpool2d",
                                            .args = "k | stride",
                                            .required = 1,
                                            .usage = "avgpool(k[,stride=])",
                                            .alias_usage = "avgpool2d",
                                            .finish = pool_finish,
                                            .format = pool_format};

const dt_op dt_op_avgpool2d = {.name = "avgpool",
                               .help = "2-d average pooling, window k, stride (default k), no padding",
                               .syntax = &avgpool_syntax,
                               .min_in = 1,
                               .max_in = 1,
                               .infer = pool_infer,
                               .forward = avgpool_forward,
                               .backward = avgpool_backward,
                               .onnx = pool_onnx,
                               .keeps_input_norm = true};
