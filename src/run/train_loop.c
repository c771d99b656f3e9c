/* The training loop: epochs of forward / loss / backward / strategy step (gradient sync,
 * clip, optimizer), periodic checkpoints, a stop agreed by every rank on SIGTERM, metrics and
 * progress callbacks. The same loop runs one process or N data-parallel ranks; ps server ranks
 * run the strategy's serve loop instead and server 0 reports the epochs (serve_run); fully
 * asynchronous ps workers train the batches the servers hand out (dynamic_run). */
#include "run/trainer_internal.h"

#include "run/ckpt_dir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Samples in global batch b of the epoch, over all ranks. */
static int global_count(const dt_trainer *t, size_t b) {
    size_t n = dt_trainer_epoch_len(t), gb = (size_t)dt_trainer_step_batch(t) * (size_t)t->dworld, start = b * gb;
    return (int)(start + gb <= n ? gb : n - start);
}

/* Per-epoch accumulators of the step loop. */
typedef struct {
    double loss_sum; /* sum of per-sample losses (this rank) */
    int64_t samples; /* this rank */
    int64_t steps;
    double compute_s, comm_wait_s;
    double sync_bytes, sync_raw_bytes, ef_norm; /* gradient sync (dt_step_stats) */
} epoch_acc;

/* --slow sleep and --balance timing between backward and the sync (dt_step_batch.compute_done). */
static double compute_done(void *ctx, int n, double busy_s) {
    return dt_balance_compute_done(((dt_trainer *)ctx)->balance, n, busy_s);
}

/* One optimizer step on this rank's part b of a global batch, trained by the strategy. The
 * strategy weights the local loss gradient by n_local*world/n_global so that averaging over ranks
 * gives exactly the mean gradient over the global batch (also when the final batch is spread
 * unevenly or the batch is cut by speed); those that step on the local mean (localsgd, ps) use 1. */
static dt_status train_step(dt_trainer *t, const dt_batch *b, epoch_acc *acc) {
    dt_strategy *st = t->strategy;
    st->cur.epoch = t->epoch;
    dt_step_batch sb = {.feed = dt_trainer_feed(b),
                        .n_global = global_count(t, b->index),
                        .world = t->dworld,
                        .accum = t->cfg.grad_accum,
                        .step = t->step,
                        .lr = dt_lr_at(&t->cfg.lr, t->lr_step >= 0 ? t->lr_step : t->step),
                        .clip = dt_trainer_step_clip(t),
                        .compute_done = compute_done,
                        .ctx = t};
    dt_step_result r;
    st->cur.grad_norm = NAN;
    DT_TRY(dt_strategy_train_step(st, &sb, &r));
    t->log.loss_sum += r.loss_sum, t->log.samples += r.n, t->log.steps++; /* --log-every's interval */
    t->log.grad_norm = st->cur.grad_norm;
    DT_TRY(dt_balance_step_end(t->balance, st->data_comm ? st->data_comm : t->dcomm, t->loader));
    acc->loss_sum += r.loss_sum;
    acc->samples += r.n;
    acc->comm_wait_s += r.st.comm_wait_s;
    acc->sync_bytes += r.st.bytes_sent, acc->sync_raw_bytes += r.st.bytes_raw;
    if (r.st.bytes_raw > 0) acc->ef_norm = r.st.ef_norm;
    acc->compute_s += r.compute_s;
    acc->steps++;
    t->step++;
    return DT_OK;
}

/* ---- ps servers: serve, and on server 0 report each epoch once every live worker finished it ---- */
typedef struct {
    dt_trainer *t;
    FILE *mf;
    double t0;
    int64_t step0; /* the step the run started from */
} serve_ctx;

static dt_status serve_epoch(void *ctx, const dt_serve_epoch *r) {
    serve_ctx *sc = ctx;
    dt_trainer *t = sc->t;
    const dt_train_config *c = &t->cfg;
    const int64_t spe = (int64_t)dt_loader_batches(t->loader);
    t->step = r->step; /* the model (assembled by the servers) is the one after this many worker steps */
    t->epoch = r->complete ? r->epoch + 1 : r->epoch;
    t->step_in_epoch = r->complete ? 0 : r->step_in_epoch >= 0 ? r->step_in_epoch : r->step - (r->step / spe) * spe;
    dt_epoch_info e = {.epoch = (int)r->epoch + 1,
                       .global_step = r->step,
                       .train_loss = r->samples > 0 ? (float)(r->loss_sum / (double)r->samples) : NAN,
                       .samples_per_s = r->epoch_s > 0 ? (double)r->samples / r->epoch_s : 0,
                       .epoch_s = r->epoch_s,
                       .world_size = t->world,
                       .global_batch = c->batch * t->dworld,
                       .lr = dt_lr_at(&c->lr, r->step > 0 ? r->step - 1 : 0),
                       .nworkers = r->nworkers,
                       .workers = r->workers,
                       .staleness = r->staleness,
                       .max_clock_gap = r->max_clock_gap,
                       .compute_s = r->busy_s,
                       .comm_wait_s = r->wait_s,
                       .steps = r->pushes};           /* per worker step */
    if (dt_strategy_hands_out_batches(t->strategy)) { /* the schedule follows the rounds of units (see dynamic_run) */
        int64_t at = r->complete ? (r->epoch + 1) * spe : r->epoch * spe + t->step_in_epoch;
        e.lr = dt_lr_at(&c->lr, at > 0 ? at - 1 : 0);
    }
    DT_TRY(dt_trainer_evaluate_test(t, &e.test_loss, &e.test_acc, &e.eval_samples));
    e.val_loss = e.val_acc = NAN;
    e.wall_s = dt_now() - t->t_start;
    if (sc->mf) DT_TRY(dt_trainer_write_metrics(sc->mf, &e, t));
    if (c->on_epoch) c->on_epoch(c->cb_ctx, &e);
    if (c->save) DT_TRY(dt_trainer_save(t, c->save));
    return DT_OK;
}

static void serve_progress(void *ctx, int64_t min_step, int64_t samples, double loss_sum) {
    serve_ctx *sc = ctx;
    const dt_train_config *c = &sc->t->cfg;
    const int64_t spe = (int64_t)dt_loader_batches(sc->t->loader);
    double el = dt_now() - sc->t0;
    int64_t in = min_step % spe, total = (int64_t)c->epochs * spe;
    if (c->max_steps > 0 && c->max_steps < total) total = c->max_steps; /* ps: batches per worker */
    const int64_t left = total > min_step ? total - min_step : 0, end = in + left < spe ? in + left : spe;
    const double per = min_step > sc->step0 ? el / (double)(min_step - sc->step0) : 0; /* seconds a step */
    dt_progress_info p = {.epoch = (int)(min_step / spe),
                          .epochs = c->epochs,
                          .step_in_epoch = in,
                          .steps_per_epoch = spe,
                          .global_step = min_step,
                          .loss = samples ? (float)(loss_sum / (double)samples) : NAN,
                          .elapsed_s = el,
                          .samples_per_s = el > 0 ? (double)samples / el : 0,
                          .eta_s = per * (double)(end - in),
                          .epoch_steps = end,
                          .total_steps = total,
                          .run_eta_s = per * (double)left};
    if (c->on_progress) c->on_progress(c->cb_ctx, &p);
}

static void serve_note(void *ctx, const char *msg) { dt_trainer_note(((serve_ctx *)ctx)->t, "%s", msg); }

static dt_status save_interrupted(dt_trainer *t);

static dt_status serve_run(dt_trainer *t, FILE *mf) {
    const dt_train_config *c = &t->cfg;
    serve_ctx sc = {.t = t, .mf = mf, .t0 = dt_now(), .step0 = t->step};
    int64_t stopped = -1, stopped_epoch = -1, stopped_in = 0;
    const size_t n = dt_trainer_epoch_len(t), B = (size_t)dt_trainer_step_batch(t);
    const bool handed_out = dt_strategy_hands_out_batches(t->strategy); /* ps dynamic: units of B */
    dt_serve_config cfg = {.start_step = t->step,
                           .start_epoch = t->epoch,
                           .start_step_in_epoch = t->step_in_epoch,
                           .steps_per_epoch = (int64_t)dt_loader_batches(t->loader),
                           .epochs = c->epochs,
                           .max_steps = c->max_steps,
                           .batch = (int)B,
                           .want_optim = true,
                           .progress_s = c->progress_interval_s > 0 ? c->progress_interval_s : 0.2,
                           .stop = c->stop,
                           .stopped_step = &stopped,
                           .units_per_epoch = handed_out ? (int64_t)((n + B - 1) / B) : 0,
                           .stopped_epoch = &stopped_epoch,
                           .stopped_in_epoch = &stopped_in,
                           .on_epoch = serve_epoch,
                           .on_progress = serve_progress,
                           .on_note = serve_note,
                           .ctx = &sc};
    dt_status s = t->strategy->ops->serve(t->strategy, &cfg);
    if (s == DT_EINTR && stopped >= 0) { /* server 0 holds the model of an interrupted run */
        const int64_t spe = cfg.steps_per_epoch;
        t->step = stopped, t->epoch = stopped / spe, t->step_in_epoch = stopped % spe;
        if (stopped_epoch >= 0) t->epoch = stopped_epoch, t->step_in_epoch = stopped_in;
        return save_interrupted(t);
    }
    return s;
}

/* Whether the run must stop after this step: the stop flag (a signal) of any rank, agreed by
 * every rank with one tiny allreduce every STOP_VOTE_EVERY steps, so all ranks stop after the
 * same step; a single process checks its flag every step. */
enum { STOP_VOTE_EVERY = 8 };

static dt_status stop_vote(const dt_trainer *t, bool *stop) {
    int32_t mine = t->cfg.stop && *t->cfg.stop, any = mine;
    *stop = false;
    if (t->dcomm) {
        if (t->step % STOP_VOTE_EVERY != 0) return DT_OK;
        DT_TRY(dt_comm_allreduce(t->dcomm, &mine, &any, 1, DT_I32, DT_OP_MAX));
    }
    *stop = any != 0;
    return DT_OK;
}

/* Writes the checkpoint of an interrupted run and returns DT_EINTR saying how to resume. */
static dt_status save_interrupted(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    dt_status s = DT_OK;
    if (c->checkpoint_dir) s = dt_trainer_save_numbered(t); /* syncs by itself */
    else { /* every rank stops here (the stop is agreed): the replicas agree first (localsgd averages,
            * pp gathers the stages on rank 0); sync is collective, as before a numbered save */
        if (t->strategy->ops->sync) s = t->strategy->ops->sync(t->strategy);
        if (s == DT_OK && (t->rank == 0 || t->strategy->shards_state))
            s = dt_trainer_save(t, c->save ? c->save : "dtrain-interrupted.safetensors");
    }
    if (s != DT_OK) return dt_error_wrap(s, "stopped at step %lld but the checkpoint failed", (long long)t->step);
    if (c->checkpoint_dir)
        return dt_error(DT_EINTR,
                        "stopped at step %lld; checkpoint %s; to continue, run the same command with "
                        "`resume` auto (and `checkpoint_dir` %s)",
                        (long long)t->step, t->last_ckpt, c->checkpoint_dir);
    return dt_error(DT_EINTR, "stopped at step %lld; checkpoint %s; to continue, run the same command with `resume` %s",
                    (long long)t->step, t->last_ckpt, t->last_ckpt);
}

/* A fully asynchronous ps worker: trains the batches (units of `batch` samples of the epoch's
 * global order) that server 0 hands out with each answer until none is left, the run stops or
 * max_steps is reached; the first is unit step_in_epoch * workers + worker index (see ps.h). */
static dt_status dynamic_run(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    dt_strategy *st = t->strategy;
    const size_t n = dt_trainer_epoch_len(t), B = (size_t)dt_trainer_step_batch(t);
    const int64_t units = (int64_t)((n + B - 1) / B);
    const dt_unit_plan plan = {
        .epoch = t->epoch, .unit = t->step_in_epoch * t->dworld, .units_per_epoch = units, .epochs = c->epochs};
    int64_t ep, u;
    st->ops->first_unit(st, &plan, &ep, &u); /* ps: unit drank of the plan (overlap: and one ahead) */
    epoch_acc acc = {0};
    bool stop = false;
    while (ep < c->epochs && u >= 0 && !stop) {
        if (c->max_steps && t->step >= c->max_steps) break;
        dt_batch b;
        double tw = dt_now();
        DT_TRY(dt_loader_take(t->loader, (uint64_t)ep, (size_t)u, &b));
        dt_trace_add(&t->trace, "data", 2, tw, dt_now(), t->step);
        t->epoch = ep, t->step_in_epoch = u;
        t->lr_step = ep * (int64_t)dt_loader_batches(t->loader) + u / t->dworld;
        dt_status s = train_step(t, &b, &acc);
        if (s == DT_OK) s = stop_vote(t, &stop);
        if (s != DT_OK)
            return dt_error_wrap(s, "step %lld (epoch %lld, batch %lld of %lld samples)", (long long)t->step,
                                 (long long)ep + 1, (long long)u + 1, (long long)B);
        st->ops->next_unit(st, &ep, &u);
    }
    t->lr_step = -1;
    return stop ? save_interrupted(t) : DT_OK; /* the servers report the epochs and hold the model */
}

/* The steps of one epoch, from the loader's position: returns DT_ENOENT at the epoch's end, at
 * a stop (*stop) or at max_steps; *ckpt_due when a numbered checkpoint is due at the epoch's end. */
static dt_status run_epoch_steps(dt_trainer *t, epoch_acc *acc, double t0, bool *stop, bool *ckpt_due) {
    const dt_train_config *c = &t->cfg;
    const int64_t spe = (int64_t)dt_loader_batches(t->loader);
    double last_progress = 0;
    dt_status s;
    dt_batch b;
    for (;;) {
        double tw = dt_now();
        if ((s = dt_loader_next(t->loader, &b)) != DT_OK) return s;
        dt_trace_add(&t->trace, "data", 2, tw, dt_now(), t->step);
        s = train_step(t, &b, acc);
        if (s == DT_OK) s = stop_vote(t, stop);
        if (s != DT_OK)
            return dt_error_wrap(s, "step %lld (epoch %lld, batch %lld)", (long long)t->step + 1,
                                 (long long)t->epoch + 1, (long long)t->step_in_epoch + 1);
        if (t->resume_path[0] && !t->resume_noted++)
            dt_trainer_note(t, "resumed from %s: training again at step %lld, %.2f s after start", t->resume_path,
                            (long long)t->step, dt_now() - t->t_start);
        t->step_in_epoch++;
        const double now = dt_now();
        const bool show = now - last_progress >= c->progress_interval_s || t->step_in_epoch == spe ||
                          (c->max_steps && t->step >= c->max_steps); /* the bar's last step is drawn */
        if (show) last_progress = now;
        dt_trainer_report_progress(t, acc->samples, acc->steps,
                                   acc->samples ? (float)(acc->loss_sum / (double)acc->samples) : NAN, t0, now, spe,
                                   show);
        if ((s = dt_trainer_step_reports(t, spe)) != DT_OK) return s;
        *ckpt_due = c->checkpoint_dir && ((c->checkpoint_every > 0 && t->step % c->checkpoint_every == 0) ||
                                          (c->checkpoint_secs > 0 && now - t->last_ckpt_time >= c->checkpoint_secs));
        if (*stop || (c->max_steps && t->step >= c->max_steps)) return DT_ENOENT;
        /* a checkpoint at an epoch's last step waits for the epoch's end (so it resumes after it) */
        if (*ckpt_due && t->step_in_epoch < spe) {
            if ((s = dt_trainer_save_numbered(t)) != DT_OK) /* its sync is a collective: say when */
                return dt_error_wrap(s, "checkpoint after step %lld (epoch %lld)", (long long)t->step,
                                     (long long)t->epoch + 1);
            *ckpt_due = false;
        }
    }
}

/* Whether the end of an epoch syncs the strategy: always, except where this rank holds only a
 * part of the model (pipeline stages, tensor parallel) and nothing then reads the whole of it (no
 * test or validation set, no --save or --save-weights): the sync would place and gather it all;
 * and where the sync only gathers checkpoint state (ddp's error feedback, 4 bytes a parameter from
 * every rank) and no --save follows. */
static bool needs_sync(const dt_trainer *t) {
    int n;
    const dt_train_config *c = &t->cfg;
    if (t->strategy->sync_for_state_only) return c->save != NULL;       /* ddp: only the epoch's --save reads it */
    const bool eval_whole = t->test && !t->strategy->evaluates_sharded; /* tp, pp evaluate on their shards */
    return !dt_model_placement(t->model, &n) || eval_whole || t->val || c->save || c->save_weights;
}

/* The end of an epoch on the replicas: sync (localsgd), balance figures, the global training loss,
 * evaluation, the metrics line, the epoch callback and --save. */
static dt_status end_epoch(dt_trainer *t, FILE *mf, const epoch_acc *acc, double epoch_s, double wait0, bool finished,
                           int64_t epoch_steps) {
    const dt_train_config *c = &t->cfg;
    uint64_t axis_bytes[3]; /* what the steps moved, before a sync (tp: the gather) adds to it */
    dt_strategy_axis_bytes(t->strategy, axis_bytes);
    if (t->strategy->ops->sync && needs_sync(t)) DT_TRY(t->strategy->ops->sync(t->strategy));
    DT_TRY(
        dt_balance_epoch(t->balance, t->strategy->data_comm ? t->strategy->data_comm : t->dcomm, epoch_s, t->workers));
    double sums[2] = {acc->loss_sum, (double)acc->samples};
    if (t->dcomm) DT_TRY(dt_comm_allreduce(t->dcomm, sums, sums, 2, DT_F64, DT_OP_SUM));
    dt_epoch_info e = {.epoch = (int)t->epoch + (finished ? 0 : 1),
                       .global_step = t->step,
                       .train_loss = sums[1] > 0 ? (float)(sums[0] / sums[1]) : NAN,
                       .samples_per_s = epoch_s > 0 ? sums[1] / epoch_s : 0,
                       .epoch_s = epoch_s,
                       .data_wait_s = dt_loader_wait_seconds(t->loader) - wait0,
                       .compute_s = acc->compute_s,
                       .comm_wait_s = acc->comm_wait_s,
                       .steps = acc->steps,
                       .world_size = t->world,
                       .epoch_steps = epoch_steps,
                       .steps_per_epoch = (int64_t)dt_loader_batches(t->loader),
                       .global_batch = dt_trainer_step_batch(t) * t->dworld,
                       .lr = dt_lr_at(&c->lr, t->step > 0 ? t->step - 1 : 0),
                       .nworkers = t->dworld,
                       .workers = t->workers,
                       .max_clock_gap = -1,
                       .sync_bytes = acc->sync_bytes,
                       .sync_raw_bytes = acc->sync_raw_bytes,
                       .ef_norm = acc->ef_norm};
    memcpy(e.comm_bytes, axis_bytes, sizeof axis_bytes);
    if (t->strategy->ops->report) t->strategy->ops->report(t->strategy, t->strategy_report, sizeof t->strategy_report);
    const double te = dt_now();
    DT_TRY(dt_trainer_evaluate_test(t, &e.test_loss, &e.test_acc, &e.eval_samples));
    DT_TRY(dt_trainer_validate(t, &e)); /* --val-split, --early-stop, --keep-best */
    e.wall_s = dt_now() - t->t_start;
    if (mf) DT_TRY(dt_trainer_write_metrics(mf, &e, t));
    if (t->rank == 0 && c->on_epoch) c->on_epoch(c->cb_ctx, &e);
    DT_TRY(dt_trainer_epoch_eval_record(t, &e, (int64_t)dt_loader_batches(t->loader), dt_now() - te));
    if ((t->rank == 0 || t->strategy->shards_state) && c->save) DT_TRY(dt_trainer_save(t, c->save));
    return dt_trainer_save_weights(t);
}

/* end_epoch, its time left out of the next --log-every record's throughput. */
static dt_status end_epoch_timed(dt_trainer *t, FILE *mf, const epoch_acc *acc, double epoch_s, double wait0,
                                 bool finished, int64_t epoch_steps) {
    const double t0 = dt_now();
    dt_status s = end_epoch(t, mf, acc, epoch_s, wait0, finished, epoch_steps);
    t->log.paused_s += dt_now() - t0;
    return s;
}

dt_status dt_trainer_run(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    const bool lead = t->rank == 0;
    FILE *mf = NULL;
    if (c->checkpoint_dir && lead) DT_TRY(dt_ckpt_dir_ensure(c->checkpoint_dir));
    DT_TRY(dt_trainer_open_metrics(t, &mf));
    t->mf = mf;
    dt_trainer_log_start(t);
    if (t->strategy->role != DT_ROLE_REPLICA && (c->log_every > 0 || c->eval_every > 0))
        dt_trainer_note(t, "`log_every` / `eval_every`: a ps run reports per epoch only (its servers hold the model)");
    if (t->strategy->role == DT_ROLE_SERVER) { /* ps servers serve instead of stepping */
        dt_status s = serve_run(t, mf);
        t->mf = NULL;
        return dt_trainer_close_metrics(t, mf, s);
    }
    if (t->strategy->role == DT_ROLE_WORKER && dt_strategy_hands_out_batches(t->strategy)) {
        dt_status s = dynamic_run(t);
        t->mf = NULL;
        return dt_trainer_close_metrics(t, mf, s);
    }
    const int64_t spe = (int64_t)dt_loader_batches(t->loader);
    t->last_ckpt_time = dt_now();
    bool stop = false, ckpt_due = false, at_epoch_end = false;
    dt_status s = DT_OK;
    if (c->early_stop > 0 && t->bad_epochs >= c->early_stop) t->early_stopped = true; /* resumed after it */
    while (t->epoch < c->epochs && s == DT_OK && !stop && !t->early_stopped) {
        if (c->max_steps && t->step >= c->max_steps) break;
        if ((s = dt_loader_start_epoch(t->loader, (uint64_t)t->epoch, (size_t)t->step_in_epoch)) != DT_OK) break;
        const double t0 = dt_now(), wait0 = dt_loader_wait_seconds(t->loader);
        epoch_acc acc = {0};
        if ((s = run_epoch_steps(t, &acc, t0, &stop, &ckpt_due)) != DT_ENOENT) break;
        s = DT_OK;
        at_epoch_end = true; /* errors below are reported with the epoch and step */
        const double epoch_s = dt_now() - t0;
        const int64_t epoch_steps = t->step_in_epoch; /* done of this epoch (all of it unless cut short) */
        const bool finished = t->step_in_epoch >= spe;
        if (finished) {
            t->epoch++;
            t->step_in_epoch = 0;
        }
        if (stop) break;
        if (t->strategy->role == DT_ROLE_WORKER) continue; /* ps: the servers report epochs */
        if ((s = end_epoch_timed(t, mf, &acc, epoch_s, wait0, finished, epoch_steps)) != DT_OK) break;
        if (ckpt_due && (s = dt_trainer_save_numbered(t)) != DT_OK) break;
        ckpt_due = false;
        at_epoch_end = false;
    }
    /* tp, pp evaluated on their shards: dt_trainer_model gets the whole model once at the end, as the
     * epochs' evaluation gathered it before (unless keep_sharded, or a --save of the last epoch did) */
    if (s == DT_OK && !stop && t->test && t->strategy->evaluates_sharded && t->strategy->ops->sync &&
        !c->keep_sharded && !c->save && !c->save_weights)
        s = t->strategy->ops->sync(t->strategy);
    if (s != DT_OK && at_epoch_end)
        s = dt_error_wrap(s, "end of epoch %lld (evaluation, metrics, checkpoint) after step %lld",
                          (long long)(t->step_in_epoch ? t->epoch + 1 : t->epoch), (long long)t->step);
    if (s == DT_OK && stop) s = save_interrupted(t);
    else if (s == DT_OK && c->checkpoint_dir && t->saved_step != t->step) s = dt_trainer_save_numbered(t);
    if ((s == DT_OK || s == DT_EINTR) && c->timeline) {
        dt_status ts = dt_trainer_write_timeline(t);
        if (ts != DT_OK) s = ts;
    }
    t->mf = NULL;
    return dt_trainer_close_metrics(t, mf, s);
}
