/* Reduction kernels shared by every algorithm and transport: elementwise sum/max/min/prod over
 * f32, f64, bf16, f16 (in f32 precision, one rounding per call), i32, i64. Vectorisable loops. */
#ifndef DT_COMM_REDUCE_H
#define DT_COMM_REDUCE_H

#include "dtrain/comm.h"

/* True for the dtypes collectives can reduce (f32, f64, bf16, f16, i32, i64). */
bool dt_reduce_dtype_ok(dt_dtype t);

/* acc[i] = acc[i] op in[i], i < n. AVG reduces as SUM (finish with dt_reduce_scale).
 * acc and in must not overlap unless equal. */
void dt_reduce_into(void *acc, const void *in, size_t n, dt_dtype t, dt_redop op);

/* out[i] = in[0][i] op in[1][i] op ... op in[k-1][i], left to right, halves accumulated in f32
 * and rounded once; AVG divides by avg_div before rounding. out2 (may be NULL) gets a copy.
 * out/out2 may equal one of the inputs (elementwise). k >= 1. */
void dt_reduce_many(void *out, void *out2, const void *const *in, int k, size_t n, dt_dtype t, dt_redop op,
                    int avg_div);
/* Same, but out is written with non-temporal (streaming) stores where it is 64-byte aligned:
 * for results far larger than the caches. Call dt_copy_fence() before others read them. */
void dt_reduce_many_nt(void *out, void *out2, const void *const *in, int k, size_t n, dt_dtype t, dt_redop op,
                       int avg_div);
/* memcpy with non-temporal stores for large destinations (falls back to memcpy). */
void dt_copy_nt(void *dst, const void *src, size_t bytes);
/* Orders earlier non-temporal stores before later stores (sfence). */
void dt_copy_fence(void);

/* buf[i] = buf[i] / div (AVG finish): floats divide in their precision (halves in f32, one
 * rounding), integers truncate. */
void dt_reduce_scale(void *buf, size_t n, dt_dtype t, int div);

#endif
