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

/* Blocks a strategy holds tensors in (ZeRO on a device, whose slabs cannot be given back in
 * parts): forward and backward read tensor t's parameters at `p` and accumulate its gradients at
 * `g` (device memory of the model's device, t's numel values each); NULL binds it back to the
 * model's slab at its offset. Only the ops' reads and writes follow a binding: dt_model_params and
 * dt_model_grads still give the slabs. DT_ENOMEM for the tables on the first binding. */
dt_status dt_model_bind_param(dt_model *m, int t, float *p);
dt_status dt_model_bind_grad(dt_model *m, int t, float *g);
/* Where backward writes tensor t's gradients: the block bound to it, else the gradient slab at its
 * offset; NULL when it has neither (a ZeRO bucket between its reduce and its next backward). A hook
 * that writes a tensor's gradients between ops asks here, not dt_model_grads. */
float *dt_model_tensor_grad(dt_model *m, int t);
/* A model whose slabs are device blocks (dt_model_set_device on a device whose memory is not the
 * host's): hands its parameter block to the caller, who frees it with the device or gives it back
 * with dt_model_put_params; dt_model_params is NULL meanwhile, so every tensor a pass uses must be
 * bound. NULL for a model in host memory (its slab stays). */
float *dt_model_take_params(dt_model *m);
void dt_model_put_params(dt_model *m, float *p);

#endif
