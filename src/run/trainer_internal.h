/* Internals of the trainer shared by its files: trainer.c (set-up, resume, checkpoints),
 * evaluate.c (evaluation, dtrain eval), train_loop.c (steps, epochs, stopping, ps serving) and
 * train_report.c (metrics lines and the timeline). Not part of the public API. */
#ifndef DT_RUN_TRAINER_INTERNAL_H
#define DT_RUN_TRAINER_INTERNAL_H

#include "core/trace.h"
#include "parallel/strategy.h"
#include "dtrain/data.h"
#include "dtrain/train.h"
#include "run/balance.h"
#include "run/checkpoint.h"

#include <stdio.h>

/* DT_EINVAL naming who (the API call) when cfg's size and version are not this library's
 * (dt_train_config_init); trainer.c. */
dt_status dt_train_config_check_layout(const dt_train_config *cfg, const char *who);

struct dt_trainer {
    dt_train_config cfg;
    dt_dataset *train, *test;
    dt_model *model;
    dt_optim *optim;
    struct dt_dev *dev; /* --device (NULL: the cpu device) */
    dt_loader *loader;
    int C, H, W, classes;
    int64_t step;          /* optimizer steps done */
    int64_t epoch;         /* current epoch (0-based) */
    int64_t step_in_epoch; /* batches consumed in the current epoch */
    int64_t lr_step;       /* ps dynamic: the schedule's step for the unit in training (its round,
                            * counted like synchronous steps, not this worker's own steps); else -1 */
    float norm_mean, norm_std;
    bool has_norm;
    double t_start;
    int rank, world;
    dt_strategy *strategy;
    bool balanced;          /* the strategy's spec asks for balance=dynamic (entry.balanced) */
    dt_trace trace;         /* empty unless cfg.timeline */
    char resume_path[4096]; /* the checkpoint resumed from (resolves "auto") */
    char last_ckpt[4096];   /* last checkpoint written or resumed from */
    char vocab_spec[256];   /* --data tokens: with a GPT spec that gives no V=: the spec with the data's V */
    double last_ckpt_time;
    int64_t saved_step; /* step of the last numbered checkpoint (-1: none) */
    int resume_noted;   /* the "training again" note was given */
    /* uneven workers (ps, localsgd, --balance, --slow) */
    int drank, dworld;       /* this rank's part of the data: the loader's rank and world */
    dt_comm *dcomm;          /* the ranks that reduce epoch figures together; NULL = this one alone */
    dt_balance *balance;     /* --slow sleep, --balance cut, per-worker figures (training ranks) */
    dt_worker_info *workers; /* [dworld] */
    /* --val-split, --early-stop, --keep-best (validation.c) */
    dt_dataset *val;           /* the held-out part of the training set, or NULL */
    dt_dataset *own_train;     /* the training part when the data is borrowed (cfg.train_set), or NULL */
    float best_val;            /* lowest validation loss so far (INFINITY: none yet) */
    int64_t best_epoch;        /* its epoch (1-based; 0: none) */
    int64_t bad_epochs;        /* epochs since then without a lower one */
    bool early_stopped;        /* --early-stop ended the run */
    bool borrowed_data;        /* train/test are cfg.train_set/test_set: not freed here */
    char strategy_report[512]; /* the strategy's figures for the epoch's metrics line (ops->report) */
    /* step-based reporting (step_report.c) */
    FILE *mf;                  /* --metrics on rank 0 while the run goes, else NULL */
    dt_progress_info progress; /* the training position last reported (an evaluation's progress starts from it) */
    struct {                   /* since the last DT_STEP_TRAIN record (this rank) */
        double loss_sum, t0, paused_s; /* paused_s: evaluation time in the interval (not training) */
        int64_t samples, steps;
        float grad_norm; /* of the last step, where measured */
    } log;
};

/* The model's feed of a loader batch (features or token ids, and labels or next tokens). */
static inline dt_feed dt_trainer_feed(const dt_batch *b) {
    return (dt_feed){.x = b->tok ? (const void *)b->tok : (const void *)b->x, .y = b->y, .n = b->n};
}
/* Samples of the training set in one epoch (--epoch-windows, else all). */
static inline size_t dt_trainer_epoch_len(const dt_trainer *t) {
    size_t n = dt_dataset_len(t->train);
    return t->cfg.epoch_windows > 0 && (size_t)t->cfg.epoch_windows < n ? (size_t)t->cfg.epoch_windows : n;
}
/* Samples of one rank's step: --grad-accum micro-batches of --batch each. */
static inline int dt_trainer_step_batch(const dt_trainer *t) {
    return t->cfg.batch * (t->cfg.grad_accum > 1 ? t->cfg.grad_accum : 1);
}
/* Opens --data for model `spec`: a text corpus (text:FILE, kjv) as windows of the GPT's context
 * with the last val_fraction as the test set, else an image/CSV data set. */
dt_status dt_trainer_open_data(const char *data, const char *spec, double val_fraction, dt_dataset **train,
                               dt_dataset **test);
/* --weights/--val-split/--early-stop/--keep-best rules; a resumed run (resume, info) keeps its
 * checkpoint's split and early-stop counters. */
dt_status dt_trainer_setup_val(dt_trainer *t, const char *resume, const dt_ckpt_info *info);
/* After the strategy is made: --val-split/--save-weights need a replicated model, and
 * --save-weights with --normalize a first layer that can take the statistics. */
dt_status dt_trainer_check_io(dt_trainer *t);
/* Loss and accuracy of the current model on ds (sharded over the replicas and reduced), over its
 * first --eval-batches batches, with progress; *samples (may be NULL): samples evaluated. */
dt_status dt_trainer_evaluate_on(dt_trainer *t, const dt_dataset *ds, float *loss, float *acc, int64_t *samples);
/* The training evaluation of the test set: as dt_trainer_evaluate, over its first --eval-batches
 * batches, with progress; *samples the samples evaluated (0 without a test set). Collective. */
dt_status dt_trainer_evaluate_test(dt_trainer *t, float *loss, float *acc, int64_t *samples);
/* The clip a step passes its strategy: --clip, or INFINITY (measure the norm, clip nothing) on a
 * step that a DT_STEP_TRAIN record follows. */
float dt_trainer_step_clip(const dt_trainer *t);
/* Starts the interval of the next DT_STEP_TRAIN record (at the start of a run). */
void dt_trainer_log_start(dt_trainer *t);
/* After each step: the DT_STEP_TRAIN record every --log-every steps and the evaluation every
 * --eval-every steps (not at the epoch's last step, nor at the run's: the epoch's evaluation
 * follows). Collective (every training rank calls it after the same step). */
dt_status dt_trainer_step_reports(dt_trainer *t, int64_t spe);
/* The progress of the run (total steps, the epoch's steps and ETAs) into t->progress and, when
 * show, to on_progress (rank 0); acc_samples/acc_steps: the epoch's so far (this rank), t0 its start. */
void dt_trainer_report_progress(dt_trainer *t, int64_t acc_samples, int64_t acc_steps, float loss, double t0,
                                double now, int64_t spe, bool show);
/* At an epoch's end that falls on an --eval-every step: its evaluation (e's figures, eval_s
 * seconds) as a DT_STEP_EVAL record too, so that the records come every --eval-every steps. */
dt_status dt_trainer_epoch_eval_record(dt_trainer *t, const dt_epoch_info *e, int64_t spe, double eval_s);
/* Appends one JSON line of a DT_STEP_TRAIN or DT_STEP_EVAL record and flushes it (DT_EIO naming the file). */
dt_status dt_trainer_write_step(FILE *f, const dt_step_info *s, const dt_trainer *t);
/* --val-split: splits t->train into training and validation parts (after the data is opened). */
dt_status dt_trainer_split_val(dt_trainer *t);
/* After an epoch's evaluation: the validation loss and accuracy into e (NaN without --val-split),
 * the best epoch and the early-stop counter updated, --keep-best written (rank 0). */
dt_status dt_trainer_validate(dt_trainer *t, dt_epoch_info *e);
/* --save-weights: rank 0 writes the weights-only file. */
dt_status dt_trainer_save_weights(dt_trainer *t);
/* Passes a note to cfg.on_note on rank 0 (printf-style). */
void dt_trainer_note(const dt_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Rank 0 writes checkpoint_dir/ckpt-<step> and prunes to --keep; every rank restarts its timer. */
dt_status dt_trainer_save_numbered(dt_trainer *t);
/* Opens --metrics for the run: truncated for a fresh run; for a resumed one, the records of
 * steps after the one resumed from are dropped first (they will be written again), so no epoch
 * appears twice. *out NULL when there is no --metrics or this is not rank 0. */
dt_status dt_trainer_open_metrics(dt_trainer *t, FILE **out);
/* Appends one JSON line for a finished epoch and flushes it; DT_EIO naming the file (disk full). */
dt_status dt_trainer_write_metrics(FILE *f, const dt_epoch_info *e, const dt_trainer *t);
/* Flushes, fsyncs and closes the metrics file (NULL: no-op); returns s, or the first write error
 * when s is DT_OK. */
dt_status dt_trainer_close_metrics(dt_trainer *t, FILE *f, dt_status s);
/* Gathers every rank's timeline events on rank 0 and writes the Chrome trace there. */
dt_status dt_trainer_write_timeline(dt_trainer *t);

/* The strategy spec this run trains with: the configured one, else "ddp" (more than one rank) or "single". */
const char *dt_trainer_strategy_spec(const dt_trainer *t);
/* DT_EINVAL naming data and the model when m's loss does not fit ds: an mse model needs regression
 * targets (dt_dataset_has_targets), a cross-entropy one class labels. */
dt_status dt_trainer_check_loss(const dt_model *m, const dt_dataset *ds, const char *data);
/* Moves the just-built *m onto a device of its own made from `device` ("cpu" or NULL: stays;
 * "checked[:arena=BYTES]"), which the model then owns; on an error *m is freed and NULL, and the
 * error names --device. */
dt_status dt_model_to_device(dt_model **m, const char *device);

#endif
