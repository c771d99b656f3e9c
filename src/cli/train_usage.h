/* dtrain train: the usage text of --help and the groups of its flags (train_usage.c). */
#ifndef DT_CLI_TRAIN_USAGE_H
#define DT_CLI_TRAIN_USAGE_H

#include "cli/cli.h"

/* The description printed first by `dtrain train --help`. */
extern const char dt_train_usage[];
/* The groups --help lists the flags in (NULL-title-terminated; unnamed flags: Advanced). */
extern const dt_flag_group dt_train_groups[];
/* The text after the flag list that follows the layers of a model spec: strategies. */
extern const char dt_train_notes[];
/* The three together, for dt_flags_parse_help: the notes start with the model spec syntax and the
 * layers of the op registry (dt_spec_help). */
const dt_flag_help *dt_train_help(void);

#endif
