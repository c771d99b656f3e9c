/* Counter-based RNG: Philox-4x32-10 (Salmon et al., SC'11). Every draw is a pure function of
 * (seed, key, index), so shuffles, init and dropout never depend on worker count or call order. */
#include "dtrain/core.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void dt_philox4x32(uint64_t seed, uint64_t key, uint64_t index, uint32_t out[4]) {
    /* counter = (index, key); the 64-bit philox key = seed */
    uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
    uint32_t c2 = (uint32_t)key, c3 = (uint32_t)(key >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static inline float u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

float dt_rng_uniform(uint64_t seed, uint64_t key, uint64_t index) {
    uint32_t r[4];
    dt_philox4x32(seed, key, index, r);
    return u32_to_unit(r[0]);
}

uint64_t dt_rng_u64(uint64_t seed, uint64_t key, uint64_t index) {
    uint32_t r[4];
    dt_philox4x32(seed, key, index, r);
    return ((uint64_t)r[1] << 32) | r[0];
}

void dt_rng_fill_uniform(float *out, size_t n, float lo, float hi, uint64_t seed, uint64_t key) {
    for (size_t i = 0; i < n; i++) out[i] = lo + (hi - lo) * dt_rng_uniform(seed, key, i);
}

void dt_rng_fill_normal(float *out, size_t n, float mean, float std, uint64_t seed, uint64_t key) {
    /* Box-Muller on words 0/1 of counter i: one normal per index keeps element i independent of n */
    for (size_t i = 0; i < n; i++) {
        uint32_t r[4];
        dt_philox4x32(seed, key, i, r);
        double u1 = ((double)r[0] + 1.0) / 4294967297.0; /* (0,1) */
        double u2 = (double)r[1] / 4294967296.0;
        out[i] = mean + std * (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
}
