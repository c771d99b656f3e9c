/* Internals of the graph (graph.c: building, layout, init; graph_run.c: memory, forward,
 * backward) and the op interface every src/nn/op_*.c implements. Not part of the public API.
 *
 * An op is one small table (one src/nn/op_*.c file and one line of the registry, DT_OPS in
 * ops.c): its name, help line and spec syntax (spec.c parses and formats specs with it, the
 * CLI's usage text lists it), shape inference (which also declares the node's parameters and
 * buffers), saved state and workspace sizes, init, forward, backward and flops, and its
 * interchange: its ONNX nodes and its PyTorch state_dict entries (nn/interchange.h). Ops reach
 * kernels only through the backend table (backend/backend.h). */
#ifndef DT_NN_GRAPH_INTERNAL_H
#define DT_NN_GRAPH_INTERNAL_H

#include "backend/backend.h"
#include "device/device.h"
#include "dtrain/nn.h"

#define DT_NODE_MAX_IN 3
#define DT_NODE_MAX_TENSORS 4
#define DT_GRAPH_MAX_INPUTS 4

typedef struct dt_node dt_node;
typedef struct dt_op dt_op;
typedef struct dt_onnx dt_onnx;               /* an ONNX graph being built (nn/interchange.h) */
typedef struct dt_torch_entry dt_torch_entry; /* a PyTorch state_dict entry (nn/interchange.h) */

/* What forward and backward see besides the node. */
typedef struct {
    const dt_kernel_table *be;
    dt_dev *dev; /* the model's device: copies and casts of its memory */
    int B;       /* samples in the batch */
    bool train;
    uint64_t step, seed;
    float *params, *grads, *buffers;
    float *work; /* shared scratch, max over nodes of op->workspace floats */
} dt_run_ctx;

struct dt_node {
    const dt_op *op;
    dt_layer_spec a; /* attributes (a.kind selects the op) */
    char name[48];
    int id, layer; /* layer: keys init and dropout streams, names sequential tensors */
    int in[DT_NODE_MAX_IN], nin;
    dt_dtype dtype;                           /* of the values: DT_F32, or DT_I32 for id/label inputs */
    int ndim, shape[4];                       /* per sample */
    size_t out_n;                             /* values per sample (1 for a loss) */
    int tensor[DT_NODE_MAX_TENSORS], ntensor; /* its parameters and buffers (tensor table ids) */
    int input_index;                          /* input nodes: position in the feed; else -1 */
    int consumers;                            /* nodes that take this one as an input */
    bool alias;                               /* values and gradient are its first input's memory (flatten, reshape,
                                               * a relu the following maxpool applies) */
    bool fused_relu;                          /* maxpool: applies the relu of its input node to its 4x smaller output */
    int fused_pool;                           /* conv: the id of the maxpool whose values (and relu) it computes in one
                                               * pass (backend conv_pool), never writing its own; -1: none */
    bool fused_conv;                          /* maxpool: its values come from the conv before it (fused_pool) */
    bool blocked;                    /* values and gradient in the backend's blocked layout (backend/blocked.h) inside a
                                      * conv -> relu -> maxpool chain (graph_layout.c), else NCHW */
    bool bf16, grad_bf16;            /* values / gradient stored bf16 (uint16_t, the first half of out /
                                      * grad): blocked ones between bf16 convs and maxpools, and values only
                                      * bf16 linears read (graph_layout.c) */
    bool needs_grad;                 /* has parameters upstream (or its own): backward must reach it */
    unsigned char tp_mark, tp_parts; /* dt_model_mark_tp: a model-parallel mark nn/ only stores */
    /* run time */
    float *out;    /* (B, out_n) values; input nodes: the fed memory */
    float *grad;   /* (B, out_n) gradient of the values (NULL when !needs_grad) */
    bool grad_set; /* gradient written in this backward (the first writer overwrites, later
                    * ones accumulate) */
    void *saved;   /* op state kept from forward to backward (argmax, mask, stats, att) */
    float dloss;   /* loss nodes: d loss of the backward (the scale) */
};

/* How a model spec writes an op: "name" or "name(positional,...,key=value)" (spec.c). */
typedef struct {
    const char *alias;                /* a second name it answers to ("dense"), or NULL */
    const char *args;                 /* its positional argument names, space separated, then the keyword-only
                                       * ones after '|' ("out k | stride pad bias"); each is a dt_layer_spec
                                       * field spec.c's set_arg reads (out k stride pad bias p eps momentum) */
    int required;                     /* how many leading positional arguments are mandatory */
    const char *usage;                /* its word in the usage text ("linear(out[,bias=0])"); NULL: not listed
                                       * there nor among the known layers of an error (mse, written after them) */
    const char *alias_usage;          /* its alias in the usage text's alias line ("dense = linear"); NULL: none */
    void (*finish)(dt_layer_spec *l); /* defaults that follow from the arguments (a pool's stride = k); NULL: none */
    /* Its canonical arguments "(...)" (the spec string a model records) into buf; NULL: none. */
    void (*format)(char *buf, size_t cap, const dt_layer_spec *l);
} dt_op_syntax;

struct dt_op {
    const char *name;
    const char *help;           /* one line: what it computes (docs/extending.md, registry-check) */
    const dt_op_syntax *syntax; /* how specs write it; NULL: graph builders only (dt_graph_node) */
    int min_in, max_in;
    /* Sets n->dtype/ndim/shape/out_n from the inputs and declares parameters with
     * dt_graph_declare; DT_EINVAL naming the node when shapes do not fit. */
    dt_status (*infer)(dt_model *m, dt_node *n);
    size_t (*saved_bytes)(const dt_model *m, const dt_node *n, int B);   /* NULL: none */
    size_t (*workspace)(const dt_model *m, const dt_node *n, int B);     /* floats; NULL: none */
    void (*init)(dt_model *m, dt_node *n, float *params, uint64_t seed); /* NULL: zeros */
    /* forward and backward are NULL for ops whose nodes are inputs or aliases (infer sets
     * n->alias): the graph never runs them */
    dt_status (*forward)(dt_model *m, dt_node *n, const dt_run_ctx *c);
    /* din[j]: where input j's gradient goes (OVERWRITE), NULL when not needed. Parameter
     * gradients ACCUMULATE into c->grads. */
    void (*backward)(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din);
    double (*flops)(const dt_model *m, const dt_node *n, int B, bool need_din); /* training (fwd+bwd); NULL: 0 */
    /* ---- interchange (nn/interchange.h) ---- */
    /* Emits the node's ONNX nodes and initializers on the values in[0..nin) of its inputs; *out gets
     * its value's name. NULL: it has no ONNX form (dt_onnx_export refuses the model, naming it). */
    dt_status (*onnx)(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in, const char **out);
    /* The entries a PyTorch state_dict has for the node beyond its tensors (a batchnorm's
     * num_batches_tracked), into e[0..cap); returns how many. NULL: none. */
    int (*torch_extra)(const dt_model *m, const dt_node *n, dt_torch_entry *e, int cap);
    /* The input normalisation x -> (x - mean) / std commutes with it (a weights file folds it into
     * the first node with parameters after: flatten, reshape, pooling, dropout). */
    bool keeps_input_norm;
    /* Folds x -> (x - mean) / std of its input into its parameters, in copies of the slabs (params
     * NULL: only whether it can); false (why: a parenthesised reason or "") when it cannot. NULL:
     * it cannot. */
    bool (*fold_input_norm)(const dt_model *m, const dt_node *n, double mean, double std, float *params, float *buffers,
                            const char **why);
};

struct dt_model {
    dt_node *nodes;
    int n, cap;
    dt_status err; /* the first build error (sticky) */
    char errmsg[512];
    bool finished;
    int inputs[DT_GRAPH_MAX_INPUTS], ninputs;
    int first_reader[DT_GRAPH_MAX_INPUTS]; /* per input: the first node that reads it (n: none) */
    int output, loss;
    char spec[1024];
    dt_param_info *tensors;
    int *last_user; /* per tensor: the last node in backward order that uses it, the one that
                     * declared it (its gradient is final after that node's backward) */
    int ntensors, tensors_cap;
    dt_slab params, grads, buffers;
    bool defer_place; /* dt_graph_defer_placement: dt_graph_finish leaves it unplaced */
    dt_range *own;    /* dt_model_place's ranges of the parameter slab (NULL: whole) */
    int nown;
    uint64_t seed;
    const dt_kernel_table *be;     /* the device's kernel table: what ops call */
    const dt_kernel_table *be_cpu; /* the CPU table it wraps (--kernels, --precision) */
    dt_dev *dev;                   /* the device of its memory (dt_model_set_device; default cpu): every
                                    * touch of parameters, gradients and activations goes through it */
    bool dev_slabs;                /* params, grads and buffers are whole blocks of dev (not host slabs) */
    bool owns_dev;                 /* dt_model_adopt_device: dt_model_destroy destroys dev last */
    int64_t *dev_correct;          /* dt_model_count_correct's count in dev's memory (NULL until needed) */
    float **bound_p, **bound_g;    /* per tensor: where a strategy put its parameters / gradients in blocks
                                    * of its own (dt_model_bind_tensor; NULL: the slab at its offset) */
    bool nhwc;                     /* the blocked values of its conv chains are NHWC instead (the backend's bf16
                                    * convs want it: backend.h conv2d_bf16_nhwc; graph_layout.c) */
    /* per batch */
    int cap_B, B;
    const void *feed_host[DT_GRAPH_MAX_INPUTS]; /* the host memory of the last feed (NULL: none) */
    bool train;
    uint64_t step;
    float *work;
    size_t work_n;
    float *scratch[DT_NODE_MAX_IN]; /* gradients of a second use of a node, added after */
    int nscratch;
    size_t scratch_n;
    dt_node_hook_fn before_forward, after_backward;
    dt_node_hook_fn before_backward; /* dt_model_set_backward_hook (ZeRO-3 gathers), with hook_ctx */
    void *hook_ctx;
    dt_node_hook_fn after_forward;
    void *after_forward_ctx;
};

/* The op table of a kind (NULL for an unknown kind). Kinds are the registry's positions: the
 * first DT_LAYER_KIND_COUNT are dt_layer_kind's (the public enum), the ones after are ops added
 * since (DT_OPS in ops.c) and ops registered at run time (dt_op_register), found by name. */
const dt_op *dt_op_of(dt_layer_kind kind);
/* How many kinds there are now (every registered op). */
int dt_op_count(void);
/* The op a spec or builder names: by name or spec alias (*kind gets its kind); NULL if none. */
const dt_op *dt_op_find(const char *name, dt_layer_kind *kind);
/* Registers an op defined outside src/nn/ (a test's, an embedder's) after the built-in ones;
 * returns its kind, or -1 with DT_EINVAL naming what is wrong (a name or alias taken, no help,
 * no infer, a syntax without args, the table full). Not thread-safe: register before building
 * models. */
int dt_op_register(const dt_op *op);

/* For infer: declares a parameter (buffer = false) or buffer of the node, named "<node>.<suffix>",
 * of shape[0..ndim); returns the tensor id or -1 with the model's error set. With n->a.tie set
 * and suffix "weight", the tied tensor is used instead (its shape must match). */
int dt_graph_declare(dt_model *m, dt_node *n, const char *suffix, bool buffer, int ndim, const int64_t *shape);
/* Sets the model's sticky error naming the node (printf-style) and returns DT_EINVAL. */
dt_status dt_graph_fail(dt_model *m, const dt_node *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Helpers for ops */
static inline const dt_node *dt_node_input(const dt_model *m, const dt_node *n, int j) { return &m->nodes[n->in[j]]; }
static inline const float *dt_node_in(const dt_model *m, const dt_node *n, int j) { return m->nodes[n->in[j]].out; }
/* Input j's values where the host can read them: the fed memory of a graph input, or any value
 * on a host-memory device; NULL where they are only on the device (for checks of ids and labels). */
static inline const void *dt_node_in_host(const dt_model *m, const dt_node *n, int j) {
    const dt_node *p = &m->nodes[n->in[j]];
    if (p->input_index >= 0) return m->feed_host[p->input_index];
    return m->dev->host_memory ? p->out : NULL;
}
/* Whether input j's values (and gradient) are blocked: those of the node owning its memory. */
static inline bool dt_node_in_blocked(const dt_model *m, const dt_node *n, int j) {
    const dt_node *p = &m->nodes[n->in[j]];
    while (p->alias) p = &m->nodes[p->in[0]];
    return p->blocked;
}
/* Whether input j's values / gradient are stored bf16 (dt_node.bf16, grad_bf16). */
static inline bool dt_node_in_bf16(const dt_model *m, const dt_node *n, int j) {
    const dt_node *p = &m->nodes[n->in[j]];
    while (p->alias) p = &m->nodes[p->in[0]];
    return p->bf16;
}
static inline bool dt_node_in_grad_bf16(const dt_model *m, const dt_node *n, int j) {
    const dt_node *p = &m->nodes[n->in[j]];
    while (p->alias) p = &m->nodes[p->in[0]];
    return p->grad_bf16;
}
/* A node that writes bf16 values outside a conv chain (n->bf16: a layernorm, relu, gelu or
 * attention) computes them in f32 pieces of at most this many floats of the workspace, each then
 * rounded into its values (dt_cast_bf16). */
#define DT_BF16_PIECE 8192
static inline uint16_t *dt_node_out_bf16(const dt_node *n) { return (uint16_t *)(void *)n->out; }
static inline const uint16_t *dt_node_in_bf16_values(const dt_model *m, const dt_node *n, int j) {
    return (const uint16_t *)(const void *)dt_node_in(m, n, j);
}

/* Asks device dev which values are blocked for the table m->be and applies it (graph_layout.c);
 * after the relu -> maxpool fusion. */
dt_status dt_graph_plan_layouts(dt_model *m, dt_dev *dev);
/* Plans which blocked values (and gradients) are stored bf16 (graph_layout.c); after the
 * conv -> maxpool fusion. */
void dt_graph_plan_bf16(dt_model *m);
/* Marks the convs computed together with their maxpool (graph_fuse.c), after the layout plan. */
void dt_graph_fuse_conv_pool(dt_model *m);
/* The fused chain of conv node n (n->fused_pool >= 0) at the current batch. */
dt_conv_pool_shape dt_node_conv_pool_shape(const dt_model *m, const dt_node *conv);
static inline size_t dt_node_tensor_off(const dt_model *m, const dt_node *n, int k) {
    return m->tensors[n->tensor[k]].offset;
}
/* Where node n's k-th tensor's parameters / gradients are for forward and backward: the block a
 * strategy bound it to (dt_model_bind_tensor), else the slab at the tensor's offset (NULL while the
 * strategy holds the slab's values elsewhere, dt_model_take_params). */
static inline float *dt_node_param(const dt_model *m, const dt_node *n, const dt_run_ctx *c, int k) {
    const int t = n->tensor[k];
    if (m->bound_p && m->bound_p[t]) return m->bound_p[t];
    return c->params ? c->params + m->tensors[t].offset : NULL;
}
static inline float *dt_node_grad(const dt_model *m, const dt_node *n, const dt_run_ctx *c, int k) {
    const int t = n->tensor[k];
    if (m->bound_g && m->bound_g[t]) return m->bound_g[t];
    return c->grads ? c->grads + m->tensors[t].offset : NULL;
}
/* The (C,H,W) of a node's per-sample shape (a vector counts as (1,1,W)). */
void dt_node_chw(const dt_node *n, int *C, int *H, int *W);
/* rows = B * values per sample / last dim; the last dim of a per-sample shape */
static inline int dt_shape_last(const dt_node *n) { return n->ndim ? n->shape[n->ndim - 1] : 1; }

#endif
