/* Elastic supervision of a local data-parallel job: runs the ranks through the launcher and,
 * when a rank dies, restarts the job from its last checkpoint (--resume auto) with replacement
 * ranks, up to a number of restarts. Used by `dtrain train --workers N --elastic MIN:MAX`. */
#ifndef DT_RUN_ELASTIC_H
#define DT_RUN_ELASTIC_H

#include "run/launch.h"

typedef struct {
    int workers;                  /* ranks of the first job */
    int min_workers, max_workers; /* bounds of later jobs: a rank slot that fails twice in a row
                                   * is dropped (not below min); replacements keep the size */
    int max_restarts;
    char **argv; /* one rank's command; restarts append "--resume auto" */
    int argc;
    const char *checkpoint_dir; /* for the log lines (newest checkpoint) */
    void (*notify)(void *ctx, const char *msg);
    void *ctx;
} dt_elastic_config;

/* Environment variable the supervisor sets for the ranks of a job it shrank: the number of ranks
 * the job now has, which overrides the command's --workers N (still the first job's size). */
#define DT_ELASTIC_WORKERS_ENV "DTRAIN_ELASTIC_WORKERS"

/* The number of ranks a rank of this job should find: the supervisor's DT_ELASTIC_WORKERS_ENV
 * when set (a shrunk job), else flag_workers (--workers N). */
int dt_elastic_job_workers(int flag_workers);

/* Runs the job until it succeeds, is interrupted, or fails more than max_restarts times.
 * res describes the last job. */
dt_status dt_elastic_run(const dt_elastic_config *cfg, dt_launch_result *res);

#endif
