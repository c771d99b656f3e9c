/* The causal attention kernels behind dt_attention_forward/backward (include/dtrain/layers.h): a
 * fused one per vector width (cpu_attention_vec.c: AVX-512 and AVX2+FMA, picked at run time) and
 * the OpenBLAS one (cpu_attention.c) where the CPU has neither. attention_test runs each one this
 * CPU can against the others. All take the public functions' arguments; work holds
 * dt_attention_workspace(T, C, NH) floats. */
#ifndef DT_BACKEND_ATTENTION_H
#define DT_BACKEND_ATTENTION_H

#include <stddef.h>

typedef enum { DT_ATT_BLAS, DT_ATT_AVX2, DT_ATT_AVX512, DT_ATT_NKINDS } dt_att_kind;

/* The kind dt_attention_forward/backward run on this CPU (the widest it supports). */
dt_att_kind dt_att_best(void);
/* Whether this CPU can run kind k; its name ("blas", "avx2", "avx512"). */
int dt_att_supported(dt_att_kind k);
const char *dt_att_name(dt_att_kind k);
void dt_att_forward(dt_att_kind k, float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH);
void dt_att_backward(dt_att_kind k, float *dqkv, float *work, const float *dout, const float *qkv, const float *att,
                     int B, int T, int C, int NH);

void dt_attention_forward_avx512(float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH);
void dt_attention_backward_avx512(float *dqkv, float *work, const float *dout, const float *qkv, const float *att,
                                  int B, int T, int C, int NH);
void dt_attention_forward_avx2(float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH);
void dt_attention_backward_avx2(float *dqkv, float *work, const float *dout, const float *qkv, const float *att,
                                int B, int T, int C, int NH);

#endif
