/* dtrain train: the uneven-worker flags and the ps job layout (see train_uneven.c). */
#ifndef DT_CLI_TRAIN_UNEVEN_H
#define DT_CLI_TRAIN_UNEVEN_H

#include "cli/cli.h"
#include "dtrain/train.h"
#include "run/train_aids.h"

/* The strategy flags as given (strings: NULL = not given). */
typedef struct {
    const char *staleness;   /* "S" or "inf" */
    const char *balance;     /* "static" | "dynamic" */
    const char *slow;        /* "RANK:FACTOR" */
    int servers, sync_every; /* --servers, --sync-every (default 1, 8) */
    bool overlap;            /* --ps-overlap */
    float bucket_mb;         /* --bucket-mb (0 = default) */
    const char *compress;    /* --compress (ddp, localsgd), NULL = not given */
    const char *allreduce;   /* --allreduce auto|flat|hier (ddp), NULL = not given */
    bool servers_given;      /* --servers / --sync-every on the command line */
    bool sync_every_given;
    int zero; /* --zero N (ddp's zero= option) */
    bool zero_given;
    bool implicit_ddp;  /* out: spec "ddp(...)" made from --bucket-mb without --strategy (one process drops it) */
    char spec[512];     /* out: the spec cfg->strategy points to once the flags are in it */
    dt_train_aids aids; /* out: --slow (cfg->aids points here once it is given) */
} dt_cli_uneven;

/* Checks --strategy (a spec, e.g. "ps(servers=2)") and the strategy flags (--servers,
 * --staleness, --sync-every, --ps-overlap, --bucket-mb, --balance for ps), adds the flags to the
 * spec (u->spec; cfg->strategy points to it) and fills the trainer-level ones (--balance,
 * --slow) into cfg; 0, or the exit status after printing the error with a hint. */
int dt_cli_uneven_parse(dt_cli_uneven *u, dt_train_config *cfg);
/* Server ranks of cfg->strategy (ps: its servers; 0 for the others or no strategy). */
int dt_cli_servers(const dt_train_config *cfg);
/* True for --strategy ps (with or without options). */
bool dt_cli_is_ps(const dt_train_config *cfg);
/* Ranks of a --workers N job: N, plus the servers for ps (--workers counts workers). */
int dt_cli_job_ranks(const dt_train_config *cfg, int workers);
/* The launcher's expendable flags of a job of nranks (ps: every worker), or NULL; free() it. */
bool *dt_cli_expendable(const dt_train_config *cfg, int nranks);

#endif
