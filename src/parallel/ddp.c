/* DDP: synchronous data parallelism. Every rank holds a full replica; gradients are averaged
 * with allreduce in buckets (contiguous slices of the gradient slab, filled from the last
 * layer backwards) so that a bucket's non-blocking allreduce starts as soon as backward has
 * produced all of its gradients, while backward continues on earlier layers. The optimizer
 * step then waits for the buckets and updates every replica identically. How a bucket travels
 * (plain allreduce, fp16/bf16, top-k, PowerSGD: "ddp(compress=...)", --compress) is the
 * gradient-sync hook table's business (grad_sync.h); the backward hook also advances buckets in
 * flight, so a compressor's second collective starts during backward. With zero=N (ZeRO stage
 * N, zero.c) the buckets are reduce-scattered into shards instead; update=shard (the default where
 * the ranks share a host) keeps the replicas and ddp's checkpoints but runs stage 1's step:
 * reduce-scatter, each rank updates its shard, allgather (dt_zero_create_update).
 * On a device whose memory the comm does not take (dt_strategy_stage_device: --device checked),
 * each bucket is downloaded into a host buffer when it starts and uploaded when its allreduce is
 * done (grad_sync's staging), the batchnorm broadcast likewise; on cpu the slab travels in place.
 * zero=1|2 and update=shard stage their reduce-scatters and gathers likewise (zero.c); zero=3 and
 * compress are refused there. */
#include "parallel/grad_sync.h"
#include "parallel/strategy.h"
#include "parallel/zero.h"

#include "device/device.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ddp's options: "ddp(bucket_mb=MB,compress=C,allreduce=A,zero=N,update=U)". */
typedef enum { UPDATE_AUTO = 0, UPDATE_FULL, UPDATE_SHARD } ddp_update;
static const char *const update_names[] = {"auto", "full", "shard"};

typedef struct {
    double bucket_mb;            /* gradient bucket (fusion buffer) size in MB, > 0 (default 1) */
    dt_compress_spec compress;   /* how buckets travel (default none: f32 allreduce) */
    dt_comm_hier_mode allreduce; /* auto (hierarchical when ranks span hosts), flat, hier */
    int zero;                    /* ZeRO stage 0..3 over the ranks (zero.c; 0: replicas) */
    ddp_update update;           /* full: allreduce, every rank updates everything; shard: reduce-scatter,
                                  * each rank updates its shard, allgather (dt_zero_create_update); auto */
    bool balance;                /* balance=dynamic: the trainer cuts each global batch by the ranks' speed */
} ddp_opts;

typedef struct {
    size_t lo, hi; /* slab range [lo, hi) */
    double t_issue;
} bucket;

typedef struct {
    bucket *b;
    dt_grad_sync *gs;
    int nb;
    int next;    /* next bucket to issue (buckets complete in index order) */
    int early;   /* issued from the backward hook */
    size_t nbuf; /* model buffers broadcast every step (batchnorm running stats) */
} ddp;

static void issue(dt_strategy *s, ddp *d, int i) {
    d->b[i].t_issue = dt_now();
    dt_grad_sync_start(d->gs, i, dt_model_grads(s->model)); /* errors surface at finish */
}

static dt_status ddp_init(dt_strategy *s) { return dt_strategy_verify_replicas(s->comm, s->model); }

static void ddp_begin(dt_strategy *s, int64_t step) {
    ddp *d = s->impl;
    s->step = step;
    d->next = 0;
    d->early = 0;
    dt_grad_sync_begin_step(d->gs, step);
}

static void ddp_ready(dt_strategy *s, size_t off, size_t n) {
    ddp *d = s->impl;
    (void)n;
    dt_grad_sync_poll(d->gs); /* buckets in flight move on to their next stage */
    /* layers arrive last to first, so bucket `next` is complete once its lowest layer is. The
     * last bucket (ending at offset 0) completes with backward itself: step() starts it */
    while (d->next < d->nb - 1 && off <= d->b[d->next].lo) {
        issue(s, d, d->next++);
        d->early++;
    }
}

static dt_status ddp_step(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    ddp *d = s->impl;
    memset(st, 0, sizeof *st);
    st->early_buckets = d->early;
    /* the wait starts before the last issue: the plain last bucket is allreduced blocking inside
     * issue() (compress_cast.c), and its time (with any wait for a slower peer) is communication */
    double t0 = dt_now();
    while (d->next < d->nb) issue(s, d, d->next++); /* any bucket the hook did not start, and the last */
    dt_status first = DT_OK;
    for (int i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        dt_status r = dt_grad_sync_finish(d->gs, i);
        if (r != DT_OK && first == DT_OK) first = r;
        if (s->trace) {
            char name[40];
            const char *how = dt_grad_sync_compressor(d->gs)->name; /* "allreduce b3", "topk b3" */
            snprintf(name, sizeof name, "%s b%d", strcmp(how, "none") ? how : "allreduce", i);
            dt_trace_add(s->trace, name, 1, b->t_issue, dt_now(), s->step);
        }
    }
    st->comm_wait_s = dt_now() - t0;
    st->buckets = d->nb;
    dt_grad_sync_stats gst = dt_grad_sync_step_stats(d->gs);
    dt_loss_scaler *ls = s->optim ? dt_optim_loss_scaler(s->optim) : NULL;
    const float scale0 = ls ? ls->scale : 1.0f; /* this step's gradients, and so its residual, carry it */
    st->bytes_sent = gst.wire_bytes, st->bytes_raw = gst.raw_bytes, st->ef_norm = gst.ef_norm / scale0;
    if (first != DT_OK) return dt_error_wrap(first, "gradient allreduce");
    if (d->nbuf) {
        /* keep batchnorm running statistics identical: rank 0's are the model's (as torch DDP) */
        DT_TRY(dt_strategy_broadcast_model(s->comm, s->model, dt_model_buffers(s->model), d->nbuf, 0));
    }
    double t1 = dt_now();
    const int64_t skipped0 = ls ? ls->skipped : 0;
    dt_strategy_apply_update(s, lr, clip);
    if (ls && (ls->skipped != skipped0 || ls->scale != scale0)) /* the error feedback is at the loss scale */
        dt_grad_sync_rescale_state(d->gs, ls->skipped != skipped0 ? 0.0f : ls->scale / scale0);
    if (s->trace) dt_trace_add(s->trace, "optimizer", 0, t1, dt_now(), s->step);
    return DT_OK;
}

static void ddp_destroy(dt_strategy *s) {
    ddp *d = s->impl;
    if (!d) return;
    dt_grad_sync_destroy(d->gs);
    free(d->b);
    free(d);
    s->impl = NULL;
}

/* Before evaluation and checkpoints: rank 0 (the writer) gets every rank's error-feedback state. */
static dt_status ddp_sync(dt_strategy *s) { return dt_grad_sync_gather_state(((ddp *)s->impl)->gs); }

static dt_status ddp_visit(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    DT_TRY(dt_state_visit_model(s->model, s->optim, fn, ctx));
    return dt_grad_sync_visit_state(((ddp *)s->impl)->gs, fn, ctx);
}

static const dt_strategy_ops ddp_ops = {.name = "ddp",
                                        .init = ddp_init,
                                        .begin_step = ddp_begin,
                                        .grad_ready = ddp_ready,
                                        .step = ddp_step,
                                        .destroy = ddp_destroy,
                                        .sync = ddp_sync,
                                        .visit_state = ddp_visit};

/* The gradient sync of d's buckets with compressor cs. */
static dt_status make_sync(dt_strategy *s, ddp *d, const dt_compress_spec *cs) {
    size_t *lo = calloc((size_t)d->nb, sizeof *lo), *hi = calloc((size_t)d->nb, sizeof *hi);
    if (!lo || !hi) {
        free(lo), free(hi);
        return dt_error(DT_ENOMEM, "ddp: out of memory");
    }
    for (int i = 0; i < d->nb; i++) lo[i] = d->b[i].lo, hi[i] = d->b[i].hi;
    dt_grad_sync_config gc = {.comm = s->comm,
                              .model = s->model,
                              .n = dt_model_num_params(s->model),
                              .lo = lo,
                              .hi = hi,
                              .nb = d->nb,
                              .stage = dt_strategy_stage_device(s->comm, s->model)};
    dt_status st = dt_grad_sync_create(&d->gs, cs, &gc);
    free(lo), free(hi);
    return st;
}

dt_status dt_ddp_buckets(dt_model *m, double bucket_mb, dt_ddp_range **out, int *nb) {
    *out = NULL, *nb = 0;
    double mb = bucket_mb > 0 ? bucket_mb : 1.0;
    size_t cap_floats = (size_t)(mb * 1048576.0 / sizeof(float));
    if (cap_floats < 1) cap_floats = 1;
    /* layer ranges from the last layer backwards; a bucket closes once it reaches the cap */
    int nl = dt_model_num_tensors(m);
    size_t *lo = calloc((size_t)nl + 1, sizeof *lo);
    dt_ddp_range *b = calloc((size_t)nl + 1, sizeof *b);
    if (!lo || !b) {
        free(lo), free(b);
        return dt_error(DT_ENOMEM, "ddp: out of memory");
    }
    /* the lowest slab offset of each layer with parameters, from the tensor table */
    int nlo = 0, last_layer = -1;
    for (int i = nl - 1; i >= 0; i--) {
        const dt_param_info *t = dt_model_tensor(m, i);
        if (t->is_buffer) continue;
        if (t->layer == last_layer) lo[nlo - 1] = t->offset; /* weight precedes its bias */
        else lo[nlo++] = t->offset, last_layer = t->layer;
    }
    size_t hi = dt_model_num_params(m);
    for (int k = 0; k < nlo; k++) {
        bool last = k == nlo - 1;
        if (hi - lo[k] >= cap_floats || last) {
            b[(*nb)++] = (dt_ddp_range){.lo = lo[k], .hi = hi};
            hi = lo[k];
        }
    }
    free(lo);
    if (*nb == 0) {
        free(b);
        return dt_error(DT_EINVAL, "ddp: the model has no parameters to synchronise");
    }
    *out = b;
    return DT_OK;
}

/* Whether the replicas agree by a sharded update (reduce-scatter, 1/N of the optimizer's work,
 * allgather) rather than an allreduce: the same results to the bit and the same bytes; auto takes
 * it where every rank shares one host (dt_comm_set_hier found one) and nothing needs the whole
 * gradient on every rank (a compressor, fp16 loss scaling that skips steps on overflow). It was the
 * faster of the two on one host (docs/why.md, "ddp's sharded update"). */
static bool sharded_update(const dt_strategy *s, const ddp_opts *op) {
    if (op->update != UPDATE_AUTO) return op->update == UPDATE_SHARD;
    return !dt_strategy_stage_device(s->comm, s->model) && dt_compress_is_none(&op->compress) && s->optim &&
           !dt_optim_loss_scaler(s->optim) && dt_comm_size(s->comm) > 1 && dt_comm_hosts(s->comm) == 1 &&
           !dt_comm_hier_active(s->comm);
}

/* What update=auto chose and why, for the run's header (static text); NULL when update was given. */
static const char *auto_choice(const dt_strategy *s, const ddp_opts *op, bool shard) {
    if (op->update != UPDATE_AUTO) return NULL;
    if (shard) return "update=shard (auto: the ranks share one host)";
    if (dt_strategy_stage_device(s->comm, s->model)) /* same comm bytes; 2/N of a slab more across the device */
        return "update=full (auto: the gradients are staged off the device; update=shard would move more)";
    if (!dt_compress_is_none(&op->compress)) return "update=full (auto: a compressor needs the allreduce)";
    if (s->optim && dt_optim_loss_scaler(s->optim)) return "update=full (auto: fp16 loss scaling skips whole steps)";
    if (dt_comm_size(s->comm) < 2) return "update=full (auto: one rank)";
    return "update=full (auto: the ranks span hosts)";
}

static dt_status ddp_create(dt_strategy *s, const void *opts) {
    const ddp_opts *op = opts;
    if (op->zero > 0) return dt_zero_create(s, op->bucket_mb, op->zero);
    DT_TRY(dt_comm_set_hier(s->comm, op->allreduce)); /* collective: every rank creates ddp */
    const bool shard = sharded_update(s, op);
    if (shard) DT_TRY(dt_zero_create_update(s, op->bucket_mb));
    s->choice = auto_choice(s, op, shard);
    if (shard) return DT_OK;
    ddp *d = calloc(1, sizeof *d);
    if (!d) return dt_error(DT_ENOMEM, "ddp: out of memory");
    dt_ddp_range *r;
    dt_status st = dt_ddp_buckets(s->model, op->bucket_mb, &r, &d->nb);
    if (st == DT_OK && !(d->b = calloc((size_t)d->nb, sizeof *d->b))) st = dt_error(DT_ENOMEM, "ddp: out of memory");
    if (st != DT_OK) {
        if (d->nb) free(r);
        free(d);
        return st;
    }
    for (int i = 0; i < d->nb; i++) d->b[i] = (bucket){.lo = r[i].lo, .hi = r[i].hi};
    free(r);
    d->nbuf = dt_model_num_buffers(s->model);
    s->impl = d;
    s->ops = &ddp_ops;
    s->sync_for_state_only = true; /* the replicas are equal: only a checkpoint needs ddp_sync */
    st = make_sync(s, d, &op->compress);
    if (st != DT_OK) ddp_destroy(s);
    return st;
}

static void ddp_defaults(void *opts) {
    ((ddp_opts *)opts)->bucket_mb = 1.0;
    dt_compress_parse("none", &((ddp_opts *)opts)->compress);
}

static dt_status ddp_set(void *opts, const char *key, const char *value) {
    ddp_opts *o = opts;
    if (!strcmp(key, "compress")) return dt_compress_parse(value, &o->compress);
    if (!strcmp(key, "allreduce")) {
        static const char *const names[] = {"auto", "flat", "hier"};
        for (int i = 0; i < 3; i++)
            if (!strcmp(value, names[i])) return o->allreduce = (dt_comm_hier_mode)i, DT_OK;
        return dt_error(DT_EINVAL,
                        "`strategy` ddp: allreduce=%s: choose auto (hierarchical when the ranks span "
                        "hosts), flat or hier",
                        value);
    }
    if (!strcmp(key, "update")) {
        for (int i = 0; i < 3; i++)
            if (!strcmp(value, update_names[i])) return o->update = (ddp_update)i, DT_OK;
        return dt_error(DT_EINVAL,
                        "`strategy` ddp: update=%s: choose auto (shard where the ranks share one host), "
                        "full (allreduce; every rank updates all) or shard (reduce-scatter, each rank "
                        "updates its part, allgather)",
                        value);
    }
    if (!strcmp(key, "balance")) return dt_strategy_parse_balance("ddp", value, &o->balance);
    char *end;
    if (!strcmp(key, "zero")) return dt_zero_parse_stage(value, &o->zero);
    double v = strtod(value, &end);
    if (*end || end == value || !(v > 0) || !isfinite(v) || v > 1e6)
        return dt_error(DT_EINVAL, "`strategy` ddp: bucket_mb=%s: need a size in MB above 0, e.g. bucket_mb=0.5",
                        value);
    o->bucket_mb = v;
    return DT_OK;
}

static void ddp_format(const void *opts, char *out, size_t cap) {
    const ddp_opts *o = opts;
    static const char *const names[] = {"auto", "flat", "hier"};
    char c[96], a[32] = "", z[64] = "";
    dt_compress_format(&o->compress, c, sizeof c);
    if (o->allreduce != DT_HIER_AUTO) snprintf(a, sizeof a, ",allreduce=%s", names[o->allreduce]);
    int zn = o->zero > 0 ? snprintf(z, sizeof z, ",zero=%d", o->zero) : 0;
    if (o->update != UPDATE_AUTO) zn += snprintf(z + zn, sizeof z - (size_t)zn, ",update=%s", update_names[o->update]);
    if (o->balance) snprintf(z + zn, sizeof z - (size_t)zn, ",balance=dynamic");
    if (dt_compress_is_none(&o->compress)) snprintf(out, cap, "bucket_mb=%g%s%s", o->bucket_mb, a, z);
    else snprintf(out, cap, "bucket_mb=%g,compress=%s%s%s", o->bucket_mb, c, a, z);
}

/* ZeRO reduce-scatters plain f32 buckets: a compressor does not apply to its shards. */
static dt_status ddp_check(const void *opts) {
    const ddp_opts *o = opts;
    if (o->zero > 0 && !dt_compress_is_none(&o->compress))
        return dt_error(DT_EINVAL,
                        "`strategy` ddp: zero=%d with compress: ZeRO reduce-scatters f32 gradients into "
                        "shards; drop `compress` or `zero`",
                        o->zero);
    if (o->update == UPDATE_SHARD && !dt_compress_is_none(&o->compress))
        return dt_error(DT_EINVAL, "`strategy` ddp: update=shard with compress: the sharded update reduce-scatters "
                                   "f32 gradients; drop compress or use update=full");
    if (o->update == UPDATE_FULL && o->zero > 0)
        return dt_error(DT_EINVAL,
                        "`strategy` ddp: update=full with zero=%d: ZeRO updates each rank's shard; drop "
                        "update or zero",
                        o->zero);
    return DT_OK;
}

/* The placement of entry.place: ZeRO-3 holds its shards of the parameters from set-up on (zero.c's
 * chunks of the buckets); replicas and stages 1-2 the whole model. */
static dt_status ddp_place(const void *opts, const dt_model *m, int rank, int size, dt_range **own, int *nown,
                           bool *whole) {
    const ddp_opts *o = opts;
    *own = NULL, *nown = 0, *whole = o->zero < 3 || size < 2;
    return *whole ? DT_OK : dt_zero_place(m, o->bucket_mb, rank, size, own, nown);
}

static bool ddp_balanced(const void *opts) { return ((const ddp_opts *)opts)->balance; }

const dt_strategy_entry dt_strategy_ddp_entry = {
    .name = "ddp",
    .options =
        "bucket_mb=MB,compress=C,allreduce=auto|flat|hier,zero=0|1|2|3,update=auto|full|shard,balance=static|dynamic",
    .help = "synchronous data parallel (the default with ranks): gradients averaged in buckets of MB as backward "
            "runs, sent as compressor C says (below); zero=1|2|3: ZeRO, shard the optimizer state, + gradients, + "
            "parameters; allreduce=hier: within each host, then across; update=shard: reduce-scatter, each rank "
            "updates its part, allgather (auto: where the ranks share one host); balance=dynamic: ranks take batches "
            "by their "
            "measured speed",
    .keys = "bucket_mb, compress, allreduce, zero, update, balance",
    .opts_size = sizeof(ddp_opts),
    .defaults = ddp_defaults,
    .set = ddp_set,
    .check = ddp_check,
    .create = ddp_create,
    .format = ddp_format,
    .needs_comm = true,
    .device_neutral = true,
    .loss_scaling = true,
    .place = ddp_place,
    .balanced = ddp_balanced,
    .mem_plan = dt_zero_mem_plan};
