/* The cuda device (--device cuda, cuda:N) for code beside it that needs its CUDA objects: the NCCL
 * transport (src/comm/) takes its streams, and the device's tests. Everything else reaches the
 * device through device/device.h only. Including this needs the CUDA toolkit's headers (a build
 * with CUDA=1, which adds them to the include path of src/device/cuda/ and whoever asks).
 *
 * Streams: the device runs every kernel, upload, copy and fill on its compute stream, in call
 * order. The comm stream is for collectives on device memory: before one reads a gradient the
 * compute stream wrote, call dt_cuda_comm_after_compute; before a kernel reads what a collective
 * wrote, dt_cuda_compute_after_comm. Both only record an event and make the other stream wait on
 * it: the host never blocks. download and synchronize wait for the compute stream (synchronize for
 * the comm stream too). */
#ifndef DT_DEVICE_CUDA_H
#define DT_DEVICE_CUDA_H

#include "device/device.h"

#include <cuda_runtime_api.h>

/* Whether d is a cuda device. */
bool dt_cuda_is(const dt_dev *d);
/* The CUDA ordinal of d (cudaSetDevice's number). */
int dt_cuda_ordinal(const dt_dev *d);
/* d's compute and comm streams (either pointer may be NULL). */
void dt_cuda_streams(const dt_dev *d, cudaStream_t *compute, cudaStream_t *comm);
/* The comm stream waits for everything enqueued on the compute stream so far. */
void dt_cuda_comm_after_compute(dt_dev *d);
/* The compute stream waits for everything enqueued on the comm stream so far. */
void dt_cuda_compute_after_comm(dt_dev *d);

#endif
