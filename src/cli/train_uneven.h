/* dtrain train: the uneven-worker flags and the ps job layout (see train_uneven.c). */
#ifndef DT_CLI_TRAIN_UNEVEN_H
#define DT_CLI_TRAIN_UNEVEN_H

#include "cli/cli.h"
#include "dtrain/train.h"

/* The string-valued flags as given (NULL = not given). */
typedef struct {
    const char *staleness;  /* "S" or "inf" */
    const char *balance;    /* "static" | "dynamic" */
    const char *slow;       /* "RANK:FACTOR" */
    bool servers_given;     /* --servers / --sync-every on the command line (their values are in cfg) */
    bool sync_every_given;
} dt_cli_uneven;

/* Fills cfg from u and checks --strategy, --servers, --sync-every and the flags that need a
 * certain strategy; 0, or the exit status after printing the
 * error with a hint. */
int dt_cli_uneven_parse(const dt_cli_uneven *u, dt_train_config *cfg);
/* True for --strategy ps. */
bool dt_cli_is_ps(const dt_train_config *cfg);
/* Ranks of a --workers N job: N, plus the servers for ps (--workers counts workers). */
int dt_cli_job_ranks(const dt_train_config *cfg, int workers);
/* The launcher's expendable flags of a job of nranks (ps: every worker), or NULL; free() it. */
bool *dt_cli_expendable(const dt_train_config *cfg, int nranks);

#endif
