/* Max and average 2-d pooling over NCHW planes (square window K, stride S, no padding).
 * MaxPool keeps the flat input index of each max (first max wins on ties, the last NaN wins,
 * as torch's CPU kernel) so backward is a scatter; K == S == 2 has a dedicated fast path. */
#include "dtrain/layers.h"

#include <string.h>

#include "nn/kern.h"

void dt_maxpool2d_forward(float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K, int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    if (OH <= 0 || OW <= 0) return;
    const size_t planes = (size_t)B * C, HW = (size_t)H * W, OHW = (size_t)OH * OW;
    for (size_t pl = 0; pl < planes; pl++) {
        const float *restrict x = in + pl * HW;
        float *restrict y = out + pl * OHW;
        int32_t *restrict am = argmax + pl * OHW;
        const int32_t base = (int32_t)(pl * HW);
        if (K == 2 && S == 2) {
            for (int oy = 0; oy < OH; oy++) {
                const float *r0 = x + (size_t)(2 * oy) * W, *r1 = r0 + W;
                for (int ox = 0; ox < OW; ox++) {
                    int i0 = 2 * ox;
                    float a = r0[i0], bq = r0[i0 + 1], c = r1[i0], d = r1[i0 + 1];
                    int ia = 2 * oy * W + i0;
                    float m = a;
                    int im = ia;
                    if (bq > m || bq != bq) m = bq, im = ia + 1;
                    if (c > m || c != c) m = c, im = ia + W;
                    if (d > m || d != d) m = d, im = ia + W + 1;
                    y[(size_t)oy * OW + ox] = m;
                    am[(size_t)oy * OW + ox] = base + im;
                }
            }
            continue;
        }
        for (int oy = 0; oy < OH; oy++) {
            for (int ox = 0; ox < OW; ox++) {
                int i0 = oy * S * W + ox * S;
                float m = x[i0];
                int im = i0;
                for (int ky = 0; ky < K; ky++)
                    for (int kx = 0; kx < K; kx++) {
                        int i = i0 + ky * W + kx;
                        float v = x[i];
                        if (v > m || v != v) {
                            m = v;
                            im = i;
                        }
                    }
                y[(size_t)oy * OW + ox] = m;
                am[(size_t)oy * OW + ox] = base + im;
            }
        }
    }
}

void dt_maxpool2d_backward(float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W, int K,
                           int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const size_t n_in = (size_t)B * C * H * W;
    memset(din, 0, n_in * sizeof(float));
    if (OH <= 0 || OW <= 0) return;
    const size_t n_out = (size_t)B * C * OH * OW;
    if (K <= S) {
        /* windows do not overlap: each input gets at most one gradient */
        for (size_t i = 0; i < n_out; i++) din[argmax[i]] = dout[i];
    } else {
        for (size_t i = 0; i < n_out; i++) din[argmax[i]] += dout[i];
    }
}

void dt_avgpool2d_forward(float *out, const float *in, int B, int C, int H, int W, int K, int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    if (OH <= 0 || OW <= 0) return;
    const size_t planes = (size_t)B * C, HW = (size_t)H * W, OHW = (size_t)OH * OW;
    const float scale = 1.0f / (float)(K * K);
    for (size_t pl = 0; pl < planes; pl++) {
        const float *restrict x = in + pl * HW;
        float *restrict y = out + pl * OHW;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                const float *win = x + (size_t)oy * S * W + (size_t)ox * S;
                float s = 0.0f;
                for (int ky = 0; ky < K; ky++)
                    for (int kx = 0; kx < K; kx++) s += win[(size_t)ky * W + kx];
                y[(size_t)oy * OW + ox] = s * scale;
            }
    }
}

void dt_avgpool2d_backward(float *din, const float *dout, int B, int C, int H, int W, int K, int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const size_t planes = (size_t)B * C, HW = (size_t)H * W, OHW = (size_t)OH * OW;
    memset(din, 0, planes * HW * sizeof(float));
    if (OH <= 0 || OW <= 0) return;
    const float scale = 1.0f / (float)(K * K);
    for (size_t pl = 0; pl < planes; pl++) {
        float *restrict x = din + pl * HW;
        const float *restrict y = dout + pl * OHW;
        for (int oy = 0; oy < OH; oy++)
            for (int ox = 0; ox < OW; ox++) {
                float *win = x + (size_t)oy * S * W + (size_t)ox * S;
                const float g = y[(size_t)oy * OW + ox] * scale;
                for (int ky = 0; ky < K; ky++)
                    for (int kx = 0; kx < K; kx++) win[(size_t)ky * W + kx] += g;
            }
    }
}
