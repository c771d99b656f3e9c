/* Validation on a held-out part of the training set (--val-split F, deterministic by the seed),
 * early stopping (--early-stop PATIENCE) and the best epoch's checkpoint (--keep-best); the
 * split and the counters travel in checkpoints, so a resumed run keeps both. Also the
 * weights-only file (--save-weights) and fine-tuning from plain weights (--weights). */
#include "run/trainer_internal.h"

#include "dtrain/io.h"
#include "run/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dt_train_best_path(const char *save, char *out, size_t cap) {
    const char *ext = ".safetensors";
    size_t n = strlen(save), k = strlen(ext);
    if (n > k && !strcmp(save + n - k, ext)) snprintf(out, cap, "%.*s.best%s", (int)(n - k), save, ext);
    else snprintf(out, cap, "%s.best", save);
}

/* The flags' rules, and the split and counters of a resumed run (info: its checkpoint, or NULL). */
dt_status dt_trainer_setup_val(dt_trainer *t, const char *resume, const dt_ckpt_info *info) {
    dt_train_config *c = &t->cfg;
    if (c->weights && resume)
        return dt_error(DT_EINVAL,
                        "`weights` %s starts a new run from plain weights, `resume` %s continues one: pass "
                        "one of them",
                        c->weights, resume);
    if (!(c->val_split >= 0 && c->val_split < 1))
        return dt_error(DT_EINVAL, "`val_split` %g: need a fraction in [0, 1), e.g. 0.1", c->val_split);
    if (c->early_stop < 0) return dt_error(DT_EINVAL, "`early_stop` %d: must not be negative (0 = off)", c->early_stop);
    if (resume && info->val_split > 0) {
        if (c->val_split > 0 && c->val_split != info->val_split)
            return dt_error(DT_EINVAL,
                            "`val_split` %g: %s was trained with `val_split` %g; resume with that (or leave "
                            "it out)",
                            c->val_split, resume, info->val_split);
        c->val_split = info->val_split;
        t->best_val = info->best_val, t->best_epoch = info->best_epoch, t->bad_epochs = info->bad_epochs;
    } else if (resume && c->val_split > 0)
        return dt_error(DT_EINVAL,
                        "`val_split` %g: %s was trained on the whole training set; resume without "
                        "`val_split`",
                        c->val_split, resume);
    if ((c->early_stop > 0 || c->keep_best) && !(c->val_split > 0))
        return dt_error(DT_EINVAL, "`%s` needs `val_split` F (the validation part it watches)",
                        c->early_stop > 0 ? "early_stop" : "keep_best");
    if (c->keep_best && !c->save) return dt_error(DT_EINVAL, "`keep_best` writes next to `save` FILE: add `save` FILE");
    return DT_OK;
}

dt_status dt_trainer_split_val(dt_trainer *t) {
    if (!(t->cfg.val_split > 0)) return DT_OK;
    dt_dataset *train = NULL;
    DT_TRY(dt_dataset_split(t->train, t->cfg.val_split, t->cfg.seed, &train, &t->val));
    if (t->borrowed_data) t->own_train = train; /* cfg.train_set stays the caller's */
    else dt_dataset_destroy(t->train);
    t->train = train;
    return DT_OK;
}

dt_status dt_trainer_validate(dt_trainer *t, dt_epoch_info *e) {
    const dt_train_config *c = &t->cfg;
    e->val_loss = e->val_acc = NAN;
    e->best_epoch = (int)t->best_epoch;
    if (!t->val) return DT_OK;
    int64_t n = 0;
    DT_TRY(dt_trainer_evaluate_on(t, t->val, &e->val_loss, &e->val_acc, &n));
    if (!e->eval_samples) e->eval_samples = n;
    if (e->val_loss < t->best_val) {
        t->best_val = e->val_loss, t->best_epoch = e->epoch, t->bad_epochs = 0;
        if (c->keep_best && t->rank == 0) {
            char path[4200], last[sizeof t->last_ckpt];
            dt_train_best_path(c->save, path, sizeof path);
            memcpy(last, t->last_ckpt, sizeof last);
            DT_TRY(dt_trainer_save(t, path));
            memcpy(t->last_ckpt, last, sizeof last); /* resume goes on from --save, not the best */
        }
    } else t->bad_epochs++;
    e->best_epoch = (int)t->best_epoch;
    if (c->early_stop > 0 && t->bad_epochs >= c->early_stop && !t->early_stopped) {
        t->early_stopped = true;
        dt_trainer_note(t,
                        "early stop after epoch %d: no lower validation loss for %d epochs (best %.4f at epoch "
                        "%lld)",
                        e->epoch, c->early_stop, t->best_val, (long long)t->best_epoch);
    }
    return DT_OK;
}

dt_status dt_trainer_check_io(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    const char *name = t->strategy->ops->name;
    if ((c->val_split > 0 || c->save_weights) && t->strategy->role != DT_ROLE_REPLICA)
        return dt_error(DT_EINVAL, "`%s` works with `strategy` single, ddp or localsgd, not %s",
                        c->val_split > 0 ? "val_split" : "save_weights", name);
    if (!c->save_weights || !t->has_norm) return DT_OK;
    dt_input_norm norm = {.on = true, .mean = t->norm_mean, .std = t->norm_std};
    dt_status s = dt_weights_check_fold(t->model, &norm);
    return s == DT_OK ? s : dt_error_wrap(s, "`save_weights` %s", c->save_weights);
}

/* A sharded strategy (ZeRO): no rank need hold the whole model, so rank 0 assembles it from the
 * pieces every rank's state visitor reports (collective), then writes it as without sharding. */
static dt_status save_gathered_weights(dt_trainer *t, const dt_input_norm *norm) {
    dt_model *m = t->model;
    const size_t np = dt_model_num_params(m), nb = dt_model_num_buffers(m);
    float *slab = t->rank == 0 ? dt_alloc((np + nb + 1) * sizeof(float)) : NULL;
    int32_t ok = t->rank != 0 || slab, all = 0;
    dt_status s = dt_comm_allreduce(t->strategy->comm, &ok, &all, 1, DT_I32, DT_OP_MIN);
    if (s == DT_OK && !all)
        s = dt_error(DT_ENOMEM,
                     "`save_weights` %s: rank 0 has no memory for the whole model's %zu "
                     "values",
                     t->cfg.save_weights, np + nb);
    if (s == DT_OK) s = dt_strategy_gather_model(t->strategy, 0, slab, slab + np);
    if (s == DT_OK && t->rank == 0)
        s = dt_weights_save_slabs(m, slab, slab + np, t->cfg.save_weights, norm, t->C, t->H, t->W);
    dt_free(slab);
    return s == DT_OK ? s : dt_error_wrap(s, "`save_weights` %s", t->cfg.save_weights);
}

dt_status dt_trainer_save_weights(dt_trainer *t) {
    if (!t->cfg.save_weights) return DT_OK;
    dt_input_norm norm = {.on = t->has_norm, .mean = t->norm_mean, .std = t->norm_std};
    if (t->strategy->shards_state && t->strategy->comm) return save_gathered_weights(t, &norm);
    if (t->rank != 0) return DT_OK;
    return dt_weights_save(t->model, t->cfg.save_weights, &norm, t->C, t->H, t->W);
}
