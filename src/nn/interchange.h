/* What the interchange formats ask of a model's ops (issue 38: ops own their interchange). Not
 * part of the public API.
 *  - ONNX: each op's onnx slot emits its nodes through dt_onnx, the functions an exporter
 *    provides (run/onnx_export.c builds the protobuf with protobuf-c; the ops never see it).
 *  - PyTorch: a model's state_dict is its tensors under their names plus the entries ops add
 *    (torch_extra: a batchnorm's num_batches_tracked) and a tied weight under each name that uses
 *    it (nanoGPT's lm_head.weight); weights files (run/weights.c) write and accept exactly these.
 *  - The input normalisation a weights file folds into the first layer (fold_input_norm). */
#ifndef DT_NN_INTERCHANGE_H
#define DT_NN_INTERCHANGE_H

#include "dtrain/nn.h"

#include <stdint.h>

typedef struct dt_node dt_node;
typedef struct dt_onnx dt_onnx;
typedef struct dt_onnx_node dt_onnx_node; /* a node of the ONNX graph (the exporter's) */
typedef struct dt_torch_entry dt_torch_entry;

/* ---- ONNX --------------------------------------------------------------------------------- *
 * Names ("t<k>" values, "<prefix>_<k>" initializers) are the exporter's and live as long as the
 * export. Out of memory marks the export failed (it then reports DT_ENOMEM): a NULL node's output
 * reads "?", attributes on it are dropped. */
struct dt_onnx {
    /* A node op(in[0..nin)) with nout (1..3) outputs, each named "t<k>" in turn. */
    dt_onnx_node *(*node)(dt_onnx *o, const char *op, const char *const *in, int nin, int nout);
    /* The name of output j of node ("?" for NULL). */
    const char *(*out)(const dt_onnx_node *node, int j);
    void (*attr_i)(dt_onnx *o, dt_onnx_node *node, const char *name, int64_t v);
    void (*attr_f)(dt_onnx *o, dt_onnx_node *node, const char *name, float v);
    void (*attr_ints)(dt_onnx *o, dt_onnx_node *node, const char *name, const int64_t *v, int k);
    /* An initializer named "<prefix>_<k>" of f32 values of dims[0..ndim) (ndim 0: a scalar) or of
     * int64 values v[0..n), copied from host memory; returns its name. */
    const char *(*const_f32)(dt_onnx *o, const char *prefix, const int64_t *dims, int ndim, const float *v);
    const char *(*const_i64)(dt_onnx *o, const char *prefix, const int64_t *v, int n);
    /* Tensor k of node n as an initializer under the tensor's own name (a tied tensor once, by its
     * first user), of its own shape or (ndim > 0) dims[0..ndim); downloaded from the model's device. */
    const char *(*param)(dt_onnx *o, const dt_model *m, const dt_node *n, int k, const int64_t *dims, int ndim);
};

/* Shorthands for the ops' onnx slots: one node of one output, its output's name. */
static inline dt_onnx_node *dt_onnx_op(dt_onnx *o, const char *op, const char *const *in, int nin) {
    return o->node(o, op, in, nin, 1);
}
static inline const char *dt_onnx_out(dt_onnx *o, const dt_onnx_node *n) { return o->out(n, 0); }
static inline const char *dt_onnx_node1(dt_onnx *o, const char *op, const char *a) {
    return o->out(o->node(o, op, &a, 1, 1), 0);
}
static inline const char *dt_onnx_node2(dt_onnx *o, const char *op, const char *a, const char *b) {
    const char *in[2] = {a, b};
    return o->out(o->node(o, op, in, 2, 1), 0);
}
/* A scalar f32 initializer "const_<k>". */
static inline const char *dt_onnx_scalar(dt_onnx *o, float v) { return o->const_f32(o, "const", NULL, 0, &v); }

/* The ONNX nodes of graph node `node` (its op's onnx slot) on its inputs' value names val[] (indexed
 * by node id); *out gets its value's name. DT_ENOTSUP naming the node when its op has no ONNX form. */
dt_status dt_onnx_node_emit(dt_onnx *o, const dt_model *m, int node, const char *const *val, const char **out);

/* ---- PyTorch state_dict ------------------------------------------------------------------- */
struct dt_torch_entry {
    char name[96];
    int tensor; /* the model tensor (dt_model_tensor) whose values it holds, under this name (a tied
                 * one); -1: a step counter torch keeps, int64 0 as a scalar */
};
/* Calls fn on every entry of the model's PyTorch state_dict, in order: each node's own tensors
 * (tensor = their index, under their names) and then the entries its op adds and its tied weight
 * under the node's name; stops at and returns fn's first error. */
typedef dt_status (*dt_torch_entry_fn)(void *ctx, const dt_torch_entry *e);
dt_status dt_model_torch_state(const dt_model *m, dt_torch_entry_fn fn, void *ctx);
/* Whether `name` is an entry of the model's state_dict that is not one of its tensors. */
bool dt_model_torch_extra(const dt_model *m, const char *name);

/* ---- the input normalisation of a weights file -------------------------------------------- */
/* The first node with parameters after only nodes the normalisation commutes with, or -1. */
int dt_model_norm_node(const dt_model *m);
/* Whether node's op folds x -> (x - mean) / std into its parameters and, with params non-NULL,
 * does it in the copies params/buffers of the slabs; false (*why: a parenthesised reason or "")
 * when it cannot. */
bool dt_model_fold_input_norm(const dt_model *m, int node, double mean, double std, float *params, float *buffers,
                              const char **why);

#endif
