/* --val-split: dt_dataset_split partitions the samples (disjoint, together all of them, each part
 * in the original order, round(n*F) in validation) by the seed alone: the same seed gives the
 * same split, another seed another; values, labels, scale and normalisation carry over; bad
 * fractions and text data sets are refused. */
#include "core/test.h"
#include "dtrain/data.h"

#include <string.h>

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
    CHECK(dt_dataset_len(va) == 20 && dt_dataset_len(tr) == 81);  /* round(101 * 0.2) */
    int seen[N] = {0}, a[N], b[N];
    ids_of(va, a), ids_of(tr, b);
    int unordered = 0;
    for (int i = 0; i < 20; i++) seen[a[i]]++, unordered += i > 0 && a[i] <= a[i - 1];
    for (int i = 0; i < 81; i++) seen[b[i]]++, unordered += i > 0 && b[i] <= b[i - 1];
    CHECK(unordered == 0);  /* each part in the original order */
    int once = 0;
    for (int i = 0; i < N; i++) once += seen[i] == 1;
    CHECK_MSG(once == N, "%d of %d samples in exactly one part", once, N);
    CHECK(dt_dataset_classes(va) == 7);
    CHECK_OK(dt_dataset_split(ds, 0.2, 42, &tr2, &va2));
    int c[N];
    ids_of(va2, c);
    CHECK(memcmp(a, c, 20 * sizeof(int)) == 0);  /* the same seed, the same split */
    CHECK_OK(dt_dataset_split(ds, 0.2, 43, &tr3, &va3));
    ids_of(va3, c);
    CHECK(memcmp(a, c, 20 * sizeof(int)) != 0);  /* another seed, another split */
    dt_dataset_free(tr), dt_dataset_free(va), dt_dataset_free(tr2), dt_dataset_free(va2);
    dt_dataset_free(tr3), dt_dataset_free(va3);
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
    dt_dataset_free(tr), dt_dataset_free(va);
    dt_dataset_free(ds);
}

static void test_refusals(void) {
    dt_dataset *ds = make(), *tr = (dt_dataset *)1, *va = (dt_dataset *)1;
    const double bad[4] = {0, 1, -0.1, 0.001};  /* 0.001 of 101 rounds to no sample */
    for (int i = 0; i < 4; i++) {
        CHECK(dt_dataset_split(ds, bad[i], 1, &tr, &va) == DT_EINVAL);
        CHECK(tr == NULL && va == NULL);
        CHECK_MSG(strstr(dt_last_error(), "--val-split"), "%s", dt_last_error());
    }
    dt_dataset_free(ds);
}

int main(void) {
    test_partition();
    test_refusals();
    return dt_test_summary("split_test");
}
