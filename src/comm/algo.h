/* Collective algorithms written once over the transport table (transport.h): ring,
 * recursive doubling, recursive halving-doubling, binomial trees, pairwise exchange,
 * dissemination barrier. The communicator (comm.c) picks one per call; every function needs
 * size > 1, a valid descriptor already posted with ops->begin, and returns the transport's
 * error as is. AVG is computed as SUM then a division by size on the final data. */
#ifndef DT_COMM_ALGO_H
#define DT_COMM_ALGO_H

#include "comm/transport.h"

/* Scratch space owned by the communicator, grown on demand. */
typedef struct {
    void *buf[2];
    size_t cap[2];
} dt_scratch;

typedef struct {
    dt_transport *t;
    int rank, size;
    double deadline;   /* of the whole op */
    dt_comm_algo algo; /* resolved choice for this call (never AUTO) */
    dt_scratch *scratch;
    size_t seg_bytes; /* pipelining segment */
} dt_algo_ctx;

/* Returns scratch buffer `which` (0/1) of at least `bytes`, or NULL with DT_ENOMEM set. */
void *dt_algo_scratch(dt_algo_ctx *x, int which, size_t bytes);

/* Sends sbytes of sbuf to dst (-1: none) while receiving rbytes from src (-1: none) into rbuf,
 * reduced into it (redop >= 0) or copied (redop < 0); pipelined in segments. Both sides of a
 * transfer must call it (the segmentation depends on bytes and dtype only). */
dt_status dt_algo_exchange(dt_algo_ctx *x, int dst, const void *sbuf, size_t sbytes, int src, void *rbuf, size_t rbytes,
                           dt_dtype t, int redop);

/* Reductions: RING, RD or RHD (non-power-of-two sizes handled by folding). send may == recv. */
dt_status dt_algo_allreduce(dt_algo_ctx *x, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op);
/* RING: reduce-scatter + gather of the blocks at root; TREE: binomial. recv used on root only. */
dt_status dt_algo_reduce(dt_algo_ctx *x, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op, int root);
/* RING only; send and recv must not overlap. */
dt_status dt_algo_reduce_scatter(dt_algo_ctx *x, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op);

/* Data movement. TREE: binomial; RING: pipelined chain. */
dt_status dt_algo_broadcast(dt_algo_ctx *x, void *buf, size_t bytes, int root);
/* block r of `bytes[r]` at recv + displ[r]; own block must already be in place. RING, or RD (power-of-two, equal
 * blocks). */
dt_status dt_algo_allgatherv(dt_algo_ctx *x, void *recv, const size_t *bytes, const size_t *displ);
dt_status dt_algo_gather(dt_algo_ctx *x, const void *send, void *recv, size_t bytes, int root);
dt_status dt_algo_scatter(dt_algo_ctx *x, const void *send, void *recv, size_t bytes, int root);
dt_status dt_algo_alltoall(dt_algo_ctx *x, const void *send, void *recv, size_t bytes);
dt_status dt_algo_barrier(dt_algo_ctx *x);

#endif
