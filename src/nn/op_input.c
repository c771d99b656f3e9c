/* Op: a graph input (f32 features or int32 ids/labels), fed by dt_model_run. */
#include "nn/graph_internal.h"

static dt_status input_infer(dt_model *m, dt_node *n) {
    (void)m, (void)n;
    return DT_OK;
}

static dt_status input_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    (void)m, (void)n, (void)c;
    return DT_OK;
}

static void input_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    (void)m, (void)n, (void)c, (void)din;
}

const dt_op dt_op_input = {.name = "input", .infer = input_infer, .forward = input_forward, .backward = input_backward};
