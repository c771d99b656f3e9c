/* Internal helpers shared by the layer kernels (the src/backend/cpu_*.c kernel files): the vectorisation switch and small
 * inline reductions. Include it LAST in a kernel file, after the system headers. */
#ifndef DT_NN_KERN_H
#define DT_NN_KERN_H

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

#endif
