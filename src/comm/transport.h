/* The transport interface (NCCL/gloo style). A transport moves bytes between the ranks of one
 * communicator; the collective algorithms in src/comm/ (ring, recursive doubling, trees ...)
 * are written once over this table, so a new transport gets every algorithm. A transport may
 * also offer native collectives (shm's direct shared-buffer reduce, MPI_Allreduce); the
 * communicator tries them first and falls back to its own algorithms on DT_ENOTSUP.
 *
 * One transport = one module (src/comm/transport_shm.c, transport_mpi.c, transport_nccl.c), each an
 * entry of the registry below (transports.c), which the communicator, the CLI's --backend help and
 * the man page read.
 *
 * Threading: the communicator serialises every call into one transport (at most one thread is
 * inside it at a time), except ops->wake, which may be called from any thread at any time.
 *
 * Errors: a failed wait returns DT_ETIMEDOUT (deadline passed), DT_EPEER (a peer died or left)
 * or DT_EMISMATCH (a peer is in a different collective), with a dt_error() message that names
 * the peer rank and the current op as formatted by dt_coll_desc_str(), e.g.
 *   "rank 2 died during allreduce #57 (f32 x 1000)"
 *   "rank 0 called allreduce(f32 x 100) but rank 1 called broadcast(f32 x 100) at #12".
 * After any error the communicator is broken: it calls nothing but destroy (and abort) again. */
#ifndef DT_COMM_TRANSPORT_H
#define DT_COMM_TRANSPORT_H

#include "dtrain/comm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* What a rank is doing: posted at the start of every op (ops->begin) so peers can detect a
 * mismatch, and used to name the op in error messages. */
typedef enum {
    DT_COLL_ALLREDUCE = 1,
    DT_COLL_BROADCAST,
    DT_COLL_REDUCE,
    DT_COLL_ALLGATHER,
    DT_COLL_ALLGATHERV,
    DT_COLL_REDUCE_SCATTER,
    DT_COLL_GATHER,
    DT_COLL_SCATTER,
    DT_COLL_ALLTOALL,
    DT_COLL_BARRIER,
    DT_COLL_SPLIT,
    DT_COLL_SEND,
    DT_COLL_RECV,
    DT_COLL_OP_COUNT
} dt_coll_op;

typedef struct {
    uint64_t seq;  /* collective sequence number on this communicator, from 1 (p2p ops: 0) */
    uint8_t op;    /* dt_coll_op */
    uint8_t dtype; /* dt_dtype */
    uint8_t redop; /* dt_redop (0 where it does not apply) */
    uint8_t pad_;
    int32_t root;   /* root rank; peer rank for send/recv; -1 where it does not apply */
    int32_t tag;    /* send/recv tag, else 0 */
    uint64_t count; /* element count as passed by the caller */
} dt_coll_desc;

/* Writes e.g. "allreduce #57 (f32 x 1000)" or "recv from rank 3 tag 5 (f32 x 10)"; returns buf. */
const char *dt_coll_desc_str(const dt_coll_desc *d, char *buf, size_t n);
/* Writes e.g. "allreduce(f32 x 100)" or "broadcast(f32 x 100, root 1)" (no seq); returns buf. */
const char *dt_coll_desc_call_str(const dt_coll_desc *d, char *buf, size_t n);
/* True when two ranks' descriptors of the same seq describe the same call. */
bool dt_coll_desc_match(const dt_coll_desc *a, const dt_coll_desc *b);
/* Name of an op: "allreduce", "broadcast", ... */
const char *dt_coll_op_name(dt_coll_op op);

/* Tag used by the communicator for all collective traffic. Collective messages between a pair
 * of ranks must arrive in send order and never match a user tag (0..DT_COMM_TAG_MAX): keep
 * them apart (e.g. MPI: a dup'ed communicator; shm: a separate channel per pair). */
#define DT_TAG_COLL (-1)

/* A point-to-point request. Storage is the caller's and must not move until it completes or the
 * transport is destroyed; the transport keeps its state in priv. Zero it before isend/irecv. */
typedef struct dt_treq {
    int peer, tag;
    size_t bytes;
    bool done;
    dt_status status;     /* valid when done */
    struct dt_treq *next; /* transport's use (pending lists) */
    union {
        void *p[6];
        uint64_t u[6];
    } priv;
} dt_treq;

/* Transports: resets req for a new isend/irecv of `bytes` with peer and tag (not done, priv zeroed). */
static inline void dt_treq_reset(dt_treq *req, int peer, int tag, size_t bytes) {
    req->peer = peer;
    req->tag = tag;
    req->bytes = bytes;
    req->done = false;
    req->status = DT_OK;
    req->next = NULL;
    memset(&req->priv, 0, sizeof req->priv);
}

typedef struct dt_transport dt_transport;

/* Arguments of a native collective (ops->coll). */
typedef struct {
    dt_coll_desc d;   /* op, seq, dtype, count, root, redop */
    const void *send; /* input; == recv for in place (see comm.h buffer table) */
    void *recv;
    const size_t *counts; /* allgatherv: elements per rank */
    const size_t *displs; /* allgatherv: element offsets into recv (never NULL here) */
    dt_comm_algo algo;    /* requested: AUTO, DIRECT, NATIVE; other values: return DT_ENOTSUP */
    double deadline;      /* dt_now() time after which a wait fails with DT_ETIMEDOUT */
} dt_coll_args;

typedef struct dt_transport_ops {
    const char *name; /* "shm", "mpi" */

    /* Post a send/recv of `bytes` to/from `peer` with `tag` (>= 0 user tag, or DT_TAG_COLL).
     * Never blocks for long; completion by test/waitall. A receive must be matched by a send of
     * the same size (else DT_EFORMAT/DT_EMISMATCH). send and recv buffers may not overlap. */
    dt_status (*isend)(dt_transport *t, int peer, int tag, const void *buf, size_t bytes, dt_treq *req);
    dt_status (*irecv)(dt_transport *t, int peer, int tag, void *buf, size_t bytes, dt_treq *req);
    /* Advances every posted request without blocking; sets *done for req. */
    dt_status (*test)(dt_transport *t, dt_treq *req, bool *done);
    /* Blocks until reqs[0..n) are done (NULL entries skipped), advancing all posted requests
     * and sleeping (futex/poll, not spinning) when idle; DT_ETIMEDOUT after `deadline`. With
     * n == 0 it returns at the first sign of progress, on wake(), or at the deadline (DT_OK). */
    dt_status (*waitall)(dt_transport *t, dt_treq *const *reqs, int n, double deadline);
    /* Thread-safe: makes a concurrent waitall(n == 0) return soon. May be NULL (then the caller
     * uses short deadlines). */
    void (*wake)(dt_transport *t);

    /* Start of each op: posts d for mismatch detection and error messages. May be NULL. */
    dt_status (*begin)(dt_transport *t, const dt_coll_desc *d);
    /* Optional native collective; DT_ENOTSUP (without side effects) makes the communicator run
     * its own algorithm. NULL = none. */
    dt_status (*coll)(dt_transport *t, const dt_coll_args *a);

    /* Makes every rank's current and later waits fail with status s and message msg (best
     * effort; used when this rank detects an error others cannot see). May be NULL. */
    void (*abort)(dt_transport *t, dt_status s, const char *msg);
    /* Creates the transport of a sub-communicator. Collective over the parent; `members` lists
     * the parent ranks of the new group in new-rank order (members[new_rank] == t->rank), and
     * split_id is unique per split on the parent and equal on all its ranks. The communicator
     * calls it on every parent rank whose color is >= 0 (each with its own group, new_size may
     * be 1), right after an allgather of (color, key) on the parent. NULL = not supported. */
    dt_status (*split)(dt_transport *t, int color, const int *members, int new_size, int new_rank, uint64_t split_id,
                       double deadline, dt_transport **out);
    /* The CPUs this transport's ranks on this host may run on together, with *ranks (how many
     * of them run there); 0 when the transport does not know. May be NULL. */
    int (*host_cpus)(dt_transport *t, int *ranks);
    /* Whether its collectives take buffers in the memory of the device kind named `device` (NCCL:
     * "cuda") directly. NULL = none: a caller with such buffers stages them through host memory
     * (dt_comm_device_native). shm and mpi take host memory only. */
    bool (*device_native)(dt_transport *t, const char *device);
    /* The first other rank that has not begun op #seq (its newest descriptor from begin is
     * older), or -1 when every rank has or the transport cannot tell: names the culprit when work
     * this transport did not carry times out (nccl's, over this bootstrap). May be NULL. */
    int (*behind)(dt_transport *t, uint64_t seq);
    /* dt_comm_set_stream: the device stream its device-memory work runs on (opaque). May be NULL. */
    void (*set_stream)(dt_transport *t, void *stream);
    /* Frees everything (does not touch outstanding dt_treq storage). NULL t is a no-op. */
    void (*destroy)(dt_transport *t);
} dt_transport_ops;

/* Every transport struct starts with this. */
struct dt_transport {
    const dt_transport_ops *ops;
    int rank, size;
    char timeout_knob[40]; /* what the user raises when a wait times out (set by comm.c) */
};

/* Who started the ranks of a job: nobody (explicit dt_comm_create, or one process), dtrain launch
 * (DTRAIN_RANK/WORLD_SIZE), or mpirun/srun (their rank variables). */
typedef enum { DT_LAUNCH_NONE = 0, DT_LAUNCH_LOCAL, DT_LAUNCH_MPI } dt_launcher;

/* Creation parameters shared by the transport constructors. */
typedef struct {
    int rank, size, local_rank; /* shm: required; mpi: ignored (MPI decides), result in t->rank/size */
    const char *job_id;         /* shm: names the segment */
    double timeout_s;           /* how long creation may wait for the other ranks */
    const char *options;        /* the text after "NAME:" in a transport spec ("" or NULL: none) */
    const char *device;         /* the device spec the ranks keep model memory on ("cuda:1"); NULL: host */
    dt_launcher launcher;       /* who started the ranks */
} dt_transport_params;

/* ---- the registry (transports.c): one entry per transport, NCCL's ncclTransports[] style ----
 * Adding a transport is one file defining `const dt_transport_kind dt_transport_kind_NAME` plus
 * its name in transports.c's DT_TRANSPORT_KINDS line. */
typedef struct dt_transport_kind {
    const char *name;    /* "shm": what --backend and dt_comm_config.transport take */
    const char *help;    /* one line for --help and the man page */
    const char *options; /* its option syntax for the help ("bootstrap=shm|mpi"), "" when it has none */
    /* Whether it can run this job here (canConnect): the automatic choice takes the first entry
     * whose probe says yes. False with the reason in why[0..n) ("not under mpirun"). */
    bool (*probe)(const dt_transport_params *p, char *why, size_t n);
    /* Creates the transport (collective over the job's ranks); p->options are its own (an entry
     * without options never sees any: the registry refuses them). *out = NULL for no transport
     * (self: one process). */
    dt_status (*create)(dt_transport **out, const dt_transport_params *p);
} dt_transport_kind;

/* The registry, in the automatic choice's order of preference; *n gets its length. */
const dt_transport_kind *const *dt_transport_kinds(int *n);
/* *out = the entry named by spec "NAME[:OPTIONS]" (*options, may be NULL, gets the text after
 * ':' or ""); DT_EINVAL listing the names when none is. */
dt_status dt_transport_find(const char *spec, const dt_transport_kind **out, const char **options);
/* *out = the first entry whose probe accepts p; DT_ENOTSUP giving each entry's reason when none. */
dt_status dt_transport_choose(const dt_transport_params *p, const dt_transport_kind **out);
/* Creates the transport of `kind` for p (refusing options to an entry without them). */
dt_status dt_transport_create(const dt_transport_kind *kind, dt_transport **out, const dt_transport_params *p);

/* shm: POSIX shared memory + futexes, local ranks of one job (transport_shm.c). */
dt_status dt_transport_shm_create(dt_transport **out, const dt_transport_params *p);

/* mpi: OpenMPI/MPICH (transport_mpi.c). Initialises MPI if needed (MPI_THREAD_SERIALIZED at
 * least: a progress thread may call in) and finalises it in destroy if it initialised it.
 * Without DT_HAVE_MPI: returns DT_ENOTSUP "built without MPI: install libopenmpi-dev and rebuild". */
dt_status dt_transport_mpi_create(dt_transport **out, const dt_transport_params *p);

#endif
