/* Embedding kernels (token and learned-position lookups) and the residual add. Backward
 * accumulates into the table's gradient. Ids are checked by the caller (the embedding op). */
#include "backend/layers.h"

#include <string.h>

#include "backend/kern.h"

void dt_embedding_forward(float *out, const int32_t *ids, const float *w, int N, int C) {
    for (int i = 0; i < N; i++) memcpy(out + (size_t)i * C, w + (size_t)ids[i] * C, (size_t)C * sizeof(float));
}

void dt_embedding_backward(float *dw, const float *dout, const int32_t *ids, int N, int C) {
    for (int i = 0; i < N; i++) {
        float *restrict d = dw + (size_t)ids[i] * C;
        const float *restrict g = dout + (size_t)i * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
    }
}

void dt_pos_embedding_forward(float *out, const float *w, int B, int T, int C) {
    for (int b = 0; b < B; b++) memcpy(out + (size_t)b * T * C, w, (size_t)T * C * sizeof(float));
}

void dt_pos_embedding_backward(float *dw, const float *dout, int B, int T, int C) {
    const size_t n = (size_t)T * C;
    for (int b = 0; b < B; b++) {
        const float *restrict g = dout + (size_t)b * n;
        for (size_t i = 0; i < n; i++) dw[i] += g[i];
    }
}

void dt_add_forward(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
