/* Which of the fused kernels' instruction sets this CPU runs (backend/isa.h). */
#include "backend/isa.h"

int dt_isa_supported(dt_isa isa) {
    switch (isa) {
    case DT_ISA_PORTABLE: return 1;
#if DT_ISA_X86
    case DT_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case DT_ISA_AVX512: return __builtin_cpu_supports("avx512f");
#endif
    default: return 0;
    }
}

dt_isa dt_isa_best(void) {
    return dt_isa_supported(DT_ISA_AVX512) ? DT_ISA_AVX512
           : dt_isa_supported(DT_ISA_AVX2) ? DT_ISA_AVX2
                                           : DT_ISA_PORTABLE;
}

const char *dt_isa_name(dt_isa isa) {
    static const char *names[DT_ISA_COUNT] = {"portable", "avx2", "avx512"};
    return isa >= 0 && isa < DT_ISA_COUNT ? names[isa] : "?";
}
