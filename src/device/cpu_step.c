/* The CPU kernels of the device's memory and training-step primitives (device.h) on host memory:
 * fill, accumulate, scale, unscale with a non-finite flag, squared-norm sums, bf16/f16 casts, and
 * the SGD and Adam/AdamW updates with torch.optim 1.13's arithmetic. The CPU device runs them on
 * dt_alloc memory, the checked device inside its arena. alloc/free/synchronize are the device's
 * own (NULL here). */
#include "device/device.h"

#include <math.h>
#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")

static void cpu_upload(dt_dev *d, void *dst, const void *src, size_t bytes) {
    (void)d;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_copy(dt_dev *d, void *dst, const void *src, size_t bytes) {
    (void)d;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_fill_f32(dt_dev *d, float *x, float v, size_t n) {
    (void)d;
    if (v == 0.0f && !signbit(v)) memset(x, 0, n * sizeof *x);
    else
        for (size_t i = 0; i < n; i++) x[i] = v;
}

static void cpu_accumulate(dt_dev *d, float *restrict y, const float *restrict x, size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_scale(dt_dev *d, float *x, float s, size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* true when every g[i] is finite (0 * inf and 0 * NaN are NaN: one vectorisable pass) */
static bool all_finite(const float *restrict g, size_t n) {
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += 0.0f * g[i + j];
    float s = 0;
    for (; i < n; i++) s += 0.0f * g[i];
    for (int j = 0; j < 16; j++) s += acc[j];
    return s == 0.0f;
}

static void cpu_unscale(dt_dev *d, float *x, float inv, size_t n, int32_t *nonfinite) {
    if (!all_finite(x, n)) {
        *nonfinite = 1;
        return;
    }
    cpu_scale(d, x, inv, n);
    *nonfinite = 0;
}

static void cpu_sqnorm(dt_dev *d, double *out, const float *x, size_t n) {
    (void)d;
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    *out = ss;
}

static void cpu_cast_f32_bf16(dt_dev *d, uint16_t *out, const float *x, size_t n) {
    (void)d;
    dt_cast_bf16(out, x, n); /* the kernels' cast (AVX512-BF16 where the CPU has it), bitwise dt_f32_to_bf16 */
}

static void cpu_cast_bf16_f32(dt_dev *d, float *out, const uint16_t *x, size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) out[i] = dt_bf16_to_f32(x[i]);
}

static void cpu_cast_f32_f16(dt_dev *d, uint16_t *out, const float *x, size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) out[i] = dt_f32_to_f16(x[i]);
}

static void cpu_cast_f16_f32(dt_dev *d, float *out, const uint16_t *x, size_t n) {
    (void)d;
    for (size_t i = 0; i < n; i++) out[i] = dt_f16_to_f32(x[i]);
}

/* torch.optim.SGD: the buffer starts as the first gradient (mu_prev = 0 on the first step); the
 * branches are hoisted out of the loops so they vectorise. */
static void cpu_sgd_step(dt_dev *d, const dt_step_args *a, float *restrict p, const float *restrict g,
                         float *restrict buf, size_t n) {
    (void)d;
    const float wd = a->weight_decay, mu = a->momentum, lr = a->lr;
    if (mu == 0) {
        for (size_t i = 0; i < n; i++) p[i] -= lr * (g[i] + wd * p[i]);
        return;
    }
    const float mu_prev = a->first_step ? 0.0f : mu;
    if (a->nesterov) {
        for (size_t i = 0; i < n; i++) {
            float dd = g[i] + wd * p[i];
            float b = mu_prev * buf[i] + dd;
            buf[i] = b;
            p[i] -= lr * (dd + mu * b);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float b = mu_prev * buf[i] + (g[i] + wd * p[i]);
            buf[i] = b;
            p[i] -= lr * b;
        }
    }
}

/* The Adam update of n values whose moments are m and v. */
__attribute__((noinline)) static void adam_loop(const dt_step_args *a, float *restrict p, const float *restrict g,
                                                float *restrict m, float *restrict v, size_t n) {
    const float b1 = a->beta1, b2 = a->beta2, eps = a->eps, wd = a->weight_decay, lr = a->lr;
    const float wd_l2 = a->decoupled ? 0.0f : wd; /* adam: L2 term in the gradient */
    const double t = (double)(a->t + 1);
    const float bc1 = (float)(1.0 - pow(b1, t));
    const float inv_bc2_sqrt = (float)(1.0 / sqrt(1.0 - pow(b2, t)));
    const float step = lr / bc1;
    /* adamw: p = p * (1 - lr wd) - update, in one pass (the same roundings as two); adam: shrink 1
     * (p * 1.0f is p exactly) and the L2 term in the gradient */
    const float shrink = a->decoupled ? 1.0f - lr * wd : 1.0f;
    for (size_t i = 0; i < n; i++) {
        const float pi = p[i] * shrink, gi = g[i] + wd_l2 * pi;
        float mi = b1 * m[i] + (1 - b1) * gi;
        float vi = b2 * v[i] + (1 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step * mi / (sqrtf(vi) * inv_bc2_sqrt + eps);
    }
}

/* adam_loop with subnormal floats flushed to zero (MXCSR FTZ and DAZ, this thread, restored after).
 * Where a gradient stays 0 (a dead ReLU unit, a pixel that is always 0) m decays by beta1 each
 * step into the subnormal range, and every multiply on a subnormal takes a microcode assist. A
 * flushed moment changes the parameter by less than lr * 1e-30, which a float cannot hold. */
static void cpu_adam_step(dt_dev *d, const dt_step_args *a, float *p, const float *g, float *m, float *v, size_t n) {
    (void)d;
#if defined(__SSE__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u); /* FTZ (bit 15) | DAZ (bit 6) */
    adam_loop(a, p, g, m, v, n);
    _mm_setcsr(csr);
#else
    adam_loop(a, p, g, m, v, n);
#endif
}

const dt_device_ops dt_cpu_step_ops = {
    .upload = cpu_upload,
    .download = cpu_upload,
    .copy = cpu_copy,
    .fill_f32 = cpu_fill_f32,
    .accumulate = cpu_accumulate,
    .scale = cpu_scale,
    .unscale = cpu_unscale,
    .sqnorm = cpu_sqnorm,
    .cast_f32_bf16 = cpu_cast_f32_bf16,
    .cast_bf16_f32 = cpu_cast_bf16_f32,
    .cast_f32_f16 = cpu_cast_f32_f16,
    .cast_f16_f32 = cpu_cast_f16_f32,
    .sgd_step = cpu_sgd_step,
    .adam_step = cpu_adam_step,
    .xent_shard = dt_cpu_xent_shard,
    .plan_layouts = dt_cpu_plan_layouts,
};
