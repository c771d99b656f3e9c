/* A toy gradient compressor written against the compressor registry (src/parallel/grad_sync.h),
 * outside the library: "sign[:block=N]", scaled sign compression with error feedback (1-bit SGD,
 * Seide et al. 2014; EF-SignSGD, Karimireddy et al. 2019). Each rank adds its residual to the
 * bucket, v = x + e, and sends one bit per value (the sign of v) and, per block of N values, the
 * mean |v| of the block as its scale; the ranks' (scale, bits) are allgathered and every rank
 * decodes the mean of scale * sign in rank order (bitwise the same everywhere). What was not sent,
 * e = v - scale * sign(v), is this rank's checkpointed error-feedback state. Registered by
 * toy_parallel_test.c with dt_compress_register(&toy_compress_sign): one file, one line. */
#include "parallel/grad_sync.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int block; /* values per scale, >= 1 (default 64) */
} sign_opts;

static dt_status sign_parse(const char *text, const char *args, void *opts) {
    sign_opts *o = opts;
    o->block = 64;
    if (!*args) return DT_OK;
    double v;
    if (strncmp(args, "block=", 6) != 0) return dt_compress_bad(text, "sign takes block=N");
    args += 6;
    if (!dt_compress_num(&args, 1, 1 << 20, &v) || v != floor(v) || *args)
        return dt_compress_bad(text, "block= needs a whole number of values >= 1");
    o->block = (int)v;
    return DT_OK;
}

static void sign_format(const void *opts, char *out, size_t cap) {
    snprintf(out, cap, "block=%d", ((const sign_opts *)opts)->block);
}

typedef struct {
    float *e;      /* error feedback (this rank's checkpointed row) */
    int32_t *send; /* [scales of the blocks | sign bits, 32 a word] */
    int32_t *recv; /* world x send */
    size_t nblocks, words;
} sign_state;

static dt_status sign_init(dt_grad_sync *g, dt_gs_bucket *b, size_t *state_floats) {
    const size_t n = b->hi - b->lo, block = (size_t)((const sign_opts *)dt_grad_sync_opts(g))->block;
    const int W = dt_comm_size(dt_grad_sync_config_of(g)->comm);
    sign_state *s = calloc(1, sizeof *s);
    b->st = s;
    if (!s) return dt_error(DT_ENOMEM, "--compress sign: out of memory");
    s->nblocks = (n + block - 1) / block;
    s->words = s->nblocks + (n + 31) / 32;
    s->send = calloc(s->words, sizeof *s->send);
    s->recv = calloc((size_t)W * s->words, sizeof *s->recv);
    if (!s->send || !s->recv) return dt_error(DT_ENOMEM, "--compress sign: out of memory for a %zu-value bucket", n);
    *state_floats = n;
    return DT_OK;
}

static void sign_free(dt_gs_bucket *b) {
    sign_state *s = b->st;
    if (!s) return;
    free(s->send), free(s->recv), free(s);
    b->st = NULL;
}

static void sign_bind(dt_gs_bucket *b, float *state) { ((sign_state *)b->st)->e = state; }

static void sign_residual(const dt_gs_bucket *b, float *out) {
    memcpy(out, ((const sign_state *)b->st)->e, (b->hi - b->lo) * sizeof(float));
}

/* v = x + e; per block the scale mean |v| and the signs; e = v - scale * sign(v). */
static dt_status sign_start(dt_grad_sync *g, dt_gs_bucket *b) {
    sign_state *s = b->st;
    const size_t n = b->hi - b->lo, block = (size_t)((const sign_opts *)dt_grad_sync_opts(g))->block;
    uint32_t *bits = (uint32_t *)(s->send + s->nblocks);
    memset(bits, 0, (n + 31) / 32 * sizeof *bits);
    double sq = 0;
    for (size_t k = 0; k < s->nblocks; k++) {
        const size_t lo = k * block, hi = lo + block < n ? lo + block : n;
        double l1 = 0;
        for (size_t i = lo; i < hi; i++) l1 += fabs((double)b->x[i] + s->e[i]);
        const float scale = (float)(l1 / (double)(hi - lo));
        memcpy(&s->send[k], &scale, sizeof scale);
        for (size_t i = lo; i < hi; i++) {
            const float v = b->x[i] + s->e[i];
            if (v >= 0) bits[i / 32] |= 1u << (i % 32);
            s->e[i] = v - (v >= 0 ? scale : -scale);
            sq += (double)s->e[i] * s->e[i];
        }
    }
    dt_grad_sync_add_ef(g, sq);
    dt_grad_sync_count(g, s->words * sizeof(int32_t), true);
    return dt_comm_iallgather(dt_grad_sync_config_of(g)->comm, s->send, s->recv, s->words, DT_I32, &b->req);
}

/* The mean over the ranks, in rank order, of scale * sign. */
static dt_status sign_advance(dt_grad_sync *g, dt_gs_bucket *b) {
    sign_state *s = b->st;
    const size_t n = b->hi - b->lo, block = (size_t)((const sign_opts *)dt_grad_sync_opts(g))->block;
    const int W = dt_comm_size(dt_grad_sync_config_of(g)->comm);
    memset(b->x, 0, n * sizeof(float));
    for (int r = 0; r < W; r++) {
        const int32_t *p = s->recv + (size_t)r * s->words;
        const uint32_t *bits = (const uint32_t *)(p + s->nblocks);
        for (size_t i = 0; i < n; i++) {
            float scale;
            memcpy(&scale, &p[i / block], sizeof scale);
            b->x[i] += (bits[i / 32] >> (i % 32) & 1u) ? scale : -scale;
        }
    }
    for (size_t i = 0; i < n; i++) b->x[i] /= (float)W;
    b->stage = DT_GS_DONE;
    return DT_OK;
}

const dt_compressor toy_compress_sign = {
    .name = "sign",
    .options = "block=N",
    .help = "toy (tests/toy): the sign of each value, one bit, and per block of N values their mean magnitude "
            "(default 64), with error feedback",
    .opts_size = sizeof(sign_opts),
    .parse = sign_parse,
    .format = sign_format,
    .bucket_init = sign_init,
    .bucket_free = sign_free,
    .start = sign_start,
    .advance = sign_advance,
    .bind_state = sign_bind,
    .residual = sign_residual};
