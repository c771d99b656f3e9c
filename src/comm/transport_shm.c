/* The shm transport: one POSIX shared-memory segment per job (layout in shm.h), created by
 * rank 0 with O_EXCL and mode 0600 and unlinked by the last rank to attach, so nothing is left
 * in /dev/shm even after a crash (only a crash before every rank attached can leave the name;
 * dt_comm_shm_cleanup removes it). This file: attach, create, split, destroy, liveness (robust
 * mutexes + kill(pid, 0)), the job-wide abort word, and the wait loop (bounded spin, then
 * FUTEX_WAIT on the own doorbell in 100 ms slices; how long and how it spins: shm_wait.c). The
 * segment's name, slot geometry, creation and opening are in shm_segment.c, point-to-point in
 * shm_p2p.c, direct collectives in shm_coll.c. */
#include "comm/shm.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static const dt_transport_ops dt_shm_ops;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *w, uint32_t val, double secs) {
    if (secs <= 0) return;
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w) { syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

void dt_shm_ring(dt_shm *s, int r) {
    shm_rank *R = shm_rank_at(s, r);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&R->sleeping, memory_order_relaxed)) {
        atomic_fetch_add(&R->bell, 1);
        futex_wake(&R->bell);
    }
}

/* ---- liveness, descriptors, abort ---- */

/* 0 alive (or not attached yet), 1 died, 2 left (destroyed its communicator) */
static int peer_state(dt_shm *s, int p) {
    shm_rank *R = shm_rank_at(s, p);
    if (atomic_load(&R->dead)) return 1;
    if (atomic_load(&R->left)) return 2;
    int e = pthread_mutex_trylock(&R->alive);
    if (e == EOWNERDEAD) {
        /* we now own the dead rank's mutex: release it at once, or it stays on this thread's
         * robust list and the next robust unlock touches it after the segment is unmapped */
        atomic_store(&R->dead, 1);
        pthread_mutex_consistent(&R->alive);
        pthread_mutex_unlock(&R->alive);
        return 1;
    }
    if (e == ENOTRECOVERABLE) return 1;
    if (e == 0) {
        pthread_mutex_unlock(&R->alive);
        return atomic_load(&R->left) ? 2 : 0;
    }
    if (R->pid > 0 && kill(R->pid, 0) != 0 && errno == ESRCH) {
        atomic_store(&R->dead, 1);
        return 1;
    }
    return 0;
}

bool dt_shm_peer_desc(dt_shm *s, int p, uint64_t seq, dt_coll_desc *out) {
    dt_coll_desc *d = &shm_rank_at(s, p)->desc[seq % SHM_DESC_RING];
    uint64_t s1 = __atomic_load_n(&d->seq, __ATOMIC_ACQUIRE);
    if (s1 != seq) return false;
    memcpy(out, d, sizeof *out);
    atomic_thread_fence(memory_order_acquire);
    uint64_t s2 = __atomic_load_n(&d->seq, __ATOMIC_RELAXED);
    out->seq = seq;
    return s2 == seq;
}

/* Waits, yielding, until the abort rank abort_state - 3 is writing is published, or that rank
 * dies or leaves before it is. */
static void wait_abort_published(dt_shm *s) {
    for (;;) {
        const int32_t st = atomic_load_explicit(&s->hdr->abort_state, memory_order_acquire);
        if (st < 3) return;
        if (st - 3 != s->me && peer_state(s, st - 3) != 0) return;
        sched_yield();
    }
}

void dt_shm_abort(dt_shm *s, dt_status st, const char *msg) {
    shm_header *h = s->hdr;
    int32_t zero = 0;
    if (atomic_compare_exchange_strong(&h->abort_state, &zero, 3 + s->me)) {
        h->abort_status = st;
        snprintf(h->abort_msg, sizeof h->abort_msg, "%s", msg);
        atomic_store(&h->abort_state, 2);
    } else {
        wait_abort_published(s);
    }
    for (int r = 0; r < s->n; r++) {
        shm_rank *R = shm_rank_at(s, r);
        atomic_fetch_add(&R->bell, 1);
        futex_wake(&R->bell);
    }
}

/* The job's abort as an error, read only once its writer has finished (abort_state 2: before,
 * abort_status still reads 0, DT_OK); else the transport's own failure. */
static dt_status abort_error(dt_shm *s) {
    s->broken = true;
    if (atomic_load_explicit(&s->hdr->abort_state, memory_order_acquire) == 2)
        return dt_error((dt_status)s->hdr->abort_status, "%s", s->hdr->abort_msg);
    return dt_error(DT_EPEER, "the shm transport failed earlier; create a new communicator");
}

/* Aborts the job with st / msg, or joins the abort another rank is publishing (two ranks that
 * find the same mismatch race for it), and returns the job's abort: the loser of the race used to
 * read the winner's status before it was written, and a mismatched collective returned DT_OK. */
dt_status dt_shm_fail(dt_shm *s, dt_status st, const char *msg) {
    dt_shm_abort(s, st, msg);
    s->broken = true;
    if (atomic_load_explicit(&s->hdr->abort_state, memory_order_acquire) == 2)
        return dt_error((dt_status)s->hdr->abort_status, "%s", s->hdr->abort_msg);
    return dt_error(st, "%s", msg); /* its writer died or left first: our own reason */
}

dt_status dt_shm_mismatch(dt_shm *s, int p, const dt_coll_desc *theirs) {
    char mine[128], other[128], msg[400];
    dt_coll_desc_call_str(&s->cur, mine, sizeof mine);
    dt_coll_desc_call_str(theirs, other, sizeof other);
    int a = s->me < p ? s->me : p, b = s->me < p ? p : s->me;
    const char *sa = s->me < p ? mine : other, *sb = s->me < p ? other : mine;
    uint64_t qa = s->me < p ? s->cur.seq : theirs->seq, qb = s->me < p ? theirs->seq : s->cur.seq;
    if (qa == qb)
        snprintf(msg, sizeof msg, "rank %d called %s but rank %d called %s at #%llu", a, sa, b, sb,
                 (unsigned long long)qa);
    else
        snprintf(msg, sizeof msg, "rank %d called %s at #%llu but rank %d called %s at #%llu", a, sa,
                 (unsigned long long)qa, b, sb, (unsigned long long)qb);
    return dt_shm_fail(s, DT_EMISMATCH, msg);
}

dt_status dt_shm_check_peer(dt_shm *s, int p) {
    dt_coll_desc d;
    if (!s->in_coll || p == s->me) return DT_OK;
    if (dt_shm_peer_desc(s, p, s->cur.seq, &d) && !dt_coll_desc_match(&s->cur, &d)) return dt_shm_mismatch(s, p, &d);
    return DT_OK;
}

static const char *what_str(dt_shm *s, char *buf, size_t n, const dt_treq *rq) {
    if (s->in_coll || !rq) return s->in_coll ? dt_coll_desc_str(&s->cur, buf, n) : "point-to-point progress";
    snprintf(buf, n, "%s rank %d tag %d (%zu bytes)", rq->priv.u[2] & 2 ? "recv from" : "send to", rq->peer, rq->tag,
             rq->bytes);
    return buf;
}

/* every ~100 ms of sleeping: abort word, dead or departed peers, mismatched ops, the deadline.
 * idle (progress-thread wait for posted point-to-point): no mismatch or deadline checks. */
static dt_status slow_checks(dt_shm *s, double deadline, double now, bool idle, dt_shm_poll poll, void *arg,
                             bool *again) {
    char what[160];
    const dt_treq *rq = s->what_req;
    if (atomic_load(&s->hdr->abort_state) == 2) return abort_error(s);
    for (int p = 0; p < s->n; p++) {
        if (p == s->me) continue;
        int st = peer_state(s, p);
        if (st == 1 || (st == 2 && s->waiting_on == p)) {
            /* the peer may have done its part after our last poll and then left (or died): what it
             * published precedes the flag just read, so look again before blaming it */
            dt_status pst = DT_OK;
            int r = poll(s, arg, &pst);
            if (pst != DT_OK) return pst;
            if (r != 0) {
                *again = true;
                return DT_OK;
            }
            s->broken = true;
            return dt_error_peer(DT_EPEER, p, "rank %d %s during %s", p,
                                 st == 1 ? "died" : "left (destroyed its communicator)",
                                 what_str(s, what, sizeof what, rq));
        }
        if (!idle && !rq) DT_TRY(dt_shm_check_peer(s, p));
    }
    if (!idle && now >= deadline) {
        int p = s->waiting_on;
        char doing[160] = "";
        if (p >= 0) {
            shm_rank *R = shm_rank_at(s, p);
            uint64_t q = atomic_load(&R->cur_seq);
            dt_coll_desc d;
            if (q && dt_shm_peer_desc(s, p, q, &d)) {
                char ds[128];
                snprintf(doing, sizeof doing, " (its latest collective is %s)", dt_coll_desc_str(&d, ds, sizeof ds));
            }
        }
        char msg[512];
        if (p >= 0)
            snprintf(msg, sizeof msg,
                     "%s on rank %d timed out waiting for rank %d%s: it is alive but did not take "
                     "part; raise %s (seconds) if it is only slow",
                     what_str(s, what, sizeof what, rq), s->me, p, doing, s->base.timeout_knob);
        else
            snprintf(msg, sizeof msg, "%s on rank %d timed out; raise %s (seconds) if the job is only slow",
                     what_str(s, what, sizeof what, rq), s->me, s->base.timeout_knob);
        if (!rq) { /* a collective: fail the whole job so no rank goes on alone */
            return dt_shm_fail(s, DT_ETIMEDOUT, msg);
        }
        s->broken = true;
        return dt_error(DT_ETIMEDOUT, "%s", msg);
    }
    return DT_OK;
}

dt_status dt_shm_block(dt_shm *s, dt_shm_poll poll, void *arg, double deadline, bool stop_on_progress) {
    shm_rank *me = shm_rank_at(s, s->me);
    const dt_shm_wait_policy *w = dt_shm_wait_here(s);
    double spin_until = 0;
    int yields = 0;
    unsigned spins = 0;
    for (;;) {
        dt_status st = DT_OK;
        int r = poll(s, arg, &st);
        if (st != DT_OK) return st;
        if (r == 1 || (r == 2 && stop_on_progress)) return DT_OK;
        if (r == 2) {
            spin_until = 0;
            yields = 0;
            continue;
        }
        if (atomic_load_explicit(&s->hdr->abort_state, memory_order_acquire) == 2) return abort_error(s);
        if (stop_on_progress && atomic_exchange(&s->woken, 0)) return DT_OK;
        if (w->spin_s > 0) { /* the policy: shm_wait.c */
            double now = dt_now();
            if (spin_until == 0) spin_until = now + w->spin_s;
            if (now < spin_until) {
                for (int i = 0; i < 32; i++) cpu_relax();
                if (w->spin_yields && (++spins & 15) == 0) sched_yield(); /* lets the compute thread run */
                continue;
            }
        }
        if (yields < w->yields) {
            yields++;
            sched_yield();
            continue;
        }
        /* sleep: announce, re-check, then FUTEX_WAIT on the doorbell */
        atomic_store(&me->sleeping, 1);
        uint32_t bell = atomic_load(&me->bell);
        r = poll(s, arg, &st);
        if (st != DT_OK || r != 0) {
            atomic_store(&me->sleeping, 0);
            if (st != DT_OK) return st;
            if (r == 1 || stop_on_progress) return DT_OK;
            spin_until = 0;
            yields = 0;
            continue;
        }
        double now = dt_now();
        if (stop_on_progress && now >= deadline) { /* an idle wait simply ends */
            atomic_store(&me->sleeping, 0);
            return DT_OK;
        }
        if (now >= s->next_check || now >= deadline) {
            if (s->check_delay_s > 0) dt_shm_sleep_ms(s->check_delay_s * 1e3);
            bool again = false;
            st = slow_checks(s, deadline, now, stop_on_progress, poll, arg, &again);
            if (st != DT_OK) {
                atomic_store(&me->sleeping, 0);
                return st;
            }
            if (again) {
                atomic_store(&me->sleeping, 0);
                spin_until = 0;
                yields = 0;
                continue;
            }
            s->next_check = now + 0.1;
        }
        double w = s->next_check - now;
        if (deadline - now < w) w = deadline - now;
        if (!(stop_on_progress && atomic_load(&s->woken))) futex_wait(&me->bell, bell, w > 0 ? w : 1e-3);
        atomic_store(&me->sleeping, 0);
        spin_until = 0;
        yields = 0;
    }
}

/* ---- creation (the segment itself: shm_segment.c) ---- */

static dt_status attach(dt_shm *s, double deadline) {
    shm_rank *me = shm_rank_at(s, s->me);
    int e = pthread_mutex_lock(&me->alive);
    if (e == EOWNERDEAD) pthread_mutex_consistent(&me->alive);
    else if (e != 0) return dt_error(DT_EINTERNAL, "cannot lock the liveness mutex of rank %d: %s", s->me, strerror(e));
    if (me->pid != 0) {
        pthread_mutex_unlock(&me->alive);
        return dt_error(DT_EMISMATCH, "two processes of job '%s' claim rank %d (pids %d and %d)", s->job, s->me,
                        (int)me->pid, (int)getpid());
    }
    me->pid = (int32_t)getpid();
    uint32_t n = atomic_fetch_add(&s->hdr->attached, 1) + 1;
    if (n == (uint32_t)s->n) {
        shm_unlink(s->name);
        futex_wake(&s->hdr->attached);
    }
    while ((n = atomic_load(&s->hdr->attached)) < (uint32_t)s->n) {
        double now = dt_now();
        for (int p = 0; p < s->n; p++)
            if (shm_rank_at(s, p)->pid > 0 && peer_state(s, p) == 1)
                return dt_error_peer(DT_EPEER, p, "rank %d died while job '%s' was starting", p, s->job);
        if (now > deadline) {
            char missing[256] = "";
            size_t len = 0;
            for (int p = 0; p < s->n && len < sizeof missing - 16; p++)
                if (shm_rank_at(s, p)->pid == 0)
                    len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? ", " : "", p);
            return dt_error(DT_ETIMEDOUT,
                            "timed out waiting for rank(s) %s to join job '%s' (%u of %d attached): "
                            "were they started with the same DTRAIN_JOB_ID and world size?",
                            missing, s->job, n, s->n);
        }
        futex_wait(&s->hdr->attached, n, 0.05);
    }
    return DT_OK;
}

static void shm_destroy(dt_transport *t);

/* The wait policies of a transport that is (or is not) oversubscribed (shm_wait.c). */
static void set_wait(dt_shm *s, bool over) {
    const char *spin = getenv("DTRAIN_SHM_SPIN_US");
    s->over = over;
    s->wait_fg = dt_shm_wait_policy_for(over, false, spin);
    s->wait_bg = dt_shm_wait_policy_for(over, true, spin);
}

dt_status dt_transport_shm_create(dt_transport **out, const dt_transport_params *p) {
    *out = NULL;
    if (p->size < 1 || p->rank < 0 || p->rank >= p->size)
        return dt_error(DT_EINVAL, "rank %d is out of range for world size %d", p->rank, p->size);
    dt_shm *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ENOMEM, "out of memory creating the shm transport");
    s->base.ops = &dt_shm_ops;
    s->base.rank = s->me = p->rank;
    s->base.size = s->n = p->size;
    s->timeout_s = p->timeout_s > 0 ? p->timeout_s : 300;
    s->waiting_on = -1;
    s->owner = pthread_self();
    dt_status st = dt_shm_job_name(s->name, sizeof s->name, p->job_id);
    if (st != DT_OK) {
        free(s);
        return st;
    }
    snprintf(s->job, sizeof s->job, "%s", p->job_id);
    size_t n = (size_t)s->n;
    s->sendq = calloc(n * SHM_KINDS, sizeof *s->sendq);
    s->recvq = calloc(n * SHM_KINDS, sizeof *s->recvq);
    s->in_req = calloc(n, sizeof *s->in_req);
    s->in_unex = calloc(n, sizeof *s->in_unex);
    s->unex = calloc(n, sizeof *s->unex);
    if (!s->sendq || !s->recvq || !s->in_req || !s->in_unex || !s->unex) {
        shm_destroy(&s->base);
        return dt_error(DT_ENOMEM, "out of memory creating the shm transport");
    }
    const char *cd = getenv("DTRAIN_SHM_TEST_CHECK_DELAY_MS");
    s->check_delay_s = cd && *cd ? atof(cd) * 1e-3 : 0;
    double deadline = dt_now() + s->timeout_s;
    st = s->me == 0 ? dt_shm_segment_create(s) : dt_shm_segment_open(s, deadline);
    if (st == DT_OK) {
        dt_shm_publish_cpus(s);
        st = attach(s, deadline);
    }
    if (st == DT_OK) /* every rank has published its CPUs: oversubscribed if they share fewer */
        set_wait(s, s->n > dt_shm_job_cpus(s));
    if (st == DT_OK) {
        s->slot_free = calloc(s->hdr->d_slots, sizeof *s->slot_free);
        if (!s->slot_free) st = dt_error(DT_ENOMEM, "out of memory creating the shm transport");
    }
    if (st != DT_OK) {
        if (s->hdr && atomic_load(&s->hdr->attached) < (uint32_t)s->n) shm_unlink(s->name);
        shm_destroy(&s->base);
        return st;
    }
    *out = &s->base;
    return DT_OK;
}

static void shm_destroy(dt_transport *t) {
    if (!t) return;
    dt_shm *s = (dt_shm *)t;
    if (s->seg) {
        shm_rank *me = shm_rank_at(s, s->me);
        if (me->pid == (int32_t)getpid()) {
            atomic_store(&me->left, 1);
            pthread_mutex_unlock(&me->alive);
            for (int r = 0; r < s->n; r++)
                if (r != s->me) dt_shm_ring(s, r);
        }
        munmap(s->seg, s->seg_bytes);
    }
    if (s->unex)
        for (int p = 0; p < s->n; p++) {
            for (shm_unex *u = s->unex[p], *nx; u; u = nx) {
                nx = u->next;
                free(u);
            }
        }
    free(s->sendq);
    free(s->recvq);
    free(s->in_req);
    free(s->in_unex);
    free(s->unex);
    free(s->slot_free);
    free(s);
}

static dt_status shm_begin(dt_transport *t, const dt_coll_desc *d) {
    dt_shm *s = (dt_shm *)t;
    if (s->broken || atomic_load(&s->hdr->abort_state) == 2) return abort_error(s);
    s->cur = *d;
    s->in_coll = true;
    shm_rank *me = shm_rank_at(s, s->me);
    dt_coll_desc *slot = &me->desc[d->seq % SHM_DESC_RING];
    __atomic_store_n(&slot->seq, 0, __ATOMIC_RELAXED);
    atomic_thread_fence(memory_order_release);
    dt_coll_desc tmp = *d;
    tmp.seq = 0;
    memcpy(slot, &tmp, sizeof tmp);
    __atomic_store_n(&slot->seq, d->seq, __ATOMIC_RELEASE);
    atomic_store_explicit(&me->cur_seq, d->seq, memory_order_release);
    return DT_OK;
}

static void shm_abort(dt_transport *t, dt_status st, const char *msg) { dt_shm_abort((dt_shm *)t, st, msg); }

static void shm_wake(dt_transport *t) {
    dt_shm *s = (dt_shm *)t;
    atomic_store(&s->woken, 1);
    shm_rank *me = shm_rank_at(s, s->me);
    atomic_fetch_add(&me->bell, 1);
    futex_wake(&me->bell);
}

static dt_status shm_split(dt_transport *t, int color, const int *members, int new_size, int new_rank,
                           uint64_t split_id, double deadline, dt_transport **out) {
    dt_shm *s = (dt_shm *)t;
    (void)members;
    char job[256];
    snprintf(job, sizeof job, "%s.%llu.%d", s->job, (unsigned long long)split_id, color);
    if (strlen(job) > 200) { /* nested splits: keep the name short but unique per (parent, split, color) */
        uint64_t h = 1469598103934665603ull;
        for (const char *c = job; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
        snprintf(job, sizeof job, "%.150s.h%016llx", s->job, (unsigned long long)h);
    }
    dt_transport_params p = {
        .rank = new_rank, .size = new_size, .local_rank = new_rank, .job_id = job, .timeout_s = deadline - dt_now()};
    if (p.timeout_s < 1) p.timeout_s = 1;
    dt_status st = dt_transport_shm_create(out, &p);
    if (st == DT_OK) ((dt_shm *)*out)->timeout_s = s->timeout_s;
    /* a split's ranks still share the CPUs with the parent's other ranks (ps's server-worker
     * pairs of 5 ranks on 2 cores): a worker spinning for its server's answer takes the core the
     * server needs (docs/figures.md, uneven workers) */
    if (st == DT_OK && s->over && !((dt_shm *)*out)->over) set_wait((dt_shm *)*out, true);
    return st;
}

/* Every rank of a shm transport is on this host; their CPUs are the union they published. */
static int shm_host_cpus(dt_transport *t, int *ranks) {
    dt_shm *s = (dt_shm *)t;
    *ranks = s->n;
    return dt_shm_job_cpus(s);
}

static int shm_behind(dt_transport *t, uint64_t seq) {
    dt_shm *s = (dt_shm *)t;
    for (int p = 0; p < s->n; p++)
        if (p != s->me && atomic_load_explicit(&shm_rank_at(s, p)->cur_seq, memory_order_acquire) < seq) return p;
    return -1;
}

static const dt_transport_ops dt_shm_ops = {
    .name = "shm",
    .isend = dt_shm_isend,
    .irecv = dt_shm_irecv,
    .test = dt_shm_test,
    .waitall = dt_shm_waitall,
    .wake = shm_wake,
    .begin = shm_begin,
    .coll = dt_shm_coll,
    .abort = shm_abort,
    .split = shm_split,
    .host_cpus = shm_host_cpus,
    .behind = shm_behind,
    .destroy = shm_destroy,
};

/* ---- its registry entry (transports.c) ---- */

static bool shm_probe(const dt_transport_params *p, char *why, size_t n) {
    if (p->launcher == DT_LAUNCH_MPI) {
        snprintf(why, n, "the ranks were started by mpirun/srun (name it to use it when they share one host)");
        return false;
    }
    if (p->size > 1) return true;
    snprintf(why, n, "one process needs no transport");
    return false;
}

const dt_transport_kind dt_transport_kind_shm = {
    .name = "shm",
    .help = "shared memory and futexes between the ranks of one host (dtrain launch, --workers N)",
    .options = "",
    .probe = shm_probe,
    .create = dt_transport_shm_create,
};
