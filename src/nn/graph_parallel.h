/* What the parallel strategies read of a graph beyond the public API (include/dtrain/nn.h): a
 * node's inputs, the input's shape and the tensor-parallel marks the model builder set. Internal:
 * parallel/ and models/ include it, embedders do not. */
#ifndef DT_NN_GRAPH_PARALLEL_H
#define DT_NN_GRAPH_PARALLEL_H

#include "dtrain/nn.h"

/* A node's input j (a node id), or -1 where it has fewer. */
int dt_model_node_input(const dt_model *m, int node, int j);
/* The per-sample shape of the first graph input (its number of dimensions, at most 4). */
int dt_model_input_shape(const dt_model *m, int shape[4]);
/* A node's mark (DT_TP_MARK_NONE when unmarked) and, where parts is not NULL, its parts. */
dt_tp_mark dt_model_node_tp(const dt_model *m, int node, int *parts);
/* Whether any node of m is marked. */
bool dt_model_has_tp_marks(const dt_model *m);

#endif
