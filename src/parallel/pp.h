/* Pipeline parallelism, internal to src/parallel/pp*.c: the cut of the graph into stages
 * (pp_cut.c), the micro-batch schedules GPipe and 1F1B as lists of actions (pp_schedule.c), the
 * step that runs a schedule with point-to-point sends (pp_step.c) and the strategy itself (pp.c:
 * options, communicators, optimizer segments, state for checkpoints, metrics).
 *
 * Rank order of the mesh (mesh.h): rank = (dp_i * PP + pp_i) * TP + tp_i, TP innermost. With
 * tp=T > 1 each stage runs its cut of the tensor-parallel GPT shard over its T ranks (pp_tp.c:
 * the shard, its hooks, the gathers of a sync); without, TP = 1 and rank = dp_i * PP + pp_i. */
#ifndef DT_PARALLEL_PP_H
#define DT_PARALLEL_PP_H

#include "parallel/mesh.h"
#include "parallel/strategy.h"
#include "parallel/tp.h"

#include <stdbool.h>
#include <stddef.h>

#define DT_PP_MAX_STAGES 64
#define DT_PP_MAX_MICRO 1024

typedef enum { DT_PP_GPIPE = 0, DT_PP_1F1B } dt_pp_schedule_kind;

/* pp's options: "pp(stages=K,microbatches=M,schedule=gpipe|1f1b,split=N1:N2:...)". */
typedef struct {
    int stages;       /* K >= 1; the world must be a multiple of tp x K (the rest is DP) */
    int tp;           /* T >= 1 tensor-parallel ranks per stage (a GPT's shards) */
    int microbatches; /* M >= 1 per rank-batch (default K) */
    dt_pp_schedule_kind schedule;
    char split[160]; /* "" = balanced; else K-1 first nodes of stages 1..K-1, by index or name */
    bool measured;   /* balance measured per-node seconds (pp_cost.c) instead of flops */
    int zero;        /* ZeRO stage over the DP axis: 0-3 (pp_zero.c, pp_zero3.c) */
} dt_pp_opts;

/* ---- schedules (pp_schedule.c) ---- */

/* One action of a stage: forward or backward of micro-batch mb. */
typedef struct {
    bool backward;
    int mb;
} dt_pp_action;

/* The actions of stage s of K for M micro-batches under kind, into a[0..2M) (2M of them: each
 * micro-batch once forward, once backward). GPipe: all forwards, then the backwards in reverse
 * order. 1F1B: min(K-s-1, M) warm-up forwards, then one forward one backward, then the rest of the
 * backwards, in micro-batch order. */
void dt_pp_schedule(dt_pp_schedule_kind kind, int s, int K, int M, dt_pp_action *a);
/* Most micro-batches forwarded and not yet backwarded at any point of a[0..n). */
int dt_pp_schedule_peak(const dt_pp_action *a, int n);
/* "gpipe" | "1f1b" -> kind; DT_EINVAL otherwise. */
dt_status dt_pp_schedule_parse(const char *name, dt_pp_schedule_kind *kind);
const char *dt_pp_schedule_name(dt_pp_schedule_kind kind);

/* ---- the cut (pp_cut.c) ---- */

/* True when the graph may be cut before node k: exactly one node below k (node k-1, not an
 * input nor an alias of one) is read at k or above, and the loss stays above the cut. */
bool dt_pp_cut_valid(const dt_model *m, int k);
/* The first node of each stage: first[0] = 0, first[1..K) the cuts, first[K] = the node count.
 * split "" balances cost[] (per node, e.g. flops; NULL: flops at batch 1) so that the most
 * expensive stage is as cheap as the valid cuts allow; else split names the K-1 cuts
 * ("12:24:36" or node names "transformer.h.2.add2:..."). DT_EINVAL saying which cuts are valid. */
dt_status dt_pp_cut(const dt_model *m, int K, const char *split, const double *cost, int *first);
/* pp's entry.mem_plan: where sh->pp > 1, sh->mine gets the parameter values of the stage's tensors
 * under the flops cut (dt_pp_cut, no split: the default placement), each a tp-th where sh->tp
 * splits it; DT_EINVAL beyond DT_PP_MAX_STAGES stages. */
dt_status dt_pp_mem_plan(dt_model *m, dt_mem_share *sh);

/* Per-node seconds of forward + backward at batch B (reps passes), measured on rank 0 of comm and
 * broadcast into cost[num_nodes] on every rank (pp_cost.c). Collective over comm. */
dt_status dt_pp_measure_costs(dt_model *m, dt_comm *comm, int B, int reps, double *cost);
/* This rank alone: seconds per node (forward + backward, through the node hooks) summed into
 * cost[nodes] over reps passes at batch B of zeros, after `warmup` passes not counted; the model's
 * gradients and buffers are left as they were. pp's cut and the planner's probe (plan/measure.c). */
dt_status dt_pp_time_nodes(dt_model *m, int B, int warmup, int reps, double *cost);

/* ---- the strategy's state (pp.c, pp_step.c) ---- */

/* Memory of one micro-batch in flight on this stage (taken at its forward, given back after its
 * backward): the received stage input, the activation sent on, the gradients, fed tokens. */
typedef struct {
    float *in, *out, *gin, *gout;
    int32_t *x, *y;
    int cap; /* samples the buffers hold */
    dt_request *req_out, *req_gout;
    double t_out, t_gout; /* when the sends were issued (for the timeline) */
    int mb_gout;          /* micro-batch of the gradient send */
    bool used;
} dt_pp_slot;

/* A contiguous range of the parameter slab that this stage updates, with its own optimizer. */
typedef struct {
    size_t lo, hi;
    dt_optim *opt;
    bool zero; /* ZeRO (pp_zero.c): opt holds chunk [lo + zoff, lo + zoff + zlen) only */
    size_t zoff, zlen;
    size_t gat;    /* ZeRO-2: the chunk's averaged gradient at p->gsh + gat */
    bool resident; /* ZeRO-3: every DP rank's chunk of the values is here (gathered) */
    size_t prel;   /* ZeRO-3: parameter bytes given back while it is not */
    bool whole;    /* after a sync on DP rank 0: opt is the whole segment's, shard the chunk's */
    dt_optim *shard;
} dt_pp_segment;

typedef struct {
    dt_pp_opts o;
    int K, DP, stage, dp_i, rank; /* rank: in the strategy's communicator */
    int tp, tr;                   /* tensor-parallel ranks per stage, this rank's index among them */
    dt_mesh mesh;                 /* the dp x pp x tp axes (pp and dp below are its communicators) */
    dt_model *m;                  /* the model the stage runs: s->model, or (tp > 1) the rank's shard */
    dt_tp_hooks *hooks;           /* tp > 1: the shard's collectives over the stage's tp axis */
    int first[DT_PP_MAX_STAGES + 1];
    int lo, hi;                          /* this stage's nodes [lo, hi) */
    dt_comm *pp, *fwd, *bwd, *data, *dp; /* pp: the stages of this pipeline, the ranks of this tp
                                          * index (fwd, bwd, data: its duplicates for activations,
                                          * gradients, tokens); pp and dp belong to the mesh */
    size_t in_vals, out_vals;            /* values per sample of the stage input (node lo-1) and output */
    size_t x_vals, y_vals;               /* values per sample of the fed inputs */
    bool reads_x[DT_PP_MAX_STAGES], reads_y[DT_PP_MAX_STAGES];
    uint64_t *users; /* per tensor of m: bit k set when stage k uses it */
    dt_comm **share; /* per tensor that several stages use: its users (NULL elsewhere) */
    dt_range *own;   /* the parameter slab ranges this stage holds (its tensors) */
    int nown;
    bool widened; /* a sync placed the whole model; the next step narrows it */
    bool whole;   /* tp > 1, world rank 0 after a sync: s->model and s->optim hold the
                   * whole state (the checkpoint's pieces) */
    dt_pp_segment *seg;
    int nseg;
    int nstates;             /* optimizer moments per parameter (0 sgd, 1 momentum, 2 adam) */
    int64_t steps0, updates; /* optimizer steps at the start, updates since */
    float *gsh;              /* ZeRO-2: this DP rank's averaged gradient chunks, packed (gat) */
    size_t grel;             /* ZeRO-2: gradient bytes given back after the last reduce */
    int *seg_of;             /* ZeRO-3: per tensor of m, its segment (one per tensor), or -1 */
    bool zfull;              /* ZeRO-3: every segment gathered (sync, evaluation): hooks idle */
    dt_status zerr;          /* ZeRO-3: the first error of a node hook's gather */
    char zmsg[384];
    dt_pp_slot *slots;
    int nslots, mb_slot[DT_PP_MAX_MICRO];
    dt_pp_action *acts;
    float *buf_save;    /* model buffers kept across a recomputed forward (a host copy) */
    struct dt_dev *dev; /* the device of m's memory (cpu: host memory, used in place) */
    bool on_dev;        /* m's memory is not host memory: it is whole on the device (no
                         * placement of the stage's part), moved with upload/download */
    float *dloss;       /* on_dev, last stage: each micro-batch's loss, read once a step */
    float *dgin;        /* on_dev: the received output gradient, uploaded for backward */
    size_t dgin_cap;    /* floats dgin holds */
    double *dss;        /* on_dev: a gradient-norm partial sum */
    float *host;        /* collectives over model memory staged here (stage_dev) */
    size_t host_cap;    /* floats host holds */
    int live;           /* micro-batch whose activations the model holds (-1: none) */
    /* figures */
    int inflight, peak_inflight; /* micro-batches forwarded and not yet backwarded */
    size_t mb_bytes;             /* bytes one micro-batch in flight holds (largest seen) */
    double bubble_sum;           /* sum over steps of this stage's idle fraction */
    int64_t bubble_steps;
    bool bubble_warm; /* the first step's figure was dropped */
    double busy;      /* compute seconds of the current step */
    uint64_t bytes_sent;
    double loss_sum;
} dt_pp;

/* Trains one step of b on this stage (pp_step.c): the schedule's micro-batches, then the
 * gradient sums over shared tensors and the data-parallel axis, clipping and the update. */
dt_status dt_pp_train_step(dt_strategy *s, const dt_step_batch *b, dt_step_result *r);
/* Evaluates feed f on this stage (pp_eval.c; ops->eval_batch): the micro-batches forward
 * through the pipeline, the last stage's tp rank 0 adds the loss, correct rows and samples. */
dt_status dt_pp_eval_batch(dt_strategy *s, const dt_feed *f, double *loss_sum, int64_t *correct, int64_t *n);
/* The world rank of stage k of this pipeline (this rank's tp index). */
static inline int dt_pp_world_rank(const dt_pp *p, int k) { return dt_mesh_rank(p->tp, p->K, p->tr, k, p->dp_i); }

/* Wraps st, an error of a point-to-point link, as "pipeline stage S (rank R): WHAT of micro-batch
 * MB to|from stage P (rank W)" ("to" when what names a send); returns st. pp_step.c. */
dt_status dt_pp_link_error(const dt_pp *p, dt_status st, const char *what, int mb, int peer);
/* An allreduce (op) of n floats of the stage model's memory x over comm: in place where comm takes
 * that memory (cpu), else staged through p->host (download, allreduce, upload). pp_step.c. */
dt_status dt_pp_allreduce_model(dt_pp *p, dt_comm *comm, float *x, size_t n, dt_redop op);
/* p->host with room for n floats (a host staging buffer of the stage). */
dt_status dt_pp_host_room(dt_pp *p, size_t n);
/* Point to point over model memory x (n floats), staged through p->host where comm does not take
 * it. pp_step.c. */
dt_status dt_pp_send_model(dt_pp *p, dt_comm *comm, const float *x, size_t n, int peer, int tag);
dt_status dt_pp_recv_model(dt_pp *p, dt_comm *comm, float *x, size_t n, int peer, int tag);
/* The lowest stage that uses tensor t of p->m (it owns the tensor's share of the norm, and its
 * values and moments for a sync). */
int dt_pp_owner_stage(const dt_pp *p, int t);
/* Whether tensor t of p->m counts in this rank's share of the global gradient norm: a parameter
 * that this stage owns (dt_pp_owner_stage), under tp the shard's part once (dt_tp_in_norm). */
bool dt_pp_in_norm(const dt_pp *p, int t);
/* The optimizer state i of the segment holding offset off of p->m's slab, or NULL. */
float *dt_pp_seg_state(dt_pp *p, int i, size_t off);

/* ---- stages of tensor-parallel shards (pp_tp.c) ---- */

/* tp > 1: the rank's shard of s->model (a GPT) as p->m, unplaced (dt_pp_tp_place places the
 * stage's tensors), with the hooks over the stage's tp axis; the cut (from the whole model) ends at
 * the shard's last node (the loss is computed outside its graph). DT_EINVAL for a model that is
 * not a GPT. */
dt_status dt_pp_tp_setup(dt_strategy *s, dt_pp *p);
/* tp > 1: places the shard p->m for own[0..nown) (the stage's tensors; NULL: none) and copies
 * their parts of s->model into it (an unplaced whole tensor: its initial values). DT_ENOMEM. */
dt_status dt_pp_tp_place(dt_strategy *s, dt_pp *p, const dt_range *own, int nown);
/* tp > 1: the state for checkpoints: after a sync on world rank 0 (p->whole) the whole model and
 * optimizer; else the stage's shards and their segments' moments as pieces of the whole tensors
 * (a resume restores them in place: before ZeRO shards the segments). */
dt_status dt_pp_tp_visit_state(dt_strategy *s, dt_state_visit_fn fn, void *ctx);
/* tp > 1: the segments' moments from the whole optimizer s->optim (a resumed run's). */
void dt_pp_tp_scatter_moments(dt_strategy *s, dt_pp *p);
/* tp > 1: every rank's s->model gets the whole current parameters (each tensor gathered over its
 * owner stage's tp axis, then broadcast along the pipeline) and world rank 0's s->optim the whole
 * moments. Collective over the job. */
dt_status dt_pp_tp_sync(dt_strategy *s);
/* ---- ZeRO over the DP axis (pp_zero.c; pp(zero=1|2|3), DP > 1, any tp; stage 3's gathers: pp_zero3.c) ---- */
/* Cuts every segment into this DP rank's chunk and shards its optimizer to it; ZeRO-2 also
 * allocates the packed gradient shard and gives the gradient pages back. */
dt_status dt_pp_zero_shard(dt_pp *p);
/* ZeRO-2, before the step's first backward: counts the gradient pages given back again (they
 * are written anew); DT_ENOMEM over --mem-limit. */
dt_status dt_pp_zero_reacquire(dt_pp *p);
/* ZeRO-2, after the step's micro-batches (g: the stage model's gradient slab, the sums over the
 * stages of shared tensors done): each segment reduce-scattered (averaged) over the DP axis into
 * this rank's chunk of p->gsh, then its gradient pages given back (they read as zeros, so the
 * next step needs no zeroing). */
dt_status dt_pp_zero_reduce(dt_pp *p, float *g);
/* ZeRO-2: appends to out the runs of this rank's gradient chunks (in p->gsh) that count in the
 * global norm (dt_pp_in_norm's tensors). */
dt_status dt_pp_zero_norm_pieces(const dt_pp *p, dt_grad_pieces *out);
/* Updates this rank's chunk of every segment (w: the stage model's slab; g: its gradient slab,
 * averaged and clipped, under ZeRO-1; NULL under ZeRO-2: the chunks of p->gsh) and all-gathers
 * the chunks over the DP axis. */
dt_status dt_pp_zero_update(dt_pp *p, float *w, const float *g, float lr);
/* Collective over the DP axis: DP rank 0's segments get whole optimizers with every rank's chunk
 * (for sync's moments); dt_pp_zero_uncollect (each step's start) puts the shards back. */
dt_status dt_pp_zero_collect(dt_pp *p);
/* Every DP rank's chunk of segment sg's parameters (w: the stage model's slab) to every one (counts:
 * the chunks' sizes); on a device whose memory the comm does not take, on a host copy of the
 * segment (p->host: the chunk downloaded, allgathered, the segment uploaded). */
dt_status dt_pp_zero_allgather(dt_pp *p, float *w, const dt_pp_segment *sg, const size_t *counts);
void dt_pp_zero_uncollect(dt_pp *p);
/* ---- ZeRO-3 over the DP axis (pp_zero3.c; pp(zero=3), DP > 1, any tp) ---- */
/* Installs the node hooks that gather a node's tensors over the DP axis before its forward and
 * its backward (one segment per tensor), chained with a tp shard's. After dt_pp_zero_shard. */
dt_status dt_pp_zero3_setup(dt_pp *p);
/* Gives back every gathered segment's values outside this rank's chunk (the start of a run, after
 * each update, the first step after a sync). */
void dt_pp_zero3_release_all(dt_pp *p);
/* Gathers every segment (sync: evaluation and checkpoints read the whole stage); collective over
 * the DP axis. The hooks then do nothing until dt_pp_zero3_release_all. */
dt_status dt_pp_zero3_gather_all(dt_pp *p);
/* The first error a hook's gather met since the last call (DT_OK: none); clears it. */
dt_status dt_pp_zero3_status(dt_pp *p);
/* The tp counters of a pp strategy (zeros without tp, or for another strategy). */
void dt_pp_tp_counters(const dt_strategy *s, dt_tp_counters *c);

#endif
