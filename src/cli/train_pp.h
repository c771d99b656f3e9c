/* dtrain train: the pipeline flags --pp, --microbatches, --pp-schedule, --pp-split (train_pp.c). */
#ifndef DT_CLI_TRAIN_PP_H
#define DT_CLI_TRAIN_PP_H

#include "cli/cli.h"
#include "dtrain/train.h"

/* The pipeline flags as given (0 / NULL = not given). */
typedef struct {
    int pp, microbatches;
    const char *schedule, *split;
    char spec[512]; /* out: the spec cfg->strategy points to once the flags are in it */
} dt_cli_pp;

/* Turns the pipeline flags into the strategy spec pp(stages=K,...) (cfg->strategy points to
 * o->spec afterwards); workers is --workers (checked against K unless this process is a rank of
 * an outside launcher). 0, or the exit status after printing the error with a hint. */
int dt_cli_pp_parse(dt_cli_pp *o, dt_train_config *cfg, int workers);
/* 0 when the pipeline of cfg->strategy (if any) has at most as many micro-batches as a step has
 * samples, else the exit status after printing the error with a hint. */
int dt_cli_pp_check_batch(const dt_train_config *cfg);

#endif
