/* The CPU device's plan step (device.h plan_layouts): where its kernel table has blocked
 * convolutions (oneDNN's nChw16c or nChw8c, backend/blocked.h; NHWC instead at bf16 where the
 * table's bf16 convs want it: oneDNN's AMX kernels), a chain conv -> (relu) -> maxpool -> conv ...
 * keeps its values and gradients blocked, so that the convolutions run without reordering them;
 * the chain's last maxpool writes NCHW (its input stays blocked), and so does a conv whose values
 * anything else reads. A value is blocked when its channels are a multiple of 16, it is not the
 * output, and every node that reads it is a conv or a maxpool (a relu fused into the maxpool reads
 * nothing itself). Every copy of a model (pipeline stages) plans the same layouts, so values sent
 * between them agree. The checked device runs the same kernels and plans the same. */
#include "device/device.h"

static int owner_of(const dt_plan_node *nodes, int i) {
    while (nodes[i].alias) i = nodes[i].in[0];
    return i;
}

/* Whether every reader of node i's memory takes blocked values. */
static bool readers_take_blocked(const dt_plan_node *nodes, int n, int i) {
    for (int j = 0; j < n; j++) {
        const dt_plan_node *r = &nodes[j];
        for (int k = 0; k < r->nin; k++) {
            if (owner_of(nodes, r->in[k]) != i) continue;
            if (r->alias ? !(r->op == DT_PLAN_RELU && !r->output) : r->op != DT_PLAN_CONV && r->op != DT_PLAN_MAXPOOL)
                return false;
        }
    }
    return true;
}

void dt_cpu_plan_layouts(dt_dev *d, const dt_kernel_table *be, const dt_plan_node *nodes, int n, dt_plan_layouts *out) {
    (void)d;
    const bool can = be && be->conv2d_forward_blocked && be->conv2d_backward_blocked && be->maxpool2d_forward_blocked &&
                     be->maxpool2d_backward_blocked;
    out->nhwc = can && be->precision == DT_BF16 && be->conv2d_bf16_nhwc && be->conv2d_bf16_nhwc();
    for (int i = 0; i < n; i++) {
        const dt_plan_node *p = &nodes[i];
        out->blocked[i] = false;
        if (!can || p->alias || p->input || p->output || p->ndim != 3) continue;
        if (p->op == DT_PLAN_CONV) out->blocked[i] = p->channels % 16 == 0 && readers_take_blocked(nodes, n, i);
        else if (p->op == DT_PLAN_MAXPOOL) /* its input (through aliases) blocked */
            out->blocked[i] = out->blocked[owner_of(nodes, p->in[0])] && readers_take_blocked(nodes, n, i);
    }
}
