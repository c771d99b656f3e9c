/* The training state of a tensor-parallel rank for checkpoints (tp.h): after a sync, on world rank
 * 0, the whole model's tensors with the whole optimizer moments (one file, as 1 worker's); before
 * one (a resume right after the strategy is made, on every rank) the rank's own shards as pieces
 * of the whole tensors (DCP style), so that they are restored in place. */
#include "parallel/tp.h"

#include <stdio.h>

/* Piece [off, off + n) of whole tensor ft, held at buf. */
static dt_status piece(dt_state_visit_fn fn, void *ctx, const char *name, const dt_param_info *ft, float *buf,
                       size_t off, size_t n, bool optim) {
    dt_state_piece p = {.name = name,
                        .buf = {buf, DT_F32, n, DT_DEVICE_CPU},
                        .ndim = ft->ndim,
                        .numel = ft->numel,
                        .offset = off,
                        .is_optim = optim};
    for (int d = 0; d < ft->ndim; d++) p.shape[d] = ft->shape[d];
    return fn(ctx, &p);
}

dt_status dt_tp_visit_shard(const dt_model *m, int Ki, int ri, dt_state_visit_fn fn, void *ctx, const char *name,
                            const dt_param_info *ft, float *lb, bool optim) {
    const size_t R = (size_t)ft->shape[0], Cc = ft->numel / R, K = (size_t)Ki, r = (size_t)ri;
    switch (dt_tp_split_of(m, ft->name)) {
    case DT_TP_REPL: return piece(fn, ctx, name, ft, lb, 0, ft->numel, optim);
    case DT_TP_RANK0: return r == 0 ? piece(fn, ctx, name, ft, lb, 0, ft->numel, optim) : DT_OK;
    case DT_TP_ROWS: return piece(fn, ctx, name, ft, lb, r * (R / K) * Cc, R / K * Cc, optim);
    case DT_TP_ROWS3:
        for (size_t j = 0, lr = R / 3 / K; j < 3; j++)
            DT_TRY(piece(fn, ctx, name, ft, lb + j * lr * Cc, (j * (R / 3) + r * lr) * Cc, lr * Cc, optim));
        return DT_OK;
    case DT_TP_COLS:
        for (size_t row = 0, lc = Cc / K; row < R; row++)
            DT_TRY(piece(fn, ctx, name, ft, lb + row * lc, row * Cc + r * lc, lc, optim));
        return DT_OK;
    }
    return DT_OK;
}

/* Before a sync (a resume right after the strategy is made): this rank's shards, each with its
 * optimizer moments, as pieces of the whole tensors (DCP style), restored in place. */
static dt_status visit_shards(dt_model *full, dt_model *local, dt_optim *lo, int K, int r, dt_state_visit_fn fn,
                              void *ctx) {
    for (int j = 0; j < dt_model_num_tensors(local); j++) {
        const dt_param_info *lt = dt_model_tensor(local, j);
        const int i = dt_model_find_tensor(full, lt->name);
        if (i < 0) return dt_error(DT_EINTERNAL, "tensor parallel: '%s' is not in the whole model", lt->name);
        const dt_param_info *ft = dt_model_tensor(full, i);
        float *lb = lt->is_buffer ? dt_model_buffers(local) : dt_model_params(local);
        DT_TRY(dt_tp_visit_shard(local, K, r, fn, ctx, ft->name, ft, lb + lt->offset, false));
        for (int k = 0; !lt->is_buffer && k < dt_optim_num_states(lo); k++) {
            const char *sname;
            float *st = dt_optim_state(lo, k, &sname);
            char name[96];
            snprintf(name, sizeof name, "optim.%s.%s", sname, ft->name);
            DT_TRY(dt_tp_visit_shard(local, K, r, fn, ctx, name, ft, st + lt->offset, true));
        }
    }
    return DT_OK;
}

/* The state: for a checkpoint (world rank 0 after sync, which every save follows) the whole
 * model's tensors, each with its whole optimizer moments; before that (or on another rank) the
 * rank's shards as pieces. */
dt_status dt_tp_visit_state(dt_model *full, dt_model *local, dt_optim *lo, int K, int r, bool whole,
                            float *const *moments, dt_state_visit_fn fn, void *ctx) {
    const int ns = dt_optim_num_states(lo);
    if (!whole) return visit_shards(full, local, lo, K, r, fn, ctx);
    dt_model *m = full;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *p = dt_model_tensor(m, i);
        float *base = p->is_buffer ? dt_model_buffers(m) : dt_model_params(m);
        dt_state_piece pc = {.name = p->name,
                             .buf = {base + p->offset, DT_F32, p->numel, DT_DEVICE_CPU},
                             .ndim = p->ndim,
                             .numel = p->numel};
        for (int d = 0; d < p->ndim; d++) pc.shape[d] = p->shape[d];
        DT_TRY(fn(ctx, &pc));
        for (int k = 0; !p->is_buffer && k < ns; k++) {
            const char *sname;
            dt_optim_state(lo, k, &sname);
            char name[96];
            snprintf(name, sizeof name, "optim.%s.%s", sname, p->name);
            pc.name = name, pc.buf.data = moments[k] + p->offset, pc.is_optim = true;
            DT_TRY(fn(ctx, &pc));
        }
    }
    return DT_OK;
}
