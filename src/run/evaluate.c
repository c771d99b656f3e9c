/* Evaluation: loss and accuracy of a model over a whole data set (sharded over ranks and reduced),
 * for the trainer's epochs and for `dtrain eval`, and loading a checkpoint's model (`dtrain sample`). */
#include "run/trainer_internal.h"

#include "dtrain/models.h"
#include "run/checkpoint.h"

#include <math.h>
#include <stdlib.h>

/* Loss and accuracy of model m on a whole data set, in batches of `batch`; with comm, each rank
 * evaluates its shard and the sums are reduced. With a strategy that evaluates sharded (tp, pp)
 * the shards are the data parts (s->data_rank of data_world): the ranks of a model copy run each
 * batch together through ops->eval_batch, one of them adding its figures. Accuracy counts every
 * row of the output (a label per sample, or a next token per position). */
static dt_status evaluate(dt_model *m, dt_strategy *st, const dt_dataset *ds, int batch, dt_comm *comm, float *loss,
                          float *acc) {
    const bool sharded = st && st->evaluates_sharded && st->ops->eval_batch;
    dt_loader *l = NULL;
    dt_loader_config lc = {.batch = batch, .shuffle = false, .rank = comm ? dt_comm_rank(comm) : 0,
                           .world = comm ? dt_comm_size(comm) : 1, .prefetch = -1};
    if (sharded) lc.rank = st->data_rank, lc.world = st->data_world;
    DT_TRY(dt_loader_create(&l, ds, &lc));
    dt_status s = dt_loader_start_epoch(l, 0, 0);
    double sum_loss = 0;
    int64_t correct = 0, n = 0;
    const int rows = dt_model_out_size(m) / dt_model_classes(m);
    dt_batch b;
    while (s == DT_OK && (s = dt_loader_next(l, &b)) == DT_OK) {
        dt_feed f = dt_trainer_feed(&b);
        if (sharded) {  /* a batch of 0 too: the copy's ranks skip it together */
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
    dt_loader_free(l);
    if (s != DT_ENOENT) return s;
    double sums[3] = {sum_loss, (double)correct, (double)n};
    if (comm) DT_TRY(dt_comm_allreduce(comm, sums, sums, 3, DT_F64, DT_OP_SUM));
    *loss = sums[2] > 0 ? (float)(sums[0] / sums[2]) : NAN;
    *acc = sums[2] > 0 && !dt_dataset_has_targets(ds) ? (float)(sums[1] / (sums[2] * rows)) : NAN;  /* regression: none */
    return DT_OK;
}

dt_status dt_trainer_evaluate(dt_trainer *t, float *loss, float *acc) {
    *loss = *acc = NAN;
    if (!t->test) return DT_OK;
    dt_status s = evaluate(t->model, t->strategy, t->test, t->cfg.batch, t->dcomm, loss, acc);
    if (s == DT_EPEER || s == DT_ETIMEDOUT)
        return dt_error_wrap(s, "dt_trainer_evaluate is collective: every rank of the job must call it (rank %d of %d "
                                "did; each evaluates its shard)", t->rank, t->world);
    return s;
}

dt_status dt_evaluate_checkpoint(const char *checkpoint, const char *data, int batch, float *loss, float *acc,
                                 int64_t *samples, const char **split) {
    dt_ckpt_info info;
    DT_TRY(dt_checkpoint_read_info(checkpoint, &info));
    if (!data && !info.data[0])
        return dt_error(DT_EINVAL, "%s does not record the data set it was trained on (an older checkpoint): "
                        "give the data set to evaluate on", checkpoint);
    if (!data) data = info.data;  /* what it trained on, as dtrain eval without --data */
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
        s = dt_error(DT_EMISMATCH, "%s: model expects inputs %dx%dx%d but --data %s has %dx%dx%d", checkpoint, info.C,
                     info.H, info.W, data, C, H, W);
        goto done;
    }
    if ((s = dt_model_build(&m, info.spec, C, H, W)) != DT_OK) {
        s = dt_error_wrap(DT_EFORMAT, "%s: its dtrain.model_spec", checkpoint); /* the file is wrong */
        goto done;
    }
    if ((s = dt_checkpoint_restore(checkpoint, m, NULL, &info)) != DT_OK) goto done;
    if ((s = dt_trainer_check_loss(m, ds, data)) != DT_OK) goto done;
    /* a label the model has no output for would make the loss NaN (and the accuracy a lie) */
    if (!dt_dataset_has_targets(ds) && (s = dt_dataset_set_classes((dt_dataset *)ds, dt_model_out_size(m))) != DT_OK) {
        s = dt_error_wrap(s, "--data %s does not fit the model of %s (%d outputs)", data, checkpoint,
                          dt_model_out_size(m));
        goto done;
    }
    if (info.has_norm && (s = dt_dataset_set_normalize((dt_dataset *)ds, info.norm_mean, info.norm_std)) != DT_OK)
        goto done;
    s = evaluate(m, NULL, ds, batch, NULL, loss, acc);
    *samples = (int64_t)dt_dataset_len(ds);
done:
    dt_model_free(m);
    dt_dataset_free(train);
    dt_dataset_free(test);
    return s;
}

dt_status dt_model_load(dt_model **m, const char *checkpoint) {
    *m = NULL;
    dt_ckpt_info info;
    DT_TRY(dt_checkpoint_read_info(checkpoint, &info));
    DT_TRY(dt_model_build(m, info.spec, info.C, info.H, info.W));
    dt_status s = dt_checkpoint_restore(checkpoint, *m, NULL, &info);
    if (s != DT_OK) {
        dt_model_free(*m);
        *m = NULL;
    }
    return s;
}

dt_status dt_trainer_evaluate_on(dt_trainer *t, const dt_dataset *ds, float *loss, float *acc) {
    return evaluate(t->model, NULL, ds, t->cfg.batch, t->dcomm, loss, acc);
}

dt_status dt_evaluate_dataset(dt_model *m, const dt_dataset *ds, int batch, float *loss, float *acc) {
    return evaluate(m, NULL, ds, batch, NULL, loss, acc);
}
