/* Activation layouts and bf16 storage. Which values stay in the kernel table's blocked layout
 * (and whether NHWC) is the device's decision (device.h plan_layouts; the CPU device's in
 * src/device/cpu_plan.c: oneDNN's conv chains): dt_graph_plan_layouts describes the graph to it and
 * applies what it says, naming no library's layout.
 * At bf16, where the backend's blocked convs take bf16 values, a blocked value that only bf16
 * convs and maxpools touch is stored bf16 (half the bytes, and no conv converts it): a conv's
 * values and gradient when a maxpool is its only reader (the pool reads bf16 and writes the
 * gradient once), and the values a fused conv -> maxpool (graph_fuse.c) writes when only bf16
 * convs read them (their gradient, which the convs' backward data writes, stays f32). Values
 * that only bf16 linears read are stored bf16 too (plan_linear_inputs); their gradient stays f32.
 * So does a bf16 linear's gradient where a GELU or an attention is its only reader
 * (plan_linear_grads), and, around a GELU between two bf16 linears, the first linear's values
 * and the GELU's gradient (plan_gelu_between_linears: the one plan that changes results). */
#include "nn/graph_internal.h"

#include <stdlib.h>

static const dt_node *owner_of(const dt_model *m, const dt_node *n) {
    while (n->alias) n = &m->nodes[n->in[0]];
    return n;
}

static dt_plan_op plan_op(dt_layer_kind k) {
    return k == DT_LAYER_CONV2D      ? DT_PLAN_CONV
           : k == DT_LAYER_MAXPOOL2D ? DT_PLAN_MAXPOOL
           : k == DT_LAYER_RELU      ? DT_PLAN_RELU
                                     : DT_PLAN_OTHER;
}

dt_status dt_graph_plan_layouts(dt_model *m, dt_dev *dev) {
    m->nhwc = false;
    for (int i = 0; i < m->n; i++) m->nodes[i].blocked = false;
    if (!dev->ops->plan_layouts || m->n == 0) return DT_OK;
    dt_plan_node *d = calloc((size_t)m->n, sizeof *d);
    bool *blocked = calloc((size_t)m->n, sizeof *blocked);
    if (!d || !blocked) {
        free(d), free(blocked);
        return dt_error(DT_ENOMEM, "model: out of memory planning the layouts of %d nodes", m->n);
    }
    for (int i = 0; i < m->n; i++) {
        const dt_node *n = &m->nodes[i];
        d[i] = (dt_plan_node){.op = plan_op(n->a.kind),
                              .nin = n->nin,
                              .alias = n->alias,
                              .input = n->input_index >= 0,
                              .output = i == m->output,
                              .ndim = n->ndim,
                              .channels = n->ndim == 3 ? n->shape[0] : 0};
        for (int k = 0; k < n->nin && k < 3; k++) d[i].in[k] = n->in[k];
    }
    dt_plan_layouts out = {.blocked = blocked};
    dev->ops->plan_layouts(dev, m->be, d, m->n, &out);
    m->nhwc = out.nhwc;
    for (int i = 0; i < m->n; i++) m->nodes[i].blocked = blocked[i];
    free(d), free(blocked);
    return DT_OK;
}

/* The nodes (not aliases) that read node i's memory: their count, and whether each passes `ok`. */
static int readers(const dt_model *m, int i, bool (*ok)(const dt_model *, const dt_node *), bool *all) {
    int n = 0;
    *all = true;
    for (int j = 0; j < m->n; j++) {
        const dt_node *r = &m->nodes[j];
        if (r->alias) continue;
        for (int k = 0; k < r->nin; k++)
            if (owner_of(m, &m->nodes[r->in[k]])->id == i) n++, *all &= ok(m, r);
    }
    return n;
}

static bool bf16_conv(const dt_model *m, const dt_node *r) {
    int C, H, W;
    dt_node_chw(&m->nodes[r->in[0]], &C, &H, &W);
    return r->a.kind == DT_LAYER_CONV2D && r->fused_pool < 0 && m->be->conv2d_bf16_values(C);
}

static bool blocked_maxpool(const dt_model *m, const dt_node *r) {
    return r->a.kind == DT_LAYER_MAXPOOL2D && !r->fused_conv && dt_node_in_blocked(m, r, 0);
}

static bool bf16_linear(const dt_model *m, const dt_node *r) {
    (void)m;
    return r->a.kind == DT_LAYER_LINEAR || r->a.kind == DT_LAYER_MATMUL_T;
}

/* A reader whose backward can write its input's gradient bf16 (op_linear.c's linear; matmul_t's
 * cannot). */
static bool writes_bf16_din(const dt_model *m, const dt_node *r) {
    (void)m;
    return r->a.kind == DT_LAYER_LINEAR;
}

/* Ops that can write bf16 values (op_layernorm.c, op_activation.c, op_attention.c) and whose
 * backward does not read them (relu and gelu read their input, not their output). */
static bool writes_bf16(const dt_node *n) {
    return n->a.kind == DT_LAYER_LAYERNORM || n->a.kind == DT_LAYER_GELU || n->a.kind == DT_LAYER_RELU ||
           n->a.kind == DT_LAYER_ATTENTION;
}

/* Values that only bf16 linears read (a GPT's layernorms, GELUs and attention outputs, an MLP's
 * relu), stored bf16: each linear would round them to bf16 anyway, so the result is the same,
 * with half the bytes written and read and no conversion in front of the GEMMs. */
static void plan_linear_inputs(dt_model *m) {
    const dt_kernel_table *be = m->be;
    if (!be || be->precision != DT_BF16 || !be->linear_bf16_values || !be->linear_bf16_values() ||
        !be->linear_forward_bf16 || !be->linear_backward_bf16)
        return;
    for (int i = 0; i < m->n; i++) {
        dt_node *n = &m->nodes[i];
        if (n->alias || n->blocked || n->input_index >= 0 || i == m->output || !writes_bf16(n)) continue;
        bool all;
        n->bf16 = readers(m, i, bf16_linear, &all) > 0 && all;
    }
}

/* Ops whose backward can write its input's gradient bf16 (op_activation.c, op_attention.c). */
static bool rounds_grad(const dt_model *m, const dt_node *r) {
    (void)m;
    return r->a.kind == DT_LAYER_GELU || r->a.kind == DT_LAYER_ATTENTION;
}

/* The gradient of a linear that takes bf16 values and whose only reader is a GELU or an attention
 * (a GPT's c_fc and c_attn), stored bf16: that backward rounds it as it writes it, which the
 * linear's GEMMs would do anyway (the same bits), and the linear reads half the bytes. Its bias
 * gradient then sums the rounded values (within bf16 rounding of the f32 sums, as autocast's). */
static void plan_linear_grads(dt_model *m) {
    const dt_kernel_table *be = m->be;
    if (!be || be->precision != DT_BF16 || !be->gelu_backward_bf16 || !be->linear_backward_bf16_grad) return;
    for (int i = 0; i < m->n; i++) {
        dt_node *n = &m->nodes[i];
        if (n->alias || n->input_index >= 0 || i == m->output || n->a.kind != DT_LAYER_LINEAR ||
            !dt_node_in_bf16(m, n, 0))
            continue;
        bool all;
        n->grad_bf16 = readers(m, i, rounds_grad, &all) == 1 && all;
    }
}

static bool linear_of_f32_grad(const dt_model *m, const dt_node *r) {
    (void)m;
    return r->a.kind == DT_LAYER_LINEAR && !r->grad_bf16;
}

/* A GELU between two bf16 linears (a GPT's MLP: c_fc -> gelu -> c_proj), once the GELU's values
 * and c_fc's gradient are bf16: c_fc writes its values bf16 too, and c_proj the GELU's gradient
 * (the GEMMs round their f32 sums as they store them), so that all four buffers around the GELU
 * are bf16. This one rounds where the f32 plan does not: the GELU reads x and dout rounded to
 * bf16 (as autocast's bf16 linear outputs are); graph_bf16_test bounds the difference. */
static void plan_gelu_between_linears(dt_model *m) {
    const dt_kernel_table *be = m->be;
    if (!be || !be->gelu_forward_bf16io || !be->gelu_backward_bf16io || !be->linear_forward_bf16io ||
        !be->linear_backward_bf16_din)
        return;
    for (int i = 0; i < m->n; i++) {
        dt_node *g = &m->nodes[i];
        if (g->alias || g->a.kind != DT_LAYER_GELU || !g->bf16) continue;
        dt_node *f = &m->nodes[g->in[0]];
        bool all;
        if (f->alias || f->a.kind != DT_LAYER_LINEAR || !f->grad_bf16 || f->bf16 ||
            readers(m, i, linear_of_f32_grad, &all) != 1 || !all)
            continue;
        f->bf16 = g->grad_bf16 = true;
    }
}

void dt_graph_plan_bf16(dt_model *m) {
    const dt_kernel_table *be = m->be;
    for (int i = 0; i < m->n; i++) m->nodes[i].bf16 = m->nodes[i].grad_bf16 = false;
    plan_linear_inputs(m);
    plan_linear_grads(m);
    plan_gelu_between_linears(m);
    if (!be || be->precision != DT_BF16 || !be->conv2d_bf16_values || !be->maxpool2d_forward_blocked_bf16 ||
        !be->maxpool2d_backward_blocked_bf16)
        return;
    for (int i = 0; i < m->n; i++) {
        dt_node *n = &m->nodes[i];
        if (!n->blocked || n->alias || i == m->output) continue;
        bool all;
        if (n->a.kind == DT_LAYER_CONV2D && n->fused_pool < 0 && bf16_conv(m, n))
            n->bf16 = n->grad_bf16 = readers(m, i, blocked_maxpool, &all) == 1 && all;
        else if (n->a.kind == DT_LAYER_MAXPOOL2D && n->fused_conv) n->bf16 = readers(m, i, bf16_conv, &all) > 0 && all;
    }
    /* The pool at a chain's end (NCHW out) of bf16 values that only bf16 linears read (the CNN's
     * flatten -> linear): its maxima are bf16 values, stored so exactly, and the linear skips
     * its cast. Its backward does not read them (a fused relu is in its argmax). Where its
     * windows tile its input and one linear reads it, that linear writes the pool's gradient
     * bf16 as well: each value of the pool's bf16 din is one of them or 0, so rounding them
     * first changes nothing (blocked_bf16_test). */
    if (!be->linear_bf16_values || !be->linear_bf16_values() || !be->linear_forward_bf16 || !be->linear_backward_bf16)
        return;
    for (int i = 0; i < m->n; i++) {
        dt_node *n = &m->nodes[i];
        bool all;
        if (n->a.kind != DT_LAYER_MAXPOOL2D || n->fused_conv || n->blocked || n->alias || i == m->output ||
            !dt_node_in_bf16(m, n, 0))
            continue;
        const int readers_n = readers(m, i, bf16_linear, &all);
        n->bf16 = readers_n > 0 && all;
        int C, H, W;
        dt_node_chw(dt_node_input(m, n, 0), &C, &H, &W);
        n->grad_bf16 = n->bf16 && readers_n == 1 && readers(m, i, writes_bf16_din, &all) == 1 && all &&
                       be->linear_backward_bf16_din && dt_node_in_grad_bf16(m, n, 0) &&
                       dt_pool_windows_tile(H, W, n->a.k, n->a.stride);
    }
}
