/* ZeRO (zero.c, zero_params.c, zero_state.c): data parallelism that shards the optimizer state
 * (stage 1), the gradients (stage 2) and the parameters (stage 3) over the ranks, on ddp's
 * buckets, and the bucket plan ddp exports for it. */
#ifndef DT_PARALLEL_ZERO_H
#define DT_PARALLEL_ZERO_H

#include "parallel/strategy.h"

/* One bucket: the slab range [lo, hi). */
typedef struct {
    size_t lo, hi;
} dt_ddp_range;

/* ddp's buckets of model m at a cap of bucket_mb MB (<= 0: 1 MB): slab ranges from the end of
 * the slab towards its start, each closing at a layer boundary once it reaches the cap, so they
 * complete in index order during backward. *out (caller frees) gets *nb ranges; DT_EINVAL for a
 * model without parameters. */
dt_status dt_ddp_buckets(dt_model *m, double bucket_mb, dt_ddp_range **out, int *nb);

/* Parses a ZeRO stage "0".."3" (the zero= option, --zero); DT_EINVAL saying what to write. */
dt_status dt_zero_parse_stage(const char *text, int *stage);

/* Makes s (comm, model, optim set) a ZeRO strategy of stage 1..3 on ddp's buckets of bucket_mb:
 * shards the optimizer (dt_optim_shard) and, from init on, frees the gradient (stage >= 2) and
 * parameter (stage 3) memory this rank does not own. */
dt_status dt_zero_create(dt_strategy *s, double bucket_mb, int stage);

/* ddp(update=shard): s (comm, model, optim set) keeps ddp's replicas, results and checkpoints, but
 * each step reduce-scatters the gradient buckets, updates only this rank's shard (ZeRO stage 1's
 * step, the optimizer kept whole) and all-gathers the parameters: the bytes of one allreduce and
 * 1/N of the optimizer's work. The moments outside the shard are stale until the strategy's sync
 * (before a checkpoint) gathers them. */
dt_status dt_zero_create_update(dt_strategy *s, double bucket_mb);

/* The shard of a bucket of n values that rank r of N owns: [*off, *off + *len) relative to the
 * bucket start: N equal chunks of n / N, the remainder (< N) to the last rank. */
void dt_zero_chunk(size_t n, int r, int N, size_t *off, size_t *len);

/* Stage 3's placement (ddp's entry.place): the ranges of m's parameter slab that rank of size
 * owns, its chunk of each of ddp's buckets at bucket_mb, in slab order (*own malloc'd). The model
 * is placed to them before it is initialised, so no rank ever holds the whole model; dt_zero_create
 * takes a model placed so. DT_ENOMEM, DT_EINVAL for a model without parameters. */
dt_status dt_zero_place(const dt_model *m, double bucket_mb, int rank, int size, dt_range **own, int *nown);

/* Gradient buckets a rank of ZeRO stage (2 or 3) lets reduce while backward fills the next one
 * (stage 3: one, so its gradients in flight are two buckets, as its parameter gathers are). */
int dt_zero_inflight_cap(int stage);

/* ddp's entry.mem_plan (ZeRO over the dp axis of any layout): where sh->zero > 0 and sh->dp > 1,
 * the values of the slab that dp rank sh->dp_rank's chunks of ddp's buckets at sh->bucket_mb own,
 * the largest buckets (a sh->tp-th) and dt_zero_inflight_cap; DT_ENOMEM. */
dt_status dt_zero_mem_plan(dt_model *m, dt_mem_share *sh);

#endif
