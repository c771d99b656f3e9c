/* The communicator's collectives and point-to-point calls: argument checks, in-place and
 * overlap handling, sequence numbers and op descriptors, then the transport's native
 * collective (shm direct, MPI) or our own algorithm chosen by size (algo.h). */
#include "comm/comm_internal.h"
#include "comm/reduce.h"

#include <stdlib.h>
#include <string.h>

static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    const char *x = a, *y = b;
    return a && b && na && nb && x < y + nb && y < x + na;
}

static dt_status check(dt_comm *c, const char *fn, dt_dtype t, bool reduce, dt_redop op, int root) {
    if (!c) return dt_error(DT_EINVAL, "%s: communicator is NULL", fn);
    if ((unsigned)t >= DT_DTYPE_COUNT) return dt_error(DT_EINVAL, "%s: unknown dtype %d", fn, (int)t);
    if (reduce && !dt_reduce_dtype_ok(t))
        return dt_error(DT_EINVAL, "%s: cannot reduce %s (use F32, F64, BF16, F16, I32 or I64)", fn, dt_dtype_name(t));
    if (reduce && (unsigned)op >= DT_OP_COUNT) return dt_error(DT_EINVAL, "%s: unknown reduction op %d", fn, (int)op);
    if (root != -1 && (root < 0 || root >= c->size))
        return dt_error(DT_EINVAL, "%s: root %d is not a rank of this communicator (size %d)", fn, root, c->size);
    if (c->failed) return dt_comm_failed_error(c);
    return DT_OK;
}

static dt_status need(const char *fn, const char *what, const void *p, size_t bytes) {
    if (bytes && !p) return dt_error(DT_EINVAL, "%s: %s is NULL but %zu bytes are needed", fn, what, bytes);
    return DT_OK;
}

static dt_request make(dt_comm *c, dt_rq_kind k, dt_coll_op op, const void *send, void *recv, size_t count, dt_dtype t,
                       dt_redop redop, int root) {
    dt_request r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.kind = k;
    r.op = op;
    r.send = send;
    r.recv = recv;
    r.count = count;
    r.dtype = t;
    r.redop = redop;
    r.root = root;
    return r;
}

/* An input that overlaps the output: recorded here, staged by stage_input when the op runs. Doing
 * it at issue time broke issue order: a queued non-blocking op (or one a blocking call waits for)
 * may still write these bytes, and a memmove into recv overwrote memory that op was reducing. */
static void copy_input(dt_request *r, size_t bytes) {
    r->stage_bytes = bytes ? bytes : 1;
    r->stage_dst = NULL;
}

static void move_input(dt_request *r, void *dst, size_t bytes) {
    r->stage_bytes = bytes;
    r->stage_dst = dst;
}

/* moves the input into place (stage_dst) or into a private copy (tmp), after every earlier op */
static dt_status stage_input(dt_request *r) {
    if (!r->stage_bytes) return DT_OK;
    if (r->stage_dst) {
        memmove(r->stage_dst, r->send, r->stage_bytes);
        r->send = r->stage_dst;
    } else {
        r->tmp = malloc(r->stage_bytes);
        if (!r->tmp)
            return dt_error(DT_ENOMEM, "out of memory copying an overlapping input (%zu bytes)", r->stage_bytes);
        memcpy(r->tmp, r->send, r->stage_bytes);
        r->send = r->tmp;
    }
    r->stage_bytes = 0;
    return DT_OK;
}

static dt_status dispatch(dt_comm *c, dt_request *r, dt_request **nb) {
    if (!nb) {
        dt_status st = dt_comm_run(c, r);
        free(r->tmp);
        return st;
    }
    dt_request *h = malloc(sizeof *h);
    if (!h) {
        free(r->tmp);
        return dt_error(DT_ENOMEM, "out of memory for a request");
    }
    *h = *r;
    return dt_comm_submit(c, h, nb);
}

static dt_comm_algo resolve(dt_comm *c, dt_coll_op op, size_t bytes) {
    if (c->algo == DT_ALGO_RING || c->algo == DT_ALGO_RD || c->algo == DT_ALGO_RHD || c->algo == DT_ALGO_TREE)
        return c->algo;
    bool pow2 = (c->size & (c->size - 1)) == 0;
    switch (op) {
    case DT_COLL_ALLREDUCE: return bytes <= (32u << 10) ? DT_ALGO_RD : DT_ALGO_RING;
    case DT_COLL_BROADCAST: return bytes <= (256u << 10) ? DT_ALGO_TREE : DT_ALGO_RING;
    case DT_COLL_REDUCE: return bytes <= (64u << 10) ? DT_ALGO_TREE : DT_ALGO_RING;
    case DT_COLL_ALLGATHER:
    case DT_COLL_SPLIT: return pow2 && bytes * (size_t)c->size <= (64u << 10) ? DT_ALGO_RD : DT_ALGO_RING;
    default: return DT_ALGO_RING;
    }
}

/* our allgatherv in bytes: own block into place, then the algorithm */
static dt_status gatherv_bytes(dt_algo_ctx *x, const void *send, void *recv, const size_t *counts, const size_t *displs,
                               size_t esz) {
    int n = x->size;
    size_t *b = malloc(2 * (size_t)n * sizeof *b);
    if (!b) return dt_error(DT_ENOMEM, "out of memory in allgather");
    for (int i = 0; i < n; i++) {
        b[i] = counts[i] * esz;
        b[n + i] = displs[i] * esz;
    }
    unsigned char *own = (unsigned char *)recv + b[n + x->rank];
    if (b[x->rank] && own != send) memmove(own, send, b[x->rank]);
    dt_status st = dt_algo_allgatherv(x, recv, b, b + n);
    free(b);
    return st;
}

static dt_status coll_run(dt_comm *c, dt_request *r) {
    dt_transport *t = c->t;
    dt_status sst = stage_input(r);
    if (sst != DT_OK) return dt_comm_fail(c, sst);
    if (r->op == DT_COLL_ALLREDUCE && c->hier && dt_comm_hier_active(c)) /* every rank takes this path */
        return dt_comm_fail(c,
                            dt_comm_hier_allreduce(c->hier, c->size, r->send, r->recv, r->count, r->dtype, r->redop));
    size_t esz = dt_dtype_size(r->dtype), bytes = r->count * esz;
    dt_coll_desc d = {.seq = ++c->seq,
                      .op = (uint8_t)r->op,
                      .dtype = (uint8_t)r->dtype,
                      .redop = (uint8_t)r->redop,
                      .root = r->root,
                      .count = r->count};
    double deadline = dt_now() + c->timeout_s;
    dt_status st = DT_OK;
    if (t && t->ops->begin) {
        st = t->ops->begin(t, &d);
        if (st != DT_OK) return dt_comm_fail(c, st);
    }
    /* allgather as allgatherv with equal blocks */
    size_t *eq = NULL;
    const size_t *counts = r->counts, *displs = r->displs;
    if (r->op == DT_COLL_ALLGATHER || r->op == DT_COLL_SPLIT) {
        eq = malloc(2 * (size_t)c->size * sizeof *eq);
        if (!eq) return dt_comm_fail(c, dt_error(DT_ENOMEM, "out of memory in allgather"));
        for (int i = 0; i < c->size; i++) eq[i] = r->count, eq[c->size + i] = (size_t)i * r->count;
        counts = eq;
        displs = eq + c->size;
    }
    if (t && (c->size > 1 || t->ops->device_native) && t->ops->coll &&
        r->op != DT_COLL_SPLIT && /* a device transport decides */
        (c->algo == DT_ALGO_AUTO || c->algo == DT_ALGO_DIRECT || c->algo == DT_ALGO_NATIVE || t->ops->device_native)) {
        dt_coll_args a = {.d = d,
                          .send = r->send,
                          .recv = r->recv,
                          .counts = counts,
                          .displs = displs,
                          .algo = c->algo,
                          .deadline = deadline};
        st = t->ops->coll(t, &a);
        if (st != DT_ENOTSUP) {
            free(eq);
            return dt_comm_fail(c, st);
        }
        dt_error_clear();
    }
    dt_algo_ctx x = {.t = t,
                     .rank = c->rank,
                     .size = c->size,
                     .deadline = deadline,
                     .algo = resolve(c, (dt_coll_op)r->op, bytes),
                     .scratch = &c->scratch,
                     .seg_bytes = c->seg_bytes};
    switch (r->op) {
    case DT_COLL_ALLREDUCE: st = dt_algo_allreduce(&x, r->send, r->recv, r->count, r->dtype, r->redop); break;
    case DT_COLL_BROADCAST: st = dt_algo_broadcast(&x, r->recv, bytes, r->root); break;
    case DT_COLL_REDUCE: st = dt_algo_reduce(&x, r->send, r->recv, r->count, r->dtype, r->redop, r->root); break;
    case DT_COLL_ALLGATHER:
    case DT_COLL_SPLIT:
    case DT_COLL_ALLGATHERV: st = gatherv_bytes(&x, r->send, r->recv, counts, displs, esz); break;
    case DT_COLL_REDUCE_SCATTER: st = dt_algo_reduce_scatter(&x, r->send, r->recv, r->count, r->dtype, r->redop); break;
    case DT_COLL_GATHER: st = dt_algo_gather(&x, r->send, r->recv, bytes, r->root); break;
    case DT_COLL_SCATTER: st = dt_algo_scatter(&x, r->send, r->recv, bytes, r->root); break;
    case DT_COLL_ALLTOALL: st = dt_algo_alltoall(&x, r->send, r->recv, bytes); break;
    case DT_COLL_BARRIER: st = dt_algo_barrier(&x); break;
    default: st = dt_error(DT_EINTERNAL, "unknown collective %d", (int)r->op);
    }
    free(eq);
    return dt_comm_fail(c, st);
}

/* Bus bytes of op r on this rank (nccl-tests' convention: what a bandwidth-optimal algorithm
 * moves per rank, whatever algorithm ran): allreduce 2(n-1)/n S, allgather / reduce-scatter
 * (n-1)/n of the whole gathered S, broadcast / reduce / p2p S; 0 for barriers and splits. */
static uint64_t bus_bytes(const dt_comm *c, const dt_request *r) {
    const double n = c->size, S = (double)r->count * (double)dt_dtype_size(r->dtype);
    if (r->kind != RQ_COLL) return (uint64_t)S;
    switch (r->op) {
    case DT_COLL_ALLREDUCE: return (uint64_t)(2.0 * (n - 1) / n * S + 0.5);
    case DT_COLL_ALLGATHER:
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_ALLTOALL: return (uint64_t)((n - 1) * S + 0.5);
    case DT_COLL_BROADCAST:
    case DT_COLL_REDUCE:
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER: return (uint64_t)S;
    case DT_COLL_ALLGATHERV: {
        uint64_t b = 0;
        for (int i = 0; r->counts && i < c->size; i++)
            if (i != c->rank) b += r->counts[i] * dt_dtype_size(r->dtype);
        return b;
    }
    default: return 0;
    }
}

static dt_status exec_op(dt_comm *c, dt_request *r);

dt_status dt_comm_exec(dt_comm *c, dt_request *r) {
    dt_status st = exec_op(c, r);
    if (st == DT_OK && c->size > 1) {
        atomic_fetch_add_explicit(&c->bytes, bus_bytes(c, r), memory_order_relaxed);
        atomic_fetch_add_explicit(&c->ops, 1, memory_order_relaxed);
    }
    return st;
}

uint64_t dt_comm_bytes(const dt_comm *c, uint64_t *ops) {
    if (ops) *ops = c ? atomic_load_explicit(&c->ops, memory_order_relaxed) : 0;
    return c ? atomic_load_explicit(&c->bytes, memory_order_relaxed) : 0;
}

static dt_status exec_op(dt_comm *c, dt_request *r) {
    if (r->kind == RQ_COLL) return coll_run(c, r);
    r->deadline = dt_now() + c->timeout_s;
    memset(&r->treq, 0, sizeof r->treq);
    size_t bytes = r->count * dt_dtype_size(r->dtype);
    dt_status st = r->kind == RQ_SEND ? c->t->ops->isend(c->t, r->root, r->tag, r->send, bytes, &r->treq)
                                      : c->t->ops->irecv(c->t, r->root, r->tag, r->recv, bytes, &r->treq);
    return dt_comm_fail(c, st);
}

/* ---- public collectives ---- */

static dt_status allreduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op,
                           dt_request **nb) {
    const char *fn = nb ? "dt_comm_iallreduce" : "dt_comm_allreduce";
    DT_TRY(check(c, fn, t, true, op, -1));
    size_t bytes = count * dt_dtype_size(t);
    DT_TRY(need(fn, "send", send, bytes));
    DT_TRY(need(fn, "recv", recv, bytes));
    dt_request r = make(c, RQ_COLL, DT_COLL_ALLREDUCE, send, recv, count, t, op, -1);
    if (send != recv && overlap(send, bytes, recv, bytes)) move_input(&r, recv, bytes);
    return dispatch(c, &r, nb);
}

dt_status dt_comm_allreduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op) {
    return allreduce(c, send, recv, count, t, op, NULL);
}
dt_status dt_comm_iallreduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op,
                             dt_request **req) {
    return allreduce(c, send, recv, count, t, op, req);
}

static dt_status broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_request **nb) {
    const char *fn = nb ? "dt_comm_ibroadcast" : "dt_comm_broadcast";
    DT_TRY(check(c, fn, t, false, DT_OP_SUM, root));
    DT_TRY(need(fn, "buf", buf, count * dt_dtype_size(t)));
    dt_request r = make(c, RQ_COLL, DT_COLL_BROADCAST, buf, buf, count, t, DT_OP_SUM, root);
    return dispatch(c, &r, nb);
}

dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
    return broadcast(c, buf, count, t, root, NULL);
}
dt_status dt_comm_ibroadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_request **req) {
    return broadcast(c, buf, count, t, root, req);
}

dt_status dt_comm_reduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op, int root) {
    DT_TRY(check(c, "dt_comm_reduce", t, true, op, root));
    size_t bytes = count * dt_dtype_size(t);
    DT_TRY(need("dt_comm_reduce", "send", send, bytes));
    if (c->rank == root) DT_TRY(need("dt_comm_reduce", "recv (on root)", recv, bytes));
    dt_request r = make(c, RQ_COLL, DT_COLL_REDUCE, send, recv, count, t, op, root);
    if (c->rank == root && send != recv && overlap(send, bytes, recv, bytes)) copy_input(&r, bytes);
    return dispatch(c, &r, NULL);
}

static dt_status allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_request **nb) {
    const char *fn = nb ? "dt_comm_iallgather" : "dt_comm_allgather";
    DT_TRY(check(c, fn, t, false, DT_OP_SUM, -1));
    size_t bytes = count * dt_dtype_size(t);
    unsigned char *own = (unsigned char *)recv + (size_t)c->rank * bytes;
    DT_TRY(need(fn, "send", send, bytes));
    DT_TRY(need(fn, "recv", recv, bytes * (size_t)c->size));
    if (send == recv) send = own;
    dt_request r = make(c, RQ_COLL, DT_COLL_ALLGATHER, send, recv, count, t, DT_OP_SUM, -1);
    if (send != own && overlap(send, bytes, recv, bytes * (size_t)c->size)) move_input(&r, own, bytes);
    return dispatch(c, &r, nb);
}

dt_status dt_comm_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
    return allgather(c, send, recv, count, t, NULL);
}
dt_status dt_comm_iallgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_request **req) {
    return allgather(c, send, recv, count, t, req);
}

dt_status dt_comm_allgatherv(dt_comm *c, const void *send, void *recv, const size_t *counts, const size_t *displs,
                             dt_dtype t) {
    const char *fn = "dt_comm_allgatherv";
    DT_TRY(check(c, fn, t, false, DT_OP_SUM, -1));
    if (!counts) return dt_error(DT_EINVAL, "%s: counts is NULL", fn);
    size_t esz = dt_dtype_size(t), total = 0;
    size_t *packed = malloc((size_t)c->size * sizeof *packed);
    if (!packed) return dt_error(DT_ENOMEM, "out of memory in %s", fn);
    for (int i = 0; i < c->size; i++) {
        packed[i] = displs ? displs[i] : total;
        total += counts[i];
    }
    size_t end = 0;
    for (int i = 0; i < c->size; i++)
        if (packed[i] + counts[i] > end) end = packed[i] + counts[i];
    dt_status st = need(fn, "send", send, counts[c->rank] * esz);
    if (st == DT_OK) st = need(fn, "recv", recv, end * esz);
    unsigned char *own = (unsigned char *)recv + packed[c->rank] * esz;
    dt_request r = make(c, RQ_COLL, DT_COLL_ALLGATHERV, send, recv, counts[c->rank], t, DT_OP_SUM, -1);
    r.counts = counts;
    r.displs = packed;
    if (st == DT_OK && send != own && overlap(send, counts[c->rank] * esz, recv, end * esz))
        move_input(&r, own, counts[c->rank] * esz);
    if (st == DT_OK) st = dispatch(c, &r, NULL);
    free(packed);
    return st;
}

static dt_status reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op,
                                dt_request **nb) {
    const char *fn = nb ? "dt_comm_ireduce_scatter" : "dt_comm_reduce_scatter";
    DT_TRY(check(c, fn, t, true, op, -1));
    size_t bytes = count * dt_dtype_size(t), all = bytes * (size_t)c->size;
    DT_TRY(need(fn, "send", send, all));
    DT_TRY(need(fn, "recv", recv, bytes));
    dt_request r = make(c, RQ_COLL, DT_COLL_REDUCE_SCATTER, send, recv, count, t, op, -1);
    if (send != recv && overlap(send, all, recv, bytes)) copy_input(&r, all);
    return dispatch(c, &r, nb);
}

dt_status dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op) {
    return reduce_scatter(c, send, recv, count, t, op, NULL);
}
dt_status dt_comm_ireduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_redop op,
                                  dt_request **req) {
    return reduce_scatter(c, send, recv, count, t, op, req);
}

dt_status dt_comm_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    DT_TRY(check(c, "dt_comm_gather", t, false, DT_OP_SUM, root));
    size_t bytes = count * dt_dtype_size(t), all = bytes * (size_t)c->size;
    DT_TRY(need("dt_comm_gather", "send", send, bytes));
    if (c->rank == root) DT_TRY(need("dt_comm_gather", "recv (on root)", recv, all));
    dt_request r = make(c, RQ_COLL, DT_COLL_GATHER, send, recv, count, t, DT_OP_SUM, root);
    if (c->rank == root && send != (unsigned char *)recv + (size_t)root * bytes && overlap(send, bytes, recv, all))
        copy_input(&r, bytes);
    return dispatch(c, &r, NULL);
}

dt_status dt_comm_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root) {
    DT_TRY(check(c, "dt_comm_scatter", t, false, DT_OP_SUM, root));
    size_t bytes = count * dt_dtype_size(t), all = bytes * (size_t)c->size;
    if (c->rank == root) DT_TRY(need("dt_comm_scatter", "send (on root)", send, all));
    DT_TRY(need("dt_comm_scatter", "recv", recv, bytes));
    dt_request r = make(c, RQ_COLL, DT_COLL_SCATTER, send, recv, count, t, DT_OP_SUM, root);
    if (c->rank == root && recv != (const unsigned char *)send + (size_t)root * bytes &&
        overlap(send, all, recv, bytes))
        copy_input(&r, all);
    return dispatch(c, &r, NULL);
}

dt_status dt_comm_alltoall(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t) {
    DT_TRY(check(c, "dt_comm_alltoall", t, false, DT_OP_SUM, -1));
    size_t all = count * dt_dtype_size(t) * (size_t)c->size;
    DT_TRY(need("dt_comm_alltoall", "send", send, all));
    DT_TRY(need("dt_comm_alltoall", "recv", recv, all));
    dt_request r = make(c, RQ_COLL, DT_COLL_ALLTOALL, send, recv, count, t, DT_OP_SUM, -1);
    if (overlap(send, all, recv, all)) copy_input(&r, all);
    return dispatch(c, &r, NULL);
}

dt_status dt_comm_barrier(dt_comm *c) {
    DT_TRY(check(c, "dt_comm_barrier", DT_F32, false, DT_OP_SUM, -1));
    dt_request r = make(c, RQ_COLL, DT_COLL_BARRIER, NULL, NULL, 0, DT_F32, DT_OP_SUM, -1);
    return dispatch(c, &r, NULL);
}

dt_status dt_comm_allgather_bytes(dt_comm *c, const void *send, void *recv, size_t bytes, dt_coll_op op) {
    dt_request r = make(c, RQ_COLL, op, send, recv, bytes, DT_U8, DT_OP_SUM, -1);
    return dispatch(c, &r, NULL);
}

/* ---- point-to-point ---- */

static dt_status p2p(dt_comm *c, bool send, const void *sbuf, void *rbuf, size_t count, dt_dtype t, int peer, int tag,
                     dt_request **nb) {
    const char *fn = send ? (nb ? "dt_comm_isend" : "dt_comm_send") : (nb ? "dt_comm_irecv" : "dt_comm_recv");
    DT_TRY(check(c, fn, t, false, DT_OP_SUM, -1));
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return dt_error(DT_EINVAL, "%s: peer %d is not another rank (this is rank %d of %d)", fn, peer, c->rank,
                        c->size);
    if (tag < 0 || tag > DT_COMM_TAG_MAX)
        return dt_error(DT_EINVAL, "%s: tag %d is outside 0..%d", fn, tag, DT_COMM_TAG_MAX);
    DT_TRY(need(fn, "buf", send ? sbuf : rbuf, count * dt_dtype_size(t)));
    dt_request r = make(c, send ? RQ_SEND : RQ_RECV, send ? DT_COLL_SEND : DT_COLL_RECV, sbuf, rbuf, count, t,
                        DT_OP_SUM, peer);
    r.tag = tag;
    return dispatch(c, &r, nb);
}

dt_status dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag) {
    return p2p(c, true, buf, NULL, count, t, peer, tag, NULL);
}
dt_status dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag) {
    return p2p(c, false, NULL, buf, count, t, peer, tag, NULL);
}
dt_status dt_comm_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag, dt_request **req) {
    return p2p(c, true, buf, NULL, count, t, peer, tag, req);
}
dt_status dt_comm_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag, dt_request **req) {
    return p2p(c, false, NULL, buf, count, t, peer, tag, req);
}
