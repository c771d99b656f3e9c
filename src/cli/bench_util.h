/* Helpers of the benchmark programs that drive the real `dtrain train` command: this
 * executable's path, running a training command and reading its last metrics line. */
#ifndef DT_CLI_BENCH_UTIL_H
#define DT_CLI_BENCH_UTIL_H

#include <stddef.h>

/* Writes the path of the running dtrain executable into out; 0 on success. */
int dt_bench_self(char *out, size_t cap);
/* Runs `dtrain train ARGS --metrics FILE` (args is a shell-quoted string) with output
 * discarded, then copies the last metrics line into line[cap]. 0 on success, else prints why. */
int dt_bench_train_run(const char *args, const char *metrics, char *line, size_t cap);
/* The number after "key": in a JSON line, or -1. */
double dt_bench_json_field(const char *line, const char *key);

/* Prints "# cpu: MODEL (N cores online; load average L)" (with a warning line when the machine
 * is already loaded: load average above half the cores) and "# openblas: CORE" (the kernel OpenBLAS chose) as comment
 * lines of a benchmark table. */
void dt_bench_print_machine(void);
/* Prints a "# warning:" comment line when `ranks` processes outnumber the cores online (they
 * then share cores: speed-ups are bounded by the core count). */
void dt_bench_warn_cores(int ranks);

#endif
