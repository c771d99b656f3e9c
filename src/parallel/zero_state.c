/* ZeRO's training state for checkpoints: each rank reports the pieces it owns (its chunk of every
 * bucket, cut at tensor boundaries: parameters and optimizer moments; rank 0 also the model's
 * buffers), so every value is written exactly once, by its owner, into that rank's shard of a
 * sharded checkpoint (run/ckpt_shard.c). sync gathers the whole model on every rank (stage 3)
 * for evaluation. ddp(update=shard) keeps ddp's checkpoints: sync gathers the optimizer moments. */
#include "parallel/zero_internal.h"

#include <stdio.h>
#include <string.h>

dt_status dt_zero_sync(dt_strategy *s) {
    zero *z = s->impl;
    if (z->stage == 3 && !z->full) DT_TRY(dt_zero_params_gather_all(s, z));
    return DT_OK;
}

/* The pieces of tensor t inside bucket b's shard: parameters, then each optimizer moment. */
static dt_status visit_owned(dt_strategy *s, const zero *z, const zbucket *b, const dt_param_info *t,
                             dt_state_visit_fn fn, void *ctx) {
    const size_t lo = b->own > t->offset ? b->own : t->offset;
    const size_t hi = b->own + b->own_n < t->offset + t->numel ? b->own + b->own_n : t->offset + t->numel;
    if (hi <= lo) return DT_OK;
    /* blocks (stage 3 on a device): the parameters in the packed shard, as the moments */
    float *par = z->psh ? z->psh + b->at + (lo - b->own) : dt_model_params(s->model) + lo;
    dt_state_piece p = {.name = t->name,
                        .buf = {par, DT_F32, hi - lo, DT_DEVICE_CPU},
                        .ndim = t->ndim,
                        .numel = t->numel,
                        .offset = lo - t->offset};
    for (int d = 0; d < t->ndim; d++) p.shape[d] = t->shape[d];
    DT_TRY(fn(ctx, &p));
    for (int k = 0; k < dt_optim_num_states(s->optim); k++) {
        const char *sname;
        float *st = dt_optim_state(s->optim, k, &sname);
        char name[96];
        snprintf(name, sizeof name, "optim.%s.%s", sname, t->name);
        p.name = name, p.buf.data = st + b->at + (lo - b->own), p.is_optim = true;
        DT_TRY(fn(ctx, &p));
    }
    return DT_OK;
}

dt_status dt_zero_visit_state(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    zero *z = s->impl;
    dt_model *m = s->model;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        if (t->is_buffer) {
            if (z->r != 0) continue;
            dt_state_piece p = {.name = t->name,
                                .buf = {dt_model_buffers(m) + t->offset, DT_F32, t->numel, DT_DEVICE_CPU},
                                .ndim = t->ndim,
                                .numel = t->numel};
            for (int d = 0; d < t->ndim; d++) p.shape[d] = t->shape[d];
            DT_TRY(fn(ctx, &p));
            continue;
        }
        for (int b = 0; b < z->nb; b++) DT_TRY(visit_owned(s, z, &z->b[b], t, fn, ctx));
    }
    return DT_OK;
}

dt_status dt_zero_replica_sync(dt_strategy *s) {
    zero *z = s->impl;
    for (int k = 0; k < dt_optim_num_states(s->optim); k++) {
        const char *name;
        dt_status st = dt_zero_gather_slab(s, z, dt_optim_state(s->optim, k, &name));
        if (st != DT_OK)
            return dt_error_wrap(st, "ddp (update=shard): the optimizer's '%s' moments, gathered for a checkpoint",
                                 name);
    }
    return DT_OK;
}

dt_status dt_zero_replica_visit(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    return dt_state_visit_model(s->model, s->optim, fn, ctx);
}
