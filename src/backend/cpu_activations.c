/* Elementwise activations (ReLU, exact-erf GELU, tanh, sigmoid) and inverted dropout with a
 * counter-based mask. GELU runs its vector copy (cpu_gelu_vec.c) where the CPU has one, else the
 * libm loop below. Forward may run in place (out == in); backward overwrites din. */
#include "dtrain/core.h"
#include "backend/layers.h"

#include <math.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/gelu.h"
#include "backend/kern.h"

/* GELU's erf and exp, tanh, and sigmoid's exp through glibc's vector math library (libmvec,
 * 1-4 ulp): the loops below run 16 (AVX-512) or 8 (AVX2) lanes at a time instead of a scalar
 * libm call per value. */
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float tanhf(float);

void dt_relu_forward(float *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

void dt_relu_backward(float *din, const float *dout, const float *x, size_t n) {
    if (!din) return; /* nothing to propagate (first layer) */
    for (size_t i = 0; i < n; i++) din[i] = x[i] > 0.0f ? dout[i] : 0.0f;
}

/* The portable GELU: libm's (or libmvec's) erff and expf. */
static void gelu_forward_libm(float *out, const float *in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = in[i];
        out[i] = 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
    }
}

static void gelu_backward_libm(float *din, const float *dout, const float *x, size_t n) {
    const float inv_sqrt_2pi = 0.39894228040143267794f;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float cdf = 0.5f * (1.0f + erff(v * (float)M_SQRT1_2));
        float pdf = inv_sqrt_2pi * expf(-0.5f * v * v);
        din[i] = dout[i] * (cdf + v * pdf);
    }
}

void dt_gelu_forward_isa(dt_isa isa, float *out, const float *in, size_t n) {
    switch (isa) {
#if DT_ISA_X86
    case DT_ISA_AVX512: dt_gelu_forward_avx512(out, in, n); break;
    case DT_ISA_AVX2: dt_gelu_forward_avx2(out, in, n); break;
#endif
    default: gelu_forward_libm(out, in, n); break;
    }
}

/* The vector copy of a bf16-out GELU kernel whose rounding is dt_cast_bf16's on this CPU (NULL:
 * none; the caller rounds f32 pieces with dt_cast_bf16): AVX-512's with AVX512-BF16 where the CPU
 * has it, else its integer rounding; AVX2's only where the cast is not native (the instruction
 * flushes denormals, the integer rounding does not). */
enum { COPY_NONE, COPY_AVX512BF16, COPY_AVX512, COPY_AVX2 };
static int bf16_copy(dt_isa isa) {
    const bool native = dt_cast_bf16_native();
    if (isa == DT_ISA_AVX512) return native ? COPY_AVX512BF16 : COPY_AVX512;
    return isa == DT_ISA_AVX2 && !native ? COPY_AVX2 : COPY_NONE;
}
#if DT_ISA_X86
#define BF16_COPY(isa, name)                               \
    (bf16_copy(isa) == COPY_AVX512BF16 ? name##_avx512bf16 \
     : bf16_copy(isa) == COPY_AVX512   ? name##_avx512     \
     : bf16_copy(isa) == COPY_AVX2     ? name##_avx2       \
                                       : NULL)
#else
#define BF16_COPY(isa, name) NULL
#endif

enum { PIECE = 256 }; /* floats of a stack piece */

void dt_gelu_forward_bf16_isa(dt_isa isa, uint16_t *out, const float *in, size_t n) {
    void (*k)(uint16_t *, const float *, size_t) = BF16_COPY(isa, dt_gelu_forward_bf16);
    if (k) return k(out, in, n);
    for (size_t i = 0; i < n; i += PIECE) {
        float piece[PIECE];
        const size_t m = n - i < PIECE ? n - i : PIECE;
        dt_gelu_forward_isa(isa, piece, in + i, m);
        dt_cast_bf16(out + i, piece, m);
    }
}

void dt_gelu_backward_bf16_isa(dt_isa isa, uint16_t *din, const float *dout, const float *x, size_t n) {
    if (!din) return;
    void (*k)(uint16_t *, const float *, const float *, size_t) = BF16_COPY(isa, dt_gelu_backward_bf16);
    if (k) return k(din, dout, x, n);
    for (size_t i = 0; i < n; i += PIECE) {
        float piece[PIECE];
        const size_t m = n - i < PIECE ? n - i : PIECE;
        dt_gelu_backward_isa(isa, piece, dout + i, x + i, m);
        dt_cast_bf16(din + i, piece, m);
    }
}

/* The bf16-in kernels: the vector copies widen in registers; else pieces are widened, then the
 * bf16-out kernel runs on them. */
void dt_gelu_forward_bf16io_isa(dt_isa isa, uint16_t *out, const uint16_t *in, size_t n) {
    void (*k)(uint16_t *, const uint16_t *, size_t) = BF16_COPY(isa, dt_gelu_forward_bf16io);
    if (k) return k(out, in, n);
    for (size_t i = 0; i < n; i += PIECE) {
        float piece[PIECE];
        const size_t m = n - i < PIECE ? n - i : PIECE;
        dt_widen_bf16(piece, in + i, m);
        dt_gelu_forward_bf16_isa(isa, out + i, piece, m);
    }
}

void dt_gelu_backward_bf16io_isa(dt_isa isa, uint16_t *din, const uint16_t *dout, const uint16_t *x, size_t n) {
    if (!din) return;
    void (*k)(uint16_t *, const uint16_t *, const uint16_t *, size_t) = BF16_COPY(isa, dt_gelu_backward_bf16io);
    if (k) return k(din, dout, x, n);
    for (size_t i = 0; i < n; i += PIECE) {
        float d[PIECE], xs[PIECE];
        const size_t m = n - i < PIECE ? n - i : PIECE;
        dt_widen_bf16(d, dout + i, m);
        dt_widen_bf16(xs, x + i, m);
        dt_gelu_backward_bf16_isa(isa, din + i, d, xs, m);
    }
}

/* Else pieces: widened x through the bf16-out forward, and its backward for dout 1; widened dout
 * times widened dydx, rounded by dt_cast_bf16. */
void dt_gelu_forward_bf16io_grad_isa(dt_isa isa, uint16_t *out, uint16_t *dydx, const uint16_t *in, size_t n) {
    void (*k)(uint16_t *, uint16_t *, const uint16_t *, size_t) = BF16_COPY(isa, dt_gelu_forward_bf16io_grad);
    if (k) return k(out, dydx, in, n);
    float one[PIECE];
    for (size_t j = 0; j < PIECE; j++) one[j] = 1.0f;
    for (size_t i = 0; i < n; i += PIECE) {
        float piece[PIECE];
        const size_t m = n - i < PIECE ? n - i : PIECE;
        dt_widen_bf16(piece, in + i, m);
        dt_gelu_forward_bf16_isa(isa, out + i, piece, m);
        dt_gelu_backward_bf16_isa(isa, dydx + i, one, piece, m);
    }
}

void dt_gelu_backward_bf16io_from_grad_isa(dt_isa isa, uint16_t *din, const uint16_t *dout, const uint16_t *dydx,
                                           size_t n) {
    if (!din) return;
    void (*k)(uint16_t *, const uint16_t *, const uint16_t *, size_t) = BF16_COPY(isa,
                                                                                  dt_gelu_backward_bf16io_from_grad);
    if (k) return k(din, dout, dydx, n);
    for (size_t i = 0; i < n; i += PIECE) {
        float d[PIECE], g[PIECE];
        const size_t m = n - i < PIECE ? n - i : PIECE;
        dt_widen_bf16(d, dout + i, m);
        dt_widen_bf16(g, dydx + i, m);
        for (size_t j = 0; j < m; j++) d[j] *= g[j];
        dt_cast_bf16(din + i, d, m);
    }
}

void dt_gelu_backward_isa(dt_isa isa, float *din, const float *dout, const float *x, size_t n) {
    if (!din) return; /* nothing to propagate (first layer) */
    switch (isa) {
#if DT_ISA_X86
    case DT_ISA_AVX512: dt_gelu_backward_avx512(din, dout, x, n); break;
    case DT_ISA_AVX2: dt_gelu_backward_avx2(din, dout, x, n); break;
#endif
    default: gelu_backward_libm(din, dout, x, n); break;
    }
}

void dt_gelu_forward(float *out, const float *in, size_t n) { dt_gelu_forward_isa(dt_isa_best(), out, in, n); }

void dt_gelu_forward_bf16(uint16_t *out, const float *in, size_t n) {
    dt_gelu_forward_bf16_isa(dt_isa_best(), out, in, n);
}

void dt_gelu_forward_bf16io(uint16_t *out, const uint16_t *in, size_t n) {
    dt_gelu_forward_bf16io_isa(dt_isa_best(), out, in, n);
}

void dt_gelu_backward_bf16io(uint16_t *din, const uint16_t *dout, const uint16_t *x, size_t n) {
    dt_gelu_backward_bf16io_isa(dt_isa_best(), din, dout, x, n);
}

void dt_gelu_forward_bf16io_grad(uint16_t *out, uint16_t *dydx, const uint16_t *in, size_t n) {
    dt_gelu_forward_bf16io_grad_isa(dt_isa_best(), out, dydx, in, n);
}

void dt_gelu_backward_bf16io_from_grad(uint16_t *din, const uint16_t *dout, const uint16_t *dydx, size_t n) {
    dt_gelu_backward_bf16io_from_grad_isa(dt_isa_best(), din, dout, dydx, n);
}

void dt_gelu_backward_bf16(uint16_t *din, const float *dout, const float *x, size_t n) {
    dt_gelu_backward_bf16_isa(dt_isa_best(), din, dout, x, n);
}

void dt_gelu_backward(float *din, const float *dout, const float *x, size_t n) {
    dt_gelu_backward_isa(dt_isa_best(), din, dout, x, n);
}

void dt_tanh_forward(float *out, const float *in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = tanhf(in[i]);
}

void dt_tanh_backward(float *din, const float *dout, const float *y, size_t n) {
    if (!din) return; /* nothing to propagate (first layer) */
    for (size_t i = 0; i < n; i++) din[i] = dout[i] * (1.0f - y[i] * y[i]);
}

void dt_sigmoid_forward(float *out, const float *in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = 1.0f / (1.0f + expf(-in[i]));
}

void dt_sigmoid_backward(float *din, const float *dout, const float *y, size_t n) {
    if (!din) return; /* nothing to propagate (first layer) */
    for (size_t i = 0; i < n; i++) din[i] = dout[i] * y[i] * (1.0f - y[i]);
}

/* Word 0 of Philox-4x32-10 for counter (index, key) and key seed, exactly as dt_philox4x32 in
 * src/core/rng.c, written as straight-line code so the mask loop vectorises (16 counters per
 * AVX-512 step instead of one call per element). kernels_test checks it bit for bit. */
static inline uint32_t philox_w0(uint64_t index, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
    uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
#define DT_PHILOX_ROUND()                                                                  \
    do {                                                                                   \
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;         \
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1; \
        c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;                            \
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;                                              \
    } while (0)
    DT_PHILOX_ROUND();
    DT_PHILOX_ROUND();
    DT_PHILOX_ROUND();
    DT_PHILOX_ROUND();
    DT_PHILOX_ROUND();
    DT_PHILOX_ROUND();
    DT_PHILOX_ROUND();
    DT_PHILOX_ROUND();
    DT_PHILOX_ROUND();
    DT_PHILOX_ROUND();
#undef DT_PHILOX_ROUND
    return c0;
}

void dt_dropout_forward(float *out, uint8_t *mask, const float *in, size_t n, float p, uint64_t seed, uint64_t key) {
    if (p <= 0.0f) {
        memset(mask, 1, n);
        if (out != in) memmove(out, in, n * sizeof(float));
        return;
    }
    if (p >= 1.0f) {
        memset(mask, 0, n);
        memset(out, 0, n * sizeof(float));
        return;
    }
    /* mask[i] = dt_rng_uniform(seed, key, i) >= p */
    const uint32_t c2 = (uint32_t)key, c3 = (uint32_t)(key >> 32), k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (size_t i = 0; i < n; i++) mask[i] = (float)(philox_w0(i, c2, c3, k0, k1) >> 8) * (1.0f / 16777216.0f) >= p;
    const float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) out[i] = mask[i] ? in[i] * scale : 0.0f;
}

void dt_dropout_backward(float *din, const float *dout, const uint8_t *mask, size_t n, float p) {
    if (!din) return; /* nothing to propagate (first layer) */
    if (p >= 1.0f) {
        memset(din, 0, n * sizeof(float));
        return;
    }
    const float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) din[i] = mask[i] ? dout[i] * scale : 0.0f;
}
