/* Distribution strategies: the one interface through which the trainer drives data-parallel
 * (and later sharded / asynchronous) training. The trainer loop is the same for every
 * strategy: forward, loss, backward with the strategy's grad-ready hook, then strategy step.
 * dist/ is the only layer where models (nn/, optim/) and communication (comm/) meet. */
#ifndef DT_DIST_STRATEGY_H
#define DT_DIST_STRATEGY_H

#include "core/trace.h"
#include "dtrain/comm.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"

typedef struct {
    double bucket_mb;  /* ddp: gradient bucket (fusion buffer) size in MB; <= 0: default 1 MB */
    dt_trace *trace;   /* may be NULL */
} dt_strategy_config;

/* Per-step timing a strategy reports back to the trainer. */
typedef struct {
    double comm_wait_s;  /* time the step blocked on communication */
    int buckets;         /* buckets communicated this step */
    int early_buckets;   /* of which were started while backward was still running */
} dt_step_stats;

typedef struct dt_strategy dt_strategy;

typedef struct {
    const char *name;
    /* Makes every rank start from identical parameters (verify or broadcast). */
    dt_status (*init)(dt_strategy *s);
    /* Before each step's backward pass. */
    void (*begin_step)(dt_strategy *s, int64_t step);
    /* Backward hook: grads[offset, offset+n) are final for this step (layers complete last to first). */
    void (*grad_ready)(dt_strategy *s, size_t offset, size_t n);
    /* After backward: finish communication, clip, apply the optimizer with learning rate lr. */
    dt_status (*step)(dt_strategy *s, float lr, float clip_norm, dt_step_stats *st);
    void (*destroy)(dt_strategy *s);
} dt_strategy_ops;

struct dt_strategy {
    const dt_strategy_ops *ops;
    dt_comm *comm;      /* NULL for a single process */
    dt_model *model;
    dt_optim *optim;
    dt_trace *trace;
    int64_t step;
    void *impl;
};

/* Creates strategy `name` ("single" for one process, "ddp"); comm may be NULL only for
 * "single". The strategy borrows comm, model and optim. DT_EINVAL naming the strategy if
 * unknown. */
dt_status dt_strategy_create(dt_strategy **s, const char *name, dt_comm *comm, dt_model *m, dt_optim *o,
                             const dt_strategy_config *cfg);
/* Frees the strategy; NULL is a no-op. */
void dt_strategy_destroy(dt_strategy *s);
/* The backward hook to pass to dt_model_backward with the strategy as ctx. */
void dt_strategy_grad_hook(void *strategy, size_t offset, size_t n);

/* Strategy constructors (one per module). */
dt_status dt_strategy_single_create(dt_strategy *s, const dt_strategy_config *cfg);
dt_status dt_strategy_ddp_create(dt_strategy *s, const dt_strategy_config *cfg);

/* Verifies that every rank of comm holds bitwise identical model parameters and buffers
 * (checksum allreduce); DT_EMISMATCH naming a differing rank otherwise. */
dt_status dt_dist_verify_replicas(dt_comm *comm, dt_model *m);

#endif
