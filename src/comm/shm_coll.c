/* shm transport, direct shared-buffer collectives: every rank copies its input chunk into its
 * own slot in the segment, then reads the peers' slots directly (no messages). Allreduce: small
 * buffers (and, between two ranks, up to 2 MiB: DDP's gradient buckets) are reduced whole by
 * every rank after one synchronisation per chunk; large ones are split in n cache-line-aligned
 * slices, rank r reduces slice r from all slots (rank order, so results are identical
 * everywhere) and the others copy it. Ranks synchronise through per-rank phase
 * counters (every rank runs the same phase sequence); slots rotate, a slot is reused once all
 * ranks passed the phase that ended its previous use. */
#include "comm/reduce.h"
#include "comm/shm.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t phase;
    int peer; /* -1: all peers */
} phase_arg;

static int poll_phase(dt_shm *s, void *arg, dt_status *st) {
    phase_arg *a = arg;
    int moved = s->npending ? dt_shm_progress(s, st) : 0; /* keep user messages flowing */
    for (int p = a->peer < 0 ? 0 : a->peer; p < s->n; p++) {
        if (p != s->me && atomic_load_explicit(&shm_rank_at(s, p)->dphase, memory_order_acquire) < a->phase) {
            s->waiting_on = p;
            return moved ? 2 : 0;
        }
        if (a->peer >= 0) break;
    }
    return 1;
}

static dt_status wait_phase(dt_shm *s, int peer, uint64_t phase, double deadline) {
    phase_arg a = {phase, peer};
    dt_status st = DT_OK;
    if (poll_phase(s, &a, &st) == 1) return st;
    st = dt_shm_block(s, poll_phase, &a, deadline, false);
    s->waiting_on = -1;
    if (st != DT_OK) s->broken = true;
    return st;
}

static void advance(dt_shm *s) {
    atomic_store_explicit(&shm_rank_at(s, s->me)->dphase, ++s->myphase, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    for (int p = 0; p < s->n; p++)
        if (p != s->me && atomic_load_explicit(&shm_rank_at(s, p)->sleeping, memory_order_relaxed)) dt_shm_ring(s, p);
}

static dt_status check_all(dt_shm *s) {
    for (int p = 0; p < s->n; p++) DT_TRY(dt_shm_check_peer(s, p));
    return DT_OK;
}

/* next slot; waits until every rank is done with its previous use */
static dt_status take_slot(dt_shm *s, uint64_t *slot, double deadline) {
    *slot = s->gchunk++ % s->hdr->d_slots;
    return wait_phase(s, -1, s->slot_free[*slot], deadline);
}

static void release_slot(dt_shm *s, uint64_t slot) {
    advance(s);
    s->slot_free[slot] = s->myphase;
}

/* element range of rank r's slice of m elements, cut at 64-byte boundaries */
static void slice(size_t m, int n, int r, size_t esz, size_t *lo, size_t *hi) {
    size_t unit = 64 / esz, units = (m + unit - 1) / unit;
    *lo = units * (size_t)r / (size_t)n * unit;
    *hi = units * (size_t)(r + 1) / (size_t)n * unit;
    if (*lo > m) *lo = m;
    if (*hi > m) *hi = m;
}

/* results at least this large are written with streaming stores (they would only evict caches) */
static size_t nt_bytes(void) {
    static size_t v;
    if (!v) {
        const char *e = getenv("DTRAIN_SHM_NT");
        v = e && *e ? (size_t)atoll(e) + 1 : (16u << 20) + 1;
    }
    return v - 1;
}

/* one pipelined chunk of a large allreduce */
typedef struct {
    size_t off, m;
    uint64_t slot, posted, reduced;
} ar_chunk;

typedef struct {
    dt_shm *s;
    const dt_coll_args *a;
    size_t esz, ce;
    bool nt;
    bool gather; /* this rank collects the result: allreduce, or reduce on its root */
    ar_chunk ch[4];
} ar_state;

/* stage A: publish the slices the other ranks reduce (my own slice stays in my buffer) */
static dt_status ar_post(ar_state *st, size_t k) {
    dt_shm *s = st->s;
    ar_chunk *c = &st->ch[k % 4];
    size_t count = st->a->d.count, lo, hi;
    c->off = k * st->ce;
    c->m = count - c->off < st->ce ? count - c->off : st->ce;
    DT_TRY(take_slot(s, &c->slot, st->a->deadline));
    unsigned char *mine = shm_dslot(s, s->me, c->slot);
    const unsigned char *src = (const unsigned char *)st->a->send + c->off * st->esz;
    for (int p = 0; p < s->n; p++) {
        if (p == s->me) continue;
        slice(c->m, s->n, p, st->esz, &lo, &hi);
        if (hi > lo) memcpy(mine + lo * st->esz, src + lo * st->esz, (hi - lo) * st->esz);
    }
    advance(s);
    c->posted = s->myphase;
    return DT_OK;
}

/* stage B: reduce my slice from every rank's buffer (rank order), into recv and my slot */
static dt_status ar_reduce(ar_state *st, size_t k) {
    dt_shm *s = st->s;
    ar_chunk *c = &st->ch[k % 4];
    const void *in[256];
    size_t lo, hi, esz = st->esz;
    DT_TRY(wait_phase(s, -1, c->posted, st->a->deadline));
    if (k == 0) DT_TRY(check_all(s));
    slice(c->m, s->n, s->me, esz, &lo, &hi);
    if (hi > lo) {
        for (int r = 0; r < s->n; r++)
            in[r] = r == s->me ? (const unsigned char *)st->a->send + (c->off + lo) * esz
                               : (const unsigned char *)shm_dslot(s, r, c->slot) + lo * esz;
        dt_redop op = (dt_redop)st->a->d.redop;
        unsigned char *out = (unsigned char *)st->a->recv + (c->off + lo) * esz;
        unsigned char *out2 = shm_dslot(s, s->me, c->slot) + lo * esz;
        if (!st->gather) out = out2, out2 = NULL; /* reduce: only the root's buffer gets results */
        int div = op == DT_OP_AVG ? s->n : 1;
        if (st->nt) dt_reduce_many_nt(out, out2, in, s->n, hi - lo, (dt_dtype)st->a->d.dtype, op, div);
        else dt_reduce_many(out, out2, in, s->n, hi - lo, (dt_dtype)st->a->d.dtype, op, div);
    }
    advance(s);
    c->reduced = s->myphase;
    return DT_OK;
}

/* stage C: copy the other ranks' reduced slices */
static dt_status ar_collect(ar_state *st, size_t k) {
    dt_shm *s = st->s;
    ar_chunk *c = &st->ch[k % 4];
    size_t lo, hi, esz = st->esz;
    for (int j = 1; j < s->n && st->gather; j++) {
        int p = (s->me + j) % s->n;
        DT_TRY(wait_phase(s, p, c->reduced, st->a->deadline));
        slice(c->m, s->n, p, esz, &lo, &hi);
        if (hi <= lo) continue;
        unsigned char *dst = (unsigned char *)st->a->recv + (c->off + lo) * esz;
        const unsigned char *src = shm_dslot(s, p, c->slot) + lo * esz;
        if (st->nt) dt_copy_nt(dst, src, (hi - lo) * esz);
        else memcpy(dst, src, (hi - lo) * esz);
    }
    release_slot(s, c->slot);
    return DT_OK;
}

/* whole: every rank (reduce: the root) reduces every chunk itself from its own buffer and the
 * peers' slots (rank order: the same bits everywhere): one synchronisation per chunk and no wait
 * for a peer's reduction. All chunks (at most d_slots) are posted before the first wait. For
 * small buffers with any number of ranks, and for up to 2 MiB with two ranks: there each rank
 * reads as many of the peer's bytes as in the sliced pipeline, which copies a quarter less but
 * makes the rank that arrives last wait for the other's reduction too, a wake-up when that one
 * slept (docs/why.md, "Two ranks reduce whole buffers"). */
enum { WHOLE_MAX_CHUNKS = 16, WHOLE2_MAX_BYTES = 2 << 20 };

static dt_status ar_whole(dt_shm *s, const dt_coll_args *a, size_t esz, bool gather) {
    const void *in[256];
    size_t count = a->d.count, ce = s->hdr->d_chunk / esz, K = count ? (count + ce - 1) / ce : 1;
    uint64_t slot[WHOLE_MAX_CHUNKS], posted[WHOLE_MAX_CHUNKS];
    const unsigned char *src = a->send;
    unsigned char *dst = a->recv;
    for (size_t k = 0; k < K; k++) {
        size_t off = k * ce, m = count - off < ce ? count - off : ce;
        DT_TRY(take_slot(s, &slot[k], a->deadline));
        if (m) memcpy(shm_dslot(s, s->me, slot[k]), src + off * esz, m * esz);
        advance(s);
        posted[k] = s->myphase;
    }
    dt_redop op = (dt_redop)a->d.redop;
    for (size_t k = 0; k < K; k++) {
        size_t off = k * ce, m = count - off < ce ? count - off : ce;
        if (gather) {
            DT_TRY(wait_phase(s, -1, posted[k], a->deadline));
            if (k == 0) DT_TRY(check_all(s));
            for (int r = 0; r < s->n; r++)
                in[r] = r == s->me ? (const void *)(src + off * esz) : (const void *)shm_dslot(s, r, slot[k]);
            if (m)
                dt_reduce_many(dst + off * esz, NULL, in, s->n, m, (dt_dtype)a->d.dtype, op,
                               op == DT_OP_AVG ? s->n : 1);
        }
        release_slot(s, slot[k]);
    }
    return DT_OK;
}

/* allreduce and reduce (gather == false on the non-root ranks of a reduce).
 * large: chunks flow through a three-stage pipeline, post(k+1) / reduce(k) / collect(k-1), so a
 * rank rarely waits for a peer's previous stage */
static dt_status d_allreduce(dt_shm *s, const dt_coll_args *a) {
    size_t esz = dt_dtype_size((dt_dtype)a->d.dtype), count = a->d.count;
    if (s->n > 256) return DT_ENOTSUP;
    bool gather = a->d.op == DT_COLL_ALLREDUCE || a->d.root == s->me;
    size_t bytes = count * esz, chunks = (bytes + s->hdr->d_chunk - 1) / s->hdr->d_chunk;
    if ((bytes <= s->hdr->small_bytes && chunks <= 1) ||
        (s->n == 2 && bytes <= WHOLE2_MAX_BYTES && chunks <= s->hdr->d_slots && chunks <= WHOLE_MAX_CHUNKS))
        return ar_whole(s, a, esz, gather);
    ar_state st = {.s = s, .a = a, .esz = esz, .ce = s->hdr->d_chunk / esz, .gather = gather};
    st.nt = gather && count * esz >= nt_bytes(); /* streaming stores only into the private result */
    size_t K = (count + st.ce - 1) / st.ce;
    DT_TRY(ar_post(&st, 0));
    for (size_t k = 0; k < K; k++) {
        if (k + 1 < K) DT_TRY(ar_post(&st, k + 1));
        DT_TRY(ar_reduce(&st, k));
        if (k >= 1) DT_TRY(ar_collect(&st, k - 1));
    }
    DT_TRY(ar_collect(&st, K - 1));
    if (st.nt) dt_copy_fence();
    return DT_OK;
}

static dt_status d_broadcast(dt_shm *s, const dt_coll_args *a) {
    size_t bytes = a->d.count * dt_dtype_size((dt_dtype)a->d.dtype), ch = s->hdr->d_chunk;
    int root = a->d.root;
    unsigned char *buf = a->recv;
    for (size_t off = 0; off == 0 || off < bytes; off += ch) {
        size_t len = bytes - off < ch ? bytes - off : ch;
        uint64_t slot;
        if (s->me == root) {
            DT_TRY(take_slot(s, &slot, a->deadline));
            if (len) memcpy(shm_dslot(s, root, slot), buf + off, len);
            advance(s);
        } else {
            slot = s->gchunk++ % s->hdr->d_slots;
            advance(s);
            DT_TRY(wait_phase(s, root, s->myphase, a->deadline));
            if (off == 0) DT_TRY(dt_shm_check_peer(s, root));
            if (len) memcpy(buf + off, shm_dslot(s, root, slot), len);
        }
        release_slot(s, slot);
    }
    return DT_OK;
}

static dt_status d_allgather(dt_shm *s, const dt_coll_args *a) {
    size_t bytes = a->d.count * dt_dtype_size((dt_dtype)a->d.dtype), ch = s->hdr->d_chunk;
    const unsigned char *src = a->send;
    unsigned char *dst = a->recv;
    for (size_t off = 0; off == 0 || off < bytes; off += ch) {
        size_t len = bytes - off < ch ? bytes - off : ch;
        uint64_t slot;
        DT_TRY(take_slot(s, &slot, a->deadline));
        if (len) memcpy(shm_dslot(s, s->me, slot), src + off, len);
        if (len && src != dst + (size_t)s->me * bytes) memcpy(dst + (size_t)s->me * bytes + off, src + off, len);
        advance(s);
        DT_TRY(wait_phase(s, -1, s->myphase, a->deadline));
        if (off == 0) DT_TRY(check_all(s));
        for (int k = 1; k < s->n; k++) {
            int p = (s->me + k) % s->n;
            if (len) memcpy(dst + (size_t)p * bytes + off, shm_dslot(s, p, slot), len);
        }
        release_slot(s, slot);
    }
    return DT_OK;
}

static dt_status d_reduce_scatter(dt_shm *s, const dt_coll_args *a) {
    dt_dtype t = (dt_dtype)a->d.dtype;
    dt_redop op = (dt_redop)a->d.redop;
    size_t esz = dt_dtype_size(t), count = a->d.count, ce = s->hdr->d_chunk / (esz * (size_t)s->n);
    const unsigned char *src = a->send;
    unsigned char *dst = a->recv;
    int n = s->n;
    const void *in[256];
    if (n > 256 || ce == 0) return DT_ENOTSUP;
    for (size_t off = 0; off == 0 || off < count; off += ce) {
        size_t m = count - off < ce ? count - off : ce;
        uint64_t slot;
        DT_TRY(take_slot(s, &slot, a->deadline));
        unsigned char *mine = shm_dslot(s, s->me, slot);
        for (int j = 0; j < n && m; j++) /* the blocks others reduce; my own stays in my buffer */
            if (j != s->me) memcpy(mine + (size_t)j * m * esz, src + ((size_t)j * count + off) * esz, m * esz);
        advance(s);
        DT_TRY(wait_phase(s, -1, s->myphase, a->deadline));
        if (off == 0) DT_TRY(check_all(s));
        for (int r = 0; r < n; r++)
            in[r] = r == s->me ? src + ((size_t)s->me * count + off) * esz
                               : shm_dslot(s, r, slot) + (size_t)s->me * m * esz;
        if (m) dt_reduce_many(dst + off * esz, NULL, in, n, m, t, op, op == DT_OP_AVG ? n : 1);
        release_slot(s, slot);
    }
    return DT_OK;
}

static dt_status d_barrier(dt_shm *s, const dt_coll_args *a) {
    advance(s);
    DT_TRY(wait_phase(s, -1, s->myphase, a->deadline));
    return check_all(s);
}

dt_status dt_shm_coll(dt_transport *t, const dt_coll_args *a) {
    dt_shm *s = (dt_shm *)t;
    if (a->algo != DT_ALGO_AUTO && a->algo != DT_ALGO_DIRECT && a->algo != DT_ALGO_NATIVE) return DT_ENOTSUP;
    if (s->n < 2) return DT_ENOTSUP;
    if (s->broken) return dt_error(DT_EPEER, "the shm transport failed earlier; create a new communicator");
    s->what_req = NULL;
    switch (a->d.op) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE: return d_allreduce(s, a);
    case DT_COLL_BROADCAST: return d_broadcast(s, a);
    case DT_COLL_ALLGATHER: return d_allgather(s, a);
    case DT_COLL_REDUCE_SCATTER: return d_reduce_scatter(s, a);
    case DT_COLL_BARRIER: return d_barrier(s, a);
    default: return DT_ENOTSUP;
    }
}
