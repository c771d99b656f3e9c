/* Linear (fully connected) layer kernels on OpenBLAS sgemm: out = in @ w^T + b, PyTorch weight
 * layout (OC, C). Backward accumulates dw/db and overwrites din (see include/dtrain/layers.h). */
#include "backend/layers.h"

#include <cblas.h>
#include <string.h>

#include "backend/kern.h"

void dt_linear_forward(float *out, const float *in, const float *w, const float *b, int B, int C, int OC) {
    if (B <= 0 || OC <= 0) return;
    float beta = 0.0f;
    if (b) {
        /* pre-broadcast the bias into out and let sgemm add the product (beta = 1) */
        for (int i = 0; i < B; i++) memcpy(out + (size_t)i * OC, b, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    if (C <= 0) {
        if (!b) memset(out, 0, (size_t)B * OC * sizeof(float));
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, OC, C, 1.0f, in, C, w, C, beta, out, OC);
}

void dt_linear_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w, int B,
                        int C, int OC) {
    if (B <= 0 || OC <= 0 || C <= 0) {
        if (din && B > 0 && C > 0) memset(din, 0, (size_t)B * C * sizeof(float));
        return;
    }
    /* dw (OC,C) += dout^T (OC,B) @ in (B,C) */
    if (dw) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, B, 1.0f, dout, OC, in, C, 1.0f, dw, C);
    /* db (OC) += column sums of dout */
    if (db) {
        for (int i = 0; i < B; i++) {
            const float *restrict row = dout + (size_t)i * OC;
            float *restrict acc = db;
            for (int j = 0; j < OC; j++) acc[j] += row[j];
        }
    }
    /* din (B,C) = dout (B,OC) @ w (OC,C) */
    if (din) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, C, OC, 1.0f, dout, OC, w, C, 0.0f, din, C);
}
