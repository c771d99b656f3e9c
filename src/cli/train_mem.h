/* dtrain train: --zero, --mem-limit and --dry-run (train_mem.c). */
#ifndef DT_CLI_TRAIN_MEM_H
#define DT_CLI_TRAIN_MEM_H

#include "cli/cli.h"
#include "dtrain/train.h"

/* --mem-limit TEXT: bytes, or with a K, M, G suffix (powers of 1024) into *bytes; 0 or the
 * usage exit status after saying what to write. */
int dt_cli_mem_limit_parse(const char *text, size_t *bytes);
/* Applies --mem-limit on this rank once the trainer holds its (sharded) state: 0, or exit 78
 * after naming the limit, the bytes held and what to do. */
int dt_cli_mem_limit_apply(size_t bytes, int rank);
/* --dry-run: prints per rank the bytes of parameters, gradients, optimizer state and
 * activations for ranks data-parallel ranks at ZeRO stage zero, and the total; exit status. */
int dt_cli_dry_run(const dt_train_config *c, int ranks, int zero, double bucket_mb, size_t mem_limit);

#endif
