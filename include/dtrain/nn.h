/* Models: a sequential stack of layers whose parameters, gradients and buffers live in flat
 * slabs (llm.c style), built from the C API or from a spec string such as
 *   "conv(32,3,pad=1) relu maxpool(2) flatten linear(128) relu linear(10)".
 * Tensor names follow torch.nn.Sequential ("0.weight", "3.bias", "4.running_mean") so a saved
 * checkpoint loads into the equivalent PyTorch model unchanged. */
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DT_LAYER_LINEAR, DT_LAYER_CONV2D, DT_LAYER_MAXPOOL2D, DT_LAYER_AVGPOOL2D, DT_LAYER_RELU,
    DT_LAYER_GELU, DT_LAYER_TANH, DT_LAYER_SIGMOID, DT_LAYER_DROPOUT, DT_LAYER_FLATTEN,
    DT_LAYER_LAYERNORM, DT_LAYER_BATCHNORM2D,
} dt_layer_kind;

/* One layer of a spec. Fields a kind does not use are ignored. */
typedef struct {
    dt_layer_kind kind;
    int out;          /* linear: out features; conv: out channels */
    int k;            /* conv / pool kernel size (square) */
    int stride;       /* conv default 1; pool default k */
    int pad;          /* conv padding, default 0 */
    bool bias;        /* linear/conv bias, default true */
    float p;          /* dropout probability, default 0.5 */
    float eps;        /* norms, default 1e-5 */
    float momentum;   /* batchnorm running-stat momentum, default 0.1 */
} dt_layer_spec;

/* Returns a spec entry of `kind` with every default filled in. */
dt_layer_spec dt_layer_default(dt_layer_kind kind);

#define DT_MAX_LAYERS 64

/* Parses a spec string or preset name ("mlp" = linear(128) relu linear(10) on flattened input,
 * "cnn" = the reference CNN) into layers[0..*n). On error returns DT_EINVAL with a message that
 * quotes the bad token and its character position. */
dt_status dt_spec_parse(const char *spec, dt_layer_spec *layers, int max_layers, int *n);
/* Writes the canonical spec string of layers into buf (always NUL-terminated). */
void dt_spec_format(char *buf, size_t cap, const dt_layer_spec *layers, int n);

typedef struct dt_model dt_model;

/* Builds a model for inputs of shape (C,H,W) (use C=1,H=1,W=features for vectors). Linear layers
 * on a 4-d activation flatten implicitly. Parameters are zero until dt_model_init. */
dt_status dt_model_create(dt_model **m, const dt_layer_spec *layers, int n, int C, int H, int W);
/* dt_spec_parse + dt_model_create. */
dt_status dt_model_create_from_spec(dt_model **m, const char *spec, int C, int H, int W);
/* Frees the model and its slabs; NULL is a no-op. */
void dt_model_free(dt_model *m);

/* Seeded initialisation (torch defaults: kaiming-uniform weights and biases for linear/conv,
 * ones/zeros for norms). Depends only on (seed, layer index), never on world size. */
void dt_model_init(dt_model *m, uint64_t seed);

/* Canonical spec string (owned by the model). */
const char *dt_model_spec(const dt_model *m);
/* Input and output shape: numbers of input values per sample, output values per sample. */
int dt_model_in_size(const dt_model *m);
int dt_model_out_size(const dt_model *m);
int dt_model_num_layers(const dt_model *m);
const dt_layer_spec *dt_model_layer(const dt_model *m, int i);

/* The flat slabs. params and grads have dt_model_num_params floats; buffers (batchnorm running
 * stats, not trained) have dt_model_num_buffers. Pointers stay valid for the model's life. */
size_t dt_model_num_params(const dt_model *m);
size_t dt_model_num_buffers(const dt_model *m);
float *dt_model_params(dt_model *m);
float *dt_model_grads(dt_model *m);
float *dt_model_buffers(dt_model *m);

/* A named tensor view of the model: offset into the params slab (or the buffers slab). */
typedef struct {
    char name[32];      /* "0.weight" */
    bool is_buffer;     /* true: in buffers slab (running stats) */
    int layer;          /* index in the layer list */
    size_t offset;      /* in floats */
    size_t numel;
    int ndim;
    int64_t shape[4];
} dt_param_info;
int dt_model_num_tensors(const dt_model *m);
const dt_param_info *dt_model_tensor(const dt_model *m, int i);

/* Runs the forward pass on x (B, in_size); train selects batchnorm batch statistics and
 * active dropout. *out points at the model-owned (B, out_size) output, valid until the next
 * forward. Activations grow to fit B. step keys dropout masks (counter-based RNG). */
dt_status dt_model_forward(dt_model *m, const float *x, int B, bool train, uint64_t step, const float **out);

/* Called during backward each time a layer's parameter gradients are complete: the range
 * grads[offset, offset+n) is final for this step. Layers complete from last to first. */
typedef void (*dt_grad_ready_fn)(void *ctx, size_t offset, size_t n);

/* Backpropagates dout (B, out_size) of the last forward through the stack, ACCUMULATING into
 * the grads slab (zero it first with dt_model_zero_grad). hook may be NULL. */
dt_status dt_model_backward(dt_model *m, const float *dout, dt_grad_ready_fn hook, void *ctx);
void dt_model_zero_grad(dt_model *m);

/* Floating-point operations of one training step (forward + backward) at batch B. */
double dt_model_train_flops(const dt_model *m, int B);

#ifdef __cplusplus
}
#endif
#endif
