/* Conv2d kernels: per-sample im2col + sgemm (out_b(OC,OH*OW) = w(OC,C*K*K) @ col(C*K*K,OH*OW)),
 * which writes NCHW output directly with no layout transpose. Backward: dw += dout_b @ col^T,
 * dcol = w^T @ dout_b then col2im into din. "Same" stride-1 convolutions (2*pad == K-1) use
 * whole-plane shifted copies instead of row-by-row loops. 1x1/stride 1/pad 0 skips im2col. */
#include "dtrain/layers.h"

#include <cblas.h>
#include <string.h>

#include "nn/kern.h"

typedef struct {
    int C, H, W, K, S, P, OH, OW;
} conv_geom;

/* First and one-past-last output column whose input column ow*S + kx - P lies in [0, W). */
static void valid_range(int kx, int S, int P, int W, int OW, int *lo, int *hi) {
    int l = 0;
    while (l < OW && l * S + kx - P < 0) l++;
    int h = OW;
    while (h > l && (h - 1) * S + kx - P >= W) h--;
    *lo = l;
    *hi = h;
}

static int same_stride1(const conv_geom *g) { return g->S == 1 && g->OH == g->H && g->OW == g->W; }

/* col (C*K*K, OH*OW) <- patches of one sample in (C,H,W). */
static void im2col(float *restrict col, const float *restrict in, const conv_geom *g) {
    const int K = g->K, S = g->S, P = g->P, H = g->H, W = g->W, OH = g->OH, OW = g->OW;
    const size_t HW = (size_t)H * W, OHW = (size_t)OH * OW;
    const int same = same_stride1(g);
    for (int c = 0; c < g->C; c++) {
        const float *restrict plane = in + c * HW;
        for (int ky = 0; ky < K; ky++) {
            for (int kx = 0; kx < K; kx++) {
                float *restrict row = col + ((size_t)(c * K + ky) * K + kx) * OHW;
                int lo, hi;
                valid_range(kx, S, P, W, OW, &lo, &hi);
                if (same) {
                    /* row[p] = plane[p + s] where in range, then zero the wrapped columns */
                    long s = (long)(ky - P) * W + (kx - P);
                    long p0 = s < 0 ? -s : 0, p1 = s > 0 ? (long)HW - s : (long)HW;
                    if (p0 > (long)HW) p0 = (long)HW;
                    if (p1 < p0) p1 = p0;
                    memset(row, 0, (size_t)p0 * sizeof(float));
                    if (p1 > p0) memcpy(row + p0, plane + p0 + s, (size_t)(p1 - p0) * sizeof(float));
                    memset(row + p1, 0, (size_t)((long)HW - p1) * sizeof(float));
                    if (lo > 0 || hi < OW)
                        for (int oy = 0; oy < OH; oy++) {
                            float *r = row + (size_t)oy * OW;
                            for (int x = 0; x < lo; x++) r[x] = 0.0f;
                            for (int x = hi; x < OW; x++) r[x] = 0.0f;
                        }
                    continue;
                }
                for (int oy = 0; oy < OH; oy++) {
                    float *restrict r = row + (size_t)oy * OW;
                    int iy = oy * S + ky - P;
                    if (iy < 0 || iy >= H || lo >= hi) {
                        memset(r, 0, (size_t)OW * sizeof(float));
                        continue;
                    }
                    const float *restrict src = plane + (size_t)iy * W + kx - P;
                    for (int x = 0; x < lo; x++) r[x] = 0.0f;
                    if (S == 1)
                        memcpy(r + lo, src + lo, (size_t)(hi - lo) * sizeof(float));
                    else
                        for (int x = lo; x < hi; x++) r[x] = src[(size_t)x * S];
                    for (int x = hi; x < OW; x++) r[x] = 0.0f;
                }
            }
        }
    }
}

/* din (C,H,W) = sum of the patch gradients in col (C*K*K, OH*OW); col is clobbered. */
static void col2im(float *restrict din, float *restrict col, const conv_geom *g) {
    const int K = g->K, S = g->S, P = g->P, H = g->H, W = g->W, OH = g->OH, OW = g->OW;
    const size_t HW = (size_t)H * W, OHW = (size_t)OH * OW;
    const int same = same_stride1(g);
    memset(din, 0, (size_t)g->C * HW * sizeof(float));
    for (int c = 0; c < g->C; c++) {
        float *restrict plane = din + c * HW;
        for (int ky = 0; ky < K; ky++) {
            for (int kx = 0; kx < K; kx++) {
                float *restrict row = col + ((size_t)(c * K + ky) * K + kx) * OHW;
                int lo, hi;
                valid_range(kx, S, P, W, OW, &lo, &hi);
                if (same) {
                    /* drop the wrapped columns, then plane[p + s] += row[p] over the valid span */
                    if (lo > 0 || hi < OW)
                        for (int oy = 0; oy < OH; oy++) {
                            float *r = row + (size_t)oy * OW;
                            for (int x = 0; x < lo; x++) r[x] = 0.0f;
                            for (int x = hi; x < OW; x++) r[x] = 0.0f;
                        }
                    long s = (long)(ky - P) * W + (kx - P);
                    long p0 = s < 0 ? -s : 0, p1 = s > 0 ? (long)HW - s : (long)HW;
                    if (p1 <= p0) continue;
                    float *restrict dst = plane + p0 + s;
                    const float *restrict src = row + p0;
                    for (long p = 0; p < p1 - p0; p++) dst[p] += src[p];
                    continue;
                }
                if (lo >= hi) continue;
                for (int oy = 0; oy < OH; oy++) {
                    int iy = oy * S + ky - P;
                    if (iy < 0 || iy >= H) continue;
                    const float *restrict r = row + (size_t)oy * OW;
                    float *restrict dst = plane + (size_t)iy * W + kx - P;
                    if (S == 1)
                        for (int x = lo; x < hi; x++) dst[x] += r[x];
                    else
                        for (int x = lo; x < hi; x++) dst[(size_t)x * S] += r[x];
                }
            }
        }
    }
}

static conv_geom geom(int C, int H, int W, int K, int S, int P) {
    conv_geom g = {C, H, W, K, S, P, (H + 2 * P - K) / S + 1, (W + 2 * P - K) / S + 1};
    return g;
}

static int is_pointwise(const conv_geom *g) { return g->K == 1 && g->S == 1 && g->P == 0; }

size_t dt_conv2d_workspace(int B, int C, int H, int W, int OC, int K, int stride, int pad) {
    (void)B;
    (void)OC;
    conv_geom g = geom(C, H, W, K, stride, pad);
    if (g.OH <= 0 || g.OW <= 0) return 0;
    if (is_pointwise(&g)) return 0;
    return (size_t)C * K * K * g.OH * g.OW;
}

void dt_conv2d_forward(float *out, const float *in, const float *w, const float *b, float *work, int B, int C,
                       int H, int W, int OC, int K, int stride, int pad) {
    conv_geom g = geom(C, H, W, K, stride, pad);
    if (g.OH <= 0 || g.OW <= 0 || B <= 0 || OC <= 0) return;
    const int CKK = C * K * K, OHW = g.OH * g.OW;
    const int pw = is_pointwise(&g);
    for (int n = 0; n < B; n++) {
        const float *in_b = in + (size_t)n * C * H * W;
        float *out_b = out + (size_t)n * OC * OHW;
        const float *col = in_b;
        if (!pw) {
            im2col(work, in_b, &g);
            col = work;
        }
        float beta = 0.0f;
        if (b) {
            for (int o = 0; o < OC; o++) {
                float *restrict r = out_b + (size_t)o * OHW;
                const float v = b[o];
                for (int i = 0; i < OHW; i++) r[i] = v;
            }
            beta = 1.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, OHW, CKK, 1.0f, w, CKK, col, OHW, beta, out_b,
                    OHW);
    }
}

void dt_conv2d_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                        float *work, int B, int C, int H, int W, int OC, int K, int stride, int pad) {
    conv_geom g = geom(C, H, W, K, stride, pad);
    if (g.OH <= 0 || g.OW <= 0 || B <= 0 || OC <= 0) return;
    const int CKK = C * K * K, OHW = g.OH * g.OW;
    const int pw = is_pointwise(&g);
    for (int n = 0; n < B; n++) {
        const float *in_b = in + (size_t)n * C * H * W;
        const float *dout_b = dout + (size_t)n * OC * OHW;
        if (db)
            for (int o = 0; o < OC; o++) db[o] += dt_nn_sum(dout_b + (size_t)o * OHW, (size_t)OHW);
        if (dw) {
            const float *col = in_b;
            if (!pw) {
                im2col(work, in_b, &g);
                col = work;
            }
            /* dw (OC,CKK) += dout_b (OC,OHW) @ col^T (OHW,CKK) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, CKK, OHW, 1.0f, dout_b, OHW, col, OHW, 1.0f, dw,
                        CKK);
        }
        if (din) {
            float *din_b = din + (size_t)n * C * H * W;
            if (pw) {
                /* din_b (C,HW) = w^T (C,OC) @ dout_b (OC,HW) */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OHW, OC, 1.0f, w, CKK, dout_b, OHW, 0.0f,
                            din_b, OHW);
            } else {
                /* dcol (CKK,OHW) = w^T (CKK,OC) @ dout_b (OC,OHW), reusing the col buffer */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CKK, OHW, OC, 1.0f, w, CKK, dout_b, OHW, 0.0f,
                            work, OHW);
                col2im(din_b, work, &g);
            }
        }
    }
}
