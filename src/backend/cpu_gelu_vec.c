/* The vector GELU kernels (backend/gelu.h): gelu_vec.h for AVX-512 (16 lanes) and AVX2 + FMA (8). */
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

#define AV_VL 8
#define AV_TARGET "avx2,fma"
#define AV_SUFFIX avx2
#include "backend/gelu_vec.h"
#endif
