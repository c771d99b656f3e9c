/* Op: a graph input (f32 features or int32 ids/labels), fed by dt_model_run. */
#include "nn/graph_internal.h"

static dt_status input_infer(dt_model *m, dt_node *n) {
    (void)m, (void)n;
    return DT_OK;
}

/* no forward or backward: the graph points an input node at the fed memory (bind_feed) */
const dt_op dt_op_input = {.name = "input",
                           .help = "a graph input: f32 features or int32 ids/labels, fed by the run",
                           .syntax = NULL,
                           .infer = input_infer};
