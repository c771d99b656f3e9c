/* One pipeline step on this stage (pp.h): the rank-batch is cut into M micro-batches, run by the
 * schedule's actions; then the gradients of tensors several stages use are summed over them, each
 * stage's gradients averaged over the DP axis, clipped by the global norm (its squares summed over
 * the stages) and applied by the stage's own optimizer segments.
 *
 * Communication: activations go forward on their own communicator, gradients back on another,
 * tokens and targets (and the loss for the report) between stage 0 and the stages that read them
 * on a third; every send is non-blocking, each receive is posted when its action is next. Each
 * communicator runs its ops in issue order, and on each one every stage issues them in
 * micro-batch order of its direction, so the chains cannot wait on one another in a cycle.
 *
 * Tensor parallel stages (tp > 1): the stage runs its nodes of the rank's GPT shard, whose hooks
 * reduce over the stage's tp axis (tp_hooks.c); the activations crossing a cut are replicated in
 * it, so tp rank j of stage k talks to tp rank j of its neighbours. The ids go into each stage
 * that reads them as they are and are mapped into its vocabulary slice there; the last stage's
 * vocabulary-parallel loss (with the targets stage 0 sent it) is taken when its backward starts.
 *
 * Memory: the model holds the activations of one micro-batch. A micro-batch in flight keeps only
 * its stage input (and the output sent on); its backward recomputes the stage's forward from it
 * unless the model still holds it (GPipe's re-materialisation; batchnorm running statistics are
 * kept across the recomputation).
 *
 * On a device (p->on_dev: its memory is not host memory) the slots stay host buffers, the
 * transport's: an activation is downloaded from the model into its slot to be sent and a received
 * one uploaded into the model, the gradients likewise; each micro-batch's loss is copied into a
 * small device buffer that the last stage downloads once a step; the sums over shared tensors and
 * the DP axis are staged through a host buffer where the comm does not take the device's memory;
 * the norm for --clip comes from the device's squared-norm partial sums. On cpu the same calls are
 * the copies the stage made before (upload and download are memcpy) and nothing else is staged. */
#include "device/device.h"
#include "parallel/pp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-step context. */
typedef struct {
    dt_strategy *s;
    dt_pp *p;
    const dt_step_batch *b;
    int M;
    dt_request **data_req; /* stage 0: the tokens/targets sends, 2 per micro-batch and later stage */
    int ndata;
} step_ctx;

static int mb_lo(const step_ctx *c, int j) { return (int)((int64_t)c->b->feed.n * j / c->M); }
static int mb_n(const step_ctx *c, int j) { return mb_lo(c, j + 1) - mb_lo(c, j); }
static const int32_t *feed_x(const step_ctx *c, int j) {
    return (const int32_t *)c->b->feed.x + (size_t)mb_lo(c, j) * c->p->x_vals;
}
static const int32_t *feed_y(const step_ctx *c, int j) {
    return c->b->feed.y ? (const int32_t *)c->b->feed.y + (size_t)mb_lo(c, j) * c->p->y_vals : NULL;
}

dt_status dt_pp_link_error(const dt_pp *p, dt_status st, const char *what, int mb, int peer) {
    return dt_error_wrap(st, "pipeline stage %d (rank %d): %s of micro-batch %d %s stage %d (rank %d)", p->stage,
                         p->rank, what, mb, strstr(what, "send") ? "to" : "from", peer, dt_pp_world_rank(p, peer));
}

static dt_status grow(void **buf, size_t bytes) {
    void *q = realloc(*buf, bytes ? bytes : 1);
    if (!q) return dt_error(DT_ENOMEM, "pp: out of memory for a micro-batch of %zu bytes", bytes);
    *buf = q;
    return DT_OK;
}

dt_status dt_pp_host_room(dt_pp *p, size_t n) {
    if (n <= p->host_cap) return DT_OK;
    float *h = dt_alloc((n ? n : 1) * sizeof(float));
    if (!h)
        return dt_error(DT_ENOMEM, "pipeline stage %d (rank %d): out of memory for a %zu-float host staging buffer",
                        p->stage, p->rank, n);
    dt_free(p->host);
    p->host = h, p->host_cap = n;
    return DT_OK;
}

typedef struct {
    dt_redop op;
    int peer, tag;
} link_args;

static dt_status allreduce_fn(dt_comm *comm, float *buf, size_t n, void *arg) {
    return dt_comm_allreduce(comm, buf, buf, n, DT_F32, ((const link_args *)arg)->op);
}
static dt_status send_fn(dt_comm *comm, float *buf, size_t n, void *arg) {
    const link_args *a = arg;
    return dt_comm_send(comm, buf, n, DT_F32, a->peer, a->tag);
}
static dt_status recv_fn(dt_comm *comm, float *buf, size_t n, void *arg) {
    const link_args *a = arg;
    return dt_comm_recv(comm, buf, n, DT_F32, a->peer, a->tag);
}

dt_status dt_pp_allreduce_model(dt_pp *p, dt_comm *comm, float *x, size_t n, dt_redop op) {
    link_args a = {.op = op};
    return dt_strategy_staged(comm, p->m, x, n, &p->host, &p->host_cap, DT_STAGE_DOWN | DT_STAGE_UP, allreduce_fn, &a);
}

dt_status dt_pp_send_model(dt_pp *p, dt_comm *comm, const float *x, size_t n, int peer, int tag) {
    link_args a = {.peer = peer, .tag = tag}; /* x is only read (downloaded where staged) */
    return dt_strategy_staged(comm, p->m, (float *)x, n, &p->host, &p->host_cap, DT_STAGE_DOWN, send_fn, &a);
}

dt_status dt_pp_recv_model(dt_pp *p, dt_comm *comm, float *x, size_t n, int peer, int tag) {
    link_args a = {.peer = peer, .tag = tag};
    return dt_strategy_staged(comm, p->m, x, n, &p->host, &p->host_cap, DT_STAGE_UP, recv_fn, &a);
}

/* Waits for a send issued at t0 and records it on lane 1 as "send WHAT mb". */
static dt_status wait_send(step_ctx *c, dt_request **req, double t0, const char *what, int mb) {
    if (!*req) return DT_OK;
    dt_status st = dt_request_wait(req);
    char name[24];
    snprintf(name, sizeof name, "send %s %d", what, mb);
    dt_trace_add(c->s->trace, name, 1, t0, dt_now(), c->s->step);
    return st;
}

/* A free slot for micro-batch j with room for n samples (its earlier gradient send finished). */
static dt_status take_slot(step_ctx *c, int j, int n) {
    dt_pp *p = c->p;
    int i = 0;
    while (i < p->nslots && p->slots[i].used) i++;
    if (i == p->nslots) p->nslots++;
    dt_pp_slot *sl = &p->slots[i];
    dt_status ws = wait_send(c, &sl->req_gout, sl->t_gout, "grad", sl->mb_gout);
    if (ws != DT_OK) return dt_pp_link_error(p, ws, "sending the input gradient", sl->mb_gout, p->stage - 1);
    if (n > sl->cap) {
        const size_t f = sizeof(float), in = (size_t)n * p->in_vals * f, out = (size_t)n * p->out_vals * f;
        DT_TRY(grow((void **)&sl->in, in));
        DT_TRY(grow((void **)&sl->gout, in));
        DT_TRY(grow((void **)&sl->out, out));
        DT_TRY(grow((void **)&sl->gin, out));
        DT_TRY(grow((void **)&sl->x, (size_t)n * p->x_vals * 4));
        DT_TRY(grow((void **)&sl->y, (size_t)n * p->y_vals * 4));
        sl->cap = n;
    }
    const size_t bytes = (size_t)n * (p->in_vals + p->out_vals) * sizeof(float); /* what it keeps in flight */
    if (bytes > p->mb_bytes) p->mb_bytes = bytes;
    sl->used = true;
    p->mb_slot[j] = i;
    return DT_OK;
}

/* Stage 0: every micro-batch's tokens and targets to the later stages that read them. */
static dt_status send_feeds(step_ctx *c) {
    dt_pp *p = c->p;
    for (int j = 0; j < c->M; j++)
        for (int k = 1; k < p->K; k++) {
            const size_t n = (size_t)mb_n(c, j);
            if (p->reads_x[k])
                DT_TRY(dt_comm_isend(p->data, feed_x(c, j), n * p->x_vals, DT_I32, k, 2 * j, &c->data_req[c->ndata++]));
            if (p->reads_y[k] && feed_y(c, j))
                DT_TRY(dt_comm_isend(p->data, feed_y(c, j), n * p->y_vals, DT_I32, k, 2 * j + 1,
                                     &c->data_req[c->ndata++]));
            if (p->reads_x[k] || (p->reads_y[k] && feed_y(c, j)))
                p->bytes_sent += n * 4 *
                                 ((p->reads_x[k] ? p->x_vals : 0) + (p->reads_y[k] && feed_y(c, j) ? p->y_vals : 0));
        }
    return DT_OK;
}

/* Receives (req, then waits) count values into buf; traced on lane 1. */
static dt_status recv_now(step_ctx *c, dt_comm *comm, void *buf, size_t count, dt_dtype dt, int peer, int tag,
                          const char *what, int mb) {
    dt_request *req = NULL;
    const double t0 = dt_now();
    dt_status st = dt_comm_irecv(comm, buf, count, dt, peer, tag, &req);
    if (st == DT_OK) st = dt_request_wait(&req);
    if (st != DT_OK) return dt_pp_link_error(c->p, st, what, mb, peer);
    char name[24];
    const char *kind = strstr(what, "gradient") ? "grad" : strstr(what, "activ") ? "act" : "feed";
    snprintf(name, sizeof name, "recv %s %d", kind, mb);
    dt_trace_add(c->s->trace, name, 1, t0, dt_now(), c->s->step);
    return DT_OK;
}

/* The targets of micro-batch j on this stage: stage 0's own, elsewhere what it received. */
static const int32_t *stage_targets(step_ctx *c, int j) {
    dt_pp *p = c->p;
    if (p->stage == 0) return feed_y(c, j);
    return p->reads_y[p->stage] && c->b->feed.y ? p->slots[p->mb_slot[j]].y : NULL;
}

/* The feed of micro-batch j on this stage: stage 0's own, elsewhere what it received (a tp
 * shard's ids mapped into its vocabulary slice). */
static dt_feed stage_feed(step_ctx *c, int j) {
    dt_pp *p = c->p;
    const dt_pp_slot *sl = &p->slots[p->mb_slot[j]];
    const bool last = p->stage == p->K - 1, reads = p->stage == 0 || p->reads_x[p->stage];
    const void *x = !reads          ? NULL
                    : p->hooks      ? (const void *)dt_tp_hooks_ids(p->hooks, mb_lo(c, j))
                    : p->stage == 0 ? (const void *)feed_x(c, j)
                                    : (const void *)sl->x;
    return (dt_feed){.x = x, .y = last || p->stage > 0 ? stage_targets(c, j) : NULL, .n = mb_n(c, j)};
}

/* Runs this stage's nodes on micro-batch j from its kept input. */
static dt_status run_forward(step_ctx *c, int j) {
    dt_pp *p = c->p;
    dt_model *m = p->m;
    const int n = mb_n(c, j);
    DT_TRY(dt_model_prepare(m, n, true, (uint64_t)(c->b->step * c->M + j)));
    if (p->stage > 0) /* the received activation into the model (cpu: a memcpy) */
        p->dev->ops->upload(p->dev, dt_model_node_buffer(m, p->lo - 1), p->slots[p->mb_slot[j]].in,
                            (size_t)n * p->in_vals * sizeof(float));
    dt_feed f = stage_feed(c, j);
    if (p->hooks) dt_tp_hooks_select(p->hooks, mb_lo(c, j), n);
    DT_TRY(dt_model_forward_nodes(m, &f, p->lo, p->hi));
    if (p->hooks) DT_TRY(dt_tp_hooks_status(p->hooks));
    if (p->seg_of) DT_TRY(dt_pp_zero3_status(p)); /* ZeRO-3: the hooks' parameter gathers */
    p->live = j;
    return DT_OK;
}

static dt_status forward(step_ctx *c, int j) {
    dt_pp *p = c->p;
    dt_model *m = p->m;
    const int n = mb_n(c, j);
    DT_TRY(take_slot(c, j, n));
    dt_pp_slot *sl = &p->slots[p->mb_slot[j]];
    if (p->stage > 0)
        DT_TRY(recv_now(c, p->fwd, sl->in, (size_t)n * p->in_vals, DT_F32, p->stage - 1, j, "receiving the activation",
                        j));
    if (p->reads_x[p->stage]) {
        DT_TRY(recv_now(c, p->data, sl->x, (size_t)n * p->x_vals, DT_I32, 0, 2 * j, "receiving the tokens", j));
        if (p->hooks) DT_TRY(dt_tp_hooks_map(p->hooks, sl->x, mb_lo(c, j), n, c->b->feed.n));
    }
    if (p->reads_y[p->stage] && c->b->feed.y)
        DT_TRY(recv_now(c, p->data, sl->y, (size_t)n * p->y_vals, DT_I32, 0, 2 * j + 1, "receiving the targets", j));
    const double t0 = dt_now();
    DT_TRY(run_forward(c, j));
    char name[24];
    snprintf(name, sizeof name, "F%d", j);
    const double t1 = dt_now();
    dt_trace_add(c->s->trace, name, 0, t0, t1, c->s->step);
    p->busy += t1 - t0;
    if (p->stage == p->K - 1 && p->hooks) {
        /* the vocabulary-parallel loss is taken at the backward, from the activations it needs */
    } else if (p->stage == p->K - 1) { /* the loss of micro-batch j, read after the schedule */
        p->dev->ops->copy(p->dev, p->dloss + j, dt_model_node_values(m, dt_model_loss_node(m)), sizeof(float));
    } else {
        const size_t bytes = (size_t)n * p->out_vals * sizeof(float);
        p->dev->ops->download(p->dev, sl->out, dt_model_node_values(m, p->hi - 1), bytes);
        sl->t_out = dt_now();
        dt_status st = dt_comm_isend(p->fwd, sl->out, (size_t)n * p->out_vals, DT_F32, p->stage + 1, j, &sl->req_out);
        if (st != DT_OK) return dt_pp_link_error(p, st, "sending the activation", j, p->stage + 1);
        p->bytes_sent += (uint64_t)n * p->out_vals * sizeof(float);
    }
    if (++p->inflight > p->peak_inflight) p->peak_inflight = p->inflight;
    return DT_OK;
}

/* The forward again from the kept input, with the model's buffers (running statistics) as they
 * were, so that they are updated once per micro-batch. */
static dt_status recompute(step_ctx *c, int j) {
    dt_pp *p = c->p;
    dt_model *m = p->m;
    const size_t nb = dt_model_num_buffers(m);
    if (nb) p->dev->ops->download(p->dev, p->buf_save, dt_model_buffers(m), nb * sizeof(float));
    dt_status st = run_forward(c, j);
    if (nb) p->dev->ops->upload(p->dev, dt_model_buffers(m), p->buf_save, nb * sizeof(float));
    return st;
}

/* The last stage of tp shards: the vocabulary-parallel loss of micro-batch j (the model holds its
 * activations), added to the step's; *dout its logits' gradient, scaled by share. */
static dt_status shard_loss(step_ctx *c, int j, float share, const float **dout) {
    dt_pp *p = c->p;
    const int n = mb_n(c, j);
    double loss;
    DT_TRY(dt_tp_hooks_loss(p->hooks, stage_targets(c, j), n, share, &loss));
    if (!isfinite(loss))
        return dt_error(DT_EINVAL,
                        "training diverged: loss is %g at step %lld on rank %d (pipeline stage %d); "
                        "lower `lr` or set `clip_norm`",
                        loss, (long long)c->b->step, p->rank, p->stage);
    p->loss_sum += loss * n;
    *dout = dt_tp_hooks_dlogits(p->hooks);
    return DT_OK;
}

/* On a device: the received output gradient (host slot) uploaded into p->dgin for the backward. */
static dt_status upload_gin(dt_pp *p, const float *gin, size_t n) {
    if (n > p->dgin_cap) {
        float *d = p->dev->ops->alloc(p->dev, (n ? n : 1) * sizeof(float));
        if (!d)
            return dt_error_wrap(DT_ENOMEM, "pipeline stage %d (rank %d): the output gradient on device %s", p->stage,
                                 p->rank, p->dev->kind->name);
        p->dev->ops->free(p->dev, p->dgin);
        p->dgin = d, p->dgin_cap = n;
    }
    p->dev->ops->upload(p->dev, p->dgin, gin, n * sizeof(float));
    return DT_OK;
}

static dt_status backward(step_ctx *c, int j) {
    dt_pp *p = c->p;
    dt_model *m = p->m;
    const int n = mb_n(c, j);
    dt_pp_slot *sl = &p->slots[p->mb_slot[j]];
    const bool last = p->stage == p->K - 1;
    if (p->live != j) { /* before the gradient arrives: the recomputation fills the wait */
        const double tr = dt_now();
        DT_TRY(recompute(c, j));
        char rn[24];
        snprintf(rn, sizeof rn, "R%d", j);
        dt_trace_add(c->s->trace, rn, 0, tr, dt_now(), c->s->step);
        p->busy += dt_now() - tr;
    }
    if (!last)
        DT_TRY(recv_now(c, p->bwd, sl->gin, (size_t)n * p->out_vals, DT_F32, p->stage + 1, j,
                        "receiving the output gradient", j));
    const double t0 = dt_now();
    const float share = (float)((double)n * c->b->world / c->b->n_global); /* of the global mean */
    const float *dout = last ? NULL : sl->gin;
    if (!last && p->on_dev) { /* the received gradient into device memory */
        DT_TRY(upload_gin(p, sl->gin, (size_t)n * p->out_vals));
        dout = p->dgin;
    }
    if (p->hooks) {
        if (last) DT_TRY(shard_loss(c, j, share, &dout));
        dt_tp_hooks_select(p->hooks, mb_lo(c, j), n);
    }
    DT_TRY(dt_model_backward_nodes(m, p->lo, p->hi, dout, share, NULL, NULL));
    if (p->hooks) DT_TRY(dt_tp_hooks_status(p->hooks));
    if (p->seg_of) DT_TRY(dt_pp_zero3_status(p));
    char name[24];
    snprintf(name, sizeof name, "B%d", j);
    const double t1 = dt_now();
    dt_trace_add(c->s->trace, name, 0, t0, t1, c->s->step);
    p->busy += t1 - t0;
    if (p->stage > 0) {
        const float *g = dt_model_node_grad(m, p->lo - 1);
        const size_t cnt = (size_t)n * p->in_vals;
        if (g) p->dev->ops->download(p->dev, sl->gout, g, cnt * sizeof(float));
        else memset(sl->gout, 0, cnt * sizeof(float)); /* the host slot: no gradient reached the input */
        sl->t_gout = dt_now(), sl->mb_gout = j;
        dt_status st = dt_comm_isend(p->bwd, sl->gout, cnt, DT_F32, p->stage - 1, j, &sl->req_gout);
        if (st != DT_OK) return dt_pp_link_error(p, st, "sending the input gradient", j, p->stage - 1);
        p->bytes_sent += cnt * sizeof(float);
    }
    dt_status st = wait_send(c, &sl->req_out, sl->t_out, "act", j);
    if (st != DT_OK) return dt_pp_link_error(p, st, "sending the activation", j, p->stage + 1);
    sl->used = false;
    p->inflight--;
    return DT_OK;
}

/* Runs the schedule of this stage over the step's micro-batches. */
static dt_status run_schedule(step_ctx *c) {
    dt_pp *p = c->p;
    dt_pp_schedule(p->o.schedule, p->stage, p->K, c->M, p->acts);
    if (p->stage == 0 && p->K > 1) DT_TRY(send_feeds(c));
    if (p->stage == 0 && p->hooks && c->b->feed.n > 0)
        DT_TRY(dt_tp_hooks_map(p->hooks, c->b->feed.x, 0, c->b->feed.n, c->b->feed.n));
    for (int i = 0; i < 2 * c->M; i++)
        DT_TRY(p->acts[i].backward ? backward(c, p->acts[i].mb) : forward(c, p->acts[i].mb));
    for (int i = 0; i < p->nslots; i++) {
        dt_pp_slot *sl = &p->slots[i];
        dt_status st = wait_send(c, &sl->req_gout, sl->t_gout, "grad", sl->mb_gout);
        if (st != DT_OK) return dt_pp_link_error(p, st, "sending the input gradient", sl->mb_gout, p->stage - 1);
    }
    dt_status st = dt_request_waitall(c->data_req, c->ndata);
    c->ndata = 0;
    if (st != DT_OK) return dt_error_wrap(st, "pipeline stage 0 (rank %d): sending tokens and targets", p->rank);
    return DT_OK;
}

/* The last stage: the micro-batches' losses from the device (one download), summed. */
static dt_status sum_losses(step_ctx *c) {
    dt_pp *p = c->p;
    float loss[DT_PP_MAX_MICRO];
    if (p->stage != p->K - 1 || p->hooks || c->M == 0) return DT_OK; /* tp shards: taken at the backward */
    p->dev->ops->download(p->dev, loss, p->dloss, (size_t)c->M * sizeof(float));
    for (int j = 0; j < c->M; j++) {
        if (!isfinite(loss[j]))
            return dt_error(DT_EINVAL,
                            "training diverged: loss is %g at step %lld on rank %d (pipeline stage %d); "
                            "lower `lr` or set `clip_norm`",
                            loss[j], (long long)c->b->step, p->rank, p->stage);
        p->loss_sum += (double)loss[j] * mb_n(c, j);
    }
    return DT_OK;
}

/* The step's loss sum from the last stage to stage 0 (which reports it). */
static dt_status pass_loss(step_ctx *c) {
    dt_pp *p = c->p;
    DT_TRY(sum_losses(c));
    if (p->K == 1) return DT_OK;
    dt_status st = DT_OK;
    if (p->stage == p->K - 1) st = dt_comm_send(p->data, &p->loss_sum, 1, DT_F64, 0, DT_COMM_TAG_MAX);
    else if (p->stage == 0) st = dt_comm_recv(p->data, &p->loss_sum, 1, DT_F64, p->K - 1, DT_COMM_TAG_MAX);
    if (st != DT_OK)
        return dt_pp_link_error(p, st, p->stage == 0 ? "receiving the loss" : "sending the loss", -1,
                                p->stage ? 0 : p->K - 1);
    return DT_OK;
}

bool dt_pp_in_norm(const dt_pp *p, int t) {
    const dt_param_info *ti = dt_model_tensor(p->m, t);
    return !ti->is_buffer && dt_pp_owner_stage(p, t) == p->stage && (p->users[t] >> p->stage & 1) &&
           (!p->hooks || dt_tp_in_norm(p->m, ti->name, p->tr));
}

/* The gradients of this stage over the DP axis: averaged in place (one allreduce per segment),
 * or under ZeRO-2 reduce-scattered into this rank's chunks (pp_zero.c). */
static dt_status dp_average(dt_pp *p, float *g) {
    if (p->DP == 1) return DT_OK;
    if (p->o.zero >= 2) return dt_pp_zero_reduce(p, g);
    for (int q = 0; q < p->nseg; q++) {
        dt_status st = dt_pp_allreduce_model(p, p->dp, g + p->seg[q].lo, p->seg[q].hi - p->seg[q].lo, DT_OP_AVG);
        if (st != DT_OK)
            return dt_error_wrap(st, "pipeline stage %d (rank %d): data-parallel gradient allreduce", p->stage,
                                 p->rank);
    }
    return DT_OK;
}

/* The runs of gradients in this rank's share of the norm (dt_pp_in_norm): one piece per run of
 * such tensors adjacent in the slab (a stage's own tensors are one run unless a tensor it does not
 * count lies between). */
static dt_status stage_norm_pieces(dt_pp *p, float *g, dt_grad_pieces *out) {
    size_t lo = 0, hi = 0;
    for (int t = 0; t < dt_model_num_tensors(p->m); t++) {
        const dt_param_info *ti = dt_model_tensor(p->m, t);
        if (ti->is_buffer || ti->numel == 0) continue; /* not in the parameter slab */
        if (hi > lo && ti->offset == hi && dt_pp_in_norm(p, t)) {
            hi += ti->numel;
            continue;
        }
        DT_TRY(dt_grad_pieces_add(out, g + lo, hi - lo));
        lo = hi = 0;
        if (dt_pp_in_norm(p, t)) lo = ti->offset, hi = lo + ti->numel;
    }
    return dt_grad_pieces_add(out, g + lo, hi - lo);
}

/* Sums the part of the squared norm over the ranks holding the rest: the DP ranks' chunks (ZeRO-2),
 * the other stages, the tp shards. */
static dt_status norm_allreduce(void *ctx, double *ss) {
    const dt_pp *p = ctx;
    if (p->o.zero >= 2 && p->DP > 1) DT_TRY(dt_comm_allreduce(p->dp, ss, ss, 1, DT_F64, DT_OP_SUM));
    if (p->K > 1) DT_TRY(dt_comm_allreduce(p->pp, ss, ss, 1, DT_F64, DT_OP_SUM));
    if (p->tp > 1) DT_TRY(dt_comm_allreduce(p->mesh.tp_comm, ss, ss, 1, DT_F64, DT_OP_SUM));
    return DT_OK;
}

/* --clip: the global norm from every stage's (and tp shard's) part, each tensor once; under
 * ZeRO-2 from every DP rank's chunks (dt_clip_grad_pieces). Scales what the update reads. */
static dt_status clip_grads(dt_pp *p, float *g, float clip, float *norm_out) {
    const bool sharded = p->o.zero >= 2 && p->DP > 1;
    dt_grad_pieces norm = {0}, upd = {0};
    dt_status st = sharded ? dt_pp_zero_norm_pieces(p, &norm) : stage_norm_pieces(p, g, &norm);
    for (int q = 0; st == DT_OK && q < p->nseg; q++) {
        const dt_pp_segment *sg = &p->seg[q];
        st = sharded ? dt_grad_pieces_add(&upd, p->gsh + sg->gat, sg->zlen)
                     : dt_grad_pieces_add(&upd, g + sg->lo, sg->hi - sg->lo);
    }
    const dt_clip_spec c = {.dev = p->dev,
                            .dev_ss = p->on_dev ? p->dss : NULL,
                            .nss = 1,
                            .norm = norm.p,
                            .nnorm = norm.n,
                            .scale = upd.p,
                            .nscale = upd.n,
                            .reduce = norm_allreduce,
                            .reduce_ctx = p};
    if (st == DT_OK) st = dt_clip_grad_pieces(&c, clip, norm_out);
    dt_grad_pieces_free(&norm), dt_grad_pieces_free(&upd);
    return st;
}

/* Sums the gradients of tensors that several stages use, averages over DP, clips, updates. */
static dt_status update(step_ctx *c) {
    dt_pp *p = c->p;
    dt_model *m = p->m;
    float *g = dt_model_grads(m), *w = dt_model_params(m);
    for (int t = 0; p->K > 1 && t < dt_model_num_tensors(m); t++) {
        const dt_param_info *ti = dt_model_tensor(m, t);
        if (ti->is_buffer || !p->share[t]) continue; /* one user, or not used here */
        dt_status st = dt_pp_allreduce_model(p, p->share[t], g + ti->offset, ti->numel, DT_OP_SUM);
        if (st != DT_OK)
            return dt_error_wrap(st,
                                 "pipeline stage %d (rank %d): summing the gradient of %s shared by "
                                 "stages",
                                 p->stage, p->rank, ti->name);
        p->bytes_sent += ti->numel * sizeof(float);
    }
    DT_TRY(dp_average(p, g));
    if (p->DP > 1 && dt_model_num_buffers(m))
        DT_TRY(dt_strategy_broadcast_model(p->dp, m, dt_model_buffers(m), dt_model_num_buffers(m), 0));
    if (c->b->clip > 0) DT_TRY(clip_grads(p, g, c->b->clip, &c->s->cur.grad_norm));
    if (p->o.zero && p->DP > 1) /* each DP rank its chunk (ZeRO-2: of the reduced shard) */
        DT_TRY(dt_pp_zero_update(p, w, p->o.zero >= 2 ? NULL : g, c->b->lr));
    else
        for (int q = 0; q < p->nseg; q++) dt_optim_step(p->seg[q].opt, w + p->seg[q].lo, g + p->seg[q].lo, c->b->lr);
    p->updates++;
    return DT_OK;
}

dt_status dt_pp_train_step(dt_strategy *s, const dt_step_batch *b, dt_step_result *r) {
    dt_pp *p = s->impl;
    const double t0 = dt_now();
    memset(r, 0, sizeof *r);
    s->ops->begin_step(s, b->step);
    if (p->o.zero >= 2 && p->DP > 1) DT_TRY(dt_pp_zero_reacquire(p)); /* the reduce left them zero, given back */
    else dt_model_zero_grad(p->m);
    step_ctx *c = calloc(1, sizeof *c);
    if (!c) return dt_error(DT_ENOMEM, "pp: out of memory");
    c->s = s, c->p = p, c->b = b;
    c->M = b->feed.n < p->o.microbatches ? b->feed.n : p->o.microbatches;
    if (!(c->data_req = calloc((size_t)(2 * c->M * p->K + 1), sizeof *c->data_req))) {
        free(c);
        return dt_error(DT_ENOMEM, "pp: out of memory");
    }
    p->loss_sum = 0, p->busy = 0, p->live = -1, p->inflight = 0;
    dt_status st = run_schedule(c);
    const double t1 = dt_now();
    /* the bubble of this step (the run's first step, which allocates, is left out when there are more) */
    if (st == DT_OK && t1 > t0 && c->M > 0) {
        if (p->bubble_steps == 1 && !p->bubble_warm) p->bubble_sum = 0, p->bubble_steps = 0, p->bubble_warm = true;
        p->bubble_sum += 1.0 - p->busy / (t1 - t0), p->bubble_steps++;
    }
    if (st == DT_OK) st = pass_loss(c);
    double busy = dt_now() - t0;
    if (st == DT_OK && b->compute_done) busy += b->compute_done(b->ctx, b->feed.n, busy);
    const double tu = dt_now();
    if (st == DT_OK) st = update(c);
    dt_trace_add(s->trace, "update", 0, tu, dt_now(), b->step);
    if (st != DT_OK) dt_request_waitall(c->data_req, c->ndata);
    free(c->data_req);
    free(c);
    DT_TRY(st);
    /* stage 0 (its tp rank 0) reports the pipeline's samples and loss once (the trainer sums ranks' figures) */
    const bool reports = p->stage == 0 && p->tr == 0;
    r->n = reports ? b->feed.n : 0;
    r->loss_sum = reports ? p->loss_sum : 0;
    s->cur.n = r->n, s->cur.loss_sum = r->loss_sum, s->cur.busy_s = busy;
    r->compute_s = dt_now() - t0;
    return DT_OK;
}
