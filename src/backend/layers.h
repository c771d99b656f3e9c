/* The CPU layer kernels (internal to the device layer: the cpu device's kernel table, backend.h,
 * calls them; tests drive them directly): plain functions over f32 arrays (llm.c style). Outputs come first, dimensions
 * are explicit, layouts are PyTorch's (NCHW activations, Linear weight (OC,C), Conv weight
 * (OC,C,K,K)) so weights load unchanged into torch.
 *
 * Contract of every backward function:
 *   - parameter gradients (dw, db, ...) ACCUMULATE (+=), so micro-batches can add up;
 *   - the input gradient din is OVERWRITTEN; pass din = NULL to skip it (first layer);
 *   - nothing allocates; scratch memory is passed in, sized by the *_workspace() helpers.
 * In-place (out == in) is allowed only where a comment says so. */
#ifndef DT_BACKEND_LAYERS_H
#define DT_BACKEND_LAYERS_H

#include <stddef.h>
#include <stdint.h>
#include "dtrain/core.h"
#include "dtrain/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Linear: out(B,OC) = in(B,C) @ w(OC,C)^T + b(OC); b may be NULL ---------------------- */
void dt_linear_forward(float *out, const float *in, const float *w, const float *b, int B, int C, int OC);
void dt_linear_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w, int B,
                        int C, int OC);

/* ---- Conv2d: in (B,C,H,W), w (OC,C,K,K), b (OC) or NULL, out (B,OC,OH,OW) ---------------- *
 * OH = (H + 2*pad - K)/stride + 1, likewise OW. work: dt_conv2d_workspace() floats. */
size_t dt_conv2d_workspace(int B, int C, int H, int W, int OC, int K, int stride, int pad);
void dt_conv2d_forward(float *out, const float *in, const float *w, const float *b, float *work, int B, int C, int H,
                       int W, int OC, int K, int stride, int pad);
void dt_conv2d_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                        float *work, int B, int C, int H, int W, int OC, int K, int stride, int pad);

/* ---- Pooling over (B,C,H,W) windows K with stride S, no padding: out (B,C,OH,OW) ----------- *
 * MaxPool records the flat input index of each max in argmax (B*C*OH*OW int32). */
void dt_maxpool2d_forward(float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K, int S);
void dt_maxpool2d_backward(float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W, int K,
                           int S);
void dt_avgpool2d_forward(float *out, const float *in, int B, int C, int H, int W, int K, int S);
void dt_avgpool2d_backward(float *din, const float *dout, int B, int C, int H, int W, int K, int S);

/* ---- Elementwise activations over n values (forward in-place allowed) --------------------- *
 * Backward takes the forward INPUT x for relu/gelu and the forward OUTPUT y for tanh/sigmoid. */
void dt_relu_forward(float *out, const float *in, size_t n);
void dt_relu_backward(float *din, const float *dout, const float *x, size_t n);
void dt_gelu_forward(float *out, const float *in, size_t n); /* exact erf form, = torch.nn.GELU() */
void dt_gelu_backward(float *din, const float *dout, const float *x, size_t n);
void dt_tanh_forward(float *out, const float *in, size_t n);
void dt_tanh_backward(float *din, const float *dout, const float *y, size_t n);
void dt_sigmoid_forward(float *out, const float *in, size_t n);
void dt_sigmoid_backward(float *din, const float *dout, const float *y, size_t n);

/* ---- Dropout (inverted): keep with prob 1-p, scale kept values by 1/(1-p) ------------------ *
 * mask[i] = 1 if kept. Element i's draw is dt_rng_uniform(seed, key, i): counter-based, so the
 * mask depends only on (seed, key, index). */
void dt_dropout_forward(float *out, uint8_t *mask, const float *in, size_t n, float p, uint64_t seed, uint64_t key);
void dt_dropout_backward(float *din, const float *dout, const uint8_t *mask, size_t n, float p);

/* ---- LayerNorm over the last dim C of (N,C); w,b (C). mean, rstd (N) saved for backward ---- */
void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *w, const float *b, int N,
                          int C, float eps);
void dt_layernorm_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                           const float *mean, const float *rstd, int N, int C);

/* ---- BatchNorm2d over (B,C,HW) per channel; w,b (C) --------------------------------------- *
 * Train mode normalises with batch statistics, saves mean/rstd (C) and updates the running
 * stats: running = (1-momentum)*running + momentum*stat (running_var uses the unbiased var),
 * exactly as torch. Eval mode uses the running stats. */
void dt_batchnorm2d_forward_train(float *out, float *mean, float *rstd, float *running_mean, float *running_var,
                                  const float *in, const float *w, const float *b, int B, int C, int HW, float momentum,
                                  float eps);
void dt_batchnorm2d_forward_eval(float *out, const float *in, const float *w, const float *b, const float *running_mean,
                                 const float *running_var, int B, int C, int HW, float eps);
void dt_batchnorm2d_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                             const float *mean, const float *rstd, int B, int C, int HW);

/* ---- Embedding: out (N,C) = rows ids[0..N) of w (V,C); ids must lie in [0,V) -------------- *
 * Positional: out (B,T,C) = w[t] at position t. Backward accumulates into dw. */
void dt_embedding_forward(float *out, const int32_t *ids, const float *w, int N, int C);
void dt_embedding_backward(float *dw, const float *dout, const int32_t *ids, int N, int C);
void dt_pos_embedding_forward(float *out, const float *w, int B, int T, int C);
void dt_pos_embedding_backward(float *dw, const float *dout, int B, int T, int C);
/* out = a + b over n values (in-place on either input allowed). */
void dt_add_forward(float *out, const float *a, const float *b, size_t n);

/* ---- Causal multi-head self-attention (nanoGPT's layout) --------------------------------- *
 * qkv (B,T,3C): q, k, v side by side in each row, head h in columns [h*hs, (h+1)*hs), hs = C/NH.
 * out (B,T,C) = softmax(q k^T / sqrt(hs), causal) v, heads side by side; att (B,NH,T,T) keeps the
 * probabilities (zeros above the diagonal) for backward. Backward overwrites dqkv (B,T,3C);
 * work (scratch of both) holds dt_attention_workspace(T, C, NH) floats. */
void dt_attention_forward(float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH);
size_t dt_attention_workspace(int T, int C, int NH);
void dt_attention_backward(float *dqkv, float *work, const float *dout, const float *qkv, const float *att, int B,
                           int T, int C, int NH);

/* ---- Losses: mean over the batch --------------------------------------------------------- *
 * Softmax cross-entropy (numerically stable, fused): logits (B,V), labels in [0,V).
 * forward writes probs (B,V) and returns the mean loss; backward writes
 * dlogits = scale * (probs - onehot) / B (overwrites; scale is for loss scaling, normally 1). */
float dt_softmax_xent_forward(float *probs, const float *logits, const int32_t *labels, int B, int V);
void dt_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels, int B, int V, float scale);
/* The same over N rows where rows whose label == ignore do not count (torch's ignore_index):
 * returns the mean over the *counted rows (0 when none); backward writes zeros for ignored
 * rows and scale * (probs - onehot) / counted for the others. */
float dt_softmax_xent_ignore_forward(float *probs, const float *logits, const int32_t *labels, int N, int V, int ignore,
                                     int *counted);
void dt_softmax_xent_ignore_backward(float *dlogits, const float *probs, const int32_t *labels, int N, int V,
                                     int ignore, int counted, float scale);
/* MSE: mean over all n values of (pred - target)^2; backward writes scale * 2*(pred-target)/n. */
float dt_mse_forward(const float *pred, const float *target, size_t n);
void dt_mse_backward(float *dpred, const float *pred, const float *target, size_t n, float scale);

/* ---- Initialisation (seeded, counter-based: element i uses index i of stream key) ---------- *
 * Kaiming-uniform as torch's default for Linear/Conv: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
 * for weight and bias; He-normal N(0, sqrt(2/fan_in)); Xavier-uniform U(±sqrt(6/(fan_in+fan_out))). */
void dt_init_kaiming_uniform(float *w, size_t n, int fan_in, uint64_t seed, uint64_t key);
void dt_init_kaiming_normal(float *w, size_t n, int fan_in, uint64_t seed, uint64_t key);
void dt_init_xavier_uniform(float *w, size_t n, int fan_in, int fan_out, uint64_t seed, uint64_t key);

#ifdef __cplusplus
}
#endif
#endif
