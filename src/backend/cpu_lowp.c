/* Low-precision GEMMs on OpenBLAS, and the rounding they rest on. OpenBLAS 0.3.21 has no bf16
 * or fp16 GEMM with f32 accumulation that dtrain can use, so the blas backend rounds the GEMM
 * inputs (activations, weights, output gradients) to bf16/fp16 values kept as f32 and runs sgemm:
 * the product of two bf16 or fp16 numbers is exact in f32, so this equals a native low-precision
 * GEMM with f32 accumulation up to summation order. It is correct but SLOWER than fp32 (an extra
 * pass over every input); oneDNN is the fast path. Bias and bias gradients stay f32. */
#include "backend/backend.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/kern.h"

/* The rounding runs on every GEMM input at bf16/fp16 where the kernels are f32 (blas, and oneDNN
 * without native bf16 or fp16), so it is vectorised: GCC does the bf16 integer steps itself, while
 * it leaves the _Float16 loop scalar (a quarter of an fp16 MLP step on an Ice Lake Xeon), so
 * fp16 converts 16 floats at a time with AVX-512, 8 with F16C; the scalar tail rounds the same. */
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* The f32 bits of u rounded to bf16 (the upper 16; to nearest even, NaN stays a quiet NaN). */
static inline uint32_t bf16_rounded_bits(uint32_t u) {
    return (u & 0x7fffffffu) > 0x7f800000u ? u | 0x00400000u : u + 0x7fffu + ((u >> 16) & 1u);
}

void dt_round_bf16(float *dst, const float *src, size_t n) { /* GCC vectorises this loop itself */
    const uint32_t *s = (const uint32_t *)src;
    uint32_t *d = (uint32_t *)dst;
    for (size_t i = 0; i < n; i++) d[i] = bf16_rounded_bits(s[i]) & 0xffff0000u;
}

void dt_round_f16(float *dst, const float *src, size_t n) {
    size_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_CUR_DIRECTION)));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_CUR_DIRECTION)));
#endif
#if defined(__GNUC__) && !defined(__clang__) /* GCC has _Float16 on every x86-64 (F16C or software) */
    for (; i < n; i++) dst[i] = (float)(_Float16)src[i];
#else /* clang 14 has it only where AVX512-FP16 is enabled: core's conversions, the same rounding */
    for (; i < n; i++) dst[i] = dt_f16_to_f32(dt_f32_to_f16(src[i]));
#endif
}

#if defined(__x86_64__)
#include <immintrin.h>
/* With AVX512-BF16: 32 values rounded in one vcvtne2ps2bf16 (to nearest even, as below). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void cast_bf16_native(uint16_t *d,
                                                                                             const float *src,
                                                                                             size_t n) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm512_storeu_si512(d + i,
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i)));
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(d + i, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i)));
    }
}
#endif

bool dt_cast_bf16_native(void) {
#if defined(__x86_64__)
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

void dt_cast_bf16(uint16_t *dst, const float *src, size_t n) {
#if defined(__x86_64__)
    if (dt_cast_bf16_native()) return cast_bf16_native(dst, src, n);
#endif
    const uint32_t *s = (const uint32_t *)src;
    for (size_t i = 0; i < n; i++) dst[i] = (uint16_t)(bf16_rounded_bits(s[i]) >> 16);
}

void dt_widen_bf16(float *dst, const uint16_t *src, size_t n) {
    uint32_t *d = (uint32_t *)dst;
    for (size_t i = 0; i < n; i++) d[i] = (uint32_t)src[i] << 16;
}

/* src rounded to the precision into dst (the caller's workspace); dst. */
static float *rounded(float *dst, const float *src, size_t n, dt_dtype prec) {
    if (prec == DT_BF16) dt_round_bf16(dst, src, n);
    else dt_round_f16(dst, src, n);
    return dst;
}

/* db (OC) += sums of dout (B, OC, HW) over B and HW, from the f32 gradient. */
static void bias_grad(float *db, const float *dout, int B, int OC, size_t HW) {
    for (int b = 0; b < B; b++)
        for (int o = 0; o < OC; o++) db[o] += dt_nn_sum(dout + ((size_t)b * OC + o) * HW, HW);
}

/* The workspace of the rounded GEMM inputs: forward's in and w, backward's dout, in and w. */
static size_t linear_ws(int B, int C, int OC) {
    return B <= 0 || OC <= 0 || C <= 0 ? 0 : (size_t)B * OC + (size_t)B * C + (size_t)OC * C;
}

static void linear_fwd(dt_dtype p, float *out, const float *in, const float *w, const float *b, float *work, int B,
                       int C, int OC) {
    if (B <= 0 || OC <= 0 || C <= 0) return dt_linear_forward(out, in, w, b, B, C, OC);
    float *rin = work, *rw = rin + (size_t)B * C;
    dt_linear_forward(out, rounded(rin, in, (size_t)B * C, p), rounded(rw, w, (size_t)OC * C, p), b, B, C, OC);
}

static void linear_bwd(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                       float *work, int B, int C, int OC) {
    if (B <= 0 || OC <= 0 || C <= 0) return dt_linear_backward(din, dw, db, dout, in, w, B, C, OC);
    if (db)
        for (int i = 0; i < B; i++) {
            const float *restrict row = dout + (size_t)i * OC;
            for (int j = 0; j < OC; j++) db[j] += row[j];
        }
    float *rg = work, *rin = rg + (size_t)B * OC, *rw = rin + (size_t)B * C;
    dt_linear_backward(din, dw, NULL, rounded(rg, dout, (size_t)B * OC, p), rounded(rin, in, (size_t)B * C, p),
                       rounded(rw, w, (size_t)OC * C, p), B, C, OC);
}

static int out_hw(int H, int W, int K, int S, int P) { return ((H + 2 * P - K) / S + 1) * ((W + 2 * P - K) / S + 1); }

/* The f32 conv's workspace, then the rounded inputs: in, w, and backward's dout. */
static size_t conv_ws(int B, int C, int H, int W, int OC, int K, int S, int P) {
    return dt_conv2d_workspace(B, C, H, W, OC, K, S, P) + (size_t)B * C * H * W + (size_t)OC * C * K * K +
           (size_t)B * OC * out_hw(H, W, K, S, P);
}

static void conv_fwd(dt_dtype p, float *out, const float *in, const float *w, const float *b, float *work, int B, int C,
                     int H, int W, int OC, int K, int S, int P) {
    float *rin = work + dt_conv2d_workspace(B, C, H, W, OC, K, S, P), *rw = rin + (size_t)B * C * H * W;
    dt_conv2d_forward(out, rounded(rin, in, (size_t)B * C * H * W, p), rounded(rw, w, (size_t)OC * C * K * K, p), b,
                      work, B, C, H, W, OC, K, S, P);
}

static void conv_bwd(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                     float *work, int B, int C, int H, int W, int OC, int K, int S, int P) {
    size_t hw = (size_t)out_hw(H, W, K, S, P);
    if (db) bias_grad(db, dout, B, OC, hw);
    float *rin = work + dt_conv2d_workspace(B, C, H, W, OC, K, S, P), *rw = rin + (size_t)B * C * H * W;
    float *rg = rw + (size_t)OC * C * K * K;
    dt_conv2d_backward(din, dw, NULL, rounded(rg, dout, (size_t)B * OC * hw, p),
                       rounded(rin, in, (size_t)B * C * H * W, p), rounded(rw, w, (size_t)OC * C * K * K, p), work, B,
                       C, H, W, OC, K, S, P);
}

#define DT_LOWP_WRAPPERS(sfx, P)                                                                                       \
    static void linear_fwd_##sfx(float *out, const float *in, const float *w, const float *b, float *work, int B,      \
                                 int C, int OC) {                                                                      \
        linear_fwd(P, out, in, w, b, work, B, C, OC);                                                                  \
    }                                                                                                                  \
    static void linear_bwd_##sfx(float *din, float *dw, float *db, const float *dout, const float *in, const float *w, \
                                 float *work, int B, int C, int OC) {                                                  \
        linear_bwd(P, din, dw, db, dout, in, w, work, B, C, OC);                                                       \
    }                                                                                                                  \
    static void conv_fwd_##sfx(float *out, const float *in, const float *w, const float *b, float *work, int B, int C, \
                               int H, int W, int OC, int K, int S, int Pd) {                                           \
        conv_fwd(P, out, in, w, b, work, B, C, H, W, OC, K, S, Pd);                                                    \
    }                                                                                                                  \
    static void conv_bwd_##sfx(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,   \
                               float *work, int B, int C, int H, int W, int OC, int K, int S, int Pd) {                \
        conv_bwd(P, din, dw, db, dout, in, w, work, B, C, H, W, OC, K, S, Pd);                                         \
    }
DT_LOWP_WRAPPERS(bf16, DT_BF16)
DT_LOWP_WRAPPERS(f16, DT_F16)

static dt_kernel_table bf16_table, f16_table;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void fill(dt_kernel_table *t, dt_dtype p) {
    *t = *dt_backend_cpu();
    t->precision = p;
    t->linear_workspace = linear_ws;
    t->conv2d_workspace = conv_ws;
    t->linear_forward = p == DT_BF16 ? linear_fwd_bf16 : linear_fwd_f16;
    t->linear_backward = p == DT_BF16 ? linear_bwd_bf16 : linear_bwd_f16;
    t->conv2d_forward = p == DT_BF16 ? conv_fwd_bf16 : conv_fwd_f16;
    t->conv2d_backward = p == DT_BF16 ? conv_bwd_bf16 : conv_bwd_f16;
}

static void fill_tables(void) { fill(&bf16_table, DT_BF16), fill(&f16_table, DT_F16); }

const dt_kernel_table *dt_backend_blas_lowp(dt_dtype precision) {
    if (precision != DT_BF16 && precision != DT_F16) return NULL;
    pthread_once(&tables_once, fill_tables);
    return precision == DT_BF16 ? &bf16_table : &f16_table;
}
