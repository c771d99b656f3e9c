/* Test helper for communicator tests: runs a function on N ranks, each a fork()ed child with an
 * explicit (rank, size, job id) communicator, no launcher needed. A child exits 0 when all its
 * checks passed; the parent kills every child after a time limit so a hang fails the test.
 * Also the test values every rank computes (nccl-tests style): small integers, so each result
 * is exact in every dtype and algorithm and can be compared bit for bit. */
#ifndef DT_COMM_TESTLIB_H
#define DT_COMM_TESTLIB_H

#include "core/test.h"
#include "dtrain/comm.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*dt_rank_fn)(int rank, int size, const char *job, void *arg);

static char dt_test_job[64];

/* A job id unique to this test process and call. */
static inline const char *dt_test_new_job(void) {
    static int k;
    snprintf(dt_test_job, sizeof dt_test_job, "t%d_%d", (int)getpid(), ++k);
    return dt_test_job;
}

/* Creates a communicator for (rank, size, job) with an optional algorithm and timeout. */
static inline dt_status dt_test_comm(dt_comm **c, int rank, int size, const char *job, dt_comm_algo algo,
                                     double timeout) {
    dt_comm_config cfg = dt_comm_config_default();
    cfg.rank = rank;
    cfg.size = size;
    cfg.job_id = job;
    cfg.algo = algo;
    cfg.timeout_s = timeout;
    return dt_comm_create(c, &cfg);
}

/* Forks n ranks running fn; returns the number of ranks that failed (non-zero exit, signal or
 * time limit). pids (may be NULL) receives the child pids right after the fork. */
static inline int dt_run_ranks_pids(int n, dt_rank_fn fn, void *arg, double limit_s, pid_t *pids_out) {
    pid_t pids[64];
    const char *job = dt_test_new_job();
    char jobcopy[64];
    snprintf(jobcopy, sizeof jobcopy, "%s", job);
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            dt_test_failures = 0; /* a rank reports only its own checks, not the parent's so far */
            int rc = fn(r, n, jobcopy, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc ? 1 : 0);
        }
        if (pids_out) pids_out[r] = pids[r];
    }
    int failed = 0, left = n, status[64];
    bool done[64] = {0};
    double t0 = (double)time(NULL);
    while (left > 0) {
        for (int r = 0; r < n; r++) {
            if (done[r]) continue;
            pid_t p = waitpid(pids[r], &status[r], WNOHANG);
            if (p == pids[r]) {
                done[r] = true;
                left--;
            }
        }
        if (left > 0 && (double)time(NULL) - t0 > limit_s) {
            for (int r = 0; r < n; r++)
                if (!done[r]) {
                    fprintf(stderr, "rank %d of job %s still running after %.0f s: killing it\n", r, jobcopy, limit_s);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], &status[r], 0);
                    status[r] = -1;
                    done[r] = true;
                    left--;
                }
        }
        if (left > 0) usleep(2000);
    }
    for (int r = 0; r < n; r++)
        if (status[r] != 0) failed++;
    return failed;
}

static inline int dt_run_ranks(int n, dt_rank_fn fn, void *arg, double limit_s) {
    return dt_run_ranks_pids(n, fn, arg, limit_s, NULL);
}

/* True when /dev/shm has no segment of the job (or of its splits). */
static inline bool dt_test_shm_gone(const char *job) {
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s", job);
    return access(path, F_OK) != 0;
}

/* Anonymous shared memory visible to the forked ranks (for timestamps, flags). */
static inline void *dt_test_shared(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- test values ------------------------------------------------------------------------- */

/* Element i of rank r for sum, avg, max and min: an integer in -5..5. */
static inline double dt_test_vsum(int r, size_t i) { return (double)((int)((r * 7 + (i % 1000) * 3) % 11) - 5); }

/* Element i of rank r for prod: 1, -1, 2 or 1, shifted by the rank, so a product over up to 8
 * ranks stays within +-4 (exact in bf16) and, for 2 and 3 ranks, has both signs across i. */
static inline double dt_test_vprod(int r, size_t i) {
    static const double t[4] = {1, -1, 2, 1};
    return t[(r * 3 + i) % 4];
}

/* Element i of rank r for data movement: an integer in 0..250 that differs by rank and index. */
static inline double dt_test_vmove(int r, size_t i) { return (double)((r * 37 + i * 11) % 251); }

/* Stores v as element i of the dtype-t buffer p (converted like dt_convert). */
static inline void dt_test_put(void *p, dt_dtype t, size_t i, double v) {
    dt_convert((char *)p + i * dt_dtype_size(t), t, &v, DT_F64, 1);
}

/* Element i of the dtype-t buffer p as a double. */
static inline double dt_test_get(const void *p, dt_dtype t, size_t i) {
    double v;
    dt_convert(&v, DT_F64, (const char *)p + i * dt_dtype_size(t), t, 1);
    return v;
}

/* Input of rank r at element i for a reduction with op. */
static inline double dt_test_input(dt_redop op, int r, size_t i) {
    return op == DT_OP_PROD ? dt_test_vprod(r, i) : dt_test_vsum(r, i);
}

/* Element i of the result of reducing the inputs of n ranks with op in dtype t (avg divides in
 * t's own precision, integers truncate). */
static inline double dt_test_expect(dt_redop op, dt_dtype t, int n, size_t i) {
    double acc = dt_test_input(op, 0, i);
    for (int r = 1; r < n; r++) {
        double v = dt_test_input(op, r, i);
        acc = op == DT_OP_PROD  ? acc * v
              : op == DT_OP_MAX ? (v > acc ? v : acc)
              : op == DT_OP_MIN ? (v < acc ? v : acc)
                                : acc + v;
    }
    if (op != DT_OP_AVG) return acc;
    switch (t) {
    case DT_F32: return (double)((float)acc / (float)n);
    case DT_F64: return acc / n;
    case DT_BF16: return dt_bf16_to_f32(dt_f32_to_bf16((float)acc / (float)n));
    case DT_F16: return dt_f16_to_f32(dt_f32_to_f16((float)acc / (float)n));
    default: return (double)((long long)acc / n);
    }
}

#endif
