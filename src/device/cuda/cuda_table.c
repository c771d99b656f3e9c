/* The cuda device's kernel table (backend.h dt_kernel_table): GEMMs through cuBLASLt, convolutions
 * through cuDNN (cuda_libs.c), everything else own kernels (cuda_kernels.cu), all on the device's
 * compute stream. The slots take no device argument, so they run on dtc_current, the process's one
 * cuda device (cuda_device.c kernels() binds it).
 *
 * f32 only so far: linear_bf16_values says false and the bf16 slots are NULL, so the graph takes its
 * f32 paths; the blocked-layout and fused conv+pool slots are NULL, so the graph's layout plan
 * (nn/graph_layout.c) and fusion (nn/graph_fuse.c) choose neither on this device. */
#include "device/cuda/cuda_internal.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define CUR dtc_current
#define RUN(call) DTC_CHECK(CUR, (call))
#define S (CUR->compute)

static void linear_forward(float *out, const float *in, const float *w, const float *b, float *work, int B, int C,
                           int OC) {
    (void)work; /* cuBLAS needs none (linear_workspace NULL) */
    if (B <= 0 || OC <= 0) return;
    if (C <= 0) {
        RUN(dtc_rows_set(S, out, b, B, OC));
        return;
    }
    /* out^T (OC x B, column-major) = op(w) in^T, w (OC, C) row-major being C x OC column-major. The
     * bias goes in the BIAS epilogue where it is 16-byte aligned (a parameter slab's offsets need
     * not be); else it is broadcast into out first and the GEMM adds to it (beta 1), as the CPU's. */
    if (b && (uintptr_t)b % 16) {
        RUN(dtc_rows_set(S, out, b, B, OC));
        dtc_gemm(CUR, true, false, OC, B, C, 1.0f, w, C, in, C, 1.0f, out, OC, NULL);
        return;
    }
    dtc_gemm(CUR, true, false, OC, B, C, 1.0f, w, C, in, C, 0.0f, out, OC, b);
}

static void linear_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                            float *work, int B, int C, int OC) {
    (void)work;
    if (B <= 0 || OC <= 0 || C <= 0) {
        if (din && B > 0 && C > 0) RUN(cudaMemsetAsync(din, 0, (size_t)B * C * sizeof(float), S));
        return;
    }
    if (dw) dtc_gemm(CUR, false, true, C, OC, B, 1.0f, in, C, dout, OC, 1.0f, dw, C, NULL); /* dw += dout^T in */
    if (db) RUN(dtc_colsum_acc(S, db, dout, B, OC));
    if (din) dtc_gemm(CUR, false, false, C, B, OC, 1.0f, w, C, dout, OC, 0.0f, din, C, NULL); /* din = dout w */
}

static bool no_bf16(void) { return false; }

static size_t conv2d_workspace(int B, int C, int H, int W, int OC, int K, int stride, int pad) {
    return dtc_conv_workspace(CUR, B, C, H, W, OC, K, stride, pad);
}

static void conv2d_forward(float *out, const float *in, const float *w, const float *b, float *work, int B, int C,
                           int H, int W, int OC, int K, int stride, int pad) {
    const int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
    if (OH <= 0 || OW <= 0 || B <= 0 || OC <= 0) return;
    dtc_conv_forward(CUR, out, in, w, work, conv2d_workspace(B, C, H, W, OC, K, stride, pad), B, C, H, W, OC, K, stride,
                     pad);
    if (b) RUN(dtc_chan_bias(S, out, b, B, OC, OH * OW));
}

static void conv2d_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                            float *work, int B, int C, int H, int W, int OC, int K, int stride, int pad) {
    const int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
    if (OH <= 0 || OW <= 0 || B <= 0 || OC <= 0) return;
    if (db) RUN(dtc_chansum_acc(S, db, dout, B, OC, OH * OW));
    dtc_conv_backward(CUR, din, dw, dout, in, w, work, conv2d_workspace(B, C, H, W, OC, K, stride, pad), B, C, H, W, OC,
                      K, stride, pad);
}

static void maxpool2d_forward(float *out, int32_t *am, const float *in, int B, int C, int H, int W, int K, int Sd) {
    RUN(dtc_maxpool_fwd(S, out, am, in, B, C, H, W, K, Sd));
}
static void maxpool2d_backward(float *din, const float *dout, const int32_t *am, int B, int C, int H, int W, int K,
                               int Sd) {
    RUN(dtc_maxpool_bwd(S, din, dout, am, B, C, H, W, K, Sd));
}
static void avgpool2d_forward(float *out, const float *in, int B, int C, int H, int W, int K, int Sd) {
    RUN(dtc_avgpool_fwd(S, out, in, B, C, H, W, K, Sd));
}
static void avgpool2d_backward(float *din, const float *dout, int B, int C, int H, int W, int K, int Sd) {
    RUN(dtc_avgpool_bwd(S, din, dout, B, C, H, W, K, Sd));
}

static void relu_forward(float *o, const float *x, size_t n) { RUN(dtc_relu_fwd(S, o, x, n)); }
static void relu_backward(float *d, const float *g, const float *x, size_t n) { RUN(dtc_relu_bwd(S, d, g, x, n)); }
static void gelu_forward(float *o, const float *x, size_t n) { RUN(dtc_gelu_fwd(S, o, x, n)); }
static void gelu_backward(float *d, const float *g, const float *x, size_t n) { RUN(dtc_gelu_bwd(S, d, g, x, n)); }
static void tanh_forward(float *o, const float *x, size_t n) { RUN(dtc_tanh_fwd(S, o, x, n)); }
static void tanh_backward(float *d, const float *g, const float *y, size_t n) { RUN(dtc_tanh_bwd(S, d, g, y, n)); }
static void sigmoid_forward(float *o, const float *x, size_t n) { RUN(dtc_sigmoid_fwd(S, o, x, n)); }
static void sigmoid_backward(float *d, const float *g, const float *y, size_t n) {
    RUN(dtc_sigmoid_bwd(S, d, g, y, n));
}
static void dropout_forward(float *o, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed, uint64_t key) {
    RUN(dtc_dropout_fwd(S, o, mask, x, n, p, seed, key));
}
static void dropout_backward(float *d, const float *g, const uint8_t *mask, size_t n, float p) {
    RUN(dtc_dropout_bwd(S, d, g, mask, n, p));
}

static void layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *w, const float *b,
                              int N, int C, float eps) {
    RUN(dtc_layernorm_fwd(S, out, mean, rstd, in, w, b, N, C, eps));
}
static void layernorm_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                               const float *mean, const float *rstd, int N, int C) {
    RUN(dtc_layernorm_bwd(S, din, dw, db, dout, in, w, mean, rstd, N, C));
}
static void batchnorm2d_forward_train(float *out, float *mean, float *rstd, float *rm, float *rv, const float *in,
                                      const float *w, const float *b, int B, int C, int HW, float mom, float eps) {
    RUN(dtc_batchnorm_fwd_train(S, out, mean, rstd, rm, rv, in, w, b, B, C, HW, mom, eps));
}
static void batchnorm2d_forward_eval(float *out, const float *in, const float *w, const float *b, const float *rm,
                                     const float *rv, int B, int C, int HW, float eps) {
    RUN(dtc_batchnorm_fwd_eval(S, out, in, w, b, rm, rv, B, C, HW, eps));
}
static void batchnorm2d_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                                 const float *mean, const float *rstd, int B, int C, int HW) {
    RUN(dtc_batchnorm_bwd(S, din, dw, db, dout, in, w, mean, rstd, B, C, HW));
}

static void embedding_forward(float *out, const int32_t *ids, const float *w, int N, int C) {
    RUN(dtc_embedding_fwd(S, out, ids, w, N, C));
}
static void embedding_backward(float *dw, const float *dout, const int32_t *ids, int N, int C) {
    RUN(dtc_embedding_bwd(S, dw, dout, ids, N, C));
}
static void pos_embedding_forward(float *out, const float *w, int B, int T, int C) {
    RUN(dtc_pos_embedding_fwd(S, out, w, B, T, C));
}
static void pos_embedding_backward(float *dw, const float *dout, int B, int T, int C) {
    RUN(dtc_pos_embedding_bwd(S, dw, dout, B, T, C));
}
static void add_forward(float *out, const float *a, const float *b, size_t n) { RUN(dtc_add(S, out, a, b, n)); }

static size_t attention_workspace(int T, int C, int NH) {
    (void)C;
    return (size_t)NH * T * T; /* dS of one batch row (backward runs the rows one after another) */
}
static void attention_forward(float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH) {
    (void)work;
    RUN(dtc_attention_fwd(S, out, att, qkv, B, T, C, NH));
}
static void attention_backward(float *dqkv, float *work, const float *dout, const float *qkv, const float *att, int B,
                               int T, int C, int NH) {
    RUN(dtc_attention_bwd(S, dqkv, work, dout, qkv, att, B, T, C, NH));
}

/* The row count stays in device memory (the graph's saved block): the backward reads it there, so
 * nothing synchronises per loss. */
static void xent_forward(float *loss, float *probs, const float *logits, const int32_t *labels, int N, int V,
                         int ignore, int32_t *counted) {
    dtc_dev *c = CUR;
    RUN(dtc_xent_fwd(S, loss, counted, probs, logits, labels, N, V, ignore, dtc_rows(c, N > 0 ? (size_t)N : 1)));
}
static void xent_backward(float *dlogits, const float *probs, const int32_t *labels, int N, int V, int ignore,
                          const int32_t *counted, float scale) {
    if (N <= 0) return;
    RUN(dtc_xent_bwd(S, dlogits, probs, labels, N, V, ignore, counted, scale));
}
static void count_correct(int64_t *correct, const float *logits, const int32_t *labels, int64_t rows, int V) {
    RUN(dtc_count_correct(S, correct, logits, labels, rows, V));
}
static void mse_forward(float *loss, const float *pred, const float *target, size_t n) {
    RUN(dtc_mse_fwd(S, loss, pred, target, n, CUR->scratch));
}
static void mse_backward(float *dpred, const float *pred, const float *target, size_t n, float scale) {
    if (n == 0) return;
    RUN(dtc_mse_bwd(S, dpred, pred, target, n, 2.0f * scale / (float)n));
}

void dtc_table_init(dtc_dev *c) {
    c->table = (dt_kernel_table){
        .name = "cuda",
        .device = DT_DEVICE_CUDA,
        .dtype = DT_F32,
        .precision = DT_F32,
        .linear_forward = linear_forward,
        .linear_backward = linear_backward,
        .linear_bf16_values = no_bf16,
        .conv2d_workspace = conv2d_workspace,
        .conv2d_forward = conv2d_forward,
        .conv2d_backward = conv2d_backward,
        .maxpool2d_forward = maxpool2d_forward,
        .maxpool2d_backward = maxpool2d_backward,
        .avgpool2d_forward = avgpool2d_forward,
        .avgpool2d_backward = avgpool2d_backward,
        .relu_forward = relu_forward,
        .relu_backward = relu_backward,
        .gelu_forward = gelu_forward,
        .gelu_backward = gelu_backward,
        .tanh_forward = tanh_forward,
        .tanh_backward = tanh_backward,
        .sigmoid_forward = sigmoid_forward,
        .sigmoid_backward = sigmoid_backward,
        .dropout_forward = dropout_forward,
        .dropout_backward = dropout_backward,
        .layernorm_forward = layernorm_forward,
        .layernorm_backward = layernorm_backward,
        .batchnorm2d_forward_train = batchnorm2d_forward_train,
        .batchnorm2d_forward_eval = batchnorm2d_forward_eval,
        .batchnorm2d_backward = batchnorm2d_backward,
        .embedding_forward = embedding_forward,
        .embedding_backward = embedding_backward,
        .pos_embedding_forward = pos_embedding_forward,
        .pos_embedding_backward = pos_embedding_backward,
        .add_forward = add_forward,
        .attention_forward = attention_forward,
        .attention_workspace = attention_workspace,
        .attention_backward = attention_backward,
        .xent_forward = xent_forward,
        .xent_backward = xent_backward,
        .count_correct = count_correct,
        .mse_forward = mse_forward,
        .mse_backward = mse_backward,
    };
}
