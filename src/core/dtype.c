/* dtypes: sizes, safetensors names, and f32 <-> bf16/f16 conversion (round to nearest even). */
#include "dtrain/core.h"

#include <math.h>
#include <string.h>

static const struct { const char *name; size_t size; } g_dtypes[DT_DTYPE_COUNT] = {
    [DT_F32] = {"F32", 4}, [DT_F64] = {"F64", 8}, [DT_BF16] = {"BF16", 2}, [DT_F16] = {"F16", 2},
    [DT_I32] = {"I32", 4}, [DT_I64] = {"I64", 8}, [DT_U8] = {"U8", 1},     [DT_I8] = {"I8", 1},
    [DT_I16] = {"I16", 2},
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

static inline uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

uint16_t dt_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dt_bf16_to_f32(uint16_t x) { return bits_f32((uint32_t)x << 16); }

uint16_t dt_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* overflow -> inf */
    if (a < 0x38800000u) {                                           /* subnormal or zero */
        /* value * 2^24 rounded to nearest even gives the subnormal mantissa */
        float f = bits_f32(a) * 16777216.0f;
        uint32_t m = (uint32_t)lrintf(f);
        return (uint16_t)(sign | m);
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xc8000fffu + mant_odd;  /* rebias exponent (-112 << 23) and round */
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

void dt_convert(void *dst, dt_dtype dt, const void *src, dt_dtype st, size_t n) {
    if (dt == st) {
        memcpy(dst, src, n * dt_dtype_size(dt));
        return;
    }
    /* fast paths for the training hot spots */
    if (st == DT_F32 && dt == DT_BF16) {
        for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = dt_f32_to_bf16(((const float *)src)[i]);
    } else if (st == DT_BF16 && dt == DT_F32) {
        for (size_t i = 0; i < n; i++) ((float *)dst)[i] = dt_bf16_to_f32(((const uint16_t *)src)[i]);
    } else if (st == DT_F32 && dt == DT_F16) {
        for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = dt_f32_to_f16(((const float *)src)[i]);
    } else if (st == DT_F16 && dt == DT_F32) {
        for (size_t i = 0; i < n; i++) ((float *)dst)[i] = dt_f16_to_f32(((const uint16_t *)src)[i]);
    } else if (st == DT_U8 && dt == DT_F32) {
        for (size_t i = 0; i < n; i++) ((float *)dst)[i] = ((const uint8_t *)src)[i];
    } else {
        for (size_t i = 0; i < n; i++) store_f64(dst, dt, i, load_f64(src, st, i));
    }
}
