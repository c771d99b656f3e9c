/* Native collectives of the MPI transport: the communicator's collectives mapped onto MPI's
 * non-blocking ones (MPI_Iallreduce, MPI_Ibcast, ...), completed by polling MPI_Test against the
 * op's deadline so a missing rank is a DT_ETIMEDOUT, not a hang (a dead one on this host, DT_EPEER
 * within DT_MPI_LIVE_PERIOD). Used when the algorithm is
 * NATIVE, or AUTO where MPI's own is faster (see use_native). bf16/f16 reductions and shapes
 * MPI cannot express (in-place alltoall, counts over INT_MAX) return DT_ENOTSUP so the
 * communicator runs its own algorithm. Also the benchmark baseline dt_comm_bench_mpi_allreduce. */
#include "comm/transport.h"

#ifdef DT_HAVE_MPI
#include "comm/transport_mpi.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static bool mpi_type(dt_dtype d, bool reduce, MPI_Datatype *out) {
    switch (d) {
    case DT_F32: *out = MPI_FLOAT; return true;
    case DT_F64: *out = MPI_DOUBLE; return true;
    case DT_I32: *out = MPI_INT32_T; return true;
    case DT_I64: *out = MPI_INT64_T; return true;
    case DT_U8: *out = MPI_UINT8_T; return !reduce; /* the comm layer reduces f32/f64/i32/i64/halves */
    case DT_I8: *out = MPI_INT8_T; return !reduce;
    case DT_I16: *out = MPI_INT16_T; return !reduce;
    case DT_BF16:
    case DT_F16: *out = MPI_UINT16_T; return !reduce; /* MPI cannot add them */
    default: return false;
    }
}

static MPI_Op mpi_op(dt_redop op) {
    switch (op) {
    case DT_OP_MAX: return MPI_MAX;
    case DT_OP_MIN: return MPI_MIN;
    case DT_OP_PROD: return MPI_PROD;
    default: return MPI_SUM; /* SUM, AVG (divided afterwards) */
    }
}

/* Divides n elements by the communicator size in place (AVG = SUM / size): floats in their
 * precision, integers truncate (as dt_reduce_scale does for the communicator's algorithms). */
static void divide(void *buf, size_t n, dt_dtype d, int size) {
    switch (d) {
    case DT_F32:
        for (size_t i = 0; i < n; i++) ((float *)buf)[i] /= (float)size;
        break;
    case DT_F64:
        for (size_t i = 0; i < n; i++) ((double *)buf)[i] /= (double)size;
        break;
    case DT_I32:
        for (size_t i = 0; i < n; i++) ((int32_t *)buf)[i] /= size;
        break;
    case DT_I64:
        for (size_t i = 0; i < n; i++) ((int64_t *)buf)[i] /= size;
        break;
    default: break;
    }
}

static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    const char *x = a, *y = b;
    return a && b && na && nb && x < y + nb && y < x + na;
}

/* Which ops go to MPI under AUTO. MPI's tuned collectives win for every op we measured except
 * none; DTRAIN_MPI_NATIVE=0 turns native off under AUTO (NATIVE still forces it). */
static bool use_native(const dt_coll_args *a) {
    if (a->algo == DT_ALGO_NATIVE) return true;
    if (a->algo != DT_ALGO_AUTO) return false;
    const char *e = getenv("DTRAIN_MPI_NATIVE");
    return !(e && !strcmp(e, "0"));
}

static const char *mpi_name(int op) {
    static const char *n[DT_COLL_OP_COUNT] = {"?",
                                              "MPI_Iallreduce",
                                              "MPI_Ibcast",
                                              "MPI_Ireduce",
                                              "MPI_Iallgather",
                                              "MPI_Iallgatherv",
                                              "MPI_Ireduce_scatter_block",
                                              "MPI_Igather",
                                              "MPI_Iscatter",
                                              "MPI_Ialltoall",
                                              "MPI_Ibarrier",
                                              "?",
                                              "?",
                                              "?"};
    return op > 0 && op < DT_COLL_OP_COUNT ? n[op] : "?";
}

static dt_status wait_req(dt_mpi_transport *t, MPI_Request *req, const dt_coll_args *a) {
    double t0 = dt_now(), next_live = t0 + DT_MPI_LIVE_PERIOD;
    /* every rank's part of the data moves through this rank at most a few times */
    dt_mpi_idle idle = dt_mpi_idle_for(
        2.0 * (double)a->d.count * (double)dt_dtype_size((dt_dtype)a->d.dtype) *
        (a->d.op == DT_COLL_ALLTOALL || a->d.op == DT_COLL_ALLGATHER ? t->base.size : 1));
    char o[96], e[256];
    for (;;) {
        int flag = 0;
        pthread_mutex_lock(&dt_mpi_lock);
        int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&dt_mpi_lock);
        if (rc != MPI_SUCCESS) { /* often a mismatched op: give the checks a moment to say so */
            if (dt_mpi_check_stalled(t, DT_MPI_PROBE_S) != DT_OK) return dt_error(t->err, "%s", t->errmsg);
            for (double end = dt_now() + 0.5; dt_now() < end && dt_mpi_progress_internal(t) == DT_OK;)
                dt_mpi_backoff(&idle);
            if (t->broken) return dt_error(t->err, "%s", t->errmsg);
            return dt_mpi_fail(t, DT_EPEER, "%s failed during %s on rank %d: %s", mpi_name(a->d.op),
                               dt_coll_desc_str(&a->d, o, sizeof o), t->base.rank, dt_mpi_errstr(rc, e, sizeof e));
        }
        if (flag) return DT_OK;
        DT_TRY(dt_mpi_progress_internal(t)); /* abort notices, mismatched ops */
        double now = dt_now();
        DT_TRY(dt_mpi_check_stalled(t, now - t0)); /* a rank may be in another op: say which */
        if (now >= next_live) {
            next_live = now + DT_MPI_LIVE_PERIOD;
            int pid, dead = dt_mpi_any_gone(t, &pid);
            if (dead >= 0) { /* its part may be in already: one more test, then that is the error */
                pthread_mutex_lock(&dt_mpi_lock);
                rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
                pthread_mutex_unlock(&dt_mpi_lock);
                if (rc == MPI_SUCCESS && flag) return DT_OK;
                return dt_mpi_fail(t, DT_EPEER,
                                   "rank %d died during %s (%s) on rank %d: its process (world rank %d, "
                                   "pid %d) is gone",
                                   dead, dt_coll_desc_str(&a->d, o, sizeof o), mpi_name(a->d.op), t->base.rank,
                                   dt_mpi_world_of(t, dead), pid);
            }
        }
        if (now >= a->deadline)
            return dt_mpi_fail(t, DT_ETIMEDOUT,
                               "timed out after %.1f s in %s (%s) on rank %d: a rank did "
                               "not join or is stalled (raise %s if it is only slow)",
                               now - t0, dt_coll_desc_str(&a->d, o, sizeof o), mpi_name(a->d.op), t->base.rank,
                               t->base.timeout_knob);
        dt_mpi_backoff(&idle);
    }
}

/* One MPI call's arguments after comm.h's buffer forms are mapped onto MPI's. */
typedef struct {
    const void *send, *sb;  /* the input, and what MPI gets for it (MPI_IN_PLACE for comm.h's in place) */
    void *recv;             /* MPI_IN_PLACE for scatter's in place */
    int cnt;                /* elements of this rank's part */
    int *icounts, *idispls; /* allgatherv (malloc'ed) */
} mpi_call;

/* allgatherv: int counts and displacements (DT_ENOTSUP past INT_MAX), this rank's part, in place */
static dt_status vcounts(const dt_coll_args *a, int size, int rank, size_t es, mpi_call *m) {
    m->icounts = malloc((size_t)size * sizeof *m->icounts);
    m->idispls = malloc((size_t)size * sizeof *m->idispls);
    if (!m->icounts || !m->idispls) return DT_ENOTSUP;
    size_t end = 0;
    for (int i = 0; i < size; i++) {
        if (a->counts[i] > (size_t)INT_MAX || a->displs[i] > (size_t)INT_MAX) return DT_ENOTSUP;
        m->icounts[i] = (int)a->counts[i];
        m->idispls[i] = (int)a->displs[i];
        if (a->displs[i] + a->counts[i] > end) end = a->displs[i] + a->counts[i];
    }
    m->cnt = m->icounts[rank];
    size_t nb = (size_t)m->cnt * es;
    char *rblk = (char *)m->recv + a->displs[rank] * es;
    if (m->send == rblk || m->send == m->recv) m->sb = MPI_IN_PLACE;
    else if (overlap(m->send, nb, m->recv, end * es)) return DT_ENOTSUP;
    return DT_OK;
}

/* In-place forms of comm.h map to MPI_IN_PLACE; any other overlap is DT_ENOTSUP (our algorithms). */
static dt_status map_buffers(const dt_coll_args *a, int size, int rank, mpi_call *m) {
    int op = a->d.op, root = a->d.root;
    size_t es = dt_dtype_size((dt_dtype)a->d.dtype), nb = (size_t)a->d.count * es, all = nb * (size_t)size;
    const void *send = m->send = m->sb = a->send;
    void *recv = m->recv = a->recv;
    char *rblk = recv ? (char *)recv + (size_t)rank * nb : NULL;
    m->cnt = (int)a->d.count;
    bool here = rank == root;
    switch (op) {
    case DT_COLL_ALLREDUCE:
        if (send == recv) m->sb = MPI_IN_PLACE;
        return m->sb != MPI_IN_PLACE && overlap(send, nb, recv, nb) ? DT_ENOTSUP : DT_OK;
    case DT_COLL_REDUCE:
        if (here && send == recv) m->sb = MPI_IN_PLACE;
        return m->sb != MPI_IN_PLACE && here && overlap(send, nb, recv, nb) ? DT_ENOTSUP : DT_OK;
    case DT_COLL_REDUCE_SCATTER:
        if (send == recv) m->sb = MPI_IN_PLACE;
        return m->sb != MPI_IN_PLACE && overlap(send, all, recv, nb) ? DT_ENOTSUP : DT_OK;
    case DT_COLL_ALLGATHER: /* in place: send == own block, or send == recv (same meaning) */
        if (send == rblk || send == recv) m->sb = MPI_IN_PLACE;
        return m->sb != MPI_IN_PLACE && overlap(send, nb, recv, all) ? DT_ENOTSUP : DT_OK;
    case DT_COLL_ALLGATHERV: return vcounts(a, size, rank, es, m);
    case DT_COLL_GATHER:
        if (here && send == rblk) m->sb = MPI_IN_PLACE;
        return m->sb != MPI_IN_PLACE && here && overlap(send, nb, recv, all) ? DT_ENOTSUP : DT_OK;
    case DT_COLL_SCATTER:
        if (here && recv == (const char *)send + (size_t)root * nb) m->recv = MPI_IN_PLACE;
        return m->recv != MPI_IN_PLACE && here && overlap(send, all, recv, nb) ? DT_ENOTSUP : DT_OK;
    case DT_COLL_ALLTOALL: return overlap(send, all, recv, all) ? DT_ENOTSUP : DT_OK;
    case DT_COLL_BROADCAST:
    case DT_COLL_BARRIER: return DT_OK;
    default: return DT_ENOTSUP;
    }
}

/* Starts the non-blocking MPI collective of m; MPI's return code. */
static int start_call(dt_mpi_transport *t, const dt_coll_args *a, const mpi_call *m, MPI_Datatype ty, MPI_Op mop,
                      MPI_Request *req) {
    int root = a->d.root, cnt = m->cnt, rc = MPI_SUCCESS;
    const void *sb = m->sb;
    void *recv = m->recv;
    pthread_mutex_lock(&dt_mpi_lock);
    switch (a->d.op) {
    case DT_COLL_ALLREDUCE: rc = MPI_Iallreduce(sb, recv, cnt, ty, mop, t->comm, req); break;
    case DT_COLL_BROADCAST: rc = MPI_Ibcast(recv ? recv : (void *)m->send, cnt, ty, root, t->comm, req); break;
    case DT_COLL_REDUCE: rc = MPI_Ireduce(sb, recv, cnt, ty, mop, root, t->comm, req); break;
    case DT_COLL_REDUCE_SCATTER: rc = MPI_Ireduce_scatter_block(sb, recv, cnt, ty, mop, t->comm, req); break;
    case DT_COLL_ALLGATHER: rc = MPI_Iallgather(sb, cnt, ty, recv, cnt, ty, t->comm, req); break;
    case DT_COLL_ALLGATHERV: rc = MPI_Iallgatherv(sb, cnt, ty, recv, m->icounts, m->idispls, ty, t->comm, req); break;
    case DT_COLL_GATHER: rc = MPI_Igather(sb, cnt, ty, recv, cnt, ty, root, t->comm, req); break;
    case DT_COLL_SCATTER: rc = MPI_Iscatter(m->send, cnt, ty, recv, cnt, ty, root, t->comm, req); break;
    case DT_COLL_ALLTOALL: rc = MPI_Ialltoall(m->send, cnt, ty, recv, cnt, ty, t->comm, req); break;
    case DT_COLL_BARRIER: rc = MPI_Ibarrier(t->comm, req); break;
    }
    pthread_mutex_unlock(&dt_mpi_lock);
    return rc;
}

/* A rank can finish its part early (a broadcast root): before reporting success, see the left
 * neighbour's descriptor of this op, so a mismatch is an error and not garbage. */
static dt_status confirm_left(dt_mpi_transport *t, const dt_coll_args *a, dt_status s) {
    int rank = t->base.rank, size = t->base.size;
    double next_live = dt_now() + DT_MPI_LIVE_PERIOD;
    for (dt_mpi_idle idle = {0}; s == DT_OK && dt_mpi_check_waiting(t);) {
        s = dt_mpi_progress_internal(t);
        int left = (rank + size - 1) % size, pid;
        char o[96];
        if (s == DT_OK && dt_now() >= next_live) {
            if ((pid = dt_mpi_peer_gone(t, left)) != 0 && (s = dt_mpi_progress_internal(t)) == DT_OK &&
                dt_mpi_check_waiting(t))
                s = dt_mpi_fail(t, DT_EPEER,
                                "rank %d died before it started %s (rank %d waited): its process (world "
                                "rank %d, pid %d) is gone",
                                left, dt_coll_desc_str(&a->d, o, sizeof o), rank, dt_mpi_world_of(t, left), pid);
            next_live = dt_now() + DT_MPI_LIVE_PERIOD;
        }
        if (s == DT_OK && dt_now() >= a->deadline)
            s = dt_mpi_fail(t, DT_ETIMEDOUT, "timed out in %s on rank %d waiting for rank %d to start it",
                            dt_coll_desc_str(&a->d, o, sizeof o), rank, left);
        if (s == DT_OK && dt_mpi_check_waiting(t)) dt_mpi_backoff(&idle);
    }
    return s;
}

dt_status dt_mpi_coll(dt_transport *tt, const dt_coll_args *a) {
    dt_mpi_transport *t = (dt_mpi_transport *)tt;
    if (!use_native(a)) return DT_ENOTSUP;
    if (t->broken) return dt_error(t->err, "%s", t->errmsg);
    int op = a->d.op, size = tt->size, rank = tt->rank, root = a->d.root;
    dt_dtype dt = (dt_dtype)a->d.dtype;
    bool reduce = op == DT_COLL_ALLREDUCE || op == DT_COLL_REDUCE || op == DT_COLL_REDUCE_SCATTER;
    MPI_Datatype ty = MPI_BYTE;
    if (op != DT_COLL_BARRIER && !mpi_type(dt, reduce, &ty)) return DT_ENOTSUP;
    size_t n = (size_t)a->d.count;
    if (n > (size_t)INT_MAX || (op != DT_COLL_ALLREDUCE && op != DT_COLL_BROADCAST && op != DT_COLL_REDUCE &&
                                (size_t)size * n > (size_t)INT_MAX))
        return DT_ENOTSUP;
    MPI_Op mop = mpi_op((dt_redop)a->d.redop);
    if (dt_mpi_inband_ok(t, a)) {
        dt_status s = dt_mpi_inband_coll(t, a, ty, mop, wait_req);
        if (s == DT_OK && a->d.redop == DT_OP_AVG && op == DT_COLL_ALLREDUCE) divide(a->recv, n, dt, size);
        return s;
    }
    DT_TRY(dt_mpi_check_decide(t, false)); /* the descriptor goes to the right rank now */
    mpi_call m = {0};
    dt_status s = map_buffers(a, size, rank, &m);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = s == DT_OK ? start_call(t, a, &m, ty, mop, &req) : MPI_SUCCESS;
    if (s == DT_OK && rc != MPI_SUCCESS) {
        char o[96], e[256];
        s = dt_mpi_fail(t, DT_EPEER, "%s could not start %s on rank %d: %s", mpi_name(op),
                        dt_coll_desc_str(&a->d, o, sizeof o), rank, dt_mpi_errstr(rc, e, sizeof e));
    } else if (s == DT_OK) {
        s = confirm_left(t, a, wait_req(t, &req, a));
    }
    free(m.icounts);
    free(m.idispls);
    if (s == DT_OK && a->d.redop == DT_OP_AVG && reduce) {
        if (op == DT_COLL_ALLREDUCE || op == DT_COLL_REDUCE_SCATTER) divide(m.recv, n, dt, size);
        else if (rank == root) divide(m.recv, n, dt, size);
    }
    return s;
}

/* MPI_Allreduce (reduce = false) or MPI_Reduce to rank 0, blocking, on MPI_COMM_WORLD. */
static int plain(bool reduce, const float *a, float *b, int count) {
    return reduce ? MPI_Reduce(a, b, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD)
                  : MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static dt_status bench_plain(bool reduce, size_t count, int warmup, int iters, double *usec) {
    const char *name = reduce ? "MPI_Reduce" : "MPI_Allreduce";
    *usec = 0;
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (!inited || fin)
        return dt_error(DT_EINVAL, "the plain %s baseline needs an MPI communicator (run under mpirun)", name);
    if (count > (size_t)INT_MAX || iters < 1 || warmup < 0)
        return dt_error(DT_EINVAL, "bench: count %zu must be <= INT_MAX and iters >= 1", count);
    float *a = dt_alloc((count ? count : 1) * sizeof(float)), *b = dt_alloc((count ? count : 1) * sizeof(float));
    if (!a || !b) {
        dt_free(a);
        dt_free(b);
        return dt_error(DT_ENOMEM, "bench: cannot allocate 2 x %zu floats", count);
    }
    for (size_t i = 0; i < count; i++) a[i] = (float)(i % 7);
    pthread_mutex_lock(&dt_mpi_lock);
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < warmup && rc == MPI_SUCCESS; i++) rc = plain(reduce, a, b, (int)count);
    if (rc == MPI_SUCCESS) rc = MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters && rc == MPI_SUCCESS; i++) rc = plain(reduce, a, b, (int)count);
    double local = (MPI_Wtime() - t0) / iters * 1e6;
    if (rc == MPI_SUCCESS) rc = MPI_Allreduce(&local, usec, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    pthread_mutex_unlock(&dt_mpi_lock);
    dt_free(a);
    dt_free(b);
    if (rc != MPI_SUCCESS) {
        char e[256];
        return dt_error(DT_EPEER, "bench: %s failed: %s", name, dt_mpi_errstr(rc, e, sizeof e));
    }
    return DT_OK;
}

dt_status dt_comm_bench_mpi_allreduce(size_t count, int warmup, int iters, double *usec) {
    return bench_plain(false, count, warmup, iters, usec);
}

dt_status dt_comm_bench_mpi_reduce(size_t count, int warmup, int iters, double *usec) {
    return bench_plain(true, count, warmup, iters, usec);
}

#else
typedef int dt_transport_mpi_coll_unused; /* built without MPI: see transport_mpi.c */
#endif
