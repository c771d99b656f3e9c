/* The kernel table (dt_kernel_table; ggml's backend split): every kernel the graph's ops run,
 * reached through the model's device (device/device.h kernels: the checked device wraps each slot),
 * one table per kernel library and precision, so model code never calls a CPU function directly and a CUDA or
 * oneDNN backend is one more table. Signatures are those of include/dtrain/layers.h (outputs
 * first, explicit dimensions; backward ACCUMULATES parameter gradients and OVERWRITES din). */
#ifndef DT_BACKEND_H
#define DT_BACKEND_H

#include "dtrain/core.h"
#include "backend/layers.h"

#include "backend/conv_pool.h"

/* The layout of a blocked convolution's input or output outside: NCHW f32, blocked f32 (nChw16c or nChw8c:
 * backend/blocked.h), or blocked with bf16 values (uint16_t, in the first half of the float buffer: the graph keeps
 * those between bf16 convs and max pools, nn/graph_layout.c); or the same two in NHWC, the layout of a chain whose bf16
 * convs want it (conv2d_bf16_nhwc). */
typedef enum {
    DT_LAYOUT_NCHW = 0,
    DT_LAYOUT_BLOCKED = 1,
    DT_LAYOUT_BLOCKED_BF16 = 2,
    DT_LAYOUT_NHWC = 3,
    DT_LAYOUT_NHWC_BF16 = 4
} dt_layout;

static inline bool dt_layout_bf16(dt_layout l) { return l == DT_LAYOUT_BLOCKED_BF16 || l == DT_LAYOUT_NHWC_BF16; }
static inline bool dt_layout_nhwc(dt_layout l) { return l == DT_LAYOUT_NHWC || l == DT_LAYOUT_NHWC_BF16; }
/* The layout of a chain's value: NCHW outside a chain, else blocked or NHWC (nhwc), bf16 or f32. */
static inline dt_layout dt_layout_of(bool chain, bool nhwc, bool bf16) {
    if (!chain) return DT_LAYOUT_NCHW;
    return nhwc ? (bf16 ? DT_LAYOUT_NHWC_BF16 : DT_LAYOUT_NHWC) : bf16 ? DT_LAYOUT_BLOCKED_BF16 : DT_LAYOUT_BLOCKED;
}

/* A max pool's windows tile its input (K == S, H and W multiples of K): each input position is
 * in exactly one window. The blocked pool kernels and the bf16 plan (graph_layout.c) decide by it. */
static inline bool dt_pool_windows_tile(int H, int W, int K, int S) { return K == S && H % K == 0 && W % K == 0; }

typedef struct dt_kernel_table {
    const char *name; /* the kernel library: "blas" or "onednn" */
    dt_device device;
    dt_dtype dtype;     /* compute dtype of the activations (DT_F32) */
    dt_dtype precision; /* of the GEMM inputs (linear, matmul_t, conv): DT_F32, DT_BF16 or DT_F16;
                         * accumulation and outputs stay f32, weights are f32 masters */
    /* The floats of work linear_forward and linear_backward take (the graph's workspace, sized at
     * plan time): the blas bf16/fp16 tables' rounded copies of the GEMM inputs; 0 for the others
     * (NULL: 0). */
    size_t (*linear_workspace)(int B, int C, int OC);
    void (*linear_forward)(float *out, const float *in, const float *w, const float *b, float *work, int B, int C,
                           int OC);
    void (*linear_backward)(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                            float *work, int B, int C, int OC);
    /* The same with a bf16 in (uint16_t: the values a linear would round anyway, stored so by the
     * layer before it, nn/graph_layout.c), for a backend whose linear_bf16_values() is true
     * (its GEMMs run at bf16, so a bf16 in gives the same result as the f32 one it was rounded
     * from); NULL where not. */
    bool (*linear_bf16_values)(void);
    void (*linear_forward_bf16)(float *out, const uint16_t *in, const float *w, const float *b, int B, int C, int OC);
    void (*linear_backward_bf16)(float *din, float *dw, float *db, const float *dout, const uint16_t *in,
                                 const float *w, int B, int C, int OC);
    /* And with a bf16 dout too (a gradient the op after it rounds, graph_layout.c): the GEMMs take
     * it as they would take the f32 one rounded; db sums the bf16 values. Where no native GEMM
     * runs, dout is widened in place (its buffer holds B * OC floats). NULL where not. */
    void (*linear_backward_bf16_grad)(float *din, float *dw, float *db, uint16_t *dout, const uint16_t *in,
                                      const float *w, int B, int C, int OC);
    /* And a bf16 in with a bf16 out (values an op after it reads bf16: graph_layout.c), or with a
     * bf16 din (its input's gradient stored bf16): the GEMM's f32 sums rounded to bf16 where the
     * GEMM writes them. NULL where not. */
    void (*linear_forward_bf16io)(uint16_t *out, const uint16_t *in, const float *w, const float *b, int B, int C,
                                  int OC);
    void (*linear_backward_bf16_din)(uint16_t *din, float *dw, float *db, const float *dout, const uint16_t *in,
                                     const float *w, int B, int C, int OC);
    size_t (*conv2d_workspace)(int B, int C, int H, int W, int OC, int K, int stride, int pad);
    void (*conv2d_forward)(float *out, const float *in, const float *w, const float *b, float *work, int B, int C,
                           int H, int W, int OC, int K, int stride, int pad);
    void (*conv2d_backward)(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                            float *work, int B, int C, int H, int W, int OC, int K, int stride, int pad);
    void (*maxpool2d_forward)(float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K, int S);
    void (*maxpool2d_backward)(float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W, int K,
                               int S);
    /* Blocked activations: oneDNN's nChw16c or nChw8c (DT_BLOCK, backend/blocked.h), for C a multiple of 16 (the
     * same count of values as NCHW). A backend with conv2d_*_blocked runs conv -> relu -> maxpool
     * chains in it (the device's plan says which values are blocked: device.h plan_layouts, the CPU's in
     * device/cpu_plan.c; nn/graph_layout.c applies it); NULL where not.
     * in_l / out_l: the layouts of in / out (and dout); at least one is blocked; din is f32 in
     * in's layout (blocked f32 for a bf16 in). bf16 layouts only where conv2d_bf16_values(C). */
    void (*conv2d_forward_blocked)(float *out, const float *in, const float *w, const float *b, int B, int C, int H,
                                   int W, int OC, int K, int stride, int pad, dt_layout in_l, dt_layout out_l);
    void (*conv2d_backward_blocked)(float *din, float *dw, float *db, const float *dout, const float *in,
                                    const float *w, int B, int C, int H, int W, int OC, int K, int stride, int pad,
                                    dt_layout in_l, dt_layout out_l);
    /* Whether a blocked conv over C input channels takes and writes DT_LAYOUT_BLOCKED_BF16 values
     * (it runs at bf16); NULL: never (the graph then keeps no bf16 values). */
    bool (*conv2d_bf16_values)(int C);
    /* Whether its bf16 convs run fastest on NHWC values (oneDNN's AMX kernels: nChw16c costs them
     * a reorder of each input and output); the graph then keeps the chains of a bf16 model NHWC
     * (DT_LAYOUT_NHWC*, nhwc below) instead of blocked. NULL: never. */
    bool (*conv2d_bf16_nhwc)(void);
    /* Max pooling of a blocked input (NHWC with nhwc): out (and dout) in that layout when out_bl,
     * else NCHW; argmax holds flat indices into the input. din is in the input's layout. relu:
     * the relu after the pool applied too (0 where the max is not > 0, NaN included, and argmax
     * -1 there, so backward sends that gradient nowhere: relu's backward included). */
    void (*maxpool2d_forward_blocked)(float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K,
                                      int S, bool out_bl, bool nhwc, bool relu);
    void (*maxpool2d_backward_blocked)(float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W,
                                       int K, int S, bool out_bl, bool nhwc);
    /* The same of a blocked bf16 input (din bf16 too); out f32, or bf16 with out_bf16 and an NCHW
     * out (the maxima are bf16 values: exact); dout f32, or bf16 with dout_bf16. The backward takes
     * maxpool2d_blocked_bf16_workspace floats of work (the graph's workspace). NULL where not. */
    void (*maxpool2d_forward_blocked_bf16)(void *out, int32_t *argmax, const uint16_t *in, int B, int C, int H, int W,
                                           int K, int S, bool out_bl, bool nhwc, bool relu, bool out_bf16);
    size_t (*maxpool2d_blocked_bf16_workspace)(int B, int C, int H, int W, int K, int S, bool dout_bf16);
    void (*maxpool2d_backward_blocked_bf16)(uint16_t *din, const void *dout, const int32_t *argmax, int B, int C, int H,
                                            int W, int K, int S, bool out_bl, bool nhwc, bool dout_bf16, float *work);
    /* conv -> (relu) -> maxpool of a first layer in one pass (backend/conv_pool.h), f32; NULL where not.
     * ws: conv_pool_workspace(s) bytes of the device's memory, 64-byte aligned (the graph's workspace) */
    size_t (*conv_pool_workspace)(const dt_conv_pool_shape *s);
    void (*conv_pool_forward)(const dt_conv_pool_shape *s, float *out, uint8_t *win, const float *in, const float *w,
                              const float *b, void *ws);
    void (*conv_pool_backward)(const dt_conv_pool_shape *s, float *dw, float *db, const float *dout, const uint8_t *win,
                               const float *in, void *ws);
    void (*avgpool2d_forward)(float *out, const float *in, int B, int C, int H, int W, int K, int S);
    void (*avgpool2d_backward)(float *din, const float *dout, int B, int C, int H, int W, int K, int S);
    void (*relu_forward)(float *out, const float *in, size_t n);
    void (*relu_backward)(float *din, const float *dout, const float *x, size_t n);
    void (*gelu_forward)(float *out, const float *in, size_t n);
    void (*gelu_backward)(float *din, const float *dout, const float *x, size_t n);
    /* gelu_forward's values rounded to bf16 as dt_cast_bf16 rounds them, in the same pass */
    void (*gelu_forward_bf16)(uint16_t *out, const float *in, size_t n);
    /* gelu_backward's din rounded to bf16 the same way (a gradient stored bf16, graph_layout.c) */
    void (*gelu_backward_bf16)(uint16_t *din, const float *dout, const float *x, size_t n);
    /* Both with bf16 x and dout too (all of a GELU's values and gradients bf16, graph_layout.c):
     * the f32 kernels on the widened values, rounded as above */
    void (*gelu_forward_bf16io)(uint16_t *out, const uint16_t *in, size_t n);
    void (*gelu_backward_bf16io)(uint16_t *din, const uint16_t *dout, const uint16_t *x, size_t n);
    /* gelu_forward_bf16io that also stores dydx = gelu'(x) (n bf16) from the same erf, and the
     * backward from it, din = dout * dydx rounded; a GELU whose x, values and gradients are all
     * bf16 keeps dydx from forward to backward (op_activation.c) */
    void (*gelu_forward_bf16io_grad)(uint16_t *out, uint16_t *dydx, const uint16_t *in, size_t n);
    void (*gelu_backward_bf16io_from_grad)(uint16_t *din, const uint16_t *dout, const uint16_t *dydx, size_t n);
    void (*tanh_forward)(float *out, const float *in, size_t n);
    void (*tanh_backward)(float *din, const float *dout, const float *y, size_t n);
    void (*sigmoid_forward)(float *out, const float *in, size_t n);
    void (*sigmoid_backward)(float *din, const float *dout, const float *y, size_t n);
    void (*dropout_forward)(float *out, uint8_t *mask, const float *in, size_t n, float p, uint64_t seed, uint64_t key);
    void (*dropout_backward)(float *din, const float *dout, const uint8_t *mask, size_t n, float p);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *in, const float *w, const float *b,
                              int N, int C, float eps);
    void (*layernorm_backward)(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                               const float *mean, const float *rstd, int N, int C);
    void (*batchnorm2d_forward_train)(float *out, float *mean, float *rstd, float *running_mean, float *running_var,
                                      const float *in, const float *w, const float *b, int B, int C, int HW,
                                      float momentum, float eps);
    void (*batchnorm2d_forward_eval)(float *out, const float *in, const float *w, const float *b,
                                     const float *running_mean, const float *running_var, int B, int C, int HW,
                                     float eps);
    void (*batchnorm2d_backward)(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                                 const float *mean, const float *rstd, int B, int C, int HW);
    void (*embedding_forward)(float *out, const int32_t *ids, const float *w, int N, int C);
    void (*embedding_backward)(float *dw, const float *dout, const int32_t *ids, int N, int C);
    void (*pos_embedding_forward)(float *out, const float *w, int B, int T, int C);
    void (*pos_embedding_backward)(float *dw, const float *dout, int B, int T, int C);
    void (*add_forward)(float *out, const float *a, const float *b, size_t n);
    void (*attention_forward)(float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH);
    size_t (*attention_workspace)(int T, int C, int NH);
    void (*attention_backward)(float *dqkv, float *work, const float *dout, const float *qkv, const float *att, int B,
                               int T, int C, int NH);
    /* The losses write their value (the mean) into *loss, one float of the device's memory: the
     * host downloads it when it needs the number, so a device with queues need not wait per step.
     * xent writes the number of targets that counted (not ignore) into *counted, device memory too,
     * and its backward reads it there (the gradient is scale / counted per counted row). */
    void (*xent_forward)(float *loss, float *probs, const float *logits, const int32_t *labels, int N, int V,
                         int ignore, int32_t *counted);
    void (*xent_backward)(float *dlogits, const float *probs, const int32_t *labels, int N, int V, int ignore,
                          const int32_t *counted, float scale);
    void (*mse_forward)(float *loss, const float *pred, const float *target, size_t n);
    void (*mse_backward)(float *dpred, const float *pred, const float *target, size_t n, float scale);
    /* *correct (one int64 of the device's memory) = the rows of logits (rows x V) whose largest
     * value (the first of equal ones) is at labels[row]: an accuracy count the host downloads. */
    void (*count_correct)(int64_t *correct, const float *logits, const int32_t *labels, int64_t rows, int V);
} dt_kernel_table;

/* The floats of work table t's linear takes (linear_workspace; NULL: 0): for callers outside the
 * graph (tests, benchmarks), which size it themselves. */
static inline size_t dt_linear_workspace_of(const dt_kernel_table *t, int B, int C, int OC) {
    return t->linear_workspace ? t->linear_workspace(B, C, OC) : 0;
}

/* The CPU f32 backend (OpenBLAS GEMMs, vectorised C kernels). */
const dt_kernel_table *dt_backend_cpu(void);

/* The backend of kernel library `kernels` ("blas", "onednn") with GEMM precision DT_F32, DT_BF16
 * or DT_F16 (static tables). DT_EINVAL for another name or dtype, DT_ENOTSUP for onednn in a
 * build without oneDNN. */
dt_status dt_backend_find(const char *kernels, dt_dtype precision, const dt_kernel_table **out);
/* The backend new models take (dt_kernels_select; default onednn fp32 where built, else blas). */
const dt_kernel_table *dt_backend_default(void);

/* The blas backend at bf16/fp16: inputs rounded to the precision (f32 values), then sgemm. */
const dt_kernel_table *dt_backend_blas_lowp(dt_dtype precision);
/* Rounds n floats to the nearest bf16 / IEEE half value (to nearest even; NaN stays NaN; past the
 * half range gives inf), kept as f32. dst == src is allowed. */
void dt_round_bf16(float *dst, const float *src, size_t n);
void dt_round_f16(float *dst, const float *src, size_t n);
/* dst (n bf16) = src (n f32) rounded to nearest even (NaN stays a quiet NaN), with AVX512-BF16
 * where the CPU has it; and back (exact). */
void dt_cast_bf16(uint16_t *dst, const float *src, size_t n);
bool dt_cast_bf16_native(void); /* whether dt_cast_bf16 runs AVX512-BF16 here */
void dt_widen_bf16(float *dst, const uint16_t *src, size_t n);

/* Kernels return void and neither allocate per call nor abort: one that cannot run (a library's
 * scratch could not be had) records why here, for the calling thread, and returns at once (its
 * outputs are then not to be used). The graph takes it after each op and fails naming the node (nn/graph_run.c). The
 * first message since the last take is kept. */
void dt_kernel_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* This thread's kernel error since the last call, copied into buf (n bytes) and cleared; false
 * when there is none. */
bool dt_kernel_error_take(char *buf, size_t n);

/* oneDNN (cpu_onednn*.c). The backend at a precision, NULL when built without oneDNN. */
const dt_kernel_table *dt_backend_onednn(dt_dtype precision);
bool dt_onednn_built(void);
/* Whether oneDNN's bf16 kernels are native here (AVX512-BF16; every AMX CPU has it too). Where
 * not, oneDNN 2.6 emulates bf16 with f32 FMAs plus conversions in its inner loops, slower than its
 * f32 kernels (docs/why.md, "oneDNN's emulated bf16"), so the onednn bf16 table
 * rounds the inputs to bf16 and runs its f32 kernels instead, as for fp16: the same products
 * (a bf16 product is exact in f32) and f32 sums, in another order. */
bool dt_onednn_bf16_native(void);
/* Primitives this thread created so far (each is created once per op, shape and precision, then
 * cached), and a summary of the implementations oneDNN chose ("matmul brg:avx512_core; ..."). */
size_t dt_onednn_cache_misses(void);
/* Entries a thread's primitive cache holds; past it the least recently used one is evicted. */
int dt_onednn_cache_capacity(void);
void dt_onednn_impls(char *buf, size_t n);

#endif
