/* Internals shared by the oneDNN kernel files (cpu_onednn.c: engine, primitive cache, matmul;
 * cpu_onednn_conv.c: convolutions). Only compiled with DT_HAVE_DNNL. */
#ifndef DT_BACKEND_ONEDNN_H
#define DT_BACKEND_ONEDNN_H

#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>

#include "backend/backend.h"

enum { DT_DNNL_MATMUL = 1, DT_DNNL_CONV_FWD, DT_DNNL_CONV_BWD_DATA, DT_DNNL_CONV_BWD_W };
#define DT_DNNL_KEY_INTS 12
#define DT_DNNL_ARGS 6

/* A cached primitive: the op, the input data type and the shape make the key. */
typedef struct {
    int op;
    dnnl_data_type_t dt;
    int d[DT_DNNL_KEY_INTS];
} dt_dnnl_key;

typedef struct {
    dt_dnnl_key key;
    bool used, failed;          /* failed: oneDNN has no primitive for it; the caller falls back */
    dnnl_primitive_t prim;
    int nargs;
    dnnl_exec_arg_t args[DT_DNNL_ARGS];
    float *tmp;                 /* conv backward weights: dw and db before they are added */
    size_t tmp_n;
    char impl[64];              /* oneDNN's impl info string */
} dt_dnnl_entry;

/* This thread's engine (created on first use). */
dnnl_engine_t dt_dnnl_engine(void);
/* The cached entry of key k, or a fresh slot (used = false) for the caller to fill with
 * dt_dnnl_finish; NULL only when the cache cannot be set up. */
dt_dnnl_entry *dt_dnnl_lookup(const dt_dnnl_key *k);
/* Completes a fresh slot from a primitive descriptor (pd may be NULL: creation failed): creates
 * the primitive and one memory object per (arg, md) pair; destroys pd. false when it failed. */
bool dt_dnnl_finish(dt_dnnl_entry *e, dnnl_primitive_desc_t pd, int nargs, const int *arg, const dnnl_memory_desc_t *md);
/* Runs e with the given data pointers (one per arg, in dt_dnnl_finish's order) on this thread's
 * stream with dt_get_threads() OpenMP threads, and waits. */
void dt_dnnl_run(dt_dnnl_entry *e, void *const *data);
/* A plain memory descriptor of a dense tensor (row-major) or with explicit strides. */
dnnl_memory_desc_t dt_dnnl_md(int ndim, const int64_t *dims, dnnl_data_type_t dt, const int64_t *strides);
/* A per-thread buffer of n elements of a 16-bit dtype holding src converted (slot 0..2). */
void *dt_dnnl_convert(int slot, const float *src, size_t n, dt_dtype p);
/* src rounded to precision p, as f32 (slot 0..2): the fallback when oneDNN lacks a kernel. */
float *dt_dnnl_rounded(int slot, const float *src, size_t n, dt_dtype p);

/* Convolutions at precision p (cpu_onednn_conv.c), the signatures of the backend table. */
void dt_dnnl_conv_forward(dt_dtype p, float *out, const float *in, const float *w, const float *b, float *work, int B,
                          int C, int H, int W, int OC, int K, int S, int P);
void dt_dnnl_conv_backward(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                           const float *w, float *work, int B, int C, int H, int W, int OC, int K, int S, int P);

#endif
