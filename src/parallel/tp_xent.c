/* The vocabulary-parallel cross-entropy of tensor parallelism (Megatron-LM's
 * vocab_parallel_cross_entropy): each rank holds the logits of its slice of the vocabulary; the
 * row maxima, the sums of exponentials and the target logits are reduced across the ranks (two
 * allreduces of N and 2N floats), so the (N, V) logits are never gathered. The arithmetic is the
 * device's (xent_shard, in three phases); the two reductions run on its memory in place, or through
 * a host buffer where the transport does not take it. */
#include "parallel/tp.h"

/* An allreduce over comm of n floats of device memory x: in place, or staged through host. */
static dt_status reduce_rows(dt_comm *comm, dt_dev *d, float *host, float *x, size_t n, dt_redop op) {
    if (!host) return dt_comm_allreduce(comm, x, x, n, DT_F32, op);
    d->ops->download(d, host, x, n * sizeof(float));
    DT_TRY(dt_comm_allreduce(comm, host, host, n, DT_F32, op));
    d->ops->upload(d, x, host, n * sizeof(float));
    return DT_OK;
}

dt_status dt_tp_xent(dt_comm *comm, dt_dev *d, float *host, const int32_t *y, int vocab, const dt_xent_shard_args *a) {
    for (int i = 0; i < a->N; i++)
        if (y[i] != a->ignore && (y[i] < 0 || y[i] >= vocab))
            return dt_error(DT_EINVAL, "model: node 'loss': target %d of row %d is outside [0, %d) (the vocabulary)",
                            y[i], i, vocab);
    if (!d->ops->xent_shard)
        return dt_error(DT_ENOTSUP,
                        "device %s has no vocabulary-parallel loss (xent_shard) yet: tp's GPT does not run "
                        "on it; use `device` cpu or another strategy",
                        d->kind->name);
    if (a->targets != y) d->ops->upload(d, (int32_t *)a->targets, y, (size_t)a->N * sizeof *y);
    d->ops->xent_shard(d, DT_XENT_MAX, a);
    if (comm) DT_TRY(reduce_rows(comm, d, host, a->rows, (size_t)a->N, DT_OP_MAX));
    d->ops->xent_shard(d, DT_XENT_SUMS, a);
    if (comm) DT_TRY(reduce_rows(comm, d, host, a->rows + a->N, 2 * (size_t)a->N, DT_OP_SUM));
    d->ops->xent_shard(d, DT_XENT_GRAD, a);
    return DT_OK;
}
