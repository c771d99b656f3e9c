/* cuBLASLt GEMMs and cuDNN convolutions for the cuda device (cuda_internal.h). Both libraries are
 * loaded with dlopen when a cuda device is created, not linked: libcublasLt alone is 540 MB, and
 * mapping it at every process start cost about 0.4 s a process here (measured: 10 starts of a
 * program linked with it, 4.1-5.4 s, against 0.02 s without), which the test suite's hundreds of
 * dtrain processes would pay without ever touching a GPU.
 *
 * GEMMs run f32 with f32 accumulation (CUBLAS_COMPUTE_32F: no TF32), the bias added by the
 * BIAS epilogue where there is one; each shape's descriptors and the heuristic's first algorithm
 * are cached, so a shape always runs the same algorithm (deterministic run to run on one GPU and
 * library version). Convolutions use cuDNN's legacy API with FMA math (no TF32) and the
 * deterministic algorithms: implicit GEMM forward, ALGO_1 for both backward passes. */
#include "device/cuda/cuda_internal.h"

#include <cublasLt.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DT_CUDA_LIBDIR
#define DT_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

#define LT_FUNCS(X)                                                                                               \
    X(cublasLtCreate)                                                                                             \
    X(cublasLtDestroy) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) \
        X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) X(cublasLtMatmulPreferenceCreate)            \
            X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulPreferenceDestroy)                            \
                X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul) X(cublasLtGetStatusString)
#define DNN_FUNCS(X)                                                                                                   \
    X(cudnnCreate)                                                                                                     \
    X(cudnnDestroy) X(cudnnSetStream) X(cudnnGetErrorString) X(cudnnCreateTensorDescriptor)                            \
        X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor) X(cudnnCreateFilterDescriptor)                   \
            X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor) X(cudnnCreateConvolutionDescriptor)          \
                X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionMathType) X(cudnnDestroyConvolutionDescriptor) \
                    X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnGetConvolutionBackwardDataWorkspaceSize)         \
                        X(cudnnGetConvolutionBackwardFilterWorkspaceSize) X(cudnnConvolutionForward)                   \
                            X(cudnnConvolutionBackwardData) X(cudnnConvolutionBackwardFilter)

#define DECL(f) static __typeof__(f) *p_##f;
LT_FUNCS(DECL)
DNN_FUNCS(DECL)
#undef DECL

enum { PLANS = 128, LT_WORKSPACE = 32 << 20 };

typedef struct {
    int key[12];
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    bool used;
} gemm_plan;

struct dtc_libs {
    void *lt_so, *dnn_so;
    cublasLtHandle_t lt;
    cudnnHandle_t dnn;
    void *lt_work;
    gemm_plan plans[PLANS];
    int nplans;
};

static void *open_in(const char *dir, size_t len, const char *name) {
    char path[1024];
    if (!len || len + strlen(name) + 2 > sizeof path) return NULL;
    snprintf(path, sizeof path, "%.*s/%s", (int)len, dir, name);
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

/* name from the loader's path, else from each directory of DTRAIN_CUDA_LIBS (colon-separated: e.g.
 * the lib folders of pip's nvidia-cublas and nvidia-cudnn wheels), else from the toolkit's. */
static void *open_lib(const char *name) {
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    for (const char *d = getenv("DTRAIN_CUDA_LIBS"); !h && d && *d; d += strcspn(d, ":"), d += *d == ':') {
        h = open_in(d, strcspn(d, ":"), name);
    }
    return h ? h : open_in(DT_CUDA_LIBDIR, strlen(DT_CUDA_LIBDIR), name);
}

static dt_status load(void *so, const char *sym, void **out, const char *lib) {
    *out = so ? dlsym(so, sym) : NULL;
    return *out ? DT_OK : dt_error(DT_ENOTSUP, "device cuda: %s has no %s (need the CUDA 13 toolkit's)", lib, sym);
}

static void lt_check(cublasStatus_t s, const char *what, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "dtrain: cuda device: %s failed (cuda_libs.c:%d): %s\n", what, line,
            p_cublasLtGetStatusString ? p_cublasLtGetStatusString(s) : "?");
    abort(); /* as dtc_check: a failed GEMM leaves nothing trustworthy to continue with */
}
static void dnn_check(cudnnStatus_t s, const char *what, int line) {
    if (s == CUDNN_STATUS_SUCCESS) return;
    fprintf(stderr, "dtrain: cuda device: %s failed (cuda_libs.c:%d): %s\n", what, line,
            p_cudnnGetErrorString ? p_cudnnGetErrorString(s) : "?");
    abort();
}
#define LT(call) lt_check(p_##call, #call, __LINE__)
#define DNN(call) dnn_check(p_##call, #call, __LINE__)

dt_status dtc_libs_open(dtc_dev *c) {
    dtc_libs *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ENOMEM, "device cuda: out of host memory");
    c->libs = l;
    l->lt_so = open_lib("libcublasLt.so.13");
    l->dnn_so = open_lib("libcudnn.so.9");
    if (!l->lt_so || !l->dnn_so)
        return dt_error(DT_ENOTSUP,
                        "device cuda: cannot load %s (%s): install the CUDA 13 toolkit's cuBLASLt and "
                        "cuDNN 9 (searched the loader path, DTRAIN_CUDA_LIBS and " DT_CUDA_LIBDIR ")",
                        !l->lt_so ? "libcublasLt.so.13" : "libcudnn.so.9", dlerror());
#define LOAD_LT(f) DT_TRY(load(l->lt_so, #f, (void **)&p_##f, "libcublasLt.so.13"));
#define LOAD_DNN(f) DT_TRY(load(l->dnn_so, #f, (void **)&p_##f, "libcudnn.so.9"));
    LT_FUNCS(LOAD_LT)
    DNN_FUNCS(LOAD_DNN)
#undef LOAD_LT
#undef LOAD_DNN
    if (p_cublasLtCreate(&l->lt) != CUBLAS_STATUS_SUCCESS)
        return dt_error(DT_ENOTSUP, "device cuda:%d: cublasLtCreate failed", c->ordinal);
    const cudnnStatus_t ds = p_cudnnCreate(&l->dnn);
    if (ds != CUDNN_STATUS_SUCCESS)
        return dt_error(DT_ENOTSUP, "device cuda:%d: cudnnCreate failed: %s", c->ordinal, p_cudnnGetErrorString(ds));
    DNN(cudnnSetStream(l->dnn, c->compute));
    if (cudaMalloc(&l->lt_work, LT_WORKSPACE) != cudaSuccess)
        return dt_error(DT_ENOTSUP, "device cuda:%d: no room for cuBLASLt's %d MiB workspace", c->ordinal,
                        LT_WORKSPACE >> 20);
    return DT_OK;
}

void dtc_libs_close(dtc_dev *c) {
    dtc_libs *l = c->libs;
    if (!l) return;
    for (int i = 0; i < l->nplans; i++) {
        gemm_plan *p = &l->plans[i];
        p_cublasLtMatrixLayoutDestroy(p->a), p_cublasLtMatrixLayoutDestroy(p->b), p_cublasLtMatrixLayoutDestroy(p->c);
        p_cublasLtMatmulDescDestroy(p->desc);
    }
    if (l->lt_work) cudaFree(l->lt_work);
    if (l->lt) p_cublasLtDestroy(l->lt);
    if (l->dnn) p_cudnnDestroy(l->dnn);
    /* the libraries stay mapped: their own destructors run at exit */
    free(l);
    c->libs = NULL;
}

/* The largest power of two (at most 16) that every pointer's address is a multiple of. */
static int alignment(const void *a, const void *b, const void *c, const void *d) {
    const uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | 16u;
    return (int)(u & -u);
}

static gemm_plan *plan_for(dtc_libs *l, const int *key) {
    for (int i = 0; i < l->nplans; i++)
        if (!memcmp(l->plans[i].key, key, sizeof l->plans[i].key)) return &l->plans[i];
    if (l->nplans == PLANS) { /* full: start over (a model has far fewer shapes) */
        for (int i = 0; i < l->nplans; i++) {
            gemm_plan *p = &l->plans[i];
            p_cublasLtMatrixLayoutDestroy(p->a), p_cublasLtMatrixLayoutDestroy(p->b),
                p_cublasLtMatrixLayoutDestroy(p->c);
            p_cublasLtMatmulDescDestroy(p->desc);
        }
        l->nplans = 0;
    }
    gemm_plan *p = &l->plans[l->nplans];
    memset(p, 0, sizeof *p);
    memcpy(p->key, key, sizeof p->key);
    const bool ta = key[0], tb = key[1], bias = key[9];
    const int m = key[2], n = key[3], k = key[4], lda = key[5], ldb = key[6], ldc = key[7], align = key[8];
    LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    }
    LT(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, ta ? k : m, ta ? m : k, lda));
    LT(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, tb ? n : k, tb ? k : n, ldb));
    LT(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, m, n, ldc));
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = LT_WORKSPACE;
    const uint32_t al = (uint32_t)align;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(l->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &found));
    p_cublasLtMatmulPreferenceDestroy(pref);
    if (!found) {
        fprintf(stderr,
                "dtrain: cuda device: cuBLASLt has no f32 algorithm for m=%d n=%d k=%d (ta=%d tb=%d, "
                "alignment %d, bias %d)\n",
                m, n, k, ta, tb, align, bias);
        abort();
    }
    p->algo = res.algo;
    l->nplans++;
    return p;
}

void dtc_gemm(dtc_dev *c, bool ta, bool tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc, const float *bias) {
    if (m <= 0 || n <= 0) return;
    dtc_libs *l = c->libs;
    const int key[12] = {ta, tb, m, n, k, lda, ldb, ldc, alignment(A, B, C, bias), bias != NULL, beta != 0.0f, 0};
    pthread_mutex_lock(&c->lock);
    gemm_plan *p = plan_for(l, key);
    if (bias) LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    LT(cublasLtMatmul(l->lt, p->desc, &alpha, A, p->a, B, p->b, &beta, C, p->c, C, p->c, &p->algo, l->lt_work,
                      LT_WORKSPACE, c->compute));
    pthread_mutex_unlock(&c->lock);
    DTC_CHECK(c, cudaGetLastError());
}

/* ---- cuDNN convolutions ---- */

typedef struct {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
} conv_desc;

static void conv_make(conv_desc *d, int B, int C, int H, int W, int OC, int K, int stride, int pad) {
    const int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
    DNN(cudnnCreateTensorDescriptor(&d->x));
    DNN(cudnnCreateTensorDescriptor(&d->y));
    DNN(cudnnCreateFilterDescriptor(&d->w));
    DNN(cudnnCreateConvolutionDescriptor(&d->conv));
    DNN(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, C, H, W));
    DNN(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, OC, OH, OW));
    DNN(cudnnSetFilter4dDescriptor(d->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, OC, C, K, K));
    DNN(cudnnSetConvolution2dDescriptor(d->conv, pad, pad, stride, stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionMathType(d->conv, CUDNN_FMA_MATH)); /* no tensor cores: no TF32 rounding */
}

static void conv_free(conv_desc *d) {
    p_cudnnDestroyTensorDescriptor(d->x), p_cudnnDestroyTensorDescriptor(d->y);
    p_cudnnDestroyFilterDescriptor(d->w), p_cudnnDestroyConvolutionDescriptor(d->conv);
}

static const cudnnConvolutionFwdAlgo_t FWD = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
static const cudnnConvolutionBwdDataAlgo_t BWD_DATA = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
static const cudnnConvolutionBwdFilterAlgo_t BWD_FILTER = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;

size_t dtc_conv_workspace(dtc_dev *c, int B, int C, int H, int W, int OC, int K, int stride, int pad) {
    if (B <= 0 || C <= 0 || OC <= 0 || (H + 2 * pad - K) < 0 || (W + 2 * pad - K) < 0) return 0;
    conv_desc d;
    conv_make(&d, B, C, H, W, OC, K, stride, pad);
    size_t f = 0, bd = 0, bf = 0;
    cudnnHandle_t h = c->libs->dnn;
    DNN(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, FWD, &f));
    DNN(cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, BWD_DATA, &bd));
    DNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, BWD_FILTER, &bf));
    conv_free(&d);
    size_t m = f > bd ? f : bd;
    m = m > bf ? m : bf;
    return (m + sizeof(float) - 1) / sizeof(float);
}

void dtc_conv_forward(dtc_dev *c, float *out, const float *in, const float *w, float *work, size_t work_floats, int B,
                      int C, int H, int W, int OC, int K, int stride, int pad) {
    conv_desc d;
    conv_make(&d, B, C, H, W, OC, K, stride, pad);
    const float one = 1.0f, zero = 0.0f;
    DNN(cudnnConvolutionForward(c->libs->dnn, &one, d.x, in, d.w, w, d.conv, FWD, work, work_floats * sizeof(float),
                                &zero, d.y, out));
    conv_free(&d);
    DTC_CHECK(c, cudaGetLastError());
}

void dtc_conv_backward(dtc_dev *c, float *din, float *dw, const float *dout, const float *in, const float *w,
                       float *work, size_t work_floats, int B, int C, int H, int W, int OC, int K, int stride,
                       int pad) {
    conv_desc d;
    conv_make(&d, B, C, H, W, OC, K, stride, pad);
    const float one = 1.0f, zero = 0.0f;
    const size_t wb = work_floats * sizeof(float);
    if (dw) /* dw accumulates (beta 1) */
        DNN(cudnnConvolutionBackwardFilter(c->libs->dnn, &one, d.x, in, d.y, dout, d.conv, BWD_FILTER, work, wb, &one,
                                           d.w, dw));
    if (din) /* din is overwritten */
        DNN(cudnnConvolutionBackwardData(c->libs->dnn, &one, d.w, w, d.y, dout, d.conv, BWD_DATA, work, wb, &zero, d.x,
                                         din));
    conv_free(&d);
    DTC_CHECK(c, cudaGetLastError());
}
