/* TensorBoard event files: scalars per step (loss, accuracy, throughput, learning rate) in the
 * format TensorBoard reads: TFRecord framing (length, masked CRC32C of the length, data, masked
 * CRC32C of the data) around Event protobufs holding Summary values. `dtrain train
 * --tensorboard DIR` writes one per run; `tensorboard --logdir DIR` shows it. */
#ifndef DTRAIN_TENSORBOARD_H
#define DTRAIN_TENSORBOARD_H

#include "dtrain/core.h"
#include "dtrain/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tb_writer dt_tb_writer;

/* Creates dir (and its parents) if needed and a new event file in it,
 * events.out.tfevents.<unix time>.<host>.<pid>.dtrain, starting with the file_version event
 * "brain.Event:2". DT_EIO naming the directory or file when it cannot be written. */
dt_status dt_tb_writer_create(dt_tb_writer **w, const char *dir);
/* The path of the event file (owned by w). */
const char *dt_tb_writer_path(const dt_tb_writer *w);
/* Appends one Event at `step` (wall_time: seconds since the epoch; <= 0 = now) with the scalar
 * summaries tags[i] = values[i], i < n; NaN values are left out. DT_EIO on a write error. */
dt_status dt_tb_writer_scalars(dt_tb_writer *w, int64_t step, double wall_time, const char *const *tags,
                               const float *values, int n);
/* The scalars of a finished epoch at its global step: loss/train, loss/test, accuracy/test,
 * throughput/samples_per_s, lr, time/epoch_s, loss/val and accuracy/val (the test and val ones
 * only with such a set). */
dt_status dt_tb_writer_epoch(dt_tb_writer *w, const dt_epoch_info *e);
/* The scalars of a step record at its step: DT_STEP_TRAIN train/loss, train/lr,
 * train/samples_per_s, train/grad_norm; DT_STEP_EVAL eval/loss_test, eval/accuracy_test,
 * eval/loss_val, eval/accuracy_val (NaN ones left out). */
dt_status dt_tb_writer_step(dt_tb_writer *w, const dt_step_info *s);
/* Flushes (fsync) and closes the file, frees w (NULL: no-op) and returns the first error of
 * any write since the writer was created, or DT_OK. */
dt_status dt_tb_writer_destroy(dt_tb_writer *w);

/* CRC32C (Castagnoli) of p[0..n), continuing crc (0 to start), as TFRecord frames use. */
uint32_t dt_crc32c(uint32_t crc, const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
