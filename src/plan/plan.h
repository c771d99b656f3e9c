/* The planner (dtrain plan, --strategy auto): a cluster (declared in a JSON file or measured
 * here), a model summary read off the graph (each node's flops, bytes moved, parameters and
 * tensor-parallel split), the cost of every layout dtrain can run (compute, each axis's
 * collectives with the overlap they get, the pipeline bubble, the optimizer step), the memory
 * per rank from the --dry-run model (dtrain/memplan.h), the search over layouts and the ranking.
 * cluster.c reads clusters, cost.c holds the formulas, search.c enumerates and ranks. */
#ifndef DT_PLAN_H
#define DT_PLAN_H

#include "dtrain/memplan.h"
#include "dtrain/models.h"

#include <stdbool.h>
#include <stddef.h>

enum { DT_PLAN_FP32 = 0, DT_PLAN_BF16 = 1, DT_PLAN_FP16 = 2, DT_PLAN_NPREC = 3 };
enum { DT_PLAN_INTRA = 0, DT_PLAN_INTER = 1 };
/* dt_plan_layout.compress beyond the 16-bit casts (DT_PLAN_BF16, DT_PLAN_FP16): the lossy compressors */
enum { DT_PLAN_TOPK = 3, DT_PLAN_POWERSGD = 4 };
/* dt_plan_layout.algo: what keeps the replicas together */
enum { DT_PLAN_SYNC = 0, DT_PLAN_LOCALSGD = 1, DT_PLAN_PS = 2 };
/* dt_plan_request.algos: the layouts that change the training algorithm, searched only when asked */
enum { DT_PLAN_ALGO_TOPK = 1, DT_PLAN_ALGO_POWERSGD = 2, DT_PLAN_ALGO_LOCALSGD = 4, DT_PLAN_ALGO_PS = 8 };

/* A link level: bandwidth in bytes/s (inter: a host's aggregate, shared by its ranks) and latency
 * of one message in seconds. */
typedef struct {
    double bw, lat;
    double rs_factor; /* a reduce-scatter costs this many times the ring's (MPI between hosts: 2; <= 0: 1) */
} dt_plan_link;

/* A cluster of identical hosts. */
typedef struct {
    char name[64];
    int hosts, ranks_per_host;
    double peak[DT_PLAN_NPREC]; /* FLOP/s of one rank per precision (0: the precision is not run there) */
    double efficiency;          /* fraction of peak a training GEMM reaches (0..1] */
    double mem_bw;              /* bytes/s of one rank's memory */
    double mem_bytes;           /* memory capacity of one rank */
    double overlap;             /* fraction of backward that can hide gradient traffic (0..1) */
    double node_overhead;       /* seconds per graph node per pass (kernel launch, dispatch) */
    double step_overhead;       /* seconds per step outside compute and comm (data, bookkeeping) */
    double coll_wait;           /* seconds a blocking collective waits for ranks the scheduler has not run yet,
                                 * per rendezvous after compute (measured here; 0 on a dedicated device) */
    double oversub;             /* compute slows by this factor (ranks sharing cores; <= 1: none); not in files */
    dt_plan_link link[2];       /* DT_PLAN_INTRA, DT_PLAN_INTER */
} dt_plan_cluster;

/* Reads cluster JSON file path into *c (cJSON). DT_EINVAL/DT_EIO name the file and the field. */
dt_status dt_plan_cluster_load(const char *path, dt_plan_cluster *c);
/* Parses JSON text (what = the file's name in messages) into *c. */
dt_status dt_plan_cluster_parse(const char *text, const char *what, dt_plan_cluster *c);
/* Writes c as a cluster file (the format dt_plan_cluster_load reads) to path; atomic (temp + rename). */
dt_status dt_plan_cluster_save(const dt_plan_cluster *c, const char *path);

/* What the cost model needs of a model: per node, per sample. */
typedef struct {
    int nodes;
    double *flops;           /* [nodes] training flops (fwd + bwd) per sample */
    double *bytes;           /* [nodes] activation bytes moved per sample (values in, out and gradients) */
    double *params;          /* [nodes] parameters the node owns (a shared tensor counted at its first user) */
    double *out_bytes;       /* [nodes] bytes per sample of the node's output (a pipeline cut sends it) */
    bool *split;             /* [nodes] tensor parallelism divides the node's work by tp */
    double *t_fix, *t_per;   /* [nodes] measured seconds per pass: t_fix + t_per x batch (NULL: roofline) */
    double opt_per;          /* measured seconds of the optimizer's update per value (0: from the memory bandwidth) */
    double ovh_fix, ovh_per; /* measured seconds of a rank's step beyond its nodes and optimizer model:
                              * ovh_fix + ovh_per x samples the rank takes per step (loss, data, bookkeeping) */
    double total_params;
    double mat_params, mat_dims; /* tensors of 2+ dimensions (n x m: first dimension by the rest): their values
                                  * and the sum of n + m (PowerSGD sends rank x (n + m) per matrix) */
    double vec_params;           /* 1-dimensional tensors (PowerSGD sends them whole) */
    bool gpt;
    dt_gpt_config g; /* when gpt */
    int classes;
} dt_plan_model;

/* Fills *pm from model m (shapes only; m may be unplaced). Free with dt_plan_model_free. */
dt_status dt_plan_model_init(dt_plan_model *pm, const dt_model *m);
void dt_plan_model_free(dt_plan_model *pm);
/* Times each node's forward+backward at batches b1 < b2 (reps passes each) on this process and
 * stores the linear fit in pm->t_fix/t_per: the per-op times at the shapes in question. m must be
 * placed (trainable). */
dt_status dt_plan_model_measure(dt_plan_model *pm, dt_model *m, int b1, int b2, int reps);
enum { DT_PLAN_MEASURE_REPS = 21 }; /* most passes per batch of dt_plan_model_measure */
#define DT_PLAN_MEASURE_S 0.5       /* past 5 passes, more while they took less (seconds) */
/* Times optimizer o's update of the model's pm->total_params values here (the median of reps
 * steps after a warm-up) into pm->opt_per, seconds per value: a small model's state stays in the
 * caches, which the memory bandwidth of a large copy does not see. */
dt_status dt_plan_model_measure_optim(dt_plan_model *pm, const dt_optim_config *o, int reps);
/* A step's seconds beyond forward, backward and the optimizer (the calibrated overhead), from the
 * same steps' totals: the epoch's training time less their compute time (dt_epoch_info.compute_s)
 * and data_wait_s (the waits for a prefetch thread the ranks do not have; 0 to keep them), per
 * step, not below 0. Both halves see the load of the same moment, where the per-op times
 * (dt_plan_model_measure) are measured at another: the difference of the two was the overhead
 * before, and under a moving load mostly the load's change (docs/plan.md). */
double dt_plan_other_s(double epoch_s, double compute_s, double data_wait_s, int64_t steps);

/* One layout: what `dtrain train` flags select. */
typedef struct {
    int dp, tp, pp;
    int zero;       /* 0..3 over dp */
    int micro;      /* pp: micro-batches per rank-batch; else --grad-accum */
    int gpipe;      /* pp: 1 = gpipe, 0 = 1f1b */
    int compress;   /* DT_PLAN_FP32 (none), DT_PLAN_BF16, DT_PLAN_FP16, DT_PLAN_TOPK, DT_PLAN_POWERSGD: --compress */
    double cparam;  /* topk: the ratio sent; powersgd: the rank */
    int algo;       /* DT_PLAN_SYNC, DT_PLAN_LOCALSGD (dp replicas, --sync-every), DT_PLAN_PS (dp workers + servers) */
    int sync_every; /* localsgd: steps between model averages */
    int servers;    /* ps: server ranks beside the dp workers (asynchronous: --staleness inf) */
    int prec;       /* --precision */
    double bucket_mb;
} dt_plan_layout;

/* Its predicted step, seconds, and memory. */
typedef struct {
    double compute, comm, bubble, optim, overhead, total; /* total = the sum */
    double comm_tp, comm_pp, comm_dp;                     /* exposed seconds per axis */
    double tp_bytes, dp_bytes, pp_bytes;                  /* bytes one rank sends per step per axis */
    int tp_level, dp_level, pp_level;                     /* the slowest link each axis crosses */
    double mem;                                           /* the fullest rank's bytes (dry-run model) */
    double mem_sync;                                      /* more while evaluation or a checkpoint gathers
                                                           * the model (--dry-run's 'at eval/ckpt') */
    bool sync_counts;                                     /* the run does that: fits counts mem_sync */
    bool fits;
} dt_plan_cost;

/* ---- formulas (cost.c), each checkable by hand ---- */

/* Seconds of a ring allreduce of n bytes over p ranks: 2(p-1)/p n / bw + 2(p-1) lat. */
double dt_plan_ring_allreduce_s(double n, int p, dt_plan_link l);
/* Seconds of a ring reduce-scatter or all-gather of n bytes (the whole buffer) over p ranks. */
double dt_plan_ring_half_s(double n, int p, dt_plan_link l);
/* The pipeline bubble's share of a step: (pp-1)/(M+pp-1) (GPipe and 1F1B alike). */
double dt_plan_bubble_fraction(int pp, int M);
/* Seconds of a pipeline's compute and sends per step, as pp_step.c runs it (isends; a stage holds
 * one micro-batch's activations): busy_max is the busiest stage's work of the step (its M forward +
 * backward passes, its recomputed forwards, its tp allreduces), fb_at_max that stage's forward +
 * backward of one micro-batch, fb_sum the sum of every stage's; a send takes lat + wire (wire: its
 * bytes over the bandwidth; each direction of a link carries one at a time). The busiest stage
 * runs all its work (or the link its M sends each way, GPipe's one way after the other), plus the
 * fill and drain through the other stages and 2(pp-1) sends: a = max(busy_max, M wire (GPipe:
 * 2 M wire)) + fb_sum - fb_at_max + 2(pp-1)(lat + wire). 1F1B keeps pp micro-batches in flight:
 * every pp of them wait for one round trip through every stage, ceil(M/pp) (fb_sum + 2(pp-1)(lat +
 * wire)), where the sends' latency dominates: the larger of the two. */
double dt_plan_pipeline_s(int pp, int M, int gpipe, double busy_max, double fb_at_max, double fb_sum, double lat,
                          double wire);
/* Bytes a rank sends per step for its data-parallel axis: ddp/ZeRO-1/2 one allreduce of its
 * gradients, 2(d-1)/d x grad_bytes; ZeRO-3 adds a second parameter gather, 3(d-1)/d. */
double dt_plan_zero_bytes(int zero, int d, double grad_bytes);
/* Seconds of the gradient sync of n fp32 values over d ranks with compressor `compress` (param: the
 * topk ratio or the powersgd rank) on link l, and the bytes one rank sends into *bytes: top-k
 * allgathers ratio x n (index, value) pairs of 8 bytes; PowerSGD allreduces P and Q, rank x
 * (n + m) values per matrix plus the 1-dimensional tensors whole, 4 bytes each (two allreduces:
 * twice the latency); the casts allreduce 2 bytes a value, none 4. */
double dt_plan_sync_s(const dt_plan_model *pm, double n, int d, int compress, double param, dt_plan_link l,
                      double *bytes);
/* Seconds of one step's traffic of a ps worker with `workers` workers and `servers` servers of a
 * model of n values on link l: it pushes n gradients and pulls n parameters (4 bytes each); each
 * server's link carries workers x n / servers each way: max(2 n 4 / bw, workers n 4 / (servers bw))
 * + 2 lat. */
double dt_plan_ps_s(double n, int workers, int servers, dt_plan_link l);

/* Bytes a rank sends per step in a GPT's tensor-parallel allreduces at batch b: Megatron's 4 b T C
 * values per block, the embedding's and head's 2 b T C and the loss's 3 b T, x 2(t-1)/t, 4 bytes
 * each (what `dtrain bench tp` counts). */
double dt_plan_tp_bytes(const dt_gpt_config *g, int b, int t);

/* How much slower a rank computes when `ranks` ranks run at once on `cores` cores beside `busy`
 * other runnable tasks, than the one process that measured the per-op times beside the same
 * tasks: the scheduler shares the cores evenly, so max(1, (busy + ranks) / cores) over
 * max(1, (busy + 1) / cores). */
double dt_plan_oversub(int ranks, int cores, double busy);

/* Collectives of the data-parallel sync per step that the rank's own thread runs blocking right
 * after the backward, each paying the cluster's coll_wait (the shm wait spins 200 us, then sleeps;
 * waking costs a scheduling delay on a loaded host): 1 for ddp without compression (its last
 * bucket, ddp.c); 0 for ZeRO 1-3 and the compressors, whose last bucket starts on the progress
 * thread in the backward's hook (and the
 * all-gather after the update finds the ranks together); 0 without data parallelism. */
int dt_plan_dp_waits(int zero, int compress, int dp);

/* The link an axis of `ranks` ranks with stride `stride` in the rank order crosses. */
int dt_plan_axis_level(const dt_plan_cluster *c, int stride, int ranks);

/* Predicts layout l's step for model pm at global batch G on cluster c with optimizer moments
 * (0 sgd, 1 momentum, 2 adam); first[] the pipeline cut of l->pp stages. Memory is not set. */
void dt_plan_predict(const dt_plan_model *pm, const dt_plan_cluster *c, const dt_plan_layout *l, int G, int moments,
                     const int *first, dt_plan_cost *out);

/* ---- the search (search.c) ---- */

typedef struct {
    dt_plan_layout l;
    dt_plan_cost c;
} dt_plan_entry;

enum { DT_PLAN_MEM_BUDGET = 2000 }; /* most layouts whose memory one search plans (fastest first) */

typedef struct {
    int G;           /* global batch (samples per optimizer step) */
    int ranks;       /* ranks to lay out (hosts x ranks per host) */
    int precs;       /* bit mask of precisions to try (1 << DT_PLAN_FP32 ...) */
    bool only_fixed; /* search only the axes given below where >= 0 */
    int fix_tp, fix_pp, fix_zero;
    double mem_limit; /* bytes per rank (<= 0: the cluster's mem_bytes) */
    double extra;     /* bytes every rank holds beside the model (the loader's copy of the data) */
    int want;         /* fitting layouts wanted at the top (<= 0: 5) */
    int algos;        /* DT_PLAN_ALGO_* also searched (they change the numerics or the algorithm) */
    bool evals;       /* the run evaluates (a test set or validation part): ZeRO-3 gathers the model */
    bool saves;       /* the run saves checkpoints or weights: tp and pp gather the model */
} dt_plan_request;

typedef struct {
    dt_plan_entry *e; /* every layout scored, best (fitting, fastest) first */
    int n, cap;
    int scored;      /* layouts whose step time was predicted */
    int planned;     /* layouts whose memory was planned (in order of predicted time) */
    double search_s; /* seconds the whole search took */
    double cost_s;   /* of which predicting every layout's step and sorting them */
    double mem_s;    /* of which the memory model */
} dt_plan_result;

/* A layout's family as a user names the choice: ZeRO stage k over every rank (0: ddp; -1: one
 * rank), 1000 + tp, 10000 + pp, 100000 for tp x pp. */
int dt_plan_family(const dt_plan_layout *l);
/* Scores every layout of r for model m (unplaced is enough; used for the --dry-run memory
 * model) summarised in pm, with optimizer o, on cluster c, into *res (best first). */
dt_status dt_plan_search(dt_model *m, const dt_plan_model *pm, const dt_optim_config *o, const dt_plan_cluster *c,
                         const dt_plan_request *r, dt_plan_result *res);
void dt_plan_result_free(dt_plan_result *res);

/* The `dtrain train` flags that run l at global batch G (e.g. "--workers 4 --tp 2 --zero 1
 * --batch 16"): into buf. */
void dt_plan_flags(const dt_plan_layout *l, int G, char *buf, size_t cap);
/* A short name of l ("dp4 zero1", "tp2 x pp2 1f1b m4", ...) into buf. */
void dt_plan_name(const dt_plan_layout *l, char *buf, size_t cap);
/* One line on why `alt` loses against `best` (its dominant extra cost, or the memory it lacks). */
void dt_plan_why(const dt_plan_entry *alt, const dt_plan_entry *best, const dt_plan_cluster *c, double limit, char *buf,
                 size_t cap);

#endif
