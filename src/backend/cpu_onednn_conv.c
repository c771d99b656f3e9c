/* oneDNN convolutions: forward, backward data and backward weights on NCHW activations and OIHW
 * weights (torch's layouts), cached per shape and precision like the matmuls (cpu_onednn.c).
 * Backward weights writes into a per-primitive scratch that is then ADDED to dw (the backend
 * contract accumulates parameter gradients; oneDNN overwrites); db sums the f32 gradient. */
#include "backend/backend.h"

#if DT_HAVE_DNNL
#include <stdlib.h>
#include <string.h>

#include "backend/onednn.h"
#include "backend/kern.h"

typedef struct {
    int B, C, H, W, OC, K, S, P, OH, OW;
    bool bias;
} conv_shape;

static dnnl_data_type_t dnnl_type(dt_dtype p) { return p == DT_BF16 ? dnnl_bf16 : p == DT_F16 ? dnnl_f16 : dnnl_f32; }

/* The plain f32 descriptors of src (NCHW), weights (OIHW), dst (NCHW) and bias; with `any` the
 * first three leave the layout to oneDNN at dtype dt (dst and diff_weights stay f32). */
static void conv_mds(const conv_shape *s, bool any, dnnl_data_type_t dt, dnnl_memory_desc_t md[4]) {
    const dnnl_dims_t src = {s->B, s->C, s->H, s->W}, w = {s->OC, s->C, s->K, s->K}, dst = {s->B, s->OC, s->OH, s->OW},
                      b = {s->OC};
    dnnl_memory_desc_init_by_tag(&md[0], 4, src, any ? dt : dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&md[1], 4, w, any ? dt : dnnl_f32, any ? dnnl_format_tag_any : dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&md[2], 4, dst, any ? dt : dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&md[3], 1, b, dnnl_f32, dnnl_x);
}

/* The forward primitive descriptor (dst f32), NULL when oneDNN has none. */
static dnnl_primitive_desc_t forward_pd(const conv_shape *s, dnnl_data_type_t dt, bool bias) {
    dnnl_memory_desc_t md[4];
    conv_mds(s, true, dt, md);
    md[2].data_type = dnnl_f32;
    dnnl_dims_t st = {s->S, s->S}, pad = {s->P, s->P};
    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_convolution_forward_desc_init(&d, dnnl_forward_training, dnnl_convolution_direct, &md[0], &md[1],
                                           bias ? &md[3] : NULL, &md[2], st, pad, pad) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, NULL, dt_dnnl_engine(), NULL) != dnnl_success)
        return NULL;
    return pd;
}

static dnnl_memory_desc_t chosen(dnnl_primitive_desc_t pd, dnnl_query_t what) {
    return *dnnl_primitive_desc_query_md(pd, what, 0);
}

/* forward: data {in, w, out, b} */
static bool build_forward(dt_dnnl_entry *e, const conv_shape *s, const dnnl_memory_desc_t *plain) {
    dnnl_primitive_desc_t pd = forward_pd(s, e->key.dt, s->bias);
    if (!pd) return false;
    dnnl_memory_desc_t q[3] = {chosen(pd, dnnl_query_src_md), chosen(pd, dnnl_query_weights_md),
                               chosen(pd, dnnl_query_dst_md)};
    dnnl_memory_t m[4] = {dt_dnnl_input(e, &plain[0], &q[0], 0), dt_dnnl_input(e, &plain[1], &q[1], 1),
                          dt_dnnl_output(e, &plain[2], &q[2], 2), s->bias ? dt_dnnl_mem(e, &plain[3], 3) : NULL};
    const int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    return dt_dnnl_step_add(e, pd, s->bias ? 4 : 3, arg, m, true);
}

/* backward data: data {din, w, dout} */
static bool build_backward_data(dt_dnnl_entry *e, const conv_shape *s, const dnnl_memory_desc_t *plain) {
    dnnl_memory_desc_t md[4];
    conv_mds(s, true, e->key.dt, md);
    md[0].data_type = dnnl_f32;  /* diff_src f32; weights and diff_dst at the precision */
    dnnl_dims_t st = {s->S, s->S}, pad = {s->P, s->P};
    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd = NULL, hint = forward_pd(s, e->key.dt, false);
    if (hint && (dnnl_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, &md[0], &md[1], &md[2], st, pad,
                                                          pad) != dnnl_success ||
                 dnnl_primitive_desc_create(&pd, &d, NULL, dt_dnnl_engine(), hint) != dnnl_success))
        pd = NULL;
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (!pd) return false;
    dnnl_memory_desc_t q[3] = {chosen(pd, dnnl_query_diff_src_md), chosen(pd, dnnl_query_weights_md),
                               chosen(pd, dnnl_query_diff_dst_md)};
    dnnl_memory_t m[3] = {dt_dnnl_output(e, &plain[0], &q[0], 0), dt_dnnl_input(e, &plain[1], &q[1], 1),
                          dt_dnnl_input(e, &plain[2], &q[2], 2)};
    const int arg[3] = {DNNL_ARG_DIFF_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_DST};
    return dt_dnnl_step_add(e, pd, 3, arg, m, true);
}

/* backward weights: data {in, dw scratch, dout} */
static bool build_backward_weights(dt_dnnl_entry *e, const conv_shape *s, const dnnl_memory_desc_t *plain) {
    dnnl_memory_desc_t md[4];
    conv_mds(s, true, e->key.dt, md);
    md[1].data_type = dnnl_f32;  /* diff_weights f32; src and diff_dst at the precision */
    dnnl_dims_t st = {s->S, s->S}, pad = {s->P, s->P};
    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd = NULL, hint = forward_pd(s, e->key.dt, false);
    if (hint && (dnnl_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, &md[0], &md[1], NULL, &md[2],
                                                             st, pad, pad) != dnnl_success ||
                 dnnl_primitive_desc_create(&pd, &d, NULL, dt_dnnl_engine(), hint) != dnnl_success))
        pd = NULL;
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (!pd) return false;
    dnnl_memory_desc_t q[3] = {chosen(pd, dnnl_query_src_md), chosen(pd, dnnl_query_diff_weights_md),
                               chosen(pd, dnnl_query_diff_dst_md)};
    dnnl_memory_t m[3] = {dt_dnnl_input(e, &plain[0], &q[0], 0), dt_dnnl_output(e, &plain[1], &q[1], 1),
                          dt_dnnl_input(e, &plain[2], &q[2], 2)};
    const int arg[3] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_DST};
    if (!dt_dnnl_step_add(e, pd, 3, arg, m, true)) return false;
    e->tmp_n = (size_t)s->OC * s->C * s->K * s->K;
    return (e->tmp = malloc(e->tmp_n * sizeof(float))) != NULL;
}

/* The entry of op (DT_DNNL_CONV_*) for s with GEMM inputs of dtype p; NULL when oneDNN has none.
 * Outside it takes f32 NCHW/OIHW; reorders convert to the layout and dtype oneDNN chose. */
static dt_dnnl_entry *conv_entry(int op, const conv_shape *s, dt_dtype p) {
    dt_dnnl_key k = {.op = op, .dt = dnnl_type(p),
                     .d = {s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P, s->bias}};
    dt_dnnl_entry *e = dt_dnnl_lookup(&k);
    if (!e || e->used) return e && !e->failed ? e : NULL;
    dnnl_memory_desc_t plain[4];
    conv_mds(s, false, dnnl_f32, plain);
    bool ok = op == DT_DNNL_CONV_FWD       ? build_forward(e, s, plain)
              : op == DT_DNNL_CONV_BWD_DATA ? build_backward_data(e, s, plain)
                                            : build_backward_weights(e, s, plain);
    return dt_dnnl_ready(e, ok) ? e : NULL;
}

/* Entry of op at precision p, or its f32 entry with *round set (oneDNN lacks the kernel at p). */
static dt_dnnl_entry *conv_plan(int op, const conv_shape *s, dt_dtype p, bool *round) {
    dt_dnnl_entry *e = conv_entry(op, s, p);
    *round = false;
    if (e || p == DT_F32) return e;
    *round = true;
    return conv_entry(op, s, DT_F32);
}

/* The input buffer at precision p: as is (f32; a native low-precision entry converts it in its
 * reorder), or rounded to p (the f32 fallback when oneDNN lacks the kernel at p). */
static void *input(int slot, const float *x, size_t n, dt_dtype p, bool round) {
    return p != DT_F32 && round ? (void *)dt_dnnl_rounded(slot, x, n, p) : (void *)x;
}

static conv_shape shape_of(int B, int C, int H, int W, int OC, int K, int S, int P, bool bias) {
    conv_shape s = {B, C, H, W, OC, K, S, P, (H + 2 * P - K) / S + 1, (W + 2 * P - K) / S + 1, bias};
    return s;
}

static const dt_backend *fallback(dt_dtype p) { return p == DT_F32 ? dt_backend_cpu() : dt_backend_blas_lowp(p); }

/* At f32, a convolution over fewer than 16 input channels (the reference CNN's first layer, C = 1)
 * runs as im2col + sgemm, which writes NCHW directly: oneDNN's kernel wants its (B,OC,H,W)
 * output and gradient in the blocked nChw16c layout, and the two reorders of that large tensor
 * cost more than the convolution itself (measured: 1.5x faster per CPU-second on a conv(32,3)
 * model, +15% on the reference CNN). At bf16/fp16 oneDNN keeps it (its kernel then also converts). */
static bool prefers_im2col(dt_dtype p, int C) { return p == DT_F32 && C < 16; }

void dt_dnnl_conv_forward(dt_dtype p, float *out, const float *in, const float *w, const float *b, float *work, int B,
                          int C, int H, int W, int OC, int K, int S, int P) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, b != NULL);
    bool round;
    dt_dnnl_entry *e = B > 0 && !prefers_im2col(p, C) ? conv_plan(DT_DNNL_CONV_FWD, &s, p, &round) : NULL;
    if (!e) return fallback(p)->conv2d_forward(out, in, w, b, work, B, C, H, W, OC, K, S, P);
    void *data[4] = {input(0, in, (size_t)B * C * H * W, p, round), input(1, w, (size_t)OC * C * K * K, p, round), out,
                     (void *)b};
    dt_dnnl_run(e, data);
}

void dt_dnnl_conv_backward(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                           const float *w, float *work, int B, int C, int H, int W, int OC, int K, int S, int P) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, false);  /* backward primitives have no bias */
    if (prefers_im2col(p, C)) return fallback(p)->conv2d_backward(din, dw, db, dout, in, w, work, B, C, H, W, OC, K, S, P);
    bool rd = false, rw = false;
    dt_dnnl_entry *ed = din && B > 0 ? conv_plan(DT_DNNL_CONV_BWD_DATA, &s, p, &rd) : NULL;
    dt_dnnl_entry *ew = dw && B > 0 ? conv_plan(DT_DNNL_CONV_BWD_W, &s, p, &rw) : NULL;
    if ((din && !ed) || (dw && !ew) || B <= 0)
        return fallback(p)->conv2d_backward(din, dw, db, dout, in, w, work, B, C, H, W, OC, K, S, P);
    size_t nout = (size_t)B * OC * s.OH * s.OW, nw = (size_t)OC * C * K * K;
    if (ew) {
        void *data[3] = {input(0, in, (size_t)B * C * H * W, p, rw), ew->tmp, input(1, dout, nout, p, rw)};
        dt_dnnl_run(ew, data);
        for (size_t i = 0; i < nw; i++) dw[i] += ew->tmp[i];
    }
    if (db)  /* from the f32 gradient at every precision */
        for (int n = 0; n < B; n++)
            for (int o = 0; o < OC; o++) db[o] += dt_nn_sum(dout + ((size_t)n * OC + o) * s.OH * s.OW, (size_t)s.OH * s.OW);
    if (ed) {
        void *data[3] = {din, input(1, w, nw, p, rd), input(2, dout, nout, p, rd)};
        dt_dnnl_run(ed, data);
    }
}

#endif
