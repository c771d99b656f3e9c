/* Memory plans: the bytes a rank will hold for parameters, gradients, optimizer state and
 * activations under a parallel layout (data x tensor x pipeline ranks, a ZeRO stage over the
 * data-parallel ranks, micro-batches and a pipeline schedule), before anything is trained
 * (`dtrain train --dry-run`). */
#ifndef DTRAIN_MEMPLAN_H
#define DTRAIN_MEMPLAN_H

#include "dtrain/comm.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A layout. Rank r sits where the mesh puts it (TP innermost, then PP, then DP):
 * r = (data index x pp + stage) x tp + tensor index. */
typedef struct {
    int dp, tp, pp;       /* ranks on each axis (>= 1) */
    int zero;             /* ZeRO stage over the dp ranks, 0..3 */
    int microbatches;     /* per optimizer step (pipeline micro-batches or --grad-accum), >= 1 */
    const char *schedule; /* pipeline schedule "gpipe" or "1f1b" (NULL: "1f1b") */
    int batch;            /* samples of one micro-batch on a rank */
    double bucket_mb;     /* ddp/ZeRO bucket size (<= 0: 1 MB) */
    bool device;          /* the model is on a device whose memory is not the host's (--device checked):
                           * ZeRO-3's gathered buckets are whole staging blocks, and data-parallel
                           * collectives run on a host copy of a slab (and of ZeRO-3's gathers) */
} dt_mem_layout;

/* What one rank holds, in bytes (f32 master copies; Adam: 2 moments, SGD+momentum: 1). */
typedef struct {
    double params, grads, optim; /* owned (ZeRO) or replicated state, the rank's tensor/stage part;
                                  * ZeRO >= 2 grads include two buckets in flight */
    double gathered;             /* ZeRO-3: parameters gathered in flight (a layer and the next) */
    double staging;              /* on a device (dt_mem_layout.device), data parallel: the host copy of
                                  * the gradient slab its collectives run on (ZeRO-3: and of the
                                  * buckets it gathers); host memory */
    double activations;          /* the micro-batches in flight at once */
    double total;                /* while training */
    double sync;                 /* more while evaluation and checkpoints gather the whole model (pp, tp,
                                  * tp x pp: checkpoints, rank 0 also the optimizer state it writes;
                                  * ZeRO-3 over dp: evaluation's parameters); not in total */
    int dp_rank, stage, tp_rank; /* the rank's coordinates in the layout */
} dt_mem_plan;

/* The plan of `rank` of layout l for model m trained with optimizer o. DT_EINVAL for a bad layout
 * (axis < 1, zero outside 0..3, rank outside dp*tp*pp, an unknown schedule), naming the field. */
dt_status dt_mem_plan_rank(dt_model *m, const dt_optim_config *o, const dt_mem_layout *l, int rank, dt_mem_plan *p);

/* The model of config c (--model, default mlp, over the shape of --data) with its slabs laid out
 * but nothing trained or written (no memory resident), for plans; free with dt_model_destroy. */
dt_status dt_train_plan_model(const dt_train_config *c, dt_model **m);
/* The bytes of the private copy on huge pages that each rank's training loader makes of the
 * training set of config c (dt_loader_copy_bytes; after --val-split), charged like the model's
 * buffers; 0 where it makes none. */
dt_status dt_train_plan_loader(const dt_train_config *c, size_t *bytes);

/* ---- measuring (dtrain bench zero) ---- */

/* What one rank of a measured run held, as the OS counts it (bytes of resident memory). */
typedef struct {
    double base;        /* VmRSS before the model existed */
    double setup_peak;  /* VmHWM once the strategy held its (sharded) state */
    double peak;        /* VmHWM over the training steps (reset after set-up) */
    double step_s;      /* mean seconds of a step after the first */
    double activations; /* dt_model_activation_bytes at the batch */
    double cpu_s;       /* mean CPU seconds of a step after the first (user + system, every thread of the rank) */
    double faults;      /* mean minor page faults of a step after the first */
    double shmem;       /* RssShmem after the steps less before: the transport's shared slots this rank
                         * touched (in its peak; every rank that maps a page counts it whole) */
    double gathered;    /* ZeRO-3: the most gathered parameter bytes not owned that the rank held at once
                         * (counted where the gathers start and their pages are given back); else 0 */
} dt_mem_probe;

/* Trains the GPT of gpt_spec under strategy spec (NULL or "single": one process, comm NULL)
 * over comm for 1 + steps steps of batch synthetic sequences and fills *out; collective over
 * comm. DT_EINVAL for a bad spec; the strategy's errors otherwise. */
dt_status dt_mem_probe_gpt(const char *gpt_spec, const char *strategy, dt_comm *comm, int batch, int steps,
                           dt_mem_probe *out);

#ifdef __cplusplus
}
#endif
#endif
