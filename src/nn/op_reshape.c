/* Ops: flatten and reshape. Both keep the values where they are (the node aliases its input's
 * memory, values and gradient), only the per-sample shape changes. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

static dt_status flatten_infer(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    n->dtype = in->dtype, n->ndim = 1, n->shape[0] = (int)in->out_n, n->out_n = in->out_n;
    n->alias = true;
    return DT_OK;
}

static dt_status reshape_infer(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    if (n->a.ndim < 0 || n->a.ndim > 4) return dt_graph_fail(m, n, "%d dims (0..4 per sample)", n->a.ndim);
    size_t cnt = 1;
    for (int i = 0; i < n->a.ndim; i++) {
        if (n->a.shape[i] <= 0) return dt_graph_fail(m, n, "dim %d is %d", i, n->a.shape[i]);
        cnt *= (size_t)n->a.shape[i];
        n->shape[i] = n->a.shape[i];
    }
    if (cnt != in->out_n) return dt_graph_fail(m, n, "%zu values per sample cannot become %zu", in->out_n, cnt);
    n->dtype = in->dtype, n->ndim = n->a.ndim, n->out_n = cnt;
    n->alias = true;
    return DT_OK;
}

static dt_status flatten_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in,
                              const char **out) {
    (void)m, (void)n;
    dt_onnx_node *f = dt_onnx_op(o, "Flatten", in, 1);
    o->attr_i(o, f, "axis", 1);
    *out = dt_onnx_out(o, f);
    return DT_OK;
}

static dt_status reshape_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in,
                              const char **out) {
    (void)m;
    int64_t shp[5] = {-1};
    for (int d = 0; d < n->ndim; d++) shp[1 + d] = n->shape[d];
    *out = dt_onnx_node2(o, "Reshape", in[0], o->const_i64(o, "shape", shp, 1 + n->ndim));
    return DT_OK;
}

static const dt_op_syntax flatten_syntax = {.args = "|", .usage = "flatten"};

/* no forward or backward: an alias node's values and gradient are its input's memory (graph_run.c) */
const dt_op dt_op_flatten = {.name = "flatten",
                             .help = "a sample's values as one vector (no copy)",
                             .syntax = &flatten_syntax,
                             .min_in = 1,
                             .max_in = 1,
                             .infer = flatten_infer,
                             .onnx = flatten_onnx,
                             .keeps_input_norm = true};
const dt_op dt_op_reshape = {.name = "reshape",
                             .help = "the same values in another per-sample shape (no copy)",
                             .syntax = NULL,
                             .min_in = 1,
                             .max_in = 1,
                             .infer = reshape_infer,
                             .onnx = reshape_onnx,
                             .keeps_input_norm = true};
