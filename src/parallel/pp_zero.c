/* ZeRO stage 1 over the data-parallel axis of a pipeline (pp(stages=K,zero=1)): each of a stage's
 * DP ranks keeps the optimizer moments of its chunk of every segment only (dt_zero_chunk: DP
 * equal chunks, the remainder to the last rank), updates that chunk after the DP average and
 * the clip, and the chunks are then all-gathered, so every replica of the stage holds the same
 * parameters. For checkpoints, sync collects the chunks' moments on DP rank 0 (whose stages send
 * them on to rank 0) into whole segment optimizers, which the next step frees again. */
#include "parallel/pp.h"
#include "parallel/zero.h"

#include <stdlib.h>
#include <string.h>

enum { TAG_PP_ZERO = 7400 };

dt_status dt_pp_zero_shard(dt_pp *p) {
    for (int q = 0; q < p->nseg; q++) {
        dt_pp_segment *sg = &p->seg[q];
        dt_zero_chunk(sg->hi - sg->lo, p->dp_i, p->DP, &sg->zoff, &sg->zlen);
        sg->zero = true;
        if (sg->opt) DT_TRY(dt_optim_shard(sg->opt, 1, &sg->zoff, &sg->zlen));
    }
    return DT_OK;
}

dt_status dt_pp_zero_update(dt_pp *p, float *w, const float *g, float lr) {
    size_t *counts = malloc((size_t)p->DP * sizeof *counts);
    if (!counts) return dt_error(DT_ENOMEM, "pp: out of memory");
    dt_status st = DT_OK;
    for (int q = 0; q < p->nseg; q++) {
        dt_pp_segment *sg = &p->seg[q];
        dt_optim_step(sg->opt, w + sg->lo + sg->zoff, g + sg->lo + sg->zoff, lr);
    }
    for (int q = 0; st == DT_OK && q < p->nseg; q++) {  /* every DP rank's updated chunk to every one */
        const dt_pp_segment *sg = &p->seg[q];
        for (int j = 0; j < p->DP; j++) {
            size_t off;
            dt_zero_chunk(sg->hi - sg->lo, j, p->DP, &off, &counts[j]);
        }
        st = dt_comm_allgatherv(p->dp, w + sg->lo + sg->zoff, w + sg->lo, counts, NULL, DT_F32);
    }
    free(counts);
    return st == DT_OK ? DT_OK
                       : dt_error_wrap(st, "pipeline stage %d (rank %d): ZeRO-1 parameter allgather over the "
                                           "data-parallel axis", p->stage, p->rank);
}

dt_status dt_pp_zero_collect(dt_pp *p) {
    dt_status st = DT_OK;
    for (int q = 0; st == DT_OK && q < p->nseg; q++) {
        dt_pp_segment *sg = &p->seg[q];
        if (!sg->opt || sg->whole) continue;
        const int ns = dt_optim_num_states(sg->opt);
        if (p->dp_i != 0) {
            for (int k = 0; st == DT_OK && k < ns; k++)
                st = dt_comm_send(p->dp, dt_optim_state(sg->opt, k, NULL), sg->zlen, DT_F32, 0, TAG_PP_ZERO + k);
            continue;
        }
        dt_optim *w = NULL;
        if ((st = dt_optim_create(&w, dt_optim_config_of(sg->opt), sg->hi - sg->lo)) != DT_OK) break;
        dt_optim_set_steps(w, dt_optim_steps(sg->opt));
        for (int j = 0; st == DT_OK && j < p->DP; j++) {
            size_t off, len;
            dt_zero_chunk(sg->hi - sg->lo, j, p->DP, &off, &len);
            for (int k = 0; st == DT_OK && k < ns; k++) {
                float *dst = dt_optim_state(w, k, NULL) + off;
                if (j == 0) memcpy(dst, dt_optim_state(sg->opt, k, NULL), len * sizeof(float));
                else st = dt_comm_recv(p->dp, dst, len, DT_F32, j, TAG_PP_ZERO + k);
            }
        }
        if (st != DT_OK) {
            dt_optim_free(w);
            break;
        }
        sg->shard = sg->opt, sg->opt = w, sg->whole = true;
    }
    return st == DT_OK ? DT_OK
                       : dt_error_wrap(st, "pipeline stage %d (rank %d): collecting the ZeRO-1 optimizer shards over "
                                           "the data-parallel axis", p->stage, p->rank);
}

void dt_pp_zero_uncollect(dt_pp *p) {
    for (int q = 0; q < p->nseg; q++) {
        dt_pp_segment *sg = &p->seg[q];
        if (!sg->whole) continue;
        dt_optim_free(sg->opt);
        sg->opt = sg->shard, sg->shard = NULL, sg->whole = false;
    }
}
