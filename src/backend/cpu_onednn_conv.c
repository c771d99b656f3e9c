/* oneDNN convolutions: forward, backward data and backward weights on NCHW activations and OIHW
 * weights (torch's layouts), cached per shape and precision like the matmuls (cpu_onednn.c); also
 * on blocked activations, nChw16c or nChw8c (DT_BLOCK; the *_blocked entries: a conv chain of the graph,
 * graph_layout.c), which oneDNN's kernels read and write without reorders at f32 and with a
 * cast only at bf16/fp16. Backward weights writes into a per-primitive scratch that is then
 * ADDED to dw (the backend contract accumulates parameter gradients; oneDNN overwrites); db sums
 * the f32 gradient (blocked f32: oneDNN's backward weights sums it in the same pass). */
#include "backend/backend.h"

#if DT_HAVE_DNNL
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/blocked.h"
#include "backend/onednn.h"
#include "backend/kern.h"

typedef struct {
    int B, C, H, W, OC, K, S, P, OH, OW;
    bool bias;
    dt_layout in_l, out_l;  /* of in / out (and dout) outside; din is f32 in in's layout (blocked f32
                             * for bf16 in) */
    bool in_bl, out_bl;     /* in (din) / out (dout) blocked or NHWC (f32 or bf16), else NCHW */
} conv_shape;

static conv_shape shape_of(int B, int C, int H, int W, int OC, int K, int S, int P, bool bias, dt_layout in_l,
                           dt_layout out_l) {
    conv_shape s = {B, C, H, W, OC, K, S, P, (H + 2 * P - K) / S + 1, (W + 2 * P - K) / S + 1, bias, in_l, out_l,
                    in_l != DT_LAYOUT_NCHW, out_l != DT_LAYOUT_NCHW};
    return s;
}

static bool has_bf16(const conv_shape *s) { return dt_layout_bf16(s->in_l) || dt_layout_bf16(s->out_l); }

static dnnl_data_type_t dnnl_type(dt_dtype p) { return p == DT_BF16 ? dnnl_bf16 : p == DT_F16 ? dnnl_f16 : dnnl_f32; }

static dnnl_data_type_t layout_type(dt_layout l) { return dt_layout_bf16(l) ? dnnl_bf16 : dnnl_f32; }

static dnnl_format_tag_t layout_tag(dt_layout l) {
    if (l == DT_LAYOUT_NCHW) return dnnl_nchw;
    if (dt_layout_nhwc(l)) return dnnl_nhwc;
    return DT_BLOCK == 16 ? dnnl_nChw16c : dnnl_nChw8c;
}

/* The outside descriptors of src (in in_l: NCHW, blocked or NHWC; bf16 for a bf16 layout), weights
 * (OIHW, f32), dst (likewise), bias and diff_src (f32 in src's layout); with `any` the first three
 * leave the layout to oneDNN at dtype dt (dst and diff_weights: see the pds). */
static void conv_mds(const conv_shape *s, bool any, dnnl_data_type_t dt, dnnl_memory_desc_t md[5]) {
    const dnnl_dims_t src = {s->B, s->C, s->H, s->W}, w = {s->OC, s->C, s->K, s->K}, dst = {s->B, s->OC, s->OH, s->OW},
                      b = {s->OC};
    const dnnl_format_tag_t ts = layout_tag(s->in_l), td = layout_tag(s->out_l);
    dnnl_memory_desc_init_by_tag(&md[0], 4, src, any ? dt : layout_type(s->in_l), any ? dnnl_format_tag_any : ts);
    dnnl_memory_desc_init_by_tag(&md[1], 4, w, any ? dt : dnnl_f32, any ? dnnl_format_tag_any : dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&md[2], 4, dst, any ? dt : layout_type(s->out_l), any ? dnnl_format_tag_any : td);
    dnnl_memory_desc_init_by_tag(&md[3], 1, b, dnnl_f32, dnnl_x);
    dnnl_memory_desc_init_by_tag(&md[4], 4, src, dnnl_f32, any ? dnnl_format_tag_any : ts);
}

/* f32 3x3 stride-1 convolutions over 16+ channels try Winograd F(4x4, 3x3) first (2.25x fewer
 * multiplications; its transforms round a little more than a direct sum, within the tests'
 * 2e-5): on the reference CNN's second conv it made the forward 1.4x and the two backward passes
 * 1.3x faster than oneDNN's direct kernels (AVX-512, one thread). oneDNN has it only where the CPU
 * has AVX-512; elsewhere (or for shapes it rejects) the direct kernel is used, as always at
 * bf16/fp16. */
static bool try_winograd(const conv_shape *s, dnnl_data_type_t dt) {
    return dt == dnnl_f32 && s->K == 3 && s->S == 1 && s->C >= 16 && s->OC >= 16;
}

/* The forward primitive descriptor (dst f32, or bf16 for a bf16 out_l) with algorithm alg, NULL
 * when oneDNN has none. */
static dnnl_primitive_desc_t forward_pd_alg(const conv_shape *s, dnnl_data_type_t dt, bool bias, dnnl_alg_kind_t alg) {
    dnnl_memory_desc_t md[5];
    conv_mds(s, true, dt, md);
    md[2].data_type = layout_type(s->out_l);
    dnnl_dims_t st = {s->S, s->S}, pad = {s->P, s->P};
    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_convolution_forward_desc_init(&d, dnnl_forward_training, alg, &md[0], &md[1], bias ? &md[3] : NULL, &md[2],
                                           st, pad, pad) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, NULL, dt_dnnl_engine(), NULL) != dnnl_success)
        return NULL;
    return pd;
}

/* The algorithm of s's convolutions: Winograd where oneDNN has it for s (try_winograd), else direct. */
static dnnl_alg_kind_t conv_alg(const conv_shape *s, dnnl_data_type_t dt) {
    if (!try_winograd(s, dt)) return dnnl_convolution_direct;
    dnnl_primitive_desc_t pd = forward_pd_alg(s, dt, false, dnnl_convolution_winograd);
    if (!pd) return dnnl_convolution_direct;
    dnnl_primitive_desc_destroy(pd);
    return dnnl_convolution_winograd;
}

static dnnl_primitive_desc_t forward_pd(const conv_shape *s, dnnl_data_type_t dt, bool bias) {
    return forward_pd_alg(s, dt, bias, conv_alg(s, dt));
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

/* The backward-weights (weights) or backward-data primitive descriptor with algorithm alg: the
 * gradient it writes (diff_weights or diff_src) f32, the others at the precision; NULL when
 * oneDNN has none. With s->bias backward weights also writes diff_bias (f32). */
static dnnl_primitive_desc_t backward_pd_alg(const conv_shape *s, dnnl_data_type_t dt, bool weights,
                                             dnnl_alg_kind_t alg) {
    dnnl_memory_desc_t md[5];
    conv_mds(s, true, dt, md);
    md[weights ? 1 : 0].data_type = dnnl_f32;
    dnnl_dims_t st = {s->S, s->S}, pad = {s->P, s->P};
    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd = NULL, hint = forward_pd_alg(s, dt, false, alg);
    dnnl_status_t st_init =
        !hint     ? dnnl_unimplemented
        : weights ? dnnl_convolution_backward_weights_desc_init(&d, alg, &md[0], &md[1], s->bias ? &md[3] : NULL,
                                                                &md[2], st, pad, pad)
                  : dnnl_convolution_backward_data_desc_init(&d, alg, &md[0], &md[1], &md[2], st, pad, pad);
    if (st_init != dnnl_success || dnnl_primitive_desc_create(&pd, &d, NULL, dt_dnnl_engine(), hint) != dnnl_success)
        pd = NULL;
    if (hint) dnnl_primitive_desc_destroy(hint);
    return pd;
}

/* That of s's algorithm (conv_alg), or the direct one where oneDNN has no Winograd kernel for
 * this pass (the gradients of the Winograd forward, from a direct sum: as accurate). */
static dnnl_primitive_desc_t backward_pd(const conv_shape *s, dnnl_data_type_t dt, bool weights) {
    const dnnl_alg_kind_t alg = conv_alg(s, dt);
    dnnl_primitive_desc_t pd = backward_pd_alg(s, dt, weights, alg);
    return pd || alg == dnnl_convolution_direct ? pd : backward_pd_alg(s, dt, weights, dnnl_convolution_direct);
}

/* The backward-data step of pd: din at data pointer `din_i`, w at `w_i`, diff_dst memory dd. */
static bool add_backward_data(dt_dnnl_entry *e, const dnnl_memory_desc_t *plain, dnnl_primitive_desc_t pd,
                              dnnl_memory_t dd, int w_i, int din_i) {
    dnnl_memory_desc_t q[2] = {chosen(pd, dnnl_query_diff_src_md), chosen(pd, dnnl_query_weights_md)};
    dnnl_memory_t m[3] = {dt_dnnl_output(e, &plain[4], &q[0], din_i), dt_dnnl_input(e, &plain[1], &q[1], w_i), dd};
    const int arg[3] = {DNNL_ARG_DIFF_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_DST};
    return dt_dnnl_step_add(e, pd, 3, arg, m, true);
}

/* Backward data as a forward convolution, where stride is 1: din = conv(dout, w') with
 * w'(c, o, i, j) = w(o, c, K-1-i, K-1-j) (flipped_weights) and padding K-1-P. oneDNN's
 * backward-data kernels for its AMX bf16 convs are slower than its forward ones (brgconv):
 * measured on the reference CNN's second conv (batch 128, one thread), 4.6 ms against 3.3 ms with
 * the f32 din written in the same pass. Only for NHWC bf16 values (the AMX chain, m->nhwc),
 * where it was measured. */
static bool data_as_forward(const conv_shape *s, dnnl_data_type_t dt) {
    return dt == dnnl_bf16 && s->S == 1 && s->P <= s->K - 1 && dt_layout_nhwc(s->in_l) && dt_layout_bf16(s->out_l);
}

/* data_as_forward's convolution: dout as src, the flipped weights, din (f32, in in's layout) as dst. */
static conv_shape data_shape(const conv_shape *s) {
    return shape_of(s->B, s->OC, s->OH, s->OW, s->C, s->K, 1, s->K - 1 - s->P, false, s->out_l,
                    dt_layout_nhwc(s->in_l) ? DT_LAYOUT_NHWC : DT_LAYOUT_BLOCKED);
}

/* The step of data_as_forward with its pd (data_shape's forward): dout at data pointer dout_i,
 * the flipped weights at w_i, din at din_i. */
static bool add_data_as_forward(dt_dnnl_entry *e, const conv_shape *s, dnnl_primitive_desc_t pd, int dout_i, int w_i,
                                int din_i) {
    const conv_shape t = data_shape(s);
    dnnl_memory_desc_t plain[5];
    conv_mds(&t, false, dnnl_f32, plain);
    dnnl_memory_desc_t q[3] = {chosen(pd, dnnl_query_src_md), chosen(pd, dnnl_query_weights_md),
                               chosen(pd, dnnl_query_dst_md)};
    dnnl_memory_t m[3] = {dt_dnnl_input(e, &plain[0], &q[0], dout_i), dt_dnnl_input(e, &plain[1], &q[1], w_i),
                          dt_dnnl_output(e, &plain[2], &q[2], din_i)};
    const int arg[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
    return e->w_flipped = dt_dnnl_step_add(e, pd, 3, arg, m, true);
}

/* The backward-weights step of pd: in at data pointer `in_i`, the dw scratch at `dw_i` (e->tmp;
 * with s->bias the db scratch after it, at data pointer dw_i + 2: see conv_backward). */
static bool add_backward_weights(dt_dnnl_entry *e, const conv_shape *s, const dnnl_memory_desc_t *plain,
                                 dnnl_primitive_desc_t pd, dnnl_memory_t dd, int in_i, int dw_i, int db_i) {
    dnnl_memory_desc_t q[2] = {chosen(pd, dnnl_query_src_md), chosen(pd, dnnl_query_diff_weights_md)};
    dnnl_memory_t m[4] = {dt_dnnl_input(e, &plain[0], &q[0], in_i), dt_dnnl_output(e, &plain[1], &q[1], dw_i), dd,
                          s->bias ? dt_dnnl_mem(e, &plain[3], db_i) : NULL};
    const int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_BIAS};
    if (!dt_dnnl_step_add(e, pd, s->bias ? 4 : 3, arg, m, true)) return false;
    e->tmp_n = (size_t)s->OC * s->C * s->K * s->K + (s->bias ? (size_t)s->OC : 0);
    return (e->tmp = malloc(e->tmp_n * sizeof(float))) != NULL;
}

/* diff_dst (plain at data pointer dout_i) as pd wants it. */
static dnnl_memory_t diff_dst_of(dt_dnnl_entry *e, const dnnl_memory_desc_t *plain, dnnl_primitive_desc_t pd,
                                 int dout_i) {
    dnnl_memory_desc_t q = chosen(pd, dnnl_query_diff_dst_md);
    return dt_dnnl_input(e, &plain[2], &q, dout_i);
}

/* One backward op: data {din, w, dout} (data), {in, dw scratch, dout[, db scratch]} (weights), or
 * both in one entry, {in, dw scratch, dout, w, din[, db scratch]}, where dout is reordered once for
 * the two primitives when they want the same layout; the db scratch with s->bias. */
static bool build_backward(dt_dnnl_entry *e, int op, const conv_shape *s, const dnnl_memory_desc_t *plain) {
    const bool wts = op != DT_DNNL_CONV_BWD_DATA, data = op != DT_DNNL_CONV_BWD_W;
    dnnl_primitive_desc_t pw = wts ? backward_pd(s, e->key.dt, true) : NULL;
    const conv_shape t = data_shape(s);
    dnnl_primitive_desc_t pf = data && (!wts || pw) && data_as_forward(s, e->key.dt)
                                   ? forward_pd_alg(&t, dnnl_bf16, false, dnnl_convolution_direct)
                                   : NULL;
    if (pf) {  /* data {in, dw scratch, dout, flipped w, din[, db scratch]} or {din, flipped w, dout} */
        bool ok = !wts || add_backward_weights(e, s, plain, pw, diff_dst_of(e, plain, pw, 2), 0, 1, 5);
        if (ok) return add_data_as_forward(e, s, pf, 2, wts ? 3 : 1, wts ? 4 : 0);
        dnnl_primitive_desc_destroy(pf);
        return false;
    }
    dnnl_primitive_desc_t pd = data ? backward_pd(s, e->key.dt, false) : NULL;
    bool ok = (!wts || pw) && (!data || pd);
    if (ok && op == DT_DNNL_CONV_BWD_DATA) {
        ok = add_backward_data(e, plain, pd, diff_dst_of(e, plain, pd, 2), 1, 0);
        pd = NULL;
    } else if (ok && op == DT_DNNL_CONV_BWD_W) {
        ok = add_backward_weights(e, s, plain, pw, diff_dst_of(e, plain, pw, 2), 0, 1, 3);
        pw = NULL;
    } else if (ok) {
        dnnl_memory_desc_t qw = chosen(pw, dnnl_query_diff_dst_md), qd = chosen(pd, dnnl_query_diff_dst_md);
        dnnl_memory_t ddw = diff_dst_of(e, plain, pw, 2);
        dnnl_memory_t ddd = dnnl_memory_desc_equal(&qw, &qd) ? ddw : diff_dst_of(e, plain, pd, 2);
        ok = ddw && ddd;
        if (ok) {  /* each add destroys its pd, also when it fails */
            ok = add_backward_weights(e, s, plain, pw, ddw, 0, 1, 5);
            pw = NULL;
        }
        if (ok) {
            ok = add_backward_data(e, plain, pd, ddd, 3, 4);
            pd = NULL;
        }
    }
    if (pw) dnnl_primitive_desc_destroy(pw);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return ok;
}

/* The entry of op (DT_DNNL_CONV_*) for s with GEMM inputs of dtype p; NULL when oneDNN has none.
 * Outside it takes f32 NCHW/OIHW; reorders convert to the layout and dtype oneDNN chose. */
static dt_dnnl_entry *conv_entry(int op, const conv_shape *s, dt_dtype p) {
    if (p == DT_BF16 && !dt_onednn_bf16_native()) return NULL;  /* emulated: the f32 entry, rounded */
    dt_dnnl_key k = {.op = op, .dt = dnnl_type(p),
                     .d = {s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P, s->bias, (int)s->in_l | (int)s->out_l << 2}};
    dt_dnnl_entry *e = dt_dnnl_lookup(&k);
    if (!e || e->used) return e && !e->failed ? e : NULL;
    dnnl_memory_desc_t plain[5];
    conv_mds(s, false, dnnl_f32, plain);
    bool ok = op == DT_DNNL_CONV_FWD ? build_forward(e, s, plain) : build_backward(e, op, s, plain);
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

static const dt_backend *fallback(dt_dtype p) { return p == DT_F32 ? dt_backend_cpu() : dt_backend_blas_lowp(p); }

/* At f32, a convolution over fewer than 16 input channels with NCHW output runs as im2col + sgemm,
 * which writes NCHW directly: oneDNN's kernel wants its (B,OC,H,W) output and gradient in the
 * blocked layout, and the two reorders of that large tensor cost more than the
 * convolution itself (measured: 1.5x faster per CPU-second on a conv(32,3) model). When the graph
 * keeps the output blocked (the reference CNN's first layer, C = 1), oneDNN runs it with no
 * reorder. At bf16/fp16 oneDNN keeps it (its kernel then also converts). */
static bool prefers_im2col(dt_dtype p, int C) { return p == DT_F32 && C < 16; }

/* The plain fallback of a blocked convolution (oneDNN made no primitive): NCHW copies around the
 * cpu kernels. Each call allocates; kernels cannot fail, so out of memory aborts. x NULL: no copy. */
static float *plain_copy(const float *x, dt_layout l, int B, int C, int HW) {
    float *d = malloc((size_t)B * C * HW * sizeof(float) + 4);
    if (!d) abort();
    if (x && l != DT_LAYOUT_NCHW) dt_blocked_to_nchw(d, x, B, C, HW, dt_layout_nhwc(l));
    else if (x) memcpy(d, x, (size_t)B * C * HW * sizeof(float));
    return d;
}

static void blocked_back(float *dst, float *plain, dt_layout l, int B, int C, int HW) {
    if (l != DT_LAYOUT_NCHW) dt_blocked_from_nchw(dst, plain, B, C, HW, dt_layout_nhwc(l));
    else memcpy(dst, plain, (size_t)B * C * HW * sizeof(float));
    free(plain);
}

static void fallback_forward(const conv_shape *s, float *out, const float *in, const float *w, const float *b) {
    const dt_backend *be = dt_backend_cpu();
    float *x = plain_copy(in, s->in_l, s->B, s->C, s->H * s->W);
    float *y = plain_copy(NULL, DT_LAYOUT_NCHW, s->B, s->OC, s->OH * s->OW);
    float *work = malloc(be->conv2d_workspace(s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P) * sizeof(float) + 4);
    if (!work) abort();
    be->conv2d_forward(y, x, w, b, work, s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P);
    blocked_back(out, y, s->out_l, s->B, s->OC, s->OH * s->OW);
    free(x), free(work);
}

static void fallback_backward(const conv_shape *s, float *din, float *dw, float *db, const float *dout, const float *in,
                              const float *w) {
    const dt_backend *be = dt_backend_cpu();
    const int HW = s->H * s->W;
    float *x = plain_copy(in, s->in_l, s->B, s->C, HW), *g = plain_copy(dout, s->out_l, s->B, s->OC, s->OH * s->OW);
    float *dx = din ? plain_copy(NULL, DT_LAYOUT_NCHW, s->B, s->C, HW) : NULL;
    float *work = malloc(be->conv2d_workspace(s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P) * sizeof(float) + 4);
    if (!work) abort();
    be->conv2d_backward(dx, dw, db, g, x, w, work, s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P);
    if (dx) blocked_back(din, dx, s->in_l, s->B, s->C, HW);
    free(x), free(g), free(work);
}

/* bf16 values outside where the entry at p cannot take them (oneDNN has no bf16 kernel for s, or
 * none at all): f32 blocked copies around the f32 path. Each call allocates (a fallback); out
 * of memory aborts, as kernels cannot fail. */
static float *widened(const float *x, dt_layout l, size_t n) {
    float *d = malloc(n * sizeof(float) + 4);
    if (!d) abort();
    if (x && dt_layout_bf16(l)) dt_convert(d, DT_F32, x, DT_BF16, n);
    else if (x) memcpy(d, x, n * sizeof(float));
    return d;
}

static conv_shape f32_layouts(const conv_shape *s) {
    conv_shape t = *s;
    if (dt_layout_bf16(t.in_l)) t.in_l = t.in_l == DT_LAYOUT_NHWC_BF16 ? DT_LAYOUT_NHWC : DT_LAYOUT_BLOCKED;
    if (dt_layout_bf16(t.out_l)) t.out_l = t.out_l == DT_LAYOUT_NHWC_BF16 ? DT_LAYOUT_NHWC : DT_LAYOUT_BLOCKED;
    return t;
}

static void conv_forward(dt_dtype p, const conv_shape *s, float *out, const float *in, const float *w, const float *b,
                         float *work);

static void widened_forward(dt_dtype p, const conv_shape *s, float *out, const float *in, const float *w,
                            const float *b) {
    const size_t nin = (size_t)s->B * s->C * s->H * s->W, nout = (size_t)s->B * s->OC * s->OH * s->OW;
    const conv_shape t = f32_layouts(s);
    float *x = dt_layout_bf16(s->in_l) ? widened(in, s->in_l, nin) : (float *)in;
    float *y = dt_layout_bf16(s->out_l) ? widened(NULL, s->out_l, nout) : out;
    conv_forward(p, &t, y, x, w, b, NULL);
    if (y != out) dt_convert(out, DT_BF16, y, DT_F32, nout), free(y);
    if (x != in) free(x);
}

/* The forward of s at precision p (s->in_l, s->out_l: the layouts outside). */
static void conv_forward(dt_dtype p, const conv_shape *s, float *out, const float *in, const float *w, const float *b,
                         float *work) {
    const bool blocked = s->in_bl || s->out_bl;
    if (has_bf16(s)) {  /* only the entry at p (bf16) takes them as they are */
        dt_dnnl_entry *e = s->B > 0 && p == DT_BF16 ? conv_entry(DT_DNNL_CONV_FWD, s, p) : NULL;
        if (!e) return widened_forward(p, s, out, in, w, b);
        void *data[4] = {(void *)in, (void *)w, out, (void *)b};
        return dt_dnnl_run(e, data);
    }
    bool round;
    dt_dnnl_entry *e = s->B > 0 && (blocked || !prefers_im2col(p, s->C)) ? conv_plan(DT_DNNL_CONV_FWD, s, p, &round) : NULL;
    if (!e && blocked) return fallback_forward(s, out, in, w, b);
    if (!e)
        return fallback(p)->conv2d_forward(out, in, w, b, work, s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P);
    void *data[4] = {input(0, in, (size_t)s->B * s->C * s->H * s->W, p, round),
                     input(1, w, (size_t)s->OC * s->C * s->K * s->K, p, round), out, (void *)b};
    dt_dnnl_run(e, data);
}

void dt_dnnl_conv_forward(dt_dtype p, float *out, const float *in, const float *w, const float *b, float *work, int B,
                          int C, int H, int W, int OC, int K, int S, int P) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, b != NULL, DT_LAYOUT_NCHW, DT_LAYOUT_NCHW);
    conv_forward(p, &s, out, in, w, b, work);
}

void dt_dnnl_conv_forward_blocked(float *out, const float *in, const float *w, const float *b, int B, int C, int H,
                                  int W, int OC, int K, int S, int P, dt_layout in_l, dt_layout out_l) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, b != NULL, in_l, out_l);
    conv_forward(DT_F32, &s, out, in, w, b, NULL);
}

static void conv_backward(dt_dtype p, const conv_shape *cs, float *din, float *dw, float *db, const float *dout,
                          const float *in, const float *w, float *work);

static void widened_backward(dt_dtype p, const conv_shape *s, float *din, float *dw, float *db, const float *dout,
                             const float *in, const float *w) {
    const size_t nin = (size_t)s->B * s->C * s->H * s->W, nout = (size_t)s->B * s->OC * s->OH * s->OW;
    const conv_shape t = f32_layouts(s);
    float *x = dw && dt_layout_bf16(s->in_l) ? widened(in, s->in_l, nin) : (float *)in;
    float *g = dt_layout_bf16(s->out_l) ? widened(dout, s->out_l, nout) : (float *)dout;
    conv_backward(p, &t, din, dw, db, g, x, w, NULL);
    if (x != in) free(x);
    if (g != dout) free(g);
}

/* db (OC) += the sums of dout (in s->out_l) over the batch and the plane, in f32. */
static void bias_sums(const conv_shape *s, float *db, const float *dout) {
    const int OHW = s->OH * s->OW;
    if (dt_layout_bf16(s->out_l)) dt_blocked_channel_sums_bf16(db, dout, s->B, s->OC, OHW, dt_layout_nhwc(s->out_l));
    else if (s->out_l != DT_LAYOUT_NCHW) dt_blocked_channel_sums(db, dout, s->B, s->OC, OHW, dt_layout_nhwc(s->out_l));
    else
        for (int n = 0; n < s->B; n++)
            for (int o = 0; o < s->OC; o++) db[o] += dt_nn_sum(dout + ((size_t)n * s->OC + o) * OHW, (size_t)OHW);
}

/* w' (C, OC, K, K) of data_as_forward: w' (c, o, i, j) = w (o, c, K-1-i, K-1-j), in this thread's
 * scratch slot 3. */
static const float *flipped_weights(const float *w, int OC, int C, int K) {
    const int KK = K * K;
    float *f = dt_dnnl_scratch(3, (size_t)OC * C * KK * sizeof(float));
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++)
            for (int k = 0; k < KK; k++) f[((size_t)c * OC + o) * KK + KK - 1 - k] = w[((size_t)o * C + c) * KK + k];
    return f;
}

/* The backward of s at precision p (layouts outside as in conv_forward). */
static void conv_backward(dt_dtype p, const conv_shape *cs, float *din, float *dw, float *db, const float *dout,
                          const float *in, const float *w, float *work) {
    conv_shape s = *cs;
    /* blocked f32 or bf16 dout: oneDNN's backward weights also sums db, in the pass that reads dout
     * anyway (from the bf16 gradient the graph keeps, as torch's autocast); else db is summed
     * below from the f32 gradient (at bf16/fp16 oneDNN would sum rounded dout) */
    s.bias = db && dw && (s.in_bl || s.out_bl) && (p == DT_F32 || dt_layout_bf16(s.out_l));
    if (has_bf16(&s) && (!(din || dw) || s.B <= 0)) {
        if (db && s.B > 0) bias_sums(&s, db, dout);  /* no din, no dw */
        return;
    }
    if (has_bf16(&s)) {  /* only the entry at p (bf16) takes them as they are */
        const int op = din && dw ? DT_DNNL_CONV_BWD : din ? DT_DNNL_CONV_BWD_DATA : DT_DNNL_CONV_BWD_W;
        dt_dnnl_entry *e = p == DT_BF16 ? conv_entry(op, &s, p) : NULL;
        if (!e) return widened_backward(p, cs, din, dw, db, dout, in, w);
        const size_t nw = (size_t)s.OC * s.C * s.K * s.K;
        float *dbs = s.bias ? e->tmp + nw : NULL;
        if (e->w_flipped) w = flipped_weights(w, s.OC, s.C, s.K);
        void *both[6] = {(void *)in, e->tmp, (void *)dout, (void *)w, din, dbs}, *data_only[3] = {din, (void *)w, (void *)dout},
             *w_only[4] = {(void *)in, e->tmp, (void *)dout, dbs};
        dt_dnnl_run(e, op == DT_DNNL_CONV_BWD ? both : op == DT_DNNL_CONV_BWD_DATA ? data_only : w_only);
        if (dw)
            for (size_t i = 0; i < nw; i++) dw[i] += e->tmp[i];
        if (dbs)
            for (int o = 0; o < s.OC; o++) db[o] += dbs[o];
        else if (db) bias_sums(&s, db, dout);
        return;
    }
    const int B = s.B, C = s.C, H = s.H, W = s.W, OC = s.OC, K = s.K, S = s.S, P = s.P;
    const bool blocked = s.in_bl || s.out_bl;
    if (!blocked && prefers_im2col(p, C))
        return fallback(p)->conv2d_backward(din, dw, db, dout, in, w, work, B, C, H, W, OC, K, S, P);
    const int op = din && dw ? DT_DNNL_CONV_BWD : din ? DT_DNNL_CONV_BWD_DATA : DT_DNNL_CONV_BWD_W;
    bool rd = false;
    dt_dnnl_entry *e = (din || dw) && B > 0 ? conv_plan(op, &s, p, &rd) : NULL;
    if (!e && blocked) return fallback_backward(&s, din, dw, db, dout, in, w);
    if (!e) return fallback(p)->conv2d_backward(din, dw, db, dout, in, w, work, B, C, H, W, OC, K, S, P);
    size_t nout = (size_t)B * OC * s.OH * s.OW, nw = (size_t)OC * C * K * K;
    /* data pointers in the order the entry's op takes them (build_backward) */
    void *g = input(1, dout, nout, p, rd), *x = dw ? input(0, in, (size_t)B * C * H * W, p, rd) : NULL;
    void *wt = din ? input(2, w, nw, p, rd) : NULL;
    float *dbs = s.bias ? e->tmp + nw : NULL;  /* oneDNN's db */
    void *both[6] = {x, e->tmp, g, wt, din, dbs}, *data_only[3] = {din, wt, g}, *w_only[4] = {x, e->tmp, g, dbs};
    dt_dnnl_run(e, op == DT_DNNL_CONV_BWD ? both : op == DT_DNNL_CONV_BWD_DATA ? data_only : w_only);
    if (dw)
        for (size_t i = 0; i < nw; i++) dw[i] += e->tmp[i];
    if (dbs)
        for (int o = 0; o < OC; o++) db[o] += dbs[o];
    else if (db)  /* din only, or bf16/fp16: from the f32 gradient */
        bias_sums(&s, db, dout);
}

void dt_dnnl_conv_backward(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                           const float *w, float *work, int B, int C, int H, int W, int OC, int K, int S, int P) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, false, DT_LAYOUT_NCHW, DT_LAYOUT_NCHW);
    conv_backward(p, &s, din, dw, db, dout, in, w, work);
}

void dt_dnnl_conv_backward_blocked(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                                   int B, int C, int H, int W, int OC, int K, int S, int P, dt_layout in_l,
                                   dt_layout out_l) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, false, in_l, out_l);
    conv_backward(DT_F32, &s, din, dw, db, dout, in, w, NULL);
}

/* Blocked convolutions at bf16/fp16 (the lowp tables' *_blocked entries). Values kept f32
 * blocked outside are converted by the primitive's reorders (no transpose); those the graph keeps
 * at bf16 (DT_LAYOUT_BLOCKED_BF16: between bf16 convs and max pools, nn/graph_layout.c) reach the
 * kernel as they are, and the output is written at bf16 for them, f32 blocked otherwise; din is
 * f32. db is summed from the f32 gradient, or by oneDNN from a bf16 one.
 * A convolution over fewer than 16 input channels runs at f32: vdpbf16ps multiplies channel
 * pairs, so with C = 1 (the CNN's first layer) oneDNN's bf16 kernel pads half its lanes and is no
 * faster than f32, while converting its large output gradient to bf16 costs a pass more
 * (measured on AVX512-BF16: the layer 2x slower than at f32). */
static dt_dtype blocked_precision(dt_dtype p, int C) { return C < 16 ? DT_F32 : p; }

bool dt_dnnl_conv_bf16_values(int C) { return dt_onednn_bf16_native() && blocked_precision(DT_BF16, C) == DT_BF16; }

/* Whether oneDNN's bf16 convolution here takes NHWC: the src layout it picks, left free, for the
 * reference CNN's second conv (32 -> 64 channels, 3x3, 14x14). Its AMX kernels pick NHWC (acdb);
 * the AVX512-BF16 ones nChw16c. Asked once. */
static bool bf16_nhwc;
static void ask_bf16_nhwc(void) {
    const conv_shape s = shape_of(64, 32, 14, 14, 64, 3, 1, 1, false, DT_LAYOUT_BLOCKED, DT_LAYOUT_BLOCKED);
    dnnl_primitive_desc_t pd = dt_onednn_bf16_native() ? forward_pd(&s, dnnl_bf16, false) : NULL;
    if (!pd) return;
    const dnnl_memory_desc_t src = chosen(pd, dnnl_query_src_md);
    bf16_nhwc = src.format_kind == dnnl_blocked && src.format_desc.blocking.inner_nblks == 0 &&
                src.format_desc.blocking.strides[1] == 1;
    dnnl_primitive_desc_destroy(pd);
}

bool dt_dnnl_conv_bf16_nhwc(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, ask_bf16_nhwc);
    return bf16_nhwc;
}

void dt_dnnl_conv_forward_blocked_lowp(dt_dtype p, float *out, const float *in, const float *w, const float *b, int B,
                                       int C, int H, int W, int OC, int K, int S, int P, dt_layout in_l,
                                       dt_layout out_l) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, b != NULL, in_l, out_l);
    conv_forward(blocked_precision(p, C), &s, out, in, w, b, NULL);
}

void dt_dnnl_conv_backward_blocked_lowp(dt_dtype p, float *din, float *dw, float *db, const float *dout,
                                        const float *in, const float *w, int B, int C, int H, int W, int OC, int K,
                                        int S, int P, dt_layout in_l, dt_layout out_l) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, false, in_l, out_l);
    conv_backward(blocked_precision(p, C), &s, din, dw, db, dout, in, w, NULL);
}

#endif
