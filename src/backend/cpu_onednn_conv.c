/* oneDNN convolutions: forward, backward data and backward weights on NCHW activations and OIHW
 * weights (torch's layouts), cached per shape and precision like the matmuls (cpu_onednn.c); also
 * on blocked activations, nChw16c or nChw8c (DT_BLOCK; the *_blocked entries: a conv chain of the graph,
 * graph_layout.c), which oneDNN's kernels read and write without reorders at f32 and with a
 * cast only at bf16/fp16. Backward weights writes into a per-primitive scratch that is then
 * ADDED to dw (the backend contract accumulates parameter gradients; oneDNN overwrites); db sums
 * the f32 gradient (blocked f32: oneDNN's backward weights sums it in the same pass). This file
 * runs the entries (built in cpu_onednn_conv_entry.c) and the fallbacks around them. */
#include "backend/backend.h"

#if DT_HAVE_DNNL
#include <stdlib.h>
#include <string.h>

#include "backend/blocked.h"
#include "backend/kern.h"
#include "backend/onednn_conv.h"

/* The input buffer at precision p: as is (f32; a native low-precision entry converts it in its
 * reorder), or rounded to p (the f32 fallback when oneDNN lacks the kernel at p). */
static void *input(int slot, const float *x, size_t n, dt_dtype p, bool round) {
    return p != DT_F32 && round ? (void *)dt_dnnl_rounded(slot, x, n, p) : (void *)x;
}

static const dt_kernel_table *fallback(dt_dtype p) { return p == DT_F32 ? dt_backend_cpu() : dt_backend_blas_lowp(p); }

/* The fallback's workspace: the graph's work (this table's f32 conv2d_workspace) at f32; at
 * bf16/fp16 the blas table's larger one (its rounded inputs too), in this thread's scratch slot 5. */
static float *fallback_work(dt_dtype p, float *work, int B, int C, int H, int W, int OC, int K, int S, int P) {
    if (p == DT_F32) return work;
    return dt_dnnl_scratch(5, fallback(p)->conv2d_workspace(B, C, H, W, OC, K, S, P) * sizeof(float) + 4);
}

/* At f32, a convolution over fewer than 16 input channels with NCHW output runs as im2col + sgemm,
 * which writes NCHW directly: oneDNN's kernel wants its (B,OC,H,W) output and gradient in the
 * blocked layout, and the two reorders of that large tensor cost more than the
 * convolution itself (docs/why.md, "im2col for few input channels"). When the graph
 * keeps the output blocked (the reference CNN's first layer, C = 1), oneDNN runs it with no
 * reorder. At bf16/fp16 oneDNN keeps it (its kernel then also converts). */
static bool prefers_im2col(dt_dtype p, int C) { return p == DT_F32 && C < 16; }

/* The plain fallback of a blocked convolution (oneDNN made no primitive): NCHW copies around the
 * cpu kernels, in this thread's scratch slots 8..11 (grown once per shape, not per call; NULL with
 * the kernel error set when one cannot grow). x NULL: no copy. */
static float *plain_copy(int slot, const float *x, dt_layout l, int B, int C, int HW) {
    float *d = dt_dnnl_scratch(slot, (size_t)B * C * HW * sizeof(float) + 4);
    if (!d) return NULL;
    if (x && l != DT_LAYOUT_NCHW) dt_blocked_to_nchw(d, x, B, C, HW, dt_layout_nhwc(l));
    else if (x) memcpy(d, x, (size_t)B * C * HW * sizeof(float));
    return d;
}

static void blocked_back(float *dst, float *plain, dt_layout l, int B, int C, int HW) {
    if (l != DT_LAYOUT_NCHW) dt_blocked_from_nchw(dst, plain, B, C, HW, dt_layout_nhwc(l));
    else memcpy(dst, plain, (size_t)B * C * HW * sizeof(float));
}

/* The cpu table's workspace for s, in slot 11. */
static float *plain_work(const conv_shape *s) {
    const size_t n = dt_backend_cpu()->conv2d_workspace(s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P);
    return dt_dnnl_scratch(11, n * sizeof(float) + 4);
}

static void fallback_forward(const conv_shape *s, float *out, const float *in, const float *w, const float *b) {
    const dt_kernel_table *be = dt_backend_cpu();
    float *x = plain_copy(8, in, s->in_l, s->B, s->C, s->H * s->W);
    float *y = x ? plain_copy(9, NULL, DT_LAYOUT_NCHW, s->B, s->OC, s->OH * s->OW) : NULL;
    float *work = y ? plain_work(s) : NULL;
    if (!work) return; /* the kernel error is set */
    be->conv2d_forward(y, x, w, b, work, s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P);
    blocked_back(out, y, s->out_l, s->B, s->OC, s->OH * s->OW);
}

static void fallback_backward(const conv_shape *s, float *din, float *dw, float *db, const float *dout, const float *in,
                              const float *w) {
    const dt_kernel_table *be = dt_backend_cpu();
    const int HW = s->H * s->W;
    float *x = plain_copy(8, in, s->in_l, s->B, s->C, HW);
    float *g = x ? plain_copy(9, dout, s->out_l, s->B, s->OC, s->OH * s->OW) : NULL;
    float *dx = g && din ? plain_copy(10, NULL, DT_LAYOUT_NCHW, s->B, s->C, HW) : NULL;
    float *work = g && (dx || !din) ? plain_work(s) : NULL;
    if (!work) return; /* the kernel error is set */
    be->conv2d_backward(dx, dw, db, g, x, w, work, s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P);
    if (dx) blocked_back(din, dx, s->in_l, s->B, s->C, HW);
}

/* bf16 values outside where the entry at p cannot take them (oneDNN has no bf16 kernel for s, or
 * none at all): f32 blocked copies around the f32 path, in this thread's scratch slots 6..7 (NULL
 * with the kernel error set when one cannot grow). */
static float *widened(int slot, const float *x, dt_layout l, size_t n) {
    float *d = dt_dnnl_scratch(slot, n * sizeof(float) + 4);
    if (!d) return NULL;
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
    float *x = dt_layout_bf16(s->in_l) ? widened(6, in, s->in_l, nin) : (float *)in;
    float *y = dt_layout_bf16(s->out_l) ? widened(7, NULL, s->out_l, nout) : out;
    if (!x || !y) return; /* the kernel error is set */
    conv_forward(p, &t, y, x, w, b, NULL);
    if (y != out) dt_convert(out, DT_BF16, y, DT_F32, nout);
}

/* The forward of s at precision p (s->in_l, s->out_l: the layouts outside). */
static void conv_forward(dt_dtype p, const conv_shape *s, float *out, const float *in, const float *w, const float *b,
                         float *work) {
    const bool blocked = s->in_bl || s->out_bl;
    if (has_bf16(s)) { /* only the entry at p (bf16) takes them as they are */
        dt_dnnl_entry *e = s->B > 0 && p == DT_BF16 ? dt_dnnl_conv_entry(DT_DNNL_CONV_FWD, s, p) : NULL;
        if (!e) return widened_forward(p, s, out, in, w, b);
        void *data[4] = {(void *)in, (void *)w, out, (void *)b};
        return dt_dnnl_run(e, data);
    }
    bool round;
    dt_dnnl_entry *e = s->B > 0 && (blocked || !prefers_im2col(p, s->C))
                           ? dt_dnnl_conv_plan(DT_DNNL_CONV_FWD, s, p, &round)
                           : NULL;
    if (!e && blocked) return fallback_forward(s, out, in, w, b);
    if (!e) {
        float *fw = fallback_work(p, work, s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P);
        if (fw || p == DT_F32)
            fallback(p)->conv2d_forward(out, in, w, b, fw, s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P);
        return;
    }
    void *data[4] = {input(0, in, (size_t)s->B * s->C * s->H * s->W, p, round),
                     input(1, w, (size_t)s->OC * s->C * s->K * s->K, p, round), out, (void *)b};
    if (data[0] && data[1]) dt_dnnl_run(e, data); /* else a rounded copy could not be had: the kernel error is set */
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
    float *x = dw && dt_layout_bf16(s->in_l) ? widened(6, in, s->in_l, nin) : (float *)in;
    float *g = dt_layout_bf16(s->out_l) ? widened(7, dout, s->out_l, nout) : (float *)dout;
    if ((dw && dt_layout_bf16(s->in_l) && !x) || !g) return; /* the kernel error is set */
    conv_backward(p, &t, din, dw, db, g, x, w, NULL);
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
    if (!f) return NULL;
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
        if (db && s.B > 0) bias_sums(&s, db, dout); /* no din, no dw */
        return;
    }
    if (has_bf16(&s)) { /* only the entry at p (bf16) takes them as they are */
        const int op = din && dw ? DT_DNNL_CONV_BWD : din ? DT_DNNL_CONV_BWD_DATA : DT_DNNL_CONV_BWD_W;
        dt_dnnl_entry *e = p == DT_BF16 ? dt_dnnl_conv_entry(op, &s, p) : NULL;
        if (!e) return widened_backward(p, cs, din, dw, db, dout, in, w);
        const size_t nw = (size_t)s.OC * s.C * s.K * s.K;
        float *dbs = s.bias ? e->tmp + nw : NULL;
        if (e->w_flipped && !(w = flipped_weights(w, s.OC, s.C, s.K))) return;
        void *both[6] = {(void *)in, e->tmp, (void *)dout, (void *)w, din, dbs},
             *data_only[3] = {din, (void *)w, (void *)dout}, *w_only[4] = {(void *)in, e->tmp, (void *)dout, dbs};
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
    dt_dnnl_entry *e = (din || dw) && B > 0 ? dt_dnnl_conv_plan(op, &s, p, &rd) : NULL;
    if (!e && blocked) return fallback_backward(&s, din, dw, db, dout, in, w);
    if (!e) {
        float *fw = fallback_work(p, work, B, C, H, W, OC, K, S, P);
        if (fw || p == DT_F32) fallback(p)->conv2d_backward(din, dw, db, dout, in, w, fw, B, C, H, W, OC, K, S, P);
        return;
    }
    size_t nout = (size_t)B * OC * s.OH * s.OW, nw = (size_t)OC * C * K * K;
    /* data pointers in the order the entry's op takes them (build_backward) */
    void *g = input(1, dout, nout, p, rd), *x = dw ? input(0, in, (size_t)B * C * H * W, p, rd) : NULL;
    void *wt = din ? input(2, w, nw, p, rd) : NULL;
    if (!g || (dw && !x) || (din && !wt)) return; /* a rounded copy could not be had: the kernel error is set */
    float *dbs = s.bias ? e->tmp + nw : NULL;     /* oneDNN's db */
    void *both[6] = {x, e->tmp, g, wt, din, dbs}, *data_only[3] = {din, wt, g}, *w_only[4] = {x, e->tmp, g, dbs};
    dt_dnnl_run(e, op == DT_DNNL_CONV_BWD ? both : op == DT_DNNL_CONV_BWD_DATA ? data_only : w_only);
    if (dw)
        for (size_t i = 0; i < nw; i++) dw[i] += e->tmp[i];
    if (dbs)
        for (int o = 0; o < OC; o++) db[o] += dbs[o];
    else if (db) /* din only, or bf16/fp16: from the f32 gradient */ bias_sums(&s, db, dout);
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
 * (docs/why.md, "Few input channels stay f32"). */
static dt_dtype blocked_precision(dt_dtype p, int C) { return C < 16 ? DT_F32 : p; }

bool dt_dnnl_conv_bf16_values(int C) { return dt_onednn_bf16_native() && blocked_precision(DT_BF16, C) == DT_BF16; }

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
