/* ZeRO's training state for checkpoints. sync (collective, before evaluation and checkpoints)
 * gathers the whole model (stage 3) and every rank's optimizer shard into whole moment slabs on
 * rank 0; rank 0's visitor then reports whole tensors, so the checkpoint is the same file a
 * replicated run writes and resumes at any world size, with or without ZeRO (the trainer
 * restores it before the strategy shards it again). */
#include "parallel/zero_internal.h"

#include <stdio.h>
#include <string.h>

enum { TAIL_TAG = 0x1a30 };

/* Gathers optimizer state slab k (this rank's packed shard) into z->ofull[k] on rank 0. */
static dt_status gather_state(dt_strategy *s, zero *z, int k) {
    float *sh = dt_optim_state(s->optim, k, NULL);
    float *full = z->r == 0 ? z->ofull[k].data : NULL;
    for (int i = 0; i < z->nb; i++) {
        const zbucket *b = &z->b[i];
        if (b->c) DT_TRY(dt_comm_gather(s->comm, sh + b->at, full ? full + b->lo : NULL, b->c, DT_F32, 0));
        if (!b->tail) continue;
        float *t = full ? full + b->lo + (size_t)z->N * b->c : NULL;
        if (z->r == z->N - 1) DT_TRY(dt_comm_send(s->comm, sh + b->at + b->c, b->tail, DT_F32, 0, TAIL_TAG));
        else if (z->r == 0) DT_TRY(dt_comm_recv(s->comm, t, b->tail, DT_F32, z->N - 1, TAIL_TAG));
    }
    return DT_OK;
}

dt_status dt_zero_sync(dt_strategy *s) {
    zero *z = s->impl;
    if (z->stage == 3 && !z->full) DT_TRY(dt_zero_params_gather_all(s, z));
    if (z->ofull_ok) return DT_OK;
    const int ns = dt_optim_num_states(s->optim);
    for (int k = 0; k < ns; k++) {
        if (z->r == 0 && !z->ofull[k].data) DT_TRY(dt_slab_alloc(&z->ofull[k], dt_model_num_params(s->model)));
        DT_TRY(gather_state(s, z, k));
    }
    z->ofull_ok = z->r == 0;
    return DT_OK;
}

dt_status dt_zero_visit_state(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    zero *z = s->impl;
    dt_model *m = s->model;
    if (!z->ofull_ok)
        return dt_error(DT_EINVAL, "ZeRO-%d: the state of rank %d is a shard; run the strategy's sync on every rank "
                        "first (rank 0 then holds it whole)", z->stage, z->r);
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        float *base = t->is_buffer ? dt_model_buffers(m) : dt_model_params(m);
        dt_state_piece p = {.name = t->name, .buf = {base + t->offset, DT_F32, t->numel, DT_DEVICE_CPU},
                            .ndim = t->ndim, .numel = t->numel};
        for (int d = 0; d < t->ndim; d++) p.shape[d] = t->shape[d];
        DT_TRY(fn(ctx, &p));
        for (int k = 0; !t->is_buffer && k < dt_optim_num_states(s->optim); k++) {
            const char *sname;
            dt_optim_state(s->optim, k, &sname);
            char name[96];
            snprintf(name, sizeof name, "optim.%s.%s", sname, t->name);
            p.name = name, p.buf.data = z->ofull[k].data + t->offset, p.is_optim = true;
            DT_TRY(fn(ctx, &p));
        }
    }
    return DT_OK;
}
