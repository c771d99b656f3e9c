/* The bf16 blocked values (dt_layout DT_LAYOUT_BLOCKED_BF16, kept by the graph between bf16
 * convs and max pools at bf16): max pooling of bf16 values against the f32 pool of the same
 * values (bitwise: the same comparisons pick the same maxima; din is the f32 gradient rounded to
 * bf16, bitwise where windows tile the input); the oneDNN bf16 table's convolutions with bf16
 * inputs / outputs against the blas bf16 kernels on the same values (an output rounded to bf16:
 * within half a bf16 step of the largest value, 2^-9 < 4e-3; the f32 gradients within 2e-5, the
 * f32 sums' order), including the widened fallback where a conv cannot take bf16 (fp16 table,
 * fewer than 16 input channels); the fused conv -> pool's bf16 store (its f32 values rounded,
 * bitwise); the graph's bf16 plan; the NHWC chain (where oneDNN's bf16 convs want it) against the
 * blocked one. */
#include "backend/backend.h"
#include "backend/blocked.h"
#include "core/test.h"
#include "dtrain/core.h"
#include "dtrain/nn.h"
#include "nn/graph_internal.h"
#include "backend/blocked_testlib.h"

#include <string.h>

/* The n values of x rounded to bf16: as f32 values (rounded), as bf16 ones (bf16_of: uint16_t
 * in a float buffer, as the graph keeps them). */
static float *rounded(const float *x, size_t n) {
    float *r = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) r[i] = dt_bf16_to_f32(dt_f32_to_bf16(x[i]));
    return r;
}

static float *bf16_of(const float *x, size_t n) {
    float *h = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) ((uint16_t *)h)[i] = dt_f32_to_bf16(x[i]);
    return h;
}

static float *widen(const float *h, size_t n) {
    float *y = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) y[i] = dt_bf16_to_f32(((const uint16_t *)h)[i]);
    return y;
}

/* max |a - b| / max |b| (0 when b is all zero) */
static double rel_diff(const float *a, const float *b, size_t n) {
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(b[i])), d = fmax(d, fabs(a[i] - b[i]));
    return m > 0 ? d / m : d;
}

/* One pooling case: the bf16 entries against the f32 blocked ones on the same (rounded) values. */
static void pool_case(int B, int C, int H, int W, int K, int S, bool nhwc) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1, HW = H * W, OHW = OH * OW;
    const size_t nin = (size_t)B * C * HW, nout = (size_t)B * C * OHW;
    const bool tiles = K == S && OH * S == H && OW * S == W;
    float *x = rnd(nin, (uint64_t)(H * 100 + K * 10 + S) + 5);
    for (size_t i = 0; i < nin; i += 5) x[i] = x[i + 1 < nin ? i + 1 : i]; /* ties */
    x[2] = NAN, x[nin / 3] = NAN;
    float *xb = blocked_of(x, B, C, HW, nhwc), *xr = rounded(xb, nin), *xh = bf16_of(xb, nin);
    float *y = malloc(nout * 4), *yh = malloc(nout * 4), *dy = rnd(nout, 78);
    float *dx = malloc(nin * 4), *dxh = malloc(nin * 4);
    int32_t *am = malloc(nout * 4), *amh = malloc(nout * 4);
    for (int v = 0; v < 4; v++) {
        const bool out_bl = v & 1, relu = v >> 1;
        dt_maxpool2d_forward_blocked(y, am, xr, B, C, H, W, K, S, out_bl, nhwc, relu);
        dt_maxpool2d_forward_blocked_bf16(yh, amh, (const uint16_t *)xh, B, C, H, W, K, S, out_bl, nhwc, relu, false);
        CHECK_MSG(!memcmp(y, yh, nout * 4) && !memcmp(am, amh, nout * 4),
                  "bf16 maxpool %dx%d K%d S%d out_bl %d nhwc %d relu %d: values differ", H, W, K, S, out_bl, nhwc,
                  relu);
        if (!out_bl) { /* bf16 values out: the same values, exactly, and the same argmax */
            uint16_t *y16 = malloc(nout * 2);
            memset(amh, 0, nout * 4);
            dt_maxpool2d_forward_blocked_bf16(y16, amh, (const uint16_t *)xh, B, C, H, W, K, S, false, nhwc, relu,
                                              true);
            size_t bad = 0;
            for (size_t i = 0; i < nout; i++) {
                uint32_t u;
                memcpy(&u, &y[i], 4);
                bad += ((uint32_t)y16[i] << 16) != u;
            }
            CHECK_MSG(bad == 0 && !memcmp(am, amh, nout * 4),
                      "bf16 maxpool %dx%d K%d S%d nhwc %d relu %d, bf16 out: %zu values differ", H, W, K, S, nhwc, relu,
                      bad);
            free(y16);
        }
        dt_maxpool2d_backward_blocked(dx, dy, am, B, C, H, W, K, S, out_bl, nhwc);
        float *work = malloc(dt_maxpool2d_blocked_bf16_workspace(B, C, H, W, K, S, true) * 4 + 4);
        dt_maxpool2d_backward_blocked_bf16((uint16_t *)dxh, dy, amh, B, C, H, W, K, S, out_bl, nhwc, false, work);
        size_t bad = 0;
        for (size_t i = 0; i < nin; i++) bad += ((uint16_t *)dxh)[i] != dt_f32_to_bf16(dx[i]);
        CHECK_MSG(bad == 0 || !tiles, "bf16 maxpool %dx%d K%d S%d out_bl %d: %zu din values differ", H, W, K, S, out_bl,
                  bad);
        if (!out_bl) { /* a bf16 dout (NCHW): the f32 backward of the rounded dout, rounded; exact where tiling */
            uint16_t *dy16 = malloc(nout * 2), *dxb = malloc(nin * 2);
            float *dyr = malloc(nout * 4), *dxr = malloc(nin * 4);
            dt_cast_bf16(dy16, dy, nout), dt_widen_bf16(dyr, dy16, nout);
            dt_maxpool2d_backward_blocked(dxr, dyr, am, B, C, H, W, K, S, false, nhwc);
            dt_maxpool2d_backward_blocked_bf16(dxb, dy16, amh, B, C, H, W, K, S, false, nhwc, true, work);
            size_t off = 0, exact = 0;
            for (size_t i = 0; i < nin; i++) {
                off += dxb[i] != dt_f32_to_bf16(dxr[i]);
                exact += dxb[i] != ((uint16_t *)dxh)[i];
            }
            CHECK_MSG(off == 0 && (exact == 0 || !tiles),
                      "bf16 maxpool %dx%d K%d S%d nhwc %d, bf16 dout: %zu din values differ from the rounded dout's, "
                      "%zu from the f32 dout's",
                      H, W, K, S, nhwc, off, exact);
            free(dy16), free(dxb), free(dyr), free(dxr);
        } else { /* a blocked bf16 dout: as the f32 one it widens to, bitwise */
            uint16_t *dy16 = malloc(nout * 2), *dxb = malloc(nin * 2), *dxr = malloc(nin * 2);
            float *dyr = malloc(nout * 4);
            dt_cast_bf16(dy16, dy, nout), dt_widen_bf16(dyr, dy16, nout);
            dt_maxpool2d_backward_blocked_bf16(dxr, dyr, amh, B, C, H, W, K, S, true, nhwc, false, work);
            dt_maxpool2d_backward_blocked_bf16(dxb, dy16, amh, B, C, H, W, K, S, true, nhwc, true, work);
            CHECK_MSG(!memcmp(dxb, dxr, nin * 2),
                      "bf16 maxpool %dx%d K%d S%d nhwc %d, blocked bf16 dout: din differs "
                      "from the widened dout's",
                      H, W, K, S, nhwc);
            free(dy16), free(dxb), free(dxr), free(dyr);
        }
        free(work);
        float *dxw = widen(dxh, nin);
        CHECK_MSG(rel_diff(dxw, dx, nin) < 4e-3, "bf16 maxpool %dx%d K%d S%d: din differs by %g", H, W, K, S,
                  rel_diff(dxw, dx, nin));
        free(dxw);
    }
    free(x), free(xb), free(xr), free(xh), free(y), free(yh), free(dy), free(dx), free(dxh), free(am), free(amh);
}

static void test_pool(void) {
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        pool_case(2, 32, 14, 14, 2, 2, nhwc); /* the CNN's second pool (tail of 1 in a 49-position plane) */
        pool_case(1, 16, 7, 9, 2, 2, nhwc);   /* odd sizes: a row and a column outside every window */
        pool_case(2, 16, 9, 9, 3, 2, nhwc);   /* overlapping windows: din sums */
        pool_case(1, 16, 4, 141, 2, 2, nhwc); /* long output rows */
        pool_case(1, 16, 40, 38, 2, 2, nhwc); /* more output positions than a 256-position chunk */
    }
}

static const char *lname(dt_layout l) {
    static const char *const names[5] = {"nchw", "blocked", "bf16", "nhwc", "nhwc bf16"};
    return names[l];
}

/* One convolution through be's blocked entries with layouts in_l / out_l (one of them bf16)
 * against the NCHW kernels at be's precision (f32 where C < 16, as cpu_onednn_conv.c runs those)
 * on the same values. */
static void conv_case(const dt_kernel_table *be, int B, int C, int H, int W, int OC, int K, int S, int P,
                      dt_layout in_l, dt_layout out_l, bool with_din) {
    const dt_kernel_table *ref = be->precision == DT_F32 || C < 16 ? dt_backend_cpu()
                                                                   : dt_backend_blas_lowp(be->precision);
    const int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1, HW = H * W, OHW = OH * OW;
    const size_t nin = (size_t)B * C * HW, nout = (size_t)B * OC * OHW, nw = (size_t)OC * C * K * K;
    float *x0 = rnd(nin, 31), *w = rnd(nw, 32), *b = rnd(OC, 33), *dy0 = rnd(nout, 34);
    float *xr = rounded(x0, nin), *dyr = rounded(dy0, nout); /* the values both sides see */
    /* the reference, NCHW */
    float *y = malloc(nout * 4), *dx = malloc(nin * 4), *dw = calloc(nw, 4), *db = calloc(OC, 4);
    float *work = malloc(ref->conv2d_workspace(B, C, H, W, OC, K, S, P) * 4 + 4);
    ref->conv2d_forward(y, xr, w, b, work, B, C, H, W, OC, K, S, P);
    ref->conv2d_backward(with_din ? dx : NULL, dw, db, dyr, xr, w, work, B, C, H, W, OC, K, S, P);
    /* be's inputs in their layouts */
    const bool in_nhwc = dt_layout_nhwc(in_l), out_nhwc = dt_layout_nhwc(out_l);
    float *xbl = in_l != DT_LAYOUT_NCHW ? blocked_of(xr, B, C, HW, in_nhwc) : NULL; /* blocked: C a multiple of 16 */
    float *dybl = out_l != DT_LAYOUT_NCHW ? blocked_of(dyr, B, OC, OHW, out_nhwc) : NULL;
    float *xh = dt_layout_bf16(in_l) ? bf16_of(xbl, nin) : NULL;
    float *dyh = dt_layout_bf16(out_l) ? bf16_of(dybl, nout) : NULL;
    float *xi = in_l == DT_LAYOUT_NCHW ? xr : xh ? xh : xbl, *dyi = out_l == DT_LAYOUT_NCHW ? dyr : dyh ? dyh : dybl;
    float *yb = malloc(nout * 4), *dxb = malloc(nin * 4), *dwb = calloc(nw, 4), *dbb = calloc(OC, 4);
    be->conv2d_forward_blocked(yb, xi, w, b, B, C, H, W, OC, K, S, P, in_l, out_l);
    be->conv2d_backward_blocked(with_din ? dxb : NULL, dwb, dbb, dyi, xi, w, B, C, H, W, OC, K, S, P, in_l, out_l);
    float *yw = dt_layout_bf16(out_l) ? widen(yb, nout) : NULL;
    float *yn = out_l == DT_LAYOUT_NCHW ? yb : nchw_of(yw ? yw : yb, B, OC, OHW, out_nhwc);
    float *dxn = in_l == DT_LAYOUT_NCHW ? dxb : nchw_of(dxb, B, C, HW, in_nhwc); /* din is f32 */
    const double ty = dt_layout_bf16(out_l) ? 4e-3 : 2e-5;
    CHECK_MSG(rel_diff(yn, y, nout) < ty, "%s conv C%d OC%d %dx%d K%d in %s out %s: out %g",
              dt_dtype_name(be->precision), C, OC, H, W, K, lname(in_l), lname(out_l), rel_diff(yn, y, nout));
    if (with_din)
        CHECK_MSG(rel_diff(dxn, dx, nin) < 2e-5, "conv C%d in %s out %s: din %g", C, lname(in_l), lname(out_l),
                  rel_diff(dxn, dx, nin));
    CHECK_MSG(rel_diff(dwb, dw, nw) < 2e-5, "conv C%d in %s out %s: dw %g", C, lname(in_l), lname(out_l),
              rel_diff(dwb, dw, nw));
    CHECK_MSG(rel_diff(dbb, db, OC) < 2e-5, "conv C%d in %s out %s: db %g", C, lname(in_l), lname(out_l),
              rel_diff(dbb, db, OC));
    if (yn != yb) free(yn);
    if (dxn != dxb) free(dxn);
    free(yw), free(x0), free(w), free(b), free(dy0), free(xr), free(xh), free(dyr), free(dyh), free(y), free(dx),
        free(dw);
    free(db), free(work), free(xbl), free(dybl), free(yb), free(dxb), free(dwb), free(dbb);
}

static void test_conv(void) {
    const dt_kernel_table *be = NULL;
    if (dt_backend_find("onednn", DT_BF16, &be) != DT_OK) {
        printf("built without oneDNN: no bf16 blocked values to test\n");
        return;
    }
    /* native bf16: convs over >= 16 channels take bf16 values; emulated (no AVX512-BF16), none do,
     * and the cases below run the widened fallback around f32 kernels on rounded inputs */
    CHECK(be->conv2d_bf16_values && be->conv2d_bf16_values(16) == dt_onednn_bf16_native() &&
          !be->conv2d_bf16_values(1));
    const dt_layout N = DT_LAYOUT_NCHW, L = DT_LAYOUT_BLOCKED, H = DT_LAYOUT_BLOCKED_BF16;
    const dt_layout NL = DT_LAYOUT_NHWC, NH = DT_LAYOUT_NHWC_BF16;
    for (int d = 0; d < 2; d++) {
        conv_case(be, 3, 32, 14, 14, 64, 3, 1, 1, H, H, d); /* the CNN's second conv */
        conv_case(be, 2, 16, 7, 6, 32, 3, 1, 1, H, L, d);
        conv_case(be, 2, 16, 7, 6, 32, 3, 1, 1, L, H, d);
        conv_case(be, 2, 32, 6, 6, 16, 3, 2, 1, H, N, d); /* the chain's end: NCHW out */
        conv_case(be, 1, 16, 5, 5, 16, 1, 1, 0, N, H, d);
        conv_case(be, 2, 1, 9, 9, 16, 3, 1, 1, N, H, d); /* C < 16 runs at f32: widened around it */
        /* NHWC (where oneDNN's bf16 convs want it, m->nhwc) */
        conv_case(be, 3, 32, 14, 14, 64, 3, 1, 1, NH, NH, d);
        conv_case(be, 2, 16, 7, 6, 32, 3, 1, 1, NH, NL, d);
        conv_case(be, 2, 16, 7, 6, 32, 3, 1, 1, NL, NH, d);
        conv_case(be, 2, 32, 6, 6, 16, 3, 2, 1, NH, N, d);
        conv_case(be, 2, 1, 9, 9, 16, 3, 1, 1, N, NH, d);
        /* backward data as a forward conv on flipped weights, padding K-1-P (stride 1) */
        conv_case(be, 2, 16, 8, 7, 32, 3, 1, 0, NH, NH, d);
        conv_case(be, 2, 32, 9, 9, 16, 5, 1, 1, NH, NH, d);
        conv_case(be, 1, 16, 6, 6, 32, 1, 1, 0, NH, NL, d);
    }
    CHECK_OK(dt_backend_find("onednn", DT_F16, &be)); /* no bf16 kernels: widened around fp16 */
    conv_case(be, 2, 16, 7, 6, 32, 3, 1, 1, H, H, true);
    conv_case(be, 2, 16, 7, 6, 32, 3, 1, 1, L, H, false);
    conv_case(be, 2, 16, 7, 6, 32, 3, 1, 1, NH, NH, true);
}

/* The fused conv -> relu -> pool storing bf16: its f32 values rounded, the same window bytes;
 * with relu 2 the conv passes its input through (the centre tap 1, no bias) and the inputs lie
 * halfway between bf16 values, where rounding to nearest even decides. Blocked and NHWC. */
static void test_conv_pool(void) {
    for (int relu = 0; relu < 6; relu++) {
        const dt_conv_pool_shape s = {2, 1, 12, 12, 32, 3, 1, 2, relu % 3 > 0, true, relu >= 3, false};
        dt_conv_pool_shape sh = s;
        sh.out_bf16 = true;
        const size_t nx = (size_t)s.B * s.C * s.H * s.W, nw = (size_t)s.OC * s.C * 9, no = (size_t)s.B * s.OC * 6 * 6;
        float *x = rnd(nx, 41), *w = rnd(nw, 42), *b = rnd(s.OC, 43), *y = malloc(no * 4), *yh = malloc(no * 4);
        uint8_t *win = malloc(no), *winh = malloc(no);
        x[5] = NAN; /* a NaN window: rounded to a quiet NaN */
        if (relu % 3 == 2) {
            memset(w, 0, nw * sizeof *w), memset(b, 0, (size_t)s.OC * sizeof *b);
            for (int o = 0; o < s.OC; o++) w[o * 9 + 4] = 1;
            for (size_t i = 0; i < nx; i++) x[i] = 1.0f + (float)(i % 5) / 128 + 1.0f / 256; /* ties */
        }
        void *ws = aligned_alloc(64, dt_conv_pool_workspace(&s)); /* the same size for both */
        dt_conv_pool_forward(&s, y, win, x, w, b, ws);
        dt_conv_pool_forward(&sh, yh, winh, x, w, b, ws);
        free(ws);
        size_t bad = 0;
        for (size_t i = 0; i < no; i++) bad += ((uint16_t *)yh)[i] != dt_f32_to_bf16(y[i]);
        CHECK_MSG(bad == 0 && !memcmp(win, winh, no), "conv_pool bf16 relu %d: %zu values differ", relu, bad);
        free(x), free(w), free(b), free(y), free(yh), free(win), free(winh);
    }
}

/* The bf16 flags the graph plans for spec on the current kernels, or replanned with table t;
 * linears: with the plans of bf16 linears' inputs too (else the conv chain's plan alone: the
 * relu between the linears is graph_bf16_test's). */
static void plan_with(const char *spec, bool *bf, bool *gbf, int *n, const dt_kernel_table *t, bool linears) {
    dt_model *m = NULL;
    CHECK_OK(dt_model_create_from_spec(&m, spec, 1, 28, 28));
    *n = m ? m->n : 0;
    dt_kernel_table c;
    if (m)
        c = t ? *t : *m->be, c.linear_bf16_values = linears ? c.linear_bf16_values : NULL, m->be = &c,
        dt_graph_plan_bf16(m);
    for (int i = 0; i < *n; i++) bf[i] = m->nodes[i].bf16, gbf[i] = m->nodes[i].grad_bf16;
    dt_model_destroy(m);
}

static void plan_of(const char *spec, bool *bf, bool *gbf, int *n, const dt_kernel_table *t) {
    plan_with(spec, bf, gbf, n, t, false);
}

static bool sixteen_or_more(int C) { return C >= 16; }

/* The plan where convs over >= 16 channels take bf16 values (t NULL: the real native table). */
static void check_native_plan(const dt_kernel_table *t) {
    bool bf[32], gbf[32];
    int n;
    plan_of("cnn", bf, gbf, &n, t);
    /* input, conv (fused), relu, maxpool (fused: values bf16), conv (values and gradient bf16),
     * relu, maxpool (NCHW out), flatten, linear ... */
    CHECK(n > 8 && bf[3] && !gbf[3] && bf[4] && gbf[4]);
    for (int i = 0; i < n; i++) CHECK(i == 3 || i == 4 || (!bf[i] && !gbf[i]));
    plan_of("conv(16,3) relu conv(16,3) maxpool(2) conv(16,3) maxpool(2) conv(16,3) flatten linear(10)", bf, gbf, &n,
            t);
    CHECK(!bf[1]);            /* over 1 channel (f32), read by an unfused relu */
    CHECK(bf[3] && gbf[3]);   /* over 16, read by a maxpool only */
    CHECK(!bf[4] && !gbf[4]); /* an unfused maxpool writes f32 */
    CHECK(bf[5] && gbf[5]);
    CHECK(!bf[6] && !bf[7]); /* likewise; a flatten reads the last conv */
    plan_of("conv(16,3) relu maxpool(2) maxpool(2) conv(16,3) relu maxpool(2) flatten linear(10)", bf, gbf, &n, t);
    CHECK(!bf[3]); /* a fused pool read by a maxpool, not a conv */
    CHECK(!bf[4] && bf[5] && gbf[5]);
    const dt_kernel_table *tb = t ? t : dt_backend_default();
    if (!tb->linear_bf16_values || !tb->linear_bf16_values() || !tb->linear_forward_bf16) return;
    /* with bf16 linears: the chain's last pool (NCHW out) of bf16 values, read by flatten ->
     * linear only, stores them bf16 (exact); the relu between the linears too. Its windows tile
     * its input, so the linear writes its gradient bf16 too (exact as well). */
    const bool din16 = tb->linear_backward_bf16_din != NULL;
    plan_with("cnn", bf, gbf, &n, t, true);
    CHECK(n > 9 && bf[3] && bf[4] && bf[6] && gbf[6] == din16 && bf[9]);
    for (int i = 0; i < n; i++) CHECK(i == 3 || i == 4 || i == 6 || i == 9 || (!bf[i] && !gbf[i]));
    plan_with("conv(16,3) conv(16,4) relu maxpool(2) flatten linear(10)", bf, gbf, &n, t, true);
    CHECK(n > 6 && bf[4] && !gbf[4]); /* 23 x 23 into 2 x 2 windows: not tiling, its gradient f32 */
    plan_with("conv(16,3) conv(16,3) relu maxpool(2) maxpool(2) flatten linear(10)", bf, gbf, &n, t, true);
    CHECK(!bf[4] && !bf[5]); /* a pool read by a pool, and one of f32 values, stay f32 */
}

static void test_plan(void) {
    bool bf[32], gbf[32];
    int n;
    const dt_kernel_table *be = NULL;
    if (dt_kernels_select("onednn", "bf16") == DT_OK && dt_backend_find("onednn", DT_BF16, &be) == DT_OK) {
        if (dt_onednn_bf16_native()) check_native_plan(NULL);
        else { /* no native bf16 convs: every value stays f32 */ plan_of("cnn", bf, gbf, &n, NULL);
            for (int i = 0; i < n; i++) CHECK(!bf[i] && !gbf[i]);
        }
        dt_kernel_table t = *be; /* the plan itself, on any CPU: a table whose convs take bf16 values */
        t.conv2d_bf16_values = sixteen_or_more;
        check_native_plan(&t);
        CHECK_OK(dt_kernels_select("onednn", "fp32"));
        plan_of("cnn", bf, gbf, &n, NULL);
        for (int i = 0; i < n; i++) CHECK(!bf[i] && !gbf[i]);
    }
    CHECK_OK(dt_kernels_select("blas", "bf16"));
    plan_of("cnn", bf, gbf, &n, NULL);
    for (int i = 0; i < n; i++) CHECK(!bf[i] && !gbf[i]);
    CHECK_OK(dt_kernels_select("blas", "fp32"));
}

static bool yes(void) { return true; }
static bool no(void) { return false; }

/* The CNN at bf16 with its chain in NHWC (t's conv2d_bf16_nhwc: yes) or blocked (no), replanned. */
static dt_model *cnn_with(const dt_kernel_table *t) {
    dt_model *m = NULL;
    CHECK_OK(dt_model_create_from_spec(&m, "cnn", 1, 28, 28));
    if (!m) return NULL;
    dt_model_init(m, 3);
    m->be = t;
    dt_graph_plan_layouts(m, m->dev);
    dt_graph_fuse_conv_pool(m);
    dt_graph_plan_bf16(m);
    return m;
}

/* The NHWC chain against the blocked one: the same plan otherwise, and 3 steps of training
 * (plain SGD) with the same losses and gradients: within 1e-6 where the CPU has native bf16
 * convs (the same products, summed in f32 by other kernels: the NHWC chain's backward data runs
 * as a forward conv, cpu_onednn_conv.c; measured 4e-8), within 1e-4 where they are emulated (f32
 * kernels on rounded values, whose order of sums may differ by layout). */
static void test_nhwc_chain(void) {
    const dt_kernel_table *be = NULL;
    if (dt_kernels_select("onednn", "bf16") != DT_OK || dt_backend_find("onednn", DT_BF16, &be) != DT_OK) return;
    CHECK(be->conv2d_bf16_nhwc && (!be->conv2d_bf16_nhwc() || dt_onednn_bf16_native()));
    printf("oneDNN's bf16 convs want NHWC here: %s\n", be->conv2d_bf16_nhwc() ? "yes" : "no");
    dt_kernel_table on = *be, off = *be;
    on.conv2d_bf16_nhwc = yes, off.conv2d_bf16_nhwc = no;
    dt_model *a = cnn_with(&on), *b = cnn_with(&off), *d = NULL;
    CHECK_OK(dt_model_create_from_spec(&d, "cnn", 1, 28, 28)); /* the default plan */
    if (a && b && d) {
        CHECK(a->nhwc && !b->nhwc && d->nhwc == be->conv2d_bf16_nhwc());
        for (int i = 0; i < a->n; i++)
            CHECK_MSG(a->nodes[i].blocked == b->nodes[i].blocked && a->nodes[i].bf16 == b->nodes[i].bf16 &&
                          a->nodes[i].grad_bf16 == b->nodes[i].grad_bf16,
                      "cnn node %s: the NHWC plan differs from the blocked one", a->nodes[i].name);
        enum { B = 6 };
        float *x = rnd((size_t)B * 784, 51);
        int32_t y[B] = {1, 7, 3, 0, 9, 4};
        const dt_feed f = {.x = x, .y = y, .n = B};
        const size_t np = dt_model_num_params(a);
        const double tol = dt_onednn_bf16_native() ? 1e-6 : 1e-4;
        for (int step = 0; step < 3; step++) {
            float la = 0, lb = 0;
            dt_model_zero_grad(a), dt_model_zero_grad(b);
            CHECK_OK(dt_model_run(a, &f, true, 0, &la));
            CHECK_OK(dt_model_run(b, &f, true, 0, &lb));
            CHECK_OK(dt_model_backward_loss(a, 1.0f, NULL, NULL));
            CHECK_OK(dt_model_backward_loss(b, 1.0f, NULL, NULL));
            const float *ga = dt_model_grads(a), *gb = dt_model_grads(b);
            const double dg = rel_diff(ga, gb, np);
            CHECK_MSG(fabs(la - lb) <= tol * fabs(lb) && dg <= tol,
                      "cnn step %d: loss %.9g NHWC, %.9g blocked; gradients differ by %g", step, la, lb, dg);
            float *pa = dt_model_params(a), *pb = dt_model_params(b);
            for (size_t i = 0; i < np; i++) pa[i] -= 0.05f * ga[i], pb[i] -= 0.05f * gb[i];
        }
        free(x);
    }
    dt_model_destroy(a), dt_model_destroy(b), dt_model_destroy(d);
    CHECK_OK(dt_kernels_select("blas", "fp32"));
}

int main(void) {
    test_pool();
    test_conv();
    test_conv_pool();
    test_plan();
    test_nhwc_chain();
    return dt_test_summary("blocked_bf16_test");
}
