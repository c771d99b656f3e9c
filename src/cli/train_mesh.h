/* dtrain train: the model-parallel flags (--tp K) into the strategy spec (see train_mesh.c). */
#ifndef DT_CLI_TRAIN_MESH_H
#define DT_CLI_TRAIN_MESH_H

#include "dtrain/train.h"

/* --tp K (0 = not given): sets cfg->strategy to "tp(tp=K)", or adds tp=K to a --strategy tp(...)
 * spec; a --strategy of another name is a usage error. zero >= 0 (--zero N given): adds zero=N,
 * ZeRO over the mesh's dp axis (refused with --pp). 0, or the exit status after printing it. */
int dt_cli_mesh_parse(int tp, int zero, dt_train_config *cfg);

#endif
