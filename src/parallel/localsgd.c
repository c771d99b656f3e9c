/* Local SGD: every rank trains its own replica with its own optimizer step on the mean gradient
 * of its local batch, and every H steps (--sync-every) the replicas are averaged with one
 * allreduce over the parameters (and model buffers, e.g. batchnorm statistics). The average is
 * weighted by the samples each rank trained on since the last average, so with --balance
 * dynamic a rank that got a smaller part of the data counts less; with equal parts every weight
 * is exactly 1 and it is the plain mean. Optimizer state (momentum, Adam moments) stays local
 * to each rank: it is never averaged (the averaged parameters are taken up by every rank's own
 * optimizer). ops->sync averages at once (the trainer calls it before evaluation and
 * checkpoints, so those always see the common model). With compression ("localsgd(compress=...)",
 * --compress) the average travels as the mean of the ranks' compressed deltas from the last
 * common model (the gradient-sync table of grad_sync.h, one bucket, error feedback per rank);
 * model buffers are still averaged exactly.
 *
 * On a device whose memory the comm does not take (dt_strategy_stage_device) the optimizer steps
 * run on the device and each average travels through host buffers: the parameters and buffers
 * are downloaded into the host vector of the allreduce (and the compressed delta's host arithmetic),
 * the result uploaded; the anchor (the last common model) is host memory. On cpu the allreduce
 * reads and writes the model in place, as before. */
#include "parallel/grad_sync.h"

#include "device/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* localsgd's options: "localsgd(sync_every=H)". */
typedef struct {
    int sync_every;            /* local steps between model averages, >= 1 (default 8) */
    dt_compress_spec compress; /* how the average travels (default none: the f32 parameters) */
    bool balance;              /* balance=dynamic: the trainer cuts each global batch by the ranks' speed */
} localsgd_opts;

typedef struct {
    int H;
    int64_t since;   /* local steps since the last average */
    int64_t samples; /* samples since the last average (this rank) */
    float *flat;     /* params + buffers for the allreduce */
    size_t np, nb;
    dt_grad_sync *gs; /* with compression: the delta's sync; else NULL */
    float *anchor;    /* with compression: the last common model */
    int64_t avgs;     /* averages done (the sync's step counter) */
    bool anchored;    /* anchor taken from the model (at the first step: after a resume's restore) */
    dt_dev *dev;      /* the model's device when averages are staged through host memory, else NULL */
    dt_dev *mdev;     /* the model's device (cpu included): get and put */
} localsgd;

/* n floats of model memory src into host memory dst (downloaded from a staged device). */
static void get(const localsgd *l, float *dst, const float *src, size_t n) {
    l->mdev->ops->download(l->mdev, dst, src, n * sizeof(float)); /* the cpu device's is a memcpy */
}

/* n floats of host memory src into model memory dst (uploaded to a staged device). */
static void put(const localsgd *l, float *dst, const float *src, size_t n) {
    l->mdev->ops->upload(l->mdev, dst, src, n * sizeof(float));
}

static dt_status lsgd_init(dt_strategy *s) { return dt_strategy_verify_replicas(s->comm, s->model); }

static void lsgd_begin(dt_strategy *s, int64_t step) {
    localsgd *l = s->impl;
    s->step = step;
    if (l->anchor && !l->anchored) get(l, l->anchor, dt_model_params(s->model), l->np);
    l->anchored = true;
}

static void lsgd_ready(dt_strategy *s, size_t off, size_t n) { (void)s, (void)off, (void)n; }

/* The compressed average: x = anchor + mean_r(C(w_r (x_r - anchor))), buffers exactly. Staged:
 * the same host arithmetic on the model downloaded into flat, the result uploaded. */
static dt_status average_compressed(dt_strategy *s, float w) {
    localsgd *l = s->impl;
    float *p = dt_model_params(s->model), *buf = dt_model_buffers(s->model);
    float *hp = l->dev ? l->flat : p, *hb = l->dev ? l->flat + l->np : buf; /* the host view */
    if (l->dev) get(l, hp, p, l->np);
    for (size_t i = 0; i < l->np; i++) l->flat[i] = w * (hp[i] - l->anchor[i]);
    dt_grad_sync_begin_step(l->gs, l->avgs++);
    dt_grad_sync_start(l->gs, 0, l->flat);
    DT_TRY(dt_grad_sync_finish(l->gs, 0));
    for (size_t i = 0; i < l->np; i++) hp[i] = l->anchor[i] + l->flat[i];
    if (l->dev) put(l, p, hp, l->np);
    memcpy(l->anchor, hp, l->np * sizeof(float));
    if (!l->nb) return DT_OK;
    if (l->dev) get(l, hb, buf, l->nb);
    for (size_t i = 0; i < l->nb; i++) l->flat[l->np + i] = w * hb[i];
    DT_TRY(dt_comm_allreduce(s->comm, l->flat + l->np, hb, l->nb, DT_F32, DT_OP_AVG));
    if (l->dev) put(l, buf, hb, l->nb);
    return DT_OK;
}

/* Sample-weighted mean of the replicas: sum_r w_r x_r / W with w_r = n_r * W / sum n. */
static dt_status average(dt_strategy *s, double *wait_s) {
    localsgd *l = s->impl;
    const int W = dt_comm_size(s->comm);
    double t0 = dt_now();
    double tot = (double)l->samples;
    DT_TRY(dt_comm_allreduce(s->comm, &tot, &tot, 1, DT_F64, DT_OP_SUM));
    float w = tot > 0 ? (float)((double)l->samples * W / tot) : 1.0f;
    float *p = dt_model_params(s->model), *buf = dt_model_buffers(s->model);
    if (l->gs) {
        dt_status st = average_compressed(s, w);
        if (st != DT_OK) return dt_error_wrap(st, "localsgd step %lld: compressed model average", (long long)s->step);
        l->since = 0, l->samples = 0;
        if (s->trace) dt_trace_add(s->trace, "average", 1, t0, dt_now(), s->step);
        if (wait_s) *wait_s += dt_now() - t0;
        return DT_OK;
    }
    get(l, l->flat, p, l->np);
    if (l->nb) get(l, l->flat + l->np, buf, l->nb);
    if (w != 1.0f)
        for (size_t i = 0; i < l->np + l->nb; i++) l->flat[i] *= w;
    dt_status st = dt_comm_allreduce(s->comm, l->flat, l->flat, l->np + l->nb, DT_F32, DT_OP_AVG);
    if (st != DT_OK) return dt_error_wrap(st, "localsgd step %lld: model average", (long long)s->step);
    put(l, p, l->flat, l->np);
    if (l->nb) put(l, buf, l->flat + l->np, l->nb);
    l->since = 0, l->samples = 0;
    if (s->trace) dt_trace_add(s->trace, "average", 1, t0, dt_now(), s->step);
    if (wait_s) *wait_s += dt_now() - t0;
    return DT_OK;
}

static dt_status lsgd_step(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    localsgd *l = s->impl;
    memset(st, 0, sizeof *st);
    float *g = dt_model_grads(s->model);
    if (clip > 0) s->cur.grad_norm = dt_optim_clip_grad_norm(s->optim, g, l->np, clip); /* on its device */
    if (s->cur.n > 0) dt_optim_step(s->optim, dt_model_params(s->model), g, lr);
    l->since++;
    l->samples += s->cur.n;
    if (l->since >= l->H) {
        DT_TRY(average(s, &st->comm_wait_s));
        st->buckets = 1;
        if (l->gs) {
            dt_grad_sync_stats g = dt_grad_sync_step_stats(l->gs);
            st->bytes_sent = g.wire_bytes, st->bytes_raw = g.raw_bytes, st->ef_norm = g.ef_norm;
        }
    }
    return DT_OK;
}

static dt_status lsgd_sync(dt_strategy *s) {
    localsgd *l = s->impl;
    /* every rank takes the same steps, so `since` agrees and either all average or none */
    if (l->since > 0) DT_TRY(average(s, NULL));
    return l->gs ? dt_grad_sync_gather_state(l->gs) : DT_OK;
}

static dt_status lsgd_visit(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    localsgd *l = s->impl;
    DT_TRY(dt_state_visit_model(s->model, s->optim, fn, ctx));
    return l->gs ? dt_grad_sync_visit_state(l->gs, fn, ctx) : DT_OK;
}

static void lsgd_destroy(dt_strategy *s) {
    localsgd *l = s->impl;
    if (!l) return;
    dt_free(l->flat);
    dt_free(l->anchor);
    dt_grad_sync_destroy(l->gs);
    free(l);
    s->impl = NULL;
}

static const dt_strategy_ops lsgd_ops = {.name = "localsgd",
                                         .init = lsgd_init,
                                         .begin_step = lsgd_begin,
                                         .grad_ready = lsgd_ready,
                                         .step = lsgd_step,
                                         .destroy = lsgd_destroy,
                                         .sync = lsgd_sync,
                                         .visit_state = lsgd_visit};

/* With compression: the delta's sync (one bucket over the parameters) and the common model. */
static dt_status make_sync(dt_strategy *s, localsgd *l, const dt_compress_spec *cs) {
    if (dt_compress_is_none(cs)) return DT_OK;
    l->anchor = dt_alloc(l->np * sizeof(float));
    if (!l->anchor) return dt_error(DT_ENOMEM, "localsgd: out of memory for %zu parameters", l->np);
    get(l, l->anchor, dt_model_params(s->model), l->np); /* init verifies they agree */
    size_t lo = 0, hi = l->np;
    dt_grad_sync_config gc = {.comm = s->comm, .model = s->model, .n = l->np, .lo = &lo, .hi = &hi, .nb = 1};
    return dt_grad_sync_create(&l->gs, cs, &gc);
}

static dt_status lsgd_create(dt_strategy *s, const void *opts) {
    const localsgd_opts *o = opts;
    localsgd *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ENOMEM, "localsgd: out of memory");
    l->H = o->sync_every > 0 ? o->sync_every : 8;
    l->np = dt_model_num_params(s->model);
    l->nb = dt_model_num_buffers(s->model);
    l->dev = dt_strategy_stage_device(s->comm, s->model);
    l->mdev = dt_model_device(s->model);
    l->flat = dt_alloc((l->np + l->nb) * sizeof(float));
    if (!l->flat) {
        size_t n = l->np + l->nb;
        free(l);
        return dt_error(DT_ENOMEM, "localsgd: out of memory for %zu parameters", n);
    }
    s->impl = l;
    s->ops = &lsgd_ops;
    s->local_mean = true;
    dt_status st = make_sync(s, l, &o->compress);
    if (st != DT_OK) lsgd_destroy(s);
    return st;
}

static void lsgd_defaults(void *opts) {
    ((localsgd_opts *)opts)->sync_every = 8;
    dt_compress_parse("none", &((localsgd_opts *)opts)->compress);
}

static dt_status lsgd_set(void *opts, const char *key, const char *value) {
    if (!strcmp(key, "compress")) return dt_compress_parse(value, &((localsgd_opts *)opts)->compress);
    if (!strcmp(key, "balance")) return dt_strategy_parse_balance("localsgd", value, &((localsgd_opts *)opts)->balance);
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || *end || end == value || v < -1000000000 || v > 1000000000)
        return dt_error(DT_EINVAL, "`strategy` localsgd: sync_every=%s: not a whole number of steps", value);
    ((localsgd_opts *)opts)->sync_every = (int)v;
    return DT_OK;
}

static dt_status lsgd_check(const void *opts) {
    const localsgd_opts *o = opts;
    if (o->sync_every < 1)
        return dt_error(DT_EINVAL, "`strategy` localsgd: sync_every=%d: need at least 1 (e.g. localsgd(sync_every=8))",
                        o->sync_every);
    return DT_OK;
}

static void lsgd_format(const void *opts, char *out, size_t cap) {
    const localsgd_opts *o = opts;
    char c[96];
    const char *b = o->balance ? ",balance=dynamic" : "";
    dt_compress_format(&o->compress, c, sizeof c);
    if (dt_compress_is_none(&o->compress)) snprintf(out, cap, "sync_every=%d%s", o->sync_every, b);
    else snprintf(out, cap, "sync_every=%d,compress=%s%s", o->sync_every, c, b);
}

static bool lsgd_balanced(const void *opts) { return ((const localsgd_opts *)opts)->balance; }

const dt_strategy_entry dt_strategy_localsgd_entry = {
    .name = "localsgd",
    .options = "sync_every=H,compress=C,balance=static|dynamic",
    .help = "local SGD: each rank steps on its own, the models are averaged every H steps (the difference sent as "
            "compressor C says); balance=dynamic: ranks take batches by their measured speed",
    .keys = "sync_every, compress, balance",
    .opts_size = sizeof(localsgd_opts),
    .defaults = lsgd_defaults,
    .set = lsgd_set,
    .check = lsgd_check,
    .create = lsgd_create,
    .format = lsgd_format,
    .needs_comm = true,
    .device_neutral = true,
    .balanced = lsgd_balanced};
