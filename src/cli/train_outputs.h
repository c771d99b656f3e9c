/* dtrain train: the files a run will write are checked before it trains (train_outputs.c). */
#ifndef DT_CLI_TRAIN_OUTPUTS_H
#define DT_CLI_TRAIN_OUTPUTS_H

#include "dtrain/train.h"

/* Whether --save, --save-weights, --timeline, --metrics and --checkpoint-dir can be written: a
 * file is made and removed in each one's directory (as root, permission bits alone do not say:
 * /proc, a read-only mount). -1 when they can, else exit DT_EXIT_OUTPUT (73) after naming the
 * flag, the path and what to do. An epoch of training is not spent to find out at its end. */
int dt_cli_check_outputs(const dt_train_config *c);
/* The same check of one output file given by flag (its text, "--save" or "-o"): -1 when a file
 * can be made in its directory and it is not a directory, else exit DT_EXIT_OUTPUT (73) after
 * naming both. */
int dt_cli_check_output_file(const char *flag, const char *path);

#endif
