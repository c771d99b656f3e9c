/* Execution of communicator ops: one op at a time, in issue order. A blocking call runs on the
 * caller's thread once every earlier non-blocking op has finished; non-blocking ops run on a
 * per-communicator progress thread (started on first use), which also keeps posted
 * non-blocking send/recv moving, sleeping in the transport (futex) while nothing happens.
 * Requests carry the op's status and error message back to dt_request_wait/test. */
#include "comm/comm_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A transport error names the ranks of its own group ("rank 0 left ..."): say which world rank
 * the blamed peer is, in its message ("world rank 4 left ...") and in dt_last_error_peer. */
static void name_world_peer(dt_comm *c) {
    const int p = dt_last_error_peer();
    if (p < 0 || p >= c->size) {
        dt_error_set_peer(-1);
        return;
    }
    const int w = c->world_of[p];
    char head[24], msg[512];
    int n = snprintf(head, sizeof head, "rank %d ", p);
    if (!strncmp(dt_last_error(), head, (size_t)n)) {
        snprintf(msg, sizeof msg, "world rank %d %s", w, dt_last_error() + n);
        dt_error(DT_EPEER, "%s", msg);
    }
    dt_error_set_peer(w);
}

dt_status dt_comm_fail(dt_comm *c, dt_status s) {
    if (s != DT_OK && c->failed == DT_OK) {
        if (c->world_of) { /* the transport names ranks of this group: say which world ranks they are */
            name_world_peer(c);
            char list[160];
            size_t n = 0;
            for (int i = 0; i < c->size && n + 16 < sizeof list; i++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", i ? ", " : "", c->world_of[i]);
            if (n + 16 >= sizeof list) snprintf(list + n, sizeof list - n, ", ...");
            dt_error_wrap(s, "in a group of %d ranks (its ranks 0-%d are world ranks %s)", c->size, c->size - 1, list);
        }
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", dt_last_error());
        c->fail_peer = dt_last_error_peer();
        c->failed = s;
    }
    return s;
}

static void finish(dt_comm *c, dt_request *r, dt_status st) {
    r->status = st;
    if (st != DT_OK) snprintf(r->msg, sizeof r->msg, "%s", dt_last_error());
    r->peer = st != DT_OK ? dt_last_error_peer() : -1;
    r->done = true;
    (void)c;
}

/* exclusive use of the transport for the calling thread, after all queued ops */
void dt_comm_acquire(dt_comm *c) {
    if (!c->thread_started) {
        c->busy = true;
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->want = true;
    while (c->busy || c->qhead) {
        if (c->idling && c->t->ops->wake) c->t->ops->wake(c->t);
        pthread_cond_wait(&c->cv, &c->mu);
    }
    c->want = false;
    c->busy = true;
    pthread_mutex_unlock(&c->mu);
}

void dt_comm_release(dt_comm *c) {
    if (!c->thread_started) {
        c->busy = false;
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->busy = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

dt_status dt_comm_failed_error(dt_comm *c) {
    dt_error(c->failed, "%s", c->fail_msg);
    dt_error_set_peer(c->fail_peer);
    return c->failed;
}

dt_status dt_comm_run(dt_comm *c, dt_request *r) {
    if (c->failed) return dt_comm_failed_error(c);
    dt_comm_acquire(c);
    dt_status st = c->failed ? dt_comm_failed_error(c) : dt_comm_exec(c, r);
    if (st == DT_OK && r->kind != RQ_COLL && !r->treq.done) {
        dt_treq *w = &r->treq;
        st = dt_comm_fail(c, c->t->ops->waitall(c->t, &w, 1, r->deadline));
    }
    dt_comm_release(c);
    return st;
}

static void drop_active(dt_comm *c, dt_request *r) {
    for (dt_request **pp = &c->active; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            return;
        }
}

/* one round of background progress for posted send/recv; called with busy held, mu unlocked */
static dt_status idle_round(dt_comm *c, double until) {
    bool any = false;
    for (dt_request *r = c->active; r; r = r->next) any |= r->treq.done;
    if (any) return DT_OK;
    return c->t->ops->waitall(c->t, NULL, 0, until);
}

static void *progress_main(void *arg) {
    dt_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (c->qhead && !c->busy) {
            dt_request *r = c->qhead;
            c->qhead = r->next;
            if (!c->qhead) c->qtail = NULL;
            c->busy = true;
            pthread_mutex_unlock(&c->mu);
            dt_status st = c->failed ? dt_comm_failed_error(c) : dt_comm_exec(c, r);
            pthread_mutex_lock(&c->mu);
            c->busy = false;
            if (st != DT_OK || r->kind == RQ_COLL || r->treq.done) finish(c, r, st);
            else {
                r->posted = true;
                r->next = c->active;
                c->active = r;
            }
            pthread_cond_broadcast(&c->cv);
            continue;
        }
        if (c->active && !c->busy && !c->want) {
            c->busy = c->idling = true;
            double now = dt_now(), until = now + 0.05;
            for (dt_request *r = c->active; r; r = r->next)
                if (r->deadline < until) until = r->deadline;
            pthread_mutex_unlock(&c->mu);
            dt_status st = c->failed ? dt_comm_failed_error(c) : idle_round(c, until);
            if (st != DT_OK) dt_comm_fail(c, st);
            now = dt_now();
            pthread_mutex_lock(&c->mu);
            c->busy = c->idling = false;
            for (dt_request *r = c->active, *nx; r; r = nx) {
                nx = r->next;
                if (st == DT_OK && !r->treq.done && now >= r->deadline) {
                    dt_error(DT_ETIMEDOUT,
                             "%s rank %d tag %d (%zu bytes) timed out: the peer never posted the "
                             "matching %s; raise %s (seconds) if it is only slow",
                             r->kind == RQ_SEND ? "send to" : "recv from", r->root, r->tag, r->treq.bytes,
                             r->kind == RQ_SEND ? "recv" : "send", c->timeout_knob);
                    dt_comm_fail(c, DT_ETIMEDOUT);
                    st = DT_ETIMEDOUT;
                }
                if (st != DT_OK || r->treq.done) {
                    drop_active(c, r);
                    finish(c, r, st == DT_OK ? DT_OK : st);
                }
            }
            pthread_cond_broadcast(&c->cv);
            continue;
        }
        if (c->stop && !c->qhead && !c->active) break;
        pthread_cond_wait(&c->cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

dt_status dt_comm_submit(dt_comm *c, dt_request *r, dt_request **out) {
    *out = NULL;
    if (!c->t) { /* single process: complete at once */
        dt_status st = dt_comm_exec(c, r);
        finish(c, r, st);
        *out = r;
        return DT_OK;
    }
    if (!c->thread_started) {
        int e = pthread_create(&c->thread, NULL, progress_main, c);
        if (e != 0) {
            free(r);
            return dt_error(DT_ENOMEM, "cannot start the communicator's progress thread: %s", strerror(e));
        }
        c->thread_started = true;
    }
    pthread_mutex_lock(&c->mu);
    r->next = NULL;
    if (c->qtail) c->qtail->next = r;
    else c->qhead = r;
    c->qtail = r;
    if (c->idling && c->t->ops->wake) c->t->ops->wake(c->t);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    *out = r;
    return DT_OK;
}

void dt_comm_stop_thread(dt_comm *c) {
    if (!c->thread_started) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    if (c->idling && c->t->ops->wake) c->t->ops->wake(c->t);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    c->thread_started = false;
}

/* ---- requests ---- */

static dt_status req_result(dt_request **req) {
    dt_request *r = *req;
    dt_status st = r->status;
    if (st != DT_OK) {
        dt_error(st, "%s", r->msg);
        dt_error_set_peer(r->peer);
    }
    free(r->tmp);
    free(r);
    *req = NULL;
    return st;
}

dt_status dt_request_wait(dt_request **req) {
    if (!req || !*req) return DT_OK;
    dt_request *r = *req;
    dt_comm *c = r->c;
    if (!r->done) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += (time_t)(c->timeout_s * 2 + 30); /* the op has its own deadline; this is a backstop */
        pthread_mutex_lock(&c->mu);
        int e = 0;
        while (!r->done && e != ETIMEDOUT) e = pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        pthread_mutex_unlock(&c->mu);
        if (!r->done)
            return dt_error(DT_ETIMEDOUT, "request did not finish within twice the timeout; it stays allocated");
    }
    return req_result(req);
}

dt_status dt_request_test(dt_request **req, bool *done) {
    *done = true;
    if (!req || !*req) return DT_OK;
    dt_request *r = *req;
    if (r->c->thread_started) {
        pthread_mutex_lock(&r->c->mu);
        *done = r->done;
        pthread_mutex_unlock(&r->c->mu);
    } else {
        *done = r->done;
    }
    return *done ? req_result(req) : DT_OK;
}

dt_status dt_request_waitall(dt_request **reqs, int n) {
    dt_status first = DT_OK;
    char msg[512] = "";
    for (int i = 0; i < n; i++) {
        dt_status st = dt_request_wait(&reqs[i]);
        if (st != DT_OK && first == DT_OK) {
            first = st;
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    return first == DT_OK ? DT_OK : dt_error(first, "%s", msg);
}
