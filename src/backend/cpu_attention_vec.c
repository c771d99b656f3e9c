/* The fused causal attention kernels, one per vector width: attention_vec.h instantiated for
 * AVX-512 (16 lanes) and AVX2 + FMA (8 lanes). Each function carries its target attribute, so a
 * portable build (-march=x86-64-v2) has them too; cpu_attention.c calls one only where
 * __builtin_cpu_supports says the CPU runs it. */
#include "backend/attention.h"

#if DT_ISA_X86
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AV_VL 16
#define AV_TARGET "avx512f"
#define AV_SUFFIX avx512
#include "backend/attention_vec.h"

#define AV_VL 8
#define AV_TARGET "avx2,fma"
#define AV_SUFFIX avx2
#include "backend/attention_vec.h"
#endif
