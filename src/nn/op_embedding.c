/* Op: embedding. int32 ids (any per-sample shape) -> rows of a (num, out) table, shape
 * (..., out). With spec.pos the row is each value's position in the sample instead (learned
 * positions, nanoGPT's wpe). Ids outside [0, num) are refused with their place. */
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <stdlib.h>

static dt_status embedding_infer(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    if (in->dtype != DT_I32) return dt_graph_fail(m, n, "takes int32 ids (an input of dtype i32)");
    if (n->a.num <= 0 || n->a.out <= 0) return dt_graph_fail(m, n, "needs num > 0 rows of out > 0 values");
    if (in->ndim >= 4) return dt_graph_fail(m, n, "ids of %d dims (at most 3)", in->ndim);
    if (n->a.pos && in->out_n > (size_t)n->a.num)
        return dt_graph_fail(m, n, "%zu positions but the table has %d rows", in->out_n, n->a.num);
    n->dtype = DT_F32, n->ndim = in->ndim + 1;
    for (int i = 0; i < in->ndim; i++) n->shape[i] = in->shape[i];
    n->shape[in->ndim] = n->a.out;
    n->out_n = in->out_n * (size_t)n->a.out;
    int64_t shp[2] = {n->a.num, n->a.out};
    return dt_graph_declare(m, n, "weight", false, 2, shp) < 0 ? DT_EINVAL : DT_OK;
}

static void embedding_init(dt_model *m, dt_node *n, float *p, uint64_t seed) {
    if (n->a.tie) return;
    const dt_param_info *w = &m->tensors[n->tensor[0]];
    float std = n->a.init_std > 0 ? n->a.init_std : 1.0f; /* torch: N(0, 1) */
    dt_rng_fill_normal(p + w->offset, w->numel, 0.0f, std, seed, dt_rng_key(DT_RNG_INIT, (uint64_t)n->layer * 2));
}

static dt_status embedding_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    const dt_node *in = dt_node_input(m, n, 0);
    const float *w = dt_node_param(m, n, c, 0);
    const int T = (int)in->out_n;
    if (n->a.pos) {
        c->be->pos_embedding_forward(n->out, w, c->B, T, n->a.out);
        return DT_OK;
    }
    const int32_t *ids = (const int32_t *)in->out, *host = dt_node_in_host(m, n, 0); /* checked on the host */
    const size_t N = (size_t)c->B * T;
    for (size_t i = 0; host && i < N; i++)
        if (host[i] < 0 || host[i] >= n->a.num)
            return dt_error(DT_EINVAL,
                            "model: node '%s': id %d of sample %zu, position %zu is outside [0, %d) (the "
                            "vocabulary)",
                            n->name, host[i], i / T, i % T, n->a.num);
    c->be->embedding_forward(n->out, ids, w, (int)N, n->a.out);
    return DT_OK;
}

static void embedding_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    (void)din; /* ids have no gradient */
    const dt_node *in = dt_node_input(m, n, 0);
    float *dw = dt_node_grad(m, n, c, 0);
    const int T = (int)in->out_n;
    if (n->a.pos) c->be->pos_embedding_backward(dw, n->grad, c->B, T, n->a.out);
    else c->be->embedding_backward(dw, n->grad, (const int32_t *)in->out, c->B * T, n->a.out);
}

/* Token rows Gather(W, ids), or position rows Gather(W, [0..T)) (broadcast over the batch). */
static dt_status embedding_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in,
                                const char **out) {
    const char *w = o->param(o, m, n, 0, NULL, 0);
    if (!n->a.pos) {
        *out = dt_onnx_node2(o, "Gather", w, in[0]);
        return DT_OK;
    }
    const int T = n->shape[0];
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)T);
    for (int i = 0; pos && i < T; i++) pos[i] = i;
    const bool ok = pos != NULL;
    *out = dt_onnx_node2(o, "Gather", w, ok ? o->const_i64(o, "positions", pos, T) : "?");
    free(pos);
    return ok ? DT_OK : dt_error(DT_ENOMEM, "export: out of memory");
}

const dt_op dt_op_embedding = {.name = "embedding",
                               .help = "rows of a (num, out) table by int32 id (or by position)",
                               .syntax = NULL,
                               .min_in = 1,
                               .max_in = 1,
                               .infer = embedding_infer,
                               .init = embedding_init,
                               .forward = embedding_forward,
                               .backward = embedding_backward,
                               .onnx = embedding_onnx};
