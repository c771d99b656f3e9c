/* Internals of tensor parallelism (tp.c, the strategy; tp_shard.c, how a whole model's tensors map
 * to the shards of the ranks, by the marks of its nodes, dt_model_mark_tp; tp_xent.c, the
 * vocabulary-parallel cross-entropy). Megatron-LM's layout, as the GPT builder marks it: column-parallel c_attn (each
 * rank its heads' q, k and v rows) and c_fc, row-parallel c_proj (each rank its input columns; the bias lives on rank
 * 0, zero elsewhere, so the partial sums add it once), the token embedding and tied head split by vocabulary rows, the
 * rest replicated. */
#ifndef DT_PARALLEL_TP_H
#define DT_PARALLEL_TP_H

#include "device/device.h"
#include "dtrain/comm.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "parallel/strategy.h"

typedef enum {
    DT_TP_REPL = 0, /* every rank holds the whole tensor (layer norms, positions) */
    DT_TP_ROWS,     /* rank r holds rows [r R/K, (r+1) R/K) (c_fc, the token embedding) */
    DT_TP_ROWS3,    /* the same within each third of the rows: q, k and v (c_attn) */
    DT_TP_COLS,     /* rank r holds columns [r C/K, (r+1) C/K) of every row (c_proj weights) */
    DT_TP_RANK0,    /* rank 0 holds the tensor, the others zeros (c_proj biases) */
} dt_tp_split;

/* How tensor `name` of model m (a whole model or a shard) is split, by the tensor-parallel mark
 * of the node that declares it (dt_model_mark_tp): a column-parallel node's weight and bias
 * ROWS (ROWS3 in 3 parts), a row-parallel one's weight COLS and bias RANK0, a vocabulary-parallel
 * one's weight ROWS; the tensors of unmarked nodes REPL. */
dt_tp_split dt_tp_split_of(const dt_model *m, const char *name);

/* Copies rank r of K's part of the whole tensor `full` (its info ft) into local (to_local), or
 * local back into its place in full, both host memory. RANK0 to_local on r > 0 writes zeros;
 * back, it copies on r 0 only. (dt_tp_scatter and dt_tp_gather move device memory.) */
void dt_tp_copy(dt_tp_split k, float *full, float *local, const dt_param_info *ft, int K, int r, bool to_local);
/* The same where full and local may be device d's memory (full_host, local_host: host memory):
 * copied with d's copy, upload or download (memcpy between host sides), zeros by its fill. */
void dt_tp_copy_on(dt_dev *d, bool full_host, bool local_host, dt_tp_split k, float *full, float *local,
                   const dt_param_info *ft, int K, int r, bool to_local);

/* Rank r's shard of the whole model (params) and optimizer (moments, step count) into the local
 * ones (each side on its model's device; the optimizers on their models'). A whole tensor that is not placed (the
 * trainer places none under tp) gives its initial values instead (dt_model_init_tensor, one tensor at a time) and fresh
 * moments. Only local's placed tensors are written (a tp x pp stage places its own). DT_EINVAL when a local tensor has
 * no whole counterpart. */
dt_status dt_tp_scatter(dt_model *full, dt_optim *fo, dt_model *local, dt_optim *lo, int K, int r);
/* The inverse, collective over comm (K ranks; NULL = one), tensor by tensor, with full, moments
 * and local on local's device (staged through host buffers where that is not host memory): every rank assembles
 * the whole parameters and buffers into full (allgather); with moments != NULL (on every rank of
 * comm alike) rank 0 also assembles each optimizer moment k of lo into moments[k] (whole-model
 * slabs; gather to rank 0, the others' moments are unused). */
dt_status dt_tp_gather(dt_comm *comm, dt_model *full, dt_model *local, dt_optim *lo, int K, float *const *moments);

/* One tensor's gather (split as tensor lt of model m, the shard, says): every rank's part of local tensor lt (its
 * values at src) into dst, the whole tensor ft, on every rank of comm (to_all: allgather) or on its rank 0 only
 * (gather). tmp: K x lt->numel floats. Collective over comm (NULL: one rank). */
dt_status dt_tp_gather_tensor(const dt_model *m, dt_comm *comm, int K, const dt_param_info *ft, const dt_param_info *lt,
                              const float *src, float *dst, float *tmp, bool to_all);
/* The same with src and dst memory of device d: on one whose memory is not host memory, src is
 * downloaded into tmp's last part (tmp: K + 1 parts of lt->numel floats), gathered on the host and
 * uploaded into its places in dst. */
dt_status dt_tp_gather_tensor_on(const dt_model *m, dt_dev *d, dt_comm *comm, int K, const dt_param_info *ft,
                                 const dt_param_info *lt, const float *src, float *dst, float *tmp, bool to_all);

/* Vocabulary-parallel softmax cross-entropy (Megatron's) on device d (device.h xent_shard): a's
 * logits (N, Vl) hold vocabulary columns [lo, lo + Vl) of the rank; y (host, N) are the global
 * target ids (ignore: does not count), uploaded into a->targets unless that is y itself (host
 * memory). Two allreduces over comm (row maxima; sums of exponentials with the target logits) of
 * a->rows, in place, or through host (3N floats) where the transport does not take d's memory
 * (host non-NULL); the full logits never leave the rank. Into d's memory: *a->loss = mean over
 * counted rows (0 when none), *a->counted their number; dlogits = scale x d mean / d logits.
 * DT_EINVAL naming a target outside [0, vocab). */
dt_status dt_tp_xent(dt_comm *comm, dt_dev *d, float *host, const int32_t *y, int vocab, const dt_xent_shard_args *a);

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

/* Rank r of K's shard of whole tensor ft (its local values at lb, dt_tp_copy's layout) as pieces
 * of the whole tensor, named name (optim: a moment), to fn. */
dt_status dt_tp_visit_shard(const dt_model *m, int K, int r, dt_state_visit_fn fn, void *ctx, const char *name,
                            const dt_param_info *ft, float *lb, bool optim);

struct dt_strategy;
/* The counters of a "tp" strategy, or of a pipeline stage of a tp x pp mesh (zeros for any other). */
void dt_tp_counters_of(const struct dt_strategy *s, dt_tp_counters *c);

/* ---- the collectives of a shard as node hooks (tp_hooks.c) ---- */

typedef struct dt_tp_hooks dt_tp_hooks;

/* Installs on local (rank r of K's shard, dt_model_create_tp_shard; g: the GPT's config, or NULL
 * for a model without vocabulary-parallel nodes) the node hooks that run tensor parallelism's
 * collectives over comm (K ranks; NULL or K 1: none) where its nodes' marks say: four allreduces
 * per GPT block, the vocabulary-parallel embedding and head. world_rank names this rank in errors; trace
 * (may be NULL) records each allreduce at step *step. The hooks hold the first failure of a
 * collective (dt_tp_hooks_status): every later one is skipped. */
dt_status dt_tp_hooks_create(dt_tp_hooks **h, dt_model *local, const dt_gpt_config *g, dt_comm *comm, int K, int r,
                             int world_rank, dt_trace *trace, const int64_t *step);
void dt_tp_hooks_destroy(dt_tp_hooks *h);
/* Re-installs the hooks after another strategy on local set its own (tp's inner ZeRO-2 sets a
 * before-backward hook), calling those too: the shard's collectives first after a backward. */
void dt_tp_hooks_chain(dt_tp_hooks *h);
/* Maps samples [lo, lo + n) of a step of `total` samples (x: their global token ids, n x T) into
 * the rank's vocabulary slice (foreign ids: row 0, masked). DT_EINVAL for an id outside the
 * vocabulary, as the whole model's embedding says it. */
dt_status dt_tp_hooks_map(dt_tp_hooks *h, const int32_t *x, int lo, int n, int total);
/* The mapped ids of sample lo on (the feed of the shard's embedding). */
const int32_t *dt_tp_hooks_ids(const dt_tp_hooks *h, int lo);
/* The samples [lo, lo + n) of the step that the next forward or backward of local runs. */
void dt_tp_hooks_select(dt_tp_hooks *h, int lo, int n);
/* The vocabulary-parallel loss of local's last output (n samples' logits of the rank's slice)
 * against targets y (n x T global ids): *loss the mean, the logits' gradient (scale x d mean)
 * in dt_tp_hooks_dlogits. Collective over the tp axis. */
dt_status dt_tp_hooks_loss(dt_tp_hooks *h, const int32_t *y, int n, float scale, double *loss);
const float *dt_tp_hooks_dlogits(const dt_tp_hooks *h);
/* After dt_tp_hooks_loss of the same n samples: adds to *correct the rows whose largest logit
 * over the whole vocabulary (the first of equal ones) is the target y (n x T global ids), as
 * dt_model_count_correct of the whole model. Collective over the tp axis (two allreduces of n x T). */
dt_status dt_tp_hooks_correct(dt_tp_hooks *h, const int32_t *y, int n, int64_t *correct);
/* The first failure of a hook's collective (DT_OK: none). */
dt_status dt_tp_hooks_status(const dt_tp_hooks *h);
/* Seconds spent in the tp collectives since the last call. */
double dt_tp_hooks_take_comm_s(dt_tp_hooks *h);
/* The hooks' byte counters into c (c->dp_bytes is kept). */
void dt_tp_hooks_counters(const dt_tp_hooks *h, dt_tp_counters *c);
/* Whether tensor `name` of tp rank r counts in the norm of the whole gradient (each shard once,
 * a replicated tensor on rank 0 only). */
bool dt_tp_in_norm(const dt_model *m, const char *name, int r);

/* ---- ZeRO over the dp axis of the mesh (tp_zero.c; tp(tp=K,zero=1|2|3)) ---- */

/* The ranges of the local slab that dp rank r of N owns under ZeRO on ddp's buckets of
 * bucket_mb (as zero.c cuts them), in the order its optimizer packs them. */
typedef struct {
    int n;
    size_t *off, *len, total;
} dt_tp_zero_part;
dt_status dt_tp_zero_ranges(dt_model *local, double bucket_mb, int r, int N, dt_tp_zero_part *p);
void dt_tp_zero_part_free(dt_tp_zero_part *p);
/* A whole local optimizer (dt_optim_destroy it; on local's device) holding lo's packed moments (part
 * mine) in place, zeros elsewhere; dt_tp_zero_pack copies part mine of it back into lo (and its
 * step count). */
dt_status dt_tp_zero_expand(dt_model *local, dt_optim *lo, const dt_tp_zero_part *mine, dt_optim **out);
void dt_tp_zero_pack(dt_model *local, dt_optim *whole, dt_optim *lo, const dt_tp_zero_part *mine);
/* Collective over the dp axis dp: every dp rank's packed moments of lo to dp rank 0, which gets
 * a whole local optimizer holding them all (*out; NULL on the other ranks). */
dt_status dt_tp_zero_collect(dt_comm *dp, dt_model *local, dt_optim *lo, double bucket_mb, dt_optim **out);
/* Appends to out the runs of gradient values g[0..n) (local slab [off, off + n)) that count in the
 * norm of the whole gradient on tp rank r (dt_tp_in_norm). */
dt_status dt_tp_zero_norm_pieces(const dt_model *local, int r, size_t off, float *g, size_t n, dt_grad_pieces *out);

#endif
