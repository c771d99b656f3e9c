/* Layer-kernel microbenchmark: GFLOP/s of linear and conv2d forward/backward at the reference
 * model shapes, and samples/s of a full kernel-level training step (forward, loss, backward, SGD
 * update) of the reference MLP and CNN, single-threaded. Prints a table, then one JSON line.
 *   make && cc -O2 -march=native -Iinclude -Isrc bench/kernels.c build/libdtrain.a \
 *        -lopenblas -lm -pthread -o build/bench_kernels && build/bench_kernels [seconds]   */
#include "dtrain/core.h"
#include "dtrain/layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double g_min_time = 0.3;
static char g_json[4096];
static size_t g_json_len;

static float *buf(size_t n) {
    float *p = dt_alloc(n * sizeof(float));
    if (!p) {
        fprintf(stderr, "bench: out of memory (%zu floats)\n", n);
        exit(1);
    }
    dt_rng_fill_uniform(p, n, -0.5f, 0.5f, 1, n);
    return p;
}

/* Best-of-5 seconds per call of fn(ctx), each repeat running at least g_min_time/5. */
static double time_it(void (*fn)(void *), void *ctx) {
    double best = 1e30;
    fn(ctx); /* warm-up */
    for (int r = 0; r < 5; r++) {
        int it = 0;
        double t0 = dt_now(), t;
        do {
            fn(ctx);
            it++;
        } while ((t = dt_now() - t0) < g_min_time / 5);
        if (t / it < best) best = t / it;
    }
    return best;
}

static void report(const char *name, double sec, double flops, double samples) {
    printf("%-40s %9.1f us  %7.1f GFLOP/s", name, sec * 1e6, flops / sec / 1e9);
    if (samples > 0) printf("  %9.0f samples/s", samples / sec);
    printf("\n");
    g_json_len += (size_t)snprintf(g_json + g_json_len, sizeof g_json - g_json_len,
                                   "%s\"%s\":{\"us\":%.1f,\"gflops\":%.2f%s", g_json_len > 1 ? "," : "", name,
                                   sec * 1e6, flops / sec / 1e9, samples > 0 ? "" : "}");
    if (samples > 0)
        g_json_len += (size_t)snprintf(g_json + g_json_len, sizeof g_json - g_json_len, ",\"samples_per_s\":%.0f}",
                                       samples / sec);
}

/* ---- linear ---- */
typedef struct {
    int B, C, OC;
    float *in, *w, *b, *out, *dout, *din, *dw, *db;
} lin_ctx;
static void lin_f(void *p) {
    lin_ctx *c = p;
    dt_linear_forward(c->out, c->in, c->w, c->b, c->B, c->C, c->OC);
}
static void lin_b(void *p) {
    lin_ctx *c = p;
    dt_linear_backward(c->din, c->dw, c->db, c->dout, c->in, c->w, c->B, c->C, c->OC);
}

static void bench_linear(int B, int C, int OC, int with_din) {
    lin_ctx c = {B,
                 C,
                 OC,
                 buf((size_t)B * C),
                 buf((size_t)OC * C),
                 buf(OC),
                 buf((size_t)B * OC),
                 buf((size_t)B * OC),
                 with_din ? buf((size_t)B * C) : NULL,
                 buf((size_t)OC * C),
                 buf(OC)};
    char name[64];
    double f = 2.0 * B * C * OC;
    snprintf(name, sizeof name, "linear %d->%d B=%d fwd", C, OC, B);
    report(name, time_it(lin_f, &c), f, 0);
    snprintf(name, sizeof name, "linear %d->%d B=%d bwd%s", C, OC, B, with_din ? "" : " (no din)");
    report(name, time_it(lin_b, &c), f * (with_din ? 2 : 1), 0);
    dt_free(c.in), dt_free(c.w), dt_free(c.b), dt_free(c.out), dt_free(c.dout), dt_free(c.din), dt_free(c.dw),
        dt_free(c.db);
}

/* ---- conv ---- */
typedef struct {
    int B, C, H, W, OC, K, S, P;
    float *in, *w, *b, *out, *dout, *din, *dw, *db, *work;
} conv_ctx;
static void conv_f(void *p) {
    conv_ctx *c = p;
    dt_conv2d_forward(c->out, c->in, c->w, c->b, c->work, c->B, c->C, c->H, c->W, c->OC, c->K, c->S, c->P);
}
static void conv_b(void *p) {
    conv_ctx *c = p;
    dt_conv2d_backward(c->din, c->dw, c->db, c->dout, c->in, c->w, c->work, c->B, c->C, c->H, c->W, c->OC, c->K, c->S,
                       c->P);
}

static void bench_conv(const char *tag, int B, int C, int H, int W, int OC, int K, int S, int P, int with_din) {
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    size_t nin = (size_t)B * C * H * W, nout = (size_t)B * OC * OH * OW;
    size_t ws = dt_conv2d_workspace(B, C, H, W, OC, K, S, P);
    conv_ctx c = {B,
                  C,
                  H,
                  W,
                  OC,
                  K,
                  S,
                  P,
                  buf(nin),
                  buf((size_t)OC * C * K * K),
                  buf(OC),
                  buf(nout),
                  buf(nout),
                  with_din ? buf(nin) : NULL,
                  buf((size_t)OC * C * K * K),
                  buf(OC),
                  buf(ws ? ws : 1)};
    double f = 2.0 * B * OC * OH * OW * C * K * K;
    char name[64];
    snprintf(name, sizeof name, "%s B=%d fwd", tag, B);
    report(name, time_it(conv_f, &c), f, 0);
    snprintf(name, sizeof name, "%s B=%d bwd%s", tag, B, with_din ? "" : " (no din)");
    report(name, time_it(conv_b, &c), f * (with_din ? 2 : 1), 0);
    dt_free(c.in), dt_free(c.w), dt_free(c.b), dt_free(c.out), dt_free(c.dout), dt_free(c.din), dt_free(c.dw),
        dt_free(c.db), dt_free(c.work);
}

/* ---- whole training steps through the kernels ---- */

/* torch-default init of consecutive (weight, bias) blocks so the numbers stay sane (no
 * overflow or denormals skewing the timings); sizes[i] floats with fan_in fans[i]. */
static void init_params(float *p, const size_t *sizes, const int *fans, int n) {
    for (int i = 0; i < n; i++) {
        dt_init_kaiming_uniform(p, sizes[i], fans[i], 1, (uint64_t)i);
        p += sizes[i];
    }
}
typedef struct {
    int B;
    float *x, *h, *hr, *logits, *probs, *dlogits, *dhr, *dh, *p, *g;
    int32_t *y;
} mlp_ctx;

static void sgd(float *restrict p, float *restrict g, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] -= 1e-3f * g[i], g[i] = 0.0f;
}

static void mlp_step(void *v) {
    mlp_ctx *c = v;
    const int B = c->B;
    float *w1 = c->p, *b1 = w1 + 128 * 784, *w2 = b1 + 128, *b2 = w2 + 10 * 128;
    float *gw1 = c->g, *gb1 = gw1 + 128 * 784, *gw2 = gb1 + 128, *gb2 = gw2 + 10 * 128;
    dt_linear_forward(c->h, c->x, w1, b1, B, 784, 128);
    dt_relu_forward(c->hr, c->h, (size_t)B * 128);
    dt_linear_forward(c->logits, c->hr, w2, b2, B, 128, 10);
    dt_softmax_xent_forward(c->probs, c->logits, c->y, B, 10);
    dt_softmax_xent_backward(c->dlogits, c->probs, c->y, B, 10, 1.0f);
    dt_linear_backward(c->dhr, gw2, gb2, c->dlogits, c->hr, w2, B, 128, 10);
    dt_relu_backward(c->dh, c->dhr, c->h, (size_t)B * 128);
    dt_linear_backward(NULL, gw1, gb1, c->dh, c->x, w1, B, 784, 128);
    sgd(c->p, c->g, 128 * 784 + 128 + 10 * 128 + 10);
}

static void bench_mlp(int B) {
    size_t np = 128 * 784 + 128 + 10 * 128 + 10;
    mlp_ctx c = {B,
                 buf((size_t)B * 784),
                 buf((size_t)B * 128),
                 buf((size_t)B * 128),
                 buf((size_t)B * 10),
                 buf((size_t)B * 10),
                 buf((size_t)B * 10),
                 buf((size_t)B * 128),
                 buf((size_t)B * 128),
                 buf(np),
                 buf(np),
                 malloc((size_t)B * sizeof(int32_t))};
    for (int i = 0; i < B; i++) c.y[i] = i % 10;
    const size_t sz[] = {128 * 784, 128, 1280, 10};
    const int fan[] = {784, 784, 128, 128};
    init_params(c.p, sz, fan, 4);
    memset(c.g, 0, np * sizeof(float));
    dt_rng_fill_uniform(c.x, (size_t)B * 784, 0, 1, 2, 3);
    char name[64];
    snprintf(name, sizeof name, "MLP 784-128-10 train step B=%d", B);
    double f = 2.0 * B * (784.0 * 128 * 2 + 128.0 * 10 * 3);
    report(name, time_it(mlp_step, &c), f, B);
    dt_free(c.x), dt_free(c.h), dt_free(c.hr), dt_free(c.logits), dt_free(c.probs), dt_free(c.dlogits), dt_free(c.dhr),
        dt_free(c.dh), dt_free(c.p), dt_free(c.g), free(c.y);
}

/* conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten linear(128) relu linear(10) */
typedef struct {
    int B;
    float *x, *a1, *r1, *p1, *a2, *r2, *p2, *h, *hr, *lo, *pr, *dlo, *dhr, *dh, *dp2, *dr2, *da2, *dp1, *dr1, *da1;
    float *p, *g, *work;
    int32_t *am1, *am2, *y;
} cnn_ctx;

/* The CNN's parameters (or gradients) as views into one flat vector, in init_params order. */
typedef struct {
    float *w1, *b1, *w2, *b2, *w3, *b3, *w4, *b4;
} cnn_views;

static cnn_views cnn_split(float *p) {
    cnn_views v = {.w1 = p};
    v.b1 = v.w1 + 32 * 9, v.w2 = v.b1 + 32, v.b2 = v.w2 + 64 * 32 * 9, v.w3 = v.b2 + 64;
    v.b3 = v.w3 + 128 * 3136, v.w4 = v.b3 + 128, v.b4 = v.w4 + 1280;
    return v;
}

/* The part both step variants share: flatten linear(128) relu linear(10), loss, and back to dp2. */
static void cnn_head(cnn_ctx *c, const cnn_views *w, const cnn_views *g) {
    const int B = c->B;
    dt_linear_forward(c->h, c->p2, w->w3, w->b3, B, 3136, 128);
    dt_relu_forward(c->hr, c->h, (size_t)B * 128);
    dt_linear_forward(c->lo, c->hr, w->w4, w->b4, B, 128, 10);
    dt_softmax_xent_forward(c->pr, c->lo, c->y, B, 10);
    dt_softmax_xent_backward(c->dlo, c->pr, c->y, B, 10, 1.0f);
    dt_linear_backward(c->dhr, g->w4, g->b4, c->dlo, c->hr, w->w4, B, 128, 10);
    dt_relu_backward(c->dh, c->dhr, c->h, (size_t)B * 128);
    dt_linear_backward(c->dp2, g->w3, g->b3, c->dh, c->p2, w->w3, B, 3136, 128);
}

static void cnn_step(void *v) {
    cnn_ctx *c = v;
    const int B = c->B;
    const cnn_views w = cnn_split(c->p), g = cnn_split(c->g);
    dt_conv2d_forward(c->a1, c->x, w.w1, w.b1, c->work, B, 1, 28, 28, 32, 3, 1, 1);
    dt_relu_forward(c->r1, c->a1, (size_t)B * 32 * 784);
    dt_maxpool2d_forward(c->p1, c->am1, c->r1, B, 32, 28, 28, 2, 2);
    dt_conv2d_forward(c->a2, c->p1, w.w2, w.b2, c->work, B, 32, 14, 14, 64, 3, 1, 1);
    dt_relu_forward(c->r2, c->a2, (size_t)B * 64 * 196);
    dt_maxpool2d_forward(c->p2, c->am2, c->r2, B, 64, 14, 14, 2, 2);
    cnn_head(c, &w, &g);
    dt_maxpool2d_backward(c->dr2, c->dp2, c->am2, B, 64, 14, 14, 2, 2);
    dt_relu_backward(c->da2, c->dr2, c->a2, (size_t)B * 64 * 196);
    dt_conv2d_backward(c->dp1, g.w2, g.b2, c->da2, c->p1, w.w2, c->work, B, 32, 14, 14, 64, 3, 1, 1);
    dt_maxpool2d_backward(c->dr1, c->dp1, c->am1, B, 32, 28, 28, 2, 2);
    dt_relu_backward(c->da1, c->dr1, c->a1, (size_t)B * 32 * 784);
    dt_conv2d_backward(NULL, g.w1, g.b1, c->da1, c->x, w.w1, c->work, B, 1, 28, 28, 32, 3, 1, 1);
    sgd(c->p, c->g, 421642);
}

/* The same network with each "relu maxpool(2)" pair run as maxpool then in-place relu: equal
 * outputs and gradients (relu is monotonic; where a window is all <= 0 both give 0 gradient),
 * 4x less elementwise traffic. Shows what a model-level reordering would buy. */
static void cnn_step_pool_first(void *v) {
    cnn_ctx *c = v;
    const int B = c->B;
    const cnn_views w = cnn_split(c->p), g = cnn_split(c->g);
    const size_t n1 = (size_t)B * 32 * 196, n2 = (size_t)B * 64 * 49;
    dt_conv2d_forward(c->a1, c->x, w.w1, w.b1, c->work, B, 1, 28, 28, 32, 3, 1, 1);
    dt_maxpool2d_forward(c->p1, c->am1, c->a1, B, 32, 28, 28, 2, 2);
    dt_relu_forward(c->p1, c->p1, n1);
    dt_conv2d_forward(c->a2, c->p1, w.w2, w.b2, c->work, B, 32, 14, 14, 64, 3, 1, 1);
    dt_maxpool2d_forward(c->p2, c->am2, c->a2, B, 64, 14, 14, 2, 2);
    dt_relu_forward(c->p2, c->p2, n2);
    cnn_head(c, &w, &g);
    dt_relu_backward(c->dp2, c->dp2, c->p2, n2); /* relu'(pooled output) */
    dt_maxpool2d_backward(c->da2, c->dp2, c->am2, B, 64, 14, 14, 2, 2);
    dt_conv2d_backward(c->dp1, g.w2, g.b2, c->da2, c->p1, w.w2, c->work, B, 32, 14, 14, 64, 3, 1, 1);
    dt_relu_backward(c->dp1, c->dp1, c->p1, n1);
    dt_maxpool2d_backward(c->da1, c->dp1, c->am1, B, 32, 28, 28, 2, 2);
    dt_conv2d_backward(NULL, g.w1, g.b1, c->da1, c->x, w.w1, c->work, B, 1, 28, 28, 32, 3, 1, 1);
    sgd(c->p, c->g, 421642);
}

static void bench_cnn(int B) {
    const size_t np = 32 * 9 + 32 + 64 * 288 + 64 + 128 * 3136 + 128 + 1280 + 10; /* 421642 */
    size_t s1 = (size_t)B * 32 * 784, s1p = (size_t)B * 32 * 196, s2 = (size_t)B * 64 * 196, s2p = (size_t)B * 3136;
    size_t ws = dt_conv2d_workspace(B, 32, 14, 14, 64, 3, 1, 1), ws1 = dt_conv2d_workspace(B, 1, 28, 28, 32, 3, 1, 1);
    cnn_ctx c = {B,
                 buf((size_t)B * 784),
                 buf(s1),
                 buf(s1),
                 buf(s1p),
                 buf(s2),
                 buf(s2),
                 buf(s2p),
                 buf((size_t)B * 128),
                 buf((size_t)B * 128),
                 buf((size_t)B * 10),
                 buf((size_t)B * 10),
                 buf((size_t)B * 10),
                 buf((size_t)B * 128),
                 buf((size_t)B * 128),
                 buf(s2p),
                 buf(s2),
                 buf(s2),
                 buf(s1p),
                 buf(s1),
                 buf(s1),
                 buf(np),
                 buf(np),
                 buf(ws > ws1 ? ws : ws1),
                 malloc(s1p * 4),
                 malloc(s2p * 4),
                 malloc((size_t)B * 4)};
    for (int i = 0; i < B; i++) c.y[i] = i % 10;
    const size_t sz[] = {32 * 9, 32, 64 * 288, 64, 128 * 3136, 128, 1280, 10};
    const int fan[] = {9, 9, 288, 288, 3136, 3136, 128, 128};
    init_params(c.p, sz, fan, 8);
    memset(c.g, 0, np * sizeof(float));
    dt_rng_fill_uniform(c.x, (size_t)B * 784, 0, 1, 2, 3);
    double f = 2.0 * B * (32.0 * 9 * 784 * 2 + 64.0 * 288 * 196 * 3 + 3136.0 * 128 * 3 + 1280.0 * 3);
    char name[64];
    snprintf(name, sizeof name, "CNN train step B=%d", B);
    report(name, time_it(cnn_step, &c), f, B);
    snprintf(name, sizeof name, "CNN train step B=%d, pool before relu", B);
    report(name, time_it(cnn_step_pool_first, &c), f, B);
    float **all = &c.x;
    for (int i = 0; i < 23; i++) dt_free(all[i]);
    free(c.am1), free(c.am2), free(c.y);
}

int main(int argc, char **argv) {
    if (argc > 1) g_min_time = atof(argv[1]);
    dt_set_threads(1);
    g_json[0] = '{', g_json_len = 1;
    printf("%-40s %12s  %15s\n", "case (1 thread)", "time/call", "rate");
    bench_linear(32, 784, 128, 0);
    bench_linear(32, 128, 10, 1);
    bench_linear(128, 784, 128, 0);
    bench_linear(128, 784, 128, 1);
    bench_linear(128, 128, 10, 1);
    bench_linear(128, 3136, 128, 1);
    bench_conv("conv1 1->32 28x28 K3 p1", 128, 1, 28, 28, 32, 3, 1, 1, 0);
    bench_conv("conv2 32->64 14x14 K3 p1", 128, 32, 14, 14, 64, 3, 1, 1, 1);
    bench_mlp(32);
    bench_mlp(128);
    bench_cnn(128);
    printf("%s}\n", g_json);
    return 0;
}
