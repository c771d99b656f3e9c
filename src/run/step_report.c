/* Step-based reporting of a training run (dtrain train --log-every, --eval-every, --eval-batches):
 * a record of the training figures every N steps (loss, learning rate, throughput, gradient
 * norm) and an evaluation every M steps, each to on_step and the --metrics file; and the run's
 * progress (its total steps under --max-steps, the epoch's last step, the ETAs) for the bar. */
#include "run/trainer_internal.h"

#include <math.h>
#include <string.h>

float dt_trainer_step_clip(const dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    if (c->clip_norm > 0) return c->clip_norm;
    return c->log_every > 0 && (t->step + 1) % c->log_every == 0 ? INFINITY : 0;
}

void dt_trainer_log_start(dt_trainer *t) {
    memset(&t->log, 0, sizeof t->log);
    t->log.t0 = dt_now();
    t->log.grad_norm = NAN;
}

/* Steps the run trains in all: every epoch's, or max_steps where that ends the run sooner. */
static int64_t total_steps(const dt_trainer *t, int64_t spe) {
    const int64_t all = (int64_t)t->cfg.epochs * spe;
    return t->cfg.max_steps > 0 && t->cfg.max_steps < all ? t->cfg.max_steps : all;
}

void dt_trainer_report_progress(dt_trainer *t, int64_t acc_samples, int64_t acc_steps, float loss, double t0,
                                double now, int64_t spe, bool show) {
    const dt_train_config *c = &t->cfg;
    const int64_t total = total_steps(t, spe), left = total > t->step ? total - t->step : 0;
    const int64_t epoch_end = t->step_in_epoch + left < spe ? t->step_in_epoch + left : spe;
    const double el = now - t0, per = acc_steps > 0 ? el / (double)acc_steps : 0; /* seconds a step */
    const dt_progress_info p = {.epoch = (int)t->epoch,
                                .epochs = c->epochs,
                                .step_in_epoch = t->step_in_epoch,
                                .steps_per_epoch = spe,
                                .global_step = t->step,
                                .loss = loss,
                                .elapsed_s = el,
                                .samples_per_s = el > 0 ? (double)acc_samples * t->dworld / el : 0,
                                .eta_s = per * (double)(epoch_end - t->step_in_epoch),
                                .epoch_steps = epoch_end,
                                .total_steps = total,
                                .run_eta_s = per * (double)left};
    t->progress = p;
    if (show && t->rank == 0 && c->on_progress) c->on_progress(c->cb_ctx, &p);
}

/* Epochs done, fractional. */
static double epochs_done(const dt_trainer *t, int64_t spe) {
    return (double)t->epoch + (spe > 0 ? (double)t->step_in_epoch / (double)spe : 0);
}

/* A record on rank 0: into --metrics, then to on_step. */
static dt_status emit(dt_trainer *t, const dt_step_info *s) {
    if (t->rank != 0) return DT_OK;
    if (t->mf) DT_TRY(dt_trainer_write_step(t->mf, s, t));
    if (t->cfg.on_step) t->cfg.on_step(t->cfg.cb_ctx, s);
    return DT_OK;
}

/* A record of kind k at this step, its figures still to fill in (NaN: none). */
static dt_step_info record(const dt_trainer *t, dt_step_kind k, int64_t spe) {
    return (dt_step_info){.kind = k,
                          .step = t->step,
                          .epoch = epochs_done(t, spe),
                          .wall_s = dt_now() - t->t_start,
                          .lr = dt_lr_at(&t->cfg.lr, t->step > 0 ? t->step - 1 : 0),
                          .train_loss = NAN,
                          .grad_norm = NAN,
                          .test_loss = NAN,
                          .test_acc = NAN,
                          .val_loss = NAN,
                          .val_acc = NAN};
}

/* The DT_STEP_TRAIN record of the steps since the last one: loss and samples summed over the
 * ranks (collective), the throughput over the interval's training time (evaluations left out). */
static dt_status log_record(dt_trainer *t, int64_t spe) {
    double sums[2] = {t->log.loss_sum, (double)t->log.samples};
    if (t->dcomm) DT_TRY(dt_comm_allreduce(t->dcomm, sums, sums, 2, DT_F64, DT_OP_SUM));
    const double busy = dt_now() - t->log.t0 - t->log.paused_s;
    dt_step_info s = record(t, DT_STEP_TRAIN, spe);
    s.train_loss = sums[1] > 0 ? (float)(sums[0] / sums[1]) : NAN;
    s.samples_per_s = busy > 0 ? sums[1] / busy : 0;
    s.grad_norm = t->log.grad_norm, s.steps = t->log.steps;
    dt_trainer_log_start(t);
    return emit(t, &s);
}

/* An evaluation in the middle of an epoch: where the ranks' models differ or are sharded in a way
 * evaluation cannot read (localsgd: averaged; ZeRO-3: gathered) the strategy syncs first, as at
 * an epoch's end; then the test set and the --val-split part, each bounded by --eval-batches. */
static dt_status eval_record(dt_trainer *t, int64_t spe) {
    const double t0 = dt_now();
    dt_strategy *st = t->strategy;
    if (st->ops->sync && !st->sync_for_state_only && !st->evaluates_sharded) DT_TRY(st->ops->sync(st));
    dt_step_info s = record(t, DT_STEP_EVAL, spe);
    DT_TRY(dt_trainer_evaluate_test(t, &s.test_loss, &s.test_acc, &s.eval_samples));
    int64_t n = 0;
    if (t->val) DT_TRY(dt_trainer_evaluate_on(t, t->val, &s.val_loss, &s.val_acc, &n));
    if (!s.eval_samples) s.eval_samples = n;
    s.eval_s = dt_now() - t0;
    t->log.paused_s += s.eval_s;
    return emit(t, &s);
}

dt_status dt_trainer_step_reports(dt_trainer *t, int64_t spe) {
    const dt_train_config *c = &t->cfg;
    if (t->strategy->role != DT_ROLE_REPLICA) return DT_OK; /* ps: the servers report, per epoch */
    if (c->log_every > 0 && t->step % c->log_every == 0) DT_TRY(log_record(t, spe));
    const bool last = t->step_in_epoch >= spe || (c->max_steps && t->step >= c->max_steps);
    if (c->eval_every > 0 && t->step % c->eval_every == 0 && !last) {
        dt_status s = eval_record(t, spe);
        if (s != DT_OK)
            return dt_error_wrap(s, "evaluation after step %lld (`eval_every` %lld)", (long long)t->step,
                                 (long long)c->eval_every);
    }
    return DT_OK;
}

dt_status dt_trainer_epoch_eval_record(dt_trainer *t, const dt_epoch_info *e, int64_t spe, double eval_s) {
    const dt_train_config *c = &t->cfg;
    if (c->eval_every <= 0 || t->step % c->eval_every != 0 || t->strategy->role != DT_ROLE_REPLICA) return DT_OK;
    dt_step_info s = record(t, DT_STEP_EVAL, spe);
    s.test_loss = e->test_loss, s.test_acc = e->test_acc, s.val_loss = e->val_loss, s.val_acc = e->val_acc;
    s.eval_samples = e->eval_samples, s.eval_s = eval_s;
    return emit(t, &s);
}
