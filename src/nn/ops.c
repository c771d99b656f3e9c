/* The op registry: one table per op kind (each in its own src/nn/op_*.c), found by kind, and the
 * ops' names. */
#include "nn/graph_internal.h"

extern const dt_op dt_op_input, dt_op_linear, dt_op_conv2d, dt_op_maxpool2d, dt_op_avgpool2d, dt_op_relu,
    dt_op_gelu, dt_op_tanh, dt_op_sigmoid, dt_op_dropout, dt_op_flatten, dt_op_layernorm, dt_op_batchnorm2d,
    dt_op_embedding, dt_op_add, dt_op_attention, dt_op_matmul_t, dt_op_reshape, dt_op_xent, dt_op_mse;

static const dt_op *const g_ops[DT_LAYER_KIND_COUNT] = {
    [DT_LAYER_LINEAR] = &dt_op_linear,       [DT_LAYER_CONV2D] = &dt_op_conv2d,
    [DT_LAYER_MAXPOOL2D] = &dt_op_maxpool2d, [DT_LAYER_AVGPOOL2D] = &dt_op_avgpool2d,
    [DT_LAYER_RELU] = &dt_op_relu,           [DT_LAYER_GELU] = &dt_op_gelu,
    [DT_LAYER_TANH] = &dt_op_tanh,           [DT_LAYER_SIGMOID] = &dt_op_sigmoid,
    [DT_LAYER_DROPOUT] = &dt_op_dropout,     [DT_LAYER_FLATTEN] = &dt_op_flatten,
    [DT_LAYER_LAYERNORM] = &dt_op_layernorm, [DT_LAYER_BATCHNORM2D] = &dt_op_batchnorm2d,
    [DT_LAYER_INPUT] = &dt_op_input,         [DT_LAYER_EMBEDDING] = &dt_op_embedding,
    [DT_LAYER_ADD] = &dt_op_add,             [DT_LAYER_ATTENTION] = &dt_op_attention,
    [DT_LAYER_MATMUL_T] = &dt_op_matmul_t,   [DT_LAYER_RESHAPE] = &dt_op_reshape,
    [DT_LAYER_XENT] = &dt_op_xent,           [DT_LAYER_MSE] = &dt_op_mse,
};

const dt_op *dt_op_of(dt_layer_kind kind) {
    return (unsigned)kind < DT_LAYER_KIND_COUNT ? g_ops[kind] : NULL;
}

const char *dt_layer_name(dt_layer_kind kind) {
    const dt_op *op = dt_op_of(kind);
    return op ? op->name : "?";
}
