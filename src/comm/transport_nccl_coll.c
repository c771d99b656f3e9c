/* The NCCL transport's data path: collectives on device buffers (allreduce, reduce-scatter,
 * allgather(v), broadcast, reduce natively; gather, scatter and alltoall as grouped send/recv),
 * point-to-point on device buffers (posted sends and receives are launched together in one NCCL
 * group at the next test/wait, so a pairwise exchange cannot deadlock), and everything on host
 * memory handed to the bootstrap transport. Every device op ends with an event polled against the
 * op's deadline; while it waits it also asks the bootstrap for progress, so a peer that died or
 * aborted fails this rank with the bootstrap's message naming it. When the deadline passes, or
 * NCCL reports an asynchronous error (ncclCommGetAsyncError), the NCCL communicator is aborted
 * (ncclCommAbort) and the bootstrap tells every other rank. */
#ifdef DT_HAVE_NCCL
#include "comm/transport_nccl.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

bool dt_nccl_on_device(const void *p) {
    if (!p) return false;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* an unregistered host pointer: clear the sticky-free error */
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

dt_status dt_nccl_error(dt_nccl *n, dt_status s, ncclResult_t r, const char *what) {
    char op[96];
    n->broken = true;
    const char *last = n->comm ? ncclGetLastError(n->comm) : NULL;
    return dt_error(s, "nccl: %s failed during %s: %s%s%s", what,
                    n->cur.op ? dt_coll_desc_str(&n->cur, op, sizeof op) : "setup", ncclGetErrorString(r),
                    last && *last ? ": " : "", last ? last : "");
}

/* The deadline passed during `what`: abort NCCL here, and every other rank through the bootstrap;
 * the message names the rank that never began the op where the bootstrap can tell (shm). */
static dt_status timed_out(dt_nccl *n, const char *what) {
    char op[96], who[64] = "a rank did not reach it or NCCL stalled", msg[400];
    const dt_transport *h = n->host;
    int late = n->cur.seq && h->ops->behind ? h->ops->behind(n->host, n->cur.seq) : -1;
    if (late >= 0) snprintf(who, sizeof who, "rank %d never started it", late);
    snprintf(msg, sizeof msg,
             "nccl: timed out after %.0f s in %s (%s) on rank %d: %s; raise %s if the ranks are only "
             "slow",
             n->timeout_s, n->cur.op ? dt_coll_desc_str(&n->cur, op, sizeof op) : "setup", what, n->base.rank, who,
             n->base.timeout_knob[0] ? n->base.timeout_knob : "DTRAIN_TIMEOUT");
    n->broken = true;
    if (n->comm) ncclCommAbort(n->comm), n->comm = NULL;
    if (n->host->ops->abort) n->host->ops->abort(n->host, DT_ETIMEDOUT, msg);
    return late >= 0 ? dt_error_peer(DT_ETIMEDOUT, late, "%s", msg) : dt_error(DT_ETIMEDOUT, "%s", msg);
}

/* One polling round's check of NCCL's asynchronous error and of the bootstrap (a peer died or
 * aborted); waits about `step` seconds in the bootstrap when step > 0. */
static dt_status poll_once(dt_nccl *n, double step, const char *what) {
    ncclResult_t a = ncclSuccess;
    if (n->comm && ncclCommGetAsyncError(n->comm, &a) == ncclSuccess && a != ncclSuccess && a != ncclInProgress)
        return dt_nccl_error(n, DT_EPEER, a, what);
    if (step <= 0) {
        sched_yield();
        return DT_OK;
    }
    dt_status st = n->host->ops->waitall(n->host, NULL, 0, dt_now() + step);
    if (st != DT_OK) {
        n->broken = true;
        if (n->comm) ncclCommAbort(n->comm), n->comm = NULL;
    }
    return st;
}

dt_status dt_nccl_wait_enqueued(dt_nccl *n, double deadline, const char *what) {
    double t0 = dt_now();
    for (;;) {
        ncclResult_t a = ncclSuccess;
        if (ncclCommGetAsyncError(n->comm, &a) != ncclSuccess || (a != ncclSuccess && a != ncclInProgress))
            return dt_nccl_error(n, DT_EPEER, a, what);
        if (a == ncclSuccess) return DT_OK;
        if (dt_now() > deadline) return timed_out(n, what);
        DT_TRY(poll_once(n, dt_now() - t0 > 2e-4 ? 1e-3 : 0, what));
    }
}

/* Waits for ev (recorded after the op) with the deadline: spins ~200 us, then polls the bootstrap
 * every millisecond. */
static dt_status wait_event(dt_nccl *n, cudaEvent_t ev, double deadline, const char *what) {
    double t0 = dt_now();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return DT_OK;
        if (e != cudaErrorNotReady) {
            n->broken = true;
            return dt_error(DT_EPEER, "nccl: %s: CUDA error %s", what, cudaGetErrorString(e));
        }
        if (dt_now() > deadline) return timed_out(n, what);
        DT_TRY(poll_once(n, dt_now() - t0 > 2e-4 ? 1e-3 : 0, what));
    }
}

dt_status dt_nccl_prepare(dt_nccl *n, cudaStream_t *s) {
    if (n->broken || !n->comm) return dt_error(DT_EPEER, "nccl: the communicator failed before (see the first error)");
    cudaError_t e = cudaSetDevice(n->dev);
    if (e == cudaSuccess && !n->given) e = cudaDeviceSynchronize(); /* no stream given: the writers are done */
    if (e != cudaSuccess) return dt_error(DT_EPEER, "nccl: CUDA error before a collective: %s", cudaGetErrorString(e));
    *s = n->given ? n->given : n->own;
    return DT_OK;
}

static bool nccl_type(int dtype, ncclDataType_t *t) {
    switch (dtype) {
    case DT_F32: *t = ncclFloat32; return true;
    case DT_F64: *t = ncclFloat64; return true;
    case DT_BF16: *t = ncclBfloat16; return true;
    case DT_F16: *t = ncclFloat16; return true;
    case DT_I32: *t = ncclInt32; return true;
    case DT_I64: *t = ncclInt64; return true;
    case DT_U8: *t = ncclUint8; return true;
    case DT_I8: *t = ncclInt8; return true;
    default: return false;
    }
}

static bool nccl_redop(int op, int dtype, ncclRedOp_t *r) {
    bool fp = dtype == DT_F32 || dtype == DT_F64 || dtype == DT_BF16 || dtype == DT_F16;
    switch (op) {
    case DT_OP_SUM: *r = ncclSum; return true;
    case DT_OP_AVG: *r = ncclAvg; return fp; /* comm.h's integer AVG divides on the host: not here */
    case DT_OP_MAX: *r = ncclMax; return true;
    case DT_OP_MIN: *r = ncclMin; return true;
    case DT_OP_PROD: *r = ncclProd; return true;
    default: return false;
    }
}

/* gather, scatter, alltoall: one group of sends and receives of `bytes` blocks; own block copied */
static ncclResult_t moves(dt_nccl *n, const dt_coll_args *a, size_t bytes, cudaStream_t s) {
    const int me = n->base.rank, N = n->base.size, root = a->d.root, op = a->d.op;
    const char *src = a->send;
    char *dst = a->recv;
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < N && r == ncclSuccess; p++) {
        if (p == me) continue;
        if (op == DT_COLL_GATHER && me == root) r = ncclRecv(dst + (size_t)p * bytes, bytes, ncclUint8, p, n->comm, s);
        if (op == DT_COLL_GATHER && p == root) r = ncclSend(src, bytes, ncclUint8, p, n->comm, s);
        if (op == DT_COLL_SCATTER && me == root) r = ncclSend(src + (size_t)p * bytes, bytes, ncclUint8, p, n->comm, s);
        if (op == DT_COLL_SCATTER && p == root) r = ncclRecv(dst, bytes, ncclUint8, p, n->comm, s);
        if (op == DT_COLL_ALLTOALL) {
            r = ncclSend(src + (size_t)p * bytes, bytes, ncclUint8, p, n->comm, s);
            if (r == ncclSuccess) r = ncclRecv(dst + (size_t)p * bytes, bytes, ncclUint8, p, n->comm, s);
        }
    }
    ncclResult_t e = ncclGroupEnd();
    if (r != ncclSuccess) return r;
    const char *from = op == DT_COLL_GATHER ? src : src + (size_t)me * bytes;
    char *to = op == DT_COLL_GATHER ? dst + (size_t)me * bytes : op == DT_COLL_SCATTER ? dst : dst + (size_t)me * bytes;
    bool mine = op == DT_COLL_ALLTOALL || me == root;
    if (mine && from != to && cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return ncclUnhandledCudaError;
    return e;
}

/* Enqueues collective a on stream s. */
static ncclResult_t launch(dt_nccl *n, const dt_coll_args *a, ncclDataType_t t, ncclRedOp_t ro, cudaStream_t s) {
    const int me = n->base.rank, N = n->base.size;
    const size_t count = a->d.count, esz = dt_dtype_size((dt_dtype)a->d.dtype);
    char *recv = a->recv;
    switch (a->d.op) {
    case DT_COLL_ALLREDUCE: return ncclAllReduce(a->send, recv, count, t, ro, n->comm, s);
    case DT_COLL_BROADCAST: return ncclBroadcast(recv, recv, count, t, a->d.root, n->comm, s);
    case DT_COLL_REDUCE: return ncclReduce(a->send, recv, count, t, ro, a->d.root, n->comm, s);
    case DT_COLL_ALLGATHER: /* in place as send == recv or send == recv + rank block: NCCL's in place */
        return ncclAllGather(a->send == recv ? recv + (size_t)me * count * esz : a->send, recv, count, t, n->comm, s);
    case DT_COLL_REDUCE_SCATTER: /* comm.h's in place: NCCL's (block `rank`), moved by nccl_coll */
        if (a->send != recv) return ncclReduceScatter(a->send, recv, count, t, ro, n->comm, s);
        return ncclReduceScatter(recv, recv + (size_t)me * count * esz, count, t, ro, n->comm, s);
    case DT_COLL_ALLGATHERV: { /* one broadcast per rank's block, in one group */
        ncclResult_t r = ncclGroupStart();
        for (int p = 0; p < N && r == ncclSuccess; p++) {
            char *blk = recv + a->displs[p] * esz;
            r = ncclBroadcast(p == me ? a->send : blk, blk, a->counts[p], t, p, n->comm, s);
        }
        ncclResult_t e = ncclGroupEnd();
        return r != ncclSuccess ? r : e;
    }
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER:
    case DT_COLL_ALLTOALL: return moves(n, a, count * esz, s);
    default: return ncclInvalidUsage;
    }
}

static dt_status nccl_coll(dt_transport *t, const dt_coll_args *a) {
    dt_nccl *n = (dt_nccl *)t;
    if (!dt_nccl_on_device(a->recv ? a->recv : a->send)) { /* host memory: the bootstrap's business */
        if (!n->host->ops->coll || n->base.size == 1) return DT_ENOTSUP;
        return n->host->ops->coll(n->host, a);
    }
    char op[96];
    ncclDataType_t ty = ncclUint8;
    ncclRedOp_t ro = ncclSum;
    bool reduces = a->d.op == DT_COLL_ALLREDUCE || a->d.op == DT_COLL_REDUCE || a->d.op == DT_COLL_REDUCE_SCATTER;
    if (!nccl_type(a->d.dtype, &ty) || (reduces && !nccl_redop(a->d.redop, a->d.dtype, &ro)))
        return dt_error(DT_EINVAL, "nccl: %s on device memory: NCCL has no such type or reduction",
                        dt_coll_desc_str(&a->d, op, sizeof op));
    n->cur = a->d;
    cudaStream_t s;
    DT_TRY(dt_nccl_prepare(n, &s));
    ncclResult_t r = launch(n, a, ty, ro, s);
    if (r != ncclSuccess && r != ncclInProgress)
        return dt_nccl_error(n, DT_EPEER, r, dt_coll_op_name((dt_coll_op)a->d.op));
    DT_TRY(dt_nccl_wait_enqueued(n, a->deadline, "enqueue"));
    size_t blk = a->d.count * dt_dtype_size((dt_dtype)a->d.dtype);
    cudaError_t e = cudaSuccess;
    if (a->d.op == DT_COLL_REDUCE_SCATTER && a->send == a->recv && t->rank > 0) /* comm.h: the result at the start */
        e = cudaMemcpyAsync(a->recv, (char *)a->recv + (size_t)t->rank * blk, blk, cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess) e = cudaEventRecord(n->ev, s);
    if (e != cudaSuccess) return dt_error(DT_EPEER, "nccl: after the collective: %s", cudaGetErrorString(e));
    return wait_event(n, n->ev, a->deadline, "waiting for the collective");
}

/* ---- point-to-point ---- */

static int dreq_index(const dt_nccl *n, const dt_treq *req) {
    for (int i = 0; i < n->ndreq; i++)
        if (n->dreq[i] == req) return i;
    return -1;
}

static dt_status post(dt_transport *t, int peer, int tag, const void *buf, size_t bytes, dt_treq *req, bool send) {
    dt_nccl *n = (dt_nccl *)t;
    if (!dt_nccl_on_device(buf))
        return send ? n->host->ops->isend(n->host, peer, tag, buf, bytes, req)
                    : n->host->ops->irecv(n->host, peer, tag, (void *)buf, bytes, req);
    if (n->ndreq == DT_NCCL_MAX_DREQ)
        return dt_error(DT_EINVAL, "nccl: more than %d device sends/receives outstanding", DT_NCCL_MAX_DREQ);
    dt_treq_reset(req, peer, tag, bytes);
    req->priv.p[1] = (void *)buf;
    req->priv.u[2] = send;
    n->dreq[n->ndreq++] = req;
    return DT_OK;
}
static dt_status nccl_isend(dt_transport *t, int peer, int tag, const void *buf, size_t bytes, dt_treq *req) {
    return post(t, peer, tag, buf, bytes, req, true);
}
static dt_status nccl_irecv(dt_transport *t, int peer, int tag, void *buf, size_t bytes, dt_treq *req) {
    return post(t, peer, tag, buf, bytes, req, false);
}

/* Launches every posted device send/recv in one group, with one event each (NCCL matches them in
 * post order per peer; tags are not NCCL's: device messages between two ranks must be received
 * in the order they were sent). */
static dt_status flush(dt_nccl *n) {
    int todo = 0;
    for (int i = 0; i < n->ndreq; i++) todo += !n->dreq[i]->priv.p[0];
    if (!todo) return DT_OK;
    cudaStream_t s;
    DT_TRY(dt_nccl_prepare(n, &s));
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n->ndreq && r == ncclSuccess; i++) {
        dt_treq *q = n->dreq[i];
        if (q->priv.p[0]) continue;
        r = q->priv.u[2] ? ncclSend(q->priv.p[1], q->bytes, ncclUint8, q->peer, n->comm, s)
                         : ncclRecv(q->priv.p[1], q->bytes, ncclUint8, q->peer, n->comm, s);
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess) r = e;
    if (r != ncclSuccess && r != ncclInProgress) return dt_nccl_error(n, DT_EPEER, r, "send/recv");
    DT_TRY(dt_nccl_wait_enqueued(n, dt_now() + n->timeout_s, "enqueue of send/recv"));
    for (int i = 0; i < n->ndreq; i++) {
        dt_treq *q = n->dreq[i];
        cudaEvent_t ev;
        if (q->priv.p[0]) continue;
        if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventRecord(ev, s) != cudaSuccess)
            return dt_error(DT_EPEER, "nccl: recording a send/recv event: %s", cudaGetErrorString(cudaGetLastError()));
        q->priv.p[0] = ev;
    }
    return DT_OK;
}

/* Whether device request i is done (then it leaves the list). */
static dt_status dreq_test(dt_nccl *n, int i, bool *done) {
    dt_treq *q = n->dreq[i];
    cudaError_t e = cudaEventQuery((cudaEvent_t)q->priv.p[0]);
    *done = e == cudaSuccess;
    if (e != cudaSuccess && e != cudaErrorNotReady)
        return dt_error(DT_EPEER, "nccl: send/recv: %s", cudaGetErrorString(e));
    if (!*done) return DT_OK;
    cudaEventDestroy((cudaEvent_t)q->priv.p[0]);
    q->priv.p[0] = NULL;
    q->done = true;
    n->dreq[i] = n->dreq[--n->ndreq];
    return DT_OK;
}

static dt_status nccl_test(dt_transport *t, dt_treq *req, bool *done) {
    dt_nccl *n = (dt_nccl *)t;
    int i = dreq_index(n, req);
    if (i < 0) return req->done ? (*done = true, DT_OK) : n->host->ops->test(n->host, req, done);
    DT_TRY(flush(n));
    return dreq_test(n, i, done);
}

/* waitall with no requests (the communicator's background progress): launches what is posted,
 * returns once a device request completed, else after the bootstrap's own progress wait */
static dt_status progress(dt_nccl *n, double deadline) {
    if (!n->ndreq) return n->host->ops->waitall(n->host, NULL, 0, deadline);
    DT_TRY(flush(n));
    double t0 = dt_now();
    for (;;) {
        bool any = false, done = false;
        for (int i = n->ndreq - 1; i >= 0; i--) { /* backwards: a done request leaves by a swap */
            DT_TRY(dreq_test(n, i, &done));
            any |= done;
        }
        if (any || !n->ndreq || dt_now() >= deadline) return DT_OK;
        DT_TRY(poll_once(n, dt_now() - t0 > 2e-4 ? 1e-3 : 0, "send/recv"));
    }
}

static dt_status nccl_waitall(dt_transport *t, dt_treq *const *reqs, int nreq, double deadline) {
    dt_nccl *n = (dt_nccl *)t;
    if (nreq == 0) return progress(n, deadline);
    DT_TRY(flush(n));
    double t0 = dt_now();
    for (;;) {
        int pending_dev = 0;
        for (int k = 0; k < nreq; k++) {
            int i = reqs[k] ? dreq_index(n, reqs[k]) : -1;
            bool done = false;
            if (i >= 0) DT_TRY(dreq_test(n, i, &done));
            pending_dev += i >= 0 && !done;
        }
        if (!pending_dev) break;
        if (dt_now() > deadline) return timed_out(n, "waiting for send/recv");
        DT_TRY(poll_once(n, dt_now() - t0 > 2e-4 ? 1e-3 : 0, "send/recv"));
    }
    dt_treq *host[64];
    int h = 0;
    for (int k = 0; k < nreq; k++) { /* the host ones (device ones are done by now) */
        if (!reqs[k] || reqs[k]->done) continue;
        if (h == 64) return dt_error(DT_EINVAL, "nccl: waitall on more than 64 host requests at once");
        host[h++] = reqs[k];
    }
    return h ? n->host->ops->waitall(n->host, host, h, deadline) : DT_OK;
}

/* ---- the rest: the bootstrap's, or small ---- */

static dt_status nccl_begin(dt_transport *t, const dt_coll_desc *d) {
    dt_nccl *n = (dt_nccl *)t;
    n->cur = *d;
    return n->host->ops->begin ? n->host->ops->begin(n->host, d) : DT_OK;
}
static void nccl_abort(dt_transport *t, dt_status s, const char *msg) {
    dt_nccl *n = (dt_nccl *)t;
    n->broken = true;
    if (n->host->ops->abort) n->host->ops->abort(n->host, s, msg);
}
static void nccl_wake(dt_transport *t) {
    dt_nccl *n = (dt_nccl *)t;
    if (n->host->ops->wake) n->host->ops->wake(n->host);
}
static int nccl_host_cpus(dt_transport *t, int *ranks) {
    dt_nccl *n = (dt_nccl *)t;
    if (!n->host->ops->host_cpus) return *ranks = 0, 0;
    return n->host->ops->host_cpus(n->host, ranks);
}
static bool nccl_device_native(dt_transport *t, const char *device) {
    (void)t;
    return device && !strncmp(device, "cuda", 4);
}
static void nccl_set_stream(dt_transport *t, void *stream) { ((dt_nccl *)t)->given = (cudaStream_t)stream; }

const dt_transport_ops dt_nccl_ops = {
    .name = "nccl",
    .isend = nccl_isend,
    .irecv = nccl_irecv,
    .test = nccl_test,
    .waitall = nccl_waitall,
    .wake = nccl_wake,
    .begin = nccl_begin,
    .coll = nccl_coll,
    .abort = nccl_abort,
    .split = dt_nccl_split,
    .host_cpus = nccl_host_cpus,
    .device_native = nccl_device_native,
    .set_stream = nccl_set_stream,
    .destroy = dt_nccl_destroy,
};

#else
typedef int dt_transport_nccl_coll_unused; /* ISO C: a translation unit is never empty */
#endif
