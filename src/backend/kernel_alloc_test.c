/* Cross-module test: kernels do not allocate (device.h: "Kernels never allocate and never abort"; issue 33): the
 * kernels that need scratch take it from a workspace their table sizes up front (linear_workspace,
 * conv2d_workspace, conv_pool_workspace, maxpool2d_blocked_bf16_workspace). This test replaces
 * malloc and its relatives for the whole process, counts the calls dtrain's code makes (the
 * caller is in this executable, where libdtrain.a is linked; a shared library's own buffers, such as
 * the per-call ones of OpenBLAS's threaded sgemm, are the library's) while one kernel call runs,
 * the first of its shape, and checks there are none.
 *
 * Covered: the blas tables at f32, bf16 and fp16 (linear and conv), the fused conv -> relu -> pool
 * and the blocked bf16 max pool backward (a scatter and a widened bf16 dout), each from its first
 * call. oneDNN's tables still grow a per-thread scratch and scratchpad on the first call of a
 * shape (docs/device.md), so for them the second call is checked:
 * linear and conv at f32, bf16 and fp16, blocked convs, and bf16 blocked values at fp16 (widened
 * to f32 copies, which once were malloc'd on every call). And a oneDNN kernel whose scratch cannot
 * be had returns with the kernel error set (dt_kernel_error_take) instead of aborting. */
#include "backend/backend.h"
#include "backend/blocked.h"
#include "backend/conv_pool.h"
#include "core/test.h"

#if defined(__SANITIZE_ADDRESS__) /* AddressSanitizer owns malloc: nothing to interpose on */
#include <stdio.h>
int main(void) {
    printf("kernel_alloc_test: skipped under AddressSanitizer (it replaces malloc itself)\n");
    return 0;
}
#else
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* glibc's own allocator, which the definitions below forward to */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void __libc_free(void *p);

extern const char __executable_start[], etext[]; /* this executable's code (GNU ld) */

static atomic_long allocs;
static atomic_int counting, failing;

/* Counts an allocation made from this executable's code (dtrain's) while counting; true when it
 * is to fail (failing: out of memory for dtrain's code). */
static bool note(const void *caller) {
    const bool ours = (const char *)caller >= __executable_start && (const char *)caller < etext;
    if (ours && atomic_load(&counting)) atomic_fetch_add(&allocs, 1);
    return ours && atomic_load(&failing);
}

#define CALLER __builtin_return_address(0)
void *malloc(size_t n) { return note(CALLER) ? NULL : __libc_malloc(n); }
void *calloc(size_t k, size_t n) { return note(CALLER) ? NULL : __libc_calloc(k, n); }
void *realloc(void *p, size_t n) { return note(CALLER) ? NULL : __libc_realloc(p, n); }
void *aligned_alloc(size_t align, size_t n) { return note(CALLER) ? NULL : __libc_memalign(align, n); }
void *memalign(size_t align, size_t n) { return note(CALLER) ? NULL : __libc_memalign(align, n); }
int posix_memalign(void **out, size_t align, size_t n) {
    *out = note(CALLER) ? NULL : __libc_memalign(align, n);
    return *out ? 0 : 12; /* ENOMEM */
}
void free(void *p) { __libc_free(p); }

/* The allocations dtrain's code makes while fn(arg) runs (the first call of its shape, so a
 * scratch grown once is seen too). */
static long allocs_of(void (*fn)(void *), void *arg) {
    atomic_store(&allocs, 0);
    atomic_store(&counting, 1);
    fn(arg);
    atomic_store(&counting, 0);
    return atomic_load(&allocs);
}

static float *filled(size_t n, float v) {
    float *p = __libc_memalign(64, n * sizeof *p + 64);
    for (size_t i = 0; i < n; i++) p[i] = v * (float)((i * 7919) % 97) / 97.0f - v / 2;
    return p;
}

enum { B = 4, C = 48, OC = 32, H = 10, K = 3, S = 1, P = 1 };

typedef struct {
    const dt_kernel_table *t;
    float *in, *w, *b, *out, *dout, *din, *dw, *db, *work;
} args;

static void linear(void *p) {
    args *a = p;
    a->t->linear_forward(a->out, a->in, a->w, a->b, a->work, B, C, OC);
    a->t->linear_backward(a->din, a->dw, a->db, a->dout, a->in, a->w, a->work, B, C, OC);
}

static void conv(void *p) {
    args *a = p;
    a->t->conv2d_forward(a->out, a->in, a->w, a->b, a->work, B, C, H, H, OC, K, S, P);
    a->t->conv2d_backward(a->din, a->dw, a->db, a->dout, a->in, a->w, a->work, B, C, H, H, OC, K, S, P);
}

static void test_tables(void) {
    const dt_kernel_table *tables[3] = {dt_backend_cpu(), dt_backend_blas_lowp(DT_BF16), dt_backend_blas_lowp(DT_F16)};
    const size_t big = (size_t)B * C * H * H * 4;
    for (int i = 0; i < 3; i++) {
        const dt_kernel_table *t = tables[i];
        size_t ws = t->conv2d_workspace(B, C, H, H, OC, K, S, P);
        const size_t lw = dt_linear_workspace_of(t, B, C, OC);
        args a = {t,
                  filled(big, 1),
                  filled(big, 0.5f),
                  filled(OC, 0.1f),
                  filled(big, 0),
                  filled(big, 1),
                  filled(big, 0),
                  filled(big, 0),
                  filled(OC, 0),
                  filled((ws > lw ? ws : lw) + 1, 0)};
        CHECK_MSG(allocs_of(linear, &a) == 0, "blas %s linear: %ld allocations in a call", dt_dtype_name(t->precision),
                  (long)atomic_load(&allocs));
        CHECK_MSG(allocs_of(conv, &a) == 0, "blas %s conv: %ld allocations in a call", dt_dtype_name(t->precision),
                  (long)atomic_load(&allocs));
        float *all[] = {a.in, a.w, a.b, a.out, a.dout, a.din, a.dw, a.db, a.work};
        for (size_t k = 0; k < sizeof all / sizeof *all; k++) __libc_free(all[k]);
    }
}

typedef struct {
    dt_conv_pool_shape s;
    float *in, *w, *b, *out, *dout, *dw, *db;
    uint8_t *win;
    void *ws;
} cp_args;

static void conv_pool(void *p) {
    cp_args *a = p;
    dt_conv_pool_forward(&a->s, a->out, a->win, a->in, a->w, a->b, a->ws);
    dt_conv_pool_backward(&a->s, a->dw, a->db, a->dout, a->win, a->in, a->ws);
}

static void test_conv_pool(void) {
    cp_args a = {.s = {.B = 2, .C = 1, .H = 12, .W = 12, .OC = 16, .K = 3, .P = 1, .PK = 2, .relu = true}};
    const size_t nout = (size_t)a.s.B * a.s.OC * 6 * 6;
    a.in = filled((size_t)a.s.B * 144, 1), a.w = filled(16 * 9, 1), a.b = filled(16, 0.1f);
    a.out = filled(nout, 0), a.dout = filled(nout, 1), a.dw = filled(16 * 9, 0), a.db = filled(16, 0);
    a.win = __libc_malloc(nout), a.ws = __libc_memalign(64, dt_conv_pool_workspace(&a.s));
    CHECK_MSG(allocs_of(conv_pool, &a) == 0, "conv_pool: %ld allocations in a call", (long)atomic_load(&allocs));
    void *all[] = {a.in, a.w, a.b, a.out, a.dout, a.dw, a.db, a.win, a.ws};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) __libc_free(all[k]);
}

typedef struct {
    int H, K, S;
    bool out_bl;
    uint16_t *din, *dout;
    int32_t *argmax;
    float *work;
} pool_args;

static void pool_backward(void *p) {
    pool_args *a = p;
    dt_maxpool2d_backward_blocked_bf16(a->din, a->dout, a->argmax, 1, 16, a->H, a->H, a->K, a->S, a->out_bl, false,
                                       true, a->work);
}

static void test_pool(void) {
    const int cases[2][4] = {{9, 3, 2, 0}, {8, 2, 2, 1}}; /* overlapping windows (a scatter); a blocked bf16 dout */
    for (int i = 0; i < 2; i++) {
        pool_args a = {.H = cases[i][0], .K = cases[i][1], .S = cases[i][2], .out_bl = cases[i][3]};
        const int OH = (a.H - a.K) / a.S + 1;
        const size_t nin = 16 * (size_t)a.H * a.H, nout = 16 * (size_t)OH * OH;
        a.din = __libc_malloc(nin * 2), a.dout = __libc_calloc(nout, 2), a.argmax = __libc_malloc(nout * 4);
        for (size_t k = 0; k < nout; k++) a.argmax[k] = (int32_t)(k % nin);
        a.work = __libc_malloc(dt_maxpool2d_blocked_bf16_workspace(1, 16, a.H, a.H, a.K, a.S, true) * 4 + 4);
        CHECK_MSG(allocs_of(pool_backward, &a) == 0, "bf16 max pool backward %dx%d K%d S%d: %ld allocations in a call",
                  a.H, a.H, a.K, a.S, (long)atomic_load(&allocs));
        __libc_free(a.din), __libc_free(a.dout), __libc_free(a.argmax), __libc_free(a.work);
    }
}

/* oneDNN's tables, from the second call of a shape (the first creates the primitives and grows the
 * thread's scratch). */
typedef struct {
    args a;
    dt_dtype p;
    dt_layout in_l, out_l;
} blk_args;

static void blocked_conv(void *p) {
    blk_args *b = p;
    const args *a = &b->a;
    a->t->conv2d_forward_blocked(a->out, a->in, a->w, a->b, B, C, H, H, OC, K, S, P, b->in_l, b->out_l);
    a->t->conv2d_backward_blocked(a->din, a->dw, a->db, a->dout, a->in, a->w, B, C, H, H, OC, K, S, P, b->in_l,
                                  b->out_l);
}

static long steady_allocs(void (*fn)(void *), void *arg) {
    fn(arg);
    return allocs_of(fn, arg);
}

static void test_onednn(void) {
    const dt_dtype prec[3] = {DT_F32, DT_BF16, DT_F16};
    const size_t big = (size_t)B * C * H * H * 4;
    for (int i = 0; i < 3 && dt_onednn_built(); i++) {
        const dt_kernel_table *t = dt_backend_onednn(prec[i]);
        const size_t ws = t->conv2d_workspace(B, C, H, H, OC, K, S, P);
        blk_args b = {{t, filled(big, 1), filled(big, 0.5f), filled(OC, 0.1f), filled(big, 0), filled(big, 1),
                       filled(big, 0), filled(big, 0), filled(OC, 0), filled(ws + 1, 0)},
                      prec[i],
                      DT_LAYOUT_BLOCKED,
                      DT_LAYOUT_BLOCKED};
        const char *pn = dt_dtype_name(prec[i]);
        CHECK_MSG(steady_allocs(linear, &b.a) == 0, "onednn %s linear: %ld allocations in a second call", pn,
                  (long)atomic_load(&allocs));
        CHECK_MSG(steady_allocs(conv, &b.a) == 0, "onednn %s conv: %ld allocations in a second call", pn,
                  (long)atomic_load(&allocs));
        CHECK_MSG(steady_allocs(blocked_conv, &b) == 0, "onednn %s blocked conv: %ld allocations in a second call", pn,
                  (long)atomic_load(&allocs));
        if (prec[i] == DT_F16) { /* bf16 blocked values at fp16: widened to f32 copies around the f32 path */
            b.in_l = b.out_l = DT_LAYOUT_BLOCKED_BF16;
            CHECK_MSG(steady_allocs(blocked_conv, &b) == 0,
                      "onednn fp16 conv of bf16 blocked values: %ld allocations in a second call",
                      (long)atomic_load(&allocs));
        }
        float *all[] = {b.a.in, b.a.w, b.a.b, b.a.out, b.a.dout, b.a.din, b.a.dw, b.a.db, b.a.work};
        for (size_t k = 0; k < sizeof all / sizeof *all; k++) __libc_free(all[k]);
    }
}

/* Out of memory in a oneDNN kernel's scratch: the kernel returns with the error set, and the next
 * take finds none. bf16 blocked values at fp16 are always widened into the thread's scratch; a
 * plane larger than above's, so that scratch must grow. */
static void test_onednn_fails(void) {
    if (!dt_onednn_built()) return;
    enum { FH = 2 * H };
    const dt_kernel_table *t = dt_backend_onednn(DT_F16);
    const size_t nin = (size_t)B * C * FH * FH, nout = (size_t)B * OC * FH * FH;
    float *in = filled(nin, 0), *w = filled((size_t)OC * C * K * K, 1), *out = filled(nout, 0);
    char why[192] = "";
    (void)dt_kernel_error_take(why, sizeof why); /* none left from above */
    atomic_store(&failing, 1);
    t->conv2d_forward_blocked(out, in, w, NULL, B, C, FH, FH, OC, K, S, P, DT_LAYOUT_BLOCKED_BF16,
                              DT_LAYOUT_BLOCKED_BF16);
    atomic_store(&failing, 0);
    CHECK_MSG(dt_kernel_error_take(why, sizeof why) && strstr(why, "out of memory"),
              "a oneDNN kernel out of scratch memory set no kernel error (got '%s')", why);
    CHECK_MSG(!dt_kernel_error_take(why, sizeof why), "the kernel error was not cleared by its take");
    __libc_free(in), __libc_free(w), __libc_free(out);
}

/* The counter itself: an allocation inside the window is seen. */
static void allocates(void *p) { *(void *volatile *)p = malloc(64); }

static void test_counter(void) {
    void *volatile q = NULL;
    CHECK_MSG(allocs_of(allocates, (void *)&q) == 1, "the counting malloc missed an allocation");
    __libc_free(q);
}

int main(void) {
    test_counter();
    test_tables();
    test_conv_pool();
    test_pool();
    test_onednn();
    test_onednn_fails();
    return dt_test_summary("kernel_alloc_test");
}
#endif
