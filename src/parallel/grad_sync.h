/* Gradient sync as a hook table (PyTorch DDP comm hooks): how a bucket of the gradient slab (or of
 * any float vector, localsgd's model delta) travels between the replicas. One compressor entry per
 * format, each in its own file with its options and their parser, listed by the registry
 * (compress.c): plain allreduce, fp16/bf16 casts, top-k (Deep Gradient Compression), PowerSGD. Each
 * bucket moves through the compressor's stages (one collective each, issued non-blocking): a
 * strategy starts a bucket as soon as its values are final, polls while backward continues (so a
 * second stage, PowerSGD's Q allreduce, starts without waiting for the step), and finishes it
 * before the update. The result in the bucket is the mean over the ranks of what each sent.
 * Lossy compressors keep error feedback: what a rank did not send is added to its next step. */
#ifndef DT_PARALLEL_GRAD_SYNC_H
#define DT_PARALLEL_GRAD_SYNC_H

#include "parallel/strategy.h"

typedef struct dt_compressor dt_compressor;

/* Room for any compressor's options (dt_compressor.opts_size is at most this). */
enum { DT_COMPRESS_OPTS_MAX = 48 };

/* A compressor and its options, as "--compress" gives it: the registry entry and the options
 * struct of its own file (private to it; dt_grad_sync_opts hands it back to its functions). */
typedef struct {
    const dt_compressor *c; /* dt_compress_none when the text gives none */
    union {
        double align_;
        unsigned char bytes[DT_COMPRESS_OPTS_MAX];
    } opts;
} dt_compress_spec;

/* The warm-up of topk and powersgd when the text gives none: PyTorch's default start_powerSGD_iter.
 * Low-rank and sparse gradients early in training cost accuracy that the rest of a short run does
 * not win back (docs/parallel.md has the measurements); warmup=0 compresses from the first step. */
#define DT_COMPRESS_DEFAULT_WARMUP 1000

/* ---- the registry (compress.c): compressors by name, each parsing its own options ---- */

/* Parses "NAME" or "NAME:ARGS" (NULL or "" is none) into *out: the entry named and its options,
 * parsed by the entry. DT_EINVAL naming the text and the accepted forms (every entry's syntax). */
dt_status dt_compress_parse(const char *text, dt_compress_spec *out);
/* Writes the canonical text of spec (parsable by dt_compress_parse) to out: "NAME" or
 * "NAME:OPTIONS" as the entry's format writes them. */
void dt_compress_format(const dt_compress_spec *spec, char *out, size_t cap);
/* Whether spec is the plain f32 allreduce ("none"). */
bool dt_compress_is_none(const dt_compress_spec *spec);
/* The registry, in the order of its help: *n entries (registered ones last). */
const dt_compressor *const *dt_compressors(int *n);
/* The entry named name, or NULL. */
const dt_compressor *dt_compress_find(const char *name);
/* Adds entry c to the registry (a compressor defined outside the library: tests/toy/). Call it
 * before any parse, from one thread. DT_EINVAL when its name is taken, it lacks name, help,
 * options or its functions, or its options do not fit; DT_ENOMEM when the registry is full. */
dt_status dt_compress_register(const dt_compressor *c);
/* For a compressor's parse: DT_EINVAL "--compress TEXT: WHY (use FORMS, e.g. ...)". */
dt_status dt_compress_bad(const char *text, const char *why);
/* For a compressor's parse: the number in [lo, hi] at *p (up to ':' or the end), *p moved past it;
 * false when it is not one. */
bool dt_compress_num(const char **p, double lo, double hi, double *out);

/* One bucket of a sync: the vector range [lo, hi) and where it stands. */
typedef struct {
    size_t lo, hi;
    float *x;        /* the values being synced, host memory the comm takes (set by dt_grad_sync_start) */
    float *dev_x;    /* staging (cfg.stage): the bucket's device memory, x's source and destination */
    dt_request *req; /* the collective in flight, or NULL */
    int stage;       /* 0 idle, 1.. stage in flight, DT_GS_DONE finished */
    bool failed;
    bool last; /* the last bucket: started once backward is done, nothing left to overlap */
    double t_issue;
    void *st; /* the compressor's state of this bucket */
} dt_gs_bucket;
#define DT_GS_DONE 1000

typedef struct dt_grad_sync dt_grad_sync;

/* The hook table entry of one compressor: a registry entry (compress.c lists them) with its name,
 * help, option syntax and parser, and the stage functions of a bucket. */
struct dt_compressor {
    const char *name;
    const char *help;    /* what it sends, one line or more (--compress's help, the man page) */
    const char *options; /* the syntax of its options after "NAME:", e.g. "RATIO[:momentum=M]"; ""
                          * when it takes none */
    size_t opts_size;    /* its options struct, at most DT_COMPRESS_OPTS_MAX bytes (0: none) */
    /* Parses args (the text after "NAME:", "" for NAME alone) into opts (zeroed), defaults
     * included; DT_EINVAL through dt_compress_bad(text, why). NULL: it takes no options. */
    dt_status (*parse)(const char *text, const char *args, void *opts);
    /* Writes the options as parse reads them (without "NAME:") to out; NULL: no options. */
    void (*format)(const void *opts, char *out, size_t cap);
    /* The advice when a checkpoint's error-feedback state does not fit this run; NULL: the common
     * one (as many workers, the same --compress and --bucket-mb). */
    const char *state_hint;
    int stages; /* collectives per bucket (0 = 1). Stage s+1 of a bucket is issued when the
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
};

/* What the sync of one vector needs to know about it. */
typedef struct {
    dt_comm *comm;
    dt_model *model;       /* tensor table (shapes, for PowerSGD) */
    size_t n;              /* floats in the vector */
    const size_t *lo, *hi; /* nb bucket ranges */
    int nb;
    /* The device of the vector when the comm does not take its memory (dt_strategy_stage_device),
     * else NULL: each bucket is downloaded into a host buffer of the sync's own at start, travels
     * from there (every compressor works on host memory) and is uploaded back once it is done, in
     * poll (overlapped with backward) or finish. */
    struct dt_dev *stage;
} dt_grad_sync_config;

/* Per-step figures, summed over the buckets. */
typedef struct {
    double payload_bytes; /* bytes this rank handed to the collectives */
    double wire_bytes;    /* bytes this rank sends with bandwidth-optimal algorithms (ring) */
    double raw_bytes;     /* f32 bytes a plain allreduce would have handed over */
    double ef_norm;       /* L2 norm of this rank's error-feedback residual after the step, as kept
                           * (fp16: at the loss scale; dt_step_stats.ef_norm divides it out) */
} dt_grad_sync_stats;

/* Creates the sync of spec for cfg, with spec->c's functions. */
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
/* The options struct of the compressor in use (its opts_size bytes, as its parse wrote them). */
const void *dt_grad_sync_opts(const dt_grad_sync *g);
const dt_grad_sync_config *dt_grad_sync_config_of(const dt_grad_sync *g);
/* Counts a collective of this step: payload bytes of this rank, allgather or allreduce. */
void dt_grad_sync_count(dt_grad_sync *g, size_t payload_bytes, bool allgather);
/* Adds the squared residual norm of a bucket to this step's figure. */
void dt_grad_sync_add_ef(dt_grad_sync *g, double sq);

/* The plain allreduce (compress_cast.c), the entry of "none". */
extern const dt_compressor dt_compress_none;

#endif
