/* Data-movement algorithms over the transport: binomial-tree and pipelined-chain broadcast,
 * ring and recursive-doubling allgather(v), linear gather/scatter, pairwise alltoall and the
 * dissemination barrier. */
#include "comm/algo.h"

#include <stdlib.h>
#include <string.h>

static dt_status tree_bcast(dt_algo_ctx *x, void *buf, size_t bytes, int root) {
    int n = x->size, vr = (x->rank - root + n) % n, mask = 1;
    while (mask < n) {
        if (vr & mask) {
            DT_TRY(dt_algo_exchange(x, -1, NULL, 0, (vr - mask + root) % n, buf, bytes, DT_U8, -1));
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < n) DT_TRY(dt_algo_exchange(x, (vr + mask + root) % n, buf, bytes, -1, NULL, 0, DT_U8, -1));
    return DT_OK;
}

/* root -> root+1 -> ... in segments; each rank forwards a segment as soon as it has it */
static dt_status chain_bcast(dt_algo_ctx *x, void *buf, size_t bytes, int root) {
    int n = x->size, vr = (x->rank - root + n) % n, prev = (x->rank + n - 1) % n, next = (x->rank + 1) % n;
    size_t seg = x->seg_bytes ? x->seg_bytes : 1, ns = bytes ? (bytes + seg - 1) / seg : 1;
    dt_treq *sr = NULL, **sp = NULL;
    if (vr < n - 1) {
        sr = calloc(ns, sizeof *sr);
        sp = calloc(ns, sizeof *sp);
        if (!sr || !sp) {
            free(sr);
            free(sp);
            return dt_error(DT_ENOMEM, "out of memory in broadcast");
        }
    }
    dt_status st = DT_OK;
    for (size_t j = 0; j < ns && st == DT_OK; j++) {
        size_t off = j * seg, len = bytes - off < seg ? bytes - off : seg;
        unsigned char *p = (unsigned char *)buf + off;
        if (vr > 0) {
            dt_treq rr;
            dt_treq *w = &rr;
            st = x->t->ops->irecv(x->t, prev, DT_TAG_COLL, p, len, &rr);
            if (st == DT_OK) st = x->t->ops->waitall(x->t, &w, 1, x->deadline);
        }
        if (st == DT_OK && vr < n - 1) {
            st = x->t->ops->isend(x->t, next, DT_TAG_COLL, p, len, &sr[j]);
            sp[j] = &sr[j];
        }
    }
    if (st == DT_OK && sp) st = x->t->ops->waitall(x->t, sp, (int)ns, x->deadline);
    free(sr);
    free(sp);
    return st;
}

dt_status dt_algo_broadcast(dt_algo_ctx *x, void *buf, size_t bytes, int root) {
    if (x->algo == DT_ALGO_RING) return chain_bcast(x, buf, bytes, root);
    return tree_bcast(x, buf, bytes, root);
}

dt_status dt_algo_allgatherv(dt_algo_ctx *x, void *recv, const size_t *bytes, const size_t *displ) {
    int n = x->size, r = x->rank;
    unsigned char *b = recv;
    bool pow2 = (n & (n - 1)) == 0, regular = true;
    for (int i = 0; i < n; i++)
        if (bytes[i] != bytes[0] || displ[i] != (size_t)i * bytes[0]) regular = false;
    if (x->algo == DT_ALGO_RD && pow2 && regular) {
        size_t B = bytes[0];
        for (int mask = 1; mask < n; mask <<= 1) {
            int peer = r ^ mask, mylo = r & ~(mask - 1), plo = peer & ~(mask - 1);
            DT_TRY(dt_algo_exchange(x, peer, b + (size_t)mylo * B, (size_t)mask * B, peer, b + (size_t)plo * B,
                                    (size_t)mask * B, DT_U8, -1));
        }
        return DT_OK;
    }
    int right = (r + 1) % n, left = (r + n - 1) % n;
    for (int s = 0; s < n - 1; s++) {
        int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
        DT_TRY(dt_algo_exchange(x, right, b + displ[sb], bytes[sb], left, b + displ[rb], bytes[rb], DT_U8, -1));
    }
    return DT_OK;
}

/* root posts one receive (gather) or send (scatter) per peer, then waits for all */
static dt_status linear(dt_algo_ctx *x, bool gather, const void *send, void *recv, size_t bytes, int root) {
    dt_transport *t = x->t;
    int n = x->size;
    if (n == 1) {
        if (bytes && send != recv) memcpy(recv, send, bytes);
        return DT_OK;
    }
    if (x->rank != root) {
        dt_treq rq;
        dt_treq *w = &rq;
        DT_TRY(gather ? t->ops->isend(t, root, DT_TAG_COLL, send, bytes, &rq)
                      : t->ops->irecv(t, root, DT_TAG_COLL, recv, bytes, &rq));
        return t->ops->waitall(t, &w, 1, x->deadline);
    }
    dt_treq *rq = calloc((size_t)n, sizeof *rq);
    dt_treq **w = calloc((size_t)n, sizeof *w);
    dt_status st = rq && w ? DT_OK : dt_error(DT_ENOMEM, "out of memory in gather/scatter");
    for (int p = 0; p < n && st == DT_OK; p++) {
        if (p == root) continue;
        st = gather ? t->ops->irecv(t, p, DT_TAG_COLL, (unsigned char *)recv + (size_t)p * bytes, bytes, &rq[p])
                    : t->ops->isend(t, p, DT_TAG_COLL, (const unsigned char *)send + (size_t)p * bytes, bytes, &rq[p]);
        w[p] = &rq[p];
    }
    if (st == DT_OK) {
        const unsigned char *from = gather ? send : (const unsigned char *)send + (size_t)root * bytes;
        unsigned char *to = gather ? (unsigned char *)recv + (size_t)root * bytes : recv;
        if (bytes && from != to) memcpy(to, from, bytes);
        st = t->ops->waitall(t, w, n, x->deadline);
    }
    free(rq);
    free(w);
    return st;
}

dt_status dt_algo_gather(dt_algo_ctx *x, const void *send, void *recv, size_t bytes, int root) {
    return linear(x, true, send, recv, bytes, root);
}

dt_status dt_algo_scatter(dt_algo_ctx *x, const void *send, void *recv, size_t bytes, int root) {
    return linear(x, false, send, recv, bytes, root);
}

dt_status dt_algo_alltoall(dt_algo_ctx *x, const void *send, void *recv, size_t bytes) {
    int n = x->size, r = x->rank;
    const unsigned char *s = send;
    unsigned char *d = recv;
    if (bytes) memcpy(d + (size_t)r * bytes, s + (size_t)r * bytes, bytes);
    for (int k = 1; k < n; k++) {
        int dst = (r + k) % n, src = (r - k + n) % n;
        DT_TRY(
            dt_algo_exchange(x, dst, s + (size_t)dst * bytes, bytes, src, d + (size_t)src * bytes, bytes, DT_U8, -1));
    }
    return DT_OK;
}

dt_status dt_algo_barrier(dt_algo_ctx *x) {
    int n = x->size, r = x->rank;
    for (int k = 1; k < n; k <<= 1)
        DT_TRY(dt_algo_exchange(x, (r + k) % n, NULL, 0, (r - k + n) % n, NULL, 0, DT_U8, -1));
    return DT_OK;
}
