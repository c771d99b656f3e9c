/* Model exchange with other tools: plain weights files in (a PyTorch `save_file(model.state_dict())`
 * safetensors file, mapped by PyTorch names, F32/F16/BF16), weights-only files out (what a strict
 * torch `load_state_dict` accepts, input normalisation folded into the first layer), ONNX export
 * (written with protobuf-c) and prediction. */
#ifndef DTRAIN_IO_H
#define DTRAIN_IO_H

#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Input standardisation a model was trained with (--normalize): x' = (x - mean) / std. */
typedef struct {
    bool on;
    float mean, std;
} dt_input_norm;

/* Loads every tensor of model m from the safetensors file path, by name ("1.weight",
 * "transformer.h.0.attn.c_attn.weight"), converting F32, F16 or BF16 to f32. Every shape is
 * checked. "<bn>.num_batches_tracked" of a batchnorm, a GPT's "lm_head.weight" (tied to
 * transformer.wte.weight) and, in a dtrain checkpoint, "optim.*" tensors are ignored. DT_EFORMAT
 * with a message naming each missing, extra or mis-shaped tensor and the shape the model expects;
 * m is unchanged on error. DT_ENOENT/DT_EIO when the file cannot be read. */
dt_status dt_weights_load(dt_model *m, const char *path);

/* The model spec and input shape a file records (dtrain checkpoints and --save-weights files:
 * metadata dtrain.model_spec, dtrain.input_shape), copied into spec (cap bytes) and C/H/W;
 * DT_ENOENT when the file records none (a foreign file: pass --model). */
dt_status dt_weights_spec(const char *path, char *spec, size_t cap, int *C, int *H, int *W);

/* Writes m's tensors (F32) to path atomically as a weights-only safetensors file: no optimizer
 * state, a batchnorm's num_batches_tracked (I64, 0) added and a GPT's lm_head.weight (a copy of
 * the tied transformer.wte.weight), so a strict torch load_state_dict of the equivalent model
 * accepts it. norm (may be NULL or off) is folded into the first layer exactly (linear, conv
 * without padding, batchnorm; flatten, pooling and dropout before it are fine); DT_EINVAL naming
 * the layer when the first layer cannot take it (a padded conv, a layernorm). m is unchanged. */
dt_status dt_weights_save(const dt_model *m, const char *path, const dt_input_norm *norm, int C, int H, int W);

/* The same with the values taken from params and buffers (whole-model slabs in m's layout, e.g.
 * assembled from the shards of the ranks) instead of m's own; norm is folded into them in place. */
dt_status dt_weights_save_slabs(const dt_model *m, float *params, float *buffers, const char *path,
                                const dt_input_norm *norm, int C, int H, int W);

/* DT_OK when dt_weights_save can fold norm into m's first layer, else its DT_EINVAL. */
dt_status dt_weights_check_fold(const dt_model *m, const dt_input_norm *norm);

/* Exports m as an ONNX model (IR 8, opset 17) to path (atomically): input "input" (N, C, H, W)
 * float, or "ids" (N, T) int32 for a GPT; output "logits" (N, classes), or (N, T, V). norm (may
 * be NULL or off) becomes Sub/Div nodes at the input. DT_ENOTSUP naming an op with no ONNX
 * form, or when dtrain was built without protobuf-c. */
dt_status dt_onnx_export(const dt_model *m, const char *path, const dt_input_norm *norm, int C, int H, int W);

/* Runs m in evaluation mode (batchnorm running stats, no dropout) on x, n samples of the model's
 * input (f32 features of dt_model_in_size each, already normalised as in training, or int32 ids),
 * in batches of at most 256, and writes the (n, dt_model_out_size) logits to logits (caller-owned).
 * DT_EINVAL for a token id out of range. */
dt_status dt_model_predict(dt_model *m, const void *x, int64_t n, float *logits);

/* Where a model comes from: a dtrain checkpoint (its spec, weights and normalisation), or a plain
 * weights file with a spec (model NULL: the spec the file records, dt_weights_spec). */
typedef struct {
    const char *checkpoint; /* a dtrain train --save / --checkpoint-dir file, or NULL */
    const char *weights;    /* a plain safetensors weights file, or NULL */
    const char *model;      /* spec or preset for weights (with a checkpoint: must match it, or NULL) */
    const char *device;     /* where it runs: "cpu" (NULL) or "checked[:arena=BYTES]" (docs/device.md); the
                             * model owns the device (dt_model_adopt_device) */
} dt_model_source;

/* The model spec of src into spec (cap bytes). DT_EINVAL naming the flags when src gives
 * neither or both files, or weights without a spec anywhere. */
dt_status dt_model_source_spec(const dt_model_source *src, char *spec, size_t cap);
/* Builds src's model for inputs (C,H,W) (ignored by a GPT) and loads its weights; *norm (may be
 * NULL) gets the input normalisation the data must be given (a checkpoint's --normalize; off for
 * weights, whose normalisation is folded). DT_EMISMATCH when a checkpoint was trained on another
 * input shape. The caller frees *m. */
dt_status dt_model_open(dt_model **m, const dt_model_source *src, int C, int H, int W, dt_input_norm *norm);
/* dtrain eval of src on the test split of data (its training split when it has none: *split
 * says which): mean loss, accuracy, samples. */
dt_status dt_evaluate_source(const dt_model_source *src, const char *data, int batch, float *loss, float *acc,
                             int64_t *samples, const char **split);

#ifdef __cplusplus
}
#endif
#endif
