/* ZeRO over the data-parallel axis of a tensor-parallel mesh (tp(tp=K,zero=1|2|3)): tp's inner
 * ddp(zero=N) shards the shard's optimizer state (and gradients, and parameters: its node hooks
 * chain with the shard's, tp_hooks.c) over the dp axis, cutting ddp's
 * buckets of the local model as zero.c does (dt_ddp_buckets, dt_zero_chunk: each dp rank's chunks
 * packed in bucket order). This file maps between that packed state and the whole local layout
 * that tp's gather (tp_shard.c) and state visitor (tp_state.c) read: a full local optimizer with
 * one rank's chunks in place (a resume restores into it, then packs back), or with every dp rank's
 * chunks (collected on dp rank 0 for rank 0's checkpoint). It also gives ZeRO's clip the part of a
 * shard's gradient that counts in the norm of the whole model (each tp shard once).
 *
 * On a device whose memory is not host memory (--device checked) the packed moments and the
 * gradient shard are device blocks: the mapping is the device's copy, the collected moments are
 * sent staged through host buffers (dt_strategy_staged) and uploaded into place on dp rank 0, and
 * the norm is one sqnorm partial per run of adjacent counted tensors. */
#include "parallel/tp.h"
#include "parallel/zero.h"

#include <stdlib.h>
#include <string.h>

dt_status dt_tp_zero_ranges(dt_model *local, double bucket_mb, int r, int N, dt_tp_zero_part *p) {
    memset(p, 0, sizeof *p);
    dt_ddp_range *b = NULL;
    int nb = 0;
    DT_TRY(dt_ddp_buckets(local, bucket_mb, &b, &nb));
    p->off = malloc((size_t)nb * sizeof *p->off), p->len = malloc((size_t)nb * sizeof *p->len);
    if (!p->off || !p->len) {
        free(b), dt_tp_zero_part_free(p);
        return dt_error(DT_ENOMEM, "tensor parallel with ZeRO: out of memory");
    }
    for (int i = 0; i < nb; i++) {
        size_t off, len;
        dt_zero_chunk(b[i].hi - b[i].lo, r, N, &off, &len);
        p->off[i] = b[i].lo + off, p->len[i] = len, p->total += len;
    }
    p->n = nb;
    free(b);
    return DT_OK;
}

void dt_tp_zero_part_free(dt_tp_zero_part *p) {
    free(p->off), free(p->len);
    memset(p, 0, sizeof *p);
}

/* Copies the packed values pk of part p into (to_full) or out of the whole local slab full, both
 * memory of device d (pk_host: pk is host memory); on host memory memcpy. */
static void move_part(dt_dev *d, bool pk_host, const dt_tp_zero_part *p, float *full, float *pk, bool to_full) {
    size_t at = 0;
    for (int i = 0; i < p->n; at += p->len[i++]) {
        float *f = full + p->off[i], *k = pk + at;
        const size_t bytes = p->len[i] * sizeof(float);
        if (d->host_memory) memcpy(to_full ? f : k, to_full ? k : f, bytes);
        else if (!pk_host) d->ops->copy(d, to_full ? f : k, to_full ? k : f, bytes);
        else if (to_full) d->ops->upload(d, f, k, bytes);
        else d->ops->download(d, k, f, bytes);
    }
}

/* A whole local optimizer like lo (zeros, lo's step count), on local's device. */
static dt_status whole_like(dt_model *local, dt_optim *lo, dt_optim **out) {
    DT_TRY(dt_optim_create(out, dt_optim_config_of(lo), dt_model_num_params(local)));
    dt_optim_set_steps(*out, dt_optim_steps(lo));
    dt_status st = dt_optim_set_device(*out, dt_model_device(local));
    if (st != DT_OK) dt_optim_destroy(*out), *out = NULL;
    return st;
}

dt_status dt_tp_zero_expand(dt_model *local, dt_optim *lo, const dt_tp_zero_part *mine, dt_optim **out) {
    DT_TRY(whole_like(local, lo, out));
    for (int k = 0; k < dt_optim_num_states(lo); k++)
        move_part(dt_model_device(local), false, mine, dt_optim_state(*out, k, NULL), dt_optim_state(lo, k, NULL),
                  true);
    return DT_OK;
}

void dt_tp_zero_pack(dt_model *local, dt_optim *whole, dt_optim *lo, const dt_tp_zero_part *mine) {
    for (int k = 0; k < dt_optim_num_states(lo); k++)
        move_part(dt_model_device(local), false, mine, dt_optim_state(whole, k, NULL), dt_optim_state(lo, k, NULL),
                  false);
    dt_optim_set_steps(lo, dt_optim_steps(whole));
}

enum { TAG_MOMENTS = 7301 };

static dt_status send_fn(dt_comm *comm, float *buf, size_t n, void *arg) {
    return dt_comm_send(comm, buf, n, DT_F32, 0, *(const int *)arg);
}

dt_status dt_tp_zero_collect(dt_comm *dp, dt_model *local, dt_optim *lo, double bucket_mb, dt_optim **out) {
    *out = NULL;
    const int N = dt_comm_size(dp), me = dt_comm_rank(dp), ns = dt_optim_num_states(lo);
    dt_tp_zero_part p;
    if (me != 0) { /* send this rank's packed moments to dp rank 0 */
        DT_TRY(dt_tp_zero_ranges(local, bucket_mb, me, N, &p));
        dt_status st = DT_OK;
        for (int k = 0, tag = TAG_MOMENTS; st == DT_OK && k < ns; k++, tag++) /* staged where dp does not take it */
            st = dt_strategy_staged(dp, local, dt_optim_state(lo, k, NULL), p.total, NULL, NULL, DT_STAGE_DOWN, send_fn,
                                    &tag);
        dt_tp_zero_part_free(&p);
        return st;
    }
    DT_TRY(whole_like(local, lo, out));
    float *tmp = NULL;
    dt_status st = DT_OK;
    for (int j = 0; st == DT_OK && j < N; j++) {
        if ((st = dt_tp_zero_ranges(local, bucket_mb, j, N, &p)) != DT_OK) break;
        if (j > 0 && !(tmp = realloc(tmp, (p.total ? p.total : 1) * sizeof(float))))
            st = dt_error(DT_ENOMEM, "tensor parallel with ZeRO: out of memory collecting the optimizer state");
        for (int k = 0; st == DT_OK && k < ns; k++) {
            if (j > 0) st = dt_comm_recv(dp, tmp, p.total, DT_F32, j, TAG_MOMENTS + k);
            if (st == DT_OK) /* the others' received into host memory */
                move_part(dt_model_device(local), j > 0, &p, dt_optim_state(*out, k, NULL),
                          j > 0 ? tmp : dt_optim_state(lo, k, NULL), true);
        }
        dt_tp_zero_part_free(&p);
    }
    free(tmp);
    if (st != DT_OK) dt_optim_destroy(*out), *out = NULL;
    return st;
}

dt_status dt_tp_zero_norm_pieces(const dt_model *local, int r, size_t off, float *g, size_t n, dt_grad_pieces *out) {
    size_t lo = 0, hi = 0; /* the current run of counted values, slab offsets */
    for (int i = 0; i < dt_model_num_tensors(local); i++) {
        const dt_param_info *t = dt_model_tensor(local, i);
        if (t->is_buffer || !dt_tp_in_norm(local, t->name, r)) continue;
        const size_t a = t->offset > off ? t->offset : off;
        const size_t e = t->offset + t->numel < off + n ? t->offset + t->numel : off + n;
        if (a >= e) continue;
        if (hi > lo && a == hi) {
            hi = e;
            continue;
        }
        if (hi > lo) DT_TRY(dt_grad_pieces_add(out, g + (lo - off), hi - lo));
        lo = a, hi = e;
    }
    return hi > lo ? dt_grad_pieces_add(out, g + (lo - off), hi - lo) : DT_OK;
}
