/* Per-node timing of `dtrain bench train --profile`: the wall time of each node's forward and
 * backward (through the model's node hooks, so nothing is timed or paid when it is off) and of
 * the optimizer step, in CPU time of the calling thread, printed as a table per benchmark row. */
#ifndef DT_CLI_BENCH_PROFILE_H
#define DT_CLI_BENCH_PROFILE_H

#include "dtrain/dtrain.h"

typedef struct dt_bench_profile dt_bench_profile;

/* A profile of m's nodes with its hooks set on m (m's hooks must be unset); NULL on no memory. */
dt_bench_profile *dt_bench_profile_attach(dt_model *m);
/* Starts (on) or stops (off) adding times: the warm-up steps are not counted. */
void dt_bench_profile_enable(dt_bench_profile *p, bool on);
/* Around the optimizer step: start true before it, false after (adds to the "optimizer" line). */
void dt_bench_profile_optim(dt_bench_profile *p, bool start);
/* Prints the table (ms per step of each node's forward and backward, share of the step time
 * step_s, CPU seconds), then frees p and unsets m's hooks. */
void dt_bench_profile_print(dt_bench_profile *p, dt_model *m, int64_t steps, double step_s);

#endif
