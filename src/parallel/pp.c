/* Pipeline parallelism (GPipe, 1F1B): the strategy "pp(stages=K,microbatches=M,schedule=...,
 * split=...)". The world is DP pipelines of K stages, rank = dp_i * K + pp_i (the mesh's order
 * with TP = 1: TP innermost, then PP, then DP). Each stage runs the nodes [first[k], first[k+1])
 * of the graph, cut where one activation crosses (pp_cut.c); activations and their gradients
 * travel point to point between neighbours, tokens and targets from stage 0 to the stages that
 * read them (pp_step.c). A stage updates only the parameters its nodes use, with optimizer state
 * for those alone (segments of the slab); a tensor used by several stages (a tied embedding) has
 * its gradient summed over them and is updated identically on each. Gradients of a stage are
 * averaged over the DP axis. Memory: a stage holds parameters, gradients and optimizer state only
 * for the tensors its nodes use, from set-up on (pp_place tells the trainer before anything is
 * written; a resume restores only those; under tp x pp the trainer places none of the whole model
 * and the stage places its tensors' shards, pp_tp.c). Evaluation runs on the stages (pp_eval.c). Before
 * checkpoints (and evaluation under ZeRO-3, whose gathers it cannot run) ops->sync
 * places the model whole again, every stage's tensors are broadcast to the whole pipeline and its
 * optimizer moments sent to stage 0, so rank 0 writes one ordinary, layout-independent checkpoint;
 * the next step narrows the stage back (streaming them instead is not done yet).
 *
 * On a device whose memory is not host memory (--device checked) the model stays whole on the
 * device (a device's slabs are whole blocks: no placement of the stage's part, no narrowing); the
 * stage's segment optimizers keep their moments there, and a sync's broadcasts and moment sends
 * are staged through host buffers where the comm does not take the device's memory (ZeRO too,
 * pp_zero.c, pp_zero3.c); under tp x pp the stage's shard is whole on the device too (pp_tp.c). */
#include "device/device.h"
#include "parallel/pp.h"
#include "parallel/zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* The stages of a pipeline hold different tensors: replicas are the same stage of each pipeline.
 * ZeRO shards the segments here, after a resume restored them whole (under tp x pp through
 * dt_pp_tp_visit_state, after the strategy was made). */
static dt_status pp_init(dt_strategy *s) {
    dt_pp *p = s->impl;
    DT_TRY(dt_strategy_verify_replicas(p->dp, p->m));
    if (p->o.zero && p->DP > 1 && !(p->nseg && p->seg[0].zero)) {
        DT_TRY(dt_pp_zero_shard(p));
        if (p->o.zero >= 3) DT_TRY(dt_pp_zero3_setup(p));
    }
    if (p->seg_of) dt_pp_zero3_release_all(p); /* ZeRO-3: from here each rank holds its chunks */
    return DT_OK;
}

/* The model (and rank 0's staging optimizer) back to what the stage holds after a sync widened
 * them. A failure (out of memory for the ranges) leaves them whole: more held, nothing wrong. */
static void narrow(dt_strategy *s, dt_pp *p) {
    static const dt_range none = {0, 0};
    if (p->on_dev) return; /* whole on the device: nothing to narrow */
    if (!p->widened || dt_model_place(s->model, p->own ? p->own : &none, p->nown) != DT_OK) return;
    if (s->optim && p->rank == 0 && dt_optim_place(s->optim, &none, 0) != DT_OK) return;
    p->widened = p->whole = false;
}

static void pp_begin(dt_strategy *s, int64_t step) {
    s->step = step;
    narrow(s, s->impl);
    dt_pp_zero_uncollect(s->impl); /* a sync's whole segment moments (ZeRO-1) back to the shards */
    if (((dt_pp *)s->impl)->zfull) dt_pp_zero3_release_all(s->impl); /* and its gathered parameters (ZeRO-3) */
}
static void pp_ready(dt_strategy *s, size_t off, size_t n) { (void)s, (void)off, (void)n; }
static dt_status pp_step_unused(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    (void)s, (void)lr, (void)clip, (void)st;
    return dt_error(DT_EINTERNAL, "pp: the pipeline trains through its own train_step");
}

int dt_pp_owner_stage(const dt_pp *p, int t) {
    for (int k = 0; k < p->K; k++)
        if (p->users[t] >> k & 1) return k;
    return 0;
}

float *dt_pp_seg_state(dt_pp *p, int i, size_t off) {
    for (int g = 0; g < p->nseg; g++)
        if (off >= p->seg[g].lo && off < p->seg[g].hi)
            return dt_optim_state(p->seg[g].opt, i, NULL) + (off - p->seg[g].lo);
    return NULL;
}

/* Checkpoints (and evaluation under ZeRO-3) read the whole model on every rank (not streamed yet;
 * evaluation otherwise runs on the stages, pp_eval.c): the model is placed whole for them (rank 0's optimizer too,
 * which writes the checkpoints), charged against
 * --mem-limit, and narrowed again at the next step. */
static dt_status widen(dt_strategy *s, dt_pp *p) {
    if (p->on_dev) return DT_OK; /* the device holds the whole model (and rank 0's optimizer) */
    dt_status st = dt_model_place(s->model, NULL, 0);
    if (st == DT_OK && s->optim && p->rank == 0) st = dt_optim_place(s->optim, NULL, 0);
    p->widened = true; /* narrow() puts back whatever was placed */
    if (st != DT_OK)
        return dt_error_wrap(st,
                             "pipeline stage %d (rank %d): checkpoints (and with `zero` 3 evaluation) gather the "
                             "whole model on every stage (rank 0 also its optimizer state); run without `save`, "
                             "`save_weights` and `checkpoint_every`, or raise `mem_limit`",
                             p->stage, p->rank);
    return DT_OK;
}

/* Every tensor from its owner stage to the whole pipeline; optimizer moments to stage 0. */
static dt_status pp_sync(dt_strategy *s) {
    dt_pp *p = s->impl;
    dt_model *m = s->model;
    if (p->o.zero && p->DP > 1) DT_TRY(dt_pp_zero_collect(p)); /* DP rank 0: whole segment moments */
    if (p->seg_of) DT_TRY(dt_pp_zero3_gather_all(p));          /* ZeRO-3: the stage's whole parameters */
    DT_TRY(widen(s, p));
    if (p->tp > 1) { /* the stages' shards gathered into the whole model */
        DT_TRY(dt_pp_tp_sync(s));
        p->whole = p->rank == 0;
        return DT_OK;
    }
    if (p->K == 1) goto moments;
    for (int t = 0; t < dt_model_num_tensors(m); t++) {
        const dt_param_info *ti = dt_model_tensor(m, t);
        float *base = (ti->is_buffer ? dt_model_buffers(m) : dt_model_params(m)) + ti->offset;
        dt_status st = dt_strategy_broadcast_model(p->pp, m, base, ti->numel, dt_pp_owner_stage(p, t));
        if (st != DT_OK)
            return dt_error_wrap(st, "pipeline stage %d (rank %d): gathering tensor %s from stage %d", p->stage,
                                 p->rank, ti->name, dt_pp_owner_stage(p, t));
    }
moments: /* to the rank that writes checkpoints, rank 0 (stage 0 of pipeline 0) */
    for (int t = 0; p->dp_i == 0 && t < dt_model_num_tensors(m); t++) {
        const dt_param_info *ti = dt_model_tensor(m, t);
        const int own = dt_pp_owner_stage(p, t);
        if (ti->is_buffer || (p->stage != 0 && p->stage != own)) continue;
        for (int i = 0; i < p->nstates; i++) {
            float *full = dt_optim_state(s->optim, i, NULL) + ti->offset, *mine = dt_pp_seg_state(p, i, ti->offset);
            dt_status st = DT_OK;
            if (own == 0 && p->stage == 0) p->dev->ops->copy(p->dev, full, mine, ti->numel * sizeof(float));
            else if (p->stage == 0) st = dt_pp_recv_model(p, p->pp, full, ti->numel, own, DT_COMM_TAG_MAX - 1);
            else st = dt_pp_send_model(p, p->pp, mine, ti->numel, 0, DT_COMM_TAG_MAX - 1);
            if (st != DT_OK)
                return dt_error_wrap(st, "pipeline stage %d (rank %d): sending the optimizer state of %s to stage 0",
                                     p->stage, p->rank, ti->name);
        }
    }
    if (s->optim) dt_optim_set_steps(s->optim, p->steps0 + p->updates);
    return DT_OK;
}

static void pp_destroy(dt_strategy *s) {
    dt_pp *p = s->impl;
    if (!p) return;
    for (int i = 0; i < p->nslots; i++) {
        dt_pp_slot *sl = &p->slots[i];
        dt_request_wait(&sl->req_out), dt_request_wait(&sl->req_gout);
        free(sl->in), free(sl->out), free(sl->gin), free(sl->gout), free(sl->x), free(sl->y);
    }
    for (int g = 0; g < p->nseg; g++) dt_optim_destroy(p->seg[g].opt), dt_optim_destroy(p->seg[g].shard);
    dt_comm *cs[] = {p->fwd, p->bwd, p->data};
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) dt_comm_destroy(cs[i]);
    for (int t = 0; p->share && t < dt_model_num_tensors(p->m ? p->m : s->model); t++) dt_comm_destroy(p->share[t]);
    if (p->seg_of && p->m) dt_model_set_node_hooks(p->m, NULL, NULL, NULL), dt_model_set_backward_hook(p->m, NULL);
    free(p->share), free(p->seg_of);
    dt_free(p->host);
    if (p->on_dev) p->dev->ops->free(p->dev, p->gsh); /* ZeRO-2's shard: a device block there */
    else dt_free(p->gsh);
    if (p->dev) {
        void *blocks[] = {p->dloss, p->dgin, p->dss};
        for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++) p->dev->ops->free(p->dev, blocks[i]);
    }
    dt_mesh_free(&p->mesh);
    dt_tp_hooks_destroy(p->hooks);
    if (p->m && p->m != s->model) dt_model_destroy(p->m);
    free(p->slots), free(p->seg), free(p->users), free(p->acts), free(p->buf_save), free(p->own);
    free(p);
    s->impl = NULL;
}

/* The figures of the run so far for the metrics line, reduced over the pipeline: the mean idle
 * (bubble) fraction of the stages, bytes sent, the largest in-flight memory of a stage. */
static void pp_report(dt_strategy *s, char *out, size_t cap) {
    dt_pp *p = s->impl;
    double v[3] = {p->bubble_steps ? p->bubble_sum / (double)p->bubble_steps : 0, (double)p->bytes_sent,
                   (double)p->peak_inflight * (double)p->mb_bytes};
    double mx[2] = {v[2], (double)p->peak_inflight}, tb[2] = {0, 0}; /* tb: the stages' tp block bytes, ops */
    if (p->hooks) {
        dt_tp_counters tc = {0};
        dt_tp_hooks_counters(p->hooks, &tc);
        tb[0] = (double)tc.block_bytes, tb[1] = (double)tc.block_ops;
    }
    if (p->K > 1 && (dt_comm_allreduce(p->pp, v, v, 2, DT_F64, DT_OP_SUM) != DT_OK ||
                     dt_comm_allreduce(p->pp, tb, tb, 2, DT_F64, DT_OP_SUM) != DT_OK ||
                     dt_comm_allreduce(p->pp, mx, mx, 2, DT_F64, DT_OP_MAX) != DT_OK)) {
        snprintf(out, cap, ", \"pp\": null");
        return;
    }
    /* each stage's peak resident memory (this pipeline's ranks) */
    struct rusage ru;
    double rss = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : 0, all[DT_PP_MAX_STAGES];
    if (p->K == 1) all[0] = rss;
    else if (dt_comm_allgather(p->pp, &rss, all, 1, DT_F64) != DT_OK)
        for (int i = 0; i < p->K; i++) all[i] = -1;
    int k = snprintf(out, cap,
                     ", \"pp\": {\"stages\": %d, \"tp\": %d, \"microbatches\": %d, \"schedule\": \"%s\", "
                     "\"bubble\": %.4f, \"bubble_ideal\": %.4f, \"bytes_sent\": %.0f, \"peak_inflight\": %.0f, "
                     "\"peak_act_bytes\": %.0f, \"tp_block_bytes\": %.0f, \"tp_block_ops\": %.0f, \"cut\": [",
                     p->K, p->tp, p->o.microbatches, dt_pp_schedule_name(p->o.schedule), v[0] / p->K,
                     (double)(p->K - 1) / (p->o.microbatches + p->K - 1), v[1], mx[1], mx[0], tb[0], tb[1]);
    for (int i = 1; i < p->K && k > 0 && (size_t)k < cap; i++) /* the cut: first node of stages 1.. */
        k += snprintf(out + k, cap - (size_t)k, "%s%d", i > 1 ? ", " : "", p->first[i]);
    if (k > 0 && (size_t)k < cap) k += snprintf(out + k, cap - (size_t)k, "], \"rss_mb\": [");
    double top = 0;
    for (int i = 0; i < p->K && k > 0 && (size_t)k < cap; i++) {
        k += snprintf(out + k, cap - (size_t)k, "%s%.1f", i ? ", " : "", all[i]);
        if (all[i] > top) top = all[i];
    }
    if (k > 0 && (size_t)k < cap) snprintf(out + k, cap - (size_t)k, "], \"rss_max_mb\": %.1f}", top);
}

/* Bus bytes per mesh axis: tp (the stage's shard collectives), pp (this pipeline's sends, the
 * shared tensors' sums, the sync), dp. */
static void pp_axis_bytes(dt_strategy *s, uint64_t bytes[3]) {
    const dt_pp *p = s->impl;
    bytes[0] = dt_comm_bytes(p->mesh.tp_comm, NULL);
    bytes[1] = dt_comm_bytes(p->pp, NULL) + dt_comm_bytes(p->fwd, NULL) + dt_comm_bytes(p->bwd, NULL) +
               dt_comm_bytes(p->data, NULL);
    bytes[2] = dt_comm_bytes(p->dp, NULL);
}

#define PP_OPS                                                                                                        \
    .name = "pp", .train_step = dt_pp_train_step, .init = pp_init, .begin_step = pp_begin, .grad_ready = pp_ready,    \
    .step = pp_step_unused, .destroy = pp_destroy, .sync = pp_sync, .report = pp_report, .axis_bytes = pp_axis_bytes, \
    .eval_batch = dt_pp_eval_batch
static const dt_strategy_ops pp_ops = {PP_OPS};
/* tp x pp: the stage's shards are state only the strategy holds (a resume restores them in place) */
static const dt_strategy_ops pp_tp_ops = {PP_OPS, .visit_state = dt_pp_tp_visit_state};

void dt_pp_tp_counters(const dt_strategy *s, dt_tp_counters *c) {
    const uint64_t dp = c->dp_bytes;
    memset(c, 0, sizeof *c);
    if (!s || (s->ops != &pp_ops && s->ops != &pp_tp_ops) || !((const dt_pp *)s->impl)->hooks) return;
    const dt_pp *p = s->impl;
    c->dp_bytes = dp;
    dt_tp_hooks_counters(p->hooks, c);
    c->dp_bytes = dt_comm_bytes(p->dp, NULL);
}

/* users[t]: the stages whose nodes use tensor t. */
static dt_status find_users(dt_pp *p, const dt_model *m) {
    if (!(p->users = calloc((size_t)dt_model_num_tensors(m) + 1, sizeof *p->users)))
        return dt_error(DT_ENOMEM, "pp: out of memory");
    for (int k = 0; k < p->K; k++)
        for (int i = p->first[k]; i < p->first[k + 1]; i++) {
            int ids[8];
            int n = dt_model_node_tensors(m, i, ids, 8);
            for (int j = 0; j < n && j < 8; j++) p->users[ids[j]] |= (uint64_t)1 << k;
        }
    return DT_OK;
}

/* The ranges of the parameter slab that stage `stage` holds: the tensors its nodes use. */
static dt_status stage_ranges(const dt_pp *p, const dt_model *m, int stage, dt_range **own, int *nown) {
    const int nt = dt_model_num_tensors(m);
    bool *keep = calloc((size_t)nt + 1, 1);
    if (!keep) return dt_error(DT_ENOMEM, "pp: out of memory");
    for (int t = 0; t < nt; t++) keep[t] = p->users[t] >> stage & 1;
    dt_status s = dt_model_tensor_ranges(m, keep, own, nown);
    free(keep);
    return s;
}

/* The placement of entry.place: the tensors of this rank's stage, from the cut the strategy
 * makes (by flops or --pp-split); under tp x pp none (the stage places its tensors' shards in its
 * GPT shard, pp_tp.c, as tp does); the whole model where the cut needs measured costs first (rank
 * 0 times every node) or the world does not divide (the strategy refuses that). */
static dt_status pp_place(const void *opts, const dt_model *m, int rank, int size, dt_range **own, int *nown,
                          bool *whole) {
    const dt_pp_opts *o = opts;
    const int tp = o->tp > 0 ? o->tp : 1;
    *whole = (o->measured && !o->split[0]) || size % (o->stages * tp) != 0 || (o->stages == 1 && tp == 1);
    if (*whole || tp > 1) return DT_OK;
    dt_pp *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ENOMEM, "pp: out of memory");
    p->K = o->stages;
    dt_status s = dt_pp_cut(m, p->K, o->split, NULL, p->first);
    if (s == DT_OK) s = find_users(p, m);
    if (s == DT_OK) s = stage_ranges(p, m, rank % p->K, own, nown);
    free(p->users), free(p);
    return s;
}

/* The slab ranges this stage updates (its tensors, merged where contiguous), each with an
 * optimizer that starts from the trainer's (a resumed run's moments and step count). */
static dt_status make_segments(dt_strategy *s, dt_pp *p) {
    dt_model *m = p->m;
    const int nt = dt_model_num_tensors(m);
    if (!(p->seg = calloc((size_t)nt + 1, sizeof *p->seg))) return dt_error(DT_ENOMEM, "pp: out of memory");
    for (int t = 0; t < nt; t++) { /* tensors are laid out in table order, so offsets increase */
        const dt_param_info *ti = dt_model_tensor(m, t);
        if (ti->is_buffer || !(p->users[t] >> p->stage & 1) || ti->numel == 0) continue;
        const bool merge = p->o.zero < 3 || p->DP == 1; /* ZeRO-3: one per tensor, gathered by its nodes */
        if (merge && p->nseg && p->seg[p->nseg - 1].hi == ti->offset) p->seg[p->nseg - 1].hi += ti->numel;
        else p->seg[p->nseg++] = (dt_pp_segment){.lo = ti->offset, .hi = ti->offset + ti->numel};
    }
    for (int g = 0; g < p->nseg && s->optim; g++) {
        dt_pp_segment *sg = &p->seg[g];
        DT_TRY(dt_optim_create(&sg->opt, dt_optim_config_of(s->optim), sg->hi - sg->lo));
        DT_TRY(dt_optim_set_device(sg->opt, p->dev)); /* its moments beside the model's memory */
        dt_optim_set_steps(sg->opt, dt_optim_steps(s->optim));
        for (int i = 0; m == s->model && i < dt_optim_num_states(s->optim); i++)
            p->dev->ops->copy(p->dev, dt_optim_state(sg->opt, i, NULL), dt_optim_state(s->optim, i, NULL) + sg->lo,
                              (sg->hi - sg->lo) * sizeof(float));
    }
    if (m != s->model && s->optim) dt_pp_tp_scatter_moments(s, p);
    return DT_OK;
}

/* The communicators: the mesh's pipeline (this tp index's stages) with three duplicates, so that
 * activations, gradients and fed tokens each keep their own order, and this stage's data-parallel
 * peers. */
static dt_status make_comms(dt_strategy *s, dt_pp *p) {
    p->pp = p->mesh.pp_comm, p->dp = p->mesh.dp_comm;
    s->data_comm = p->dp;
    if (p->K == 1) return DT_OK;
    DT_TRY(dt_comm_split(p->pp, 0, p->stage, &p->fwd));
    DT_TRY(dt_comm_split(p->pp, 0, p->stage, &p->bwd));
    DT_TRY(dt_comm_split(p->pp, 0, p->stage, &p->data));
    /* a tensor that several stages use (a tied embedding): its users sum its gradient among
     * themselves (the other stages hold no memory for it) */
    const int nt = dt_model_num_tensors(p->m); /* users[] is per tensor of the stage model */
    if (!(p->share = calloc((size_t)nt + 1, sizeof *p->share))) return dt_error(DT_ENOMEM, "pp: out of memory");
    for (int t = 0; t < nt; t++)
        if (!dt_model_tensor(p->m, t)->is_buffer && (p->users[t] & (p->users[t] - 1)))
            DT_TRY(dt_comm_split(p->pp, p->users[t] >> p->stage & 1 ? 0 : DT_COMM_UNDEFINED, p->stage, &p->share[t]));
    return DT_OK;
}

/* This rank's place in the dp x pp x tp mesh and its axes. */
static dt_status place(dt_strategy *s, dt_pp *p) {
    const int world = dt_comm_size(s->comm);
    p->tp = p->o.tp > 0 ? p->o.tp : 1;
    if (p->tp == 1 && world % p->K)
        return dt_error(DT_EINVAL,
                        "`pp` %d: the job has %d ranks, not a multiple of %d; start K x DP ranks (e.g. "
                        "`workers` %d)",
                        p->K, world, p->K, p->K);
    DT_TRY(dt_mesh_create(&p->mesh, s->comm, p->tp, p->K));
    p->DP = p->mesh.dp, p->rank = dt_comm_rank(s->comm);
    p->stage = p->mesh.pp_rank, p->dp_i = p->mesh.dp_rank, p->tr = p->mesh.tp_rank;
    return DT_OK;
}

/* The model's device, and on one whose memory is not host memory the small device buffers of a
 * step (the micro-batches' losses, a norm partial sum). */
static dt_status device_setup(dt_strategy *s, dt_pp *p) {
    p->dev = dt_model_device(s->model);
    p->on_dev = !p->dev->host_memory;
    const int M = p->o.microbatches;
    if (!(p->dloss = p->dev->ops->alloc(p->dev, (size_t)M * sizeof(float))) ||
        (p->on_dev && !(p->dss = p->dev->ops->alloc(p->dev, sizeof(double)))))
        return dt_error_wrap(DT_ENOMEM, "pipeline stage (rank %d): its step buffers on device %s",
                             dt_comm_rank(s->comm), p->dev->kind->name);
    return DT_OK;
}

static dt_status pp_setup(dt_strategy *s, dt_pp *p) {
    DT_TRY(device_setup(s, p));
    DT_TRY(place(s, p));
    double *cost = NULL;
    if (p->o.measured && !p->o.split[0] && p->K > 1) {
        const int n = dt_model_num_nodes(s->model);
        if (!(cost = malloc(sizeof(double) * (size_t)n))) return dt_error(DT_ENOMEM, "pp: out of memory");
        dt_status st = dt_pp_measure_costs(s->model, s->comm, 8, 3, cost);
        if (st != DT_OK) free(cost);
        DT_TRY(st);
    }
    dt_status cs = dt_pp_cut(s->model, p->K, p->o.split, cost, p->first); /* by the whole model's costs */
    free(cost);
    DT_TRY(cs);
    p->m = s->model;
    if (p->tp > 1) DT_TRY(dt_pp_tp_setup(s, p));
    dt_model *m = p->m;
    p->lo = p->first[p->stage], p->hi = p->first[p->stage + 1];
    p->in_vals = p->stage > 0 ? dt_model_node_size(m, p->lo - 1) : 0;
    p->out_vals = p->stage < p->K - 1 ? dt_model_node_size(m, p->hi - 1) : 0;
    p->x_vals = (size_t)dt_model_input_values(m, 0), p->y_vals = (size_t)dt_model_input_values(m, 1);
    for (int k = 0; k < p->K; k++) {
        p->reads_x[k] = k > 0 && dt_model_range_reads_input(m, p->first[k], p->first[k + 1], 0);
        p->reads_y[k] = k > 0 && dt_model_range_reads_input(m, p->first[k], p->first[k + 1], 1);
    }
    if (p->hooks && p->K > 1) p->reads_y[p->K - 1] = true; /* the shard's loss is outside its graph */
    DT_TRY(find_users(p, m));
    if (p->tp > 1) { /* the shard holds the stage's tensors only */
        dt_range *mine = NULL;
        int nmine = 0;
        DT_TRY(stage_ranges(p, m, p->stage, &mine, &nmine));
        dt_status ps = dt_pp_tp_place(s, p, mine, nmine);
        free(mine);
        DT_TRY(ps);
    }
    p->nstates = s->optim ? dt_optim_num_states(s->optim) : 0;
    p->steps0 = s->optim ? dt_optim_steps(s->optim) : 0;
    DT_TRY(make_segments(s, p));
    /* from here the stage holds only its tensors (the trainer placed no more unless the cut needed
     * measured costs or a sharded checkpoint was restored; under tp x pp none of the whole model),
     * and the trainer's optimizer no moments: the segments are the stage's; rank 0 places them
     * again to stage checkpoints */
    if (p->tp == 1) DT_TRY(stage_ranges(p, m, p->stage, &p->own, &p->nown));
    p->widened = true;
    narrow(s, p);
    if (s->optim && p->rank != 0) dt_optim_free_state(s->optim);
    const size_t nbuf = dt_model_num_buffers(m);
    p->acts = calloc(2 * DT_PP_MAX_MICRO, sizeof *p->acts);
    p->slots = calloc(DT_PP_MAX_MICRO, sizeof *p->slots);
    if (!p->acts || !p->slots || (nbuf && !(p->buf_save = malloc(nbuf * sizeof(float)))))
        return dt_error(DT_ENOMEM, "pp: out of memory");
    p->live = -1;
    s->data_rank = p->dp_i, s->data_world = p->DP, s->job_rank0 = 0;
    return make_comms(s, p); /* ZeRO shards the segments in pp_init */
}

static dt_status pp_create(dt_strategy *s, const void *opts) {
    dt_pp *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ENOMEM, "pp: out of memory");
    p->o = *(const dt_pp_opts *)opts;
    p->K = p->o.stages;
    if (p->o.microbatches == 0) p->o.microbatches = p->K; /* default: M = K */
    s->impl = p;
    s->ops = p->o.tp > 1 ? &pp_tp_ops : &pp_ops;
    /* ZeRO-3's forward gathers over the DP axis, whose ranks evaluate different numbers of
     * batches: there evaluation reads the model a sync gathered */
    s->evaluates_sharded = !(p->o.zero >= 3 && dt_comm_size(s->comm) > p->K * (p->o.tp > 0 ? p->o.tp : 1));
    dt_status st = pp_setup(s, p);
    if (st != DT_OK) {
        pp_destroy(s);
        s->ops = NULL;
    }
    return st;
}

/* ---- options ---- */

static void pp_defaults(void *opts) {
    dt_pp_opts *o = opts;
    *o = (dt_pp_opts){.stages = 2, .tp = 1, .microbatches = 0, .schedule = DT_PP_1F1B};
}

static dt_status int_opt(const char *key, const char *value, int lo, int hi, int *out) {
    char *end;
    long v = strtol(value, &end, 10);
    if (*end || end == value || v < lo || v > hi)
        return dt_error(DT_EINVAL, "`strategy` pp: %s=%s: need a whole number from %d to %d", key, value, lo, hi);
    *out = (int)v;
    return DT_OK;
}

static dt_status pp_set(void *opts, const char *key, const char *value) {
    dt_pp_opts *o = opts;
    if (!strcmp(key, "stages")) return int_opt(key, value, 1, DT_PP_MAX_STAGES, &o->stages);
    if (!strcmp(key, "tp")) return int_opt(key, value, 1, 4096, &o->tp);
    if (!strcmp(key, "zero")) return dt_zero_parse_stage(value, &o->zero);
    if (!strcmp(key, "microbatches")) return int_opt(key, value, 1, DT_PP_MAX_MICRO, &o->microbatches);
    if (!strcmp(key, "schedule")) return dt_pp_schedule_parse(value, &o->schedule);
    if (!strcmp(key, "cost")) {
        if (strcmp(value, "flops") && strcmp(value, "measured"))
            return dt_error(DT_EINVAL, "`strategy` pp: cost=%s: choose flops or measured", value);
        o->measured = !strcmp(value, "measured");
        return DT_OK;
    }
    if (strlen(value) >= sizeof o->split)
        return dt_error(DT_EINVAL, "`pp_split` %s: too long (at most %zu characters)", value, sizeof o->split - 1);
    snprintf(o->split, sizeof o->split, "%s", value);
    return DT_OK;
}

static void pp_format(const void *opts, char *out, size_t cap) {
    const dt_pp_opts *o = opts;
    int k = snprintf(out, cap, "stages=%d,microbatches=%d,schedule=%s", o->stages,
                     o->microbatches ? o->microbatches : o->stages, dt_pp_schedule_name(o->schedule));
    if (o->tp > 1 && k > 0 && (size_t)k < cap) k += snprintf(out + k, cap - (size_t)k, ",tp=%d", o->tp);
    if (o->zero && k > 0 && (size_t)k < cap) k += snprintf(out + k, cap - (size_t)k, ",zero=%d", o->zero);
    if (o->measured && k > 0 && (size_t)k < cap) k += snprintf(out + k, cap - (size_t)k, ",cost=measured");
    if (o->split[0] && k > 0 && (size_t)k < cap) snprintf(out + k, cap - (size_t)k, ",split=%s", o->split);
}

/* The data part of entry.data_part: the dp axis of the tp x K mesh (dt_mesh_data_part; a size it
 * does not divide is refused when the strategy is made). */
static void pp_data_part(const void *opts, int rank, int size, int *data_rank, int *data_world) {
    const dt_pp_opts *o = opts;
    dt_mesh_data_part(rank, size, o->tp > 0 ? o->tp : 1, o->stages, data_rank, data_world);
}

static void pp_mesh(const void *opts, int *tp, int *pp, int *microbatches, const char **schedule) {
    const dt_pp_opts *o = opts;
    *tp = o->tp > 0 ? o->tp : 1, *pp = o->stages, *microbatches = o->microbatches;
    *schedule = dt_pp_schedule_name(o->schedule);
}

const dt_strategy_entry dt_strategy_pp_entry = {
    .name = "pp",
    .options = "stages=K,microbatches=M,schedule=gpipe|1f1b,cost=flops|measured,split=N1:N2:...,tp=T,"
               "zero=0|1|2|3",
    .help = "pipeline parallel: K stages, M micro-batches per rank-batch (default K), cut before nodes N1:N2:... "
            "(default: balanced by flops, or by measured times); tp=T: each stage a tensor-parallel group of T ranks, "
            "rank = (dp_i*K + stage)*T + tp_i; zero=N: ZeRO over the dp axis",
    .keys = "stages,microbatches,schedule,cost,split,tp,zero",
    .opts_size = sizeof(dt_pp_opts),
    .defaults = pp_defaults,
    .set = pp_set,
    .create = pp_create,
    .format = pp_format,
    .needs_comm = true,
    .device_neutral = true,
    .data_part = pp_data_part,
    .mesh = pp_mesh,
    .place = pp_place,
    .mem_plan = dt_pp_mem_plan};
