/* Reduction kernels (see reduce.h). Loops work on fixed blocks of BLK elements so the compiler
 * vectorises them at -O2; bf16/f16 blocks are widened to f32, reduced, and rounded once. */
#include "comm/reduce.h"

#include <string.h>
#if defined(__F16C__) || defined(__AVX__)
#include <immintrin.h>
#endif

#define BLK 64

bool dt_reduce_dtype_ok(dt_dtype t) {
    return t == DT_F32 || t == DT_F64 || t == DT_BF16 || t == DT_F16 || t == DT_I32 || t == DT_I64;
}

/* ---- elementwise operators; integers wrap (computed unsigned) ---- */
#define F_SUM(x, y) ((x) + (y))
#define F_PROD(x, y) ((x) * (y))
#define F_MAX(x, y) ((x) > (y) ? (x) : (y))
#define F_MIN(x, y) ((x) < (y) ? (x) : (y))
#define I32_SUM(x, y) ((int32_t)((uint32_t)(x) + (uint32_t)(y)))
#define I32_PROD(x, y) ((int32_t)((uint32_t)(x) * (uint32_t)(y)))
#define I64_SUM(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define I64_PROD(x, y) ((int64_t)((uint64_t)(x) * (uint64_t)(y)))

/* acc op= in, and the k-input form, for one type and one operator */
#define DEF_OP(NAME, T, OP)                                                  \
    static void into_##NAME(T *restrict a, const T *restrict b, size_t n) {  \
        size_t i = 0;                                                        \
        for (; i + BLK <= n; i += BLK)                                       \
            for (int j = 0; j < BLK; j++) a[i + j] = OP(a[i + j], b[i + j]); \
        for (; i < n; i++) a[i] = OP(a[i], b[i]);                            \
    }

#define DEF_TYPE(S, T, SUM, PROD)                                   \
    DEF_OP(S##_sum, T, SUM)                                         \
    DEF_OP(S##_prod, T, PROD)                                       \
    DEF_OP(S##_max, T, F_MAX)                                       \
    DEF_OP(S##_min, T, F_MIN)                                       \
    static void into_##S(T *a, const T *b, size_t n, dt_redop op) { \
        switch (op) {                                               \
        case DT_OP_SUM:                                             \
        case DT_OP_AVG: into_##S##_sum(a, b, n); break;             \
        case DT_OP_PROD: into_##S##_prod(a, b, n); break;           \
        case DT_OP_MAX: into_##S##_max(a, b, n); break;             \
        case DT_OP_MIN: into_##S##_min(a, b, n); break;             \
        default: break;                                             \
        }                                                           \
    }

DEF_TYPE(f32, float, F_SUM, F_PROD)
DEF_TYPE(f64, double, F_SUM, F_PROD)
DEF_TYPE(i32, int32_t, I32_SUM, I32_PROD)
DEF_TYPE(i64, int64_t, I64_SUM, I64_PROD)

/* ---- half-precision widening/narrowing of one block ---- */
static inline __attribute__((always_inline)) void bf16_load(float *restrict d, const uint16_t *restrict s, int m) {
    for (int j = 0; j < m; j++) {
        uint32_t u = (uint32_t)s[j] << 16;
        memcpy(&d[j], &u, 4);
    }
}

static inline __attribute__((always_inline)) void bf16_store(uint16_t *restrict d, const float *restrict s, int m) {
    for (int j = 0; j < m; j++) {
        uint32_t u;
        memcpy(&u, &s[j], 4);
        uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        d[j] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : r);
    }
}

static inline void f16_load(float *restrict d, const uint16_t *restrict s, int m) {
    int j = 0;
#ifdef __F16C__
    for (; j + 8 <= m; j += 8) _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j))));
#endif
    for (; j < m; j++) d[j] = dt_f16_to_f32(s[j]);
}

static inline void f16_store(uint16_t *restrict d, const float *restrict s, int m) {
    int j = 0;
#ifdef __F16C__
    for (; j + 8 <= m; j += 8)
        _mm_storeu_si128((__m128i *)(d + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; j < m; j++) d[j] = dt_f32_to_f16(s[j]);
}

/* full blocks take the constant-trip-count path so the bf16 loops vectorise */
static inline void half_load(float *d, const uint16_t *s, int m, dt_dtype t) {
    if (t == DT_BF16) {
        if (m == BLK) bf16_load(d, s, BLK);
        else bf16_load(d, s, m);
    } else f16_load(d, s, m);
}

static inline void half_store(uint16_t *d, const float *s, int m, dt_dtype t) {
    if (t == DT_BF16) {
        if (m == BLK) bf16_store(d, s, BLK);
        else bf16_store(d, s, m);
    } else f16_store(d, s, m);
}

static void into_half(uint16_t *a, const uint16_t *b, size_t n, dt_dtype t, dt_redop op) {
    float fa[BLK], fb[BLK];
    for (size_t i = 0; i < n; i += BLK) {
        int m = n - i < BLK ? (int)(n - i) : BLK;
        half_load(fa, a + i, m, t);
        half_load(fb, b + i, m, t);
        into_f32(fa, fb, (size_t)m, op);
        half_store(a + i, fa, m, t);
    }
}

void dt_reduce_into(void *acc, const void *in, size_t n, dt_dtype t, dt_redop op) {
    switch (t) {
    case DT_F32: into_f32(acc, in, n, op); break;
    case DT_F64: into_f64(acc, in, n, op); break;
    case DT_I32: into_i32(acc, in, n, op); break;
    case DT_I64: into_i64(acc, in, n, op); break;
    case DT_BF16:
    case DT_F16: into_half(acc, in, n, t, op); break;
    default: break;
    }
}

/* ---- non-temporal stores ---- */
static inline void store_blk(void *dst, const void *src, size_t bytes, bool nt) {
#ifdef __AVX__
    if (nt && ((uintptr_t)dst & 31) == 0 && (bytes & 31) == 0) {
        for (size_t j = 0; j < bytes; j += 32)
            _mm256_stream_si256((__m256i *)((char *)dst + j),
                                _mm256_loadu_si256((const __m256i *)((const char *)src + j)));
        return;
    }
#endif
    (void)nt;
    memcpy(dst, src, bytes);
}

void dt_copy_nt(void *dst, const void *src, size_t bytes) {
#ifdef __AVX__
    char *d = dst;
    const char *s = src;
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    if (head > bytes) head = bytes;
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    size_t body = bytes & ~(size_t)127;
    for (size_t j = 0; j < body; j += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + j)), b = _mm256_loadu_si256((const __m256i *)(s + j + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + j + 64)),
                e = _mm256_loadu_si256((const __m256i *)(s + j + 96));
        _mm256_stream_si256((__m256i *)(d + j), a);
        _mm256_stream_si256((__m256i *)(d + j + 32), b);
        _mm256_stream_si256((__m256i *)(d + j + 64), c);
        _mm256_stream_si256((__m256i *)(d + j + 96), e);
    }
    memcpy(d + body, s + body, bytes - body);
#else
    memcpy(dst, src, bytes);
#endif
}

void dt_copy_fence(void) {
#ifdef __AVX__
    _mm_sfence();
#endif
}

/* ---- k inputs: accumulate a block on the stack, then store once (or twice) ---- */
#define DEF_MANY(S, T, DIV)                                                                                        \
    static void many_##S(T *out, T *out2, const void *const *in, int k, size_t n, dt_redop op, int div, bool nt) { \
        T acc[BLK];                                                                                                \
        size_t i = 0;                                                                                              \
        for (; i + BLK <= n; i += BLK) { /* whole blocks: fixed sizes, so vector moves */                          \
            memcpy(acc, (const T *)in[0] + i, sizeof acc);                                                         \
            for (int r = 1; r < k; r++) into_##S(acc, (const T *)in[r] + i, BLK, op);                              \
            if (op == DT_OP_AVG)                                                                                   \
                for (size_t j = 0; j < BLK; j++) acc[j] = DIV(acc[j], div);                                        \
            store_blk(out + i, acc, sizeof acc, nt);                                                               \
            if (out2) memcpy(out2 + i, acc, sizeof acc);                                                           \
        }                                                                                                          \
        for (; i < n; i += BLK) {                                                                                  \
            size_t m = n - i < BLK ? n - i : BLK;                                                                  \
            memcpy(acc, (const T *)in[0] + i, m * sizeof(T));                                                      \
            for (int r = 1; r < k; r++) into_##S(acc, (const T *)in[r] + i, m, op);                                \
            if (op == DT_OP_AVG)                                                                                   \
                for (size_t j = 0; j < m; j++) acc[j] = DIV(acc[j], div);                                          \
            store_blk(out + i, acc, m * sizeof(T), nt);                                                            \
            if (out2) memcpy(out2 + i, acc, m * sizeof(T));                                                        \
        }                                                                                                          \
    }
#define FDIV(x, d) ((x) / (d))
DEF_MANY(f32, float, FDIV)
DEF_MANY(f64, double, FDIV)
DEF_MANY(i32, int32_t, FDIV)
DEF_MANY(i64, int64_t, FDIV)

static void many_half(uint16_t *out, uint16_t *out2, const void *const *in, int k, size_t n, dt_dtype t, dt_redop op,
                      int div, bool nt) {
    float acc[BLK], tmp[BLK];
    uint16_t h[BLK];
    for (size_t i = 0; i < n; i += BLK) {
        int m = n - i < BLK ? (int)(n - i) : BLK;
        half_load(acc, (const uint16_t *)in[0] + i, m, t);
        for (int r = 1; r < k; r++) {
            half_load(tmp, (const uint16_t *)in[r] + i, m, t);
            into_f32(acc, tmp, (size_t)m, op);
        }
        if (op == DT_OP_AVG)
            for (int j = 0; j < m; j++) acc[j] /= (float)div;
        half_store(h, acc, m, t);
        store_blk(out + i, h, (size_t)m * 2, nt);
        if (out2) memcpy(out2 + i, h, (size_t)m * 2);
    }
}

static void many(void *out, void *out2, const void *const *in, int k, size_t n, dt_dtype t, dt_redop op, int avg_div,
                 bool nt) {
    switch (t) {
    case DT_F32: many_f32(out, out2, in, k, n, op, avg_div, nt); break;
    case DT_F64: many_f64(out, out2, in, k, n, op, avg_div, nt); break;
    case DT_I32: many_i32(out, out2, in, k, n, op, avg_div, nt); break;
    case DT_I64: many_i64(out, out2, in, k, n, op, avg_div, nt); break;
    case DT_BF16:
    case DT_F16: many_half(out, out2, in, k, n, t, op, avg_div, nt); break;
    default: break;
    }
}

void dt_reduce_many(void *out, void *out2, const void *const *in, int k, size_t n, dt_dtype t, dt_redop op,
                    int avg_div) {
    many(out, out2, in, k, n, t, op, avg_div, false);
}

void dt_reduce_many_nt(void *out, void *out2, const void *const *in, int k, size_t n, dt_dtype t, dt_redop op,
                       int avg_div) {
    /* a short head with ordinary stores brings out to a 32-byte boundary */
    size_t esz = dt_dtype_size(t), mis = (uintptr_t)out & 31, h = mis ? (32 - mis) / esz : 0;
    if (mis % esz || k > 256) h = n;
    if (h > n) h = n;
    if (h) many(out, out2, in, k, h, t, op, avg_div, false);
    if (h == n) return;
    const void *rest[256];
    for (int r = 0; r < k; r++) rest[r] = (const char *)in[r] + h * esz;
    many((char *)out + h * esz, out2 ? (char *)out2 + h * esz : NULL, rest, k, n - h, t, op, avg_div, true);
}

void dt_reduce_scale(void *buf, size_t n, dt_dtype t, int div) {
    if (div == 1) return;
    switch (t) {
    case DT_F32: {
        float *p = buf;
        for (size_t i = 0; i < n; i++) p[i] /= (float)div;
        break;
    }
    case DT_F64: {
        double *p = buf;
        for (size_t i = 0; i < n; i++) p[i] /= (double)div;
        break;
    }
    case DT_I32: {
        int32_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] /= div;
        break;
    }
    case DT_I64: {
        int64_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] /= div;
        break;
    }
    case DT_BF16:
    case DT_F16: {
        float f[BLK];
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i += BLK) {
            int m = n - i < BLK ? (int)(n - i) : BLK;
            half_load(f, p + i, m, t);
            for (int j = 0; j < m; j++) f[j] /= (float)div;
            half_store(p + i, f, m, t);
        }
        break;
    }
    default: break;
    }
}
