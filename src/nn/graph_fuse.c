/* Fusing a first convolution with its relu and max pooling: a conv whose values only a maxpool
 * reads (through a relu it applies, fused_relu), with non-overlapping windows, few input channels
 * and an input that needs no gradient (the first layer of a CNN) computes the pooled values in one
 * pass (backend conv_pool) and never writes its own: its full-size output and gradient, the
 * largest tensors of such a model, are then never allocated. The conv node runs the fused forward
 * and backward, so the hooks around it (ZeRO-3's gathers) cover its parameters; the maxpool node
 * only holds the pooled values, window positions and gradient. Runs after the layout plan (the
 * pool's n->blocked says in which layout it writes). */
#include "nn/graph_internal.h"

enum { MAX_FUSED_C = 4 }; /* input channels: the fused kernel keeps C * K * K weight vectors at hand */

/* The conv that maxpool p reads (through a relu it applies), or NULL. */
static dt_node *conv_of(dt_model *m, const dt_node *p) {
    dt_node *src = &m->nodes[p->in[0]];
    if (src->a.kind == DT_LAYER_RELU) {
        if (!p->fused_relu || !src->alias) return NULL;
        src = &m->nodes[src->in[0]];
    }
    return src->a.kind == DT_LAYER_CONV2D && !src->alias ? src : NULL;
}

static bool fusable(dt_model *m, const dt_node *p, const dt_node *conv) {
    const dt_node *in = &m->nodes[conv->in[0]];
    while (in->alias) in = &m->nodes[in->in[0]];
    int C, H, W;
    dt_node_chw(&m->nodes[conv->in[0]], &C, &H, &W);
    return conv->consumers == 1 && conv->id != m->output && conv->a.stride == 1 && !in->needs_grad &&
           C <= MAX_FUSED_C && conv->shape[0] % 16 == 0 && p->a.k == p->a.stride && p->a.k < 16 && p->shape[1] > 0 &&
           p->shape[2] > 0 && !dt_node_in_blocked(m, conv, 0);
}

void dt_graph_fuse_conv_pool(dt_model *m) {
    const dt_kernel_table *be = m->be;
    for (int i = 0; i < m->n; i++) m->nodes[i].fused_pool = -1, m->nodes[i].fused_conv = false;
    if (!be || !be->conv_pool_forward || !be->conv_pool_backward) return;
    for (int i = 0; i < m->n; i++) {
        dt_node *p = &m->nodes[i];
        if (p->a.kind != DT_LAYER_MAXPOOL2D || p->alias || p->input_index >= 0) continue;
        dt_node *conv = conv_of(m, p);
        if (!conv || !fusable(m, p, conv)) continue;
        conv->fused_pool = i, p->fused_conv = true;
    }
}

dt_conv_pool_shape dt_node_conv_pool_shape(const dt_model *m, const dt_node *conv) {
    const dt_node *p = &m->nodes[conv->fused_pool];
    int C, H, W;
    dt_node_chw(&m->nodes[conv->in[0]], &C, &H, &W);
    return (dt_conv_pool_shape){.B = m->B,
                                .C = C,
                                .H = H,
                                .W = W,
                                .OC = conv->a.out,
                                .K = conv->a.k,
                                .P = conv->a.pad,
                                .PK = p->a.k,
                                .relu = p->fused_relu,
                                .out_bl = p->blocked,
                                .out_nhwc = m->nhwc,
                                .out_bf16 = p->bf16};
}

bool dt_model_node_fused(const dt_model *m, int node) {
    if (node < 0 || node >= m->n) return false;
    const dt_node *n = &m->nodes[node];
    while (n->alias) n = &m->nodes[n->in[0]];
    return n->fused_pool >= 0;
}
