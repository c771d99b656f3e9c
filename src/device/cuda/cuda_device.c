/* The cuda device (--device cuda, cuda:N; docs/device.md "cuda"): model memory from cudaMalloc
 * (charged against --mem-limit), a compute stream and a comm stream (cuda.h), and the training-step
 * primitives as CUDA kernels (cuda_kernels.cu). Without a driver or a GPU, create fails with
 * DT_ENOTSUP saying what CUDA reported and that --device cpu runs without one (exit 78 from
 * dtrain train). cuBLASLt and cuDNN are loaded when a device is created (cuda_libs.c), so a
 * process that never asks for the GPU does not pay for mapping them.
 *
 * The default ordinal is the local rank (DTRAIN_LOCAL_RANK, set by the launcher) modulo the GPUs
 * present, so local workers spread over the GPUs and several share one when there are fewer. */
#include "device/cuda/cuda_internal.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dtc_dev *dtc_current;

typedef struct dtc_block {
    void *p;
    size_t bytes;
} dtc_block;

/* The device of an entry point, made current on the calling thread (the comm and loader threads
 * call the device too; cudaSetDevice is per thread, and cheap when it changes nothing). */
static dtc_dev *cdev(dt_dev *d) {
    dtc_dev *c = (dtc_dev *)d;
    cudaSetDevice(c->ordinal);
    return c;
}

void dtc_check(dtc_dev *c, cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess && c && c->sync_each) e = cudaStreamSynchronize(c->compute);
    if (e == cudaSuccess) return;
    fprintf(stderr, "dtrain: cuda device %d (%s): %s failed at %s:%d: %s (%s)%s\n", c ? c->ordinal : -1,
            c ? c->name : "?", what, file, line, cudaGetErrorString(e), cudaGetErrorName(e),
            c && c->sync_each ? "" : "; rerun with DTRAIN_CUDA_SYNC=1 to stop at the kernel that failed");
    abort(); /* a CUDA error is sticky: the context is lost and no later result could be trusted */
}

/* ---- the block table: device pointer -> size, for free's uncharge ---- */

static size_t slot_of(const dtc_dev *c, const void *p) { return ((uintptr_t)p >> 6) * 0x9E3779B97F4A7C15ull % c->cap; }

static bool table_put(dtc_dev *c, void *p, size_t bytes) {
    if ((c->nblocks + 1) * 2 > c->cap) {
        const size_t ncap = c->cap ? c->cap * 2 : 256;
        dtc_block *nb = calloc(ncap, sizeof *nb), *old = c->blocks;
        if (!nb) return false;
        const size_t ocap = c->cap;
        c->blocks = nb, c->cap = ncap;
        for (size_t i = 0; i < ocap; i++)
            if (old[i].p) {
                size_t j = slot_of(c, old[i].p);
                while (c->blocks[j].p) j = (j + 1) % c->cap;
                c->blocks[j] = old[i];
            }
        free(old);
    }
    size_t j = slot_of(c, p);
    while (c->blocks[j].p) j = (j + 1) % c->cap;
    c->blocks[j] = (dtc_block){p, bytes};
    c->nblocks++;
    return true;
}

/* Removes p; its size, or 0 when p is not a live block. */
static size_t table_take(dtc_dev *c, void *p) {
    if (!c->cap) return 0;
    size_t j = slot_of(c, p);
    while (c->blocks[j].p && c->blocks[j].p != p) j = (j + 1) % c->cap;
    if (!c->blocks[j].p) return 0;
    const size_t bytes = c->blocks[j].bytes;
    c->blocks[j].p = NULL;
    c->nblocks--;
    /* re-insert the rest of the cluster (linear probing deletion) */
    for (size_t k = (j + 1) % c->cap; c->blocks[k].p; k = (k + 1) % c->cap) {
        dtc_block b = c->blocks[k];
        c->blocks[k].p = NULL;
        size_t q = slot_of(c, b.p);
        while (c->blocks[q].p) q = (q + 1) % c->cap;
        c->blocks[q] = b;
    }
    return bytes;
}

static void *cuda_alloc(dt_dev *d, size_t bytes) {
    dtc_dev *c = cdev(d);
    const size_t len = bytes ? (bytes + 63) / 64 * 64 : 64;
    if (dt_mem_charge(len, "cuda device block") != DT_OK) return NULL;
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, len); /* 256-byte aligned */
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        dt_mem_uncharge(len);
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        dt_error(DT_ENOMEM,
                 "cuda device %d: cannot allocate %zu bytes (%s; %zu of %zu MiB free): use a smaller "
                 "model or batch",
                 c->ordinal, bytes, cudaGetErrorString(e), free_b >> 20, total >> 20);
        return NULL;
    }
    pthread_mutex_lock(&c->lock);
    const bool ok = table_put(c, p, len);
    pthread_mutex_unlock(&c->lock);
    if (!ok) {
        cudaFree(p);
        dt_mem_uncharge(len);
        dt_error(DT_ENOMEM, "cuda device %d: no host memory for the block table", c->ordinal);
        return NULL;
    }
    return p;
}

static void cuda_free(dt_dev *d, void *p) {
    if (!p) return;
    dtc_dev *c = cdev(d);
    pthread_mutex_lock(&c->lock);
    const size_t len = table_take(c, p);
    pthread_mutex_unlock(&c->lock);
    if (!len) {
        fprintf(stderr, "dtrain: cuda device %d: free of %p, which is not a live block of this device\n", c->ordinal,
                p);
        abort(); /* a double free or a foreign pointer: a programmer error */
    }
    DTC_CHECK(c, cudaFree(p)); /* waits for the kernels that may still use it */
    dt_mem_uncharge(len);
}

static void cuda_upload(dt_dev *d, void *dst, const void *src, size_t bytes) {
    dtc_dev *c = cdev(d);
    /* from pageable memory: returns once src has been staged, so the caller may reuse it */
    if (bytes) DTC_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->compute));
}

static void cuda_download(dt_dev *d, void *dst, const void *src, size_t bytes) {
    dtc_dev *c = cdev(d);
    if (!bytes) return;
    DTC_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->compute));
    DTC_CHECK(c, cudaStreamSynchronize(c->compute));
}

static void cuda_copy(dt_dev *d, void *dst, const void *src, size_t bytes) {
    dtc_dev *c = cdev(d);
    if (bytes) DTC_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->compute));
}

static void cuda_fill_f32(dt_dev *d, float *x, float v, size_t n) {
    dtc_dev *c = cdev(d);
    if (v == 0.0f && !signbit(v)) DTC_CHECK(c, cudaMemsetAsync(x, 0, n * sizeof *x, c->compute));
    else DTC_CHECK(c, dtc_fill_f32(c->compute, x, v, n));
}

static void cuda_synchronize(dt_dev *d) {
    dtc_dev *c = cdev(d);
    DTC_CHECK(c, cudaStreamSynchronize(c->comm));
    DTC_CHECK(c, cudaStreamSynchronize(c->compute));
}

static void cuda_accumulate(dt_dev *d, float *y, const float *x, size_t n) {
    DTC_CHECK(cdev(d), dtc_accumulate(cdev(d)->compute, y, x, n));
}
static void cuda_scale(dt_dev *d, float *x, float s, size_t n) {
    DTC_CHECK(cdev(d), dtc_scale(cdev(d)->compute, x, s, n));
}
static void cuda_unscale(dt_dev *d, float *x, float inv, size_t n, int32_t *flag) {
    DTC_CHECK(cdev(d), dtc_unscale(cdev(d)->compute, x, inv, n, flag));
}
static void cuda_sqnorm(dt_dev *d, double *out, const float *x, size_t n) {
    DTC_CHECK(cdev(d), dtc_sqnorm(cdev(d)->compute, out, x, n, cdev(d)->scratch));
}
static void cuda_cast_f32_bf16(dt_dev *d, uint16_t *o, const float *x, size_t n) {
    DTC_CHECK(cdev(d), dtc_cast_f32_bf16(cdev(d)->compute, o, x, n));
}
static void cuda_cast_bf16_f32(dt_dev *d, float *o, const uint16_t *x, size_t n) {
    DTC_CHECK(cdev(d), dtc_cast_bf16_f32(cdev(d)->compute, o, x, n));
}
static void cuda_cast_f32_f16(dt_dev *d, uint16_t *o, const float *x, size_t n) {
    DTC_CHECK(cdev(d), dtc_cast_f32_f16(cdev(d)->compute, o, x, n));
}
static void cuda_cast_f16_f32(dt_dev *d, float *o, const uint16_t *x, size_t n) {
    DTC_CHECK(cdev(d), dtc_cast_f16_f32(cdev(d)->compute, o, x, n));
}

static void cuda_sgd_step(dt_dev *d, const dt_step_args *a, float *p, const float *g, float *buf, size_t n) {
    const float mu_prev = a->first_step ? 0.0f : a->momentum;
    DTC_CHECK(cdev(d),
              dtc_sgd(cdev(d)->compute, p, g, buf, n, a->lr, a->weight_decay, a->momentum, mu_prev, a->nesterov));
}

/* The scalars as cpu_step.c's adam_loop computes them on the host (double pow and sqrt). */
static void cuda_adam_step(dt_dev *d, const dt_step_args *a, float *p, const float *g, float *m, float *v, size_t n) {
    const double t = (double)(a->t + 1);
    const float bc1 = (float)(1.0 - pow(a->beta1, t));
    const float inv_bc2_sqrt = (float)(1.0 / sqrt(1.0 - pow(a->beta2, t)));
    const float step = a->lr / bc1;
    const float shrink = a->decoupled ? 1.0f - a->lr * a->weight_decay : 1.0f;
    const float wd_l2 = a->decoupled ? 0.0f : a->weight_decay;
    DTC_CHECK(cdev(d),
              dtc_adam(cdev(d)->compute, p, g, m, v, n, a->beta1, a->beta2, a->eps, wd_l2, shrink, step, inv_bc2_sqrt));
}

static const dt_kernel_table *cuda_kernels(dt_dev *d, const dt_kernel_table *cpu) {
    dtc_dev *c = cdev(d);
    if (cpu && cpu->precision != DT_F32) {
        dt_error(DT_ENOTSUP,
                 "cuda device: `precision` %s is not supported on the GPU yet (its GEMMs run f32); use "
                 "`precision` fp32",
                 cpu->precision == DT_BF16 ? "bf16" : "fp16");
        return NULL;
    }
    if (dtc_current && dtc_current != c) {
        dt_error(DT_ENOTSUP, "cuda device: a process runs one cuda device's kernels (this one has cuda:%d already)",
                 dtc_current->ordinal);
        return NULL;
    }
    dtc_current = c;
    if (!c->table_ready) dtc_table_init(c), c->table_ready = true;
    return &c->table;
}

static const dt_device_ops cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .fill_f32 = cuda_fill_f32,
    .synchronize = cuda_synchronize,
    .accumulate = cuda_accumulate,
    .scale = cuda_scale,
    .unscale = cuda_unscale,
    .sqnorm = cuda_sqnorm,
    .cast_f32_bf16 = cuda_cast_f32_bf16,
    .cast_bf16_f32 = cuda_cast_bf16_f32,
    .cast_f32_f16 = cuda_cast_f32_f16,
    .cast_f16_f32 = cuda_cast_f16_f32,
    .sgd_step = cuda_sgd_step,
    .adam_step = cuda_adam_step,
    .kernels = cuda_kernels,
};

double *dtc_rows(dtc_dev *c, size_t n) {
    pthread_mutex_lock(&c->lock);
    if (n > c->rows_cap) {
        DTC_CHECK(c, cudaStreamSynchronize(c->compute));
        DTC_CHECK(c, cudaFree(c->rows));
        c->rows = NULL;
        const size_t cap = n < 4096 ? 4096 : n;
        DTC_CHECK(c, cudaMalloc((void **)&c->rows, cap * sizeof(double)));
        c->rows_cap = cap;
    }
    double *r = c->rows;
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* ---- streams for the comm side (cuda.h) ---- */

extern const dt_device_kind dt_device_kind_cuda;

bool dt_cuda_is(const dt_dev *d) { return d && d->ops == &cuda_ops; }
int dt_cuda_ordinal(const dt_dev *d) { return ((const dtc_dev *)d)->ordinal; }

void dt_cuda_streams(const dt_dev *d, cudaStream_t *compute, cudaStream_t *comm) {
    const dtc_dev *c = (const dtc_dev *)d;
    if (compute) *compute = c->compute;
    if (comm) *comm = c->comm;
}

void dt_cuda_comm_after_compute(dt_dev *d) {
    dtc_dev *c = cdev(d);
    DTC_CHECK(c, cudaEventRecord(c->ev_compute, c->compute));
    DTC_CHECK(c, cudaStreamWaitEvent(c->comm, c->ev_compute, 0));
}

void dt_cuda_compute_after_comm(dt_dev *d) {
    dtc_dev *c = cdev(d);
    DTC_CHECK(c, cudaEventRecord(c->ev_comm, c->comm));
    DTC_CHECK(c, cudaStreamWaitEvent(c->compute, c->ev_comm, 0));
}

/* ---- the kind ---- */

/* The ordinal from the options ("" or a number) and the local rank; DT_EINVAL on a bad option. */
static dt_status pick_ordinal(const char *opt, int count, int *out) {
    if (opt && *opt) {
        char *end;
        errno = 0;
        const long v = strtol(opt, &end, 10);
        if (errno || *end || end == opt || v < 0)
            return dt_error(DT_EINVAL, "device cuda: '%s' is not a GPU number (cuda:N, e.g. cuda:0)", opt);
        if (v >= count)
            return dt_error(DT_ENOTSUP, "device cuda:%ld: this machine has %d GPU%s (cuda:0 to cuda:%d)", v, count,
                            count == 1 ? "" : "s", count - 1);
        *out = (int)v;
        return DT_OK;
    }
    const char *lr = getenv("DTRAIN_LOCAL_RANK");
    const int local = lr ? atoi(lr) : 0;
    *out = (local < 0 ? 0 : local) % count;
    return DT_OK;
}

static dt_status no_gpu(cudaError_t e, int count) {
    if (e == cudaSuccess && count == 0)
        return dt_error(DT_ENOTSUP, "device cuda: no CUDA GPU found (the driver reports 0 devices): `device` cuda "
                                    "needs an NVIDIA GPU and its driver; use `device` cpu");
    return dt_error(DT_ENOTSUP,
                    "device cuda: no usable GPU: the CUDA runtime says \"%s\" (%s): `device` cuda needs "
                    "an NVIDIA GPU and a driver for CUDA %d.%d or newer; use `device` cpu",
                    cudaGetErrorString(e), cudaGetErrorName(e), CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
}

static void cuda_destroy(dt_dev *d);

static dt_status cuda_setup(dtc_dev *c) {
    struct cudaDeviceProp prop;
    if (cudaSetDevice(c->ordinal) != cudaSuccess || cudaGetDeviceProperties(&prop, c->ordinal) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->comm, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&c->ev_comm, cudaEventDisableTiming) != cudaSuccess ||
        cudaMalloc((void **)&c->scratch, DTC_SCRATCH_BLOCKS * sizeof(double) + sizeof(int)) != cudaSuccess) {
        const cudaError_t e = cudaGetLastError();
        return dt_error(DT_ENOTSUP, "device cuda:%d: cannot set it up: %s", c->ordinal, cudaGetErrorString(e));
    }
    snprintf(c->name, sizeof c->name, "%s, sm_%d%d", prop.name, prop.major, prop.minor);
    if (prop.major < 9)
        return dt_error(DT_ENOTSUP,
                        "device cuda:%d (%s): this build has kernels for sm_90 (Hopper) and PTX for "
                        "compute_90 only; rebuild with CUDA_ARCH for this GPU, or use `device` cpu",
                        c->ordinal, c->name);
    return dtc_libs_open(c);
}

static dt_status cuda_create(dt_dev **out, const char *options) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) return no_gpu(e, count);
    int ordinal = 0;
    DT_TRY(pick_ordinal(options, count, &ordinal));
    dtc_dev *c = calloc(1, sizeof *c);
    if (!c) return dt_error(DT_ENOMEM, "device cuda: out of host memory");
    c->ordinal = ordinal;
    c->base.ops = &cuda_ops;
    c->base.host_memory = false;
    pthread_mutex_init(&c->lock, NULL);
    const char *sync = getenv("DTRAIN_CUDA_SYNC");
    c->sync_each = sync && *sync && strcmp(sync, "0");
    const dt_status s = cuda_setup(c);
    if (s != DT_OK) {
        cuda_destroy(&c->base);
        return s;
    }
    *out = &c->base;
    return DT_OK;
}

static void cuda_destroy(dt_dev *d) {
    dtc_dev *c = cdev(d);
    if (c->compute) cudaStreamSynchronize(c->compute);
    if (c->comm) cudaStreamSynchronize(c->comm);
    dtc_libs_close(c);
    for (size_t i = 0; i < c->cap; i++)
        if (c->blocks[i].p) cudaFree(c->blocks[i].p), dt_mem_uncharge(c->blocks[i].bytes);
    free(c->blocks);
    if (c->rows) cudaFree(c->rows);
    if (c->scratch) cudaFree(c->scratch);
    if (c->ev_compute) cudaEventDestroy(c->ev_compute);
    if (c->ev_comm) cudaEventDestroy(c->ev_comm);
    if (c->compute) cudaStreamDestroy(c->compute);
    if (c->comm) cudaStreamDestroy(c->comm);
    if (dtc_current == c) dtc_current = NULL;
    pthread_mutex_destroy(&c->lock);
    free(c);
}

const dt_device_kind dt_device_kind_cuda = {
    .name = "cuda",
    .help = "an NVIDIA GPU (cuda:N; default the local rank's): cuBLASLt GEMMs, cuDNN convolutions, own kernels",
    .options = "N",
    .create = cuda_create,
    .destroy = cuda_destroy,
};
