/* The sampler: a deterministic per-(seed, epoch) permutation of the data set (Fisher-Yates with
 * unbiased bounded draws from the counter-based Philox RNG) and its split into per-rank batches.
 * Nothing here depends on the number of workers except the final cut, so N ranks see exactly the
 * global order that 1 rank sees. */
#include "dtrain/data.h"

/* Uniform draw in [0, range) for Fisher-Yates position i (Lemire's multiply-shift with
 * rejection). Attempt k of position i uses counter index k*2^32 + i, so a rejection never shifts
 * the stream of another position. */
static uint64_t bounded(uint64_t seed, uint64_t key, uint64_t i, uint64_t range) {
    uint64_t threshold = (0 - range) % range; /* 2^64 mod range: values below it are biased */
    for (uint64_t attempt = 0;; attempt++) {
        uint64_t x = dt_rng_u64(seed, key, attempt << 32 | i);
        unsigned __int128 m = (unsigned __int128)x * range;
        if ((uint64_t)m >= threshold) return (uint64_t)(m >> 64);
    }
}

void dt_sampler_order(uint32_t *order, size_t n, uint64_t seed, uint64_t epoch, bool shuffle) {
    for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
    if (!shuffle) return;
    uint64_t key = dt_rng_key(DT_RNG_SHUFFLE, epoch);
    for (size_t i = n; i-- > 1;) {
        size_t j = (size_t)bounded(seed, key, i, (uint64_t)i + 1);
        uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

size_t dt_sampler_batches(size_t n, int batch, int world, bool drop_last) {
    if (batch <= 0) return 0;
    size_t g = (size_t)batch * (size_t)(world > 0 ? world : 1);
    return drop_last ? n / g : (n + g - 1) / g;
}

void dt_sampler_batch_range(size_t n, int batch, int rank, int world, size_t b, size_t *start, size_t *count) {
    if (world <= 0) world = 1;
    size_t B = (size_t)batch, W = (size_t)world, r = (size_t)rank;
    size_t g = B * W, gs = b * g;
    if (gs >= n) {
        *start = n;
        *count = 0;
    } else if (n - gs >= g) { /* a complete global batch: contiguous block r */
        *start = gs + r * B;
        *count = B;
    } else { /* the last incomplete one: spread rem over the ranks */
        size_t rem = n - gs, q = rem / W, extra = rem % W;
        *start = gs + r * q + (r < extra ? r : extra);
        *count = q + (r < extra ? 1 : 0);
    }
}

void dt_sampler_cut_range(size_t n, const int *counts, int rank, int world, size_t b, size_t *start, size_t *count) {
    size_t g = 0, before = 0;
    for (int r = 0; r < world; r++) {
        if (r == rank) before = g;
        g += (size_t)counts[r];
    }
    size_t mine = (size_t)counts[rank], gs = b * g;
    if (gs >= n) {
        *start = n;
        *count = 0;
    } else if (n - gs >= g) {
        *start = gs + before;
        *count = mine;
    } else { /* the last incomplete one: the same proportions, rounded down at each boundary */
        size_t rem = n - gs;
        size_t lo = (size_t)((unsigned __int128)before * rem / g);
        size_t hi = (size_t)((unsigned __int128)(before + mine) * rem / g);
        *start = gs + lo;
        *count = hi - lo;
    }
}

size_t dt_sampler_shard(uint32_t *out, const uint32_t *order, size_t n, int batch, int rank, int world,
                        bool drop_last) {
    size_t nb = dt_sampler_batches(n, batch, world, drop_last), k = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t s, c;
        dt_sampler_batch_range(n, batch, rank, world, b, &s, &c);
        for (size_t i = 0; i < c; i++) out[k++] = order[s + i];
    }
    return k;
}
