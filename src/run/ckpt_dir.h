/* A directory of numbered checkpoints (ckpt-<step>.safetensors): naming, picking the newest
 * valid one for --resume auto (damaged ones are reported and skipped), and keeping the last K. */
#ifndef DT_RUN_CKPT_DIR_H
#define DT_RUN_CKPT_DIR_H

#include "dtrain/core.h"

#include <stddef.h>

/* Writes "DIR/ckpt-<step, 10 digits>.safetensors" into out. */
void dt_ckpt_dir_path(char *out, size_t cap, const char *dir, int64_t step);
/* Creates dir (and parents) if missing; DT_EIO naming it otherwise. */
dt_status dt_ckpt_dir_ensure(const char *dir);
/* Finds the newest checkpoint in dir that validates completely. Each damaged newer one is passed
 * to report(ctx, path, reason) and skipped. *found = false (DT_OK) when none is usable. */
dt_status dt_ckpt_dir_latest(const char *dir, char *out, size_t cap, bool *found,
                             void (*report)(void *ctx, const char *path, const char *reason), void *ctx);
/* Removes "PATH.tmp.<pid>" and "PATH.rR-of-N.tmp.<pid>" (a ZeRO rank's shard) files left by writers
 * that were killed (their pid is gone). */
void dt_ckpt_remove_stale_temps(const char *path);
/* Deletes all but the newest `keep` checkpoints (keep <= 0: keep all) with their shards, and the
 * temp files of killed writers (whole checkpoints and shards). */
dt_status dt_ckpt_dir_prune(const char *dir, int keep);

#endif
