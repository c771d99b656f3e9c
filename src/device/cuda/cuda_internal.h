/* The cuda device's state and the functions its files share (cuda_device.c: memory, streams and
 * the step primitives; cuda_libs.c: cuBLASLt and cuDNN, loaded with dlopen; cuda_table.c: the
 * kernel table). Private to src/device/cuda/. */
#ifndef DT_DEVICE_CUDA_INTERNAL_H
#define DT_DEVICE_CUDA_INTERNAL_H

#include "device/cuda/cuda.h"
#include "device/cuda/cuda_kernels.h"

#include <pthread.h>

typedef struct dtc_libs dtc_libs; /* cuBLASLt and cuDNN handles (cuda_libs.c) */

typedef struct {
    dt_dev base;
    int ordinal;
    char name[320]; /* the GPU's name and sm, for messages */
    cudaStream_t compute, comm;
    cudaEvent_t ev_compute, ev_comm;
    double *scratch; /* DTC_SCRATCH_BLOCKS doubles + an int (cuda_kernels.h) */
    double *rows;    /* xent's per-row losses, rows_cap doubles, grown on demand */
    size_t rows_cap;
    pthread_mutex_t lock;     /* the block table and the scratch growth */
    struct dtc_block *blocks; /* live allocations: pointer -> size (open hash) */
    size_t nblocks, cap;
    bool sync_each; /* DTRAIN_CUDA_SYNC=1: wait after every call (to find a failing kernel) */
    dtc_libs *libs;
    dt_kernel_table table; /* what kernels() returns */
    bool table_ready;
} dtc_dev;

/* The one cuda device the kernel table runs on (its slots take no device argument). */
extern dtc_dev *dtc_current;

/* Checks a CUDA call made by a kernel entry point: on an error, prints what failed (the call, the
 * file and line, CUDA's message, how to find the kernel with DTRAIN_CUDA_SYNC=1) and aborts, since
 * the device's state is then lost and every later result would be garbage. With sync_each, also
 * waits for the stream so an asynchronous fault is reported at the call that caused it. */
void dtc_check(dtc_dev *c, cudaError_t e, const char *what, const char *file, int line);
#define DTC_CHECK(c, call) dtc_check((c), (call), #call, __FILE__, __LINE__)

/* xent's per-row scratch of at least n doubles (grown with the stream synchronised). */
double *dtc_rows(dtc_dev *c, size_t n);

/* cuda_libs.c: loads cuBLASLt and cuDNN and makes the handles on c's compute stream; DT_ENOTSUP
 * naming the library and what to install where one is missing. */
dt_status dtc_libs_open(dtc_dev *c);
void dtc_libs_close(dtc_dev *c);
/* C (m x n, column-major, ldc m) = alpha op(A) op(B) + beta C, f32 with f32 accumulation (no
 * TF32), optional bias[m] added to each column (beta must then be 0). */
void dtc_gemm(dtc_dev *c, bool ta, bool tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc, const float *bias);
/* cuDNN convolutions, NCHW f32, deterministic algorithms; workspace in floats. */
size_t dtc_conv_workspace(dtc_dev *c, int B, int C, int H, int W, int OC, int K, int stride, int pad);
void dtc_conv_forward(dtc_dev *c, float *out, const float *in, const float *w, float *work, size_t work_floats, int B,
                      int C, int H, int W, int OC, int K, int stride, int pad);
void dtc_conv_backward(dtc_dev *c, float *din, float *dw, const float *dout, const float *in, const float *w,
                       float *work, size_t work_floats, int B, int C, int H, int W, int OC, int K, int stride, int pad);

/* cuda_table.c: fills c->table. */
void dtc_table_init(dtc_dev *c);

#endif
