/* Local SGD: every rank trains its own replica with its own optimizer step on the mean gradient
 * of its local batch, and every H steps (--sync-every) the replicas are averaged with one
 * allreduce over the parameters (and model buffers, e.g. batchnorm statistics). The average is
 * weighted by the samples each rank trained on since the last average, so with --balance
 * dynamic a rank that got a smaller part of the data counts less; with equal parts every weight
 * is exactly 1 and it is the plain mean. Optimizer state (momentum, Adam moments) stays local
 * to each rank: it is never averaged (the averaged parameters are taken up by every rank's own
 * optimizer). ops->sync averages at once (the trainer calls it before evaluation and
 * checkpoints, so those always see the common model). */
#include "parallel/strategy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* localsgd's options: "localsgd(sync_every=H)". */
typedef struct {
    int sync_every;    /* local steps between model averages, >= 1 (default 8) */
} localsgd_opts;

typedef struct {
    int H;
    int64_t since;     /* local steps since the last average */
    int64_t samples;   /* samples since the last average (this rank) */
    float *flat;       /* params + buffers for the allreduce */
    size_t np, nb;
} localsgd;

static dt_status lsgd_init(dt_strategy *s) { return dt_strategy_verify_replicas(s->comm, s->model); }

static void lsgd_begin(dt_strategy *s, int64_t step) { s->step = step; }

static void lsgd_ready(dt_strategy *s, size_t off, size_t n) { (void)s, (void)off, (void)n; }

/* Sample-weighted mean of the replicas: sum_r w_r x_r / W with w_r = n_r * W / sum n. */
static dt_status average(dt_strategy *s, double *wait_s) {
    localsgd *l = s->impl;
    const int W = dt_comm_size(s->comm);
    double t0 = dt_now();
    double tot = (double)l->samples;
    DT_TRY(dt_comm_allreduce(s->comm, &tot, &tot, 1, DT_F64, DT_OP_SUM));
    float w = tot > 0 ? (float)((double)l->samples * W / tot) : 1.0f;
    float *p = dt_model_params(s->model), *buf = dt_model_buffers(s->model);
    memcpy(l->flat, p, l->np * sizeof(float));
    if (l->nb) memcpy(l->flat + l->np, buf, l->nb * sizeof(float));
    if (w != 1.0f)
        for (size_t i = 0; i < l->np + l->nb; i++) l->flat[i] *= w;
    dt_status st = dt_comm_allreduce(s->comm, l->flat, l->flat, l->np + l->nb, DT_F32, DT_OP_AVG);
    if (st != DT_OK) return dt_error_wrap(st, "localsgd step %lld: model average", (long long)s->step);
    memcpy(p, l->flat, l->np * sizeof(float));
    if (l->nb) memcpy(buf, l->flat + l->np, l->nb * sizeof(float));
    l->since = 0, l->samples = 0;
    if (s->trace) dt_trace_add(s->trace, "average", 1, t0, dt_now(), s->step);
    if (wait_s) *wait_s += dt_now() - t0;
    return DT_OK;
}

static dt_status lsgd_step(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    localsgd *l = s->impl;
    memset(st, 0, sizeof *st);
    float *g = dt_model_grads(s->model);
    if (clip > 0) dt_clip_grad_norm(g, l->np, clip);
    if (s->cur.n > 0) dt_optim_step(s->optim, dt_model_params(s->model), g, lr);
    l->since++;
    l->samples += s->cur.n;
    if (l->since >= l->H) {
        DT_TRY(average(s, &st->comm_wait_s));
        st->buckets = 1;
    }
    return DT_OK;
}

static dt_status lsgd_sync(dt_strategy *s) {
    localsgd *l = s->impl;
    /* every rank takes the same steps, so `since` agrees and either all average or none */
    return l->since > 0 ? average(s, NULL) : DT_OK;
}

static void lsgd_destroy(dt_strategy *s) {
    localsgd *l = s->impl;
    if (!l) return;
    dt_free(l->flat);
    free(l);
    s->impl = NULL;
}

static const dt_strategy_ops lsgd_ops = {.name = "localsgd", .init = lsgd_init, .begin_step = lsgd_begin,
                                         .grad_ready = lsgd_ready, .step = lsgd_step, .destroy = lsgd_destroy,
                                         .sync = lsgd_sync};

static dt_status lsgd_create(dt_strategy *s, const void *opts) {
    const localsgd_opts *o = opts;
    localsgd *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ENOMEM, "localsgd: out of memory");
    l->H = o->sync_every > 0 ? o->sync_every : 8;
    l->np = dt_model_num_params(s->model);
    l->nb = dt_model_num_buffers(s->model);
    l->flat = dt_alloc((l->np + l->nb) * sizeof(float));
    if (!l->flat) {
        size_t n = l->np + l->nb;
        free(l);
        return dt_error(DT_ENOMEM, "localsgd: out of memory for %zu parameters", n);
    }
    s->impl = l;
    s->ops = &lsgd_ops;
    s->local_mean = true;
    return DT_OK;
}

static void lsgd_defaults(void *opts) { ((localsgd_opts *)opts)->sync_every = 8; }

static dt_status lsgd_set(void *opts, const char *key, const char *value) {
    (void)key;  /* the only key: sync_every */
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || *end || end == value || v < -1000000000 || v > 1000000000)
        return dt_error(DT_EINVAL, "--strategy localsgd: sync_every=%s: not a whole number of steps", value);
    ((localsgd_opts *)opts)->sync_every = (int)v;
    return DT_OK;
}

static dt_status lsgd_check(const void *opts) {
    const localsgd_opts *o = opts;
    if (o->sync_every < 1)
        return dt_error(DT_EINVAL, "--strategy localsgd: sync_every=%d: need at least 1 (e.g. localsgd(sync_every=8))",
                        o->sync_every);
    return DT_OK;
}

static void lsgd_format(const void *opts, char *out, size_t cap) {
    snprintf(out, cap, "sync_every=%d", ((const localsgd_opts *)opts)->sync_every);
}

const dt_strategy_entry dt_strategy_localsgd_entry = {
    .name = "localsgd", .help = "localsgd(sync_every=H)", .keys = "sync_every", .opts_size = sizeof(localsgd_opts),
    .defaults = lsgd_defaults, .set = lsgd_set, .check = lsgd_check, .create = lsgd_create, .format = lsgd_format,
    .needs_comm = true};
