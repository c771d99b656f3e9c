/* dtrain train: the usage text of --help and the groups of its flags (train_usage.c). */
#ifndef DT_CLI_TRAIN_USAGE_H
#define DT_CLI_TRAIN_USAGE_H

#include "cli/cli.h"

/* The description printed first by `dtrain train --help`. */
extern const char dt_train_usage[];
/* The groups --help lists the flags in (NULL-title-terminated; unnamed flags: Advanced). */
extern const dt_flag_group dt_train_groups[];
/* The text after the flag list: model spec syntax, then the strategies and the compressors, each
 * with its syntax, help and flags, from the registries. Static storage, made on the first call. */
const char *dt_train_notes(void);
/* The three together, for dt_flags_parse_help. */
const dt_flag_help *dt_train_help(void);
/* The help of --strategy, --compress and --device: the registries' names and syntax. Static storage. */
const char *dt_train_strategy_help(void);
const char *dt_train_compress_help(void);
const char *dt_train_device_help(void);
/* The --device help of the commands that run a trained model (eval, predict, sample, export):
 * the devices of the registry. Static storage. */
const char *dt_cli_device_help(void);

#endif
