/* Kernels on blocked activations, oneDNN's nChw16c or nChw8c: (B, C/BL, H, W, BL) with BL =
 * DT_BLOCK (blocked.h), the layout a oneDNN convolution reads and writes without reorders
 * (backend.h), or NHWC, (B, H, W, C), the one its AMX bf16 convolutions take: there each BL
 * channels of a sample are a block whose positions lie C apart instead of BL. Max pooling reads
 * a blocked input and writes a blocked or NCHW output (the end of a conv chain); each window
 * step handles BL channels at once. Ties and NaNs as the NCHW kernel
 * (cpu_pool.c): the first max wins, a NaN replaces the max (the last NaN wins). An NCHW output
 * (and its gradient) moves between the BL-channel vectors and the BL planes by in-register
 * BL x BL transposes. The reorders convert whole tensors. */
#include "backend/blocked.h"

#include <string.h>

#include "backend/backend.h"
#include "backend/kern.h"
#include "backend/vec_native.h"
#include "dtrain/core.h"

#define BL DT_BLOCK

/* Value i of x: f32, or bf16 (uint16_t) when bf16 (a constant in every inlined caller). */
static inline float value_at(const void *x, size_t i, bool bf16) {
    if (!bf16) return ((const float *)x)[i];
    const uint32_t u = (uint32_t)((const uint16_t *)x)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* 16 values at x + i: f32, or bf16 widened (exact). */
static inline __attribute__((always_inline)) __m512 load16(const void *x, size_t i, bool bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)x + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* v rounded to bf16 (to nearest even, NaN stays a quiet NaN: dt_f32_to_bf16's rule). */
static inline __m256i bf16_of16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                       _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i q = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_mask_blend_epi32(nan, r, q), 16));
}

/* window_max for one 16-channel vector (AVX-512): v > m or v is NaN replaces m. Inlined into
 * each caller so that a constant K (the 2x2 pools of CNNs) unrolls: called through a loop over a
 * variable K it ran several times slower (docs/why.md, "An inlined window maximum"). */
static inline __attribute__((always_inline)) void window_max16(float *m_out, int32_t *idx_out, const void *x, int W,
                                                               int ps, int y0, int x0, int K, int32_t base, bool bf16,
                                                               bool relu) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int32_t at0 = (y0 * W + x0) * ps;
    __m512 m = load16(x, (size_t)at0, bf16);
    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base + at0), lane);
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            if (!ky && !kx) continue;
            const int32_t at = at0 + (ky * W + kx) * ps;
            __m512 v = load16(x, (size_t)at, bf16);
            __mmask16 t = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            m = _mm512_mask_blend_ps(t, m, v);
            idx = _mm512_mask_blend_epi32(t, idx, _mm512_add_epi32(_mm512_set1_epi32(base + at), lane));
        }
    if (relu) { /* the relu after the pool: 0 and no window position (-1: no gradient) where m > 0 fails */
        const __mmask16 pass = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ);
        m = _mm512_maskz_mov_ps(pass, m), idx = _mm512_mask_blend_epi32(pass, _mm512_set1_epi32(-1), idx);
    }
    _mm512_storeu_ps(m_out, m);
    _mm512_storeu_si512(idx_out, idx);
}

static inline __attribute__((always_inline)) void unpool_window16(void *din, const float *g, const int32_t *am, int W,
                                                                  int ps, int y0, int x0, int K, int32_t base,
                                                                  bool bf16) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 gv = _mm512_loadu_ps(g);
    const __m512i av = _mm512_loadu_si512(am);
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            const int32_t at = ((y0 + ky) * W + x0 + kx) * ps;
            const __mmask16 hit = _mm512_cmpeq_epi32_mask(av, _mm512_add_epi32(_mm512_set1_epi32(base + at), lane));
            const __m512 v = _mm512_maskz_mov_ps(hit, gv);
            if (bf16) _mm256_storeu_si256((__m256i *)((uint16_t *)din + at), bf16_of16(v));
            else _mm512_storeu_ps((float *)din + at, v);
        }
}
#define WINDOW_MAX window_max16
#define UNPOOL_WINDOW unpool_window16
#else
/* Without AVX-512: the same steps on GCC vectors as wide as the registers (backend/vec_native.h),
 * BL / VW of them per window position. */

/* VW values at x + i: f32, or bf16 widened (exact). */
static inline __attribute__((always_inline)) vf load_vw(const void *x, size_t i, bool bf16) {
    return bf16 ? vf_from_bf16((const uint16_t *)x + i) : vf_load((const float *)x + i);
}

/* Maxima of one output position over its KxK window, for the BL channels of block x (H x W x BL
 * values, f32 or bf16); idx gets their flat indices into the whole input (base: the block's
 * first one). Inlined (see window_max16). */
static inline __attribute__((always_inline)) void window_max_vw(float *m_out, int32_t *idx_out, const void *x, int W,
                                                                int ps, int y0, int x0, int K, int32_t base, bool bf16,
                                                                bool relu) {
    const int32_t at0 = (y0 * W + x0) * ps;
    for (int h = 0; h < BL; h += VW) {
        vf m = load_vw(x, (size_t)at0 + h, bf16);
        vi idx = vi_lanes() + (base + at0 + h);
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
                if (!ky && !kx) continue;
                const int32_t at = at0 + (ky * W + kx) * ps + h;
                const vf v = load_vw(x, (size_t)at, bf16);
                const vi t = (v > m) | (v != v);
                m = vf_select(t, v, m);
                idx = (t & (vi_lanes() + (base + at))) | (idx & ~t);
            }
        if (relu) { /* as window_max16 */
            const vi pass = m > 0;
            m = vf_select(pass, m, (vf){0}), idx = (idx & pass) | ~pass;
        }
        vf_store(m_out + h, m);
        memcpy(idx_out + h, &idx, sizeof idx);
    }
}

/* din of one output position whose KxK window no other window overlaps (K == S): each window
 * value gets the gradient where the argmax points, 0 elsewhere (rounded to bf16 for a bf16 din);
 * g, am: the position's BL channels. */
static inline __attribute__((always_inline)) void unpool_window_vw(void *din, const float *g, const int32_t *am, int W,
                                                                   int ps, int y0, int x0, int K, int32_t base,
                                                                   bool bf16) {
    for (int h = 0; h < BL; h += VW) {
        const vf gv = vf_load(g + h);
        vi av;
        memcpy(&av, am + h, sizeof av);
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
                const int32_t at = ((y0 + ky) * W + x0 + kx) * ps + h;
                const vf v = (vf)((vi)gv & (av == vi_lanes() + (base + at)));
                if (bf16) {
                    const vh r = vf_to_bf16(v);
                    memcpy((uint16_t *)din + at, &r, sizeof r);
                } else vf_store((float *)din + at, v);
            }
    }
}
#define WINDOW_MAX window_max_vw
#define UNPOOL_WINDOW unpool_window_vw
#endif

#if defined(__AVX512F__)
/* r[i] lane j <-> r[j] lane i: a 16x16 transpose of 32-bit values in 64 shuffles. */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++)
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]),
              t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]),
                      c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c)),
              r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d)),
                  r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88),
                      t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    for (int j = 0; j < 8; j++)
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88), r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
}
#define TRANSPOSE transpose16
typedef __m512 tvec;
#define TLOAD _mm512_loadu_ps
#define TSTORE _mm512_storeu_ps
#elif defined(__AVX__)
#include <immintrin.h>

/* The same of 8x8 (BL 8 without AVX-512) in 24 shuffles. */
static inline __attribute__((always_inline)) void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++)
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]),
              t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++)
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20), r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
}
#define TRANSPOSE transpose8
typedef __m256 tvec;
#define TLOAD _mm256_loadu_ps
#define TSTORE _mm256_storeu_ps
#endif

/* y[c * ys + j] = v[j * BL + c] for c < BL, j < n (32-bit values): n BL-channel vectors of a
 * block to BL NCHW plane rows. */
static void vectors_to_planes(uint32_t *restrict y, size_t ys, const uint32_t *restrict v, size_t n) {
    size_t j = 0;
#if defined(TRANSPOSE)
    for (; j + BL <= n; j += BL) {
        tvec r[BL];
        for (int i = 0; i < BL; i++) r[i] = TLOAD((const float *)v + (j + i) * BL);
        TRANSPOSE(r);
        for (int c = 0; c < BL; c++) TSTORE((float *)y + c * ys + j, r[c]);
    }
#endif
    for (int c = 0; c < BL; c++) /* the tail */
        for (size_t i = j; i < n; i++) y[c * ys + i] = v[i * BL + c];
}

/* v[j * BL + c] = y[c * ys + j]: the inverse. */
static void planes_to_vectors(uint32_t *restrict v, const uint32_t *restrict y, size_t ys, size_t n) {
    size_t j = 0;
#if defined(TRANSPOSE)
    for (; j + BL <= n; j += BL) {
        tvec r[BL];
        for (int c = 0; c < BL; c++) r[c] = TLOAD((const float *)y + c * ys + j);
        TRANSPOSE(r);
        for (int i = 0; i < BL; i++) TSTORE((float *)v + (j + i) * BL, r[i]);
    }
#endif
    for (int c = 0; c < BL; c++) /* the tail (the 49th of a 7x7 plane): plain moves beat a transpose */
        for (size_t i = j; i < n; i++) v[i * BL + c] = y[c * ys + i];
}

/* Where block blk (sample blk / CB, channels blk % CB * BL on) of a (B, C, HW) tensor starts:
 * blocked, (B, C/BL, HW, BL), or NHWC, (B, HW, C); the step between its positions is BL or C. */
static inline size_t block_at(size_t blk, int CB, size_t HW, bool nhwc) {
    return nhwc ? (blk / CB * HW * CB + blk % CB) * BL : blk * HW * BL;
}

/* Output positions p0 .. p0 + np - 1 (of rows OW long) of one block; ps, os: the steps between
 * the block's input and output positions. */
static inline __attribute__((always_inline)) void pool_chunk(float *m, int32_t *idx, const void *x, int W, int ps,
                                                             int OW, int os, size_t p0, size_t np, int K, int S,
                                                             int32_t base, bool bf16, bool relu) {
    for (size_t j = 0, oy = p0 / OW, ox = p0 % OW; j < np; j++) {
        WINDOW_MAX(m + j * os, idx + j * os, x, W, ps, (int)oy * S, (int)ox * S, K, base, bf16, relu);
        if (++ox == (size_t)OW) ox = 0, oy++;
    }
}

/* The windows of output positions p0 .. p0 + np - 1 of one block (g, a: their vectors, os apart). */
static inline __attribute__((always_inline)) void unpool_chunk(void *x, const float *g, const int32_t *a, int W, int ps,
                                                               int OW, int os, size_t p0, size_t np, int K,
                                                               int32_t base, bool bf16) {
    for (size_t j = 0, oy = p0 / OW, ox = p0 % OW; j < np; j++) {
        UNPOOL_WINDOW(x, g + j * os, a + j * os, W, ps, (int)oy * K, (int)ox * K, K, base, bf16);
        if (++ox == (size_t)OW) ox = 0, oy++;
    }
}

#define CHUNK 256 /* output positions of a block pooled before an NCHW output is written */

/* Whether every input value lies in exactly one window (the backward then unpools window by
 * window; else it scatters through argmax). */

/* argmax's layout with an NCHW output: where the windows tile the input, only the pool's own
 * backward reads it, so it stays in the block's vector order (block blk's positions from
 * blk * OHW * BL, BL channels each) and neither pass transposes it; else it is NCHW like dout,
 * for the scatter. out_bf16 (a bf16 in, an NCHW out): the output values stored bf16
 * (dt_cast_bf16), which they are exactly: maxima of bf16 values, or 0. */
static inline __attribute__((always_inline)) void pool_forward(void *out_v, int32_t *argmax, const void *in, int B,
                                                               int C, int H, int W, int K, int S, bool out_bl,
                                                               bool nhwc, bool relu, bool bf16, bool out_bf16) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1, CB = C / BL, ps = nhwc ? C : BL;
    if (OH <= 0 || OW <= 0) return;
    const size_t HW = (size_t)H * W, OHW = (size_t)OH * OW, vsize = bf16 ? 2 : 4;
    const bool a_vectors = !out_bl && dt_pool_windows_tile(H, W, K, S);
    float *out = out_v;
    float tm[CHUNK * BL]; /* NCHW output: CHUNK positions of the block, then BL plane rows */
    int32_t ti[CHUNK * BL];
    float tp[out_bf16 ? CHUNK * BL : 1]; /* a bf16 NCHW output: the BL plane rows at f32 */
    for (size_t blk = 0; blk < (size_t)B * CB; blk++) {
        const size_t at = block_at(blk, CB, HW, nhwc), out_at = block_at(blk, CB, OHW, nhwc);
        const void *x = (const char *)in + at * vsize;
        const int32_t base = (int32_t)at;
        for (size_t p0 = 0; p0 < OHW; p0 += CHUNK) {
            const size_t np = OHW - p0 < CHUNK ? OHW - p0 : CHUNK;
            float *m = out_bl ? out + out_at + p0 * ps : tm;
            int32_t *idx = out_bl ? argmax + out_at + p0 * ps : a_vectors ? argmax + (blk * OHW + p0) * BL : ti;
            const int os = out_bl ? ps : BL;
            if (K == 2) pool_chunk(m, idx, x, W, ps, OW, os, p0, np, 2, S, base, bf16, relu);
            else pool_chunk(m, idx, x, W, ps, OW, os, p0, np, K, S, base, bf16, relu);
            if (out_bl) continue;
            /* planes (n, blk % CB * BL + c) of the NCHW output */
            if (out_bf16) {
                vectors_to_planes((uint32_t *)tp, np, (const uint32_t *)tm, np);
                for (int c = 0; c < BL; c++)
                    dt_cast_bf16((uint16_t *)out_v + (blk * BL + c) * OHW + p0, tp + (size_t)c * np, np);
            } else vectors_to_planes((uint32_t *)out + blk * BL * OHW + p0, OHW, (const uint32_t *)tm, np);
            if (!a_vectors) vectors_to_planes((uint32_t *)argmax + blk * BL * OHW + p0, OHW, (const uint32_t *)ti, np);
        }
    }
}

void dt_maxpool2d_forward_blocked(float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K,
                                  int S, bool out_bl, bool nhwc, bool relu) {
    pool_forward(out, argmax, in, B, C, H, W, K, S, out_bl, nhwc, relu, false, false);
}

void dt_maxpool2d_forward_blocked_bf16(void *out, int32_t *argmax, const uint16_t *in, int B, int C, int H, int W,
                                       int K, int S, bool out_bl, bool nhwc, bool relu, bool out_bf16) {
    if (out_bf16 && !out_bl) pool_forward(out, argmax, in, B, C, H, W, K, S, false, nhwc, relu, true, true);
    else pool_forward(out, argmax, in, B, C, H, W, K, S, out_bl, nhwc, relu, true, false);
}

/* Overlapping windows or input values outside every window: a scatter (dout and argmax share
 * the output's layout), summed in f32; a bf16 din is rounded once at the end. An argmax of -1
 * (the fused relu stopped it) sends nothing. */
static void unpool_scatter(void *din, const float *dout, const int32_t *argmax, size_t nin, size_t nout, bool bf16,
                           float *work) {
    float *d = bf16 ? work : din; /* a bf16 din: its f32 sums in the workspace's first nin floats */
    memset(d, 0, nin * sizeof(float));
    for (size_t i = 0; i < nout; i++)
        if (argmax[i] >= 0) d[argmax[i]] += dout[i];
    if (!bf16) return;
    for (size_t i = 0; i < nin; i++) ((uint16_t *)din)[i] = dt_f32_to_bf16(d[i]);
}

/* dout_bf16 (an NCHW dout, bf16 din): dout is bf16 (uint16_t) too, each plane row's chunk widened
 * before it is transposed; exact where the windows tile the input, since each din value is then
 * one dout value or 0, rounded once either way. */
static inline __attribute__((always_inline)) void pool_backward(void *din, const void *dout_v, const int32_t *argmax,
                                                                int B, int C, int H, int W, int K, int S, bool out_bl,
                                                                bool nhwc, bool bf16, bool dout_bf16, float *work) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1, CB = C / BL, ps = nhwc ? C : BL;
    const bool tiles = dt_pool_windows_tile(H, W, K, S);
    const size_t HW = (size_t)H * W, OHW = (size_t)OH * OW, vsize = bf16 ? 2 : 4;
    const size_t nout = OH > 0 && OW > 0 ? (size_t)B * C * OHW : 0;
    const float *dout = dout_v;
    if (!tiles || OH <= 0 || OW <= 0) { /* work: the scatter's f32 din (bf16), then the widened dout */
        float *wide = dout_bf16 ? work + (bf16 ? (size_t)B * C * HW : 0) : NULL;
        if (dout_bf16) dt_widen_bf16(wide, dout_v, nout);
        unpool_scatter(din, dout_bf16 ? wide : dout, argmax, (size_t)B * C * HW, nout, bf16, work);
        return;
    }
    float tg[CHUNK * BL];                 /* NCHW dout: CHUNK positions of the block's 16 planes, transposed */
    float tw[dout_bf16 ? CHUNK * BL : 1]; /* a bf16 NCHW dout: the BL plane rows widened */
    for (size_t blk = 0; blk < (size_t)B * CB; blk++) {
        const size_t at = block_at(blk, CB, HW, nhwc), out_at = block_at(blk, CB, OHW, nhwc);
        void *x = (char *)din + at * vsize;
        const int32_t base = (int32_t)at;
        for (size_t p0 = 0; p0 < OHW; p0 += CHUNK) {
            const size_t np = OHW - p0 < CHUNK ? OHW - p0 : CHUNK;
            const float *g = out_bl ? dout + out_at + p0 * ps : tg;
            const int32_t *a = out_bl ? argmax + out_at + p0 * ps : argmax + (blk * OHW + p0) * BL;
            const int os = out_bl ? ps : BL;
            if (!out_bl && dout_bf16) {
                for (int c = 0; c < BL; c++)
                    dt_widen_bf16(tw + (size_t)c * np, (const uint16_t *)dout_v + (blk * BL + c) * OHW + p0, np);
                planes_to_vectors((uint32_t *)tg, (const uint32_t *)tw, np, np);
            } else if (!out_bl)
                planes_to_vectors((uint32_t *)tg, (const uint32_t *)dout + blk * BL * OHW + p0, OHW, np);
            if (K == 2) unpool_chunk(x, g, a, W, ps, OW, os, p0, np, 2, base, bf16);
            else unpool_chunk(x, g, a, W, ps, OW, os, p0, np, K, base, bf16);
        }
    }
}

void dt_maxpool2d_backward_blocked(float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W,
                                   int K, int S, bool out_bl, bool nhwc) {
    pool_backward(din, dout, argmax, B, C, H, W, K, S, out_bl, nhwc, false, false, NULL);
}

/* The scatter's f32 din where the windows do not tile the input, and a widened bf16 dout. */
size_t dt_maxpool2d_blocked_bf16_workspace(int B, int C, int H, int W, int K, int S, bool dout_bf16) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const bool scatter = !dt_pool_windows_tile(H, W, K, S) || OH <= 0 || OW <= 0;
    const size_t nout = OH > 0 && OW > 0 ? (size_t)B * C * OH * OW : 0;
    return (scatter ? (size_t)B * C * H * W : 0) + (dout_bf16 ? nout : 0);
}

void dt_maxpool2d_backward_blocked_bf16(uint16_t *din, const void *dout, const int32_t *argmax, int B, int C, int H,
                                        int W, int K, int S, bool out_bl, bool nhwc, bool dout_bf16, float *work) {
    if (!dout_bf16) return pool_backward(din, dout, argmax, B, C, H, W, K, S, out_bl, nhwc, true, false, work);
    if (!out_bl) return pool_backward(din, dout, argmax, B, C, H, W, K, S, false, nhwc, true, true, work);
    /* a blocked bf16 dout: widened into the workspace's tail (the same count of values), then as f32 */
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const size_t nout = OH > 0 && OW > 0 ? (size_t)B * C * OH * OW : 0;
    float *wide = work + dt_maxpool2d_blocked_bf16_workspace(B, C, H, W, K, S, true) - nout;
    dt_widen_bf16(wide, dout, nout);
    pool_backward(din, wide, argmax, B, C, H, W, K, S, true, nhwc, true, false, work);
}

/* Where (sample n, channel c, position p) of a (B, C, HW) tensor lives, blocked or NHWC. */
static inline size_t chain_index(int n, int c, int p, int C, int HW, bool nhwc) {
    return nhwc ? ((size_t)n * HW + p) * C + c : (((size_t)n * (C / BL) + c / BL) * HW + p) * BL + c % BL;
}

void dt_blocked_from_nchw(float *restrict dst, const float *restrict src, int B, int C, int HW, bool nhwc) {
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < HW; p++) dst[chain_index(n, c, p, C, HW, nhwc)] = src[((size_t)n * C + c) * HW + p];
}

void dt_blocked_to_nchw(float *restrict dst, const float *restrict src, int B, int C, int HW, bool nhwc) {
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < HW; p++) dst[((size_t)n * C + c) * HW + p] = src[chain_index(n, c, p, C, HW, nhwc)];
}

static inline __attribute__((always_inline)) void channel_sums(float *restrict acc, const void *restrict x, int B,
                                                               int C, int HW, bool nhwc, bool bf16) {
    const int CB = C / BL, ps = nhwc ? C : BL;
    for (size_t blk = 0; blk < (size_t)B * CB; blk++) {
        float s[BL] = {0};
        const size_t at = block_at(blk, CB, (size_t)HW, nhwc);
        for (int p = 0; p < HW; p++)
            for (int c = 0; c < BL; c++) s[c] += value_at(x, at + (size_t)p * ps + c, bf16);
        float *restrict a = acc + blk % CB * BL;
        for (int c = 0; c < BL; c++) a[c] += s[c];
    }
}

void dt_blocked_channel_sums(float *restrict acc, const float *restrict x, int B, int C, int HW, bool nhwc) {
    channel_sums(acc, x, B, C, HW, nhwc, false);
}

void dt_blocked_channel_sums_bf16(float *restrict acc, const float *restrict x, int B, int C, int HW, bool nhwc) {
    channel_sums(acc, x, B, C, HW, nhwc, true);
}
