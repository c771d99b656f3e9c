/* Kernel libraries and precision: which CPU kernels (oneDNN, OpenBLAS) new models run with and at
 * what GEMM precision, and what this machine's BLAS chose; for a program that reports or picks
 * its kernels. */
#ifndef DTRAIN_KERNELS_H
#define DTRAIN_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The BLAS library ---------------------------------------------------------------------- *
 * dt_blas_corename: the kernel set OpenBLAS chose ("SkylakeX", "Haswell", "Zen", "Prescott"...).
 * dt_blas_better_coretype: when OpenBLAS did not recognise this CPU and fell back to its generic
 * Prescott kernels although the CPU has AVX-512 (or AVX2 + FMA), the OPENBLAS_CORETYPE to set
 * before the library loads ("SkylakeX", "Haswell"); NULL otherwise or when OPENBLAS_CORETYPE is
 * already set. The dtrain command re-executes itself with it; an embedding program can do the same. */
const char *dt_blas_corename(void);
const char *dt_blas_better_coretype(void);
/* The decision of dt_blas_better_coretype on given facts: OpenBLAS's core name, the value of
 * OPENBLAS_CORETYPE (NULL: unset) and the CPU's features (AVX-512 F/BW/VL/DQ; AVX2 and FMA). */
const char *dt_blas_coretype_for(const char *core, const char *env, bool avx512, bool avx2_fma);
/* Whether OpenBLAS's kernel set `core` leaves AVX-512 unused on a CPU that has it (avx512): true
 * for any set but SkylakeX, Cooperlake and SapphireRapids (e.g. "Haswell" or "Zen" forced by
 * OPENBLAS_CORETYPE). dt_blas_avx512_unused asks it of this process's OpenBLAS and CPU. */
bool dt_blas_core_misses_avx512(const char *core, bool avx512);
bool dt_blas_avx512_unused(void);

/* ---- Kernel libraries and precision --------------------------------------------------------- *
 * dt_kernels_select: the kernels new models run from now on in this process: "onednn" (the
 * default where built) or "blas", with GEMMs (linear, matmul_t, conv) in "fp32", "bf16" or
 * "fp16" (low-precision inputs, f32 accumulation; weights stay f32 masters). NULL keeps the
 * current choice. DT_EINVAL naming the bad word; DT_ENOTSUP for onednn in a build without it.
 * dt_kernels_describe: "onednn fp32" etc. of the current choice (static string). */
dt_status dt_kernels_select(const char *kernels, const char *precision);
const char *dt_kernels_describe(void);
/* A one-line note when the chosen precision will be slow here (blas bf16/fp16 round then run
 * sgemm; oneDNN 2.6 has no CPU fp16 GEMM; on a CPU without AVX512-BF16 oneDNN's bf16 rounds the
 * inputs, then runs f32 kernels), else NULL (static text). */
const char *dt_kernels_note(void);
/* Whether oneDNN is built in; the implementations oneDNN chose on this thread so far
 * ("matmul(f32) brg:avx512_core; conv_fwd(f32) ..."), written to buf (n bytes). */
bool dt_kernels_onednn_built(void);
void dt_kernels_impls(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
