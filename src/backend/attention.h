/* The causal attention kernels behind dt_attention_forward/backward (include/dtrain/layers.h): a
 * fused one per vector width (cpu_attention_vec.c: AVX-512 and AVX2+FMA, picked at run time) and
 * the OpenBLAS one (cpu_attention.c) where the CPU has neither. attention_test runs each one this
 * CPU can against a naive attention. All take the public functions' arguments; work holds
 * dt_attention_workspace(T, C, NH) floats. */
#ifndef DT_BACKEND_ATTENTION_H
#define DT_BACKEND_ATTENTION_H

#include <stddef.h>

#include "backend/isa.h"

/* The kernel for isa (DT_ISA_PORTABLE: the OpenBLAS one); dt_attention_forward/backward run
 * dt_isa_best()'s. */
void dt_att_forward(dt_isa k, float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH);
void dt_att_backward(dt_isa k, float *dqkv, float *work, const float *dout, const float *qkv, const float *att, int B,
                     int T, int C, int NH);

void dt_attention_forward_avx512(float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH);
void dt_attention_backward_avx512(float *dqkv, float *work, const float *dout, const float *qkv, const float *att,
                                  int B, int T, int C, int NH);
void dt_attention_forward_avx2(float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH);
void dt_attention_backward_avx2(float *dqkv, float *work, const float *dout, const float *qkv, const float *att, int B,
                                int T, int C, int NH);

#endif
