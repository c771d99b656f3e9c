/* Template of the small vector toolkit of the fused CPU kernels (attention_vec.h, cpu_gelu_vec.c),
 * for one vector width. Before including, define AV_VL (lanes: 8 or 16), AV_TARGET (a GCC target
 * string: "avx512f" or "avx2,fma") and AV_SUFFIX (a name suffix); include vecmath_end.h after
 * the code that uses it. GCC vector types carry the arithmetic; FMA, max, broadcasts and
 * horizontal reductions are the target's intrinsics, so every function here and in the code
 * built on it carries the target attribute (AV_FN) and a portable build has it too. Include
 * <immintrin.h>, <stdint.h>, <string.h> first. */

#define AV_CAT2(a, b) a##_##b
#define AV_CAT(a, b) AV_CAT2(a, b)
#define AV(x) AV_CAT(x, AV_SUFFIX)
#define AV_FN static inline __attribute__((target(AV_TARGET), always_inline))

typedef float AV(vf) __attribute__((vector_size(AV_VL * 4)));
typedef int32_t AV(vi) __attribute__((vector_size(AV_VL * 4)));
typedef float AV(vfu) __attribute__((vector_size(AV_VL * 4), aligned(4), may_alias));
typedef uint32_t AV(vu) __attribute__((vector_size(AV_VL * 4)));
typedef uint16_t AV(vh) __attribute__((vector_size(AV_VL * 2)));
typedef uint16_t AV(vhu) __attribute__((vector_size(AV_VL * 2), aligned(2), may_alias));
#define vf AV(vf)
#define vi AV(vi)
#define vfu AV(vfu)
#define vu AV(vu)
#define vh AV(vh)
#define vhu AV(vhu)

#if AV_VL == 16
#define AV_SET1(s) ((vf)_mm512_set1_ps(s))
#define AV_FMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define AV_MAX(a, b) ((vf)_mm512_max_ps((__m512)(a), (__m512)(b)))
#else
#define AV_SET1(s) ((vf)_mm256_set1_ps(s))
#define AV_FMA(a, b, c) ((vf)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define AV_MAX(a, b) ((vf)_mm256_max_ps((__m256)(a), (__m256)(b)))
#endif
#define AV_LOAD(p) (*(const vfu *)(p))
#define AV_STORE(p, v) (*(vfu *)(p) = (v))

/* exp(x) for x <= 0: Cephes' expf on x clamped to >= -87 (the result stays a normal float). */
AV_FN vf AV(exp)(vf x) {
    x = AV_MAX(x, AV_SET1(-87.0f));
    const vf magic = AV_SET1(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    const vf n = AV_FMA(x, AV_SET1(1.44269504088896341f), magic) - magic;
    vf r = AV_FMA(n, AV_SET1(-0.693359375f), x);
    r = AV_FMA(n, AV_SET1(2.12194440e-4f), r);
    vf p = AV_SET1(1.9875691500e-4f);
    p = AV_FMA(p, r, AV_SET1(1.3981999507e-3f));
    p = AV_FMA(p, r, AV_SET1(8.3334519073e-3f));
    p = AV_FMA(p, r, AV_SET1(4.1665795894e-2f));
    p = AV_FMA(p, r, AV_SET1(1.6666665459e-1f));
    p = AV_FMA(p, r, AV_SET1(5.0000001201e-1f));
    p = AV_FMA(p, r * r, r + AV_SET1(1.0f));
    const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)e;
}

/* Horizontal sum and max: a fixed tree of halvings (the same order every run). */
#if AV_VL == 16
AV_FN float AV(hsum)(vf v) { return _mm512_reduce_add_ps((__m512)v); }
AV_FN float AV(hmax)(vf v) { return _mm512_reduce_max_ps((__m512)v); }
#else
AV_FN float AV(hsum)(vf v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}
AV_FN float AV(hmax)(vf v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}
#endif

/* The first n <= AV_VL lanes of v to dst. */
AV_FN void AV(store_n)(float *dst, vf v, int n) {
    if (n <= 0) return;
    if (n >= AV_VL) {
        AV_STORE(dst, v);
        return;
    }
    float t[AV_VL];
    AV_STORE(t, v);
    memcpy(dst, t, (size_t)n * sizeof(float));
}

/* The first n lanes from p, zeros after (n < AV_VL reads only n floats). */
AV_FN vf AV(load_n)(const float *p, int n) {
    if (n >= AV_VL) return AV_LOAD(p);
    float t[AV_VL] = {0};
    memcpy(t, p, (size_t)(n > 0 ? n : 0) * sizeof(float));
    return AV_LOAD(t);
}

/* AV_VL bf16 values from p, widened (exact); the first n of them, zeros after (reads only n). */
AV_FN vf AV(load_bf16)(const uint16_t *p) { return (vf)(__builtin_convertvector(*(const vhu *)p, vu) << 16); }
AV_FN vf AV(load_bf16_n)(const uint16_t *p, int n) {
    if (n >= AV_VL) return AV(load_bf16)(p);
    vh h = {0};
    memcpy(&h, p, (size_t)(n > 0 ? n : 0) * sizeof(uint16_t));
    return (vf)(__builtin_convertvector(h, vu) << 16);
}

/* The first n <= AV_VL lanes of v rounded to bf16 into dst, as dt_cast_bf16 rounds them: with
 * AV_BF16_NATIVE (a section whose AV_TARGET has avx512bf16) one vcvtneps2bf16, which dt_cast_bf16
 * runs where the CPU has it; else to nearest even in integer steps, NaN a quiet NaN (its
 * portable rounding). */
AV_FN void AV(store_bf16_n)(uint16_t *dst, vf v, int n) {
    if (n <= 0) return;
#if defined(AV_BF16_NATIVE)
    const __m256i h = (__m256i)_mm512_cvtneps_pbh((__m512)v);
    if (n >= AV_VL) _mm256_storeu_si256((__m256i *)(void *)dst, h);
    else _mm256_mask_storeu_epi16(dst, (__mmask16)((1u << n) - 1), h);
#else
    const vu u = (vu)v, nan = (vu)((u & 0x7fffffffu) > 0x7f800000u);
    const vu r = ((u | 0x00400000u) & nan) | ((u + 0x7fffu + ((u >> 16) & 1u)) & ~nan);
    const vh h = __builtin_convertvector(r >> 16, vh);
    memcpy(dst, &h, (size_t)(n < AV_VL ? n : AV_VL) * sizeof(uint16_t));
#endif
}
