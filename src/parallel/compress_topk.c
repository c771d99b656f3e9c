/* Top-k sparsification after Deep Gradient Compression (Lin et al., ICLR 2018): each rank sends
 * only the k largest-magnitude values of its bucket as (index, value) pairs, allgathered (every
 * rank picks other indices, so the pairs cannot be summed on the way), and every rank adds them
 * up in rank order, so the mean is bitwise the same everywhere. What is not sent stays in a local
 * accumulator and is added next step (error feedback / local gradient accumulation). Momentum
 * correction (momentum=M) accumulates the velocity u = M u + g instead of g and clears u where a
 * value was sent (momentum factor masking); the optimizer then runs without momentum. warmup=S
 * lowers the ratio geometrically from 1 to RATIO over the first S steps. */
#include "parallel/grad_sync.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* topk's options: "topk:RATIO[:momentum=M][:warmup=STEPS]". */
typedef struct {
    double ratio;    /* fraction of the values sent, (0, 1] */
    double momentum; /* DGC momentum correction (0 = off; then train with plain SGD) */
    int warmup;      /* steps over which the ratio falls from 1 to `ratio` (DGC warm-up) */
} topk_opts;

static dt_status topk_parse(const char *text, const char *p, void *opts) {
    topk_opts *o = opts;
    o->warmup = DT_COMPRESS_DEFAULT_WARMUP;
    if (!dt_compress_num(&p, 0, 1, &o->ratio) || !(o->ratio > 0))
        return dt_compress_bad(text, "the ratio must be a number in (0, 1]");
    while (*p == ':') {
        p++;
        double v;
        if (!strncmp(p, "momentum=", 9)) {
            p += 9;
            if (!dt_compress_num(&p, 0, 0.999, &v)) return dt_compress_bad(text, "momentum= needs a number in [0, 1)");
            o->momentum = v;
        } else if (!strncmp(p, "warmup=", 7)) {
            p += 7;
            if (!dt_compress_num(&p, 0, 1e9, &v) || v != floor(v))
                return dt_compress_bad(text, "warmup= needs a whole number of steps");
            o->warmup = (int)v;
        } else return dt_compress_bad(text, "topk takes momentum= and warmup=");
    }
    return DT_OK;
}

static void topk_format(const void *opts, char *out, size_t cap) {
    const topk_opts *o = opts;
    snprintf(out, cap, "%g:momentum=%g:warmup=%d", o->ratio, o->momentum, o->warmup);
}

typedef struct {
    float *v;      /* accumulated values not yet sent (checkpointed row) */
    float *u;      /* momentum-corrected velocity, when momentum > 0 (checkpointed row) */
    float *mag;    /* scratch: |v| for the selection */
    int32_t *send; /* k (index, value-bits) pairs */
    int32_t *recv; /* world * k pairs */
    size_t k;      /* pairs of this step */
} topk_state;

/* The fraction sent at step `step` (the DGC warm-up: geometric from 1 down to ratio). */
static double density(const topk_opts *s, int64_t step) {
    if (s->warmup <= 0 || step >= s->warmup) return s->ratio;
    return pow(s->ratio, (double)(step + 1) / (double)s->warmup);
}

/* Values sent of a bucket of n at step `step`: ceil(density * n), at least 1. */
static size_t topk_count(const topk_opts *s, int64_t step, size_t n) {
    double k = ceil(density(s, step) * (double)n - 1e-9);
    return k < 1 ? 1 : k > (double)n ? n : (size_t)k;
}

static dt_status topk_init(dt_grad_sync *g, dt_gs_bucket *b, size_t *state_floats) {
    const topk_opts *s = dt_grad_sync_opts(g);
    size_t n = b->hi - b->lo;
    int W = dt_comm_size(dt_grad_sync_config_of(g)->comm);
    topk_state *t = calloc(1, sizeof *t);
    if (t) {
        t->mag = dt_alloc(n * sizeof(float));
        t->send = dt_alloc(2 * n * sizeof(int32_t));
        t->recv = dt_alloc((size_t)W * 2 * n * sizeof(int32_t));
    }
    b->st = t;
    if (!t || !t->mag || !t->send || !t->recv)
        return dt_error(DT_ENOMEM, "`compress` topk: out of memory for a %zu-value bucket", n);
    *state_floats = s->momentum > 0 ? 2 * n : n;
    return DT_OK;
}

static void topk_free(dt_gs_bucket *b) {
    topk_state *t = b->st;
    if (!t) return;
    dt_free(t->mag), dt_free(t->send), dt_free(t->recv);
    free(t);
    b->st = NULL;
}

static void topk_bind(dt_gs_bucket *b, float *state) {
    topk_state *t = b->st;
    t->v = state;
    t->u = state + (b->hi - b->lo); /* used only with momentum (then the row holds both) */
}

static void topk_residual(const dt_gs_bucket *b, float *out) {
    memcpy(out, ((const topk_state *)b->st)->v, (b->hi - b->lo) * sizeof(float));
}

/* The k-th largest of a[0..n) (1 <= k <= n); reorders a (quickselect, Hoare partition). */
static float kth_largest(float *a, size_t n, size_t k) {
    long lo = 0, hi = (long)n - 1, want = (long)k - 1;
    while (lo < hi) {
        float p = a[lo + (hi - lo) / 2];
        long i = lo, j = hi;
        while (i <= j) {
            while (a[i] > p) i++;
            while (a[j] < p) j--;
            if (i <= j) {
                float x = a[i];
                a[i++] = a[j], a[j--] = x;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return a[want]; /* between the parts every value equals the pivot */
    }
    return a[want];
}

/* The selection's magnitude of v: |v|, and inf for a NaN, so that a NaN (fp16 loss scaling's
 * overflow) is always sent, every rank sees it and skips the step; without an order for NaN the
 * selection could pack fewer than k values. */
static inline float mag_of(float v) { return v != v ? INFINITY : fabsf(v); }

/* The k-th largest |v[i]|, exact. Large buckets first pass a threshold from a strided sample of
 * 4096 values that about 2k values exceed (DGC's sampled threshold), then look for the k-th among
 * those; when fewer than k pass, among all n. */
static float kth_magnitude(topk_state *t, size_t n, size_t k) {
    const size_t m = 4096;
    if (n >= 4 * m && k * 8 < n) {
        size_t stride = n / m, ks = (size_t)ceil(2.0 * (double)k * (double)m / (double)n) + 8, c = 0;
        for (size_t j = 0; j < m; j++) t->mag[j] = mag_of(t->v[j * stride]);
        float approx = kth_largest(t->mag, m, ks < m ? ks : m);
        for (size_t i = 0; i < n; i++) {
            float a = mag_of(t->v[i]);
            if (a >= approx) t->mag[c++] = a;
        }
        if (c >= k) return kth_largest(t->mag, c, k); /* the k largest all pass the threshold */
    }
    for (size_t i = 0; i < n; i++) t->mag[i] = mag_of(t->v[i]);
    return kth_largest(t->mag, n, k);
}

/* Packs the k values of largest magnitude of v (lowest indices first among equals) into send and
 * clears them in v (and u). Returns the squared norm of what stays. */
static double select_topk(topk_state *t, size_t n, size_t k, bool momentum) {
    float thr = kth_magnitude(t, n, k);
    size_t above = 0;
    for (size_t i = 0; i < n; i++) above += mag_of(t->v[i]) > thr;
    size_t ties = k - above, m = 0;
    double sq = 0;
    for (size_t i = 0; i < n; i++) {
        float a = mag_of(t->v[i]);
        bool take = a > thr || (a == thr && ties > 0 && (ties--, true));
        if (take && m < k) {
            t->send[2 * m] = (int32_t)i;
            memcpy(&t->send[2 * m + 1], &t->v[i], sizeof(float));
            m++;
            t->v[i] = 0;
            if (momentum) t->u[i] = 0;
        } else sq += (double)t->v[i] * t->v[i];
    }
    return sq;
}

static dt_status topk_start(dt_grad_sync *g, dt_gs_bucket *b) {
    const topk_opts *s = dt_grad_sync_opts(g);
    topk_state *t = b->st;
    size_t n = b->hi - b->lo;
    const bool mom = s->momentum > 0;
    const float M = (float)s->momentum;
    for (size_t i = 0; i < n; i++) {
        if (mom) {
            t->u[i] = M * t->u[i] + b->x[i];
            t->v[i] += t->u[i];
        } else t->v[i] += b->x[i];
    }
    t->k = topk_count(s, dt_grad_sync_step(g), n);
    dt_grad_sync_add_ef(g, select_topk(t, n, t->k, mom));
    dt_grad_sync_count(g, 2 * t->k * sizeof(int32_t), true);
    return dt_comm_iallgather(dt_grad_sync_config_of(g)->comm, t->send, t->recv, 2 * t->k, DT_I32, &b->req);
}

static dt_status topk_advance(dt_grad_sync *g, dt_gs_bucket *b) {
    topk_state *t = b->st;
    size_t n = b->hi - b->lo;
    int W = dt_comm_size(dt_grad_sync_config_of(g)->comm);
    memset(b->x, 0, n * sizeof(float));
    for (int r = 0; r < W; r++) {
        const int32_t *p = t->recv + (size_t)r * 2 * t->k;
        for (size_t j = 0; j < t->k; j++) {
            float v;
            if (p[2 * j] < 0 || (size_t)p[2 * j] >= n)
                return dt_error(DT_EPEER, "`compress` topk: rank %d sent index %d outside its %zu-value bucket", r,
                                p[2 * j], n);
            memcpy(&v, &p[2 * j + 1], sizeof v);
            b->x[p[2 * j]] += v;
        }
    }
    const float inv = 1.0f / (float)W;
    for (size_t i = 0; i < n; i++) b->x[i] *= inv;
    b->stage = DT_GS_DONE;
    return DT_OK;
}

const dt_compressor dt_compress_topk = {
    .name = "topk",
    .options = "RATIO[:momentum=M][:warmup=STEPS]",
    .help = "the RATIO share of values of largest magnitude, as (index, value) pairs allgathered (Deep Gradient "
            "Compression); the rest is kept and added next step; momentum=M: DGC's momentum correction (then train "
            "with plain SGD); warmup=STEPS: the ratio falls from 1 over the first STEPS steps (default 1000)",
    .opts_size = sizeof(topk_opts),
    .parse = topk_parse,
    .format = topk_format,
    .bucket_init = topk_init,
    .bucket_free = topk_free,
    .start = topk_start,
    .advance = topk_advance,
    .bind_state = topk_bind,
    .residual = topk_residual};
