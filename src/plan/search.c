/* The planner's search: every layout dtrain can run on the request's ranks (DP x TP x PP degrees,
 * ZeRO stage, pipeline micro-batches and schedule, gradient accumulation, ddp compression,
 * precision and bucket size; when asked, top-k, PowerSGD, localsgd and ps), pruned by the memory
 * per rank of the --dry-run model (cached per distinct memory layout: the cost model alone is
 * scored per layout), ranked fitting-and-fastest first; and the words for a layout: its flags, its name, why it loses.
 */
#include "plan/plan.h"
#include "parallel/pp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_prec[DT_PLAN_NPREC] = {"fp32", "bf16", "fp16"};
static const double g_buckets[] = {0.25, 1, 4, 16, 64};
static const double g_topk[] = {0.01, 0.1};   /* the ratios of --compress topk the search tries */
static const double g_powersgd[] = {1, 4};    /* the ranks of --compress powersgd */
static const int g_sync_every[] = {4, 8, 16}; /* localsgd's --sync-every */

/* The memory model's parts, cached: a rank's state (parameters, gradients, optimizer, ZeRO's
 * buckets in flight and gathers) depends on the mesh, the stage and ZeRO, not on the batch; its
 * activations on tp and the micro-batch only (memplan.c: every node's, whatever the stage). */
typedef struct {
    int tp, pp, dp, zero, b; /* b < 0: a state entry; else an activations entry (tp, b) */
    double bucket, bytes;
    double sync; /* a state entry: the fullest rank's more at evaluation or a checkpoint */
} mem_key;

typedef struct {
    dt_model *m;
    const dt_optim_config *o;
    mem_key *k;
    int n, cap;
    double extra; /* bytes every rank holds beside the model (the loader's copy) */
} mem_cache;

static const mem_key *find(const mem_cache *mc, const mem_key *q) {
    for (int i = 0; i < mc->n; i++) {
        const mem_key *k = &mc->k[i];
        if (k->tp == q->tp && k->pp == q->pp && k->dp == q->dp && k->zero == q->zero && k->b == q->b &&
            k->bucket == q->bucket)
            return k;
    }
    return NULL;
}

static dt_status remember(mem_cache *mc, const mem_key *q) {
    if (mc->n == mc->cap) {
        const int cap = mc->cap ? 2 * mc->cap : 64;
        mem_key *k = realloc(mc->k, (size_t)cap * sizeof *k);
        if (!k) return dt_error(DT_ENOMEM, "plan: out of memory");
        mc->k = k, mc->cap = cap;
    }
    mc->k[mc->n++] = *q;
    return DT_OK;
}

/* The fullest rank's bytes under l at micro-batch b: dt_mem_plan_rank (the --dry-run model) over
 * the stages of the first and last model copies (ZeRO's last rank owns the remainders; the
 * tensor-parallel ranks of a stage hold the same), its parts cached; into *sync the most any of
 * them holds more while evaluation or a checkpoint gathers the model (--dry-run's 'at eval/ckpt'). */
static dt_status layout_mem(mem_cache *mc, const dt_plan_layout *l, int b, double *out, double *sync) {
    const double bucket = l->zero >= 1 && l->dp > 1 ? l->bucket_mb : 0;
    mem_key st = {l->tp, l->pp, l->dp, l->dp > 1 ? l->zero : 0, -1, bucket, 0, 0};
    mem_key act = {l->tp, 1, 1, 0, b, 0, 0, 0};
    const mem_key *hs = find(mc, &st), *ha = find(mc, &act);
    if (!hs || !ha) {
        const dt_mem_layout ml = {.dp = l->dp,
                                  .tp = l->tp,
                                  .pp = l->pp,
                                  .zero = st.zero,
                                  .microbatches = l->micro,
                                  .schedule = l->pp > 1 ? (l->gpipe ? "gpipe" : "1f1b") : NULL,
                                  .batch = b,
                                  .bucket_mb = bucket > 0 ? bucket : 1};
        double worst = 0, acts = 0, worst_sync = 0;
        const int last = st.zero > 0 ? l->dp - 1 : 0; /* without ZeRO every model copy holds the same */
        for (int dpi = 0; dpi <= last; dpi = dpi == 0 && last > 1 ? last : dpi + 1)
            for (int stage = 0; stage < l->pp && (!hs || !ha); stage++) {
                dt_mem_plan p;
                DT_TRY(dt_mem_plan_rank(mc->m, mc->o, &ml, (dpi * l->pp + stage) * l->tp, &p));
                if (p.total - p.activations > worst) worst = p.total - p.activations;
                if (p.total - p.activations + p.sync > worst_sync) worst_sync = p.total - p.activations + p.sync;
                acts = p.activations;
                if (hs) break; /* only the activations were missing: one rank tells */
            }
        st.bytes = worst, st.sync = worst_sync > worst ? worst_sync - worst : 0, act.bytes = acts;
        if (!hs) DT_TRY(remember(mc, &st));
        if (!ha) DT_TRY(remember(mc, &act));
        hs = find(mc, &st), ha = find(mc, &act);
    }
    *out = hs->bytes + ha->bytes + mc->extra;
    *sync = hs->sync;
    return DT_OK;
}

/* Bytes a rank holds beside the ddp layout of the same mesh: the lossy compressors' state (top-k:
 * the unsent values, their magnitudes and every rank's pairs; PowerSGD: the error and Q) and a ps
 * server's shard of the optimizer state is left to the ddp figure it stays under. */
static double algo_mem(const dt_plan_layout *l, double params) {
    if (l->compress == DT_PLAN_TOPK) return params * 4 * 2 + l->dp * ceil(l->cparam * params) * 8;
    if (l->compress == DT_PLAN_POWERSGD) return params * 4 * 2;
    return 0;
}

static dt_status push(dt_plan_result *res, const dt_plan_entry *e) {
    if (res->n == res->cap) {
        const int cap = res->cap ? 2 * res->cap : 1024;
        dt_plan_entry *x = realloc(res->e, (size_t)cap * sizeof *x);
        if (!x) return dt_error(DT_ENOMEM, "plan: out of memory for %d layouts", cap);
        res->e = x, res->cap = cap;
    }
    res->e[res->n++] = *e;
    return DT_OK;
}

/* A layout's complexity, to break ties towards the simpler one. */
static int complexity(const dt_plan_layout *l) {
    return l->zero + 2 * (l->tp > 1) + 2 * (l->pp > 1) + (l->compress > 0) + 2 * (l->compress >= DT_PLAN_TOPK) +
           (l->micro > 1) + (l->prec > 0) + 3 * (l->algo != DT_PLAN_SYNC);
}

static int by_time(const void *a, const void *b) {
    const dt_plan_entry *x = a, *y = b;
    if (x->c.total != y->c.total) return x->c.total < y->c.total ? -1 : 1;
    return complexity(&x->l) - complexity(&y->l);
}

static int by_rank(const void *a, const void *b) {
    const dt_plan_entry *x = a, *y = b;
    if (x->c.fits != y->c.fits) return x->c.fits ? -1 : 1;
    if (x->c.total != y->c.total) return x->c.total < y->c.total ? -1 : 1;
    return complexity(&x->l) - complexity(&y->l);
}

typedef struct {
    dt_model *m;
    const dt_plan_model *pm;
    const dt_plan_cluster *c;
    const dt_plan_request *r;
    int moments;
    double limit;
    mem_cache mc;
    dt_plan_result *res;
} search_ctx;

/* Predicts l's step and keeps it (its memory comes later, in rank order). */
static dt_status score(search_ctx *s, const dt_plan_layout *l, const int *first) {
    dt_plan_entry e = {.l = *l};
    dt_plan_predict(s->pm, s->c, l, s->r->G, s->moments, first, &e.c);
    e.c.mem = -1; /* not yet known */
    s->res->scored++;
    return push(s->res, &e);
}

/* Every option on top of the mesh (dp, tp, pp) with pipeline cut first[]. */
static dt_status options(search_ctx *s, int dp, int tp, int pp, const int *first) {
    const int rb = s->r->G / dp; /* samples per model copy per step */
    for (int prec = 0; prec < DT_PLAN_NPREC; prec++) {
        if (!(s->r->precs & (1 << prec)) || (!s->pm->t_per && s->c->peak[prec] <= 0)) continue;
        for (int zero = 0; zero <= (dp > 1 ? 3 : 0); zero++) {
            if (s->r->fix_zero >= 0 && zero != s->r->fix_zero) continue;
            /* a pipeline syncs each stage's gradients in one allreduce: no buckets (train refuses --bucket-mb) */
            const int nbk = dp > 1 && pp == 1 ? (int)(sizeof g_buckets / sizeof *g_buckets) : 1;
            for (int bk = 0; bk < nbk; bk++)
                for (int micro = pp > 1 ? pp : 1; micro <= rb && micro <= 512; micro++) {
                    if (rb % micro) continue; /* every divisor: a pipeline's M, or the accumulation steps */
                    for (int gp = 0; gp <= (pp > 1); gp++)
                        for (int cmp = 0; cmp <= (dp > 1 && zero == 0 && tp == 1 && pp == 1 ? 4 : 0); cmp++) {
                            const double *par = cmp == DT_PLAN_TOPK ? g_topk : g_powersgd;
                            const int lossy = cmp >= DT_PLAN_TOPK, np = lossy ? 2 : 1;
                            if (cmp == DT_PLAN_TOPK && !(s->r->algos & DT_PLAN_ALGO_TOPK)) continue;
                            if (cmp == DT_PLAN_POWERSGD && !(s->r->algos & DT_PLAN_ALGO_POWERSGD)) continue;
                            for (int k = 0; k < np; k++) {
                                const dt_plan_layout l = {.dp = dp,
                                                          .tp = tp,
                                                          .pp = pp,
                                                          .zero = zero,
                                                          .micro = micro,
                                                          .gpipe = gp,
                                                          .compress = cmp,
                                                          .cparam = lossy ? par[k] : 0,
                                                          .prec = prec,
                                                          .bucket_mb = dp > 1 && pp == 1 ? g_buckets[bk] : 1};
                                DT_TRY(score(s, &l, first));
                            }
                        }
                }
        }
    }
    return DT_OK;
}

/* The layouts that change the algorithm on all W ranks: localsgd over W replicas (every
 * --sync-every of the list) and ps with S servers and W - S workers (S up to W / 2, the workers
 * dividing G), fp32 without accumulation. */
static dt_status algorithms(search_ctx *s, int W) {
    const int first[2] = {0, s->pm->nodes};
    for (int k = 0; (s->r->algos & DT_PLAN_ALGO_LOCALSGD) && W > 1 && s->r->G % W == 0 &&
                    k < (int)(sizeof g_sync_every / sizeof *g_sync_every);
         k++) {
        const dt_plan_layout l = {.dp = W,
                                  .tp = 1,
                                  .pp = 1,
                                  .micro = 1,
                                  .bucket_mb = 1,
                                  .algo = DT_PLAN_LOCALSGD,
                                  .sync_every = g_sync_every[k]};
        DT_TRY(score(s, &l, first));
    }
    for (int S = 1; (s->r->algos & DT_PLAN_ALGO_PS) && S <= W / 2; S++) {
        if (s->r->G % (W - S)) continue;
        const dt_plan_layout l = {
            .dp = W - S, .tp = 1, .pp = 1, .micro = 1, .bucket_mb = 1, .algo = DT_PLAN_PS, .servers = S};
        DT_TRY(score(s, &l, first));
    }
    return DT_OK;
}

int dt_plan_family(const dt_plan_layout *l) {
    if (l->algo == DT_PLAN_LOCALSGD) return 200000;
    if (l->algo == DT_PLAN_PS) return 300000 + l->servers;
    if (l->compress >= DT_PLAN_TOPK) return 400000 + l->compress;
    if (l->tp > 1 && l->pp > 1) return 100000;
    if (l->tp > 1) return 1000 + l->tp;
    if (l->pp > 1) return 10000 + l->pp;
    return l->dp > 1 ? l->zero : -1;
}

/* Prunes by memory in the order of predicted time: the memory of a layout is planned until the
 * request's top layouts fit and every family seen has its fastest fitting layout (a family none
 * of whose layouts fits is planned to the end), at most DT_PLAN_MEM_BUDGET layouts (a deep
 * pipeline's memory plan cuts the graph per stage). Layouts left unplanned count as not fitting
 * (mem -1). */
static dt_status prune(search_ctx *s) {
    dt_plan_result *res = s->res;
    int fam[256], nf = 0, found = 0;
    const int want = s->r->want > 0 ? s->r->want : 5;
    const double t0 = dt_now();
    for (int i = 0; i < res->n && res->planned < DT_PLAN_MEM_BUDGET; i++) {
        dt_plan_entry *e = &res->e[i];
        const int f = dt_plan_family(&e->l);
        bool done = false;
        for (int k = 0; k < nf && !done; k++) done = fam[k] == f;
        if (done && found >= want) continue;
        const int b = s->r->G / e->l.dp / (e->l.micro > 0 ? e->l.micro : 1);
        DT_TRY(layout_mem(&s->mc, &e->l, b, &e->c.mem, &e->c.mem_sync));
        e->c.mem += algo_mem(&e->l, s->pm->total_params);
        /* as --dry-run's verdict: the gather counts where the run saves, or evaluates under ZeRO-3 */
        e->c.sync_counts = e->c.mem_sync > 0 && (s->r->saves || (s->r->evals && e->l.zero >= 3 && e->l.dp > 1));
        e->c.fits = e->c.mem + (e->c.sync_counts ? e->c.mem_sync : 0) <= s->limit;
        res->planned++;
        if (e->c.fits) found++;
        if (e->c.fits && !done && nf < 256) fam[nf++] = f;
    }
    res->mem_s = dt_now() - t0;
    return DT_OK;
}

static dt_status meshes(search_ctx *s) {
    const int W = s->r->ranks;
    for (int tp = 1; tp <= W; tp++) {
        if (W % tp || (s->r->fix_tp >= 0 && tp != s->r->fix_tp)) continue;
        if (tp > 1 && (!s->pm->gpt || dt_gpt_check_tp(&s->pm->g, tp) != DT_OK)) continue;
        for (int pp = 1; pp <= W / tp && pp <= DT_PP_MAX_STAGES; pp++) {
            if ((W / tp) % pp || (s->r->fix_pp >= 0 && pp != s->r->fix_pp)) continue;
            const int dp = W / (tp * pp);
            if (s->r->G % dp) continue;
            int first[DT_PP_MAX_STAGES + 1] = {0, s->pm->nodes};
            if (pp > 1 && dt_pp_cut(s->m, pp, "", NULL, first) != DT_OK) continue; /* too few cuts */
            DT_TRY(options(s, dp, tp, pp, first));
        }
    }
    return s->r->fix_tp > 1 || s->r->fix_pp > 1 || s->r->fix_zero > 0 ? DT_OK : algorithms(s, W);
}

dt_status dt_plan_search(dt_model *m, const dt_plan_model *pm, const dt_optim_config *o, const dt_plan_cluster *c,
                         const dt_plan_request *r, dt_plan_result *res) {
    memset(res, 0, sizeof *res);
    if (r->ranks < 1 || r->G < 1)
        return dt_error(DT_EINVAL, "plan: %d ranks, global batch %d: need at least 1 of each", r->ranks, r->G);
    const double t0 = dt_now();
    search_ctx s = {.m = m,
                    .pm = pm,
                    .c = c,
                    .r = r,
                    .res = res,
                    .moments = o->kind != DT_OPTIM_SGD ? 2
                               : o->momentum > 0       ? 1
                                                       : 0,
                    .limit = r->mem_limit > 0 ? r->mem_limit : c->mem_bytes,
                    .mc = {.m = m, .o = o, .extra = r->extra}};
    dt_status st = meshes(&s);
    if (st != DT_OK) {
        free(s.mc.k);
        dt_plan_result_free(res);
        return st;
    }
    qsort(res->e, (size_t)res->n, sizeof *res->e, by_time);
    res->cost_s = dt_now() - t0;
    st = prune(&s);
    free(s.mc.k);
    if (st != DT_OK) {
        dt_plan_result_free(res);
        return st;
    }
    qsort(res->e, (size_t)res->n, sizeof *res->e, by_rank);
    res->search_s = dt_now() - t0;
    if (!res->n && (r->fix_tp > 1 || r->fix_pp > 1))
        return dt_error(
            DT_EINVAL,
            "plan: no layout of %d ranks with%s%.0d%s%.0d at global batch %d (tp must divide "
            "the ranks and a GPT's heads, width and vocabulary; pp the ranks, within the graph's valid cuts)",
            r->ranks, r->fix_tp > 1 ? " tp " : "", r->fix_tp > 1 ? r->fix_tp : 0, r->fix_pp > 1 ? " pp " : "",
            r->fix_pp > 1 ? r->fix_pp : 0, r->G);
    if (!res->n)
        return dt_error(DT_EINVAL,
                        "plan: no layout of %d ranks divides the global batch %d (use a batch that the "
                        "data-parallel ranks divide, or other `workers`)",
                        r->ranks, r->G);
    return DT_OK;
}

void dt_plan_result_free(dt_plan_result *res) {
    if (!res) return;
    free(res->e);
    memset(res, 0, sizeof *res);
}

void dt_plan_flags(const dt_plan_layout *l, int G, char *buf, size_t cap) {
    const int W = l->dp * l->tp * l->pp, micro = l->micro > 0 ? l->micro : 1;
    const int batch = l->pp > 1 ? G / l->dp : G / l->dp / micro;
    int n = snprintf(buf, cap, "--workers %d --batch %d", W, batch);
    if (l->algo == DT_PLAN_LOCALSGD)
        n += snprintf(buf + n, cap - (size_t)n, " --strategy localsgd --sync-every %d", l->sync_every);
    if (l->algo == DT_PLAN_PS) n += snprintf(buf + n, cap - (size_t)n, " --strategy ps --servers %d", l->servers);
    if (l->compress == DT_PLAN_TOPK) n += snprintf(buf + n, cap - (size_t)n, " --compress topk:%g", l->cparam);
    if (l->compress == DT_PLAN_POWERSGD) n += snprintf(buf + n, cap - (size_t)n, " --compress powersgd:%g", l->cparam);
    if (l->tp > 1) n += snprintf(buf + n, cap - (size_t)n, " --tp %d", l->tp);
    if (l->pp > 1)
        n += snprintf(buf + n, cap - (size_t)n, " --pp %d --microbatches %d --pp-schedule %s", l->pp, micro,
                      l->gpipe ? "gpipe" : "1f1b");
    if (l->pp == 1 && micro > 1) n += snprintf(buf + n, cap - (size_t)n, " --grad-accum %d", micro);
    if (l->dp > 1 && l->zero > 0) n += snprintf(buf + n, cap - (size_t)n, " --zero %d", l->zero);
    if (l->compress && l->compress < DT_PLAN_TOPK)
        n += snprintf(buf + n, cap - (size_t)n, " --compress %s", g_prec[l->compress]);
    if (l->dp > 1 && l->pp == 1 && l->bucket_mb != 1)
        n += snprintf(buf + n, cap - (size_t)n, " --bucket-mb %g", l->bucket_mb);
    if (l->prec) snprintf(buf + n, cap - (size_t)n, " --precision %s", g_prec[l->prec]);
}

void dt_plan_name(const dt_plan_layout *l, char *buf, size_t cap) {
    int n = 0;
    buf[0] = '\0';
#define ADD(...) n += snprintf(buf + n, cap > (size_t)n ? cap - (size_t)n : 0, __VA_ARGS__)
    if (l->dp > 1) ADD("dp%d", l->dp);
    if (l->algo == DT_PLAN_LOCALSGD) n = 0, ADD("localsgd%d h%d", l->dp, l->sync_every);
    if (l->algo == DT_PLAN_PS) n = 0, ADD("ps %d servers + %d workers", l->servers, l->dp);
    if (l->dp > 1 && l->zero) ADD(" zero%d", l->zero);
    if (l->tp > 1) ADD("%stp%d", n ? " x " : "", l->tp);
    if (l->pp > 1) ADD("%spp%d %s m%d", n ? " x " : "", l->pp, l->gpipe ? "gpipe" : "1f1b", l->micro);
    if (!n) ADD("1 rank");
    if (l->pp == 1 && l->micro > 1) ADD(" accum%d", l->micro);
    if (l->compress && l->compress < DT_PLAN_TOPK) ADD(" %s-grads", g_prec[l->compress]);
    if (l->compress == DT_PLAN_TOPK) ADD(" topk%g", l->cparam);
    if (l->compress == DT_PLAN_POWERSGD) ADD(" powersgd%g", l->cparam);
    if (l->prec) ADD(" %s", g_prec[l->prec]);
#undef ADD
}

static const char *level_name(int level) { return level == DT_PLAN_INTER ? "inter-node" : "intra-node"; }

void dt_plan_why(const dt_plan_entry *alt, const dt_plan_entry *best, const dt_plan_cluster *c, double limit, char *buf,
                 size_t cap) {
    char name[96];
    dt_plan_name(&alt->l, name, sizeof name);
    if (!alt->c.fits) {
        const bool gb = limit >= 1e9, at_sync = alt->c.mem >= 0 && alt->c.mem <= limit;
        const double need = alt->c.mem + (at_sync ? alt->c.mem_sync : 0);
        snprintf(buf, cap, "%s does not fit: %.*f %s per rank%s against %.*f", name, gb ? 2 : 1,
                 need / (gb ? 1e9 : 1e6), gb ? "GB" : "MB",
                 at_sync ? " while evaluation or a checkpoint gathers the model" : "", gb ? 2 : 1,
                 limit / (gb ? 1e9 : 1e6));
        return;
    }
    const dt_plan_cost *a = &alt->c, *b = &best->c;
    const double d[5] = {a->compute - b->compute, a->comm_tp - b->comm_tp, a->comm_dp - b->comm_dp,
                         a->bubble + a->comm_pp - b->bubble - b->comm_pp, a->optim - b->optim};
    int k = 0;
    for (int i = 1; i < 5; i++)
        if (d[i] > d[k]) k = i;
    const double slower = b->total > 0 ? 100.0 * (a->total / b->total - 1) : 0;
    int n = snprintf(buf, cap, "%s is %.0f%% slower (%.4g ms per step): ", name, slower, a->total * 1e3);
    char *p = buf + n;
    const size_t left = cap > (size_t)n ? cap - (size_t)n : 0;
    const double bw_tp = c->link[a->tp_level].bw * 8 / 1e9, bw_dp = c->link[a->dp_level].bw * 8 / 1e9;
    if (k == 1)
        snprintf(p, left, "tp %d would send %.3g MB per step through a %.3g Gbit/s %s link: %.3g ms exposed", alt->l.tp,
                 a->tp_bytes / 1e6, bw_tp, level_name(a->tp_level), a->comm_tp * 1e3);
    else if (k == 2 && alt->l.algo == DT_PLAN_LOCALSGD)
        snprintf(p, left,
                 "its model average every %d steps sends %.3g MB per step over a %.3g Gbit/s %s link: %.3g "
                 "ms",
                 alt->l.sync_every, a->dp_bytes / 1e6, bw_dp, level_name(a->dp_level), a->comm_dp * 1e3);
    else if (k == 2 && alt->l.algo == DT_PLAN_PS)
        snprintf(p, left,
                 "each worker pushes and pulls %.3g MB per step through %d server%s over a %.3g Gbit/s %s "
                 "link: %.3g ms",
                 a->dp_bytes / 1e6, alt->l.servers, alt->l.servers > 1 ? "s" : "", bw_dp, level_name(a->dp_level),
                 a->comm_dp * 1e3);
    else if (k == 2)
        snprintf(p, left, "its gradient sync sends %.3g MB per step over a %.3g Gbit/s %s link: %.3g ms exposed",
                 a->dp_bytes / 1e6, bw_dp, level_name(a->dp_level), a->comm_dp * 1e3);
    else if (k == 3)
        snprintf(p, left,
                 "the pipeline's bubble idles %.0f%% of each stage (%d of %d slots): %.3g ms, and its sends "
                 "%.3g ms",
                 100 * dt_plan_bubble_fraction(alt->l.pp, alt->l.micro), alt->l.pp - 1, alt->l.micro + alt->l.pp - 1,
                 a->bubble * 1e3, a->comm_pp * 1e3);
    else if (k == 4)
        snprintf(p, left, "its optimizer step takes %.3g ms against %.3g (unsharded state)", a->optim * 1e3,
                 b->optim * 1e3);
    else
        snprintf(p, left,
                 "it computes for %.4g ms per step against %.4g (smaller per-rank work runs less "
                 "efficiently, or it repeats work)",
                 a->compute * 1e3, b->compute * 1e3);
}
