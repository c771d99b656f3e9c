/* Which backend table new models take: a kernel library ("onednn" where built, else "blas") and a
 * GEMM precision (fp32, bf16, fp16), chosen once per process by dt_kernels_select (--kernels,
 * --precision). */
#include "backend/backend.h"

#include <stdio.h>
#include <string.h>

static const dt_kernel_table *g_default;

dt_status dt_backend_find(const char *kernels, dt_dtype precision, const dt_kernel_table **out) {
    *out = NULL;
    if (precision != DT_F32 && precision != DT_BF16 && precision != DT_F16)
        return dt_error(DT_EINVAL, "precision %s: use fp32, bf16 or fp16", dt_dtype_name(precision));
    if (!strcmp(kernels, "blas")) {
        *out = precision == DT_F32 ? dt_backend_cpu() : dt_backend_blas_lowp(precision);
        return DT_OK;
    }
    if (!strcmp(kernels, "onednn")) {
        if (!dt_onednn_built())
            return dt_error(DT_ENOTSUP, "`kernels` onednn: built without oneDNN: install libdnnl-dev and rebuild "
                                        "(or use `kernels` blas)");
        *out = dt_backend_onednn(precision);
        return DT_OK;
    }
    return dt_error(DT_EINVAL, "`kernels` %s: unknown kernel library (use onednn or blas)", kernels);
}

const dt_kernel_table *dt_backend_default(void) {
    if (!g_default) g_default = dt_onednn_built() ? dt_backend_onednn(DT_F32) : dt_backend_cpu();
    return g_default;
}

static const char *precision_word(dt_dtype p) { return p == DT_BF16 ? "bf16" : p == DT_F16 ? "fp16" : "fp32"; }

dt_status dt_kernels_select(const char *kernels, const char *precision) {
    const dt_kernel_table *cur = dt_backend_default();
    dt_dtype p = cur->precision;
    if (precision) {
        if (!strcmp(precision, "fp32") || !strcmp(precision, "f32")) p = DT_F32;
        else if (!strcmp(precision, "bf16")) p = DT_BF16;
        else if (!strcmp(precision, "fp16") || !strcmp(precision, "f16")) p = DT_F16;
        else return dt_error(DT_EINVAL, "`precision` %s: unknown precision (use fp32, bf16 or fp16)", precision);
    }
    const dt_kernel_table *be;
    DT_TRY(dt_backend_find(kernels ? kernels : cur->name, p, &be));
    g_default = be;
    return DT_OK;
}

const char *dt_kernels_describe(void) {
    static _Thread_local char buf[32];
    const dt_kernel_table *be = dt_backend_default();
    snprintf(buf, sizeof buf, "%s %s", be->name, precision_word(be->precision));
    return buf;
}

const char *dt_kernels_note(void) {
    const dt_kernel_table *be = dt_backend_default();
    if (be->precision == DT_F32) return NULL;
    if (!strcmp(be->name, "blas"))
        return "blas at bf16/fp16 rounds the GEMM inputs, then runs sgemm: correct but slower than fp32 "
               "(`kernels` onednn is the fast path)";
    if (be->precision == DT_F16)
        return "oneDNN 2.6 has no fp16 GEMM on CPUs: inputs are rounded to fp16, then f32 oneDNN GEMMs "
               "(correct, not faster than fp32)";
    if (!dt_onednn_bf16_native())
        return "this CPU lacks AVX512-BF16/AMX: inputs are rounded to bf16, then f32 oneDNN GEMMs "
               "(correct, slower than fp32)";
    return NULL;
}

bool dt_kernels_onednn_built(void) { return dt_onednn_built(); }
void dt_kernels_impls(char *buf, size_t n) { dt_onednn_impls(buf, n); }
