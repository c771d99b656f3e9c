/* The vector GELU kernels (backend/gelu.h): gelu_vec.h for AVX-512 (16 lanes) and AVX2 + FMA (8),
 * and the bf16-out forward once more with AVX512-BF16's rounding (dt_cast_bf16's where it runs). */
#include "backend/gelu.h"

#if DT_ISA_X86
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AV_VL 16
#define AV_TARGET "avx512f"
#define AV_SUFFIX avx512
#include "backend/gelu_vec.h"

#define AV_VL 16
#define AV_TARGET "avx512f,avx512bw,avx512vl,avx512bf16"
#define AV_SUFFIX avx512bf16
#define AV_BF16_NATIVE 1
#include "backend/gelu_vec.h"

#define AV_VL 8
#define AV_TARGET "avx2,fma"
#define AV_SUFFIX avx2
#include "backend/gelu_vec.h"
#endif
