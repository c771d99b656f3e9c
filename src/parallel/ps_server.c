/* Parameter server, server side: one handler thread per worker blocks on that worker's pair
 * communicator, applies each pushed gradient slice to the shard with the shard's own optimizer
 * (under the shard lock) and answers with the current slice once the staleness bound allows:
 * a worker about to start step c is answered only when c - (slowest live worker's clock) <= s.
 * With s = 0 that is synchronous training; s < 0 never waits (fully asynchronous).
 *
 * A worker whose pair fails (it died, left or timed out) is dropped: its clock no longer holds
 * the others back, and server 0 reports "worker rank R died at step N; continuing with K
 * workers". The serving thread meanwhile waits for epoch ends: once every live worker's clock has
 * passed an epoch's last step, each server copies its shard and server 0 assembles the model (and
 * optimizer state) into the strategy's model and reports the epoch (loss, per-worker figures, a
 * histogram of gradient staleness, the largest clock gap granted).
 *
 * Dynamic assignment (p->dynamic, see ps.h): server 0 hands out the units in its answers (a
 * dropped worker's unit is handed out again) and every server ends an epoch once all its units
 * were pushed; workers leave with a goodbye header. Each server keeps the set of units it has
 * (done_lo: every seq below it is in); a bounded staleness s holds a unit back while it is more
 * than s rounds (of W units) ahead of done_lo: server 0 before handing it out, servers > 0
 * before answering the pull request that names it. A unit a dead worker held is handed out
 * again by server 0; a server > 0 counts it as in (lost with the worker) so nothing waits for it.
 * With overlap each worker holds up to two units (two pending slots; ps.h says how they flow).
 * The hand-out and the bookkeeping of dynamic assignment are in ps_assign.c.
 *
 * On a device (--device other than cpu) a server still keeps its shard, its optimizer and the
 * workers' gradient slices in host memory and steps on the CPU: it is a host process answering W
 * handler threads under one lock, each push arrives in and each answer leaves from host buffers of
 * the transport, so a device shard would cost an upload and a download per push for one
 * element-wise update. Only the strategy's model (and optimizer) is on the device: the shard is
 * downloaded from it at start, and server 0 uploads the assembled model at each epoch end. The
 * checked device runs the CPU kernels, so its results equal cpu's. */
#include "parallel/ps_server.h"

#include "device/device.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STOP_WAIT_S 10.0 /* after a stop, how long to wait for the workers to leave */

static int64_t min_live(const server *sv) {
    int64_t m = INT64_MAX;
    for (int w = 0; w < sv->p->W; w++)
        if (sv->alive[w] && !sv->bye[w] && sv->clock[w] < m) m = sv->clock[w];
    return m;
}

static void add_note(server *sv, const char *fmt, int64_t a, int64_t b, int64_t c) {
    if (sv->nnotes < PS_MAX_NOTES) snprintf(sv->notes[sv->nnotes++], sizeof sv->notes[0], fmt, a, b, c);
}

/* A worker's pair failed: drop it (with the lock held). */
static void drop(server *sv, int w, dt_status st) {
    if (!sv->alive[w]) return;
    sv->alive[w] = false;
    sv->nlive--;
    for (int k = 0; sv->p->dynamic && k < dt_ps_slots(sv); k++) {
        int64_t q = sv->pending[w * 2 + k];
        if (q < 0) continue;
        if (sv->idx == 0) sv->requeue[sv->nrequeue++] = q; /* its units go to other workers */
        else dt_ps_unit_in(sv, q);                         /* nothing waits for it here (see the top) */
        sv->pending[w * 2 + k] = -1;
    }
    pthread_cond_broadcast(&sv->cv);
    if (sv->stopping) return; /* leaving after a stop is expected */
    const char *how = st == DT_ETIMEDOUT ? "timed out" : strstr(dt_last_error(), "left") ? "left" : "died";
    char fmt[128];
    snprintf(fmt, sizeof fmt, "worker rank %%lld %s at step %%lld; continuing with %%lld worker%s", how,
             sv->nlive == 1 ? "" : "s");
    add_note(sv, fmt, (int64_t)(sv->p->S + w), sv->clock[w], sv->nlive);
}

/* A push header from worker w is checked against what the server knows before anything in it
 * is used: a hostile or corrupted header (a version from the future, a step behind the worker's
 * clock, more samples than a batch, an epoch or unit outside the run) drops that worker, not the server. */
dt_status dt_ps_push_check(const server *sv, int w, const ps_push *m) {
    const ps_state *p = sv->p;
    const char *bad = NULL;
    if (m->n < 0 || m->n > sv->cfg->batch) bad = "sample count";
    else if (m->version < 0 || m->version > sv->version) bad = "model version";
    else if (m->step < sv->clock[w] || m->step >= sv->total) bad = "step";
    else if (m->epoch < sv->ep0 || m->epoch - sv->ep0 >= sv->nep) bad = "epoch";
    else if (!(m->lr >= 0.0f) || m->lr > 1e30f) bad = "learning rate";
    else if (!p->dynamic && m->seq != -1) bad = "unit";
    else if (p->dynamic && m->seq != -1 && /* bounded first: the epoch of a huge seq overflows */
             (m->seq < 0 || m->seq >= sv->nep * sv->units || dt_ps_seq_epoch(sv, m->seq) >= sv->nep))
        bad = "unit";
    if (!bad) return DT_OK;
    return dt_error(DT_EFORMAT,
                    "ps server rank %d: worker rank %d sent a push with an impossible %s (step %lld, version %lld "
                    "of %lld, n %d, unit %lld); dropping it",
                    p->me, p->S + w, bad, (long long)m->step, (long long)m->version, (long long)sv->version, m->n,
                    (long long)m->seq);
}

/* Books a checked push of worker w (its optimizer step already applied when m->n > 0): staleness,
 * the epoch's figures, the unit it trained, its clock. With the lock held. */
void dt_ps_push_record(server *sv, int w, const ps_push *m) {
    const ps_state *p = sv->p;
    int64_t stale = sv->version - m->version;
    sv->stale[stale < DT_STALENESS_BINS - 1 ? stale : DT_STALENESS_BINS - 1]++;
    if (m->n > 0) sv->version++;
    int64_t e = m->epoch - sv->ep0;
    if (e >= 0 && e < sv->nep) {
        sv->loss_sum[e] += m->loss_sum;
        sv->samples[e] += m->n;
        sv->wsamples[e * p->W + w] += m->n;
        sv->wbusy[e * p->W + w] += m->busy_s;
        sv->wait[e] += m->wait_s;
        sv->pushes[e]++;
    }
    if (p->dynamic && m->seq >= 0) {
        dt_ps_unit_in(sv, m->seq);
        if (dt_ps_release(sv, w, m->seq)) sv->wunits[w]++;
    }
    sv->clock[w] = m->step + 1;
    pthread_cond_broadcast(&sv->cv);
}

static void *handler_main(void *arg) {
    handler *h = arg;
    server *sv = h->sv;
    ps_state *p = sv->p;
    dt_comm *c = p->pair[h->w];
    const int w = h->w;
    const int64_t total = sv->total;
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        bool done = sv->clock[w] >= total || !sv->alive[w];
        pthread_mutex_unlock(&sv->mu);
        if (done) break;
        ps_push m;
        dt_status st = dt_comm_broadcast(c, &m, sizeof m, DT_U8, 1);
        if (st == DT_OK && m.n >= 0) st = dt_comm_broadcast(c, h->grad, sv->n, DT_F32, 1); /* n < 0: goodbye */
        if (st == DT_OK && m.n < 0 && m.n != PS_N_BYE)
            st = dt_error(DT_EMISMATCH, "ps server rank %d: worker rank %d sent n = %d where a push or goodbye belongs",
                          p->me, p->S + w, m.n);
        pthread_mutex_lock(&sv->mu);
        if (st != DT_OK) {
            drop(sv, w, st);
            pthread_mutex_unlock(&sv->mu);
            break;
        }
        if (m.n < 0) { /* dynamic: the worker is done; acknowledge, so that its leaving is not a failure */
            sv->bye[w] = true;
            pthread_cond_broadcast(&sv->cv);
            pthread_mutex_unlock(&sv->mu);
            ps_reply ack = {.version = -1, .seq = -1, .epoch = -1, .unit = -1, .bye = 1};
            if ((st = dt_comm_broadcast(c, &ack, sizeof ack, DT_U8, 0)) != DT_OK) {
                pthread_mutex_lock(&sv->mu);
                drop(sv, w, st);
                pthread_mutex_unlock(&sv->mu);
            }
            break;
        }
        if ((st = dt_ps_push_check(sv, w, &m)) != DT_OK) {
            drop(sv, w, st);
            pthread_mutex_unlock(&sv->mu);
            break;
        }
        if (m.n > 0) dt_optim_step(sv->opt, sv->w, h->grad, m.lr);
        dt_ps_push_record(sv, w, &m);
        int64_t clk = sv->clock[w];
        /* fixed shards, stale-synchronous: hold the answer while this worker is too far ahead of
         * the slowest (dynamic: dt_ps_assign() and dt_ps_pull() hold it instead) */
        while (!p->dynamic && p->staleness >= 0 && clk < total && clk - min_live(sv) > p->staleness && !sv->stopping)
            pthread_cond_wait(&sv->cv, &sv->mu);
        int64_t lo = min_live(sv);
        if (!p->dynamic && clk < total && !sv->stopping && clk - lo > sv->max_gap) sv->max_gap = (int)(clk - lo);
        ps_reply r = {.seq = -1, .epoch = -1, .unit = -1};
        if (p->dynamic && sv->idx == 0) dt_ps_assign(sv, w, clk, &r);
        else if (p->dynamic && clk < total && (st = dt_ps_pull(sv, w)) != DT_OK) {
            drop(sv, w, st);
            pthread_mutex_unlock(&sv->mu);
            break;
        }
        r.version = sv->version;
        memcpy(h->out, sv->w, sv->n * sizeof(float));
        pthread_mutex_unlock(&sv->mu);
        st = dt_comm_broadcast(c, &r, sizeof r, DT_U8, 0);
        if (st == DT_OK) st = dt_comm_broadcast(c, h->out, sv->n, DT_F32, 0);
        if (st != DT_OK) {
            pthread_mutex_lock(&sv->mu);
            drop(sv, w, st);
            pthread_mutex_unlock(&sv->mu);
            break;
        }
    }
    pthread_mutex_lock(&sv->mu);
    sv->running--;
    pthread_cond_broadcast(&sv->cv);
    pthread_mutex_unlock(&sv->mu);
    return NULL;
}

static void flush_notes(server *sv) {
    for (int i = 0; i < sv->nnotes; i++)
        if (sv->idx == 0 && sv->cfg->on_note) sv->cfg->on_note(sv->cfg->ctx, sv->notes[i]);
    sv->nnotes = 0;
}

/* n floats of host memory src into the strategy's model or optimizer memory dst (its device's). */
static void to_model(const ps_state *p, float *dst, const float *src, size_t n) {
    p->mdev->ops->upload(p->mdev, dst, src, n * sizeof(float)); /* the cpu device's is a memcpy */
}

/* n floats of the strategy's model or optimizer memory src into host memory dst. */
static void from_model(const ps_state *p, float *dst, const float *src, size_t n) {
    p->mdev->ops->download(p->mdev, dst, src, n * sizeof(float));
}

/* Server 0: server i's shard of n floats (tag) into model memory dst: received in place, or on a
 * staged device into host memory tmp and uploaded. */
static dt_status recv_shard(const ps_state *p, float *dst, float *tmp, size_t n, int i, int tag) {
    if (!p->dev) return dt_comm_recv(p->servers, dst, n, DT_F32, i, tag);
    DT_TRY(dt_comm_recv(p->servers, tmp, n, DT_F32, i, tag));
    to_model(p, dst, tmp, n);
    return DT_OK;
}

/* Server 0's part of assemble: its own snapshot, then every other server's shard. */
static dt_status assemble_root(server *sv, const float *snap, float **snap_state, int nstate, float *tmp) {
    ps_state *p = sv->p;
    float *full = dt_model_params(sv->s->model);
    const bool opt = sv->cfg->want_optim;
    to_model(p, full + sv->lo, snap, sv->n);
    for (int k = 0; opt && k < nstate; k++)
        to_model(p, dt_optim_state(sv->s->optim, k, NULL) + sv->lo, snap_state[k], sv->n);
    for (int i = 1; i < p->S; i++) {
        size_t lo = p->lo[i], n = p->lo[i + 1] - p->lo[i];
        DT_TRY(recv_shard(p, full + lo, tmp, n, i, PS_TAG_SHARD));
        for (int k = 0; opt && k < nstate; k++)
            DT_TRY(recv_shard(p, dt_optim_state(sv->s->optim, k, NULL) + lo, tmp, n, i, PS_TAG_SHARD + 1 + k));
    }
    if (opt) dt_optim_set_steps(sv->s->optim, dt_optim_steps(sv->opt));
    return DT_OK;
}

/* Assembles params (and optimizer state) on server 0 from every server's snapshot. */
static dt_status assemble(server *sv, float *snap, float **snap_state, int nstate) {
    ps_state *p = sv->p;
    const bool opt = sv->cfg->want_optim;
    if (sv->idx != 0) {
        DT_TRY(dt_comm_send(p->servers, snap, sv->n, DT_F32, 0, PS_TAG_SHARD));
        for (int k = 0; opt && k < nstate; k++)
            DT_TRY(dt_comm_send(p->servers, snap_state[k], sv->n, DT_F32, 0, PS_TAG_SHARD + 1 + k));
        return DT_OK;
    }
    float *tmp = NULL; /* staged: the largest shard of another server, received on the host */
    if (p->dev && p->S > 1 && !(tmp = dt_alloc((p->P / (size_t)p->S + 1) * sizeof(float))))
        return dt_error(DT_ENOMEM, "ps server: out of memory for a host buffer of a shard");
    dt_status st = assemble_root(sv, snap, snap_state, nstate, tmp);
    dt_free(tmp);
    return st;
}

static void wait_until(server *sv, double until) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double d = until - dt_now();
    if (d < 0) d = 0;
    ts.tv_sec += (time_t)d;
    ts.tv_nsec += (long)((d - (double)(time_t)d) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&sv->cv, &sv->mu, &ts);
}

/* A copy of the shard's weights (and optimizer state) for assemble; under the lock. */
static void snapshot(server *sv, float *snap, float **state, int nstate) {
    memcpy(snap, sv->w, sv->n * sizeof(float));
    for (int k = 0; k < nstate && sv->cfg->want_optim; k++)
        memcpy(state[k], dt_optim_state(sv->opt, k, NULL), sv->n * sizeof(float));
}

/* Waits, under the lock, for the end of the epoch with books e: every live worker past step end, or
 * (dynamic) `need` units in, no worker left, or out of memory; reports progress meanwhile. True when
 * a stop (SIGTERM) ended the wait. */
static bool wait_epoch_end(server *sv, int64_t e, int64_t end, int64_t need) {
    const dt_serve_config *cfg = sv->cfg;
    const bool dyn = sv->p->dynamic;
    double next_progress = dt_now() + cfg->progress_s;
    bool stop = false;
    /* the stop is read first: the workers leave at a stop, and a serving thread woken only by
     * the last one leaving (nlive 0) must still take it for the stop, not for "all are gone" */
    while (!(stop = cfg->stop && *cfg->stop) && sv->nlive > 0 && min_live(sv) < end &&
           !(dyn && sv->units_done[e] >= need) && !sv->oom) {
        wait_until(sv, next_progress);
        flush_notes(sv); /* short callbacks (a line each) run under the lock */
        if (dt_now() >= next_progress) {
            next_progress = dt_now() + cfg->progress_s;
            if (sv->idx == 0 && cfg->on_progress)
                cfg->on_progress(cfg->ctx, min_live(sv) < INT64_MAX ? min_live(sv) : end, sv->samples[e],
                                 sv->loss_sum[e]);
        }
    }
    return stop;
}

/* A stop (SIGTERM reaches every rank: the workers finish their step and leave). Answers them at once
 * (no staleness wait), then takes the model once every handler is done (or after STOP_WAIT_S for a
 * worker that did not get the signal). Called with the lock held; releases it. DT_EINTR, or the
 * assembly's error. */
static dt_status take_stop(server *sv, float *snap, float **state, int nstate) {
    ps_state *p = sv->p;
    const dt_serve_config *cfg = sv->cfg;
    const int W = p->W;
    sv->stopping = true;
    pthread_cond_broadcast(&sv->cv);
    double give_up = dt_now() + STOP_WAIT_S;
    while (sv->running > 0 && dt_now() < give_up) wait_until(sv, give_up);
    int64_t at = 0;
    for (int w = 0; w < W; w++) at = sv->clock[w] > at ? sv->clock[w] : at;
    int64_t stop_ep = 0, stop_in = 0;
    if (p->dynamic && sv->idx == 0) dt_ps_seq_position(sv, sv->done_lo, &stop_ep, &stop_in);
    for (int w = 0; w < W; w++) sv->alive[w] = false;
    sv->nlive = 0;
    pthread_cond_broadcast(&sv->cv);
    snapshot(sv, snap, state, nstate);
    pthread_mutex_unlock(&sv->mu);
    dt_status st = DT_OK;
    /* one server holds the whole model: hand it to the trainer for the interrupt checkpoint */
    if (p->S == 1 && cfg->stopped_step && (st = assemble(sv, snap, state, nstate)) == DT_OK) {
        *cfg->stopped_step = at;
        if (p->dynamic && cfg->stopped_epoch) *cfg->stopped_epoch = stop_ep, *cfg->stopped_in_epoch = stop_in;
    }
    return st == DT_OK ? dt_error(DT_EINTR, "ps: stopped by a signal near worker step %lld", (long long)at) : st;
}

/* Epoch ep's report (books e, ended at step end after epoch_s seconds), from the books under the
 * lock (the staleness histogram and the clock gap start afresh); wi (W records) and stale
 * (DT_STALENESS_BINS) are the caller's, pointed to by the report. */
static dt_serve_epoch epoch_report(server *sv, int64_t ep, int64_t e, int64_t end, bool units_in, double epoch_s,
                                   dt_worker_info *wi, int64_t *stale) {
    ps_state *p = sv->p;
    const dt_serve_config *cfg = sv->cfg;
    const int W = p->W;
    const int64_t base = cfg->start_step - cfg->start_step_in_epoch;
    for (int w = 0; w < W; w++) {
        int64_t ns = sv->wsamples[e * W + w];
        wi[w] = (dt_worker_info){.rank = p->S + w,
                                 .samples = ns,
                                 .share = sv->samples[e] > 0 ? (double)ns / (double)sv->samples[e] : 0,
                                 .samples_per_s = epoch_s > 0 ? (double)ns / epoch_s : 0,
                                 .busy_s = sv->wbusy[e * W + w],
                                 .batch = cfg->batch,
                                 .alive = sv->alive[w]};
    }
    memcpy(stale, sv->stale, sizeof sv->stale);
    memset(sv->stale, 0, sizeof sv->stale);
    dt_serve_epoch rep = {.epoch = ep,
                          .step = end,
                          .complete = end == base + (ep - cfg->start_epoch + 1) * cfg->steps_per_epoch,
                          .loss_sum = sv->loss_sum[e],
                          .samples = sv->samples[e],
                          .epoch_s = epoch_s,
                          .nworkers = W,
                          .workers = wi,
                          .staleness = stale,
                          .max_clock_gap = sv->max_gap,
                          .step_in_epoch = -1,
                          .wait_s = sv->wait[e],
                          .pushes = sv->pushes[e]};
    for (int w = 0; w < W; w++) rep.busy_s += sv->wbusy[e * W + w];
    if (p->dynamic) { /* the step: the most steps a worker did; the position: see dt_serve_config */
        rep.step = 0;
        for (int w = 0; w < W; w++) rep.step = sv->clock[w] > rep.step ? sv->clock[w] : rep.step;
        rep.complete = units_in;
        int64_t pe = ep;
        rep.step_in_epoch = 0;
        if (!units_in && sv->idx == 0) dt_ps_seq_position(sv, sv->done_lo, &pe, &rep.step_in_epoch);
    }
    sv->max_gap = 0;
    return rep;
}

/* The serving thread's part: epoch ends, assembly, reports. */
static dt_status epochs(server *sv) {
    ps_state *p = sv->p;
    const dt_serve_config *cfg = sv->cfg;
    const int W = p->W;
    const int64_t base = cfg->start_step - cfg->start_step_in_epoch;
    int nstate = dt_optim_num_states(sv->opt);
    float *snap = dt_alloc(sv->n * sizeof(float) + 1), *state[2] = {NULL, NULL};
    dt_worker_info *wi = calloc((size_t)W, sizeof *wi);
    dt_status st = snap && wi ? DT_OK : dt_error(DT_ENOMEM, "ps server: out of memory");
    for (int k = 0; k < nstate && st == DT_OK; k++)
        if (!(state[k] = dt_alloc(sv->n * sizeof(float) + 1))) st = dt_error(DT_ENOMEM, "ps server: out of memory");
    double t_prev = dt_now();
    const bool dyn = p->dynamic;
    for (int64_t ep = cfg->start_epoch; ep < cfg->epochs && st == DT_OK; ep++) {
        /* dynamic: the units this run trains of the epoch (a resumed one starts the first at unit u0) */
        int64_t need = sv->units - (ep == cfg->start_epoch ? cfg->start_step_in_epoch * W : 0);
        if (need < 0) need = 0;
        int64_t end = base + (ep - cfg->start_epoch + 1) * cfg->steps_per_epoch;
        if (end > sv->total) end = sv->total;
        if (dyn) end = sv->total; /* dynamic: the epoch ends when its units are in (or at max_steps) */
        int64_t e = ep - sv->ep0;
        pthread_mutex_lock(&sv->mu);
        if (wait_epoch_end(sv, e, end, need)) {
            st = take_stop(sv, snap, state, nstate);
            break;
        }
        if (sv->oom) {
            pthread_mutex_unlock(&sv->mu);
            st = dt_error(DT_ENOMEM, "ps server rank %d: out of memory for the units in", p->me);
            break;
        }
        const bool units_in = dyn && sv->units_done[e] >= need;
        if (sv->nlive == 0 && !units_in) {
            flush_notes(sv);
            pthread_mutex_unlock(&sv->mu);
            st = dt_error(DT_EPEER, "ps: all %d workers are gone (died or left) before step %lld", W, (long long)end);
            break;
        }
        snapshot(sv, snap, state, nstate);
        double now = dt_now(), epoch_s = now - t_prev;
        t_prev = now;
        int64_t stale[DT_STALENESS_BINS];
        dt_serve_epoch rep = epoch_report(sv, ep, e, end, units_in, epoch_s, wi, stale);
        flush_notes(sv);
        pthread_mutex_unlock(&sv->mu);
        st = assemble(sv, snap, state, nstate);
        if (st == DT_OK && sv->idx == 0 && cfg->on_epoch) st = cfg->on_epoch(cfg->ctx, &rep);
        if (dyn ? !rep.complete : end >= sv->total) break;
    }
    dt_free(snap);
    for (int k = 0; k < 2; k++) dt_free(state[k]);
    free(wi);
    return st;
}

/* The per-worker and per-epoch books (W = sv->p->W workers, sv->nep epochs), zeroed. */
dt_status dt_ps_books_alloc(server *sv) {
    const size_t W = (size_t)sv->p->W, E = (size_t)sv->nep;
    sv->clock = calloc(W, sizeof *sv->clock);
    sv->alive = calloc(W, sizeof *sv->alive);
    sv->bye = calloc(W, sizeof *sv->bye);
    sv->pending = calloc(W * 2, sizeof *sv->pending);
    sv->requeue = calloc(W * 2, sizeof *sv->requeue);
    sv->wunits = calloc(W, sizeof *sv->wunits);
    sv->units_done = calloc(E, sizeof *sv->units_done);
    sv->loss_sum = calloc(E, sizeof *sv->loss_sum);
    sv->samples = calloc(E, sizeof *sv->samples);
    sv->wsamples = calloc(E * W, sizeof *sv->wsamples);
    sv->wbusy = calloc(E * W, sizeof *sv->wbusy);
    sv->wait = calloc(E, sizeof *sv->wait);
    sv->pushes = calloc(E, sizeof *sv->pushes);
    if (sv->clock && sv->alive && sv->bye && sv->pending && sv->requeue && sv->wunits && sv->units_done &&
        sv->loss_sum && sv->samples && sv->wsamples && sv->wbusy && sv->wait && sv->pushes)
        return DT_OK;
    dt_ps_books_free(sv);
    return dt_error(DT_ENOMEM, "ps server: out of memory");
}

void dt_ps_books_free(server *sv) {
    free(sv->clock), free(sv->alive), free(sv->bye), free(sv->pending), free(sv->requeue), free(sv->wunits);
    free(sv->units_done), free(sv->ahead), free(sv->loss_sum), free(sv->samples), free(sv->wsamples);
    free(sv->wbusy), free(sv->wait), free(sv->pushes);
    sv->clock = NULL, sv->alive = NULL, sv->bye = NULL, sv->pending = sv->requeue = sv->wunits = NULL;
    sv->units_done = sv->ahead = sv->samples = sv->wsamples = sv->pushes = NULL;
    sv->loss_sum = sv->wbusy = sv->wait = NULL;
}

static void server_free(server *sv, handler *h) {
    for (int w = 0; h && w < sv->p->W; w++) {
        dt_free(h[w].grad);
        dt_free(h[w].out);
    }
    free(h);
    dt_optim_destroy(sv->opt);
    dt_free(sv->w);
    dt_ps_books_free(sv);
    pthread_cond_destroy(&sv->cv);
    pthread_mutex_destroy(&sv->mu);
}

dt_status dt_ps_serve(dt_strategy *s, const dt_serve_config *cfg) {
    ps_state *p = s->impl;
    const int W = p->W;
    server sv = {.p = p, .s = s, .cfg = cfg, .idx = p->me};
    sv.lo = p->lo[p->me], sv.n = p->lo[p->me + 1] - p->lo[p->me];
    int64_t end_all = cfg->start_step - cfg->start_step_in_epoch +
                      (cfg->epochs - cfg->start_epoch) * cfg->steps_per_epoch;
    sv.total = cfg->max_steps > 0 && cfg->max_steps < end_all ? cfg->max_steps : end_all;
    if (p->dynamic) { /* a fast worker does more steps than its share: only max_steps bounds them */
        if (cfg->units_per_epoch <= 0)
            return dt_error(DT_EINVAL, "ps server: dynamic assignment needs units_per_epoch");
        sv.total = cfg->max_steps > 0 ? cfg->max_steps : INT64_MAX;
        sv.units = cfg->units_per_epoch;
        sv.next_seq = p->overlap ? 2 * W : W; /* worker w starts with seq w (overlap: and W + w) */
    }
    sv.ep0 = cfg->start_epoch;
    sv.nep = cfg->epochs - cfg->start_epoch > 0 ? cfg->epochs - cfg->start_epoch : 1;
    pthread_mutex_init(&sv.mu, NULL);
    pthread_cond_init(&sv.cv, NULL);
    handler *h = calloc((size_t)W, sizeof *h);
    sv.w = dt_alloc(sv.n * sizeof(float) + 1);
    dt_status st = dt_ps_books_alloc(&sv);
    if (st == DT_OK && (!h || !sv.w)) st = dt_error(DT_ENOMEM, "ps server: out of memory");
    if (st == DT_OK) st = dt_optim_create(&sv.opt, dt_optim_config_of(s->optim), sv.n);
    if (st != DT_OK) {
        server_free(&sv, h);
        return st;
    }
    /* the shard starts from the (identical, verified) replica, a resumed one included */
    from_model(p, sv.w, dt_model_params(s->model) + sv.lo, sv.n);
    for (int k = 0; k < dt_optim_num_states(sv.opt); k++)
        from_model(p, dt_optim_state(sv.opt, k, NULL), dt_optim_state(s->optim, k, NULL) + sv.lo, sv.n);
    dt_optim_set_steps(sv.opt, dt_optim_steps(s->optim));
    sv.version = 0;
    for (int w = 0; w < W; w++) {
        sv.clock[w] = cfg->start_step, sv.alive[w] = true;
        sv.pending[w * 2] = p->dynamic ? w : -1, sv.pending[w * 2 + 1] = -1;
        if (p->dynamic && p->overlap && dt_ps_seq_epoch(&sv, W + w) + sv.ep0 < cfg->epochs)
            sv.pending[w * 2 + 1] = W + w;
    }
    sv.nlive = W;
    for (int w = 0; w < W && st == DT_OK; w++) {
        h[w] = (handler){
            .sv = &sv, .w = w, .grad = dt_alloc(sv.n * sizeof(float) + 1), .out = dt_alloc(sv.n * sizeof(float) + 1)};
        if (!h[w].grad || !h[w].out) st = dt_error(DT_ENOMEM, "ps server: out of memory");
        else if (pthread_create(&h[w].thread, NULL, handler_main, &h[w]) != 0)
            st = dt_error(DT_ENOMEM, "ps server: cannot start a handler thread for worker rank %d", p->S + w);
        else {
            h[w].started = true;
            pthread_mutex_lock(&sv.mu);
            sv.running++;
            pthread_mutex_unlock(&sv.mu);
        }
    }
    if (st == DT_OK) st = epochs(&sv);
    if (st != DT_OK) {
        /* stop waiting on anyone: handlers still blocked on a live worker end at its timeout */
        pthread_mutex_lock(&sv.mu);
        for (int w = 0; w < W; w++) sv.alive[w] = false;
        sv.nlive = 0;
        sv.stopping = true; /* and answer at once: no unit or bound wait holds a handler */
        pthread_cond_broadcast(&sv.cv);
        pthread_mutex_unlock(&sv.mu);
    }
    for (int w = 0; w < W; w++)
        if (h[w].started) pthread_join(h[w].thread, NULL);
    server_free(&sv, h);
    return st;
}
