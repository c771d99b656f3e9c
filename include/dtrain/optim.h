/* Optimizers (SGD with momentum/Nesterov/weight decay, Adam, AdamW) over flat slabs, learning
 * rate schedules (constant, step, cosine, linear warm-up) and gradient-norm clipping.
 * Updates match torch.optim (1.13) formulas. */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DT_OPTIM_SGD, DT_OPTIM_ADAM, DT_OPTIM_ADAMW } dt_optim_kind;

typedef struct {
    dt_optim_kind kind;
    float momentum;          /* sgd */
    bool nesterov;           /* sgd */
    float weight_decay;      /* sgd/adam: L2 added to the gradient; adamw: decoupled */
    float beta1, beta2, eps; /* adam/adamw */
} dt_optim_config;

/* Defaults as torch: sgd momentum 0; adam betas (0.9, 0.999), eps 1e-8; adamw weight decay 0.01. */
dt_optim_config dt_optim_defaults(dt_optim_kind kind);
/* "sgd" | "adam" | "adamw" -> kind; DT_EINVAL naming the bad name otherwise. */
dt_status dt_optim_parse(const char *name, dt_optim_kind *kind);
const char *dt_optim_name(dt_optim_kind kind);

typedef struct dt_optim dt_optim;

/* An optimizer for n parameters (a whole slab or one shard of it). */
dt_status dt_optim_create(dt_optim **o, const dt_optim_config *cfg, size_t n);
/* The same with only the moments of own[0..nown) placed (dt_optim_place; own NULL: all). */
dt_status dt_optim_create_placed(dt_optim **o, const dt_optim_config *cfg, size_t n, const dt_range *own, int nown);
void dt_optim_destroy(dt_optim *o);
/* One update: params[i] -= f(grads[i], state) with learning rate lr, i in [0,n). */
void dt_optim_step(dt_optim *o, float *params, const float *grads, float lr);
/* One update of nr ranges (a ZeRO shard): range k updates params[k][0..len[k]) from grads[k]
 * with the state values that follow those of ranges 0..k-1; the lengths sum to at most
 * dt_optim_size. Counts one step. */
void dt_optim_step_ranges(dt_optim *o, int nr, float *const *params, const float *const *grads, const size_t *len,
                          float lr);
/* As dt_optim_step_ranges on a whole (unsharded) optimizer: range k uses the state values
 * [off[k], off[k] + len[k]) (off[k] is the range's place in the full slab). The state outside the
 * ranges is left as it was. Counts one step. */
void dt_optim_step_at(dt_optim *o, int nr, float *const *params, const float *const *grads, const size_t *off,
                      const size_t *len, float lr);
/* Keeps only the state of ranges [off[k], off[k]+len[k)) (packed in that order: this rank's
 * shard), freeing the rest; dt_optim_size becomes the sum of len. DT_EINVAL for a range beyond
 * the state, DT_ENOMEM leaves the optimizer as it was. */
dt_status dt_optim_shard(dt_optim *o, int nr, const size_t *off, const size_t *len);

/* State for checkpoints: moment slabs by index ("m"/"momentum", "v"), each of n floats, and the
 * step counter. */
int dt_optim_num_states(const dt_optim *o);
float *dt_optim_state(dt_optim *o, int i, const char **name);
size_t dt_optim_size(const dt_optim *o);
int64_t dt_optim_steps(const dt_optim *o);
void dt_optim_set_steps(dt_optim *o, int64_t t);
const dt_optim_config *dt_optim_config_of(const dt_optim *o);
/* The device (src/device/device.h; default cpu) its state, the parameters and the gradients it is
 * given live on: the update runs its kernels there. A device whose memory is not the host's takes
 * the whole state (no dt_optim_place of a part) and moves it there; dt_optim_shard then packs the
 * shard into blocks of the device. */
struct dt_dev;
dt_status dt_optim_set_device(dt_optim *o, struct dt_dev *d);
/* dt_clip_grad_norm and, with loss scaling on, dt_loss_scaler_unscale of its loss scaler (true
 * without it), on gradients in the optimizer's device memory. */
float dt_optim_clip_grad_norm(dt_optim *o, float *g, size_t n, float max_norm);
bool dt_optim_unscale(dt_optim *o, float *g, size_t n);
/* Frees the moment slabs (for a rank whose state lives in other optimizers, e.g. pipeline stages'
 * segments): dt_optim_num_states returns 0 afterwards and dt_optim_step must not be called. */
void dt_optim_free_state(dt_optim *o);
/* The part of the moments this process holds, as dt_slab_place (ranges of the parameter slab;
 * own NULL: all): only they are charged against --mem-limit, the rest reads as zeros. A strategy
 * that keeps its own optimizers (pipeline segments, tensor-parallel shards) narrows the
 * trainer's to what it stages for checkpoints. DT_ENOMEM when they do not fit (the first moment
 * may then be placed and the second not: the run stops there). */
dt_status dt_optim_place(dt_optim *o, const dt_range *own, int nown);

/* ---- dynamic loss scaling (fp16) ---- */
typedef struct {
    float scale;           /* current scale S */
    float growth, backoff; /* S *= growth after `interval` finite steps; S *= backoff on inf/NaN */
    int interval;
    int good;        /* finite steps since S last changed */
    int64_t skipped; /* steps skipped for inf/NaN gradients */
} dt_loss_scaler;
/* torch.cuda.amp.GradScaler's defaults: S = 65536, growth 2, backoff 0.5, interval 2000. */
dt_loss_scaler dt_loss_scaler_default(void);
/* DT_EINVAL naming the bad field of s. */
dt_status dt_loss_scaler_check(const dt_loss_scaler *s);
/* After the backward pass of a loss scaled by s->scale: when all n gradients are finite, divides
 * them by the scale (in place), counts a good step (growing the scale after `interval`) and returns
 * true; otherwise leaves g, backs the scale off, counts a skipped step and returns false: the
 * caller must skip this update. */
bool dt_loss_scaler_unscale(dt_loss_scaler *s, float *g, size_t n);
/* Gives o a loss scaler (a copy of init; NULL = defaults), or removes it (enable = false); the
 * strategies scale the loss gradient by dt_optim_loss_scale and unscale before the update. */
dt_status dt_optim_set_loss_scaling(dt_optim *o, bool enable, const dt_loss_scaler *init);
/* o's scaler, NULL when off. */
dt_loss_scaler *dt_optim_loss_scaler(dt_optim *o);
/* The current loss scale (1 when off). */
float dt_optim_loss_scale(const dt_optim *o);

/* ---- learning-rate schedules ---- */
typedef enum { DT_LR_CONSTANT, DT_LR_STEP, DT_LR_COSINE } dt_lr_kind;
typedef struct {
    dt_lr_kind kind;
    float base_lr;
    int64_t warmup_steps; /* linear warm-up from base_lr/warmup to base_lr, 0 = none */
    int64_t total_steps;  /* cosine: decay horizon (after warm-up) */
    int64_t step_size;    /* step: decay every step_size steps */
    float gamma;          /* step: multiply by gamma */
    float min_lr;         /* cosine floor */
} dt_lr_schedule;
/* "constant" | "step" | "cosine" -> kind. */
dt_status dt_lr_parse(const char *name, dt_lr_kind *kind);
/* Learning rate to use for optimizer step `step` (0-based). */
float dt_lr_at(const dt_lr_schedule *s, int64_t step);

/* Scales g so its L2 norm is at most max_norm (no-op if max_norm <= 0). Returns the norm
 * before clipping (as torch.nn.utils.clip_grad_norm_). */
float dt_clip_grad_norm(float *g, size_t n, float max_norm);

#ifdef __cplusplus
}
#endif
#endif
