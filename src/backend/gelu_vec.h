/* Template of the vector GELU (cpu_gelu_vec.c includes it once per width, after defining AV_VL,
 * AV_TARGET and AV_SUFFIX as for vecmath.h): dt_gelu_forward_<suffix>, dt_gelu_backward_<suffix>
 * and dt_gelu_forward_bf16_<suffix>, dt_gelu_backward_bf16_<suffix> (bf16 out),
 * dt_gelu_forward_bf16io_<suffix>, dt_gelu_backward_bf16io_<suffix> (bf16 in and out),
 * dt_gelu_forward_bf16io_grad_<suffix>, dt_gelu_backward_bf16io_from_grad_<suffix> (the same with
 * the derivative kept from forward to backward); with AV_BF16_NATIVE only the last six. */
#include "backend/vecmath.h"

/* erf(a), max error < 1 ulp: Norbert Juffa's erff (a polynomial in a^2 below |a| = 0.9277, and
 * 1 - exp(polynomial in |a|) above), both halves computed and one selected per lane. */
AV_FN vf AV(erf)(vf a) {
    const vi sign = (vi){0} + (int32_t)0x80000000;
    const vf t = (vf)((vi)a & ~sign), s = a * a;
    vf r = AV_FMA(AV_SET1(-1.72853470e-5f), t, AV_SET1(3.83197126e-4f));
    const vf u = AV_FMA(AV_SET1(-3.88396438e-3f), t, AV_SET1(2.42546219e-2f));
    r = AV_FMA(r, s, u);
    r = AV_FMA(r, t, AV_SET1(-1.06777877e-1f));
    r = AV_FMA(r, t, AV_SET1(-6.34846687e-1f));
    r = AV_FMA(r, t, AV_SET1(-1.28717512e-1f));
    r = AV_FMA(r, t, -t);
    r = AV_SET1(1.0f) - AV(exp)(r);
    r = (vf)(((vi)r & ~sign) | ((vi)a & sign));
    vf p = AV_SET1(-5.96761703e-4f);
    p = AV_FMA(p, s, AV_SET1(4.99119423e-3f));
    p = AV_FMA(p, s, AV_SET1(-2.67681349e-2f));
    p = AV_FMA(p, s, AV_SET1(1.12819925e-1f));
    p = AV_FMA(p, s, AV_SET1(-3.76125336e-1f));
    p = AV_FMA(p, s, AV_SET1(1.28379166e-1f));
    p = AV_FMA(p, a, a);
    const vi big = t > AV_SET1(0.927734375f);
    return (vf)(((vi)r & big) | ((vi)p & ~big));
}

/* GELU and its derivative from x and erf(x / sqrt 2), so that one erf can serve both */
AV_FN vf AV(erf_of)(vf x) { return AV(erf)(x * AV_SET1((float)M_SQRT1_2)); }
AV_FN vf AV(gelu_of)(vf x, vf erf) {
    const vf h = x * AV_SET1(0.5f);
    return AV_FMA(h, erf, h);
}
/* d gelu / dx = Phi(x) + x phi(x) */
AV_FN vf AV(gelu_grad_of)(vf x, vf erf) {
    const vf cdf = AV_FMA(AV_SET1(0.5f), erf, AV_SET1(0.5f));
    const vf e = x * x * AV_SET1(-0.5f);
    const vi live = e >= AV_SET1(-87.0f); /* exp underflows to 0 below */
    const vf pdf = (vf)((vi)(AV(exp)(e) * AV_SET1(0.39894228040143267794f)) & live);
    return AV_FMA(x, pdf, cdf);
}
AV_FN vf AV(gelu)(vf x) { return AV(gelu_of)(x, AV(erf_of)(x)); }
AV_FN vf AV(gelu_grad)(vf x) { return AV(gelu_grad_of)(x, AV(erf_of)(x)); }

__attribute__((target(AV_TARGET))) void AV(dt_gelu_forward_bf16)(uint16_t *out, const float *in, size_t n) {
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL) AV(store_bf16_n)(out + i, AV(gelu)(AV_LOAD(in + i)), AV_VL);
    if (i < n) AV(store_bf16_n)(out + i, AV(gelu)(AV(load_n)(in + i, (int)(n - i))), (int)(n - i));
}

__attribute__((target(AV_TARGET))) void AV(dt_gelu_backward_bf16)(uint16_t *din, const float *dout, const float *x,
                                                                  size_t n) {
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL)
        AV(store_bf16_n)(din + i, AV_LOAD(dout + i) * AV(gelu_grad)(AV_LOAD(x + i)), AV_VL);
    if (i < n) {
        const int r = (int)(n - i);
        AV(store_bf16_n)(din + i, AV(load_n)(dout + i, r) * AV(gelu_grad)(AV(load_n)(x + i, r)), r);
    }
}

/* bf16 x, dout and results (the values widened in registers) */
__attribute__((target(AV_TARGET))) void AV(dt_gelu_forward_bf16io)(uint16_t *out, const uint16_t *in, size_t n) {
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL) AV(store_bf16_n)(out + i, AV(gelu)(AV(load_bf16)(in + i)), AV_VL);
    if (i < n) AV(store_bf16_n)(out + i, AV(gelu)(AV(load_bf16_n)(in + i, (int)(n - i))), (int)(n - i));
}

__attribute__((target(AV_TARGET))) void AV(dt_gelu_backward_bf16io)(uint16_t *din, const uint16_t *dout,
                                                                    const uint16_t *x, size_t n) {
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL)
        AV(store_bf16_n)(din + i, AV(load_bf16)(dout + i) * AV(gelu_grad)(AV(load_bf16)(x + i)), AV_VL);
    if (i < n) {
        const int r = (int)(n - i);
        AV(store_bf16_n)(din + i, AV(load_bf16_n)(dout + i, r) * AV(gelu_grad)(AV(load_bf16_n)(x + i, r)), r);
    }
}

/* bf16 x; the values and the derivative dy/dx rounded to bf16, one erf for both; the backward
 * then multiplies dout by dy/dx (bf16 in and out) */
AV_FN void AV(gelu_and_grad_bf16)(uint16_t *out, uint16_t *dydx, vf x, int r) {
    const vf e = AV(erf_of)(x);
    AV(store_bf16_n)(out, AV(gelu_of)(x, e), r);
    AV(store_bf16_n)(dydx, AV(gelu_grad_of)(x, e), r);
}

__attribute__((target(AV_TARGET))) void AV(dt_gelu_forward_bf16io_grad)(uint16_t *out, uint16_t *dydx,
                                                                        const uint16_t *in, size_t n) {
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL) AV(gelu_and_grad_bf16)(out + i, dydx + i, AV(load_bf16)(in + i), AV_VL);
    if (i < n) AV(gelu_and_grad_bf16)(out + i, dydx + i, AV(load_bf16_n)(in + i, (int)(n - i)), (int)(n - i));
}

__attribute__((target(AV_TARGET))) void AV(dt_gelu_backward_bf16io_from_grad)(uint16_t *din, const uint16_t *dout,
                                                                              const uint16_t *dydx, size_t n) {
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL)
        AV(store_bf16_n)(din + i, AV(load_bf16)(dout + i) * AV(load_bf16)(dydx + i), AV_VL);
    if (i < n) {
        const int r = (int)(n - i);
        AV(store_bf16_n)(din + i, AV(load_bf16_n)(dout + i, r) * AV(load_bf16_n)(dydx + i, r), r);
    }
}

#if !defined(AV_BF16_NATIVE)
__attribute__((target(AV_TARGET))) void AV(dt_gelu_forward)(float *out, const float *in, size_t n) {
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL) AV_STORE(out + i, AV(gelu)(AV_LOAD(in + i)));
    if (i < n) AV(store_n)(out + i, AV(gelu)(AV(load_n)(in + i, (int)(n - i))), (int)(n - i));
}

__attribute__((target(AV_TARGET))) void AV(dt_gelu_backward)(float *din, const float *dout, const float *x, size_t n) {
    size_t i = 0;
    for (; i + AV_VL <= n; i += AV_VL) AV_STORE(din + i, AV_LOAD(dout + i) * AV(gelu_grad)(AV_LOAD(x + i)));
    if (i < n) {
        const int r = (int)(n - i);
        AV(store_n)(din + i, AV(load_n)(dout + i, r) * AV(gelu_grad)(AV(load_n)(x + i, r)), r);
    }
}
#endif

#include "backend/vecmath_end.h"
