/* Parameter server (--strategy ps): layout and connections (see ps.h) and the worker side. A
 * worker trains on its shard of the data (the loader's rank/world are its index/count among the
 * workers), and after each backward pass clips its full gradient, pushes each server its slice
 * and receives the servers' current parameters, which may be held back by the staleness bound
 * (stale-synchronous parallel). There is no barrier among the workers. The servers apply the
 * optimizer with exactly the float operations of dt_optim_step on the whole slab (it is
 * element-wise and every shard's optimizer counts the same steps), so one worker with staleness
 * 0 trains bit for bit like a single process. By default the workers own no shard: server 0's
 * answer names the next batch to train (dynamic assignment, ps.h), so a slow worker trains
 * fewer; with fixed_shards each owns 1/W of every epoch and SSP counts its own steps. */
#include "dist/ps.h"

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
    DT_TRY(dt_dist_verify_replicas(c, s->model));
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

/* Push the gradient slices, then take every server's answer into the parameters. */
static dt_status ps_step(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    ps_state *p = s->impl;
    memset(st, 0, sizeof *st);
    float *g = dt_model_grads(s->model), *w = dt_model_params(s->model);
    if (clip > 0) dt_clip_grad_norm(g, p->P, clip);
    double t0 = dt_now();
    for (int i = 0; i < p->S; i++) {
        p->push[i] = (ps_push){.step = s->step, .epoch = s->cur.epoch, .version = p->version[i], .n = s->cur.n,
                               .lr = lr, .loss_sum = s->cur.loss_sum, .busy_s = s->cur.busy_s,
                               .seq = p->dynamic ? p->seq : -1};
        dt_status r = dt_comm_broadcast(p->pair[i], &p->push[i], sizeof p->push[i], DT_U8, 1);
        if (r == DT_OK) r = dt_comm_broadcast(p->pair[i], g + p->lo[i], p->lo[i + 1] - p->lo[i], DT_F32, 1);
        if (r != DT_OK) return server_error(p, i, r, "pushing to");
    }
    for (int i = 0; i < p->S; i++) {
        dt_status r = DT_OK;
        if (i > 0 && p->dynamic && (p->reply[0].seq >= 0 || p->reply[0].bye)) {  /* name the next unit */
            ps_push pull = {.step = s->step, .n = PS_N_PULL, .seq = p->reply[0].seq};
            if ((r = dt_comm_broadcast(p->pair[i], &pull, sizeof pull, DT_U8, 1)) != DT_OK)
                return server_error(p, i, r, "asking");
        }
        r = dt_comm_broadcast(p->pair[i], &p->reply[i], sizeof p->reply[i], DT_U8, 0);
        if (r == DT_OK) r = dt_comm_broadcast(p->pair[i], w + p->lo[i], p->lo[i + 1] - p->lo[i], DT_F32, 0);
        if (r != DT_OK) return server_error(p, i, r, "pulling from");
        p->version[i] = p->reply[i].version;
    }
    if (p->dynamic) {
        const ps_reply *r = &p->reply[0];
        p->seq = r->seq, s->next_epoch = r->epoch, s->next_unit = r->unit;
        for (int i = 0; r->bye && i < p->S; i++) {  /* nothing left: say goodbye to every server */
            ps_push bye = {.step = s->step + 1, .n = PS_N_BYE, .seq = -1};
            ps_reply ack;  /* the server took it: leaving now cannot look like a failure */
            dt_status e = dt_comm_broadcast(p->pair[i], &bye, sizeof bye, DT_U8, 1);
            if (e == DT_OK) e = dt_comm_broadcast(p->pair[i], &ack, sizeof ack, DT_U8, 0);
            if (e != DT_OK) return server_error(p, i, e, "saying goodbye to");
        }
    }
    st->comm_wait_s = dt_now() - t0;
    st->buckets = p->S;
    return DT_OK;
}

static void ps_destroy(dt_strategy *s) {
    ps_state *p = s->impl;
    if (!p) return;
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

static const dt_strategy_ops ps_ops = {"ps", ps_init, ps_begin, ps_ready, ps_step, ps_destroy, NULL, ps_serve};

dt_status dt_strategy_ps_create(dt_strategy *s, const dt_strategy_config *cfg) {
    const int size = dt_comm_size(s->comm), me = dt_comm_rank(s->comm);
    int drank, dworld;
    DT_TRY(dt_strategy_data_part("ps", cfg, me, size, &drank, &dworld));
    if (dt_model_num_buffers(s->model) > 0)
        return dt_error(DT_ENOTSUP, "--strategy ps does not keep model buffers (batchnorm running statistics) on the "
                                    "servers: use a model without batchnorm, or --strategy ddp/localsgd");
    ps_state *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ENOMEM, "ps: out of memory");
    p->S = size - dworld, p->W = dworld, p->me = me;
    p->staleness = cfg->staleness;
    p->dynamic = !cfg->fixed_shards;
    p->seq = me - p->S;  /* dynamic: worker w trains seq w first */
    p->P = dt_model_num_params(s->model);
    p->lo = calloc((size_t)p->S + 1, sizeof *p->lo);
    p->pair = calloc((size_t)(p->S > p->W ? p->S : p->W), sizeof *p->pair);
    p->push = calloc((size_t)p->S, sizeof *p->push);
    p->reply = calloc((size_t)p->S, sizeof *p->reply);
    p->version = calloc((size_t)p->S, sizeof *p->version);
    s->impl = p;
    if (!p->lo || !p->pair || !p->push || !p->reply || !p->version) {
        ps_destroy(s);
        return dt_error(DT_ENOMEM, "ps: out of memory");
    }
    for (int i = 0; i <= p->S; i++) p->lo[i] = (size_t)((unsigned __int128)p->P * (unsigned)i / (unsigned)p->S);
    s->ops = &ps_ops;
    s->role = me < p->S ? DT_ROLE_SERVER : DT_ROLE_WORKER;
    s->data_rank = drank, s->data_world = dworld;
    s->job_rank0 = p->S;
    s->local_mean = true;
    s->dynamic = p->dynamic;
    return DT_OK;
}
