/* Parameter server (--strategy ps): layout and connections (see ps.h) and the worker side. A
 * worker trains on its shard of the data (the loader's rank/world are its index/count among the
 * workers), and after each backward pass clips its full gradient, pushes each server its slice
 * and receives the servers' current parameters, which may be held back by the staleness bound
 * (stale-synchronous parallel). There is no barrier among the workers. The servers apply the
 * optimizer with exactly the float operations of dt_optim_step on the whole slab (it is
 * element-wise and every shard's optimizer counts the same steps), so one worker with staleness
 * 0 trains bit for bit like a single process. By default the workers own no shard: server 0's
 * answer names the next batch to train (dynamic assignment, ps.h), so a slow worker trains
 * fewer; with fixed_shards each owns 1/W of every epoch and SSP counts its own steps. With
 * overlap (--ps-overlap) the exchange runs on a worker thread while the next batch trains (ps.h).
 * On a device whose memory the comm does not take (dt_strategy_stage_device) a worker clips on the
 * device, downloads its gradient into a host send buffer and uploads the parameters it pulls from a
 * host staging buffer; the servers keep host memory (ps_server.c says why). */
#include "parallel/ps.h"

#include "device/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pairing: round k of max(S, W) splits joins each server with a different worker. */
static int partner(const ps_state *p, int round, bool server, int idx) {
    if (p->S <= p->W) {
        if (server) return (idx + round) % p->W;
        int i = ((idx - round) % p->W + p->W) % p->W;
        return i < p->S ? i : -1;
    }
    if (!server) return (idx + round) % p->S;
    int j = ((idx - round) % p->S + p->S) % p->S;
    return j < p->W ? j : -1;
}

static dt_status ps_init(dt_strategy *s) {
    ps_state *p = s->impl;
    dt_comm *c = s->comm;
    DT_TRY(dt_strategy_verify_replicas(c, s->model));
    const bool server = p->me < p->S;
    const int idx = server ? p->me : p->me - p->S;
    /* one split per round; the pair's color is the server index, the server is pair rank 0 */
    const int rounds = p->S > p->W ? p->S : p->W;
    for (int k = 0; k < rounds; k++) {
        int other = partner(p, k, server, idx);
        int color = other < 0 ? DT_COMM_UNDEFINED : server ? idx : other;
        dt_comm *pc = NULL;
        dt_status st = dt_comm_split(c, color, server ? 0 : 1, &pc);
        if (st != DT_OK) return dt_error_wrap(st, "ps: connecting servers and workers");
        if (pc) p->pair[other] = pc;
    }
    if (p->S > 1) {
        dt_status st = dt_comm_split(c, server ? 0 : DT_COMM_UNDEFINED, p->me, &p->servers);
        if (st != DT_OK) return dt_error_wrap(st, "ps: connecting the servers");
    }
    return DT_OK;
}

static void ps_begin(dt_strategy *s, int64_t step) { s->step = step; }

static void ps_ready(dt_strategy *s, size_t off, size_t n) { (void)s, (void)off, (void)n; }

static dt_status server_error(const ps_state *p, int i, dt_status st, const char *what) {
    return dt_error_wrap(st, "ps worker rank %d: %s server rank %d", p->me, what, i);
}

/* One exchange with every server: the headers p->push[] and gradient g go out, then (dynamic,
 * S > 1) the pull requests naming the unit server 0 handed out, and the answers come into
 * p->reply[] and the parameters w. Both sides make the same calls in the same order (ps.h). */
static dt_status exchange(ps_state *p, const float *g, float *w, int64_t step) {
    for (int i = 0; i < p->S; i++) {
        dt_status r = dt_comm_broadcast(p->pair[i], &p->push[i], sizeof p->push[i], DT_U8, 1);
        if (r == DT_OK) r = dt_comm_broadcast(p->pair[i], (void *)(g + p->lo[i]), p->lo[i + 1] - p->lo[i], DT_F32, 1);
        if (r != DT_OK) return server_error(p, i, r, "pushing to");
    }
    for (int i = 0; i < p->S; i++) {
        dt_status r = DT_OK;
        const ps_reply *r0 = &p->reply[0];
        if (i > 0 && p->dynamic && (r0->seq >= 0 || r0->bye || r0->later)) { /* name the next unit */
            ps_push pull = {.step = step, .n = PS_N_PULL, .seq = r0->seq};
            if ((r = dt_comm_broadcast(p->pair[i], &pull, sizeof pull, DT_U8, 1)) != DT_OK)
                return server_error(p, i, r, "asking");
        }
        r = dt_comm_broadcast(p->pair[i], &p->reply[i], sizeof p->reply[i], DT_U8, 0);
        if (r == DT_OK) r = dt_comm_broadcast(p->pair[i], w + p->lo[i], p->lo[i + 1] - p->lo[i], DT_F32, 0);
        if (r != DT_OK) return server_error(p, i, r, "pulling from");
    }
    return DT_OK;
}

/* Dynamic: nothing left to train: say goodbye to every server. */
static dt_status goodbye(ps_state *p, int64_t step) {
    for (int i = 0; i < p->S; i++) {
        ps_push bye = {.step = step, .n = PS_N_BYE, .seq = -1};
        ps_reply ack; /* the server took it: leaving now cannot look like a failure */
        dt_status e = dt_comm_broadcast(p->pair[i], &bye, sizeof bye, DT_U8, 1);
        if (e == DT_OK) e = dt_comm_broadcast(p->pair[i], &ack, sizeof ack, DT_U8, 0);
        if (e != DT_OK) return server_error(p, i, e, "saying goodbye to");
    }
    return DT_OK;
}

/* The push headers of this step (version: of the parameters the gradient was computed on). */
static void fill_push(dt_strategy *s, ps_state *p, float lr) {
    for (int i = 0; i < p->S; i++)
        p->push[i] = (ps_push){.step = s->step,
                               .epoch = s->cur.epoch,
                               .version = p->version[i],
                               .n = s->cur.n,
                               .lr = lr,
                               .loss_sum = s->cur.loss_sum,
                               .busy_s = s->cur.busy_s,
                               .wait_s = p->last_wait,
                               .seq = p->dynamic ? p->seq : -1};
}

/* Push the gradient slices, then take every server's answer into the parameters. */
static dt_status ps_step_blocking(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    ps_state *p = s->impl;
    memset(st, 0, sizeof *st);
    float *g = dt_model_grads(s->model), *w = dt_model_params(s->model);
    if (clip > 0) s->cur.grad_norm = dt_optim_clip_grad_norm(s->optim, g, p->P, clip); /* on its device */
    double t0 = dt_now();
    fill_push(s, p, lr);
    if (p->dev) { /* staged: the gradient goes out of, the parameters come into, host buffers */
        p->dev->ops->download(p->dev, p->gsend, g, p->P * sizeof(float));
        DT_TRY(exchange(p, p->gsend, p->wstage, s->step));
        p->dev->ops->upload(p->dev, w, p->wstage, p->P * sizeof(float));
    } else DT_TRY(exchange(p, g, w, s->step));
    for (int i = 0; i < p->S; i++) p->version[i] = p->reply[i].version;
    if (p->dynamic) {
        const ps_reply *r = &p->reply[0];
        p->seq = r->seq, p->next_epoch = r->epoch, p->next_unit = r->unit;
        if (r->bye) DT_TRY(goodbye(p, s->step + 1));
    }
    st->comm_wait_s = p->last_wait = dt_now() - t0;
    st->buckets = p->S;
    return DT_OK;
}

/* ---- overlap: the exchange runs on a thread of the worker (ps.h) ---- */
static void *exchange_main(void *arg) {
    ps_state *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->busy && !p->quit) pthread_cond_wait(&p->cv, &p->mu);
        if (!p->busy) break;
        pthread_mutex_unlock(&p->mu);
        dt_status st = exchange(p, p->gsend, p->wstage, p->xstep);
        pthread_mutex_lock(&p->mu);
        p->xst = st;
        if (st != DT_OK) snprintf(p->xmsg, sizeof p->xmsg, "%s", dt_last_error()); /* the message is per thread */
        p->busy = false;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Waits until no exchange is in flight. */
static void exchange_wait(ps_state *p) {
    pthread_mutex_lock(&p->mu);
    while (p->busy) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* Takes the answer of the finished exchange: staged parameters into the model, the unit handed out. */
static dt_status exchange_take(dt_strategy *s, ps_state *p) {
    if (p->xst != DT_OK) return dt_error(p->xst, "%s", p->xmsg);
    dt_dev *d = dt_model_device(s->model); /* the cpu device's upload is a memcpy */
    d->ops->upload(d, dt_model_params(s->model), p->wstage, p->P * sizeof(float));
    for (int i = 0; i < p->S; i++) p->version[i] = p->reply[i].version;
    const ps_reply *r = &p->reply[0];
    if (r->seq >= 0) { /* each answer hands out at most one; the worker holds at most one more */
        if (p->nheld >= 2)
            return dt_error(DT_EMISMATCH,
                            "ps worker rank %d: server 0 handed out unit %lld while this worker holds "
                            "two (`ps_overlap` protocol)",
                            p->me, (long long)r->seq);
        p->held[p->nheld][0] = r->seq, p->held[p->nheld][1] = r->epoch, p->held[p->nheld][2] = r->unit;
        p->nheld++;
    }
    p->bye = r->bye != 0;
    return DT_OK;
}

static dt_status exchange_start(ps_state *p, const float *g, int64_t step) {
    if (!p->thread_started) {
        if (pthread_create(&p->thread, NULL, exchange_main, p) != 0)
            return dt_error(DT_ENOMEM, "ps worker rank %d: cannot start the exchange thread (`ps_overlap`)", p->me);
        p->thread_started = true;
    }
    p->mdev->ops->download(p->mdev, p->gsend, g, p->P * sizeof(float)); /* the next backward overwrites g */
    pthread_mutex_lock(&p->mu);
    p->xstep = step, p->xst = DT_OK, p->busy = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return DT_OK;
}

dt_status dt_ps_worker_drain(dt_strategy *s) {
    ps_state *p = s->impl;
    if (!p || !p->overlap || !p->inflight) return DT_OK;
    exchange_wait(p);
    p->inflight = false;
    return exchange_take(s, p);
}

/* Overlap: wait for the previous exchange, take its answer, start this step's in the background
 * and go on with a unit held ahead; with none held, wait for this answer too (blocking). */
static dt_status ps_step_overlap(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    ps_state *p = s->impl;
    memset(st, 0, sizeof *st);
    float *g = dt_model_grads(s->model);
    if (clip > 0) s->cur.grad_norm = dt_optim_clip_grad_norm(s->optim, g, p->P, clip); /* on its device */
    if (!p->first_done) { /* the unit ahead the worker starts with (seq W + w), from first_unit */
        p->first_done = true;
        if (p->next_unit >= 0) {
            p->held[0][0] = p->seq + p->W, p->held[0][1] = p->next_epoch, p->held[0][2] = p->next_unit;
            p->nheld = 1;
        }
    }
    double t0 = dt_now();
    if (p->inflight) exchange_wait(p);
    fill_push(s, p, lr); /* before the staged parameters come in: the version the gradient saw */
    if (p->inflight) {
        p->inflight = false;
        DT_TRY(exchange_take(s, p));
    }
    DT_TRY(exchange_start(p, g, s->step));
    p->inflight = true;
    if (p->nheld == 0) DT_TRY(dt_ps_worker_drain(s)); /* nothing held ahead: blocking */
    if (p->nheld > 0) {
        p->seq = p->held[0][0], p->next_epoch = p->held[0][1], p->next_unit = p->held[0][2];
        p->held[0][0] = p->held[1][0], p->held[0][1] = p->held[1][1], p->held[0][2] = p->held[1][2];
        p->nheld--;
    } else {
        p->seq = -1, p->next_epoch = -1, p->next_unit = -1;
        if (p->bye) DT_TRY(goodbye(p, s->step + 1));
    }
    st->comm_wait_s = p->last_wait = dt_now() - t0;
    st->buckets = p->S;
    return DT_OK;
}

static dt_status ps_step(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    ps_state *p = s->impl;
    return p->overlap ? ps_step_overlap(s, lr, clip, st) : ps_step_blocking(s, lr, clip, st);
}

static void ps_destroy(dt_strategy *s) {
    ps_state *p = s->impl;
    if (!p) return;
    if (p->thread_started) { /* drain the exchange in flight (its answer is not needed), then stop */
        pthread_mutex_lock(&p->mu);
        while (p->busy) pthread_cond_wait(&p->cv, &p->mu);
        p->quit = true;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    if (p->overlap) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
    }
    dt_free(p->gsend);
    dt_free(p->wstage);
    if (p->pair)
        for (int i = 0; i < (p->me < p->S ? p->W : p->S); i++) dt_comm_destroy(p->pair[i]);
    dt_comm_destroy(p->servers);
    free(p->pair);
    free(p->lo);
    free(p->push);
    free(p->reply);
    free(p->version);
    free(p);
    s->impl = NULL;
}

static dt_status ps_serve(dt_strategy *s, const dt_serve_config *cfg) { return dt_ps_serve(s, cfg); }

/* Dynamic assignment: worker w trains seq w first and (overlap) holds seq W + w ahead. */
static void ps_first_unit(dt_strategy *s, const dt_unit_plan *plan, int64_t *epoch, int64_t *unit) {
    ps_state *p = s->impl;
    const int w = p->me - p->S;
    dt_ps_seq_unit(w, plan->epoch, plan->unit, plan->units_per_epoch, epoch, unit);
    p->next_epoch = -1, p->next_unit = -1;
    if (p->overlap) {
        dt_ps_seq_unit(p->W + w, plan->epoch, plan->unit, plan->units_per_epoch, &p->next_epoch, &p->next_unit);
        if (p->next_epoch >= plan->epochs) p->next_epoch = -1, p->next_unit = -1;
    }
}

static void ps_next_unit(dt_strategy *s, int64_t *epoch, int64_t *unit) {
    const ps_state *p = s->impl;
    *epoch = p->next_epoch, *unit = p->next_unit;
}

/* fixed shards: the workers take their shard of the loader's order; dynamic: the servers hand out */
static const dt_strategy_ops ps_ops = {.name = "ps",
                                       .init = ps_init,
                                       .begin_step = ps_begin,
                                       .grad_ready = ps_ready,
                                       .step = ps_step,
                                       .destroy = ps_destroy,
                                       .serve = ps_serve};
static const dt_strategy_ops ps_dynamic_ops = {.name = "ps",
                                               .init = ps_init,
                                               .begin_step = ps_begin,
                                               .grad_ready = ps_ready,
                                               .step = ps_step,
                                               .destroy = ps_destroy,
                                               .serve = ps_serve,
                                               .first_unit = ps_first_unit,
                                               .next_unit = ps_next_unit};

static dt_status ps_create(dt_strategy *s, const void *opts) {
    const ps_opts *o = opts;
    const int size = dt_comm_size(s->comm), me = dt_comm_rank(s->comm);
    int drank, dworld;
    DT_TRY(dt_strategy_data_part(&dt_strategy_ps_entry, o, me, size, &drank, &dworld));
    if (dt_model_num_buffers(s->model) > 0)
        return dt_error(DT_ENOTSUP, "`strategy` ps does not keep model buffers (batchnorm running statistics) on the "
                                    "servers: use a model without batchnorm, or `strategy` ddp/localsgd");
    DT_TRY(dt_strategy_ps_entry.check(o)); /* also for options not made by dt_strategy_parse */
    ps_state *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ENOMEM, "ps: out of memory");
    p->S = size - dworld, p->W = dworld, p->me = me;
    p->staleness = o->staleness;
    p->dynamic = !o->fixed_shards;
    p->overlap = o->overlap;
    p->next_epoch = -1, p->next_unit = -1;
    if (p->overlap) {
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->cv, NULL);
    }
    p->seq = me - p->S; /* dynamic: worker w trains seq w first */
    p->P = dt_model_num_params(s->model);
    p->dev = dt_strategy_stage_device(s->comm, s->model);
    p->mdev = dt_model_device(s->model);
    p->lo = calloc((size_t)p->S + 1, sizeof *p->lo);
    p->pair = calloc((size_t)(p->S > p->W ? p->S : p->W), sizeof *p->pair);
    p->push = calloc((size_t)p->S, sizeof *p->push);
    p->reply = calloc((size_t)p->S, sizeof *p->reply);
    p->version = calloc((size_t)p->S, sizeof *p->version);
    const bool worker = me >= p->S;
    if ((p->overlap || p->dev) && worker) {
        p->gsend = dt_alloc(p->P * sizeof(float) + 1);
        p->wstage = dt_alloc(p->P * sizeof(float) + 1);
    }
    s->impl = p;
    if (!p->lo || !p->pair || !p->push || !p->reply || !p->version ||
        ((p->overlap || p->dev) && worker && (!p->gsend || !p->wstage))) {
        ps_destroy(s);
        return dt_error(DT_ENOMEM, "ps: out of memory");
    }
    for (int i = 0; i <= p->S; i++) p->lo[i] = (size_t)((unsigned __int128)p->P * (unsigned)i / (unsigned)p->S);
    s->ops = p->dynamic ? &ps_dynamic_ops : &ps_ops;
    s->role = me < p->S ? DT_ROLE_SERVER : DT_ROLE_WORKER;
    s->data_rank = drank, s->data_world = dworld;
    s->job_rank0 = p->S;
    s->local_mean = true;
    return DT_OK;
}

/* ---- options: "ps(servers=S,staleness=S|inf,shards=dynamic|fixed,overlap=0|1)" ---- */
static void ps_defaults(void *opts) { *(ps_opts *)opts = (ps_opts){.servers = 1, .staleness = -1}; }

/* A whole number in [lo, hi]. */
static bool whole(const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    *out = strtol(v, &end, 10);
    return !errno && !*end && end != v && *out >= lo && *out <= hi;
}

static dt_status ps_set(void *opts, const char *key, const char *value) {
    ps_opts *o = opts;
    long v;
    if (!strcmp(key, "servers")) {
        if (!whole(value, -1000000, 1000000, &v))
            return dt_error(DT_EINVAL, "`strategy` ps: servers=%s: not a whole number of ranks", value);
        o->servers = (int)v;
    } else if (!strcmp(key, "staleness")) {
        if (!strcmp(value, "inf") || !strcmp(value, "async")) o->staleness = -1;
        else if (whole(value, 0, 1000000, &v)) o->staleness = (int)v;
        else
            return dt_error(DT_EINVAL,
                            "`strategy` ps: staleness=%s: not a whole number of batches (use staleness=S, "
                            "0 = synchronous, or staleness=inf)",
                            value);
    } else if (!strcmp(key, "shards")) {
        if (strcmp(value, "fixed") && strcmp(value, "dynamic"))
            return dt_error(DT_EINVAL,
                            "`strategy` ps: shards=%s: use shards=dynamic (server 0 hands out the batches, "
                            "the default) or shards=fixed (each worker owns 1/N of every epoch)",
                            value);
        o->fixed_shards = !strcmp(value, "fixed");
    } else { /* overlap */
        if (strcmp(value, "0") && strcmp(value, "1") && strcmp(value, "true") && strcmp(value, "false"))
            return dt_error(DT_EINVAL, "`strategy` ps: overlap=%s: use overlap=1 or overlap=0", value);
        o->overlap = !strcmp(value, "1") || !strcmp(value, "true");
    }
    return DT_OK;
}

static dt_status ps_check(const void *opts) {
    const ps_opts *o = opts;
    if (o->servers < 1)
        return dt_error(DT_EINVAL, "`strategy` ps: servers=%d: need at least 1 (e.g. ps(servers=1))", o->servers);
    if (o->overlap && (o->fixed_shards || o->staleness >= 0))
        return dt_error(DT_EINVAL,
                        "`strategy` ps: overlap=1 needs shards=dynamic and staleness=inf (it adds a step "
                        "of staleness that a bound does not count): use %s, or drop overlap",
                        o->fixed_shards ? "shards=dynamic" : "staleness=inf");
    return DT_OK;
}

static int ps_servers(const void *opts) { return ((const ps_opts *)opts)->servers; }

static void ps_format(const void *opts, char *out, size_t cap) {
    const ps_opts *o = opts;
    char st[16] = "inf";
    if (o->staleness >= 0) snprintf(st, sizeof st, "%d", o->staleness);
    snprintf(out, cap, "servers=%d,staleness=%s,shards=%s,overlap=%d", o->servers, st,
             o->fixed_shards ? "fixed" : "dynamic", o->overlap ? 1 : 0);
}

const dt_strategy_entry dt_strategy_ps_entry = {
    .name = "ps",
    .options = "servers=S,staleness=S|inf,shards=dynamic|fixed,overlap=0|1",
    .help = "parameter server: the first S ranks hold the parameters, the workers push gradients and pull them, "
            "at most S global batches ahead of the slowest (inf: asynchronous); shards=dynamic: server 0 hands out "
            "the batches (a slow worker trains fewer); overlap=1: push and pull while the next batch trains",
    .keys = "servers, staleness, shards, overlap",
    .opts_size = sizeof(ps_opts),
    .defaults = ps_defaults,
    .set = ps_set,
    .check = ps_check,
    .create = ps_create,
    .servers = ps_servers,
    .format = ps_format,
    .needs_comm = true,
    .device_neutral = true};
