/* Dynamic loss scaling for fp16 training (the scheme of NVIDIA's mixed-precision recipe and
 * torch.cuda.amp.GradScaler): the loss gradient is multiplied by a scale S so small gradients
 * survive fp16's range; after the backward pass (and the gradient sync) the gradients are
 * divided by S. When any of them is inf or NaN the step is skipped and S is halved; after
 * `interval` finite steps in a row S doubles. */
#include "optim/optim_internal.h"

#include <math.h>

dt_loss_scaler dt_loss_scaler_default(void) {
    return (dt_loss_scaler){.scale = 65536.0f, .growth = 2.0f, .backoff = 0.5f, .interval = 2000};
}

dt_status dt_loss_scaler_check(const dt_loss_scaler *s) {
    if (!(s->scale > 0) || !isfinite(s->scale))
        return dt_error(DT_EINVAL, "loss scale %g: need a positive finite scale", s->scale);
    if (!(s->growth >= 1) || !(s->backoff > 0 && s->backoff < 1) || s->interval < 1)
        return dt_error(DT_EINVAL,
                        "loss scaler: growth %g (>= 1), backoff %g (in (0,1)) or interval %d (>= 1) out of range",
                        s->growth, s->backoff, s->interval);
    return DT_OK;
}

bool dt_loss_scaler_unscale(dt_loss_scaler *s, float *g, size_t n) {
    return dt_loss_scaler_unscale_on(s, dt_device_cpu(), NULL, g, n);
}

bool dt_loss_scaler_unscale_on(dt_loss_scaler *s, dt_dev *d, int32_t *dev_flag, float *g, size_t n) {
    int32_t nonfinite = 0;
    d->ops->unscale(d, g, 1.0f / s->scale, n, dev_flag ? dev_flag : &nonfinite); /* only where every value is finite */
    if (dev_flag) d->ops->download(d, &nonfinite, dev_flag, sizeof nonfinite);
    if (nonfinite) {
        s->skipped++;
        s->good = 0;
        s->scale *= s->backoff;
        if (s->scale < 1e-30f) s->scale = 1e-30f;
        return false;
    }
    if (++s->good >= s->interval) {
        s->good = 0;
        float grown = s->scale * s->growth;
        if (isfinite(grown) && grown <= 1e30f) s->scale = grown;
    }
    return true;
}
