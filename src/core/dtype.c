/* dtypes: sizes, safetensors names, and f32 <-> bf16/f16 conversion (round to nearest even). */
#include "dtrain/core.h"

#include <math.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

static const struct {
    const char *name;
    size_t size;
} g_dtypes[DT_DTYPE_COUNT] = {
    [DT_F32] = {"F32", 4}, [DT_F64] = {"F64", 8}, [DT_BF16] = {"BF16", 2}, [DT_F16] = {"F16", 2}, [DT_I32] = {"I32", 4},
    [DT_I64] = {"I64", 8}, [DT_U8] = {"U8", 1},   [DT_I8] = {"I8", 1},     [DT_I16] = {"I16", 2},
};

size_t dt_dtype_size(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? g_dtypes[t].size : 0; }

const char *dt_dtype_name(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? g_dtypes[t].name : "?"; }

dt_status dt_dtype_parse(const char *name, dt_dtype *out) {
    for (int i = 0; i < DT_DTYPE_COUNT; i++)
        if (strcmp(name, g_dtypes[i].name) == 0) {
            *out = (dt_dtype)i;
            return DT_OK;
        }
    return dt_error(DT_EINVAL, "unknown dtype '%s' (expected F32, F64, BF16, F16, I32, I64, U8, I8, I16)", name);
}

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t dt_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dt_bf16_to_f32(uint16_t x) { return bits_f32((uint32_t)x << 16); }

uint16_t dt_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (a < 0x38800000u) {                                   /* subnormal or zero */
        /* value * 2^24 rounded to nearest even gives the subnormal mantissa */
        float f = bits_f32(a) * 16777216.0f;
        uint32_t m = (uint32_t)lrintf(f);
        return (uint16_t)(sign | m);
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (a >> 13));
}

float dt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float f = (float)mant * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

static double load_f64(const void *p, dt_dtype t, size_t i) {
    switch (t) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return ((const double *)p)[i];
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    case DT_F16: return dt_f16_to_f32(((const uint16_t *)p)[i]);
    case DT_I32: return ((const int32_t *)p)[i];
    case DT_I64: return (double)((const int64_t *)p)[i];
    case DT_U8: return ((const uint8_t *)p)[i];
    case DT_I8: return ((const int8_t *)p)[i];
    case DT_I16: return ((const int16_t *)p)[i];
    default: return 0;
    }
}

static void store_f64(void *p, dt_dtype t, size_t i, double v) {
    switch (t) {
    case DT_F32: ((float *)p)[i] = (float)v; break;
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_BF16: ((uint16_t *)p)[i] = dt_f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t *)p)[i] = dt_f32_to_f16((float)v); break;
    case DT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DT_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case DT_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case DT_I16: ((int16_t *)p)[i] = (int16_t)v; break;
    default: break;
    }
}

/* Vector forms of the four f32 <-> bf16/f16 array conversions (--compress fp16/bf16 each step,
 * bf16 values around convolutions, checkpoints): each converts a prefix of the array (whole
 * vectors) and returns its length; the scalar loops below do the rest. They give the scalar
 * functions' bits: bf16 by the same integer steps; f16 by the CPU's converts (round to nearest
 * even, like lrintf in the default mode), except that a vector holding a NaN is left to the
 * scalar code, which writes the one quiet NaN where the CPU would keep the payload. */
#ifdef __AVX512F__
static size_t f32_to_bf16_vec(uint16_t *d, const float *s, size_t n) {
    const __m512i lsb = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40),
                  abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_loadu_si512(s + i);
        const __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(_mm512_add_epi32(u, half), _mm512_and_si512(_mm512_srli_epi32(u, 16), lsb)), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
        const __m512i h = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
        _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtepi32_epi16(h));
    }
    return i;
}

static size_t bf16_to_f32_vec(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_si512(d + i,
                            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i))), 16));
    return i;
}

static size_t f32_to_f16_vec(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(s + i);
        if (_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q)) break;
        _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    return i;
}

static size_t f16_to_f32_vec(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i)));
        if (_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q)) break;
        _mm512_storeu_ps(d + i, x);
    }
    return i;
}
#else
static size_t f32_to_bf16_vec(uint16_t *d, const float *s, size_t n) { return (void)d, (void)s, (void)n, 0; }
static size_t bf16_to_f32_vec(float *d, const uint16_t *s, size_t n) { return (void)d, (void)s, (void)n, 0; }
#ifdef __F16C__
static size_t f32_to_f16_vec(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(s + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) break;
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    return i;
}

static size_t f16_to_f32_vec(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)));
        if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) break;
        _mm256_storeu_ps(d + i, x);
    }
    return i;
}
#else
static size_t f32_to_f16_vec(uint16_t *d, const float *s, size_t n) { return (void)d, (void)s, (void)n, 0; }
static size_t f16_to_f32_vec(float *d, const uint16_t *s, size_t n) { return (void)d, (void)s, (void)n, 0; }
#endif
#endif

/* dst (n values of type dt) = src (type st); the f32 <-> bf16/f16 cases run the vector forms up
 * to a vector holding a NaN (f16), then the scalar functions from there on. */
void dt_convert(void *dst, dt_dtype dt, const void *src, dt_dtype st, size_t n) {
    if (dt == st) {
        memcpy(dst, src, n * dt_dtype_size(dt));
        return;
    }
    uint16_t *h = dst;
    float *f = dst;
    const uint16_t *hs = src;
    const float *fs = src;
    /* fast paths for the training hot spots */
    if (st == DT_F32 && dt == DT_BF16) {
        for (size_t i = f32_to_bf16_vec(h, fs, n); i < n; i++) h[i] = dt_f32_to_bf16(fs[i]);
    } else if (st == DT_BF16 && dt == DT_F32) {
        for (size_t i = bf16_to_f32_vec(f, hs, n); i < n; i++) f[i] = dt_bf16_to_f32(hs[i]);
    } else if (st == DT_F32 && dt == DT_F16) {
        for (size_t i = f32_to_f16_vec(h, fs, n); i < n; i++) h[i] = dt_f32_to_f16(fs[i]);
    } else if (st == DT_F16 && dt == DT_F32) {
        for (size_t i = f16_to_f32_vec(f, hs, n); i < n; i++) f[i] = dt_f16_to_f32(hs[i]);
    } else if (st == DT_U8 && dt == DT_F32) {
        for (size_t i = 0; i < n; i++) f[i] = ((const uint8_t *)src)[i];
    } else {
        for (size_t i = 0; i < n; i++) store_f64(dst, dt, i, load_f64(src, st, i));
    }
}
