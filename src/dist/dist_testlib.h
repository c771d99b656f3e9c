/* Shared helpers of the strategy tests: a small separable 4-class CSV data set in a temp dir. */
#ifndef DT_DIST_TESTLIB_H
#define DT_DIST_TESTLIB_H

#include "dtrain/core.h"

#include <stdio.h>
#include <stdlib.h>

/* Writes DIR/toy_train.csv (made with mkdtemp from `tmpl`, e.g. "/tmp/dtrain-x-XXXXXX") of 203
 * samples of 12 features (odd: the last batch of an epoch is short), labels from `seed`.
 * dir (64) and csv (128) receive the paths. */
static inline void dt_test_write_toy_csv(char *dir, char *csv, const char *tmpl, uint64_t seed) {
    snprintf(dir, 64, "%s", tmpl);
    if (!mkdtemp(dir)) abort();
    snprintf(csv, 128, "%s/toy_train.csv", dir);
    FILE *f = fopen(csv, "w");
    if (!f) abort();
    for (int i = 0; i < 203; i++) {
        int y = (int)(dt_rng_u64(seed, 1, (uint64_t)i) % 4);
        fprintf(f, "%d", y);
        for (int k = 0; k < 12; k++)
            fprintf(f, ",%.5f", dt_rng_uniform(seed, 2, (uint64_t)(i * 12 + k)) + (k % 4 == y ? 1.5f : 0.0f));
        fprintf(f, "\n");
    }
    fclose(f);
}

/* Removes the directory made by dt_test_write_toy_csv. */
static inline void dt_test_remove_dir(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

#endif
