/* The launchers of the cuda device's own kernels (cuda_kernels.cu, cuda_adam.cu), callable from C:
 * each enqueues its kernels on stream s and returns the launch status (cudaSuccess, or the error of
 * the launch). Pointers are device pointers; counts are elements. Nothing here allocates: a kernel
 * that reduces across blocks takes its scratch from the caller (sizes below). Kept free of the
 * project's headers so nvcc compiles the .cu files as plain C++. */
#ifndef DT_CUDA_KERNELS_H
#define DT_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Scratch (device memory) that the reductions need: this many doubles, plus 1 int at the end. */
enum { DTC_SCRATCH_BLOCKS = 1024 };

/* ---- the training-step primitives (bitwise those of device/cpu_step.c but sqnorm's order) ---- */
cudaError_t dtc_fill_f32(cudaStream_t s, float *x, float v, size_t n);
cudaError_t dtc_accumulate(cudaStream_t s, float *y, const float *x, size_t n);
cudaError_t dtc_scale(cudaStream_t s, float *x, float v, size_t n);
/* *flag = 1 where some x is not finite, else 0; then x *= inv where *flag is 0. */
cudaError_t dtc_unscale(cudaStream_t s, float *x, float inv, size_t n, int32_t *flag);
/* *out = sum of x^2 in double; scratch: DTC_SCRATCH_BLOCKS doubles. */
cudaError_t dtc_sqnorm(cudaStream_t s, double *out, const float *x, size_t n, double *scratch);
cudaError_t dtc_cast_f32_bf16(cudaStream_t s, uint16_t *out, const float *x, size_t n);
cudaError_t dtc_cast_bf16_f32(cudaStream_t s, float *out, const uint16_t *x, size_t n);
cudaError_t dtc_cast_f32_f16(cudaStream_t s, uint16_t *out, const float *x, size_t n);
cudaError_t dtc_cast_f16_f32(cudaStream_t s, float *out, const uint16_t *x, size_t n);
/* SGD: mu 0 = no momentum (buf unused); mu_prev: 0 on the first step, else mu. */
cudaError_t dtc_sgd(cudaStream_t s, float *p, const float *g, float *buf, size_t n, float lr, float wd, float mu,
                    float mu_prev, int nesterov);
/* Adam/AdamW with the host-computed scalars of cpu_step.c's adam_loop (cuda_adam.cu, flushing
 * subnormals as the CPU's FTZ/DAZ does). */
cudaError_t dtc_adam(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n, float b1, float b2,
                     float eps, float wd_l2, float shrink, float step, float inv_bc2_sqrt);

/* ---- kernels of the kernel table (NULL din: nothing to write, as the CPU kernels) ---- */
cudaError_t dtc_relu_fwd(cudaStream_t s, float *out, const float *in, size_t n);
cudaError_t dtc_relu_bwd(cudaStream_t s, float *din, const float *dout, const float *x, size_t n);
cudaError_t dtc_gelu_fwd(cudaStream_t s, float *out, const float *in, size_t n);
cudaError_t dtc_gelu_bwd(cudaStream_t s, float *din, const float *dout, const float *x, size_t n);
cudaError_t dtc_tanh_fwd(cudaStream_t s, float *out, const float *in, size_t n);
cudaError_t dtc_tanh_bwd(cudaStream_t s, float *din, const float *dout, const float *y, size_t n);
cudaError_t dtc_sigmoid_fwd(cudaStream_t s, float *out, const float *in, size_t n);
cudaError_t dtc_sigmoid_bwd(cudaStream_t s, float *din, const float *dout, const float *y, size_t n);
cudaError_t dtc_dropout_fwd(cudaStream_t s, float *out, uint8_t *mask, const float *in, size_t n, float p,
                            uint64_t seed, uint64_t key);
cudaError_t dtc_dropout_bwd(cudaStream_t s, float *din, const float *dout, const uint8_t *mask, size_t n, float p);
cudaError_t dtc_add(cudaStream_t s, float *out, const float *a, const float *b, size_t n);

cudaError_t dtc_maxpool_fwd(cudaStream_t s, float *out, int32_t *argmax, const float *in, int B, int C, int H, int W,
                            int K, int S);
cudaError_t dtc_maxpool_bwd(cudaStream_t s, float *din, const float *dout, const int32_t *argmax, int B, int C, int H,
                            int W, int K, int S);
cudaError_t dtc_avgpool_fwd(cudaStream_t s, float *out, const float *in, int B, int C, int H, int W, int K, int S);
cudaError_t dtc_avgpool_bwd(cudaStream_t s, float *din, const float *dout, int B, int C, int H, int W, int K, int S);

/* out (rows x cols) = bias broadcast over rows, or 0 where bias is NULL */
cudaError_t dtc_rows_set(cudaStream_t s, float *out, const float *bias, int rows, int cols);
/* db[j] += sum over rows of x[r, j], rows in order (the CPU's order: bitwise) */
cudaError_t dtc_colsum_acc(cudaStream_t s, float *db, const float *x, int rows, int cols);
/* x (B, C, HW) += bias[c] */
cudaError_t dtc_chan_bias(cudaStream_t s, float *x, const float *bias, int B, int C, int HW);
/* db[c] += sum of x over every (b, hw) of channel c, x (B, C, HW) */
cudaError_t dtc_chansum_acc(cudaStream_t s, float *db, const float *x, int B, int C, int HW);

cudaError_t dtc_layernorm_fwd(cudaStream_t s, float *out, float *mean, float *rstd, const float *in, const float *w,
                              const float *b, int N, int C, float eps);
cudaError_t dtc_layernorm_bwd(cudaStream_t s, float *din, float *dw, float *db, const float *dout, const float *in,
                              const float *w, const float *mean, const float *rstd, int N, int C);
cudaError_t dtc_batchnorm_fwd_train(cudaStream_t s, float *out, float *mean, float *rstd, float *running_mean,
                                    float *running_var, const float *in, const float *w, const float *b, int B, int C,
                                    int HW, float momentum, float eps);
cudaError_t dtc_batchnorm_fwd_eval(cudaStream_t s, float *out, const float *in, const float *w, const float *b,
                                   const float *running_mean, const float *running_var, int B, int C, int HW,
                                   float eps);
cudaError_t dtc_batchnorm_bwd(cudaStream_t s, float *din, float *dw, float *db, const float *dout, const float *in,
                              const float *w, const float *mean, const float *rstd, int B, int C, int HW);

cudaError_t dtc_embedding_fwd(cudaStream_t s, float *out, const int32_t *ids, const float *w, int N, int C);
cudaError_t dtc_embedding_bwd(cudaStream_t s, float *dw, const float *dout, const int32_t *ids, int N, int C);
cudaError_t dtc_pos_embedding_fwd(cudaStream_t s, float *out, const float *w, int B, int T, int C);
cudaError_t dtc_pos_embedding_bwd(cudaStream_t s, float *dw, const float *dout, int B, int T, int C);

/* Causal attention of batch row b0..b0+nb-1 (qkv (B,T,3C), out (B,T,C), att (B,NH,T,T)). */
cudaError_t dtc_attention_fwd(cudaStream_t s, float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* work: NH * T * T floats (dS of one batch row); the batch rows run one after another. */
cudaError_t dtc_attention_bwd(cudaStream_t s, float *dqkv, float *work, const float *dout, const float *qkv,
                              const float *att, int B, int T, int C, int NH);

/* Softmax cross-entropy: probs, and the mean loss over the rows whose label is not `ignore` into
 * *loss; the count of those rows into *counted_dev (device memory: the backward reads it there).
 * N doubles of row losses at rowloss. */
cudaError_t dtc_xent_fwd(cudaStream_t s, float *loss, int32_t *counted_dev, float *probs, const float *logits,
                         const int32_t *labels, int N, int V, int ignore, double *rowloss);
/* dlogits = scale / *counted_dev * (probs - onehot), 0 on ignored rows (the CPU's arithmetic). */
cudaError_t dtc_xent_bwd(cudaStream_t s, float *dlogits, const float *probs, const int32_t *labels, int N, int V,
                         int ignore, const int32_t *counted_dev, float scale);
/* *correct = the rows whose first largest logit is at their label (the CPU's argmax). */
cudaError_t dtc_count_correct(cudaStream_t s, int64_t *correct, const float *logits, const int32_t *labels,
                              int64_t rows, int V);
/* *loss = mean of (pred - target)^2; scratch: DTC_SCRATCH_BLOCKS doubles */
cudaError_t dtc_mse_fwd(cudaStream_t s, float *loss, const float *pred, const float *target, size_t n, double *scratch);
cudaError_t dtc_mse_bwd(cudaStream_t s, float *dpred, const float *pred, const float *target, size_t n, float k);

#ifdef __cplusplus
}
#endif

#endif
