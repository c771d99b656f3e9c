/* Evaluation: loss and accuracy of a model over a data set, or its first --eval-batches batches
 * (sharded over ranks and reduced, with progress), for the trainer's evaluations and `dtrain
 * eval`, and loading a checkpoint's model (`dtrain sample`). */
#include "run/trainer_internal.h"

#include "dtrain/models.h"
#include "run/checkpoint.h"

#include <math.h>
#include <stdlib.h>

/* How one evaluation runs: in batches of `batch`, over the first max_batches global batches of
 * the set (0: all of it), reporting its progress to the trainer's on_progress on rank 0 when
 * `progress` is set (set names the data set there: "test" or "validation"). */
typedef struct {
    int batch;
    int64_t max_batches;
    const dt_trainer *progress;
    const char *set;
} eval_opts;

/* The progress callback during an evaluation: the trainer's position, and the batch it is at. */
static void eval_progress(const eval_opts *o, int64_t done, int64_t total, double *last) {
    const dt_trainer *t = o->progress;
    const double now = dt_now();
    if (!t || t->rank != 0 || !t->cfg.on_progress) return;
    if (done > 0 && done < total && now - *last < t->cfg.progress_interval_s) return;
    *last = now;
    dt_progress_info p = t->progress;
    p.global_step = t->step; /* ps server 0 reports no training progress of its own */
    p.eval_set = o->set, p.eval_batch = done, p.eval_batches = total;
    t->cfg.on_progress(t->cfg.cb_ctx, &p);
}

/* Loss and accuracy of model m on a data set (or its first o->max_batches global batches); with
 * comm, each rank evaluates its shard and the sums are reduced. With a strategy that evaluates
 * sharded (tp, pp) the shards are the data parts (s->data_rank of data_world): the ranks of a
 * model copy run each batch together through ops->eval_batch, one of them adding its figures.
 * Accuracy counts every row of the output (a label per sample, or a next token per position).
 * *samples (may be NULL) gets the samples evaluated, all ranks. */
static dt_status evaluate(dt_model *m, dt_strategy *st, const dt_dataset *ds, dt_comm *comm, const eval_opts *o,
                          float *loss, float *acc, int64_t *samples) {
    const bool sharded = st && st->evaluates_sharded && st->ops->eval_batch;
    dt_loader *l = NULL;
    dt_loader_config lc = {.batch = o->batch,
                           .shuffle = false,
                           .rank = comm ? dt_comm_rank(comm) : 0,
                           .world = comm ? dt_comm_size(comm) : 1,
                           .prefetch = -1};
    if (sharded) lc.rank = st->data_rank, lc.world = st->data_world;
    const size_t n_all = dt_dataset_len(ds), cap = (size_t)o->max_batches * (size_t)o->batch * (size_t)lc.world;
    if (o->max_batches > 0 && cap < n_all) lc.epoch_len = cap; /* the first batches, the same every time */
    DT_TRY(dt_loader_create(&l, ds, &lc));
    dt_status s = dt_loader_start_epoch(l, 0, 0);
    double sum_loss = 0, last = 0;
    int64_t correct = 0, n = 0, done = 0;
    const int64_t total = (int64_t)dt_loader_batches(l);
    const int rows = dt_model_out_size(m) / dt_model_classes(m);
    dt_batch b;
    eval_progress(o, 0, total, &last);
    while (s == DT_OK && (s = dt_loader_next(l, &b)) == DT_OK) {
        dt_feed f = dt_trainer_feed(&b);
        if (done > 0) eval_progress(o, done, total, &last); /* batches done before this one */
        done++;
        if (sharded) { /* a batch of 0 too: the copy's ranks skip it together */
            s = st->ops->eval_batch(st, &f, &sum_loss, &correct, &n);
            continue;
        }
        if (b.n == 0) continue;
        float bl;
        if ((s = dt_model_run(m, &f, false, 0, &bl)) != DT_OK) break;
        sum_loss += (double)bl * b.n;
        if (!dt_dataset_has_targets(ds)) correct += dt_model_count_correct(m, b.y, b.n);
        n += b.n;
    }
    dt_loader_destroy(l);
    if (s != DT_ENOENT) return s;
    eval_progress(o, total, total, &last);
    double sums[3] = {sum_loss, (double)correct, (double)n};
    if (comm) DT_TRY(dt_comm_allreduce(comm, sums, sums, 3, DT_F64, DT_OP_SUM));
    *loss = sums[2] > 0 ? (float)(sums[0] / sums[2]) : NAN;
    *acc = sums[2] > 0 && !dt_dataset_has_targets(ds) ? (float)(sums[1] / (sums[2] * rows))
                                                      : NAN; /* regression: none */
    if (samples) *samples = (int64_t)sums[2];
    return DT_OK;
}

/* The collective's error of a rank that evaluated alone. */
static dt_status collective_error(const dt_trainer *t, dt_status s) {
    if (s == DT_EPEER || s == DT_ETIMEDOUT)
        return dt_error_wrap(s,
                             "dt_trainer_evaluate is collective: every rank of the job must call it (rank %d of %d "
                             "did; each evaluates its shard)",
                             t->rank, t->world);
    return s;
}

dt_status dt_trainer_evaluate(dt_trainer *t, float *loss, float *acc) {
    *loss = *acc = NAN;
    if (!t->test) /* the same on every rank: no collective is entered */
        return dt_error(DT_EINVAL,
                        "dt_trainer_evaluate: the run has no test set (`data` %s gave none): set "
                        "dt_train_config.test_set, use data with a test part (an IDX directory's t10k files, a "
                        "CSV's *test* sibling, text or tokens with `val_fraction` > 0, npy x_test/y_test), or evaluate "
                        "a data set of your own with dt_evaluate_dataset",
                        t->cfg.data ? t->cfg.data : "(in memory)");
    const eval_opts o = {.batch = t->cfg.batch}; /* the whole set: --eval-batches bounds only training's */
    return collective_error(t, evaluate(t->model, t->strategy, t->test, t->dcomm, &o, loss, acc, NULL));
}

dt_status dt_trainer_evaluate_test(dt_trainer *t, float *loss, float *acc, int64_t *samples) {
    *loss = *acc = NAN;
    *samples = 0;
    if (!t->test) return DT_OK;
    const eval_opts o = {.batch = t->cfg.batch, .max_batches = t->cfg.eval_batches, .progress = t, .set = "test"};
    return collective_error(t, evaluate(t->model, t->strategy, t->test, t->dcomm, &o, loss, acc, samples));
}

dt_status dt_evaluate_checkpoint(const char *checkpoint, const char *data, int batch, float *loss, float *acc,
                                 int64_t *samples, const char **split) {
    return dt_evaluate_checkpoint_on(checkpoint, data, NULL, batch, loss, acc, samples, split);
}

dt_status dt_evaluate_checkpoint_on(const char *checkpoint, const char *data, const char *device, int batch,
                                    float *loss, float *acc, int64_t *samples, const char **split) {
    dt_ckpt_info info;
    DT_TRY(dt_checkpoint_read_info(checkpoint, &info));
    if (!data && !info.data[0])
        return dt_error(DT_EINVAL,
                        "%s does not record the data set it was trained on (an older checkpoint): "
                        "give the data set to evaluate on",
                        checkpoint);
    if (!data) data = info.data; /* what it trained on, as dtrain eval without --data */
    dt_dataset *train = NULL, *test = NULL;
    dt_model *m = NULL;
    /* text: the part the run held out (its --val-fraction; 0.1 in checkpoints that do not say) */
    dt_status s = dt_trainer_open_data(data, info.spec, info.val_fraction > 0 ? info.val_fraction : 0.1, &train, &test);
    if (s != DT_OK) return s;
    const dt_dataset *ds = test ? test : train;
    *split = test ? "test" : "train";
    int C, H, W;
    dt_dataset_shape(ds, &C, &H, &W);
    if (C != info.C || H != info.H || W != info.W) {
        s = dt_error(DT_EMISMATCH, "%s: model expects inputs %dx%dx%d but `data` %s has %dx%dx%d", checkpoint, info.C,
                     info.H, info.W, data, C, H, W);
        goto done;
    }
    if ((s = dt_model_build(&m, info.spec, C, H, W)) != DT_OK) {
        s = dt_error_wrap(DT_EFORMAT, "%s: its dtrain.model_spec", checkpoint); /* the file is wrong */
        goto done;
    }
    DT_TRY_GOTO(s = dt_model_to_device(&m, device), done);
    DT_TRY_GOTO(s = dt_checkpoint_restore(checkpoint, m, NULL, &info), done);
    DT_TRY_GOTO(s = dt_trainer_check_loss(m, ds, data), done);
    /* a label the model has no output for would make the loss NaN (and the accuracy a lie) */
    if (!dt_dataset_has_targets(ds) && (s = dt_dataset_set_classes((dt_dataset *)ds, dt_model_out_size(m))) != DT_OK) {
        s = dt_error_wrap(s, "`data` %s does not fit the model of %s (%d outputs)", data, checkpoint,
                          dt_model_out_size(m));
        goto done;
    }
    if (info.has_norm) DT_TRY_GOTO(s = dt_dataset_set_normalize((dt_dataset *)ds, info.norm_mean, info.norm_std), done);
    const eval_opts o = {.batch = batch};
    s = evaluate(m, NULL, ds, NULL, &o, loss, acc, NULL);
    *samples = (int64_t)dt_dataset_len(ds);
done:
    dt_model_destroy(m);
    dt_dataset_destroy(train);
    dt_dataset_destroy(test);
    return s;
}

dt_status dt_model_load(dt_model **m, const char *checkpoint) {
    *m = NULL;
    dt_ckpt_info info;
    DT_TRY(dt_checkpoint_read_info(checkpoint, &info));
    DT_TRY(dt_model_build(m, info.spec, info.C, info.H, info.W));
    dt_status s = dt_checkpoint_restore(checkpoint, *m, NULL, &info);
    if (s != DT_OK) {
        dt_model_destroy(*m);
        *m = NULL;
    }
    return s;
}

dt_status dt_trainer_evaluate_on(dt_trainer *t, const dt_dataset *ds, float *loss, float *acc, int64_t *samples) {
    const eval_opts o = {.batch = t->cfg.batch, .max_batches = t->cfg.eval_batches, .progress = t, .set = "validation"};
    return evaluate(t->model, NULL, ds, t->dcomm, &o, loss, acc, samples);
}

dt_status dt_evaluate_dataset(dt_model *m, const dt_dataset *ds, int batch, float *loss, float *acc) {
    const eval_opts o = {.batch = batch};
    return evaluate(m, NULL, ds, NULL, &o, loss, acc, NULL);
}
