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

/* Memory descriptors of src, weights, dst (at the given types) and bias (f32). */
static void conv_mds(const conv_shape *s, dnnl_data_type_t ts, dnnl_data_type_t tw, dnnl_data_type_t td,
                     dnnl_memory_desc_t md[4]) {
    int64_t src[4] = {s->B, s->C, s->H, s->W}, w[4] = {s->OC, s->C, s->K, s->K}, dst[4] = {s->B, s->OC, s->OH, s->OW},
            b[1] = {s->OC};
    md[0] = dt_dnnl_md(4, src, ts, NULL), md[1] = dt_dnnl_md(4, w, tw, NULL), md[2] = dt_dnnl_md(4, dst, td, NULL);
    md[3] = dt_dnnl_md(1, b, dnnl_f32, NULL);
}

static dnnl_primitive_desc_t forward_pd(const conv_shape *s, const dnnl_memory_desc_t *md, bool bias) {
    dnnl_dims_t st = {s->S, s->S}, pad = {s->P, s->P};
    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_convolution_forward_desc_init(&d, dnnl_forward_training, dnnl_convolution_direct, &md[0], &md[1],
                                           bias ? &md[3] : NULL, &md[2], st, pad, pad) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &d, NULL, dt_dnnl_engine(), NULL) != dnnl_success)
        return NULL;
    return pd;
}

/* The entry of op (DT_DNNL_CONV_*) for s with GEMM inputs of dtype p; NULL when oneDNN has none. */
static dt_dnnl_entry *conv_entry(int op, const conv_shape *s, dt_dtype p) {
    dt_dnnl_key k = {.op = op, .dt = dnnl_type(p),
                     .d = {s->B, s->C, s->H, s->W, s->OC, s->K, s->S, s->P, s->bias}};
    dt_dnnl_entry *e = dt_dnnl_lookup(&k);
    if (!e || e->used) return e && !e->failed ? e : NULL;
    dnnl_memory_desc_t md[4];
    dnnl_dims_t st = {s->S, s->S}, pad = {s->P, s->P};
    dnnl_convolution_desc_t d;
    dnnl_primitive_desc_t pd = NULL, hint = NULL;
    if (op == DT_DNNL_CONV_FWD) {
        conv_mds(s, k.dt, k.dt, dnnl_f32, md);
        int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
        return dt_dnnl_finish(e, forward_pd(s, md, s->bias), s->bias ? 4 : 3, arg, md) ? e : NULL;
    }
    if (op == DT_DNNL_CONV_BWD_DATA) {
        conv_mds(s, dnnl_f32, k.dt, k.dt, md);  /* diff_src f32, weights and diff_dst low precision */
        dnnl_memory_desc_t hmd[4];
        conv_mds(s, k.dt, k.dt, k.dt == dnnl_f32 ? dnnl_f32 : k.dt, hmd);
        hint = forward_pd(s, hmd, false);
        if (hint && dnnl_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, &md[0], &md[1], &md[2], st, pad,
                                                             pad) == dnnl_success &&
            dnnl_primitive_desc_create(&pd, &d, NULL, dt_dnnl_engine(), hint) != dnnl_success)
            pd = NULL;
        if (hint) dnnl_primitive_desc_destroy(hint);
        int arg[3] = {DNNL_ARG_DIFF_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_DST};
        dnnl_memory_desc_t m3[3] = {md[0], md[1], md[2]};
        return dt_dnnl_finish(e, pd, 3, arg, m3) ? e : NULL;
    }
    conv_mds(s, k.dt, dnnl_f32, k.dt, md);  /* src and diff_dst low precision, diff_weights f32 */
    dnnl_memory_desc_t hmd[4];
    conv_mds(s, k.dt, k.dt, k.dt == dnnl_f32 ? dnnl_f32 : k.dt, hmd);
    hint = forward_pd(s, hmd, false);
    if (hint && dnnl_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, &md[0], &md[1], NULL, &md[2],
                                                            st, pad, pad) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &d, NULL, dt_dnnl_engine(), hint) != dnnl_success)
        pd = NULL;
    if (hint) dnnl_primitive_desc_destroy(hint);
    int arg[3] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_DST};
    if (!dt_dnnl_finish(e, pd, 3, arg, md)) return NULL;
    e->tmp_n = (size_t)s->OC * s->C * s->K * s->K;
    if (!(e->tmp = malloc(e->tmp_n * sizeof(float)))) abort();  /* kernels cannot fail */
    return e;
}

/* Entry of op at precision p, or its f32 entry with *round set (oneDNN lacks the kernel at p). */
static dt_dnnl_entry *conv_plan(int op, const conv_shape *s, dt_dtype p, bool *round) {
    dt_dnnl_entry *e = conv_entry(op, s, p);
    *round = false;
    if (e || p == DT_F32) return e;
    *round = true;
    return conv_entry(op, s, DT_F32);
}

/* The input buffer at precision p: as is (f32), converted (native), or rounded (fallback). */
static void *input(int slot, const float *x, size_t n, dt_dtype p, bool round) {
    if (p == DT_F32) return (void *)x;
    return round ? (void *)dt_dnnl_rounded(slot, x, n, p) : dt_dnnl_convert(slot, x, n, p);
}

static conv_shape shape_of(int B, int C, int H, int W, int OC, int K, int S, int P, bool bias) {
    conv_shape s = {B, C, H, W, OC, K, S, P, (H + 2 * P - K) / S + 1, (W + 2 * P - K) / S + 1, bias};
    return s;
}

static const dt_backend *fallback(dt_dtype p) { return p == DT_F32 ? dt_backend_cpu() : dt_backend_blas_lowp(p); }

void dt_dnnl_conv_forward(dt_dtype p, float *out, const float *in, const float *w, const float *b, float *work, int B,
                          int C, int H, int W, int OC, int K, int S, int P) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, b != NULL);
    bool round;
    dt_dnnl_entry *e = B > 0 ? conv_plan(DT_DNNL_CONV_FWD, &s, p, &round) : NULL;
    if (!e) return fallback(p)->conv2d_forward(out, in, w, b, work, B, C, H, W, OC, K, S, P);
    void *data[4] = {input(0, in, (size_t)B * C * H * W, p, round), input(1, w, (size_t)OC * C * K * K, p, round), out,
                     (void *)b};
    dt_dnnl_run(e, data);
}

void dt_dnnl_conv_backward(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                           const float *w, float *work, int B, int C, int H, int W, int OC, int K, int S, int P) {
    conv_shape s = shape_of(B, C, H, W, OC, K, S, P, false);  /* backward primitives have no bias */
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
