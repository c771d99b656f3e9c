/* Cross-module test: finite-difference gradient checks for every layer kernel and both losses: the analytic input
 * and parameter gradients of backward must match central differences of the forward pass on
 * L = sum(dout * out) with a fixed random dout. Also checks the backward contract: parameter
 * gradients accumulate, din is overwritten, din = NULL skips it and changes nothing else. */
#include "core/test.h"
#include "dtrain/core.h"
#include "backend/layers.h"

#include <stdint.h>
#include <string.h>

/* ---- generic machinery -------------------------------------------------------------------- */

typedef struct gc gc;
typedef void (*gc_fwd)(gc *c);

/* One layer under test: its forward reads the float arrays below and writes out (nout). */
struct gc {
    gc_fwd fwd;
    float *out, *dout;
    size_t nout;
    float *in, *w, *b;     /* perturbed tensors (w, b may be NULL) */
    int i[8];              /* dimensions */
    float f[2];            /* p / eps / momentum */
    float *work, *s1, *s2; /* scratch (conv work, saved mean/rstd) */
    int32_t *idx;
    uint8_t *mask;
};

static uint64_t g_seed = 1234;

static float *rnd(size_t n, float lo, float hi) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    dt_rng_fill_uniform(x, n, lo, hi, g_seed, dt_rng_key(DT_RNG_USER, g_seed));
    g_seed++;
    return x;
}

static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* L = sum(dout * out) in double after running the forward. */
static double gc_loss(gc *c) {
    c->fwd(c);
    double s = 0;
    for (size_t i = 0; i < c->nout; i++) s += (double)c->dout[i] * c->out[i];
    return s;
}

/* Compares the analytic gradient g of x (n values) with central differences (step eps).
 * Tolerance: |num - ana| <= atol * max(1, max|ana|) + rtol * |ana| for every element. */
static void gc_check(const char *what, gc *c, float *x, const float *g, size_t n, float eps, double rtol, double atol) {
    double scale = 1, worst = 0, worst_err = 0;
    for (size_t j = 0; j < n; j++) scale = fmax(scale, fabs(g[j]));
    for (size_t j = 0; j < n; j++) {
        float save = x[j];
        x[j] = save + eps;
        double hp = x[j], lp = gc_loss(c);
        x[j] = save - eps;
        double hm = x[j], lm = gc_loss(c);
        x[j] = save;
        double num = (lp - lm) / (hp - hm), err = fabs(num - g[j]);
        double ratio = err / (atol * scale + rtol * fabs(g[j]));
        if (ratio > worst || ratio != ratio) worst = ratio != ratio ? INFINITY : ratio, worst_err = err;
    }
    c->fwd(c); /* restore out for the caller */
    printf("  %-34s n=%-4zu max err %.2e (%.2f of tolerance)\n", what, n, worst_err, worst);
    CHECK_MSG(worst <= 1.0, "%s: gradient mismatch, max err %g is %.2f x tolerance", what, worst_err, worst);
}

static int all_equal(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* For x in [lo,hi) away from 0 by at least `gap` (kinks of relu). */
static void push_from_zero(float *x, size_t n, float gap) {
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) < gap) x[i] = x[i] < 0 ? x[i] - gap : x[i] + gap;
}

/* ---- linear ------------------------------------------------------------------------------- */

static void lin_fwd(gc *c) { dt_linear_forward(c->out, c->in, c->w, c->b, c->i[0], c->i[1], c->i[2]); }

static void test_linear(int bias) {
    const int B = 3, C = 5, OC = 4;
    gc c = {.fwd = lin_fwd, .nout = (size_t)B * OC, .i = {B, C, OC}};
    c.in = rnd(B * C, -1, 1), c.w = rnd(OC * C, -1, 1), c.b = bias ? rnd(OC, -1, 1) : NULL;
    c.out = zeros(c.nout), c.dout = rnd(c.nout, -1, 1);
    float *din = rnd(B * C, 5, 6) /* garbage: must be overwritten */, *dw = zeros(OC * C), *db = zeros(OC);
    lin_fwd(&c);
    dt_linear_backward(din, dw, bias ? db : NULL, c.dout, c.in, c.w, B, C, OC);
    printf("linear bias=%d\n", bias);
    gc_check("linear din", &c, c.in, din, B * C, 0.5f, 1e-4, 1e-5);
    gc_check("linear dw", &c, c.w, dw, OC * C, 0.5f, 1e-4, 1e-5);
    if (bias) gc_check("linear db", &c, c.b, db, OC, 0.5f, 1e-4, 1e-5);
    /* accumulate: a second call doubles dw/db; din = NULL leaves din alone */
    float *dw1 = malloc(OC * C * sizeof(float)), *db1 = malloc(OC * sizeof(float)), *din1 = malloc(B * C * 4);
    memcpy(dw1, dw, OC * C * 4), memcpy(db1, db, OC * 4), memcpy(din1, din, B * C * 4);
    dt_linear_backward(NULL, dw, bias ? db : NULL, c.dout, c.in, c.w, B, C, OC);
    int ok = 1;
    for (int i = 0; i < OC * C; i++) ok &= fabsf(dw[i] - 2 * dw1[i]) <= 1e-6f * fabsf(dw1[i]) + 1e-7f;
    for (int i = 0; bias && i < OC; i++) ok &= fabsf(db[i] - 2 * db1[i]) <= 1e-6f * fabsf(db1[i]) + 1e-7f;
    CHECK_MSG(ok, "linear: second backward must double dw/db");
    CHECK_MSG(all_equal(din, din1, B * C), "linear: din = NULL must not touch din");
    free(dw1), free(db1), free(din1);
    free(c.in), free(c.w), free(c.b), free(c.out), free(c.dout), free(din), free(dw), free(db);
}

/* ---- conv2d ------------------------------------------------------------------------------- */

static void conv_fwd(gc *c) {
    dt_conv2d_forward(c->out, c->in, c->w, c->b, c->work, c->i[0], c->i[1], c->i[2], c->i[3], c->i[4], c->i[5], c->i[6],
                      c->i[7]);
}

static void test_conv(int B, int C, int H, int W, int OC, int K, int S, int P, int bias) {
    const int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    const size_t nin = (size_t)B * C * H * W, nw = (size_t)OC * C * K * K;
    size_t ws = dt_conv2d_workspace(B, C, H, W, OC, K, S, P);
    gc c = {.fwd = conv_fwd, .nout = (size_t)B * OC * OH * OW, .i = {B, C, H, W, OC, K, S, P}};
    c.in = rnd(nin, -1, 1), c.w = rnd(nw, -1, 1), c.b = bias ? rnd(OC, -1, 1) : NULL;
    c.out = zeros(c.nout), c.dout = rnd(c.nout, -1, 1);
    c.work = ws ? malloc(ws * sizeof(float)) : NULL; /* exact size: ASan catches overruns */
    float *din = rnd(nin, 5, 6), *dw = zeros(nw), *db = zeros(OC);
    conv_fwd(&c);
    dt_conv2d_backward(din, dw, bias ? db : NULL, c.dout, c.in, c.w, c.work, B, C, H, W, OC, K, S, P);
    printf("conv2d B=%d C=%d %dx%d OC=%d K=%d stride=%d pad=%d bias=%d -> %dx%d\n", B, C, H, W, OC, K, S, P, bias, OH,
           OW);
    gc_check("conv din", &c, c.in, din, nin, 0.5f, 1e-4, 1e-5);
    gc_check("conv dw", &c, c.w, dw, nw, 0.5f, 1e-4, 1e-5);
    if (bias) gc_check("conv db", &c, c.b, db, OC, 0.5f, 1e-4, 1e-5);
    float *dw1 = malloc(nw * 4), *din1 = malloc(nin * 4), *db1 = malloc(OC * 4);
    memcpy(dw1, dw, nw * 4), memcpy(din1, din, nin * 4), memcpy(db1, db, OC * 4);
    dt_conv2d_backward(NULL, dw, bias ? db : NULL, c.dout, c.in, c.w, c.work, B, C, H, W, OC, K, S, P);
    int ok = 1;
    for (size_t i = 0; i < nw; i++) ok &= fabsf(dw[i] - 2 * dw1[i]) <= 1e-5f * fabsf(dw1[i]) + 1e-6f;
    for (int i = 0; bias && i < OC; i++) ok &= fabsf(db[i] - 2 * db1[i]) <= 1e-5f * fabsf(db1[i]) + 1e-6f;
    CHECK_MSG(ok, "conv: second backward must double dw/db");
    CHECK_MSG(all_equal(din, din1, nin), "conv: din = NULL must not touch din");
    /* din only (dw = db = NULL) gives the same din */
    float *din2 = rnd(nin, 5, 6);
    dt_conv2d_backward(din2, NULL, NULL, c.dout, c.in, c.w, c.work, B, C, H, W, OC, K, S, P);
    CHECK_MSG(all_equal(din2, din1, nin), "conv: din must not depend on dw/db being computed");
    free(dw1), free(din1), free(db1), free(din2);
    free(c.in), free(c.w), free(c.b), free(c.out), free(c.dout), free(c.work), free(din), free(dw), free(db);
}

/* ---- pooling ------------------------------------------------------------------------------ */

static void maxpool_fwd(gc *c) {
    dt_maxpool2d_forward(c->out, c->idx, c->in, c->i[0], c->i[1], c->i[2], c->i[3], c->i[4], c->i[5]);
}
static void avgpool_fwd(gc *c) {
    dt_avgpool2d_forward(c->out, c->in, c->i[0], c->i[1], c->i[2], c->i[3], c->i[4], c->i[5]);
}

static void test_pool(int max, int B, int C, int H, int W, int K, int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const size_t nin = (size_t)B * C * H * W;
    gc c = {.fwd = max ? maxpool_fwd : avgpool_fwd, .nout = (size_t)B * C * OH * OW, .i = {B, C, H, W, K, S}};
    /* distinct values 0.1 apart (a shuffled ramp) so no max changes under the 0.02 step */
    c.in = malloc(nin * sizeof(float));
    for (size_t i = 0; i < nin; i++) c.in[i] = 0.1f * (float)i;
    for (size_t i = nin - 1; i > 0; i--) {
        size_t j = dt_rng_u64(7, 8, i) % (i + 1);
        float t = c.in[i];
        c.in[i] = c.in[j], c.in[j] = t;
    }
    c.out = zeros(c.nout), c.dout = rnd(c.nout, -1, 1), c.idx = malloc(c.nout * sizeof(int32_t));
    float *din = rnd(nin, 5, 6);
    c.fwd(&c);
    if (max) dt_maxpool2d_backward(din, c.dout, c.idx, B, C, H, W, K, S);
    else dt_avgpool2d_backward(din, c.dout, B, C, H, W, K, S);
    printf("%s B=%d C=%d %dx%d K=%d S=%d\n", max ? "maxpool2d" : "avgpool2d", B, C, H, W, K, S);
    /* max: step below half the value spacing; avg is linear, so a large step is exact */
    gc_check(max ? "maxpool din" : "avgpool din", &c, c.in, din, nin, max ? 0.02f : 0.5f, 1e-4, 1e-5);
    if (max) { /* the recorded index holds the window max */
        int ok = 1;
        for (size_t i = 0; i < c.nout; i++) ok &= c.idx[i] >= 0 && (size_t)c.idx[i] < nin && c.in[c.idx[i]] == c.out[i];
        CHECK_MSG(ok, "maxpool: argmax must point at the max");
    }
    free(c.in), free(c.out), free(c.dout), free(c.idx), free(din);
}

/* ---- activations and dropout -------------------------------------------------------------- */

enum { ACT_RELU, ACT_GELU, ACT_TANH, ACT_SIGMOID };
static void act_fwd(gc *c) {
    size_t n = c->nout;
    switch (c->i[0]) {
    case ACT_RELU: dt_relu_forward(c->out, c->in, n); break;
    case ACT_GELU: dt_gelu_forward(c->out, c->in, n); break;
    case ACT_TANH: dt_tanh_forward(c->out, c->in, n); break;
    default: dt_sigmoid_forward(c->out, c->in, n); break;
    }
}

static void test_activation(int kind, const char *name) {
    const size_t n = 40;
    gc c = {.fwd = act_fwd, .nout = n, .i = {kind}};
    c.in = rnd(n, -3, 3), c.out = zeros(n), c.dout = rnd(n, -1, 1);
    if (kind == ACT_RELU) push_from_zero(c.in, n, 0.05f);
    float *din = rnd(n, 5, 6);
    act_fwd(&c);
    /* relu/gelu take the forward input, tanh/sigmoid the forward output */
    const float *saved = (kind == ACT_RELU || kind == ACT_GELU) ? c.in : c.out;
    switch (kind) {
    case ACT_RELU: dt_relu_backward(din, c.dout, saved, n); break;
    case ACT_GELU: dt_gelu_backward(din, c.dout, saved, n); break;
    case ACT_TANH: dt_tanh_backward(din, c.dout, saved, n); break;
    default: dt_sigmoid_backward(din, c.dout, saved, n); break;
    }
    printf("%s\n", name);
    gc_check(name, &c, c.in, din, n, 1e-2f, 2e-3, 2e-4);
    /* in-place forward gives the same values */
    float *y = malloc(n * 4);
    memcpy(y, c.in, n * 4);
    float *keep = c.out, *x = c.in;
    c.out = y, c.in = y, act_fwd(&c);
    CHECK_MSG(all_equal(y, keep, n), "%s: in-place forward differs", name);
    free(y), free(keep), free(x), free(c.dout), free(din);
}

static void drop_fwd(gc *c) {
    dt_dropout_forward(c->out, c->mask, c->in, c->nout, c->f[0], 99, dt_rng_key(DT_RNG_DROPOUT, 5));
}

static void test_dropout(void) {
    const size_t n = 64;
    const float p = 0.3f;
    gc c = {.fwd = drop_fwd, .nout = n, .f = {p}};
    c.in = rnd(n, -1, 1), c.out = zeros(n), c.dout = rnd(n, -1, 1), c.mask = malloc(n);
    float *din = rnd(n, 5, 6);
    drop_fwd(&c);
    dt_dropout_backward(din, c.dout, c.mask, n, p);
    printf("dropout p=%.1f (mask fixed by seed/key)\n", p);
    gc_check("dropout din", &c, c.in, din, n, 0.5f, 1e-5, 1e-6);
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= c.mask[i] == (dt_rng_uniform(99, dt_rng_key(DT_RNG_DROPOUT, 5), i) >= p) &&
              c.out[i] == (c.mask[i] ? c.in[i] * (1.0f / (1 - p)) : 0.0f);
    CHECK_MSG(ok, "dropout: mask must be u(seed,key,i) >= p and kept values scaled by 1/(1-p)");
    /* keep rate over a large vector, and another key gives another mask */
    enum { N = 100000 };
    float *x = rnd(N, 1, 2), *y = malloc(N * 4);
    uint8_t *m1 = malloc(N), *m2 = malloc(N);
    dt_dropout_forward(y, m1, x, N, p, 1, 2);
    dt_dropout_forward(y, m2, x, N, p, 1, 3);
    size_t kept = 0, same = 0;
    for (size_t i = 0; i < N; i++) kept += m1[i], same += m1[i] == m2[i];
    CHECK_MSG(fabs(kept / (double)N - (1 - p)) < 0.01, "dropout keep rate %g, want %g", kept / (double)N, 1 - p);
    CHECK_MSG(same < N * 0.65, "dropout: different keys must give different masks (%zu equal)", same);
    free(x), free(y), free(m1), free(m2);
    free(c.in), free(c.out), free(c.dout), free(c.mask), free(din);
}

/* ---- norms -------------------------------------------------------------------------------- */

static void ln_fwd(gc *c) { dt_layernorm_forward(c->out, c->s1, c->s2, c->in, c->w, c->b, c->i[0], c->i[1], c->f[0]); }

static void test_layernorm(int affine) {
    const int N = 4, C = 9;
    gc c = {.fwd = ln_fwd, .nout = (size_t)N * C, .i = {N, C}, .f = {1e-5f}};
    c.in = rnd(N * C, -2, 2), c.w = affine ? rnd(C, 0.5f, 1.5f) : NULL, c.b = affine ? rnd(C, -1, 1) : NULL;
    c.out = zeros(c.nout), c.dout = rnd(c.nout, -1, 1), c.s1 = zeros(N), c.s2 = zeros(N);
    float *din = rnd(N * C, 5, 6), *dw = zeros(C), *db = zeros(C);
    ln_fwd(&c);
    dt_layernorm_backward(din, affine ? dw : NULL, affine ? db : NULL, c.dout, c.in, c.w, c.s1, c.s2, N, C);
    printf("layernorm N=%d C=%d affine=%d\n", N, C, affine);
    gc_check("layernorm din", &c, c.in, din, N * C, 1e-2f, 2e-3, 5e-4);
    if (affine) {
        gc_check("layernorm dw", &c, c.w, dw, C, 1e-2f, 2e-3, 5e-4);
        gc_check("layernorm db", &c, c.b, db, C, 1e-2f, 2e-3, 5e-4);
        float *dw1 = malloc(C * 4), *din1 = malloc(N * C * 4);
        memcpy(dw1, dw, C * 4), memcpy(din1, din, N * C * 4);
        dt_layernorm_backward(NULL, dw, db, c.dout, c.in, c.w, c.s1, c.s2, N, C);
        int ok = 1;
        for (int i = 0; i < C; i++) ok &= fabsf(dw[i] - 2 * dw1[i]) <= 1e-5f * fabsf(dw1[i]) + 1e-6f;
        CHECK_MSG(ok, "layernorm: second backward must double dw");
        CHECK_MSG(all_equal(din, din1, N * C), "layernorm: din = NULL must not touch din");
        free(dw1), free(din1);
    }
    free(c.in), free(c.w), free(c.b), free(c.out), free(c.dout), free(c.s1), free(c.s2), free(din), free(dw), free(db);
}

static void bn_fwd(gc *c) {
    dt_batchnorm2d_forward_train(c->out, c->s1, c->s2, NULL, NULL, c->in, c->w, c->b, c->i[0], c->i[1], c->i[2],
                                 c->f[1], c->f[0]);
}

static void test_batchnorm(void) {
    const int B = 3, C = 4, HW = 5;
    const size_t n = (size_t)B * C * HW;
    gc c = {.fwd = bn_fwd, .nout = n, .i = {B, C, HW}, .f = {1e-5f, 0.1f}};
    c.in = rnd(n, -2, 2), c.w = rnd(C, 0.5f, 1.5f), c.b = rnd(C, -1, 1);
    c.out = zeros(n), c.dout = rnd(n, -1, 1), c.s1 = zeros(C), c.s2 = zeros(C);
    float *din = rnd(n, 5, 6), *dw = zeros(C), *db = zeros(C);
    bn_fwd(&c);
    dt_batchnorm2d_backward(din, dw, db, c.dout, c.in, c.w, c.s1, c.s2, B, C, HW);
    printf("batchnorm2d train B=%d C=%d HW=%d\n", B, C, HW);
    gc_check("batchnorm din", &c, c.in, din, n, 1e-2f, 2e-3, 5e-4);
    gc_check("batchnorm dw", &c, c.w, dw, C, 1e-2f, 2e-3, 5e-4);
    gc_check("batchnorm db", &c, c.b, db, C, 1e-2f, 2e-3, 5e-4);
    float *dw1 = malloc(C * 4), *din1 = malloc(n * 4);
    memcpy(dw1, dw, C * 4), memcpy(din1, din, n * 4);
    dt_batchnorm2d_backward(NULL, dw, db, c.dout, c.in, c.w, c.s1, c.s2, B, C, HW);
    int ok = 1;
    for (int i = 0; i < C; i++) ok &= fabsf(dw[i] - 2 * dw1[i]) <= 1e-5f * fabsf(dw1[i]) + 1e-6f;
    CHECK_MSG(ok, "batchnorm: second backward must double dw");
    CHECK_MSG(all_equal(din, din1, n), "batchnorm: din = NULL must not touch din");
    /* running stats: momentum update with the unbiased variance; eval uses them */
    float rm[4] = {0.5f, 0, 0, 0}, rv[4] = {2, 1, 1, 1}, rm0[4], rv0[4];
    memcpy(rm0, rm, sizeof rm), memcpy(rv0, rv, sizeof rv);
    dt_batchnorm2d_forward_train(c.out, c.s1, c.s2, rm, rv, c.in, c.w, c.b, B, C, HW, 0.1f, 1e-5f);
    double worst = 0;
    for (int ch = 0; ch < C; ch++) {
        double s = 0, ss = 0;
        for (int i = 0; i < B; i++)
            for (int k = 0; k < HW; k++) s += c.in[(i * C + ch) * HW + k];
        double m = s / (B * HW);
        for (int i = 0; i < B; i++)
            for (int k = 0; k < HW; k++) ss += pow(c.in[(i * C + ch) * HW + k] - m, 2);
        double uv = ss / (B * HW - 1);
        worst = fmax(worst, fabs(rm[ch] - (0.9 * rm0[ch] + 0.1 * m)));
        worst = fmax(worst, fabs(rv[ch] - (0.9 * rv0[ch] + 0.1 * uv)));
        worst = fmax(worst, fabs(c.s2[ch] - 1 / sqrt(ss / (B * HW) + 1e-5)));
    }
    printf("  batchnorm running stats max err %.2e\n", worst);
    CHECK_MSG(worst < 1e-5, "batchnorm running stats off by %g", worst);
    float *ev = zeros(n);
    dt_batchnorm2d_forward_eval(ev, c.in, c.w, c.b, rm, rv, B, C, HW, 1e-5f);
    worst = 0;
    for (size_t i = 0; i < n; i++) {
        int ch = (int)(i / HW) % C;
        double want = (c.in[i] - rm[ch]) / sqrt(rv[ch] + 1e-5) * c.w[ch] + c.b[ch];
        worst = fmax(worst, fabs(ev[i] - want));
    }
    CHECK_MSG(worst < 1e-5, "batchnorm eval off by %g", worst);
    free(ev), free(dw1), free(din1);
    free(c.in), free(c.w), free(c.b), free(c.out), free(c.dout), free(c.s1), free(c.s2), free(din), free(dw), free(db);
}

/* ---- losses ------------------------------------------------------------------------------- */

static int32_t g_labels[6] = {2, 0, 4, 4, 1, 3};

/* For losses the "output" is the scalar loss: nout = 1, dout = {1}. */
static void xent_fwd(gc *c) { c->out[0] = dt_softmax_xent_forward(c->work, c->in, g_labels, c->i[0], c->i[1]); }
static void mse_fwd(gc *c) { c->out[0] = dt_mse_forward(c->in, c->w, (size_t)c->i[0]); }

static void test_losses(void) {
    const int B = 6, V = 5;
    float one = 1.0f, loss;
    gc c = {.fwd = xent_fwd, .nout = 1, .i = {B, V}, .out = &loss, .dout = &one};
    c.in = rnd(B * V, -4, 4), c.work = zeros(B * V);
    float *d = rnd(B * V, 5, 6), *d2 = zeros(B * V);
    xent_fwd(&c);
    dt_softmax_xent_backward(d, c.work, g_labels, B, V, 1.0f);
    printf("softmax cross-entropy B=%d V=%d loss %.4f\n", B, V, loss);
    gc_check("softmax_xent dlogits", &c, c.in, d, B * V, 1e-2f, 2e-3, 5e-4);
    /* loss scaling multiplies the gradient */
    dt_softmax_xent_backward(d2, c.work, g_labels, B, V, 8.0f);
    int ok = 1;
    for (int i = 0; i < B * V; i++) ok &= fabsf(d2[i] - 8 * d[i]) <= 1e-6f;
    CHECK_MSG(ok, "softmax_xent: scale must multiply the gradient");
    /* stability: huge logits give a finite loss equal to the shifted one */
    float big[5] = {1000, 1001, 1002, 999, 998}, small[5] = {0, 1, 2, -1, -2}, pb[5], ps[5];
    int32_t lab = 1;
    float lb = dt_softmax_xent_forward(pb, big, &lab, 1, 5), ls = dt_softmax_xent_forward(ps, small, &lab, 1, 5);
    CHECK_MSG(isfinite(lb) && fabsf(lb - ls) < 1e-5f, "softmax_xent unstable: %g vs %g", lb, ls);
    CHECK_MSG(fabsf(ls - 1.4519143f) < 1e-5f, "softmax_xent value %g, want 1.4519143", ls);
    free(c.in), free(c.work), free(d), free(d2);

    const int n = 17;
    gc m = {.fwd = mse_fwd, .nout = 1, .i = {n}, .out = &loss, .dout = &one};
    m.in = rnd(n, -2, 2), m.w = rnd(n, -2, 2);
    float *dp = rnd(n, 5, 6);
    mse_fwd(&m);
    dt_mse_backward(dp, m.in, m.w, n, 1.0f);
    printf("mse n=%d loss %.4f\n", n, loss);
    gc_check("mse dpred", &m, m.in, dp, n, 1e-2f, 2e-3, 5e-4);
    free(m.in), free(m.w), free(dp);
}

int main(void) {
    dt_set_threads(1);
    test_linear(1);
    test_linear(0);
    test_conv(2, 3, 6, 6, 4, 3, 1, 1, 1); /* "same" fast path */
    test_conv(2, 3, 7, 7, 4, 3, 2, 1, 1); /* stride 2, pad 1 */
    test_conv(1, 2, 6, 5, 3, 3, 1, 0, 0); /* valid, no bias, non-square input */
    test_conv(2, 2, 5, 5, 3, 2, 1, 0, 1); /* even kernel */
    test_conv(2, 4, 4, 4, 3, 1, 1, 0, 1); /* pointwise: no im2col */
    test_conv(1, 2, 7, 6, 2, 5, 2, 2, 1); /* K=5 stride 2 pad 2 */
    test_conv(2, 2, 1, 1, 3, 3, 1, 1, 1); /* 1x1 input, 3x3 same: shifts beyond the plane */
    test_conv(1, 1, 5, 5, 2, 3, 1, 2, 1); /* pad larger than "same" */
    test_pool(1, 2, 3, 6, 6, 2, 2);
    test_pool(1, 2, 2, 7, 7, 3, 2); /* overlapping windows */
    test_pool(1, 1, 2, 5, 6, 2, 1);
    test_pool(1, 2, 2, 7, 7, 2, 2);  /* odd size: last row/column unused */
    test_pool(1, 1, 2, 4, 40, 2, 2); /* rows wider than one vector */
    test_pool(0, 2, 3, 6, 6, 2, 2);
    test_pool(0, 2, 2, 7, 7, 3, 2);
    test_activation(ACT_RELU, "relu");
    test_activation(ACT_GELU, "gelu");
    test_activation(ACT_TANH, "tanh");
    test_activation(ACT_SIGMOID, "sigmoid");
    test_dropout();
    test_layernorm(1);
    test_layernorm(0);
    test_batchnorm();
    test_losses();
    return dt_test_summary("gradcheck_test");
}
