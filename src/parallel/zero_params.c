/* ZeRO's node hooks. Stage 3 keeps only this rank's chunks of the parameters: before a node's
 * forward and again before its backward, the buckets holding its tensors (tied ones too) are
 * all-gathered, the buckets of the next node with parameters (in that pass's order) are started
 * one layer ahead so the gather overlaps this node's compute, and every other gathered bucket is
 * freed (its pages not owned go back to the OS). The gathers run on a communicator of their own
 * (a split of the strategy's), so their order never interleaves with the gradient reduces.
 * Stage 2 uses the backward hook only to count the gradient pages backward is about to write
 * again (--mem-limit). On a device (zero.blocks) a gathered bucket is a staging block of the
 * device, bound into the graph, and freed when released; where the comm does not take the
 * device's memory the gather runs on a host copy of the bucket (this rank's chunk downloaded from
 * the shard, the bucket uploaded when it arrives); a bucket's gradient block is made before the
 * first node that writes it runs backward. */
#include "nn/graph_parallel.h"
#include "parallel/zero_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int *needs(const zero *z, int node) { return &z->node_b[node * ZERO_NODE_BUCKETS]; }

static bool in_list(const int *l, int b) {
    for (int k = 0; k < ZERO_NODE_BUCKETS && l[k] >= 0; k++)
        if (l[k] == b) return true;
    return false;
}

/* Blocks: bucket i's staging block (and staged, its host copy), this rank's chunk in place in it;
 * *p: where the gather runs (the block, or the host copy; the bucket's first value). False when
 * out of memory. */
static bool stage_block(zero *z, int i, float **p) {
    zbucket *b = &z->b[i];
    dt_dev *d = z->md;
    const size_t n = b->hi - b->lo, bytes = b->own_n * sizeof(float);
    if (!(b->pblk = d->ops->alloc(d, n * sizeof(float))) ||
        (z->stage_dev && !(b->phost = dt_alloc(n * sizeof(float))))) {
        dt_zero_hook_error(z, dt_error(DT_ENOMEM, "the %zu-value staging of its parameters", n), "parameter gather", i);
        d->ops->free(d, b->pblk), b->pblk = NULL;
        return false;
    }
    float *x = z->stage_dev ? b->phost : b->pblk;
    if (z->stage_dev && bytes) d->ops->download(d, x + (b->own - b->lo), z->psh + b->at, bytes);
    else if (bytes) d->ops->copy(d, x + (b->own - b->lo), z->psh + b->at, bytes);
    *p = x;
    return true;
}

/* Starts gathering bucket i's parameters (nothing if they are here or on their way). */
static void start(dt_strategy *s, zero *z, int i) {
    zbucket *b = &z->b[i];
    if (b->pst != ZP_RELEASED) return;
    if (b->prel) dt_zero_hook_error(z, dt_mem_reacquire(b->prel), "parameter gather", i);
    b->prel = 0;
    float *x = dt_model_params(s->model); /* the bucket's first value */
    if (z->blocks && !stage_block(z, i, &x)) return;
    if (!z->blocks) x += b->lo;
    b->ag = b->bt = NULL;
    if (b->c)
        dt_zero_hook_error(z, dt_comm_iallgather(z->pcomm, x + (b->own - b->lo), x, b->c, DT_F32, &b->ag),
                           "parameter allgather", i);
    if (b->tail)
        dt_zero_hook_error(z, dt_comm_ibroadcast(z->pcomm, x + (size_t)z->N * b->c, b->tail, DT_F32, z->N - 1, &b->bt),
                           "parameter broadcast", i);
    b->pst = ZP_GATHERING;
    b->t_gather = dt_now();
    b->counted = true; /* the values it writes that this rank does not own (--mem-limit charges the pages) */
    z->gath_now += (b->hi - b->lo - (z->blocks ? 0 : b->own_n)) * sizeof(float); /* blocks: the whole bucket */
    if (z->gath_now > z->gath_peak) z->gath_peak = z->gath_now;
    z->gathers++;
}

/* Waits for bucket b's gather; with s, --timeline shows it from its start to here. */
static void wait_gather(dt_strategy *s, zero *z, zbucket *b) {
    if (b->pst != ZP_GATHERING) return;
    dt_zero_hook_error(z, dt_request_wait(&b->ag), "parameter allgather", (int)(b - z->b));
    dt_zero_hook_error(z, dt_request_wait(&b->bt), "parameter broadcast", (int)(b - z->b));
    b->pst = ZP_RESIDENT;
    if (z->blocks && b->phost) { /* staged: the gathered bucket up into its block */
        z->md->ops->upload(z->md, b->pblk, b->phost, (b->hi - b->lo) * sizeof(float));
        dt_free(b->phost), b->phost = NULL;
    }
    if (s && z->blocks) dt_zero_param_bind(s, z, (int)(b - z->b), true);
    if (s && s->trace) {
        char name[32];
        snprintf(name, sizeof name, "allgather b%d", (int)(b - z->b));
        dt_trace_add(s->trace, name, 1, b->t_gather, dt_now(), s->step);
    }
}

/* Frees bucket i's parameters that this rank does not own. */
static void release(dt_strategy *s, zero *z, int i) {
    zbucket *b = &z->b[i];
    wait_gather(s, z, b);
    if (b->pst != ZP_RESIDENT) return;
    float *p = dt_model_params(s->model);
    if (z->blocks) dt_zero_param_bind(s, z, i, false);
    else
        b->prel = dt_mem_release(p + b->lo, (b->own - b->lo) * sizeof(float)) +
                  dt_mem_release(p + b->own + b->own_n, (b->hi - b->own - b->own_n) * sizeof(float));
    b->pst = ZP_RELEASED;
    if (b->counted) z->gath_now -= (b->hi - b->lo - (z->blocks ? 0 : b->own_n)) * sizeof(float);
    b->counted = false;
}

/* node's buckets gathered now, next's started, every other one freed. */
static void visit(dt_strategy *s, zero *z, int node, int next) {
    const int *need = needs(z, node);
    if (need[0] < 0) return;
    for (int k = 0; k < ZERO_NODE_BUCKETS && need[k] >= 0; k++) start(s, z, need[k]);
    for (int k = 0; k < ZERO_NODE_BUCKETS && need[k] >= 0; k++) wait_gather(s, z, &z->b[need[k]]);
    const int *pre = next >= 0 ? needs(z, next) : NULL;
    for (int k = 0; pre && k < ZERO_NODE_BUCKETS && pre[k] >= 0; k++) start(s, z, pre[k]);
    for (int i = 0; i < z->nb; i++)
        if (z->b[i].pst == ZP_RESIDENT && !in_list(need, i) && !(pre && in_list(pre, i))) release(s, z, i);
}

static void forward_hook(void *ctx, int node) {
    dt_strategy *s = ctx;
    zero *z = s->impl;
    if (z->full || needs(z, node)[0] < 0) return;
    if (z->bwd_next[node] < 0) z->fwd_calls++; /* the first node with parameters: a new pass */
    visit(s, z, node, z->fwd_next[node]);
}

static void backward_hook(void *ctx, int node) {
    dt_strategy *s = ctx;
    zero *z = s->impl;
    const int *need = needs(z, node);
    if (need[0] < 0) return;
    /* first the parameters no longer needed go and the reduced buckets give their gradient pages
     * back, then the pages backward is about to accumulate into come back (mapped at once) */
    if (z->stage == 3 && !z->full) visit(s, z, node, z->bwd_next[node]);
    if (z->stage >= 2) dt_zero_poll(s, z);
    for (int k = 0; k < ZERO_NODE_BUCKETS && need[k] >= 0; k++) {
        zbucket *b = &z->b[need[k]];
        if (z->blocks) {
            dt_zero_grad_block(s, z, need[k]);
            continue;
        }
        if (b->gfree && b->grel) {
            dt_zero_hook_error(z, dt_mem_reacquire(b->grel), "gradient pages", need[k]);
            dt_mem_populate(dt_model_grads(s->model) + b->lo, (b->hi - b->lo) * sizeof(float));
        }
        b->gfree = false, b->grel = 0;
    }
}

/* The bucket holding slab offset off. */
static int bucket_of(const zero *z, size_t off) {
    for (int i = 0; i < z->nb; i++)
        if (off >= z->b[i].lo && off < z->b[i].hi) return i;
    return -1;
}

/* node_b, fwd_next and bwd_next from the model's nodes and tensors. */
static dt_status build_tables(dt_strategy *s, zero *z) {
    dt_model *m = s->model;
    const int n = z->nnodes = dt_model_num_nodes(m);
    z->node_b = malloc((size_t)n * ZERO_NODE_BUCKETS * sizeof *z->node_b);
    z->fwd_next = malloc((size_t)n * sizeof(int)), z->bwd_next = malloc((size_t)n * sizeof(int));
    if (!z->node_b || !z->fwd_next || !z->bwd_next) return dt_error(DT_ENOMEM, "zero: out of memory");
    for (int i = 0; i < n; i++) {
        int *l = &z->node_b[i * ZERO_NODE_BUCKETS], nl = 0, idx[8];
        for (int k = 0; k < ZERO_NODE_BUCKETS; k++) l[k] = -1;
        int nt = dt_model_node_tensors(m, i, idx, 8);
        for (int k = 0; k < nt && k < 8; k++) {
            const dt_param_info *t = dt_model_tensor(m, idx[k]);
            int b = t->is_buffer ? -1 : bucket_of(z, t->offset);
            if (b < 0 || in_list(l, b)) continue;
            if (nl == ZERO_NODE_BUCKETS)
                return dt_error(DT_EINTERNAL, "zero: node '%s' reads more than %d buckets", dt_model_node_name(m, i),
                                ZERO_NODE_BUCKETS);
            l[nl++] = b;
        }
    }
    for (int i = 0, last = -1; i < n; i++) {
        z->bwd_next[i] = last;
        if (z->node_b[i * ZERO_NODE_BUCKETS] >= 0) last = i;
    }
    for (int i = n - 1, last = -1; i >= 0; i--) {
        z->fwd_next[i] = last;
        if (z->node_b[i * ZERO_NODE_BUCKETS] >= 0) last = i;
    }
    return DT_OK;
}

dt_status dt_zero_params_init(dt_strategy *s, zero *z) {
    DT_TRY(build_tables(s, z));
    if (z->stage == 3) DT_TRY(dt_comm_split(s->comm, 0, z->r, &z->pcomm));
    dt_model_set_node_hooks(s->model, z->stage == 3 ? forward_hook : NULL, NULL, s);
    dt_model_set_backward_hook(s->model, backward_hook);
    if (z->stage == 3) dt_zero_params_release_all(s, z);
    return DT_OK;
}

/* Blocks: every bucket gathered straight into one whole parameter block, which becomes the model's
 * slab (evaluation, checkpoints, weights read it there). Staged, on the host copy the gradient
 * reduces use (none is in flight between steps): the chunk downloaded from the shard, the bucket
 * gathered there, uploaded into the block. Blocking, on the gathers' communicator. */
static dt_status gather_whole(dt_strategy *s, zero *z) {
    dt_dev *d = z->md, *sd = z->stage_dev;
    const size_t P = dt_model_num_params(s->model);
    dt_zero_params_release_all(s, z);
    float *w = z->pwhole = d->ops->alloc(d, (P ? P : 1) * sizeof(float));
    if (!w) return dt_error_wrap(DT_ENOMEM, "ZeRO-3: the whole %zu parameters gathered on device %s", P, d->kind->name);
    for (int i = 0; i < z->nb; i++) {
        const zbucket *b = &z->b[i];
        float *x = sd ? z->host : w;
        if (sd && b->own_n) sd->ops->download(sd, x + b->own, z->psh + b->at, b->own_n * sizeof(float));
        else if (b->own_n) d->ops->copy(d, x + b->own, z->psh + b->at, b->own_n * sizeof(float));
        dt_status st = b->c ? dt_comm_allgather(z->pcomm, x + b->own, x + b->lo, b->c, DT_F32) : DT_OK;
        if (st == DT_OK && b->tail)
            st = dt_comm_broadcast(z->pcomm, x + b->lo + (size_t)z->N * b->c, b->tail, DT_F32, z->N - 1);
        if (st != DT_OK) return dt_error_wrap(st, "ZeRO-3: the parameter gather of bucket %d of %d", i, z->nb);
        if (sd) sd->ops->upload(sd, w + b->lo, x + b->lo, (b->hi - b->lo) * sizeof(float));
    }
    dt_model_put_params(s->model, w);
    return DT_OK;
}

void dt_zero_blocks_unwhole(dt_strategy *s, zero *z) {
    float *p = dt_model_take_params(s->model);
    z->md->ops->free(z->md, p ? p : z->pwhole);
    z->pwhole = NULL;
}

dt_status dt_zero_params_gather_all(dt_strategy *s, zero *z) {
    if (z->blocks) DT_TRY(gather_whole(s, z));
    for (int i = 0; i < z->nb && !z->blocks; i++) start(s, z, i);
    for (int i = 0; i < z->nb && !z->blocks; i++) wait_gather(s, z, &z->b[i]);
    z->full = true;
    if (z->err != DT_OK) return dt_error(z->err, "ZeRO-%d: %s", z->stage, z->errmsg);
    return DT_OK;
}

void dt_zero_params_release_all(dt_strategy *s, zero *z) {
    for (int i = 0; i < z->nb; i++) release(s, z, i);
    if (z->pwhole) dt_zero_blocks_unwhole(s, z);
    z->full = false;
}

void dt_zero_params_replay(dt_strategy *s, zero *z) {
    /* the other ranks ran accum forward and backward passes (each with at least one sample): run
     * the gathers of the passes this rank did not, so every rank issues the same gathers */
    for (int pass = z->fwd_calls; pass < z->accum; pass++) {
        for (int i = 0; i < z->nnodes; i++)
            if (needs(z, i)[0] >= 0) visit(s, z, i, z->fwd_next[i]);
        for (int i = z->nnodes - 1; i >= 0; i--)
            if (needs(z, i)[0] >= 0) visit(s, z, i, z->bwd_next[i]);
    }
}

void dt_zero_params_free(zero *z) {
    for (int i = 0; z->b && i < z->nb; i++) wait_gather(NULL, z, &z->b[i]);
    dt_comm_destroy(z->pcomm);
    z->pcomm = NULL;
    free(z->node_b), free(z->fwd_next), free(z->bwd_next);
    z->node_b = z->fwd_next = z->bwd_next = NULL;
}
