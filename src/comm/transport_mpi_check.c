/* The op check of the MPI transport: ranks that call mismatched collectives get DT_EMISMATCH
 * naming both calls, not a hang or garbage. Two ways, chosen per op by its descriptor alone (so
 * every rank that calls the same op chooses the same):
 *  - in-band: a native allreduce or allgather of at most DT_MPI_INBAND_MAX bytes per rank on at
 *    most DT_MPI_INBAND_RANKS ranks carries check words in its own data. An allgather appends the
 *    op's descriptor to each rank's block (every rank sees every other's); an allreduce appends
 *    four 10-bit digits d of the descriptor's hash and, per digit, d^2 (sum) or 1023 - d (max,
 *    min): the reduced words equal size*d and size*d^2 (or d and 1023 - d) exactly when every rank
 *    had the same d. No message of its own: a small op costs no extra packet.
 *  - by message: every other op sends its descriptor to rank+1, which compares it with its own op
 *    of that seq; a native op does not return success before the left rank's descriptor of it was
 *    compared (a broadcast root could finish before a mismatch shows).
 * An in-band op that waits DT_MPI_PROBE_S (a rank may be in another op, which would hang it), or
 * whose check words disagree, sends its descriptor after all, so the neighbour names both calls.
 * The left rank's descriptors arrive in seq order: one for a seq below the one we wait on means
 * it skipped ours (its op there was in-band: another allreduce or allgather). */
#include "comm/transport.h"

#ifdef DT_HAVE_MPI
#include "comm/transport_mpi.h"

#include <stdlib.h>
#include <string.h>

enum { OP_NEW = 1, OP_INBAND, OP_SENT, OP_MATCHED }; /* hist_state */

#define SLOT(seq) ((int)((seq) % DT_MPI_DESC_SLOTS))
#define LOCK() pthread_mutex_lock(&dt_mpi_lock)
#define UNLOCK() pthread_mutex_unlock(&dt_mpi_lock)

static int left_of(const dt_mpi_transport *t) { return (t->base.rank + t->base.size - 1) % t->base.size; }

static dt_status post_left_recv(dt_mpi_transport *t, int k) {
    LOCK();
    int rc = MPI_Irecv(&t->left_buf[k], (int)sizeof(dt_coll_desc), MPI_BYTE, left_of(t), DT_MPI_TAG_DESC, t->comm,
                       &t->left_rreq[k]);
    UNLOCK();
    if (rc == MPI_SUCCESS) return DT_OK;
    char e[256];
    return dt_mpi_fail(t, DT_EPEER, "MPI could not post the op check's receive from rank %d: %s", left_of(t),
                       dt_mpi_errstr(rc, e, sizeof e));
}

void dt_mpi_check_init(dt_mpi_transport *t) { /* under the lock; a failed receive shows as a failed op check */
    for (int i = 0; i < DT_MPI_DESC_SLOTS; i++) t->hist_sreq[i] = MPI_REQUEST_NULL;
    t->expect_lo = 1;
    for (int i = 0; i < DT_MPI_DESC_RECVS; i++) {
        t->left_rreq[i] = MPI_REQUEST_NULL;
        if (t->check)
            MPI_Irecv(&t->left_buf[i], (int)sizeof(dt_coll_desc), MPI_BYTE, left_of(t), DT_MPI_TAG_DESC, t->comm,
                      &t->left_rreq[i]);
    }
}

void dt_mpi_check_free(dt_mpi_transport *t) { /* under the lock */
    for (int i = 0; i < DT_MPI_DESC_RECVS; i++)
        if (t->left_rreq[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&t->left_rreq[i]);
            MPI_Request_free(&t->left_rreq[i]);
        }
    for (int i = 0; i < DT_MPI_DESC_SLOTS; i++)
        if (t->hist_sreq[i] != MPI_REQUEST_NULL) MPI_Request_free(&t->hist_sreq[i]);
    dt_free(t->stage);
    t->stage = NULL;
}

/* Sends own op k's descriptor to the right rank. */
static dt_status send_desc(dt_mpi_transport *t, int k) {
    int right = (t->base.rank + 1) % t->base.size;
    LOCK();
    int rc = MPI_Isend(&t->hist[k], (int)sizeof(dt_coll_desc), MPI_BYTE, right, DT_MPI_TAG_DESC, t->comm,
                       &t->hist_sreq[k]);
    UNLOCK();
    if (rc != MPI_SUCCESS) {
        char e[256];
        return dt_mpi_fail(t, DT_EPEER, "MPI could not post the op check to rank %d: %s", right,
                           dt_mpi_errstr(rc, e, sizeof e));
    }
    t->desc_sent++;
    return DT_OK;
}

dt_status dt_mpi_check_decide(dt_mpi_transport *t, bool inband) {
    if (!t->check || t->check_seq == 0) return DT_OK;
    int k = SLOT(t->check_seq);
    if (t->hist_state[k] != OP_NEW) return DT_OK;
    t->hist_state[k] = inband ? OP_INBAND : OP_SENT;
    return inband ? DT_OK : send_desc(t, k);
}

dt_status dt_mpi_check_flush(dt_mpi_transport *t) { return dt_mpi_check_decide(t, false); }

bool dt_mpi_check_waiting(const dt_mpi_transport *t) {
    return t->check && t->check_seq && t->hist_state[SLOT(t->check_seq)] == OP_SENT;
}

dt_status dt_mpi_check_stalled(dt_mpi_transport *t, double waited) {
    if (!t->check || t->check_seq == 0 || waited < DT_MPI_PROBE_S) return DT_OK;
    int k = SLOT(t->check_seq);
    if (t->hist_state[k] != OP_INBAND || t->hist_probed[k]) return DT_OK;
    t->hist_probed[k] = 1;
    return send_desc(t, k);
}

static dt_status mismatch(dt_mpi_transport *t, const dt_coll_desc *theirs, const dt_coll_desc *mine) {
    char a[96], b[96];
    return dt_mpi_fail(t, DT_EMISMATCH, "rank %d called %s but rank %d called %s at #%llu", left_of(t),
                       dt_coll_desc_call_str(theirs, a, sizeof a), t->base.rank,
                       dt_coll_desc_call_str(mine, b, sizeof b),
                       (unsigned long long)mine->seq); /* notifies the others */
}

/* Whether own op seq waits (or, not decided yet, may wait) for the left rank's descriptor of it. */
static bool expects(const dt_mpi_transport *t, uint64_t seq) {
    int k = SLOT(seq);
    return t->hist[k].seq == seq && (t->hist_state[k] == OP_SENT || t->hist_state[k] == OP_NEW);
}

/* expect_lo to the first own op that waits for the left rank's descriptor (or past the last). */
static void advance_expect(dt_mpi_transport *t) {
    while (t->expect_lo <= t->check_seq && !expects(t, t->expect_lo)) t->expect_lo++;
}

/* The left rank's descriptor L: 1 handled, 0 not yet (it is ahead of us), or the error. */
static int take_left(dt_mpi_transport *t, const dt_coll_desc *L, dt_status *err) {
    advance_expect(t);
    if (t->expect_lo <= t->check_seq && t->expect_lo < L->seq) { /* it skipped an op we sent */
        int k = SLOT(t->expect_lo);
        {
            char b[96], c[96];
            *err = dt_mpi_fail(t, DT_EMISMATCH,
                               "rank %d called an allreduce or allgather (checked in-band) but rank %d "
                               "called %s at #%llu (rank %d's next op is %s)",
                               left_of(t), t->base.rank, dt_coll_desc_call_str(&t->hist[k], b, sizeof b),
                               (unsigned long long)t->expect_lo, left_of(t), dt_coll_desc_str(L, c, sizeof c));
            return -1;
        }
    }
    if (L->seq > t->check_seq) return 0;
    int k = SLOT(L->seq);
    if (L->seq + DT_MPI_DESC_SLOTS > t->check_seq && t->hist[k].seq == L->seq) { /* else long passed: a late probe */
        if (!dt_coll_desc_match(L, &t->hist[k])) {
            *err = mismatch(t, L, &t->hist[k]);
            return -1;
        }
        if (t->hist_state[k] == OP_SENT) t->hist_state[k] = OP_MATCHED;
    }
    advance_expect(t);
    return 1;
}

dt_status dt_mpi_check_progress(dt_mpi_transport *t) {
    if (!t->check) return DT_OK;
    DT_TRY(dt_mpi_check_flush(t));
    for (;;) {
        int k = (int)(t->left_head % DT_MPI_DESC_RECVS), flag = 0;
        LOCK();
        if (t->left_rreq[k] != MPI_REQUEST_NULL) MPI_Test(&t->left_rreq[k], &flag, MPI_STATUS_IGNORE);
        else flag = 1; /* completed earlier, its descriptor not handled yet */
        UNLOCK();
        if (!flag) return DT_OK;
        dt_status err = DT_OK;
        int r = take_left(t, &t->left_buf[k], &err);
        if (r < 0) return err;
        if (r == 0) return DT_OK;
        t->left_head++;
        t->check_events++;
        DT_TRY(post_left_recv(t, k));
    }
}

dt_status dt_mpi_check_begin(dt_transport *tt, const dt_coll_desc *d) {
    dt_mpi_transport *t = (dt_mpi_transport *)tt;
    t->cur = *d;
    if (!t->check || d->op == DT_COLL_SEND || d->op == DT_COLL_RECV) return DT_OK;
    DT_TRY(dt_mpi_check_flush(t)); /* the previous op, if nothing sent it */
    int k = SLOT(d->seq);
    dt_mpi_idle idle = {0};
    double deadline = dt_now() + t->timeout_s, next_live = dt_now() + DT_MPI_LIVE_PERIOD;
    const int left = left_of(t);
    for (;;) { /* the slot's last op must be compared and its descriptor sent before reuse */
        int sf = 1;
        LOCK();
        if (t->hist_sreq[k] != MPI_REQUEST_NULL) MPI_Test(&t->hist_sreq[k], &sf, MPI_STATUS_IGNORE);
        UNLOCK();
        if (sf && !expects(t, t->hist[k].seq)) break;
        DT_TRY(dt_mpi_progress_internal(t));
        double now = dt_now();
        int pid;
        char b[96];
        if (now >= next_live) {
            if ((pid = dt_mpi_peer_gone(t, left)) != 0)
                return dt_mpi_fail(t, DT_EPEER,
                                   "rank %d died %d ops behind rank %d at %s: its process (world rank %d, "
                                   "pid %d) is gone",
                                   left, DT_MPI_DESC_SLOTS, tt->rank, dt_coll_desc_str(d, b, sizeof b),
                                   dt_mpi_world_of(t, left), pid);
            next_live = now + DT_MPI_LIVE_PERIOD;
        }
        if (now > deadline)
            return dt_mpi_fail(t, DT_ETIMEDOUT, "rank %d is %d ops behind rank %d at %s", left, DT_MPI_DESC_SLOTS,
                               tt->rank, dt_coll_desc_str(d, b, sizeof b));
        dt_mpi_backoff(&idle);
    }
    t->hist[k] = *d;
    t->hist_state[k] = OP_NEW;
    t->hist_probed[k] = 0;
    t->check_seq = d->seq;
    advance_expect(t); /* past the ops before this one that wait for nothing */
    return DT_OK;
}

/* ---- in-band check words ------------------------------------------------------------------- */

bool dt_mpi_inband_ok(const dt_mpi_transport *t, const dt_coll_args *a) {
    if (!t->check || t->base.size > DT_MPI_INBAND_RANKS) return false;
    size_t nb = (size_t)a->d.count * dt_dtype_size((dt_dtype)a->d.dtype);
    if (nb > DT_MPI_INBAND_MAX) return false;
    if (a->d.op == DT_COLL_ALLGATHER) return true;
    if (a->d.op != DT_COLL_ALLREDUCE) return false;
    dt_dtype d = (dt_dtype)a->d.dtype;
    dt_redop r = (dt_redop)a->d.redop;
    return (d == DT_F32 || d == DT_F64 || d == DT_I32 || d == DT_I64) &&
           (r == DT_OP_SUM || r == DT_OP_AVG || r == DT_OP_MAX || r == DT_OP_MIN);
}

static void *stage(dt_mpi_transport *t, size_t bytes) {
    if (bytes <= t->stage_cap) return t->stage;
    void *p = dt_alloc(bytes);
    if (!p) return NULL;
    dt_free(t->stage);
    t->stage = p, t->stage_cap = bytes;
    return p;
}

/* Four 10-bit digits of a hash of the descriptor (FNV-1a over its fields). */
static void digits(const dt_coll_desc *d, double out[4]) {
    uint64_t v[6] = {d->seq, d->op, d->dtype, d->redop, (uint64_t)(int64_t)d->root, d->count},
             h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 6; i++)
        for (int b = 0; b < 8; b++) h = (h ^ ((v[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    for (int j = 0; j < 4; j++) out[j] = (double)((h >> (10 * j)) & 1023);
}

static void put(void *buf, size_t i, dt_dtype d, double v) {
    switch (d) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    default: ((int64_t *)buf)[i] = (int64_t)v; break;
    }
}

static double get(const void *buf, size_t i, dt_dtype d) {
    switch (d) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_I32: return ((const int32_t *)buf)[i];
    default: return (double)((const int64_t *)buf)[i];
    }
}

/* The check words disagree: the descriptor goes out so the neighbour can name both calls; an
 * error from there (its comparison, another rank's notice) wins over ours for a moment. */
static dt_status inband_failed(dt_mpi_transport *t, const dt_coll_args *a) {
    dt_status s = dt_mpi_check_stalled(t, DT_MPI_PROBE_S);
    dt_mpi_idle idle = {0};
    for (double end = dt_now() + 1.0; s == DT_OK && dt_now() < end;) {
        s = dt_mpi_progress_internal(t);
        if (s == DT_OK) dt_mpi_backoff(&idle);
    }
    if (t->broken) return dt_error(t->err, "%s", t->errmsg);
    char o[96];
    return dt_mpi_fail(t, DT_EMISMATCH,
                       "rank %d called %s but another rank called a different collective at #%llu "
                       "(its check words in the data disagree)",
                       t->base.rank, dt_coll_desc_call_str(&a->d, o, sizeof o), (unsigned long long)a->d.seq);
}

dt_status dt_mpi_inband_coll(dt_mpi_transport *t, const dt_coll_args *a, MPI_Datatype ty, MPI_Op mop,
                             dt_status (*wait)(dt_mpi_transport *, MPI_Request *, const dt_coll_args *)) {
    DT_TRY(dt_mpi_check_decide(t, true));
    const int W = t->base.size, R = t->base.rank;
    const dt_dtype dt = (dt_dtype)a->d.dtype;
    const size_t es = dt_dtype_size(dt), n = (size_t)a->d.count, nb = n * es;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc;
    if (a->d.op == DT_COLL_ALLGATHER) { /* [block | descriptor] per rank: ours, then everyone's */
        const size_t blk = nb + sizeof(dt_coll_desc);
        char *s = stage(t, blk * (size_t)(W + 1)), *g = s + blk;
        if (!s)
            return dt_mpi_fail(t, DT_ENOMEM, "out of memory staging %s of %zu bytes", "an allgather", blk * (size_t)W);
        const char *own = (const char *)a->recv + (size_t)R * nb;
        memcpy(s, a->send == a->recv ? own : (const char *)a->send, nb);
        memcpy(s + nb, &a->d, sizeof a->d);
        LOCK();
        rc = MPI_Iallgather(s, (int)blk, MPI_BYTE, g, (int)blk, MPI_BYTE, t->comm, &req);
        UNLOCK();
        if (rc == MPI_SUCCESS) DT_TRY(wait(t, &req, a));
        for (int i = 0; rc == MPI_SUCCESS && i < W; i++) {
            dt_coll_desc theirs;
            memcpy(&theirs, g + (size_t)i * blk + nb, sizeof theirs);
            if (!dt_coll_desc_match(&theirs, &a->d)) {
                char x[96], y[96];
                return dt_mpi_fail(t, DT_EMISMATCH, "rank %d called %s but rank %d called %s at #%llu", i,
                                   dt_coll_desc_call_str(&theirs, x, sizeof x), R,
                                   dt_coll_desc_call_str(&a->d, y, sizeof y), (unsigned long long)a->d.seq);
            }
        }
        for (int i = 0; rc == MPI_SUCCESS && i < W; i++)
            memcpy((char *)a->recv + (size_t)i * nb, g + (size_t)i * blk, nb);
    } else { /* [values | 4 digits | 4 companions], reduced in place */
        double d[4];
        digits(&a->d, d);
        const bool sum = a->d.redop == DT_OP_SUM || a->d.redop == DT_OP_AVG;
        char *s = stage(t, (n + 8) * es);
        if (!s) return dt_mpi_fail(t, DT_ENOMEM, "out of memory staging %s of %zu bytes", "an allreduce", (n + 8) * es);
        memcpy(s, a->send, nb);
        for (int j = 0; j < 4; j++)
            put(s, n + (size_t)j, dt, d[j]), put(s, n + 4 + (size_t)j, dt, sum ? d[j] * d[j] : 1023 - d[j]);
        LOCK();
        rc = MPI_Iallreduce(MPI_IN_PLACE, s, (int)(n + 8), ty, mop, t->comm, &req);
        UNLOCK();
        if (rc == MPI_SUCCESS) DT_TRY(wait(t, &req, a));
        for (int j = 0; rc == MPI_SUCCESS && j < 4; j++) {
            double want = sum ? W * d[j] : d[j], want2 = sum ? W * d[j] * d[j] : 1023 - d[j];
            if (get(s, n + (size_t)j, dt) != want || get(s, n + 4 + (size_t)j, dt) != want2) return inband_failed(t, a);
        }
        if (rc == MPI_SUCCESS) memcpy(a->recv, s, nb);
    }
    if (rc != MPI_SUCCESS) {
        char o[96], e[256];
        return dt_mpi_fail(t, DT_EPEER, "MPI could not start %s on rank %d: %s", dt_coll_desc_str(&a->d, o, sizeof o),
                           R, dt_mpi_errstr(rc, e, sizeof e));
    }
    return DT_OK;
}

#else
typedef int dt_transport_mpi_check_unused; /* built without MPI: see transport_mpi.c */
#endif
