/* The fused conv -> relu -> maxpool kernels (cpu_conv_pool.c) against the unfused chain of the
 * cpu kernels (im2col conv, NCHW max pooling, relu): pooled values within 1e-5 of the largest,
 * the window positions equal to the reference argmax (and the relu's stops), dw / db
 * (accumulated onto nonzero values) within 1e-5 relative; NCHW, blocked and NHWC outputs; the CNN's
 * 1-channel 3x3 conv with 2x2 windows (pooled in registers, its own code) and 3 channels, other
 * kernel and window sizes, an odd plane whose last row and column no window covers, no relu, no
 * bias; two runs bitwise equal. Then the graph's plan: which convs fuse (oneDNN at every precision; not
 * when the input needs a gradient, windows overlap or the input has many channels). Models through
 * the fused path against the blas (unfused) ones: blocked_test. */
#include "backend/backend.h"
#include "backend/blocked.h"
#include "backend/conv_pool.h"
#include "core/test.h"
#include "dtrain/core.h"
#include "dtrain/nn.h"
#include "nn/graph_internal.h"

#include <string.h>

static float *rnd(size_t n, uint64_t key) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    dt_rng_fill_uniform(x, n, -1, 1, 11, key);
    return x;
}

static double rel(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(b[i]) > m ? fabs(b[i]) : m;
    return dt_test_maxdiff(a, b, n) / (m > 0 ? m : 1);
}

typedef struct {
    float *out, *dw, *db;
    int32_t *win; /* window positions (DT_CONV_POOL_STOP where the relu stops the gradient) */
} result;

/* The unfused chain on the cpu kernels: conv, maxpool, relu; backward through all three. */
static result reference(const dt_conv_pool_shape *s, const float *x, const float *w, const float *b, const float *g,
                        const float *dw0) {
    const dt_kernel_table *be = dt_backend_cpu();
    const int CH = s->H + 2 * s->P - s->K + 1, CW = s->W + 2 * s->P - s->K + 1, OH = CH / s->PK, OW = CW / s->PK;
    const size_t nc = (size_t)s->B * s->OC * CH * CW, no = (size_t)s->B * s->OC * OH * OW,
                 nw = (size_t)s->OC * s->C * s->K * s->K;
    float *y = malloc(nc * 4), *dy = malloc(nc * 4),
          *work = malloc(dt_conv2d_workspace(s->B, s->C, s->H, s->W, s->OC, s->K, 1, s->P) * 4 + 4);
    int32_t *am = malloc(no * 4);
    result r = {malloc(no * 4), malloc(nw * 4), calloc((size_t)s->OC, 4), malloc(no * 4)};
    float *gg = malloc(no * 4);
    memcpy(r.dw, dw0, nw * 4);
    be->conv2d_forward(y, x, w, b, work, s->B, s->C, s->H, s->W, s->OC, s->K, 1, s->P);
    be->maxpool2d_forward(r.out, am, y, s->B, s->OC, CH, CW, s->PK, s->PK);
    for (size_t i = 0; i < no; i++) { /* the argmax's flat index in its plane -> (py, px) in its window */
        const int p = am[i] % (CH * CW), cy = p / CW, cx = p % CW;
        r.win[i] = s->relu && !(r.out[i] > 0) ? DT_CONV_POOL_STOP : cy % s->PK * s->PK + cx % s->PK;
    }
    if (s->relu) be->relu_forward(r.out, r.out, no);
    if (s->relu) be->relu_backward(gg, g, r.out, no);
    else memcpy(gg, g, no * 4);
    be->maxpool2d_backward(dy, gg, am, s->B, s->OC, CH, CW, s->PK, s->PK);
    be->conv2d_backward(NULL, r.dw, b ? r.db : NULL, dy, x, w, work, s->B, s->C, s->H, s->W, s->OC, s->K, 1, s->P);
    free(y), free(dy), free(work), free(am), free(gg);
    return r;
}

static result fused(const dt_conv_pool_shape *s, const float *x, const float *w, const float *b, const float *g,
                    const float *dw0, size_t no) {
    const size_t nw = (size_t)s->OC * s->C * s->K * s->K;
    const int OHW = (int)(no / ((size_t)s->B * s->OC));
    result r = {malloc(no * 4), malloc(nw * 4), calloc((size_t)s->OC, 4), malloc(no * 4)};
    uint8_t *wb = malloc(no);
    memcpy(r.dw, dw0, nw * 4);
    float *gb = s->out_bl ? malloc(no * 4) : (float *)g;
    if (s->out_bl) dt_blocked_from_nchw(gb, g, s->B, s->OC, OHW, s->out_nhwc);
    void *ws = aligned_alloc(64, dt_conv_pool_workspace(s));
    dt_conv_pool_forward(s, r.out, wb, x, w, b, ws);
    dt_conv_pool_backward(s, r.dw, b ? r.db : NULL, gb, wb, x, ws);
    free(ws);
    float *wf = malloc(no * 4); /* the positions as floats, to reorder them with the values */
    for (size_t i = 0; i < no; i++) wf[i] = wb[i];
    if (s->out_bl) { /* back to NCHW to compare */
        float *o = malloc(no * 4);
        dt_blocked_to_nchw(o, r.out, s->B, s->OC, OHW, s->out_nhwc);
        memcpy(r.out, o, no * 4);
        dt_blocked_to_nchw(o, wf, s->B, s->OC, OHW, s->out_nhwc);
        memcpy(wf, o, no * 4);
        free(o), free(gb);
    }
    for (size_t i = 0; i < no; i++) r.win[i] = (int32_t)wf[i];
    free(wf), free(wb);
    return r;
}

static void free_result(result *r) { free(r->out), free(r->dw), free(r->db), free(r->win); }

enum { NCHW, BLOCKED, NHWC }; /* the output's layout */

static void kernel_case(int B, int C, int H, int W, int OC, int K, int P, int PK, bool relu, bool bias, int layout) {
    const bool out_bl = layout != NCHW;
    const dt_conv_pool_shape s = {B, C, H, W, OC, K, P, PK, relu, out_bl, layout == NHWC, false};
    const int OH = (H + 2 * P - K + 1) / PK, OW = (W + 2 * P - K + 1) / PK;
    const size_t nx = (size_t)B * C * H * W, nw = (size_t)OC * C * K * K, no = (size_t)B * OC * OH * OW;
    float *x = rnd(nx, 1), *w = rnd(nw, 2), *b = bias ? rnd((size_t)OC, 3) : NULL, *g = rnd(no, 4), *dw0 = rnd(nw, 5);
    result r = reference(&s, x, w, b, g, dw0), f = fused(&s, x, w, b, g, dw0, no), f2 = fused(&s, x, w, b, g, dw0, no);
    size_t same_win = 0;
    for (size_t i = 0; i < no; i++) same_win += r.win[i] == f.win[i];
    CHECK_MSG(rel(f.out, r.out, no) < 1e-5, "conv_pool C%d K%d P%d PK%d bl%d: out differs by %g", C, K, P, PK, out_bl,
              rel(f.out, r.out, no));
    CHECK_MSG(same_win == no, "conv_pool C%d K%d PK%d: %zu of %zu window positions differ", C, K, PK, no - same_win,
              no);
    CHECK_MSG(rel(f.dw, r.dw, nw) < 1e-5, "conv_pool C%d K%d P%d PK%d relu%d bl%d: dw differs by %g", C, K, P, PK, relu,
              out_bl, rel(f.dw, r.dw, nw));
    CHECK_MSG(rel(f.db, r.db, (size_t)OC) < 1e-5, "conv_pool C%d K%d PK%d: db differs by %g", C, K, PK,
              rel(f.db, r.db, (size_t)OC));
    CHECK(!memcmp(f.out, f2.out, no * 4) && !memcmp(f.dw, f2.dw, nw * 4) && !memcmp(f.db, f2.db, (size_t)OC * 4));
    free_result(&r), free_result(&f), free_result(&f2);
    free(x), free(w), free(b), free(g), free(dw0);
}

static void test_kernels(void) {
    kernel_case(3, 1, 28, 28, 32, 3, 1, 2, true, true, BLOCKED); /* the reference CNN's first layer */
    kernel_case(3, 1, 28, 28, 32, 3, 1, 2, true, true, NCHW);
    kernel_case(3, 1, 28, 28, 32, 3, 1, 2, true, true, NHWC);   /* its layout at bf16 on AMX */
    kernel_case(2, 1, 9, 11, 16, 3, 1, 2, true, true, BLOCKED); /* the last row and column in no window */
    kernel_case(2, 1, 9, 11, 48, 3, 1, 2, true, true, NHWC);
    kernel_case(2, 3, 10, 10, 16, 3, 1, 2, true, true, BLOCKED); /* 3 channels (RGB) */
    kernel_case(2, 3, 11, 7, 16, 5, 2, 3, false, true, NCHW);    /* 3 channels, 5x5, 3x3 windows, no relu */
    kernel_case(2, 3, 11, 7, 32, 5, 2, 3, false, true, NHWC);
    kernel_case(2, 2, 8, 10, 32, 1, 0, 2, true, false, BLOCKED); /* 1x1, no bias */
    kernel_case(1, 4, 6, 6, 16, 3, 0, 4, true, true, NCHW);      /* one 4x4 window per plane */
}

/* Which nodes of spec (1x12x12 inputs) fuse, on the kernels of lib. */
static void fused_of_at(const char *lib, const char *prec, const char *spec, bool *fz, int *n) {
    dt_model *m = NULL;
    *n = 0;
    if (dt_kernels_select(lib, prec) != DT_OK) return;
    CHECK_OK(dt_model_create_from_spec(&m, spec, 1, 12, 12));
    *n = m ? m->n : 0;
    for (int i = 0; i < *n; i++) fz[i] = dt_model_node_fused(m, i);
    dt_model_destroy(m);
}

static void fused_of(const char *lib, const char *spec, bool *fz, int *n) { fused_of_at(lib, "fp32", spec, fz, n); }

static void test_plan(void) {
    bool fz[32];
    int n;
    const bool have = dt_backend_onednn(DT_F32) != NULL;
    fused_of("onednn", "cnn", fz, &n); /* input, conv, relu, maxpool, conv, relu, maxpool, ... */
    if (have) CHECK(n > 6 && fz[1] && fz[2] && !fz[3] && !fz[4] && !fz[6]);
    fused_of_at("onednn", "bf16", "cnn", fz, &n); /* bf16 runs a conv over 1 channel at f32: fused too */
    if (have) CHECK(n > 6 && fz[1] && fz[2] && !fz[3] && !fz[4] && !fz[6]);
    fused_of("onednn", "conv(16,3) maxpool(3,stride=2) flatten linear(4)", fz, &n); /* overlapping windows */
    for (int i = 0; i < n; i++) CHECK(!fz[i]);
    fused_of("onednn", "conv(4,1) conv(16,3) relu maxpool(2) flatten linear(4)", fz, &n);
    for (int i = 0; i < n; i++) CHECK(!fz[i]); /* the second conv's input needs a gradient */
    fused_of("onednn", "conv(8,3) conv(16,3) relu maxpool(2) flatten linear(4)", fz, &n);
    for (int i = 0; i < n; i++) CHECK(!fz[i]); /* 8 input channels (and 8 outputs) */
    fused_of("blas", "cnn", fz, &n);
    for (int i = 0; i < n; i++) CHECK(!fz[i]); /* blas is the unfused reference */
    if (have) {
        fused_of("onednn", "conv(16,5,pad=2) maxpool(2) conv(16,3) relu maxpool(2) flatten linear(4)", fz, &n);
        CHECK(n > 3 && fz[1] && !fz[2] && !fz[3]); /* no relu between; the second conv reads 16 channels */
    }
    CHECK_OK(dt_kernels_select("blas", "fp32"));
}

int main(void) {
    test_kernels();
    test_plan();
    return dt_test_summary("conv_pool_test");
}
