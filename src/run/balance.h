/* Uneven workers in the step loop: the --slow straggler aid (a rank sleeps (factor - 1) x its
 * measured compute time after each step's backward, never spinning; what a nap oversleeps, the
 * timer's wake-up latency or a busy machine, is taken off the next naps, so the rank is FACTOR
 * times slower on average even where a step lasts a few timer latencies), dynamic load balancing
 * (--balance dynamic: every few steps the ranks allgather their measured time per sample and
 * cut the next global batches by their speeds, in quanta, where that pays, identically on every
 * rank, so that all arrive at the allreduce together) and the per-worker figures of an epoch
 * (samples, share, speed) for the metrics. The trainer weights each rank's loss gradient by
 * n_local*world/n_global, so any cut still averages to the exact mean gradient over the global
 * batch. */
#ifndef DT_RUN_BALANCE_H
#define DT_RUN_BALANCE_H

#include "dtrain/comm.h"
#include "dtrain/data.h"
#include "dtrain/train.h"

#include <stdio.h>

typedef struct {
    int rank, world; /* data-parallel rank and world (the loader's) */
    int job_rank0;   /* job rank of data rank 0 (ps workers start after the servers) */
    int batch;       /* per-rank batch: a global batch is batch * world samples */
    bool dynamic;    /* re-cut the global batch by measured speed */
    double slow;     /* this rank's --slow factor; <= 1 = not slow */
    int interval;    /* steps between re-cuts, at least; 0 = default (8); more where the predicted
                      * step is so short that they would come less than 50 ms apart */
    /* the nap of a slow rank: sleeps about s seconds and returns the seconds it really took;
     * NULL = nanosleep timed by dt_now (tests inject a clock-free one) */
    double (*nap)(void *ctx, double s);
    void *nap_ctx;
} dt_balance_config;

typedef struct dt_balance dt_balance;

/* Creates the balancer; *b owned by the caller (dt_balance_destroy). */
dt_status dt_balance_create(dt_balance **b, const dt_balance_config *cfg);
/* Frees it; NULL is a no-op. */
void dt_balance_destroy(dt_balance *b);
/* After a step's forward+backward over n samples that took compute_s seconds: sleeps
 * (slow - 1) x compute_s on the slow rank, less what earlier naps overslept (never below 0: an
 * oversleep larger than a nap is paid off over the next ones), and records the time per sample
 * with the sleep it really took. Returns that sleep in seconds. */
double dt_balance_compute_done(dt_balance *b, int n, double compute_s);
/* End of a step: when dynamic and due (after step 3, then every interval steps, or as many as
 * make 50 ms of predicted steps), allgathers the ranks' time per sample over comm (a
 * collective: every rank calls this after every step), cuts the global batch by speed in quanta
 * of dt_balance_quantum(batch) and, where that shortens the predicted step (the slowest rank's
 * samples x time per sample) by more than 5%, sets the same new cut on l on every rank. */
dt_status dt_balance_step_end(dt_balance *b, dt_comm *comm, dt_loader *l);
/* The granule of a re-cut for per-rank batch B: the largest divisor of B not above B / 16 (at
 * least 1); every rank's share of a re-cut global batch is a multiple of it. */
int dt_balance_quantum(int batch);
/* Cuts G samples (a multiple of q) among `world` ranks in whole quanta of q samples so that the
 * longest predicted step (count / speed, speeds[] > 0) is as short as can be: floors of the
 * proportional cut (each rank at least one quantum when G / q >= world), then each quantum left
 * to the rank it lengthens least (ties to the lower rank). Deterministic. */
void dt_balance_cut_quantised(int *counts, const double *speeds, int world, int G, int q);
/* The current cut: samples per data rank of a complete global batch ([world]). */
const int *dt_balance_cut(const dt_balance *b);
/* Cuts G samples among `world` ranks in proportion to speeds[] (> 0), each rank at least one
 * sample when G >= world; deterministic (largest remainder, ties to the lower rank). */
void dt_balance_cut_by_speed(int *counts, const double *speeds, int world, int G);
/* Epoch figures of every rank (collective over comm; comm NULL = this rank alone): samples and
 * busy time since the last call, over epoch_s of wall time. out has room for world entries. */
dt_status dt_balance_epoch(dt_balance *b, dt_comm *comm, double epoch_s, dt_worker_info *out);
/* Writes the uneven-worker fields of e into an open JSON object: , "workers": [{rank, samples,
 * share, samples_per_s, busy_s, batch, alive}...], and for ps "staleness": {"hist": [...],
 * "mean": x, "max": n} and "max_clock_gap". Nothing when e has no per-worker figures. */
void dt_balance_write_json(FILE *f, const dt_epoch_info *e);

#endif
