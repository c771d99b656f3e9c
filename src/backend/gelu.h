/* The exact-erf GELU kernels behind dt_gelu_forward/backward (include/dtrain/layers.h): an AVX-512
 * and an AVX2 + FMA copy (cpu_gelu_vec.c), with erf and exp as polynomials (< 1 ulp erf, Norbert
 * Juffa's erff; Cephes' expf) instead of libmvec's calls, and the portable libm loop
 * (cpu_activations.c). Same arguments as the public functions. */
#ifndef DT_BACKEND_GELU_H
#define DT_BACKEND_GELU_H

#include <stddef.h>
#include <stdint.h>

#include "backend/isa.h"

void dt_gelu_forward_isa(dt_isa isa, float *out, const float *in, size_t n);
void dt_gelu_backward_isa(dt_isa isa, float *din, const float *dout, const float *x, size_t n);

/* GELU's values rounded to bf16 (out: n bf16), bitwise dt_gelu_forward then dt_cast_bf16, in one
 * pass: the vector copies round in their registers (AVX512-BF16's instruction where dt_cast_bf16
 * uses it, which flushes denormals; AVX2 then goes through pieces), the portable one through a
 * piece on the stack. */
void dt_gelu_forward_bf16_isa(dt_isa isa, uint16_t *out, const float *in, size_t n);
void dt_gelu_forward_bf16(uint16_t *out, const float *in, size_t n);
/* The same for the backward: din (n bf16) = dt_gelu_backward's din rounded by dt_cast_bf16. */
void dt_gelu_backward_bf16_isa(dt_isa isa, uint16_t *din, const float *dout, const float *x, size_t n);
void dt_gelu_backward_bf16(uint16_t *din, const float *dout, const float *x, size_t n);

/* And with bf16 x and dout: the f32 kernels on the widened values, rounded as above. */
void dt_gelu_forward_bf16io_isa(dt_isa isa, uint16_t *out, const uint16_t *in, size_t n);
void dt_gelu_forward_bf16io(uint16_t *out, const uint16_t *in, size_t n);
void dt_gelu_backward_bf16io_isa(dt_isa isa, uint16_t *din, const uint16_t *dout, const uint16_t *x, size_t n);
void dt_gelu_backward_bf16io(uint16_t *din, const uint16_t *dout, const uint16_t *x, size_t n);

/* The bf16-in forward that also stores dydx = gelu'(x) (n bf16, rounded as the values are:
 * dt_gelu_backward_bf16io's din for dout 1), and the backward from it: din = dout * dydx rounded
 * (bf16 in and out). The backward then computes no erf or exp: the forward shares its erf. */
void dt_gelu_forward_bf16io_grad_isa(dt_isa isa, uint16_t *out, uint16_t *dydx, const uint16_t *in, size_t n);
void dt_gelu_forward_bf16io_grad(uint16_t *out, uint16_t *dydx, const uint16_t *in, size_t n);
void dt_gelu_backward_bf16io_from_grad_isa(dt_isa isa, uint16_t *din, const uint16_t *dout, const uint16_t *dydx,
                                           size_t n);
void dt_gelu_backward_bf16io_from_grad(uint16_t *din, const uint16_t *dout, const uint16_t *dydx, size_t n);

void dt_gelu_forward_bf16io_grad_avx512(uint16_t *out, uint16_t *dydx, const uint16_t *in, size_t n);
void dt_gelu_forward_bf16io_grad_avx512bf16(uint16_t *out, uint16_t *dydx, const uint16_t *in, size_t n);
void dt_gelu_forward_bf16io_grad_avx2(uint16_t *out, uint16_t *dydx, const uint16_t *in, size_t n);
void dt_gelu_backward_bf16io_from_grad_avx512(uint16_t *din, const uint16_t *dout, const uint16_t *dydx, size_t n);
void dt_gelu_backward_bf16io_from_grad_avx512bf16(uint16_t *din, const uint16_t *dout, const uint16_t *dydx, size_t n);
void dt_gelu_backward_bf16io_from_grad_avx2(uint16_t *din, const uint16_t *dout, const uint16_t *dydx, size_t n);
void dt_gelu_forward_bf16io_avx512(uint16_t *out, const uint16_t *in, size_t n);
void dt_gelu_forward_bf16io_avx512bf16(uint16_t *out, const uint16_t *in, size_t n);
void dt_gelu_forward_bf16io_avx2(uint16_t *out, const uint16_t *in, size_t n);
void dt_gelu_backward_bf16io_avx512(uint16_t *din, const uint16_t *dout, const uint16_t *x, size_t n);
void dt_gelu_backward_bf16io_avx512bf16(uint16_t *din, const uint16_t *dout, const uint16_t *x, size_t n);
void dt_gelu_backward_bf16io_avx2(uint16_t *din, const uint16_t *dout, const uint16_t *x, size_t n);
void dt_gelu_forward_bf16_avx512(uint16_t *out, const float *in, size_t n);
void dt_gelu_forward_bf16_avx512bf16(uint16_t *out, const float *in, size_t n);
void dt_gelu_forward_bf16_avx2(uint16_t *out, const float *in, size_t n);
void dt_gelu_backward_bf16_avx512(uint16_t *din, const float *dout, const float *x, size_t n);
void dt_gelu_backward_bf16_avx512bf16(uint16_t *din, const float *dout, const float *x, size_t n);
void dt_gelu_backward_bf16_avx2(uint16_t *din, const float *dout, const float *x, size_t n);
void dt_gelu_forward_avx512(float *out, const float *in, size_t n);
void dt_gelu_backward_avx512(float *din, const float *dout, const float *x, size_t n);
void dt_gelu_forward_avx2(float *out, const float *in, size_t n);
void dt_gelu_backward_avx2(float *din, const float *dout, const float *x, size_t n);

#endif
