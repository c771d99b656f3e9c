/* Conv2d kernels: per-sample im2col + sgemm (out_b(OC,OH*OW) = w(OC,C*K*K) @ col(C*K*K,OH*OW)),
 * which writes NCHW output directly with no layout transpose (per-sample GEMMs measured faster
 * than one batched GEMM plus a transpose at the reference CNN shapes). Bias rides in the GEMM as
 * a ones row of col. Backward: [dw|db]^T += [col;1] @ dout_b^T, dcol = w^T @ dout_b, col2im.
 * "Same" stride-1 convolutions (2*pad == K-1) build col from whole-plane shifted copies;
 * 1x1/stride 1/pad 0 skips im2col. */
#include "backend/layers.h"

#include <cblas.h>
#include <string.h>

/* im2col issues thousands of short zero/copy runs per sample: keep them inline loops */
#define DT_NN_INLINE_COPIES
#include "backend/kern.h"

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
    for (int c = 0; c < g->C; c++) {
        const float *restrict plane = in + c * HW;
        for (int ky = 0; ky < K; ky++) {
            for (int kx = 0; kx < K; kx++) {
                float *restrict row = col + ((size_t)(c * K + ky) * K + kx) * OHW;
                int lo, hi;
                valid_range(kx, S, P, W, OW, &lo, &hi);
                for (int oy = 0; oy < OH; oy++) {
                    float *restrict r = row + (size_t)oy * OW;
                    int iy = oy * S + ky - P;
                    if (iy < 0 || iy >= H || lo >= hi) {
                        memset(r, 0, (size_t)OW * sizeof(float));
                        continue;
                    }
                    /* src[x] is input column lo*S + kx - P + x*S (in range for x < hi - lo) */
                    const float *restrict src = plane + (size_t)iy * W + (lo * S + kx - P);
                    for (int x = 0; x < lo; x++) r[x] = 0.0f;
                    if (S == 1) memcpy(r + lo, src, (size_t)(hi - lo) * sizeof(float));
                    else
                        for (int x = 0; x < hi - lo; x++) r[lo + x] = src[(size_t)x * S];
                    for (int x = hi; x < OW; x++) r[x] = 0.0f;
                }
            }
        }
    }
}

/* din (C,H,W) = sum of the patch gradients in col (C*K*K, OH*OW). */
static void col2im(float *restrict din, const float *restrict col, const conv_geom *g) {
    const int K = g->K, S = g->S, P = g->P, H = g->H, W = g->W, OH = g->OH, OW = g->OW;
    const size_t HW = (size_t)H * W, OHW = (size_t)OH * OW;
    memset(din, 0, (size_t)g->C * HW * sizeof(float));
    for (int c = 0; c < g->C; c++) {
        float *restrict plane = din + c * HW;
        for (int ky = 0; ky < K; ky++) {
            for (int kx = 0; kx < K; kx++) {
                const float *restrict row = col + ((size_t)(c * K + ky) * K + kx) * OHW;
                int lo, hi;
                valid_range(kx, S, P, W, OW, &lo, &hi);
                if (lo >= hi) continue;
                for (int oy = 0; oy < OH; oy++) {
                    int iy = oy * S + ky - P;
                    if (iy < 0 || iy >= H) continue;
                    const float *restrict r = row + (size_t)oy * OW + lo;
                    float *restrict dst = plane + (size_t)iy * W + (lo * S + kx - P);
                    if (S == 1)
                        for (int x = 0; x < hi - lo; x++) dst[x] += r[x];
                    else
                        for (int x = 0; x < hi - lo; x++) dst[(size_t)x * S] += r[x];
                }
            }
        }
    }
}

/* ---- "same" stride-1 convolutions (2*pad == K-1): a tap (ky,kx) of the patch matrix is the
 * whole input plane shifted by s = (ky-P)*W + (kx-P): one long copy per tap instead of H short
 * ones, then the |kx-P| columns per row that wrapped around a row edge are zeroed (faster than a
 * masked copy at the reference CNN's 14x14 planes: docs/why.md, "Same convolutions"). */

/* Valid span [p0, p1) of row positions p whose source p + s lies inside a plane of HW values. */
static void shift_span(long s, long HW, long *p0, long *p1) {
    long a = s < 0 ? -s : 0, b = s > 0 ? HW - s : HW;
    if (a > HW) a = HW;
    if (b < a) b = a;
    *p0 = a, *p1 = b;
}

/* Zeroes the entries of a (H,W) row-major tap whose column wrapped: x < -dx or x >= W - dx
 * (column by column: a strided loop of H stores each). */
static void zero_wrapped(float *row, int H, int W, int dx) {
    int x0 = dx < 0 ? 0 : W - dx, x1 = dx < 0 ? -dx : W;
    if (x0 < 0) x0 = 0;
    if (x1 > W) x1 = W;
    for (int x = x0; x < x1; x++)
        for (int y = 0; y < H; y++) row[(size_t)y * W + x] = 0.0f;
}

static void im2col_same(float *restrict col, const float *restrict in, const conv_geom *g) {
    const int K = g->K, P = g->P, W = g->W;
    const long HW = (long)g->H * W;
    for (int c = 0; c < g->C; c++) {
        const float *plane = in + c * HW;
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
                float *row = col + ((long)(c * K + ky) * K + kx) * HW;
                long s = (long)(ky - P) * W + (kx - P), p0, p1;
                shift_span(s, HW, &p0, &p1);
                const float *restrict src = plane + p0 + s;
                float *restrict dst = row + p0;
                for (long i = 0; i < p0; i++) row[i] = 0.0f;
                for (long i = 0; i < p1 - p0; i++) dst[i] = src[i];
                for (long i = p1; i < HW; i++) row[i] = 0.0f;
                if (kx != P) zero_wrapped(row, g->H, W, kx - P);
            }
    }
}

/* din (C,H,W) = sum over taps of the shifted rows of col (the wrapped entries of col are zeroed
 * first, so col is clobbered). */
static void col2im_same(float *restrict din, float *restrict col, const conv_geom *g) {
    const int K = g->K, P = g->P, W = g->W;
    const long HW = (long)g->H * W;
    for (int c = 0; c < g->C; c++) {
        float *plane = din + c * HW;
        /* the centre tap covers every position: it initialises the plane */
        memcpy(plane, col + ((long)(c * K + P) * K + P) * HW, (size_t)HW * sizeof(float));
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
                if (ky == P && kx == P) continue;
                float *row = col + ((long)(c * K + ky) * K + kx) * HW;
                if (kx != P) zero_wrapped(row, g->H, W, kx - P);
                long s = (long)(ky - P) * W + (kx - P), p0, p1;
                shift_span(s, HW, &p0, &p1);
                const float *restrict src = row + p0;
                float *restrict dst = plane + p0 + s;
                for (long i = 0; i < p1 - p0; i++) dst[i] += src[i];
            }
    }
}

static conv_geom geom(int C, int H, int W, int K, int S, int P) {
    conv_geom g = {C, H, W, K, S, P, (H + 2 * P - K) / S + 1, (W + 2 * P - K) / S + 1};
    return g;
}

static int is_pointwise(const conv_geom *g) { return g->K == 1 && g->S == 1 && g->P == 0; }

/* Workspace (floats), for all but pointwise convolutions:
 *   col  (CKK+1, OHW)  patch matrix; its last row is ones, so that a bias column appended to w
 *                      adds the bias inside the forward GEMM and the backward GEMM's last row
 *                      yields db (no separate bias fill or row-sum passes);
 *   wx   (OC, CKK+1)   forward: [w | b];  backward: dwT (CKK+1, OC) accumulated over the batch. */
typedef struct {
    float *col, *wx;
} conv_work;

static size_t col_floats(const conv_geom *g) { return ((size_t)g->C * g->K * g->K + 1) * g->OH * g->OW; }

size_t dt_conv2d_workspace(int B, int C, int H, int W, int OC, int K, int stride, int pad) {
    (void)B;
    conv_geom g = geom(C, H, W, K, stride, pad);
    if (g.OH <= 0 || g.OW <= 0 || OC <= 0 || is_pointwise(&g)) return 0;
    return col_floats(&g) + (size_t)OC * (C * K * K + 1);
}

static conv_work carve(float *work, const conv_geom *g, int OC) {
    (void)OC;
    conv_work w = {work, work + col_floats(g)};
    const size_t CKK = (size_t)g->C * g->K * g->K, OHW = (size_t)g->OH * g->OW;
    for (size_t i = 0; i < OHW; i++) w.col[CKK * OHW + i] = 1.0f;
    return w;
}

static void fill_patches(const conv_work *w, const float *in_b, const conv_geom *g) {
    if (same_stride1(g)) im2col_same(w->col, in_b, g);
    else im2col(w->col, in_b, g);
}

/* Pointwise (1x1, stride 1, pad 0): the input plane is the patch matrix. */
static void pointwise_forward(float *out, const float *in, const float *w, const float *b, int B, int C, int HW,
                              int OC) {
    for (int n = 0; n < B; n++) {
        float *out_b = out + (size_t)n * OC * HW;
        float beta = 0.0f;
        if (b) {
            for (int o = 0; o < OC; o++) {
                float *restrict r = out_b + (size_t)o * HW;
                const float v = b[o];
                for (int i = 0; i < HW; i++) r[i] = v;
            }
            beta = 1.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, HW, C, 1.0f, w, C, in + (size_t)n * C * HW, HW, beta,
                    out_b, HW);
    }
}

static void pointwise_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                               int B, int C, int HW, int OC) {
    for (int n = 0; n < B; n++) {
        const float *dout_b = dout + (size_t)n * OC * HW;
        if (db)
            for (int o = 0; o < OC; o++) db[o] += dt_nn_sum(dout_b + (size_t)o * HW, (size_t)HW);
        if (dw)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, C, HW, 1.0f, dout_b, HW, in + (size_t)n * C * HW,
                        HW, 1.0f, dw, C);
        if (din)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, HW, OC, 1.0f, w, C, dout_b, HW, 0.0f,
                        din + (size_t)n * C * HW, HW);
    }
}

void dt_conv2d_forward(float *out, const float *in, const float *w, const float *b, float *work, int B, int C, int H,
                       int W, int OC, int K, int stride, int pad) {
    conv_geom g = geom(C, H, W, K, stride, pad);
    if (g.OH <= 0 || g.OW <= 0 || B <= 0 || OC <= 0) return;
    if (is_pointwise(&g)) {
        pointwise_forward(out, in, w, b, B, C, H * W, OC);
        return;
    }
    const int CKK = C * K * K, OHW = g.OH * g.OW;
    conv_work cw = carve(work, &g, OC);
    const float *a = w;
    int kdim = CKK;
    if (b) { /* [w | b] against [col; ones] */
        for (int o = 0; o < OC; o++) {
            memcpy(cw.wx + (size_t)o * (CKK + 1), w + (size_t)o * CKK, (size_t)CKK * sizeof(float));
            cw.wx[(size_t)o * (CKK + 1) + CKK] = b[o];
        }
        a = cw.wx, kdim = CKK + 1;
    }
    for (int n = 0; n < B; n++) {
        fill_patches(&cw, in + (size_t)n * C * H * W, &g);
        /* out_b (OC,OHW) = [w|b] (OC,kdim) @ [col;1] (kdim,OHW) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, OHW, kdim, 1.0f, a, kdim, cw.col, OHW, 0.0f,
                    out + (size_t)n * OC * OHW, OHW);
    }
}

void dt_conv2d_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                        float *work, int B, int C, int H, int W, int OC, int K, int stride, int pad) {
    conv_geom g = geom(C, H, W, K, stride, pad);
    if (g.OH <= 0 || g.OW <= 0 || B <= 0 || OC <= 0) {
        if (din && B > 0) memset(din, 0, (size_t)B * C * H * W * sizeof(float));
        return;
    }
    if (is_pointwise(&g)) {
        pointwise_backward(din, dw, db, dout, in, w, B, C, H * W, OC);
        return;
    }
    const int CKK = C * K * K, OHW = g.OH * g.OW;
    conv_work cw = carve(work, &g, OC);
    const int grads = dw || db;
    if (grads) memset(cw.wx, 0, (size_t)(CKK + 1) * OC * sizeof(float));
    for (int n = 0; n < B; n++) {
        const float *dout_b = dout + (size_t)n * OC * OHW;
        if (grads) {
            /* [dw | db]^T (CKK+1,OC) += [col;1] (CKK+1,OHW) @ dout_b^T (OHW,OC) */
            fill_patches(&cw, in + (size_t)n * C * H * W, &g);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, CKK + 1, OC, OHW, 1.0f, cw.col, OHW, dout_b, OHW, 1.0f,
                        cw.wx, OC);
        }
        if (!din) continue;
        /* dcol (CKK,OHW) = w^T (CKK,OC) @ dout_b (OC,OHW) into the col rows, then fold into din_b */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CKK, OHW, OC, 1.0f, w, CKK, dout_b, OHW, 0.0f, cw.col,
                    OHW);
        float *din_b = din + (size_t)n * C * H * W;
        if (same_stride1(&g)) col2im_same(din_b, cw.col, &g);
        else col2im(din_b, cw.col, &g);
    }
    if (dw)
        for (int o = 0; o < OC; o++) {
            float *restrict d = dw + (size_t)o * CKK;
            const float *restrict t = cw.wx + o;
            for (int k = 0; k < CKK; k++) d[k] += t[(size_t)k * OC];
        }
    if (db)
        for (int o = 0; o < OC; o++) db[o] += cw.wx[(size_t)CKK * OC + o];
}
