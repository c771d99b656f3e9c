/* --val-split: dt_dataset_split partitions the samples (disjoint, together all of them, each part
 * in the original order, round(n*F) in validation) by the seed alone: the same seed gives the
 * same split, another seed another; values, labels, scale and normalisation carry over; bad
 * fractions and text data sets are refused; the parts are views, bitwise what copies would give. */
#include "core/test.h"
#include "dtrain/data.h"

#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

enum { N = 101, D = 3 };

/* Sample i of the set built below has label i % 7 and first value i (exact in u8 up to 255). */
static dt_dataset *make(void) {
    static uint8_t x[N * D];
    static int32_t y[N];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < D; j++) x[i * D + j] = (uint8_t)(i + j);
        y[i] = i % 7;
    }
    dt_dataset *ds = NULL;
    CHECK_OK(dt_dataset_create(&ds, DT_U8, x, y, N, 1, 1, D, 7));
    return ds;
}

/* The original index of every sample of part (its first value times 255). */
static void ids_of(const dt_dataset *part, int *ids) {
    for (size_t i = 0; i < dt_dataset_len(part); i++) {
        uint32_t k = (uint32_t)i;
        float x[D];
        int32_t y;
        CHECK_OK(dt_dataset_batch(part, &k, 1, x, &y));
        ids[i] = (int)(x[0] * 255 + 0.5f);
        CHECK(y == ids[i] % 7);
        CHECK(fabsf(x[2] - (float)(ids[i] + 2) / 255) < 1e-6f);
    }
}

static void test_partition(void) {
    dt_dataset *ds = make(), *tr = NULL, *va = NULL, *tr2 = NULL, *va2 = NULL, *tr3 = NULL, *va3 = NULL;
    CHECK_OK(dt_dataset_split(ds, 0.2, 42, &tr, &va));
    CHECK(dt_dataset_len(va) == 20 && dt_dataset_len(tr) == 81); /* round(101 * 0.2) */
    int seen[N] = {0}, a[N], b[N];
    ids_of(va, a), ids_of(tr, b);
    int unordered = 0;
    for (int i = 0; i < 20; i++) seen[a[i]]++, unordered += i > 0 && a[i] <= a[i - 1];
    for (int i = 0; i < 81; i++) seen[b[i]]++, unordered += i > 0 && b[i] <= b[i - 1];
    CHECK(unordered == 0); /* each part in the original order */
    int once = 0;
    for (int i = 0; i < N; i++) once += seen[i] == 1;
    CHECK_MSG(once == N, "%d of %d samples in exactly one part", once, N);
    CHECK(dt_dataset_classes(va) == 7);
    CHECK_OK(dt_dataset_split(ds, 0.2, 42, &tr2, &va2));
    int c[N];
    ids_of(va2, c);
    CHECK(memcmp(a, c, 20 * sizeof(int)) == 0); /* the same seed, the same split */
    CHECK_OK(dt_dataset_split(ds, 0.2, 43, &tr3, &va3));
    ids_of(va3, c);
    CHECK(memcmp(a, c, 20 * sizeof(int)) != 0); /* another seed, another split */
    dt_dataset_destroy(tr), dt_dataset_destroy(va), dt_dataset_destroy(tr2), dt_dataset_destroy(va2);
    dt_dataset_destroy(tr3), dt_dataset_destroy(va3);
    /* the normalisation of the source carries over */
    CHECK_OK(dt_dataset_set_normalize(ds, 0.5f, 0.25f));
    CHECK_OK(dt_dataset_split(ds, 0.5, 1, &tr, &va));
    uint32_t k = 0;
    float x[D], x0[D];
    int32_t y;
    CHECK_OK(dt_dataset_batch(va, &k, 1, x, &y));
    CHECK_OK(dt_dataset_set_normalize(va, 0, 1));
    CHECK_OK(dt_dataset_batch(va, &k, 1, x0, &y));
    CHECK(fabsf(x[0] - (x0[0] - 0.5f) / 0.25f) < 1e-5f);
    dt_dataset_destroy(tr), dt_dataset_destroy(va);
    dt_dataset_destroy(ds);
}

/* The parts are views of ds: every batch of a part is bitwise the batch a copy of those samples
 * gives (the bytes, labels and statistics of ds's rows; the f32 path too), also after ds was
 * freed (the parts keep it), and they hold no copy of the samples (glibc's malloc counters). */
static void test_view(dt_dtype dt) {
    enum { M = 20000, E = 5 };
    uint8_t *xu = malloc(M * E), *gu = malloc(M * E);
    float *xf = malloc(M * E * sizeof(float)), *gf = malloc(M * E * sizeof(float));
    int32_t *y = malloc(M * sizeof *y), *gy = malloc(M * sizeof *gy);
    uint32_t r = 7;
    for (int i = 0; i < M * E; i++) {
        r = r * 1664525u + 1013904223u;
        xu[i] = (uint8_t)(r >> 24), xf[i] = (float)(r >> 8) / 65536.0f - 100.0f;
    }
    for (int i = 0; i < M; i++) y[i] = (int)(r = r * 1664525u + 1013904223u) >> 29 & 7;
    const void *x = dt == DT_U8 ? (const void *)xu : (const void *)xf;
    const size_t es = dt == DT_U8 ? 1 : sizeof(float);
    dt_dataset *ds = NULL, *tr = NULL, *va = NULL;
    CHECK_OK(dt_dataset_create(&ds, dt, x, y, M, 1, 1, E, 8));
    CHECK_OK(dt_dataset_set_normalize(ds, 0.25f, 2.0f));
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
    struct mallinfo2 m0 = mallinfo2();
    CHECK_OK(dt_dataset_split(ds, 0.25, 9, &tr, &va));
    struct mallinfo2 m1 = mallinfo2();
    const size_t grew = (m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd);
    CHECK_MSG(grew < M * sizeof(uint32_t) + (64 << 10),
              "the split allocated %zu bytes: a copy of "
              "the samples (%zu bytes)?",
              grew, (size_t)M * E * es);
#else
    CHECK_OK(dt_dataset_split(ds, 0.25, 9, &tr, &va));
#endif
    uint32_t *all = malloc(M * sizeof *all), *src = malloc(M * sizeof *src);
    float *bx = malloc(M * E * sizeof(float)), *cx = malloc(M * E * sizeof(float));
    int32_t *by = malloc(M * sizeof *by), *cy = malloc(M * sizeof *cy);
    for (int i = 0; i < M; i++) all[i] = (uint32_t)i;
    /* the original index of each sample of a part: its bytes are unique in ds (random rows) */
    dt_dataset *parts[2] = {va, tr};
    uint32_t *ids[2] = {NULL, NULL};
    for (int p = 0; p < 2; p++) {
        dt_dataset *part = parts[p];
        const size_t n = dt_dataset_len(part);
        ids[p] = malloc(n * sizeof(uint32_t));
        CHECK_OK(dt_dataset_batch(ds, all, M, cx, cy));
        CHECK_OK(dt_dataset_batch(part, all, (int)n, bx, by));
        size_t found = 0;
        for (size_t i = 0, k = 0; i < n; i++) {
            while (k < M && memcmp(bx + i * E, cx + k * E, E * sizeof(float))) k++;
            if (k < M) ids[p][i] = (uint32_t)k++, found++;
        }
        CHECK_MSG(found == n, "%zu of %zu samples of the part are ds's samples in order", found, n);
    }
    CHECK(dt_dataset_len(va) + dt_dataset_len(tr) == M);
    dt_dataset_destroy(ds); /* the parts keep its samples */
    for (int p = 0; p < 2; p++) {
        dt_dataset *part = parts[p], *copy = NULL;
        const size_t n = dt_dataset_len(part);
        for (size_t i = 0; i < n; i++) {
            memcpy(dt == DT_U8 ? (void *)(gu + i * E) : (void *)(gf + i * E), (const char *)x + ids[p][i] * E * es,
                   E * es);
            gy[i] = y[ids[p][i]];
        }
        CHECK_OK(dt_dataset_create(&copy, dt, dt == DT_U8 ? (const void *)gu : (const void *)gf, gy, n, 1, 1, E, 8));
        CHECK_OK(dt_dataset_set_normalize(copy, 0.25f, 2.0f));
        for (size_t i = 0; i < n; i++) src[i] = (uint32_t)(n - 1 - i); /* any order */
        CHECK_OK(dt_dataset_batch(part, src, (int)n, bx, by));
        CHECK_OK(dt_dataset_batch(copy, src, (int)n, cx, cy));
        CHECK_MSG(memcmp(bx, cx, n * E * sizeof(float)) == 0 && memcmp(by, cy, n * sizeof(int32_t)) == 0,
                  "part %d's batches differ from a copy's", p);
        double m[2], sd[2];
        dt_dataset_stats(part, &m[0], &sd[0]);
        dt_dataset_stats(copy, &m[1], &sd[1]);
        CHECK_MSG(m[0] == m[1] && sd[0] == sd[1], "part %d: stats %.17g %.17g, a copy's %.17g %.17g", p, m[0], sd[0],
                  m[1], sd[1]);
        dt_dataset_destroy(copy), free(ids[p]);
    }
    dt_dataset_destroy(va), dt_dataset_destroy(tr);
    free(xu), free(gu), free(xf), free(gf), free(y), free(gy), free(all), free(src), free(bx), free(cx), free(by),
        free(cy);
}

static void test_refusals(void) {
    dt_dataset *ds = make(), *tr = (dt_dataset *)1, *va = (dt_dataset *)1;
    const double bad[4] = {0, 1, -0.1, 0.001}; /* 0.001 of 101 rounds to no sample */
    for (int i = 0; i < 4; i++) {
        CHECK(dt_dataset_split(ds, bad[i], 1, &tr, &va) == DT_EINVAL);
        CHECK(tr == NULL && va == NULL);
        CHECK_MSG(strstr(dt_last_error(), "`val_split`"), "%s", dt_last_error());
    }
    dt_dataset_destroy(ds);
}

int main(void) {
    test_partition();
    test_view(DT_U8);
    test_view(DT_F32);
    test_refusals();
    return dt_test_summary("split_test");
}
