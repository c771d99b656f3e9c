/* Shared helpers of the strategy tests: small data sets in a temp dir (a separable 4-class CSV, a
 * text corpus), forked ranks, parameter files. */
#ifndef DT_DIST_TESTLIB_H
#define DT_DIST_TESTLIB_H

#include "dtrain/comm.h"
#include "dtrain/core.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Writes 3001 bytes of varied English-like text to path (GPT tests: 187 windows of 16 and some for
 * validation) and sets spec (cap bytes) to "text:PATH". Aborts when the file cannot be written. */
static inline void dt_test_write_corpus(const char *path, char *spec, size_t cap) {
    snprintf(spec, cap, "text:%s", path);
    const char *words[] = {"the ", "lord ", "said ", "unto ", "moses ", "and ", "of ", "in ", "light ", "was ", ".\n"};
    FILE *f = fopen(path, "w");
    if (!f) abort();
    for (int i = 0; ftell(f) < 3001; i++) fputs(words[dt_rng_u64(9, 1, (uint64_t)i) % 11], f);
    fclose(f);
}

/* In a forked rank: joins job `job` as rank r of n over shared memory (60 s deadlines), or
 * prints why and exits the process with status 2. */
static inline dt_comm *dt_test_rank_comm(int r, int n, const char *job) {
    dt_comm_config cc = dt_comm_config_default();
    cc.rank = r, cc.size = n, cc.job_id = job, cc.timeout_s = 60;
    dt_comm *c;
    if (dt_comm_create(&c, &cc) != DT_OK) {
        fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
        _exit(2);
    }
    return c;
}

/* Trains cfg to its end: the trained parameters (when at most cap) into out, their number into
 * *n; the run's status. */
static inline dt_status dt_test_train_params(const dt_train_config *cfg, float *out, size_t cap, size_t *n) {
    dt_trainer *t;
    DT_TRY(dt_trainer_create(&t, cfg));
    dt_status s = dt_trainer_run(t);
    *n = dt_model_num_params(dt_trainer_model(t));
    if (s == DT_OK && *n <= cap) memcpy(out, dt_model_params(dt_trainer_model(t)), *n * sizeof(float));
    dt_trainer_destroy(t);
    return s;
}

/* Writes n floats to path (a forked rank hands its parameters to the parent); 0 on success. */
static inline int dt_test_write_floats(const char *path, const float *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, sizeof(float), n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* Waits for every child; returns how many did not exit 0. */
static inline int dt_test_wait_children(void) {
    int failed = 0, st;
    while (wait(&st) > 0) failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return failed;
}

/* Reads up to cap floats from path (written by dt_test_write_floats); returns how many. */
static inline size_t dt_test_read_floats(const char *path, float *p, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(p, sizeof(float), cap, f);
    fclose(f);
    return n;
}

/* Removes the directory made by dt_test_write_toy_csv. */
static inline void dt_test_remove_dir(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

#endif
