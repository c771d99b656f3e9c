/* A client's local training (FedAvg's E epochs of SGD, FedProx's proximal term, FedSGD's one
 * full-batch gradient), the server's weighted accumulation and clipping of updates, and
 * evaluation of the global model. The model may live on any device (docs/device.md): the global
 * weights are uploaded, the update downloaded, and on a device whose memory is not the host's the
 * proximal SGD step runs as the device's own primitives (the same arithmetic, bit for bit). */
#include "fl/fl.h"
#include "device/device.h"
#include "dtrain/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FL_EVAL_CHUNK 512

/* The device memory of a round's local training where the model's memory is not the host's:
 * minus the global weights, and the step's scratch (NULL both on the cpu device). */
typedef struct {
    float *neg_global, *tmp;
} dev_round;

/* params -= lr * (grad + mu (w - global)) on the model's device: on the host where its memory is
 * the host's; else as copy, accumulate and scale in the order of that expression (w + (-global)
 * is w - global, and w + (-(lr * t)) is w - lr * t, exactly). */
static void prox_step(dt_model *m, const float *global, float lr, float mu, const dev_round *r) {
    float *w = dt_model_params(m);
    const float *g = dt_model_grads(m);
    size_t np = dt_model_num_params(m);
    dt_dev *d = dt_model_device(m);
    if (!r->tmp) {
        for (size_t i = 0; i < np; i++) w[i] -= lr * (g[i] + mu * (w[i] - global[i]));
        return;
    }
    d->ops->copy(d, r->tmp, w, np * sizeof(float));
    d->ops->accumulate(d, r->tmp, r->neg_global, np); /* w - global */
    d->ops->scale(d, r->tmp, mu, np);
    d->ops->accumulate(d, r->tmp, g, np); /* g + mu (w - global) */
    d->ops->scale(d, r->tmp, -lr, np);
    d->ops->accumulate(d, w, r->tmp, np);
}

/* One SGD step on samples idx[0..n): params -= lr * (grad + mu (w - global)). */
static dt_status local_step(dt_model *m, const dt_dataset *ds, const uint32_t *idx, int n, const float *global,
                            const dt_fl_model_msg *cfg, const dev_round *r, float *x, int32_t *y, double *loss_sum) {
    DT_TRY(dt_dataset_batch(ds, idx, n, x, y));
    dt_feed f = {x, y, n};
    float loss;
    dt_model_zero_grad(m);
    DT_TRY(dt_model_run(m, &f, true, 0, &loss));
    DT_TRY(dt_model_backward_loss(m, 1.0f, NULL, NULL));
    prox_step(m, global, cfg->lr, cfg->mu, r);
    *loss_sum += (double)loss * n;
    return DT_OK;
}

/* The global weights into the model (and, on a device that is not the host's, minus them into
 * r's device memory, with room for the step's scratch). */
static dt_status load_global(dt_model *m, const float *global, dev_round *r) {
    dt_dev *d = dt_model_device(m);
    const size_t np = dt_model_num_params(m), bytes = np * sizeof(float);
    *r = (dev_round){NULL, NULL};
    d->ops->upload(d, dt_model_params(m), global, bytes); /* the cpu device: a memcpy */
    if (d->host_memory) return DT_OK;
    float *neg = malloc(bytes + 1);
    r->neg_global = d->ops->alloc(d, bytes), r->tmp = d->ops->alloc(d, bytes);
    if (!neg || !r->neg_global || !r->tmp) {
        free(neg), d->ops->free(d, r->neg_global), d->ops->free(d, r->tmp);
        *r = (dev_round){NULL, NULL};
        return dt_error(DT_ENOMEM, "fl client: no room for 2 x %zu bytes of the local step on device %s", bytes,
                        d->kind->name);
    }
    for (size_t i = 0; i < np; i++) neg[i] = -global[i];
    d->ops->upload(d, r->neg_global, neg, bytes);
    free(neg);
    return DT_OK;
}

dt_status dt_fl_local_train(dt_model *m, const dt_dataset *ds, const float *global, const dt_fl_model_msg *cfg,
                            float *delta, float *loss_out) {
    size_t n = dt_dataset_len(ds), np = dt_model_num_params(m);
    if (n == 0) return dt_error(DT_EINVAL, "fl client: empty local data set");
    if (cfg->n != np)
        return dt_error(DT_EMISMATCH, "fl client: the server's model has %u parameters, ours %zu", cfg->n, np);
    int batch = cfg->batch == 0 || cfg->batch > n || cfg->epochs == 0 ? (int)n : (int)cfg->batch;
    int epochs = cfg->epochs == 0 ? 1 : (int)cfg->epochs;
    uint32_t *order = malloc(n * sizeof *order);
    float *x = malloc((size_t)batch * dt_model_in_size(m) * sizeof(float));
    int32_t *y = malloc((size_t)batch * sizeof *y);
    dt_status s = order && x && y ? DT_OK : dt_error(DT_ENOMEM, "fl client: out of memory");
    dev_round r = {NULL, NULL};
    if (s == DT_OK) s = load_global(m, global, &r);
    double loss_sum = 0;
    for (int e = 0; e < epochs && s == DT_OK; e++) {
        dt_sampler_order(order, n, cfg->seed ^ ((uint64_t)cfg->round << 20), (uint64_t)e, cfg->epochs > 0);
        loss_sum = 0;
        for (size_t b = 0; b < n && s == DT_OK; b += (size_t)batch) {
            int cnt = (int)(n - b < (size_t)batch ? n - b : (size_t)batch);
            s = local_step(m, ds, order + b, cnt, global, cfg, &r, x, y, &loss_sum);
        }
    }
    if (s == DT_OK) {
        dt_dev *d = dt_model_device(m);
        d->ops->download(d, delta, dt_model_params(m), np * sizeof(float)); /* the new weights, then */
        for (size_t i = 0; i < np; i++) delta[i] -= global[i];              /* w - global in place */
        if (loss_out) *loss_out = (float)(loss_sum / (double)n);
    }
    if (r.tmp) dt_model_device(m)->ops->free(dt_model_device(m), r.tmp);
    if (r.neg_global) dt_model_device(m)->ops->free(dt_model_device(m), r.neg_global);
    free(order), free(x), free(y);
    return s;
}

void dt_fl_accumulate(double *acc, const float *delta, size_t n, double w) {
    for (size_t i = 0; i < n; i++) acc[i] += w * delta[i];
}

double dt_fl_clip(float *delta, size_t n, double clip) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)delta[i] * delta[i];
    double norm = sqrt(ss);
    if (clip > 0 && norm > clip) {
        float k = (float)(clip / norm);
        for (size_t i = 0; i < n; i++) delta[i] *= k;
    }
    return norm;
}

dt_status dt_fl_evaluate(dt_model *m, const dt_dataset *ds, double *acc, double *loss) {
    size_t n = dt_dataset_len(ds);
    int in = dt_model_in_size(m);
    uint32_t *idx = malloc(FL_EVAL_CHUNK * sizeof *idx);
    float *x = malloc((size_t)FL_EVAL_CHUNK * in * sizeof(float));
    int32_t *y = malloc(FL_EVAL_CHUNK * sizeof *y);
    dt_status s = idx && x && y ? DT_OK : dt_error(DT_ENOMEM, "fl evaluate: out of memory");
    size_t correct = 0;
    double loss_sum = 0;
    for (size_t b = 0; b < n && s == DT_OK; b += FL_EVAL_CHUNK) {
        int cnt = (int)(n - b < FL_EVAL_CHUNK ? n - b : FL_EVAL_CHUNK);
        for (int i = 0; i < cnt; i++) idx[i] = (uint32_t)(b + (size_t)i);
        if ((s = dt_dataset_batch(ds, idx, cnt, x, y)) != DT_OK) break;
        dt_feed f = {x, y, cnt};
        float l;
        if ((s = dt_model_run(m, &f, false, 0, &l)) != DT_OK) break;
        loss_sum += (double)l * cnt;
        const int64_t c = dt_model_count_correct(m, y, cnt); /* on a device: counted there, 8 bytes back */
        if (c < 0) {
            s = dt_error(DT_ENOMEM, "fl evaluate: out of memory for a batch's logits");
            break;
        }
        correct += (size_t)c;
    }
    if (s == DT_OK) {
        *acc = n ? (double)correct / (double)n : 0;
        *loss = n ? loss_sum / (double)n : 0;
    }
    free(idx), free(x), free(y);
    return s;
}
