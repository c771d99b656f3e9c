/* The collectives of a tensor-parallel GPT shard (tp.h), as node hooks of its graph (nn/ knows
 * no communication): the g operator (allreduce of a row-parallel c_proj's partial sums, forward),
 * the f operator (allreduce of a column-parallel layer's input gradient, backward), the
 * vocabulary-parallel embedding (foreign lookups zeroed, then summed) and head (its input
 * gradient summed), and the vocabulary-parallel loss. The tensor-parallel strategy (tp.c) and the
 * pipeline (pp_step.c, a stage of a tp x pp mesh) drive the same hooks: they map a step's ids into
 * the rank's slice, select the samples of the micro-batch the next forward or backward runs, and
 * take the loss and its logits' gradient from dt_tp_hooks_loss. */
#include "parallel/tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a node's hooks do. */
enum {
    ROLE_NONE = 0,
    ROLE_ROW,        /* row-parallel c_proj: allreduce its output (g); zero its bias gradient off rank 0 */
    ROLE_COL,        /* column-parallel c_attn / c_fc: allreduce its input's gradient (f) */
    ROLE_HEAD,       /* the tied head: allreduce its input's gradient */
    ROLE_EMBED,      /* the token embedding: zero lookups outside the slice, allreduce */
    ROLE_EMBED_GRAD, /* the embedding sum: zero the token rows outside the slice of its gradient */
};

struct dt_tp_hooks {
    dt_model *local;
    dt_node_hook_fn inner_before_forward, inner_after_backward, inner_before_backward;  /* chained (ZeRO's) */
    void *inner_ctx;
    dt_comm *comm;
    dt_gpt_config g;
    int K, r, world_rank;
    dt_trace *trace;
    const int64_t *step;
    unsigned char *role;      /* per node of local */
    int *src;                 /* per node: the node whose gradient ROLE_COL / ROLE_HEAD reduce */
    int wte;
    int32_t *ids;             /* the step's ids mapped into the rank's vocabulary slice */
    unsigned char *keep;      /* whether each id is in the slice */
    size_t cap;               /* samples ids/keep hold */
    float *dlogits, *work;
    size_t lcap;              /* samples dlogits/work hold */
    const unsigned char *cur_keep;
    int B;                    /* samples of the selected micro-batch */
    dt_status err;            /* the first failure inside a hook */
    double comm_s;            /* seconds in tp collectives since dt_tp_hooks_take_comm_s */
    dt_tp_counters cnt;
};

/* Wraps a failure on the tp axis: its ranks are world ranks (tp rank i = world rank base + i). */
static dt_status tp_fail(const dt_tp_hooks *h, dt_status st, const char *what, size_t n) {
    return dt_error_wrap(st, "tensor parallel: %s %zu (tp rank %d of %d; tp rank i is world rank %d+i)", what, n, h->r,
                         h->K, h->world_rank - h->r);
}

/* One allreduce (sum) of the tp axis from a hook; counts its bytes; records a failure. */
static void reduce(dt_tp_hooks *h, float *buf, size_t n, bool block) {
    if (h->err != DT_OK || !h->comm || h->K == 1) return;
    const uint64_t b0 = dt_comm_bytes(h->comm, NULL);
    const double t0 = dt_now();
    dt_status st = dt_comm_allreduce(h->comm, buf, buf, n, DT_F32, DT_OP_SUM);
    h->comm_s += dt_now() - t0;
    if (st != DT_OK) {
        h->err = tp_fail(h, st, "allreduce, values", n);
        return;
    }
    const uint64_t db = dt_comm_bytes(h->comm, NULL) - b0;
    if (block) h->cnt.block_bytes += db, h->cnt.block_ops++;
    else h->cnt.other_bytes += db;
    dt_trace_add(h->trace, "tp allreduce", 1, t0, dt_now(), h->step ? *h->step : 0);
}

static size_t btc(const dt_tp_hooks *h) { return (size_t)h->B * (size_t)h->g.T * (size_t)h->g.C; }

/* Zeroes the rows (of C values) of x whose id is outside the rank's slice. */
static void zero_foreign(const dt_tp_hooks *h, float *x) {
    const size_t n = (size_t)h->B * (size_t)h->g.T;
    for (size_t i = 0; i < n; i++)
        if (!h->cur_keep[i]) memset(x + i * (size_t)h->g.C, 0, (size_t)h->g.C * sizeof(float));
}

static void after_forward(void *ctx, int node) {
    dt_tp_hooks *h = ctx;
    switch (h->role[node]) {
    case ROLE_ROW: reduce(h, dt_model_node_values_mut(h->local, node), btc(h), true); break;
    case ROLE_EMBED: {
        float *v = dt_model_node_values_mut(h->local, node);
        zero_foreign(h, v);
        reduce(h, v, btc(h), false);
        break;
    }
    default: break;
    }
}

static void after_backward(void *ctx, int node) {
    dt_tp_hooks *h = ctx;
    switch (h->role[node]) {
    case ROLE_ROW:
        if (h->r != 0) {  /* the bias is rank 0's: the others hold zeros that must stay zeros */
            char name[96];
            snprintf(name, sizeof name, "%s.bias", dt_model_node_name(h->local, node));
            int k = dt_model_find_tensor(h->local, name);
            if (k >= 0) {
                const dt_param_info *b = dt_model_tensor(h->local, k);
                memset(dt_model_grads(h->local) + b->offset, 0, b->numel * sizeof(float));
            }
        }
        break;
    case ROLE_COL: reduce(h, dt_model_node_grad_mut(h->local, h->src[node]), btc(h), true); break;
    case ROLE_HEAD: reduce(h, dt_model_node_grad_mut(h->local, h->src[node]), btc(h), false); break;
    case ROLE_EMBED_GRAD: {
        float *g = dt_model_node_grad_mut(h->local, h->wte);
        if (g) zero_foreign(h, g);
        break;
    }
    default: break;
    }
}

static int find_node(const dt_model *m, const char *name) {
    for (int i = 0; i < dt_model_num_nodes(m); i++)
        if (!strcmp(dt_model_node_name(m, i), name)) return i;
    return -1;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The hooks' role of every node of the shard, by nanoGPT's module names. */
static dt_status assign_roles(dt_tp_hooks *h) {
    const int n = dt_model_num_nodes(h->local);
    h->role = calloc((size_t)n, 1), h->src = calloc((size_t)n, sizeof *h->src);
    if (!h->role || !h->src) return dt_error(DT_ENOMEM, "tensor parallel: out of memory");
    for (int i = 0; i < n; i++) {
        const char *nm = dt_model_node_name(h->local, i);
        const int len = (int)strlen(nm);
        char in[64] = "";  /* the layer norm a column-parallel layer reads: "<block>.ln_1" / "<block>.ln_2" */
        if (ends_with(nm, ".attn.c_proj") || ends_with(nm, ".mlp.c_proj")) h->role[i] = ROLE_ROW;
        else if (ends_with(nm, ".attn.c_attn"))
            h->role[i] = ROLE_COL, snprintf(in, sizeof in, "%.*s.ln_1", len - (int)strlen(".attn.c_attn"), nm);
        else if (ends_with(nm, ".mlp.c_fc"))
            h->role[i] = ROLE_COL, snprintf(in, sizeof in, "%.*s.ln_2", len - (int)strlen(".mlp.c_fc"), nm);
        else if (!strcmp(nm, "lm_head")) h->role[i] = ROLE_HEAD, snprintf(in, sizeof in, "transformer.ln_f");
        else if (!strcmp(nm, "transformer.wte")) h->role[i] = ROLE_EMBED, h->wte = i;
        else if (!strcmp(nm, "transformer.embed")) h->role[i] = ROLE_EMBED_GRAD;
        if (in[0] && (h->src[i] = find_node(h->local, in)) < 0)
            return dt_error(DT_EINTERNAL, "tensor parallel: node '%s' has no input '%s'", nm, in);
    }
    return DT_OK;
}

dt_status dt_tp_hooks_create(dt_tp_hooks **out, dt_model *local, const dt_gpt_config *g, dt_comm *comm, int K, int r,
                             int world_rank, dt_trace *trace, const int64_t *step) {
    *out = NULL;
    dt_tp_hooks *h = calloc(1, sizeof *h);
    if (!h) return dt_error(DT_ENOMEM, "tensor parallel: out of memory");
    *h = (dt_tp_hooks){.local = local, .comm = comm, .g = *g, .K = K, .r = r, .world_rank = world_rank,
                       .trace = trace, .step = step};
    dt_status st = assign_roles(h);
    if (st != DT_OK) {
        dt_tp_hooks_destroy(h);
        return st;
    }
    dt_model_set_after_forward_hook(local, after_forward, h);
    dt_model_set_node_hooks(local, NULL, after_backward, h);
    *out = h;
    return DT_OK;
}

/* The hooks of a strategy that set its own after the shard's (tp's inner ZeRO), chained to these. */
static void chained_before_forward(void *ctx, int node) {
    dt_tp_hooks *h = ctx;
    if (h->inner_before_forward) h->inner_before_forward(h->inner_ctx, node);
}
static void chained_before_backward(void *ctx, int node) {
    dt_tp_hooks *h = ctx;
    if (h->inner_before_backward) h->inner_before_backward(h->inner_ctx, node);
}
static void chained_after_backward(void *ctx, int node) {
    dt_tp_hooks *h = ctx;
    after_backward(h, node);
    if (h->inner_after_backward) h->inner_after_backward(h->inner_ctx, node);
}

void dt_tp_hooks_chain(dt_tp_hooks *h) {
    dt_node_hook_fn bf, ab, bb;
    void *ctx;
    dt_model_node_hooks(h->local, &bf, &ab, &bb, &ctx);
    if (ctx == h) return;  /* ours are installed */
    h->inner_before_forward = bf, h->inner_after_backward = ab, h->inner_before_backward = bb, h->inner_ctx = ctx;
    dt_model_set_node_hooks(h->local, bf ? chained_before_forward : NULL, chained_after_backward, h);
    dt_model_set_backward_hook(h->local, bb ? chained_before_backward : NULL);
}

void dt_tp_hooks_destroy(dt_tp_hooks *h) {
    if (!h) return;
    free(h->role), free(h->src), free(h->ids), free(h->keep), free(h->dlogits), free(h->work);
    free(h);
}

dt_status dt_tp_hooks_map(dt_tp_hooks *h, const int32_t *x, int lo, int n, int total) {
    const size_t T = (size_t)h->g.T;
    if ((size_t)total > h->cap) {  /* grown keeping what is mapped (a stage maps micro-batch by micro-batch) */
        int32_t *ids = realloc(h->ids, (size_t)total * T * sizeof *h->ids);
        if (ids) h->ids = ids;
        unsigned char *keep = ids ? realloc(h->keep, (size_t)total * T) : NULL;
        if (keep) h->keep = keep;
        if (!ids || !keep) return dt_error(DT_ENOMEM, "tensor parallel: out of memory for a batch of %d", total);
        h->cap = (size_t)total;
    }
    const int Vl = h->g.V / h->K, first = h->r * Vl;
    int32_t *ids = h->ids + (size_t)lo * T;
    unsigned char *keep = h->keep + (size_t)lo * T;
    for (size_t i = 0; i < (size_t)n * T; i++) {
        if (x[i] < 0 || x[i] >= h->g.V)
            return dt_error(DT_EINVAL, "model: node 'transformer.wte': id %d of sample %zu, position %zu is outside "
                            "[0, %d) (the vocabulary)", x[i], (size_t)lo + i / T, i % T, h->g.V);
        keep[i] = x[i] >= first && x[i] < first + Vl;
        ids[i] = keep[i] ? x[i] - first : 0;
    }
    return DT_OK;
}

const int32_t *dt_tp_hooks_ids(const dt_tp_hooks *h, int lo) { return h->ids + (size_t)lo * (size_t)h->g.T; }

void dt_tp_hooks_select(dt_tp_hooks *h, int lo, int n) {
    h->B = n;
    h->cur_keep = h->keep ? h->keep + (size_t)lo * (size_t)h->g.T : NULL;
}

dt_status dt_tp_hooks_loss(dt_tp_hooks *h, const int32_t *y, int n, float scale, double *loss) {
    const size_t N = (size_t)n * (size_t)h->g.T, Vl = (size_t)(h->g.V / h->K);
    if ((size_t)n > h->lcap) {
        free(h->dlogits), free(h->work);
        h->dlogits = malloc(N * Vl * sizeof(float)), h->work = malloc(3 * N * sizeof(float));
        h->lcap = h->dlogits && h->work ? (size_t)n : 0;
        if (!h->lcap) return dt_error(DT_ENOMEM, "tensor parallel: out of memory for the loss of %d samples", n);
    }
    const uint64_t x0 = dt_comm_bytes(h->comm, NULL);
    const double t0 = dt_now();
    int counted;
    dt_status st = dt_tp_xent(h->K > 1 ? h->comm : NULL, dt_model_output(h->local), y, (int)N, (int)Vl,
                              h->r * (int)Vl, h->g.V, -1, scale, h->dlogits, h->work, loss, &counted);
    h->comm_s += dt_now() - t0;  /* mostly its two allreduces */
    h->cnt.other_bytes += dt_comm_bytes(h->comm, NULL) - x0;
    if (st != DT_OK && st != DT_EINVAL) return tp_fail(h, st, "loss allreduce, rows", N);
    return st;
}

const float *dt_tp_hooks_dlogits(const dt_tp_hooks *h) { return h->dlogits; }

dt_status dt_tp_hooks_correct(dt_tp_hooks *h, const int32_t *y, int n, int64_t *correct) {
    const size_t N = (size_t)n * (size_t)h->g.T, Vl = (size_t)(h->g.V / h->K);
    if ((size_t)n > h->lcap) return dt_error(DT_EINTERNAL, "tensor parallel: dt_tp_hooks_correct before the loss");
    float *mx = h->work, *at = h->work + N;  /* per row: the slice's largest logit, its global id */
    const float *z = dt_model_output(h->local);
    for (size_t i = 0; i < N; i++) {
        size_t best = 0;
        for (size_t v = 1; v < Vl; v++)
            if (z[i * Vl + v] > z[i * Vl + best]) best = v;
        mx[i] = z[i * Vl + best], at[i] = (float)(h->r * Vl + best);  /* exact: V < 2^24 */
    }
    const uint64_t x0 = dt_comm_bytes(h->comm, NULL);
    dt_status st = h->K > 1 ? dt_comm_allreduce(h->comm, mx, mx, N, DT_F32, DT_OP_MAX) : DT_OK;
    for (size_t i = 0; st == DT_OK && i < N; i++)  /* the first of equal maxima, as one model's argmax */
        if (z[i * Vl + ((size_t)at[i] - h->r * Vl)] < mx[i]) at[i] = (float)h->g.V;
    if (st == DT_OK && h->K > 1) st = dt_comm_allreduce(h->comm, at, at, N, DT_F32, DT_OP_MIN);
    h->cnt.other_bytes += dt_comm_bytes(h->comm, NULL) - x0;
    if (st != DT_OK) return tp_fail(h, st, "accuracy allreduce, rows", N);
    int64_t c = 0;
    for (size_t i = 0; i < N; i++) c += (int32_t)at[i] == y[i];
    *correct += c;
    return DT_OK;
}

dt_status dt_tp_hooks_status(const dt_tp_hooks *h) { return h->err; }

double dt_tp_hooks_take_comm_s(dt_tp_hooks *h) {
    const double s = h->comm_s;
    h->comm_s = 0;
    return s;
}

void dt_tp_hooks_counters(const dt_tp_hooks *h, dt_tp_counters *c) {
    const uint64_t dp = c->dp_bytes;
    *c = h ? h->cnt : (dt_tp_counters){0};
    c->dp_bytes = dp;
}

bool dt_tp_in_norm(const char *name, int r) { return r == 0 || dt_tp_split_of(name) != DT_TP_REPL; }
