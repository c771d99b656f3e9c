/* dtrain train: the model-parallel flags (--tp K) into the strategy spec (see train_mesh.c). */
#ifndef DT_CLI_TRAIN_MESH_H
#define DT_CLI_TRAIN_MESH_H

#include "dtrain/train.h"

/* The flags tensor parallelism takes. */
typedef struct {
    int tp;            /* --tp K (0 = not given) */
    int zero;          /* --zero N (-1 = not given): ZeRO over the mesh's dp axis */
    double bucket_mb;  /* --bucket-mb MB (0 = not given): the dp axis's gradient buckets */
    bool implicit_ddp; /* cfg->strategy is the ddp(...) that --compress / --allreduce made */
} dt_cli_mesh_flags;

/* --tp K: sets cfg->strategy to "tp(tp=K)", or adds tp=K to a --strategy tp(...) or pp(...) spec
 * (pipeline stages of tp shards); a --strategy of another name is a usage error. zero becomes
 * tp's or pp's option (pp checks it before any rank starts), bucket_mb tp's (refused with --pp).
 * 0, or the exit status after printing. */
int dt_cli_mesh_parse(const dt_cli_mesh_flags *f, dt_train_config *cfg);

#endif
