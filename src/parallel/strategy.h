/* Distribution strategies: the one interface through which the trainer drives data-parallel
 * (and later sharded / asynchronous) training. The trainer loop is the same for every
 * strategy: forward, loss, backward with the strategy's grad-ready hook, then strategy step.
 * parallel/ is the only layer where models (nn/, optim/) and communication (comm/) meet. */
#ifndef DT_DIST_STRATEGY_H
#define DT_DIST_STRATEGY_H

#include "core/trace.h"
#include "dtrain/comm.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/workers.h"

#include <signal.h>

typedef struct {
    double bucket_mb;  /* ddp: gradient bucket (fusion buffer) size in MB; <= 0: default 1 MB */
    dt_trace *trace;   /* may be NULL */
    int servers;       /* ps: the first `servers` ranks are servers (<= 0: 1) */
    int staleness;     /* ps: bound in steps (rounds of W batches, see ps.h), < 0 = unbounded */
    bool fixed_shards; /* ps: each worker owns 1/W of every epoch, SSP on its own steps (default:
                        * dynamic assignment, the workers take the next batch from server 0) */
    bool overlap;      /* ps, dynamic assignment, staleness < 0 only: a worker's push and pull run in
                        * the background while it trains the next batch (one unit held ahead, ps.h) */
    int sync_every;    /* localsgd: steps between model averages (<= 0: 8) */
} dt_strategy_config;

/* What a rank does under the strategy. */
typedef enum {
    DT_ROLE_REPLICA = 0,  /* trains a replica; the ranks reduce epoch figures together (ddp, localsgd) */
    DT_ROLE_WORKER,       /* ps worker: trains on its shard, talks only to the servers */
    DT_ROLE_SERVER,       /* ps server: runs ops->serve instead of the step loop */
} dt_role;

/* One epoch as seen by the servers (ps), reported by server rank 0 after it assembled the whole
 * current model into s->model (and, when asked, the optimizer state into s->optim). */
typedef struct {
    int64_t epoch;             /* 0-based epoch that ended (or was cut short by max_steps) */
    int64_t step;              /* worker clock at its end: every live worker did this many steps */
    bool complete;             /* false: ended by max_steps inside the epoch */
    double loss_sum;           /* sum over the epoch's samples of the training loss */
    int64_t samples;
    double epoch_s;            /* wall time since the previous report */
    int nworkers;
    const dt_worker_info *workers;
    const int64_t *staleness;  /* [DT_STALENESS_BINS] */
    int max_clock_gap;
    int64_t step_in_epoch;     /* ps dynamic: where a resume continues (see dt_serve_config); else -1 */
    double busy_s, wait_s;     /* the workers' compute and exchange waits, summed over their pushes */
    int64_t pushes;
} dt_serve_epoch;

/* What the servers need to know about the run, and the lead's callbacks. */
typedef struct {
    int64_t start_step, start_epoch, start_step_in_epoch;  /* where the workers start */
    int64_t steps_per_epoch, epochs, max_steps;            /* max_steps 0 = none */
    int batch;                 /* per-worker batch (for the report) */
    bool want_optim;           /* assemble the optimizer state too (for checkpoints) */
    double progress_s;         /* seconds between on_progress calls */
    volatile sig_atomic_t *stop;  /* set (by a signal handler) to stop serving: DT_EINTR; may be NULL */
    int64_t *stopped_step;     /* out, may be NULL: on a stop with one server, the worker clock of the
                                * model assembled into s->model (else left alone) */
    /* ps dynamic assignment (s->dynamic): units of `batch` samples per epoch (ceil(n / batch));
     * the workers start at unit start_step_in_epoch * workers of start_epoch. Positions handed
     * back (stopped_epoch/stopped_in_epoch, dt_serve_epoch.step_in_epoch) are in global batches of
     * batch x workers: floor(units done before the first unit not yet pushed / workers). */
    int64_t units_per_epoch;
    int64_t *stopped_epoch, *stopped_in_epoch;  /* out, may be NULL: with stopped_step */
    /* server rank 0 only; called from the serving thread */
    dt_status (*on_epoch)(void *ctx, const dt_serve_epoch *e);
    void (*on_progress)(void *ctx, int64_t min_step, int64_t samples, double loss_sum);
    void (*on_note)(void *ctx, const char *msg);
    void *ctx;
} dt_serve_config;

/* Per-step timing a strategy reports back to the trainer. */
typedef struct {
    double comm_wait_s;  /* time the step blocked on communication */
    int buckets;         /* buckets communicated this step */
    int early_buckets;   /* of which were started while backward was still running */
} dt_step_stats;

typedef struct dt_strategy dt_strategy;

/* ---- state for checkpoints (DCP style): what a rank holds, as pieces of whole tensors ---- */

/* A piece of a tensor of the training state: buf holds buf.count values of tensor `name` (global
 * shape shape[0..ndim), numel elements) starting at element `offset`; a replicated strategy
 * reports whole tensors (offset 0, count numel), a sharded one its slices. Names are the
 * checkpoint's: "0.weight", "transformer.wte.weight", "optim.m.<tensor>", "optim.v.<tensor>". */
typedef struct {
    const char *name;
    dt_buffer buf;
    int ndim;
    int64_t shape[4];
    size_t numel, offset;
    bool is_optim;  /* an optimizer moment (absent from weights-only checkpoints) */
} dt_state_piece;
/* Called with each piece; returning an error stops the visit with it. For a restore the visitor
 * writes into buf. */
typedef dt_status (*dt_state_visit_fn)(void *ctx, const dt_state_piece *p);

/* Visits model m's tensors (parameters and buffers) in their table order, each followed by its
 * optimizer moments when o != NULL: whole tensors (the state of a replicated strategy). */
dt_status dt_state_visit_model(dt_model *m, dt_optim *o, dt_state_visit_fn fn, void *ctx);

/* One step of this rank, as the trainer hands it to the strategy (dt_strategy_train_step). */
typedef struct {
    dt_feed feed;         /* this rank's samples (n may be 0 on a rank of a final spread batch) */
    int n_global;         /* samples of the whole global batch, every rank together */
    int world;            /* ranks sharing the global batch */
    int accum;            /* micro-batches the feed is cut into (--grad-accum; <= 1: one) */
    int64_t step;         /* the optimizer step (keys dropout masks) */
    float lr, clip;
    /* called after forward/backward with the samples and their compute seconds; returns the seconds
     * it added (a --slow sleep); may be NULL */
    double (*compute_done)(void *ctx, int n, double busy_s);
    void *ctx;
} dt_step_batch;

/* What a step did. */
typedef struct {
    double loss_sum;      /* sum over the rank's samples of their loss */
    int n;                /* samples */
    double compute_s;     /* forward + backward + update, without communication waits */
    dt_step_stats st;
} dt_step_result;

typedef struct {
    const char *name;
    /* Optional (NULL = dt_strategy_default_train_step): trains one step of b. */
    dt_status (*train_step)(dt_strategy *s, const dt_step_batch *b, dt_step_result *r);
    /* Makes every rank start from identical parameters (verify or broadcast). */
    dt_status (*init)(dt_strategy *s);
    /* At the start of each step, before its forward pass. */
    void (*begin_step)(dt_strategy *s, int64_t step);
    /* Backward hook: grads[offset, offset+n) are final for this step (layers complete last to first). */
    void (*grad_ready)(dt_strategy *s, size_t offset, size_t n);
    /* After backward: finish communication, clip, apply the optimizer with learning rate lr. */
    dt_status (*step)(dt_strategy *s, float lr, float clip_norm, dt_step_stats *st);
    void (*destroy)(dt_strategy *s);
    /* Optional (NULL = nothing to do): makes every replica hold the same current model before
     * evaluation and checkpoints (localsgd: averages now). Collective over the replicas. */
    dt_status (*sync)(dt_strategy *s);
    /* Optional (NULL = dt_state_visit_model of the strategy's model and optimizer): reports this
     * rank's part of the training state, for checkpoints to write and to restore. */
    dt_status (*visit_state)(dt_strategy *s, dt_state_visit_fn fn, void *ctx);
    /* Optional, for role DT_ROLE_SERVER: serves the workers until they are all done or gone. */
    dt_status (*serve)(dt_strategy *s, const dt_serve_config *cfg);
} dt_strategy_ops;

struct dt_strategy {
    const dt_strategy_ops *ops;
    dt_comm *comm;      /* NULL for a single process */
    dt_model *model;
    dt_optim *optim;
    dt_trace *trace;
    int64_t step;
    void *impl;
    /* set by the constructor (defaults: replica, data rank/world = comm rank/size) */
    dt_role role;
    int data_rank, data_world;  /* this rank's part of the data (ps workers: index among workers) */
    int job_rank0;              /* job rank of data rank 0 */
    bool dynamic;               /* ps (not fixed_shards): the servers hand out the batches (ps.h);
                                 * the worker trains unit next_unit of epoch next_epoch next
                                 * (next_unit < 0: none left) */
    int64_t next_epoch, next_unit;
    bool ahead;                 /* ps overlap: the worker holds one unit ahead; before its first step
                                 * the trainer sets next_epoch/next_unit to that unit (seq W + w,
                                 * next_unit < 0: none) and after each step they name the next */
    bool local_mean;            /* the step wants the mean gradient of the local batch (localsgd,
                                 * ps); else the rank's share of the global mean (ddp) */
    struct {                    /* the current step on this rank, set by the trainer before ops->step */
        int n;                  /* samples */
        int64_t epoch;
        double loss_sum;        /* sum of the per-sample losses */
        double busy_s;          /* forward+backward time (including a --slow sleep) */
    } cur;
};

/* Creates strategy `name` ("single" for one process, "ddp", "localsgd", "ps"); comm may be NULL
 * only for "single". The strategy borrows comm, model and optim. DT_EINVAL naming the strategy
 * if unknown. */
dt_status dt_strategy_create(dt_strategy **s, const char *name, dt_comm *comm, dt_model *m, dt_optim *o,
                             const dt_strategy_config *cfg);
/* Frees the strategy; NULL is a no-op. */
void dt_strategy_destroy(dt_strategy *s);
/* The backward hook to pass to dt_model_backward with the strategy as ctx. */
void dt_strategy_grad_hook(void *strategy, size_t offset, size_t n);

/* Strategy constructors (one per module). */
dt_status dt_strategy_single_create(dt_strategy *s, const dt_strategy_config *cfg);
dt_status dt_strategy_ddp_create(dt_strategy *s, const dt_strategy_config *cfg);
dt_status dt_strategy_localsgd_create(dt_strategy *s, const dt_strategy_config *cfg);
dt_status dt_strategy_ps_create(dt_strategy *s, const dt_strategy_config *cfg);

/* The data part of a rank under strategy `name` before the strategy exists (for the loader):
 * ps workers are ranks servers..size-1 and shard the data among themselves; servers get
 * data rank 0 of the workers (they never train). Others: rank of size. DT_EINVAL when ps
 * leaves no worker. */
dt_status dt_strategy_data_part(const char *name, const dt_strategy_config *cfg, int rank, int size, int *data_rank,
                                int *data_world);

/* Visits this rank's training state through ops->visit_state (see dt_state_piece). */
dt_status dt_strategy_visit_state(dt_strategy *s, dt_state_visit_fn fn, void *ctx);

/* Trains one step through the strategy's train_step (forward, loss, backward with the grad-ready
 * hook, sync, update). */
dt_status dt_strategy_train_step(dt_strategy *s, const dt_step_batch *b, dt_step_result *r);
/* The step the replicated strategies share: begin_step; zero the gradients; for each of the
 * accum micro-batches forward with the loss node and backward with d loss = its share of the
 * global mean (the hook only on the last, so communication starts once the sum is final); then
 * ops->step. DT_EINVAL when the loss is not finite. */
dt_status dt_strategy_default_train_step(dt_strategy *s, const dt_step_batch *b, dt_step_result *r);

/* The local update shared by the replicated strategies: clip the whole gradient slab (clip > 0)
 * and apply the optimizer to the whole parameter slab. */
void dt_strategy_apply_update(dt_strategy *s, float lr, float clip);

/* Verifies that every rank of comm holds bitwise identical model parameters and buffers
 * (checksum allreduce); DT_EMISMATCH naming a differing rank otherwise. */
dt_status dt_strategy_verify_replicas(dt_comm *comm, dt_model *m);

#endif
