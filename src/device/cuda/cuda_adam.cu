/* The cuda device's Adam/AdamW step (cuda_kernels.h dtc_adam), in its own file because it is
 * compiled with -ftz=true: every f32 operation flushes subnormal inputs and results to zero, as
 * the CPU step does under FTZ and DAZ (device/cpu_step.c adam_loop, whose arithmetic this follows
 * operation for operation; --fmad=false keeps the roundings the CPU's). */
#include "cuda_kernels.h"

#include <cuda_runtime.h>

namespace {

__global__ void k_adam(float *p, const float *g, float *m, float *v, size_t n, float b1, float b2, float eps,
                       float wd_l2, float shrink, float step, float inv_bc2_sqrt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float pi = p[i] * shrink, gi = g[i] + wd_l2 * pi;
        const float mi = b1 * m[i] + (1 - b1) * gi;
        const float vi = b2 * v[i] + (1 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step * mi / (sqrtf(vi) * inv_bc2_sqrt + eps);
    }
}

}  // namespace

extern "C" cudaError_t dtc_adam(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n, float b1,
                                float b2, float eps, float wd_l2, float shrink, float step, float inv_bc2_sqrt) {
    if (n == 0) return cudaSuccess;
    size_t nb = (n + 255) / 256;
    if (nb > 65535) nb = 65535;
    k_adam<<<(unsigned)nb, 256, 0, s>>>(p, g, m, v, n, b1, b2, eps, wd_l2, shrink, step, inv_bc2_sqrt);
    return cudaGetLastError();
}
