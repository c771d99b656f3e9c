/* Internals of the shm transport shared by transport_shm.c (attach, liveness, waiting),
 * shm_segment.c (the segment's name, slot geometry, creation and opening), shm_p2p.c
 * (point-to-point channels) and shm_coll.c (direct shared-buffer collectives).
 *
 * Segment "/dtrain-<job>" (mode 0600, created O_EXCL by rank 0, unlinked by the last rank to
 * attach, so a crash after start-up leaves nothing in /dev/shm):
 *   header | rank blocks [n] | channels [src][dst][kind] | direct slots [n][d_slots]
 * Rank block: robust mutex held while the rank lives (EOWNERDEAD = it died), pid, left flag,
 * doorbell futex word (every event for this rank rings it), direct phase counter, and a ring of
 * posted op descriptors (mismatch detection). Channel (src->dst): a FIFO of fragments
 * (64-byte header + payload) with head/tail counters; kind 0 carries collective traffic in
 * order, kind 1 user point-to-point with tags. Waiting spins briefly, then sleeps on the own
 * doorbell with FUTEX_WAIT (100 ms slices: deadline, peer liveness and mismatch checks). */
#ifndef DT_COMM_SHM_H
#define DT_COMM_SHM_H

#include "comm/transport.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define SHM_MAGIC 0x6474726e73686d31ull /* "dtrnshm1" */
#define SHM_VERSION 2                   /* 2: rank blocks record their CPUs (shm_rank.cpus) */
#define SHM_LINE 128
#define SHM_DESC_RING 8
#define SHM_KINDS 2       /* 0: collective channel, 1: user point-to-point */
#define SHM_MAX_CPUS 1024 /* CPUs a rank block records (shm_rank.cpus) */

typedef struct {
    uint64_t magic;
    uint32_t version, size;
    uint64_t total_bytes;
    uint32_t slots[SHM_KINDS];      /* fragments per channel */
    uint32_t slot_bytes[SHM_KINDS]; /* payload bytes per fragment */
    uint32_t d_slots;               /* direct slots per rank */
    uint32_t small_bytes;           /* allreduce up to this size: every rank reduces it whole */
    uint64_t d_chunk;               /* bytes per direct slot */
    uint64_t off_ranks, off_chans, off_direct, chan_bytes[SHM_KINDS];
    _Atomic uint32_t ready, attached;
    _Atomic int32_t abort_state; /* 0 none, 2 set, 3 + r being written by rank r */
    int32_t abort_status;
    char abort_msg[512];
} shm_header;

typedef struct {
    pthread_mutex_t alive; /* robust + process-shared; locked by the live rank */
    int32_t pid;
    _Atomic int32_t left, dead;
    char pad0[SHM_LINE - sizeof(pthread_mutex_t) - 12];
    _Atomic uint32_t bell, sleeping;
    char pad1[SHM_LINE - 8];
    _Atomic uint64_t dphase;
    char pad2[SHM_LINE - 8];
    _Atomic uint64_t cur_seq; /* seq of the newest posted descriptor */
    dt_coll_desc desc[SHM_DESC_RING];
    uint64_t cpus[SHM_MAX_CPUS / 64]; /* the CPUs the rank may run on, written before it attaches */
} shm_rank;

/* How dt_shm_block waits (shm_wait.c): spin_s seconds of spinning (yielding every 16 rounds if
 * spin_yields), then `yields` sched_yield()s, then sleep on the doorbell. */
typedef struct {
    double spin_s;
    bool spin_yields;
    int yields;
} dt_shm_wait_policy;

typedef struct {
    _Atomic uint64_t tail; /* written by the sender */
    char pad0[SHM_LINE - 8];
    _Atomic uint64_t head; /* written by the receiver */
    char pad1[SHM_LINE - 8];
} shm_chan;

enum { FRAG_FIRST = 1, FRAG_LAST = 2 };

typedef struct {
    uint32_t len, flags;
    int32_t tag, src;
    uint64_t msg_bytes;
    dt_coll_desc desc;
    char pad[8];
} shm_frag; /* 64 bytes, followed by the payload */

/* an incoming user message nobody has posted a receive for yet */
typedef struct shm_unex {
    struct shm_unex *next;
    int tag;
    size_t bytes, off;
    bool complete;
    dt_treq *bound; /* receive waiting for it */
    unsigned char data[];
} shm_unex;

typedef struct {
    dt_treq *head, *tail;
} shm_reqq;

typedef struct {
    dt_transport base;
    char name[256];
    unsigned char *seg;
    size_t seg_bytes;
    shm_header *hdr;
    int n, me;
    double timeout_s;
    /* point-to-point state */
    shm_reqq *sendq, *recvq; /* [peer * SHM_KINDS + kind] */
    dt_treq **in_req;        /* [peer]: user message being received into a request */
    shm_unex **in_unex;      /* [peer]: ... or into an unexpected buffer */
    shm_unex **unex;         /* [peer]: unexpected messages, arrival order */
    int npending;
    /* current op (begin) */
    dt_coll_desc cur;
    bool in_coll;
    /* direct collectives */
    uint64_t myphase, gchunk;
    uint64_t *slot_free; /* [d_slots]: phase all ranks pass once done with the slot */
    /* waiting */
    pthread_t owner;                     /* the creating thread: waits there use wait_fg, elsewhere wait_bg */
    dt_shm_wait_policy wait_fg, wait_bg; /* the rank's own thread; its progress and helper threads */
    bool over;                           /* oversubscribed: more ranks than CPUs here, or a split of such a
                                          * job (its ranks share the CPUs with the parent's others) */
    double next_check;
    double check_delay_s;    /* DTRAIN_SHM_TEST_CHECK_DELAY_MS: tests widen the poll -> slow check gap */
    int waiting_on;          /* peer the current wait needs, for timeout messages */
    const dt_treq *what_req; /* user request being waited for (names it in errors) */
    char job[216];
    _Atomic int woken;
    bool broken;
} dt_shm;

static inline shm_rank *shm_rank_at(dt_shm *s, int r) {
    return (shm_rank *)(s->seg + s->hdr->off_ranks + (size_t)r * sizeof(shm_rank));
}
static inline shm_chan *shm_chan_at(dt_shm *s, int src, int dst, int kind) {
    size_t idx = ((size_t)src * (size_t)s->n + (size_t)dst);
    size_t off = s->hdr->off_chans + idx * (s->hdr->chan_bytes[0] + s->hdr->chan_bytes[1]);
    if (kind) off += s->hdr->chan_bytes[0];
    return (shm_chan *)(s->seg + off);
}
static inline shm_frag *shm_frag_at(dt_shm *s, shm_chan *c, int kind, uint64_t i) {
    size_t stride = sizeof(shm_frag) + s->hdr->slot_bytes[kind];
    return (shm_frag *)((unsigned char *)c + sizeof(shm_chan) + (size_t)(i % s->hdr->slots[kind]) * stride);
}
static inline unsigned char *shm_dslot(dt_shm *s, int r, uint64_t slot) {
    return s->seg + s->hdr->off_direct + ((size_t)r * s->hdr->d_slots + (size_t)slot) * s->hdr->d_chunk;
}

/* The segment (shm_segment.c). The shm name "/dtrain-<job>" into out (n bytes); DT_EINVAL for a
 * missing or malformed job id. */
dt_status dt_shm_job_name(char *out, size_t n, const char *job);
/* Rank 0: creates s->name (O_EXCL, 0600) sized by the slot geometry its environment chooses,
 * maps it into s->seg / s->hdr, initialises the header and the ranks' liveness mutexes, then
 * sets ready. Unlinks the name again when it fails after creating it. */
dt_status dt_shm_segment_create(dt_shm *s);
/* The other ranks: opens and maps s->name once rank 0 has created and initialised it (polling
 * until deadline), checking its magic, version, size and world size. */
dt_status dt_shm_segment_open(dt_shm *s, double deadline);

static inline void dt_shm_sleep_ms(double ms) {
    struct timespec ts = {0, (long)(ms * 1e6)};
    nanosleep(&ts, NULL);
}

/* The wait policy (shm_wait.c) where the job's ranks outnumber the CPUs they may run on together
 * (over), on a thread other than the one that created the transport (background: the
 * communicator's progress thread, ps's exchange and handler threads) or on that one; env_us: the value of
 * DTRAIN_SHM_SPIN_US (NULL or "" for the default), the spin of both threads in microseconds. */
dt_shm_wait_policy dt_shm_wait_policy_for(bool over, bool background, const char *env_us);
/* Records the CPUs this rank may run on in its rank block (before it attaches). */
void dt_shm_publish_cpus(dt_shm *s);
/* The number of CPUs that some rank of the job may run on (after every rank attached). */
int dt_shm_job_cpus(dt_shm *s);
/* The policy dt_shm_block waits with on the calling thread: wait_fg on the thread that created
 * the transport (the rank's own), wait_bg on any other (the progress thread, helpers). */
static inline const dt_shm_wait_policy *dt_shm_wait_here(const dt_shm *s) {
    return pthread_equal(pthread_self(), s->owner) ? &s->wait_fg : &s->wait_bg;
}

/* Rings rank r's doorbell if it sleeps (call after publishing what it waits for). */
void dt_shm_ring(dt_shm *s, int r);
/* A poll function for dt_shm_block: returns 1 done, 2 progress made, 0 nothing; may set *st. */
typedef int (*dt_shm_poll)(dt_shm *s, void *arg, dt_status *st);
/* Spins briefly, then sleeps on the own doorbell until poll() says done; checks the deadline,
 * the job's abort flag, peer liveness and posted descriptors. `what` names the op in errors. */
dt_status dt_shm_block(dt_shm *s, dt_shm_poll poll, void *arg, double deadline, bool stop_on_progress);
/* Publishes a job-wide failure (first one wins; a later caller waits until the first one's is
 * written, or its writer died or left) and wakes every rank. */
void dt_shm_abort(dt_shm *s, dt_status st, const char *msg);
/* dt_shm_abort, the transport marked broken, and the job's abort returned as the error. */
dt_status dt_shm_fail(dt_shm *s, dt_status st, const char *msg);
/* Reads peer p's descriptor for `seq` consistently; false if it has not posted that seq. */
bool dt_shm_peer_desc(dt_shm *s, int p, uint64_t seq, dt_coll_desc *out);
/* Checks peer p's posted descriptor for the current op; on a mismatch aborts the job and
 * returns DT_EMISMATCH naming both sides. */
dt_status dt_shm_check_peer(dt_shm *s, int p);
/* Builds the mismatch message/status for my current op vs a peer's descriptor. */
dt_status dt_shm_mismatch(dt_shm *s, int p, const dt_coll_desc *theirs);

/* Point-to-point over the channels (shm_p2p.c); see dt_transport_ops. */
dt_status dt_shm_isend(dt_transport *t, int peer, int tag, const void *buf, size_t bytes, dt_treq *req);
dt_status dt_shm_irecv(dt_transport *t, int peer, int tag, void *buf, size_t bytes, dt_treq *req);
dt_status dt_shm_test(dt_transport *t, dt_treq *req, bool *done);
dt_status dt_shm_waitall(dt_transport *t, dt_treq *const *reqs, int n, double deadline);
/* Advances every posted request once; returns 1 if anything moved. */
int dt_shm_progress(dt_shm *s, dt_status *st);

/* Direct collectives (shm_coll.c): DT_ENOTSUP when the op/algo is not handled here. */
dt_status dt_shm_coll(dt_transport *t, const dt_coll_args *a);

#endif
