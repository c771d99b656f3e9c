/* Building the convolutions' cached oneDNN entries (onednn_conv.h; cpu_onednn_conv.c runs them):
 * the memory descriptors outside (NCHW, blocked or NHWC activations, OIHW weights), the
 * primitive descriptors (Winograd where oneDNN has it at f32), and the steps of a forward, a
 * backward-data, a backward-weights or a combined backward entry; also the one-time question
 * whether oneDNN's bf16 convolutions want NHWC here. */
#include "backend/backend.h"

#if DT_HAVE_DNNL
#include <pthread.h>
#include <stdlib.h>

#include "backend/blocked.h"
#include "backend/onednn_conv.h"

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
 * 2e-5): faster than oneDNN's direct kernels at the reference CNN's shapes (docs/why.md, "Winograd
 * convolutions"). oneDNN has it only where the CPU
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
        dnnl_primitive_desc_create(&pd, &d, dt_dnnl_attr(), dt_dnnl_engine(), NULL) != dnnl_success)
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
    dnnl_status_t st_init = !hint     ? dnnl_unimplemented
                            : weights ? dnnl_convolution_backward_weights_desc_init(
                                            &d, alg, &md[0], &md[1], s->bias ? &md[3] : NULL, &md[2], st, pad, pad)
                                      : dnnl_convolution_backward_data_desc_init(&d, alg, &md[0], &md[1], &md[2], st,
                                                                                 pad, pad);
    if (st_init != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, dt_dnnl_attr(), dt_dnnl_engine(), hint) != dnnl_success)
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
 * backward-data kernels for its AMX bf16 convs are slower than its forward ones (brgconv), the f32
 * din written in the same pass (docs/why.md, "AMX backward data as a forward convolution"). Only
 * for NHWC bf16 values (the AMX chain, m->nhwc), where it was measured. */
static bool data_as_forward(const conv_shape *s, dnnl_data_type_t dt) {
    return dt == dnnl_bf16 && s->S == 1 && s->P <= s->K - 1 && dt_layout_nhwc(s->in_l) && dt_layout_bf16(s->out_l);
}

/* data_as_forward's convolution: dout as src, the flipped weights, din (f32, in in's layout) as dst. */
static conv_shape data_shape(const conv_shape *s) {
    return shape_of(s->B, s->OC, s->OH, s->OW, s->C, s->K, 1, s->K - 1 - s->P, false, s->out_l,
                    dt_layout_nhwc(s->in_l) ? DT_LAYOUT_NHWC : DT_LAYOUT_BLOCKED);
}

/* The step of data_as_forward with its shape t (data_shape) and pd: dout at data pointer dout_i,
 * the flipped weights at w_i, din at din_i. */
static bool add_data_as_forward(dt_dnnl_entry *e, const conv_shape *t, dnnl_primitive_desc_t pd, int dout_i, int w_i,
                                int din_i) {
    dnnl_memory_desc_t plain[5];
    conv_mds(t, false, dnnl_f32, plain);
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
    return (e->tmp = dt_dnnl_alloc(e->tmp_n * sizeof(float))) != NULL;
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
    if (pf) { /* data {in, dw scratch, dout, flipped w, din[, db scratch]} or {din, flipped w, dout} */
        bool ok = !wts || add_backward_weights(e, s, plain, pw, diff_dst_of(e, plain, pw, 2), 0, 1, 5);
        if (ok) return add_data_as_forward(e, &t, pf, 2, wts ? 3 : 1, wts ? 4 : 0);
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
        if (ok) { /* each add destroys its pd, also when it fails */
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

dt_dnnl_entry *dt_dnnl_conv_entry(int op, const conv_shape *s, dt_dtype p) {
    if (p == DT_BF16 && !dt_onednn_bf16_native()) return NULL; /* emulated: the f32 entry, rounded */
    dt_dnnl_key k = {
        .op = op,
        .dt = dnnl_type(p),
        .d = {s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P, s->bias, (int)s->in_l | (int)s->out_l << 2}};
    dt_dnnl_entry *e = dt_dnnl_lookup(&k);
    if (!e || e->used) return e && !e->failed ? e : NULL;
    dnnl_memory_desc_t plain[5];
    conv_mds(s, false, dnnl_f32, plain);
    bool ok = op == DT_DNNL_CONV_FWD ? build_forward(e, s, plain) : build_backward(e, op, s, plain);
    return dt_dnnl_ready(e, ok) ? e : NULL;
}

dt_dnnl_entry *dt_dnnl_conv_plan(int op, const conv_shape *s, dt_dtype p, bool *round) {
    dt_dnnl_entry *e = dt_dnnl_conv_entry(op, s, p);
    *round = false;
    if (e || p == DT_F32) return e;
    *round = true;
    return dt_dnnl_conv_entry(op, s, DT_F32);
}

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

#endif
