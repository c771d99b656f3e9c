/* dt_launch_workers (dtrain/launch.h): N forked workers of the calling program under the local
 * launcher (launch.c), each with a shared-memory communicator from its rank environment. A
 * worker's status travels back as its exit code (-status), its message through a shared page. */
#include "dtrain/launch.h"
#include "run/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MSG_CAP 2048 /* bytes of one worker's error message */

typedef struct {
    dt_worker_fn fn;
    void *ctx;
    char *msgs; /* [workers][MSG_CAP], shared with the parent */
    int workers;
} worker_job;

/* In the forked worker: a communicator from the rank environment, then the caller's function. */
static int worker_main(void *p) {
    worker_job *w = p;
    const char *r = getenv("DTRAIN_RANK");
    int rank = r ? atoi(r) : 0;
    if (rank < 0 || rank >= w->workers) rank = 0;
    dt_comm *comm = NULL;
    dt_status s = dt_comm_create_from_env(&comm, NULL);
    if (s == DT_OK) s = w->fn(comm, w->ctx);
    if (s != DT_OK) snprintf(w->msgs + (size_t)rank * MSG_CAP, MSG_CAP, "%s", dt_last_error());
    dt_comm_destroy(comm);
    return s == DT_OK ? 0 : -(int)s;
}

/* The status of a worker's exit code (1..11: -dt_status; anything else: it died). */
static dt_status status_of_exit(int code) {
    if (code == 0) return DT_OK;
    return code >= -DT_EINVAL && code <= -DT_EINTR ? (dt_status)-code : DT_EPEER;
}

dt_status dt_launch_workers(int workers, dt_worker_fn fn, void *ctx, double timeout_s) {
    if (workers < 1 || !fn)
        return dt_error(DT_EINVAL, "dt_launch_workers: need workers >= 1 (got %d) and a function", workers);
    if (!(timeout_s >= 0))
        return dt_error(DT_EINVAL, "dt_launch_workers: timeout_s %g must not be negative", timeout_s);
    const size_t bytes = (size_t)workers * MSG_CAP;
    char *msgs = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (msgs == MAP_FAILED)
        return dt_error(DT_ENOMEM, "dt_launch_workers: cannot map %zu bytes for %d workers", bytes, workers);
    worker_job w = {.fn = fn, .ctx = ctx, .msgs = msgs, .workers = workers};
    dt_launch_config lc = {.nranks = workers, .timeout_s = timeout_s, .child_main = worker_main, .child_ctx = &w};
    dt_launch_result res;
    dt_status s = dt_launch_run(&lc, NULL, &res);
    if (s == DT_EPEER && res.failed_rank >= 0) {
        const int rk = res.failed_rank;
        const char *m = msgs + (size_t)rk * MSG_CAP;
        dt_status ws = status_of_exit(res.exit_code);
        s = dt_error(ws == DT_OK ? DT_EPEER : ws, "worker %d: %s", rk,
                     m[0]                  ? m
                     : res.exit_code > 128 ? "killed by a signal"
                                           : "exited without a message");
    } else if (s == DT_ETIMEDOUT) {
        s = dt_error(DT_ETIMEDOUT, "dt_launch_workers: the %d workers did not finish within %g s; they were stopped",
                     workers, timeout_s);
    } else if (s != DT_OK) {
        s = dt_error_wrap(s, "dt_launch_workers");
    }
    munmap(msgs, bytes);
    return s;
}
