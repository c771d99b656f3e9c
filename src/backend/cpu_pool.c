/* Max and average 2-d pooling over NCHW planes (square window K, stride S, no padding).
 * MaxPool keeps the flat input index of each max (first max wins on ties, the last NaN wins,
 * as torch's CPU kernel) so backward is a scatter; K == S == 2 has a dedicated fast path. */
#include "backend/layers.h"

#include <string.h>

#include "backend/kern.h"

#if defined(__AVX512F__)
#include <immintrin.h>

/* Lane masks for the 2*cnt input floats of cnt (<= 16) outputs, split into two 16-lane halves. */
static inline void pair_masks(int cnt, __mmask16 *mo, __mmask16 *mlo, __mmask16 *mhi) {
    int nin = 2 * cnt;
    *mo = (__mmask16)((1u << cnt) - 1);
    *mlo = (__mmask16)(nin >= 16 ? 0xFFFFu : (1u << nin) - 1);
    *mhi = (__mmask16)(nin > 16 ? (1u << (nin - 16)) - 1 : 0u);
}

/* One output row of a 2x2/stride-2 max pool from input rows r0, r0 + W, 16 outputs per step
 * (masked tails). Order and NaN rule as the general loop: v > m or v is NaN replaces m. */
static void pool2_row(float *y, int32_t *am, const float *r0, int W, int OW, int32_t base) {
    const float *r1 = r0 + W;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    const __m512i one = _mm512_set1_epi32(1), vw = _mm512_set1_epi32(W), vw1 = _mm512_set1_epi32(W + 1);
    for (int ox = 0; ox < OW; ox += 16) {
        __mmask16 mo, mlo, mhi;
        pair_masks(OW - ox < 16 ? OW - ox : 16, &mo, &mlo, &mhi);
        __m512 t0 = _mm512_maskz_loadu_ps(mlo, r0 + 2 * ox), t1 = _mm512_maskz_loadu_ps(mhi, r0 + 2 * ox + 16);
        __m512 u0 = _mm512_maskz_loadu_ps(mlo, r1 + 2 * ox), u1 = _mm512_maskz_loadu_ps(mhi, r1 + 2 * ox + 16);
        __m512 m = _mm512_permutex2var_ps(t0, ev, t1), b = _mm512_permutex2var_ps(t0, od, t1);
        __m512 c = _mm512_permutex2var_ps(u0, ev, u1), d = _mm512_permutex2var_ps(u0, od, u1);
        __m512i off = _mm512_setzero_si512();
        __mmask16 t = _mm512_cmp_ps_mask(b, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
        m = _mm512_mask_blend_ps(t, m, b), off = _mm512_mask_blend_epi32(t, off, one);
        t = _mm512_cmp_ps_mask(c, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
        m = _mm512_mask_blend_ps(t, m, c), off = _mm512_mask_blend_epi32(t, off, vw);
        t = _mm512_cmp_ps_mask(d, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
        m = _mm512_mask_blend_ps(t, m, d), off = _mm512_mask_blend_epi32(t, off, vw1);
        _mm512_mask_storeu_ps(y + ox, mo, m);
        __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * ox), _mm512_add_epi32(ev, off));
        _mm512_mask_storeu_epi32(am + ox, mo, idx);
    }
}

/* Backward of one 2x2/stride-2 output row that tiles its two input rows exactly: writes every
 * din value of rows r0, r0 + W (the gradient where the argmax points, 0 elsewhere). */
static void unpool2_row(float *r0, const float *g, const int32_t *am, int W, int OW, int32_t base) {
    float *r1 = r0 + W;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1), vw = _mm512_set1_epi32(W),
                  vw1 = _mm512_set1_epi32(W + 1);
    for (int ox = 0; ox < OW; ox += 16) {
        __mmask16 mo, mlo, mhi;
        pair_masks(OW - ox < 16 ? OW - ox : 16, &mo, &mlo, &mhi);
        __m512 gv = _mm512_maskz_loadu_ps(mo, g + ox);
        __m512i off = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(mo, am + ox),
                                       _mm512_add_epi32(_mm512_set1_epi32(base + 2 * ox), ev));
        __m512 a = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(off, zero), gv);
        __m512 b = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(off, one), gv);
        __m512 c = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(off, vw), gv);
        __m512 d = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(off, vw1), gv);
        _mm512_mask_storeu_ps(r0 + 2 * ox, mlo, _mm512_permutex2var_ps(a, lo, b));
        _mm512_mask_storeu_ps(r0 + 2 * ox + 16, mhi, _mm512_permutex2var_ps(a, hi, b));
        _mm512_mask_storeu_ps(r1 + 2 * ox, mlo, _mm512_permutex2var_ps(c, lo, d));
        _mm512_mask_storeu_ps(r1 + 2 * ox + 16, mhi, _mm512_permutex2var_ps(c, hi, d));
    }
}
#else
/* One output row of a 2x2/stride-2 max pool from input rows r0, r0 + W (portable version). */
static void pool2_row(float *restrict y, int32_t *restrict am, const float *restrict r0, int W, int OW, int32_t base) {
    const float *restrict r1 = r0 + W;
    for (int ox = 0; ox < OW; ox++) {
        float a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
        float m = a;
        int32_t off = 0;
        int tb = (b > m) | (b != b);
        m = tb ? b : m, off = tb ? 1 : off;
        int tc = (c > m) | (c != c);
        m = tc ? c : m, off = tc ? W : off;
        int td = (d > m) | (d != d);
        m = td ? d : m, off = td ? W + 1 : off;
        y[ox] = m;
        am[ox] = base + 2 * ox + off;
    }
}

/* Backward of one 2x2/stride-2 output row that tiles its two input rows (portable version). */
static void unpool2_row(float *restrict r0, const float *restrict g, const int32_t *restrict am, int W, int OW,
                        int32_t base) {
    float *restrict r1 = r0 + W;
    for (int ox = 0; ox < OW; ox++) {
        int32_t off = am[ox] - (base + 2 * ox);
        float v = g[ox];
        r0[2 * ox] = off == 0 ? v : 0.0f;
        r0[2 * ox + 1] = off == 1 ? v : 0.0f;
        r1[2 * ox] = off == W ? v : 0.0f;
        r1[2 * ox + 1] = off == W + 1 ? v : 0.0f;
    }
}
#endif

void dt_maxpool2d_forward(float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K, int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    if (OH <= 0 || OW <= 0) return;
    const size_t planes = (size_t)B * C, HW = (size_t)H * W, OHW = (size_t)OH * OW;
    for (size_t pl = 0; pl < planes; pl++) {
        const float *restrict x = in + pl * HW;
        float *restrict y = out + pl * OHW;
        int32_t *restrict am = argmax + pl * OHW;
        const int32_t base = (int32_t)(pl * HW);
        if (K == 2 && S == 2) {
            for (int oy = 0; oy < OH; oy++)
                pool2_row(y + (size_t)oy * OW, am + (size_t)oy * OW, x + (size_t)(2 * oy) * W, W, OW,
                          base + 2 * oy * W);
            continue;
        }
        for (int oy = 0; oy < OH; oy++) {
            for (int ox = 0; ox < OW; ox++) {
                int i0 = oy * S * W + ox * S;
                float m = x[i0];
                int im = i0;
                for (int ky = 0; ky < K; ky++)
                    for (int kx = 0; kx < K; kx++) {
                        int i = i0 + ky * W + kx;
                        float v = x[i];
                        if (v > m || v != v) {
                            m = v;
                            im = i;
                        }
                    }
                y[(size_t)oy * OW + ox] = m;
                am[(size_t)oy * OW + ox] = base + im;
            }
        }
    }
}

void dt_maxpool2d_backward(float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W, int K,
                           int S) {
    if (!din) return; /* nothing to propagate (first layer) */
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const size_t planes = (size_t)B * C, HW = (size_t)H * W;
    if (OH <= 0 || OW <= 0) {
        memset(din, 0, planes * HW * sizeof(float));
        return;
    }
    const size_t OHW = (size_t)OH * OW;
    if (K == 2 && S == 2 && H == 2 * OH && W == 2 * OW) {
        /* the windows tile the input: write every din value once, no clearing pass */
        for (size_t pl = 0; pl < planes; pl++)
            for (int oy = 0; oy < OH; oy++) {
                size_t o = pl * OHW + (size_t)oy * OW;
                unpool2_row(din + pl * HW + (size_t)(2 * oy) * W, dout + o, argmax + o, W, OW,
                            (int32_t)(pl * HW + (size_t)(2 * oy) * W));
            }
        return;
    }
    /* plane by plane so the cleared plane is still in cache for the scatter */
    for (size_t pl = 0; pl < planes; pl++) {
        memset(din + pl * HW, 0, HW * sizeof(float));
        const float *g = dout + pl * OHW;
        const int32_t *am = argmax + pl * OHW;
        for (size_t i = 0; i < OHW; i++) din[am[i]] += g[i];
    }
}

void dt_avgpool2d_forward(float *out, const float *in, int B, int C, int H, int W, int K, int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    if (OH <= 0 || OW <= 0) return;
    const size_t planes = (size_t)B * C, HW = (size_t)H * W, OHW = (size_t)OH * OW;
    const float scale = 1.0f / (float)(K * K);
    for (size_t pl = 0; pl < planes; pl++) {
        const float *restrict x = in + pl * HW;
        float *restrict y = out + pl * OHW;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                const float *win = x + (size_t)oy * S * W + (size_t)ox * S;
                float s = 0.0f;
                for (int ky = 0; ky < K; ky++)
                    for (int kx = 0; kx < K; kx++) s += win[(size_t)ky * W + kx];
                y[(size_t)oy * OW + ox] = s * scale;
            }
    }
}

void dt_avgpool2d_backward(float *din, const float *dout, int B, int C, int H, int W, int K, int S) {
    if (!din) return; /* nothing to propagate (first layer) */
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const size_t planes = (size_t)B * C, HW = (size_t)H * W, OHW = (size_t)OH * OW;
    memset(din, 0, planes * HW * sizeof(float));
    if (OH <= 0 || OW <= 0) return;
    const float scale = 1.0f / (float)(K * K);
    for (size_t pl = 0; pl < planes; pl++) {
        float *restrict x = din + pl * HW;
        const float *restrict y = dout + pl * OHW;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                float *win = x + (size_t)oy * S * W + (size_t)ox * S;
                const float g = y[(size_t)oy * OW + ox] * scale;
                for (int ky = 0; ky < K; ky++)
                    for (int kx = 0; kx < K; kx++) win[(size_t)ky * W + kx] += g;
            }
    }
}
