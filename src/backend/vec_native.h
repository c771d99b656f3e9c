/* GCC vector-extension types as wide as the registers this file is compiled for (-march): 16
 * floats with AVX-512, 8 with AVX, 4 with SSE (VW lanes), and the few helpers the blocked-layout
 * kernels share (cpu_conv_pool.c, cpu_blocked.c). A vector wider than the registers is not split
 * into registers by GCC 12: it moves the parts through the stack (docs/why.md, "Vectors as wide as
 * the registers"), so code that handles a 16-channel block loops over
 * its BL / VW vectors instead. Include after <stdint.h> and <string.h>. */
#ifndef DT_BACKEND_VEC_NATIVE_H
#define DT_BACKEND_VEC_NATIVE_H

#if defined(__AVX512F__)
#include <immintrin.h>
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif

typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VW * sizeof(int32_t))));
typedef uint8_t vb __attribute__((vector_size(VW)));
typedef uint32_t vu __attribute__((vector_size(VW * sizeof(uint32_t))));
typedef uint16_t vh __attribute__((vector_size(VW * sizeof(uint16_t))));

/* VW floats from p / to p (any alignment). */
static inline vf vf_load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vf_store(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* Lanes 0 .. VW - 1, as int32. */
static inline vi vi_lanes(void) {
    vi l;
    for (int i = 0; i < VW; i++) l[i] = i;
    return l;
}

/* a where t's lane is all ones, else b. */
static inline vf vf_select(vi t, vf a, vf b) { return (vf)(((vi)a & t) | ((vi)b & ~t)); }

/* The low 16 bits of each lane. GCC 12 narrows vectors lane by lane (unpacks and inserts: the
 * fused first conv's output stores took a third of its forward); AVX-512 has one instruction. */
static inline vh vu_low16(vu u) {
#if defined(__AVX512F__)
    vh h;
    const __m256i r = _mm512_cvtepi32_epi16((__m512i)u);
    memcpy(&h, &r, sizeof h);
    return h;
#else
    return __builtin_convertvector(u, vh);
#endif
}

/* The low 8 bits of each lane (window positions, 0 .. 255), as vu_low16. */
static inline vb vi_low8(vi v) {
#if defined(__AVX512F__)
    vb b;
    const __m128i r = _mm512_cvtepi32_epi8((__m512i)v);
    memcpy(&b, &r, sizeof b);
    return b;
#else
    return __builtin_convertvector(v, vb);
#endif
}

/* v rounded to bf16: to nearest even, NaN stays a quiet NaN (dt_f32_to_bf16's rule). */
static inline vh vf_to_bf16(vf v) {
    const vu u = (vu)v, r = u + 0x7fffu + ((u >> 16) & 1u), q = u | 0x00400000u;
    const vu nan = (vu)(v != v);
    return vu_low16(((q & nan) | (r & ~nan)) >> 16);
}

/* VW bf16 values at p widened to f32 (exact). */
static inline vf vf_from_bf16(const uint16_t *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);
}

#endif
