/* Local workers for embedders: runs a function of the caller's program on N worker processes of
 * one machine, each with a communicator over the shared-memory transport (what
 * `dtrain train --workers N` does), and supervises them like `dtrain launch`: the first worker
 * that fails stops the others, and the call returns that worker's error. */
#ifndef DTRAIN_LAUNCH_H
#define DTRAIN_LAUNCH_H

#include "dtrain/comm.h"
#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One worker's body: comm is this worker's communicator (rank 0..n-1 of n; owned by the
 * launcher, destroyed after fn returns). Returns DT_OK, or an error with dt_error's message. */
typedef dt_status (*dt_worker_fn)(dt_comm *comm, void *ctx);

/* Runs fn(comm, ctx) on `workers` forked processes of this program (fork without exec: ctx and
 * everything else in memory is each worker's copy; what a worker changes stays in that worker)
 * and waits for all of them, at most timeout_s seconds (0 = no limit). The workers' stdout and
 * stderr lines reach this process's with a "[rank] " prefix. Returns DT_OK when every worker's fn
 * returned DT_OK; otherwise the first failing worker's status (DT_EPEER when it was killed or
 * exited without one) with a message "worker R: <its message>"; DT_ETIMEDOUT past timeout_s;
 * DT_EINTR when this process got SIGINT/SIGTERM (the workers are stopped). Call it from a
 * single-threaded program (fork copies only the calling thread); one call at a time. */
dt_status dt_launch_workers(int workers, dt_worker_fn fn, void *ctx, double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
