/* bf16 packing of a GEMM's B operand into oneDNN's VNNI layout BA16a{nb}b2a (from f32, rounded,
 * or from bf16 values), done here instead of by oneDNN reorders. oneDNN 2.6's generic reorder
 * (jit:uni) converts f32 to that layout far slower than a plain f32 -> bf16 cast (docs/why.md,
 * "VNNI packing"), and the GPT's linear layers pack an activation or a weight for every GEMM. With
 * AVX512-BF16, two rows are rounded in one vcvtne2ps2bf16 and interleaved in one vpermw. Only
 * used where the CPU has AVX512-BF16 and oneDNN chose one of these layouts (dt_dnnl_vnni_block);
 * elsewhere oneDNN's reorder runs as before. The rounding is the same: to nearest even. */
#include "backend/backend.h"

#if DT_HAVE_DNNL
#include <immintrin.h>
#include <string.h>

#include "backend/onednn.h"

bool dt_dnnl_cast_fast(void) { return dt_cast_bf16_native(); }

int dt_dnnl_vnni_block(const dnnl_memory_desc_t *md, int64_t K, int64_t N) {
    if (!dt_dnnl_cast_fast()) return 0;
    static const dnnl_format_tag_t tags[4] = {dnnl_BA16a16b2a, dnnl_BA16a32b2a, dnnl_BA16a48b2a, dnnl_BA16a64b2a};
    const dnnl_dims_t d = {K, N};
    for (int i = 0; i < 4; i++) {
        dnnl_memory_desc_t t;
        if (dnnl_memory_desc_init_by_tag(&t, 2, d, dnnl_bf16, tags[i]) == dnnl_success &&
            dnnl_memory_desc_equal(&t, md))
            return 16 * (i + 1);
    }
    return 0;
}

int dt_dnnl_vnni_padded_k(const dnnl_memory_desc_t *md) { return (int)md->padded_dims[0]; }

/* Rows ka and kb's 16 values from column n: f32 rounded (to nearest even), or bf16 as they are;
 * zeros past K (ka, kb) and past the mask's columns. Row ka's values are in the low half. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), always_inline)) static inline __m512i row_pair(
    const void *src, bool bf16, int64_t ld, int K, int ka, int kb, int64_t n, __mmask16 m) {
    if (bf16) {
        const uint16_t *s = src;
        const __m256i a = ka < K ? _mm256_maskz_loadu_epi16(m, s + ka * ld + n) : _mm256_setzero_si256();
        const __m256i b = kb < K ? _mm256_maskz_loadu_epi16(m, s + kb * ld + n) : _mm256_setzero_si256();
        return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    }
    const float *s = src;
    const __m512 a = ka < K ? _mm512_maskz_loadu_ps(m, s + ka * ld + n) : _mm512_setzero_ps();
    const __m512 b = kb < K ? _mm512_maskz_loadu_ps(m, s + kb * ld + n) : _mm512_setzero_ps();
    return (__m512i)_mm512_cvtne2ps_pbh(b, a); /* a's 16 values, then b's */
}

/* One 16 x nb block of a row-major src (f32, or bf16 values: a value the graph stores bf16,
 * nn/graph_layout.c): rows k0.. (pairs interleaved) of columns n0..n0+nb, zeros past K and N. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void pack_block(uint16_t *dst, const void *src,
                                                                                       bool bf16, int64_t ld, int K,
                                                                                       int N, int k0, int n0, int nb) {
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int kp = 0; kp < 8; kp++) {
        const int ka = k0 + 2 * kp;
        for (int n = 0; n < nb; n += 16) {
            const int left = N - n0 - n;
            const __mmask16 m = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            const __m512i r = row_pair(src, bf16, ld, K, ka, ka + 1, n0 + n, m);
            _mm512_storeu_si512(dst + ((size_t)kp * nb + n) * 2, _mm512_permutexvar_epi16(inter, r));
        }
    }
}

/* Columns n .. n + 15 of the same block from a column-major B (element (k, n) at src[n * ld + k],
 * a linear layer's weight as the forward's w^T): each column's 16 values of the block are 8 pairs already, cast
 * to 8 32-bit words; 16 columns' words (two columns a register, 8 registers) are then transposed
 * in registers into the block's 8 pair rows of those 16 columns: an 8 x 8 transpose of words in
 * each 256-bit half (unpacks of 32 and 64 bits, then 128-bit lanes picked across two registers). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void pack_block_t(uint16_t *dst,
                                                                                         const float *src, int64_t ld,
                                                                                         int K, int N, int k0, int n0,
                                                                                         int n, int nb) {
    const int left = K - k0;
    const __mmask16 m = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    __m512i z[8], a[8], b[8];
    for (int j = 0; j < 8; j++) { /* z[j]: column n + j's 8 words, then column n + j + 8's */
        const int ca = n0 + n + j, cb = ca + 8;
        const __m512 va = ca < N ? _mm512_maskz_loadu_ps(m, src + (int64_t)ca * ld + k0) : _mm512_setzero_ps();
        const __m512 vb = cb < N ? _mm512_maskz_loadu_ps(m, src + (int64_t)cb * ld + k0) : _mm512_setzero_ps();
        z[j] = _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(va)),
                                  (__m256i)_mm512_cvtneps_pbh(vb), 1);
    }
    for (int j = 0; j < 8; j += 2)
        a[j] = _mm512_unpacklo_epi32(z[j], z[j + 1]), a[j + 1] = _mm512_unpackhi_epi32(z[j], z[j + 1]);
    for (int j = 0; j < 8; j += 4) { /* b[j + q], 128-bit lane L: word 4L + q of columns j..j+3 */
        b[j] = _mm512_unpacklo_epi64(a[j], a[j + 2]), b[j + 1] = _mm512_unpackhi_epi64(a[j], a[j + 2]);
        b[j + 2] = _mm512_unpacklo_epi64(a[j + 1], a[j + 3]), b[j + 3] = _mm512_unpackhi_epi64(a[j + 1], a[j + 3]);
    }
    for (int q = 0; q < 4; q++) { /* pair rows q (lanes 0, 2) and q + 4 (lanes 1, 3) */
        _mm512_storeu_si512(dst + ((size_t)q * nb + n) * 2, _mm512_permutex2var_epi64(b[q], lo, b[q + 4]));
        _mm512_storeu_si512(dst + ((size_t)(q + 4) * nb + n) * 2, _mm512_permutex2var_epi64(b[q], hi, b[q + 4]));
    }
}

/* Row-major sources are read a block row at a time (whole rows: faster than column strips at the
 * GPT's and the CNN's shapes), column-major ones 16 columns at a time, read down as they lie (16
 * streams for the prefetchers instead of a block column's nb; docs/why.md, "VNNI packing"). */
void dt_dnnl_vnni_pack(void *dst, const void *src, dt_vnni_src kind, int K, int N, int64_t ld, int nb, int Kp) {
    const int KB = Kp / 16, NB = (N + nb - 1) / nb;
    uint16_t *d = dst;
    const size_t blk = (size_t)16 * nb;
    if (kind == DT_VNNI_F32_COLS) {
        for (int j = 0; j < NB; j++)
            for (int n = 0; n < nb; n += 16)
                for (int i = 0; i < KB; i++)
                    pack_block_t(d + ((size_t)j * KB + i) * blk, src, ld, K, N, 16 * i, nb * j, n, nb);
        return;
    }
    const bool bf16 = kind == DT_VNNI_BF16_ROWS;
    for (int i = 0; i < KB; i++)
        for (int j = 0; j < NB; j++)
            pack_block(d + ((size_t)j * KB + i) * blk, src, bf16, ld, K, N, 16 * i, nb * j, nb);
}

#endif
