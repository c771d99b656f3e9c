/* Internals of the MPI transport shared by transport_mpi.c (point-to-point, creation, abort,
 * destroy), transport_mpi_split.c, transport_mpi_check.c (the op check) and transport_mpi_coll.c
 * (native MPI collectives and the benchmark baseline).
 * Only compiled with DT_HAVE_MPI. */
#ifndef DT_COMM_TRANSPORT_MPI_H
#define DT_COMM_TRANSPORT_MPI_H

#ifdef DT_HAVE_MPI
#include "comm/transport.h"

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>

/* MPI tags on a transport's communicator: collective traffic, user tags shifted by one, and
 * the internal channels. MPI guarantees MPI_TAG_UB >= 32767. */
#define DT_MPI_TAG_COLL 0
#define DT_MPI_TAG_USER(t) ((t) + 1)
#define DT_MPI_TAG_DESC (DT_COMM_TAG_MAX + 2)  /* op descriptors to the ring neighbour */
#define DT_MPI_TAG_SPLIT (DT_COMM_TAG_MAX + 3) /* split rendezvous */
#define DT_MPI_TAG_ABORT (DT_COMM_TAG_MAX + 4) /* abort notices */
#define DT_MPI_DESC_SLOTS 64 /* own ops remembered for the check; the most a rank runs ahead of its left */
#define DT_MPI_DESC_RECVS 4  /* receives posted for the left rank's descriptors */
#define DT_MPI_PROBE_S 0.2   /* an in-band-checked op waiting this long sends its descriptor after all */
#define DT_MPI_INBAND_MAX ((size_t)256 << 10) /* in-band check up to this many bytes per rank */
#define DT_MPI_INBAND_RANKS 16                /* and this many ranks (the sums of its check words stay exact in f32) */

typedef struct {
    dt_transport base;
    MPI_Comm comm;
    dt_treq *pending; /* posted, not yet completed requests */
    atomic_int woken;
    dt_coll_desc cur; /* the current op (for messages) */
    double timeout_s; /* bound of internal waits (op-check slots) */
    bool broken;      /* an error happened: later waits fail at once */
    dt_status err;
    char errmsg[560];
    /* abort notices from any rank */
    MPI_Request abort_req;
    char abort_buf[576], abort_out[576]; /* int status, kind 'A'/'F', message */
    /* the op check (transport_mpi_check.c): every collective either carries check words in its
     * own data (in-band: native allreduce / allgather up to DT_MPI_INBAND_MAX) or sends its
     * descriptor to rank+1, which compares it with its own op of that seq (and rank-1's to us) */
    bool check;
    uint64_t check_seq;                   /* seq of the latest op begun here (0: none yet) */
    uint64_t expect_lo;                   /* no op below it still waits for the left rank's descriptor */
    uint64_t check_events;                /* descriptors of the left rank handled (progress) */
    uint64_t desc_sent;                   /* descriptors sent (counters, tests) */
    dt_coll_desc hist[DT_MPI_DESC_SLOTS]; /* own ops by seq % SLOTS */
    unsigned char hist_state[DT_MPI_DESC_SLOTS], hist_probed[DT_MPI_DESC_SLOTS];
    MPI_Request hist_sreq[DT_MPI_DESC_SLOTS];
    dt_coll_desc left_buf[DT_MPI_DESC_RECVS]; /* the left rank's descriptors, taken in order */
    MPI_Request left_rreq[DT_MPI_DESC_RECVS];
    unsigned left_head;
    void *stage; /* in-band staging buffer */
    size_t stage_cap;
    int *world; /* [size] MPI_COMM_WORLD rank of each rank (dead-peer checks) */
} dt_mpi_transport;

/* Every MPI call of the library holds this lock (MPI is initialised THREAD_SERIALIZED). */
extern pthread_mutex_t dt_mpi_lock;

/* Sets t broken with status s and the formatted message, tells every other rank of t (their
 * waits fail with "rank R failed: ..."), and returns s with that last error. */
dt_status dt_mpi_fail(dt_mpi_transport *t, dt_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Advances the internal channels (abort notices, descriptor checks); DT_OK or the error. */
dt_status dt_mpi_progress_internal(dt_mpi_transport *t);
/* Idle state of a polling loop: poll (yielding the core) for a short spin window after the last
 * progress, or for as long as the data of the operation needs to move (busy_s), then sleep with
 * growing naps. MPI only progresses inside its calls: a non-blocking collective (libnbc's
 * MPI_Ireduce above all) advances one fragment per MPI_Test, so napping while its data is still
 * moving stalls it (docs/why.md, "MPI progresses only inside its calls"). Zero it to start (or
 * dt_mpi_idle_for), and
 * dt_mpi_idle_reset() on progress. */
typedef struct {
    double since;
    int naps;
    double busy_s;
} dt_mpi_idle;
void dt_mpi_backoff(dt_mpi_idle *w);
static inline void dt_mpi_idle_reset(dt_mpi_idle *w) {
    w->since = 0;
    w->naps = 0;
}
/* An idle state for a wait on an operation moving `bytes`: it polls without sleeping for the time
 * those bytes need at a pessimistic 0.25 GB/s (plus 1 ms), then naps of at most 20 us until 10x
 * that time, then longer ones: a peer that is late. */
static inline dt_mpi_idle dt_mpi_idle_for(double bytes) { return (dt_mpi_idle){.busy_s = 1e-3 + bytes / 0.25e9}; }
/* The nap dt_mpi_backoff takes el seconds into an idle stretch after w->naps naps (spin_s: the
 * spin window): 0 = poll again at once (yield), else nanoseconds to sleep. */
static inline long dt_mpi_nap_ns(const dt_mpi_idle *w, double el, double spin_s) {
    if (el < spin_s || el < w->busy_s) return 0;
    const int top = el < 10 * w->busy_s ? 2 : 7; /* 5..20 us while the data may still move, then up to 640 us */
    return 5000L << (w->naps < top ? w->naps : top);
}
/* Writes MPI's text for an error code into buf. */
const char *dt_mpi_errstr(int code, char *buf, size_t n);
/* Dead-peer detection (transport_mpi_live.c). Seconds between two checks in a wait: */
#define DT_MPI_LIVE_PERIOD 0.1
/* Records who each rank of the world is as a process (pid, start time, host) with one collective
 * over comm, a duplicate of MPI_COMM_WORLD, bounded by deadline; once per process. */
dt_status dt_mpi_live_init(MPI_Comm comm, double deadline);
/* Frees what dt_mpi_live_init recorded (before MPI_Finalize). */
void dt_mpi_live_free(void);
/* The MPI_COMM_WORLD rank of each of comm's size ranks, malloc'd (caller frees); NULL if out of memory. */
int *dt_mpi_live_ranks(MPI_Comm comm, int size);
/* The pid of t's rank peer if that process is known to be gone (it ran on this host and has
 * exited, was killed or is a zombie), else 0: alive, or elsewhere (then only the deadline tells). */
int dt_mpi_peer_gone(const dt_mpi_transport *t, int peer);
/* The MPI_COMM_WORLD rank of t's rank r (r itself when unknown), for messages. */
static inline int dt_mpi_world_of(const dt_mpi_transport *t, int r) { return t->world ? t->world[r] : r; }
/* Whether any rank of MPI_COMM_WORLD on this host is gone. */
bool dt_mpi_world_lost(void);
/* The first rank of t whose process is gone (its pid in *pid), or -1. */
int dt_mpi_any_gone(const dt_mpi_transport *t, int *pid);
/* Posts an MPI receive (recv) or send of bytes at buf with peer on MPI tag mtag (tag: the caller's,
 * for messages) into req, on t's pending list. */
dt_status dt_mpi_post(dt_mpi_transport *t, bool recv, int peer, int tag, int mtag, void *buf, size_t bytes,
                      dt_treq *req);
/* ops->waitall; wraps comm (a duplicate or a new group) as a transport (under dt_mpi_lock). */
dt_status dt_mpi_waitall(dt_transport *tt, dt_treq *const *reqs, int n, double deadline);
dt_status dt_mpi_wrap(MPI_Comm comm, double timeout_s, dt_transport **out);
/* ops->split (transport_mpi_split.c). */
dt_status dt_mpi_split(dt_transport *tt, int color, const int *members, int new_size, int new_rank, uint64_t split_id,
                       double deadline, dt_transport **out);
/* The op check (transport_mpi_check.c). Sets up / releases its channel on t (at create / destroy). */
void dt_mpi_check_init(dt_mpi_transport *t);
void dt_mpi_check_free(dt_mpi_transport *t);
/* ops->begin: records op d (the rank's next collective); blocks (bounded) while the left rank is
 * DT_MPI_DESC_SLOTS ops behind. The descriptor goes out at dt_mpi_check_decide or the op's first
 * message, whichever comes first. */
dt_status dt_mpi_check_begin(dt_transport *tt, const dt_coll_desc *d);
/* The current op is checked in-band (true: no descriptor unless it stalls) or not (sent now). */
dt_status dt_mpi_check_decide(dt_mpi_transport *t, bool inband);
/* Sends the current op's descriptor if it is not decided yet (before its first p2p message). */
dt_status dt_mpi_check_flush(dt_mpi_transport *t);
/* Handles the left rank's descriptors that arrived (called by dt_mpi_progress_internal). */
dt_status dt_mpi_check_progress(dt_mpi_transport *t);
/* Whether the current op still waits for the left rank's descriptor of it. */
bool dt_mpi_check_waiting(const dt_mpi_transport *t);
/* An in-band op has waited `waited` seconds: from DT_MPI_PROBE_S on, its descriptor goes out once. */
dt_status dt_mpi_check_stalled(dt_mpi_transport *t, double waited);
/* Native allreduce / allgather with the check words in their data (when dt_mpi_inband_ok). */
bool dt_mpi_inband_ok(const dt_mpi_transport *t, const dt_coll_args *a);
dt_status dt_mpi_inband_coll(dt_mpi_transport *t, const dt_coll_args *a, MPI_Datatype ty, MPI_Op mop,
                             dt_status (*wait)(dt_mpi_transport *, MPI_Request *, const dt_coll_args *));
/* The native collective entry of the vtable (transport_mpi_coll.c). */
dt_status dt_mpi_coll(dt_transport *tt, const dt_coll_args *a);

#endif
#endif
