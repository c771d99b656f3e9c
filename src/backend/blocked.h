/* Blocked activations (oneDNN's nChw16c, (B, C/16, H, W, 16), or nChw8c, with DT_BLOCK
 * channels per block; the graph blocks only C a multiple of 16, so plans do not depend on it): the
 * max pooling kernels of the backend table's *_blocked entries and whole-tensor reorders
 * (cpu_blocked.c). With nhwc the "blocked" values are NHWC, (B, H, W, C), instead: the layout of
 * a chain whose bf16 convolutions want it (oneDNN's AMX kernels, backend.h conv2d_bf16_nhwc). */
#ifndef DT_BACKEND_BLOCKED_H
#define DT_BACKEND_BLOCKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Channels per block: the one oneDNN's convolutions take on the CPU the build is for (-march):
 * 16 with AVX-512, 8 with AVX2 (its jit:avx2 kernels). Any other block costs two reorders of each
 * conv's input and output (docs/why.md, "Channels per block"). */
#if defined(__AVX512F__)
#define DT_BLOCK 16
#else
#define DT_BLOCK 8
#endif

/* Max pooling of a blocked in (B, C, H, W): out blocked when out_bl, else NCHW; argmax holds
 * flat indices into in, at the output's positions (with an NCHW out where the windows tile the
 * input, in the blocked order instead: only the backward reads it). Backward OVERWRITES din
 * (blocked). */
void dt_maxpool2d_forward_blocked(float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K,
                                  int S, bool out_bl, bool nhwc, bool relu);
void dt_maxpool2d_backward_blocked(float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W,
                                   int K, int S, bool out_bl, bool nhwc);
/* The same of a bf16 in (uint16_t), din bf16: the maxima and argmax of the f32 pool of in's
 * values, din its gradient rounded to bf16 (sums of overlapping windows in f32, rounded once).
 * out_bf16 with an NCHW out (!out_bl): out is bf16 (the maxima are bf16 values: exact). */
void dt_maxpool2d_forward_blocked_bf16(void *out, int32_t *argmax, const uint16_t *in, int B, int C, int H, int W,
                                       int K, int S, bool out_bl, bool nhwc, bool relu, bool out_bf16);
/* dout_bf16: dout is bf16 as well (exact where the windows tile the input: each din value is one
 * dout value or 0). work: dt_maxpool2d_blocked_bf16_workspace floats (the f32 sums of a scatter
 * where the windows do not tile the input, and a widened bf16 dout). */
size_t dt_maxpool2d_blocked_bf16_workspace(int B, int C, int H, int W, int K, int S, bool dout_bf16);
void dt_maxpool2d_backward_blocked_bf16(uint16_t *din, const void *dout, const int32_t *argmax, int B, int C, int H,
                                        int W, int K, int S, bool out_bl, bool nhwc, bool dout_bf16, float *work);
/* dst (blocked) = src (NCHW) and back; HW = H * W. */
void dt_blocked_from_nchw(float *dst, const float *src, int B, int C, int HW, bool nhwc);
void dt_blocked_to_nchw(float *dst, const float *src, int B, int C, int HW, bool nhwc);
/* acc[c] += the sum of channel c of a blocked x over the batch and the plane. */
void dt_blocked_channel_sums(float *acc, const float *x, int B, int C, int HW, bool nhwc);
/* The same of a bf16 x (uint16_t values in a float buffer), summed in f32. */
void dt_blocked_channel_sums_bf16(float *acc, const float *x, int B, int C, int HW, bool nhwc);

#endif
