/* shm transport, point-to-point: per ordered pair of ranks two FIFO channels of fragments in the
 * segment (kind 0: collective traffic, strictly in order, each message carrying the sender's op
 * descriptor for mismatch detection; kind 1: user messages matched by tag, unexpected ones
 * drained into heap buffers). Requests progress whenever the rank is inside the transport. */
#include "comm/shm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* request state in dt_treq.priv */
#define RQ_BUF(r) ((r)->priv.p[0])
#define RQ_OFF(r) ((r)->priv.u[1])
#define RQ_FLAGS(r) ((r)->priv.u[2]) /* bit0: user channel, bit1: receive, bit2: first fragment seen */

static void q_push(shm_reqq *q, dt_treq *r) {
    r->next = NULL;
    if (q->tail) q->tail->next = r;
    else q->head = r;
    q->tail = r;
}

static void q_remove(shm_reqq *q, dt_treq *r) {
    dt_treq *prev = NULL;
    for (dt_treq *x = q->head; x; prev = x, x = x->next)
        if (x == r) {
            if (prev) prev->next = x->next;
            else q->head = x->next;
            if (q->tail == x) q->tail = prev;
            return;
        }
}

static void complete(dt_shm *s, dt_treq *r) {
    r->done = true;
    r->status = DT_OK;
    s->npending--;
}

static dt_status size_mismatch(dt_shm *s, int peer, int tag, uint64_t sent, size_t want) {
    char msg[300];
    if (tag == DT_TAG_COLL) {
        char d[128];
        snprintf(msg, sizeof msg,
                 "in %s rank %d sent %llu bytes but rank %d expected %zu (ranks chose different "
                 "algorithms? set the same DTRAIN_COMM_ALGO everywhere)",
                 dt_coll_desc_str(&s->cur, d, sizeof d), peer, (unsigned long long)sent, s->me, want);
    } else {
        snprintf(msg, sizeof msg, "rank %d sent %llu bytes with tag %d but rank %d posted a receive of %zu bytes", peer,
                 (unsigned long long)sent, tag, s->me, want);
    }
    return dt_shm_fail(s, DT_EMISMATCH, msg);
}

/* copies as many fragments of the queued sends to `peer` as the channel has room for */
static int push(dt_shm *s, int peer, int kind) {
    shm_reqq *q = &s->sendq[peer * SHM_KINDS + kind];
    shm_chan *c = shm_chan_at(s, s->me, peer, kind);
    uint64_t tail = atomic_load_explicit(&c->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
    uint32_t slots = s->hdr->slots[kind];
    size_t cap = s->hdr->slot_bytes[kind];
    int moved = 0;
    while (q->head && tail - head < slots) {
        dt_treq *r = q->head;
        size_t off = RQ_OFF(r), len = r->bytes - off < cap ? r->bytes - off : cap;
        shm_frag *f = shm_frag_at(s, c, kind, tail);
        f->len = (uint32_t)len;
        f->flags = (off == 0 ? FRAG_FIRST : 0) | (off + len == r->bytes ? FRAG_LAST : 0);
        f->tag = r->tag;
        f->src = s->me;
        f->msg_bytes = r->bytes;
        f->desc = s->cur;
        if (len) memcpy(f + 1, (const unsigned char *)RQ_BUF(r) + off, len);
        atomic_store_explicit(&c->tail, ++tail, memory_order_release);
        moved = 1;
        RQ_OFF(r) = off + len;
        if (off + len == r->bytes) {
            q->head = r->next;
            if (!q->head) q->tail = NULL;
            complete(s, r);
        }
        if (tail - head >= slots) head = atomic_load_explicit(&c->head, memory_order_acquire);
    }
    if (moved) dt_shm_ring(s, peer);
    return moved;
}

static int pull_coll(dt_shm *s, int peer, dt_status *st) {
    shm_reqq *q = &s->recvq[peer * SHM_KINDS];
    shm_chan *c = shm_chan_at(s, peer, s->me, 0);
    uint64_t head = atomic_load_explicit(&c->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&c->tail, memory_order_acquire);
    int moved = 0;
    while (q->head && head < tail) {
        dt_treq *r = q->head;
        shm_frag *f = shm_frag_at(s, c, 0, head);
        if (!(RQ_FLAGS(r) & 4)) {
            if (s->in_coll && !dt_coll_desc_match(&f->desc, &s->cur)) {
                *st = dt_shm_mismatch(s, peer, &f->desc);
                break;
            }
            if (f->msg_bytes != r->bytes) {
                *st = size_mismatch(s, peer, DT_TAG_COLL, f->msg_bytes, r->bytes);
                break;
            }
            RQ_FLAGS(r) |= 4;
        }
        uint32_t flags = f->flags;
        if (f->len) memcpy((unsigned char *)RQ_BUF(r) + RQ_OFF(r), f + 1, f->len);
        RQ_OFF(r) += f->len;
        atomic_store_explicit(&c->head, ++head, memory_order_release);
        moved = 1;
        if (flags & FRAG_LAST) {
            q->head = r->next;
            if (!q->head) q->tail = NULL;
            complete(s, r);
        }
    }
    if (moved) dt_shm_ring(s, peer);
    return moved;
}

static int pull_user(dt_shm *s, int peer, dt_status *st) {
    shm_reqq *q = &s->recvq[peer * SHM_KINDS + 1];
    shm_chan *c = shm_chan_at(s, peer, s->me, 1);
    uint64_t head = atomic_load_explicit(&c->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&c->tail, memory_order_acquire);
    int moved = 0;
    while (head < tail) {
        shm_frag *f = shm_frag_at(s, c, 1, head);
        dt_treq *r = s->in_req[peer];
        shm_unex *u = s->in_unex[peer];
        if (!r && !u) { /* a new message: match the oldest receive posted for its tag */
            for (dt_treq *x = q->head; x; x = x->next)
                if (x->tag == f->tag) {
                    r = x;
                    break;
                }
            if (r) {
                if (r->bytes != f->msg_bytes) {
                    *st = size_mismatch(s, peer, f->tag, f->msg_bytes, r->bytes);
                    break;
                }
                q_remove(q, r);
                s->in_req[peer] = r;
            } else {
                if (!q->head) break; /* nobody receives from this peer now: leave it in the channel */
                u = malloc(sizeof *u + f->msg_bytes);
                if (!u) {
                    *st = dt_error(DT_ENOMEM, "out of memory buffering a message from rank %d", peer);
                    break;
                }
                *u = (shm_unex){.tag = f->tag, .bytes = f->msg_bytes};
                shm_unex **pp = &s->unex[peer];
                while (*pp) pp = &(*pp)->next;
                *pp = u;
                s->in_unex[peer] = u;
            }
        }
        uint32_t flags = f->flags;
        if (r) {
            if (f->len) memcpy((unsigned char *)RQ_BUF(r) + RQ_OFF(r), f + 1, f->len);
            RQ_OFF(r) += f->len;
        } else {
            if (f->len) memcpy(u->data + u->off, f + 1, f->len);
            u->off += f->len;
        }
        atomic_store_explicit(&c->head, ++head, memory_order_release);
        moved = 1;
        if (flags & FRAG_LAST) {
            if (r) {
                complete(s, r);
                s->in_req[peer] = NULL;
            } else {
                u->complete = true;
                s->in_unex[peer] = NULL;
                if (u->bound) {
                    memcpy(RQ_BUF(u->bound), u->data, u->bytes);
                    complete(s, u->bound);
                    free(u);
                }
            }
        }
    }
    if (moved) dt_shm_ring(s, peer);
    return moved;
}

int dt_shm_progress(dt_shm *s, dt_status *st) {
    int moved = 0;
    if (!s->npending) return 0;
    for (int p = 0; p < s->n; p++) {
        if (p == s->me) continue;
        for (int k = 0; k < SHM_KINDS; k++)
            if (s->sendq[p * SHM_KINDS + k].head) moved |= push(s, p, k);
        if (s->recvq[p * SHM_KINDS].head) moved |= pull_coll(s, p, st);
        if (*st != DT_OK) return 0;
        if (s->recvq[p * SHM_KINDS + 1].head || s->in_req[p] || s->in_unex[p]) moved |= pull_user(s, p, st);
        if (*st != DT_OK) return 0;
    }
    return moved;
}

static dt_status post_check(dt_shm *s, int peer, int tag, const void *buf, size_t bytes, dt_treq *req) {
    if (s->broken) return dt_error(DT_EPEER, "the shm transport failed earlier; create a new communicator");
    if (peer < 0 || peer >= s->n || peer == s->me)
        return dt_error(DT_EINVAL, "peer %d is not another rank of this communicator (rank %d of %d)", peer, s->me,
                        s->n);
    if (tag < DT_TAG_COLL) return dt_error(DT_EINVAL, "tag %d is negative", tag);
    if (bytes && !buf) return dt_error(DT_EINVAL, "NULL buffer for %zu bytes", bytes);
    dt_treq_reset(req, peer, tag, bytes);
    return DT_OK;
}

dt_status dt_shm_isend(dt_transport *t, int peer, int tag, const void *buf, size_t bytes, dt_treq *req) {
    dt_shm *s = (dt_shm *)t;
    DT_TRY(post_check(s, peer, tag, buf, bytes, req));
    int kind = tag == DT_TAG_COLL ? 0 : 1;
    RQ_BUF(req) = (void *)buf;
    RQ_FLAGS(req) = (uint64_t)kind;
    q_push(&s->sendq[peer * SHM_KINDS + kind], req);
    s->npending++;
    push(s, peer, kind);
    return DT_OK;
}

dt_status dt_shm_irecv(dt_transport *t, int peer, int tag, void *buf, size_t bytes, dt_treq *req) {
    dt_shm *s = (dt_shm *)t;
    DT_TRY(post_check(s, peer, tag, buf, bytes, req));
    int kind = tag == DT_TAG_COLL ? 0 : 1;
    RQ_BUF(req) = buf;
    RQ_FLAGS(req) = (uint64_t)kind | 2;
    dt_status st = DT_OK;
    if (kind == 1) { /* an already-arrived message with this tag? */
        for (shm_unex **pp = &s->unex[peer]; *pp; pp = &(*pp)->next) {
            shm_unex *u = *pp;
            if (u->tag != tag) continue;
            if (u->bytes != bytes) return size_mismatch(s, peer, tag, u->bytes, bytes);
            *pp = u->next;
            if (u->complete) {
                if (bytes) memcpy(buf, u->data, bytes);
                free(u);
                req->done = true;
                return DT_OK;
            }
            u->bound = req;
            s->npending++;
            return DT_OK;
        }
    }
    q_push(&s->recvq[peer * SHM_KINDS + kind], req);
    s->npending++;
    if (kind == 0) pull_coll(s, peer, &st);
    else pull_user(s, peer, &st);
    return st;
}

dt_status dt_shm_test(dt_transport *t, dt_treq *req, bool *done) {
    dt_shm *s = (dt_shm *)t;
    dt_status st = DT_OK;
    dt_shm_progress(s, &st);
    *done = req->done;
    return st;
}

typedef struct {
    dt_treq *const *reqs;
    int n;
} waitall_arg;

static int poll_waitall(dt_shm *s, void *arg, dt_status *st) {
    waitall_arg *w = arg;
    int moved = dt_shm_progress(s, st);
    if (*st != DT_OK) return 0;
    if (w->n == 0) return moved ? 2 : 0; /* idle wait: until something moves */
    for (int i = 0; i < w->n; i++)
        if (w->reqs[i] && !w->reqs[i]->done) {
            s->waiting_on = w->reqs[i]->peer;
            return moved ? 2 : 0;
        }
    return 1;
}

dt_status dt_shm_waitall(dt_transport *t, dt_treq *const *reqs, int n, double deadline) {
    dt_shm *s = (dt_shm *)t;
    if (s->broken) return dt_error(DT_EPEER, "the shm transport failed earlier; create a new communicator");
    waitall_arg w = {reqs, n};
    s->what_req = NULL;
    bool coll = false;
    for (int i = 0; i < n; i++)
        if (reqs[i] && reqs[i]->tag == DT_TAG_COLL) coll = true;
    for (int i = 0; i < n && !coll && !s->what_req; i++)
        if (reqs[i] && !reqs[i]->done) s->what_req = reqs[i];
    if (n == 0) { /* idle: return on progress, wake() or the deadline */
        s->waiting_on = -1;
        for (int p = 0; p < s->n && s->waiting_on < 0; p++) {
            dt_treq *q = s->recvq[p * SHM_KINDS + 1].head   ? s->recvq[p * SHM_KINDS + 1].head
                         : s->sendq[p * SHM_KINDS + 1].head ? s->sendq[p * SHM_KINDS + 1].head
                                                            : s->in_req[p];
            if (q) s->waiting_on = p, s->what_req = q;
        }
        dt_status st = dt_shm_block(s, poll_waitall, &w, deadline, true);
        if (st != DT_OK) s->broken = true;
        s->what_req = NULL;
        return st;
    }
    dt_status st = dt_shm_block(s, poll_waitall, &w, deadline, false);
    s->what_req = NULL;
    s->waiting_on = -1;
    if (st != DT_OK) s->broken = true;
    return st;
}
