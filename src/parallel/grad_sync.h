/* Gradient sync as a hook table (PyTorch DDP comm hooks): how a bucket of the gradient slab (or of
 * any float vector, localsgd's model delta) travels between the replicas. One compressor entry per
 * format: plain allreduce, fp16/bf16 casts, top-k (Deep Gradient Compression), PowerSGD. Each
 * bucket moves through the compressor's stages (one collective each, issued non-blocking): a
 * strategy starts a bucket as soon as its values are final, polls while backward continues (so a
 * second stage, PowerSGD's Q allreduce, starts without waiting for the step), and finishes it
 * before the update. The result in the bucket is the mean over the ranks of what each sent.
 * Lossy compressors keep error feedback: what a rank did not send is added to its next step. */
#ifndef DT_PARALLEL_GRAD_SYNC_H
#define DT_PARALLEL_GRAD_SYNC_H

#include "parallel/strategy.h"

typedef enum { DT_COMPRESS_NONE = 0, DT_COMPRESS_FP16, DT_COMPRESS_BF16, DT_COMPRESS_TOPK, DT_COMPRESS_POWERSGD } dt_compress_kind;

/* A compressor and its parameters, as "--compress" gives it. */
typedef struct {
    dt_compress_kind kind;
    double ratio;      /* topk: fraction of the values sent, (0, 1] */
    double momentum;   /* topk: DGC momentum correction (0 = off; then train with plain SGD) */
    int warmup;        /* topk: steps over which the ratio falls from 1 to `ratio` (DGC warm-up);
                        * powersgd: steps of plain allreduce first (PyTorch's start_powerSGD_iter);
                        * DT_COMPRESS_DEFAULT_WARMUP where the text gives none */
    int rank;          /* powersgd: rank r of the approximation, >= 1 */
    double min_rate;   /* powersgd: an n x m matrix is compressed only when its factors are at least this
                        * many times smaller, (n + m) r min_rate < n m (PyTorch's min_compression_rate);
                        * others travel plain with the biases. DT_PSGD_DEFAULT_MIN_RATE where not given */
} dt_compress_spec;

/* The warm-up of topk and powersgd when the text gives none: PyTorch's default start_powerSGD_iter.
 * Low-rank and sparse gradients early in training cost accuracy that the rest of a short run does
 * not win back (docs/parallel.md has the measurements); warmup=0 compresses from the first step. */
#define DT_COMPRESS_DEFAULT_WARMUP 1000
/* PowerSGD's min_rate when the text gives none: PyTorch's default min_compression_rate. A matrix
 * whose factors save less than half of it (a rank near its smaller side) is sent whole: exact, and
 * at most twice the bytes of its factors. min_rate=0 compresses every matrix. */
#define DT_PSGD_DEFAULT_MIN_RATE 2.0

/* Parses "none", "fp16", "bf16", "topk:RATIO[:momentum=M][:warmup=STEPS]",
 * "powersgd:RANK[:warmup=S][:min_rate=X]" into *out (warmup DT_COMPRESS_DEFAULT_WARMUP, min_rate
 * DT_PSGD_DEFAULT_MIN_RATE where not given); DT_EINVAL naming the text and the accepted forms. */
dt_status dt_compress_parse(const char *text, dt_compress_spec *out);
/* Writes the canonical text of spec (parsable by dt_compress_parse) to out; min_rate only where it
 * is not the default. */
void dt_compress_format(const dt_compress_spec *spec, char *out, size_t cap);

/* One bucket of a sync: the vector range [lo, hi) and where it stands. */
typedef struct {
    size_t lo, hi;
    float *x;            /* the values being synced, host memory the comm takes (set by dt_grad_sync_start) */
    float *dev_x;        /* staging (cfg.stage): the bucket's device memory, x's source and destination */
    dt_request *req;     /* the collective in flight, or NULL */
    int stage;           /* 0 idle, 1.. stage in flight, DT_GS_DONE finished */
    bool failed;
    bool last;           /* the last bucket: started once backward is done, nothing left to overlap */
    double t_issue;
    void *st;            /* the compressor's state of this bucket */
} dt_gs_bucket;
#define DT_GS_DONE 1000

typedef struct dt_grad_sync dt_grad_sync;

/* The hook table entry of one compressor. */
typedef struct {
    const char *name;
    int stages;           /* collectives per bucket (0 = 1). Stage s+1 of a bucket is issued when the
                           * next bucket starts or at finish: the same order on every rank. */
    /* Allocates b->st for bucket b; *state_floats gets the error-feedback floats it keeps. */
    dt_status (*bucket_init)(dt_grad_sync *g, dt_gs_bucket *b, size_t *state_floats);
    void (*bucket_free)(dt_gs_bucket *b);
    /* Compresses b->x (adding the residual) and issues the first collective into b->req. */
    dt_status (*start)(dt_grad_sync *g, dt_gs_bucket *b);
    /* b->req has completed: issues the next stage's collective (b->stage++), or writes the mean of
     * the ranks' payloads into b->x and sets b->stage = DT_GS_DONE. */
    dt_status (*advance)(dt_grad_sync *g, dt_gs_bucket *b);
    /* Points state[0..state_floats) of the bucket at the checkpointed floats (row of this rank). */
    void (*bind_state)(dt_gs_bucket *b, float *state);
    /* Writes what this rank has not sent yet (the residual, in the bucket's layout) to out[0..n). */
    void (*residual)(const dt_gs_bucket *b, float *out);
} dt_compressor;

/* What the sync of one vector needs to know about it. */
typedef struct {
    dt_comm *comm;
    dt_model *model;         /* tensor table (shapes, for PowerSGD) */
    size_t n;                /* floats in the vector */
    const size_t *lo, *hi;   /* nb bucket ranges */
    int nb;
    /* The device of the vector when the comm does not take its memory (dt_strategy_stage_device),
     * else NULL: each bucket is downloaded into a host buffer of the sync's own at start, travels
     * from there (every compressor works on host memory) and is uploaded back once it is done, in
     * poll (overlapped with backward) or finish. */
    struct dt_dev *stage;
} dt_grad_sync_config;

/* Per-step figures, summed over the buckets. */
typedef struct {
    double payload_bytes;    /* bytes this rank handed to the collectives */
    double wire_bytes;       /* bytes this rank sends with bandwidth-optimal algorithms (ring) */
    double raw_bytes;        /* f32 bytes a plain allreduce would have handed over */
    double ef_norm;          /* L2 norm of this rank's error-feedback residual after the step, as kept
                              * (fp16: at the loss scale; dt_step_stats.ef_norm divides it out) */
} dt_grad_sync_stats;

/* Creates the sync of spec for cfg; the hook entry is chosen from spec->kind. */
dt_status dt_grad_sync_create(dt_grad_sync **out, const dt_compress_spec *spec, const dt_grad_sync_config *cfg);
void dt_grad_sync_destroy(dt_grad_sync *g);
/* The compressor entry in use. */
const dt_compressor *dt_grad_sync_compressor(const dt_grad_sync *g);
/* Starts a step (the top-k ratio warm-up counts these steps). */
void dt_grad_sync_begin_step(dt_grad_sync *g, int64_t step);
/* Starts bucket i on x[lo, hi) (x: the whole vector, device memory where cfg.stage is set); errors
 * show at finish. Buckets start in
 * index order; earlier buckets waiting for a next stage get it issued first (it may wait for
 * their previous collective). */
void dt_grad_sync_start(dt_grad_sync *g, int i, float *x);
/* Never blocking: a started bucket whose last collective has completed is unpacked. (A next stage
 * is never issued here: completion order differs between ranks, issue order must not.) */
void dt_grad_sync_poll(dt_grad_sync *g);
/* Waits for bucket i to go through all its stages; its result is in x[lo, hi). */
dt_status dt_grad_sync_finish(dt_grad_sync *g, int i);
/* The figures of the current step (after every bucket finished). */
dt_grad_sync_stats dt_grad_sync_step_stats(const dt_grad_sync *g);
/* Writes this rank's error-feedback residual (what it has not sent yet) as a vector x[0..n). */
void dt_grad_sync_residual(const dt_grad_sync *g, float *x);
/* For dynamic loss scaling (fp16): the error-feedback state holds gradients at the loss scale of
 * the step that kept them, so when the scale changes by `factor` after a step, this rank's state
 * is multiplied by it (a value that is not finite is zeroed); factor 0 after a skipped step (its
 * gradients overflowed and the state took the inf in) zeroes it, losing the feedback of earlier
 * steps that was not yet sent. PowerSGD's warm-start Q, in the same row, is orthonormalised
 * before use, and a zeroed column is redrawn. */
void dt_grad_sync_rescale_state(dt_grad_sync *g, float factor);
/* Makes the state checkpointable: allgathers every rank's error-feedback state so the one writer
 * (rank 0) holds all of them. Collective. */
dt_status dt_grad_sync_gather_state(dt_grad_sync *g);
/* Visits the error-feedback state ("compress.<name>.state", [world, floats]) when there is any. */
dt_status dt_grad_sync_visit_state(dt_grad_sync *g, dt_state_visit_fn fn, void *ctx);

/* ---- for the compressors (grad_sync.c) ---- */
int64_t dt_grad_sync_step(const dt_grad_sync *g);
const dt_compress_spec *dt_grad_sync_spec(const dt_grad_sync *g);
const dt_grad_sync_config *dt_grad_sync_config_of(const dt_grad_sync *g);
/* Counts a collective of this step: payload bytes of this rank, allgather or allreduce. */
void dt_grad_sync_count(dt_grad_sync *g, size_t payload_bytes, bool allgather);
/* Adds the squared residual norm of a bucket to this step's figure. */
void dt_grad_sync_add_ef(dt_grad_sync *g, double sq);

extern const dt_compressor dt_compress_none, dt_compress_fp16, dt_compress_bf16, dt_compress_topk,
    dt_compress_powersgd;

#endif
