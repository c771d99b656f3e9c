/* Internal helpers shared by the layer kernels (the src/backend/cpu_*.c kernel files): the vectorisation switch and
 * small inline reductions. Include it LAST in a kernel file, after the system headers. */
#ifndef DT_NN_KERN_H
#define DT_NN_KERN_H

#include <math.h>
#include <stddef.h>

/* GCC 12 at -O2 vectorises only loops whose trip count is a multiple of the vector width; the
 * kernels have runtime sizes, so turn on the dynamic cost model for the code that follows. */
#if defined(__GNUC__) && !defined(__clang__)
#ifdef DT_NN_INLINE_COPIES
/* ...and keep short zero/copy loops inline instead of turning them into memset/memcpy calls */
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic", "no-tree-loop-distribute-patterns")
#else
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif
#endif

#define DT_NN_LANES 16

/* Sum of n floats with 16 independent partial sums (vectorisable without -ffast-math). */
static inline float dt_nn_sum(const float *restrict x, size_t n) {
    float acc[DT_NN_LANES] = {0};
    size_t i = 0;
    for (; i + DT_NN_LANES <= n; i += DT_NN_LANES)
        for (int j = 0; j < DT_NN_LANES; j++) acc[j] += x[i + j];
    float s = 0;
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < DT_NN_LANES; j++) s += acc[j];
    return s;
}

/* Dot product of n floats, 16 partial sums. */
static inline float dt_nn_dot(const float *restrict x, const float *restrict y, size_t n) {
    float acc[DT_NN_LANES] = {0};
    size_t i = 0;
    for (; i + DT_NN_LANES <= n; i += DT_NN_LANES)
        for (int j = 0; j < DT_NN_LANES; j++) acc[j] += x[i + j] * y[i + j];
    float s = 0;
    for (; i < n; i++) s += x[i] * y[i];
    for (int j = 0; j < DT_NN_LANES; j++) s += acc[j];
    return s;
}

/* libmvec's vector expf (16 lanes on AVX-512) where a loop asks for it */
#pragma omp declare simd notinbranch
float expf(float);

/* dst[i] = exp(src[i] - mx) for i < n; returns their sum (dst == src allowed). Whole blocks of 16
 * go through the vector expf, and so does the tail, padded with -inf (exp gives 0): a softmax row
 * of 10 classes or a causal attention row of t + 1 scores makes no scalar expf call. */
static inline float dt_nn_exp_sub_sum(float *dst, const float *src, int n, float mx) {
    float acc[DT_NN_LANES] = {0};
    int i = 0;
    for (; i + DT_NN_LANES <= n; i += DT_NN_LANES) {
#pragma omp simd
        for (int j = 0; j < DT_NN_LANES; j++) {
            float e = expf(src[i + j] - mx);
            dst[i + j] = e;
            acc[j] += e;
        }
    }
    if (i < n) {
        float t[DT_NN_LANES];
        const int r = n - i;
        for (int j = 0; j < DT_NN_LANES; j++) t[j] = j < r ? src[i + j] - mx : -INFINITY;
#pragma omp simd
        for (int j = 0; j < DT_NN_LANES; j++) t[j] = expf(t[j]);
        for (int j = 0; j < r; j++) dst[i + j] = t[j], acc[j] += t[j];
    }
    float s = 0;
    for (int j = 0; j < DT_NN_LANES; j++) s += acc[j];
    return s;
}

#endif
