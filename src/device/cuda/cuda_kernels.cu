/* The cuda device's own kernels (cuda_kernels.h): the training-step primitives but Adam
 * (cuda_adam.cu), and every op of the kernel table that is not a GEMM or a convolution (those go to
 * cuBLASLt and cuDNN, cuda_libs.c). Straightforward first versions, written for the same results as
 * the CPU kernels: compiled with --fmad=false (no contraction: the CPU build has none in ISO C
 * mode), elementwise kernels in the CPU's operation order (bitwise where the math functions are
 * IEEE: +, *, /, sqrt), reductions that the CPU runs in order (bias and embedding gradients,
 * pooling backward) as one thread walking the same order (bitwise), and the rest as fixed-shape
 * block trees: deterministic run to run, not the CPU's rounding. No atomics anywhere. */
#include "cuda_kernels.h"

#include <cuda_runtime.h>
#include <math.h>

namespace {

const int TPB = 256;  // threads per block of the elementwise kernels

unsigned blocks_for(size_t n) {
    size_t b = (n + TPB - 1) / TPB;
    if (b < 1) b = 1;
    return b > 65535u ? 65535u : (unsigned)b;
}

#define GRID_LOOP(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), in a fixed tree; every
// thread gets it. Safe to call more than once per kernel.
template <typename T> __device__ T block_sum(T v) {
    __shared__ T sh[33];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        T t = lane < nw ? sh[lane] : T(0);
        for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(0xffffffffu, t, o);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    return sh[32];
}

// The max as the CPU takes it (a > m replaces m: NaN never does), over the block.
__device__ float max_of(float a, float b) { return b > a ? b : a; }
__device__ float block_max(float v) {
    __shared__ float sh[33];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v = max_of(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? sh[lane] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) t = max_of(t, __shfl_down_sync(0xffffffffu, t, o));
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    return sh[32];
}

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = max_of(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---- step primitives ----

__global__ void k_fill(float *x, float v, size_t n) { GRID_LOOP(i, n) x[i] = v; }
__global__ void k_accumulate(float *y, const float *x, size_t n) { GRID_LOOP(i, n) y[i] += x[i]; }
__global__ void k_scale(float *x, float v, size_t n) { GRID_LOOP(i, n) x[i] *= v; }

__global__ void k_nonfinite(const float *x, size_t n, int32_t *flag) {
    GRID_LOOP(i, n) if (!isfinite(x[i])) *flag = 1;  // every writer writes 1: no race on the value
}

__global__ void k_scale_if_ok(float *x, float v, size_t n, const int32_t *flag) {
    if (*flag) return;
    GRID_LOOP(i, n) x[i] *= v;
}

__global__ void k_sqnorm_part(double *part, const float *x, size_t n) {
    double s = 0;
    GRID_LOOP(i, n) s += (double)x[i] * x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sum_parts(double *out, const double *part, int nparts) {
    double s = 0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = block_sum(s);
    if (threadIdx.x == 0) *out = s;
}

__device__ uint16_t to_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ uint16_t to_f16(float x) {
    const uint32_t u = __float_as_uint(x), sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) return (uint16_t)(sign | __float2uint_rn(__uint_as_float(a) * 16777216.0f));
    a += 0xc8000fffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (a >> 13));
}

__device__ float from_f16(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (e == 0) {
        const float f = (float)mant * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (mant << 13));
}

__global__ void k_f32_bf16(uint16_t *o, const float *x, size_t n) { GRID_LOOP(i, n) o[i] = to_bf16(x[i]); }
__global__ void k_bf16_f32(float *o, const uint16_t *x, size_t n) {
    GRID_LOOP(i, n) o[i] = __uint_as_float((uint32_t)x[i] << 16);
}
__global__ void k_f32_f16(uint16_t *o, const float *x, size_t n) { GRID_LOOP(i, n) o[i] = to_f16(x[i]); }
__global__ void k_f16_f32(float *o, const uint16_t *x, size_t n) { GRID_LOOP(i, n) o[i] = from_f16(x[i]); }

__global__ void k_sgd(float *p, const float *g, float *buf, size_t n, float lr, float wd, float mu, float mu_prev,
                      int nesterov) {
    GRID_LOOP(i, n) {
        if (mu == 0.0f) {
            p[i] -= lr * (g[i] + wd * p[i]);
        } else if (nesterov) {
            const float dd = g[i] + wd * p[i], b = mu_prev * buf[i] + dd;
            buf[i] = b;
            p[i] -= lr * (dd + mu * b);
        } else {
            const float b = mu_prev * buf[i] + (g[i] + wd * p[i]);
            buf[i] = b;
            p[i] -= lr * b;
        }
    }
}

// ---- activations, dropout, add ----

const float SQRT1_2 = 0.70710678118654752440f, INV_SQRT_2PI = 0.39894228040143267794f;

__global__ void k_relu_f(float *o, const float *x, size_t n) { GRID_LOOP(i, n) o[i] = x[i] > 0.0f ? x[i] : 0.0f; }
__global__ void k_relu_b(float *d, const float *g, const float *x, size_t n) {
    GRID_LOOP(i, n) d[i] = x[i] > 0.0f ? g[i] : 0.0f;
}
__global__ void k_gelu_f(float *o, const float *x, size_t n) {
    GRID_LOOP(i, n) {
        const float v = x[i];
        o[i] = 0.5f * v * (1.0f + erff(v * SQRT1_2));
    }
}
__global__ void k_gelu_b(float *d, const float *g, const float *x, size_t n) {
    GRID_LOOP(i, n) {
        const float v = x[i], cdf = 0.5f * (1.0f + erff(v * SQRT1_2)), pdf = INV_SQRT_2PI * expf(-0.5f * v * v);
        d[i] = g[i] * (cdf + v * pdf);
    }
}
__global__ void k_tanh_f(float *o, const float *x, size_t n) { GRID_LOOP(i, n) o[i] = tanhf(x[i]); }
__global__ void k_tanh_b(float *d, const float *g, const float *y, size_t n) {
    GRID_LOOP(i, n) d[i] = g[i] * (1.0f - y[i] * y[i]);
}
__global__ void k_sigmoid_f(float *o, const float *x, size_t n) { GRID_LOOP(i, n) o[i] = 1.0f / (1.0f + expf(-x[i])); }
__global__ void k_sigmoid_b(float *d, const float *g, const float *y, size_t n) {
    GRID_LOOP(i, n) d[i] = g[i] * y[i] * (1.0f - y[i]);
}

// Word 0 of Philox-4x32-10 for counter (index, key), key seed: src/core/rng.c's dt_philox4x32.
__device__ uint32_t philox_w0(uint64_t index, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
    uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
    for (int r = 0; r < 10; r++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    return c0;
}

__global__ void k_dropout_f(float *o, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed, uint64_t key) {
    const uint32_t c2 = (uint32_t)key, c3 = (uint32_t)(key >> 32), k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const float scale = 1.0f / (1.0f - p);
    GRID_LOOP(i, n) {
        uint8_t m;
        if (p <= 0.0f) m = 1;
        else if (p >= 1.0f) m = 0;
        else m = (float)(philox_w0(i, c2, c3, k0, k1) >> 8) * (1.0f / 16777216.0f) >= p;
        mask[i] = m;
        o[i] = p <= 0.0f ? x[i] : m ? x[i] * scale : 0.0f;
    }
}
__global__ void k_dropout_b(float *d, const float *g, const uint8_t *mask, size_t n, float p) {
    const float scale = 1.0f / (1.0f - p);
    GRID_LOOP(i, n) d[i] = p >= 1.0f ? 0.0f : mask[i] ? g[i] * scale : 0.0f;
}
__global__ void k_add(float *o, const float *a, const float *b, size_t n) { GRID_LOOP(i, n) o[i] = a[i] + b[i]; }

// ---- pooling (NCHW planes, window K, stride S, no padding) ----

__global__ void k_maxpool_f(float *out, int32_t *am, const float *in, size_t planes, int H, int W, int K, int S, int OH,
                            int OW) {
    const size_t total = planes * OH * OW;
    GRID_LOOP(o, total) {
        const size_t pl = o / ((size_t)OH * OW);
        const int r = (int)(o % ((size_t)OH * OW)), oy = r / OW, ox = r % OW;
        const float *x = in + pl * H * W;
        const int i0 = oy * S * W + ox * S;
        float m = x[i0];
        int im = i0;
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) {
                const int i = i0 + ky * W + kx;
                const float v = x[i];
                if (v > m || v != v) m = v, im = i;
            }
        out[o] = m;
        am[o] = (int32_t)(pl * H * W) + im;
    }
}

// The windows (oy, ox ranges) that cover input row h / column w.
__device__ void covering(int h, int K, int S, int OH, int *lo, int *hi) {
    *lo = h - K + 1 <= 0 ? 0 : (h - K + 1 + S - 1) / S;
    *hi = h / S < OH - 1 ? h / S : OH - 1;
}

__global__ void k_maxpool_b(float *din, const float *dout, const int32_t *am, size_t planes, int H, int W, int K, int S,
                            int OH, int OW) {
    const size_t total = planes * H * W;
    GRID_LOOP(i, total) {
        const size_t pl = i / ((size_t)H * W);
        const int r = (int)(i % ((size_t)H * W)), h = r / W, w = r % W;
        int y0, y1, x0, x1;
        covering(h, K, S, OH, &y0, &y1);
        covering(w, K, S, OW, &x0, &x1);
        float acc = 0.0f;
        for (int oy = y0; oy <= y1; oy++)
            for (int ox = x0; ox <= x1; ox++) {
                const size_t o = pl * OH * OW + (size_t)oy * OW + ox;
                if (am[o] == (int32_t)i) acc += dout[o];
            }
        din[i] = acc;
    }
}

__global__ void k_avgpool_f(float *out, const float *in, size_t planes, int H, int W, int K, int S, int OH, int OW) {
    const float scale = 1.0f / (float)(K * K);
    GRID_LOOP(o, planes * OH * OW) {
        const size_t pl = o / ((size_t)OH * OW);
        const int r = (int)(o % ((size_t)OH * OW)), oy = r / OW, ox = r % OW;
        const float *win = in + pl * H * W + (size_t)oy * S * W + (size_t)ox * S;
        float s = 0.0f;
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++) s += win[(size_t)ky * W + kx];
        out[o] = s * scale;
    }
}

__global__ void k_avgpool_b(float *din, const float *dout, size_t planes, int H, int W, int K, int S, int OH, int OW) {
    const float scale = 1.0f / (float)(K * K);
    GRID_LOOP(i, planes * H * W) {
        const size_t pl = i / ((size_t)H * W);
        const int r = (int)(i % ((size_t)H * W)), h = r / W, w = r % W;
        int y0, y1, x0, x1;
        covering(h, K, S, OH, &y0, &y1);
        covering(w, K, S, OW, &x0, &x1);
        float acc = 0.0f;
        for (int oy = y0; oy <= y1; oy++)
            for (int ox = x0; ox <= x1; ox++) acc += dout[pl * OH * OW + (size_t)oy * OW + ox] * scale;
        din[i] = acc;
    }
}

// ---- bias helpers ----

__global__ void k_rows_set(float *out, const float *bias, int rows, int cols) {
    GRID_LOOP(i, (size_t)rows * cols) out[i] = bias ? bias[i % cols] : 0.0f;
}

__global__ void k_colsum_acc(float *db, const float *x, int rows, int cols) {
    GRID_LOOP(j, (size_t)cols) {
        float acc = db[j];
        for (int r = 0; r < rows; r++) acc += x[(size_t)r * cols + j];
        db[j] = acc;
    }
}

__global__ void k_chan_bias(float *x, const float *bias, int C, int HW, size_t n) {
    GRID_LOOP(i, n) x[i] += bias[(i / HW) % C];
}

__global__ void k_chansum_acc(float *db, const float *x, int B, int C, int HW) {
    const int c = blockIdx.x;
    double s = 0;
    for (int b = 0; b < B; b++)
        for (int i = threadIdx.x; i < HW; i += blockDim.x) s += x[((size_t)b * C + c) * HW + i];
    s = block_sum(s);
    if (threadIdx.x == 0) db[c] += (float)s;
}

// ---- norms ----

// LayerNorm: one warp per row.
__global__ void k_layernorm_f(float *out, float *mean, float *rstd, const float *in, const float *w, const float *b,
                              int N, int C, float eps) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = in + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += x[i];
    const float m = warp_sum(s) / (float)C;
    float q = 0.0f;
    for (int i = lane; i < C; i += 32) q += (x[i] - m) * (x[i] - m);
    const float var = warp_sum(q) / (float)C, rs = 1.0f / sqrtf(var + eps);
    float *y = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) y[i] = (x[i] - m) * rs * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    if (lane == 0) mean[row] = m, rstd[row] = rs;
}

__global__ void k_layernorm_bdin(float *din, const float *dout, const float *in, const float *w, const float *mean,
                                 const float *rstd, int N, int C) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = in + (size_t)row * C, *dy = dout + (size_t)row * C;
    const float m = mean[row], rs = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int i = lane; i < C; i += 32) {
        const float g = dy[i] * (w ? w[i] : 1.0f);
        sg += g, sgx += g * (x[i] - m);
    }
    sg = warp_sum(sg), sgx = warp_sum(sgx);
    const float a = sg / (float)C, c2 = sgx * rs * rs / (float)C;
    float *dx = din + (size_t)row * C;
    for (int i = lane; i < C; i += 32) dx[i] = rs * (dy[i] * (w ? w[i] : 1.0f) - a - (x[i] - m) * c2);
}

// dw and db of LayerNorm: a thread per column, rows in order (the CPU's order).
__global__ void k_layernorm_bw(float *dw, float *db, const float *dout, const float *in, const float *mean,
                               const float *rstd, int N, int C) {
    GRID_LOOP(i, (size_t)C) {
        float aw = dw ? dw[i] : 0.0f, ab = db ? db[i] : 0.0f;
        for (int r = 0; r < N; r++) {
            const float dy = dout[(size_t)r * C + i];
            aw += dy * (in[(size_t)r * C + i] - mean[r]) * rstd[r];
            ab += dy;
        }
        if (dw) dw[i] = aw;
        if (db) db[i] = ab;
    }
}

// BatchNorm2d, training: one block per channel.
__global__ void k_batchnorm_f(float *out, float *mean, float *rstd, float *rmean, float *rvar, const float *in,
                              const float *w, const float *b, int B, int C, int HW, float momentum, float eps) {
    const int c = blockIdx.x;
    const double n = (double)B * HW;
    double s = 0;
    for (int bi = 0; bi < B; bi++)
        for (int i = threadIdx.x; i < HW; i += blockDim.x) s += in[((size_t)bi * C + c) * HW + i];
    const float m = (float)(block_sum(s) / n);
    double ss = 0;
    for (int bi = 0; bi < B; bi++)
        for (int i = threadIdx.x; i < HW; i += blockDim.x) {
            const float d = in[((size_t)bi * C + c) * HW + i] - m;
            ss += (double)(d * d);
        }
    const double var = block_sum(ss) / n;
    const float rs = (float)(1.0 / sqrt(var + (double)eps));
    if (threadIdx.x == 0) {
        mean[c] = m, rstd[c] = rs;
        if (rmean) rmean[c] = (1.0f - momentum) * rmean[c] + momentum * m;
        if (rvar) rvar[c] = (1.0f - momentum) * rvar[c] + momentum * (float)(n > 1 ? var * n / (n - 1) : var);
    }
    const float scale = rs * (w ? w[c] : 1.0f), shift = (b ? b[c] : 0.0f) - m * scale;
    for (int bi = 0; bi < B; bi++)
        for (int i = threadIdx.x; i < HW; i += blockDim.x) {
            const size_t k = ((size_t)bi * C + c) * HW + i;
            out[k] = in[k] * scale + shift;
        }
}

__global__ void k_batchnorm_eval(float *out, const float *in, const float *w, const float *b, const float *rmean,
                                 const float *rvar, int B, int C, int HW, float eps) {
    GRID_LOOP(k, (size_t)B * C * HW) {
        const int c = (int)((k / HW) % C);
        const float rs = (float)(1.0 / sqrt((double)rvar[c] + (double)eps));
        const float scale = rs * (w ? w[c] : 1.0f), shift = (b ? b[c] : 0.0f) - rmean[c] * scale;
        out[k] = in[k] * scale + shift;
    }
}

__global__ void k_batchnorm_b(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                              const float *mean, const float *rstd, int B, int C, int HW) {
    const int c = blockIdx.x;
    const double n = (double)B * HW;
    const float m = mean[c], rs = rstd[c];
    double sdy = 0, sdyx = 0;
    for (int bi = 0; bi < B; bi++)
        for (int i = threadIdx.x; i < HW; i += blockDim.x) {
            const size_t k = ((size_t)bi * C + c) * HW + i;
            sdy += dout[k];
            sdyx += (double)(dout[k] * (in[k] - m));
        }
    sdy = block_sum(sdy);
    sdyx = block_sum(sdyx) * rs;
    if (threadIdx.x == 0) {
        if (dw) dw[c] += (float)sdyx;
        if (db) db[c] += (float)sdy;
    }
    if (!din) return;
    const float k = rs * (w ? w[c] : 1.0f), a = (float)(sdy / n), c2 = (float)(sdyx / n) * rs;
    for (int bi = 0; bi < B; bi++)
        for (int i = threadIdx.x; i < HW; i += blockDim.x) {
            const size_t q = ((size_t)bi * C + c) * HW + i;
            din[q] = k * (dout[q] - a - (in[q] - m) * c2);
        }
}

// ---- embeddings ----

__global__ void k_embedding_f(float *out, const int32_t *ids, const float *w, int N, int C) {
    GRID_LOOP(k, (size_t)N * C) out[k] = w[(size_t)ids[k / C] * C + k % C];
}
// a thread per column: rows in order, as the CPU (bitwise, no atomics)
__global__ void k_embedding_b(float *dw, const float *dout, const int32_t *ids, int N, int C) {
    GRID_LOOP(c, (size_t)C)
    for (int i = 0; i < N; i++) dw[(size_t)ids[i] * C + c] += dout[(size_t)i * C + c];
}
__global__ void k_pos_f(float *out, const float *w, int B, size_t TC) {
    GRID_LOOP(k, (size_t)B * TC) out[k] = w[k % TC];
}
__global__ void k_pos_b(float *dw, const float *dout, int B, size_t TC) {
    GRID_LOOP(k, TC) {
        float acc = dw[k];
        for (int b = 0; b < B; b++) acc += dout[(size_t)b * TC + k];
        dw[k] = acc;
    }
}

// ---- causal attention: qkv rows (B, T, 3C), heads of hs = C / NH ----

// One warp per (b, h, t): the scores q_t . k_j * scale for j <= t, their softmax, zeros after.
__global__ void k_att_probs(float *att, const float *qkv, int B, int T, int C, int NH) {
    const int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (w >= B * NH * T) return;
    const int t = w % T, h = (w / T) % NH, b = w / (T * NH), hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const float *q = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
    float *row = att + (size_t)w * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) {
        const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
        float d = 0.0f;
        for (int e = 0; e < hs; e++) d += q[e] * k[e];
        row[j] = scale * d;
        mx = max_of(mx, row[j]);
    }
    mx = warp_max(mx);
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        row[j] = expf(row[j] - mx);
        s += row[j];
    }
    const float inv = 1.0f / warp_sum(s);
    for (int j = lane; j < T; j += 32) row[j] = j <= t ? row[j] * inv : 0.0f;
}

// out[b, t, h*hs + d] = sum_{j <= t} P[t, j] v_j[d]
__global__ void k_att_out(float *out, const float *att, const float *qkv, int B, int T, int C, int NH) {
    const int hs = C / NH;
    GRID_LOOP(k, (size_t)B * T * C) {
        const int c = (int)(k % C), t = (int)((k / C) % T), b = (int)(k / ((size_t)T * C)), h = c / hs, d = c % hs;
        const float *P = att + (((size_t)b * NH + h) * T + t) * T;
        const float *v = qkv + (size_t)b * T * 3 * C + 2 * C + (size_t)h * hs + d;
        float acc = 0.0f;
        for (int j = 0; j <= t; j++) acc += P[j] * v[(size_t)j * 3 * C];
        out[k] = acc;
    }
}

// Batch row b: dS[h, t, j] = P (dP - sum_j P dP) with dP = dO_t . v_j; a warp per (h, t).
__global__ void k_att_ds(float *dS, const float *dout, const float *qkv, const float *att, int b, int T, int C,
                         int NH) {
    const int w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (w >= NH * T) return;
    const int t = w % T, h = w / T, hs = C / NH;
    const float *dO = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
    const float *P = att + (((size_t)b * NH + h) * T + t) * T;
    float *row = dS + (size_t)w * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        const float *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + (size_t)h * hs;
        float d = 0.0f;
        for (int e = 0; e < hs; e++) d += dO[e] * v[e];
        row[j] = d;
        dot += P[j] * d;
    }
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) row[j] = j <= t ? P[j] * (row[j] - dot) : 0.0f;
}

// Batch row b: dq, dk, dv of every (t, h, d).
__global__ void k_att_grads(float *dqkv, const float *dS, const float *dout, const float *qkv, const float *att, int b,
                            int T, int C, int NH) {
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    GRID_LOOP(k, (size_t)T * C) {
        const int c = (int)(k % C), t = (int)(k / C), h = c / hs;
        const size_t ld = 3 * (size_t)C, base = (size_t)b * T * ld;
        const float *S = dS + (size_t)h * T * T, *P = att + ((size_t)b * NH + h) * T * T;
        float dq = 0.0f, dk = 0.0f, dv = 0.0f;
        for (int j = 0; j <= t; j++) dq += S[(size_t)t * T + j] * qkv[base + j * ld + C + c];
        for (int i = t; i < T; i++) {
            dk += S[(size_t)i * T + t] * qkv[base + i * ld + c];
            dv += P[(size_t)i * T + t] * dout[((size_t)b * T + i) * C + c];
        }
        float *r = dqkv + base + t * ld;
        r[c] = dq * scale, r[C + c] = dk * scale, r[2 * C + c] = dv;
    }
}

// ---- losses ----

// A block per row: probs and the row's loss (double), NaN for a label outside [0, V), 0 when ignored.
__global__ void k_xent_rows(double *rowloss, float *probs, const float *logits, const int32_t *labels, int V,
                            int ignore) {
    const int r = blockIdx.x;
    const int32_t y = labels[r];
    const float *x = logits + (size_t)r * V;
    float *p = probs + (size_t)r * V;
    if (y == ignore) {  // the CPU leaves this row's probs as they were; nothing reads them
        if (threadIdx.x == 0) rowloss[r] = 0.0;
        return;
    }
    float mx = x[0];
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = max_of(mx, x[i]);
    mx = block_max(mx);
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        p[i] = expf(x[i] - mx);
        s += p[i];
    }
    s = block_sum(s);
    const float inv = 1.0f / s;
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] *= inv;
    if (threadIdx.x == 0) rowloss[r] = (y >= 0 && y < V) ? (double)logf(s) - (double)(x[y] - mx) : (double)NAN;
}

__global__ void k_xent_mean(float *loss, int32_t *counted, const double *rowloss, const int32_t *labels, int N,
                            int ignore) {
    double s = 0;
    int c = 0;
    for (int r = threadIdx.x; r < N; r += blockDim.x)
        if (labels[r] != ignore) s += rowloss[r], c++;
    s = block_sum(s);
    c = block_sum(c);
    if (threadIdx.x == 0) {
        *loss = c > 0 ? (float)(s / c) : 0.0f;
        *counted = c;
    }
}

__global__ void k_xent_b(float *d, const float *p, const int32_t *labels, int N, int V, int ignore,
                         const int32_t *counted, float scale) {
    const int32_t c = *counted;
    const float k = c > 0 ? scale / (float)c : 0.0f;
    GRID_LOOP(q, (size_t)N * V) {
        const int r = (int)(q / V), i = (int)(q % V);
        const int32_t y = labels[r];
        d[q] = y == ignore ? 0.0f : i == y ? k * p[q] - k : k * p[q];
    }
}

// A thread per row: its first largest logit against its label, counted into *correct.
__global__ void k_count_correct(unsigned long long *correct, const float *logits, const int32_t *labels, int64_t rows,
                                int V) {
    GRID_LOOP(r, (size_t)rows) {
        const float *x = logits + r * (size_t)V;
        int best = 0;
        for (int k = 1; k < V; k++)
            if (x[k] > x[best]) best = k;
        if (best == labels[r]) atomicAdd(correct, 1ULL);
    }
}

__global__ void k_mse_part(double *part, const float *a, const float *b, size_t n) {
    double s = 0;
    GRID_LOOP(i, n) {
        const float d = a[i] - b[i];
        s += (double)(d * d);
    }
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_mse_mean(float *loss, const double *part, int nparts, size_t n) {
    double s = 0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = block_sum(s);
    if (threadIdx.x == 0) *loss = n ? (float)(s / (double)n) : 0.0f;
}

__global__ void k_mse_b(float *d, const float *a, const float *b, size_t n, float k) {
    GRID_LOOP(i, n) d[i] = k * (a[i] - b[i]);
}

unsigned parts_for(size_t n) {
    const unsigned b = blocks_for(n);
    return b > (unsigned)DTC_SCRATCH_BLOCKS ? (unsigned)DTC_SCRATCH_BLOCKS : b;
}

unsigned warp_blocks(size_t warps) { return (unsigned)((warps + TPB / 32 - 1) / (TPB / 32)); }

}  // namespace

#define LAUNCH(kernel, grid, ...) (kernel<<<(grid), TPB, 0, s>>>(__VA_ARGS__), cudaGetLastError())
#define EMPTY(n) \
    if ((n) == 0) return cudaSuccess

extern "C" {

cudaError_t dtc_fill_f32(cudaStream_t s, float *x, float v, size_t n) {
    EMPTY(n);
    return LAUNCH(k_fill, blocks_for(n), x, v, n);
}
cudaError_t dtc_accumulate(cudaStream_t s, float *y, const float *x, size_t n) {
    EMPTY(n);
    return LAUNCH(k_accumulate, blocks_for(n), y, x, n);
}
cudaError_t dtc_scale(cudaStream_t s, float *x, float v, size_t n) {
    EMPTY(n);
    return LAUNCH(k_scale, blocks_for(n), x, v, n);
}
cudaError_t dtc_unscale(cudaStream_t s, float *x, float inv, size_t n, int32_t *flag) {
    cudaError_t e = cudaMemsetAsync(flag, 0, sizeof *flag, s);
    if (e != cudaSuccess || n == 0) return e;
    e = LAUNCH(k_nonfinite, blocks_for(n), x, n, flag);
    return e != cudaSuccess ? e : LAUNCH(k_scale_if_ok, blocks_for(n), x, inv, n, flag);
}
cudaError_t dtc_sqnorm(cudaStream_t s, double *out, const float *x, size_t n, double *scratch) {
    const unsigned nb = parts_for(n);
    cudaError_t e = LAUNCH(k_sqnorm_part, nb, scratch, x, n);
    return e != cudaSuccess ? e : LAUNCH(k_sum_parts, 1, out, scratch, (int)nb);
}
cudaError_t dtc_cast_f32_bf16(cudaStream_t s, uint16_t *o, const float *x, size_t n) {
    EMPTY(n);
    return LAUNCH(k_f32_bf16, blocks_for(n), o, x, n);
}
cudaError_t dtc_cast_bf16_f32(cudaStream_t s, float *o, const uint16_t *x, size_t n) {
    EMPTY(n);
    return LAUNCH(k_bf16_f32, blocks_for(n), o, x, n);
}
cudaError_t dtc_cast_f32_f16(cudaStream_t s, uint16_t *o, const float *x, size_t n) {
    EMPTY(n);
    return LAUNCH(k_f32_f16, blocks_for(n), o, x, n);
}
cudaError_t dtc_cast_f16_f32(cudaStream_t s, float *o, const uint16_t *x, size_t n) {
    EMPTY(n);
    return LAUNCH(k_f16_f32, blocks_for(n), o, x, n);
}
cudaError_t dtc_sgd(cudaStream_t s, float *p, const float *g, float *buf, size_t n, float lr, float wd, float mu,
                    float mu_prev, int nesterov) {
    EMPTY(n);
    return LAUNCH(k_sgd, blocks_for(n), p, g, buf, n, lr, wd, mu, mu_prev, nesterov);
}

cudaError_t dtc_relu_fwd(cudaStream_t s, float *o, const float *x, size_t n) {
    EMPTY(n);
    return LAUNCH(k_relu_f, blocks_for(n), o, x, n);
}
cudaError_t dtc_relu_bwd(cudaStream_t s, float *d, const float *g, const float *x, size_t n) {
    if (!d) return cudaSuccess;
    EMPTY(n);
    return LAUNCH(k_relu_b, blocks_for(n), d, g, x, n);
}
cudaError_t dtc_gelu_fwd(cudaStream_t s, float *o, const float *x, size_t n) {
    EMPTY(n);
    return LAUNCH(k_gelu_f, blocks_for(n), o, x, n);
}
cudaError_t dtc_gelu_bwd(cudaStream_t s, float *d, const float *g, const float *x, size_t n) {
    if (!d) return cudaSuccess;
    EMPTY(n);
    return LAUNCH(k_gelu_b, blocks_for(n), d, g, x, n);
}
cudaError_t dtc_tanh_fwd(cudaStream_t s, float *o, const float *x, size_t n) {
    EMPTY(n);
    return LAUNCH(k_tanh_f, blocks_for(n), o, x, n);
}
cudaError_t dtc_tanh_bwd(cudaStream_t s, float *d, const float *g, const float *y, size_t n) {
    if (!d) return cudaSuccess;
    EMPTY(n);
    return LAUNCH(k_tanh_b, blocks_for(n), d, g, y, n);
}
cudaError_t dtc_sigmoid_fwd(cudaStream_t s, float *o, const float *x, size_t n) {
    EMPTY(n);
    return LAUNCH(k_sigmoid_f, blocks_for(n), o, x, n);
}
cudaError_t dtc_sigmoid_bwd(cudaStream_t s, float *d, const float *g, const float *y, size_t n) {
    if (!d) return cudaSuccess;
    EMPTY(n);
    return LAUNCH(k_sigmoid_b, blocks_for(n), d, g, y, n);
}
cudaError_t dtc_dropout_fwd(cudaStream_t s, float *o, uint8_t *mask, const float *x, size_t n, float p, uint64_t seed,
                            uint64_t key) {
    EMPTY(n);
    return LAUNCH(k_dropout_f, blocks_for(n), o, mask, x, n, p, seed, key);
}
cudaError_t dtc_dropout_bwd(cudaStream_t s, float *d, const float *g, const uint8_t *mask, size_t n, float p) {
    if (!d) return cudaSuccess;
    EMPTY(n);
    return LAUNCH(k_dropout_b, blocks_for(n), d, g, mask, n, p);
}
cudaError_t dtc_add(cudaStream_t s, float *o, const float *a, const float *b, size_t n) {
    EMPTY(n);
    return LAUNCH(k_add, blocks_for(n), o, a, b, n);
}

cudaError_t dtc_maxpool_fwd(cudaStream_t s, float *out, int32_t *am, const float *in, int B, int C, int H, int W, int K,
                            int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    if (OH <= 0 || OW <= 0 || B <= 0 || C <= 0) return cudaSuccess;
    const size_t planes = (size_t)B * C;
    return LAUNCH(k_maxpool_f, blocks_for(planes * OH * OW), out, am, in, planes, H, W, K, S, OH, OW);
}
cudaError_t dtc_maxpool_bwd(cudaStream_t s, float *din, const float *dout, const int32_t *am, int B, int C, int H,
                            int W, int K, int S) {
    if (!din || B <= 0 || C <= 0 || H <= 0 || W <= 0) return cudaSuccess;
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const size_t planes = (size_t)B * C;
    if (OH <= 0 || OW <= 0) return cudaMemsetAsync(din, 0, planes * H * W * sizeof(float), s);
    return LAUNCH(k_maxpool_b, blocks_for(planes * H * W), din, dout, am, planes, H, W, K, S, OH, OW);
}
cudaError_t dtc_avgpool_fwd(cudaStream_t s, float *out, const float *in, int B, int C, int H, int W, int K, int S) {
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    if (OH <= 0 || OW <= 0 || B <= 0 || C <= 0) return cudaSuccess;
    const size_t planes = (size_t)B * C;
    return LAUNCH(k_avgpool_f, blocks_for(planes * OH * OW), out, in, planes, H, W, K, S, OH, OW);
}
cudaError_t dtc_avgpool_bwd(cudaStream_t s, float *din, const float *dout, int B, int C, int H, int W, int K, int S) {
    if (!din || B <= 0 || C <= 0 || H <= 0 || W <= 0) return cudaSuccess;
    const int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    const size_t planes = (size_t)B * C;
    if (OH <= 0 || OW <= 0) return cudaMemsetAsync(din, 0, planes * H * W * sizeof(float), s);
    return LAUNCH(k_avgpool_b, blocks_for(planes * H * W), din, dout, planes, H, W, K, S, OH, OW);
}

cudaError_t dtc_rows_set(cudaStream_t s, float *out, const float *bias, int rows, int cols) {
    EMPTY((size_t)rows * cols);
    return LAUNCH(k_rows_set, blocks_for((size_t)rows * cols), out, bias, rows, cols);
}
cudaError_t dtc_colsum_acc(cudaStream_t s, float *db, const float *x, int rows, int cols) {
    EMPTY((size_t)cols);
    return LAUNCH(k_colsum_acc, blocks_for((size_t)cols), db, x, rows, cols);
}
cudaError_t dtc_chan_bias(cudaStream_t s, float *x, const float *bias, int B, int C, int HW) {
    EMPTY((size_t)B * C * HW);
    return LAUNCH(k_chan_bias, blocks_for((size_t)B * C * HW), x, bias, C, HW, (size_t)B * C * HW);
}
cudaError_t dtc_chansum_acc(cudaStream_t s, float *db, const float *x, int B, int C, int HW) {
    if (C <= 0) return cudaSuccess;
    return LAUNCH(k_chansum_acc, (unsigned)C, db, x, B, C, HW);
}

cudaError_t dtc_layernorm_fwd(cudaStream_t s, float *out, float *mean, float *rstd, const float *in, const float *w,
                              const float *b, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    return LAUNCH(k_layernorm_f, warp_blocks((size_t)N), out, mean, rstd, in, w, b, N, C, eps);
}
cudaError_t dtc_layernorm_bwd(cudaStream_t s, float *din, float *dw, float *db, const float *dout, const float *in,
                              const float *w, const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return cudaSuccess;
    cudaError_t e = cudaSuccess;
    if (dw || db) e = LAUNCH(k_layernorm_bw, blocks_for((size_t)C), dw, db, dout, in, mean, rstd, N, C);
    if (e == cudaSuccess && din)
        e = LAUNCH(k_layernorm_bdin, warp_blocks((size_t)N), din, dout, in, w, mean, rstd, N, C);
    return e;
}
cudaError_t dtc_batchnorm_fwd_train(cudaStream_t s, float *out, float *mean, float *rstd, float *rmean, float *rvar,
                                    const float *in, const float *w, const float *b, int B, int C, int HW,
                                    float momentum, float eps) {
    if (C <= 0) return cudaSuccess;
    return LAUNCH(k_batchnorm_f, (unsigned)C, out, mean, rstd, rmean, rvar, in, w, b, B, C, HW, momentum, eps);
}
cudaError_t dtc_batchnorm_fwd_eval(cudaStream_t s, float *out, const float *in, const float *w, const float *b,
                                   const float *rmean, const float *rvar, int B, int C, int HW, float eps) {
    EMPTY((size_t)B * C * HW);
    return LAUNCH(k_batchnorm_eval, blocks_for((size_t)B * C * HW), out, in, w, b, rmean, rvar, B, C, HW, eps);
}
cudaError_t dtc_batchnorm_bwd(cudaStream_t s, float *din, float *dw, float *db, const float *dout, const float *in,
                              const float *w, const float *mean, const float *rstd, int B, int C, int HW) {
    if (C <= 0) return cudaSuccess;
    return LAUNCH(k_batchnorm_b, (unsigned)C, din, dw, db, dout, in, w, mean, rstd, B, C, HW);
}

cudaError_t dtc_embedding_fwd(cudaStream_t s, float *out, const int32_t *ids, const float *w, int N, int C) {
    EMPTY((size_t)N * C);
    return LAUNCH(k_embedding_f, blocks_for((size_t)N * C), out, ids, w, N, C);
}
cudaError_t dtc_embedding_bwd(cudaStream_t s, float *dw, const float *dout, const int32_t *ids, int N, int C) {
    EMPTY((size_t)N * C);
    return LAUNCH(k_embedding_b, blocks_for((size_t)C), dw, dout, ids, N, C);
}
cudaError_t dtc_pos_embedding_fwd(cudaStream_t s, float *out, const float *w, int B, int T, int C) {
    EMPTY((size_t)B * T * C);
    return LAUNCH(k_pos_f, blocks_for((size_t)B * T * C), out, w, B, (size_t)T * C);
}
cudaError_t dtc_pos_embedding_bwd(cudaStream_t s, float *dw, const float *dout, int B, int T, int C) {
    EMPTY((size_t)T * C);
    return LAUNCH(k_pos_b, blocks_for((size_t)T * C), dw, dout, B, (size_t)T * C);
}

cudaError_t dtc_attention_fwd(cudaStream_t s, float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return cudaSuccess;
    cudaError_t e = LAUNCH(k_att_probs, warp_blocks((size_t)B * NH * T), att, qkv, B, T, C, NH);
    return e != cudaSuccess ? e : LAUNCH(k_att_out, blocks_for((size_t)B * T * C), out, att, qkv, B, T, C, NH);
}
cudaError_t dtc_attention_bwd(cudaStream_t s, float *dqkv, float *work, const float *dout, const float *qkv,
                              const float *att, int B, int T, int C, int NH) {
    cudaError_t e = cudaSuccess;
    for (int b = 0; b < B && e == cudaSuccess; b++) {
        e = LAUNCH(k_att_ds, warp_blocks((size_t)NH * T), work, dout, qkv, att, b, T, C, NH);
        if (e == cudaSuccess)
            e = LAUNCH(k_att_grads, blocks_for((size_t)T * C), dqkv, work, dout, qkv, att, b, T, C, NH);
    }
    return e;
}

cudaError_t dtc_xent_fwd(cudaStream_t s, float *loss, int32_t *counted, float *probs, const float *logits,
                         const int32_t *labels, int N, int V, int ignore, double *rowloss) {
    cudaError_t e = cudaSuccess;
    if (N > 0) e = LAUNCH(k_xent_rows, (unsigned)N, rowloss, probs, logits, labels, V, ignore);
    return e != cudaSuccess ? e : LAUNCH(k_xent_mean, 1, loss, counted, rowloss, labels, N, ignore);
}
cudaError_t dtc_xent_bwd(cudaStream_t s, float *d, const float *p, const int32_t *labels, int N, int V, int ignore,
                         const int32_t *counted, float scale) {
    EMPTY((size_t)N * V);
    return LAUNCH(k_xent_b, blocks_for((size_t)N * V), d, p, labels, N, V, ignore, counted, scale);
}
cudaError_t dtc_count_correct(cudaStream_t s, int64_t *correct, const float *logits, const int32_t *labels,
                              int64_t rows, int V) {
    cudaError_t e = cudaMemsetAsync(correct, 0, sizeof *correct, s);
    if (e != cudaSuccess || rows <= 0) return e;
    return LAUNCH(k_count_correct, blocks_for((size_t)rows), (unsigned long long *)correct, logits, labels, rows, V);
}
cudaError_t dtc_mse_fwd(cudaStream_t s, float *loss, const float *a, const float *b, size_t n, double *scratch) {
    const unsigned nb = parts_for(n);
    cudaError_t e = LAUNCH(k_mse_part, nb, scratch, a, b, n);
    return e != cudaSuccess ? e : LAUNCH(k_mse_mean, 1, loss, scratch, (int)nb, n);
}
cudaError_t dtc_mse_bwd(cudaStream_t s, float *d, const float *a, const float *b, size_t n, float k) {
    EMPTY(n);
    return LAUNCH(k_mse_b, blocks_for(n), d, a, b, n, k);
}

}  // extern "C"
