/* Tensor parallelism (Megatron-LM), strategy "tp(tp=K,pp=1,bucket_mb=MB)" or --tp K (with pp=P > 1
 * the pipeline of P stages of shards, pp.h / pp_tp.c): every rank
 * of a tensor-parallel group holds its shard of the model (dt_model_create_tp_shard; the marks its
 * builder set, dt_model_mark_tp, tell tp_shard.c how each tensor splits and tp_hooks.c where the
 * collectives go) and they run each layer together. A GPT:
 *  - a block's attention is split by heads (column-parallel c_attn, row-parallel c_proj) and its
 *    MLP likewise (column-parallel c_fc, row-parallel c_proj). Each half does one allreduce forward
 *    (g: the row-parallel output's partial sums) and one backward (f: the gradient of the
 *    replicated input of the column-parallel layer): four per block per step, b*s*h values each;
 *  - the token embedding and the tied head are split by vocabulary rows: the embedding's lookups
 *    outside the rank's slice are zeros and one allreduce sums them; the head's logits stay on
 *    their rank and the vocabulary-parallel cross-entropy (tp_xent.c) reduces only row maxima and
 *    sums, one allreduce of the head's input gradient backward.
 * A sequential model's marked linear -> elementwise -> linear pairs run as the GPT's MLP; its
 * row-parallel output is whole on every rank, so the shard's own loss node runs (own_loss_step).
 * The collectives run in the graph's after-forward and after-backward node hooks (tp_hooks.c; nn/
 * knows no communication), the same hooks a pipeline stage of shards runs. The remaining ranks of the world are data
 * parallel: the mesh (mesh.h) splits the world into tp and dp communicators and an inner ddp averages the shards'
 * gradients over the dp axis. Memory: a rank holds only its shards (4P/K with Adam, plus the replicated small tensors)
 * from set-up on: the trainer places none of the whole model (s->model, tp_place), whose tensors initialise the shards
 * one at a time (dt_tp_scatter), and a resume restores the shards in place (tp_state.c). Evaluation runs on the shards
 * (tp_eval_batch). The whole model is the checkpoint's (and under ZeRO-3 evaluation's): ops->sync places it and gathers
 * the parameters on every rank, the optimizer moments on world rank 0 (which writes the checkpoints); the next step
 * frees that again (streaming instead is not done yet). On a device (dt_model_device of the whole model) the shards,
 * their optimizer and the hooks' buffers are its memory: set-up and sync move them with device calls, the clip takes
 * one squared-norm partial per run of counted tensors (sqnorm), summed across the tp ranks, and the update is the
 * device's. There the whole model stays placed as whole device blocks (a device block is not narrowed). ZeRO-1 and -2
 * over the dp axis run there (tp_zero.c: the packed moments and the gradient shard device blocks); ZeRO-3 is refused
 * there so far. */
#include "nn/graph_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pp.h"
#include "parallel/strategy.h"
#include "parallel/tp.h"
#include "parallel/zero.h"
#include "dtrain/models.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int tp, pp;
    double bucket_mb; /* the inner ddp's buckets over the dp axis */
    int zero;         /* ZeRO stage of the inner ddp over the dp axis (0: replicas; 1-3, tp_zero.c) */
} tp_opts;

typedef struct {
    dt_strategy *s;
    dt_mesh mesh;
    int K, r;
    dt_gpt_config g;
    bool vocab; /* a GPT: vocabulary-parallel embedding, head and loss (else the shard's own loss) */
    dt_model *local;
    dt_optim *lopt;
    dt_strategy *ddp;   /* over the dp axis; NULL with one data-parallel rank */
    dt_tp_hooks *hooks; /* the shard's collectives (tp_hooks.c) */
    dt_status err;      /* a failure of the norm's allreduce inside tp_update */
    bool whole;         /* this rank holds the whole state (world rank 0 after a sync) */
    bool widened;       /* a sync placed the whole model; the next step narrows it to nothing */
    float *whole_m[2];  /* world rank 0: the whole optimizer moments, assembled by sync (the others
                         * hold only their shards: the whole model's own moments are freed);
                         * memory of dev */
    dt_dev *dev;        /* the model's device */
    double *dev_ss;     /* a device double for the clip's partial sums (dev not host memory) */
    uint64_t dp_bytes;  /* what the dp axis moved */
    int zero;           /* the inner ddp's ZeRO stage (0: none, or one dp rank) */
    double bucket_mb;
    dt_tp_zero_part mine; /* with zero: the ranges of the local slab this dp rank's optimizer holds */
} tp;

/* Wraps a failure on the tp axis: its ranks are world ranks (tp rank i = world rank base + i). */
static dt_status tp_fail(const tp *t, dt_status st, const char *what, size_t n) {
    const int base = dt_comm_rank(t->s->comm) - t->r;
    return dt_error_wrap(st, "tensor parallel: %s %zu (tp rank %d of %d; tp rank i is world rank %d+i)", what, n, t->r,
                         t->K, base);
}

/* Sums the shard's part of the squared norm over the tp ranks. */
static dt_status norm_allreduce(void *ctx, double *ss) {
    const tp *t = ctx;
    return t->mesh.tp_comm ? dt_comm_allreduce(t->mesh.tp_comm, ss, ss, 1, DT_F64, DT_OP_SUM) : DT_OK;
}

/* Clips by the norm of the whole gradient (every shard once, replicated tensors from rank 0:
 * dt_clip_grad_pieces over the shard's counted values), then updates the shard. The inner ddp
 * calls it after averaging over the dp axis. */
static void tp_update(void *ctx, float lr, float clip) {
    tp *t = ctx;
    float *g = dt_model_grads(t->local);
    if (clip > 0 && t->err == DT_OK) {
        dt_grad_pieces counted = {0};
        dt_status st = dt_tp_zero_norm_pieces(t->local, t->r, 0, g, dt_model_num_params(t->local), &counted);
        const dt_grad_piece whole = {g, dt_model_num_params(t->local)};
        const dt_clip_spec c = {.dev = t->dev,
                                .dev_ss = t->dev->host_memory ? NULL : t->dev_ss,
                                .nss = 1,
                                .norm = counted.p,
                                .nnorm = counted.n,
                                .scale = &whole,
                                .nscale = 1,
                                .reduce = norm_allreduce,
                                .reduce_ctx = t};
        if (st == DT_OK) st = dt_clip_grad_pieces(&c, clip, &t->s->cur.grad_norm);
        dt_grad_pieces_free(&counted);
        if (st != DT_OK) {
            t->err = tp_fail(t, st, "allreduce of the gradient norm, step", (size_t)t->s->step);
            return;
        }
    }
    dt_optim_step(t->lopt, dt_model_params(t->local), g, lr);
}

/* ZeRO's clip (the inner ddp's shards of the local slab): the values that count in the whole norm. */
static dt_status tp_norm_pieces(void *ctx, size_t off, float *g, size_t n, dt_grad_pieces *out) {
    const tp *t = ctx;
    return dt_tp_zero_norm_pieces(t->local, t->r, off, g, n, out);
}

/* Samples [lo, lo + n) of feed f (x and y as the shard's inputs hold them). */
static dt_feed part_of(const dt_model *m, const dt_feed *f, int lo, int n) {
    const size_t xs = (size_t)dt_model_input_values(m, 0) * DT_FEED_VALUE_BYTES,
                 ys = (size_t)dt_model_input_values(m, 1) * DT_FEED_VALUE_BYTES;
    return (dt_feed){
        .x = (const char *)f->x + (size_t)lo * xs, .y = f->y ? (const char *)f->y + (size_t)lo * ys : NULL, .n = n};
}

/* A shard with its own loss node (no vocabulary-parallel head: the row-parallel output is whole
 * on every rank after its allreduce): forward with the loss, backward from it. */
static dt_status own_loss_step(tp *t, const dt_step_batch *b, int lo, int hi, uint64_t key, float share, bool last,
                               double *loss_sum) {
    const dt_feed f = part_of(t->local, &b->feed, lo, hi - lo);
    float loss;
    const double tf = dt_now();
    DT_TRY(dt_model_run(t->local, &f, true, key, &loss));
    DT_TRY(dt_tp_hooks_status(t->hooks));
    if (!isfinite(loss))
        return dt_error(DT_EINVAL,
                        "training diverged: loss is %g at step %lld on rank %d; lower `lr` or set `clip_norm`", loss,
                        (long long)b->step, dt_comm_rank(t->s->comm));
    *loss_sum += (double)loss * f.n;
    const double tb = dt_now();
    dt_trace_add(t->s->trace, "forward", 0, tf, tb, b->step);
    DT_TRY(dt_model_backward_loss(t->local, share, last && t->ddp ? dt_strategy_grad_hook : NULL, t->ddp));
    DT_TRY(dt_tp_hooks_status(t->hooks));
    dt_trace_add(t->s->trace, "backward", 0, tb, dt_now(), b->step);
    return DT_OK;
}

/* Forward, vocabulary-parallel loss and backward of samples [lo, hi) of the step. */
static dt_status micro_step(tp *t, const dt_step_batch *b, int lo, int hi, uint64_t key, float share, bool last,
                            double *loss_sum) {
    if (!t->vocab) {
        dt_tp_hooks_select(t->hooks, lo, hi - lo);
        return own_loss_step(t, b, lo, hi, key, share, last, loss_sum);
    }
    const int T = t->g.T;
    dt_feed f = {.x = dt_tp_hooks_ids(t->hooks, lo), .y = NULL, .n = hi - lo};
    dt_tp_hooks_select(t->hooks, lo, f.n);
    const double tf = dt_now();
    DT_TRY(dt_model_run(t->local, &f, true, key, NULL));
    DT_TRY(dt_tp_hooks_status(t->hooks));
    double loss;
    const int32_t *y = (const int32_t *)b->feed.y + (size_t)lo * T;
    DT_TRY(dt_tp_hooks_loss(t->hooks, y, f.n, share, &loss));
    if (!isfinite(loss))
        return dt_error(DT_EINVAL,
                        "training diverged: loss is %g at step %lld on rank %d; lower `lr` or set `clip_norm`", loss,
                        (long long)b->step, dt_comm_rank(t->s->comm));
    *loss_sum += loss * f.n;
    const double tb = dt_now();
    dt_trace_add(t->s->trace, "forward", 0, tf, tb, b->step);
    DT_TRY(dt_model_backward(t->local, dt_tp_hooks_dlogits(t->hooks), last && t->ddp ? dt_strategy_grad_hook : NULL,
                             t->ddp));
    DT_TRY(dt_tp_hooks_status(t->hooks));
    dt_trace_add(t->s->trace, "backward", 0, tb, dt_now(), b->step);
    return DT_OK;
}

/* World rank 0's whole moments, freed (device memory, or dt_alloc on host memory). */
static void free_whole_moments(tp *t) {
    for (int k = 0; k < 2; k++) {
        if (t->dev->host_memory) dt_free(t->whole_m[k]);
        else t->dev->ops->free(t->dev, t->whole_m[k]);
        t->whole_m[k] = NULL;
    }
}

/* The whole model back to holding nothing (and world rank 0's whole moments freed) after a sync
 * widened it for evaluation or a checkpoint: between syncs the shards are all a rank holds. */
static void narrow(dt_strategy *s, tp *t) {
    static const dt_range none = {0, 0};
    if (!t->widened) return;
    if (t->dev->host_memory && dt_model_place(s->model, &none, 0) != DT_OK) return; /* a failure: stays whole */
    free_whole_moments(t);
    t->whole = t->widened = false;
}

static dt_status tp_train_step(dt_strategy *s, const dt_step_batch *b, dt_step_result *r) {
    tp *t = s->impl;
    const double t0 = dt_now();
    narrow(s, t);
    const int accum = b->accum > 1 ? b->accum : 1, n = b->feed.n;
    memset(r, 0, sizeof *r);
    s->step = b->step;
    if (t->ddp) t->ddp->ops->begin_step(t->ddp, b->step);
    if (!t->ddp || !t->ddp->grads_zeroed) dt_model_zero_grad(t->local); /* ZeRO-2 leaves them zero */
    dt_tp_hooks_take_comm_s(t->hooks);
    if (n > 0 && t->vocab) DT_TRY(dt_tp_hooks_map(t->hooks, b->feed.x, 0, n, n));
    const float weight = n == 0 ? 1.0f : (float)((double)n * b->world / b->n_global); /* share of the global mean */
    for (int k = 0; k < accum && n > 0; k++) {
        const int lo = (int)((int64_t)n * k / accum), hi = (int)((int64_t)n * (k + 1) / accum);
        if (hi == lo) continue;
        const float share = accum > 1 ? weight * (float)(hi - lo) / (float)n : weight;
        DT_TRY(micro_step(t, b, lo, hi, (uint64_t)(b->step * accum + k), share, k == accum - 1, &r->loss_sum));
    }
    double busy = dt_now() - t0;
    if (b->compute_done) busy += b->compute_done(b->ctx, n, busy);
    /* the ranks of a tp group share their samples: tp rank 0 reports them (the epoch's figures are
     * summed over every rank), as pipeline stage 0 does */
    if (t->r != 0) r->loss_sum = 0;
    s->cur.n = t->r == 0 ? n : 0, s->cur.loss_sum = r->loss_sum, s->cur.busy_s = busy;
    r->n = s->cur.n;
    if (t->ddp) {
        const uint64_t d0 = dt_comm_bytes(t->mesh.dp_comm, NULL);
        t->ddp->cur = s->cur;
        dt_status st = t->ddp->ops->step(t->ddp, b->lr, b->clip, &r->st);
        if (st != DT_OK) /* dp rank j is world rank j*TP*PP + this rank's offset in its model copy */
            return dt_error_wrap(st,
                                 "data-parallel axis of the mesh (dp rank %d of %d; dp rank j is world rank j*%d+%d)",
                                 t->mesh.dp_rank, t->mesh.dp, t->mesh.tp * t->mesh.pp,
                                 dt_comm_rank(s->comm) % (t->mesh.tp * t->mesh.pp));
        t->dp_bytes += dt_comm_bytes(t->mesh.dp_comm, NULL) - d0;
        if (t->ddp->cur.grad_norm == t->ddp->cur.grad_norm) s->cur.grad_norm = t->ddp->cur.grad_norm; /* ZeRO's clip */
    } else {
        tp_update(t, b->lr, b->clip);
    }
    DT_TRY(t->err);
    r->st.comm_wait_s += dt_tp_hooks_take_comm_s(t->hooks); /* the tp collectives block the step as the dp ones do */
    r->compute_s = dt_now() - t0 - r->st.comm_wait_s;
    return DT_OK;
}

static dt_status tp_init(dt_strategy *s) {
    tp *t = s->impl; /* the same shards on every model copy (the whole model holds nothing now) */
    if (t->mesh.dp_comm) DT_TRY(dt_strategy_verify_replicas(t->mesh.dp_comm, t->local));
    if (!t->ddp) return DT_OK;
    DT_TRY(t->ddp->ops->init(t->ddp));
    dt_tp_hooks_chain(t->hooks); /* ZeRO-2's init set the model's node hooks: run ours and its */
    return DT_OK;
}

static void tp_begin(dt_strategy *s, int64_t step) { s->step = step; }
static void tp_ready(dt_strategy *s, size_t off, size_t n) { (void)s, (void)off, (void)n; }

static dt_status tp_step(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    (void)lr, (void)clip;
    memset(st, 0, sizeof *st);
    return dt_error(DT_EINTERNAL, "tensor parallel trains through its own train_step (step %lld)", (long long)s->step);
}

static float *whole_alloc(tp *t, size_t bytes) {
    return t->dev->host_memory ? dt_alloc(bytes) : t->dev->ops->alloc(t->dev, bytes);
}

/* The whole parameters from the shards on every rank (checkpoints; evaluation under ZeRO-3), and
 * the whole optimizer moments on world rank 0 (its tp group gathers them there), which writes the checkpoints. The
 * whole model is placed for it (charged against --mem-limit; streaming is not done yet) and
 * narrowed again at the next step. */
static dt_status tp_sync(dt_strategy *s) {
    tp *t = s->impl;
    const bool saver = dt_comm_rank(s->comm) == 0, group0 = t->mesh.dp_rank == 0 && t->mesh.pp_rank == 0;
    t->widened = true;
    dt_status ws = dt_model_place(s->model, NULL, 0);
    if (ws != DT_OK)
        return dt_error_wrap(ws,
                             "tensor parallel (world rank %d): checkpoints (and with `zero` 3 evaluation) gather "
                             "the whole model on every rank (rank 0 also its optimizer state); run without `save`, "
                             "`save_weights` and `checkpoint_every`, or raise `mem_limit`",
                             dt_comm_rank(s->comm));
    for (int k = 0; saver && k < dt_optim_num_states(t->lopt); k++)
        if (!t->whole_m[k] && !(t->whole_m[k] = whole_alloc(t, dt_model_num_params(s->model) * sizeof(float))))
            return dt_mem_limit_hit()
                       ? dt_error_wrap(DT_ENOMEM, "tensor parallel (world rank 0): checkpoints gather the whole "
                                                  "optimizer state on rank 0; run without `save`, `save_weights` and "
                                                  "`checkpoint_every`, or raise `mem_limit`")
                       : dt_error(DT_ENOMEM, "tensor parallel: out of memory for the whole optimizer state");
    if (t->zero == 3)
        DT_TRY(t->ddp->ops->sync(t->ddp));     /* ZeRO-3: the shard's parameters gathered (until the
                                                * next step's begin_step frees them again) */
    dt_optim *lo = t->lopt, *collected = NULL; /* with ZeRO: dp rank 0 collects the dp axis's shards */
    if (t->zero) DT_TRY(dt_tp_zero_collect(t->mesh.dp_comm, t->local, t->lopt, t->bucket_mb, &collected));
    if (collected) lo = collected;
    dt_status st = dt_tp_gather(t->mesh.tp_comm, s->model, t->local, lo, t->K, group0 ? t->whole_m : NULL);
    dt_optim_destroy(collected);
    DT_TRY(st);
    dt_optim_set_steps(s->optim, dt_optim_steps(t->lopt));
    t->whole = saver;
    return DT_OK;
}

/* Evaluation on the shards (ops->eval_batch): the step's forward without gradients, the
 * vocabulary-parallel loss and argmax; tp rank 0 reports. The whole model is not gathered. */
static dt_status tp_eval_batch(dt_strategy *s, const dt_feed *f, double *loss_sum, int64_t *correct, int64_t *n) {
    tp *t = s->impl;
    if (f->n == 0) return DT_OK; /* the whole tp group has the same samples */
    if (!t->vocab) {             /* the shard's own loss; its output is whole after the row-parallel allreduce */
        float loss;
        dt_tp_hooks_select(t->hooks, 0, f->n);
        DT_TRY(dt_model_run(t->local, f, false, 0, &loss));
        DT_TRY(dt_tp_hooks_status(t->hooks));
        const int64_t c = dt_model_count_correct(t->local, f->y, f->n);
        if (t->r == 0) *loss_sum += (double)loss * f->n, *correct += c, *n += f->n;
        return DT_OK;
    }
    DT_TRY(dt_tp_hooks_map(t->hooks, f->x, 0, f->n, f->n));
    dt_tp_hooks_select(t->hooks, 0, f->n);
    dt_feed lf = {.x = dt_tp_hooks_ids(t->hooks, 0), .y = NULL, .n = f->n};
    DT_TRY(dt_model_run(t->local, &lf, false, 0, NULL));
    DT_TRY(dt_tp_hooks_status(t->hooks));
    double loss;
    int64_t c = 0;
    DT_TRY(dt_tp_hooks_loss(t->hooks, f->y, f->n, 1.0f, &loss));
    DT_TRY(dt_tp_hooks_correct(t->hooks, f->y, f->n, &c));
    if (t->r == 0) *loss_sum += loss * f->n, *correct += c, *n += f->n;
    return DT_OK;
}

/* The state (tp_state.c): the whole on world rank 0 after a sync, else the rank's shards. */
static dt_status tp_visit(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    tp *t = s->impl;
    if (!t->zero || t->whole)
        return dt_tp_visit_state(s->model, t->local, t->lopt, t->K, t->r, t->whole, t->whole_m, fn, ctx);
    /* ZeRO: the shard's pieces through a whole local optimizer holding this dp rank's part */
    dt_optim *w = NULL;
    DT_TRY(dt_tp_zero_expand(t->local, t->lopt, &t->mine, &w));
    dt_status st = dt_tp_visit_state(s->model, t->local, w, t->K, t->r, false, NULL, fn, ctx);
    if (st == DT_OK) dt_tp_zero_pack(t->local, w, t->lopt, &t->mine);
    dt_optim_destroy(w);
    return st;
}

static void tp_destroy(dt_strategy *s) {
    tp *t = s->impl;
    if (!t) return;
    dt_strategy_destroy(t->ddp);
    dt_model_destroy(t->local);
    dt_optim_destroy(t->lopt);
    dt_mesh_free(&t->mesh);
    dt_tp_hooks_destroy(t->hooks);
    dt_tp_zero_part_free(&t->mine);
    if (t->dev) free_whole_moments(t);
    if (t->dev_ss) t->dev->ops->free(t->dev, t->dev_ss);
    free(t);
    s->impl = NULL;
}

static void tp_axis_bytes(dt_strategy *s, uint64_t bytes[3]) {
    const tp *t = s->impl;
    bytes[0] = dt_comm_bytes(t->mesh.tp_comm, NULL);
    bytes[1] = dt_comm_bytes(t->mesh.pp_comm, NULL);
    bytes[2] = dt_comm_bytes(t->mesh.dp_comm, NULL);
}

static const dt_strategy_ops tp_ops = {.name = "tp",
                                       .train_step = tp_train_step,
                                       .init = tp_init,
                                       .begin_step = tp_begin,
                                       .grad_ready = tp_ready,
                                       .step = tp_step,
                                       .destroy = tp_destroy,
                                       .sync = tp_sync,
                                       .visit_state = tp_visit,
                                       .axis_bytes = tp_axis_bytes,
                                       .eval_batch = tp_eval_batch};

void dt_tp_counters_of(const dt_strategy *s, dt_tp_counters *c) {
    memset(c, 0, sizeof *c);
    if (s && s->ops == &tp_ops) {
        const tp *t = s->impl;
        c->dp_bytes = t->dp_bytes;
        dt_tp_hooks_counters(t->hooks, c);
    } else if (s) {
        dt_pp_tp_counters(s, c);
    }
}

/* The shard and its optimizer moved onto the whole model's device t->dev (not host memory). */
static dt_status on_device(tp *t, const tp_opts *o) {
    if (o->zero == 3)
        return dt_error(DT_ENOTSUP,
                        "`device` %s: tp with zero=3 (ZeRO-3 over the mesh's dp axis: its parameter "
                        "shards are host pages given back) does not run on a device yet; use zero=1 or zero=2 there, "
                        "tp x pp (pp=2) with zero=3, or `device` cpu",
                        t->dev->kind->name);
    DT_TRY(dt_model_set_device(t->local, t->dev));
    DT_TRY(dt_optim_set_device(t->lopt, t->dev));
    if (!(t->dev_ss = t->dev->ops->alloc(t->dev, sizeof(double))))
        return dt_error_wrap(DT_ENOMEM, "tensor parallel: the clip's partial sum on device %s", t->dev->kind->name);
    return DT_OK;
}

/* The shard of the whole model s->model for this rank, its optimizer, hooks and the dp axis. */
static dt_status setup(dt_strategy *s, tp *t, const tp_opts *o) {
    DT_TRY(dt_mesh_create(&t->mesh, s->comm, o->tp, o->pp));
    t->K = t->mesh.tp, t->r = t->mesh.tp_rank;
    DT_TRY(dt_model_create_tp_shard(&t->local, s->model, t->K, false));
    DT_TRY(dt_optim_create(&t->lopt, dt_optim_config_of(s->optim), dt_model_num_params(t->local)));
    if (!t->dev->host_memory) DT_TRY(on_device(t, o));
    DT_TRY(dt_tp_scatter(s->model, s->optim, t->local, t->lopt, t->K, t->r));
    /* from here the whole model holds nothing between syncs (the trainer placed none of it unless
     * a sharded checkpoint was restored): its gradients and the whole optimizer's moments are
     * never used, so they are not kept */
    dt_model_release_grads(s->model);
    dt_optim_free_state(s->optim);
    t->widened = true; /* tp x pp (pp > 1) is the pipeline's (pp_tp.c), so here the mesh has pp = 1 */
    narrow(s, t);
    DT_TRY(dt_tp_hooks_create(&t->hooks, t->local, t->vocab ? &t->g : NULL, t->mesh.tp_comm, t->K, t->r,
                              dt_comm_rank(s->comm), s->trace, &s->step));
    if (t->mesh.dp > 1) {
        char spec[96];
        snprintf(spec, sizeof spec, "ddp(bucket_mb=%g,zero=%d%s)", o->bucket_mb, o->zero,
                 o->zero ? "" : ",update=full"); /* tp_update is the update: not ddp's sharded one */
        t->zero = o->zero, t->bucket_mb = o->bucket_mb;
        if (t->zero) DT_TRY(dt_tp_zero_ranges(t->local, o->bucket_mb, t->mesh.dp_rank, t->mesh.dp, &t->mine));
        DT_TRY(dt_strategy_create(&t->ddp, spec, t->mesh.dp_comm, t->local, t->lopt, s->trace));
        t->ddp->update = tp_update, t->ddp->update_ctx = t;
        t->ddp->norm_pieces = tp_norm_pieces, t->ddp->norm_comm = s->comm; /* ZeRO's clip: every shard once */
    }
    s->data_rank = t->mesh.dp_rank, s->data_world = t->mesh.dp;
    s->data_comm = t->mesh.dp_comm;
    return DT_OK;
}

static dt_status tp_create(dt_strategy *s, const void *opts) {
    const tp_opts *o = opts;
    const char *spec = dt_model_spec(s->model);
    const bool gpt = dt_model_spec_is_gpt(spec);
    if (!dt_model_has_tp_marks(s->model))
        return dt_error(DT_EINVAL,
                        "`tp` %d: `model` %s has no node marked for tensor parallelism: its builder marks "
                        "column-parallel, row-parallel and vocabulary-parallel nodes (dt_model_mark_tp); a sequential "
                        "model is split where a linear, elementwise layers (relu, gelu, tanh, sigmoid) and a linear "
                        "follow each other (e.g. \"flatten linear(256) relu linear(10)\"), a GPT always (or use "
                        "`strategy` ddp)",
                        o->tp, spec);
    if (o->pp > 1 && !gpt)
        return dt_error(DT_ENOTSUP,
                        "`strategy` tp: tp x pp (tp=%d, pp=%d) runs a GPT only so far; `model` %s: use "
                        "pp=1",
                        o->tp, o->pp, spec);
    if (o->pp > 1) { /* tp x pp: pipeline stages of shards (pp_tp.c), M = K micro-batches, 1F1B */
        dt_pp_opts po;
        dt_strategy_pp_entry.defaults(&po);
        po.stages = o->pp, po.tp = o->tp;
        if (o->zero) { /* pp's ZeRO over the DP axis (pp_zero.c), which refuses stage 3 */
            char z[4];
            snprintf(z, sizeof z, "%d", o->zero);
            DT_TRY(dt_strategy_pp_entry.set(&po, "zero", z));
        }
        return dt_strategy_pp_entry.create(s, &po);
    }
    tp *t = calloc(1, sizeof *t);
    if (!t) return dt_error(DT_ENOMEM, "tensor parallel: out of memory");
    t->s = s, t->dev = dt_model_device(s->model);
    t->vocab = gpt;
    dt_status st = gpt ? dt_gpt_parse(spec, &t->g) : DT_OK;
    if (st == DT_OK) st = setup(s, t, o);
    s->impl = t;
    if (st != DT_OK) {
        tp_destroy(s);
        return st;
    }
    s->ops = &tp_ops;
    s->evaluates_sharded = t->zero != 3; /* ZeRO-3's forward gathers over the dp axis, whose ranks
                                          * evaluate different numbers of batches: sync gathers it */
    return DT_OK;
}

static void tp_defaults(void *opts) { *(tp_opts *)opts = (tp_opts){.tp = 2, .pp = 1, .bucket_mb = 1.0}; }

static dt_status tp_set(void *opts, const char *key, const char *value) {
    tp_opts *o = opts;
    char *end;
    if (!strcmp(key, "zero")) return dt_zero_parse_stage(value, &o->zero);
    if (!strcmp(key, "bucket_mb")) {
        double v = strtod(value, &end);
        if (*end || end == value || !(v > 0) || !isfinite(v) || v > 1e6)
            return dt_error(DT_EINVAL, "`strategy` tp: bucket_mb=%s: need a size in MB above 0, e.g. bucket_mb=0.5",
                            value);
        o->bucket_mb = v;
        return DT_OK;
    }
    long v = strtol(value, &end, 10);
    if (*end || end == value || v < 1 || v > 4096)
        return dt_error(DT_EINVAL, "`strategy` tp: %s=%s: need a number of ranks from 1 to 4096 (`%s` K)", key, value,
                        key);
    if (!strcmp(key, "tp")) o->tp = (int)v;
    else o->pp = (int)v;
    return DT_OK;
}

static void tp_format(const void *opts, char *out, size_t cap) {
    const tp_opts *o = opts;
    snprintf(out, cap, "tp=%d,pp=%d,bucket_mb=%g%s", o->tp, o->pp, o->bucket_mb, o->zero ? ",zero=" : "");
    if (o->zero) snprintf(out + strlen(out), cap - strlen(out), "%d", o->zero);
}

/* The data part of entry.data_part: the dp axis of the tp x pp mesh (dt_mesh_data_part; a size
 * it does not divide is refused when the strategy is made). */
static void tp_data_part(const void *opts, int rank, int size, int *data_rank, int *data_world) {
    const tp_opts *o = opts;
    dt_mesh_data_part(rank, size, o->tp, o->pp, data_rank, data_world);
}

static void tp_mesh(const void *opts, int *tp, int *pp, int *microbatches, const char **schedule) {
    const tp_opts *o = opts;
    *tp = o->tp, *pp = o->pp, *microbatches = o->pp, *schedule = "1f1b"; /* as the pipeline it makes */
}

/* The placement of entry.place: none of the whole model (its shards live in the local model,
 * initialised tensor by tensor; with pp > 1 a stage's shard holds only the stage's, pp_tp.c). */
static dt_status tp_place(const void *opts, const dt_model *m, int rank, int size, dt_range **own, int *nown,
                          bool *whole) {
    (void)opts, (void)m, (void)rank, (void)size;
    *own = NULL, *nown = 0, *whole = false;
    return DT_OK;
}

/* The memory plan's model part without a pipeline (pp's entry plans tp x pp): every tensor, a tp-th
 * of each that the shards split. */
static dt_status tp_mem_plan(dt_model *m, dt_mem_share *sh) {
    if (sh->tp <= 1 || sh->pp > 1) return DT_OK;
    return dt_mem_part_values(m, 0, dt_model_num_nodes(m), sh->tp, &sh->mine);
}

const dt_strategy_entry dt_strategy_tp_entry = {
    .name = "tp",
    .options = "tp=K,pp=1,bucket_mb=MB,zero=0|1|2|3",
    .help = "Megatron tensor parallel: K ranks per model copy (a GPT, or a model whose builder marks its layers: a "
            "sequential model's linear -> relu -> linear pairs), the other ranks data parallel; --workers N counts "
            "all ranks; mesh order, TP innermost: rank = (dp_i*PP + pp_i)*TP + tp_i; zero=N: ZeRO over the dp axis",
    .keys = "tp,pp,bucket_mb,zero",
    .opts_size = sizeof(tp_opts),
    .defaults = tp_defaults,
    .set = tp_set,
    .create = tp_create,
    .format = tp_format,
    .needs_comm = true,
    .data_part = tp_data_part,
    .mesh = tp_mesh,
    .place = tp_place,
    .mem_plan = tp_mem_plan,
    .device_neutral = true};
