/* dtrain plan (cmd_plan.c), this host's measured cluster (plan_probe.c) and --strategy auto for
 * train (plan_auto.c). */
#ifndef DT_CLI_CMD_PLAN_H
#define DT_CLI_CMD_PLAN_H

#include "plan/plan.h"

int dt_cmd_plan(int argc, char **argv);
/* dtrain plan's flags in argv (argv[0] = "plan"): plans, prints, and puts the best layout in *best
 * (may be NULL); 0 when it fits, else the exit status. */
int dt_cli_plan_run(int argc, char **argv, dt_plan_entry *best);
/* Prints the plan's table and why the alternatives lose (res best first, limit bytes per rank). */
void dt_cli_plan_print(const dt_plan_result *res, const dt_plan_cluster *c, const char *source, const char *model,
                       int G, double limit, int top);
/* This host as a cluster of `ranks` ranks into *c: the figures --probe cached for that many ranks
 * (true), else defaults (false). */
bool dt_cli_plan_host_cluster(int ranks, dt_plan_cluster *c);
/* The other runnable tasks on this host now (mean of /proc/loadavg samples over 40 ms, this
 * process left out): what the ranks of a run share the cores with. */
double dt_cli_plan_busy(void);
/* --probe: measures allreduce latency and bandwidth between `ranks` local ranks (forked, shm) and
 * the memory bandwidth, and caches them; 0 or the exit status after saying what failed. */
int dt_cli_plan_probe(int ranks, dt_plan_cluster *c);
/* This host's links between `ranks` local ranks now, at the model's size: the slowest rank's median
 * allreduce of 4 KB (the latency, over the ring's 2(ranks-1) hops) and of `values` floats (the
 * gradients, 4 K to 2 M of them: the bandwidth at that size, which stays in the caches where an
 * 8 MB probe does not) into c's links. On a shared host both follow the load within minutes
 * (a blocked rank waits for the scheduler). 0 or the exit status. */
int dt_cli_plan_links_now(int ranks, double values, dt_plan_cluster *c);
/* The planner's cache directory (DTRAIN_PLAN_CACHE, else ~/.cache/dtrain) into buf, made when
 * `make`; false when there is none (no HOME). */
bool dt_cli_plan_cache_dir(char *buf, size_t cap, bool make);
/* The per-op times --probe measured (pm's t_fix, t_per, ovh_fix, ovh_per) under `key` (the model,
 * data shape, batches, precision, ranks and CPU: plan_opcache.c) into pm, and the other runnable
 * tasks when they were measured into *busy; false when none is cached under that key. */
bool dt_cli_plan_ops_load(const char *key, dt_plan_model *pm, double *busy);
/* Caches pm's per-op times under key (measured beside `busy` other runnable tasks); 0 or the exit
 * status after saying why. */
int dt_cli_plan_ops_save(const char *key, const dt_plan_model *pm, double busy);
/* The cache key of the per-op times of model spec on data set `data` measured at batches b1 and b2
 * for `ranks` ranks at precisions `prec` (calibrated: with the step overhead), on this CPU, into buf. */
void dt_cli_plan_ops_key(const char *spec, const char *data, int b1, int b2, int ranks, const char *prec,
                         bool calibrated, char *buf, size_t cap);
/* Whether argv asks `dtrain train` for --strategy auto. */
bool dt_cli_strategy_is_auto(int argc, char **argv);
/* dtrain train --strategy auto: plans the run on this host, prints the plan and the choice, and runs
 * train (via run) with the chosen layout's flags in place of --strategy auto, the prediction in
 * DTRAIN_PLAN_STEP_S for the ranks; its exit status. */
int dt_cli_train_auto(int argc, char **argv, int (*run)(int, char **));

/* In a rank that --strategy auto started: the planner's step time (0 when not) and *layout its
 * layout's name (NULL when not), from the environment dt_cli_train_auto sets. */
double dt_cli_plan_from_env(const char **layout);

#endif
