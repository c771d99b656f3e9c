/* Internals shared by the oneDNN kernel files (cpu_onednn.c: engine, primitive cache, matmul;
 * cpu_onednn_conv.c: convolutions). Only compiled with DT_HAVE_DNNL. */
#ifndef DT_BACKEND_ONEDNN_H
#define DT_BACKEND_ONEDNN_H

#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>

#include "backend/backend.h"

/* DT_DNNL_CONV_BWD: backward data and weights in one entry (diff_dst reordered once) */
enum { DT_DNNL_MATMUL = 1, DT_DNNL_CONV_FWD, DT_DNNL_CONV_BWD_DATA, DT_DNNL_CONV_BWD_W, DT_DNNL_CONV_BWD };
#define DT_DNNL_KEY_INTS 13
#define DT_DNNL_SCRATCH_SLOTS 12
#define DT_DNNL_ARGS 7 /* with its scratchpad */

/* A cached primitive: the op, the input data type and the shape make the key. */
typedef struct {
    int op;
    dnnl_data_type_t dt;
    int d[DT_DNNL_KEY_INTS];
} dt_dnnl_key;

#define DT_DNNL_STEPS 8
#define DT_DNNL_MEMS 14

typedef struct {
    dnnl_primitive_t p;
    dnnl_memory_t pad; /* its scratchpad (user mode), bound to the thread's at each run; NULL: none */
    int nargs;
    dnnl_exec_arg_t args[DT_DNNL_ARGS];
} dt_dnnl_step;

/* A cached computation: the main primitive with the reorders around it (plain torch layouts and
 * f32 outside, the layout and precision oneDNN chose inside). */
typedef struct {
    dt_dnnl_key key;
    bool used, failed;       /* failed: oneDNN has no primitive for it; the caller falls back */
    unsigned long long last; /* lookup clock of its last use (the cache evicts the oldest) */
    int nsteps, nmem, npost;
    dt_dnnl_step step[DT_DNNL_STEPS];
    dnnl_memory_t mem[DT_DNNL_MEMS];
    int ext[DT_DNNL_MEMS];                  /* index into dt_dnnl_run's data pointers; -1: owned by oneDNN */
    dnnl_memory_t post_from[3], post_to[3]; /* outputs reordered back after the main step */
    float *tmp;                             /* conv backward weights: dw before it is added; matmul: packed B */
    int pack_nb, pack_kp;                   /* matmul: B goes in packed by dt_dnnl_vnni_pack with this block (0: not) */
    bool w_flipped; /* conv backward data runs as a forward conv: w goes in flipped (cpu_onednn_conv.c) */
    size_t tmp_n;
    size_t pad_n;  /* the largest scratchpad of its steps, in bytes */
    char impl[64]; /* oneDNN's impl info string of the main primitive */
} dt_dnnl_entry;

/* This thread's engine (created on first use). */
dnnl_engine_t dt_dnnl_engine(void);
/* This thread's primitive attributes (scratchpad_mode user: a primitive keeps no scratchpad of
 * its own; dt_dnnl_run hands it the thread's), for every primitive descriptor made here; NULL
 * when there is no engine. */
dnnl_primitive_attr_t dt_dnnl_attr(void);
/* The cached entry of key k, or a fresh slot (used = false) for the caller to build with the
 * functions below and close with dt_dnnl_ready; NULL only when the cache cannot be set up. */
dt_dnnl_entry *dt_dnnl_lookup(const dt_dnnl_key *k);
/* A memory object of e: bound to data pointer `ext` at each run, or owned by oneDNN (ext < 0). */
dnnl_memory_t dt_dnnl_mem(dt_dnnl_entry *e, const dnnl_memory_desc_t *md, int ext);
/* Appends a primitive (created from pd, which is destroyed; pd NULL fails) with its args. */
bool dt_dnnl_step_add(dt_dnnl_entry *e, dnnl_primitive_desc_t pd, int nargs, const int *arg, const dnnl_memory_t *m,
                      bool main);
/* An input in plain layout `plain` at data pointer ext, as the primitive wants it (`want`): the
 * same memory, or an owned one filled by a reorder step (layout and dtype). NULL on failure. */
dnnl_memory_t dt_dnnl_input(dt_dnnl_entry *e, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *want, int ext);
/* An output: the memory the primitive writes; a reorder back to `plain` runs after the main step. */
dnnl_memory_t dt_dnnl_output(dt_dnnl_entry *e, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *want,
                             int ext);
/* Closes a fresh entry after its main step (adds the output reorders); false (entry marked failed
 * and emptied) when ok is false or a step could not be made. */
bool dt_dnnl_ready(dt_dnnl_entry *e, bool ok);
/* Runs e with the given data pointers on this thread's stream with dt_get_threads() OpenMP
 * threads, and waits. Its steps' scratchpads are this thread's one buffer, grown to e->pad_n on
 * the first run that needs more (failing: the kernel error is set and nothing runs). */
void dt_dnnl_run(dt_dnnl_entry *e, void *const *data);
/* A plain memory descriptor of a dense tensor (row-major) or with explicit strides. */
dnnl_memory_desc_t dt_dnnl_md(int ndim, const int64_t *dims, dnnl_data_type_t dt, const int64_t *strides);
/* This thread's scratch slot 0..DT_DNNL_SCRATCH_SLOTS - 1 (grown to `bytes`, kept for the thread's
 * life; its contents do not survive a growth). 64-byte aligned, as dt_dnnl_alloc. NULL, with the
 * kernel error set (dt_kernel_fail), when it cannot grow: the caller returns without writing.
 * Slots: 0..2 rounded inputs, 3 flipped or widened weights/inputs, 4 a bf16 output's f32 copy, 5 a
 * fallback's workspace, 6..7 widened bf16 values (cpu_onednn_conv.c), 8..11 a blocked conv's plain
 * fallback (its NCHW input, output or gradient, input gradient and workspace). */
void *dt_dnnl_scratch(int slot, size_t bytes);
/* `bytes` (rounded up to 64) at a 64-byte boundary, for free(); NULL when out of memory. Every
 * buffer a oneDNN kernel reads or writes is aligned so: AMX tile loads of rows that straddle cache
 * lines slow a bf16 matmul down (docs/why.md, "64-byte alignment"). */
void *dt_dnnl_alloc(size_t bytes);
/* src rounded to precision p, as f32 (slot 0..2): the fallback when oneDNN lacks a kernel. NULL
 * when src is NULL or the slot cannot grow (the kernel error set). */
float *dt_dnnl_rounded(int slot, const float *src, size_t n, dt_dtype p);

/* Linear layers at precision p (cpu_onednn_matmul.c), the signatures of the backend table; and
 * the bf16 table's entries for a bf16 in (backend.h: linear_bf16_values). */
void dt_dnnl_linear_forward(dt_dtype p, float *out, const float *in, const float *w, const float *b, int B, int C,
                            int OC);
void dt_dnnl_linear_backward(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                             const float *w, int B, int C, int OC);
bool dt_dnnl_linear_bf16_values(void);
void dt_dnnl_linear_forward_bf16(float *out, const uint16_t *in, const float *w, const float *b, int B, int C, int OC);
void dt_dnnl_linear_backward_bf16(float *din, float *dw, float *db, const float *dout, const uint16_t *in,
                                  const float *w, int B, int C, int OC);
void dt_dnnl_linear_forward_bf16io(uint16_t *out, const uint16_t *in, const float *w, const float *b, int B, int C,
                                   int OC);
void dt_dnnl_linear_backward_bf16_din(uint16_t *din, float *dw, float *db, const float *dout, const uint16_t *in,
                                      const float *w, int B, int C, int OC);
void dt_dnnl_linear_backward_bf16_grad(float *din, float *dw, float *db, uint16_t *dout, const uint16_t *in,
                                       const float *w, int B, int C, int OC);

/* Convolutions at precision p (cpu_onednn_conv.c), the signatures of the backend table. */
void dt_dnnl_conv_forward(dt_dtype p, float *out, const float *in, const float *w, const float *b, float *work, int B,
                          int C, int H, int W, int OC, int K, int S, int P);
void dt_dnnl_conv_backward(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                           const float *w, float *work, int B, int C, int H, int W, int OC, int K, int S, int P);
/* f32 convolutions with blocked (DT_BLOCK) values outside: the backend table's *_blocked entries. */
void dt_dnnl_conv_forward_blocked(float *out, const float *in, const float *w, const float *b, int B, int C, int H,
                                  int W, int OC, int K, int S, int P, dt_layout in_l, dt_layout out_l);
void dt_dnnl_conv_backward_blocked(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                                   int B, int C, int H, int W, int OC, int K, int S, int P, dt_layout in_l,
                                   dt_layout out_l);
/* The same at bf16/fp16 (p): f32 blocked values outside, converted by the primitive's reorders,
 * or bf16 blocked ones (DT_LAYOUT_BLOCKED_BF16) as they are. */
void dt_dnnl_conv_forward_blocked_lowp(dt_dtype p, float *out, const float *in, const float *w, const float *b, int B,
                                       int C, int H, int W, int OC, int K, int S, int P, dt_layout in_l,
                                       dt_layout out_l);
void dt_dnnl_conv_backward_blocked_lowp(dt_dtype p, float *din, float *dw, float *db, const float *dout,
                                        const float *in, const float *w, int B, int C, int H, int W, int OC, int K,
                                        int S, int P, dt_layout in_l, dt_layout out_l);
/* Whether a blocked convolution over C input channels runs at bf16 and so takes bf16 values. */
bool dt_dnnl_conv_bf16_values(int C);
/* Whether oneDNN's bf16 convolutions here want NHWC values (its AMX kernels) rather than blocked. */
bool dt_dnnl_conv_bf16_nhwc(void);
/* Whether this CPU runs the packing below and dt_cast_bf16 natively (AVX512-BF16); where not,
 * oneDNN's reorders convert. */
bool dt_dnnl_cast_fast(void);
/* The GEMM B operand's bf16 VNNI packing (cpu_onednn_pack.c): the N block nb of md when it is
 * oneDNN's BA16a{nb}b2a layout of a (K, N) bf16 matrix and this CPU has AVX512-BF16, else 0. */
int dt_dnnl_vnni_block(const dnnl_memory_desc_t *md, int64_t K, int64_t N);
/* The rows md's layout pads K to (oneDNN pads to a multiple of 32, not only of 16). */
int dt_dnnl_vnni_padded_k(const dnnl_memory_desc_t *md);
/* dst (BA16a{nb}b2a bf16, K padded to Kp rows and N to a multiple of nb, padding zero) = src
 * (K, N): f32 rounded to nearest even, row-major with leading dimension ld (DT_VNNI_F32_ROWS) or
 * column-major ((k, n) at src[n * ld + k], DT_VNNI_F32_COLS); or bf16 values, row-major, copied
 * as they are (DT_VNNI_BF16_ROWS). */
typedef enum { DT_VNNI_F32_ROWS, DT_VNNI_F32_COLS, DT_VNNI_BF16_ROWS } dt_vnni_src;
void dt_dnnl_vnni_pack(void *dst, const void *src, dt_vnni_src kind, int K, int N, int64_t ld, int nb, int Kp);

#endif
