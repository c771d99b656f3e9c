/* The training state as pieces of tensors (dt_state_piece), for checkpoints that do not depend on
 * how a strategy lays it out: the replicated visitor (every placed tensor whole, with its
 * optimizer moments) and the strategy's entry point. */
#include "parallel/strategy.h"

#include <stdio.h>

dt_status dt_state_visit_model(dt_model *m, dt_optim *o, dt_state_visit_fn fn, void *ctx) {
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        if (!dt_model_tensor_placed(m, i)) continue;  /* another rank's (pipeline stages) */
        float *base = t->is_buffer ? dt_model_buffers(m) : dt_model_params(m);
        dt_state_piece p = {.name = t->name, .buf = {base + t->offset, DT_F32, t->numel, DT_DEVICE_CPU},
                            .ndim = t->ndim, .numel = t->numel};
        for (int d = 0; d < t->ndim; d++) p.shape[d] = t->shape[d];
        DT_TRY(fn(ctx, &p));
        for (int k = 0; o && !t->is_buffer && k < dt_optim_num_states(o); k++) {
            const char *sname;
            float *st = dt_optim_state(o, k, &sname);
            char name[96];
            snprintf(name, sizeof name, "optim.%s.%s", sname, t->name);
            p.name = name, p.buf.data = st + t->offset, p.is_optim = true;
            DT_TRY(fn(ctx, &p));
        }
    }
    return DT_OK;
}

dt_status dt_strategy_visit_state(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    if (s->ops->visit_state) return s->ops->visit_state(s, fn, ctx);
    return dt_state_visit_model(s->model, s->optim, fn, ctx);
}
