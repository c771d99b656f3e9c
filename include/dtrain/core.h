/* dtrain core: status codes and errors, dtypes and conversion, tensor views over flat slabs,
 * the counter-based RNG, logging and thread control. Everything above builds on this. */
#ifndef DTRAIN_CORE_H
#define DTRAIN_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status and errors ------------------------------------------------------------------- */

typedef enum {
    DT_OK = 0,
    DT_EINVAL = -1,    /* bad argument, flag or spec */
    DT_ENOMEM = -2,    /* allocation failed */
    DT_EIO = -3,       /* read/write/open failed */
    DT_EFORMAT = -4,   /* file or message has the wrong format, magic, size or checksum */
    DT_ENOTSUP = -5,   /* feature not built in or not supported */
    DT_ETIMEDOUT = -6, /* a deadline passed */
    DT_EPEER = -7,     /* a peer rank died or misbehaved */
    DT_EMISMATCH = -8, /* ranks disagree (collective, count, dtype, checksum) */
    DT_EINTERNAL = -9, /* a bug: an invariant failed */
    DT_ENOENT = -10,   /* a file or named thing does not exist */
    DT_EINTR = -11,    /* interrupted by a signal (e.g. SIGTERM) */
} dt_status;

/* Errors name the library's own terms, never a command-line flag: a setting appears as its config
 * field or strategy-spec key in backticks ("`grad_accum` 0: need 1..65536 micro-batches per step",
 * "`strategy` ddp: zero=4: ..."), so an embedder is told about what it set. A front end maps the
 * terms to its own words: dtrain's CLI prints each as the flag that sets it (--grad-accum), from
 * its table in src/cli/flag_terms.c; tests/layering.sh fails on a "--flag" in a library message. */

/* Short static name for a status ("DT_EINVAL: invalid argument"). */
const char *dt_status_str(dt_status s);
/* The message of the last error set on this thread ("" if none). Valid until the next error. */
const char *dt_last_error(void);
/* Sets this thread's last error message (printf-style) and returns s, for `return dt_error(...)`. */
dt_status dt_error(dt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current last-error message with context: "ctx: old message". Returns s. */
dt_status dt_error_wrap(dt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clears this thread's last error. */
void dt_error_clear(void);
/* Like dt_error, and records which peer rank the error blames (a rank that died or left): the
 * caller can then tell "only followed a peer's failure" from a failure of its own. dt_error and
 * dt_error_clear forget the peer; dt_error_wrap keeps it. Returns s. */
dt_status dt_error_peer(dt_status s, int peer, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The peer rank the last error on this thread blames, or -1 (none, or not a peer failure). */
int dt_last_error_peer(void);
/* Sets (or with -1 forgets) the peer of the current last error, e.g. after copying the message over. */
void dt_error_set_peer(int peer);

/* DT_TRY(x): returns x's status from the calling function when it is not DT_OK. */
#define DT_TRY(x)                                 \
    do {                                          \
        dt_status dt_try_s_ = (x);                \
        if (dt_try_s_ != DT_OK) return dt_try_s_; \
    } while (0)

/* DT_TRY_GOTO(x, label): jumps to label (the function's cleanup) when x is not DT_OK. Write the
 * assignment inside to keep the status for the cleanup to return:
 *     DT_TRY_GOTO(s = dt_loader_create(&l, ds, &lc), fail);
 * x is evaluated once. */
#define DT_TRY_GOTO(x, label)         \
    do {                              \
        if ((x) != DT_OK) goto label; \
    } while (0)

/* ---- version ------------------------------------------------------------------------------ */

/* The library's version ("0.1.0"): DTRAIN_VERSION (dtrain/dtrain.h) as it was when the library was
 * built, for an embedder to compare with the headers it compiled with. A static string. */
const char *dt_version(void);

/* ---- dtypes ------------------------------------------------------------------------------- */

typedef enum { DT_F32 = 0, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64, DT_U8, DT_I8, DT_I16, DT_DTYPE_COUNT } dt_dtype;

size_t dt_dtype_size(dt_dtype t);      /* bytes per element */
const char *dt_dtype_name(dt_dtype t); /* safetensors spelling: "F32", "BF16", "U8", ... */
/* Parses a safetensors dtype name; returns DT_EINVAL for an unknown name. */
dt_status dt_dtype_parse(const char *name, dt_dtype *out);

/* Scalar conversions. bf16/f16 conversions round to nearest even; NaN stays NaN. */
uint16_t dt_f32_to_bf16(float x);
float dt_bf16_to_f32(uint16_t x);
uint16_t dt_f32_to_f16(float x);
float dt_f16_to_f32(uint16_t x);
/* Converts n elements between any two dtypes (through f64 for exotic pairs). dst != src. */
void dt_convert(void *dst, dt_dtype dst_type, const void *src, dt_dtype src_type, size_t n);

/* ---- devices and typed buffers ------------------------------------------------------------- */

typedef enum { DT_DEVICE_CPU = 0, DT_DEVICE_CUDA } dt_device;

/* A buffer that knows its dtype and device: count elements of dtype at data (not owned). */
typedef struct {
    void *data;
    dt_dtype dtype;
    size_t count;
    dt_device device;
} dt_buffer;

/* ---- tensors and slabs -------------------------------------------------------------------- */

#define DT_MAX_DIMS 6

/* A non-owning view: data points into a slab or user memory. */
typedef struct {
    void *data;
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
} dt_tensor;

/* Number of elements of a view (1 for ndim 0). */
int64_t dt_tensor_numel(const dt_tensor *t);
/* Builds a contiguous view of `ndim` dims over data. */
dt_tensor dt_tensor_view(void *data, dt_dtype dtype, int ndim, const int64_t *shape);

/* A flat, 64-byte aligned, zero-initialised buffer of f32 that tensors view into
 * (parameters, gradients, each optimizer moment: llm.c style). */
typedef struct {
    float *data;
    size_t n;      /* number of floats */
    bool reserved; /* made by dt_slab_reserve: only its placed values are charged */
    size_t placed; /* reserved: the bytes dt_slab_place charged */
} dt_slab;

/* Sets s up with n zeroed floats (a plain struct: _init, then _free); on failure sets the last error and
 * returns DT_ENOMEM. */
dt_status dt_slab_init(dt_slab *s, size_t n);
/* Frees the slab; safe on a zeroed or already freed slab. */
void dt_slab_free(dt_slab *s);

/* [lo, hi) of a slab, in values. */
typedef struct {
    size_t lo, hi;
} dt_range;

/* Reserves n floats that read as zeros: mapped, neither resident nor charged against --mem-limit
 * until dt_slab_place makes a part of them this process's. DT_ENOMEM when the address space is
 * short. */
dt_status dt_slab_reserve(dt_slab *s, size_t n);
/* Makes the values in own[0..nown) (sorted, disjoint ranges of a reserved slab) the part this
 * process holds: their bytes are charged (DT_ENOMEM naming `what` and the limit when they do not
 * fit; nothing changes then), the whole pages outside them given back (they read as zeros again).
 * own NULL: the whole slab. A slab may be placed again, wider or narrower. */
dt_status dt_slab_place(dt_slab *s, const dt_range *own, int nown, const char *what);
/* Aligned allocation helpers used across the library (64-byte aligned, zeroed). NULL on failure. */
void *dt_alloc(size_t bytes);
void dt_free(void *p);
/* The bytes dt_alloc(bytes) holds and charges against --mem-limit: bytes rounded up to 64 (64 for 0). */
size_t dt_alloc_size(size_t bytes);
/* As dt_alloc, but the block is not charged (its owner charges what it uses with dt_mem_charge). */
void *dt_alloc_reserved(size_t bytes);

/* ---- memory accounting (core/mem.c): the bytes of every dt_alloc block this process holds ---- *
 * Blocks of 256 KiB and more are page-aligned anonymous mappings: their pages are resident only
 * once written, and dt_mem_release gives whole pages back to the OS (ZeRO frees what a rank does
 * not own). A limit (--mem-limit) makes dt_alloc and dt_mem_reacquire fail beyond it. */

/* Sets the per-process limit in bytes (0 = none). DT_ENOMEM naming the limit and the bytes held
 * when this process already holds more. */
dt_status dt_mem_set_limit(size_t bytes);
size_t dt_mem_limit(void);
/* Bytes held now (dt_alloc blocks less released pages) and the most held so far. */
size_t dt_mem_used(void);
size_t dt_mem_peak(void);
/* True when the last failed dt_alloc / dt_mem_reacquire of this thread failed on the limit (the
 * last error then says so). */
bool dt_mem_limit_hit(void);
/* Gives the whole pages inside [p, p + bytes) back to the OS (they read as zeros afterwards) and
 * stops counting them; p lies in a dt_alloc block. Returns the bytes given back. */
size_t dt_mem_release(void *p, size_t bytes);
/* Counts bytes released earlier that are about to be written again; DT_ENOMEM over the limit. */
dt_status dt_mem_reacquire(size_t bytes);
/* Counts bytes against the limit for `what`; DT_ENOMEM naming it and the limit when they do not
 * fit. dt_mem_uncharge stops counting them. */
dt_status dt_mem_charge(size_t bytes, const char *what);
void dt_mem_uncharge(size_t bytes);
/* Gives the whole pages inside [p, p + bytes) back to the OS (they read as zeros afterwards)
 * without changing what is counted (the owner of a reserved block counts). */
void dt_mem_discard(void *p, size_t bytes);
/* Maps the whole pages inside [p, p + bytes) writable now, zero-filled where released, in one call
 * (MADV_POPULATE_WRITE) instead of a fault per page, and two where a page is read before it is
 * written (accumulating into a released gradient). Contents are kept. A kernel without it: no-op. */
void dt_mem_populate(void *p, size_t bytes);
/* The peak resident set of this process as the OS counts it (VmHWM), in bytes; 0 if unknown. */
size_t dt_mem_os_peak(void);

/* ---- counter-based RNG -------------------------------------------------------------------- *
 * Philox-4x32-10. A draw is a pure function of (seed, purpose, index, lane) so results never
 * depend on the number of workers, the order of calls or on resuming. `purpose` separates
 * streams: use DT_RNG_* constants combined with epoch / layer ids (dt_rng_key). */

enum {
    DT_RNG_INIT = 1,    /* weight init: key(DT_RNG_INIT, layer) */
    DT_RNG_SHUFFLE = 2, /* data order: key(DT_RNG_SHUFFLE, epoch) */
    DT_RNG_DROPOUT = 3, /* dropout masks: key(DT_RNG_DROPOUT, step*256 + layer) */
    DT_RNG_USER = 100,
};

/* Combines a purpose and a sub-id (layer, epoch, step) into one 64-bit stream key. */
static inline uint64_t dt_rng_key(uint32_t purpose, uint64_t sub) { return ((uint64_t)purpose << 48) ^ sub; }
/* Four 32-bit random words for (seed, key, index). */
void dt_philox4x32(uint64_t seed, uint64_t key, uint64_t index, uint32_t out[4]);
/* Uniform float in [0,1) and 64-bit words, from (seed, key, index). */
float dt_rng_uniform(uint64_t seed, uint64_t key, uint64_t index);
uint64_t dt_rng_u64(uint64_t seed, uint64_t key, uint64_t index);
/* Fills out[0..n) with U[lo,hi) / N(mean,std) draws; element i uses counter index i. */
void dt_rng_fill_uniform(float *out, size_t n, float lo, float hi, uint64_t seed, uint64_t key);
void dt_rng_fill_normal(float *out, size_t n, float mean, float std, uint64_t seed, uint64_t key);

/* ---- threads, time, logging --------------------------------------------------------------- */

/* Sets the number of BLAS/compute threads of this process (default 1 per worker). */
void dt_set_threads(int n);
int dt_get_threads(void);
/* Monotonic wall clock in seconds. */
double dt_now(void);

typedef enum { DT_LOG_ERROR = 0, DT_LOG_WARN, DT_LOG_INFO, DT_LOG_DEBUG } dt_log_level;
/* Library logging goes to stderr, prefixed "[dtrain rank R] "; level from DTRAIN_LOG
 * (error|warn|info|debug), default warn. The library never prints otherwise. */
void dt_log(dt_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_log_set_rank(int rank);
/* Sends each log line (with its "[dtrain rank R] warn: " prefix, without a newline) to sink
 * instead of stderr; NULL: stderr again. dtrain's CLI prints them with its flags for the library's
 * terms (see the note on errors above). */
void dt_log_set_sink(void (*sink)(void *ctx, const char *line), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
