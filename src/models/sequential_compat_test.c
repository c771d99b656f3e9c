/* The sequential spec on the graph equals, bit for bit, the chain executor it replaced: this
 * file keeps that executor (the pre-graph src/nn/model.c, frozen, on the same kernels) as an
 * independent reference. For the mlp and cnn presets and a stack of every layer kind, both start
 * from the same parameters and take SGD steps on the same batches: outputs, every gradient,
 * batchnorm buffers and the parameters after the steps must match exactly (memcmp). */
#include "core/test.h"
#include "backend/layers.h"
#include "dtrain/models.h"
#include "dtrain/optim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char name[32];
    bool is_buffer;
    int layer;
    size_t offset, numel;
    int ndim;
    int64_t shape[4];
} ref_param_info;

typedef void (*ref_grad_ready_fn)(void *ctx, size_t offset, size_t n);
typedef struct ref_model ref_model;
static void ref_free(ref_model *m);

typedef struct {
    dt_layer_spec s;
    int C, H, W;                   /* input shape per sample */
    int OC, OH, OW;                /* output shape per sample */
    size_t in_n, out_n;            /* values per sample */
    size_t w_off, w_n, b_off, b_n; /* params slab (b_n = 0: no bias) */
    size_t buf_off;                /* buffers slab: running mean (C), running var (C) */
    float *out;                    /* activation (B, out_n); aliases the input for flatten and fused relu */
    bool fused;                    /* relu directly before a maxpool: the pool runs first and applies the relu to
                                    * its 4x smaller output (identical values and gradients: relu is monotone) */
    float *aux;                    /* per-layer saved values: mean/rstd (norms) */
    int32_t *argmax;               /* maxpool */
    uint8_t *mask;                 /* dropout */
} layer_rt;

struct ref_model {
    int n;
    layer_rt *L;
    int in_C, in_H, in_W;
    char spec[1024];
    dt_slab params, grads, buffers;
    int ntensors;
    ref_param_info *tensors;
    uint64_t seed;
    /* per-batch state */
    int cap_B; /* activations sized for this batch */
    int B;     /* batch of the last forward */
    bool train;
    uint64_t step;
    const float *x; /* input of the last forward (caller-owned) */
    float *gbuf[2]; /* ping-pong activation-gradient buffers */
    float *work;    /* conv workspace */
    size_t work_n;
};

static bool has_params(const layer_rt *l) { return l->w_n > 0; }

static void add_tensor(ref_model *m, int layer, const char *suffix, bool is_buffer, size_t off, size_t numel, int ndim,
                       const int64_t *shape) {
    ref_param_info *t = &m->tensors[m->ntensors++];
    snprintf(t->name, sizeof t->name, "%d.%s", layer, suffix);
    t->is_buffer = is_buffer;
    t->layer = layer;
    t->offset = off;
    t->numel = numel;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
}

/* Infers output shapes and assigns slab offsets. */
static dt_status layout(ref_model *m) {
    int C = m->in_C, H = m->in_H, W = m->in_W;
    size_t np = 0, nb = 0;
    m->tensors = calloc((size_t)m->n * 4, sizeof *m->tensors);
    if (!m->tensors) return dt_error(DT_ENOMEM, "model: out of memory");
    for (int i = 0; i < m->n; i++) {
        layer_rt *l = &m->L[i];
        const dt_layer_spec *s = &l->s;
        l->C = C, l->H = H, l->W = W;
        l->in_n = (size_t)C * H * W;
        int OC = C, OH = H, OW = W;
        switch (s->kind) {
        case DT_LAYER_LINEAR: {
            OC = s->out, OH = 1, OW = 1;
            l->w_off = np, l->w_n = (size_t)s->out * l->in_n, np += l->w_n;
            int64_t shp[2] = {s->out, (int64_t)l->in_n};
            add_tensor(m, i, "weight", false, l->w_off, l->w_n, 2, shp);
            if (s->bias) {
                l->b_off = np, l->b_n = (size_t)s->out, np += l->b_n;
                add_tensor(m, i, "bias", false, l->b_off, l->b_n, 1, shp);
            }
            break;
        }
        case DT_LAYER_CONV2D: {
            OH = (H + 2 * s->pad - s->k) / s->stride + 1;
            OW = (W + 2 * s->pad - s->k) / s->stride + 1;
            if (H + 2 * s->pad < s->k || W + 2 * s->pad < s->k)
                return dt_error(DT_EINVAL, "model spec: layer %d conv(%d,%d) kernel is larger than its %dx%d input", i,
                                s->out, s->k, H, W);
            OC = s->out;
            l->w_off = np, l->w_n = (size_t)s->out * C * s->k * s->k, np += l->w_n;
            int64_t shp[4] = {s->out, C, s->k, s->k};
            add_tensor(m, i, "weight", false, l->w_off, l->w_n, 4, shp);
            if (s->bias) {
                l->b_off = np, l->b_n = (size_t)s->out, np += l->b_n;
                add_tensor(m, i, "bias", false, l->b_off, l->b_n, 1, shp);
            }
            break;
        }
        case DT_LAYER_MAXPOOL2D:
        case DT_LAYER_AVGPOOL2D:
            if (H < s->k || W < s->k)
                return dt_error(DT_EINVAL, "model spec: layer %d pool(%d) window is larger than its %dx%d input", i,
                                s->k, H, W);
            OH = (H - s->k) / s->stride + 1;
            OW = (W - s->k) / s->stride + 1;
            break;
        case DT_LAYER_FLATTEN: OC = C * H * W, OH = 1, OW = 1; break;
        case DT_LAYER_LAYERNORM: {
            int64_t shp[1] = {(int64_t)l->in_n};
            l->w_off = np, l->w_n = l->in_n, np += l->w_n;
            add_tensor(m, i, "weight", false, l->w_off, l->w_n, 1, shp);
            l->b_off = np, l->b_n = l->in_n, np += l->b_n;
            add_tensor(m, i, "bias", false, l->b_off, l->b_n, 1, shp);
            break;
        }
        case DT_LAYER_BATCHNORM2D: {
            int64_t shp[1] = {C};
            l->w_off = np, l->w_n = (size_t)C, np += l->w_n;
            add_tensor(m, i, "weight", false, l->w_off, l->w_n, 1, shp);
            l->b_off = np, l->b_n = (size_t)C, np += l->b_n;
            add_tensor(m, i, "bias", false, l->b_off, l->b_n, 1, shp);
            l->buf_off = nb;
            add_tensor(m, i, "running_mean", true, nb, (size_t)C, 1, shp);
            add_tensor(m, i, "running_var", true, nb + (size_t)C, (size_t)C, 1, shp);
            nb += 2 * (size_t)C;
            break;
        }
        default: break;
        }
        if (OH < 1 || OW < 1) return dt_error(DT_EINVAL, "model spec: layer %d has an empty output", i);
        l->OC = OC, l->OH = OH, l->OW = OW;
        l->out_n = (size_t)OC * OH * OW;
        C = OC, H = OH, W = OW;
    }
    for (int i = 0; i + 2 < m->n; i++) /* not when the pool is the last layer (its gradient is the caller's) */
        m->L[i].fused = m->L[i].s.kind == DT_LAYER_RELU && m->L[i + 1].s.kind == DT_LAYER_MAXPOOL2D;
    DT_TRY(dt_slab_init(&m->params, np));
    DT_TRY(dt_slab_init(&m->grads, np));
    DT_TRY(dt_slab_init(&m->buffers, nb ? nb : 1));
    m->buffers.n = nb;
    /* batchnorm running_var starts at 1 */
    for (int i = 0; i < m->n; i++)
        if (m->L[i].s.kind == DT_LAYER_BATCHNORM2D)
            for (int c = 0; c < m->L[i].C; c++) m->buffers.data[m->L[i].buf_off + (size_t)m->L[i].C + c] = 1.0f;
    return DT_OK;
}

static dt_status ref_create(ref_model **out, const dt_layer_spec *layers, int n, int C, int H, int W) {
    *out = NULL;
    if (n <= 0 || n > DT_MAX_LAYERS) return dt_error(DT_EINVAL, "model: %d layers (need 1..%d)", n, DT_MAX_LAYERS);
    if (C <= 0 || H <= 0 || W <= 0) return dt_error(DT_EINVAL, "model: bad input shape %dx%dx%d", C, H, W);
    ref_model *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ENOMEM, "model: out of memory");
    m->n = n;
    m->in_C = C, m->in_H = H, m->in_W = W;
    m->L = calloc((size_t)n, sizeof *m->L);
    if (!m->L) {
        free(m);
        return dt_error(DT_ENOMEM, "model: out of memory");
    }
    for (int i = 0; i < n; i++) m->L[i].s = layers[i];
    dt_status s = layout(m);
    if (s != DT_OK) {
        ref_free(m);
        return s;
    }
    dt_spec_format(m->spec, sizeof m->spec, layers, n);
    *out = m;
    return DT_OK;
}

static void free_activations(ref_model *m) {
    for (int i = 0; i < m->n; i++) {
        layer_rt *l = &m->L[i];
        if (l->s.kind != DT_LAYER_FLATTEN && !l->fused) dt_free(l->out);
        dt_free(l->aux);
        dt_free(l->argmax);
        dt_free(l->mask);
        l->out = NULL, l->aux = NULL, l->argmax = NULL, l->mask = NULL;
    }
    dt_free(m->gbuf[0]);
    dt_free(m->gbuf[1]);
    dt_free(m->work);
    m->gbuf[0] = m->gbuf[1] = m->work = NULL;
    m->cap_B = 0;
}

static void ref_free(ref_model *m) {
    if (!m) return;
    if (m->L) free_activations(m);
    free(m->L);
    free(m->tensors);
    dt_slab_free(&m->params);
    dt_slab_free(&m->grads);
    dt_slab_free(&m->buffers);
    free(m);
}

/* (Re)allocates activation memory for batch B. */
static dt_status ensure_batch(ref_model *m, int B) {
    if (B <= m->cap_B) return DT_OK;
    free_activations(m);
    size_t maxact = (size_t)m->in_C * m->in_H * m->in_W, work = 0;
    for (int i = 0; i < m->n; i++) {
        layer_rt *l = &m->L[i];
        size_t outs = (size_t)B * l->out_n;
        if (l->out_n > maxact) maxact = l->out_n;
        /* flatten aliases its input (set in forward) */
        if (l->s.kind != DT_LAYER_FLATTEN && !l->fused && !(l->out = dt_alloc(outs * sizeof(float)))) goto oom;
        switch (l->s.kind) {
        case DT_LAYER_MAXPOOL2D:
            if (!(l->argmax = dt_alloc(outs * sizeof(int32_t)))) goto oom;
            break;
        case DT_LAYER_DROPOUT:
            if (!(l->mask = dt_alloc(outs))) goto oom;
            break;
        case DT_LAYER_LAYERNORM:
            if (!(l->aux = dt_alloc(2 * (size_t)B * sizeof(float)))) goto oom;
            break;
        case DT_LAYER_BATCHNORM2D:
            if (!(l->aux = dt_alloc(2 * (size_t)l->C * sizeof(float)))) goto oom;
            break;
        case DT_LAYER_CONV2D: {
            size_t w = dt_conv2d_workspace(B, l->C, l->H, l->W, l->s.out, l->s.k, l->s.stride, l->s.pad);
            if (w > work) work = w;
            break;
        }
        default: break;
        }
    }
    for (int k = 0; k < 2; k++)
        if (!(m->gbuf[k] = dt_alloc((size_t)B * maxact * sizeof(float)))) goto oom;
    if (work && !(m->work = dt_alloc(work * sizeof(float)))) goto oom;
    m->work_n = work;
    m->cap_B = B;
    return DT_OK;
oom:
    free_activations(m);
    return dt_error(DT_ENOMEM, "model: cannot allocate activations for batch %d", B);
}

static void ref_init(ref_model *m, uint64_t seed) {
    m->seed = seed;
    float *p = m->params.data;
    for (int i = 0; i < m->n; i++) {
        layer_rt *l = &m->L[i];
        uint64_t kw = dt_rng_key(DT_RNG_INIT, (uint64_t)i * 2), kb = dt_rng_key(DT_RNG_INIT, (uint64_t)i * 2 + 1);
        switch (l->s.kind) {
        case DT_LAYER_LINEAR:
        case DT_LAYER_CONV2D: {
            int fan_in = l->s.kind == DT_LAYER_LINEAR ? (int)l->in_n : l->C * l->s.k * l->s.k;
            dt_init_kaiming_uniform(p + l->w_off, l->w_n, fan_in, seed, kw);
            if (l->b_n) dt_init_kaiming_uniform(p + l->b_off, l->b_n, fan_in, seed, kb);
            break;
        }
        case DT_LAYER_LAYERNORM:
        case DT_LAYER_BATCHNORM2D:
            for (size_t j = 0; j < l->w_n; j++) p[l->w_off + j] = 1.0f;
            memset(p + l->b_off, 0, l->b_n * sizeof(float));
            break;
        default: break;
        }
    }
}

static size_t ref_num_params(const ref_model *m) { return m->params.n; }
float *ref_params(ref_model *m) { return m->params.data; }
float *ref_grads(ref_model *m) { return m->grads.data; }
float *ref_buffers(ref_model *m) { return m->buffers.data; }
static void ref_zero_grad(ref_model *m) { memset(m->grads.data, 0, m->grads.n * sizeof(float)); }

static dt_status ref_forward(ref_model *m, const float *x, int B, bool train, uint64_t step, const float **out) {
    if (B <= 0) return dt_error(DT_EINVAL, "model forward: batch %d must be positive", B);
    DT_TRY(ensure_batch(m, B));
    m->B = B, m->train = train, m->step = step, m->x = x;
    const float *p = m->params.data;
    const float *in = x;
    for (int i = 0; i < m->n; i++) {
        layer_rt *l = &m->L[i];
        const dt_layer_spec *s = &l->s;
        size_t n_out = (size_t)B * l->out_n;
        switch (s->kind) {
        case DT_LAYER_LINEAR:
            dt_linear_forward(l->out, in, p + l->w_off, l->b_n ? p + l->b_off : NULL, B, (int)l->in_n, s->out);
            break;
        case DT_LAYER_CONV2D:
            dt_conv2d_forward(l->out, in, p + l->w_off, l->b_n ? p + l->b_off : NULL, m->work, B, l->C, l->H, l->W,
                              s->out, s->k, s->stride, s->pad);
            break;
        case DT_LAYER_MAXPOOL2D:
            dt_maxpool2d_forward(l->out, l->argmax, in, B, l->C, l->H, l->W, s->k, s->stride);
            if (i > 0 && m->L[i - 1].fused) dt_relu_forward(l->out, l->out, n_out);
            break;
        case DT_LAYER_AVGPOOL2D: dt_avgpool2d_forward(l->out, in, B, l->C, l->H, l->W, s->k, s->stride); break;
        case DT_LAYER_RELU:
            if (l->fused) l->out = (float *)in; /* the next maxpool applies it */
            else dt_relu_forward(l->out, in, n_out);
            break;
        case DT_LAYER_GELU: dt_gelu_forward(l->out, in, n_out); break;
        case DT_LAYER_TANH: dt_tanh_forward(l->out, in, n_out); break;
        case DT_LAYER_SIGMOID: dt_sigmoid_forward(l->out, in, n_out); break;
        case DT_LAYER_DROPOUT:
            if (train && s->p > 0)
                dt_dropout_forward(l->out, l->mask, in, n_out, s->p, m->seed,
                                   dt_rng_key(DT_RNG_DROPOUT, step * 256 + (uint64_t)i));
            else memcpy(l->out, in, n_out * sizeof(float));
            break;
        case DT_LAYER_FLATTEN: l->out = (float *)in; break;
        case DT_LAYER_LAYERNORM:
            dt_layernorm_forward(l->out, l->aux, l->aux + B, in, p + l->w_off, p + l->b_off, B, (int)l->in_n, s->eps);
            break;
        case DT_LAYER_BATCHNORM2D: {
            float *rm = m->buffers.data + l->buf_off, *rv = rm + l->C;
            if (train)
                dt_batchnorm2d_forward_train(l->out, l->aux, l->aux + l->C, rm, rv, in, p + l->w_off, p + l->b_off, B,
                                             l->C, l->H * l->W, s->momentum, s->eps);
            else
                dt_batchnorm2d_forward_eval(l->out, in, p + l->w_off, p + l->b_off, rm, rv, B, l->C, l->H * l->W,
                                            s->eps);
            break;
        }
        default: break; /* graph-only ops never reach the chain executor */
        }
        in = l->out;
    }
    *out = in;
    return DT_OK;
}

static dt_status ref_backward(ref_model *m, const float *dout, ref_grad_ready_fn hook, void *ctx) {
    if (m->B <= 0) return dt_error(DT_EINVAL, "model backward: no forward pass to differentiate");
    const int B = m->B;
    const float *p = m->params.data;
    float *g = m->grads.data;
    /* the first layer that owns parameters bounds how far back gradients must flow */
    int first = m->n;
    for (int i = 0; i < m->n; i++)
        if (has_params(&m->L[i])) {
            first = i;
            break;
        }
    const float *gout = dout;
    int k = 0;
    for (int i = m->n - 1; i >= first; i--) {
        layer_rt *l = &m->L[i];
        const dt_layer_spec *s = &l->s;
        const float *in = i ? m->L[i - 1].out : m->x;
        float *gin = i > first ? m->gbuf[k] : NULL;
        size_t n_out = (size_t)B * l->out_n;
        switch (s->kind) {
        case DT_LAYER_LINEAR:
            dt_linear_backward(gin, g + l->w_off, l->b_n ? g + l->b_off : NULL, gout, in, p + l->w_off, B, (int)l->in_n,
                               s->out);
            break;
        case DT_LAYER_CONV2D:
            dt_conv2d_backward(gin, g + l->w_off, l->b_n ? g + l->b_off : NULL, gout, in, p + l->w_off, m->work, B,
                               l->C, l->H, l->W, s->out, s->k, s->stride, s->pad);
            break;
        case DT_LAYER_MAXPOOL2D:
            if (i > 0 && m->L[i - 1].fused) /* relu gradient on the pooled output, in place (gout is ours) */
                dt_relu_backward((float *)gout, gout, l->out, n_out);
            dt_maxpool2d_backward(gin, gout, l->argmax, B, l->C, l->H, l->W, s->k, s->stride);
            break;
        case DT_LAYER_AVGPOOL2D: dt_avgpool2d_backward(gin, gout, B, l->C, l->H, l->W, s->k, s->stride); break;
        case DT_LAYER_RELU:
            if (l->fused) continue; /* already applied by the maxpool after it */
            dt_relu_backward(gin, gout, in, n_out);
            break;
        case DT_LAYER_GELU: dt_gelu_backward(gin, gout, in, n_out); break;
        case DT_LAYER_TANH: dt_tanh_backward(gin, gout, l->out, n_out); break;
        case DT_LAYER_SIGMOID: dt_sigmoid_backward(gin, gout, l->out, n_out); break;
        case DT_LAYER_DROPOUT:
            if (m->train && s->p > 0) dt_dropout_backward(gin, gout, l->mask, n_out, s->p);
            else memcpy(gin, gout, n_out * sizeof(float));
            break;
        case DT_LAYER_FLATTEN: continue; /* same memory, same gradient */
        case DT_LAYER_LAYERNORM:
            dt_layernorm_backward(gin, g + l->w_off, g + l->b_off, gout, in, p + l->w_off, l->aux, l->aux + B, B,
                                  (int)l->in_n);
            break;
        case DT_LAYER_BATCHNORM2D:
            dt_batchnorm2d_backward(gin, g + l->w_off, g + l->b_off, gout, in, p + l->w_off, l->aux, l->aux + l->C, B,
                                    l->C, l->H * l->W);
            break;
        default: break;
        }
        if (hook && has_params(l)) hook(ctx, l->w_off, l->w_n + l->b_n);
        gout = gin;
        k ^= 1;
    }
    return DT_OK;
}

/* Both executors from the same parameters over `steps` SGD steps on random batches of B. */
static void compare(const char *spec, int C, int H, int W, int B, int steps) {
    dt_layer_spec layers[DT_MAX_LAYERS];
    int nl;
    CHECK_OK(dt_spec_parse(spec, layers, DT_MAX_LAYERS, &nl));
    dt_model *g = NULL;
    ref_model *r = NULL;
    CHECK_OK(dt_model_create(&g, layers, nl, C, H, W));
    CHECK_OK(ref_create(&r, layers, nl, C, H, W));
    if (!g || !r) return;
    dt_model_init(g, 9);
    ref_init(r, 9);
    const size_t P = dt_model_num_params(g), in = (size_t)C * H * W;
    CHECK(P == ref_num_params(r) && !memcmp(dt_model_params(g), ref_params(r), P * sizeof(float)));
    const int V = dt_model_classes(g);
    float *x = malloc((size_t)B * in * sizeof(float)), *probs = malloc((size_t)B * V * sizeof(float)),
          *dl = malloc((size_t)B * V * sizeof(float));
    int32_t *y = malloc((size_t)B * sizeof(int32_t));
    bool same_out = true, same_grad = true, same_buf = true;
    for (int s = 0; s < steps; s++) {
        dt_rng_fill_uniform(x, (size_t)B * in, -1, 1, 17, (uint64_t)s);
        for (int i = 0; i < B; i++) y[i] = (int32_t)(dt_rng_u64(17, 1000 + (uint64_t)s, (uint64_t)i) % (uint64_t)V);
        /* graph: the loss node; reference: the kernels the trainer used to call */
        dt_feed f = {.x = x, .y = y, .n = B};
        float lg;
        CHECK_OK(dt_model_run(g, &f, true, (uint64_t)s, &lg));
        const float *ro = NULL;
        CHECK_OK(ref_forward(r, x, B, true, (uint64_t)s, &ro));
        float lr_ = dt_softmax_xent_forward(probs, ro, y, B, V);
        dt_softmax_xent_backward(dl, probs, y, B, V, 1.0f);
        same_out &= !memcmp(dt_model_output(g), ro, (size_t)B * V * sizeof(float)) && lg == lr_;
        dt_model_zero_grad(g);
        ref_zero_grad(r);
        CHECK_OK(dt_model_backward_loss(g, 1.0f, NULL, NULL));
        CHECK_OK(ref_backward(r, dl, NULL, NULL));
        same_grad &= !memcmp(dt_model_grads(g), ref_grads(r), P * sizeof(float));
        same_buf &= !memcmp(dt_model_buffers(g), ref_buffers(r), dt_model_num_buffers(g) * sizeof(float));
        for (size_t i = 0; i < P; i++) { /* plain SGD, the same on both */
            dt_model_params(g)[i] -= 0.05f * dt_model_grads(g)[i];
            ref_params(r)[i] -= 0.05f * ref_grads(r)[i];
        }
    }
    bool same_params = !memcmp(dt_model_params(g), ref_params(r), P * sizeof(float));
    CHECK_MSG(same_out, "%s: outputs or loss differ", spec);
    CHECK_MSG(same_grad, "%s: gradients differ", spec);
    CHECK_MSG(same_buf, "%s: buffers differ", spec);
    CHECK_MSG(same_params, "%s: parameters differ after %d steps", spec, steps);
    printf("%-40.40s %zu params, %d steps: outputs, gradients, buffers, parameters %s\n", spec, P, steps,
           same_out && same_grad && same_buf && same_params ? "bitwise identical" : "DIFFER");
    free(x), free(probs), free(dl), free(y);
    dt_model_destroy(g);
    ref_free(r);
}

int main(void) {
    /* the frozen executor calls the blas kernels directly: the graph must run the same ones */
    CHECK_OK(dt_kernels_select("blas", "fp32"));
    compare("mlp", 1, 28, 28, 32, 5);
    compare("cnn", 1, 28, 28, 8, 3);
    compare("conv(6,3,stride=2,pad=1) batchnorm relu maxpool(2) conv(4,2,bias=0) gelu avgpool(1) flatten dropout(0.3) "
            "layernorm linear(24) tanh linear(12,bias=0) sigmoid linear(5)",
            2, 12, 12, 6, 4);
    return dt_test_summary("sequential_compat_test");
}
