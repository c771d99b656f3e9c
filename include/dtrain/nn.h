/* Models are graphs of ops (ggml / PyTorch autograd style) whose parameters, gradients and
 * buffers live in flat slabs (llm.c style). Nodes name their inputs, so residual connections and
 * shared weights work; activation gradients accumulate where branches meet. Inputs are typed
 * (f32 features or int32 tokens) and the loss is a node of the graph.
 *
 * Two builders make the same kind of graph: the sequential spec ("conv(32,3,pad=1) relu
 * maxpool(2) flatten linear(128) relu linear(10)", tensor names as torch.nn.Sequential:
 * "0.weight", "4.running_mean") and the GPT builder (src/models/gpt.c, nanoGPT tensor names).
 * Either way a saved checkpoint loads into the equivalent PyTorch model unchanged. */
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DT_LAYER_LINEAR,
    DT_LAYER_CONV2D,
    DT_LAYER_MAXPOOL2D,
    DT_LAYER_AVGPOOL2D,
    DT_LAYER_RELU,
    DT_LAYER_GELU,
    DT_LAYER_TANH,
    DT_LAYER_SIGMOID,
    DT_LAYER_DROPOUT,
    DT_LAYER_FLATTEN,
    DT_LAYER_LAYERNORM,
    DT_LAYER_BATCHNORM2D,
    /* graph ops beyond the sequential layers */
    DT_LAYER_INPUT,     /* a graph input (dt_graph_input) */
    DT_LAYER_EMBEDDING, /* int32 ids (..) -> rows of a (num, out) table: (.., out); pos: row = position */
    DT_LAYER_ADD,       /* a + b, same shape (residual) */
    DT_LAYER_ATTENTION, /* causal multi-head self-attention: qkv (T, 3C) -> (T, C), `heads` heads */
    DT_LAYER_MATMUL_T,  /* in (.., C) @ w^T with w (out, C) and no bias (a tied output head) */
    DT_LAYER_RESHAPE,   /* same values, per-sample shape `shape[0..ndim)` */
    DT_LAYER_XENT,      /* loss: softmax cross-entropy of logits (.., V) against int32 targets (..) */
    DT_LAYER_MSE,       /* loss: mean squared error against an f32 target of the same shape */
    DT_LAYER_KIND_COUNT /* the kinds named here; ops added to the registry since have kinds from here
                         * on, without a name in this enum (dt_layer_find) */
} dt_layer_kind;

/* One layer of a spec. Fields a kind does not use are ignored. */
typedef struct {
    dt_layer_kind kind;
    int out;        /* linear: out features; conv: out channels */
    int k;          /* conv / pool kernel size (square) */
    int stride;     /* conv default 1; pool default k */
    int pad;        /* conv padding, default 0 */
    bool bias;      /* linear/conv bias, default true */
    float p;        /* dropout probability, default 0.5 */
    float eps;      /* norms, default 1e-5 */
    float momentum; /* batchnorm running-stat momentum, default 0.1 */
    /* graph ops (the sequential spec leaves these at their defaults) */
    bool flatten; /* linear: over all values of a sample (sequential spec) instead of the last dim */
    int num;      /* embedding: rows of the table (vocabulary or positions) */
    bool pos;     /* embedding: look up each position's row instead of the id's */
    int heads;    /* attention heads */
    int ndim;     /* reshape: per-sample shape */
    int shape[4];
    int ignore_index; /* xent: targets equal to it do not count (default -100, as torch) */
    float init_std;   /* > 0: weights ~ N(0, init_std), biases 0 (GPT); 0: torch's default init */
    const char *tie;  /* linear/matmul_t/embedding: use this existing tensor as the weight (tied) */
} dt_layer_spec;

/* Returns a spec entry of `kind` with every default filled in. */
dt_layer_spec dt_layer_default(dt_layer_kind kind);
/* The op's name ("linear", "attention", ...), as in specs and messages. */
const char *dt_layer_name(dt_layer_kind kind);
/* The kind of the op called `name` (or its spec alias), or -1 if there is none: how to name an op
 * that has no dt_layer_kind value (the ops of the registry past DT_LAYER_KIND_COUNT). */
int dt_layer_find(const char *name);

#define DT_MAX_LAYERS 64

/* Parses a spec string or preset name ("mlp" = linear(128) relu linear(10) on flattened input,
 * "cnn" = the reference CNN) into layers[0..*n). On error returns DT_EINVAL with a message that
 * quotes the bad token and its character position. */
dt_status dt_spec_parse(const char *spec, dt_layer_spec *layers, int max_layers, int *n);
/* Writes the canonical spec string of layers into buf (always NUL-terminated). */
void dt_spec_format(char *buf, size_t cap, const dt_layer_spec *layers, int n);
/* The layers a spec may name and their aliases, for a usage text: "layers: linear(out[,bias=0])
 * ...\naliases: dense = linear, ...\n", from the op registry (a static string). */
const char *dt_spec_help(void);

typedef struct dt_model dt_model;

/* ---- building a graph ---------------------------------------------------------------------- *
 * Nodes are added in topological order; each names its inputs by the ids earlier calls returned.
 * Shapes are per sample (the batch dimension comes at run time). Errors are sticky (ggml style):
 * a failed call returns -1, later calls with a -1 input return -1, and dt_graph_finish reports
 * the first error with the node's name. A node's parameters are named "<node name>.weight",
 * ".bias" (norms also ".running_mean", ".running_var" buffers); spec.tie makes a node use an
 * existing tensor instead of its own weight (shapes must match). */

/* An empty graph. */
dt_status dt_graph_create(dt_model **m);
/* A graph input of `dtype` (DT_F32 features/targets or DT_I32 ids/labels) and per-sample shape
 * shape[0..ndim) (ndim 0..4; 0 = one value). Inputs are fed in the order they were added. */
int dt_graph_input(dt_model *m, const char *name, dt_dtype dtype, int ndim, const int *shape);
/* A node of op spec->kind on inputs[0..nin). `layer` keys its initialisation and dropout streams
 * (the sequential spec passes the layer index; -1 = the node's index). Returns the node id. */
int dt_graph_node(dt_model *m, const char *name, const dt_layer_spec *spec, int layer, const int *inputs, int nin);
/* Ends building: `output` is the node whose values dt_model_forward returns (logits), `loss` a
 * loss node (xent or mse) whose first input is `output`, or -1. Lays out the slabs (parameters
 * in node order, weight before bias) and sets `spec` as the model's spec string. */
dt_status dt_graph_finish(dt_model *m, int output, int loss, const char *spec);
/* Before dt_graph_finish: leave the model unplaced, its parameters and gradients reserved (zero,
 * neither resident nor charged) until dt_model_place says which part this process holds; call
 * that before anything else touches the model (until then it counts as whole, uncharged).
 * Without it, dt_graph_finish places the whole model. */
void dt_graph_defer_placement(dt_model *m);

/* ---- placement: the part of the parameters (and their gradients) this process holds ---- *
 * A strategy decides it from the graph before anything is written (pipeline parallel: the
 * tensors of its stage; tensor parallel: none of the whole model, whose shards live in another
 * model). own[0..nown) are sorted, disjoint ranges of the parameter slab; a tensor is placed when
 * it meets one. Their parameter and gradient bytes are charged against --mem-limit, the pages of
 * the rest given back (they read as zeros). Only placed tensors are initialised, zeroed, saved
 * and restored. own NULL: the whole model. DT_ENOMEM (nothing changed) when they do not fit. May
 * be called again to widen (evaluation, checkpoints) or narrow the placement. */
dt_status dt_model_place(dt_model *m, const dt_range *own, int nown);
/* Whether parameter tensor t (or a buffer: always) is placed. */
bool dt_model_tensor_placed(const dt_model *m, int t);
/* The ranges of the parameter slab the tensors with keep[t] set cover, merged where contiguous
 * (for dt_model_place; *own malloc'd, NULL with *nown 0 when none). DT_ENOMEM. */
dt_status dt_model_tensor_ranges(const dt_model *m, const bool *keep, dt_range **own, int *nown);
/* The placement: its ranges (NULL: whole) and their count. The pointer is the model's. */
const dt_range *dt_model_placement(const dt_model *m, int *nown);
/* The values of tensor t into out (numel floats). A placed tensor (or buffer) gives what it
 * holds; an unplaced one the initial values of the last dt_model_init's seed, the same as a whole
 * model's: the node that declares t is initialised into the reserved slab for the moment (its
 * bytes charged meanwhile, given back after). The node must declare no placed tensor. DT_ENOMEM. */
dt_status dt_model_init_tensor(dt_model *m, int t, float *out);

/* Builds the sequential model of layers[0..n) for inputs of shape (C,H,W) (C=1,H=1,W=features
 * for vectors), with an int32 label input and a softmax cross-entropy loss node. Linear layers on
 * a 4-d activation flatten implicitly. Parameters are zero until dt_model_init. */
dt_status dt_model_create(dt_model **m, const dt_layer_spec *layers, int n, int C, int H, int W);
/* dt_spec_parse + dt_model_create. */
dt_status dt_model_create_from_spec(dt_model **m, const char *spec, int C, int H, int W);
/* The device its memory lives on and its kernels run on (src/device/device.h; default the cpu
 * device). Set right after building (before placing or running): the parameters, gradients and
 * buffers move to whole blocks of the device, activations and the input batch are allocated
 * there, and the ops run the device's kernel table. A device whose memory is not the host's takes
 * only a whole model (dt_model_place with own NULL). */
struct dt_dev;
dt_status dt_model_set_device(dt_model *m, struct dt_dev *dev);
struct dt_dev *dt_model_device(const dt_model *m);
/* dt_model_set_device, and the model owns dev from then on: dt_model_destroy destroys it (a model
 * loaded for eval, predict, sample or export on a device of its own). On an error the caller
 * still owns dev. */
dt_status dt_model_adopt_device(dt_model *m, struct dt_dev *dev);
/* Frees the model and its slabs; NULL is a no-op. */
void dt_model_destroy(dt_model *m);

/* Seeded initialisation (torch defaults: kaiming-uniform weights and biases for linear/conv,
 * ones/zeros for norms; N(0, init_std) where a node sets it). Depends only on (seed, layer),
 * never on world size. Only the nodes that declare a placed tensor are initialised; a tensor
 * placed in part (ZeRO-3's shards) is initialised whole and what lies outside the placement is
 * given back at once. */
void dt_model_init(dt_model *m, uint64_t seed);

/* Canonical spec string (owned by the model). */
const char *dt_model_spec(const dt_model *m);
/* Values per sample of the first input and of the output node. */
int dt_model_in_size(const dt_model *m);
int dt_model_out_size(const dt_model *m);
/* Values per sample of input k (in feed order: 0 the data, 1 the targets); 0 if none. */
int dt_model_input_values(const dt_model *m, int k);
/* dtype of the first input (DT_F32 features, DT_I32 tokens). */
dt_dtype dt_model_in_dtype(const dt_model *m);
/* Classes of the output: its last dimension (the vocabulary for a language model). */
int dt_model_classes(const dt_model *m);

/* The flat slabs. params and grads have dt_model_num_params floats; buffers (batchnorm running
 * stats, not trained) have dt_model_num_buffers. Pointers stay valid for the model's life. */
size_t dt_model_num_params(const dt_model *m);
size_t dt_model_num_buffers(const dt_model *m);
float *dt_model_params(dt_model *m);
float *dt_model_grads(dt_model *m);
float *dt_model_buffers(dt_model *m);

/* A named tensor view of the model: offset into the params slab (or the buffers slab). */
typedef struct {
    char name[64];  /* "0.weight", "transformer.h.0.attn.c_attn.weight" */
    bool is_buffer; /* true: in buffers slab (running stats) */
    int layer;      /* the node that owns it (its first user) */
    size_t offset;  /* in floats */
    size_t numel;
    int ndim;
    int64_t shape[4];
} dt_param_info;
int dt_model_num_tensors(const dt_model *m);
const dt_param_info *dt_model_tensor(const dt_model *m, int i);
/* Index of the tensor called name, or -1. */
int dt_model_find_tensor(const dt_model *m, const char *name);

/* ---- nodes (for strategies: hooks, pipeline cuts) ----------------------------------------- */
int dt_model_num_nodes(const dt_model *m);
const char *dt_model_node_name(const dt_model *m, int node);
dt_layer_kind dt_model_node_kind(const dt_model *m, int node);
/* The output and loss node ids given to dt_graph_finish. */
int dt_model_output_node(const dt_model *m);
int dt_model_loss_node(const dt_model *m);
/* A node's values of the last forward ((B, values per sample), f32) and their gradient of the
 * last backward (NULL where none was computed). Valid until the next forward. Inside a CNN's
 * conv -> maxpool chain the backend's layout applies instead: blocked nChw16c, and at bf16 a
 * conv's values (and gradient) as bf16 in the first half of the memory (nn/graph_layout.c);
 * pipeline stages pass them on as they are. */
const float *dt_model_node_values(const dt_model *m, int node);
const float *dt_model_node_grad(const dt_model *m, int node);
/* Whether a node's values are never written: a conv computed together with the maxpool after it
 * (its values and gradient are then NULL; no pipeline stage may end there). */
bool dt_model_node_fused(const dt_model *m, int node);

/* How tensor parallelism may split a node (set by the model builder; nn/ only stores it, the
 * tensor-parallel strategy (parallel/tp_hooks.c, tp_shard.c) gives it meaning). A node's
 * parameters are "<node>.weight" (out, in) and "<node>.bias" (out). */
typedef enum {
    DT_TP_MARK_NONE = 0, /* replicated: every rank computes it whole */
    DT_TP_MARK_COLUMN,   /* column-parallel linear: rank r of K computes outputs [r out/K, (r+1) out/K)
                          * (in `parts` equal parts each split so: 3 for a fused q,k,v) from the whole
                          * input; its input's gradient is summed over the ranks */
    DT_TP_MARK_ROW,      /* row-parallel linear: rank r reads inputs [r in/K, ...) (a column-parallel
                          * node's slice, through elementwise nodes), its output's partial sums are
                          * summed over the ranks; the bias is added once */
    DT_TP_MARK_VOCAB,    /* vocabulary-parallel: an embedding or a (tied) head split by table rows */
} dt_tp_mark;
/* Marks node (parts: 1, or 3 for a fused q,k,v column-parallel node). DT_EINVAL naming the
 * node for a bad node, mark or parts. */
dt_status dt_model_mark_tp(dt_model *m, int node, dt_tp_mark mark, int parts);
/* Called before a node's forward and after its backward (ZeRO-3 gathers, tensor-parallel
 * collectives); either may be NULL. */
typedef void (*dt_node_hook_fn)(void *ctx, int node);
void dt_model_set_node_hooks(dt_model *m, dt_node_hook_fn before_forward, dt_node_hook_fn after_backward, void *ctx);
/* Called after a node's forward (tensor-parallel collectives on its values); NULL: none. Its own
 * ctx, so it composes with the hooks above. */
void dt_model_set_after_forward_hook(dt_model *m, dt_node_hook_fn after_forward, void *ctx);
/* Writable views of a node's values / gradient of the current run, for a hook to reduce in place
 * (NULL where none exist). Aliases resolve to the node that owns the memory. */
float *dt_model_node_values_mut(dt_model *m, int node);
float *dt_model_node_grad_mut(dt_model *m, int node);
/* Called before a node's backward (ZeRO-3 gathers its parameters again), with the ctx of
 * dt_model_set_node_hooks; NULL: none. */
void dt_model_set_backward_hook(dt_model *m, dt_node_hook_fn before_backward);
/* The node hooks set now (any may be NULL), so that a second user can chain them. */
void dt_model_node_hooks(const dt_model *m, dt_node_hook_fn *before_forward, dt_node_hook_fn *after_backward,
                         dt_node_hook_fn *before_backward, void **ctx);
/* The tensors (dt_model_tensor ids, parameters and buffers, tied ones included) node reads,
 * into idx[0..cap); returns how many it has (which may exceed cap). */
int dt_model_node_tensors(const dt_model *m, int node, int *idx, int cap);

/* ---- running ------------------------------------------------------------------------------ */

/* One batch: x is (n, in_size) of the first input's dtype (f32 features or int32 ids); y the
 * second input (int32 labels/targets or f32 regression targets) or NULL for no loss. */
typedef struct {
    const void *x;
    const void *y;
    int n;
} dt_feed;
/* Bytes of one fed value (f32 or int32 alike): sample i of x starts at i * in_size * this. */
#define DT_FEED_VALUE_BYTES 4

/* Runs the forward pass of every node on f (the loss too when f->y is set and the graph has
 * one); train selects batchnorm batch statistics and active dropout; step keys dropout masks
 * (counter-based RNG). *loss (may be NULL) gets the loss (NaN without one). Activations grow to
 * fit the batch. DT_EINVAL for a token id or label out of range, naming it. */
dt_status dt_model_run(dt_model *m, const dt_feed *f, bool train, uint64_t step, float *loss);
/* The output (logits) of the last run/forward: (B, out_size). */
const float *dt_model_output(const dt_model *m);
/* Values [first, first + n) of the last run's output into host memory (downloaded from the
 * model's device; the output's own memory may be the device's, which the host cannot read). */
void dt_model_read_output(const dt_model *m, size_t first, size_t n, float *host);
/* Rows of the last forward's output ((n x out_size / classes) rows of dt_model_classes values)
 * whose largest value (the first of equal ones) is at labels[row]: correct predictions. On a
 * device whose memory is not the host's they are counted there when labels are the last run's
 * fed targets (its count kernel; 8 bytes downloaded), else the logits are downloaded first: -1
 * when the host has no memory for them. */
int64_t dt_model_count_correct(const dt_model *m, const int32_t *labels, int n);

/* f32 models: runs the forward pass on x (B, in_size) up to the output node (no loss); *out
 * points at the model-owned (B, out_size) output, valid until the next forward. */
dt_status dt_model_forward(dt_model *m, const float *x, int B, bool train, uint64_t step, const float **out);

/* Called during backward each time parameter gradients are complete: the range
 * grads[offset, offset+n) is final for this step. Ranges complete from the end of the slab
 * towards its start; a tied tensor completes with its last user. */
typedef void (*dt_grad_ready_fn)(void *ctx, size_t offset, size_t n);

/* Backpropagates from the loss of the last dt_model_run (d loss = scale: 1, or a weight for
 * the rank's share of a global batch, or a loss scale), ACCUMULATING into the grads slab (zero
 * it first with dt_model_zero_grad). hook may be NULL. */
dt_status dt_model_backward_loss(dt_model *m, float scale, dt_grad_ready_fn hook, void *ctx);
/* Backpropagates dout (B, out_size) of the output node of the last forward (no loss). */
dt_status dt_model_backward(dt_model *m, const float *dout, dt_grad_ready_fn hook, void *ctx);
void dt_model_zero_grad(dt_model *m);
/* Frees the gradient slab of a model that is never differentiated (tensor parallel: the whole
 * model only holds the gathered parameters); dt_model_grads is then NULL and backward must not be
 * called. */
void dt_model_release_grads(dt_model *m);

/* ---- pipeline cuts: the graph cut at a node boundary k into stages [0, k) and [k, n) --------- *
 * Every stage may be a separate copy of the model (another process). A stage sizes its memory
 * with dt_model_prepare, writes the values its first nodes read from the previous stage into
 * dt_model_node_buffer of those nodes (dt_model_cut_inputs names them), runs its forward with
 * dt_model_forward_nodes, and its backward with dt_model_backward_nodes from the gradient the
 * next stage sent (or from the loss); the gradient to send back is then dt_model_node_grad of
 * the cut inputs. Parameter gradients accumulate as in a whole backward. */

/* Sizes activation memory for batch B and sets the run's mode and step (dropout keys). */
dt_status dt_model_prepare(dt_model *m, int B, bool train, uint64_t step);
/* The nodes below k (not graph inputs) whose values a node at k or above reads, into
 * nodes[0..cap); returns how many there are (which may exceed cap). */
int dt_model_cut_inputs(const dt_model *m, int k, int *nodes, int cap);
/* Writable (B, values per sample) memory of a node's values, after dt_model_prepare. */
float *dt_model_node_buffer(dt_model *m, int node);
/* Forward of nodes [lo, hi) on feed f (its inputs; f->n must be the prepared batch). */
dt_status dt_model_forward_nodes(dt_model *m, const dt_feed *f, int lo, int hi);
/* Backward of nodes [lo, hi): from d loss = scale when the loss node is among them, else from
 * dout, the gradient of node hi-1's values ((B, values per sample), from the next stage). */
dt_status dt_model_backward_nodes(dt_model *m, int lo, int hi, const float *dout, float scale, dt_grad_ready_fn hook,
                                  void *ctx);

/* The node whose memory holds node's values: node itself, or for an alias (flatten, reshape, a
 * relu its maxpool applies) the node it aliases, followed to the end. */
int dt_model_node_owner(const dt_model *m, int node);
/* True when a node of [lo, hi) reads graph input k (feed order: 0 the data, 1 the targets). */
bool dt_model_range_reads_input(const dt_model *m, int lo, int hi, int k);
/* Values per sample of a node's output (1 for a loss). */
size_t dt_model_node_size(const dt_model *m, int node);
/* Floating-point operations of one node's training step (forward + backward) at batch B. */
double dt_model_node_flops(const dt_model *m, int node, int B);
/* Bytes of activation memory (values, gradients, saved tensors, scratch, workspace) a training
 * run at batch B allocates: those of the blocks dt_model_prepare takes, as --mem-limit counts
 * them (dt_alloc_size; a value or gradient stored bf16 has an f32 one's room). */
size_t dt_model_activation_bytes(const dt_model *m, int B);

/* Floating-point operations of one training step (forward + backward) at batch B. */
double dt_model_train_flops(const dt_model *m, int B);

#ifdef __cplusplus
}
#endif
#endif
