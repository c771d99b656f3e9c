/* The causal attention kernels (backend/attention.h) against a naive double-precision attention
 * written from the definition, forward (out, the kept probabilities) and backward (dq, dk, dv),
 * for every kind this CPU runs (OpenBLAS, AVX2, AVX-512) at odd shapes: T = 1, 5, 17, 33, 64,
 * 70; head sizes 4, 16, 32, 40, 48; several batches and heads. Outputs and workspace start as NaN
 * (a value the kernel forgets to write, or reads before writing, shows), a guard past the
 * workspace must stay untouched (dt_attention_workspace is large enough), probabilities above the
 * diagonal must be exactly zero, and two runs must be bitwise equal. The naive backward itself is
 * checked by central differences of its forward. */
#include "backend/attention.h"
#include "core/test.h"
#include "dtrain/core.h"
#include "backend/layers.h"

#include <string.h>

#define GUARD 64

/* out (B,T,C), P (B,NH,T,T) from qkv (B,T,3C), in double. */
static void naive_forward(double *out, double *P, const double *qkv, int B, int T, int C, int NH) {
    const int hs = C / NH, ld = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * ld + h * hs;
                double *p = P + (((size_t)b * NH + h) * T + t) * T, mx = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * ld + C + h * hs;
                    double s = 0;
                    for (int d = 0; d < hs; d++) s += q[d] * k[d];
                    p[j] = j <= t ? s * scale : -INFINITY;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j < T; j++) sum += p[j] = j <= t ? exp(p[j] - mx) : 0.0;
                for (int j = 0; j < T; j++) p[j] /= sum;
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int d = 0; d < hs; d++) {
                    double s = 0;
                    for (int j = 0; j <= t; j++) s += p[j] * qkv[((size_t)b * T + j) * ld + 2 * C + h * hs + d];
                    o[d] = s;
                }
            }
}

/* dqkv (B,T,3C) from dout (B,T,C), given qkv and the P of naive_forward. */
static void naive_backward(double *dqkv, const double *dout, const double *qkv, const double *P, int B, int T, int C,
                           int NH) {
    const int hs = C / NH, ld = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    double *dS = malloc((size_t)T * T * sizeof *dS);
    memset(dqkv, 0, (size_t)B * T * ld * sizeof *dqkv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const double *p = P + ((size_t)b * NH + h) * T * T;
#define Q(t, d) qkv[((size_t)b * T + (t)) * ld + h * hs + (d)]
#define K(t, d) qkv[((size_t)b * T + (t)) * ld + C + h * hs + (d)]
#define V(t, d) qkv[((size_t)b * T + (t)) * ld + 2 * C + h * hs + (d)]
#define DO(t, d) dout[((size_t)b * T + (t)) * C + h * hs + (d)]
#define DQKV(t, part, d) dqkv[((size_t)b * T + (t)) * ld + (part)*C + h * hs + (d)]
            for (int t = 0; t < T; t++) {
                double dot = 0;
                for (int j = 0; j <= t; j++) {
                    double dp = 0;
                    for (int d = 0; d < hs; d++) dp += DO(t, d) * V(j, d);
                    dS[(size_t)t * T + j] = dp;
                    dot += p[(size_t)t * T + j] * dp;
                }
                for (int j = 0; j <= t; j++)
                    dS[(size_t)t * T + j] = p[(size_t)t * T + j] * (dS[(size_t)t * T + j] - dot);
            }
            for (int t = 0; t < T; t++)
                for (int j = 0; j <= t; j++)
                    for (int d = 0; d < hs; d++) {
                        DQKV(t, 0, d) += scale * dS[(size_t)t * T + j] * K(j, d);
                        DQKV(j, 1, d) += scale * dS[(size_t)t * T + j] * Q(t, d);
                        DQKV(j, 2, d) += p[(size_t)t * T + j] * DO(t, d);
                    }
#undef Q
#undef K
#undef V
#undef DO
#undef DQKV
        }
    free(dS);
}

/* max |a - b| / max |b| */
static double rel(const float *a, const double *b, size_t n) {
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        m = fabs(b[i]) > m ? fabs(b[i]) : m;
        const double e = fabs((double)a[i] - b[i]);
        d = e > d || e != e ? (e != e ? INFINITY : e) : d;
    }
    return d / (m > 0 ? m : 1);
}

static void fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

/* Central differences of sum(out * g) through naive_forward against naive_backward, a few entries. */
static void check_naive_gradient(void) {
    const int B = 2, T = 5, C = 12, NH = 3, n = B * T * 3 * C;
    double *x = malloc(n * sizeof *x), *g = malloc(B * T * C * sizeof *g), *out = malloc(B * T * C * sizeof *out);
    double *P = malloc((size_t)B * NH * T * T * sizeof *P), *dx = malloc(n * sizeof *dx);
    float *tmp = malloc(n * sizeof *tmp);
    dt_rng_fill_uniform(tmp, n, -1.5f, 1.5f, 3, 1);
    for (int i = 0; i < n; i++) x[i] = tmp[i];
    dt_rng_fill_uniform(tmp, B * T * C, -1, 1, 3, 2);
    for (int i = 0; i < B * T * C; i++) g[i] = tmp[i];
    naive_forward(out, P, x, B, T, C, NH);
    naive_backward(dx, g, x, P, B, T, C, NH);
    double worst = 0;
    for (int i = 0; i < n; i += 7) {
        const double h = 1e-6, x0 = x[i];
        double lp = 0, lm = 0;
        x[i] = x0 + h, naive_forward(out, P, x, B, T, C, NH);
        for (int j = 0; j < B * T * C; j++) lp += out[j] * g[j];
        x[i] = x0 - h, naive_forward(out, P, x, B, T, C, NH);
        for (int j = 0; j < B * T * C; j++) lm += out[j] * g[j];
        x[i] = x0;
        const double fd = (lp - lm) / (2 * h), e = fabs(fd - dx[i]);
        worst = e > worst ? e : worst;
    }
    CHECK_MSG(worst < 1e-7, "naive attention backward against central differences: max error %.3g", worst);
    free(x), free(g), free(out), free(P), free(dx), free(tmp);
}

static void check_shape(dt_isa kind, int B, int T, int C, int NH) {
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, np = (size_t)B * NH * T * T;
    const size_t nw = dt_attention_workspace(T, C, NH);
    float *qkv = malloc(nq * 4), *dout = malloc(no * 4), *out = malloc(no * 4), *att = malloc(np * 4);
    float *dqkv = malloc(nq * 4), *work = malloc((nw + GUARD) * 4), *out2 = malloc(no * 4), *att2 = malloc(np * 4);
    float *dqkv2 = malloc(nq * 4);
    double *xd = malloc(nq * 8), *gd = malloc(no * 8), *od = malloc(no * 8), *Pd = malloc(np * 8),
           *dxd = malloc(nq * 8);
    dt_rng_fill_uniform(qkv, nq, -2, 2, 5, (uint64_t)T * 1000 + C);
    dt_rng_fill_uniform(dout, no, -1, 1, 6, (uint64_t)T * 1000 + C);
    for (size_t i = 0; i < nq; i++) xd[i] = qkv[i];
    for (size_t i = 0; i < no; i++) gd[i] = dout[i];
    naive_forward(od, Pd, xd, B, T, C, NH);
    naive_backward(dxd, gd, xd, Pd, B, T, C, NH);

    for (int run = 0; run < 2; run++) {
        float *o = run ? out2 : out, *a = run ? att2 : att, *dx = run ? dqkv2 : dqkv;
        fill_nan(o, no), fill_nan(a, np), fill_nan(dx, nq), fill_nan(work, nw);
        for (int i = 0; i < GUARD; i++) work[nw + i] = 12345.0f;
        dt_att_forward(kind, o, a, work, qkv, B, T, C, NH);
        fill_nan(work, nw);
        dt_att_backward(kind, dx, work, dout, qkv, a, B, T, C, NH);
        int guard_ok = 1;
        for (int i = 0; i < GUARD; i++) guard_ok &= work[nw + i] == 12345.0f;
        CHECK_MSG(guard_ok, "%s B=%d T=%d C=%d NH=%d: wrote past dt_attention_workspace (%zu floats)",
                  dt_isa_name(kind), B, T, C, NH, nw);
    }
    const double eo = rel(out, od, no), ep = rel(att, Pd, np), ed = rel(dqkv, dxd, nq);
    size_t above = 0;
    for (size_t bh = 0; bh < (size_t)B * NH; bh++)
        for (int t = 0; t < T; t++)
            for (int j = t + 1; j < T; j++) above += att[(bh * T + t) * T + j] != 0.0f;
    const char *nm = dt_isa_name(kind);
    CHECK_MSG(eo < 2e-5, "%s B=%d T=%d C=%d NH=%d: out off by %.3g (relative)", nm, B, T, C, NH, eo);
    CHECK_MSG(ep < 2e-5, "%s B=%d T=%d C=%d NH=%d: probabilities off by %.3g", nm, B, T, C, NH, ep);
    CHECK_MSG(ed < 5e-5, "%s B=%d T=%d C=%d NH=%d: dqkv off by %.3g (relative)", nm, B, T, C, NH, ed);
    CHECK_MSG(above == 0, "%s B=%d T=%d C=%d NH=%d: %zu probabilities above the diagonal are not 0", nm, B, T, C, NH,
              above);
    CHECK_MSG(!memcmp(out, out2, no * 4) && !memcmp(att, att2, np * 4) && !memcmp(dqkv, dqkv2, nq * 4),
              "%s B=%d T=%d C=%d NH=%d: two runs differ", nm, B, T, C, NH);
    free(qkv), free(dout), free(out), free(att), free(dqkv), free(work), free(out2), free(att2), free(dqkv2);
    free(xd), free(gd), free(od), free(Pd), free(dxd);
}

int main(void) {
    check_naive_gradient();
    /* B, T, C, NH: head sizes 4, 16, 32, 40, 48; T not a multiple of 4, 8 or 16 */
    static const int shapes[][4] = {{2, 5, 8, 2},    {1, 1, 32, 2},  {1, 17, 48, 3},  {3, 33, 64, 2},
                                    {2, 64, 128, 4}, {1, 70, 40, 1}, {2, 19, 144, 3}, {1, 16, 32, 1}};
    int ran = 0;
    for (int k = 0; k < DT_ISA_COUNT; k++) {
        if (!dt_isa_supported((dt_isa)k)) {
            printf("attention %s: not on this CPU, skipped\n", dt_isa_name((dt_isa)k));
            continue;
        }
        ran++;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_shape((dt_isa)k, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
        printf("attention %s: %zu shapes\n", dt_isa_name((dt_isa)k), sizeof shapes / sizeof shapes[0]);
    }
    CHECK(ran >= 1);
    printf("dt_attention_forward runs %s here (portable: OpenBLAS)\n", dt_isa_name(dt_isa_best()));
    return dt_test_summary("attention_test");
}
