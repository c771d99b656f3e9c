/* The gradient-sync pipeline shared by every compressor (grad_sync.h; the registry and the
 * --compress parser are compress.c's): the per-bucket stage machine (start, poll while backward
 * runs, finish before the update), the bytes-on-the-wire and error-feedback figures, and the
 * error-feedback state as one checkpoint tensor [world, floats] (every rank's row, gathered before
 * a save so the one writer has them). */
#include "parallel/grad_sync.h"

#include "device/device.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_grad_sync {
    dt_compress_spec spec;
    dt_grad_sync_config cfg;
    const dt_compressor *c;
    dt_gs_bucket *b;
    int64_t step;
    int rank, world;
    size_t state_n; /* error-feedback floats per rank */
    float *host;    /* staging (cfg.stage): the host copy of the vector the buckets travel in */
    float *state;   /* [world][state_n]; row `rank` is live */
    dt_grad_sync_stats st;
    double ef_sq;
    dt_status err; /* the first failure of a stage this step, and its message */
    char err_msg[512];
};

void dt_grad_sync_destroy(dt_grad_sync *g) {
    if (!g) return;
    for (int i = 0; g->b && i < g->cfg.nb; i++) {
        dt_request_wait(&g->b[i].req);
        if (g->c->bucket_free) g->c->bucket_free(&g->b[i]);
    }
    free(g->b);
    dt_free(g->state);
    dt_free(g->host);
    free(g);
}

/* Allocates the [world][state_n] error-feedback rows and hands each bucket its part of ours. */
static dt_status bind_state(dt_grad_sync *g, const size_t *sizes) {
    if (!g->state_n) return DT_OK;
    g->state = dt_alloc((size_t)g->world * g->state_n * sizeof(float));
    if (!g->state) return dt_error(DT_ENOMEM, "`compress`: out of memory for %zu error-feedback floats", g->state_n);
    memset(g->state, 0, (size_t)g->world * g->state_n * sizeof(float));
    float *row = g->state + (size_t)g->rank * g->state_n;
    for (int i = 0; i < g->cfg.nb; i++) {
        if (sizes[i] && g->c->bind_state) g->c->bind_state(&g->b[i], row);
        row += sizes[i];
    }
    return DT_OK;
}

dt_status dt_grad_sync_create(dt_grad_sync **out, const dt_compress_spec *spec, const dt_grad_sync_config *cfg) {
    *out = NULL;
    dt_grad_sync *g = calloc(1, sizeof *g);
    size_t *sizes = calloc((size_t)cfg->nb + 1, sizeof *sizes);
    if (!g || !sizes) {
        free(g), free(sizes);
        return dt_error(DT_ENOMEM, "`compress`: out of memory");
    }
    g->spec = *spec, g->cfg = *cfg, g->c = spec->c ? spec->c : &dt_compress_none;
    g->rank = cfg->comm ? dt_comm_rank(cfg->comm) : 0;
    g->world = cfg->comm ? dt_comm_size(cfg->comm) : 1;
    g->b = calloc((size_t)cfg->nb, sizeof *g->b);
    dt_status s = g->c && g->b ? DT_OK : dt_error(DT_ENOMEM, "`compress`: out of memory");
    for (int i = 0; s == DT_OK && i < cfg->nb; i++) {
        g->b[i].lo = cfg->lo[i], g->b[i].hi = cfg->hi[i], g->b[i].last = i == cfg->nb - 1;
        if (g->c->bucket_init) s = g->c->bucket_init(g, &g->b[i], &sizes[i]);
        g->state_n += sizes[i];
    }
    if (s == DT_OK) s = bind_state(g, sizes);
    if (s == DT_OK && cfg->stage && !(g->host = dt_alloc(cfg->n * sizeof(float))))
        s = dt_error(DT_ENOMEM, "gradient sync: out of memory for the %zu-float host staging buffer of `device` %s",
                     cfg->n, cfg->stage->kind->name);
    free(sizes);
    if (s != DT_OK) {
        dt_grad_sync_destroy(g);
        return s;
    }
    *out = g;
    return DT_OK;
}

const dt_compressor *dt_grad_sync_compressor(const dt_grad_sync *g) { return g->c; }
int64_t dt_grad_sync_step(const dt_grad_sync *g) { return g->step; }
const void *dt_grad_sync_opts(const dt_grad_sync *g) { return g->spec.opts.bytes; }
const dt_grad_sync_config *dt_grad_sync_config_of(const dt_grad_sync *g) { return &g->cfg; }

void dt_grad_sync_begin_step(dt_grad_sync *g, int64_t step) {
    g->step = step;
    memset(&g->st, 0, sizeof g->st);
    g->ef_sq = 0;
    g->err = DT_OK;
    for (int i = 0; i < g->cfg.nb; i++) g->b[i].stage = 0, g->b[i].failed = false;
}

void dt_grad_sync_count(dt_grad_sync *g, size_t payload, bool allgather) {
    const double W = g->world;
    g->st.payload_bytes += (double)payload;
    g->st.wire_bytes += allgather ? (W - 1) * (double)payload : 2 * (W - 1) / W * (double)payload;
}

void dt_grad_sync_add_ef(dt_grad_sync *g, double sq) { g->ef_sq += sq; }

/* Marks b failed (finish reports the first failure of the step with its message). */
static void fail_bucket(dt_grad_sync *g, dt_gs_bucket *b, dt_status s) {
    if (g->err == DT_OK) g->err = s, snprintf(g->err_msg, sizeof g->err_msg, "%s", dt_last_error());
    b->failed = true, b->stage = DT_GS_DONE;
}

/* Runs one stage transition of b; a failure marks the bucket. A staged bucket that is done goes
 * back to the device. */
static void step_bucket(dt_grad_sync *g, dt_gs_bucket *b, dt_status (*fn)(dt_grad_sync *, dt_gs_bucket *)) {
    dt_status s = fn(g, b);
    if (s != DT_OK) fail_bucket(g, b, s);
    else if (b->stage == DT_GS_DONE && b->dev_x) {
        dt_dev *d = g->cfg.stage;
        d->ops->upload(d, b->dev_x, b->x, (b->hi - b->lo) * sizeof(float));
    }
}

static int stages(const dt_grad_sync *g) { return g->c->stages > 0 ? g->c->stages : 1; }

/* Waits for b's collective and moves it on (issuing its next stage, or unpacking the result). */
static void wait_advance(dt_grad_sync *g, dt_gs_bucket *b) {
    dt_status r = dt_request_wait(&b->req);
    if (r != DT_OK) fail_bucket(g, b, r);
    else step_bucket(g, b, g->c->advance);
}

void dt_grad_sync_start(dt_grad_sync *g, int i, float *x) {
    for (int j = 0; j < i; j++) /* PowerSGD's Q allreduce of earlier buckets, before this P */
        while (g->b[j].stage > 0 && g->b[j].stage < stages(g) && !g->b[j].failed) wait_advance(g, &g->b[j]);
    dt_gs_bucket *b = &g->b[i];
    b->t_issue = dt_now();
    if (g->cfg.stage) { /* the comm does not take device memory: the bucket travels in a host copy */
        dt_dev *d = g->cfg.stage;
        b->dev_x = x + b->lo, b->x = g->host + b->lo;
        d->ops->download(d, b->x, b->dev_x, (b->hi - b->lo) * sizeof(float));
    } else {
        b->x = x + b->lo;
    }
    b->stage = 1;
    g->st.raw_bytes += (double)(b->hi - b->lo) * sizeof(float);
    step_bucket(g, b, g->c->start);
}

void dt_grad_sync_poll(dt_grad_sync *g) {
    for (int i = 0; i < g->cfg.nb; i++) {
        dt_gs_bucket *b = &g->b[i];
        while (b->stage == stages(g) && b->req) {
            bool done = false;
            dt_status r = dt_request_test(&b->req, &done);
            if (r != DT_OK) fail_bucket(g, b, r);
            if (!done || b->failed) break;
            step_bucket(g, b, g->c->advance);
        }
    }
}

dt_status dt_grad_sync_finish(dt_grad_sync *g, int i) {
    dt_gs_bucket *b = &g->b[i];
    dt_status first = DT_OK;
    while (b->stage != DT_GS_DONE && !b->failed) {
        if (b->stage == 0) return dt_error(DT_EINVAL, "gradient sync: bucket %d was never started", i);
        wait_advance(g, b);
    }
    if (b->failed)
        first = dt_error(g->err ? g->err : DT_EINTERNAL, "gradient sync (`compress` %s) of bucket %d: %s", g->c->name,
                         i, g->err_msg);
    return first;
}

dt_grad_sync_stats dt_grad_sync_step_stats(const dt_grad_sync *g) {
    dt_grad_sync_stats s = g->st;
    s.ef_norm = sqrt(g->ef_sq);
    return s;
}

void dt_grad_sync_residual(const dt_grad_sync *g, float *x) {
    memset(x, 0, g->cfg.n * sizeof(float));
    for (int i = 0; i < g->cfg.nb; i++)
        if (g->c->residual) g->c->residual(&g->b[i], x + g->b[i].lo);
}

void dt_grad_sync_rescale_state(dt_grad_sync *g, float factor) {
    if (!g->state_n) return;
    float *restrict row = g->state + (size_t)g->rank * g->state_n;
    if (factor == 0.0f) {
        memset(row, 0, g->state_n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < g->state_n; i++) {
        const float v = row[i] * factor;
        row[i] = v - v == 0.0f ? v : 0.0f; /* inf and NaN (v - v is NaN) go */
    }
}

dt_status dt_grad_sync_gather_state(dt_grad_sync *g) {
    if (!g->state_n || g->world == 1) return DT_OK;
    float *mine = g->state + (size_t)g->rank * g->state_n;
    return dt_comm_allgather(g->cfg.comm, mine, g->state, g->state_n, DT_F32);
}

dt_status dt_grad_sync_visit_state(dt_grad_sync *g, dt_state_visit_fn fn, void *ctx) {
    if (!g->state_n) return DT_OK;
    char name[64];
    snprintf(name, sizeof name, "compress.%s.state", g->c->name);
    size_t n = (size_t)g->world * g->state_n;
    dt_state_piece p = {.name = name,
                        .buf = {g->state, DT_F32, n, DT_DEVICE_CPU},
                        .ndim = 2,
                        .shape = {g->world, (int64_t)g->state_n},
                        .numel = n,
                        .is_optim = true,
                        .host = true, /* the compressors work on the staged host copy: so does their state */
                        .hint = g->c->state_hint ? g->c->state_hint
                                                 : "it is the `compress` error-feedback state of each rank; resume "
                                                   "with as many workers, the same `compress` and `bucket_mb`"};
    return fn(ctx, &p);
}
