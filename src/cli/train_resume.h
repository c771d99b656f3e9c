/* dtrain train --resume: the training settings the command line leaves out (train_resume.c). */
#ifndef DT_CLI_TRAIN_RESUME_H
#define DT_CLI_TRAIN_RESUME_H

#include "dtrain/train.h"

/* With c->resume (a file, or auto: the newest valid one in c->checkpoint_dir), every training
 * setting argv does not give (--data, --optimizer and its hyper-parameters, --lr and the
 * schedule, --seed, --batch, --grad-accum, --clip, --precision) is set in c to the checkpoint's; a
 * checkpoint of an older version without dtrain.settings gives only its optimizer, seed and
 * batch. So is the strategy of a ddp or localsgd run with options (--compress, --sync-every,
 * --bucket-mb, --allreduce; not a layout: ZeRO, tp, pp, ps) when no flag named one (c->strategy
 * NULL): true then (the caller drops it where only one rank runs). Nothing is changed when there is no checkpoint or it
 * cannot be read (the trainer then reports why). The trainer announces the given settings that differ from the
 * checkpoint's. */
bool dt_cli_resume_settings(int argc, char **argv, dt_train_config *c);

#endif
