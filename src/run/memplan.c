/* Memory plans (dtrain/memplan.h): per rank, the bytes of its part of the parameters, gradients
 * and optimizer state (ZeRO: its shard of each of ddp's buckets, as zero.c cuts them; pipeline:
 * the tensors its stage's nodes use under the flops cut pp.c places; tensor parallel: each tensor
 * a tp-th where tp_shard.c splits it, else whole),
 * stage 2-3's gradient buckets in flight (a pipeline's stage 2-3: its whole gradients and the
 * shard), stage 3's gathered buckets and the activations its graph allocates at a micro-batch
 * (graph_activations). */
#include "dtrain/memplan.h"
#include "dtrain/models.h"
#include "parallel/mesh.h"
#include "parallel/pp.h"
#include "parallel/tp.h"
#include "parallel/zero.h"
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

/* Values of the slab this rank's ZeRO shard owns over [lo, hi), and the sizes of its largest
 * buckets: big[0] the largest, big[1] the two largest, big[2] the three largest together. */
static dt_status zero_share(dt_model *m, const dt_mem_layout *l, int dpi, size_t lo, size_t hi, double *own,
                            double big[3]) {
    dt_ddp_range *b;
    int nb;
    DT_TRY(dt_ddp_buckets(m, l->bucket_mb, &b, &nb));
    double o = 0, top[3] = {0, 0, 0};
    for (int i = 0; i < nb; i++) {
        size_t a = b[i].lo > lo ? b[i].lo : lo, e = b[i].hi < hi ? b[i].hi : hi;
        if (e <= a) continue;
        size_t off, len;
        dt_zero_chunk(e - a, dpi, l->dp, &off, &len);
        o += (double)len;
        double n = (double)(e - a);
        for (int k = 0; k < 3; k++)
            if (n > top[k]) {
                for (int j = 2; j > k; j--) top[j] = top[j - 1];
                top[k] = n;
                break;
            }
    }
    free(b);
    *own = o, big[0] = top[0], big[1] = top[0] + top[1], big[2] = big[1] + top[2];
    return DT_OK;
}

/* The flops cut of m into pp stages (dt_pp_cut), remembered per stage count for the model last
 * asked about: a plan of every rank (--dry-run), or of many layouts (the planner), asks for the
 * same cuts again. */
static dt_status flops_cut(dt_model *m, int pp, int *first) {
    static _Thread_local struct {
        const dt_model *m;
        char spec[256];
        int nodes;
        bool have[DT_PP_MAX_STAGES + 1];
        int first[DT_PP_MAX_STAGES + 1][DT_PP_MAX_STAGES + 1];
    } c;
    const int n = dt_model_num_nodes(m);
    if (c.m != m || c.nodes != n || strncmp(c.spec, dt_model_spec(m), sizeof c.spec)) { /* another model */
        memset(c.have, 0, sizeof c.have);
        c.m = m, c.nodes = n;
        snprintf(c.spec, sizeof c.spec, "%s", dt_model_spec(m));
    }
    if (!c.have[pp]) {
        DT_TRY(dt_pp_cut(m, pp, "", NULL, c.first[pp]));
        c.have[pp] = true;
    }
    memcpy(first, c.first[pp], (size_t)(pp + 1) * sizeof *first);
    return DT_OK;
}

/* Parameters `stage` holds: the tensors its nodes use under the flops cut (pp.c's placement),
 * each a tp-th where tensor parallelism splits it (tp_shard.c), else whole. */
static dt_status owned_params(dt_model *m, const dt_mem_layout *l, int stage, double *own) {
    int first[DT_PP_MAX_STAGES + 1] = {0, dt_model_num_nodes(m)};
    if (l->pp > DT_PP_MAX_STAGES)
        return dt_error(DT_EINVAL, "memory plan: pp %d: at most %d stages", l->pp, DT_PP_MAX_STAGES);
    if (l->pp > 1) DT_TRY(flops_cut(m, l->pp, first));
    const int nt = dt_model_num_tensors(m);
    bool *used = calloc((size_t)nt + 1, 1);
    if (!used) return dt_error(DT_ENOMEM, "memory plan: out of memory");
    for (int i = first[stage]; i < first[stage + 1]; i++) {
        int ids[8];
        const int n = dt_model_node_tensors(m, i, ids, 8);
        for (int j = 0; j < n && j < 8; j++) used[ids[j]] = true;
    }
    double o = 0;
    for (int t = 0; t < nt; t++) {
        const dt_param_info *p = dt_model_tensor(m, t);
        if (!used[t] || p->is_buffer) continue;
        const dt_tp_split k = dt_tp_split_of(m, p->name);
        o += l->tp > 1 && k != DT_TP_REPL && k != DT_TP_RANK0 ? (double)p->numel / l->tp : (double)p->numel;
    }
    free(used);
    *own = o;
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
    double mine = 0, own, big[3] = {0, 0, 0};
    DT_TRY(owned_params(m, l, stage, &mine));
    own = mine;
    if (l->zero > 0 && l->dp > 1) { /* ZeRO shards the data-parallel ranks' slab (no pipeline cut) */
        DT_TRY(zero_share(m, l, dpi, 0, P, &own, big));
        own *= mine / (double)P;
        for (int k = 0; k < 3; k++) big[k] /= l->tp;
    }
    const int moments = o->kind != DT_OPTIM_SGD ? 2 : o->momentum > 0 ? 1 : 0;
    p->params = F * (l->zero >= 3 ? own : mine);
    p->grads = F * (l->zero >= 2 ? own : mine);
    /* the bucket backward fills and the ones still reducing (zero.c lets dt_zero_inflight_cap run) */
    if (l->zero >= 2 && l->dp > 1 && l->pp == 1) p->grads += F * big[dt_zero_inflight_cap(l->zero)];
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
