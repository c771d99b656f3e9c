/* Activation layouts: where the backend has blocked convolutions (oneDNN's nChw16c, backend.h),
 * a chain conv -> (relu) -> maxpool -> conv ... keeps its values and gradients blocked, so that
 * the convolutions run without reordering them; the chain's last maxpool writes NCHW (its input
 * stays blocked), and so does a conv whose values anything else reads. A value is blocked when
 * its channels are a multiple of 16, it is not the output, and every node that reads it is a
 * conv or a maxpool (a relu fused into the maxpool reads nothing itself). Every copy of a model
 * (pipeline stages) plans the same layouts, so values sent between them agree. */
#include "nn/graph_internal.h"

static const dt_node *owner_of(const dt_model *m, const dt_node *n) {
    while (n->alias) n = &m->nodes[n->in[0]];
    return n;
}

/* Whether every reader of node i's memory takes blocked values. */
static bool readers_take_blocked(const dt_model *m, int i) {
    for (int j = 0; j < m->n; j++) {
        const dt_node *r = &m->nodes[j];
        for (int k = 0; k < r->nin; k++) {
            if (owner_of(m, &m->nodes[r->in[k]])->id != i) continue;
            if (r->alias ? !(r->a.kind == DT_LAYER_RELU && r->id != m->output)
                         : r->a.kind != DT_LAYER_CONV2D && r->a.kind != DT_LAYER_MAXPOOL2D)
                return false;
        }
    }
    return true;
}

void dt_graph_plan_layouts(dt_model *m) {
    const dt_backend *be = m->be;
    const bool can = be && be->conv2d_forward_blocked && be->conv2d_backward_blocked && be->maxpool2d_forward_blocked &&
                     be->maxpool2d_backward_blocked;
    for (int i = 0; i < m->n; i++) {
        dt_node *n = &m->nodes[i];
        n->blocked = false;
        if (!can || n->alias || n->input_index >= 0 || i == m->output || n->ndim != 3) continue;
        if (n->a.kind == DT_LAYER_CONV2D)
            n->blocked = n->shape[0] % 16 == 0 && readers_take_blocked(m, i);
        else if (n->a.kind == DT_LAYER_MAXPOOL2D)
            n->blocked = dt_node_in_blocked(m, n, 0) && readers_take_blocked(m, i);
    }
}
