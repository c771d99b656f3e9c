/* Evaluation on a pipeline's stages (ops->eval_batch, pp.h): each micro-batch of the feed runs
 * forward through the stages as a step's forwards do, without gradients, a kept input or a
 * recomputation: the stage model holds one micro-batch's activations, as in training. The
 * activations travel point to point on the forward communicator; the last stage takes the loss and
 * the correct rows (under tp x pp the vocabulary-parallel ones) and its tp rank 0 reports them.
 * Every stage reads the feed from its own loader (a pipeline's stages load the same samples), so
 * no tokens travel. Nothing of the whole model is placed. On a device the activations travel through
 * host buffers where the comm does not take its memory, and the loss is downloaded (one float). */
#include "device/device.h"
#include "parallel/pp.h"

/* Micro-batch j: samples [lo, lo + n) of f through this stage; the last stage adds its figures. */
static dt_status eval_micro(dt_pp *p, const dt_feed *f, int j, int lo, int n, double *loss_sum, int64_t *correct) {
    dt_model *m = p->m;
    const bool last = p->stage == p->K - 1;
    DT_TRY(dt_model_prepare(m, n, false, 0));
    if (p->stage > 0) {
        dt_status st = dt_pp_recv_model(p, p->fwd, dt_model_node_buffer(m, p->lo - 1), (size_t)n * p->in_vals,
                                        p->stage - 1, j);
        if (st != DT_OK) return dt_pp_link_error(p, st, "evaluation: receiving the activation", j, p->stage - 1);
    }
    const int32_t *y = f->y ? (const int32_t *)f->y + (size_t)lo * p->y_vals : NULL;
    const void *x = p->hooks ? (const void *)dt_tp_hooks_ids(p->hooks, lo)
                             : (const char *)f->x + (size_t)lo * p->x_vals * DT_FEED_VALUE_BYTES;
    const dt_feed mf = {.x = x, .y = last || p->reads_y[p->stage] ? y : NULL, .n = n};
    if (p->hooks) dt_tp_hooks_select(p->hooks, lo, n);
    DT_TRY(dt_model_forward_nodes(m, &mf, p->lo, p->hi));
    if (p->hooks) DT_TRY(dt_tp_hooks_status(p->hooks));
    if (!last) {
        dt_status st = dt_pp_send_model(p, p->fwd, dt_model_node_values(m, p->hi - 1), (size_t)n * p->out_vals,
                                        p->stage + 1, j);
        if (st != DT_OK) return dt_pp_link_error(p, st, "evaluation: sending the activation", j, p->stage + 1);
        p->bytes_sent += (uint64_t)n * p->out_vals * sizeof(float);
        return DT_OK;
    }
    double loss;
    int64_t c = 0;
    if (p->hooks) {
        DT_TRY(dt_tp_hooks_loss(p->hooks, y, n, 1.0f, &loss));
        DT_TRY(dt_tp_hooks_correct(p->hooks, y, n, &c));
    } else {
        float l;
        p->dev->ops->download(p->dev, &l, dt_model_node_values(m, dt_model_loss_node(m)), sizeof l);
        loss = l;
        c = dt_model_count_correct(m, y, n);
    }
    if (p->tr == 0) *loss_sum += loss * n, *correct += c;
    return DT_OK;
}

dt_status dt_pp_eval_batch(dt_strategy *s, const dt_feed *f, double *loss_sum, int64_t *correct, int64_t *n) {
    dt_pp *p = s->impl;
    if (f->n == 0) return DT_OK; /* the whole pipeline has the same samples */
    if (p->hooks) DT_TRY(dt_tp_hooks_map(p->hooks, f->x, 0, f->n, f->n));
    const int M = f->n < p->o.microbatches ? f->n : p->o.microbatches;
    p->live = -1; /* the model holds no step's micro-batch now */
    for (int j = 0; j < M; j++) {
        const int lo = (int)((int64_t)f->n * j / M), hi = (int)((int64_t)f->n * (j + 1) / M);
        DT_TRY(eval_micro(p, f, j, lo, hi - lo, loss_sum, correct));
    }
    if (p->stage == p->K - 1 && p->tr == 0) *n += f->n;
    return DT_OK;
}
