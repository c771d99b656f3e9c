/* Internals shared by optim.c and loss_scale.c: the loss scaler's unscale on a device. */
#ifndef DT_OPTIM_INTERNAL_H
#define DT_OPTIM_INTERNAL_H

#include "device/device.h"
#include "dtrain/optim.h"

/* dt_loss_scaler_unscale of n gradients g in device d's memory; dev_flag: one int32_t of d's
 * memory for the non-finite flag (NULL on a host-memory device: a host variable is used). */
bool dt_loss_scaler_unscale_on(dt_loss_scaler *s, dt_dev *d, int32_t *dev_flag, float *g, size_t n);

#endif
