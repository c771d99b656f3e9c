/* Shared helpers of the blocked-layout tests (blocked_test.c, blocked_bf16_test.c): random
 * values and copies of an NCHW tensor in the blocked or NHWC layout (blocked.h) and back (malloc'd, 4 bytes
 * of slack so that a kernel's overrun shows under ASan rather than corrupting a neighbour).
 * Include after backend/blocked.h and core/test.h. */
#ifndef DT_BACKEND_BLOCKED_TESTLIB_H
#define DT_BACKEND_BLOCKED_TESTLIB_H

#include <stdlib.h>

static float *rnd(size_t n, uint64_t key) {
    float *x = malloc((n ? n : 1) * sizeof *x + 4);
    dt_rng_fill_uniform(x, n, -1, 1, 5, key);
    return x;
}

/* x (NCHW) blocked, or NHWC with nhwc (blocked.h); and back */
static float *blocked_of(const float *x, int B, int C, int HW, bool nhwc) {
    float *y = malloc((size_t)B * C * HW * sizeof *y + 4);
    dt_blocked_from_nchw(y, x, B, C, HW, nhwc);
    return y;
}

static float *nchw_of(const float *x, int B, int C, int HW, bool nhwc) {
    float *y = malloc((size_t)B * C * HW * sizeof *y + 4);
    dt_blocked_to_nchw(y, x, B, C, HW, nhwc);
    return y;
}

#endif
