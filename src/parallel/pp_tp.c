/* Pipeline stages of tensor-parallel GPT shards, the tp x pp (x dp) mesh (pp.h): each rank holds
 * its shard of the GPT (tp_shard.c: Megatron-LM's layout) and runs its stage's nodes of it with
 * the tp hooks over the stage's tp ranks (tp_hooks.c). The cut is the whole model's; the shard has
 * no loss node, so the last stage ends at the head and takes the vocabulary-parallel loss.
 *
 * Memory, from set-up on: the trainer places none of the whole model (s->model, pp_place / tp_place),
 * and the shard (p->m) is placed only for the stage's tensors (their tp parts; the replicated ones
 * whole), initialised one whole tensor at a time (dt_tp_scatter); a resume restores those shards
 * in place (dt_pp_tp_visit_state, before ZeRO shards the segments in pp_init). The whole model is
 * the checkpoint's and evaluation's: a sync places it (pp.c widen) and gathers each tensor over
 * its owner stage's tp ranks, broadcasts it along the pipeline of every tp index (so every rank
 * holds the whole model for evaluation), and gathers its moments to tp rank 0 of the owner stage,
 * which sends them to world rank 0 (stage 0, tp 0, dp 0): one ordinary, layout-independent
 * checkpoint. The next step narrows the whole model to nothing again.
 *
 * On a device whose memory is not host memory (pp's p->on_dev) the shard is whole device blocks
 * (a block is not narrowed: the stage's tensors are scattered, the others unused) and so is the
 * whole model; the sync's gathers, broadcasts and moment sends are staged through host buffers
 * (dt_tp_gather_tensor_on, dt_strategy_broadcast_model, dt_pp_send_model / dt_pp_recv_model). */
#include "parallel/pp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_pp_tp_setup(dt_strategy *s, dt_pp *p) {
    const char *spec = dt_model_spec(s->model);
    if (!dt_model_spec_is_gpt(spec))
        return dt_error(DT_EINVAL,
                        "`tp` %d `pp` %d: tensor-parallel pipeline stages run a GPT only so far; `model` "
                        "%s is not a GPT (use `model` gpt:L=..,H=..,C=..,T=.., `tp` alone or `pp` alone)",
                        p->tp, p->K, spec);
    dt_gpt_config g;
    DT_TRY(dt_gpt_parse(spec, &g));
    DT_TRY(dt_gpt_create_sharded_unplaced(&p->m, &g, p->tp));
    if (p->on_dev) DT_TRY(dt_model_set_device(p->m, p->dev)); /* whole device blocks, before the hooks */
    const int n = dt_model_num_nodes(p->m);
    for (int i = 0; i < n; i++)
        if (strcmp(dt_model_node_name(p->m, i), dt_model_node_name(s->model, i)) != 0)
            return dt_error(DT_EINTERNAL, "`tp` %d `pp` %d: node %d of the shard is '%s', of the whole model '%s'",
                            p->tp, p->K, i, dt_model_node_name(p->m, i), dt_model_node_name(s->model, i));
    if (p->first[p->K - 1] >= n)
        return dt_error(DT_EINVAL,
                        "`tp` %d `pp` %d: the last stage would hold only the loss (it starts at node %d, "
                        "'%s'); under tensor parallelism the loss goes with the head: cut earlier (`pp_split`)",
                        p->tp, p->K, p->first[p->K - 1], dt_model_node_name(s->model, p->first[p->K - 1]));
    p->first[p->K] = n;
    /* the whole model only receives gathered parameters (evaluation, checkpoints) */
    dt_model_release_grads(s->model);
    return dt_tp_hooks_create(&p->hooks, p->m, &g, p->mesh.tp_comm, p->tp, p->tr, p->rank, s->trace, &s->step);
}

dt_status dt_pp_tp_place(dt_strategy *s, dt_pp *p, const dt_range *own, int nown) {
    static const dt_range none = {0, 0};
    dt_status st = p->on_dev ? DT_OK : dt_model_place(p->m, own ? own : &none, nown); /* a device's: whole */
    if (st != DT_OK)
        return dt_error_wrap(st, "pipeline stage %d, tp rank %d (rank %d): placing the stage's shard", p->stage, p->tr,
                             p->rank);
    return dt_tp_scatter(s->model, NULL, p->m, NULL, p->tp, p->tr);
}

/* The whole model's tensor of the shard's tensor j. */
static const dt_param_info *whole_of(const dt_strategy *s, const dt_pp *p, int j) {
    const int i = dt_model_find_tensor(s->model, dt_model_tensor(p->m, j)->name);
    return i < 0 ? NULL : dt_model_tensor(s->model, i);
}

void dt_pp_tp_scatter_moments(dt_strategy *s, dt_pp *p) {
    for (int j = 0; j < dt_model_num_tensors(p->m); j++) {
        const dt_param_info *lt = dt_model_tensor(p->m, j), *ft = whole_of(s, p, j);
        if (!ft || lt->is_buffer || !(p->users[j] >> p->stage & 1)) continue;
        for (int k = 0; k < p->nstates; k++) {
            float *full = dt_optim_state(s->optim, k, NULL), *mine = dt_pp_seg_state(p, k, lt->offset);
            if (full && mine)
                dt_tp_copy_on(p->dev, !p->on_dev, !p->on_dev, dt_tp_split_of(p->m, lt->name), full + ft->offset, mine,
                              ft, p->tp, p->tr, true);
        }
    }
}

/* Moment k of tensor j (whole ft, shard lt) to world rank 0: gathered to tp rank 0 of the owner
 * stage, sent from there to stage 0 when the owner is another stage. mom: ft->numel floats. */
static dt_status sync_moment(dt_strategy *s, dt_pp *p, int j, int k, int own, float *tmp, float *mom) {
    const dt_param_info *lt = dt_model_tensor(p->m, j), *ft = whole_of(s, p, j);
    const bool saver = p->stage == 0 && p->tr == 0;
    float *dst = saver ? dt_optim_state(s->optim, k, NULL) + ft->offset : mom;
    if (p->stage == own) {
        dt_status st = dt_tp_gather_tensor_on(p->m, p->dev, p->mesh.tp_comm, p->tp, ft, lt,
                                              dt_pp_seg_state(p, k, lt->offset), dst, tmp, false);
        if (st != DT_OK)
            return dt_error_wrap(st,
                                 "pipeline stage %d (rank %d): gathering the optimizer state of %s over the tp "
                                 "axis",
                                 p->stage, p->rank, ft->name);
    }
    if (own == 0 || p->tr != 0 || (p->stage != own && p->stage != 0)) return DT_OK;
    dt_status st = p->stage == 0 ? dt_pp_recv_model(p, p->pp, dst, ft->numel, own, DT_COMM_TAG_MAX - 1)
                                 : dt_pp_send_model(p, p->pp, mom, ft->numel, 0, DT_COMM_TAG_MAX - 1);
    if (st != DT_OK)
        return dt_error_wrap(st, "pipeline stage %d (rank %d): %s the optimizer state of %s %s stage %d (rank %d)",
                             p->stage, p->rank, p->stage == 0 ? "receiving" : "sending", ft->name,
                             p->stage == 0 ? "from" : "to", p->stage == 0 ? own : 0,
                             dt_pp_world_rank(p, p->stage == 0 ? own : 0));
    return DT_OK;
}

/* Tensor j: its whole values on every rank, its moments on world rank 0. */
static dt_status sync_tensor(dt_strategy *s, dt_pp *p, int j, float *tmp, float *mom) {
    const dt_param_info *lt = dt_model_tensor(p->m, j), *ft = whole_of(s, p, j);
    if (!ft) return dt_error(DT_EINTERNAL, "`tp` `pp`: the shard's tensor '%s' is not in the whole model", lt->name);
    const int own = dt_pp_owner_stage(p, j);
    float *whole = (lt->is_buffer ? dt_model_buffers(s->model) : dt_model_params(s->model)) + ft->offset;
    const float *mine = (lt->is_buffer ? dt_model_buffers(p->m) : dt_model_params(p->m)) + lt->offset;
    dt_status st = p->stage == own
                       ? dt_tp_gather_tensor_on(p->m, p->dev, p->mesh.tp_comm, p->tp, ft, lt, mine, whole, tmp, true)
                       : DT_OK;
    if (st != DT_OK)
        return dt_error_wrap(st, "pipeline stage %d (rank %d): gathering tensor %s over the tp axis", p->stage, p->rank,
                             ft->name);
    if (p->K > 1 && (st = dt_strategy_broadcast_model(p->pp, s->model, whole, ft->numel, own)) != DT_OK)
        return dt_error_wrap(st, "pipeline stage %d (rank %d): gathering tensor %s from stage %d", p->stage, p->rank,
                             ft->name, own);
    for (int k = 0; !lt->is_buffer && s->optim && p->dp_i == 0 && k < p->nstates; k++)
        DT_TRY(sync_moment(s, p, j, k, own, tmp, mom));
    return DT_OK;
}

dt_status dt_pp_tp_visit_state(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    dt_pp *p = s->impl;
    if (p->whole) return dt_state_visit_model(s->model, s->optim, fn, ctx);
    for (int g = 0; g < p->nseg; g++)
        if (p->seg[g].zero && !p->seg[g].whole)
            return dt_error(DT_EINTERNAL,
                            "`tp` %d `pp` %d: the stage's state is ZeRO-sharded; its pieces are visited "
                            "before pp_init shards it, or after a sync",
                            p->tp, p->K);
    for (int j = 0; j < dt_model_num_tensors(p->m); j++) {
        const dt_param_info *lt = dt_model_tensor(p->m, j), *ft = whole_of(s, p, j);
        if (!(p->users[j] >> p->stage & 1)) continue; /* another stage's */
        if (!ft)
            return dt_error(DT_EINTERNAL, "`tp` `pp`: the shard's tensor '%s' is not in the whole model", lt->name);
        float *lb = (lt->is_buffer ? dt_model_buffers(p->m) : dt_model_params(p->m)) + lt->offset;
        DT_TRY(dt_tp_visit_shard(p->m, p->tp, p->tr, fn, ctx, ft->name, ft, lb, false));
        for (int k = 0; !lt->is_buffer && k < p->nstates; k++) {
            const char *sname = "";
            float *mine = dt_pp_seg_state(p, k, lt->offset);
            if (!mine) continue;
            dt_optim_state(p->seg[0].opt, k, &sname); /* the segments' optimizers are one kind */
            char name[96];
            snprintf(name, sizeof name, "optim.%s.%s", sname, ft->name);
            DT_TRY(dt_tp_visit_shard(p->m, p->tp, p->tr, fn, ctx, name, ft, mine, true));
        }
    }
    return DT_OK;
}

dt_status dt_pp_tp_sync(dt_strategy *s) {
    dt_pp *p = s->impl;
    size_t most_l = 1, most_w = 1;
    for (int j = 0; j < dt_model_num_tensors(p->m); j++) {
        const dt_param_info *ft = whole_of(s, p, j);
        if (dt_model_tensor(p->m, j)->numel > most_l) most_l = dt_model_tensor(p->m, j)->numel;
        if (ft && ft->numel > most_w) most_w = ft->numel;
    }
    /* tmp: the tp parts (and on a device the staged own part); mom: a moment on its way to stage 0,
     * memory of the device (sent staged) */
    float *tmp = malloc(((size_t)p->tp + p->on_dev) * most_l * sizeof(float));
    float *mom = p->on_dev ? p->dev->ops->alloc(p->dev, most_w * sizeof(float)) : malloc(most_w * sizeof(float));
    dt_status st = tmp && mom ? DT_OK : dt_error(DT_ENOMEM, "`tp` `pp`: out of memory gathering the shards");
    for (int j = 0; st == DT_OK && j < dt_model_num_tensors(p->m); j++) st = sync_tensor(s, p, j, tmp, mom);
    free(tmp);
    if (p->on_dev) p->dev->ops->free(p->dev, mom);
    else free(mom);
    if (st == DT_OK && s->optim) dt_optim_set_steps(s->optim, p->steps0 + p->updates);
    return st;
}
