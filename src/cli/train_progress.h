/* What `dtrain train` prints on rank 0 while it trains: a progress bar on a terminal (plain lines
 * every few seconds into a pipe), one line per epoch and per --log-every / --eval-every record,
 * the trainer's notes. */
#ifndef DT_CLI_TRAIN_PROGRESS_H
#define DT_CLI_TRAIN_PROGRESS_H

#include "dtrain/dtrain.h"

#include <stdbool.h>

typedef struct {
    bool quiet, tty;
    int epochs;
    int64_t eval_batches;    /* --eval-batches (the epoch line then says how many samples it evaluated) */
    bool bar_shown;          /* a bar is on the terminal's last line (cleared before a line on stdout) */
    double last_line;        /* when the last plain progress line was printed (monotonic seconds) */
    dt_epoch_info last;      /* the last finished epoch, for the closing line */
    dt_tb_writer *tb;        /* --tensorboard (rank 0), or NULL */
    double predicted_step_s; /* --strategy auto: the planner's step time (0: none) */
} dt_train_progress;

/* dt_train_config.on_progress: the bar (tty) or a plain line at most every 5 s, ending at this
 * epoch's last step (--max-steps); an evaluation's batches the same way; ctx is a
 * dt_train_progress. Nothing when quiet. */
void dt_train_print_progress(void *ctx, const dt_progress_info *p);
/* dt_train_config.on_step: the TensorBoard scalars of a --log-every / --eval-every record and,
 * unless quiet, its line on stdout (not for the evaluation of an epoch's end, which its epoch
 * line shows). */
void dt_train_print_step(void *ctx, const dt_step_info *s);
/* dt_train_config.on_epoch: the epoch's line (cut-short and resumed epochs say so; validation and
 * test figures when there are any) on stdout, and its TensorBoard scalars; keeps it as ->last. */
void dt_train_print_epoch(void *ctx, const dt_epoch_info *e);
/* dt_train_config.on_note: "dtrain: MSG" on stdout. */
void dt_train_print_note(void *ctx, const char *msg);

#endif
