/* The GELU kernels (backend/gelu.h), every copy this CPU runs (portable libm, AVX2, AVX-512),
 * against GELU in double (erf from libm): forward x Phi(x) and backward dout (Phi(x) + x phi(x))
 * on a dense grid over [-12, 12], around the erf polynomial's switch at |x| / sqrt(2) = 0.9277,
 * at 0, +-1e-30 and +-1e4, with a length that is not a whole number of vectors (the tail);
 * in-place forward; two runs bitwise equal; the bf16-out forward and backward bitwise equal to the
 * f32 ones rounded by dt_cast_bf16 (with NaN, infinities, denormals and ties among the inputs and
 * the douts), and the bf16-in ones to those on the widened values. From
 * x = 0.25 up (no cancellation) the forward is within 2.5 units of 2^-23 relative. Elsewhere the
 * tolerance: 3e-7 x max(1, |x|) absolute, times max(1, |dout|) backward (the float formula's own
 * cancellation where Phi is near 0 bounds what any copy can do). */
#include "backend/backend.h"
#include "backend/gelu.h"
#include "core/test.h"
#include "dtrain/core.h"

#include <string.h>

static double gelu_ref(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_grad_ref(double x) {
    return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

static void check_isa(dt_isa isa, const float *x, const float *g, size_t n) {
    float *y = malloc(n * 4), *y2 = malloc(n * 4), *d = malloc(n * 4), *d2 = malloc(n * 4);
    dt_gelu_forward_isa(isa, y, x, n);
    dt_gelu_backward_isa(isa, d, g, x, n);
    double wf = 0, wb = 0, wr = 0;
    size_t bf = 0, bb = 0, br = 0;
    for (size_t i = 0; i < n; i++) {
        const double xi = x[i], tol = 3e-7 * (fabs(xi) > 1 ? fabs(xi) : 1);
        const double ef = fabs(y[i] - gelu_ref(xi)) / tol;
        const double eb = fabs(d[i] - g[i] * gelu_grad_ref(xi)) / (tol * (fabs(g[i]) > 1 ? fabs(g[i]) : 1));
        if (!(ef <= wf)) wf = ef, bf = i;
        if (xi >= 0.25 && xi < 1e3) { /* no cancellation: relative error in units of 2^-23 */
            const double er = fabs(y[i] - gelu_ref(xi)) / (gelu_ref(xi) * 0x1p-23);
            if (!(er <= wr)) wr = er, br = i;
        }
        if (!(eb <= wb)) wb = eb, bb = i;
    }
    CHECK_MSG(wf <= 1, "%s: gelu(%.9g) = %.9g, want %.9g", dt_isa_name(isa), x[bf], y[bf], gelu_ref(x[bf]));
    CHECK_MSG(wr <= 2.5, "%s: gelu(%.9g) = %.9g, want %.9g (%.2f units of 2^-23)", dt_isa_name(isa), x[br], y[br],
              gelu_ref(x[br]), wr);
    CHECK_MSG(wb <= 1, "%s: gelu'(%.9g) dout = %.9g, want %.9g", dt_isa_name(isa), x[bb], d[bb],
              g[bb] * gelu_grad_ref(x[bb]));
    memcpy(y2, x, n * 4);
    dt_gelu_forward_isa(isa, y2, y2, n);
    dt_gelu_backward_isa(isa, d2, g, x, n);
    CHECK_MSG(!memcmp(y, y2, n * 4) && !memcmp(d, d2, n * 4), "%s: in place or a second run differs", dt_isa_name(isa));
    printf("gelu %s: forward within %.2f (%.2f units of 2^-23 from x = 0.25), backward within %.2f of the tolerance\n",
           dt_isa_name(isa), wf, wr, wb);
    free(y), free(y2), free(d), free(d2);
}

/* The f32 GELU of x (g NULL) or its backward for dout g, and the same rounded to bf16 in the pass. */
static void gelu_f32(dt_isa isa, float *y, const float *x, const float *g, size_t n) {
    if (g) dt_gelu_backward_isa(isa, y, g, x, n);
    else dt_gelu_forward_isa(isa, y, x, n);
}
static void gelu_bf16(dt_isa isa, uint16_t *y, const float *x, const float *g, size_t n) {
    if (g) dt_gelu_backward_bf16_isa(isa, y, g, x, n);
    else dt_gelu_forward_bf16_isa(isa, y, x, n);
}

/* dt_gelu_forward_bf16_isa == dt_gelu_forward_isa then dt_cast_bf16, bit for bit, at every
 * length from 0 to 40 (the vector tails) and on the whole of x; with dout g, the same for
 * dt_gelu_backward_bf16_isa and dt_gelu_backward_isa. */
static void check_bf16_isa(dt_isa isa, const float *x, const float *g, size_t n) {
    const char *what = g ? "gelu backward" : "gelu";
    float *y = malloc(n * 4);
    uint16_t *want = malloc(n * 2), *got = malloc(n * 2 + 2);
    gelu_f32(isa, y, x, g, n);
    dt_cast_bf16(want, y, n);
    size_t bad = n;
    uint16_t seen = 0; /* the wrong value found */
    for (size_t len = 0; len <= 40 && len <= n; len++) {
        memset(got, 0xa5, n * 2 + 2);
        gelu_bf16(isa, got, x, g, len);
        for (size_t i = 0; i < len && bad == n; i++)
            if (got[i] != want[i]) bad = i, seen = got[i];
        CHECK_MSG(got[len] == 0xa5a5, "%s: bf16 %s of %zu values wrote past them", dt_isa_name(isa), what, len);
    }
    gelu_bf16(isa, got, x, g, n);
    for (size_t i = 0; i < n && bad == n; i++)
        if (got[i] != want[i]) bad = i, seen = got[i];
#if DT_ISA_X86
    /* the integer rounding of the vector copies (what runs without AVX512-BF16) against
     * dt_round_bf16's portable one, on this CPU too */
    if ((isa == DT_ISA_AVX512 || isa == DT_ISA_AVX2) && bad == n) {
        dt_round_bf16(y, y, n);
        if (g) (isa == DT_ISA_AVX512 ? dt_gelu_backward_bf16_avx512 : dt_gelu_backward_bf16_avx2)(got, g, x, n);
        else (isa == DT_ISA_AVX512 ? dt_gelu_forward_bf16_avx512 : dt_gelu_forward_bf16_avx2)(got, x, n);
        for (size_t i = 0; i < n && bad == n; i++) {
            uint32_t b;
            memcpy(&b, &y[i], 4);
            if (got[i] != b >> 16) bad = i, seen = got[i], want[i] = (uint16_t)(b >> 16);
        }
    }
#endif
    CHECK_MSG(bad == n, "%s: bf16 %s(%.9g, dout %.9g) = 0x%04x, want 0x%04x (f32 then dt_cast_bf16)", dt_isa_name(isa),
              what, bad < n ? x[bad] : 0.0f, bad < n && g ? g[bad] : 0.0f, seen, bad < n ? want[bad] : 0);
    free(y), free(want), free(got);
}

/* dt_gelu_forward_bf16io_isa on bf16 x (g NULL), or dt_gelu_backward_bf16io_isa with bf16 dout
 * g, == the bf16-out kernels on the widened values, bit for bit, at every length from 0 to 40 and
 * on the whole of x (x and g rounded to bf16 first). */
static void check_bf16io_isa(dt_isa isa, const float *x, const float *g, size_t n) {
    const char *what = g ? "gelu backward" : "gelu";
    uint16_t *x16 = malloc(n * 2), *g16 = malloc(n * 2), *want = malloc(n * 2), *got = malloc(n * 2 + 2);
    float *xw = malloc(n * 4), *gw = malloc(n * 4);
    dt_cast_bf16(x16, x, n), dt_widen_bf16(xw, x16, n);
    if (g) dt_cast_bf16(g16, g, n), dt_widen_bf16(gw, g16, n);
    gelu_bf16(isa, want, xw, g ? gw : NULL, n);
    size_t bad = n;
    uint16_t seen = 0; /* the wrong value found */
    for (size_t len = 0; len <= n; len = len < 40 ? len + 1 : (len < n ? n : n + 1)) {
        memset(got, 0xa5, n * 2 + 2);
        if (g) dt_gelu_backward_bf16io_isa(isa, got, g16, x16, len);
        else dt_gelu_forward_bf16io_isa(isa, got, x16, len);
        for (size_t i = 0; i < len && bad == n; i++)
            if (got[i] != want[i]) bad = i, seen = got[i];
        CHECK_MSG(got[len] == 0xa5a5, "%s: bf16-in %s of %zu values wrote past them", dt_isa_name(isa), what, len);
    }
    CHECK_MSG(bad == n, "%s: bf16-in %s(%.9g, dout %.9g) = 0x%04x, want 0x%04x (widened, then the bf16-out kernel)",
              dt_isa_name(isa), what, bad < n ? xw[bad] : 0.0f, bad < n && g ? gw[bad] : 0.0f, seen,
              bad < n ? want[bad] : 0);
    free(x16), free(g16), free(want), free(got), free(xw), free(gw);
}

/* dt_gelu_forward_bf16io_grad_isa's values == dt_gelu_forward_bf16io_isa's and its dydx ==
 * dt_gelu_backward_bf16io_isa's din for dout 1, bit for bit; dt_gelu_backward_bf16io_from_grad_isa
 * == widened dout times widened dydx, rounded by dt_cast_bf16; at every length from 0 to 40 and on
 * the whole of x, nothing written past the end. g: the douts. */
static void check_keep_grad_isa(dt_isa isa, const float *x, const float *g, size_t n) {
    uint16_t *x16 = malloc(n * 2), *g16 = malloc(n * 2), *one = malloc(n * 2), *wy = malloc(n * 2), *wd = malloc(n * 2),
             *wb = malloc(n * 2), *y = malloc(n * 2 + 2), *d = malloc(n * 2 + 2), *b = malloc(n * 2 + 2);
    float *p = malloc(n * 4), *q = malloc(n * 4);
    dt_cast_bf16(x16, x, n), dt_cast_bf16(g16, g, n);
    for (size_t i = 0; i < n; i++) one[i] = 0x3f80; /* 1.0 */
    dt_gelu_forward_bf16io_isa(isa, wy, x16, n);
    dt_gelu_backward_bf16io_isa(isa, wd, one, x16, n);
    dt_widen_bf16(p, g16, n), dt_widen_bf16(q, wd, n);
    for (size_t i = 0; i < n; i++) p[i] *= q[i];
    dt_cast_bf16(wb, p, n);
    size_t bad = n;
    const char *what = "";
    for (size_t len = 0; len <= n; len = len < 40 ? len + 1 : (len < n ? n : n + 1)) {
        memset(y, 0xa5, n * 2 + 2), memset(d, 0xa5, n * 2 + 2), memset(b, 0xa5, n * 2 + 2);
        dt_gelu_forward_bf16io_grad_isa(isa, y, d, x16, len);
        dt_gelu_backward_bf16io_from_grad_isa(isa, b, g16, wd, len);
        for (size_t i = 0; i < len && bad == n; i++)
            if (y[i] != wy[i] || d[i] != wd[i] || b[i] != wb[i])
                bad = i, what = y[i] != wy[i] ? "value" : d[i] != wd[i] ? "derivative" : "backward from it";
        CHECK_MSG(y[len] == 0xa5a5 && d[len] == 0xa5a5 && b[len] == 0xa5a5,
                  "%s: gelu keeping its derivative, %zu values: wrote past them", dt_isa_name(isa), len);
    }
    CHECK_MSG(bad == n, "%s: gelu keeping its derivative: the %s at x = %.9g, dout %.9g differs", dt_isa_name(isa),
              what, bad < n ? x[bad] : 0.0f, bad < n ? g[bad] : 0.0f);
    free(x16), free(g16), free(one), free(wy), free(wd), free(wb), free(y), free(d), free(b), free(p), free(q);
}

int main(void) {
    const float special[] = {0.0f,    -0.0f,    1e-30f,  -1e-30f,  1e4f,     -1e4f,
                             1.3119f, -1.3119f, 1.3120f, -1.3120f, 1.31201f, -1.31201f};
    const size_t ns = sizeof special / sizeof special[0], ngrid = 240001, n = ns + ngrid + 7;
    float *x = malloc(n * 4), *g = malloc(n * 4);
    memcpy(x, special, sizeof special);
    for (size_t i = 0; i < ngrid; i++) x[ns + i] = -12.0f + 24.0f * (float)i / (float)(ngrid - 1);
    for (size_t i = ns + ngrid; i < n; i++) x[i] = 0.5f * (float)(i - ns - ngrid) - 1.5f;
    dt_rng_fill_uniform(g, n, -2, 2, 9, 1);
    /* values whose bf16 rounding is delicate: NaN (quiet and signalling), infinities, denormal
     * inputs and outputs, and GELUs near a rounding tie */
    float odd[48];
    const uint32_t bits[] = {0x7fc00000u, 0x7f800001u, 0xff800000u, 0x7f800000u, 0x00000001u, 0x80400000u,
                             0x00800000u, 0x80800000u, 0x3f808000u, 0x3f818000u, 0xbf808000u, 0x40000000u};
    for (size_t i = 0; i < 48; i++) {
        uint32_t b = bits[i % 12] + (uint32_t)(i / 12);
        memcpy(&odd[i], &b, 4);
    }
    int ran = 0;
    for (int k = 0; k < DT_ISA_COUNT; k++) {
        if (!dt_isa_supported((dt_isa)k)) {
            printf("gelu %s: not on this CPU, skipped\n", dt_isa_name((dt_isa)k));
            continue;
        }
        ran++;
        check_isa((dt_isa)k, x, g, n);
        check_isa((dt_isa)k, x + 3, g + 3, 13); /* shorter than one vector */
        check_bf16_isa((dt_isa)k, x, NULL, n);
        check_bf16_isa((dt_isa)k, odd, NULL, sizeof odd / sizeof odd[0]);
        check_bf16_isa((dt_isa)k, x, g, n);
        check_bf16_isa((dt_isa)k, odd, g, sizeof odd / sizeof odd[0]);
        check_bf16_isa((dt_isa)k, g, odd, sizeof odd / sizeof odd[0]); /* the odd values as dout */
        check_bf16io_isa((dt_isa)k, x, NULL, n);
        check_bf16io_isa((dt_isa)k, x, g, n);
        check_bf16io_isa((dt_isa)k, odd, g, sizeof odd / sizeof odd[0]);
        check_bf16io_isa((dt_isa)k, g, odd, sizeof odd / sizeof odd[0]);
        check_keep_grad_isa((dt_isa)k, x, g, n);
        check_keep_grad_isa((dt_isa)k, odd, g, sizeof odd / sizeof odd[0]);
        check_keep_grad_isa((dt_isa)k, g, odd, sizeof odd / sizeof odd[0]);
    }
    CHECK(ran >= 1);
    free(x), free(g);
    return dt_test_summary("gelu_test");
}
