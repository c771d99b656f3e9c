/* The MPI transport (OpenMPI/MPICH under mpirun/srun): tagged point-to-point over
 * MPI_Isend/MPI_Irecv on a private communicator, completed by polling MPI_Test with a short
 * backoff so every wait has a deadline (never an unbounded MPI_Wait); errors come back as
 * statuses (MPI_ERRORS_RETURN) naming the peer and the op. Also: the op check (mismatched
 * collectives become DT_EMISMATCH instead of a hang: transport_mpi_check.c), abort notices
 * to every rank, split via MPI_Comm_create_group after a bounded rendezvous, MPI_Finalize when
 * the last transport goes. A wait also notices within DT_MPI_LIVE_PERIOD that a peer on this host
 * died (transport_mpi_live.c): MPI itself never says so. Native collectives are in
 * transport_mpi_coll.c.
 * Without DT_HAVE_MPI the constructor returns DT_ENOTSUP. */
#include "comm/transport.h"

#include <stdio.h>

#ifndef DT_HAVE_MPI
dt_status dt_transport_mpi_create(dt_transport **out, const dt_transport_params *p) {
    (void)p;
    if (out) *out = NULL;
    return dt_error(DT_ENOTSUP, "built without MPI: install libopenmpi-dev and rebuild");
}
dt_status dt_comm_bench_mpi_allreduce(size_t count, int warmup, int iters, double *usec) {
    (void)count;
    (void)warmup;
    (void)iters;
    if (usec) *usec = 0;
    return dt_error(DT_ENOTSUP, "built without MPI: install libopenmpi-dev and rebuild");
}
dt_status dt_comm_bench_mpi_reduce(size_t count, int warmup, int iters, double *usec) {
    return dt_comm_bench_mpi_allreduce(count, warmup, iters, usec);
}
#else
#include "comm/transport_mpi.h"

#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

pthread_mutex_t dt_mpi_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_live;           /* live MPI transports */
static bool g_we_init;       /* we called MPI_Init_thread, so we finalise */
static atomic_bool g_failed; /* some transport failed: peers may be stuck, skip MPI_Finalize */
static MPI_Datatype g_block; /* 1 MiB of bytes, for messages over INT_MAX bytes */
static bool g_block_ok;
#define BLOCK_BYTES ((size_t)1 << 20)

#define LOCK() pthread_mutex_lock(&dt_mpi_lock)
#define UNLOCK() pthread_mutex_unlock(&dt_mpi_lock)

static const dt_transport_ops g_ops;

const char *dt_mpi_errstr(int code, char *buf, size_t n) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS) len = 0;
    s[len] = 0;
    snprintf(buf, n, "%s", len ? s : "unknown MPI error");
    return buf;
}

/* Marks t broken with status s and message msg (first error wins); returns the error. */
static dt_status set_broken(dt_mpi_transport *t, dt_status s, const char *msg) {
    if (!t->broken) {
        snprintf(t->errmsg, sizeof t->errmsg, "%s", msg);
        t->broken = true;
        t->err = s;
        g_failed = true;
    }
    return dt_error(t->err, "%s", t->errmsg);
}

/* Sends a notice (status, kind 'A' abort / 'F' failure, message) to every other rank so their
 * waits fail now instead of at their deadlines; best effort, never waits. */
static void notify_all(dt_mpi_transport *t, char kind, dt_status s, const char *msg) {
    int si = (int)s;
    memcpy(t->abort_out, &si, sizeof si);
    t->abort_out[sizeof si] = kind;
    snprintf(t->abort_out + sizeof si + 1, sizeof t->abort_out - sizeof si - 1, "%s", msg);
    LOCK();
    for (int p = 0; p < t->base.size; p++) {
        if (p == t->base.rank) continue;
        MPI_Request r;
        if (MPI_Isend(t->abort_out, (int)sizeof t->abort_out, MPI_BYTE, p, DT_MPI_TAG_ABORT, t->comm, &r) ==
            MPI_SUCCESS)
            MPI_Request_free(&r); /* small and eager: delivered by later progress */
    }
    UNLOCK();
}

dt_status dt_mpi_fail(dt_mpi_transport *t, dt_status s, const char *fmt, ...) {
    if (!t->broken) {
        char msg[sizeof t->errmsg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        set_broken(t, s, msg);
        if (t->base.size > 1) notify_all(t, 'F', s, t->errmsg);
    }
    return dt_error(t->err, "%s", t->errmsg);
}

static double g_spin_s = 200e-6; /* spin window; DTRAIN_MPI_SPIN_US overrides (read at create) */

void dt_mpi_backoff(dt_mpi_idle *w) {
    double now = dt_now();
    if (w->since == 0) w->since = now;
    long ns = dt_mpi_nap_ns(w, now - w->since, g_spin_s);
    if (ns == 0) {
        sched_yield();
        return;
    }
    w->naps++;
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

static const char *op_str(dt_mpi_transport *t, char *buf, size_t n) {
    if (t->cur.op) return dt_coll_desc_str(&t->cur, buf, n);
    snprintf(buf, n, "setup");
    return buf;
}

/* ---- internal channels: abort notices and the op check ------------------------------------ */

dt_status dt_mpi_progress_internal(dt_mpi_transport *t) {
    if (t->broken) return dt_error(t->err, "%s", t->errmsg);
    int flag = 0;
    MPI_Status st;
    LOCK();
    if (t->abort_req != MPI_REQUEST_NULL) MPI_Test(&t->abort_req, &flag, &st);
    UNLOCK();
    if (flag) {
        int s;
        char msg[sizeof t->errmsg];
        memcpy(&s, t->abort_buf, sizeof s);
        t->abort_buf[sizeof t->abort_buf - 1] = 0;
        snprintf(msg, sizeof msg, "rank %d %s: %s", st.MPI_SOURCE, t->abort_buf[sizeof s] == 'A' ? "aborted" : "failed",
                 t->abort_buf + sizeof s + 1);
        return set_broken(t, s < 0 ? (dt_status)s : DT_EPEER, msg);
    }
    return dt_mpi_check_progress(t);
}

/* ---- point-to-point ------------------------------------------------------------------------ */

/* priv layout: u[0], u[1] = MPI requests (memcpy'd), u[2] = number of parts, u[3] = 1 for recv */
static void req_get(const dt_treq *r, MPI_Request *m) { memcpy(m, r->priv.u, 2 * sizeof *m); }
static void req_set(dt_treq *r, const MPI_Request *m) { memcpy(r->priv.u, m, 2 * sizeof *m); }

dt_status dt_mpi_post(dt_mpi_transport *t, bool recv, int peer, int tag, int mtag, void *buf, size_t bytes,
                      dt_treq *req) {
    if (t->broken) return dt_error(t->err, "%s", t->errmsg);
    DT_TRY(dt_mpi_check_flush(t)); /* the op's descriptor before its first message */
    if (peer < 0 || peer >= t->base.size)
        return dt_error(DT_EINVAL, "peer rank %d out of range 0..%d", peer, t->base.size - 1);
    _Static_assert(2 * sizeof(MPI_Request) <= 2 * sizeof(uint64_t), "MPI_Request fits priv");
    dt_treq_reset(req, peer, tag, bytes);
    MPI_Request m[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int counts[2], nparts = 1;
    MPI_Datatype types[2] = {MPI_BYTE, MPI_BYTE};
    size_t off1 = 0;
    if (bytes <= (size_t)INT_MAX) {
        counts[0] = (int)bytes;
    } else { /* whole MiB blocks, then the rest: both sides split the same size the same way */
        types[0] = g_block;
        counts[0] = (int)(bytes / BLOCK_BYTES);
        off1 = (size_t)counts[0] * BLOCK_BYTES;
        counts[1] = (int)(bytes - off1);
        nparts = counts[1] ? 2 : 1;
    }
    int rc = MPI_SUCCESS;
    LOCK();
    for (int i = 0; i < nparts && rc == MPI_SUCCESS; i++) {
        char *p = (char *)buf + (i ? off1 : 0);
        rc = recv ? MPI_Irecv(p, counts[i], types[i], peer, mtag, t->comm, &m[i])
                  : MPI_Isend(p, counts[i], types[i], peer, mtag, t->comm, &m[i]);
    }
    UNLOCK();
    if (rc != MPI_SUCCESS) {
        char e[256], o[96];
        return dt_mpi_fail(t, DT_EPEER, "MPI could not post a %s of %zu bytes %s rank %d during %s: %s",
                           recv ? "receive" : "send", bytes, recv ? "from" : "to", peer, op_str(t, o, sizeof o),
                           dt_mpi_errstr(rc, e, sizeof e));
    }
    req_set(req, m);
    req->priv.u[2] = (uint64_t)nparts;
    req->priv.u[3] = recv;
    req->next = t->pending;
    t->pending = req;
    return DT_OK;
}

static int to_mtag(int tag) { return tag == DT_TAG_COLL ? DT_MPI_TAG_COLL : DT_MPI_TAG_USER(tag); }

static dt_status check_tag(int tag) {
    if (tag == DT_TAG_COLL || (tag >= 0 && tag <= DT_COMM_TAG_MAX)) return DT_OK;
    return dt_error(DT_EINVAL, "tag %d out of range 0..%d", tag, DT_COMM_TAG_MAX);
}

static dt_status mpi_isend(dt_transport *tt, int peer, int tag, const void *buf, size_t bytes, dt_treq *req) {
    DT_TRY(check_tag(tag));
    return dt_mpi_post((dt_mpi_transport *)tt, false, peer, tag, to_mtag(tag), (void *)buf, bytes, req);
}

static dt_status mpi_irecv(dt_transport *tt, int peer, int tag, void *buf, size_t bytes, dt_treq *req) {
    DT_TRY(check_tag(tag));
    return dt_mpi_post((dt_mpi_transport *)tt, true, peer, tag, to_mtag(tag), buf, bytes, req);
}

static const char *tag_str(int tag, char *buf, size_t n) {
    if (tag == DT_TAG_COLL) snprintf(buf, n, "collective traffic");
    else if (tag > DT_COMM_TAG_MAX) snprintf(buf, n, "internal");
    else snprintf(buf, n, "tag %d", tag);
    return buf;
}

/* Completes r from its MPI statuses: errors, and receives of the wrong size. */
static void finish(dt_mpi_transport *t, dt_treq *r, int rc, MPI_Status *st, int nparts) {
    r->done = true;
    bool recv = r->priv.u[3] != 0;
    char e[256], o[96], tg[32];
    op_str(t, o, sizeof o);
    tag_str(r->tag, tg, sizeof tg);
    for (int i = 0; i < nparts; i++) {
        int code = rc == MPI_ERR_IN_STATUS ? st[i].MPI_ERROR : rc;
        if (code != MPI_SUCCESS) {
            int cls = 0;
            MPI_Error_class(code, &cls);
            dt_mpi_errstr(code, e, sizeof e);
            if (cls == MPI_ERR_TRUNCATE)
                r->status = dt_mpi_fail(t, DT_EMISMATCH,
                                        "rank %d sent more than the %zu bytes rank %d expected (%s) during %s", r->peer,
                                        r->bytes, t->base.rank, tg, o);
            else
                r->status = dt_mpi_fail(t, DT_EPEER, "lost rank %d during %s (%s of %zu bytes, %s): MPI: %s", r->peer,
                                        o, recv ? "receive" : "send", r->bytes, tg, e);
            return;
        }
    }
    if (recv) {
        long long got = 0;
        for (int i = 0; i < nparts; i++) {
            int c = 0;
            MPI_Get_count(&st[i], MPI_BYTE, &c);
            if (c == MPI_UNDEFINED) { /* a count of 1 MiB blocks */
                MPI_Get_count(&st[i], g_block, &c);
                got += (long long)c * (long long)BLOCK_BYTES;
            } else {
                got += c;
            }
        }
        if ((size_t)got != r->bytes)
            r->status = dt_mpi_fail(t, DT_EMISMATCH, "rank %d sent %lld bytes but rank %d expected %zu (%s) during %s",
                                    r->peer, got, t->base.rank, r->bytes, tg, o);
    }
}

/* Tests every pending request once; *progressed is set when one completed. */
static dt_status progress_all(dt_mpi_transport *t, bool *progressed) {
    *progressed = false;
    uint64_t checked = t->check_events;
    DT_TRY(dt_mpi_progress_internal(t));
    if (t->check_events != checked) *progressed = true;
    for (dt_treq **pp = &t->pending; *pp;) {
        dt_treq *r = *pp;
        MPI_Request m[2];
        MPI_Status st[2];
        int flag = 0, n = (int)r->priv.u[2];
        req_get(r, m);
        LOCK();
        int rc = MPI_Testall(n, m, &flag, st);
        UNLOCK();
        req_set(r, m);
        if (!flag && rc == MPI_SUCCESS) {
            pp = &r->next;
            continue;
        }
        finish(t, r, rc, st, n);
        *pp = r->next;
        r->next = NULL;
        *progressed = true;
        if (t->broken) return dt_error(t->err, "%s", t->errmsg);
    }
    return DT_OK;
}

static dt_status mpi_test(dt_transport *tt, dt_treq *req, bool *done) {
    dt_mpi_transport *t = (dt_mpi_transport *)tt;
    bool progressed;
    dt_status s = progress_all(t, &progressed);
    *done = req->done;
    if (req->done && req->status != DT_OK) return dt_error(req->status, "%s", t->errmsg);
    return s;
}

static dt_status timeout_error(dt_mpi_transport *t, dt_treq *const *reqs, int n, double waited) {
    char who[256] = "", o[96], tg[32];
    size_t len = 0;
    int listed = 0;
    for (int i = 0; i < n && listed < 4; i++) {
        if (!reqs[i] || reqs[i]->done) continue;
        len += (size_t)snprintf(who + len, sizeof who - len, "%srank %d (%s of %zu bytes, %s)", listed ? ", " : "",
                                reqs[i]->peer, reqs[i]->priv.u[3] ? "receive" : "send", reqs[i]->bytes,
                                tag_str(reqs[i]->tag, tg, sizeof tg));
        if (len >= sizeof who) len = sizeof who - 1;
        listed++;
    }
    return dt_mpi_fail(t, DT_ETIMEDOUT,
                       "timed out after %.1f s during %s waiting for %s; the rank is stalled or dead "
                       "(raise %s if it is only slow)",
                       waited, op_str(t, o, sizeof o), who, t->base.timeout_knob);
}

/* A request of reqs waits on a rank whose process is gone (and what it sent before is not here):
 * that is DT_EPEER now rather than DT_ETIMEDOUT at the deadline. */
static dt_status check_dead(dt_mpi_transport *t, dt_treq *const *reqs, int n) {
    for (int i = 0; i < n; i++) {
        dt_treq *r = reqs[i];
        int pid;
        if (!r || r->done || !(pid = dt_mpi_peer_gone(t, r->peer))) continue;
        bool progressed;
        DT_TRY(progress_all(t, &progressed)); /* its last messages may be in already */
        if (r->done) continue;
        char o[96], tg[32];
        return dt_mpi_fail(t, DT_EPEER,
                           "rank %d died during %s (%s of %zu bytes, %s): its process (world rank %d, "
                           "pid %d) is gone",
                           r->peer, op_str(t, o, sizeof o), r->priv.u[3] ? "receive" : "send", r->bytes,
                           tag_str(r->tag, tg, sizeof tg), dt_mpi_world_of(t, r->peer), pid);
    }
    return DT_OK;
}

dt_status dt_mpi_waitall(dt_transport *tt, dt_treq *const *reqs, int n, double deadline) {
    dt_mpi_transport *t = (dt_mpi_transport *)tt;
    double t0 = dt_now(), next_live = t0 + DT_MPI_LIVE_PERIOD, bytes = 0;
    for (int i = 0; i < n; i++) bytes += reqs[i] && !reqs[i]->done ? (double)reqs[i]->bytes : 0;
    dt_mpi_idle idle = dt_mpi_idle_for(bytes); /* no naps while the messages are still moving */
    for (;;) {
        bool progressed;
        DT_TRY(progress_all(t, &progressed));
        if (n == 0) {
            if (progressed || atomic_exchange(&t->woken, 0)) return DT_OK;
        } else {
            bool all = true;
            for (int i = 0; i < n; i++)
                if (reqs[i] && !reqs[i]->done) all = false;
            if (all) {
                for (int i = 0; i < n; i++)
                    if (reqs[i] && reqs[i]->status != DT_OK) return dt_error(reqs[i]->status, "%s", t->errmsg);
                return DT_OK;
            }
        }
        double now = dt_now();
        if (n > 0 && now >= next_live) {
            DT_TRY(check_dead(t, reqs, n));
            next_live = now + DT_MPI_LIVE_PERIOD;
        }
        if (now >= deadline) return n == 0 ? DT_OK : timeout_error(t, reqs, n, now - t0);
        if (progressed) dt_mpi_idle_reset(&idle);
        dt_mpi_backoff(&idle);
    }
}

static void mpi_wake(dt_transport *tt) { atomic_store(&((dt_mpi_transport *)tt)->woken, 1); }

static void mpi_abort(dt_transport *tt, dt_status s, const char *msg) {
    dt_mpi_transport *t = (dt_mpi_transport *)tt;
    if (t->broken) return;
    notify_all(t, 'A', s, msg ? msg : "aborted");
    set_broken(t, s < 0 ? s : DT_EPEER, msg ? msg : "aborted");
}

/* ---- creation, split, destroy -------------------------------------------------------------- */

dt_status dt_mpi_wrap(MPI_Comm comm, double timeout_s, dt_transport **out) {
    dt_mpi_transport *t = calloc(1, sizeof *t);
    if (!t) return dt_error(DT_ENOMEM, "out of memory creating the MPI transport");
    t->base.ops = &g_ops;
    t->comm = comm;
    t->timeout_s = timeout_s > 0 ? timeout_s : 300;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &t->base.rank);
    MPI_Comm_size(comm, &t->base.size);
    t->world = dt_mpi_live_ranks(comm, t->base.size); /* NULL: no dead-peer checks, deadlines only */
    const char *chk = getenv("DTRAIN_MPI_CHECK");
    t->check = t->base.size > 1 && !(chk && !strcmp(chk, "0"));
    dt_mpi_check_init(t);
    MPI_Irecv(t->abort_buf, (int)sizeof t->abort_buf, MPI_BYTE, MPI_ANY_SOURCE, DT_MPI_TAG_ABORT, comm, &t->abort_req);
    g_live++;
    *out = &t->base;
    return DT_OK;
}

dt_status dt_transport_mpi_create(dt_transport **out, const dt_transport_params *p) {
    *out = NULL;
    LOCK();
    const char *spin = getenv("DTRAIN_MPI_SPIN_US");
    if (spin && *spin) g_spin_s = atof(spin) * 1e-6;
    int inited = 0, finalized = 0, provided = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    dt_status s = DT_OK;
    if (finalized) {
        s = dt_error(DT_ENOTSUP, "MPI was already finalised in this process: create the MPI communicator "
                                 "once per process and destroy it at the end");
    } else if (!inited) {
        /* OpenMPI's non-blocking allreduce defaults to algorithms slower than its blocking one;
         * reduce-scatter+allgather (Rabenseifner) matches MPI_Allreduce (docs/why.md, "libnbc's
         * allreduce algorithm"). A user setting wins. At 2 ranks recursive doubling sends the same
         * bytes (each rank its S once, not S/2 twice) in half the messages. */
        const char *np = getenv("OMPI_COMM_WORLD_SIZE");
        setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", np && !strcmp(np, "2") ? "4" : "3", 0);
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            s = dt_error(DT_EIO, "MPI_Init_thread failed: start the ranks with mpirun or srun");
        else g_we_init = true;
        if (s == DT_OK) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    } else {
        MPI_Query_thread(&provided);
    }
    if (s == DT_OK && provided < MPI_THREAD_SERIALIZED)
        s = dt_error(DT_ENOTSUP,
                     "MPI provides thread level %d but dtrain needs MPI_THREAD_SERIALIZED: "
                     "initialise MPI with MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...)",
                     provided);
    if (s == DT_OK && !g_block_ok) {
        MPI_Type_contiguous((int)BLOCK_BYTES, MPI_BYTE, &g_block);
        MPI_Type_commit(&g_block);
        g_block_ok = true;
    }
    MPI_Comm comm = MPI_COMM_NULL;
    if (s == DT_OK) {
        char e[256];
        int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
        if (rc != MPI_SUCCESS)
            s = dt_error(DT_EPEER, "MPI_Comm_dup of the world failed: %s", dt_mpi_errstr(rc, e, sizeof e));
        double until = dt_now() + (p && p->timeout_s > 0 ? p->timeout_s : 300);
        if (s == DT_OK && (s = dt_mpi_live_init(comm, until)) != DT_OK) MPI_Comm_free(&comm);
    }
    if (s == DT_OK) s = dt_mpi_wrap(comm, p ? p->timeout_s : 0, out);
    UNLOCK();
    return s;
}

/* Whether this process must leave without MPI_Finalize (whose fence waits for every rank): a
 * transport failed (peers may be stuck in ops with us), a rank of the job is gone, or Open MPI
 * runs the job with --enable-recovery. There, after a rank was killed, the fence of MPI_Finalize
 * hung in 4 of 15 runs of a ps job (Open MPI 4.1.4, the survivors all in it), while ranks of such
 * a job may exit without it (mpirun neither complains nor changes its exit status). */
static bool skip_finalize(void) {
    static const char *yes[] = {"1", "t", "true", "y", "yes", "enabled"};
    const char *r = getenv("OMPI_MCA_orte_enable_recovery");
    for (size_t i = 0; r && i < sizeof yes / sizeof *yes; i++)
        if (!strcasecmp(r, yes[i])) return true;
    return g_failed || dt_mpi_world_lost();
}

static void mpi_destroy(dt_transport *tt) {
    if (!tt) return;
    dt_mpi_transport *t = (dt_mpi_transport *)tt;
    LOCK();
    if (t->abort_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&t->abort_req);
        MPI_Request_free(&t->abort_req);
    }
    dt_mpi_check_free(t);
    MPI_Comm_free(&t->comm);
    if (--g_live == 0 && g_we_init && !skip_finalize()) {
        MPI_Type_free(&g_block);
        g_block_ok = false;
        dt_mpi_live_free();
        MPI_Finalize();
    }
    UNLOCK();
    free(t->world);
    free(t);
}

static const dt_transport_ops g_ops = {
    .name = "mpi",
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .waitall = dt_mpi_waitall,
    .wake = mpi_wake,
    .begin = dt_mpi_check_begin,
    .coll = dt_mpi_coll,
    .abort = mpi_abort,
    .split = dt_mpi_split,
    .destroy = mpi_destroy,
};

#endif

/* ---- its registry entry (transports.c) ---- */

static bool mpi_probe(const dt_transport_params *p, char *why, size_t n) {
#ifndef DT_HAVE_MPI
    snprintf(why, n, "built without MPI: install libopenmpi-dev and rebuild");
    return (void)p, false;
#else
    if (p->launcher == DT_LAUNCH_MPI) return true;
    snprintf(why, n, "the ranks were not started by mpirun/srun");
    return false;
#endif
}

const dt_transport_kind dt_transport_kind_mpi = {
    .name = "mpi",
    .help = "MPI point-to-point and MPI's own collectives, for ranks started by mpirun/srun",
    .options = "",
    .probe = mpi_probe,
    .create = dt_transport_mpi_create,
};
