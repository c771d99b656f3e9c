/* Test helper for communicator tests: runs a function on N ranks, each a fork()ed child with an
 * explicit (rank, size, job id) communicator, no launcher needed. A child exits 0 when all its
 * checks passed; the parent kills every child after a time limit so a hang fails the test. */
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
static inline dt_status dt_test_comm(dt_comm **c, int rank, int size, const char *job, dt_comm_algo algo, double timeout) {
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
            if (p == pids[r]) { done[r] = true; left--; }
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

#endif
