/* Plain records of data-parallel workers' progress, produced by the distribution strategies
 * (parallel/) and reported by the trainer (run/) in its metrics, and the classes of strategies.
 * Data only, no behaviour. */
#ifndef DTRAIN_WORKERS_H
#define DTRAIN_WORKERS_H

#include <stdbool.h>
#include <stdint.h>

/* One data-parallel worker's share of an epoch (uneven workers: --balance, --slow, ps). */
typedef struct {
    int rank;             /* its rank in the job */
    int64_t samples;      /* samples it trained on this epoch */
    double share;         /* samples / all workers' samples */
    double samples_per_s; /* samples / the epoch's wall time (what it contributed) */
    double busy_s;        /* its forward+backward time, including a --slow sleep */
    int batch;            /* its batch at the end of the epoch (the balanced cut) */
    bool alive;           /* ps: false once the servers dropped it */
} dt_worker_info;

/* What a strategy is, from its registry entry (parallel/): code outside parallel/ asks this
 * (dtrain/train.h dt_strategy_spec_class) instead of testing a strategy's name. */
typedef enum {
    DT_STRATEGY_ONE_PROCESS,   /* single */
    DT_STRATEGY_REPLICAS,      /* data-parallel copies of the model: ddp, localsgd */
    DT_STRATEGY_SERVERS,       /* the first ranks serve the parameters: ps */
    DT_STRATEGY_MODEL_PARALLEL /* the model is cut over ranks: tp, pp */
} dt_strategy_class;

#define DT_STALENESS_BINS 16 /* ps histogram: bins 0..14 exact, bin 15 = 15 or more */

#endif
