/* Losses: fused, numerically stable softmax cross-entropy (subtract the row max, log-sum-exp)
 * and mean squared error. Both average over the batch; backward overwrites the gradient and
 * takes a loss-scaling factor. */
#include "backend/layers.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/kern.h"

float dt_softmax_xent_ignore_forward(float *probs, const float *logits, const int32_t *labels, int N, int V, int ignore,
                                     int *counted) {
    int cnt = 0;
    double total = 0.0;
    for (int r = 0; r < N; r++) {
        const float *restrict x = logits + (size_t)r * V;
        float *restrict p = probs + (size_t)r * V;
        const int32_t y = labels[r];
        if (y == ignore) continue;
        cnt++;
        float mx = x[0];
#pragma omp simd reduction(max : mx) /* the max is exact in any order; lanes keep the loop vectorised */
        for (int i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
        const float s = dt_nn_exp_sub_sum(p, x, V, mx);
        const float inv = 1.0f / s;
        for (int i = 0; i < V; i++) p[i] *= inv;
        /* -log softmax(x)[y] = log(sum exp(x - mx)) - (x[y] - mx); a bad label gives NaN */
        total += (y >= 0 && y < V) ? (double)logf(s) - (double)(x[y] - mx) : NAN;
    }
    if (counted) *counted = cnt;
    return cnt > 0 ? (float)(total / cnt) : 0.0f;
}

void dt_softmax_xent_ignore_backward(float *dlogits, const float *probs, const int32_t *labels, int N, int V,
                                     int ignore, int counted, float scale) {
    if (N <= 0) return;
    const float k = counted > 0 ? scale / (float)counted : 0.0f;
    for (int r = 0; r < N; r++) {
        const float *restrict p = probs + (size_t)r * V;
        float *restrict d = dlogits + (size_t)r * V;
        const int32_t y = labels[r];
        if (y == ignore) {
            memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        for (int i = 0; i < V; i++) d[i] = k * p[i];
        if (y >= 0 && y < V) d[y] -= k;
    }
}

float dt_softmax_xent_forward(float *probs, const float *logits, const int32_t *labels, int B, int V) {
    if (B <= 0) return 0.0f;
    return dt_softmax_xent_ignore_forward(probs, logits, labels, B, V, INT32_MIN, NULL);
}

void dt_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels, int B, int V, float scale) {
    dt_softmax_xent_ignore_backward(dlogits, probs, labels, B, V, INT32_MIN, B, scale);
}

float dt_mse_forward(const float *pred, const float *target, size_t n) {
    if (n == 0) return 0.0f;
    double s = 0.0;
    const size_t chunk = 4096;
    for (size_t i0 = 0; i0 < n; i0 += chunk) {
        size_t m = n - i0 < chunk ? n - i0 : chunk;
        float acc[DT_NN_LANES] = {0}, t = 0.0f;
        size_t i = 0;
        for (; i + DT_NN_LANES <= m; i += DT_NN_LANES)
            for (int j = 0; j < DT_NN_LANES; j++) {
                float d = pred[i0 + i + j] - target[i0 + i + j];
                acc[j] += d * d;
            }
        for (; i < m; i++) t += (pred[i0 + i] - target[i0 + i]) * (pred[i0 + i] - target[i0 + i]);
        for (int j = 0; j < DT_NN_LANES; j++) t += acc[j];
        s += t;
    }
    return (float)(s / (double)n);
}

void dt_mse_backward(float *dpred, const float *pred, const float *target, size_t n, float scale) {
    if (n == 0) return;
    const float k = 2.0f * scale / (float)n;
    for (size_t i = 0; i < n; i++) dpred[i] = k * (pred[i] - target[i]);
}
