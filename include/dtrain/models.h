/* Model builders over the graph of include/dtrain/nn.h: the sequential spec (mlp, cnn, any
 * layer list) and a decoder-only transformer (GPT: pre-LN, GELU MLP, learned positions, output
 * head tied to the token embedding) with nanoGPT's tensor names, so a checkpoint loads into a
 * nanoGPT-style PyTorch model unchanged (lm_head.weight is transformer.wte.weight). */
#ifndef DTRAIN_MODELS_H
#define DTRAIN_MODELS_H

#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int L; /* transformer blocks (n_layer) */
    int H; /* attention heads (n_head); C % H == 0 */
    int C; /* embedding width (n_embd) */
    int T; /* context length (block_size) */
    int V; /* vocabulary (256: bytes) */
} dt_gpt_config;

/* Parses "gpt" or "gpt:L=4,H=4,C=128,T=64[,V=256]" (defaults: those values). DT_EINVAL names
 * the bad key or value and says what is allowed. */
dt_status dt_gpt_parse(const char *spec, dt_gpt_config *c);
/* Writes the canonical spec "gpt:L=..,H=..,C=..,T=..,V=.." into buf. */
void dt_gpt_format(char *buf, size_t cap, const dt_gpt_config *c);
/* Builds the GPT graph: input int32 ids (T), targets int32 (T), logits (T, V), softmax
 * cross-entropy loss over all B*T positions. Initialise with dt_model_init (nanoGPT's init:
 * N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0, layer norms 1/0). */
dt_status dt_gpt_create(dt_model **m, const dt_gpt_config *c);

/* DT_OK when tp ranks can split c evenly (tp divides H, C and V); else DT_EINVAL naming --tp and
 * listing the values that divide. */
dt_status dt_gpt_check_tp(const dt_gpt_config *c, int tp);
/* One tensor-parallel rank's shard of the GPT of c for tp ranks (Megatron-LM): the same node and
 * tensor names, H/tp heads per block (c_attn (3C/tp, C): the rank's q, k and v rows), c_fc
 * (4C/tp, C), the c_proj weights (C, C/tp) and (C, 4C/tp) (their outputs are partial sums), the
 * token embedding / tied head (V/tp, C): a slice of the vocabulary; the output is the rank's
 * (T, V/tp) logits and there is no loss node (the vocabulary-parallel loss needs the other
 * ranks). Parameters are zero; the strategy copies them from the whole model. DT_EINVAL as
 * dt_gpt_check_tp. */
dt_status dt_gpt_create_sharded(dt_model **m, const dt_gpt_config *c, int tp);
/* The same shard left unplaced (dt_graph_defer_placement): nothing written or charged until
 * dt_model_place says which of its tensors this rank holds (a tp x pp stage: its own). */
dt_status dt_gpt_create_sharded_unplaced(dt_model **m, const dt_gpt_config *c, int tp);

/* Sampling: temperature (0 = greedy), top-k (0 = all), seed of the counter-based draws. */
typedef struct {
    float temperature;
    int top_k;
    uint64_t seed;
} dt_sample_config;
/* Generates ntokens after prompt[0..nprompt) with a GPT (any model with int32 ids in and
 * (T, V) logits out), calling on_token (may be NULL) with each new token as it is drawn. The
 * context is the last T tokens. DT_EINVAL for an empty prompt or an id outside the vocabulary. */
dt_status dt_gpt_generate(dt_model *m, const int32_t *prompt, int nprompt, int ntokens, const dt_sample_config *sc,
                          void (*on_token)(void *ctx, int32_t token), void *ctx);

/* True when spec names a GPT ("gpt" or "gpt:..."). */
bool dt_model_spec_is_gpt(const char *spec);
/* The seed dt_model_build initialises with: the trainer's default (dt_train_defaults' seed). */
#define DT_MODEL_BUILD_SEED 42
/* Any model from its spec, ready to train: a GPT spec, or a sequential spec / preset for inputs
 * of shape (C,H,W) (for a GPT they are ignored: its input is T ids). Its parameters are
 * initialised as dt_model_init(*m, DT_MODEL_BUILD_SEED) does (call dt_model_init for another
 * seed; loading a checkpoint or weights overwrites them). The model is the caller's
 * (dt_model_destroy). DT_EINVAL names a bad spec or shape. */
dt_status dt_model_build(dt_model **m, const char *spec, int C, int H, int W);
/* As dt_model_build, but unplaced and NOT initialised: no parameter or gradient memory is written
 * or charged until dt_model_place (the trainer places the part its strategy says this rank holds),
 * then dt_model_init. */
dt_status dt_model_build_unplaced(dt_model **m, const char *spec, int C, int H, int W);
/* The sequential model of spec, placed whole or (defer) unplaced; not initialised (parameters
 * zero until dt_model_init). */
dt_status dt_model_create_spec_placed(dt_model **m, const char *spec, int C, int H, int W, bool defer);
/* Tensor parallelism: one rank's shard for tp ranks of the sequential model of spec (each
 * column-parallel linear tp times narrower; DT_EINVAL where tp does not divide its width). */
dt_status dt_model_create_spec_shard(dt_model **m, const char *spec, int C, int H, int W, int tp, bool defer);
/* One tensor-parallel rank's shard for tp ranks of the model `whole` (built by dt_model_build*:
 * a GPT, dt_gpt_create_sharded; a sequential model, dt_model_create_spec_shard on its input
 * shape), placed or (defer) unplaced, not initialised. The marks of its nodes (dt_model_mark_tp)
 * are the whole model's. */
dt_status dt_model_create_tp_shard(dt_model **m, const dt_model *whole, int tp, bool defer);

#ifdef __cplusplus
}
#endif
#endif
