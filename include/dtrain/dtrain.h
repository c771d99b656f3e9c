/* libdtrain: the public API in one include: every header of include/dtrain (tests/library.sh
 * checks that none is missing and that a program including only this file compiles as C and C++). */
#ifndef DTRAIN_H
#define DTRAIN_H

#define DTRAIN_VERSION "0.1.0"

#include "dtrain/core.h"
#include "dtrain/kernels.h"
#include "dtrain/nn.h"
#include "dtrain/models.h"
#include "dtrain/optim.h"
#include "dtrain/train.h"
#include "dtrain/workers.h"
#include "dtrain/data.h"
#include "dtrain/safetensors.h"
#include "dtrain/comm.h"
#include "dtrain/io.h"
#include "dtrain/launch.h"
#include "dtrain/train_options.h"
#include "dtrain/tensorboard.h"
#include "dtrain/memplan.h"

#endif
