/* ZeRO stages 1-3 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
 * Parameter Models") over ddp's buckets. Every bucket (a slab range, filled by backward from the
 * last layer to the first) is cut into N equal chunks, one per rank, and the last rank also owns
 * the remainder (< N values): shards balanced by bytes to within N-1 values per bucket. A rank's
 * optimizer state covers its chunks only (dt_optim_shard).
 *   stage 1: each bucket is reduce-scattered in place (the rank's chunk of the average lands at
 *            the bucket's start in the gradient slab), each rank updates its chunks and the
 *            parameters are all-gathered: the traffic of one allreduce, no copy.
 *   stage 2: each bucket is reduce-scattered into the owner's packed gradient shard as soon as
 *            backward completes it (the grad-ready hook, as ddp's overlap); the bucket's gradient
 *            pages are then given back to the OS.
 *   stage 3: as stage 2, and a rank holds only its chunks of the parameters: zero_params.c gathers
 *            each layer's bucket just before its forward and its backward and frees it after.
 * On a device (dt_dev, not host memory) the shards are blocks of the model's device: the packed
 * gradient shard and the optimizer's packed moments; the step runs the device's kernels on them,
 * --clip takes the norm from the device's per-bucket sqnorm partials. Where the comm does not
 * take the device's memory (dt_strategy_stage_device), each collective runs on a host copy of
 * the slab: a bucket's gradients are downloaded when it is issued (from the backward hook, so the
 * overlap stays), reduced there and the rank's chunk uploaded into its shard when the reduce is
 * done; a parameter (or moment) gather downloads the chunk, gathers on the host and uploads the
 * bucket. A device block cannot be given back in part: there stages 2 and 3 hold a bucket's
 * gradients (and stage 3 its gathered parameters) in blocks of their own, bound into the graph,
 * and the model's whole gradient (and parameter) blocks are freed (zero_blocks.c). */
#include "optim/clip.h"
#include "parallel/zero_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PAGE = 4096 };

dt_status dt_zero_parse_stage(const char *text, int *stage) {
    if (text && text[0] >= '0' && text[0] <= '3' && !text[1]) {
        *stage = text[0] - '0';
        return DT_OK;
    }
    return dt_error(DT_EINVAL,
                    "zero=%s: the ZeRO stage is 0 (replicas), 1 (shard the optimizer state), 2 (and the "
                    "gradients) or 3 (and the parameters), e.g. `zero` 2",
                    text ? text : "");
}

void dt_zero_chunk(size_t n, int r, int N, size_t *off, size_t *len) {
    size_t c = n / (size_t)N;
    *off = (size_t)r * c;
    *len = c + (r == N - 1 ? n - c * (size_t)N : 0);
}

void dt_zero_hook_error(zero *z, dt_status st, const char *what, int bucket) {
    if (st == DT_OK || z->err != DT_OK) return;
    z->err = st;
    snprintf(z->errmsg, sizeof z->errmsg, "%s of bucket %d of %d: %s", what, bucket, z->nb, dt_last_error());
}

/* Gives back bucket b's gradient pages (they read as zeros) and zeros its values on the pages
 * shared with neighbours: afterwards its gradients are zero, for the next step. */
static void release_grads(dt_strategy *s, zero *z, zbucket *b) {
    if (z->blocks) { /* its own block: freed, made again (zeroed) before backward next writes it */
        dt_zero_grad_block_free(s, z, (int)(b - z->b));
        return;
    }
    float *g = dt_model_grads(s->model);
    char *lo = (char *)(g + b->lo), *hi = (char *)(g + b->hi);
    b->grel = dt_mem_release(lo, (size_t)(hi - lo));
    if (b->grel == 0) {
        memset(lo, 0, (size_t)(hi - lo));
    } else {
        char *a = (char *)(((uintptr_t)lo + PAGE - 1) & ~(uintptr_t)(PAGE - 1)), *e = a + b->grel;
        memset(lo, 0, (size_t)(a - lo));
        memset(e, 0, (size_t)(hi - e));
    }
    b->gfree = true;
}

/* Where this rank's reduced chunk of bucket b lives for the step: stage 1 in place at the start of
 * the bucket in the gradient slab (comm.h's in-place form: no copy), stage >= 2 in the packed shard. */
static float *shard_grads(dt_strategy *s, const zero *z, const zbucket *b) {
    return z->stage == 1 ? dt_model_grads(s->model) + b->lo : z->gsh + b->at;
}

/* What bucket b's reduce reads: its gradients in the slab, or in the slab's host copy (staged). */
static float *rs_src(dt_strategy *s, const zero *z, const zbucket *b) {
    if (z->stage_dev) return z->host + b->lo;
    return z->blocks ? b->gblk : dt_model_grads(s->model) + b->lo;
}

/* Where bucket b's reduce-scatter leaves this rank's chunk: shard_grads, or staged in place in the
 * host copy (reduced() uploads it into shard_grads). */
static float *rs_dest(dt_strategy *s, const zero *z, const zbucket *b) {
    return z->stage_dev ? z->host + b->lo : shard_grads(s, z, b);
}

/* Staged: bucket i's final gradients into the host copy the collectives run on; its gradient block
 * (blocks) is freed at once, or read as zeros where this rank wrote none (no samples this step). */
static void stage_out(dt_strategy *s, zero *z, int i, float *host) {
    zbucket *b = &z->b[i];
    const size_t bytes = (b->hi - b->lo) * sizeof(float);
    if (!z->blocks) {
        z->stage_dev->ops->download(z->stage_dev, host, dt_model_grads(s->model) + b->lo, bytes);
        return;
    }
    if (b->gblk) z->stage_dev->ops->download(z->stage_dev, host, b->gblk, bytes);
    else memset(host, 0, bytes);
    dt_zero_grad_block_free(s, z, i);
}

/* Starts bucket i's reduce, non-blocking on the communicator's progress thread; with `blocking`
 * nothing starts and finish() runs it on the caller's thread (the step's last bucket where the
 * backward hook did not start it: a rank without samples this step). */
static void issue(dt_strategy *s, zero *z, int i, bool blocking) {
    zbucket *b = &z->b[i];
    b->t_issue = dt_now();
    b->issued = true;
    b->rs = b->rt = NULL;
    b->rs_done = b->c == 0, b->rt_done = b->tail == 0;
    if (z->blocks && !z->stage_dev) dt_zero_grad_block(s, z, i); /* none written (no samples): zeros */
    float *src = rs_src(s, z, b);
    if (z->stage_dev) stage_out(s, z, i, src);
    if (blocking) return;
    if (b->c && dt_comm_ireduce_scatter(s->comm, src, rs_dest(s, z, b), b->c, DT_F32, DT_OP_AVG, &b->rs) != DT_OK)
        b->rs = NULL;
    float *t = src + (size_t)z->N * b->c;
    if (b->tail && dt_comm_iallreduce(s->comm, t, t, b->tail, DT_F32, DT_OP_AVG, &b->rt) != DT_OK) b->rt = NULL;
}

/* Bucket i's reduce is done: the tail into the last rank's shard, the gradient pages given back. */
static void reduced(dt_strategy *s, zero *z, int i) {
    zbucket *b = &z->b[i];
    b->reduced = true;
    const bool tail = z->r == z->N - 1 && b->tail; /* the tail follows the chunk in the reduced shard */
    float *dst = shard_grads(s, z, b), *src = rs_src(s, z, b);
    if (z->stage_dev) { /* the chunk and tail from the host copy */
        dt_dev *d = z->stage_dev;
        if (b->c) d->ops->upload(d, dst, src, b->c * sizeof(float));
        if (tail) d->ops->upload(d, dst + b->c, src + (size_t)z->N * b->c, b->tail * sizeof(float));
    } else if (tail && !z->host_pages) {
        z->md->ops->copy(z->md, dst + b->c, src + (size_t)z->N * b->c, b->tail * sizeof(float));
    } else if (tail) {
        memmove(dst + b->c, src + (size_t)z->N * b->c, b->tail * sizeof(float));
    }
    if (z->stage == 1) return;
    release_grads(s, z, b);
}

/* Waits for bucket i's reduce (or runs it blocking where its start failed). */
static dt_status finish(dt_strategy *s, zero *z, int i) {
    zbucket *b = &z->b[i];
    if (b->reduced) return DT_OK;
    float *src = rs_src(s, z, b), *t = src + (size_t)z->N * b->c;
    dt_status st = DT_OK, st2 = DT_OK;
    if (!b->rs_done)
        st = b->rs ? dt_request_wait(&b->rs)
                   : dt_comm_reduce_scatter(s->comm, src, rs_dest(s, z, b), b->c, DT_F32, DT_OP_AVG);
    if (!b->rt_done)
        st2 = b->rt ? dt_request_wait(&b->rt) : dt_comm_allreduce(s->comm, t, t, b->tail, DT_F32, DT_OP_AVG);
    b->rs_done = b->rt_done = true;
    if (st == DT_OK) st = st2;
    if (st == DT_OK) reduced(s, z, i);
    return st;
}

/* Tests one part of a bucket's reduce: true when it is done (an error is kept for the step). */
static bool part_done(zero *z, int i, dt_request **rq, bool *done) {
    if (*done) return true;
    if (!*rq) return false; /* not started: finish runs it */
    bool d = false;
    dt_status st = dt_request_test(rq, &d);
    if (st != DT_OK) dt_zero_hook_error(z, st, "gradient reduce-scatter", i), d = true;
    *done = d;
    return d;
}

int dt_zero_inflight_cap(int stage) { return stage >= 3 ? 1 : 2; }

dt_status dt_zero_mem_plan(dt_model *m, dt_mem_share *sh) {
    if (sh->zero <= 0 || sh->dp <= 1) return DT_OK;
    dt_ddp_range *b;
    int nb;
    DT_TRY(dt_ddp_buckets(m, sh->bucket_mb, &b, &nb));
    const size_t P = dt_model_num_params(m);
    double o = 0, top[3] = {0, 0, 0};
    for (int i = 0; i < nb; i++) {
        const size_t a = b[i].lo, e = b[i].hi < P ? b[i].hi : P;
        if (e <= a) continue;
        size_t off, len;
        dt_zero_chunk(e - a, sh->dp_rank, sh->dp, &off, &len);
        o += (double)len;
        const double n = (double)(e - a);
        for (int k = 0; k < 3; k++)
            if (n > top[k]) {
                for (int j = 2; j > k; j--) top[j] = top[j - 1];
                top[k] = n;
                break;
            }
    }
    free(b);
    sh->zero_own = o, sh->big[0] = top[0], sh->big[1] = top[0] + top[1], sh->big[2] = sh->big[1] + top[2];
    for (int k = 0; k < 3; k++) sh->big[k] /= sh->tp;
    sh->inflight = dt_zero_inflight_cap(sh->zero);
    return DT_OK;
}

/* Stage >= 2: completes the issued buckets whose reduce has finished, so that their gradient
 * pages go back while backward runs on, and waits for the oldest ones while more than
 * dt_zero_inflight_cap are in flight: the gradient memory stays the shard plus a few buckets even
 * when the communication falls behind. Also called before each node's backward (zero_params.c),
 * so a bucket reduced meanwhile gives its pages back before the node writes new ones. */
void dt_zero_poll(dt_strategy *s, zero *z) {
    const int cap = dt_zero_inflight_cap(z->stage);
    int inflight = 0;
    for (int i = 0; i < z->next; i++) {
        zbucket *b = &z->b[i];
        if (b->reduced || !part_done(z, i, &b->rs, &b->rs_done) || !part_done(z, i, &b->rt, &b->rt_done)) {
            inflight += !b->reduced;
            continue;
        }
        if (z->err == DT_OK) reduced(s, z, i);
    }
    for (int i = 0; i < z->next && inflight > cap; i++) {
        if (z->b[i].reduced) continue;
        dt_status st = finish(s, z, i);
        if (st != DT_OK) dt_zero_hook_error(z, st, "gradient reduce-scatter", i), z->b[i].reduced = true;
        inflight--;
    }
}

static void zero_ready(dt_strategy *s, size_t off, size_t n) {
    zero *z = s->impl;
    (void)n;
    /* layers arrive last to first: bucket `next` is complete once its lowest layer is. Every stage
     * starts the last bucket here too, on the progress thread: stages 2 and 3 so that its gradient
     * pages go back at once; stage 1 because, run blocking on the caller's thread as it once was, it
     * waited for the scheduler's wake-up on a loaded host (docs/figures.md, "ZeRO-1's last bucket") */
    while (z->next < z->nb && off <= z->b[z->next].lo) {
        issue(s, z, z->next++, false);
        z->early++;
    }
    if (z->stage >= 2) dt_zero_poll(s, z);
}

static void zero_begin(dt_strategy *s, int64_t step) {
    zero *z = s->impl;
    s->step = step;
    z->next = z->early = 0;
    z->fwd_calls = 0;
    for (int i = 0; i < z->nb; i++) z->b[i].issued = z->b[i].reduced = false;
    if (z->stage == 3 && z->full) dt_zero_params_release_all(s, z);
    z->gath_peak = z->gath_now;
}

/* Sums the shard's part of the squared norm over the ranks (norm_comm: tp's world). */
static dt_status norm_allreduce(void *ctx, double *ss) {
    const dt_strategy *s = ctx;
    return dt_comm_allreduce(s->norm_comm ? s->norm_comm : s->comm, ss, ss, 1, DT_F64, DT_OP_SUM);
}

/* --clip over the whole model: the norm from every rank's shard (dt_clip_grad_pieces): a partial
 * per bucket on the model's device (tp's norm_pieces: the parts of each bucket that count). */
static dt_status clip_shard(dt_strategy *s, zero *z, float clip) {
    dt_grad_pieces all = {0}, counted = {0};
    dt_status st = DT_OK;
    for (int i = 0; st == DT_OK && i < z->nb; i++) st = dt_grad_pieces_add(&all, (float *)z->gp[i], z->len[i]);
    for (int i = 0; st == DT_OK && s->norm_pieces && i < z->nb; i++)
        st = s->norm_pieces(s->update_ctx, z->b[i].own, (float *)z->gp[i], z->len[i], &counted);
    if (st == DT_OK && !z->dss && !(z->dss = z->md->ops->alloc(z->md, (size_t)z->nb * sizeof(double))))
        st = dt_error(DT_ENOMEM, "`clip_norm`: out of memory for %d norm partials", z->nb);
    const dt_grad_pieces *norm = s->norm_pieces ? &counted : &all;
    const dt_clip_spec c = {.dev = z->md,
                            .dev_ss = z->dss,
                            .nss = z->nb,
                            .norm = norm->p,
                            .nnorm = norm->n,
                            .scale = all.p,
                            .nscale = all.n,
                            .reduce = norm_allreduce,
                            .reduce_ctx = s};
    if (st == DT_OK) st = dt_clip_grad_pieces(&c, clip, &s->cur.grad_norm);
    dt_grad_pieces_free(&all), dt_grad_pieces_free(&counted);
    return st;
}

/* Blocking on the caller's thread: the step waits for all of them anyway, and the progress thread
 * would only add two thread switches (on a rank bound to one core they are on the critical path:
 * MLP b128 on two ranks, see ddp.c). */
/* Staged (z->stage_dev): the rank's chunk (and the last rank's tail) downloaded into the host
 * copy, gathered there, the bucket uploaded. */
dt_status dt_zero_gather_slab(dt_strategy *s, zero *z, float *p) {
    dt_dev *d = z->stage_dev;
    float *x = d ? z->host : p;
    for (int i = 0; i < z->nb; i++) {
        zbucket *b = &z->b[i];
        if (d && b->own_n) d->ops->download(d, x + b->own, p + b->own, b->own_n * sizeof(float));
        dt_status st = b->c ? dt_comm_allgather(s->comm, x + b->own, x + b->lo, b->c, DT_F32) : DT_OK;
        if (st == DT_OK && b->tail)
            st = dt_comm_broadcast(s->comm, x + b->lo + (size_t)z->N * b->c, b->tail, DT_F32, z->N - 1);
        if (st != DT_OK) return dt_error_wrap(st, "allgather of bucket %d of %d", i, z->nb);
        if (d) d->ops->upload(d, p + b->lo, x + b->lo, (b->hi - b->lo) * sizeof(float));
    }
    return DT_OK;
}

static dt_status zero_step(dt_strategy *s, float lr, float clip, dt_step_stats *st) {
    zero *z = s->impl;
    memset(st, 0, sizeof *st);
    st->early_buckets = z->early;
    if (z->stage == 3) dt_zero_params_replay(s, z);
    const double t0 = dt_now(); /* a last bucket the hook did not start runs blocking: communication */
    while (z->next < z->nb) issue(s, z, z->next, z->next == z->nb - 1), z->next++;
    dt_status first = DT_OK;
    int first_b = -1;
    for (int i = 0; i < z->nb; i++) {
        dt_status r = finish(s, z, i);
        if (r != DT_OK && first == DT_OK) first = r, first_b = i;
        if (s->trace) {
            char name[32];
            snprintf(name, sizeof name, "reduce_scatter b%d", i);
            dt_trace_add(s->trace, name, 1, z->b[i].t_issue, dt_now(), s->step);
        }
    }
    st->comm_wait_s = dt_now() - t0;
    st->buckets = z->nb;
    char who[32]; /* what errors call the strategy: ddp's sharded update is no ZeRO to its user */
    if (z->replica) snprintf(who, sizeof who, "ddp (update=shard)");
    else snprintf(who, sizeof who, "ZeRO-%d", z->stage);
    if (first != DT_OK)
        return dt_error_wrap(first, "%s gradient reduce-scatter of bucket %d of %d", who, first_b, z->nb);
    if (z->err != DT_OK) return dt_error(z->err, "%s: %s", who, z->errmsg);
    dt_status st2 = z->nbuf ? dt_strategy_broadcast_model(s->comm, s->model, dt_model_buffers(s->model), z->nbuf, 0)
                            : DT_OK;
    if (st2 != DT_OK) return dt_error_wrap(st2, "%s broadcast of the model buffers (batchnorm statistics)", who);
    const double t1 = dt_now();
    if (clip > 0 && (st2 = clip_shard(s, z, clip)) != DT_OK)
        return dt_error_wrap(st2, "%s `clip_norm` norm allreduce", who);
    if (z->replica) dt_optim_step_at(s->optim, z->nb, z->pp, z->gp, z->soff, z->len, lr);
    else dt_optim_step_ranges(s->optim, z->nb, z->pp, z->gp, z->len, lr);
    if (s->trace) dt_trace_add(s->trace, "optimizer", 0, t1, dt_now(), s->step);
    if (z->stage == 3) {
        dt_zero_params_release_all(s, z); /* the gathered copies are stale now */
        st->gathered_peak_bytes = (double)z->gath_peak;
        return DT_OK;
    }
    const double t2 = dt_now();
    dt_status g = dt_zero_gather_slab(s, z, dt_model_params(s->model));
    st->comm_wait_s += dt_now() - t2;
    if (s->trace) dt_trace_add(s->trace, "allgather params", 1, t2, dt_now(), s->step);
    return g == DT_OK ? DT_OK : dt_error_wrap(g, "%s parameter", who);
}

static dt_status zero_init(dt_strategy *s) {
    zero *z = s->impl;
    /* placed (stage 3): each rank holds other values, only the shape and buffers can agree */
    DT_TRY(dt_strategy_verify_model(s->comm, s->model, !z->placed));
    if (z->stage >= 2) {
        /* nothing was written to the gradients yet: give their pages back until backward needs them */
        if (z->blocks) DT_TRY(dt_zero_blocks_init(s, z));
        else
            for (int i = 0; i < z->nb; i++) release_grads(s, z, &z->b[i]);
        DT_TRY(dt_zero_params_init(s, z));
    }
    return DT_OK;
}

static dt_status zero_train_step(dt_strategy *s, const dt_step_batch *b, dt_step_result *r) {
    zero *z = s->impl;
    z->accum = b->accum > 1 ? b->accum : 1;
    return dt_strategy_default_train_step(s, b, r);
}

static void zero_destroy(dt_strategy *s) {
    zero *z = s->impl;
    if (!z) return;
    for (int i = 0; i < z->nb; i++) dt_request_wait(&z->b[i].rs), dt_request_wait(&z->b[i].rt);
    dt_zero_params_free(z);
    if (z->blocks) dt_zero_blocks_free(s, z);
    dt_model_set_node_hooks(s->model, NULL, NULL, NULL);
    dt_model_set_backward_hook(s->model, NULL);
    if (z->md) z->md->ops->free(z->md, z->gsh), z->md->ops->free(z->md, z->dss);
    dt_free(z->host);
    free(z->b), free(z->pp), free(z->gp), free(z->len), free(z->soff);
    free(z);
    s->impl = NULL;
}

static const dt_strategy_ops zero_ops = {.name = "zero",
                                         .train_step = zero_train_step,
                                         .init = zero_init,
                                         .begin_step = zero_begin,
                                         .grad_ready = zero_ready,
                                         .step = zero_step,
                                         .destroy = zero_destroy,
                                         .sync = dt_zero_sync,
                                         .visit_state = dt_zero_visit_state};
/* ddp(update=shard): stage 1's step, ddp's name, state and checkpoints */
static const dt_strategy_ops zero_update_ops = {.name = "ddp",
                                                .train_step = zero_train_step,
                                                .init = zero_init,
                                                .begin_step = zero_begin,
                                                .grad_ready = zero_ready,
                                                .step = zero_step,
                                                .destroy = zero_destroy,
                                                .sync = dt_zero_replica_sync,
                                                .visit_state = dt_zero_replica_visit};

/* This rank's shard of every bucket, its packed gradient shard and the optimizer's ranges. */
static dt_status plan_shards(dt_strategy *s, zero *z, const dt_ddp_range *r) {
    if (!(z->b = calloc((size_t)z->nb, sizeof *z->b)) || !(z->pp = calloc((size_t)z->nb, sizeof *z->pp)) ||
        !(z->gp = calloc((size_t)z->nb, sizeof *z->gp)) || !(z->len = calloc((size_t)z->nb, sizeof *z->len)))
        return dt_error(DT_ENOMEM, "zero: out of memory");
    size_t at = 0;
    for (int i = 0; i < z->nb; i++) {
        zbucket *b = &z->b[i];
        size_t off, len, n = r[i].hi - r[i].lo;
        dt_zero_chunk(n, z->r, z->N, &off, &len);
        *b = (zbucket){.lo = r[i].lo,
                       .hi = r[i].hi,
                       .c = n / (size_t)z->N,
                       .own = r[i].lo + off,
                       .own_n = len,
                       .at = at,
                       .pst = ZP_RESIDENT,
                       .rs_done = true,
                       .rt_done = true};
        b->tail = n - b->c * (size_t)z->N;
        z->len[i] = len;
        at += len;
    }
    z->nsh = at;
    if (z->blocks) DT_TRY(dt_zero_blocks_plan(s, z));
    if (z->stage >= 2 && !(z->gsh = z->md->ops->alloc(z->md, (at ? at : 1) * sizeof(float))))
        return dt_error_wrap(DT_ENOMEM, "zero: the gradient shard of %zu values on device %s", at, z->md->kind->name);
    const size_t P = dt_model_num_params(s->model);
    if (z->stage_dev && !(z->host = dt_alloc((P ? P : 1) * sizeof(float))))
        return dt_error_wrap(DT_ENOMEM, "zero: the %zu-value host copy its collectives run on (device %s)", P,
                             z->stage_dev->kind->name);
    float *p = dt_model_params(s->model), *g = dt_model_grads(s->model);
    for (int i = 0; i < z->nb; i++) {
        z->pp[i] = z->psh ? z->psh + z->b[i].at : p + z->b[i].own;
        z->gp[i] = z->stage >= 2 ? z->gsh + z->b[i].at : g + z->b[i].lo; /* where rs_dest puts it */
    }
    return DT_OK;
}

dt_status dt_zero_place(const dt_model *m, double bucket_mb, int rank, int size, dt_range **own, int *nown) {
    dt_ddp_range *b = NULL;
    int nb = 0;
    *own = NULL, *nown = 0;
    DT_TRY(dt_ddp_buckets((dt_model *)m, bucket_mb, &b, &nb));
    dt_range *r = malloc((size_t)nb * sizeof *r);
    if (!r) {
        free(b);
        return dt_error(DT_ENOMEM, "zero: out of memory");
    }
    for (int i = 0; i < nb; i++) { /* the buckets run from the end of the slab to its start */
        size_t off, len;
        const dt_ddp_range *k = &b[nb - 1 - i];
        dt_zero_chunk(k->hi - k->lo, rank, size, &off, &len);
        r[i] = (dt_range){k->lo + off, k->lo + off + len};
    }
    free(b);
    *own = r, *nown = nb;
    return DT_OK;
}

/* A model placed by dt_zero_place (stage 3 from set-up on) becomes whole again in the allocator's
 * books (nothing of it becomes resident: the pages not owned were never written or were given
 * back), so the stage's own release and gather charge and uncharge as for a whole model; any
 * other placement is refused. */
static dt_status take_placed(dt_strategy *s, zero *z, double bucket_mb) {
    int n = 0, k = 0;
    const dt_range *have = dt_model_placement(s->model, &n);
    if (!have) return DT_OK;
    dt_range *want = NULL;
    if (z->stage == 3) DT_TRY(dt_zero_place(s->model, bucket_mb, z->r, z->N, &want, &k));
    const bool same = want && k == n && !memcmp(want, have, (size_t)n * sizeof *want);
    free(want);
    if (!same)
        return dt_error(DT_EINVAL,
                        "zero: stage %d on rank %d of %d needs %s, but the model is placed in another part; "
                        "place it by the strategy's entry (dt_strategy_placement) or not at all",
                        z->stage, z->r, z->N, z->stage == 3 ? "its shards of the buckets" : "the whole model");
    z->placed = true;
    return dt_model_place(s->model, NULL, 0);
}

/* stage 1..3; replica: ddp(update=shard) (stage 1, the optimizer kept whole) */
static dt_status create(dt_strategy *s, double bucket_mb, int stage, bool replica) {
    if (stage < 1 || stage > 3) return dt_error(DT_EINVAL, "zero: stage %d (choose 1, 2 or 3)", stage);
    if (!s->optim) return dt_error(DT_EINVAL, "zero: the strategy needs the optimizer it shards");
    if (dt_optim_size(s->optim) != dt_model_num_params(s->model))
        return dt_error(DT_EINVAL, "zero: the optimizer covers %zu values, the model has %zu parameters",
                        dt_optim_size(s->optim), dt_model_num_params(s->model));
    zero *z = calloc(1, sizeof *z);
    if (!z) return dt_error(DT_ENOMEM, "zero: out of memory");
    z->stage = stage, z->N = dt_comm_size(s->comm), z->r = dt_comm_rank(s->comm);
    z->replica = replica;
    z->nbuf = dt_model_num_buffers(s->model);
    z->md = dt_model_device(s->model);
    z->host_pages = z->md->host_memory;
    z->blocks = !z->host_pages && stage >= 2 && !replica;
    z->stage_dev = dt_strategy_stage_device(s->comm, s->model);
    s->impl = z;
    s->ops = replica ? &zero_update_ops : &zero_ops;
    dt_ddp_range *r = NULL;
    dt_status st = take_placed(s, z, bucket_mb);
    if (st == DT_OK) st = dt_ddp_buckets(s->model, bucket_mb, &r, &z->nb);
    if (st == DT_OK) st = plan_shards(s, z, r);
    free(r);
    size_t *off = st == DT_OK ? malloc((size_t)z->nb * sizeof *off) : NULL;
    if (st == DT_OK && !off) st = dt_error(DT_ENOMEM, "zero: out of memory");
    for (int i = 0; st == DT_OK && i < z->nb; i++) off[i] = z->b[i].own;
    if (st == DT_OK && !replica) st = dt_optim_shard(s->optim, z->nb, off, z->len);
    if (replica) z->soff = off; /* the shard's state stays in place in the whole optimizer */
    else free(off);
    if (st != DT_OK) {
        zero_destroy(s);
        s->ops = NULL;
        return st;
    }
    s->grads_zeroed = stage >= 2;     /* the reduce leaves them zero */
    s->shards_state = !replica;       /* every rank writes its shard of a checkpoint (replica: rank 0 all) */
    s->sync_for_state_only = replica; /* the parameters are whole; only the moments need gathering */
    return DT_OK;
}

dt_status dt_zero_create(dt_strategy *s, double bucket_mb, int stage) { return create(s, bucket_mb, stage, false); }

dt_status dt_zero_create_update(dt_strategy *s, double bucket_mb) { return create(s, bucket_mb, 1, true); }
