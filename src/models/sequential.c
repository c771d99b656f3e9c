/* The sequential builder: a spec's layers become a chain of graph nodes named "0", "1", ... (so
 * tensors are named as torch.nn.Sequential's: "0.weight", "4.running_mean"), on an f32 input of
 * shape (C,H,W), with an int32 label input and a softmax cross-entropy loss node, or (a spec that
 * ends in "mse") an f32 target input and a mean-squared-error loss node: regression.
 * Tensor parallelism: where a linear, one or more elementwise layers (relu, gelu, tanh, sigmoid)
 * and a linear follow each other, the builder marks the first linear column-parallel and the
 * second row-parallel (Megatron-LM's MLP pair: no communication between them, one allreduce of
 * the second's output); the pairs do not overlap. The shard of tp rank r of K
 * (dt_model_create_tp_shard) is the same chain with each column-parallel linear out/K wide. */
#include "dtrain/models.h"

#include "nn/graph_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

static bool elementwise(dt_layer_kind k) {
    return k == DT_LAYER_RELU || k == DT_LAYER_GELU || k == DT_LAYER_TANH || k == DT_LAYER_SIGMOID;
}

/* Whether a spec may name the op as a layer: one with spec syntax (dt_op_syntax) and one input
 * (not a loss, nor the graph builders' ops). */
static bool sequential_layer(dt_layer_kind k) {
    const dt_op *op = dt_op_of(k);
    return op && op->syntax && op->min_in == 1;
}

/* The tensor-parallel mark of each layer: the linear -> elementwise+ -> linear pairs. */
static void tp_marks(const dt_layer_spec *layers, int n, dt_tp_mark *mk) {
    for (int i = 0; i < n; i++) mk[i] = DT_TP_MARK_NONE;
    for (int i = 0; i < n; i++) {
        if (layers[i].kind != DT_LAYER_LINEAR) continue;
        int j = i + 1;
        while (j < n && elementwise(layers[j].kind)) j++;
        if (j > i + 1 && j < n && layers[j].kind == DT_LAYER_LINEAR)
            mk[i] = DT_TP_MARK_COLUMN, mk[j] = DT_TP_MARK_ROW, i = j;
    }
}

/* The model (tp > 1: one tensor-parallel rank's shard); defer: left unplaced (dt_graph_defer_placement). */
static dt_status create(dt_model **out, const dt_layer_spec *layers, int n, int C, int H, int W, bool defer, int tp) {
    *out = NULL;
    if (n <= 0 || n > DT_MAX_LAYERS) return dt_error(DT_EINVAL, "model: %d layers (need 1..%d)", n, DT_MAX_LAYERS);
    if (C <= 0 || H <= 0 || W <= 0) return dt_error(DT_EINVAL, "model: bad input shape %dx%dx%d", C, H, W);
    const bool mse = n > 1 && layers[n - 1].kind == DT_LAYER_MSE; /* "... linear(1) mse": regression */
    if (n == 1 && layers[0].kind == DT_LAYER_MSE)
        return dt_error(DT_EINVAL,
                        "model: 'mse' is the loss after the layers (e.g. \"linear(16) relu linear(1) mse\")");
    for (int i = 0; i < n - mse; i++)
        if (!sequential_layer(layers[i].kind))
            return dt_error(DT_EINVAL, "model: layer %d (%s) is not a sequential layer", i,
                            dt_layer_name(layers[i].kind));
    dt_tp_mark mk[DT_MAX_LAYERS];
    tp_marks(layers, n - mse, mk);
    for (int i = 0; i < n - mse && tp > 1; i++)
        if (mk[i] == DT_TP_MARK_COLUMN && layers[i].out % tp)
            return dt_error(DT_EINVAL,
                            "`tp` %d: layer %d, linear(%d), is split column-parallel into %d equal parts; "
                            "choose a width divisible by %d or another `tp`",
                            tp, i, layers[i].out, tp, tp);
    dt_model *m;
    DT_TRY(dt_graph_create(&m));
    int shape[3] = {C, H, W};
    int x = dt_graph_input(m, "x", DT_F32, 3, shape);
    for (int i = 0; i < n - mse; i++) {
        dt_layer_spec l = layers[i];
        if (l.kind == DT_LAYER_LINEAR || l.kind == DT_LAYER_LAYERNORM) l.flatten = true; /* over the whole sample */
        if (mk[i] == DT_TP_MARK_COLUMN) l.out /= tp;
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        x = dt_graph_node(m, name, &l, i, &x, 1);
        if (x >= 0 && mk[i] != DT_TP_MARK_NONE) (void)dt_model_mark_tp(m, x, mk[i], 1);
    }
    const int one = 1; /* mse: one f32 target a sample (the data's), so the model ends in linear(1) */
    int y = mse ? dt_graph_input(m, "y", DT_F32, 1, &one) : dt_graph_input(m, "y", DT_I32, 0, NULL);
    dt_layer_spec xe = dt_layer_default(mse ? DT_LAYER_MSE : DT_LAYER_XENT);
    xe.ignore_index = INT32_MIN; /* every label counts (an out-of-range one is DT_EINVAL) */
    int in2[2] = {x, y};
    int loss = dt_graph_node(m, "loss", &xe, -1, in2, 2);
    char spec[1024];
    dt_spec_format(spec, sizeof spec, layers, n);
    if (defer) dt_graph_defer_placement(m);
    dt_status s = dt_graph_finish(m, x, loss, spec);
    if (s != DT_OK) {
        dt_model_destroy(m);
        return s;
    }
    *out = m;
    return DT_OK;
}

dt_status dt_model_create(dt_model **out, const dt_layer_spec *layers, int n, int C, int H, int W) {
    return create(out, layers, n, C, H, W, false, 1);
}

dt_status dt_model_create_spec_placed(dt_model **m, const char *spec, int C, int H, int W, bool defer) {
    dt_layer_spec layers[DT_MAX_LAYERS];
    int n;
    *m = NULL;
    DT_TRY(dt_spec_parse(spec, layers, DT_MAX_LAYERS, &n));
    return create(m, layers, n, C, H, W, defer, 1);
}

dt_status dt_model_create_spec_shard(dt_model **m, const char *spec, int C, int H, int W, int tp, bool defer) {
    dt_layer_spec layers[DT_MAX_LAYERS];
    int n;
    *m = NULL;
    DT_TRY(dt_spec_parse(spec, layers, DT_MAX_LAYERS, &n));
    return create(m, layers, n, C, H, W, defer, tp);
}

dt_status dt_model_create_from_spec(dt_model **m, const char *spec, int C, int H, int W) {
    return dt_model_create_spec_placed(m, spec, C, H, W, false);
}
