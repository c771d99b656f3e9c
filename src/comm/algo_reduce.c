/* Reduction algorithms over the transport: ring allreduce (reduce-scatter + allgather,
 * bandwidth-optimal), recursive doubling (latency-optimal), recursive halving-doubling
 * (Rabenseifner), ring reduce-scatter, binomial-tree and ring reduce. Non-power-of-two sizes
 * fold the first 2r ranks in pairs (Thakur et al.). All exchanges go through dt_algo_exchange,
 * which pipelines in segments through a cache-sized scratch buffer. */
#include "comm/algo.h"
#include "comm/reduce.h"

#include <stdlib.h>
#include <string.h>

void *dt_algo_scratch(dt_algo_ctx *x, int which, size_t bytes) {
    dt_scratch *s = x->scratch;
    if (bytes == 0) bytes = 64;
    if (s->cap[which] < bytes) {
        dt_free(s->buf[which]);
        s->buf[which] = dt_alloc(bytes);
        s->cap[which] = s->buf[which] ? bytes : 0;
        if (!s->buf[which]) {
            dt_error(DT_ENOMEM, "out of memory: %zu bytes of collective scratch space", bytes);
            return NULL;
        }
    }
    return s->buf[which];
}

static size_t segs(size_t bytes, size_t seg) { return bytes ? (bytes + seg - 1) / seg : 1; }

/* Sends sbytes of sbuf to dst (-1: none) while receiving rbytes from src (-1: none) into rbuf,
 * reduced into it (redop >= 0) or copied (redop < 0), in segments of x->seg_bytes. rbuf may equal
 * sbuf: each segment is sent before the same segment is reduced. */
dt_status dt_algo_exchange(dt_algo_ctx *x, int dst, const void *sbuf, size_t sbytes, int src, void *rbuf, size_t rbytes,
                           dt_dtype t, int redop) {
    dt_transport *tp = x->t;
    size_t esz = dt_dtype_size(t), seg = x->seg_bytes / esz * esz;
    if (seg == 0) seg = esz;
    size_t ns = dst >= 0 ? segs(sbytes, seg) : 0, nr = src >= 0 ? segs(rbytes, seg) : 0;
    unsigned char *tmp = NULL;
    if (redop >= 0 && nr && rbytes) {
        tmp = dt_algo_scratch(x, 0, rbytes < seg ? rbytes : seg);
        if (!tmp) return DT_ENOMEM;
    }
    for (size_t j = 0; j < ns || j < nr; j++) {
        dt_treq sr, rr;
        dt_treq *w[2] = {NULL, NULL};
        size_t off = j * seg;
        if (j < ns) {
            DT_TRY(tp->ops->isend(tp, dst, DT_TAG_COLL, (const unsigned char *)sbuf + off,
                                  sbytes - off < seg ? sbytes - off : seg, &sr));
            w[0] = &sr;
        }
        size_t rlen = 0;
        if (j < nr) {
            rlen = rbytes - off < seg ? rbytes - off : seg;
            DT_TRY(tp->ops->irecv(tp, src, DT_TAG_COLL, tmp ? (void *)tmp : (unsigned char *)rbuf + off, rlen, &rr));
            w[1] = &rr;
        }
        DT_TRY(tp->ops->waitall(tp, w, 2, x->deadline));
        if (tmp && rlen) dt_reduce_into((unsigned char *)rbuf + off, tmp, rlen / esz, t, (dt_redop)redop);
    }
    return DT_OK;
}

/* element offset/length of block b when `count` is cut into n near-equal blocks */
static size_t blk_off(size_t count, int n, int b) {
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    return (size_t)b * base + ((size_t)b < rem ? (size_t)b : rem);
}
static size_t blk_len(size_t count, int n, int b) { return blk_off(count, n, b + 1) - blk_off(count, n, b); }

/* ring reduce-scatter in place over buf: afterwards block `rank` holds the full reduction */
static dt_status ring_rs(dt_algo_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op) {
    int n = x->size, r = x->rank, right = (r + 1) % n, left = (r + n - 1) % n;
    size_t esz = dt_dtype_size(t);
    unsigned char *b = buf;
    for (int s = 0; s < n - 1; s++) {
        int sb = (r - s - 1 + 2 * n) % n, rb = (r - s - 2 + 2 * n) % n;
        DT_TRY(dt_algo_exchange(x, right, b + blk_off(count, n, sb) * esz, blk_len(count, n, sb) * esz, left,
                                b + blk_off(count, n, rb) * esz, blk_len(count, n, rb) * esz, t, (int)op));
    }
    return DT_OK;
}

/* ring allgather in place: block `rank` present, afterwards all blocks */
static dt_status ring_ag(dt_algo_ctx *x, void *buf, size_t count, dt_dtype t) {
    int n = x->size, r = x->rank, right = (r + 1) % n, left = (r + n - 1) % n;
    size_t esz = dt_dtype_size(t);
    unsigned char *b = buf;
    for (int s = 0; s < n - 1; s++) {
        int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
        DT_TRY(dt_algo_exchange(x, right, b + blk_off(count, n, sb) * esz, blk_len(count, n, sb) * esz, left,
                                b + blk_off(count, n, rb) * esz, blk_len(count, n, rb) * esz, t, -1));
    }
    return DT_OK;
}

/* non-power-of-two folding: returns the virtual rank in [0, p) or -1 for a folded-out rank */
static int fold_vr(int n, int r, int *p_out) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    int rem = n - p;
    *p_out = p;
    if (r < 2 * rem) return r % 2 ? r / 2 : -1;
    return r - rem;
}
static int real_rank(int n, int p, int vr) {
    int rem = n - p;
    return vr < rem ? 2 * vr + 1 : vr + rem;
}

static dt_status fold_in(dt_algo_ctx *x, void *buf, size_t bytes, dt_dtype t, dt_redop op, int p) {
    int r = x->rank, rem = x->size - p;
    if (r >= 2 * rem) return DT_OK;
    if (r % 2 == 0) return dt_algo_exchange(x, r + 1, buf, bytes, -1, NULL, 0, t, -1);
    return dt_algo_exchange(x, -1, NULL, 0, r - 1, buf, bytes, t, (int)op);
}

static dt_status fold_out(dt_algo_ctx *x, void *buf, size_t bytes, dt_dtype t, int p) {
    int r = x->rank, rem = x->size - p;
    if (r >= 2 * rem) return DT_OK;
    if (r % 2) return dt_algo_exchange(x, r - 1, buf, bytes, -1, NULL, 0, t, -1);
    return dt_algo_exchange(x, -1, NULL, 0, r + 1, buf, bytes, t, -1);
}

static dt_status rd_allreduce(dt_algo_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op) {
    size_t bytes = count * dt_dtype_size(t);
    int p, vr = fold_vr(x->size, x->rank, &p);
    DT_TRY(fold_in(x, buf, bytes, t, op, p));
    if (vr >= 0) {
        for (int mask = 1; mask < p; mask <<= 1) {
            int peer = real_rank(x->size, p, vr ^ mask);
            DT_TRY(dt_algo_exchange(x, peer, buf, bytes, peer, buf, bytes, t, (int)op));
        }
        if (op == DT_OP_AVG) dt_reduce_scale(buf, count, t, x->size);
    }
    return fold_out(x, buf, bytes, t, p);
}

static dt_status rhd_allreduce(dt_algo_ctx *x, void *buf, size_t count, dt_dtype t, dt_redop op) {
    size_t esz = dt_dtype_size(t), bytes = count * esz;
    unsigned char *b = buf;
    int p, vr = fold_vr(x->size, x->rank, &p);
    DT_TRY(fold_in(x, buf, bytes, t, op, p));
    if (vr >= 0) {
        int lo = 0, hi = p; /* block range I am responsible for */
        for (int mask = p / 2; mask >= 1; mask >>= 1) {
            int peer = real_rank(x->size, p, vr ^ mask), mid = lo + (hi - lo) / 2;
            int klo = (vr & mask) ? mid : lo, khi = (vr & mask) ? hi : mid;
            int slo = (vr & mask) ? lo : mid, shi = (vr & mask) ? mid : hi;
            size_t so = blk_off(count, p, slo), sn = blk_off(count, p, shi) - so;
            size_t ko = blk_off(count, p, klo), kn = blk_off(count, p, khi) - ko;
            DT_TRY(dt_algo_exchange(x, peer, b + so * esz, sn * esz, peer, b + ko * esz, kn * esz, t, (int)op));
            lo = klo, hi = khi;
        }
        if (op == DT_OP_AVG) dt_reduce_scale(b + blk_off(count, p, vr) * esz, blk_len(count, p, vr), t, x->size);
        for (int mask = 1; mask < p; mask <<= 1) {
            int peer = real_rank(x->size, p, vr ^ mask), w = hi - lo;
            int plo = (vr & mask) ? lo - w : hi, phi = plo + w;
            size_t so = blk_off(count, p, lo), sn = blk_off(count, p, hi) - so;
            size_t po = blk_off(count, p, plo), pn = blk_off(count, p, phi) - po;
            DT_TRY(dt_algo_exchange(x, peer, b + so * esz, sn * esz, peer, b + po * esz, pn * esz, t, -1));
            if (plo < lo) lo = plo;
            else hi = phi;
        }
    }
    return fold_out(x, buf, bytes, t, p);
}

dt_status dt_algo_allreduce(dt_algo_ctx *x, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op) {
    size_t esz = dt_dtype_size(t);
    if (send != recv && count) memcpy(recv, send, count * esz);
    switch (x->algo) {
    case DT_ALGO_RD: return rd_allreduce(x, recv, count, t, op);
    case DT_ALGO_RHD: return rhd_allreduce(x, recv, count, t, op);
    default: {
        DT_TRY(ring_rs(x, recv, count, t, op));
        unsigned char *own = (unsigned char *)recv + blk_off(count, x->size, x->rank) * esz;
        if (op == DT_OP_AVG) dt_reduce_scale(own, blk_len(count, x->size, x->rank), t, x->size);
        return ring_ag(x, recv, count, t);
    }
    }
}

dt_status dt_algo_reduce_scatter(dt_algo_ctx *x, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op) {
    size_t esz = dt_dtype_size(t), total = count * (size_t)x->size;
    unsigned char *acc = dt_algo_scratch(x, 1, total * esz);
    if (!acc) return DT_ENOMEM;
    if (total) memcpy(acc, send, total * esz);
    DT_TRY(ring_rs(x, acc, total, t, op));
    if (count) memcpy(recv, acc + (size_t)x->rank * count * esz, count * esz);
    if (op == DT_OP_AVG) dt_reduce_scale(recv, count, t, x->size);
    return DT_OK;
}

static dt_status tree_reduce(dt_algo_ctx *x, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op,
                             int root) {
    int n = x->size, vr = (x->rank - root + n) % n;
    size_t bytes = count * dt_dtype_size(t);
    unsigned char *acc = x->rank == root ? recv : dt_algo_scratch(x, 1, bytes);
    if (!acc) return DT_ENOMEM;
    if (acc != send && bytes) memcpy(acc, send, bytes);
    for (int mask = 1; mask < n; mask <<= 1) {
        if (vr & mask) return dt_algo_exchange(x, (vr - mask + root) % n, acc, bytes, -1, NULL, 0, t, -1);
        if (vr + mask < n) DT_TRY(dt_algo_exchange(x, -1, NULL, 0, (vr + mask + root) % n, acc, bytes, t, (int)op));
    }
    if (op == DT_OP_AVG) dt_reduce_scale(acc, count, t, n);
    return DT_OK;
}

/* ring reduce-scatter on a copy, then every block owner sends its block to root */
static dt_status ring_reduce(dt_algo_ctx *x, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op,
                             int root) {
    int n = x->size, r = x->rank;
    size_t esz = dt_dtype_size(t);
    unsigned char *acc = dt_algo_scratch(x, 1, count * esz);
    if (!acc) return DT_ENOMEM;
    if (count) memcpy(acc, send, count * esz);
    DT_TRY(ring_rs(x, acc, count, t, op));
    unsigned char *own = acc + blk_off(count, n, r) * esz;
    size_t own_n = blk_len(count, n, r);
    if (op == DT_OP_AVG) dt_reduce_scale(own, own_n, t, n);
    if (r != root) return dt_algo_exchange(x, root, own, own_n * esz, -1, NULL, 0, t, -1);
    unsigned char *out = recv;
    if (own_n) memcpy(out + blk_off(count, n, r) * esz, own, own_n * esz);
    for (int p = 0; p < n; p++)
        if (p != root)
            DT_TRY(dt_algo_exchange(x, -1, NULL, 0, p, out + blk_off(count, n, p) * esz, blk_len(count, n, p) * esz, t,
                                    -1));
    return DT_OK;
}

dt_status dt_algo_reduce(dt_algo_ctx *x, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op,
                         int root) {
    if (x->algo == DT_ALGO_RING || x->algo == DT_ALGO_RHD) return ring_reduce(x, send, recv, count, t, op, root);
    return tree_reduce(x, send, recv, count, t, op, root);
}
