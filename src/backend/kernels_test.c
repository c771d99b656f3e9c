/* Cross-module test: the layer kernels beyond gradients: conv2d against a direct 7-loop convolution
 * over many shapes (every im2col path), the initialisers' distributions (torch's defaults),
 * determinism of counter-based init/dropout (the in-kernel Philox equals core's), and edge cases (NaN in max pooling,
 * bad labels, dropout p = 0 / 1, empty shapes). */
#include "core/test.h"
#include "dtrain/core.h"
#include "backend/layers.h"

#include <string.h>

static float *rnd(size_t n, uint64_t key) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    dt_rng_fill_uniform(x, n, -1, 1, 77, key);
    return x;
}

/* ---- conv2d vs direct loops --------------------------------------------------------------- */

static void direct_conv(double *out, const float *in, const float *w, const float *b, int B, int C, int H, int W,
                        int OC, int K, int S, int P) {
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OC; o++)
            for (int y = 0; y < OH; y++)
                for (int x = 0; x < OW; x++) {
                    double s = b ? b[o] : 0;
                    for (int c = 0; c < C; c++)
                        for (int ky = 0; ky < K; ky++)
                            for (int kx = 0; kx < K; kx++) {
                                int iy = y * S + ky - P, ix = x * S + kx - P;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                                s += (double)w[((o * C + c) * K + ky) * K + kx] * in[((n * C + c) * H + iy) * W + ix];
                            }
                    out[((n * OC + o) * OH + y) * OW + x] = s;
                }
}

static void test_conv_direct(void) {
    /* B C H W OC K S P */
    static const int cases[][8] = {
        {2, 3, 8, 8, 5, 3, 1, 1}, {1, 1, 28, 28, 4, 3, 1, 1}, {2, 4, 9, 7, 3, 3, 2, 1}, {1, 2, 5, 5, 2, 5, 1, 2},
        {1, 3, 6, 6, 2, 1, 1, 0}, {1, 3, 6, 6, 2, 1, 2, 0},   {1, 2, 7, 7, 3, 2, 2, 0}, {2, 2, 4, 6, 3, 3, 1, 0},
        {1, 1, 3, 3, 2, 7, 1, 3}, {1, 2, 10, 3, 2, 3, 3, 1},  {1, 1, 2, 2, 1, 3, 1, 2}, {3, 5, 6, 6, 7, 3, 1, 1},
    };
    double worst = 0;
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        const int *c = cases[t];
        int B = c[0], C = c[1], H = c[2], W = c[3], OC = c[4], K = c[5], S = c[6], P = c[7];
        int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
        size_t nout = (size_t)B * OC * OH * OW, ws = dt_conv2d_workspace(B, C, H, W, OC, K, S, P);
        float *in = rnd((size_t)B * C * H * W, t), *w = rnd((size_t)OC * C * K * K, 100 + t), *b = rnd(OC, 200 + t);
        float *out = malloc(nout * sizeof *out), *work = ws ? malloc(ws * sizeof *work) : NULL;
        double *want = malloc(nout * sizeof *want);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            dt_conv2d_forward(out, in, w, with_bias ? b : NULL, work, B, C, H, W, OC, K, S, P);
            direct_conv(want, in, w, with_bias ? b : NULL, B, C, H, W, OC, K, S, P);
            double d = 0;
            for (size_t i = 0; i < nout; i++) d = fmax(d, fabs(out[i] - want[i]));
            CHECK_MSG(d < 1e-5, "conv B=%d C=%d %dx%d OC=%d K=%d S=%d P=%d bias=%d: max diff %g", B, C, H, W, OC, K, S,
                      P, with_bias, d);
            worst = fmax(worst, d);
        }
        free(in), free(w), free(b), free(out), free(work), free(want);
    }
    printf("conv2d vs direct loops: %zu shapes, max diff %.2e\n", sizeof cases / sizeof *cases, worst);
}

/* ---- initialisation ----------------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Kolmogorov-Smirnov distance of x (sorted in place) from U(-bound, bound). */
static double ks_uniform(float *x, size_t n, double bound) {
    qsort(x, n, sizeof *x, cmp_float);
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        double cdf = (x[i] + bound) / (2 * bound);
        d = fmax(d, fmax(fabs(cdf - (double)i / n), fabs(cdf - (double)(i + 1) / n)));
    }
    return d;
}

static void moments(const float *x, size_t n, double *mean, double *var, double *lo, double *hi) {
    double s = 0, s2 = 0;
    *lo = INFINITY, *hi = -INFINITY;
    for (size_t i = 0; i < n; i++) s += x[i], *lo = fmin(*lo, x[i]), *hi = fmax(*hi, x[i]);
    *mean = s / n;
    for (size_t i = 0; i < n; i++) s2 += (x[i] - *mean) * (x[i] - *mean);
    *var = s2 / n;
}

static void test_init(void) {
    enum { N = 100352 }; /* 128 x 784, the MLP's first weight */
    float *w = malloc(N * sizeof *w), *w2 = malloc(N * sizeof *w2);
    double mean, var, lo, hi;
    /* torch Linear/Conv default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
    const int fan_in = 784;
    const double kb = 1 / sqrt(fan_in);
    dt_init_kaiming_uniform(w, N, fan_in, 5, dt_rng_key(DT_RNG_INIT, 0));
    moments(w, N, &mean, &var, &lo, &hi);
    printf("kaiming_uniform fan_in %d: mean %.2e var %.4e (want %.4e) range [%.5f, %.5f] bound %.5f\n", fan_in, mean,
           var, kb * kb / 3, lo, hi, kb);
    CHECK(lo >= -kb && hi < kb && hi > 0.99 * kb && lo < -0.99 * kb);
    CHECK(fabs(mean) < 0.01 * kb && fabs(var / (kb * kb / 3) - 1) < 0.02);
    /* determinism: same (seed, key) same values; element i does not depend on n */
    dt_init_kaiming_uniform(w2, 1000, fan_in, 5, dt_rng_key(DT_RNG_INIT, 0));
    CHECK(memcmp(w, w2, 1000 * sizeof *w) == 0);
    dt_init_kaiming_uniform(w2, N, fan_in, 5, dt_rng_key(DT_RNG_INIT, 1));
    CHECK(memcmp(w, w2, N * sizeof *w) != 0);
    double ks = ks_uniform(w, N, kb);
    printf("  KS distance from U(-b,b): %.4f (5%% critical value %.4f)\n", ks, 1.36 / sqrt(N));
    CHECK(ks < 1.63 / sqrt(N)); /* 1% level */

    /* He normal: N(0, 2/fan_in) */
    dt_init_kaiming_normal(w, N, fan_in, 5, 9);
    moments(w, N, &mean, &var, &lo, &hi);
    double k4 = 0;
    for (size_t i = 0; i < N; i++) k4 += pow(w[i] - mean, 4);
    k4 = k4 / N / (var * var);
    printf("kaiming_normal fan_in %d: mean %.2e var %.4e (want %.4e) kurtosis %.3f\n", fan_in, mean, var, 2.0 / fan_in,
           k4);
    CHECK(fabs(mean) < 0.01 * sqrt(2.0 / fan_in) && fabs(var / (2.0 / fan_in) - 1) < 0.02 && fabs(k4 - 3) < 0.1);

    /* Xavier uniform: U(-sqrt(6/(fan_in+fan_out)), +) */
    const double xb = sqrt(6.0 / (784 + 128));
    dt_init_xavier_uniform(w, N, 784, 128, 5, 11);
    moments(w, N, &mean, &var, &lo, &hi);
    printf("xavier_uniform 784x128: var %.4e (want %.4e) range [%.5f, %.5f] bound %.5f\n", var, xb * xb / 3, lo, hi,
           xb);
    CHECK(lo >= -xb && hi < xb && fabs(var / (xb * xb / 3) - 1) < 0.02);
    CHECK(ks_uniform(w, N, xb) < 1.63 / sqrt(N));
    free(w), free(w2);
}

/* ---- edge cases --------------------------------------------------------------------------- */

static void test_edges(void) {
    /* max pooling propagates NaN (as torch) and records where it came from */
    float x[16] = {1, 2, 3, 4, 5, NAN, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, y[4];
    int32_t am[4];
    dt_maxpool2d_forward(y, am, x, 1, 1, 4, 4, 2, 2);
    CHECK(isnan(y[0]) && am[0] == 5 && y[1] == 8 && am[1] == 7 && y[3] == 16 && am[3] == 15);
    /* ties keep the first maximum */
    float t[4] = {3, 3, 3, 3};
    dt_maxpool2d_forward(y, am, t, 1, 1, 2, 2, 2, 2);
    CHECK(am[0] == 0);
    /* a label outside [0,V) makes the loss NaN instead of reading out of bounds */
    float logits[6] = {1, 2, 3, 4, 5, 6}, probs[6], d[6];
    int32_t bad[2] = {1, 7};
    CHECK(isnan(dt_softmax_xent_forward(probs, logits, bad, 2, 3)));
    dt_softmax_xent_backward(d, probs, bad, 2, 3, 1.0f);
    CHECK(fabsf(d[3] + d[4] + d[5] - 0.5f) < 1e-6f); /* row 2: probs/B only, no one-hot */
    /* dropout p = 0 keeps everything, p = 1 drops everything (no NaN from 1/(1-p)) */
    float in[8] = {1, -2, 3, -4, 5, -6, 7, -8}, out[8], din[8];
    uint8_t mask[8];
    dt_dropout_forward(out, mask, in, 8, 0.0f, 1, 2);
    CHECK(memcmp(out, in, sizeof in) == 0 && mask[0] == 1 && mask[7] == 1);
    dt_dropout_forward(out, mask, in, 8, 1.0f, 1, 2);
    dt_dropout_backward(din, in, mask, 8, 1.0f);
    int zero = 1;
    for (int i = 0; i < 8; i++) zero &= out[i] == 0 && din[i] == 0 && mask[i] == 0;
    CHECK(zero);
    /* in-place dropout */
    float io[8];
    memcpy(io, in, sizeof in);
    dt_dropout_forward(io, mask, io, 8, 0.5f, 3, 4);
    dt_dropout_forward(out, mask, in, 8, 0.5f, 3, 4);
    CHECK(memcmp(io, out, sizeof io) == 0);
    /* sigmoid/tanh saturate without NaN or inf */
    float s[4] = {-1000, 1000, -90, 90}, so[4];
    dt_sigmoid_forward(so, s, 4);
    CHECK(so[0] == 0 && so[1] == 1 && isfinite(so[2]) && so[3] == 1);
    dt_tanh_forward(so, s, 4);
    CHECK(so[0] == -1 && so[1] == 1);
    /* batch of zero: no work, no crash */
    CHECK(dt_softmax_xent_forward(probs, logits, bad, 0, 3) == 0.0f);
    dt_linear_forward(out, in, in, NULL, 0, 2, 2);
    /* a linear layer without bias matches one with a zero bias */
    float w[6] = {1, 2, 3, 4, 5, 6}, zb[3] = {0, 0, 0}, o1[6], o2[6];
    dt_linear_forward(o1, in, w, NULL, 2, 2, 3);
    dt_linear_forward(o2, in, w, zb, 2, 2, 3);
    CHECK(memcmp(o1, o2, sizeof o1) == 0 && o1[0] == 1 * 1 + -2 * 2);
    /* din = NULL is a no-op for every parameter-free backward */
    float g4[4] = {1, 2, 3, 4};
    int32_t am4[1] = {0};
    dt_relu_backward(NULL, g4, g4, 4), dt_gelu_backward(NULL, g4, g4, 4), dt_tanh_backward(NULL, g4, g4, 4);
    dt_sigmoid_backward(NULL, g4, g4, 4), dt_dropout_backward(NULL, g4, mask, 4, 0.5f);
    dt_maxpool2d_backward(NULL, g4, am4, 1, 1, 2, 2, 2, 2), dt_avgpool2d_backward(NULL, g4, 1, 1, 2, 2, 2, 2);
    CHECK(g4[0] == 1 && g4[3] == 4);
    /* layernorm of a constant row: output = bias, no NaN */
    float cst[4] = {2, 2, 2, 2}, ln[4], mean, rstd, lw[4] = {1, 1, 1, 1}, lb[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    dt_layernorm_forward(ln, &mean, &rstd, cst, lw, lb, 1, 4, 1e-5f);
    CHECK(ln[0] == 0.5f && ln[3] == 0.5f && mean == 2.0f);
}

/* the vectorised in-kernel Philox must equal dt_rng_uniform bit for bit (any seed/key bits) */
static void test_dropout_stream(void) {
    enum { N = 20011 };
    float *x = rnd(N, 5), *y = malloc(N * sizeof *y);
    uint8_t *m = malloc(N);
    const uint64_t seeds[] = {0, 42, 0xFEDCBA9876543210ull}, keys[] = {0, dt_rng_key(DT_RNG_DROPOUT, 77), ~0ull};
    size_t bad = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            dt_dropout_forward(y, m, x, N, 0.37f, seeds[a], keys[b]);
            for (size_t i = 0; i < N; i++) bad += m[i] != (dt_rng_uniform(seeds[a], keys[b], i) >= 0.37f);
        }
    CHECK_MSG(bad == 0, "dropout mask differs from dt_rng_uniform(seed,key,i) >= p at %zu places", bad);
    free(x), free(y), free(m);
}

int main(void) {
    dt_set_threads(1);
    test_conv_direct();
    test_init();
    test_edges();
    test_dropout_stream();
    return dt_test_summary("kernels_test");
}
