/* The blocked-layout (nChw16c; nChw8c without AVX-512) kernels against the NCHW ones: max
 * pooling (the cpu table's *_blocked entries: tiling and overlapping windows, odd sizes, ties and NaNs; blocked and
 * NCHW outputs), and the oneDNN f32 table's blocked convolutions (every in/out layout pair, with and without din, bias)
 * against the cpu kernels; the reorders round-trip; the graph's layout plan (which values of a model are blocked), and
 * models with chains on the oneDNN kernels against the same models on the blas ones (ref_test also runs the reference
 * CNN against torch). Pooling must match bitwise (the same comparisons choose the same maxima); convolutions within
 * 2e-5 of the largest value (f32 sums in another order). */
#include "backend/backend.h"
#include "backend/blocked.h"
#include "core/test.h"
#include "dtrain/core.h"
#include "dtrain/nn.h"
#include "nn/graph_internal.h"
#include "backend/blocked_testlib.h"

#include <string.h>

static void test_reorders(void) {
    const int B = 2, C = 32, HW = 5;
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        float *x = rnd((size_t)B * C * HW, 1), *b = blocked_of(x, B, C, HW, nhwc), *y = nchw_of(b, B, C, HW, nhwc);
        CHECK(!memcmp(x, y, (size_t)B * C * HW * sizeof *x));
        CHECK(b[1] == x[HW]);                                                    /* channel 1 of position 0 */
        if (nhwc) CHECK(b[C] == x[1] && b[C * HW] == x[C * HW]);                 /* position 1; sample 1 */
        else CHECK(b[DT_BLOCK * HW] == x[DT_BLOCK * HW] && b[DT_BLOCK] == x[1]); /* block 1; position 1 */
        float acc[32] = {0}, want[32] = {0};
        dt_blocked_channel_sums(acc, b, B, C, HW, nhwc);
        for (int n = 0; n < B; n++)
            for (int c = 0; c < C; c++)
                for (int p = 0; p < HW; p++) want[c] += x[((size_t)n * C + c) * HW + p];
        CHECK(dt_test_maxdiff(acc, want, 32) < 1e-5);
        free(x), free(b), free(y);
    }
}

/* One pooling case: blocked (or NHWC) forward, with outputs in that layout and NCHW, and
 * backward equal the NCHW ones; with relu, the NCHW ones followed by relu's kernels (forward on
 * the pooled values, backward on their gradient). */
static void pool_case(int B, int C, int H, int W, int K, int S, bool nhwc, bool relu) {
    const dt_kernel_table *be = dt_backend_cpu();
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1, HW = H * W, OHW = OH * OW;
    const size_t nin = (size_t)B * C * HW, nout = (size_t)B * C * OHW;
    float *x = rnd(nin, (uint64_t)(H * 100 + K * 10 + S));
    for (size_t i = 0; i < nin; i += 7) x[i] = x[i + 1 < nin ? i + 1 : i]; /* ties */
    x[3] = NAN, x[nin / 2] = NAN;
    float *y = malloc(nout * sizeof *y), *dy = rnd(nout, 77), *dx = malloc(nin * sizeof *dx);
    int32_t *am = malloc(nout * sizeof *am), *amb = malloc(nout * sizeof *amb);
    be->maxpool2d_forward(y, am, x, B, C, H, W, K, S);
    if (relu) {
        be->relu_forward(y, y, nout);
        be->relu_backward(dy, dy, y, nout); /* dy: the gradient the pool's backward then gets */
    }
    be->maxpool2d_backward(dx, dy, am, B, C, H, W, K, S);
    float *xb = blocked_of(x, B, C, HW, nhwc), *yb = malloc(nout * sizeof *yb), *dxb = malloc(nin * sizeof *dxb);
    for (int out_bl = 0; out_bl < 2; out_bl++) {
        be->maxpool2d_forward_blocked(yb, amb, xb, B, C, H, W, K, S, out_bl, nhwc, relu);
        float *yn = out_bl ? nchw_of(yb, B, C, OHW, nhwc) : yb;
        CHECK_MSG(!memcmp(yn, y, nout * sizeof *y), "maxpool %dx%d K%d S%d out_bl %d nhwc %d relu %d: values differ", H,
                  W, K, S, out_bl, nhwc, relu);
        /* the gradient as the graph has it: with relu, not yet zeroed where relu stops it */
        float *dyg = rnd(nout, 77), *dyb = out_bl ? blocked_of(dyg, B, C, OHW, nhwc) : dyg;
        be->maxpool2d_backward_blocked(dxb, dyb, amb, B, C, H, W, K, S, out_bl, nhwc);
        float *dxn = nchw_of(dxb, B, C, HW, nhwc);
        CHECK_MSG(dt_test_maxdiff(dxn, dx, nin) <= 1e-6,
                  "maxpool %dx%d K%d S%d out_bl %d nhwc %d relu %d: din differs by %g", H, W, K, S, out_bl, nhwc, relu,
                  dt_test_maxdiff(dxn, dx, nin));
        if (out_bl) free(yn), free(dyb);
        free(dxn), free(dyg);
    }
    free(x), free(y), free(dy), free(dx), free(am), free(amb), free(xb), free(yb), free(dxb);
}

static void test_pool(void) {
    for (int nhwc = 0; nhwc < 2; nhwc++)
        for (int relu = 0; relu < 2; relu++) {
            pool_case(2, 16, 8, 8, 2, 2, nhwc, relu); /* windows tile the input */
            pool_case(1, 32, 7, 9, 2, 2, nhwc, relu); /* odd sizes: a row and a column outside every window */
            pool_case(2, 16, 9, 9, 3, 2, nhwc, relu); /* overlapping windows: din sums */
            pool_case(1, 16, 6, 6, 3, 3, nhwc, relu);
            pool_case(1, 16, 5, 5, 1, 1, nhwc, relu);
            pool_case(1, 16, 4, 141, 2, 2, nhwc, relu); /* long output rows */
            pool_case(2, 16, 40, 38, 2, 2, nhwc, relu); /* more output positions than a 256-position chunk */
            pool_case(2, 48, 6, 6, 2, 2, nhwc, relu);   /* three channel blocks per position */
            pool_case(1, 32, 40, 38, 2, 2, nhwc, relu); /* two blocks, two chunks */
        }
}

/* max |a - b| / max |b| (0 when b is all zero) */
static double rel_diff(const float *a, const float *b, size_t n) {
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(b[i])), d = fmax(d, fabs(a[i] - b[i]));
    return m > 0 ? d / m : d;
}

/* The NCHW kernels a blocked convolution of be over C input channels must agree with: the cpu
 * kernels at f32; at bf16/fp16 the blas kernels at that precision (inputs rounded, f32 sums:
 * the same products as oneDNN's), or f32 where C < 16 (cpu_onednn_conv.c runs those at f32). */
static const dt_kernel_table *conv_reference(const dt_kernel_table *be, int C) {
    return be->precision == DT_F32 || C < 16 ? dt_backend_cpu() : dt_backend_blas_lowp(be->precision);
}

/* One convolution case through be's blocked entries against the NCHW reference kernels. */
static void conv_case(const dt_kernel_table *be, int B, int C, int H, int W, int OC, int K, int S, int P,
                      dt_layout in_l, dt_layout out_l, bool with_din) {
    const bool in_bl = in_l != DT_LAYOUT_NCHW, out_bl = out_l != DT_LAYOUT_NCHW;
    const bool in_nhwc = dt_layout_nhwc(in_l), out_nhwc = dt_layout_nhwc(out_l);
    const dt_kernel_table *cpu = conv_reference(be, C);
    const int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1, HW = H * W, OHW = OH * OW;
    const size_t nin = (size_t)B * C * HW, nout = (size_t)B * OC * OHW, nw = (size_t)OC * C * K * K;
    float *x = rnd(nin, 11), *w = rnd(nw, 12), *b = rnd(OC, 13), *dy = rnd(nout, 14);
    float *y = malloc(nout * 4), *dx = malloc(nin * 4), *dw = calloc(nw, 4), *db = calloc(OC, 4);
    float *work = malloc(cpu->conv2d_workspace(B, C, H, W, OC, K, S, P) * 4 + 4);
    cpu->conv2d_forward(y, x, w, b, work, B, C, H, W, OC, K, S, P);
    cpu->conv2d_backward(with_din ? dx : NULL, dw, db, dy, x, w, work, B, C, H, W, OC, K, S, P);
    float *xi = in_bl ? blocked_of(x, B, C, HW, in_nhwc) : x, *dyi = out_bl ? blocked_of(dy, B, OC, OHW, out_nhwc) : dy;
    float *yb = malloc(nout * 4), *dxb = malloc(nin * 4), *dwb = calloc(nw, 4), *dbb = calloc(OC, 4);
    be->conv2d_forward_blocked(yb, xi, w, b, B, C, H, W, OC, K, S, P, in_l, out_l);
    be->conv2d_backward_blocked(with_din ? dxb : NULL, dwb, dbb, dyi, xi, w, B, C, H, W, OC, K, S, P, in_l, out_l);
    float *yn = out_bl ? nchw_of(yb, B, OC, OHW, out_nhwc) : yb, *dxn = in_bl ? nchw_of(dxb, B, C, HW, in_nhwc) : dxb;
    const char *l[4] = {"nchw", "blocked", "", "nhwc"};
    CHECK_MSG(rel_diff(yn, y, nout) < 2e-5, "conv C%d OC%d %dx%d K%d S%d P%d in %s out %s: out %g", C, OC, H, W, K, S,
              P, l[in_l], l[out_l], rel_diff(yn, y, nout));
    if (with_din)
        CHECK_MSG(rel_diff(dxn, dx, nin) < 2e-5, "conv C%d OC%d in %s out %s: din %g", C, OC, l[in_l], l[out_l],
                  rel_diff(dxn, dx, nin));
    CHECK_MSG(rel_diff(dwb, dw, nw) < 2e-5, "conv C%d OC%d in %s out %s: dw %g", C, OC, l[in_l], l[out_l],
              rel_diff(dwb, dw, nw));
    CHECK_MSG(rel_diff(dbb, db, OC) < 2e-5, "conv C%d OC%d in %s out %s: db %g", C, OC, l[in_l], l[out_l],
              rel_diff(dbb, db, OC));
    if (in_bl) free(xi), free(dxn);
    if (out_bl) free(dyi), free(yn);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(work);
    free(yb), free(dxb), free(dwb), free(dbb);
}

static void test_conv(void) {
    const dt_kernel_table *be = NULL;
    if (dt_backend_find("onednn", DT_F32, &be) != DT_OK) {
        printf("built without oneDNN: no blocked convolutions to test\n");
        CHECK(dt_backend_cpu()->conv2d_forward_blocked == NULL);
        return;
    }
    CHECK(be->conv2d_forward_blocked && be->conv2d_backward_blocked);
    for (int p = 0; p < 3; p++) { /* f32, then bf16 and fp16: f32 blocked values, converted inside */
        const dt_dtype prec[3] = {DT_F32, DT_BF16, DT_F16};
        CHECK_OK(dt_backend_find("onednn", prec[p], &be));
        CHECK(be->conv2d_forward_blocked && be->conv2d_backward_blocked);
        const dt_layout N = DT_LAYOUT_NCHW, L = DT_LAYOUT_BLOCKED, H = DT_LAYOUT_NHWC;
        for (int d = 0; d < 2; d++) {
            conv_case(be, 2, 16, 7, 6, 32, 3, 1, 1, L, L, d);
            conv_case(be, 2, 32, 6, 6, 16, 3, 2, 1, L, N, d); /* the chain's end: NCHW out */
            conv_case(be, 3, 1, 9, 9, 16, 3, 1, 1, N, L, d);  /* a first layer: NCHW in, C 1 */
            conv_case(be, 1, 3, 8, 7, 32, 5, 2, 2, N, L, d);
            conv_case(be, 2, 16, 5, 5, 16, 1, 1, 0, L, L, d);
            conv_case(be, 3, 32, 14, 14, 64, 3, 1, 1, L, N, d); /* the CNN's second conv (Winograd at f32 on AVX-512) */
            conv_case(be, 2, 16, 9, 11, 16, 3, 1, 0, N, L, d);  /* Winograd: tiles past the edge, NCHW in */
            /* NHWC chains (a bf16 model's where oneDNN's bf16 convs want them) */
            conv_case(be, 3, 32, 14, 14, 64, 3, 1, 1, H, H, d);
            conv_case(be, 2, 32, 6, 6, 16, 3, 2, 1, H, N, d);
            conv_case(be, 3, 1, 9, 9, 16, 3, 1, 1, N, H, d);
            conv_case(be, 2, 16, 7, 6, 32, 3, 1, 1, H, L, d);
        }
    }
}

/* The layouts the graph plans for spec on backend be: blocked[i] for node i. */
static void plan_of(const char *spec, int C, int H, int W, bool *blocked, int *n) {
    dt_model *m = NULL;
    CHECK_OK(dt_model_create_from_spec(&m, spec, C, H, W));
    *n = m ? m->n : 0;
    for (int i = 0; i < *n; i++) blocked[i] = m->nodes[i].blocked;
    dt_model_destroy(m);
}

static void test_plan(void) {
    bool bl[32];
    int n;
    const bool have = dt_kernels_select("onednn", "fp32") == DT_OK;
    plan_of("cnn", 1, 12, 12, bl, &n);
    /* input, conv, relu (fused), maxpool, conv, relu, maxpool, flatten, linear ... */
    CHECK(n > 6);
    CHECK(!bl[0] && bl[1] == have && !bl[2] && bl[3] == have && bl[4] == have && !bl[5] && !bl[6] && !bl[7]);
    plan_of("conv(16,3) relu conv(16,3) maxpool(2) conv(16,3) batchnorm flatten linear(10)", 1, 12, 12, bl, &n);
    CHECK(!bl[1]);        /* an unfused relu reads it */
    CHECK(bl[3] == have); /* read by the maxpool only */
    CHECK(bl[4] == have); /* the maxpool feeds a conv */
    CHECK(!bl[5]);        /* batchnorm reads it */
    plan_of("conv(8,3) maxpool(2) conv(16,3) flatten linear(4)", 1, 12, 12, bl, &n);
    CHECK(!bl[1] && !bl[2] && !bl[3]); /* 8 channels; a flatten reads the conv */
    if (have) {                        /* bf16 plans the same blocked chains */
        CHECK_OK(dt_kernels_select("onednn", "bf16"));
        plan_of("cnn", 1, 12, 12, bl, &n);
        CHECK(n > 6 && bl[1] && bl[3] && bl[4] && !bl[6]);
    }
    CHECK_OK(dt_kernels_select("blas", "fp32"));
    plan_of("cnn", 1, 12, 12, bl, &n);
    for (int i = 0; i < n; i++) CHECK(!bl[i]);
    CHECK_OK(dt_kernels_select("blas", "bf16"));
    plan_of("cnn", 1, 12, 12, bl, &n);
    for (int i = 0; i < n; i++) CHECK(!bl[i]);
    CHECK_OK(dt_kernels_select("blas", "fp32"));
}

/* A model whose chains are blocked on the oneDNN kernels at precision prec equals the same model
 * on the blas f32 kernels (NCHW throughout): logits and every parameter gradient within tol of
 * their largest value, after the same forward and backward; a second oneDNN copy gives bitwise
 * the same. */
static void test_model_vs_blas(const char *spec, const char *prec, double tol) {
    dt_model *m[3] = {NULL, NULL, NULL};
    const char *lib[3] = {"blas", "onednn", "onednn"};
    const char *pr[3] = {"fp32", prec, prec}; /* the reference: blas at f32, NCHW throughout */
    const int B = 3, C = 1, H = 12, W = 12;
    float *x = rnd((size_t)B * C * H * W, 21);
    int32_t y[3] = {1, 4, 3};
    const float *logits[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++) {
        if (dt_kernels_select(lib[k], pr[k]) != DT_OK) break;
        CHECK_OK(dt_model_create_from_spec(&m[k], spec, C, H, W));
        if (!m[k]) break;
        dt_model_init(m[k], 9);
        dt_model_zero_grad(m[k]);
        dt_feed f = {x, y, B};
        float loss;
        CHECK_OK(dt_model_run(m[k], &f, true, 0, &loss));
        CHECK_OK(dt_model_backward_loss(m[k], 1.0f, NULL, NULL));
        logits[k] = dt_model_output(m[k]);
    }
    if (m[0] && m[1]) {
        const size_t np = dt_model_num_params(m[0]), nl = (size_t)B * dt_model_out_size(m[0]);
        CHECK_MSG(rel_diff(logits[1], logits[0], nl) < tol, "%s %s: logits differ by %g", spec, prec,
                  rel_diff(logits[1], logits[0], nl));
        CHECK_MSG(rel_diff(dt_model_grads(m[1]), dt_model_grads(m[0]), np) < tol, "%s %s: gradients differ by %g", spec,
                  prec, rel_diff(dt_model_grads(m[1]), dt_model_grads(m[0]), np));
    }
    if (m[1] && m[2]) {
        const size_t np = dt_model_num_params(m[1]), nl = (size_t)B * dt_model_out_size(m[1]);
        CHECK_MSG(!memcmp(logits[1], logits[2], nl * 4) && !memcmp(dt_model_grads(m[1]), dt_model_grads(m[2]), np * 4),
                  "%s %s: two oneDNN runs differ", spec, prec);
    }
    dt_model_destroy(m[0]), dt_model_destroy(m[1]), dt_model_destroy(m[2]);
    free(x);
    CHECK_OK(dt_kernels_select("blas", "fp32"));
}

int main(void) {
    test_reorders();
    test_pool();
    test_conv();
    test_plan();
    const char *specs[4] = {
        "cnn", /* its first conv fused with its pool at f32 (conv_pool_test) */
        "conv(16,3) relu conv(16,3) maxpool(2) conv(32,3,stride=2,pad=1) flatten linear(10)",
        "conv(16,5,pad=2) maxpool(2) conv(16,3) relu maxpool(2) flatten linear(5)", /* fused, no relu */
        "conv(16,3,pad=1) maxpool(3,stride=2) conv(16,1) maxpool(2) conv(16,1) batchnorm relu flatten linear(5)"};
    /* bf16: blocked oneDNN within bf16's rounding of f32 (3e-2); not the batchnorm model, whose
     * 12 values per channel amplify rounding noise (0.09 apart, as are blas bf16 and f32) */
    for (int i = 0; i < 4; i++) test_model_vs_blas(specs[i], "fp32", 2e-5);
    for (int i = 0; i < 3; i++) test_model_vs_blas(specs[i], "bf16", 3e-2);
    return dt_test_summary("blocked_test");
}
