/* ZeRO's blocks on a device whose memory is not the host's (zero.blocks). A device block cannot be
 * given back in part, so where the CPU device gives a bucket's pages back to the OS, these hold the
 * bucket in a block of its own, bound into the graph (dt_model_bind_param/grad):
 *   stage 2-3: the model's whole gradient block is freed; a bucket's gradient block is made
 *              (zeroed) before backward first writes it and freed once its reduce has its values;
 *   stage 3:   the model's whole parameter block is freed after this rank's chunks are copied into
 *              a packed shard (as the gradient shard); zero_params.c gathers a bucket into a
 *              staging block before a node runs and frees it after.
 * So a rank holds 4Ψ + 12Ψ/N (stage 2, Adam) or 16Ψ/N (stage 3) besides the buckets in flight,
 * as on the CPU device. */
#include "nn/graph_parallel.h"
#include "parallel/zero_internal.h"

#include <stdlib.h>

dt_status dt_zero_blocks_plan(dt_strategy *s, zero *z) {
    dt_model *m = s->model;
    const int nt = dt_model_num_tensors(m);
    for (int i = 0; i < z->nb; i++) { /* the tensors of each bucket (their offsets increase in table order) */
        zbucket *b = &z->b[i];
        b->t0 = nt, b->t1 = 0;
        for (int t = 0; t < nt; t++) {
            const dt_param_info *p = dt_model_tensor(m, t);
            if (p->is_buffer || p->numel == 0 || p->offset < b->lo || p->offset >= b->hi) continue;
            if (t < b->t0) b->t0 = t;
            b->t1 = t + 1;
        }
    }
    if (z->stage < 3) return DT_OK;
    if (!(z->psh = z->md->ops->alloc(z->md, (z->nsh ? z->nsh : 1) * sizeof(float))))
        return dt_error_wrap(DT_ENOMEM, "zero: the parameter shard of %zu values on device %s", z->nsh,
                             z->md->kind->name);
    return DT_OK;
}

dt_status dt_zero_blocks_init(dt_strategy *s, zero *z) {
    dt_dev *d = z->md;
    dt_model_release_grads(s->model); /* backward writes each bucket's own block */
    if (z->stage < 3) return DT_OK;
    float *p = dt_model_take_params(s->model);
    for (int i = 0; i < z->nb; i++)
        if (z->b[i].own_n) d->ops->copy(d, z->psh + z->b[i].at, p + z->b[i].own, z->b[i].own_n * sizeof(float));
    d->ops->free(d, p);
    return DT_OK;
}

/* Binds (or with NULL unbinds) the gradients of bucket i's tensors to block g. */
static void bind_grads(dt_strategy *s, zero *z, int i, float *g) {
    const zbucket *b = &z->b[i];
    for (int t = b->t0; t < b->t1; t++) {
        const dt_param_info *p = dt_model_tensor(s->model, t);
        if (p->is_buffer) continue;
        dt_zero_hook_error(z, dt_model_bind_grad(s->model, t, g ? g + (p->offset - b->lo) : NULL), "gradient block", i);
    }
}

float *dt_zero_grad_block(dt_strategy *s, zero *z, int i) {
    zbucket *b = &z->b[i];
    if (b->gblk) return b->gblk;
    dt_dev *d = z->md;
    if (!(b->gblk = d->ops->alloc(d, (b->hi - b->lo) * sizeof(float)))) {
        dt_zero_hook_error(z, DT_ENOMEM, "gradient block", i);
        return NULL;
    }
    d->ops->fill_f32(d, b->gblk, 0.0f, b->hi - b->lo);
    bind_grads(s, z, i, b->gblk);
    b->gfree = false;
    return b->gblk;
}

void dt_zero_grad_block_free(dt_strategy *s, zero *z, int i) {
    zbucket *b = &z->b[i];
    if (b->gblk) bind_grads(s, z, i, NULL), z->md->ops->free(z->md, b->gblk);
    b->gblk = NULL;
    b->gfree = true, b->grel = 0;
}

void dt_zero_param_bind(dt_strategy *s, zero *z, int i, bool bind) {
    zbucket *b = &z->b[i];
    for (int t = b->t0; t < b->t1; t++) {
        const dt_param_info *p = dt_model_tensor(s->model, t);
        if (p->is_buffer) continue;
        dt_zero_hook_error(z, dt_model_bind_param(s->model, t, bind ? b->pblk + (p->offset - b->lo) : NULL),
                           "parameter block", i);
    }
    if (bind) return;
    z->md->ops->free(z->md, b->pblk);
    b->pblk = NULL;
}

void dt_zero_blocks_free(dt_strategy *s, zero *z) {
    dt_dev *d = z->md;
    for (int i = 0; z->b && i < z->nb; i++) {
        if (z->b[i].gblk) dt_zero_grad_block_free(s, z, i);
        if (z->b[i].pblk) dt_zero_param_bind(s, z, i, false);
        dt_free(z->b[i].phost), z->b[i].phost = NULL;
    }
    if (z->pwhole) dt_zero_blocks_unwhole(s, z);
    d->ops->free(d, z->psh);
    z->psh = NULL;
}
