/* The collectives of a tensor-parallel shard (tp.h), as node hooks of its graph (nn/ knows
 * no communication), placed by the marks its builder set (dt_model_mark_tp): the g operator
 * (allreduce of a row-parallel node's partial sums, forward), the f operator (allreduce of a
 * column-parallel node's input gradient, backward), the vocabulary-parallel embedding (foreign
 * lookups zeroed, then summed) and head (its input gradient summed), and (a GPT's) the
 * vocabulary-parallel loss. The tensor-parallel strategy (tp.c) and the
 * pipeline (pp_step.c, a stage of a tp x pp mesh) drive the same hooks: they map a step's ids into
 * the rank's slice, select the samples of the micro-batch the next forward or backward runs, and
 * take the loss and its logits' gradient from dt_tp_hooks_loss. Activations, gradients and the
 * loss's buffers are the shard's device memory: the hooks zero and reduce them through device
 * calls, staging an allreduce through a host buffer where the transport does not take that memory
 * (dt_strategy_stage_device); on the cpu device the collectives run on them in place. */
#include "nn/graph_parallel.h"
#include "parallel/tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a node's hooks do. */
enum {
    ROLE_NONE = 0,
    ROLE_ROW,        /* row-parallel (c_proj): allreduce its output (g); zero its bias gradient off rank 0 */
    ROLE_COL,        /* column-parallel (c_attn, c_fc): allreduce its input's gradient (f) */
    ROLE_HEAD,       /* vocabulary-parallel head (the tied lm_head): allreduce its input's gradient */
    ROLE_EMBED,      /* vocabulary-parallel embedding: zero lookups outside the slice, allreduce */
    ROLE_EMBED_GRAD, /* the embedding's reader: zero the token rows outside the slice of its gradient */
};

struct dt_tp_hooks {
    dt_model *local;
    dt_node_hook_fn inner_before_forward, inner_after_backward, inner_before_backward; /* chained (ZeRO's) */
    void *inner_ctx;
    dt_comm *comm;
    dt_gpt_config g;
    int K, r, world_rank;
    dt_trace *trace;
    const int64_t *step;
    unsigned char *role; /* per node of local */
    int *src;            /* per node: the node whose gradient ROLE_COL / ROLE_HEAD reduce */
    size_t *size;        /* per node: values per sample its hook reduces */
    int wte;
    int32_t *ids;          /* the step's ids mapped into the rank's vocabulary slice */
    unsigned char *keep;   /* whether each id is in the slice */
    size_t cap;            /* samples ids/keep hold */
    dt_dev *dev;           /* the shard's device */
    dt_dev *stage;         /* dev where the collectives go through host buffers, else NULL */
    float *dlogits, *rows; /* device: the logits' gradient; the loss's rows (3N: maxima, sums) */
    int32_t *targets;      /* device: the loss's targets (unused on host memory: it reads the feed) */
    void *out;             /* device: the loss (a double) and its counted rows (an int32) */
    size_t lcap;           /* samples dlogits/rows/targets hold */
    float *host;           /* host buffer for staging and the accuracy's rows (device memory only) */
    size_t hcap;           /* floats host holds */
    float *logits_host;    /* the accuracy's logits, downloaded (device memory only) */
    const unsigned char *cur_keep;
    int B;         /* samples of the selected micro-batch */
    dt_status err; /* the first failure inside a hook */
    double comm_s; /* seconds in tp collectives since dt_tp_hooks_take_comm_s */
    dt_tp_counters cnt;
};

/* Wraps a failure on the tp axis: its ranks are world ranks (tp rank i = world rank base + i). */
static dt_status tp_fail(const dt_tp_hooks *h, dt_status st, const char *what, size_t n) {
    return dt_error_wrap(st, "tensor parallel: %s %zu (tp rank %d of %d; tp rank i is world rank %d+i)", what, n, h->r,
                         h->K, h->world_rank - h->r);
}

/* The host buffer of at least n floats (grown), or NULL with the error set. */
static float *host_buf(dt_tp_hooks *h, size_t n) {
    if (n > h->hcap) {
        float *p = realloc(h->host, n * sizeof(float));
        if (!p) {
            dt_error(DT_ENOMEM, "tensor parallel: out of memory for a host buffer of %zu floats", n);
            return NULL;
        }
        h->host = p, h->hcap = n;
    }
    return h->host;
}

/* n bytes of the device's memory (host memory on the cpu device, as malloc), and their free. */
static void *dev_alloc(dt_dev *d, size_t n) { return d->host_memory ? malloc(n) : d->ops->alloc(d, n); }
static void dev_free(dt_dev *d, void *p) {
    if (d->host_memory) free(p);
    else d->ops->free(d, p);
}

/* One allreduce (sum) of the tp axis from a hook; counts its bytes; records a failure. */
static void reduce(dt_tp_hooks *h, float *buf, size_t n, bool block) {
    if (h->err != DT_OK || !h->comm || h->K == 1) return;
    const uint64_t b0 = dt_comm_bytes(h->comm, NULL);
    const double t0 = dt_now();
    float *host = h->stage ? host_buf(h, n) : NULL;
    dt_status st = h->stage && !host ? DT_ENOMEM : DT_OK;
    if (host) h->dev->ops->download(h->dev, host, buf, n * sizeof(float));
    if (st == DT_OK) st = dt_comm_allreduce(h->comm, host ? host : buf, host ? host : buf, n, DT_F32, DT_OP_SUM);
    if (host && st == DT_OK) h->dev->ops->upload(h->dev, buf, host, n * sizeof(float));
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

/* The values node i's hook reduces at the selected micro-batch. */
static size_t btc(const dt_tp_hooks *h, int i) { return (size_t)h->B * h->size[i]; }

/* Zeroes the rows (of C values) of x whose id is outside the rank's slice. */
static void zero_foreign(const dt_tp_hooks *h, float *x) {
    const size_t n = (size_t)h->B * (size_t)h->g.T, C = (size_t)h->g.C;
    for (size_t i = 0; i < n;) { /* a run of foreign rows, one fill */
        size_t e = i;
        while (e < n && !h->cur_keep[e]) e++;
        if (e > i) h->dev->ops->fill_f32(h->dev, x + i * C, 0.0f, (e - i) * C);
        i = e + 1;
    }
}

static void after_forward(void *ctx, int node) {
    dt_tp_hooks *h = ctx;
    switch (h->role[node]) {
    case ROLE_ROW: reduce(h, dt_model_node_values_mut(h->local, node), btc(h, node), true); break;
    case ROLE_EMBED: {
        float *v = dt_model_node_values_mut(h->local, node);
        zero_foreign(h, v);
        reduce(h, v, btc(h, node), false);
        break;
    }
    default: break;
    }
}

static void after_backward(void *ctx, int node) {
    dt_tp_hooks *h = ctx;
    switch (h->role[node]) {
    case ROLE_ROW:
        if (h->r != 0) { /* the bias is rank 0's: the others hold zeros that must stay zeros */
            char name[96];
            snprintf(name, sizeof name, "%s.bias", dt_model_node_name(h->local, node));
            int k = dt_model_find_tensor(h->local, name);
            float *g = k >= 0 ? dt_model_tensor_grad(h->local, k) : NULL; /* its own block under ZeRO-2 */
            if (g) h->dev->ops->fill_f32(h->dev, g, 0.0f, dt_model_tensor(h->local, k)->numel);
        }
        break;
    case ROLE_COL: { /* none where the input needs no gradient (the model's input): on every rank alike */
        float *g = dt_model_node_grad_mut(h->local, h->src[node]);
        if (g) reduce(h, g, btc(h, node), true);
        break;
    }
    case ROLE_HEAD: reduce(h, dt_model_node_grad_mut(h->local, h->src[node]), btc(h, node), false); break;
    case ROLE_EMBED_GRAD: {
        float *g = dt_model_node_grad_mut(h->local, h->wte);
        if (g) zero_foreign(h, g);
        break;
    }
    default: break;
    }
}

/* The hooks' role of every node of the shard, by the marks of its nodes. */
static dt_status assign_roles(dt_tp_hooks *h) {
    const int n = dt_model_num_nodes(h->local);
    h->role = calloc((size_t)n, 1), h->src = calloc((size_t)n, sizeof *h->src);
    h->size = calloc((size_t)n, sizeof *h->size);
    if (!h->role || !h->src || !h->size) return dt_error(DT_ENOMEM, "tensor parallel: out of memory");
    h->wte = -1;
    for (int i = 0; i < n; i++) {
        const dt_tp_mark mk = dt_model_node_tp(h->local, i, NULL);
        const bool embed = dt_model_node_kind(h->local, i) == DT_LAYER_EMBEDDING;
        h->src[i] = dt_model_node_input(h->local, i, 0);
        if (mk == DT_TP_MARK_ROW) h->role[i] = ROLE_ROW;
        else if (mk == DT_TP_MARK_COLUMN) h->role[i] = ROLE_COL;
        else if (mk == DT_TP_MARK_VOCAB && embed) h->role[i] = ROLE_EMBED, h->wte = i;
        else if (mk == DT_TP_MARK_VOCAB) h->role[i] = ROLE_HEAD;
        const bool reads_input = h->role[i] == ROLE_COL || h->role[i] == ROLE_HEAD;
        if (reads_input && h->src[i] < 0)
            return dt_error(DT_EINTERNAL, "tensor parallel: marked node '%s' has no input",
                            dt_model_node_name(h->local, i));
        h->size[i] = dt_model_node_size(h->local, reads_input ? h->src[i] : i);
    }
    for (int i = 0; h->wte >= 0 && i < n; i++) /* the reader of the vocabulary-parallel embedding */
        for (int j = 0; dt_model_node_input(h->local, i, j) >= 0; j++)
            if (dt_model_node_input(h->local, i, j) == h->wte && h->role[i] == ROLE_NONE) h->role[i] = ROLE_EMBED_GRAD;
    return DT_OK;
}

dt_status dt_tp_hooks_create(dt_tp_hooks **out, dt_model *local, const dt_gpt_config *g, dt_comm *comm, int K, int r,
                             int world_rank, dt_trace *trace, const int64_t *step) {
    *out = NULL;
    dt_tp_hooks *h = calloc(1, sizeof *h);
    if (!h) return dt_error(DT_ENOMEM, "tensor parallel: out of memory");
    *h = (dt_tp_hooks){.local = local,
                       .comm = comm,
                       .g = g ? *g : (dt_gpt_config){0},
                       .K = K,
                       .r = r,
                       .world_rank = world_rank,
                       .trace = trace,
                       .step = step,
                       .dev = dt_model_device(local)};
    h->stage = comm && K > 1 ? dt_strategy_stage_device(comm, local) : NULL;
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
    if (ctx == h) return; /* ours are installed */
    h->inner_before_forward = bf, h->inner_after_backward = ab, h->inner_before_backward = bb, h->inner_ctx = ctx;
    dt_model_set_node_hooks(h->local, bf ? chained_before_forward : NULL, chained_after_backward, h);
    dt_model_set_backward_hook(h->local, bb ? chained_before_backward : NULL);
}

void dt_tp_hooks_destroy(dt_tp_hooks *h) {
    if (!h) return;
    free(h->role), free(h->src), free(h->size), free(h->ids), free(h->keep), free(h->host), free(h->logits_host);
    dev_free(h->dev, h->dlogits), dev_free(h->dev, h->rows), dev_free(h->dev, h->targets), dev_free(h->dev, h->out);
    free(h);
}

dt_status dt_tp_hooks_map(dt_tp_hooks *h, const int32_t *x, int lo, int n, int total) {
    const size_t T = (size_t)h->g.T;
    if ((size_t)total > h->cap) { /* grown keeping what is mapped (a stage maps micro-batch by micro-batch) */
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
            return dt_error(DT_EINVAL,
                            "model: node 'transformer.wte': id %d of sample %zu, position %zu is outside "
                            "[0, %d) (the vocabulary)",
                            x[i], (size_t)lo + i / T, i % T, h->g.V);
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

/* The loss's device buffers for n samples (N rows of Vl logits). */
static dt_status loss_buffers(dt_tp_hooks *h, int n, size_t N, size_t Vl) {
    if ((size_t)n <= h->lcap) return DT_OK;
    dt_dev *d = h->dev;
    dev_free(d, h->dlogits), dev_free(d, h->rows), dev_free(d, h->targets), dev_free(d, h->out);
    h->dlogits = dev_alloc(d, N * Vl * sizeof(float)), h->rows = dev_alloc(d, 3 * N * sizeof(float));
    h->targets = d->host_memory ? NULL : dev_alloc(d, N * sizeof(int32_t));
    h->out = dev_alloc(d, 2 * sizeof(double));
    h->lcap = h->dlogits && h->rows && h->out && (d->host_memory || h->targets) ? (size_t)n : 0;
    if (h->lcap && !d->host_memory && !host_buf(h, 3 * N)) h->lcap = 0;
    if (!h->lcap) return dt_error(DT_ENOMEM, "tensor parallel: out of memory for the loss of %d samples", n);
    return DT_OK;
}

dt_status dt_tp_hooks_loss(dt_tp_hooks *h, const int32_t *y, int n, float scale, double *loss) {
    const size_t N = (size_t)n * (size_t)h->g.T, Vl = (size_t)(h->g.V / h->K);
    DT_TRY(loss_buffers(h, n, N, Vl));
    const uint64_t x0 = dt_comm_bytes(h->comm, NULL);
    const double t0 = dt_now();
    dt_xent_shard_args a = {.logits = dt_model_output(h->local),
                            .targets = h->dev->host_memory ? y : h->targets,
                            .N = (int)N,
                            .Vl = (int)Vl,
                            .lo = h->r * (int)Vl,
                            .ignore = -1,
                            .scale = scale,
                            .dlogits = h->dlogits,
                            .rows = h->rows,
                            .loss = h->out,
                            .counted = (int32_t *)((double *)h->out + 1)};
    dt_status st = dt_tp_xent(h->K > 1 ? h->comm : NULL, h->dev, h->stage ? h->host : NULL, y, h->g.V, &a);
    if (st == DT_OK) h->dev->ops->download(h->dev, loss, a.loss, sizeof *loss);
    h->comm_s += dt_now() - t0; /* mostly its two allreduces */
    h->cnt.other_bytes += dt_comm_bytes(h->comm, NULL) - x0;
    if (st != DT_OK && st != DT_EINVAL) return tp_fail(h, st, "loss allreduce, rows", N);
    return st;
}

const float *dt_tp_hooks_dlogits(const dt_tp_hooks *h) { return h->dlogits; }

dt_status dt_tp_hooks_correct(dt_tp_hooks *h, const int32_t *y, int n, int64_t *correct) {
    const size_t N = (size_t)n * (size_t)h->g.T, Vl = (size_t)(h->g.V / h->K);
    if ((size_t)n > h->lcap) return dt_error(DT_EINTERNAL, "tensor parallel: dt_tp_hooks_correct before the loss");
    const float *z = dt_model_output(h->local);
    float *mx = h->rows, *at = h->rows + N; /* per row: the slice's largest logit, its global id */
    if (!h->dev->host_memory) {             /* the logits downloaded once per batch, as a whole model's accuracy does */
        float *zh = realloc(h->logits_host, N * Vl * sizeof(float));
        if (!zh) return dt_error(DT_ENOMEM, "tensor parallel: out of memory for the logits of %d samples", n);
        h->logits_host = zh;
        h->dev->ops->download(h->dev, zh, z, N * Vl * sizeof(float));
        z = zh, mx = h->host, at = h->host + N; /* loss_buffers made host hold 3N floats */
    }
    for (size_t i = 0; i < N; i++) {
        size_t best = 0;
        for (size_t v = 1; v < Vl; v++)
            if (z[i * Vl + v] > z[i * Vl + best]) best = v;
        mx[i] = z[i * Vl + best], at[i] = (float)(h->r * Vl + best); /* exact: V < 2^24 */
    }
    const uint64_t x0 = dt_comm_bytes(h->comm, NULL);
    dt_status st = h->K > 1 ? dt_comm_allreduce(h->comm, mx, mx, N, DT_F32, DT_OP_MAX) : DT_OK;
    for (size_t i = 0; st == DT_OK && i < N; i++) /* the first of equal maxima, as one model's argmax */
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

bool dt_tp_in_norm(const dt_model *m, const char *name, int r) {
    return r == 0 || dt_tp_split_of(m, name) != DT_TP_REPL;
}
