/* A client's local training (FedAvg's E epochs of SGD, FedProx's proximal term, FedSGD's one
 * full-batch gradient), the server's weighted accumulation and clipping of updates, and
 * evaluation of the global model. */
#include "fl/fl.h"
#include "dtrain/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FL_EVAL_CHUNK 512

/* One SGD step on samples idx[0..n): params -= lr * (grad + mu (w - global)). */
static dt_status local_step(dt_model *m, const dt_dataset *ds, const uint32_t *idx, int n, const float *global,
                            float lr, float mu, float *x, int32_t *y, double *loss_sum) {
    DT_TRY(dt_dataset_batch(ds, idx, n, x, y));
    dt_feed f = {x, y, n};
    float loss;
    dt_model_zero_grad(m);
    DT_TRY(dt_model_run(m, &f, true, 0, &loss));
    DT_TRY(dt_model_backward_loss(m, 1.0f, NULL, NULL));
    float *w = dt_model_params(m);
    const float *g = dt_model_grads(m);
    size_t np = dt_model_num_params(m);
    for (size_t i = 0; i < np; i++) w[i] -= lr * (g[i] + mu * (w[i] - global[i]));
    *loss_sum += (double)loss * n;
    return DT_OK;
}

dt_status dt_fl_local_train(dt_model *m, const dt_dataset *ds, const float *global, const dt_fl_model_msg *cfg,
                            float *delta, float *loss_out) {
    size_t n = dt_dataset_len(ds), np = dt_model_num_params(m);
    if (n == 0) return dt_error(DT_EINVAL, "fl client: empty local data set");
    if (cfg->n != np) return dt_error(DT_EMISMATCH, "fl client: the server's model has %u parameters, ours %zu", cfg->n, np);
    int batch = cfg->batch == 0 || cfg->batch > n || cfg->epochs == 0 ? (int)n : (int)cfg->batch;
    int epochs = cfg->epochs == 0 ? 1 : (int)cfg->epochs;
    uint32_t *order = malloc(n * sizeof *order);
    float *x = malloc((size_t)batch * dt_model_in_size(m) * sizeof(float));
    int32_t *y = malloc((size_t)batch * sizeof *y);
    dt_status s = order && x && y ? DT_OK : dt_error(DT_ENOMEM, "fl client: out of memory");
    memcpy(dt_model_params(m), global, np * sizeof(float));
    double loss_sum = 0;
    for (int e = 0; e < epochs && s == DT_OK; e++) {
        dt_sampler_order(order, n, cfg->seed ^ ((uint64_t)cfg->round << 20), (uint64_t)e, cfg->epochs > 0);
        loss_sum = 0;
        for (size_t b = 0; b < n && s == DT_OK; b += (size_t)batch) {
            int cnt = (int)(n - b < (size_t)batch ? n - b : (size_t)batch);
            s = local_step(m, ds, order + b, cnt, global, cfg->lr, cfg->mu, x, y, &loss_sum);
        }
    }
    if (s == DT_OK) {
        const float *w = dt_model_params(m);
        for (size_t i = 0; i < np; i++) delta[i] = w[i] - global[i];
        if (loss_out) *loss_out = (float)(loss_sum / (double)n);
    }
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
    int in = dt_model_in_size(m), classes = dt_model_out_size(m);
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
        const float *out = dt_model_output(m);
        for (int i = 0; i < cnt; i++) {
            int best = 0;
            for (int k = 1; k < classes; k++)
                if (out[(size_t)i * classes + k] > out[(size_t)i * classes + best]) best = k;
            correct += best == y[i];
        }
    }
    if (s == DT_OK) {
        *acc = n ? (double)correct / (double)n : 0;
        *loss = n ? loss_sum / (double)n : 0;
    }
    free(idx), free(x), free(y);
    return s;
}
