/* A model's interchange, asked of its ops (nn/interchange.h): the ONNX nodes of a graph node, the
 * PyTorch state_dict entries, and the input normalisation a weights file folds in. */
#include "nn/interchange.h"

#include "nn/graph_internal.h"

#include <stdio.h>
#include <string.h>

dt_status dt_onnx_node_emit(dt_onnx *o, const dt_model *m, int node, const char *const *val, const char **out) {
    const dt_node *n = &m->nodes[node];
    if (!n->op->onnx)
        return dt_error(DT_ENOTSUP, "export: node '%s' (%s) has no ONNX form", n->name, dt_layer_name(n->a.kind));
    const char *in[DT_NODE_MAX_IN];
    for (int j = 0; j < n->nin; j++) in[j] = val[n->in[j]];
    return n->op->onnx(o, m, n, in, out);
}

/* The entries of node n beyond its own tensors: its tied weight under its own name, then its op's. */
static int node_extras(const dt_model *m, const dt_node *n, int own_from, dt_torch_entry *e, int cap) {
    int k = 0;
    for (int j = 0; j < n->ntensor && k < cap; j++)
        if (n->tensor[j] < own_from) { /* declared by an earlier node: tied (dt_graph_declare's "weight") */
            snprintf(e[k].name, sizeof e[k].name, "%s.weight", n->name);
            e[k++].tensor = n->tensor[j];
        }
    if (n->op->torch_extra) k += n->op->torch_extra(m, n, e + k, cap - k);
    return k;
}

dt_status dt_model_torch_state(const dt_model *m, dt_torch_entry_fn fn, void *ctx) {
    int next = 0; /* tensors are declared in node order: a node's own ones come next */
    for (int i = 0; i < m->n; i++) {
        const dt_node *n = &m->nodes[i];
        const int own_from = next;
        for (int j = 0; j < n->ntensor; j++)
            if (n->tensor[j] == next) {
                dt_torch_entry e = {.tensor = next++};
                snprintf(e.name, sizeof e.name, "%s", m->tensors[e.tensor].name);
                DT_TRY(fn(ctx, &e));
            }
        dt_torch_entry extra[DT_NODE_MAX_TENSORS + 4];
        const int k = node_extras(m, n, own_from, extra, (int)(sizeof extra / sizeof *extra));
        for (int j = 0; j < k; j++) DT_TRY(fn(ctx, &extra[j]));
    }
    return DT_OK;
}

bool dt_model_torch_extra(const dt_model *m, const char *name) {
    int next = 0;
    for (int i = 0; i < m->n; i++) {
        const dt_node *n = &m->nodes[i];
        const int own_from = next;
        for (int j = 0; j < n->ntensor; j++) next += n->tensor[j] == next;
        dt_torch_entry extra[DT_NODE_MAX_TENSORS + 4];
        const int k = node_extras(m, n, own_from, extra, (int)(sizeof extra / sizeof *extra));
        for (int j = 0; j < k; j++)
            if (!strcmp(extra[j].name, name)) return true;
    }
    return false;
}

int dt_model_norm_node(const dt_model *m) {
    for (int i = 0; i < m->n; i++) {
        const dt_node *n = &m->nodes[i];
        if (n->input_index >= 0) continue;
        if (n->ntensor > 0) return i;
        if (!n->op->keeps_input_norm) break;
    }
    return -1;
}

bool dt_model_fold_input_norm(const dt_model *m, int node, double mean, double std, float *params, float *buffers,
                              const char **why) {
    const dt_node *n = &m->nodes[node];
    *why = "";
    return n->op->fold_input_norm && n->op->fold_input_norm(m, n, mean, std, params, buffers, why);
}
