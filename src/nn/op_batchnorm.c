/* Op: 2-d batch normalisation per channel of (C,H,W) samples; batch statistics in training
 * (updating the running_mean/running_var buffers as torch), running statistics otherwise. */
#include "nn/graph_internal.h"

#include <string.h>

dt_status dt_op_same_shape(dt_model *m, dt_node *n);

static dt_status batchnorm_infer(dt_model *m, dt_node *n) {
    DT_TRY(dt_op_same_shape(m, n));
    int C, H, W;
    dt_node_chw(n, &C, &H, &W);
    int64_t shp[1] = {C};
    if (dt_graph_declare(m, n, "weight", false, 1, shp) < 0 || dt_graph_declare(m, n, "bias", false, 1, shp) < 0 ||
        dt_graph_declare(m, n, "running_mean", true, 1, shp) < 0 || dt_graph_declare(m, n, "running_var", true, 1, shp) < 0)
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
    else
        c->be->batchnorm2d_forward_eval(n->out, dt_node_in(m, n, 0), w, b, rm, rv, c->B, C, H * W, n->a.eps);
    return DT_OK;
}

static void batchnorm_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    int C, H, W;
    dt_node_chw(n, &C, &H, &W);
    const float *mean = n->saved, *rstd = mean + C;
    c->be->batchnorm2d_backward(din[0], dt_node_grad(m, n, c, 0), dt_node_grad(m, n, c, 1),
                                n->grad, dt_node_in(m, n, 0), dt_node_param(m, n, c, 0), mean, rstd, c->B,
                                C, H * W);
}

const dt_op dt_op_batchnorm2d = {.name = "batchnorm", .min_in = 1, .max_in = 1, .infer = batchnorm_infer,
                                 .saved_bytes = batchnorm_saved, .init = batchnorm_init, .forward = batchnorm_forward,
                                 .backward = batchnorm_backward};
