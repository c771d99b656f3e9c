/* Kernels on blocked activations, oneDNN's nChw16c: (B, C/16, H, W, 16), C a multiple of 16, the
 * layout a oneDNN convolution reads and writes without reorders (backend.h). Max pooling reads
 * a blocked input and writes a blocked or NCHW output (the end of a conv chain); each window
 * step handles 16 channels at once. Ties and NaNs as the NCHW kernel (cpu_pool.c): the first max
 * wins, a NaN replaces the max (the last NaN wins). The reorders convert whole tensors. */
#include "backend/blocked.h"

#include <string.h>

#include "backend/kern.h"

#define BL 16

/* Maxima of one output position over its KxK window, for the 16 channels of block x (H x W x 16
 * values); idx gets their flat indices into the whole input (base: the block's first one). */
static inline void window_max(float *restrict m, int32_t *restrict idx, const float *restrict x, int W, int y0,
                              int x0, int K, int32_t base) {
    for (int c = 0; c < BL; c++) m[c] = x[((size_t)y0 * W + x0) * BL + c], idx[c] = base + (y0 * W + x0) * BL + c;
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            if (!ky && !kx) continue;
            const int32_t at = ((y0 + ky) * W + x0 + kx) * BL;
            const float *restrict v = x + at;
            for (int c = 0; c < BL; c++) {
                const int t = (v[c] > m[c]) | (v[c] != v[c]);
                m[c] = t ? v[c] : m[c];
                idx[c] = t ? base + at + c : idx[c];
            }
        }
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* The same for one 16-channel vector (AVX-512): v > m or v is NaN replaces m. */
static inline void window_max16(float *m_out, int32_t *idx_out, const float *x, int W, int y0, int x0, int K,
                                int32_t base) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t at = (y0 * W + x0) * BL;
    __m512 m = _mm512_loadu_ps(x + at);
    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base + at), lane);
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            if (!ky && !kx) continue;
            at = ((y0 + ky) * W + x0 + kx) * BL;
            __m512 v = _mm512_loadu_ps(x + at);
            __mmask16 t = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            m = _mm512_mask_blend_ps(t, m, v);
            idx = _mm512_mask_blend_epi32(t, idx, _mm512_add_epi32(_mm512_set1_epi32(base + at), lane));
        }
    _mm512_storeu_ps(m_out, m);
    _mm512_storeu_si512(idx_out, idx);
}
#define WINDOW_MAX window_max16
#else
#define WINDOW_MAX window_max
#endif

/* y[j] = m[j * 16], a[j] = idx[j * 16] for j < n: one channel of pooled 16-channel vectors. */
static inline void transpose_lane(float *restrict y, int32_t *restrict a, const float *restrict m,
                                  const int32_t *restrict idx, size_t n) {
    size_t j = 0;
#if defined(__AVX512F__)
    const __m512i stride = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    for (; j + 16 <= n; j += 16) {
        _mm512_storeu_ps(y + j, _mm512_i32gather_ps(stride, m + j * BL, 4));
        _mm512_storeu_si512(a + j, _mm512_i32gather_epi32(stride, idx + j * BL, 4));
    }
#endif
    for (; j < n; j++) y[j] = m[j * BL], a[j] = idx[j * BL];
}

#define CHUNK 256  /* output positions of a block pooled before an NCHW output is written */

void dt_maxpool2d_forward_blocked(float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K,
                                  int S, bool out_bl) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1, CB = C / BL;
    if (OH <= 0 || OW <= 0) return;
    const size_t HW = (size_t)H * W, OHW = (size_t)OH * OW;
    float tm[CHUNK * BL];     /* NCHW output: CHUNK positions of the block, then 16 plane rows */
    int32_t ti[CHUNK * BL];
    for (size_t blk = 0; blk < (size_t)B * CB; blk++) {
        const float *x = in + blk * HW * BL;
        const int32_t base = (int32_t)(blk * HW * BL);
        for (size_t p0 = 0; p0 < OHW; p0 += CHUNK) {
            const size_t np = OHW - p0 < CHUNK ? OHW - p0 : CHUNK;
            float *m = out_bl ? out + (blk * OHW + p0) * BL : tm;
            int32_t *idx = out_bl ? argmax + (blk * OHW + p0) * BL : ti;
            for (size_t j = 0; j < np; j++) {
                const int oy = (int)((p0 + j) / OW), ox = (int)((p0 + j) % OW);
                WINDOW_MAX(m + j * BL, idx + j * BL, x, W, oy * S, ox * S, K, base);
            }
            if (out_bl) continue;
            for (int c = 0; c < BL; c++)  /* plane (n, blk % CB * 16 + c) of the NCHW output */
                transpose_lane(out + (blk * BL + c) * OHW + p0, argmax + (blk * BL + c) * OHW + p0, tm + c, ti + c, np);
        }
    }
}

/* din of one output position whose KxK window no other window overlaps (K == S): each window
 * value gets the gradient where the argmax points, 0 elsewhere. Channel c's gradient and argmax
 * are at g[c * gs], am[c * gs] (gs 1: a blocked output, OH * OW: NCHW). */
#if defined(__AVX512F__)
static inline void unpool_window(float *din, const float *g, const int32_t *am, size_t gs, int W, int y0, int x0, int K,
                                 int32_t base) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 gv;
    __m512i av;
    if (gs == 1) gv = _mm512_loadu_ps(g), av = _mm512_loadu_si512(am);
    else {
        const __m512i at = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)gs));
        gv = _mm512_i32gather_ps(at, g, 4), av = _mm512_i32gather_epi32(at, am, 4);
    }
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            const int32_t at = ((y0 + ky) * W + x0 + kx) * BL;
            const __mmask16 hit = _mm512_cmpeq_epi32_mask(av, _mm512_add_epi32(_mm512_set1_epi32(base + at), lane));
            _mm512_storeu_ps(din + at, _mm512_maskz_mov_ps(hit, gv));
        }
}
#else
static inline void unpool_window(float *restrict din, const float *restrict g, const int32_t *restrict am, size_t gs,
                                 int W, int y0, int x0, int K, int32_t base) {
    float gv[BL];
    int32_t av[BL];
    for (int c = 0; c < BL; c++) gv[c] = g[c * gs], av[c] = am[c * gs];
    for (int ky = 0; ky < K; ky++)
        for (int kx = 0; kx < K; kx++) {
            const int32_t at = ((y0 + ky) * W + x0 + kx) * BL;
            for (int c = 0; c < BL; c++) din[at + c] = av[c] == base + at + c ? gv[c] : 0.0f;
        }
}
#endif

void dt_maxpool2d_backward_blocked(float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W,
                                   int K, int S, bool out_bl) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1, CB = C / BL;
    const bool tiles = K == S && OH * S == H && OW * S == W;  /* every input value in exactly one window */
    const size_t HW = (size_t)H * W, OHW = (size_t)OH * OW;
    if (!tiles || OH <= 0 || OW <= 0) {  /* a scatter: dout and argmax share the output's layout */
        memset(din, 0, (size_t)B * C * HW * sizeof(float));
        for (size_t i = 0; OH > 0 && OW > 0 && i < (size_t)B * C * OHW; i++) din[argmax[i]] += dout[i];
        return;
    }
    float tg[CHUNK * BL];  /* NCHW dout: CHUNK positions of the block's 16 planes, transposed */
    int32_t ta[CHUNK * BL];
    for (size_t blk = 0; blk < (size_t)B * CB; blk++) {
        float *x = din + blk * HW * BL;
        const int32_t base = (int32_t)(blk * HW * BL);
        for (size_t p0 = 0; p0 < OHW; p0 += CHUNK) {
            const size_t np = OHW - p0 < CHUNK ? OHW - p0 : CHUNK;
            const float *g = out_bl ? dout + (blk * OHW + p0) * BL : tg;
            const int32_t *a = out_bl ? argmax + (blk * OHW + p0) * BL : ta;
            if (!out_bl)  /* one pass of plain loads and stores: gathers across 16 planes are slow */
                for (int c = 0; c < BL; c++)
                    for (size_t j = 0; j < np; j++)
                        tg[j * BL + c] = dout[(blk * BL + c) * OHW + p0 + j], ta[j * BL + c] = argmax[(blk * BL + c) * OHW + p0 + j];
            for (size_t j = 0; j < np; j++) {
                const int oy = (int)((p0 + j) / OW), ox = (int)((p0 + j) % OW);
                unpool_window(x, g + j * BL, a + j * BL, 1, W, oy * S, ox * S, K, base);
            }
        }
    }
}

void dt_blocked_from_nchw(float *restrict dst, const float *restrict src, int B, int C, int HW) {
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < HW; p++)
                dst[(((size_t)n * (C / BL) + c / BL) * HW + p) * BL + c % BL] = src[((size_t)n * C + c) * HW + p];
}

void dt_blocked_to_nchw(float *restrict dst, const float *restrict src, int B, int C, int HW) {
    for (int n = 0; n < B; n++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < HW; p++)
                dst[((size_t)n * C + c) * HW + p] = src[(((size_t)n * (C / BL) + c / BL) * HW + p) * BL + c % BL];
}

void dt_blocked_channel_sums(float *restrict acc, const float *restrict x, int B, int C, int HW) {
    for (size_t blk = 0; blk < (size_t)B * (C / BL); blk++) {
        float s[BL] = {0};
        const float *restrict v = x + blk * HW * BL;
        for (int p = 0; p < HW; p++)
            for (int c = 0; c < BL; c++) s[c] += v[(size_t)p * BL + c];
        float *restrict a = acc + blk % (C / BL) * BL;
        for (int c = 0; c < BL; c++) a[c] += s[c];
    }
}
