/* PowerSGD (Vogels et al., NeurIPS 2019): each weight matrix M (n x m: a tensor's first dimension
 * by the rest) of a bucket travels as a rank-r product P Q^T. With error feedback M = grad + e:
 * P = M Q (Q warm-started from the last step), allreduce P (mean), orthonormalise P's columns
 * (Gram-Schmidt, twice), Q = M^T P, allreduce Q, then M ~ P Q^T and e = M - P Q^T. One-dimensional
 * tensors (biases), and matrices whose factors would save less than min_rate (PyTorch's
 * min_compression_rate), ride uncompressed with P. The warm-start Q is orthonormalised first (PowerSGD
 * spans the same space) and refilled where it lost rank, so full rank reproduces M. The two allreduces are two stages
 * of the bucket: the second is issued when the next bucket starts (after the backward of the layers between them, so P
 * has usually arrived), and runs while backward continues on earlier layers (PyTorch's hook waits for P before it
 * returns: pytorch/pytorch#74148). The issue order is the same on every rank. The checkpointed row of a bucket is [Q of
 * each matrix | e of each matrix]. warmup=S: the first S steps are plain allreduces (PyTorch's start_powerSGD_iter). */
#include "parallel/grad_sync.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PowerSGD's min_rate when the text gives none: PyTorch's default min_compression_rate. A matrix
 * whose factors save less than half of it (a rank near its smaller side) is sent whole: exact, and
 * at most twice the bytes of its factors. min_rate=0 compresses every matrix. */
#define PSGD_DEFAULT_MIN_RATE 2.0

/* powersgd's options: "powersgd:RANK[:warmup=STEPS][:min_rate=X]". */
typedef struct {
    int rank;        /* rank r of the approximation, >= 1 */
    int warmup;      /* steps of plain allreduce first (PyTorch's start_powerSGD_iter) */
    double min_rate; /* an n x m matrix is compressed only when its factors are at least this many times
                      * smaller, (n + m) r min_rate < n m (PyTorch's min_compression_rate); others
                      * travel plain with the biases */
} psgd_opts;

static dt_status psgd_parse(const char *text, const char *p, void *opts) {
    psgd_opts *o = opts;
    double r;
    if (!dt_compress_num(&p, 1, 1e6, &r) || r != floor(r))
        return dt_compress_bad(text, "the rank must be a whole number >= 1");
    o->rank = (int)r, o->warmup = DT_COMPRESS_DEFAULT_WARMUP, o->min_rate = PSGD_DEFAULT_MIN_RATE;
    while (*p == ':') {
        p++;
        double v;
        if (!strncmp(p, "warmup=", 7)) {
            p += 7;
            if (!dt_compress_num(&p, 0, 1e9, &v) || v != floor(v))
                return dt_compress_bad(text, "warmup= needs a whole number of steps");
            o->warmup = (int)v;
        } else if (!strncmp(p, "min_rate=", 9)) {
            p += 9;
            if (!dt_compress_num(&p, 0, 1e6, &v))
                return dt_compress_bad(text, "min_rate= needs a number >= 0 (compress a matrix only when its factors "
                                             "are that many times smaller; 0 compresses every matrix)");
            o->min_rate = v;
        } else
            return dt_compress_bad(text, "powersgd takes :warmup=STEPS (plain allreduce for the first STEPS steps) "
                                         "and :min_rate=X");
    }
    return DT_OK;
}

/* min_rate only where it is not the default. */
static void psgd_format(const void *opts, char *out, size_t cap) {
    const psgd_opts *o = opts;
    if (o->min_rate == PSGD_DEFAULT_MIN_RATE) snprintf(out, cap, "%d:warmup=%d", o->rank, o->warmup);
    else snprintf(out, cap, "%d:warmup=%d:min_rate=%.17g", o->rank, o->warmup, o->min_rate);
}

typedef struct {
    size_t off, n, m, r; /* matrix at bucket offset off, n x m, rank r */
    size_t p, q, e;      /* its P in pay (after the plain values), Q in the q row, e in the e row */
} psgd_mat;

typedef struct {
    size_t off, len; /* a plain (uncompressed) range of the bucket */
} psgd_plain;

typedef struct {
    psgd_mat *mat; /* one per tensor at most (the model's tensor count) */
    psgd_plain *plain;
    int nmat, nplain;
    size_t nplain_vals, np, nq, ne;
    float *pay;      /* [plain values | P of each matrix] */
    float *q, *e;    /* in the checkpointed row */
    bool plain_step; /* this step is in the warm-up: a plain f32 allreduce of the bucket */
} psgd_state;

/* Adds tensor t's part of bucket b to the layout: a matrix (n = its first dimension, m = the rest,
 * rank r = min(rank, n, m)) when all of it is in b and its factors are at least min_rate times
 * smaller than it, (n + m) r min_rate < n m (PyTorch's _should_compress); plain otherwise. */
static dt_status add_tensor(psgd_state *s, const dt_gs_bucket *b, const dt_param_info *t, int rank, double min_rate) {
    size_t lo = t->offset > b->lo ? t->offset : b->lo, hi = t->offset + t->numel < b->hi ? t->offset + t->numel : b->hi;
    if (lo >= hi) return DT_OK;
    bool whole = lo == t->offset && hi == t->offset + t->numel;
    size_t n = t->ndim >= 2 ? (size_t)t->shape[0] : t->numel, m = n ? t->numel / n : 0;
    size_t r = (size_t)rank < n ? (size_t)rank : n;
    if (r > m) r = m;
    if (whole && t->ndim >= 2 && n > 1 && m > 1 && (double)((n + m) * r) * min_rate < (double)(n * m)) {
        psgd_mat *x = &s->mat[s->nmat++];
        x->off = lo - b->lo, x->n = n, x->m = m, x->r = r;
        x->p = s->np, x->q = s->nq, x->e = s->ne;
        s->np += x->n * x->r, s->nq += x->m * x->r, s->ne += x->n * x->m;
        return DT_OK;
    }
    s->plain[s->nplain++] = (psgd_plain){lo - b->lo, hi - lo};
    s->nplain_vals += hi - lo;
    return DT_OK;
}

static dt_status psgd_init(dt_grad_sync *g, dt_gs_bucket *b, size_t *state_floats) {
    const dt_grad_sync_config *c = dt_grad_sync_config_of(g);
    const psgd_opts *o = dt_grad_sync_opts(g);
    psgd_state *s = calloc(1, sizeof *s);
    b->st = s;
    size_t nt = (size_t)dt_model_num_tensors(c->model) + 1;
    if (s) s->mat = calloc(nt, sizeof *s->mat), s->plain = calloc(nt, sizeof *s->plain);
    if (!s || !s->mat || !s->plain) return dt_error(DT_ENOMEM, "`compress` powersgd: out of memory");
    for (int i = 0; i < dt_model_num_tensors(c->model); i++) {
        const dt_param_info *t = dt_model_tensor(c->model, i);
        if (!t->is_buffer) DT_TRY(add_tensor(s, b, t, o->rank, o->min_rate));
    }
    s->pay = dt_alloc((s->nplain_vals + s->np + 1) * sizeof(float));
    if (!s->pay) return dt_error(DT_ENOMEM, "`compress` powersgd: out of memory for a %zu-value bucket", b->hi - b->lo);
    *state_floats = s->nq + s->ne;
    return DT_OK;
}

static void psgd_free(dt_gs_bucket *b) {
    psgd_state *s = b->st;
    if (!s) return;
    dt_free(s->pay);
    free(s->mat), free(s->plain);
    free(s);
    b->st = NULL;
}

/* Binds the row and draws the first Q of each matrix: N(0,1), the same on every rank. */
static void psgd_bind(dt_gs_bucket *b, float *state) {
    psgd_state *s = b->st;
    s->q = state, s->e = state + s->nq;
    for (int i = 0; i < s->nmat; i++)
        dt_rng_fill_normal(s->q + s->mat[i].q, s->mat[i].m * s->mat[i].r, 0.0f, 1.0f, 0x9e3779b97f4a7c15ull,
                           dt_rng_key(DT_RNG_USER + 15, ((uint64_t)b->lo << 8) + (uint64_t)i));
}

static void psgd_residual(const dt_gs_bucket *b, float *out) {
    const psgd_state *s = b->st;
    for (int i = 0; i < s->nmat; i++)
        memcpy(out + s->mat[i].off, s->e + s->mat[i].e, s->mat[i].n * s->mat[i].m * sizeof(float));
}

/* Projects column j of A (n x r, row-major) off columns 0..j-1 (twice, in double) and returns
 * its remaining norm. */
static double project_out(float *A, size_t n, size_t r, size_t j) {
    for (int pass = 0; pass < 2; pass++)
        for (size_t k = 0; k < j; k++) {
            double d = 0;
            for (size_t i = 0; i < n; i++) d += (double)A[i * r + j] * A[i * r + k];
            for (size_t i = 0; i < n; i++) A[i * r + j] -= (float)(d * A[i * r + k]);
        }
    double nn = 0;
    for (size_t i = 0; i < n; i++) nn += (double)A[i * r + j] * A[i * r + j];
    return sqrt(nn);
}

/* Orthonormalises the r columns of A (n x r, row-major) in place (Gram-Schmidt). A column that
 * collapses (its norm falls below 1e-4 of what it had: A lost rank) is zeroed, or with
 * refill != 0 replaced by a random direction keyed by refill (the same on every rank): a warm-
 * started Q that lost rank would otherwise never regain it. */
static void orthonormalise(float *A, size_t n, size_t r, uint64_t refill) {
    for (size_t j = 0; j < r; j++) {
        double before = 0;
        for (size_t i = 0; i < n; i++) before += (double)A[i * r + j] * A[i * r + j];
        double after = project_out(A, n, r, j);
        if (after <= 1e-4 * sqrt(before) || after == 0) {
            after = 0;
            for (size_t i = 0; refill && i < n; i++) A[i * r + j] = dt_rng_uniform(0x5eed, refill + j, i) - 0.5f;
            if (refill) after = project_out(A, n, r, j);
        }
        double inv = after > 0 ? 1.0 / after : 0.0;
        for (size_t i = 0; i < n; i++) A[i * r + j] = (float)(A[i * r + j] * inv);
    }
}

static dt_status psgd_start(dt_grad_sync *g, dt_gs_bucket *b) {
    psgd_state *s = b->st;
    s->plain_step = dt_grad_sync_step(g) < ((const psgd_opts *)dt_grad_sync_opts(g))->warmup;
    if (s->plain_step) { /* warm-up: uncompressed, no error feedback (the residual stays 0) */
        dt_grad_sync_count(g, (b->hi - b->lo) * sizeof(float), false);
        return dt_comm_iallreduce(dt_grad_sync_config_of(g)->comm, b->x, b->x, b->hi - b->lo, DT_F32, DT_OP_AVG,
                                  &b->req);
    }
    float *pp = s->pay + s->nplain_vals;
    size_t k = 0;
    for (int i = 0; i < s->nplain; i++, k += s->plain[i - 1].len)
        memcpy(s->pay + k, b->x + s->plain[i].off, s->plain[i].len * sizeof(float));
    for (int i = 0; i < s->nmat; i++) {
        const psgd_mat *x = &s->mat[i];
        float *M = b->x + x->off, *e = s->e + x->e;
        for (size_t j = 0; j < x->n * x->m; j++) M[j] += e[j]; /* error feedback */
        /* warm start from last step's Q, orthonormal and of full rank (same span otherwise) */
        orthonormalise(s->q + x->q, x->m, x->r, dt_rng_key(DT_RNG_USER + 16, (uint64_t)dt_grad_sync_step(g) << 20));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)x->n, (int)x->r, (int)x->m, 1.0f, M, (int)x->m,
                    s->q + x->q, (int)x->r, 0.0f, pp + x->p, (int)x->r);
    }
    size_t len = s->nplain_vals + s->np;
    dt_grad_sync_count(g, len * sizeof(float), false);
    return dt_comm_iallreduce(dt_grad_sync_config_of(g)->comm, s->pay, s->pay, len, DT_F32, DT_OP_AVG, &b->req);
}

/* Stage 1 done: plain values back, P orthonormal, Q = M^T P, allreduce Q. */
static dt_status after_p(dt_grad_sync *g, dt_gs_bucket *b) {
    psgd_state *s = b->st;
    float *pp = s->pay + s->nplain_vals;
    size_t k = 0;
    for (int i = 0; !s->plain_step && i < s->nplain; i++, k += s->plain[i - 1].len)
        memcpy(b->x + s->plain[i].off, s->pay + k, s->plain[i].len * sizeof(float));
    if (s->nmat == 0 || s->plain_step) {
        b->stage = DT_GS_DONE;
        return DT_OK;
    }
    for (int i = 0; i < s->nmat; i++) {
        const psgd_mat *x = &s->mat[i];
        orthonormalise(pp + x->p, x->n, x->r, 0);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)x->m, (int)x->r, (int)x->n, 1.0f, b->x + x->off,
                    (int)x->m, pp + x->p, (int)x->r, 0.0f, s->q + x->q, (int)x->r);
    }
    b->stage = 2;
    dt_grad_sync_count(g, s->nq * sizeof(float), false);
    return dt_comm_iallreduce(dt_grad_sync_config_of(g)->comm, s->q, s->q, s->nq, DT_F32, DT_OP_AVG, &b->req);
}

/* Stage 2 done: M ~ P Q^T into the bucket, the rest into e. */
static dt_status after_q(dt_grad_sync *g, dt_gs_bucket *b) {
    psgd_state *s = b->st;
    const float *pp = s->pay + s->nplain_vals;
    double sq = 0;
    for (int i = 0; i < s->nmat; i++) {
        const psgd_mat *x = &s->mat[i];
        float *M = b->x + x->off, *e = s->e + x->e;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)x->n, (int)x->m, (int)x->r, 1.0f, pp + x->p,
                    (int)x->r, s->q + x->q, (int)x->r, 0.0f, e, (int)x->m);
        for (size_t j = 0; j < x->n * x->m; j++) {
            float approx = e[j];
            e[j] = M[j] - approx;
            M[j] = approx;
            sq += (double)e[j] * e[j];
        }
    }
    dt_grad_sync_add_ef(g, sq);
    b->stage = DT_GS_DONE;
    return DT_OK;
}

static dt_status psgd_advance(dt_grad_sync *g, dt_gs_bucket *b) {
    return b->stage == 1 ? after_p(g, b) : after_q(g, b);
}

const dt_compressor dt_compress_powersgd = {
    .name = "powersgd",
    .options = "RANK[:warmup=STEPS][:min_rate=X]",
    .help = "each weight matrix as a rank-RANK product P Q^T (PowerSGD: two allreduces), the rest kept for the next "
            "step; biases travel whole; warmup=STEPS: plain allreduce first (default 1000); min_rate=X: compress a "
            "matrix only when its factors are X times smaller (default 2; 0: every matrix)",
    .opts_size = sizeof(psgd_opts),
    .parse = psgd_parse,
    .format = psgd_format,
    .state_hint = "it is the `compress` error-feedback state of each rank; resume with as many workers, the same "
                  "`compress` and `bucket_mb` (a powersgd checkpoint written before min_rate existed compressed every "
                  "matrix: add :min_rate=0)",
    .stages = 2,
    .bucket_init = psgd_init,
    .bucket_free = psgd_free,
    .start = psgd_start,
    .advance = psgd_advance,
    .bind_state = psgd_bind,
    .residual = psgd_residual};
