/* Memory plans (dtrain/memplan.h): per rank, the bytes of its part of the parameters, gradients
 * and optimizer state (ZeRO: its shard of each of ddp's buckets; pipeline: the tensors its stage's nodes
 * use under the flops cut; tensor parallel: each tensor a tp-th where tp splits it, else whole:
 * the strategies' entries fill these, dt_strategy_entry.mem_plan),
 * stage 2-3's gradient buckets in flight (a pipeline's stage 2-3: its whole gradients and the
 * shard), stage 3's gathered buckets and the activations its graph allocates at a micro-batch
 * (graph_activations). */
#include "dtrain/memplan.h"
#include "dtrain/models.h"
#include "parallel/mesh.h"
#include "parallel/strategy.h"
#include "run/trainer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_status check_layout(const dt_mem_layout *l, int rank) {
    if (l->dp < 1 || l->tp < 1 || l->pp < 1)
        return dt_error(DT_EINVAL, "memory plan: dp %d, tp %d, pp %d: each axis needs at least 1 rank", l->dp, l->tp,
                        l->pp);
    if (l->zero < 0 || l->zero > 3) return dt_error(DT_EINVAL, "memory plan: zero %d: choose 0, 1, 2 or 3", l->zero);
    if (l->microbatches < 1 || l->batch < 1)
        return dt_error(DT_EINVAL, "memory plan: %d micro-batches of %d samples: need at least 1 of each",
                        l->microbatches, l->batch);
    if (l->schedule && strcmp(l->schedule, "gpipe") && strcmp(l->schedule, "1f1b"))
        return dt_error(DT_EINVAL, "memory plan: schedule '%s': choose gpipe or 1f1b", l->schedule);
    if (rank < 0 || rank >= l->dp * l->tp * l->pp)
        return dt_error(DT_EINVAL, "memory plan: rank %d outside the %d ranks of dp %d x tp %d x pp %d", rank,
                        l->dp * l->tp * l->pp, l->dp, l->tp, l->pp);
    return DT_OK;
}

/* The parts of the plan the strategies decide (dt_mem_share): the rank's model part (the whole
 * model unless an entry's axis cuts it) and ZeRO's shard, from every registry entry's mem_plan. */
static dt_status strategy_share(dt_model *m, const dt_mem_layout *l, int stage, int dpi, dt_mem_share *sh) {
    *sh = (dt_mem_share){.dp = l->dp,
                         .tp = l->tp,
                         .pp = l->pp,
                         .zero = l->zero,
                         .stage = stage,
                         .dp_rank = dpi,
                         .bucket_mb = l->bucket_mb};
    DT_TRY(dt_mem_part_values(m, 0, dt_model_num_nodes(m), 1, &sh->mine));
    int n;
    const dt_strategy_entry *const *e = dt_strategy_entries(&n);
    for (int i = 0; i < n; i++)
        if (e[i]->mem_plan) DT_TRY(e[i]->mem_plan(m, sh));
    return DT_OK;
}

/* The activations the rank's graph allocates at its (micro-)batch: every node's, once (a pipeline
 * stage runs its micro-batches through the one graph, recomputing a forward rather than keeping
 * several in it; the sent and received activations are not charged); under tp the graph is the
 * rank's shard (dt_model_create_tp_shard), whose replicated nodes (a GPT's residual stream) stay whole. */
static dt_status graph_activations(const dt_model *m, const dt_mem_layout *l, double *out) {
    if (l->tp == 1) {
        *out = (double)dt_model_activation_bytes(m, l->batch);
        return DT_OK;
    }
    dt_model *shard = NULL;
    DT_TRY(dt_model_create_tp_shard(&shard, m, l->tp, true)); /* laid out, nothing written */
    *out = (double)dt_model_activation_bytes(shard, l->batch);
    dt_model_destroy(shard);
    return DT_OK;
}

dt_status dt_mem_plan_rank(dt_model *m, const dt_optim_config *o, const dt_mem_layout *l, int rank, dt_mem_plan *p) {
    memset(p, 0, sizeof *p);
    DT_TRY(check_layout(l, rank));
    int tpi, stage, dpi;
    dt_mesh_coords(rank, l->tp, l->pp, &tpi, &stage, &dpi);
    p->dp_rank = dpi, p->stage = stage, p->tp_rank = tpi;
    const size_t P = dt_model_num_params(m);
    const double F = sizeof(float);
    dt_mem_share sh;
    DT_TRY(strategy_share(m, l, stage, dpi, &sh));
    const double mine = sh.mine, *big = sh.big;
    double own = mine;
    if (l->zero > 0 && l->dp > 1) { /* ZeRO shards the data-parallel ranks' slab (no pipeline cut) */
        own = sh.zero_own;
        own *= mine / (double)P;
    }
    const int moments = o->kind != DT_OPTIM_SGD ? 2 : o->momentum > 0 ? 1 : 0;
    p->params = F * (l->zero >= 3 ? own : mine);
    p->grads = F * (l->zero >= 2 ? own : mine);
    /* the bucket backward fills and the ones still reducing (zero.c lets dt_zero_inflight_cap run) */
    if (l->zero >= 2 && l->dp > 1 && l->pp == 1) p->grads += F * big[sh.inflight];
    /* on a device ZeRO-2/3 hold a bucket's gradients in a block of its own from backward's first
     * write to its reduce, as the CPU's pages (zero_blocks.c); a data-parallel run stages its
     * collectives through a host copy of the slab (ddp's grad_sync.c, zero.c), ZeRO-3's gathers
     * through a host copy of each bucket in flight */
    if (l->device && l->dp > 1 && l->tp == 1 && l->pp == 1) p->staging = F * ((double)P + (l->zero >= 3 ? big[1] : 0));
    /* a pipeline's ZeRO-2 (pp_zero.c) accumulates the step's micro-batches into the stage's whole
     * gradients, then reduce-scatters them into the shard: both at the peak */
    if (l->zero >= 2 && l->dp > 1 && l->pp > 1) p->grads = F * (mine + own);
    p->optim = F * moments * (l->zero >= 1 ? own : mine);
    /* a node's buckets and the next node's, prefetched */
    if (l->zero >= 3 && l->dp > 1) p->gathered = F * big[1] * (double)(l->dp - 1) / l->dp;
    /* a device's staging block holds the whole bucket, this rank's chunk too */
    if (l->zero >= 3 && l->dp > 1 && l->device && l->pp == 1) p->gathered = F * big[1];
    /* pp, tp, tp x pp: checkpoints (and evaluation under ZeRO-3 over dp; otherwise it runs on the
     * shards) place the whole model on every rank, rank 0 also
     * the whole optimizer state it writes (pp.c widen, tp.c tp_sync); a pp stage alone already
     * holds its tensors of it, tp and tp x pp none (their shards are another model's) */
    if (l->tp > 1 || l->pp > 1) {
        p->sync = F * ((double)P - (l->pp > 1 && l->tp == 1 ? mine : 0));
        if (rank == 0) p->sync += F * moments * (double)P;
    } else if (l->zero >= 3 && l->dp > 1) {
        /* ZeRO-3's evaluation (zero_state.c dt_zero_sync) gathers every bucket: the whole
         * parameters, where training holds the rank's chunks and a layer's gathers in flight */
        p->sync = F * ((double)P - own) - p->gathered;
        /* a device gathers them into a whole block, beside the shard */
        if (l->device && l->pp == 1) p->sync = F * (double)P - p->gathered;
        if (p->sync < 0) p->sync = 0; /* a shallow model's gathers in flight already hold it all */
    }
    DT_TRY(graph_activations(m, l, &p->activations));
    p->total = p->params + p->grads + p->optim + p->gathered + p->staging + p->activations;
    return DT_OK;
}

dt_status dt_train_plan_loader(const dt_train_config *c, size_t *bytes) {
    *bytes = 0;
    dt_dataset *train = NULL, *test = NULL, *part = NULL, *val = NULL;
    DT_TRY(dt_trainer_open_data(c->data, c->model ? c->model : "mlp", c->val_fraction, &train, &test));
    dt_status s = c->val_split > 0 ? dt_dataset_split(train, c->val_split, c->seed, &part, &val) : DT_OK;
    if (s == DT_OK) *bytes = dt_loader_copy_bytes(part ? part : train);
    dt_dataset_destroy(part), dt_dataset_destroy(val), dt_dataset_destroy(train), dt_dataset_destroy(test);
    return s;
}

dt_status dt_train_plan_model(const dt_train_config *c, dt_model **m) {
    *m = NULL;
    const char *spec = c->model ? c->model : "mlp";
    dt_dataset *train = NULL, *test = NULL;
    DT_TRY(dt_trainer_open_data(c->data, spec, c->val_fraction, &train, &test));
    int C, H, W;
    dt_dataset_shape(train, &C, &H, &W);
    dt_dataset_destroy(train), dt_dataset_destroy(test);
    return dt_model_build_unplaced(m, spec, C, H, W); /* shapes only: nothing is written or charged */
}
