/* Distribution strategies: the one interface through which the trainer drives data-parallel
 * (and later sharded / asynchronous) training. The trainer asks the strategy to train each step
 * (train_step; the replicated strategies share forward, loss, backward with the grad-ready hook,
 * then ops->step). Strategies come from a registry (registry.c): each entry parses its options
 * from a spec ("ps(servers=2,staleness=4)") into its own struct, so nothing outside a strategy's
 * module knows its options. parallel/ is the only layer where models (nn/, optim/) and
 * communication (comm/) meet. */
#ifndef DT_DIST_STRATEGY_H
#define DT_DIST_STRATEGY_H

#include "core/trace.h"
#include "dtrain/comm.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/workers.h"
#include "optim/clip.h"

#include <signal.h>
#include <stddef.h>

/* What a rank does under the strategy. */
typedef enum {
    DT_ROLE_REPLICA = 0, /* trains a replica; the ranks reduce epoch figures together (ddp, localsgd) */
    DT_ROLE_WORKER,      /* ps worker: trains on its shard, talks only to the servers */
    DT_ROLE_SERVER,      /* ps server: runs ops->serve instead of the step loop */
} dt_role;

/* One epoch as seen by the servers (ps), reported by server rank 0 after it assembled the whole
 * current model into s->model (and, when asked, the optimizer state into s->optim). */
typedef struct {
    int64_t epoch;   /* 0-based epoch that ended (or was cut short by max_steps) */
    int64_t step;    /* worker clock at its end: every live worker did this many steps */
    bool complete;   /* false: ended by max_steps inside the epoch */
    double loss_sum; /* sum over the epoch's samples of the training loss */
    int64_t samples;
    double epoch_s; /* wall time since the previous report */
    int nworkers;
    const dt_worker_info *workers;
    const int64_t *staleness; /* [DT_STALENESS_BINS] */
    int max_clock_gap;
    int64_t step_in_epoch; /* ps dynamic: where a resume continues (see dt_serve_config); else -1 */
    double busy_s, wait_s; /* the workers' compute and exchange waits, summed over their pushes */
    int64_t pushes;
} dt_serve_epoch;

/* What the servers need to know about the run, and the lead's callbacks. */
typedef struct {
    int64_t start_step, start_epoch, start_step_in_epoch; /* where the workers start */
    int64_t steps_per_epoch, epochs, max_steps;           /* max_steps 0 = none */
    int batch;                   /* samples of one worker step (--batch x --grad-accum): the most a push may
                                  * carry, and the report's per-worker batch */
    bool want_optim;             /* assemble the optimizer state too (for checkpoints) */
    double progress_s;           /* seconds between on_progress calls */
    volatile sig_atomic_t *stop; /* set (by a signal handler) to stop serving: DT_EINTR; may be NULL */
    int64_t *stopped_step;       /* out, may be NULL: on a stop with one server, the worker clock of the
                                  * model assembled into s->model (else left alone) */
    /* ps dynamic assignment (dt_strategy_hands_out_batches): units of `batch` samples per epoch (ceil(n / batch));
     * the workers start at unit start_step_in_epoch * workers of start_epoch. Positions handed
     * back (stopped_epoch/stopped_in_epoch, dt_serve_epoch.step_in_epoch) are in global batches of
     * batch x workers: floor(units done before the first unit not yet pushed / workers). */
    int64_t units_per_epoch;
    int64_t *stopped_epoch, *stopped_in_epoch; /* out, may be NULL: with stopped_step */
    /* server rank 0 only; called from the serving thread */
    dt_status (*on_epoch)(void *ctx, const dt_serve_epoch *e);
    void (*on_progress)(void *ctx, int64_t min_step, int64_t samples, double loss_sum);
    void (*on_note)(void *ctx, const char *msg);
    void *ctx;
} dt_serve_config;

/* Per-step timing a strategy reports back to the trainer. */
typedef struct {
    double comm_wait_s;         /* time the step blocked on communication */
    int buckets;                /* buckets communicated this step */
    int early_buckets;          /* of which were started while backward was still running */
    double bytes_sent;          /* gradient-sync bytes this rank sent (ring / allgather volume; 0: not counted) */
    double bytes_raw;           /* what an uncompressed f32 allreduce would have handed over */
    double ef_norm;             /* L2 norm of the error-feedback residual after the step (--compress), in
                                 * gradient units (fp16: divided by the loss scale) */
    double gathered_peak_bytes; /* ZeRO-3: the most gathered parameter bytes not owned held at once */
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
    bool is_optim;    /* an optimizer moment (absent from weights-only checkpoints) */
    const char *hint; /* NULL, or: the piece is optional (a checkpoint without it leaves buf as it
                       * is) and a restore of another shape fails with this advice */
    bool host;        /* buf is host memory where the model is on a device (a strategy's own state that
                       * its host code works on: --compress error feedback); false: model memory, on
                       * the model's device (dt_model_device), read and written through it */
} dt_state_piece;
/* Called with each piece; returning an error stops the visit with it. For a restore the visitor
 * writes into buf. */
typedef dt_status (*dt_state_visit_fn)(void *ctx, const dt_state_piece *p);

/* Visits model m's tensors (parameters and buffers) in their table order, each followed by its
 * optimizer moments when o != NULL: whole tensors (the state of a replicated strategy). */
dt_status dt_state_visit_model(dt_model *m, dt_optim *o, dt_state_visit_fn fn, void *ctx);

/* Where a run whose batches the strategy hands out stands (ops->first_unit): units of one
 * rank-batch of samples numbered from unit `unit` of epoch `epoch` (the resume position, in
 * units: step_in_epoch x data_world), units_per_epoch per epoch, epochs in the whole run. */
typedef struct {
    int64_t epoch, unit, units_per_epoch, epochs;
} dt_unit_plan;

/* One step of this rank, as the trainer hands it to the strategy (dt_strategy_train_step). */
typedef struct {
    dt_feed feed; /* this rank's samples (n may be 0 on a rank of a final spread batch) */
    int n_global; /* samples of the whole global batch, every rank together */
    int world;    /* ranks sharing the global batch */
    int accum;    /* micro-batches the feed is cut into (--grad-accum; <= 1: one) */
    int64_t step; /* the optimizer step (keys dropout masks) */
    float lr, clip;
    /* called after forward/backward with the samples and their compute seconds; returns the seconds
     * it added (a --slow sleep); may be NULL */
    double (*compute_done)(void *ctx, int n, double busy_s);
    void *ctx;
} dt_step_batch;

/* What a step did. */
typedef struct {
    double loss_sum;  /* sum over the rank's samples of their loss */
    int n;            /* samples */
    double compute_s; /* forward + backward + update, without communication waits */
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
    /* Optional, set when the strategy hands out the batches (ps dynamic assignment, ps.h) instead
     * of each rank taking its shard of the loader's order (dt_strategy_hands_out_batches). A
     * training rank calls first_unit once before its first step: plan says where the run stands;
     * *epoch, *unit get the unit (of plan->units_per_epoch per epoch) it trains first. After each
     * step next_unit names the next one (*unit < 0: none left). */
    void (*first_unit)(dt_strategy *s, const dt_unit_plan *plan, int64_t *epoch, int64_t *unit);
    void (*next_unit)(dt_strategy *s, int64_t *epoch, int64_t *unit);
    /* Optional (NULL = everything on s->comm counts as the dp axis): this rank's bus bytes per mesh
     * axis since the start, bytes[0] tp, [1] pp, [2] dp (dt_comm_bytes of each axis). */
    void (*axis_bytes)(dt_strategy *s, uint64_t bytes[3]);
    /* Optional: appends the strategy's own figures of the run to the epoch's metrics line, as
     * JSON members starting with ", " (pp: the bubble fraction, bytes sent, peak activations).
     * Collective over the ranks (called on every training rank at each epoch's end). */
    void (*report)(dt_strategy *s, char *out, size_t cap);
    /* Optional, used where s->evaluates_sharded: evaluates feed f (this model copy's samples, the
     * same on each of its ranks) without gradients on the model as the step holds it (tp shards,
     * pp stages), holding no more than a training step does. One rank of each model copy adds the
     * sum over f's samples of their loss to *loss_sum, its correct rows (dt_model_count_correct) to
     * *correct and f->n to *n; the others add nothing. Collective over the model copy's ranks. */
    dt_status (*eval_batch)(dt_strategy *s, const dt_feed *f, double *loss_sum, int64_t *correct, int64_t *n);
} dt_strategy_ops;

struct dt_strategy {
    const dt_strategy_ops *ops;
    dt_comm *comm; /* NULL for a single process */
    dt_model *model;
    dt_optim *optim;
    dt_trace *trace;
    int64_t step;
    void *impl;
    /* set by the constructor (defaults: replica, data rank/world = comm rank/size) */
    dt_role role;
    int data_rank, data_world; /* this rank's part of the data (ps workers: index among workers) */
    int job_rank0;             /* job rank of data rank 0 */
    dt_comm *data_comm;        /* the ranks of this rank's data axis when they are not the job's ranks
                                * (pp: the stage's DP peers, tp: its mesh's dp axis; owned by the strategy):
                                * the balancer's; NULL = comm */
    bool local_mean;           /* the step wants the mean gradient of the local batch (localsgd,
                                * ps); else the rank's share of the global mean (ddp) */
    bool grads_zeroed;         /* the strategy leaves the gradient slab zero after each step (ZeRO
                                * stage >= 2 gives its pages back): the step does not zero it */
    bool sync_for_state_only;  /* ops->sync only brings checkpoint state to the writer (ddp's error
                                * feedback): evaluation reads the model without it */
    bool evaluates_sharded;    /* evaluation runs ops->eval_batch on the data part's batches (tp, pp:
                                * the model stays sharded; no ops->sync gathers it for evaluation) */
    bool shards_state;         /* each rank holds only its part of the state (ZeRO): every rank
                                * writes its shard of a checkpoint (dt_checkpoint_write_sharded) */
    const char *choice;        /* what the strategy chose at set-up where its spec left it open
                                * ("update=shard (auto: one host)"; static text), NULL when nothing */
    struct {                   /* the current step on this rank, set by the trainer before ops->step */
        int n;                 /* samples */
        int64_t epoch;
        double loss_sum; /* sum of the per-sample losses */
        double busy_s;   /* forward+backward time (including a --slow sleep) */
        float grad_norm; /* the gradient's global L2 norm before clipping, set by the step where it
                          * computes it (clip > 0; the trainer passes INFINITY to measure only) */
    } cur;
    /* set on a strategy another one drives (tp's inner ddp over the dp axis): replaces the local
     * clip-and-update of dt_strategy_apply_update (tp clips by the norm over its shards); NULL = local */
    void (*update)(void *ctx, float lr, float clip);
    void *update_ctx;
    /* the same for ZeRO, which clips and updates its own shards (tp(zero=N)): appends to out the
     * pieces of a shard's gradient values g[0..n) at slab offset off that count in the norm (NULL:
     * all), summed over norm_comm (NULL: comm; tp's world: each tp shard's part once) */
    dt_status (*norm_pieces)(void *ctx, size_t off, float *g, size_t n, dt_grad_pieces *out);
    dt_comm *norm_comm;
};

/* ---- the registry (registry.c): strategies by name, each with its options in its own struct ---- */

/* Room for any strategy's options (dt_strategy_entry.opts_size is at most this). */
typedef union {
    max_align_t align_;
    unsigned char bytes[256];
} dt_strategy_opts;

/* A rank's part of a memory plan (run/memplan.c, dtrain/memplan.h) that the strategies decide. The
 * plan fills the inputs, the defaults (mine: the whole model's parameter values; zero_own, big: 0)
 * and then calls every entry's mem_plan, each filling what its axis of the layout decides. */
typedef struct {
    /* in: the layout (dt_mem_layout's axes, ZeRO stage, bucket size) and the rank's place in it */
    int dp, tp, pp, zero, stage, dp_rank;
    double bucket_mb;
    /* out */
    double mine;     /* parameter values the rank's model part holds (pp: its stage's tensors; tp: each
                      * tensor a tp-th where tp splits it, else whole) */
    double zero_own; /* ZeRO over dp (zero > 0, dp > 1): values of the whole slab the rank's shard owns */
    double big[3];   /* ZeRO: the largest bucket, the two largest, the three largest together (values,
                      * a tp-th of the slab's) */
    int inflight;    /* ZeRO: the buckets still reducing while backward fills the next one */
} dt_mem_share;

/* The parameter values (buffers aside) of the tensors that nodes [first, last) of m use, each a
 * tp-th where tensor parallelism over tp ranks splits it (tp_shard.c), else whole; DT_ENOMEM. */
dt_status dt_mem_part_values(const dt_model *m, int first, int last, int tp, double *out);

/* One strategy of the registry. Its options struct (opts_size bytes) is private to its module. */
typedef struct {
    const char *name;
    const char *help;    /* what it does, one line or more (--help's list of strategies, the man page) */
    const char *options; /* the syntax of its options inside NAME(...), e.g. "bucket_mb=MB,zero=0|1|2|3"
                          * ("" for none): every key of `keys` as KEY=... */
    const char *keys;    /* the option keys, for messages: "bucket_mb" ("" for none) */
    size_t opts_size;
    void (*defaults)(void *opts);
    /* Sets option key (one of keys) from its text; DT_EINVAL naming the strategy, key and value. */
    dt_status (*set)(void *opts, const char *key, const char *value);
    /* The rules between options; DT_EINVAL saying what to change. NULL: none. */
    dt_status (*check)(const void *opts);
    /* Fills s (ops, impl, role, data part ...); s->comm, model, optim and trace are set. */
    dt_status (*create)(dt_strategy *s, const void *opts);
    /* The ranks (the first ones) that serve instead of training; NULL: none. */
    int (*servers)(const void *opts);
    /* Writes every option as KEY=VALUE,... (the canonical spec's inside); NULL: no options. */
    void (*format)(const void *opts, char *out, size_t cap);
    bool needs_comm; /* true: more than one rank; false: one process only */
    /* true: it touches model memory only through the device (device/device.h), so it runs on a
     * device other than cpu (ddp stages its buckets through host buffers and refuses its options
     * that do not yet: see ddp.c); false: --device cpu only */
    bool device_neutral;
    /* true: it unscales gradients through dt_strategy_apply_update, so fp16 loss scaling works */
    bool loss_scaling;
    /* Optional: this rank's part of the data when it is not (rank of size) and no servers
     * (pp: the stages of a pipeline share their samples, so rank / stages of size / stages). */
    void (*data_part)(const void *opts, int rank, int size, int *data_rank, int *data_world);
    /* Optional (NULL: tp = pp = 1): the model-parallel axes of opts (tp, pp: mesh.h) and the
     * pipeline's micro-batches (0: as many as stages) and schedule ("gpipe" / "1f1b"). */
    void (*mesh)(const void *opts, int *tp, int *pp, int *microbatches, const char **schedule);
    /* Optional: the part of the parameter slab of the (unplaced) model m that this rank holds,
     * decided from the graph alone before any memory is written (dt_model_place's ranges, *own
     * malloc'd; *whole true: all of it). NULL: the whole model. The strategy narrows the model
     * to the same part after it is made (and widens it for evaluation and checkpoints). */
    dt_status (*place)(const void *opts, const dt_model *m, int rank, int size, dt_range **own, int *nown, bool *whole);
    /* Optional: true when opts ask the trainer to cut each global batch among the ranks by their
     * measured speed (ddp, localsgd: balance=dynamic). NULL: never. */
    bool (*balanced)(const void *opts);
    /* Optional: fills the part of a memory plan (dt_mem_share) that this strategy's axis of the
     * layout decides, where the layout has one (pp: the stage's tensors; tp: the shards; ddp: ZeRO's
     * shard of the buckets); leaves it alone otherwise. NULL: nothing to add. */
    dt_status (*mem_plan)(dt_model *m, dt_mem_share *share);
} dt_strategy_entry;

/* The option balance=static|dynamic of the replica strategies (ddp, localsgd) into *dynamic;
 * DT_EINVAL naming strategy and value. */
dt_status dt_strategy_parse_balance(const char *strategy, const char *value, bool *dynamic);

/* The entry named name, or NULL. */
const dt_strategy_entry *dt_strategy_find(const char *name);
/* Whether key is one of e's option keys. */
bool dt_strategy_entry_takes(const dt_strategy_entry *e, const char *key);
/* What kind of strategy e is (dtrain/workers.h), from its entry: no comm = one
 * process; servers = servers; a mesh = model parallel; else data-parallel replicas. */
dt_strategy_class dt_strategy_entry_class(const dt_strategy_entry *e);
/* The names of the entries for which pred(e, arg) holds, joined for a message ("ddp", "ddp and
 * localsgd", "ddp, tp and pp"; `last` joins the last two: "and", "or") into out (cap); out. */
const char *dt_strategy_names_where(bool (*pred)(const dt_strategy_entry *e, const void *arg), const void *arg,
                                    const char *last, char *out, size_t cap);
/* The strategy a job runs when it names none: one process "single", several "ddp". */
const char *dt_strategy_default_name(int world);
/* The registry: *n entries (registered ones last). */
const dt_strategy_entry *const *dt_strategy_entries(int *n);
/* Adds entry e to the registry (a strategy defined outside the library: tests/toy/). Call it before
 * any spec is parsed, from one thread. DT_EINVAL when its name is taken or it lacks name, help,
 * options (every key as KEY=...), keys, create or set; DT_ENOMEM when the registry is full. */
dt_status dt_strategy_register(const dt_strategy_entry *e);
/* Parses spec "NAME" or "NAME(KEY=VALUE,...)" (spaces allowed around the parts): *entry gets the
 * strategy, opts (dt_strategy_opts or at least (*entry)->opts_size bytes) its defaults with the
 * spec's options set, then checked. DT_EINVAL naming the strategy, key or value and the keys the
 * strategy takes. */
dt_status dt_strategy_parse(const char *spec, const dt_strategy_entry **entry, void *opts);
/* Adds KEY=VALUE to spec, written to out (cap bytes): the options of NAME(...) in spec, then
 * key=value. When spec already sets key to the same value (as parsed) out is spec's options
 * unchanged; to another value DT_EINVAL ("... sets key=A"), the caller names its flag. */
dt_status dt_strategy_spec_add(const char *spec, const char *key, const char *value, char *out, size_t cap);

/* Creates the strategy of spec (dt_strategy_parse); comm NULL only for a strategy without
 * needs_comm ("single"). The strategy borrows comm, model, optim and trace (may be NULL). */
dt_status dt_strategy_create(dt_strategy **s, const char *spec, dt_comm *comm, dt_model *m, dt_optim *o,
                             dt_trace *trace);
/* The same from a parsed entry and its options. */
dt_status dt_strategy_create_with(dt_strategy **s, const dt_strategy_entry *e, const void *opts, dt_comm *comm,
                                  dt_model *m, dt_optim *o, dt_trace *trace);
/* Frees the strategy; NULL is a no-op. */
void dt_strategy_destroy(dt_strategy *s);
/* The backward hook to pass to dt_model_backward with the strategy as ctx. */
void dt_strategy_grad_hook(void *strategy, size_t offset, size_t n);
/* True when the strategy hands out the batches (ops->first_unit / next_unit: ps dynamic). */
bool dt_strategy_hands_out_batches(const dt_strategy *s);

/* The strategies' entries (one per module). */
extern const dt_strategy_entry dt_strategy_single_entry, dt_strategy_ddp_entry, dt_strategy_localsgd_entry,
    dt_strategy_ps_entry;
extern const dt_strategy_entry dt_strategy_tp_entry;
extern const dt_strategy_entry dt_strategy_pp_entry;

/* The data part of a rank under strategy e with opts before the strategy exists (for the
 * loader): with S = e->servers(opts) > 0 the workers are ranks S..size-1 and shard the data among
 * themselves, servers get data rank 0 of the workers (they never train). Others: rank of size.
 * DT_EINVAL when the servers leave no worker. */
/* The placement of model m on this rank under the strategy (entry.place; whole without one):
 * *own malloc'd, or NULL for the whole model (*nown 0) when *whole. */
dt_status dt_strategy_placement(const dt_strategy_entry *e, const void *opts, const dt_model *m, int rank, int size,
                                dt_range **own, int *nown, bool *whole);
dt_status dt_strategy_data_part(const dt_strategy_entry *e, const void *opts, int rank, int size, int *data_rank,
                                int *data_world);

/* Visits this rank's training state through ops->visit_state (see dt_state_piece). */
dt_status dt_strategy_visit_state(dt_strategy *s, dt_state_visit_fn fn, void *ctx);

/* Collective over s->comm: the whole model's parameters and buffers written into params and
 * buffers (whole-model slabs, m's layout; used on root only) on rank root, from the parameter and
 * buffer pieces every rank's visitor reports (a sharded strategy: each rank its own). DT_EINTERNAL
 * on root when the pieces do not cover the model. */
dt_status dt_strategy_gather_model(dt_strategy *s, int root, float *params, float *buffers);

/* This rank's bus bytes per mesh axis (tp, pp, dp) since the start (ops->axis_bytes or s->comm's). */
void dt_strategy_axis_bytes(dt_strategy *s, uint64_t bytes[3]);

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
/* The same; params false: only the parameter count and the buffers (ranks holding other shards). */
dt_status dt_strategy_verify_model(dt_comm *comm, dt_model *m, bool params);

/* The device of m when comm's collectives cannot take its memory (device.h's host_memory is false
 * and dt_comm_device_native says no): model memory then travels through host buffers (download,
 * collective, upload). NULL where the collectives take it in place (the cpu device: zero-copy). */
struct dt_dev *dt_strategy_stage_device(const dt_comm *comm, const dt_model *m);
/* A collective over n floats at buf (model memory in place, or its host copy where staged). */
typedef dt_status (*dt_staged_fn)(dt_comm *comm, float *buf, size_t n, void *arg);
enum { DT_STAGE_DOWN = 1, DT_STAGE_UP = 2 };
/* fn(comm, buf, n, arg) over n floats of m's memory x: on x in place where comm takes that memory
 * (dt_strategy_stage_device NULL: the cpu device, nothing copied), else on a host copy: downloaded
 * into it first (dirs has DT_STAGE_DOWN), uploaded back into x after fn succeeds (DT_STAGE_UP).
 * The copy is *host (grown to n floats with dt_alloc, *cap its size), or with host NULL one made
 * and freed here. The one host-staging loop of the strategies' collectives over model memory. */
dt_status dt_strategy_staged(dt_comm *comm, const dt_model *m, float *x, size_t n, float **host, size_t *cap, int dirs,
                             dt_staged_fn fn, void *arg);
/* A broadcast from root of n floats of model memory x (on m's device), staged through a host
 * buffer where dt_strategy_stage_device says so. */
dt_status dt_strategy_broadcast_model(dt_comm *comm, const dt_model *m, float *x, size_t n, int root);

#endif
