/* LayerNorm over the last dimension and BatchNorm2d over (B, HW) per channel, forward and
 * backward. Statistics use two passes (mean, then squared deviations) for accuracy; w/b may be
 * NULL (no affine: scale 1, shift 0, and no dw/db). Variance is biased for normalisation as
 * torch; BatchNorm's running_var gets the unbiased one. */
#include "backend/layers.h"

#include <math.h>

#include "backend/kern.h"

/* Sum of (x[i] - m)^2, 16 partial sums. */
static float sq_dev_sum(const float *restrict x, size_t n, float m) {
    float acc[DT_NN_LANES] = {0};
    size_t i = 0;
    for (; i + DT_NN_LANES <= n; i += DT_NN_LANES)
        for (int j = 0; j < DT_NN_LANES; j++) {
            float d = x[i + j] - m;
            acc[j] += d * d;
        }
    float s = 0;
    for (; i < n; i++) s += (x[i] - m) * (x[i] - m);
    for (int j = 0; j < DT_NN_LANES; j++) s += acc[j];
    return s;
}

/* Sum of g[i] * (x[i] - m), 16 partial sums. */
static float dev_dot(const float *restrict g, const float *restrict x, size_t n, float m) {
    float acc[DT_NN_LANES] = {0};
    size_t i = 0;
    for (; i + DT_NN_LANES <= n; i += DT_NN_LANES)
        for (int j = 0; j < DT_NN_LANES; j++) acc[j] += g[i + j] * (x[i + j] - m);
    float s = 0;
    for (; i < n; i++) s += g[i] * (x[i] - m);
    for (int j = 0; j < DT_NN_LANES; j++) s += acc[j];
    return s;
}

/* *sg = sum of g[i], *sgx = sum of g[i] * (x[i] - m) for g = dy * w, vectorised (the simd
 * reduction lets the compiler split the sums into lanes; one serial chain each took LayerNorm's
 * backward ~4 cycles a value). */
static void scaled_sums(float *sg, float *sgx, const float *restrict dy, const float *restrict w,
                        const float *restrict x, size_t n, float m) {
    float s = 0, t = 0;
#pragma omp simd reduction(+ : s, t)
    for (size_t i = 0; i < n; i++) {
        const float g = dy[i] * w[i];
        s += g;
        t += g * (x[i] - m);
    }
    *sg = s, *sgx = t;
}

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *in, const float *w, const float *b, int N,
                          int C, float eps) {
    for (int r = 0; r < N; r++) {
        const float *restrict x = in + (size_t)r * C;
        float *restrict y = out + (size_t)r * C;
        float m = dt_nn_sum(x, (size_t)C) / (float)C;
        float var = sq_dev_sum(x, (size_t)C, m) / (float)C;
        float rs = 1.0f / sqrtf(var + eps);
        if (w && b)
            for (int i = 0; i < C; i++) y[i] = (x[i] - m) * rs * w[i] + b[i];
        else
            for (int i = 0; i < C; i++) y[i] = (x[i] - m) * rs * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
        mean[r] = m;
        rstd[r] = rs;
    }
}

void dt_layernorm_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                           const float *mean, const float *rstd, int N, int C) {
    for (int r = 0; r < N; r++) {
        const float *restrict x = in + (size_t)r * C;
        const float *restrict dy = dout + (size_t)r * C;
        const float m = mean[r], rs = rstd[r];
        if (dw)
            for (int i = 0; i < C; i++) dw[i] += dy[i] * (x[i] - m) * rs;
        if (db)
            for (int i = 0; i < C; i++) db[i] += dy[i];
        if (!din) continue;
        /* g = dy * w; din = rs * (g - mean(g) - xhat * mean(g * xhat)) */
        float sg = 0.0f, sgx = 0.0f;
        if (w) {
            scaled_sums(&sg, &sgx, dy, w, x, (size_t)C, m);
        } else {
            sg = dt_nn_sum(dy, (size_t)C);
            sgx = dev_dot(dy, x, (size_t)C, m);
        }
        const float a = sg / (float)C, c2 = sgx * rs * rs / (float)C;
        float *restrict dx = din + (size_t)r * C;
        for (int i = 0; i < C; i++) dx[i] = rs * (dy[i] * (w ? w[i] : 1.0f) - a - (x[i] - m) * c2);
    }
}

void dt_batchnorm2d_forward_train(float *out, float *mean, float *rstd, float *running_mean, float *running_var,
                                  const float *in, const float *w, const float *b, int B, int C, int HW, float momentum,
                                  float eps) {
    const size_t plane = (size_t)HW, cstride = (size_t)C * HW;
    const double n = (double)B * HW;
    for (int c = 0; c < C; c++) {
        double s = 0.0;
        for (int i = 0; i < B; i++) s += dt_nn_sum(in + i * cstride + c * plane, plane);
        const float m = (float)(s / n);
        double ss = 0.0;
        for (int i = 0; i < B; i++) ss += sq_dev_sum(in + i * cstride + c * plane, plane, m);
        const double var = ss / n;
        const float rs = (float)(1.0 / sqrt(var + (double)eps));
        mean[c] = m;
        rstd[c] = rs;
        if (running_mean) running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * m;
        if (running_var) {
            double unbiased = n > 1 ? var * n / (n - 1) : var;
            running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (float)unbiased;
        }
        const float scale = rs * (w ? w[c] : 1.0f), shift = (b ? b[c] : 0.0f) - m * scale;
        for (int i = 0; i < B; i++) {
            const float *restrict x = in + i * cstride + c * plane;
            float *restrict y = out + i * cstride + c * plane;
            for (size_t k = 0; k < plane; k++) y[k] = x[k] * scale + shift;
        }
    }
}

void dt_batchnorm2d_forward_eval(float *out, const float *in, const float *w, const float *b, const float *running_mean,
                                 const float *running_var, int B, int C, int HW, float eps) {
    const size_t plane = (size_t)HW, cstride = (size_t)C * HW;
    for (int c = 0; c < C; c++) {
        const float rs = (float)(1.0 / sqrt((double)running_var[c] + (double)eps));
        const float scale = rs * (w ? w[c] : 1.0f), shift = (b ? b[c] : 0.0f) - running_mean[c] * scale;
        for (int i = 0; i < B; i++) {
            const float *restrict x = in + i * cstride + c * plane;
            float *restrict y = out + i * cstride + c * plane;
            for (size_t k = 0; k < plane; k++) y[k] = x[k] * scale + shift;
        }
    }
}

void dt_batchnorm2d_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                             const float *mean, const float *rstd, int B, int C, int HW) {
    const size_t plane = (size_t)HW, cstride = (size_t)C * HW;
    const double n = (double)B * HW;
    for (int c = 0; c < C; c++) {
        const float m = mean[c], rs = rstd[c];
        double sdy = 0.0, sdyx = 0.0;
        for (int i = 0; i < B; i++) {
            const float *x = in + i * cstride + c * plane, *dy = dout + i * cstride + c * plane;
            sdy += dt_nn_sum(dy, plane);
            sdyx += dev_dot(dy, x, plane, m);
        }
        sdyx *= rs; /* sum of dy * xhat */
        if (dw) dw[c] += (float)sdyx;
        if (db) db[c] += (float)sdy;
        if (!din) continue;
        /* din = w * rs * (dy - mean(dy) - xhat * mean(dy * xhat)) */
        const float k = rs * (w ? w[c] : 1.0f), a = (float)(sdy / n), c2 = (float)(sdyx / n) * rs;
        for (int i = 0; i < B; i++) {
            const float *restrict x = in + i * cstride + c * plane, *restrict dy = dout + i * cstride + c * plane;
            float *restrict dx = din + i * cstride + c * plane;
            for (size_t q = 0; q < plane; q++) dx[q] = k * (dy[q] - a - (x[q] - m) * c2);
        }
    }
}
