/* Internals of tensor parallelism (tp.c, the strategy; tp_shard.c, how a whole GPT's tensors map
 * to the shards of the ranks; tp_xent.c, the vocabulary-parallel cross-entropy). Megatron-LM's
 * layout: column-parallel c_attn (each rank its heads' q, k and v rows) and c_fc, row-parallel
 * c_proj (each rank its input columns; the bias lives on rank 0, zero elsewhere, so the partial
 * sums add it once), the token embedding and tied head split by vocabulary rows, the rest
 * replicated. */
#ifndef DT_PARALLEL_TP_H
#define DT_PARALLEL_TP_H

#include "dtrain/comm.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "parallel/strategy.h"

typedef enum {
    DT_TP_REPL = 0,  /* every rank holds the whole tensor (layer norms, positions) */
    DT_TP_ROWS,      /* rank r holds rows [r R/K, (r+1) R/K) (c_fc, the token embedding) */
    DT_TP_ROWS3,     /* the same within each third of the rows: q, k and v (c_attn) */
    DT_TP_COLS,      /* rank r holds columns [r C/K, (r+1) C/K) of every row (c_proj weights) */
    DT_TP_RANK0,     /* rank 0 holds the tensor, the others zeros (c_proj biases) */
} dt_tp_split;

/* How the GPT tensor called name is split. */
dt_tp_split dt_tp_split_of(const char *name);

/* Copies rank r of K's part of the whole tensor `full` (its info ft) into local (to_local), or
 * local back into its place in full. RANK0 to_local on r > 0 writes zeros; back, it copies on r 0 only. */
void dt_tp_copy(dt_tp_split k, float *full, float *local, const dt_param_info *ft, int K, int r, bool to_local);

/* Rank r's shard of the whole model (params) and optimizer (moments, step count) into the local
 * ones. A whole tensor that is not placed (the trainer places none under tp) gives its initial
 * values instead (dt_model_init_tensor, one tensor at a time) and fresh moments. DT_EINVAL when a
 * local tensor has no whole counterpart. */
dt_status dt_tp_scatter(dt_model *full, dt_optim *fo, dt_model *local, dt_optim *lo, int K, int r);
/* The inverse, collective over comm (K ranks; NULL = one), tensor by tensor: every rank assembles
 * the whole parameters and buffers into full (allgather); with moments != NULL (on every rank of
 * comm alike) rank 0 also assembles each optimizer moment k of lo into moments[k] (whole-model
 * slabs; gather to rank 0, the others' moments are unused). */
dt_status dt_tp_gather(dt_comm *comm, dt_model *full, dt_model *local, dt_optim *lo, int K, float *const *moments);

/* Vocabulary-parallel softmax cross-entropy (Megatron's): logits (N, Vl) hold vocabulary columns
 * [lo, lo + Vl) of the rank; targets (N) are global ids (ignore: does not count). Two allreduces
 * over comm (row maxima; sums of exponentials with the target logits), full logits never leave the
 * rank. *loss = mean over counted rows (0 when none), *counted their number; dlogits (N, Vl) =
 * scale x d mean / d logits (overwritten). work: 3N floats. DT_EINVAL naming a target outside
 * [0, V) (V = vocab, the whole vocabulary). */
dt_status dt_tp_xent(dt_comm *comm, const float *logits, const int32_t *targets, int N, int Vl, int lo, int vocab,
                     int ignore, float scale, float *dlogits, float *work, double *loss, int *counted);

/* What the tp axis moved on this rank since the strategy was made (dt_comm_bytes of its
 * allreduces): inside the blocks (the four f/g allreduces per block per step, Megatron's
 * 4 b s h x 2(t-1)/t values) and around them (embedding, head, loss); dp_bytes: the dp axis. */
typedef struct {
    uint64_t block_bytes, block_ops, other_bytes, dp_bytes;
} dt_tp_counters;

/* The state of rank r of K for a checkpoint visitor: whole (world rank 0 after a sync) the whole
 * model full's tensors, each with its moments[k] (whole-model slabs of lo's states); else this
 * rank's shards of local and lo as pieces of the whole tensors (restored in place). */
dt_status dt_tp_visit_state(dt_model *full, dt_model *local, dt_optim *lo, int K, int r, bool whole,
                            float *const *moments, dt_state_visit_fn fn, void *ctx);

struct dt_strategy;
/* The counters of a "tp" strategy (zeros for any other). */
void dt_tp_counters_of(const struct dt_strategy *s, dt_tp_counters *c);

#endif
