/* dtrain communicator: rank/size, collectives (allreduce, broadcast, reduce, allgather(v),
 * reduce-scatter, gather, scatter, alltoall, barrier), tagged point-to-point, non-blocking
 * variants with requests, and split into sub-communicators. Algorithms (ring, recursive
 * doubling, halving-doubling, binomial tree, shm direct reduce) run over a transport
 * (shm for local workers, MPI under mpirun/srun). Nothing blocks forever: every wait has a
 * deadline, a dead peer or a mismatched collective becomes an error on every live rank.
 *
 * Buffer conventions (counts are in elements of `dtype`, per rank where it says so):
 *   allreduce       send[count] -> recv[count]                      in place: send == recv
 *   broadcast       buf[count], root's copy to everyone
 *   reduce          send[count] -> recv[count] on root (recv unused elsewhere, may be NULL)
 *   allgather       send[count] -> recv[size*count], rank r's block at recv + r*count
 *                   in place: send == recv + rank*count, or send == recv (same meaning)
 *   allgatherv      send[counts[rank]] -> recv, block r at recv + displs[r] (displs NULL: packed)
 *   reduce_scatter  send[size*count] -> recv[count] = block `rank` of the reduction
 *                   in place: send == recv (result in the first count elements)
 *   gather          send[count] -> recv[size*count] on root; in place: send == recv + root*count
 *   scatter         send[size*count] on root -> recv[count]; in place: recv == send + root*count
 *   alltoall        send[size*count] -> recv[size*count], block j of send goes to rank j
 * Any other overlap of send and recv is handled by copying the input first.
 * bf16/f16 are reduced in f32 precision (converted, reduced, rounded once per step).
 * Reductions give bitwise-identical results on every rank.
 *
 * Environment: DTRAIN_TIMEOUT (seconds, default 300) deadline of every blocking wait;
 * DTRAIN_COMM_ALGO (auto|ring|rd|rhd|tree|direct|native) forces an algorithm; tuning knobs for
 * benchmarks: DTRAIN_COMM_SEG (pipelining segment of our algorithms, bytes), and for shm
 * DTRAIN_SHM_CHUNK (direct-collective chunk; default 512 KiB cut so that the n ranks' slots fit
 * DTRAIN_SHM_DIRECT, default 4 MiB: every rank maps all of them), DTRAIN_SHM_FRAG (channel fragment),
 * DTRAIN_SHM_SMALL (allreduce size reduced whole by every rank), DTRAIN_SHM_NT (results at least
 * this large use streaming stores), DTRAIN_SHM_SPIN_US (spin before sleeping on a futex; default
 * 200 us on the thread that created the communicator, 50 on others such as its progress thread, 0
 * when the ranks outnumber the CPUs they may run on, also on a communicator split from such a job).
 *
 * Threads: a communicator is called from one thread at a time (non-blocking ops progress on
 * its own internal thread). Create and destroy it on a thread that lives as long as it does
 * (peers use a robust mutex owned by the creating thread to tell that the rank is alive). */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_comm dt_comm;
typedef struct dt_request dt_request;

/* Reduction operators. AVG is SUM divided by the communicator size (integer division for ints). */
typedef enum { DT_OP_SUM = 0, DT_OP_AVG, DT_OP_MAX, DT_OP_MIN, DT_OP_PROD, DT_OP_COUNT } dt_redop;

/* Transports. AUTO picks from the environment (see dt_comm_create_from_env). The enum names the
 * first transports only; dt_comm_config.transport names any entry of the registry by its name. */
typedef enum { DT_BACKEND_AUTO = 0, DT_BACKEND_SHM, DT_BACKEND_MPI, DT_BACKEND_SELF } dt_backend;

/* Algorithms; AUTO chooses by message size and world size. Others force one where it applies
 * (a collective without that variant uses its default); for benchmarks and tests. */
typedef enum {
    DT_ALGO_AUTO = 0,
    DT_ALGO_RING,   /* ring: reduce-scatter + allgather, bandwidth-optimal */
    DT_ALGO_RD,     /* recursive doubling, latency-optimal */
    DT_ALGO_RHD,    /* recursive halving (reduce-scatter) + doubling (allgather), Rabenseifner */
    DT_ALGO_TREE,   /* binomial tree (broadcast, reduce, gather, scatter) */
    DT_ALGO_DIRECT, /* shm only: ranks reduce slices straight from peers' buffers in the segment */
    DT_ALGO_NATIVE, /* the transport's own collective (MPI_Allreduce ...) */
    DT_ALGO_COUNT
} dt_comm_algo;

/* Explicit creation parameters. Start from dt_comm_config_default(). */
typedef struct {
    int rank;                 /* this process's rank, 0..size-1 */
    int size;                 /* world size; 1 = a single process (no transport needed) */
    int local_rank;           /* rank among the processes of this host (informational) */
    const char *job_id;       /* shm: names the job's segment; all ranks of a job pass the same id */
    dt_backend backend;       /* AUTO: shm when size > 1 (explicit create) */
    dt_comm_algo algo;        /* AUTO unless overridden; DTRAIN_COMM_ALGO env overrides AUTO */
    double timeout_s;         /* deadline of every blocking wait; 0 = env DTRAIN_TIMEOUT or 300 s */
    const char *timeout_knob; /* what sets timeout_s for the user (e.g. "--timeout"), named in timeout
                               * errors; NULL = "dt_comm_config.timeout_s" when set, else DTRAIN_TIMEOUT */
    const char *transport;    /* a transport by name, "NAME[:OPTIONS]" (dt_comm_transport_help lists them:
                               * "shm", "nccl:bootstrap=mpi", ...); NULL or "auto" = by `backend` */
    const char *device;       /* the device spec the ranks keep model memory on ("cuda", "cuda:1"), for the
                               * automatic choice (nccl when every rank is on a CUDA device); NULL = host */
} dt_comm_config;

/* Default config: rank 0 of 1, backend AUTO, algo AUTO, timeout from the environment. */
dt_comm_config dt_comm_config_default(void);

/* Creates a communicator from explicit rank/size/job id. Collective over the `size` processes
 * of the job (they must all call it within the timeout). *out is owned by the caller. */
dt_status dt_comm_create(dt_comm **out, const dt_comm_config *cfg);

/* Creates a communicator from the environment: DTRAIN_RANK, DTRAIN_WORLD_SIZE,
 * DTRAIN_LOCAL_RANK, DTRAIN_JOB_ID (set by `dtrain launch`) -> shm; OMPI_COMM_WORLD_RANK/SIZE,
 * PMI_RANK/SIZE or SLURM_PROCID/NTASKS (mpirun/srun) -> mpi; none -> world size 1.
 * cfg (may be NULL) supplies backend (overrides the choice unless AUTO), algo and timeout;
 * its rank/size/job_id are ignored. */
dt_status dt_comm_create_from_env(dt_comm **out, const dt_comm_config *cfg);

/* True when the environment makes this process one rank of a job, by the same rules as
 * dt_comm_create_from_env: DTRAIN_RANK or DTRAIN_WORLD_SIZE set, or one of the launcher pairs
 * (OMPI_COMM_WORLD_RANK+SIZE, PMI_RANK+SIZE, SLURM_PROCID+NTASKS) set in full. A lone
 * SLURM_PROCID (an sbatch script) is not a rank. */
bool dt_comm_env_is_rank(void);

/* Longest job id accepted (characters, without the NUL). */
#define DT_COMM_JOB_ID_MAX 200

/* True when id is a valid job id: 1..DT_COMM_JOB_ID_MAX characters of [A-Za-z0-9_.]. The shm
 * segments of job J are "/dev/shm/dtrain-J" and, for splits, "dtrain-J.<split>.<color>"; '-' is
 * not allowed so that no job's names can match other dtrain files such as the data-set cache
 * "dtrain-data-<key>.v1". */
bool dt_comm_job_id_valid(const char *id);

/* Frees the communicator (waits for queued non-blocking ops, up to the timeout). NULL is a no-op.
 * Peers still waiting on this rank get DT_EPEER ("rank R left"). */
void dt_comm_destroy(dt_comm *c);

/* This process's rank in c (0 .. size-1), and the number of ranks of c. */
int dt_comm_rank(const dt_comm *c);
int dt_comm_size(const dt_comm *c);
/* Name of the transport in use: "self", "shm", "mpi", "nccl" (an entry of the transport registry). */
const char *dt_comm_backend_name(const dt_comm *c);

/* The transport registry, for help texts: "auto (...); shm: ...; mpi: ...; nccl[:OPTIONS]: ...",
 * one clause per transport with its options and one line of help. */
const char *dt_comm_transport_help(void);
/* The transports' names, "shm, mpi, nccl or self" (registry order). */
const char *dt_comm_transport_names(void);
/* DT_OK when spec is "auto" or names a transport of the registry ("NAME[:OPTIONS]", options only
 * where it takes any); else DT_EINVAL with a message listing the names. Options are checked in
 * full when the transport is created. */
dt_status dt_comm_transport_check(const char *spec);
/* Gives c's device-memory transport (nccl) the stream its collectives on device buffers run on:
 * an opaque handle of the device (a cudaStream_t), on which the caller has ordered the work that
 * wrote the buffers (events from the compute stream). NULL (the default): the transport
 * synchronises the device before each collective on device memory instead. A no-op for transports
 * that take host memory only. Call between ops, on every rank alike or not. */
void dt_comm_set_stream(dt_comm *c, void *stream);

/* Splits c by color: ranks with the same color form a new communicator, ordered by (key, parent
 * rank). Collective over c. color < 0 (DT_COMM_UNDEFINED) gives *out = NULL. */
#define DT_COMM_UNDEFINED (-1)
dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out);

/* Hierarchical allreduce (comm_hier.c): shm reduce within each host, allreduce among one leader
 * per host, shm broadcast. AUTO: on when the ranks span hosts and some host has several; FLAT:
 * off; ON: forced (also on one host). Hosts are told apart by hostname (DTRAIN_HOSTNAME
 * overrides it, for tests). */
typedef enum { DT_HIER_AUTO = 0, DT_HIER_FLAT, DT_HIER_ON } dt_comm_hier_mode;
typedef struct dt_comm_hier dt_comm_hier;
/* Learns the host layout and sets up (or drops) the hierarchical allreduce for every later
 * allreduce on c. Collective over c; call with no non-blocking op of c in flight. */
dt_status dt_comm_set_hier(dt_comm *c, dt_comm_hier_mode mode);
/* Pipeline chunk of the hierarchical allreduce in bytes (0: no pipelining; the default comes
 * from DTRAIN_HIER_CHUNK or comm_hier.c). Call after dt_comm_set_hier, on every rank alike. */
dt_status dt_comm_set_hier_chunk(dt_comm *c, size_t bytes);
/* True when c's allreduce runs hierarchically. */
bool dt_comm_hier_active(const dt_comm *c);
/* Hosts c's ranks span, as dt_comm_set_hier found them (0 before it ran or with FLAT). */
int dt_comm_hosts(const dt_comm *c);
/* Whether c's collectives take buffers in the memory of the device kind named `device` (e.g.
 * "checked") directly (the transport says so: nccl does for "cuda"; shm and mpi for none). Where false, a caller
 * with device buffers downloads them into host buffers, runs the collective there and uploads the
 * result. A device whose memory is host memory (cpu) needs no asking. False for a single process
 * and while the hierarchical allreduce is active (its sub-communicators are not asked). */
bool dt_comm_device_native(const dt_comm *c, const char *device);
/* The CPUs that c's ranks on this host may run on together (their affinity masks' union), with
 * *ranks, how many of c's ranks run there; 0 (and *ranks 0) where the transport cannot tell (mpi)
 * and for a single process. */
int dt_comm_host_cpus(const dt_comm *c, int *ranks);
/* Bytes this rank's ops on c moved since it was created, counted as bus bytes (nccl-tests:
 * allreduce 2(n-1)/n x size, allgather / reduce-scatter / alltoall (n-1)/n x the gathered size,
 * broadcast / reduce / gather / scatter / send / recv the size; whatever algorithm ran), for
 * metrics per mesh axis; *ops (may be NULL) gets the number of ops. 0 for a single process. */
uint64_t dt_comm_bytes(const dt_comm *c, uint64_t *ops);

/* Overrides the algorithm choice for later calls on this communicator (AUTO restores). */
void dt_comm_set_algo(dt_comm *c, dt_comm_algo algo);

/* ---- blocking collectives (collective over all ranks of c; see the buffer table above) ---- */

dt_status dt_comm_allreduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op);
dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int root);
dt_status dt_comm_reduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op, int root);
dt_status dt_comm_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype);
/* counts[size] elements contributed by each rank; displs[size] element offsets into recv (NULL: packed). */
dt_status dt_comm_allgatherv(dt_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                             dt_dtype dtype);
dt_status dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op);
dt_status dt_comm_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype, int root);
dt_status dt_comm_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype, int root);
dt_status dt_comm_alltoall(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype);
dt_status dt_comm_barrier(dt_comm *c);

/* ---- point-to-point (tag 0..DT_COMM_TAG_MAX; messages between a pair with one tag arrive in
 * order; the receive count must equal the send count) ---- */
#define DT_COMM_TAG_MAX 16383
dt_status dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype dtype, int peer, int tag);
dt_status dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int peer, int tag);

/* ---- non-blocking: start the op and return a request at once. Ops of one communicator run in
 * issue order on its progress thread (no polling needed); buffers must stay valid and untouched
 * until the request completes. Blocking calls issued meanwhile run after them. ---- */

dt_status dt_comm_iallreduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op,
                             dt_request **req);
dt_status dt_comm_ibroadcast(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int root, dt_request **req);
dt_status dt_comm_iallgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype, dt_request **req);
dt_status dt_comm_ireduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype, dt_redop op,
                                  dt_request **req);
dt_status dt_comm_isend(dt_comm *c, const void *buf, size_t count, dt_dtype dtype, int peer, int tag, dt_request **req);
dt_status dt_comm_irecv(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int peer, int tag, dt_request **req);

/* Waits (within the communicator's timeout) for *req to finish, frees it and sets *req = NULL.
 * Returns the op's status; its error message becomes this thread's last error. NULL *req: DT_OK. */
dt_status dt_request_wait(dt_request **req);
/* Never blocks. *done = true when finished: then like dt_request_wait (frees, returns status). */
dt_status dt_request_test(dt_request **req, bool *done);
/* Waits for all n requests (NULL entries allowed); returns the first error, frees every one. */
dt_status dt_request_waitall(dt_request **reqs, int n);

/* ---- names and parsing (for flags and messages) ---- */

const char *dt_redop_name(dt_redop op); /* "sum", "avg", "max", "min", "prod" */
dt_status dt_redop_parse(const char *s, dt_redop *out);
const char *dt_backend_name(dt_backend b); /* "auto", "shm", "mpi", "self" */
dt_status dt_backend_parse(const char *s, dt_backend *out);
const char *dt_comm_algo_name(dt_comm_algo a); /* "auto", "ring", "rd", "rhd", "tree", "direct", "native" */
dt_status dt_comm_algo_parse(const char *s, dt_comm_algo *out);

/* Removes the shm segment of a job if a crash left it behind (for launchers); DT_OK if absent. */
dt_status dt_comm_shm_cleanup(const char *job_id);

#ifdef __cplusplus
}
#endif
/* Baseline for `dtrain bench comm`: times `iters` (after `warmup`) plain MPI_Allreduce calls of
 * `count` f32 (sum) on MPI_COMM_WORLD; *usec = mean time per call, equal on all ranks (max over
 * ranks). Needs MPI to be initialised already (an mpi communicator exists). Without MPI:
 * DT_ENOTSUP. */
dt_status dt_comm_bench_mpi_allreduce(size_t count, int warmup, int iters, double *usec);
/* The same for plain MPI_Reduce to rank 0: the row that shows a slow non-blocking reduce. */
dt_status dt_comm_bench_mpi_reduce(size_t count, int warmup, int iters, double *usec);

#endif
