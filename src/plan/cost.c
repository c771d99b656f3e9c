/* The planner's cost model: the model summary read off the graph (or measured per node here),
 * the collective formulas (ring allreduce, reduce-scatter / all-gather, ZeRO's bytes per stage,
 * Megatron's tp bytes) and the step time of a layout: compute of the critical pipeline stage at
 * its micro-batch, each axis's exposed communication (ddp and ZeRO hide gradient traffic behind
 * the backward as far as the cluster's overlap allows; tp traffic sits on the critical path; a
 * pipeline's sends overlap its other micro-batches' work, except 1F1B's round trips), the pipeline
 * bubble and the optimizer step (memory-bound); and the layouts that change the algorithm: top-k
 * and PowerSGD compression, localsgd's average every H steps, ps's push and pull. */
#include "plan/plan.h"
#include "parallel/tp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void dt_plan_model_free(dt_plan_model *pm) {
    if (!pm) return;
    free(pm->flops), free(pm->bytes), free(pm->params), free(pm->out_bytes), free(pm->split), free(pm->t_fix),
        free(pm->t_per);
    memset(pm, 0, sizeof *pm);
}

/* Whether tensor parallelism divides node i's work (GPT: the heads, MLP columns and vocabulary;
 * layer norms, residual adds and the position embedding stay whole on every rank). */
static bool node_split(const dt_model *m, int i) {
    const dt_layer_kind k = dt_model_node_kind(m, i);
    if (k == DT_LAYER_ATTENTION || k == DT_LAYER_GELU || k == DT_LAYER_XENT || k == DT_LAYER_MATMUL_T) return true;
    int ids[8];
    const int n = dt_model_node_tensors(m, i, ids, 8);
    for (int j = 0; j < n && j < 8; j++) {
        const dt_tp_split s = dt_tp_split_of(m, dt_model_tensor(m, ids[j])->name);
        if (s != DT_TP_REPL && s != DT_TP_RANK0) return true;
    }
    return false;
}

dt_status dt_plan_model_init(dt_plan_model *pm, const dt_model *m) {
    memset(pm, 0, sizeof *pm);
    const int n = dt_model_num_nodes(m);
    pm->nodes = n;
    pm->flops = calloc((size_t)n, sizeof(double)), pm->bytes = calloc((size_t)n, sizeof(double));
    pm->params = calloc((size_t)n, sizeof(double)), pm->out_bytes = calloc((size_t)n, sizeof(double));
    pm->split = calloc((size_t)n, sizeof(bool));
    if (!pm->flops || !pm->bytes || !pm->params || !pm->out_bytes || !pm->split) {
        dt_plan_model_free(pm);
        return dt_error(DT_ENOMEM, "plan: out of memory for the model summary");
    }
    pm->gpt = dt_model_spec_is_gpt(dt_model_spec(m)) && dt_gpt_parse(dt_model_spec(m), &pm->g) == DT_OK;
    enum { B = 64 }; /* flops per sample from a batch large enough that per-batch terms vanish */
    for (int i = 0; i < n; i++) {
        pm->flops[i] = dt_model_node_flops(m, i, B) / B;
        pm->out_bytes[i] = 4.0 * (double)dt_model_node_size(m, i);
        /* forward writes the output and its reader reads it; backward writes and reads its gradient */
        pm->bytes[i] = 4.0 * pm->out_bytes[i];
        pm->split[i] = pm->gpt && node_split(m, i);
    }
    for (int t = 0; t < dt_model_num_tensors(m); t++) {
        const dt_param_info *p = dt_model_tensor(m, t);
        if (p->is_buffer) continue;
        if (p->layer >= 0 && p->layer < n) pm->params[p->layer] += (double)p->numel;
        if (p->ndim >= 2 && p->shape[0] > 0) {
            pm->mat_params += (double)p->numel;
            pm->mat_dims += (double)p->shape[0] + (double)p->numel / (double)p->shape[0];
        } else {
            pm->vec_params += (double)p->numel;
        }
    }
    pm->total_params = (double)dt_model_num_params(m);
    pm->classes = dt_model_classes(m);
    return DT_OK;
}

double dt_plan_ring_allreduce_s(double n, int p, dt_plan_link l) {
    if (p <= 1 || n <= 0) return 0;
    return 2.0 * (p - 1) / p * n / l.bw + 2.0 * (p - 1) * l.lat;
}

double dt_plan_ring_half_s(double n, int p, dt_plan_link l) {
    if (p <= 1 || n <= 0) return 0;
    return (double)(p - 1) / p * n / l.bw + (double)(p - 1) * l.lat;
}

double dt_plan_sync_s(const dt_plan_model *pm, double n, int d, int compress, double param, dt_plan_link l,
                      double *bytes) {
    *bytes = 0;
    if (d <= 1 || n <= 0) return 0;
    if (compress == DT_PLAN_TOPK) { /* an allgather of d x k pairs: each rank sends (d-1) k of them */
        const double k = ceil(param * n) > 1 ? ceil(param * n) : 1;
        *bytes = (d - 1) * k * 8;
        return dt_plan_ring_half_s(d * k * 8, d, l);
    }
    double S = n * (compress == DT_PLAN_BF16 || compress == DT_PLAN_FP16 ? 2 : 4);
    if (compress == DT_PLAN_POWERSGD) { /* this rank's share (n of the model's values) of P, Q and the vectors */
        const double all = pm->mat_params + pm->vec_params, share = all > 0 ? n / all : 1;
        S = 4 * share * (param * pm->mat_dims + pm->vec_params);
    }
    *bytes = 2.0 * (d - 1) / d * S;
    return dt_plan_ring_allreduce_s(S, d, l) + (compress == DT_PLAN_POWERSGD ? 2.0 * (d - 1) * l.lat : 0);
}

double dt_plan_ps_s(double n, int workers, int servers, dt_plan_link l) {
    if (workers < 1 || servers < 1 || n <= 0) return 0;
    const double mine = 2 * n * 4 / l.bw, server = workers * n * 4 / (servers * l.bw);
    return (mine > server ? mine : server) + 2 * l.lat;
}

double dt_plan_bubble_fraction(int pp, int M) { return pp <= 1 ? 0 : (double)(pp - 1) / (M + pp - 1); }

double dt_plan_zero_bytes(int zero, int d, double grad_bytes) {
    if (d <= 1) return 0;
    return (zero >= 3 ? 3.0 : 2.0) * (d - 1) / d * grad_bytes;
}

double dt_plan_tp_bytes(const dt_gpt_config *g, int b, int t) {
    if (t <= 1) return 0;
    const double ring = 2.0 * (t - 1) / t, bsh = (double)b * g->T * g->C * 4;
    return (4.0 * bsh * g->L + 2.0 * bsh + 3.0 * b * g->T * 4) * ring;
}

double dt_plan_oversub(int ranks, int cores, double busy) {
    if (cores < 1) cores = 1;
    if (busy < 0) busy = 0;
    const double with = (busy + ranks) / cores, alone = (busy + 1) / cores;
    return (with > 1 ? with : 1) / (alone > 1 ? alone : 1);
}

int dt_plan_axis_level(const dt_plan_cluster *c, int stride, int ranks) {
    if (ranks <= 1 || c->hosts <= 1) return DT_PLAN_INTRA;
    return stride * ranks <= c->ranks_per_host && c->ranks_per_host % (stride * ranks) == 0 ? DT_PLAN_INTRA
                                                                                            : DT_PLAN_INTER;
}

/* One rank's bandwidth and latency on a level: a host's inter-node links are shared by its ranks. */
static dt_plan_link rank_link(const dt_plan_cluster *c, int level) {
    dt_plan_link l = c->link[level];
    if (level == DT_PLAN_INTER && c->ranks_per_host > 1) l.bw /= c->ranks_per_host;
    return l;
}

/* Seconds of node i's forward + backward at batch b on one rank of tensor-parallel degree tp. */
static double node_s(const dt_plan_model *pm, const dt_plan_cluster *c, int prec, int i, int b, int tp) {
    const double div = pm->split[i] && tp > 1 ? tp : 1, slow = c->oversub > 1 ? c->oversub : 1;
    if (pm->t_per) return slow * (pm->t_fix[i] + pm->t_per[i] * b / div);
    const double peak = c->peak[prec] > 0 ? c->peak[prec] : c->peak[DT_PLAN_FP32];
    const double f = pm->flops[i] * b / div / (peak * c->efficiency), m = pm->bytes[i] * b / div / c->mem_bw;
    return slow * ((f > m ? f : m) + 2 * c->node_overhead);
}

/* A stage's compute per micro-batch and its parameters (a tp-th where tp splits them). */
static void stage_cost(const dt_plan_model *pm, const dt_plan_cluster *c, const dt_plan_layout *l, int lo, int hi,
                       int b, double *t, double *params) {
    *t = 0, *params = 0;
    for (int i = lo; i < hi; i++) {
        *t += node_s(pm, c, l->prec, i, b, l->tp);
        *params += pm->split[i] && l->tp > 1 ? pm->params[i] / l->tp : pm->params[i];
    }
}

int dt_plan_dp_waits(int zero, int compress, int dp) { return dp > 1 && zero == 0 && compress == DT_PLAN_FP32 ? 1 : 0; }

/* ZeRO-3's parameters still gathered when the backward starts, in values: zero_params.c frees
 * every bucket but those the forward's last node reads, and ddp.c cuts the buckets from the last
 * layer backwards, a bucket closing once it reaches bucket_mb: the first such bucket. */
static double zero3_kept(const dt_plan_model *pm, double bucket_mb) {
    const double cap = (bucket_mb > 0 ? bucket_mb : 1) * 1048576.0 / 4;
    double acc = 0;
    for (int i = pm->nodes - 1; i >= 0; i--)
        if ((acc += pm->params[i]) >= cap) break;
    return acc;
}

/* Exposed seconds of the data-parallel axis: the gradient sync of `params` values (and ZeRO's
 * gathers), as parallel/ddp.c and zero.c run it. ddp's allreduce of each bucket starts when the
 * backward completes it and hides behind the rest of the backward (bwd seconds) as far as the
 * cluster's overlap allows, never the last bucket. ZeRO 1-3 reduce-scatter the same way (each
 * starts its last bucket in the hook); ZeRO 1-2 then all-gather the updated parameters, blocking,
 * after the optimizer; ZeRO-3 instead gathers each layer's parameters before its forward and,
 * unless they are still gathered (zero3_kept), before its backward, hidden behind them as the
 * overlap allows. A collective the rank's thread runs blocking right after the backward (ddp's
 * last bucket) also waits coll_wait (dt_plan_dp_waits). */
static double dp_exposed(const dt_plan_model *pm, const dt_plan_cluster *c, const dt_plan_layout *l, double params,
                         double bwd, double fwd, dt_plan_cost *o) {
    const int d = l->dp;
    if (d <= 1) return 0;
    const double S = params * (l->compress ? 2 : 4);
    const double mb = l->bucket_mb > 0 ? l->bucket_mb : 1;
    const double nb = ceil(params * 4 / (mb * 1048576.0)) > 1 ? ceil(params * 4 / (mb * 1048576.0)) : 1;
    o->dp_level = dt_plan_axis_level(c, l->tp * l->pp, d);
    const double waits = dt_plan_dp_waits(l->zero, l->compress, d) * c->coll_wait;
    if (l->compress >= DT_PLAN_TOPK) { /* per bucket like ddp's allreduce, hidden as far as the backward allows */
        const dt_plan_link lk = rank_link(c, o->dp_level);
        const double calls = l->compress == DT_PLAN_POWERSGD ? 2 : 1;
        const double sync = dt_plan_sync_s(pm, params, d, l->compress, l->cparam, lk, &o->dp_bytes) +
                            (nb - 1) * calls * (d - 1) * lk.lat,
                     hide = c->overlap * bwd;
        return (sync - hide > sync / nb ? sync - hide : sync / nb) + waits;
    }
    o->dp_bytes = dt_plan_zero_bytes(l->zero, d, S);
    const dt_plan_link in = c->link[DT_PLAN_INTRA], lk = rank_link(c, o->dp_level);
    /* reduce-scatter then all-gather (an allreduce is both); hierarchical across hosts: within the
     * host over k ranks, then the k-th share between the hosts */
    const int k = o->dp_level == DT_PLAN_INTER ? c->ranks_per_host / (l->tp * l->pp) : d;
    const int h = o->dp_level == DT_PLAN_INTER && k >= 1 ? d / (k > 0 ? k : 1) : 1;
    const bool hier = o->dp_level == DT_PLAN_INTER && k > 1;
    const double local = hier ? dt_plan_ring_half_s(S, k, in) : 0;
    const double wide = hier ? dt_plan_ring_half_s(S / k, h, lk) : dt_plan_ring_half_s(S, d, lk);
    const double lats = (nb - 1) * (d - 1) * lk.lat; /* every bucket pays the ring's latency */
    const double half = local + wide + lats;
    const double hide = l->pp > 1 ? 0 : c->overlap * bwd; /* a pipeline syncs after its flush */
    if (l->zero == 0) {                                   /* the allreduce's volume under the backward */
        const double sync = 2 * half;
        return (sync - hide > sync / nb ? sync - hide : sync / nb) + waits;
    }
    /* ZeRO's own reduce-scatter (MPI's is not a ring: rs_factor) under the backward */
    const double rsf = lk.rs_factor > 0 ? lk.rs_factor : 1, rs = local + rsf * wide + lats;
    double exposed = (rs - hide > rs / nb ? rs - hide : rs / nb) + waits;
    if (l->zero <= 2) return exposed + half; /* the parameters' all-gather after the update */
    /* a gather before the forward, and before the backward of every bucket not still gathered (the
     * whole model's buckets: a tp or pp rank's are taken as all re-gathered) */
    const double kept = l->tp == 1 && l->pp == 1 ? zero3_kept(pm, l->bucket_mb) : 0;
    const double again = params > kept ? (params - kept) / params : 0;
    o->dp_bytes = dt_plan_zero_bytes(2, d, S) + (double)(d - 1) / d * S * again;
    const double g = (1 + again) * half, h3 = c->overlap * (fwd + bwd);
    return exposed + (g - h3 > g / nb ? g - h3 : g / nb);
}

double dt_plan_pipeline_s(int pp, int M, int gpipe, double busy_max, double fb_at_max, double fb_sum, double lat,
                          double wire) {
    if (pp <= 1) return busy_max;
    const double link = (gpipe ? 2.0 : 1.0) * M * wire, msg = lat + wire;
    const double a = (busy_max > link ? busy_max : link) + (fb_sum - fb_at_max) + 2.0 * (pp - 1) * msg;
    if (gpipe) return a;
    const double loop = ceil((double)M / pp) * (fb_sum + 2.0 * (pp - 1) * msg);
    return loop > a ? loop : a;
}

void dt_plan_predict(const dt_plan_model *pm, const dt_plan_cluster *c, const dt_plan_layout *l, int G, int moments,
                     const int *first, dt_plan_cost *o) {
    memset(o, 0, sizeof *o);
    const int nm = l->micro > 0 ? l->micro : 1, b = G / l->dp / nm;
    double tp_mb = 0; /* a stage's tensor-parallel allreduces per micro-batch, on its critical path */
    if (l->tp > 1 && pm->gpt) {
        o->tp_level = dt_plan_axis_level(c, 1, l->tp);
        const dt_plan_link lk = rank_link(c, o->tp_level);
        dt_gpt_config st = pm->g; /* a stage's blocks: a pipeline splits them */
        st.L = (pm->g.L + l->pp - 1) / l->pp;
        const double per = dt_plan_tp_bytes(&st, b, l->tp), calls = 4.0 * st.L + 5;
        o->tp_bytes = nm * per;
        tp_mb = per / lk.bw + calls * 2.0 * (l->tp - 1) * lk.lat;
        o->comm_tp = nm * tp_mb;
    }
    /* per stage: forward + backward of a micro-batch (fb) and the busy time of the step, with the
     * forwards pp_step.c recomputes (a stage holds one micro-batch's activations: 1F1B recomputes
     * each of a non-last stage's micro-batches, GPipe all but the last one on every stage; a
     * forward taken as a third of fb) */
    double crit = 0, pmax = 0, cut = 0, fb_sum = 0, busy_max = 0, fb_at_max = 0;
    for (int s = 0; s < l->pp; s++) {
        double t, p;
        stage_cost(pm, c, l, first[s], first[s + 1], b, &t, &p);
        const int rec = l->pp <= 1 ? 0 : l->gpipe ? nm - 1 : s + 1 < l->pp ? nm : 0;
        const double busy = nm * (t + tp_mb) + rec * t / 3;
        if (t > crit) crit = t;
        if (busy > busy_max) busy_max = busy, fb_at_max = t + tp_mb;
        fb_sum += t + tp_mb;
        if (p > pmax) pmax = p;
        if (s + 1 < l->pp && pm->out_bytes[first[s + 1] - 1] > cut) cut = pm->out_bytes[first[s + 1] - 1];
    }
    o->compute = busy_max - o->comm_tp;
    if (l->pp > 1) {
        o->pp_level = dt_plan_axis_level(c, l->tp, l->pp);
        const dt_plan_link lk = rank_link(c, o->pp_level);
        o->pp_bytes = nm * cut * b * 2;
        /* the fill and drain through the other stages; the rest beyond the busiest stage's work: the
         * sends, and 1F1B's wait for its in-flight micro-batches' round trips */
        o->bubble = fb_sum - fb_at_max;
        o->comm_pp = dt_plan_pipeline_s(l->pp, nm, l->gpipe, busy_max, fb_at_max, fb_sum, lk.lat, cut * b / lk.bw) -
                     busy_max - o->bubble;
    }
    /* the update reads parameters and gradients, writes parameters, reads and writes each moment */
    const double owned = l->zero >= 1 && l->dp > 1 ? pmax / l->dp : pmax;
    const double slow = c->oversub > 1 ? c->oversub : 1; /* the update and the casts share the cores too */
    const double per_value = pm->opt_per > 0 ? pm->opt_per : 4.0 * (3 + 2 * moments) / c->mem_bw;
    o->optim = owned * per_value;
    if (l->algo == DT_PLAN_LOCALSGD) { /* no gradient sync; the models averaged every H steps, blocking */
        o->dp_level = dt_plan_axis_level(c, 1, l->dp);
        o->dp_bytes = 2.0 * (l->dp - 1) / l->dp * pmax * 4 / l->sync_every;
        o->comm_dp = (dt_plan_ring_allreduce_s(pmax * 4, l->dp, rank_link(c, o->dp_level)) + c->coll_wait) /
                     l->sync_every;
    } else if (l->algo == DT_PLAN_PS) { /* push, the server's update of its shard, pull; no update here */
        o->dp_level = dt_plan_axis_level(c, 1, l->dp + l->servers);
        o->dp_bytes = 2 * pmax * 4;
        o->comm_dp = dt_plan_ps_s(pmax, l->dp, l->servers, rank_link(c, o->dp_level)) + c->coll_wait;
        o->optim = pmax / l->servers * per_value;
    } else {
        o->comm_dp = dp_exposed(pm, c, l, pmax, crit * 2.0 / 3.0, crit / 3.0, o);
    }
    o->comm = o->comm_tp + o->comm_pp + o->comm_dp;
    if (l->compress == DT_PLAN_BF16 || l->compress == DT_PLAN_FP16)
        o->optim += pmax * 4 * 2 / c->mem_bw; /* the casts */
    if (l->compress == DT_PLAN_TOPK) /* |v|, the selection, the pairs, the sum of the peers' pairs, the feedback */
        o->optim += pmax * 4 * 6 / c->mem_bw;
    if (l->compress == DT_PLAN_POWERSGD) { /* P = M Q and Q = M^T P (4 r flops a value), the error feedback */
        const double peak = c->peak[l->prec] > 0 ? c->peak[l->prec] : c->peak[DT_PLAN_FP32];
        o->optim += pmax * 4 * 5 / c->mem_bw + (peak > 0 ? 4 * l->cparam * pm->mat_params / (peak * c->efficiency) : 0);
    }
    o->optim *= slow;
    /* a pipeline's stages share the per-sample work beyond the nodes: the first loads the data, the
     * last computes the loss, at the same time */
    o->overhead = c->step_overhead + slow * (pm->ovh_fix + pm->ovh_per * (double)G / l->dp / l->pp);
    o->total = o->compute + o->comm + o->bubble + o->optim + o->overhead;
}
