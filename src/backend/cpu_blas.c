/* Which kernels OpenBLAS runs. Debian's OpenBLAS 0.3.21 does not know newer CPUs (seen: Intel
 * family 6 model 207, with AVX-512 and AMX) and falls back to its slow generic "Prescott" kernels
 * (docs/why.md); OPENBLAS_CORETYPE, read when the library loads, picks a kernel set by hand. */
#include "backend/isa.h"
#include "backend/layers.h"

#include <stdlib.h>
#include <string.h>

char *openblas_get_corename(void);

const char *dt_blas_corename(void) { return openblas_get_corename(); }

const char *dt_blas_coretype_for(const char *core, const char *env, bool avx512, bool avx2_fma) {
    if (env && *env) return NULL;                            /* the user chose */
    if (!core || strcmp(core, "Prescott") != 0) return NULL; /* a kernel set for this CPU */
    if (avx512) return "SkylakeX";
    if (avx2_fma) return "Haswell";
    return NULL;
}

bool dt_blas_core_misses_avx512(const char *core, bool avx512) {
    static const char *const avx512_sets[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    if (!avx512 || !core) return false;
    for (size_t i = 0; i < sizeof avx512_sets / sizeof *avx512_sets; i++)
        if (!strcmp(core, avx512_sets[i])) return false;
    return true;
}

static bool cpu_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

const char *dt_blas_better_coretype(void) {
    return dt_blas_coretype_for(openblas_get_corename(), getenv("OPENBLAS_CORETYPE"), cpu_avx512(),
                                dt_isa_supported(DT_ISA_AVX2));
}

bool dt_blas_avx512_unused(void) { return dt_blas_core_misses_avx512(openblas_get_corename(), cpu_avx512()); }
