/* The convolutions' cached oneDNN entries, shared by cpu_onednn_conv_entry.c (which builds them)
 * and cpu_onednn_conv.c (which runs them, with the fallbacks around them). Only compiled with
 * DT_HAVE_DNNL. */
#ifndef DT_BACKEND_ONEDNN_CONV_H
#define DT_BACKEND_ONEDNN_CONV_H

#include "backend/onednn.h"

typedef struct {
    int B, C, H, W, OC, K, S, P, OH, OW;
    bool bias;
    dt_layout in_l, out_l; /* of in / out (and dout) outside; din is f32 in in's layout (blocked f32
                            * for bf16 in) */
    bool in_bl, out_bl;    /* in (din) / out (dout) blocked or NHWC (f32 or bf16), else NCHW */
} conv_shape;

static inline conv_shape shape_of(int B, int C, int H, int W, int OC, int K, int S, int P, bool bias, dt_layout in_l,
                                  dt_layout out_l) {
    conv_shape s = {B,
                    C,
                    H,
                    W,
                    OC,
                    K,
                    S,
                    P,
                    (H + 2 * P - K) / S + 1,
                    (W + 2 * P - K) / S + 1,
                    bias,
                    in_l,
                    out_l,
                    in_l != DT_LAYOUT_NCHW,
                    out_l != DT_LAYOUT_NCHW};
    return s;
}

static inline bool has_bf16(const conv_shape *s) { return dt_layout_bf16(s->in_l) || dt_layout_bf16(s->out_l); }

/* The entry of op (DT_DNNL_CONV_*) for s with GEMM inputs of dtype p; NULL when oneDNN has none.
 * Outside it takes f32 NCHW/OIHW; reorders convert to the layout and dtype oneDNN chose. A
 * backward entry with w_flipped takes the weights as flipped_weights (cpu_onednn_conv.c) makes them. */
dt_dnnl_entry *dt_dnnl_conv_entry(int op, const conv_shape *s, dt_dtype p);
/* Entry of op at precision p, or its f32 entry with *round set (oneDNN lacks the kernel at p). */
dt_dnnl_entry *dt_dnnl_conv_plan(int op, const conv_shape *s, dt_dtype p, bool *round);

#endif
