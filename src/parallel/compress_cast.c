/* The plain and the cast entries of the gradient-sync table: "none" allreduces the f32 bucket as
 * it is; "fp16" and "bf16" round it to 16 bits (half the bytes), allreduce those (the
 * communicator reduces them in f32 and rounds once) and widen the mean again. The casts keep
 * error feedback: the rounding error of this step is added to the next step's values. */
#include "parallel/grad_sync.h"

#include <stdlib.h>
#include <string.h>

/* ---- none ---- */

static dt_status none_start(dt_grad_sync *g, dt_gs_bucket *b) {
    size_t n = b->hi - b->lo;
    dt_comm *c = dt_grad_sync_config_of(g)->comm;
    dt_grad_sync_count(g, n * sizeof(float), false);
    /* the last bucket runs here, blocking: nothing is left to overlap it with, and it saves the
     * hand-off to the progress thread (finish then only unpacks) */
    if (b->last) return dt_comm_allreduce(c, b->x, b->x, n, DT_F32, DT_OP_AVG);
    return dt_comm_iallreduce(c, b->x, b->x, n, DT_F32, DT_OP_AVG, &b->req);
}

static dt_status none_advance(dt_grad_sync *g, dt_gs_bucket *b) {
    (void)g;
    b->stage = DT_GS_DONE;
    return DT_OK;
}

const dt_compressor dt_compress_none = {.name = "none",
                                        .help = "the f32 values, allreduced as they are (the default)",
                                        .options = "",
                                        .start = none_start,
                                        .advance = none_advance};

/* ---- fp16 / bf16 ---- */

typedef struct {
    uint16_t *h; /* the 16-bit payload */
    float *res;  /* error feedback: what rounding took off last step (in the checkpointed row) */
} cast_state;

static dt_status cast_init(dt_grad_sync *g, dt_gs_bucket *b, size_t *state_floats) {
    (void)g;
    cast_state *c = calloc(1, sizeof *c);
    if (c) c->h = dt_alloc((b->hi - b->lo) * sizeof(uint16_t));
    if (!c || !c->h) {
        free(c);
        return dt_error(DT_ENOMEM, "`compress`: out of memory for a %zu-value bucket", b->hi - b->lo);
    }
    b->st = c;
    *state_floats = b->hi - b->lo;
    return DT_OK;
}

static void cast_free(dt_gs_bucket *b) {
    cast_state *c = b->st;
    if (!c) return;
    dt_free(c->h);
    free(c);
    b->st = NULL;
}

static void cast_bind(dt_gs_bucket *b, float *state) { ((cast_state *)b->st)->res = state; }

static void cast_residual(const dt_gs_bucket *b, float *out) {
    memcpy(out, ((const cast_state *)b->st)->res, (b->hi - b->lo) * sizeof(float));
}

/* The payload h = round(x + res), and res = what the rounding took off, in blocks that stay in
 * L1: dt_convert's vector conversions do the rounding (one call per element was 6.5 ns for fp16,
 * more than an MLP step's compute over its 101,770 gradients). */
static dt_status cast_start(dt_grad_sync *g, dt_gs_bucket *b, bool bf16) {
    enum { BLK = 512 };
    cast_state *c = b->st;
    const dt_dtype t = bf16 ? DT_BF16 : DT_F16;
    size_t n = b->hi - b->lo;
    double sq = 0;
    for (size_t o = 0; o < n; o += BLK) {
        const size_t m = n - o < BLK ? n - o : BLK;
        float v[BLK], r[BLK];
        float *restrict res = c->res + o;
        const float *restrict x = b->x + o;
        for (size_t i = 0; i < m; i++) v[i] = x[i] + res[i];
        dt_convert(c->h + o, t, v, DT_F32, m);
        dt_convert(r, DT_F32, c->h + o, t, m);
        for (size_t i = 0; i < m; i++) res[i] = v[i] - r[i];
        float acc[16] = {0}; /* 16 sums in f32 (the vector lanes), then f64: the figure is a diagnostic */
        size_t i = 0;
        for (; i + 16 <= m; i += 16)
            for (int k = 0; k < 16; k++) acc[k] += res[i + k] * res[i + k];
        for (; i < m; i++) acc[0] += res[i] * res[i];
        for (int k = 0; k < 16; k++) sq += acc[k];
    }
    dt_grad_sync_add_ef(g, sq);
    dt_grad_sync_count(g, n * sizeof(uint16_t), false);
    return dt_comm_iallreduce(dt_grad_sync_config_of(g)->comm, c->h, c->h, n, t, DT_OP_AVG, &b->req);
}

static dt_status fp16_start(dt_grad_sync *g, dt_gs_bucket *b) { return cast_start(g, b, false); }
static dt_status bf16_start(dt_grad_sync *g, dt_gs_bucket *b) { return cast_start(g, b, true); }

static dt_status cast_advance(dt_grad_sync *g, dt_gs_bucket *b, bool bf16) {
    (void)g;
    cast_state *c = b->st;
    dt_convert(b->x, DT_F32, c->h, bf16 ? DT_BF16 : DT_F16, b->hi - b->lo);
    b->stage = DT_GS_DONE;
    return DT_OK;
}

static dt_status fp16_advance(dt_grad_sync *g, dt_gs_bucket *b) { return cast_advance(g, b, false); }
static dt_status bf16_advance(dt_grad_sync *g, dt_gs_bucket *b) { return cast_advance(g, b, true); }

const dt_compressor dt_compress_fp16 = {.name = "fp16",
                                        .options = "",
                                        .help = "rounded to IEEE half precision (half the bytes); the rounding error "
                                                "is added to the next step (error feedback)",
                                        .bucket_init = cast_init,
                                        .bucket_free = cast_free,
                                        .start = fp16_start,
                                        .advance = fp16_advance,
                                        .bind_state = cast_bind,
                                        .residual = cast_residual};
const dt_compressor dt_compress_bf16 = {.name = "bf16",
                                        .options = "",
                                        .help = "rounded to bfloat16 (half the bytes, f32's range), with error "
                                                "feedback",
                                        .bucket_init = cast_init,
                                        .bucket_free = cast_free,
                                        .start = bf16_start,
                                        .advance = bf16_advance,
                                        .bind_state = cast_bind,
                                        .residual = cast_residual};
