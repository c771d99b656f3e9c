/* Cross-module test: the GEMM kernels of every backend (blas and onednn, each at fp32, bf16 and fp16) against naive
 * double-precision loops at odd shapes: linear forward, both backward GEMMs and the bias
 * gradient; conv forward, backward data and backward weights. The reference takes the inputs
 * rounded to the backend's precision (bf16/fp16 products are exact in f32), so the only
 * difference allowed is f32 accumulation order: |got - want| <= 3e-5 * sum |terms| + 1e-30,
 * for every precision. Also: OpenBLAS's core choice on faked core names, the rounding helpers
 * against core's scalar conversions, the oneDNN primitive cache (a short last batch costs one
 * creation, not one per step), bitwise repeatability, and DT_ENOTSUP without oneDNN. */
#include "backend/backend.h"
#include "core/test.h"
#include "dtrain/core.h"

#include <pthread.h>
#include <string.h>

static float *rnd(size_t n, uint64_t key) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    dt_rng_fill_uniform(x, n, -1, 1, 99, key);
    return x;
}

/* x rounded to p (a copy). */
static float *at(const float *x, size_t n, dt_dtype p) {
    float *y = malloc((n ? n : 1) * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = p == DT_BF16  ? dt_bf16_to_f32(dt_f32_to_bf16(x[i]))
               : p == DT_F16 ? dt_f16_to_f32(dt_f32_to_f16(x[i]))
                             : x[i];
    return y;
}

/* Table be's linear workspace for (B, C, OC), in a buffer of the calling thread (grown; a thread
 * that ends frees it with lwork_release). */
static _Thread_local float *lwork_buf;
static _Thread_local size_t lwork_cap;
static float *lwork(const dt_kernel_table *be, int B, int C, int OC) {
    const size_t n = dt_linear_workspace_of(be, B, C, OC) + 1;
    if (n > lwork_cap) free(lwork_buf), lwork_buf = malloc(n * sizeof *lwork_buf), lwork_cap = n;
    return lwork_buf;
}
static void lwork_release(void) {
    free(lwork_buf);
    lwork_buf = NULL, lwork_cap = 0;
}

static double worst; /* largest error / bound seen */

/* got vs want within 3e-5 * scale (the sum of |terms| of each output). */
static void check_close(const char *what, const dt_kernel_table *be, const float *got, const double *want,
                        const double *scale, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double bound = 3e-5 * scale[i] + 1e-30, e = fabs(got[i] - want[i]);
        if (!(e <= bound) && !bad++) first = i;
        if (e / bound > worst) worst = e / bound;
    }
    CHECK_MSG(bad == 0, "%s %s/%s: %zu of %zu values off (first [%zu] got %g want %g)", what, be->name,
              dt_dtype_name(be->precision), bad, n, first, bad ? got[first] : 0, bad ? want[first] : 0);
}

static void test_linear(const dt_kernel_table *be, int B, int C, int OC) {
    dt_dtype p = be->precision;
    float *in = rnd((size_t)B * C, 1), *w = rnd((size_t)OC * C, 2), *b = rnd(OC, 3), *dout = rnd((size_t)B * OC, 4);
    float *rin = at(in, (size_t)B * C, p), *rw = at(w, (size_t)OC * C, p), *rd = at(dout, (size_t)B * OC, p);
    float *out = malloc((size_t)B * OC * 4), *din = malloc((size_t)B * C * 4), *dw = rnd((size_t)OC * C, 5),
          *db = rnd(OC, 6);
    double *want = calloc((size_t)(B > C ? B : C) * (OC > C ? OC : C) + OC, 8),
           *sc = calloc((size_t)(B > C ? B : C) * (OC > C ? OC : C) + OC, 8);
    be->linear_forward(out, in, w, b, lwork(be, B, C, OC), B, C, OC);
    for (int i = 0; i < B; i++)
        for (int o = 0; o < OC; o++) {
            double s = b[o], a = fabs(b[o]);
            for (int k = 0; k < C; k++)
                s += (double)rin[i * C + k] * rw[o * C + k], a += fabs((double)rin[i * C + k] * rw[o * C + k]);
            want[i * OC + o] = s, sc[i * OC + o] = a;
        }
    check_close("linear forward", be, out, want, sc, (size_t)B * OC);
    be->linear_backward(din, dw, db, dout, in, w, lwork(be, B, C, OC), B, C, OC);
    float *dw0 = rnd((size_t)OC * C, 5), *db0 = rnd(OC, 6);
    for (int o = 0; o < OC; o++)
        for (int k = 0; k < C; k++) { /* dw accumulates onto its old value */
            double s = dw0[o * C + k], a = fabs(dw0[o * C + k]);
            for (int i = 0; i < B; i++)
                s += (double)rd[i * OC + o] * rin[i * C + k], a += fabs((double)rd[i * OC + o] * rin[i * C + k]);
            want[o * C + k] = s, sc[o * C + k] = a;
        }
    check_close("linear dw", be, dw, want, sc, (size_t)OC * C);
    for (int o = 0; o < OC; o++) { /* the bias gradient sums the f32 gradient */
        double s = db0[o], a = fabs(db0[o]);
        for (int i = 0; i < B; i++) s += dout[i * OC + o], a += fabs(dout[i * OC + o]);
        want[o] = s, sc[o] = a;
    }
    check_close("linear db", be, db, want, sc, (size_t)OC);
    for (int i = 0; i < B; i++)
        for (int k = 0; k < C; k++) {
            double s = 0, a = 0;
            for (int o = 0; o < OC; o++)
                s += (double)rd[i * OC + o] * rw[o * C + k], a += fabs((double)rd[i * OC + o] * rw[o * C + k]);
            want[i * C + k] = s, sc[i * C + k] = a;
        }
    check_close("linear din", be, din, want, sc, (size_t)B * C);
    free(in), free(w), free(b), free(dout), free(rin), free(rw), free(rd), free(out), free(din), free(dw), free(db);
    free(dw0), free(db0), free(want), free(sc);
}

static void test_conv(const dt_kernel_table *be, const int *c) {
    const int B = c[0], C = c[1], H = c[2], W = c[3], OC = c[4], K = c[5], S = c[6], P = c[7];
    const int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    const size_t ni = (size_t)B * C * H * W, nw = (size_t)OC * C * K * K, no = (size_t)B * OC * OH * OW;
    dt_dtype p = be->precision;
    float *in = rnd(ni, 11), *w = rnd(nw, 12), *b = rnd(OC, 13), *dout = rnd(no, 14);
    float *rin = at(in, ni, p), *rw = at(w, nw, p), *rd = at(dout, no, p), *out = malloc(no * 4), *din = malloc(ni * 4);
    float *dw = calloc(nw, 4), *db = calloc(OC, 4);
    size_t ws = be->conv2d_workspace(B, C, H, W, OC, K, S, P);
    float *work = malloc((ws ? ws : 1) * 4);
    double *wo = calloc(no, 8), *so = calloc(no, 8), *wi = calloc(ni, 8), *si = calloc(ni, 8), *ww = calloc(nw, 8),
           *sw = calloc(nw, 8), *wb = calloc(OC, 8), *sb = calloc(OC, 8);
    be->conv2d_forward(out, in, w, b, work, B, C, H, W, OC, K, S, P);
    be->conv2d_backward(din, dw, db, dout, in, w, work, B, C, H, W, OC, K, S, P);
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OC; o++)
            for (int y = 0; y < OH; y++)
                for (int x = 0; x < OW; x++) {
                    size_t oi = (((size_t)n * OC + o) * OH + y) * OW + x;
                    wo[oi] += b[o], so[oi] += fabs(b[o]), wb[o] += dout[oi], sb[o] += fabs(dout[oi]);
                    for (int ch = 0; ch < C; ch++)
                        for (int ky = 0; ky < K; ky++)
                            for (int kx = 0; kx < K; kx++) {
                                int iy = y * S + ky - P, ix = x * S + kx - P;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                                size_t ii = (((size_t)n * C + ch) * H + iy) * W + ix,
                                       wi_ = (((size_t)o * C + ch) * K + ky) * K + kx;
                                double f = (double)rin[ii] * rw[wi_], g = (double)rd[oi] * rw[wi_],
                                       h = (double)rd[oi] * rin[ii];
                                wo[oi] += f, so[oi] += fabs(f), wi[ii] += g, si[ii] += fabs(g), ww[wi_] += h,
                                    sw[wi_] += fabs(h);
                            }
                }
    char what[96];
    snprintf(what, sizeof what, "conv B%d C%d %dx%d OC%d K%d S%d P%d", B, C, H, W, OC, K, S, P);
    check_close(what, be, out, wo, so, no);
    check_close(what, be, din, wi, si, ni);
    check_close(what, be, dw, ww, sw, nw);
    check_close(what, be, db, wb, sb, OC);
    free(in), free(w), free(b), free(dout), free(rin), free(rw), free(rd), free(out), free(din), free(dw), free(db);
    free(work), free(wo), free(so), free(wi), free(si), free(ww), free(sw), free(wb), free(sb);
}

static void test_backends(void) {
    static const int lin[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {3, 129, 31}, {64, 100, 10}, {5, 1, 9}};
    static const int conv[][8] = {{2, 3, 8, 8, 5, 3, 1, 1},
                                  {1, 1, 28, 28, 4, 3, 1, 1},
                                  {2, 4, 9, 7, 3, 3, 2, 1},
                                  {1, 2, 5, 5, 2, 5, 1, 2},
                                  {3, 5, 6, 6, 7, 1, 2, 0},
                                  {2, 6, 7, 5, 3, 2, 2, 0},
                                  /* 16+ input channels: oneDNN's own f32 kernel (fewer go to im2col) */
                                  {2, 17, 7, 9, 5, 3, 1, 1},
                                  {3, 32, 6, 6, 19, 3, 2, 1},
                                  {2, 16, 5, 5, 3, 1, 1, 0}};
    static const dt_dtype prec[3] = {DT_F32, DT_BF16, DT_F16};
    int tables = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) {
            const dt_kernel_table *be;
            if (dt_backend_find(k ? "onednn" : "blas", prec[i], &be) != DT_OK) continue;
            CHECK(be->precision == prec[i] && !strcmp(be->name, k ? "onednn" : "blas"));
            for (size_t t = 0; t < sizeof lin / sizeof *lin; t++) test_linear(be, lin[t][0], lin[t][1], lin[t][2]);
            for (size_t t = 0; t < sizeof conv / sizeof *conv; t++) test_conv(be, conv[t]);
            tables++;
        }
    CHECK(tables == (dt_onednn_built() ? 6 : 3));
    char impls[1024];
    dt_onednn_impls(impls, sizeof impls);
    printf("GEMMs of %d backend tables vs naive loops: worst error %.2f of its bound\noneDNN chose: %s\n", tables,
           worst, impls);
}

/* OpenBLAS's core choice on faked facts: only a generic Prescott core on a capable CPU, with
 * OPENBLAS_CORETYPE unset or empty, gets a better kernel set. */
static void test_blas_core(void) {
    const char *r;
    CHECK((r = dt_blas_coretype_for("Prescott", NULL, true, true)) && !strcmp(r, "SkylakeX"));
    CHECK((r = dt_blas_coretype_for("Prescott", "", true, false)) && !strcmp(r, "SkylakeX"));
    CHECK((r = dt_blas_coretype_for("Prescott", NULL, false, true)) && !strcmp(r, "Haswell"));
    CHECK(dt_blas_coretype_for("Prescott", NULL, false, false) == NULL);
    CHECK(dt_blas_coretype_for("Prescott", "Haswell", true, true) == NULL);
    CHECK(dt_blas_coretype_for("SkylakeX", NULL, true, true) == NULL);
    CHECK(dt_blas_coretype_for("Haswell", NULL, true, true) == NULL);
    CHECK(dt_blas_coretype_for(NULL, NULL, true, true) == NULL);
    /* OPENBLAS_CORETYPE=Haswell (or Zen) on an AVX-512 CPU leaves AVX-512 unused: worth a note. */
    CHECK(dt_blas_core_misses_avx512("Haswell", true) && dt_blas_core_misses_avx512("Zen", true));
    CHECK(dt_blas_core_misses_avx512("Prescott", true));
    CHECK(!dt_blas_core_misses_avx512("SkylakeX", true) && !dt_blas_core_misses_avx512("Cooperlake", true));
    CHECK(!dt_blas_core_misses_avx512("SapphireRapids", true));
    CHECK(!dt_blas_core_misses_avx512("Haswell", false) && !dt_blas_core_misses_avx512(NULL, true));
    const char *core = dt_blas_corename();
    CHECK(core && *core);
    printf("OpenBLAS core here: %s\n", core ? core : "?");
}

/* n values of x rounded by the vector helpers against core's scalar conversions (bitwise; NaN
 * as any NaN); the counts of differing values. */
static void rounding_misses(const float *x, float *y, float *z, size_t n, size_t *bad_b, size_t *bad_h) {
    dt_round_bf16(y, x, n);
    dt_round_f16(z, x, n);
    *bad_b = *bad_h = 0;
    for (size_t i = 0; i < n; i++) {
        float b = dt_bf16_to_f32(dt_f32_to_bf16(x[i])), h = dt_f16_to_f32(dt_f32_to_f16(x[i]));
        *bad_b += !(memcmp(&b, &y[i], 4) == 0 || (isnan(b) && isnan(y[i])));
        *bad_h += !(memcmp(&h, &z[i], 4) == 0 || (isnan(h) && isnan(z[i])));
    }
}

/* The vector rounding helpers equal core's scalar conversions: specials, normal values, an odd
 * length (the vector loops' tails), and every 509th float bit pattern (8.4 million: each
 * exponent, fp16 subnormals, overflow, ties, both signs, NaNs). */
static void test_rounding(void) {
    enum { N = 4096 + 7 };
    static float x[N], y[N], z[N];
    dt_rng_fill_normal(x, N, 0, 1000, 5, 5);
    const float specials[] = {0.0f, -0.0f,   INFINITY, -INFINITY, NAN,         65504.0f,     65520.0f,
                              1e6f, 3.4e38f, 1e-8f,    6e-5f,     1.00390625f, 1.001953125f, -2.5e-41f};
    memcpy(x, specials, sizeof specials);
    size_t bad_b, bad_h;
    rounding_misses(x, y, z, N, &bad_b, &bad_h);
    CHECK_MSG(bad_b == 0, "dt_round_bf16 differs from dt_f32_to_bf16 at %zu values", bad_b);
    CHECK_MSG(bad_h == 0, "dt_round_f16 differs from dt_f32_to_f16 at %zu values", bad_h);
    CHECK(isinf(z[6]) && z[5] == 65504.0f); /* past the half range is inf: what loss scaling catches */
    enum { M = 1 << 16 };
    static float a[M], ya[M], za[M];
    size_t sweep_b = 0, sweep_h = 0;
    uint64_t bits = 0;
    while (bits < (1ull << 32)) {
        size_t m = 0;
        for (; m < M && bits < (1ull << 32); m++, bits += 509) {
            uint32_t u = (uint32_t)bits;
            memcpy(&a[m], &u, 4);
        }
        rounding_misses(a, ya, za, m, &bad_b, &bad_h);
        sweep_b += bad_b, sweep_h += bad_h;
    }
    CHECK_MSG(sweep_b == 0, "dt_round_bf16 differs from dt_f32_to_bf16 at %zu of the swept values", sweep_b);
    CHECK_MSG(sweep_h == 0, "dt_round_f16 differs from dt_f32_to_f16 at %zu of the swept values", sweep_h);
}

/* oneDNN: one primitive per op and shape; alternating a full and a short batch creates each once;
 * the same call twice gives the same bits. Without oneDNN: DT_ENOTSUP that says what to do. */
static void test_onednn_cache(void) {
    const dt_kernel_table *be;
    dt_status s = dt_backend_find("onednn", DT_F32, &be);
    if (!dt_onednn_built()) {
        CHECK(s == DT_ENOTSUP && strstr(dt_last_error(), "libdnnl-dev"));
        printf("built without oneDNN: %s\n", dt_last_error());
        return;
    }
    CHECK(s == DT_OK && dt_backend_default() == be);
    enum { C = 24, OC = 10, B = 32, SHORT = 7 };
    float *in = rnd(B * C, 1), *w = rnd(OC * C, 2), *out = malloc(B * OC * 4), *again = malloc(B * OC * 4);
    float *dout = rnd(B * OC, 3), *din = malloc(B * C * 4), *dw = calloc(OC * C, 4);
    size_t before = dt_onednn_cache_misses(), after_first = 0;
    for (int step = 0; step < 10; step++) {
        int n = step % 2 ? SHORT : B;
        be->linear_forward(out, in, w, NULL, lwork(be, n, C, OC), n, C, OC);
        be->linear_backward(din, dw, NULL, dout, in, w, lwork(be, n, C, OC), n, C, OC);
        if (step == 1) after_first = dt_onednn_cache_misses();
    }
    CHECK_MSG(after_first - before == 6, "first two steps created %zu primitives (want 3 per batch size)",
              after_first - before);
    CHECK_MSG(dt_onednn_cache_misses() == after_first, "%zu primitives re-created in later steps",
              dt_onednn_cache_misses() - after_first);
    be->linear_forward(out, in, w, NULL, lwork(be, B, C, OC), B, C, OC);
    be->linear_forward(again, in, w, NULL, lwork(be, B, C, OC), B, C, OC);
    CHECK(memcmp(out, again, B * OC * 4) == 0);
    /* --threads: a primitive is made for the thread count (oneDNN splits the work at creation);
     * going back finds the old one */
    size_t m0 = dt_onednn_cache_misses();
    dt_set_threads(2);
    be->linear_forward(again, in, w, NULL, lwork(be, B, C, OC), B, C, OC);
    CHECK_MSG(dt_onednn_cache_misses() == m0 + 1, "2 threads: %zu new primitives (want 1)",
              dt_onednn_cache_misses() - m0);
    CHECK(dt_test_maxdiff(out, again, B * OC) < 1e-5);
    dt_set_threads(1);
    be->linear_forward(again, in, w, NULL, lwork(be, B, C, OC), B, C, OC);
    CHECK(dt_onednn_cache_misses() == m0 + 1 && memcmp(out, again, B * OC * 4) == 0);
    /* conv: forward and backward per batch size, then none */
    enum { CC = 16, HW = 6, COC = 4, CB = 4 }; /* C >= 16: oneDNN's kernel also at f32 */
    float *ci = rnd(CB * CC * HW * HW, 7), *cw = rnd(COC * CC * 9, 8), *cb = rnd(COC, 9),
          *co = malloc(CB * COC * HW * HW * 4);
    float *cdo = rnd(CB * COC * HW * HW, 10), *cdi = malloc(CB * CC * HW * HW * 4), *cdw = calloc(COC * CC * 9, 4),
          *cdb = calloc(COC, 4);
    before = dt_onednn_cache_misses();
    for (int step = 0; step < 6; step++) {
        int n = step % 2 ? CB - 1 : CB;
        be->conv2d_forward(co, ci, cw, cb, NULL, n, CC, HW, HW, COC, 3, 1, 1);
        be->conv2d_backward(cdi, cdw, cdb, cdo, ci, cw, NULL, n, CC, HW, HW, COC, 3, 1, 1);
        if (step == 1) after_first = dt_onednn_cache_misses();
    }
    /* per batch size: the forward entry and one backward entry (data and weights together) */
    CHECK_MSG(after_first - before == 4 && dt_onednn_cache_misses() == after_first,
              "conv: %zu cache entries for two batch sizes, %zu more later (want 4, 0)", after_first - before,
              dt_onednn_cache_misses() - after_first);
    free(ci), free(cw), free(cb), free(co), free(cdo), free(cdi), free(cdw), free(cdb);
    char impls[512];
    dt_onednn_impls(impls, sizeof impls);
    CHECK(strstr(impls, "matmul(f32)") != NULL);
    printf("oneDNN chose: %s\n", impls);
    free(in), free(w), free(out), free(again), free(dout), free(din), free(dw);
}

/* A full cache evicts none of the entries that one op holds: a linear backward whose dw GEMM is
 * the oldest entry (a hit) and whose din GEMM is new (a miss that evicts) still computes dw with
 * the dw primitive. Runs on a fresh thread, so the cache starts empty. */
static void *cache_eviction_thread(void *arg) {
    const dt_kernel_table *be = arg;
    enum { B = 5, C = 7, OC = 3 };
    float *in = rnd(B * C, 21), *w = rnd(OC * C, 22), *dout = rnd(B * OC, 23), *din = malloc(B * C * 4);
    float *dw = calloc(OC * C, 4), *out = malloc(64 * 4), *x = rnd(64, 24);
    be->linear_backward(NULL, dw, NULL, dout, in, w, lwork(be, B, C, OC), B, C, OC); /* entry 1: the dw GEMM */
    for (int i = 1; i < dt_onednn_cache_capacity(); i++)
        be->linear_forward(out, x, x, NULL, lwork(be, 1, 1 + i % 8, 1 + i / 8), 1, 1 + i % 8, 1 + i / 8);
    memset(dw, 0, OC * C * 4);
    /* dw: a hit on the oldest; din: a miss */
    be->linear_backward(din, dw, NULL, dout, in, w, lwork(be, B, C, OC), B, C, OC);
    double err = 0;
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
            double want = 0;
            for (int b = 0; b < B; b++) want += (double)dout[b * OC + o] * in[b * C + c];
            double e = dw[o * C + c] - want;
            if (e < 0) e = -e;
            if (e > err) err = e;
        }
    CHECK_MSG(err < 1e-5, "full cache: dw off by %g after the din GEMM's primitive was created", err);
    free(in), free(w), free(dout), free(din), free(dw), free(out), free(x);
    lwork_release();
    return NULL;
}

static void test_cache_eviction(void) {
    const dt_kernel_table *be;
    if (dt_backend_find("onednn", DT_F32, &be) != DT_OK) return;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, cache_eviction_thread, (void *)be) == 0);
    pthread_join(t, NULL);
}

int main(void) {
    dt_set_threads(1);
    test_cache_eviction();
    test_blas_core();
    test_rounding();
    test_onednn_cache();
    test_backends();
    lwork_release();
    return dt_test_summary("gemm_test");
}
