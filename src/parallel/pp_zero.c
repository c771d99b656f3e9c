/* ZeRO over the data-parallel axis of a pipeline (pp(stages=K,zero=1|2|3), with or without tp;
 * stage 3's parameter gathers are pp_zero3.c's):
 * each of a stage's DP ranks keeps the optimizer moments of its chunk of every segment only
 * (dt_zero_chunk: DP equal chunks, the remainder to the last rank), updates that chunk after the
 * DP average and the clip, and the chunks are then all-gathered, so every replica of the stage
 * holds the same parameters. The segments are ranges of the stage model's slab (p->m: under tp
 * the rank's GPT shard), so tp x pp shards its local tensors the same way. For checkpoints, sync
 * collects the chunks' moments on DP rank 0 (whose stages send them on to rank 0) into whole
 * segment optimizers, which the next step frees again.
 *
 * ZeRO-2 adds the gradients: after the step's last micro-batch each segment is reduce-scattered
 * (averaged) into this rank's packed chunk (p->gsh), and the segment's gradient pages are given
 * back to the OS. The micro-batches accumulate into the stage's whole gradient slab first: one
 * reduce-scatter per step, not one per micro-batch (M x the traffic, which is why DeepSpeed
 * refuses ZeRO-2 with its pipeline). Memory per rank, Psi = the stage's parameters, N = DP, f32
 * Adam: during the step 4 Psi (parameters) + 4 Psi (whole gradients, while backward runs) +
 * 4 Psi/N (gradient shard) + 8 Psi/N (moments) = 8 Psi + 12 Psi/N, against the paper's
 * 4 Psi + 12 Psi/N (which needs each bucket reduced and freed during every micro-batch's
 * backward); between steps (evaluation, checkpoints) it is 4 Psi + 12 Psi/N.
 *
 * On a device whose memory is not host memory (p->on_dev; stage 3's gathers: pp_zero3.c): a
 * segment's optimizer is remade with its chunk's moments on the device, the gradient shard is a
 * device block, a segment's gradients are zeroed with fill_f32 instead of given back, the
 * reduce-scatter and the allgather run on host copies of the segment (p->host: download, the
 * collective, upload), and the norm is the device's sqnorm of the chunk's runs. On cpu nothing of
 * this changes the arithmetic or the copies made before. */
#include "device/device.h"
#include "parallel/pp.h"
#include "parallel/zero.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_PP_ZERO = 7400, PAGE = 4096 };

/* ZeRO-2: gives back segment sg's gradient pages (they read as zeros) and zeros its values on the
 * pages it shares with neighbours: its gradients are zero afterwards, for the next step. */
static size_t release_grads(dt_pp *p, float *g, const dt_pp_segment *sg) {
    if (p->on_dev) { /* a device block cannot give pages back: zeroed */
        p->dev->ops->fill_f32(p->dev, g + sg->lo, 0.0f, sg->hi - sg->lo);
        return 0;
    }
    char *lo = (char *)(g + sg->lo), *hi = (char *)(g + sg->hi);
    const size_t rel = dt_mem_release(lo, (size_t)(hi - lo));
    char *a = (char *)(((uintptr_t)lo + PAGE - 1) & ~(uintptr_t)(PAGE - 1)), *e = rel ? a + rel : hi;
    memset(lo, 0, (size_t)((rel ? a : hi) - lo));
    if (rel) memset(e, 0, (size_t)(hi - e));
    return rel;
}

/* On a device: segment sg's optimizer remade with its chunk's moments only (dt_optim_shard packs
 * host slabs), copied on the device from the whole segment's (a resumed run's). */
static dt_status shard_on_device(dt_pp *p, dt_pp_segment *sg) {
    dt_optim *o = NULL;
    DT_TRY(dt_optim_create(&o, dt_optim_config_of(sg->opt), sg->zlen));
    dt_status st = dt_optim_set_device(o, p->dev);
    if (st != DT_OK) return dt_optim_destroy(o), st;
    dt_optim_set_steps(o, dt_optim_steps(sg->opt));
    for (int k = 0; k < dt_optim_num_states(o); k++)
        p->dev->ops->copy(p->dev, dt_optim_state(o, k, NULL), dt_optim_state(sg->opt, k, NULL) + sg->zoff,
                          sg->zlen * sizeof(float));
    dt_optim_destroy(sg->opt);
    sg->opt = o;
    return DT_OK;
}

/* The ZeRO-2 gradient shard of `at` floats, zeroed: a device block on a device. */
static dt_status alloc_gsh(dt_pp *p, size_t at) {
    const size_t n = at ? at : 1;
    p->gsh = p->on_dev ? p->dev->ops->alloc(p->dev, n * sizeof(float)) : dt_alloc(n * sizeof(float));
    if (!p->gsh)
        return dt_mem_limit_hit() ? dt_error_wrap(DT_ENOMEM, "pipeline stage %d: the ZeRO-2 gradient shard", p->stage)
                                  : dt_error(DT_ENOMEM, "pp: out of memory for the ZeRO-2 gradient shard");
    if (p->on_dev) p->dev->ops->fill_f32(p->dev, p->gsh, 0.0f, n);
    else memset(p->gsh, 0, n * sizeof(float));
    return DT_OK;
}

dt_status dt_pp_zero_shard(dt_pp *p) {
    size_t at = 0;
    for (int q = 0; q < p->nseg; q++) {
        dt_pp_segment *sg = &p->seg[q];
        dt_zero_chunk(sg->hi - sg->lo, p->dp_i, p->DP, &sg->zoff, &sg->zlen);
        sg->zero = true, sg->gat = at, at += sg->zlen;
        if (sg->opt && p->on_dev) DT_TRY(shard_on_device(p, sg));
        else if (sg->opt) DT_TRY(dt_optim_shard(sg->opt, 1, &sg->zoff, &sg->zlen));
    }
    if (p->o.zero < 2) return DT_OK;
    DT_TRY(alloc_gsh(p, at));
    float *g = dt_model_grads(p->m); /* nothing written yet: the pages go back until backward needs them */
    for (int q = 0; q < p->nseg; q++) p->grel += release_grads(p, g, &p->seg[q]);
    return DT_OK;
}

dt_status dt_pp_zero_reacquire(dt_pp *p) {
    const size_t n = p->grel;
    p->grel = 0;
    if (!n || dt_mem_reacquire(n) == DT_OK) return DT_OK;
    return dt_error_wrap(DT_ENOMEM,
                         "pipeline stage %d (rank %d): ZeRO-2 holds the stage's whole gradients while its "
                         "micro-batches accumulate (%zu bytes given back between steps); raise `mem_limit` or use more "
                         "stages (`pp`)",
                         p->stage, p->rank, n);
}

/* Segment sg's reduce-scatter on a host copy (p->host: the segment, then the chunk's c floats):
 * downloaded, reduced, this rank's part uploaded into its chunk of p->gsh. */
static dt_status reduce_staged(dt_pp *p, const float *g, const dt_pp_segment *sg) {
    dt_dev *d = p->dev;
    const size_t n = sg->hi - sg->lo, c = n / (size_t)p->DP, tail = n - c * (size_t)p->DP;
    DT_TRY(dt_pp_host_room(p, n + c));
    float *h = p->host, *t = h + c * (size_t)p->DP, *out = h + n;
    d->ops->download(d, h, g + sg->lo, n * sizeof(float));
    dt_status st = c ? dt_comm_reduce_scatter(p->dp, h, out, c, DT_F32, DT_OP_AVG) : DT_OK;
    if (st == DT_OK && tail) st = dt_comm_allreduce(p->dp, t, t, tail, DT_F32, DT_OP_AVG);
    if (st != DT_OK) return st;
    if (c) d->ops->upload(d, p->gsh + sg->gat, out, c * sizeof(float));
    if (tail && p->dp_i == p->DP - 1) d->ops->upload(d, p->gsh + sg->gat + c, t, tail * sizeof(float));
    return DT_OK;
}

dt_status dt_pp_zero_reduce(dt_pp *p, float *g) {
    dt_status st = DT_OK;
    for (int q = 0; st == DT_OK && q < p->nseg; q++) {
        const dt_pp_segment *sg = &p->seg[q];
        if (dt_strategy_stage_device(p->dp, p->m)) {
            if ((st = reduce_staged(p, g, sg)) == DT_OK) p->grel += release_grads(p, g, sg);
            continue;
        }
        const size_t n = sg->hi - sg->lo, c = n / (size_t)p->DP, tail = n - c * (size_t)p->DP;
        float *t = g + sg->lo + c * (size_t)p->DP;
        if (c) st = dt_comm_reduce_scatter(p->dp, g + sg->lo, p->gsh + sg->gat, c, DT_F32, DT_OP_AVG);
        if (st == DT_OK && tail) st = dt_comm_allreduce(p->dp, t, t, tail, DT_F32, DT_OP_AVG);
        if (st == DT_OK && tail && p->dp_i == p->DP - 1) memcpy(p->gsh + sg->gat + c, t, tail * sizeof(float));
        if (st == DT_OK) p->grel += release_grads(p, g, sg);
    }
    return st == DT_OK ? DT_OK
                       : dt_error_wrap(st,
                                       "pipeline stage %d (rank %d): ZeRO-2 gradient reduce-scatter over the "
                                       "data-parallel axis",
                                       p->stage, p->rank);
}

/* The sum of squares of this rank's chunk of the gradients in its share of the norm: the device's
 * sqnorm of each run of such values adjacent in p->gsh (visited in increasing offset, as the loop
 * over tensors and segments it replaced). */
dt_status dt_pp_zero_norm_pieces(const dt_pp *p, dt_grad_pieces *out) {
    size_t lo = 0, hi = 0; /* the current run in p->gsh */
    for (int t = 0; t < dt_model_num_tensors(p->m); t++) {
        const dt_param_info *ti = dt_model_tensor(p->m, t);
        if (ti->is_buffer || !dt_pp_in_norm(p, t)) continue;
        for (int q = 0; q < p->nseg; q++) { /* the tensor's part in this rank's chunk of its segment */
            const dt_pp_segment *sg = &p->seg[q];
            const size_t c0 = sg->lo + sg->zoff, c1 = c0 + sg->zlen;
            const size_t a = ti->offset > c0 ? ti->offset : c0,
                         e = ti->offset + ti->numel < c1 ? ti->offset + ti->numel : c1;
            if (a >= e) continue;
            const size_t ga = sg->gat + (a - c0), ge = ga + (e - a);
            if (hi > lo && ga == hi) {
                hi = ge;
                continue;
            }
            DT_TRY(dt_grad_pieces_add(out, p->gsh + lo, hi - lo));
            lo = ga, hi = ge;
        }
    }
    return dt_grad_pieces_add(out, p->gsh + lo, hi - lo);
}

dt_status dt_pp_zero_allgather(dt_pp *p, float *w, const dt_pp_segment *sg, const size_t *counts) {
    if (!dt_strategy_stage_device(p->dp, p->m))
        return dt_comm_allgatherv(p->dp, w + sg->lo + sg->zoff, w + sg->lo, counts, NULL, DT_F32);
    const size_t n = sg->hi - sg->lo;
    DT_TRY(dt_pp_host_room(p, n));
    p->dev->ops->download(p->dev, p->host + sg->zoff, w + sg->lo + sg->zoff, sg->zlen * sizeof(float));
    DT_TRY(dt_comm_allgatherv(p->dp, p->host + sg->zoff, p->host, counts, NULL, DT_F32));
    p->dev->ops->upload(p->dev, w + sg->lo, p->host, n * sizeof(float));
    return DT_OK;
}

dt_status dt_pp_zero_update(dt_pp *p, float *w, const float *g, float lr) {
    size_t *counts = malloc((size_t)p->DP * sizeof *counts);
    if (!counts) return dt_error(DT_ENOMEM, "pp: out of memory");
    dt_status st = DT_OK;
    for (int q = 0; q < p->nseg; q++) {
        dt_pp_segment *sg = &p->seg[q];
        dt_optim_step(sg->opt, w + sg->lo + sg->zoff, g ? g + sg->lo + sg->zoff : p->gsh + sg->gat, lr);
    }
    if (p->seg_of) { /* ZeRO-3: the stale copies go; each node gathers the new values when it runs */
        free(counts);
        dt_pp_zero3_release_all(p);
        return DT_OK;
    }
    for (int q = 0; st == DT_OK && q < p->nseg; q++) { /* every DP rank's updated chunk to every one */
        const dt_pp_segment *sg = &p->seg[q];
        for (int j = 0; j < p->DP; j++) {
            size_t off;
            dt_zero_chunk(sg->hi - sg->lo, j, p->DP, &off, &counts[j]);
        }
        st = dt_pp_zero_allgather(p, w, sg, counts);
    }
    free(counts);
    return st == DT_OK ? DT_OK
                       : dt_error_wrap(st,
                                       "pipeline stage %d (rank %d): ZeRO-%d parameter allgather over the "
                                       "data-parallel axis",
                                       p->stage, p->rank, p->o.zero);
}

dt_status dt_pp_zero_collect(dt_pp *p) {
    dt_status st = DT_OK;
    for (int q = 0; st == DT_OK && q < p->nseg; q++) {
        dt_pp_segment *sg = &p->seg[q];
        if (!sg->opt || sg->whole) continue;
        const int ns = dt_optim_num_states(sg->opt);
        if (p->dp_i != 0) {
            for (int k = 0; st == DT_OK && k < ns; k++)
                st = dt_pp_send_model(p, p->dp, dt_optim_state(sg->opt, k, NULL), sg->zlen, 0, TAG_PP_ZERO + k);
            continue;
        }
        dt_optim *w = NULL;
        if ((st = dt_optim_create(&w, dt_optim_config_of(sg->opt), sg->hi - sg->lo)) != DT_OK) break;
        if ((st = dt_optim_set_device(w, p->dev)) != DT_OK) {
            dt_optim_destroy(w);
            break;
        }
        dt_optim_set_steps(w, dt_optim_steps(sg->opt));
        for (int j = 0; st == DT_OK && j < p->DP; j++) {
            size_t off, len;
            dt_zero_chunk(sg->hi - sg->lo, j, p->DP, &off, &len);
            for (int k = 0; st == DT_OK && k < ns; k++) {
                float *dst = dt_optim_state(w, k, NULL) + off;
                if (j == 0) p->dev->ops->copy(p->dev, dst, dt_optim_state(sg->opt, k, NULL), len * sizeof(float));
                else st = dt_pp_recv_model(p, p->dp, dst, len, j, TAG_PP_ZERO + k);
            }
        }
        if (st != DT_OK) {
            dt_optim_destroy(w);
            break;
        }
        sg->shard = sg->opt, sg->opt = w, sg->whole = true;
    }
    return st == DT_OK ? DT_OK
                       : dt_error_wrap(st,
                                       "pipeline stage %d (rank %d): collecting the ZeRO-%d optimizer shards over "
                                       "the data-parallel axis",
                                       p->stage, p->rank, p->o.zero);
}

void dt_pp_zero_uncollect(dt_pp *p) {
    for (int q = 0; q < p->nseg; q++) {
        dt_pp_segment *sg = &p->seg[q];
        if (!sg->whole) continue;
        dt_optim_destroy(sg->opt);
        sg->opt = sg->shard, sg->shard = NULL, sg->whole = false;
    }
}
