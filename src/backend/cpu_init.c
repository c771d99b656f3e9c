/* Parameter initialisation matching torch's default distributions (not its numbers: the draws
 * come from the counter-based Philox generator, element i from counter i of stream key). */
#include "dtrain/core.h"
#include "backend/layers.h"

#include <math.h>

void dt_init_kaiming_uniform(float *w, size_t n, int fan_in, uint64_t seed, uint64_t key) {
    /* torch: kaiming_uniform_(a=sqrt(5)) => bound = sqrt(6/((1+5)*fan_in)) = 1/sqrt(fan_in) */
    const float bound = fan_in > 0 ? 1.0f / sqrtf((float)fan_in) : 0.0f;
    dt_rng_fill_uniform(w, n, -bound, bound, seed, key);
}

void dt_init_kaiming_normal(float *w, size_t n, int fan_in, uint64_t seed, uint64_t key) {
    const float std = fan_in > 0 ? sqrtf(2.0f / (float)fan_in) : 0.0f;
    dt_rng_fill_normal(w, n, 0.0f, std, seed, key);
}

void dt_init_xavier_uniform(float *w, size_t n, int fan_in, int fan_out, uint64_t seed, uint64_t key) {
    const int fans = fan_in + fan_out;
    const float bound = fans > 0 ? sqrtf(6.0f / (float)fans) : 0.0f;
    dt_rng_fill_uniform(w, n, -bound, bound, seed, key);
}
