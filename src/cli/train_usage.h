/* dtrain train: the usage text of --help (train_usage.c). */
#ifndef DT_CLI_TRAIN_USAGE_H
#define DT_CLI_TRAIN_USAGE_H

/* The text before the flag list of `dtrain train --help`. */
extern const char dt_train_usage[];

#endif
