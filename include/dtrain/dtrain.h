/* libdtrain: the public API in one include: every header of include/dtrain (tests/library.sh
 * checks that none is missing and that a program including only this file compiles as C and C++).
 * Lifetimes have one spelling: a handle (an opaque pointer: dt_model, dt_trainer, ...) is made by a
 * verb that says how (create, open, build, load) and ends with _destroy (NULL: a no-op); a plain
 * struct the caller holds (dt_slab, dt_idx) is set up by _init (or a reader) and ends with _free. */
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
