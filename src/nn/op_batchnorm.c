/* Op: 2-d batch normalisation per channel of (C,H,W) samples; batch statistics in training
 * (updating the running_mean/running_var buffers as torch), running statistics otherwise. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <stdio.h>
#include <string.h>

dt_status dt_op_same_shape(dt_model *m, dt_node *n);

static dt_status batchnorm_infer(dt_model *m, dt_node *n) {
    DT_TRY(dt_op_same_shape(m, n));
    int C, H, W;
    dt_node_chw(n, &C, &H, &W);
    int64_t shp[1] = {C};
    if (dt_graph_declare(m, n, "weight", false, 1, shp) < 0 || dt_graph_declare(m, n, "bias", false, 1, shp) < 0 ||
        dt_graph_declare(m, n, "running_mean", true, 1, shp) < 0 ||
        dt_graph_declare(m, n, "running_var", true, 1, shp) < 0)
        return DT_EINVAL;
    return DT_OK;
}

static size_t batchnorm_saved(const dt_model *m, const dt_node *n, int B) {
    (void)m, (void)B;
    int C, H, W;
    dt_node_chw(n, &C, &H, &W);
    return 2 * (size_t)C * sizeof(float);
}

static void batchnorm_init(dt_model *m, dt_node *n, float *p, uint64_t seed) {
    (void)seed;
    int C, H, W;
    dt_node_chw(n, &C, &H, &W);
    float *w = p + dt_node_tensor_off(m, n, 0);
    for (int j = 0; j < C; j++) w[j] = 1.0f;
    memset(p + dt_node_tensor_off(m, n, 1), 0, (size_t)C * sizeof(float));
}

static dt_status batchnorm_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    int C, H, W;
    dt_node_chw(n, &C, &H, &W);
    const float *w = dt_node_param(m, n, c, 0), *b = dt_node_param(m, n, c, 1);
    float *rm = c->buffers + dt_node_tensor_off(m, n, 2), *rv = c->buffers + dt_node_tensor_off(m, n, 3);
    float *mean = n->saved, *rstd = mean + C;
    if (c->train)
        c->be->batchnorm2d_forward_train(n->out, mean, rstd, rm, rv, dt_node_in(m, n, 0), w, b, c->B, C, H * W,
                                         n->a.momentum, n->a.eps);
    else c->be->batchnorm2d_forward_eval(n->out, dt_node_in(m, n, 0), w, b, rm, rv, c->B, C, H * W, n->a.eps);
    return DT_OK;
}

static void batchnorm_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    int C, H, W;
    dt_node_chw(n, &C, &H, &W);
    const float *mean = n->saved, *rstd = mean + C;
    c->be->batchnorm2d_backward(din[0], dt_node_grad(m, n, c, 0), dt_node_grad(m, n, c, 1), n->grad,
                                dt_node_in(m, n, 0), dt_node_param(m, n, c, 0), mean, rstd, c->B, C, H * W);
}

/* With its running statistics (evaluation). */
static dt_status batchnorm_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in,
                                const char **out) {
    const char *bn[5] = {in[0], o->param(o, m, n, 0, NULL, 0), o->param(o, m, n, 1, NULL, 0),
                         o->param(o, m, n, 2, NULL, 0), o->param(o, m, n, 3, NULL, 0)};
    dt_onnx_node *b = dt_onnx_op(o, "BatchNormalization", bn, 5);
    o->attr_f(o, b, "epsilon", n->a.eps);
    *out = dt_onnx_out(o, b);
    return DT_OK;
}

/* torch's BatchNorm2d keeps a step counter beside its statistics (int64; dtrain does not count). */
static int batchnorm_torch_extra(const dt_model *m, const dt_node *n, dt_torch_entry *e, int cap) {
    (void)m;
    if (cap < 1) return 0;
    snprintf(e[0].name, sizeof e[0].name, "%s.num_batches_tracked", n->name);
    e[0].tensor = -1;
    return 1;
}

/* Evaluation computes (x' - rm) / sqrt(rv + eps) with x' = (x - mean) / std: the running statistics
 * take the normalisation in. */
static bool batchnorm_fold(const dt_model *m, const dt_node *n, double mean, double std, float *params, float *buffers,
                           const char **why) {
    (void)why;
    if (!params) return true;
    const dt_param_info *w = &m->tensors[n->tensor[0]];
    float *rm = buffers + m->tensors[n->tensor[2]].offset, *rv = buffers + m->tensors[n->tensor[3]].offset;
    for (size_t c = 0; c < w->numel; c++) {
        rm[c] = (float)(mean + std * rm[c]);
        rv[c] = (float)(std * std * ((double)rv[c] + n->a.eps) - n->a.eps);
    }
    return true;
}

static void batchnorm_format(char *buf, size_t cap, const dt_layer_spec *l) {
    snprintf(buf, cap, "(eps=%g,momentum=%g)", l->eps, l->momentum);
}

static const dt_op_syntax batchnorm_syntax = {.alias = "batchnorm2d",
                                              .args = "| eps momentum",
                                              .usage = "batchnorm([eps=,momentum=])",
                                              .alias_usage = "batchnorm2d = batchnorm",
                                              .format = batchnorm_format};

const dt_op dt_op_batchnorm2d = {.name = "batchnorm",
                                 .help = "2-d batch normalisation per channel, running statistics",
                                 .syntax = &batchnorm_syntax,
                                 .min_in = 1,
                                 .max_in = 1,
                                 .infer = batchnorm_infer,
                                 .saved_bytes = batchnorm_saved,
                                 .init = batchnorm_init,
                                 .forward = batchnorm_forward,
                                 .backward = batchnorm_backward,
                                 .onnx = batchnorm_onnx,
                                 .torch_extra = batchnorm_torch_extra,
                                 .fold_input_norm = batchnorm_fold};
