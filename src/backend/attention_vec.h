/* Template of the fused causal attention (cpu_attention_vec.c includes it once per vector width).
 * Before including, define AV_VL (lanes: 8 or 16), AV_TARGET (a GCC target string) and AV_SUFFIX
 * (a name suffix: avx2, avx512). It defines dt_attention_forward_<suffix> and
 * dt_attention_backward_<suffix>, declared in backend/attention.h.
 *
 * Per (batch, head) k (forward) or v (backward) is transposed into the workspace; q, k, v, dout
 * and the kept probabilities are read in place (zero-padded copies only where the head size is
 * not a whole number of vectors). Every product is then one micro-kernel: 8 output rows x 1-2
 * vectors of columns (AVX-512) or 6 x 1-2 (AVX2), an FMA of a broadcast scalar with a vector per
 * step. Blocks above the diagonal are skipped (the causal half), the scale, mask and softmax run
 * on a block of score rows while they are in L1, and the exp is a polynomial
 * (Cephes' expf, ~1 ulp) with no libm call. The order of every sum is fixed: runs are bitwise
 * reproducible. */

#include "backend/vecmath.h"

/* Rows per block: 8 where there are 32 vector registers, else 6 (AVX2's 16: 12 accumulators, 2
 * vectors of b, a broadcast). */
#if AV_VL == 16
#define AV_R 8
#else
#define AV_R 6
#endif
#define AV_NCMAX 2

/* acc[r][c] = sum_{k<K} a_r[k*ak] * b[k*ldb + c*AV_VL] for AV_R rows r (a_r = a[r]), NC vectors c. */
#define AV_MICRO(NC)                                                                                               \
    AV_FN void AV(micro##NC)(vf acc[AV_R][AV_NCMAX], int K, const float *const a[AV_R], size_t ak, const float *b, \
                             size_t ldb) {                                                                         \
        vf c[AV_R][NC];                                                                                            \
        _Pragma("GCC unroll 16") for (int i = 0; i < AV_R * NC; i++) c[i / NC][i % NC] = (vf){0};                  \
        for (int k = 0; k < K; k++) {                                                                              \
            const float *bk = b + (size_t)k * ldb;                                                                 \
            const size_t o = (size_t)k * ak;                                                                       \
            vf bv[NC];                                                                                             \
            _Pragma("GCC unroll 4") for (int j = 0; j < NC; j++) bv[j] = AV_LOAD(bk + j * AV_VL);                  \
            _Pragma("GCC unroll 8") for (int r = 0; r < AV_R; r++) {                                               \
                const vf av = AV_SET1(a[r][o]);                                                                    \
                _Pragma("GCC unroll 4") for (int j = 0; j < NC; j++) c[r][j] = AV_FMA(av, bv[j], c[r][j]);         \
            }                                                                                                      \
        }                                                                                                          \
        _Pragma("GCC unroll 16") for (int i = 0; i < AV_R * NC; i++) acc[i / NC][i % NC] = c[i / NC][i % NC];      \
    }
AV_MICRO(1)
AV_MICRO(2)
#undef AV_MICRO

/* out rows (AV_R x n, row stride ldo; rows < nrows stored) = A (AV_R x K) B (K x n). A's element
 * (r, k) is a[r*ar + k*ak]; rows past nrows read row nrows - 1 instead (so nothing past A's end
 * is read); B's rows (ldb floats apart) are read in whole vectors, up to n rounded up. */
AV_FN void AV(gemm)(float *out, size_t ldo, int nrows, int n, int K, const float *a, size_t ar, size_t ak,
                    const float *b, size_t ldb) {
    const float *rows[AV_R];
    for (int r = 0; r < AV_R; r++) rows[r] = a + (size_t)(r < nrows ? r : nrows - 1) * ar;
    vf acc[AV_R][AV_NCMAX];
    for (int c = 0; c < n; c += AV_NCMAX * AV_VL) {
        const int left = (n - c + AV_VL - 1) / AV_VL, nv = left < AV_NCMAX ? left : AV_NCMAX;
        switch (nv) {
        case 1: AV(micro1)(acc, K, rows, ak, b + c, ldb); break;
        default: AV(micro2)(acc, K, rows, ak, b + c, ldb); break;
        }
        for (int r = 0; r < nrows; r++)
            for (int j = 0; j < nv; j++) AV(store_n)(out + r * ldo + c + j * AV_VL, acc[r][j], n - c - j * AV_VL);
    }
}

#define AV_UP(x, m) (((x) + (m)-1) / (m) * (m))

/* dst (rows x ldd, zero padded) = scale * src (n x cols, row stride lds), n <= rows, cols <= ldd. */
static void AV(pack_rows)(float *dst, int rows, int ldd, const float *src, size_t lds, int n, int cols, float scale) {
    for (int t = 0; t < rows; t++) {
        float *d = dst + (size_t)t * ldd;
        int j = 0;
        if (t < n)
            for (; j < cols; j++) d[j] = src[(size_t)t * lds + j] * scale;
        for (; j < ldd; j++) d[j] = 0.0f;
    }
}

/* Stage b of an in-register transpose of AV_VL rows: rows x = v[i], y = v[i | m] (m = 2^b, bit b
 * of i clear) swap bit b of the row index with bit b of the column index; after every stage the
 * rows are the columns. Each stage is AV_VL two-vector shuffles, instead of AV_VL^2 strided
 * scalar loads (they were 16 % of the attention's time). */
#define AV_TX(c, m) ((c) & (m) ? AV_VL + ((c) ^ (m)) : (c))
#define AV_TY(c, m) ((c) & (m) ? AV_VL + (c) : ((c) ^ (m)))
/* __builtin_shufflevector (GCC >= 12 and clang; the fuzz build uses clang) takes the lane
 * indices as constants, so the mask is an argument list. */
#if AV_VL == 16
#define AV_TMASK(F, m)                                                                                            \
    F(0, m), F(1, m), F(2, m), F(3, m), F(4, m), F(5, m), F(6, m), F(7, m), F(8, m), F(9, m), F(10, m), F(11, m), \
        F(12, m), F(13, m), F(14, m), F(15, m)
#else
#define AV_TMASK(F, m) F(0, m), F(1, m), F(2, m), F(3, m), F(4, m), F(5, m), F(6, m), F(7, m)
#endif
#define AV_TSTAGE(v, m)                                                     \
    for (int i = 0; i < AV_VL; i++)                                         \
        if (!(i & (m))) {                                                   \
            const vf x = v[i], y = v[i | (m)];                              \
            v[i] = __builtin_shufflevector(x, y, AV_TMASK(AV_TX, m));       \
            v[i | (m)] = __builtin_shufflevector(x, y, AV_TMASK(AV_TY, m)); \
        }

/* dst[c * ldd + r] = src[r * lds + c] for an AV_VL x AV_VL block. */
AV_FN void AV(transpose_block)(float *dst, size_t ldd, const float *src, size_t lds) {
    vf v[AV_VL];
    for (int i = 0; i < AV_VL; i++) v[i] = AV_LOAD(src + (size_t)i * lds);
    AV_TSTAGE(v, 1)
    AV_TSTAGE(v, 2)
    AV_TSTAGE(v, 4)
#if AV_VL == 16
    AV_TSTAGE(v, 8)
#endif
    for (int i = 0; i < AV_VL; i++) AV_STORE(dst + (size_t)i * ldd, v[i]);
}
#undef AV_TSTAGE
#undef AV_TMASK
#undef AV_TY
#undef AV_TX

/* dst (cols x ldd, zero padded past n) = src^T, src (n x cols, row stride lds): whole blocks in
 * registers, the edges value by value. */
AV_FN void AV(pack_cols)(float *dst, int ldd, const float *src, size_t lds, int n, int cols) {
    const int nb = n / AV_VL * AV_VL, cb = cols / AV_VL * AV_VL;
    for (int j = 0; j < nb; j += AV_VL)
        for (int d = 0; d < cb; d += AV_VL)
            AV(transpose_block)(dst + (size_t)d * ldd + j, (size_t)ldd, src + (size_t)j * lds + d, lds);
    for (int d = 0; d < cols; d++) {
        float *o = dst + (size_t)d * ldd;
        for (int j = d < cb ? nb : 0; j < n; j++) o[j] = src[(size_t)j * lds + d];
        for (int j = n; j < ldd; j++) o[j] = 0.0f;
    }
}

/* Causal softmax of score row t in place (Tp floats): softmax of scale * s over lanes j <= t,
 * zeros up to Tp. */
AV_FN void AV(softmax_row)(float *row, int t, int Tp, float scale) {
    const int nc = t / AV_VL + 1;
    vi lane;
    for (int i = 0; i < AV_VL; i++) lane[i] = i;
    const vi tv = (vi){0} + t;
    const vf sc = AV_SET1(scale);
    vf mx = AV_SET1(-INFINITY);
    for (int c = 0; c < nc; c++) {
        const vi keep = lane + c * AV_VL <= tv;
        const vf s = (vf)(((vi)(AV_LOAD(row + c * AV_VL) * sc) & keep) | ((vi)AV_SET1(-INFINITY) & ~keep));
        mx = AV_MAX(mx, s);
    }
    const vf m = AV_SET1(AV(hmax)(mx));
    vf sum = {0};
    for (int c = 0; c < nc; c++) {
        const vi keep = lane + c * AV_VL <= tv;
        const vf e = (vf)((vi)AV(exp)(AV_LOAD(row + c * AV_VL) * sc - m) & keep);
        AV_STORE(row + c * AV_VL, e);
        sum += e;
    }
    const vf inv = AV_SET1(1.0f / AV(hsum)(sum));
    for (int c = 0; c < nc; c++) AV_STORE(row + c * AV_VL, AV_LOAD(row + c * AV_VL) * inv);
    for (int j = nc * AV_VL; j < Tp; j++) row[j] = 0.0f;
}

/* A head's (T x hs) block of rows ld floats apart, for reading in whole vectors: itself where hs
 * is a whole number of vectors, else a zero-padded copy in pad (T x hsp). Sets *ldo. */
static const float *AV(rows_of)(float *pad, const float *x, size_t ld, int T, int hs, int hsp, size_t *ldo) {
    if (hs == hsp) return *ldo = ld, x;
    AV(pack_rows)(pad, T, hsp, x, ld, T, hs, 1.0f);
    return *ldo = (size_t)hsp, pad;
}

__attribute__((target(AV_TARGET))) void AV(dt_attention_forward)(float *out, float *att, float *work, const float *qkv,
                                                                 int B, int T, int C, int NH) {
    const int hs = C / NH, ld = 3 * C, Tp = AV_UP(T, AV_VL), hsp = AV_UP(hs, AV_VL);
    const float scale = 1.0f / sqrtf((float)hs);
    float *Kt = work, *Vp = Kt + (size_t)hs * Tp, *S = Vp + (size_t)T * hsp;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs, *k = q + C;
            float *P = att + ((size_t)b * NH + h) * T * T, *o = out + (size_t)b * T * C + (size_t)h * hs;
            size_t ldv;
            const float *v = AV(rows_of)(Vp, q + 2 * C, ld, T, hs, hsp, &ldv);
            AV(pack_cols)(Kt, Tp, k, ld, T, hs);
            for (int t0 = 0; t0 < T; t0 += AV_R) {
                const int rows = T - t0 < AV_R ? T - t0 : AV_R;
                /* scores of rows t0.. left of the diagonal's vector, their softmax, then out = P v */
                AV(gemm)(S, Tp, rows, AV_UP(t0 + rows, AV_VL), hs, q + (size_t)t0 * ld, ld, 1, Kt, Tp);
                for (int r = 0; r < rows; r++) {
                    AV(softmax_row)(S + (size_t)r * Tp, t0 + r, Tp, scale);
                    memcpy(P + (size_t)(t0 + r) * T, S + (size_t)r * Tp, (size_t)T * sizeof(float));
                }
                AV(gemm)(o + (size_t)t0 * C, (size_t)C, rows, hs, t0 + rows, S, Tp, 1, v, ldv);
            }
        }
}

__attribute__((target(AV_TARGET))) void AV(dt_attention_backward)(float *dqkv, float *work, const float *dout,
                                                                  const float *qkv, const float *att, int B, int T,
                                                                  int C, int NH) {
    const int hs = C / NH, ld = 3 * C, Tp = AV_UP(T, AV_VL), hsp = AV_UP(hs, AV_VL);
    const float scale = 1.0f / sqrtf((float)hs);
    float *Vt = work, *dS = Vt + (size_t)hs * Tp, *pad = dS + (size_t)T * Tp;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t row0 = (size_t)b * T * ld + (size_t)h * hs;
            const float *q = qkv + row0;
            float *dq = dqkv + row0, *dk = dq + C, *dv = dq + 2 * C;
            const float *P = att + ((size_t)b * NH + h) * T * T;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
            size_t ldk, ldq, ldo;
            const float *kr = AV(rows_of)(pad, q + C, ld, T, hs, hsp, &ldk);
            const float *qr = AV(rows_of)(pad + (size_t)T * hsp, q, ld, T, hs, hsp, &ldq);
            const float *dOr = AV(rows_of)(pad + (size_t)2 * T * hsp, dO, C, T, hs, hsp, &ldo);
            AV(pack_cols)(Vt, Tp, q + 2 * C, ld, T, hs);
            /* dS rows = P * (dP - sum_j P dP) * scale, dP = dO v^T left of the diagonal's vector */
            for (int t0 = 0; t0 < T; t0 += AV_R) {
                const int rows = T - t0 < AV_R ? T - t0 : AV_R;
                float *S = dS + (size_t)t0 * Tp;
                AV(gemm)(S, Tp, rows, AV_UP(t0 + rows, AV_VL), hs, dO + (size_t)t0 * C, C, 1, Vt, Tp);
                for (int r = 0; r < rows; r++) {
                    const int t = t0 + r, nc = t / AV_VL + 1;
                    float *d = S + (size_t)r * Tp;
                    const float *p = P + (size_t)t * T;
                    vf acc = {0};
                    for (int c = 0; c < nc; c++)
                        acc = AV_FMA(AV(load_n)(p + c * AV_VL, T - c * AV_VL), AV_LOAD(d + c * AV_VL), acc);
                    const vf dot = AV_SET1(AV(hsum)(acc)), sc = AV_SET1(scale);
                    for (int c = 0; c < nc; c++)
                        AV_STORE(d + c * AV_VL,
                                 AV(load_n)(p + c * AV_VL, T - c * AV_VL) * (AV_LOAD(d + c * AV_VL) - dot) * sc);
                    for (int j = nc * AV_VL; j < Tp; j++) d[j] = 0.0f;
                }
            }
            for (int t0 = 0; t0 < T; t0 += AV_R) {
                const int rows = T - t0 < AV_R ? T - t0 : AV_R;
                /* dq rows t0.. = dS rows (nonzero up to column t0 + rows) times k */
                AV(gemm)(dq + (size_t)t0 * ld, (size_t)ld, rows, hs, t0 + rows, dS + (size_t)t0 * Tp, Tp, 1, kr, ldk);
                /* dk rows t0.. = columns t0.. of dS (nonzero from row t0) times q; dv likewise P^T dO */
                AV(gemm)
                (dk + (size_t)t0 * ld, (size_t)ld, rows, hs, T - t0, dS + (size_t)t0 * Tp + t0, 1, Tp,
                 qr + (size_t)t0 * ldq, ldq);
                AV(gemm)
                (dv + (size_t)t0 * ld, (size_t)ld, rows, hs, T - t0, P + (size_t)t0 * T + t0, 1, T,
                 dOr + (size_t)t0 * ldo, ldo);
            }
        }
}

#undef AV_UP
#undef AV_R
#undef AV_NCMAX
#include "backend/vecmath_end.h"
