/* Learning-rate schedules: constant, step decay and cosine decay, each with optional linear
 * warm-up. A pure function of the step, so resumed runs get the same rates. */
#include "dtrain/optim.h"

#include <math.h>
#include <string.h>

dt_status dt_lr_parse(const char *name, dt_lr_kind *kind) {
    if (!strcmp(name, "constant")) *kind = DT_LR_CONSTANT;
    else if (!strcmp(name, "step")) *kind = DT_LR_STEP;
    else if (!strcmp(name, "cosine")) *kind = DT_LR_COSINE;
    else return dt_error(DT_EINVAL, "unknown learning-rate schedule '%s' (choose constant, step or cosine)", name);
    return DT_OK;
}

float dt_lr_at(const dt_lr_schedule *s, int64_t step) {
    if (s->warmup_steps > 0 && step < s->warmup_steps) return s->base_lr * (float)(step + 1) / (float)s->warmup_steps;
    int64_t t = step - (s->warmup_steps > 0 ? s->warmup_steps : 0);
    switch (s->kind) {
    case DT_LR_STEP:
        if (s->step_size <= 0) return s->base_lr;
        return s->base_lr * powf(s->gamma, (float)(t / s->step_size));
    case DT_LR_COSINE: {
        if (s->total_steps <= 0) return s->base_lr;
        double frac = t >= s->total_steps ? 1.0 : (double)t / (double)s->total_steps;
        return s->min_lr + (s->base_lr - s->min_lr) * (float)(0.5 * (1.0 + cos(M_PI * frac)));
    }
    default: return s->base_lr;
    }
}
