/* ZeRO's state shared by its files: the buckets with this rank's shard of each, the packed
 * gradient shard and stage 3's parameter gathers. */
#ifndef DT_PARALLEL_ZERO_INTERNAL_H
#define DT_PARALLEL_ZERO_INTERNAL_H

#include "device/device.h"
#include "parallel/zero.h"

enum { ZP_RELEASED = 0, ZP_GATHERING, ZP_RESIDENT }; /* stage 3: a bucket's parameters */
enum { ZERO_NODE_BUCKETS = 4 };                      /* buckets one node reads (its tensors) */

typedef struct {
    size_t lo, hi;         /* slab range */
    size_t c, tail;        /* chunk per rank, and the rest (< N values) that the last rank owns */
    size_t own, own_n;     /* this rank's shard in the slab: [own, own + own_n) */
    size_t at;             /* its place in the packed shard (gradients, optimizer state) */
    dt_request *rs, *rt;   /* the gradient reduce: chunks and tail */
    bool rs_done, rt_done; /* each part finished (or empty) */
    bool issued, reduced;
    bool gfree;          /* stage >= 2: its gradient pages are given back */
    size_t grel;         /* bytes given back from the gradient slab */
    dt_request *ag, *bt; /* stage 3: parameter gather of the chunks, broadcast of the tail */
    int pst;             /* ZP_* */
    size_t prel;         /* bytes given back from the parameter slab */
    bool counted;        /* stage 3: its gathered values not owned are in zero.gath_now */
    int t0, t1;          /* the tensors (table ids) whose values lie in [lo, hi) */
    float *gblk;         /* blocks, stage >= 2: its gradients from backward's first write to the reduce */
    float *pblk;         /* blocks, stage 3: its gathered parameters (a staging block of the device) */
    float *phost;        /* blocks, stage 3, staged: the host copy its gather runs on */
    double t_issue;
    double t_gather; /* stage 3: when its parameter gather started (the timeline's span) */
} zbucket;

typedef struct {
    int stage, N, r;
    bool replica; /* ddp(update=shard): stage 1 with the optimizer whole (stale outside the
                   * shard until sync gathers it) and ddp's checkpoints (dt_zero_create_update) */
    size_t *soff; /* replica: per bucket, the shard's place in the whole optimizer state */
    bool placed;  /* the model came placed to this rank's shards (dt_zero_place) */
    zbucket *b;
    int nb;
    int next, early;   /* next bucket to reduce; reduced from the backward hook */
    float *gsh;        /* stage >= 2: the reduced gradients of the shard, packed (a block of md) */
    dt_dev *md;        /* the model's device: the shards are its blocks, the step's arithmetic its calls */
    bool host_pages;   /* md's memory is host memory: pages not needed go back to the OS (madvise) */
    bool blocks;       /* stage >= 2 on a device whose memory is not the host's: a part of a block
                        * cannot be given back, so the gradients (and stage 3's parameters) are held
                        * in blocks of their own, bound into the graph (zero_blocks.c) */
    float *psh;        /* blocks, stage 3: this rank's parameter shard, packed as gsh */
    float *pwhole;     /* blocks, stage 3: the whole parameters while z->full (the model's slab) */
    dt_dev *stage_dev; /* the comm does not take md's memory (dt_strategy_stage_device): collectives
                        * run on `host`, a host copy of one slab, downloaded and uploaded around them */
    float *host;
    double *dss; /* --clip: per bucket, the squared norm of its shard (nb doubles of md) */
    size_t nsh;  /* values in the shard */
    float **pp;  /* per bucket: the shard's parameters, gradients, lengths (optimizer) */
    const float **gp;
    size_t *len;
    size_t nbuf; /* model buffers broadcast every step (batchnorm running stats) */
    /* stage 3 */
    dt_comm *pcomm; /* parameter gathers run on their own communicator (split of s->comm) */
    int nnodes;
    int *node_b;                /* node i reads buckets node_b[i*ZERO_NODE_BUCKETS + k] (-1: none) */
    int *fwd_next, *bwd_next;   /* the next node with parameters in forward / backward order (-1) */
    bool full;                  /* every parameter gathered (after sync): the hooks do nothing */
    int fwd_calls;              /* forward passes this step (hooks on the first node with parameters) */
    int accum;                  /* micro-batches of this step */
    int64_t gathers;            /* parameter gathers issued (for the stats) */
    size_t gath_now, gath_peak; /* bytes of gathered parameters not owned held now, and the most this step */
    dt_status err;              /* first error of a hook, reported by the step */
    char errmsg[512];
} zero;

/* Stage 3 (zero_params.c): installs the node hooks and frees the parameters not owned. */
dt_status dt_zero_params_init(dt_strategy *s, zero *z);
/* Stage 3: gathers every bucket (sync, evaluation) and sets z->full; collective. */
dt_status dt_zero_params_gather_all(dt_strategy *s, zero *z);
/* Stage 3: frees every gathered bucket's parameters not owned (the start of a step). */
void dt_zero_params_release_all(dt_strategy *s, zero *z);
/* Stage 3: a rank that had no samples this step runs the hooks' gathers the others ran. */
void dt_zero_params_replay(dt_strategy *s, zero *z);
/* Stage 3: waits for the gathers in flight; frees the hooks' tables. */
void dt_zero_params_free(zero *z);
/* Stage >= 2 (zero.c): gives back the gradient pages of the buckets whose reduce finished and waits
 * for the oldest while more than dt_zero_inflight_cap(stage) are in flight. */
void dt_zero_poll(dt_strategy *s, zero *z);
/* Records the first hook error: "WHAT of bucket B of NB: " and the last error's message. */
void dt_zero_hook_error(zero *z, dt_status st, const char *what, int bucket);

/* Stages 1-2 (zero.c): every rank's chunks of slab `base` (parameters, or an optimizer moment of
 * ddp(update=shard)) to every rank, in place, blocking. Collective. */
dt_status dt_zero_gather_slab(dt_strategy *s, zero *z, float *base);

/* Blocks (zero_blocks.c). Plan: each bucket's tensors; stage 3's packed parameter shard. */
dt_status dt_zero_blocks_plan(dt_strategy *s, zero *z);
/* At init, after the replicas were verified: the whole gradient block freed (stage >= 2); stage 3
 * copies its chunks into the shard and frees the whole parameter block. */
dt_status dt_zero_blocks_init(dt_strategy *s, zero *z);
/* Bucket i's gradient block, made (zeroed, bound into the graph) where it has none; NULL when out
 * of memory (the error kept for the step). */
float *dt_zero_grad_block(dt_strategy *s, zero *z, int i);
/* Frees bucket i's gradient block (its gradients read as unbound, i.e. none, until the next write). */
void dt_zero_grad_block_free(dt_strategy *s, zero *z, int i);
/* Stage 3: binds bucket i's tensors to its staging block (bind) or unbinds them and frees it. */
void dt_zero_param_bind(dt_strategy *s, zero *z, int i, bool bind);
/* Stage 3: every bucket gathered into one whole parameter block, given to the model (z->pwhole),
 * for evaluation and checkpoints; release takes it back and frees it. */
dt_status dt_zero_blocks_whole(dt_strategy *s, zero *z);
void dt_zero_blocks_unwhole(dt_strategy *s, zero *z);
/* Frees every block (destroy). */
void dt_zero_blocks_free(dt_strategy *s, zero *z);

/* Checkpoints (zero_state.c): sync (stage 3: gathers the model) and the visitor of the pieces
 * this rank owns. */
dt_status dt_zero_sync(dt_strategy *s);
dt_status dt_zero_visit_state(dt_strategy *s, dt_state_visit_fn fn, void *ctx);
/* ddp(update=shard): sync gathers every rank's shard of the optimizer moments (the replicas then
 * hold the whole state, as ddp's), and the state is visited as ddp's (rank 0 writes it all). */
dt_status dt_zero_replica_sync(dt_strategy *s);
dt_status dt_zero_replica_visit(dt_strategy *s, dt_state_visit_fn fn, void *ctx);

#endif
