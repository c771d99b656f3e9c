/* Dynamic loss scaling for fp16 training (the scheme of NVIDIA's mixed-precision recipe and
 * torch.cuda.amp.GradScaler): the loss gradient is multiplied by a scale S so small gradients
 * survive fp16's range; after the backward pass (and the gradient sync) the gradients are
 * divided by S. When any of them is inf or NaN the step is skipped and S is halved; after
 * `interval` finite steps in a row S doubles. */
#include "dtrain/optim.h"

#include <math.h>

#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")

dt_loss_scaler dt_loss_scaler_default(void) {
    return (dt_loss_scaler){.scale = 65536.0f, .growth = 2.0f, .backoff = 0.5f, .interval = 2000};
}

dt_status dt_loss_scaler_check(const dt_loss_scaler *s) {
    if (!(s->scale > 0) || !isfinite(s->scale)) return dt_error(DT_EINVAL, "loss scale %g: need a positive finite scale", s->scale);
    if (!(s->growth >= 1) || !(s->backoff > 0 && s->backoff < 1) || s->interval < 1)
        return dt_error(DT_EINVAL, "loss scaler: growth %g (>= 1), backoff %g (in (0,1)) or interval %d (>= 1) out of range",
                        s->growth, s->backoff, s->interval);
    return DT_OK;
}

/* true when every g[i] is finite (0 * inf and 0 * NaN are NaN: one vectorisable pass) */
static bool all_finite(const float *restrict g, size_t n) {
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += 0.0f * g[i + j];
    float s = 0;
    for (; i < n; i++) s += 0.0f * g[i];
    for (int j = 0; j < 16; j++) s += acc[j];
    return s == 0.0f;
}

bool dt_loss_scaler_unscale(dt_loss_scaler *s, float *g, size_t n) {
    if (!all_finite(g, n)) {
        s->skipped++;
        s->good = 0;
        s->scale *= s->backoff;
        if (s->scale < 1e-30f) s->scale = 1e-30f;
        return false;
    }
    const float inv = 1.0f / s->scale;
    for (size_t i = 0; i < n; i++) g[i] *= inv;
    if (++s->good >= s->interval) {
        s->good = 0;
        float grown = s->scale * s->growth;
        if (isfinite(grown) && grown <= 1e30f) s->scale = grown;
    }
    return true;
}
