/* The single-process strategy, the train step the replicated strategies share and replica
 * verification (the registry and factory are in registry.c). */
#include "parallel/strategy.h"

#include "device/device.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static dt_status single_init(dt_strategy *s) {
    (void)s;
    return DT_OK;
}

static void single_begin(dt_strategy *s, int64_t step) { s->step = step; }

static void single_ready(dt_strategy *s, size_t off, size_t n) { (void)s, (void)off, (void)n; }

void dt_strategy_apply_update(dt_strategy *s, float lr, float clip) {
    if (s->update) {
        s->update(s->update_ctx, lr, clip);
        return;
    }
    float *g = dt_model_grads(s->model);                                       /* on the optimizer's device */
    if (!dt_optim_unscale(s->optim, g, dt_model_num_params(s->model))) return; /* fp16: inf/NaN skips the step */
    if (clip > 0) s->cur.grad_norm = dt_optim_clip_grad_norm(s->optim, g, dt_model_num_params(s->model), clip);
    dt_optim_step(s->optim, dt_model_params(s->model), g, lr);
}

static dt_status single_step(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    memset(st, 0, sizeof *st);
    dt_strategy_apply_update(s, lr, clip);
    return DT_OK;
}

static void single_destroy(dt_strategy *s) { (void)s; }

static const dt_strategy_ops single_ops = {.name = "single",
                                           .init = single_init,
                                           .begin_step = single_begin,
                                           .grad_ready = single_ready,
                                           .step = single_step,
                                           .destroy = single_destroy};

static dt_status single_create(dt_strategy *s, const void *opts) {
    (void)opts;
    s->ops = &single_ops;
    return DT_OK;
}

const dt_strategy_entry dt_strategy_single_entry = {.name = "single",
                                                    .help = "one process (the default without ranks)",
                                                    .options = "",
                                                    .keys = "",
                                                    .opts_size = 0,
                                                    .create = single_create,
                                                    .needs_comm = false,
                                                    .device_neutral = true,
                                                    .loss_scaling = true};

void dt_strategy_destroy(dt_strategy *s) {
    if (!s) return;
    if (s->ops) s->ops->destroy(s);
    free(s);
}

void dt_strategy_grad_hook(void *strategy, size_t offset, size_t n) {
    dt_strategy *s = strategy;
    s->ops->grad_ready(s, offset, n);
}

dt_status dt_strategy_verify_replicas(dt_comm *comm, dt_model *m) { return dt_strategy_verify_model(comm, m, true); }

dt_dev *dt_strategy_stage_device(const dt_comm *comm, const dt_model *m) {
    dt_dev *d = dt_model_device(m);
    return d && !d->host_memory && !dt_comm_device_native(comm, d->kind->name) ? d : NULL;
}

dt_status dt_strategy_staged(dt_comm *comm, const dt_model *m, float *x, size_t n, float **host, size_t *cap, int dirs,
                             dt_staged_fn fn, void *arg) {
    dt_dev *d = dt_strategy_stage_device(comm, m);
    if (!d) return fn(comm, x, n, arg);
    float *h = host ? *host : NULL;
    if (!host || *cap < n) {
        if (!(h = dt_alloc((n ? n : 1) * sizeof(float))))
            return dt_error(DT_ENOMEM, "out of memory for a %zu-float host staging buffer", n);
        if (host) dt_free(*host), *host = h, *cap = n;
    }
    if (dirs & DT_STAGE_DOWN) d->ops->download(d, h, x, n * sizeof(float));
    dt_status st = fn(comm, h, n, arg);
    if (st == DT_OK && (dirs & DT_STAGE_UP)) d->ops->upload(d, x, h, n * sizeof(float));
    if (!host) dt_free(h);
    return st;
}

static dt_status broadcast_fn(dt_comm *comm, float *buf, size_t n, void *arg) {
    return dt_comm_broadcast(comm, buf, n, DT_F32, *(const int *)arg);
}

dt_status dt_strategy_broadcast_model(dt_comm *comm, const dt_model *m, float *x, size_t n, int root) {
    return dt_strategy_staged(comm, m, x, n, NULL, NULL, DT_STAGE_DOWN | DT_STAGE_UP, broadcast_fn, &root);
}

/* *crc = crc32 of n floats of m's memory x (downloaded first where it is not host memory). */
static dt_status model_crc(const dt_model *m, const float *x, size_t n, uLong *crc) {
    dt_dev *d = dt_model_device(m);
    if (!n || !d || d->host_memory) return *crc = crc32(0L, (const Bytef *)x, (uInt)(n * sizeof(float))), DT_OK;
    float *h = dt_alloc(n * sizeof(float));
    if (!h) return dt_error(DT_ENOMEM, "replica check: out of memory for a %zu-float host copy of the model", n);
    d->ops->download(d, h, x, n * sizeof(float));
    *crc = crc32(0L, (const Bytef *)h, (uInt)(n * sizeof(float)));
    dt_free(h);
    return DT_OK;
}

dt_status dt_strategy_verify_model(dt_comm *comm, dt_model *m, bool params) {
    /* (param count, crc32 of params, crc32 of buffers): min and max must agree on every rank */
    uLong c1 = 0, c2 = 0;
    if (params) DT_TRY(model_crc(m, dt_model_params(m), dt_model_num_params(m), &c1));
    DT_TRY(model_crc(m, dt_model_buffers(m), dt_model_num_buffers(m), &c2));
    int64_t mine[3] = {(int64_t)dt_model_num_params(m), (int64_t)c1, (int64_t)c2};
    int64_t lo[3], hi[3];
    DT_TRY(dt_comm_allreduce(comm, mine, lo, 3, DT_I64, DT_OP_MIN));
    DT_TRY(dt_comm_allreduce(comm, mine, hi, 3, DT_I64, DT_OP_MAX));
    if (memcmp(lo, hi, sizeof lo) != 0) {
        /* find one rank that differs from rank 0 to name it */
        int size = dt_comm_size(comm);
        int64_t *all = malloc(sizeof(int64_t) * 3 * (size_t)size);
        int bad = -1;
        if (all && dt_comm_allgather(comm, mine, all, 3, DT_I64) == DT_OK)
            for (int r = 1; r < size && bad < 0; r++)
                if (memcmp(all + 3 * r, all, sizeof mine) != 0) bad = r;
        free(all);
        return dt_error(DT_EMISMATCH,
                        "replicas differ at start: rank %d holds other parameters than rank 0; every worker must "
                        "run the same `model`, `seed` and `resume` checkpoint",
                        bad);
    }
    return DT_OK;
}

/* Micro-batch k of the feed: samples [k*n/accum, (k+1)*n/accum). */
static dt_feed micro_batch(const dt_model *m, const dt_feed *f, int k, int accum) {
    const int lo = (int)((int64_t)f->n * k / accum), hi = (int)((int64_t)f->n * (k + 1) / accum);
    const size_t xs = (size_t)dt_model_input_values(m, 0) * DT_FEED_VALUE_BYTES,
                 ys = (size_t)dt_model_input_values(m, 1) * DT_FEED_VALUE_BYTES;
    return (dt_feed){.x = (const char *)f->x + (size_t)lo * xs,
                     .y = f->y ? (const char *)f->y + (size_t)lo * ys : NULL,
                     .n = hi - lo};
}

dt_status dt_strategy_default_train_step(dt_strategy *s, const dt_step_batch *b, dt_step_result *r) {
    const double t0 = dt_now();
    const int accum = b->accum > 1 ? b->accum : 1, n = b->feed.n;
    memset(r, 0, sizeof *r);
    s->ops->begin_step(s, b->step);
    if (!s->grads_zeroed) dt_model_zero_grad(s->model);
    /* d loss: the rank's share of the global mean (ddp), or the local mean (localsgd, ps) */
    const float weight = s->local_mean || n == 0 ? 1.0f : (float)((double)n * b->world / b->n_global);
    for (int k = 0; k < accum && n > 0; k++) {
        dt_feed f = micro_batch(s->model, &b->feed, k, accum);
        if (f.n == 0) continue;
        float loss;
        const double tf = dt_now();
        DT_TRY(dt_model_run(s->model, &f, true, (uint64_t)(b->step * accum + k), &loss));
        if (!isfinite(loss))
            return dt_error(DT_EINVAL,
                            "training diverged: loss is %g at step %lld on rank %d; lower `lr` or set `clip_norm`",
                            loss, (long long)b->step, dt_comm_rank(s->comm));
        r->loss_sum += (double)loss * f.n;
        const double tb = dt_now();
        dt_trace_add(s->trace, "forward", 0, tf, tb, b->step);
        const bool last = k == accum - 1;
        const float share = (accum > 1 ? weight * (float)f.n / (float)n : weight) * dt_optim_loss_scale(s->optim);
        DT_TRY(dt_model_backward_loss(s->model, share, last ? dt_strategy_grad_hook : NULL, s));
        dt_trace_add(s->trace, "backward", 0, tb, dt_now(), b->step);
    }
    double busy = dt_now() - t0;
    if (b->compute_done) busy += b->compute_done(b->ctx, n, busy);
    s->cur.n = n, s->cur.loss_sum = r->loss_sum, s->cur.busy_s = busy;
    r->n = n;
    DT_TRY(s->ops->step(s, b->lr, b->clip, &r->st));
    r->compute_s = dt_now() - t0 - r->st.comm_wait_s;
    return DT_OK;
}

void dt_strategy_axis_bytes(dt_strategy *s, uint64_t bytes[3]) {
    bytes[0] = bytes[1] = bytes[2] = 0;
    if (s->ops->axis_bytes) s->ops->axis_bytes(s, bytes);
    else bytes[2] = dt_comm_bytes(s->comm, NULL);
}

dt_status dt_strategy_train_step(dt_strategy *s, const dt_step_batch *b, dt_step_result *r) {
    return s->ops->train_step ? s->ops->train_step(s, b, r) : dt_strategy_default_train_step(s, b, r);
}
