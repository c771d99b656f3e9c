/* Internals of the NCCL transport shared by transport_nccl.c (creation over the bootstrap
 * transport, split, destroy, the registry entry) and transport_nccl_coll.c (collectives and
 * point-to-point on device buffers, waits with deadlines). Only built with DT_HAVE_NCCL.
 *
 * What the CUDA device (src/device/cuda/) must provide for this transport, and what the caller
 * (parallel/, which holds both the device and the communicator) does with it:
 *   - its communication stream as an opaque handle (a cudaStream_t cast to void *), e.g. a
 *     dt_device_ops slot `void *(*comm_stream)(dt_dev *d)`;
 *   - before a collective over device buffers, the work that wrote them is ordered before that
 *     stream (an event recorded on the compute stream, cudaStreamWaitEvent on the comm stream:
 *     the device's job, as for its bucket overlap);
 *   - the caller passes it once: dt_comm_set_stream(comm, d->ops->comm_stream(d)).
 * Without a stream the transport calls cudaDeviceSynchronize before each device collective
 * (correct, slower). A collective returns when its result is in the buffers (the transport waits
 * on an event recorded after it, polling with the deadline), so callers keep the blocking
 * semantics of every other transport. The CUDA device index: "cuda:N" in dt_comm_config.device,
 * else the local rank modulo the devices visible (the CUDA device's own default). */
#ifndef DT_COMM_TRANSPORT_NCCL_H
#define DT_COMM_TRANSPORT_NCCL_H

#include "comm/transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

/* device point-to-point requests not yet complete (posted or launched) */
#define DT_NCCL_MAX_DREQ 256

typedef struct dt_nccl {
    dt_transport base;
    dt_transport *host; /* the bootstrap transport (shm or mpi): host-memory traffic, begin, abort */
    ncclComm_t comm;
    int dev;            /* CUDA device index */
    cudaStream_t own;   /* the transport's stream when none is given */
    cudaStream_t given; /* dt_comm_set_stream's (NULL: none) */
    cudaEvent_t ev;     /* recorded after each collective */
    double timeout_s;
    bool broken;                     /* NCCL failed or was aborted: every later call fails */
    dt_coll_desc cur;                /* the op in progress (messages) */
    dt_treq *dreq[DT_NCCL_MAX_DREQ]; /* device p2p requests, not complete; priv.p[0]: event once launched */
    int ndreq;
} dt_nccl;

/* The NCCL ops table (transport_nccl_coll.c); split and destroy are transport_nccl.c's. */
extern const dt_transport_ops dt_nccl_ops;
dt_status dt_nccl_split(dt_transport *t, int color, const int *members, int new_size, int new_rank, uint64_t split_id,
                        double deadline, dt_transport **out);
void dt_nccl_destroy(dt_transport *t);
/* The stream device work runs on; syncs the device first when none was given. */
dt_status dt_nccl_prepare(dt_nccl *n, cudaStream_t *s);
/* Error text of an NCCL failure on n, with NCCL's last message. */
dt_status dt_nccl_error(dt_nccl *n, dt_status s, ncclResult_t r, const char *what);
/* Waits until a nonblocking NCCL call on n is enqueued (ncclInProgress resolved), up to deadline. */
dt_status dt_nccl_wait_enqueued(dt_nccl *n, double deadline, const char *what);
/* True when p is CUDA device (or managed) memory. */
bool dt_nccl_on_device(const void *p);

#endif
