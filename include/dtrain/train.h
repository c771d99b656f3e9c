/* The training loop: data set + model + optimizer + schedule, epochs of steps, evaluation,
 * checkpoints (safetensors) and JSON-Lines metrics. The library never prints: progress and
 * end-of-epoch results reach the caller through callbacks. */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/comm.h"
#include "dtrain/workers.h"
#include "dtrain/core.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"

#include <signal.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Progress of the running epoch, for a progress bar. */
typedef struct {
    int epoch, epochs; /* 0-based epoch, total */
    int64_t step_in_epoch, steps_per_epoch, global_step;
    float loss;                       /* mean training loss so far this epoch */
    double samples_per_s;             /* this epoch so far */
    double elapsed_s, eta_s;          /* this epoch: time so far, and to its last step (the epoch's end, or
                                       * max_steps where that ends the run inside it) */
    int64_t epoch_steps;              /* steps this epoch runs: steps_per_epoch, fewer where max_steps ends
                                       * the run in it (the bar's end) */
    int64_t total_steps;              /* steps of the whole run: epochs x steps_per_epoch, capped by max_steps */
    double run_eta_s;                 /* to the run's last step (training only, at this epoch's pace) */
    const char *eval_set;             /* non-NULL while an evaluation runs ("test" or "validation"): it is at */
    int64_t eval_batch, eval_batches; /* batch eval_batch of eval_batches (the other fields as before it) */
} dt_progress_info;

/* A step-logged run's record (dt_train_config.log_every, eval_every), on rank 0. */
typedef enum {
    DT_STEP_TRAIN, /* every log_every steps: the training figures since the previous record */
    DT_STEP_EVAL,  /* after each evaluation every eval_every steps */
} dt_step_kind;

typedef struct {
    dt_step_kind kind;
    int64_t step;  /* optimizer steps done */
    double epoch;  /* epochs done, fractional: the epoch + its steps done / steps_per_epoch */
    double wall_s; /* seconds since the start */
    float lr;      /* learning rate of the last step */
    /* DT_STEP_TRAIN */
    float train_loss;     /* mean per-sample loss over the record's steps, all ranks */
    double samples_per_s; /* training samples per second over the record's steps, all ranks */
    float grad_norm;      /* global L2 norm of the last step's gradient before --clip (rank 0's own
                           * under localsgd); NaN where not measured */
    int64_t steps;        /* steps since the previous record */
    /* DT_STEP_EVAL (NaN: no such set) */
    float test_loss, test_acc; /* on the test set */
    float val_loss, val_acc;   /* on the --val-split part */
    int64_t eval_samples;      /* samples each set was evaluated on (eval_batches bounds it) */
    double eval_s;             /* seconds the evaluation took */
} dt_step_info;

/* Results of one finished epoch. */
typedef struct {
    int epoch; /* 1-based */
    int64_t global_step;
    float train_loss, test_loss, test_acc; /* test_* are NaN without a test set */
    double samples_per_s;                  /* training samples per second, all ranks (excludes evaluation) */
    double epoch_s, wall_s;                /* this epoch's training time; time since start */
    double data_wait_s;                    /* time the step loop waited for the loader (rank 0) */
    double compute_s, comm_wait_s;         /* forward+backward+optimizer time; blocked on gradients (rank 0) */
    int64_t steps;                         /* steps this process ran in this epoch: train_loss averages them
                                            * (fewer than epoch_steps after a resume mid-epoch) */
    int64_t epoch_steps, steps_per_epoch;  /* steps of the epoch done, of all; epoch_steps <
                                            * steps_per_epoch when --max-steps ended it early */
    int world_size, global_batch;
    float lr; /* learning rate of the last step */
    /* uneven workers (NULL / 0 for one process) */
    int nworkers;
    const dt_worker_info *workers; /* [nworkers] */
    const int64_t *staleness;      /* ps: [DT_STALENESS_BINS] gradients by staleness (server updates
                                    * applied between a worker's pull and its push), or NULL */
    float val_loss, val_acc;       /* on the --val-split part (NaN without one) */
    int best_epoch;                /* --val-split: the epoch with the lowest validation loss so far */
    int max_clock_gap;             /* ps: most steps a worker was let run ahead of the slowest live
                                    * one (dynamic assignment: rounds a batch was handed out ahead of
                                    * the oldest in training); <= --staleness; -1 when not ps */
    /* gradient sync (rank 0, summed over the epoch's steps; 0 where the strategy does not count) */
    double sync_bytes;      /* bytes sent (ring / allgather volume of what the compressor handed over) */
    double sync_raw_bytes;  /* what an uncompressed f32 allreduce would have handed over */
    double ef_norm;         /* --compress: error-feedback residual norm after the last step */
    uint64_t comm_bytes[3]; /* rank 0's bus bytes (dt_comm_bytes) per mesh axis since the start:
                             * [0] tensor parallel, [1] pipeline, [2] data parallel */
    int64_t eval_samples;   /* samples of each set the evaluation covered (--eval-batches bounds it) */
} dt_epoch_info;

/* The layout of dt_train_config: raised whenever its fields change (added, removed, reordered). */
#define DT_TRAIN_CONFIG_VERSION 2

struct dt_train_aids; /* internal test and benchmark aids (src/run/train_aids.h); NULL for an embedder */

typedef struct {
    /* The layout the caller was compiled with, set by dt_train_config_init (and dt_train_defaults):
     * dt_trainer_create and dt_train_local refuse a config of another size or version (a caller
     * built against another dtrain/train.h), naming both, instead of reading its fields wrongly. */
    size_t size;
    unsigned version;
    const char *data;      /* IDX directory, "fashion-mnist", "mnist", a .csv file, "npy:..." arrays, or text
                            * for a GPT ("text:FILE", "kjv": byte windows of its context T; "tokens:DIR":
                            * 16-bit token files) (dt_dataset_open, dt_dataset_open_text) */
    int64_t epoch_windows; /* samples per epoch (text: windows), the first of each epoch's shuffle; 0 = all */
    double val_fraction;   /* text: the last part of the file held out for evaluation (default 0.1) */
    const char *model;     /* spec string or preset ("mlp", "cnn", "gpt:L=4,H=4,C=128,T=64"); NULL = the resumed
                            * checkpoint's model, else "mlp" */
    int epochs;
    int batch;      /* samples per rank per micro-batch */
    int grad_accum; /* micro-batches per optimizer step (<= 1: one); a step of N micro-batches of
                     * b equals one batch of N*b (to float rounding) */
    dt_optim_config optim;
    dt_lr_schedule lr; /* base_lr is the learning rate */
    float clip_norm;   /* gradient-norm clipping, 0 = off */
    uint64_t seed;
    int threads;                /* BLAS threads, default 1 */
    const char *kernels;        /* "onednn" (default where built) or "blas"; NULL: the process's choice */
    const char *precision;      /* GEMM inputs "fp32" (NULL), "bf16" or "fp16" (f32 master weights and optimizer
                                 * state; fp16 adds dynamic loss scaling: single and ddp strategies) */
    const char *device;         /* where model memory lives and kernels run: "cpu" (NULL) or "checked[:arena=BYTES]"
                                 * (the CPU kernels on memory the host cannot touch: docs/device.md); a device
                                 * other than cpu takes one process with the single strategy for now */
    bool normalize;             /* standardise inputs with the training set's mean/std */
    int64_t max_steps;          /* stop after this many steps in total (0 = run all epochs) */
    const char *save;           /* checkpoint written at the end (and after each epoch) */
    const char *resume;         /* checkpoint to continue from; "auto" = newest valid one in
                                 * checkpoint_dir (damaged ones are reported and skipped; none = start) */
    const char *checkpoint_dir; /* numbered checkpoints ckpt-<step>.safetensors go here */
    int64_t checkpoint_every;   /* write one every N steps (0 = off) */
    double checkpoint_secs;     /* and/or every S seconds (0 = off) */
    int keep;                   /* keep the newest K in checkpoint_dir (0 = all) */
    /* Set asynchronously (e.g. by a SIGTERM handler) to stop: every rank finishes the current
     * step, a checkpoint is written, and dt_trainer_run returns DT_EINTR. Run such a handler on
     * a thread that does not train: block the signal (pthread_sigmask) in the thread that calls
     * dt_trainer_run before it starts, and leave it unblocked in one other thread. oneDNN's JIT
     * GEMM kernels point the stack pointer at the heap while they run (oneDNN issue #4845), so a
     * signal frame written there corrupts the heap; dtrain train does this (src/cli/stop_signal.c). */
    volatile sig_atomic_t *stop;
    const char *metrics; /* JSON-Lines file, one object per epoch */
    /* distribution: comm NULL = one process. With a communicator of size > 1, --batch is per
     * rank, the data is sharded by rank, and only rank 0 calls back, writes metrics and saves. */
    dt_comm *comm; /* borrowed */
    /* the strategy spec: NAME or NAME(KEY=VALUE,...), e.g. "ps(servers=2,staleness=4)",
     * "localsgd(sync_every=8)", "ddp(bucket_mb=0.5)" (dt_strategy_spec_help lists them);
     * NULL: "ddp" when the world size > 1, else "single" */
    const char *strategy;
    const char *timeline;    /* Chrome trace (JSON) of every rank's steps, written by rank 0 */
    double predicted_step_s; /* the planner's step time for this layout (--strategy auto); > 0: each epoch's
                              * metrics carry it beside the measured one */
    const char *plan_layout; /* the planner's name of the layout (with predicted_step_s), or NULL */
    /* uneven workers: ddp and localsgd cut each global batch by the workers' measured speed with
     * their spec's balance=dynamic; ps hands out batches (its shards=) */
    const struct dt_train_aids *aids; /* internal: dtrain's own tests and benchmarks (NULL: none) */
    /* callbacks (may be NULL) */
    void (*on_progress)(void *ctx, const dt_progress_info *p);
    void (*on_epoch)(void *ctx, const dt_epoch_info *e);
    void (*on_note)(void *ctx, const char *msg);       /* checkpoints written / skipped, resume notes */
    void (*on_step)(void *ctx, const dt_step_info *s); /* each log_every / eval_every record (rank 0) */
    void *cb_ctx;
    double progress_interval_s; /* minimum seconds between on_progress calls (default 0.2) */
    /* step-based reporting: records into on_step and `metrics` ("kind": "step" / "eval" lines) */
    int64_t log_every;    /* a DT_STEP_TRAIN record every N steps (0 = off) */
    int64_t eval_every;   /* evaluate every N steps, a DT_STEP_EVAL record (0 = only at the epochs' ends) */
    int64_t eval_batches; /* every evaluation during training covers the first N global batches of each
                           * set, the same ones each time (0 = the whole set) */
    /* weights in and out, validation (include/dtrain/io.h) */
    const char *weights;      /* start from this plain safetensors weights file (by PyTorch names), not from
                               * the seeded init: fine-tuning; not with resume */
    const char *save_weights; /* rank 0 writes a weights-only file (torch load_state_dict strict, --normalize
                               * folded) here after every epoch */
    double val_split;         /* hold out this fraction of the training set (by the seed) to validate on
                               * after every epoch; 0 = off (a resumed run keeps its checkpoint's) */
    int early_stop;           /* with val_split: stop after this many epochs without a lower validation
                               * loss (0 = off) */
    bool keep_best;           /* with val_split and save: also write the best validation epoch's checkpoint
                               * to dt_train_best_path(save) */
    bool keep_sharded;        /* tensor and pipeline parallelism (which evaluate on their shards): the
                               * run ends without gathering the whole model into dt_trainer_model (it
                               * may not fit where the shards do; `dtrain train` sets it); false: with
                               * a test set the model is gathered once at the end, as the epochs'
                               * evaluation gathered it before (without one, only checkpoints do) */
    /* in-memory data sets (dt_dataset_create) instead of `data`, borrowed: they must outlive the
     * trainer, which sets their classes to the model's and their normalisation (cfg.normalize).
     * test_set may be NULL (no evaluation). With a communicator every rank passes the same data. */
    dt_dataset *train_set, *test_set;
} dt_train_config;

/* Sets *cfg to the defaults of the `dtrain train` command (mlp, 1 epoch, batch 32, adam 1e-3), its
 * size and version those of the header the caller is compiled with:
 *     dt_train_config cfg;
 *     if (dt_train_config_init(&cfg) != DT_OK) ... (a library of another layout: the message says so)
 */
#define dt_train_config_init(cfg) dt_train_config_init_sized((cfg), sizeof(dt_train_config), DT_TRAIN_CONFIG_VERSION)
/* dt_train_config_init's function: DT_EINVAL, and nothing written, when size or version are not
 * this library's. */
dt_status dt_train_config_init_sized(dt_train_config *cfg, size_t size, unsigned version);
/* The same defaults by value, for a caller compiled with this library's header (the CLI, tests). */
dt_train_config dt_train_defaults(void);

typedef struct dt_trainer dt_trainer;

/* Loads the data, builds the model and optimizer and restores cfg->resume if set. The
 * config's strings must outlive the trainer. Sets the process-wide BLAS thread count to
 * cfg->threads (dt_set_threads). Error messages name the dtrain train flag of a bad field. */
dt_status dt_trainer_create(dt_trainer **t, const dt_train_config *cfg);
void dt_trainer_destroy(dt_trainer *t);
/* Runs the remaining epochs (or up to max_steps), calling the callbacks; saves to cfg->save.
 * Collective: with a communicator every rank of the job calls it (dt_trainer_create too).
 * Once the run has reached its end, another call returns DT_OK at once. DT_EINTR: stopped by
 * cfg->stop after writing a checkpoint (the message says how to continue). */
dt_status dt_trainer_run(dt_trainer *t);
/* Loss and accuracy of the current model on the test set. DT_EINVAL (loss and acc NaN) when the
 * run has none: the message says how to give one.
 * Collective: with a communicator, EVERY rank of the job must call it (each evaluates its shard
 * and the sums are allreduced); a rank calling it alone fails with DT_EPEER naming that. */
dt_status dt_trainer_evaluate(dt_trainer *t, float *loss, float *acc);
/* Writes a checkpoint of the current state (model, optimizer, position, config). Not collective:
 * it writes what this rank holds; in a job, call it on rank 0. */
dt_status dt_trainer_save(dt_trainer *t, const char *path);
dt_model *dt_trainer_model(dt_trainer *t);
int64_t dt_trainer_step(const dt_trainer *t);
/* Path of the last checkpoint written or resumed from ("" if none). */
const char *dt_trainer_last_checkpoint(const dt_trainer *t);
/* What the strategy chose at set-up where its spec left the choice open, e.g. ddp(update=auto):
 * "update=shard (auto: the ranks share one host)"; NULL when it chose nothing. Static text. */
const char *dt_trainer_strategy_choice(const dt_trainer *t);

/* Strategy specs (dt_train_config.strategy). Parses and checks spec: name gets the strategy's
 * name (cap bytes), *servers (may be NULL) the ranks that serve instead of training (ps: the
 * first S ranks; 0 for the others). DT_EINVAL naming the strategy, option or value otherwise. */
dt_status dt_strategy_spec_info(const char *spec, char *name, size_t cap, int *servers);
/* The ranks among which spec splits each global batch in a job of world ranks (ddp: world; ps:
 * the workers; pp: the pipelines, world / stages); world when spec is bad. */
int dt_strategy_spec_data_world(const char *spec, int world);
/* The model-parallel layout of spec: *tp tensor-parallel ranks, *pp pipeline stages (1 each for a
 * data-parallel strategy), *microbatches per rank-batch and *schedule ("gpipe" or "1f1b", static)
 * of the pipeline (1 and NULL without one). DT_EINVAL as dt_strategy_spec_info. */
dt_status dt_strategy_spec_mesh(const char *spec, int *tp, int *pp, int *microbatches, const char **schedule);
/* Writes spec with every option spelled out ("ps(servers=1,staleness=inf,shards=dynamic,overlap=0)")
 * to out (cap bytes); DT_EINVAL as dt_strategy_spec_info. */
dt_status dt_strategy_spec_canonical(const char *spec, char *out, size_t cap);
/* Writes spec plus option key=value to out (cap bytes), e.g. ("ps(servers=2)", "staleness", "4")
 * gives "ps(servers=2,staleness=4)". DT_EINVAL when the strategy has no such option or spec
 * already sets key to another value (the message names spec and its value). */
dt_status dt_strategy_spec_add_option(const char *spec, const char *key, const char *value, char *out, size_t cap);
/* The strategies' spec syntax, one per line ("ddp(bucket_mb=MB)\n..."); static storage. */
const char *dt_strategy_spec_help(void);

/* ---- the registries, for help texts (dtrain train --help and the man page are made from them) ---- */
typedef enum {
    DT_REGISTRY_STRATEGY = 0, /* --strategy: dt_train_config.strategy */
    DT_REGISTRY_COMPRESSOR,   /* a strategy's compress=C (--compress) */
    DT_REGISTRY_TRANSPORT,    /* dt_comm_config.transport (--backend) */
    DT_REGISTRY_DEVICE,       /* dt_train_config.device (--device) */
} dt_registry;

/* One entry of a registry. */
typedef struct {
    const char *name;
    const char *options; /* the syntax of its options, "" when it takes none: a strategy's inside
                          * NAME(...), the others' after "NAME:" */
    const char *help;    /* what it is or does: a sentence or more, not wrapped */
} dt_registry_entry;

/* Entry i (from 0) of registry r, in the registry's order (transports: the automatic choice's);
 * false past the last. The strings are static. */
bool dt_registry_entry_at(dt_registry r, int i, dt_registry_entry *out);

/* The class (dtrain/workers.h dt_strategy_class) of spec's strategy (a name or a spec); DT_EINVAL as
 * dt_strategy_spec_info. */
dt_status dt_strategy_spec_class(const char *spec, dt_strategy_class *out);
/* Whether spec's strategy takes option key (e.g. "compress"); false for a bad spec. */
bool dt_strategy_spec_takes(const char *spec, const char *key);
/* The names of the strategies that take option key, for a message: "ddp and localsgd" (into out,
 * cap bytes; `last` joins the last two: "and", "or"); out. */
const char *dt_strategy_takers(const char *key, const char *last, char *out, size_t cap);
/* The names of the strategies of class c, joined as dt_strategy_takers. */
const char *dt_strategy_names_of_class(dt_strategy_class c, const char *last, char *out, size_t cap);
/* The strategy a job of world ranks runs when it names none: "single" for one, "ddp" for more. */
const char *dt_strategy_spec_default(int world);
/* Whether spec is one of those, written without options. */
bool dt_strategy_spec_is_default(const char *spec);

/* Where --keep-best writes the best epoch's checkpoint for --save path: "<stem>.best.safetensors"
 * for "<stem>.safetensors", else "<path>.best" (into out, cap bytes). */
void dt_train_best_path(const char *save, char *out, size_t cap);

/* Builds the model a checkpoint was trained with (its dtrain.model_spec and input shape) and
 * loads its weights; the caller frees *m. */
dt_status dt_model_load(dt_model **m, const char *checkpoint);

/* Loss and accuracy (every output row: a label per sample, a next token per position) of model
 * m on the whole data set ds, in batches of `batch`, in this process (no communicator). ds must
 * fit m's input (feature or token set); a label beyond m's outputs is DT_EINVAL naming it. */
dt_status dt_evaluate_dataset(dt_model *m, const dt_dataset *ds, int batch, float *loss, float *acc);
/* Evaluates a checkpoint on the test split of a data set (dtrain eval); a data set without one
 * is evaluated on its training split. *split gets "test" or "train". data NULL: the data set the
 * checkpoint records (its --data), DT_EINVAL when it records none. */
dt_status dt_evaluate_checkpoint(const char *checkpoint, const char *data, int batch, float *loss, float *acc,
                                 int64_t *samples, const char **split);
/* The same with the model on the device `device` ("cpu" or NULL; "checked[:arena=BYTES]",
 * docs/device.md): the same figures on every device. */
dt_status dt_evaluate_checkpoint_on(const char *checkpoint, const char *data, const char *device, int batch,
                                    float *loss, float *acc, int64_t *samples, const char **split);

#ifdef __cplusplus
}
#endif
#endif
