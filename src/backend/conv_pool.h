/* A first convolution fused with its relu and max pooling (cpu_conv_pool.c): conv (C -> OC, KxK,
 * stride 1, pad P, optional bias) -> relu (when relu) -> max pool (PK x PK windows, stride PK),
 * computed window by window, so the conv's full-size output and its gradient never reach
 * memory. For the first layer of a CNN (few input channels, input needing no gradient), where
 * those tensors are the largest of the model and each pass over them costs more than the
 * convolution's arithmetic. OC a multiple of 16. */
#ifndef DT_BACKEND_CONV_POOL_H
#define DT_BACKEND_CONV_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Shape of the chain: input (B, C, H, W), the conv's (OC, CH, CW) with CH = H + 2P - K + 1
 * (likewise CW), the pooled (OC, CH / PK, CW / PK). */
typedef struct {
    int B, C, H, W, OC, K, P, PK;
    bool relu;     /* a relu between the conv and the pool (applied to the pooled value) */
    bool out_bl;   /* the pooled output (and its gradient) blocked (backend/blocked.h), else NCHW */
    bool out_nhwc; /* out_bl: NHWC instead of blocked */
    bool out_bf16; /* out_bl: the pooled values stored bf16 (uint16_t; their gradient stays f32) */
} dt_conv_pool_shape;

/* win[i] where the relu stopped pooled value i's gradient (its max was not positive). */
#define DT_CONV_POOL_STOP 255

/* The bytes of workspace forward and backward take (ws: 64-byte aligned, not shared with another
 * argument): the padded sample, the weights as vectors, a few rows and backward's sums. */
size_t dt_conv_pool_workspace(const dt_conv_pool_shape *s);

/* out: the pooled values (uint16_t bf16 ones, rounded, with s->out_bf16); win: for each, the
 * position (py * PK + px) of the window's max, which the pooled value came from (the first max
 * wins, a NaN replaces it: the maxpool kernels' rule), or DT_CONV_POOL_STOP; in out's layout, one
 * byte each (PK * PK < 255). */
void dt_conv_pool_forward(const dt_conv_pool_shape *s, float *out, uint8_t *win, const float *in, const float *w,
                          const float *b, void *ws);
/* dw (OC, C, K, K) and db (OC; NULL: no bias) ACCUMULATE the gradient of the chain from dout
 * (out's layout) and the forward's win. The input gets no gradient. */
void dt_conv_pool_backward(const dt_conv_pool_shape *s, float *dw, float *db, const float *dout, const uint8_t *win,
                           const float *in, void *ws);

#endif
