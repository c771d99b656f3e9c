/* Op: causal multi-head self-attention over (T, 3C) rows of q, k, v side by side (the output of
 * the c_attn linear, nanoGPT's layout) -> (T, C); spec.heads heads. The output projection is a
 * separate linear node. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <math.h>
#include <stdlib.h>

static void dims(const dt_model *m, const dt_node *n, int *T, int *C) {
    const dt_node *in = dt_node_input(m, n, 0);
    *T = in->shape[0], *C = in->shape[1] / 3;
}

static dt_status attention_infer(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    if (in->dtype != DT_F32 || in->ndim != 2 || in->shape[1] % 3)
        return dt_graph_fail(m, n, "takes f32 (T, 3C) rows of q, k, v");
    int T, C;
    dims(m, n, &T, &C);
    if (n->a.heads <= 0 || C % n->a.heads)
        return dt_graph_fail(m, n, "%d heads do not divide the width %d", n->a.heads, C);
    n->dtype = DT_F32, n->ndim = 2, n->shape[0] = T, n->shape[1] = C;
    n->out_n = (size_t)T * C;
    return DT_OK;
}

static size_t attention_saved(const dt_model *m, const dt_node *n, int B) {
    int T, C;
    dims(m, n, &T, &C);
    return (size_t)B * n->a.heads * T * T * sizeof(float);
}

static size_t attention_workspace(const dt_model *m, const dt_node *n, int B) {
    (void)B;
    int T, C;
    dims(m, n, &T, &C);
    /* bf16 values (graph_layout.c): a sample's f32 output after the kernel's own; a bf16 input
     * gradient: a sample's f32 one */
    const size_t out = n->bf16 ? (size_t)T * C : 0, grad = dt_node_in_grad_bf16(m, n, 0) ? (size_t)3 * T * C : 0;
    return m->be->attention_workspace(T, C, n->a.heads) + (out > grad ? out : grad);
}

static dt_status attention_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    int T, C;
    dims(m, n, &T, &C);
    const int NH = n->a.heads;
    const float *qkv = dt_node_in(m, n, 0);
    if (!n->bf16) return c->be->attention_forward(n->out, n->saved, c->work, qkv, c->B, T, C, NH), DT_OK;
    float *f = c->work + c->be->attention_workspace(T, C, NH);
    const size_t tc = (size_t)T * C;
    for (int b = 0; b < c->B; b++) { /* a sample at a time (the kernel's samples are independent) */
        c->be->attention_forward(f, (float *)n->saved + (size_t)b * NH * T * T, c->work, qkv + 3 * tc * b, 1, T, C, NH);
        c->dev->ops->cast_f32_bf16(c->dev, dt_node_out_bf16(n) + tc * b, f, tc);
    }
    return DT_OK;
}

static void attention_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    if (!din[0]) return;
    int T, C;
    dims(m, n, &T, &C);
    const int NH = n->a.heads;
    const float *qkv = dt_node_in(m, n, 0);
    if (!dt_node_in_grad_bf16(m, n, 0))
        return c->be->attention_backward(din[0], c->work, n->grad, qkv, n->saved, c->B, T, C, NH);
    /* the c_attn's gradient stored bf16 (graph_layout.c): a sample at a time, then rounded */
    float *f = c->work + c->be->attention_workspace(T, C, NH);
    uint16_t *d16 = (uint16_t *)(void *)din[0];
    const size_t tc = (size_t)T * C;
    for (int b = 0; b < c->B; b++) {
        c->be->attention_backward(f, c->work, n->grad + tc * b, qkv + 3 * tc * b,
                                  (const float *)n->saved + (size_t)b * NH * T * T, 1, T, C, NH);
        c->dev->ops->cast_f32_bf16(c->dev, d16 + 3 * tc * b, f, 3 * tc);
    }
}

static double attention_flops(const dt_model *m, const dt_node *n, int B, bool need_din) {
    int T, C;
    dims(m, n, &T, &C);
    double fwd = 4.0 * B * T * (double)T * C; /* q k^T and P v, every head */
    return need_din ? 3 * fwd : fwd;
}

/* q, k, v of (N, T, 3C): softmax(q k^T / sqrt(D) + a causal mask) v, the heads split by Reshape and
 * Transpose. */
static dt_status attention_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in,
                                const char **out) {
    (void)m;
    const int T = n->shape[0], Cc = n->shape[1], NH = n->a.heads, D = Cc / NH;
    const int64_t split[3] = {Cc, Cc, Cc}, hshape[4] = {0, 0, NH, D}, oshape[3] = {0, 0, Cc};
    const int64_t p_q[4] = {0, 2, 1, 3}, p_k[4] = {0, 2, 3, 1};
    const char *sin[2] = {in[0], o->const_i64(o, "split", split, 3)};
    dt_onnx_node *sp = o->node(o, "Split", sin, 2, 3);
    o->attr_i(o, sp, "axis", 2);
    const char *hs = o->const_i64(o, "shape", hshape, 4), *qkv3[3];
    for (int j = 0; j < 3; j++) {
        const char *r = dt_onnx_node2(o, "Reshape", o->out(sp, j), hs);
        dt_onnx_node *t = dt_onnx_op(o, "Transpose", &r, 1);
        o->attr_ints(o, t, "perm", j == 1 ? p_k : p_q, 4);
        qkv3[j] = dt_onnx_out(o, t);
    }
    float *mask = malloc(sizeof(float) * (size_t)T * T);
    for (int i = 0; mask && i < T; i++)
        for (int j = 0; j < T; j++) mask[(size_t)i * T + j] = j <= i ? 0.0f : -1e30f;
    const int64_t mdims[2] = {T, T};
    const char *mk = mask ? o->const_f32(o, "causal_mask", mdims, 2, mask) : "?";
    free(mask);
    const char *att = dt_onnx_node2(o, "Mul", dt_onnx_node2(o, "MatMul", qkv3[0], qkv3[1]),
                                    dt_onnx_scalar(o, 1.0f / sqrtf((float)D)));
    const char *masked = dt_onnx_node2(o, "Add", att, mk);
    dt_onnx_node *sm = dt_onnx_op(o, "Softmax", &masked, 1);
    o->attr_i(o, sm, "axis", -1);
    const char *y = dt_onnx_node2(o, "MatMul", dt_onnx_out(o, sm), qkv3[2]);
    dt_onnx_node *t = dt_onnx_op(o, "Transpose", &y, 1);
    o->attr_ints(o, t, "perm", p_q, 4);
    *out = dt_onnx_node2(o, "Reshape", dt_onnx_out(o, t), o->const_i64(o, "shape", oshape, 3));
    return mk[0] == '?' ? dt_error(DT_ENOMEM, "export: out of memory") : DT_OK;
}

const dt_op dt_op_attention = {.name = "attention",
                               .help = "causal multi-head self-attention of (T, 3C) q, k, v rows",
                               .syntax = NULL,
                               .min_in = 1,
                               .max_in = 1,
                               .infer = attention_infer,
                               .saved_bytes = attention_saved,
                               .workspace = attention_workspace,
                               .forward = attention_forward,
                               .backward = attention_backward,
                               .flops = attention_flops,
                               .onnx = attention_onnx};
