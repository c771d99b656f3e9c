/* Internals of the communicator shared by comm.c (creation, environment, split, destroy) and
 * comm_ops.c (collectives, point-to-point, requests, the progress thread). */
#ifndef DT_COMM_INTERNAL_H
#define DT_COMM_INTERNAL_H

#include "comm/algo.h"

#include <pthread.h>
#include <stdatomic.h>

typedef enum { RQ_COLL = 0, RQ_SEND, RQ_RECV } dt_rq_kind;

/* One op: blocking calls describe themselves on the stack, non-blocking ones on the heap. */
struct dt_request {
    dt_comm *c;
    dt_rq_kind kind;
    dt_coll_op op;
    const void *send;
    void *recv;
    size_t count;
    dt_dtype dtype;
    dt_redop redop;
    int root; /* root, or peer for send/recv */
    int tag;
    bool blocking;
    bool posted; /* send/recv handed to the transport, completion pending */
    bool done;
    dt_status status;
    double deadline;
    dt_treq treq;
    const size_t *counts, *displs; /* allgatherv (blocking only) */
    void *tmp;                     /* private copy of an overlapping input, freed with the request */
    /* an input that overlaps the output, staged when the op runs (after every earlier op, which
     * may still write it), not when it is issued: moved to stage_dst, or copied into tmp (NULL) */
    size_t stage_bytes;
    void *stage_dst;
    char msg[512];
    int peer; /* the world rank a failure blames (dt_last_error_peer), or -1 */
    struct dt_request *next;
};

struct dt_comm {
    int rank, size;
    const dt_transport_kind *kind; /* its entry of the transport registry */
    dt_transport *t;               /* NULL for a single process */
    dt_comm_algo algo;             /* AUTO or a forced algorithm */
    double timeout_s;
    char timeout_knob[40]; /* named in timeout errors: "--timeout", DTRAIN_TIMEOUT, ... */
    uint64_t seq, splits;
    dt_scratch scratch;
    size_t seg_bytes;
    dt_status failed; /* first transport-level failure: every later call returns it */
    char fail_msg[512];
    int fail_peer; /* the world rank that failure blames, or -1 */
    /* execution: one op at a time, in issue order, on the caller or the progress thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool busy, idling, stop, thread_started, want;
    pthread_t thread;
    dt_request *qhead, *qtail;   /* issued, not started */
    dt_request *active;          /* non-blocking send/recv posted to the transport */
    struct dt_comm_hier *hier;   /* hierarchical allreduce (comm_hier.c), or NULL */
    _Atomic uint64_t bytes, ops; /* counters (dt_comm_bytes): bus bytes and ops that succeeded */
    int *world_of;               /* a split's members as world ranks (named in its errors); NULL: the world */
};

/* Frees a hierarchical-allreduce setup (its sub-communicators); NULL is a no-op. */
void dt_comm_hier_free(dt_comm_hier *h);
/* The hierarchical allreduce of count elements (comm_hier.c); AVG divides by world at the end. */
dt_status dt_comm_hier_allreduce(dt_comm_hier *h, int world, const void *send, void *recv, size_t count, dt_dtype t,
                                 dt_redop op);

/* Runs one op to completion on the calling thread (collective) or posts it (non-blocking
 * send/recv). Needs exclusive use of the transport. */
dt_status dt_comm_exec(dt_comm *c, dt_request *r);
/* Blocking call: waits for earlier non-blocking ops, then runs r on this thread to completion. */
dt_status dt_comm_run(dt_comm *c, dt_request *r);
/* Non-blocking call: queues heap request r for the progress thread and returns it in *out
 * (completes it at once for a single process). Frees r on failure. */
dt_status dt_comm_submit(dt_comm *c, dt_request *r, dt_request **out);
/* Exclusive use of the transport (after every queued op) / its release. */
void dt_comm_acquire(dt_comm *c);
void dt_comm_release(dt_comm *c);
/* Records a transport failure so every later call fails with the same message. Returns s. */
dt_status dt_comm_fail(dt_comm *c, dt_status s);
/* c's first failure again, as this thread's last error (with its peer). Returns it. */
dt_status dt_comm_failed_error(dt_comm *c);
/* Stops the progress thread after it finished every queued op. */
void dt_comm_stop_thread(dt_comm *c);
/* Internal allgather of `bytes` per rank (used by split), as collective #seq. */
dt_status dt_comm_allgather_bytes(dt_comm *c, const void *send, void *recv, size_t bytes, dt_coll_op op);

#endif
