/* The bf16 VNNI packing of GEMM B operands (cpu_onednn_pack.c) against oneDNN's own reorder to
 * the same layout: bitwise equal bytes, padding included, for full and partial blocks and a
 * leading dimension wider than N; then the bf16 linear layer on the onednn backend (which packs
 * where the CPU allows) against the blas bf16 kernels (inputs rounded, sgemm), its bias gradient
 * included; and that the buffers our code hands oneDNN are 64-byte aligned. */
#include "core/test.h"

#include <string.h>

#include "backend/backend.h"

#if DT_HAVE_DNNL
#include "backend/onednn.h"

static float *rnd(size_t n, uint64_t key) {
    float *x = malloc(n * sizeof *x + 4);
    dt_rng_fill_uniform(x, n, -2, 2, 5, key);
    return x;
}

/* oneDNN's reorder of src (K, N, leading dimension ld) into the tag's bf16 layout, compared with
 * dt_dnnl_vnni_pack at block nb. */
/* ld: of the rows (row-major), past N by as much as the columns' (column-major) past K. */
static void pack_case(int K, int N, int ld, dnnl_format_tag_t tag, int nb, bool cols) {
    dnnl_engine_t eng = dt_dnnl_engine();
    if (cols) ld = K + ld - N;
    const int64_t dims[2] = {K, N}, strides[2] = {cols ? 1 : ld, cols ? ld : 1};
    dnnl_memory_desc_t from = dt_dnnl_md(2, dims, dnnl_f32, strides), to;
    const dnnl_dims_t d = {K, N};
    CHECK(dnnl_memory_desc_init_by_tag(&to, 2, d, dnnl_bf16, tag) == dnnl_success);
    float *src = rnd((size_t)(cols ? N : K) * ld, (uint64_t)(K * 1000 + N));
    src[0] = 1.00390625f; /* halfway between two bf16 values: to even */
    const size_t bytes = dnnl_memory_desc_get_size(&to);
    uint16_t *want = calloc(bytes, 1), *got = malloc(bytes);
    memset(got, 0xab, bytes);
    dnnl_memory_t mf, mt;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t r;
    dnnl_stream_t st;
    CHECK(dnnl_memory_create(&mf, &from, eng, src) == dnnl_success);
    CHECK(dnnl_memory_create(&mt, &to, eng, want) == dnnl_success);
    CHECK(dnnl_reorder_primitive_desc_create(&pd, &from, eng, &to, eng, NULL) == dnnl_success);
    CHECK(dnnl_primitive_create(&r, pd) == dnnl_success);
    CHECK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags) == dnnl_success);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mf}, {DNNL_ARG_TO, mt}};
    CHECK(dnnl_primitive_execute(r, st, 2, args) == dnnl_success);
    dnnl_stream_wait(st);
    CHECK_MSG(dt_dnnl_vnni_block(&to, K, N) == nb, "K%d N%d: block %d, want %d", K, N, dt_dnnl_vnni_block(&to, K, N),
              nb);
    dt_dnnl_vnni_pack(got, src, cols ? DT_VNNI_F32_COLS : DT_VNNI_F32_ROWS, K, N, ld, nb, dt_dnnl_vnni_padded_k(&to));
    size_t bad = 0;
    for (size_t i = 0; i < bytes / 2; i++) bad += got[i] != want[i];
    CHECK_MSG(bad == 0, "K%d N%d ld%d nb%d %s: %zu of %zu bf16 values differ from oneDNN's reorder", K, N, ld, nb,
              cols ? "column-major" : "row-major", bad, bytes / 2);
    dnnl_stream_destroy(st), dnnl_primitive_destroy(r), dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(mf), dnnl_memory_destroy(mt);
    free(src), free(want), free(got);
}

/* linear forward and backward at bf16: onednn within f32 summation order of blas bf16. */
static void linear_case(int B, int C, int OC) {
    const dt_kernel_table *be, *ref = dt_backend_blas_lowp(DT_BF16);
    CHECK_OK(dt_backend_find("onednn", DT_BF16, &be));
    float *x = rnd((size_t)B * C, 1), *w = rnd((size_t)OC * C, 2), *b = rnd(OC, 3), *dy = rnd((size_t)B * OC, 4);
    float *y[2], *dx[2], *dw[2], *db[2];
    for (int k = 0; k < 2; k++) {
        const dt_kernel_table *t = k ? be : ref;
        y[k] = malloc((size_t)B * OC * 4), dx[k] = malloc((size_t)B * C * 4);
        dw[k] = calloc((size_t)OC * C, 4), db[k] = calloc(OC, 4);
        float *work = malloc(dt_linear_workspace_of(t, B, C, OC) * 4 + 4);
        t->linear_forward(y[k], x, w, b, work, B, C, OC);
        t->linear_backward(dx[k], dw[k], db[k], dy, x, w, work, B, C, OC);
        free(work);
    }
    double e[4] = {0}, m[4] = {0};
    const float *a[4] = {y[1], dx[1], dw[1], db[1]}, *r[4] = {y[0], dx[0], dw[0], db[0]};
    const size_t n[4] = {(size_t)B * OC, (size_t)B * C, (size_t)OC * C, (size_t)OC};
    for (int q = 0; q < 4; q++)
        for (size_t i = 0; i < n[q]; i++) m[q] = fmax(m[q], fabs(r[q][i])), e[q] = fmax(e[q], fabs(a[q][i] - r[q][i]));
    for (int q = 0; q < 4; q++)
        CHECK_MSG(e[q] <= 1e-5 * m[q], "linear B%d C%d OC%d: %s differs by %g of %g", B, C, OC,
                  q == 0   ? "out"
                  : q == 1 ? "din"
                  : q == 2 ? "dw"
                           : "db",
                  e[q], m[q]);
    for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]), free(dw[k]), free(db[k]);
    free(x), free(w), free(b), free(dy);
}

/* The buffers our code hands oneDNN (packed B operands, cast inputs, scratch) start on 64-byte
 * lines, at every size and after every growth: AMX rows that straddle lines ran a bf16 GEMM up to
 * 2.6x slower (cpu_onednn.c). */
static void alignment_case(void) {
    const size_t sizes[] = {1, 2, 3, 17, 100, 4099, 200001, 1u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        void *p = dt_dnnl_alloc(sizes[i]);
        CHECK_MSG(p && ((uintptr_t)p & 63) == 0, "dt_dnnl_alloc(%zu) gave %p, not 64-byte aligned", sizes[i], p);
        memset(p, 1, sizes[i]); /* all of it is ours (ASan checks) */
        free(p);
        for (int slot = 0; slot < DT_DNNL_SCRATCH_SLOTS; slot++) {
            void *q = dt_dnnl_scratch(slot, sizes[i]);
            CHECK_MSG(((uintptr_t)q & 63) == 0, "scratch slot %d at %zu bytes: %p, not 64-byte aligned", slot, sizes[i],
                      q);
            memset(q, 2, sizes[i]);
        }
    }
}

int main(void) {
    alignment_case();
    if (!__builtin_cpu_supports("avx512bf16")) {
        printf("cpu_onednn_pack_test: no AVX512-BF16 here: oneDNN's reorders pack, nothing of ours to test\n");
        CHECK(dt_dnnl_vnni_block(NULL, 1, 1) == 0);
    } else {
        for (int cols = 0; cols < 2; cols++) { /* row-major, then column-major (a weight as w^T) */
            pack_case(64, 128, 128, dnnl_BA16a64b2a, 64, cols);
            pack_case(768, 512, 512, dnnl_BA16a64b2a, 64, cols);
            pack_case(37, 100, 130, dnnl_BA16a64b2a, 64, cols); /* partial blocks, ld past the matrix */
            pack_case(17, 10, 10, dnnl_BA16a16b2a, 16, cols);
            pack_case(33, 40, 41, dnnl_BA16a32b2a, 32, cols);
            pack_case(16, 48, 48, dnnl_BA16a48b2a, 48, cols);
        }
    }
    linear_case(768, 128, 512);
    linear_case(37, 100, 70);
    linear_case(5, 3, 10);
    return dt_test_summary("cpu_onednn_pack_test");
}
#else
int main(void) {
    printf("cpu_onednn_pack_test: built without oneDNN\n");
    return 0;
}
#endif
