/* Non-IID partitions of a labelled data set among federated clients: iid, label shards
 * (McMahan et al. 2017) and per-class Dirichlet proportions (Hsu et al. 2019). Randomness is
 * the counter-based generator keyed by (seed, purpose, index), so a partition is reproducible. */
#include "fl/fl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { KEY_PART = DT_RNG_USER + 17 };

/* A standard normal from two uniforms of stream (seed, key) at counter i (Box-Muller). */
static double normal(uint64_t seed, uint64_t key, uint64_t *i) {
    double u1 = (dt_rng_u64(seed, key, (*i)++) >> 11) * 0x1.0p-53,
           u2 = (dt_rng_u64(seed, key, (*i)++) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

/* Gamma(a, 1) by Marsaglia and Tsang (a < 1 through the a+1 boost). */
static double gamma_draw(double a, uint64_t seed, uint64_t key, uint64_t *i) {
    double boost = 1.0;
    if (a < 1.0) {
        double u = (dt_rng_u64(seed, key, (*i)++) >> 11) * 0x1.0p-53;
        boost = pow(u > 0 ? u : 0x1.0p-53, 1.0 / a);
        a += 1.0;
    }
    double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double z = normal(seed, key, i), v = 1.0 + c * z;
        if (v <= 0) continue;
        v = v * v * v;
        double u = (dt_rng_u64(seed, key, (*i)++) >> 11) * 0x1.0p-53;
        if (u < 1.0 - 0.0331 * z * z * z * z) return boost * d * v;
        if (log(u > 0 ? u : 0x1.0p-53) < 0.5 * z * z + d * (1.0 - v + log(v))) return boost * d * v;
    }
}

/* Sample indices ordered by label (stable), into out[n]. */
static void sort_by_label(uint32_t *out, const int32_t *labels, size_t n, int classes, size_t *start) {
    memset(start, 0, (size_t)(classes + 1) * sizeof *start);
    for (size_t i = 0; i < n; i++) start[labels[i] + 1]++;
    for (int c = 0; c < classes; c++) start[c + 1] += start[c];
    size_t *pos = malloc((size_t)classes * sizeof *pos);
    memcpy(pos, start, (size_t)classes * sizeof *pos);
    for (size_t i = 0; i < n; i++) out[pos[labels[i]]++] = (uint32_t)i;
    free(pos);
}

static void part_shards(const uint32_t *by_label, size_t n, int k, int S, uint64_t seed, int *owner) {
    size_t shards = (size_t)k * (size_t)S;
    uint32_t *perm = malloc(shards * sizeof *perm);
    dt_sampler_order(perm, shards, seed, KEY_PART, true);
    for (size_t s = 0; s < shards; s++) {
        size_t lo = s * n / shards, hi = (s + 1) * n / shards;
        for (size_t j = lo; j < hi; j++) owner[by_label[j]] = (int)(perm[s] % (uint32_t)k);
    }
    free(perm);
}

static void part_dirichlet(const uint32_t *by_label, const size_t *start, int classes, int k, double alpha,
                           uint64_t seed, int *owner) {
    double *p = malloc((size_t)k * sizeof *p);
    uint64_t ctr = 0;
    for (int c = 0; c < classes; c++) {
        double sum = 0;
        for (int j = 0; j < k; j++) sum += p[j] = gamma_draw(alpha, seed, dt_rng_key(KEY_PART, 1), &ctr);
        size_t m = start[c + 1] - start[c], done = 0;
        double cum = 0;
        for (int j = 0; j < k; j++) {
            cum += p[j] / sum;
            size_t upto = j == k - 1 ? m : (size_t)floor(cum * (double)m + 0.5);
            if (upto > m) upto = m;
            for (; done < upto; done++) owner[by_label[start[c] + done]] = j;
        }
    }
    free(p);
}

dt_status dt_fl_partition(const char *spec, const int32_t *labels, size_t n, int classes, int k, uint64_t seed,
                          int *owner) {
    if (k < 1 || (size_t)k > n) return dt_error(DT_EINVAL, "`clients` %d: need 1..%zu (the training samples)", k, n);
    for (size_t i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= classes)
            return dt_error(DT_EINVAL, "partition: label of sample %zu out of range", i);
    char *end;
    if (!strcmp(spec, "iid")) {
        uint32_t *order = malloc(n * sizeof *order);
        if (!order) return dt_error(DT_ENOMEM, "partition: out of memory");
        dt_sampler_order(order, n, seed, KEY_PART, true);
        for (size_t i = 0; i < n; i++) owner[order[i]] = (int)(i * (size_t)k / n);
        free(order);
        return DT_OK;
    }
    uint32_t *by = malloc(n * sizeof *by);
    size_t *start = malloc((size_t)(classes + 1) * sizeof *start);
    if (!by || !start) return free(by), free(start), dt_error(DT_ENOMEM, "partition: out of memory");
    sort_by_label(by, labels, n, classes, start);
    dt_status s = DT_OK;
    if (!strncmp(spec, "shards:", 7)) {
        long S = strtol(spec + 7, &end, 10);
        if (*end || S < 1 || (size_t)S * (size_t)k > n)
            s = dt_error(DT_EINVAL, "`partition` %s: shards:S needs an integer S >= 1 with S*clients <= samples", spec);
        else part_shards(by, n, k, (int)S, seed, owner);
    } else if (!strncmp(spec, "dirichlet:", 10)) {
        double a = strtod(spec + 10, &end);
        if (*end || !(a > 0) || a > 1e6)
            s = dt_error(DT_EINVAL, "`partition` %s: dirichlet:A needs a concentration A > 0 (e.g. 0.5)", spec);
        else part_dirichlet(by, start, classes, k, a, seed, owner);
    } else {
        s = dt_error(DT_EINVAL, "`partition` '%s': expected iid, shards:S or dirichlet:A", spec);
    }
    free(by), free(start);
    return s;
}
