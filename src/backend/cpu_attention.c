/* Causal multi-head self-attention: the public kernels pick the fused one for the CPU's widest
 * vectors (cpu_attention_vec.c: AVX-512 or AVX2 + FMA), else run the OpenBLAS one here: sgemm
 * per (batch, head), scores = q k^T / sqrt(hs) (T x T), a causal softmax per row, out = P v. The
 * q/k/v heads are read in place from the (B,T,3C) rows with leading dimension 3C, and the output
 * heads written with leading dimension C, so no transposes are copied. Backward recomputes
 * nothing: P is kept in att. */
#include "backend/layers.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "backend/attention.h"
#include "backend/kern.h"

/* The fused kernels' buffers at 16 lanes (8 need no more): the transposed k or v (hs x Tp); a
 * block of 8 score rows (forward) or all T rows of dS (backward); zero-padded copies of v (forward)
 * or of k, q and dout (backward) where hs is not a whole number of vectors. OpenBLAS: T x T. */
size_t dt_attention_workspace(int T, int C, int NH) {
    const size_t hs = (size_t)(C / NH), t = (size_t)T, Tp = (t + 15) / 16 * 16, hsp = (hs + 15) / 16 * 16;
    const size_t blas = t * t, fwd = hs * Tp + 8 * Tp + t * hsp, bwd = hs * Tp + t * Tp + 3 * t * hsp;
    const size_t m = blas > fwd ? blas : fwd;
    return m > bwd ? m : bwd;
}

/* Row t of the scores: softmax over j <= t, zeros after. */
static void causal_softmax_row(float *restrict row, int t, int T) {
    float mx = row[0];
    for (int j = 1; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
    const float inv = 1.0f / dt_nn_exp_sub_sum(row, row, t + 1, mx);
    for (int j = 0; j <= t; j++) row[j] *= inv;
    for (int j = t + 1; j < T; j++) row[j] = 0.0f;
}

static void blas_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    const int hs = C / NH, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
            float *P = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, ld, k, ld, 0.0f, P, T);
            for (int t = 0; t < T; t++) causal_softmax_row(P + (size_t)t * T, t, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, v, ld, 0.0f,
                        out + (size_t)b * T * C + (size_t)h * hs, C);
        }
}

static void blas_backward(float *dqkv, float *work, const float *dout, const float *qkv, const float *att, int B, int T,
                          int C, int NH) {
    const int hs = C / NH, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t row0 = (size_t)b * T * ld + (size_t)h * hs;
            const float *q = qkv + row0, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + row0, *dk = dq + C, *dv = dq + 2 * C;
            const float *P = att + ((size_t)b * NH + h) * T * T;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
            float *dS = work;
            /* dP = dO v^T, dv = P^T dO */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, C, v, ld, 0.0f, dS, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, dO, C, 0.0f, dv, ld);
            /* softmax backward per row, causal: dS = P * (dP - sum_j P dP) */
            for (int t = 0; t < T; t++) {
                const float *restrict p = P + (size_t)t * T;
                float *restrict d = dS + (size_t)t * T;
                float dot = 0.0f;
                for (int j = 0; j <= t; j++) dot += p[j] * d[j];
                for (int j = 0; j <= t; j++) d[j] = p[j] * (d[j] - dot);
                for (int j = t + 1; j < T; j++) d[j] = 0.0f;
            }
            /* dq = dS k * scale, dk = dS^T q * scale */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dS, T, k, ld, 0.0f, dq, ld);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dS, T, q, ld, 0.0f, dk, ld);
        }
}

void dt_att_forward(dt_isa k, float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH) {
    switch (k) {
#if DT_ISA_X86
    case DT_ISA_AVX512: dt_attention_forward_avx512(out, att, work, qkv, B, T, C, NH); break;
    case DT_ISA_AVX2: dt_attention_forward_avx2(out, att, work, qkv, B, T, C, NH); break;
#endif
    default: blas_forward(out, att, qkv, B, T, C, NH); break;
    }
}

void dt_att_backward(dt_isa k, float *dqkv, float *work, const float *dout, const float *qkv, const float *att, int B,
                     int T, int C, int NH) {
    switch (k) {
#if DT_ISA_X86
    case DT_ISA_AVX512: dt_attention_backward_avx512(dqkv, work, dout, qkv, att, B, T, C, NH); break;
    case DT_ISA_AVX2: dt_attention_backward_avx2(dqkv, work, dout, qkv, att, B, T, C, NH); break;
#endif
    default: blas_backward(dqkv, work, dout, qkv, att, B, T, C, NH); break;
    }
}

void dt_attention_forward(float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH) {
    dt_att_forward(dt_isa_best(), out, att, work, qkv, B, T, C, NH);
}

void dt_attention_backward(float *dqkv, float *work, const float *dout, const float *qkv, const float *att, int B,
                           int T, int C, int NH) {
    dt_att_backward(dt_isa_best(), dqkv, work, dout, qkv, att, B, T, C, NH);
}
