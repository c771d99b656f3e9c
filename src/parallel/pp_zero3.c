/* ZeRO stage 3 over the data-parallel axis of a pipeline (pp(stages=K,zero=3), with or without tp:
 * under tp the stage model is the rank's shard, whose collectives' hooks chain with these): on top of
 * stage 2 (pp_zero.c: optimizer state and gradients sharded), a stage's DP ranks keep only their
 * chunk of each parameter segment (one segment per tensor here, so a node gathers only its own
 * tensors). Node hooks gather a node's tensors over the DP axis before its forward and again
 * before its backward (and its recomputed forward), and give back the previous node's; after the
 * update every segment is given back again, so the parameters are all-gathered 2-3 times per
 * micro-batch instead of once per step: M times ZeRO-2's parameter traffic (DeepSpeed refuses
 * ZeRO-3 with its pipeline for this), blocking, without prefetch. Memory per rank (Psi the stage's
 * parameters, N = DP, f32 Adam): 4 Psi/N parameters + the largest node's tensors, and stage 2's
 * gradients (the whole 4 Psi while the micro-batches accumulate) + 12 Psi/N: 4 Psi + 16 Psi/N at
 * the peak, 16 Psi/N between steps. A sync gathers every segment for evaluation and checkpoints.
 *
 * On a device whose memory is not host memory the model is a whole device block: a segment's
 * values outside the chunk are zeroed (fill_f32), not given back, so the parameters' memory stays
 * 4 Psi there (the arithmetic and traffic are ZeRO-3's; a per-layer staging block is not done), and
 * a gather runs on a host copy of the segment (dt_pp_zero_allgather). */
#include "device/device.h"
#include "parallel/pp.h"
#include "parallel/zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NODE_TENSORS = 8, MAX_DP = 1024 };

/* Zeros segment sg's values outside this rank's chunk and gives back the whole pages among them
 * (small blocks have none): they read as zeros until the next gather. */
static void release(dt_pp *p, dt_pp_segment *sg) {
    if (!sg->resident) return;
    float *w = dt_model_params(p->m);
    const size_t end = sg->lo + sg->zoff + sg->zlen;
    if (p->on_dev) { /* a device block: zeroed, nothing given back */
        p->dev->ops->fill_f32(p->dev, w + sg->lo, 0.0f, sg->zoff);
        p->dev->ops->fill_f32(p->dev, w + end, 0.0f, sg->hi - end);
        sg->resident = false;
        return;
    }
    memset(w + sg->lo, 0, sg->zoff * sizeof(float));
    memset(w + end, 0, (sg->hi - end) * sizeof(float));
    sg->prel = dt_mem_release(w + sg->lo, sg->zoff * sizeof(float));
    sg->prel += dt_mem_release(w + end, (sg->hi - end) * sizeof(float));
    sg->resident = false;
}

/* Every DP rank's chunk of segment sg into place. */
static dt_status gather(dt_pp *p, dt_pp_segment *sg) {
    if (sg->resident) return DT_OK;
    if (sg->prel) {
        dt_status st = dt_mem_reacquire(sg->prel);
        if (st != DT_OK)
            return dt_error_wrap(st, "pipeline stage %d (rank %d): ZeRO-3 gathering a tensor's parameters", p->stage,
                                 p->rank);
        sg->prel = 0;
    }
    size_t counts[MAX_DP], off;
    if (p->DP > MAX_DP) return dt_error(DT_EINVAL, "pp zero=3: at most %d data-parallel ranks", MAX_DP);
    for (int j = 0; j < p->DP; j++) dt_zero_chunk(sg->hi - sg->lo, j, p->DP, &off, &counts[j]);
    float *w = dt_model_params(p->m);
    dt_status st = dt_pp_zero_allgather(p, w, sg, counts);
    if (st != DT_OK)
        return dt_error_wrap(st, "pipeline stage %d (rank %d): ZeRO-3 parameter allgather over the data-parallel axis",
                             p->stage, p->rank);
    sg->resident = true;
    return DT_OK;
}

/* Before node's forward or backward: the segments of its tensors gathered, the others given back. */
static void node_hook(void *ctx, int node) {
    dt_pp *p = ctx;
    if (p->zfull || p->zerr != DT_OK || node < p->lo || node >= p->hi) return;
    int ids[NODE_TENSORS], need[NODE_TENSORS], nn = 0;
    const int n = dt_model_node_tensors(p->m, node, ids, NODE_TENSORS);
    for (int k = 0; k < n && k < NODE_TENSORS; k++)
        if (p->seg_of[ids[k]] >= 0) need[nn++] = p->seg_of[ids[k]];
    if (nn == 0) return; /* a node without parameters keeps the last ones (the next may need them) */
    for (int q = 0; q < p->nseg; q++) {
        bool keep = false;
        for (int k = 0; k < nn; k++) keep |= need[k] == q;
        if (!keep) release(p, &p->seg[q]);
    }
    for (int k = 0; k < nn; k++) {
        dt_status st = gather(p, &p->seg[need[k]]);
        if (st != DT_OK) {
            p->zerr = st;
            snprintf(p->zmsg, sizeof p->zmsg, "%s", dt_last_error());
            return;
        }
    }
}

dt_status dt_pp_zero3_setup(dt_pp *p) {
    const int nt = dt_model_num_tensors(p->m);
    if (!(p->seg_of = malloc(((size_t)nt + 1) * sizeof *p->seg_of))) return dt_error(DT_ENOMEM, "pp: out of memory");
    for (int t = 0; t < nt; t++) {
        const dt_param_info *ti = dt_model_tensor(p->m, t);
        p->seg_of[t] = -1;
        for (int q = 0; !ti->is_buffer && q < p->nseg; q++)
            if (p->seg[q].lo == ti->offset && p->seg[q].hi == ti->offset + ti->numel) p->seg_of[t] = q;
    }
    for (int q = 0; q < p->nseg; q++) p->seg[q].resident = true; /* whole until init gives them back */
    dt_model_set_node_hooks(p->m, node_hook, NULL, p);
    dt_model_set_backward_hook(p->m, node_hook);
    if (p->hooks) dt_tp_hooks_chain(p->hooks); /* tp x pp: the shard's collectives after its backward, ours before */
    return DT_OK;
}

void dt_pp_zero3_release_all(dt_pp *p) {
    for (int q = 0; q < p->nseg; q++) release(p, &p->seg[q]);
    p->zfull = false;
}

dt_status dt_pp_zero3_gather_all(dt_pp *p) {
    for (int q = 0; q < p->nseg; q++) DT_TRY(gather(p, &p->seg[q]));
    p->zfull = true;
    return DT_OK;
}

dt_status dt_pp_zero3_status(dt_pp *p) {
    const dt_status st = p->zerr;
    p->zerr = DT_OK;
    return st == DT_OK ? DT_OK : dt_error(st, "%s", p->zmsg);
}
