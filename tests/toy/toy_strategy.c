/* A toy distribution strategy written against the strategy registry (src/parallel/strategy.h),
 * outside the library: "allreduce(chunk_mb=MB)", plain synchronous data parallelism without
 * buckets or overlap. Each rank runs forward and backward on its part of the global batch (the
 * shared dt_strategy_default_train_step scales d loss to its share of the global mean), then the
 * whole gradient slab is averaged over the ranks in allreduces of at most MB, and every rank applies
 * the same update (dt_strategy_apply_update). So 2 workers at batch b train like 1 at 2b, to
 * rounding. Registered by toy_parallel_test.c with dt_strategy_register(&toy_strategy_allreduce_entry):
 * one file, one line. */
#include "parallel/strategy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double chunk_mb; /* the most one allreduce carries, MB (> 0) */
} allreduce_opts;

static dt_status ar_init(dt_strategy *s) { return dt_strategy_verify_replicas(s->comm, s->model); }

static void ar_begin(dt_strategy *s, int64_t step) { s->step = step; }

static void ar_ready(dt_strategy *s, size_t offset, size_t n) { (void)s, (void)offset, (void)n; }

/* The mean gradient over the ranks, chunk by chunk, then the local update. */
static dt_status ar_step(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    const allreduce_opts *o = s->impl;
    float *g = dt_model_grads(s->model);
    const size_t n = dt_model_num_params(s->model);
    size_t chunk = (size_t)(o->chunk_mb * 1048576.0 / sizeof(float));
    if (chunk < 1) chunk = 1;
    const double t0 = dt_now();
    for (size_t lo = 0; lo < n; lo += chunk) {
        const size_t m = n - lo < chunk ? n - lo : chunk;
        DT_TRY(dt_comm_allreduce(s->comm, g + lo, g + lo, m, DT_F32, DT_OP_AVG));
        st->buckets++;
    }
    st->comm_wait_s += dt_now() - t0;
    st->bytes_sent = st->bytes_raw = 2.0 * (double)n * sizeof(float);
    dt_strategy_apply_update(s, lr, clip);
    return DT_OK;
}

static void ar_destroy(dt_strategy *s) {
    free(s->impl);
    s->impl = NULL;
}

static const dt_strategy_ops ar_ops = {.name = "allreduce",
                                       .init = ar_init,
                                       .begin_step = ar_begin,
                                       .grad_ready = ar_ready,
                                       .step = ar_step,
                                       .destroy = ar_destroy};

static dt_status ar_create(dt_strategy *s, const void *opts) {
    if (dt_model_num_buffers(s->model))
        return dt_error(DT_ENOTSUP, "--strategy allreduce: the model has buffers (batchnorm statistics), which this "
                                    "toy does not average; use ddp");
    allreduce_opts *o = malloc(sizeof *o);
    if (!o) return dt_error(DT_ENOMEM, "allreduce: out of memory");
    *o = *(const allreduce_opts *)opts;
    s->impl = o, s->ops = &ar_ops;
    return DT_OK;
}

static void ar_defaults(void *opts) { ((allreduce_opts *)opts)->chunk_mb = 1.0; }

static dt_status ar_set(void *opts, const char *key, const char *value) {
    (void)key; /* the only key: chunk_mb */
    char *end;
    const double v = strtod(value, &end);
    if (*end || end == value || !(v > 0) || !isfinite(v))
        return dt_error(DT_EINVAL, "--strategy allreduce: chunk_mb=%s: need a size in MB above 0", value);
    ((allreduce_opts *)opts)->chunk_mb = v;
    return DT_OK;
}

static void ar_format(const void *opts, char *out, size_t cap) {
    snprintf(out, cap, "chunk_mb=%g", ((const allreduce_opts *)opts)->chunk_mb);
}

const dt_strategy_entry toy_strategy_allreduce_entry = {
    .name = "allreduce",
    .options = "chunk_mb=MB",
    .keys = "chunk_mb",
    .help = "toy (tests/toy): the whole gradient averaged after backward, in allreduces of at most MB",
    .opts_size = sizeof(allreduce_opts),
    .defaults = ar_defaults,
    .set = ar_set,
    .create = ar_create,
    .format = ar_format,
    .needs_comm = true};
