/* Op: 2-d convolution on (C,H,W) samples, weight (OC,C,K,K), torch's nn.Conv2d layout. Its
 * input and values may be in the backend's blocked or NHWC layout (n->blocked, m->nhwc: graph_layout.c), at bf16
 * stored as bf16 (n->bf16). A conv fused with its maxpool (n->fused_pool, graph_fuse.c) writes
 * that pool's values instead. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <stdio.h>

/* The input's (C,H,W); a vector counts as (1,1,W). */
void dt_node_chw(const dt_node *in, int *C, int *H, int *W) {
    *C = in->ndim >= 3 ? in->shape[in->ndim - 3] : 1;
    *H = in->ndim >= 2 ? in->shape[in->ndim - 2] : 1;
    *W = in->ndim >= 1 ? in->shape[in->ndim - 1] : 1;
    if (in->ndim > 3) *C = (int)(in->out_n / ((size_t)*H * *W));
}

static dt_status conv_infer(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    const dt_layer_spec *s = &n->a;
    int C, H, W;
    dt_node_chw(in, &C, &H, &W);
    if (in->dtype != DT_F32) return dt_graph_fail(m, n, "takes f32 values");
    if (s->out <= 0 || s->k <= 0 || s->stride <= 0 || s->pad < 0)
        return dt_graph_fail(m, n, "conv(%d,%d,stride=%d,pad=%d) needs positive sizes", s->out, s->k, s->stride,
                             s->pad);
    if (H + 2 * s->pad < s->k || W + 2 * s->pad < s->k)
        return dt_graph_fail(m, n, "conv(%d,%d) kernel is larger than its %dx%d input", s->out, s->k, H, W);
    n->dtype = DT_F32, n->ndim = 3;
    n->shape[0] = s->out;
    n->shape[1] = (H + 2 * s->pad - s->k) / s->stride + 1;
    n->shape[2] = (W + 2 * s->pad - s->k) / s->stride + 1;
    n->out_n = (size_t)n->shape[0] * n->shape[1] * n->shape[2];
    int64_t shp[4] = {s->out, C, s->k, s->k};
    if (dt_graph_declare(m, n, "weight", false, 4, shp) < 0) return DT_EINVAL;
    if (s->bias && dt_graph_declare(m, n, "bias", false, 1, shp) < 0) return DT_EINVAL;
    return DT_OK;
}

static void conv_init(dt_model *m, dt_node *n, float *p, uint64_t seed) {
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    int fan_in = C * n->a.k * n->a.k;
    const dt_param_info *w = &m->tensors[n->tensor[0]];
    dt_init_kaiming_uniform(p + w->offset, w->numel, fan_in, seed, dt_rng_key(DT_RNG_INIT, (uint64_t)n->layer * 2));
    if (n->a.bias)
        dt_init_kaiming_uniform(p + dt_node_tensor_off(m, n, 1), (size_t)n->a.out, fan_in, seed,
                                dt_rng_key(DT_RNG_INIT, (uint64_t)n->layer * 2 + 1));
}

static size_t conv_workspace(const dt_model *m, const dt_node *n, int B) {
    const dt_layer_spec *s = &n->a;
    if (n->fused_pool >= 0) { /* bytes, as floats */
        const dt_conv_pool_shape cs = dt_node_conv_pool_shape(m, n);
        return (m->be->conv_pool_workspace(&cs) + sizeof(float) - 1) / sizeof(float);
    }
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    /* the table's own size: the CPU's im2col buffer, cuDNN's workspace on cuda */
    return m->be->conv2d_workspace(B, C, H, W, s->out, s->k, s->stride, s->pad);
}

static dt_status conv_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    const dt_layer_spec *s = &n->a;
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    const float *b = s->bias ? dt_node_param(m, n, c, 1) : NULL;
    const bool in_bl = dt_node_in_blocked(m, n, 0);
    if (n->fused_pool >= 0) {
        dt_node *p = &m->nodes[n->fused_pool];
        const dt_conv_pool_shape cs = dt_node_conv_pool_shape(m, n);
        c->be->conv_pool_forward(&cs, p->out, p->saved, dt_node_in(m, n, 0), dt_node_param(m, n, c, 0), b, c->work);
        return DT_OK;
    }
    if (in_bl || n->blocked) {
        c->be->conv2d_forward_blocked(n->out, dt_node_in(m, n, 0), dt_node_param(m, n, c, 0), b, c->B, C, H, W, s->out,
                                      s->k, s->stride, s->pad, dt_layout_of(in_bl, m->nhwc, dt_node_in_bf16(m, n, 0)),
                                      dt_layout_of(n->blocked, m->nhwc, n->bf16));
        return DT_OK;
    }
    c->be->conv2d_forward(n->out, dt_node_in(m, n, 0), dt_node_param(m, n, c, 0), b, c->work, c->B, C, H, W, s->out,
                          s->k, s->stride, s->pad);
    return DT_OK;
}

static void conv_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    const dt_layer_spec *s = &n->a;
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    float *db = s->bias ? dt_node_grad(m, n, c, 1) : NULL;
    const bool in_bl = dt_node_in_blocked(m, n, 0);
    if (n->fused_pool >= 0) { /* from the pool's gradient; the input needs none (graph_fuse.c) */
        const dt_node *p = &m->nodes[n->fused_pool];
        const dt_conv_pool_shape cs = dt_node_conv_pool_shape(m, n);
        c->be->conv_pool_backward(&cs, dt_node_grad(m, n, c, 0), db, p->grad, p->saved, dt_node_in(m, n, 0), c->work);
        return;
    }
    if (in_bl || n->blocked) {
        c->be->conv2d_backward_blocked(din[0], dt_node_grad(m, n, c, 0), db, n->grad, dt_node_in(m, n, 0),
                                       dt_node_param(m, n, c, 0), c->B, C, H, W, s->out, s->k, s->stride, s->pad,
                                       dt_layout_of(in_bl, m->nhwc, dt_node_in_bf16(m, n, 0)),
                                       dt_layout_of(n->blocked, m->nhwc, n->grad_bf16));
        return;
    }
    c->be->conv2d_backward(din[0], dt_node_grad(m, n, c, 0), db, n->grad, dt_node_in(m, n, 0),
                           dt_node_param(m, n, c, 0), c->work, c->B, C, H, W, s->out, s->k, s->stride, s->pad);
}

static double conv_flops(const dt_model *m, const dt_node *n, int B, bool need_din) {
    int C, H, W;
    dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
    double mac = (double)B * n->a.out * n->shape[1] * n->shape[2] * (double)C * n->a.k * n->a.k;
    return 2 * mac * (need_din ? 3 : 2);
}

static dt_status conv_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in, const char **out) {
    const int64_t ks[2] = {n->a.k, n->a.k}, st[2] = {n->a.stride, n->a.stride};
    const int64_t pads[4] = {n->a.pad, n->a.pad, n->a.pad, n->a.pad};
    const char *x[3] = {in[0], o->param(o, m, n, 0, NULL, 0), n->ntensor > 1 ? o->param(o, m, n, 1, NULL, 0) : NULL};
    dt_onnx_node *c = dt_onnx_op(o, "Conv", x, n->ntensor > 1 ? 3 : 2);
    o->attr_ints(o, c, "pads", pads, 4);
    o->attr_ints(o, c, "kernel_shape", ks, 2);
    o->attr_ints(o, c, "strides", st, 2);
    *out = dt_onnx_out(o, c);
    return DT_OK;
}

bool dt_op_fold_affine(const dt_model *m, const dt_node *n, double mean, double std, float *params, const char **why);

/* Without padding only: the zero padding is not the mean (the padded border would change). */
static bool conv_fold(const dt_model *m, const dt_node *n, double mean, double std, float *params, float *buffers,
                      const char **why) {
    (void)buffers;
    if (n->a.pad) *why = " (a padded conv: the zero padding is not the mean)";
    return !n->a.pad && dt_op_fold_affine(m, n, mean, std, params, why);
}

static void conv_finish(dt_layer_spec *l) {
    if (l->stride == 0) l->stride = 1;
}

static void conv_format(char *buf, size_t cap, const dt_layer_spec *l) {
    snprintf(buf, cap, "(%d,%d,stride=%d,pad=%d%s)", l->out, l->k, l->stride, l->pad, l->bias ? "" : ",bias=0");
}

static const dt_op_syntax conv_syntax = {.alias = "conv2d",
                                         .args = "out k | stride pad bias",
                                         .required = 2,
                                         .usage = "conv(out,k[,stride=,pad=,bias=])",
                                         .alias_usage = "conv2d = conv",
                                         .finish = conv_finish,
                                         .format = conv_format};

const dt_op dt_op_conv2d = {.name = "conv",
                            .help = "2-d convolution of (C,H,W) samples, torch's nn.Conv2d",
                            .syntax = &conv_syntax,
                            .min_in = 1,
                            .max_in = 1,
                            .infer = conv_infer,
                            .init = conv_init,
                            .workspace = conv_workspace,
                            .forward = conv_forward,
                            .backward = conv_backward,
                            .flops = conv_flops,
                            .onnx = conv_onnx,
                            .fold_input_norm = conv_fold};
