/* Optimizers over flat slabs: SGD (momentum, Nesterov, weight decay), Adam and AdamW with the
 * torch.optim 1.13 update rules, plus gradient-norm clipping. */
#include "optim/clip.h"
#include "optim/optim_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dt_optim {
    dt_optim_config cfg;
    size_t n;
    int64_t t;    /* completed steps */
    dt_slab m, v; /* sgd: m = momentum buffer; adam: m, v moments */
    bool scaling; /* fp16: dynamic loss scaling on */
    dt_loss_scaler ls;
    dt_dev *dev;    /* where m, v and the gradients live (dt_optim_set_device; default cpu) */
    bool dev_state; /* m and v are whole blocks of dev, not host slabs */
    void *scalars;  /* dev_state: a norm sum (double) and a non-finite flag (int32_t) in dev */
};

dt_optim_config dt_optim_defaults(dt_optim_kind kind) {
    dt_optim_config c = {.kind = kind, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    if (kind == DT_OPTIM_ADAMW) c.weight_decay = 0.01f;
    return c;
}

static const char *const g_names[] = {"sgd", "adam", "adamw"};

const char *dt_optim_name(dt_optim_kind kind) { return (unsigned)kind < 3 ? g_names[kind] : "?"; }

dt_status dt_optim_parse(const char *name, dt_optim_kind *kind) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, g_names[i])) {
            *kind = (dt_optim_kind)i;
            return DT_OK;
        }
    return dt_error(DT_EINVAL, "unknown optimizer '%s' (choose sgd, adam or adamw)", name);
}

dt_status dt_optim_create(dt_optim **out, const dt_optim_config *cfg, size_t n) {
    return dt_optim_create_placed(out, cfg, n, NULL, 0);
}

dt_status dt_optim_create_placed(dt_optim **out, const dt_optim_config *cfg, size_t n, const dt_range *own, int nown) {
    *out = NULL;
    if ((unsigned)cfg->kind > DT_OPTIM_ADAMW) return dt_error(DT_EINVAL, "optimizer: unknown kind %d", cfg->kind);
    if (cfg->kind != DT_OPTIM_SGD && !(cfg->beta1 >= 0 && cfg->beta1 < 1 && cfg->beta2 >= 0 && cfg->beta2 < 1))
        return dt_error(DT_EINVAL, "optimizer: betas (%g, %g) must lie in [0,1)", cfg->beta1, cfg->beta2);
    if (cfg->nesterov && cfg->momentum <= 0) return dt_error(DT_EINVAL, "optimizer: nesterov needs a momentum > 0");
    dt_optim *o = calloc(1, sizeof *o);
    if (!o) return dt_error(DT_ENOMEM, "optimizer: out of memory");
    o->cfg = *cfg;
    o->n = n;
    o->dev = dt_device_cpu();
    bool need_m = cfg->kind != DT_OPTIM_SGD || cfg->momentum > 0;
    if ((need_m && dt_slab_reserve(&o->m, n) != DT_OK) ||
        (cfg->kind != DT_OPTIM_SGD && dt_slab_reserve(&o->v, n) != DT_OK) || dt_optim_place(o, own, nown) != DT_OK) {
        dt_optim_destroy(o);
        return DT_ENOMEM;
    }
    *out = o;
    return DT_OK;
}

void dt_optim_destroy(dt_optim *o) {
    if (!o) return;
    dt_optim_free_state(o);
    if (o->scalars) o->dev->ops->free(o->dev, o->scalars);
    free(o);
}

/* A whole moment slab as a zeroed block of device d with the host slab's placed values; the host
 * slab freed. */
static dt_status move_slab(dt_dev *d, dt_slab *s) {
    if (!s->data) return DT_OK;
    float *p = d->ops->alloc(d, (s->n ? s->n : 1) * sizeof(float));
    if (!p) return dt_error_wrap(DT_ENOMEM, "optimizer: its state of %zu values on device %s", s->n, d->kind->name);
    d->ops->fill_f32(d, p, 0.0f, s->n ? s->n : 1);
    if (s->n && (s->placed > 0 || !s->reserved)) d->ops->upload(d, p, s->data, s->n * sizeof(float));
    const size_t n = s->n;
    dt_slab_free(s);
    *s = (dt_slab){.data = p, .n = n};
    return DT_OK;
}

dt_status dt_optim_set_device(dt_optim *o, dt_dev *d) {
    if (d == o->dev) return DT_OK;
    if (o->dev_state) return dt_error(DT_EINVAL, "optimizer: already moved to device %s", o->dev->kind->name);
    if (d->host_memory) {
        o->dev = d;
        return DT_OK;
    }
    if (!(o->scalars = d->ops->alloc(d, 64))) return dt_error_wrap(DT_ENOMEM, "optimizer: device %s", d->kind->name);
    dt_status s = move_slab(d, &o->m);
    if (s == DT_OK) s = move_slab(d, &o->v);
    o->dev = d, o->dev_state = true; /* a failed second move leaves m on d: dt_optim_destroy frees it there */
    return s;
}

/* The step's arguments for the device's kernels (device/cpu_step.c: torch.optim's arithmetic). */
static dt_step_args step_args(const dt_optim *o, float lr) {
    const dt_optim_config *c = &o->cfg;
    return (dt_step_args){.lr = lr,
                          .weight_decay = c->weight_decay,
                          .momentum = c->momentum,
                          .nesterov = c->nesterov,
                          .first_step = o->t == 0,
                          .beta1 = c->beta1,
                          .beta2 = c->beta2,
                          .eps = c->eps,
                          .decoupled = c->kind == DT_OPTIM_ADAMW,
                          .t = o->t};
}

/* The update of n values (moments or momentum buffer m, v) on the optimizer's device. */
static void update(const dt_optim *o, float *p, const float *g, float *m, float *v, size_t n, float lr) {
    dt_dev *d = o->dev;
    const dt_step_args a = step_args(o, lr);
    if (o->cfg.kind == DT_OPTIM_SGD) d->ops->sgd_step(d, &a, p, g, m, n);
    else d->ops->adam_step(d, &a, p, g, m, v, n);
}

void dt_optim_step(dt_optim *o, float *params, const float *grads, float lr) {
    update(o, params, grads, o->m.data, o->v.data, o->n, lr);
    o->t++;
}

dt_status dt_optim_set_loss_scaling(dt_optim *o, bool enable, const dt_loss_scaler *init) {
    dt_loss_scaler ls = init ? *init : dt_loss_scaler_default();
    if (enable) DT_TRY(dt_loss_scaler_check(&ls));
    o->scaling = enable;
    o->ls = ls;
    return DT_OK;
}

dt_loss_scaler *dt_optim_loss_scaler(dt_optim *o) { return o->scaling ? &o->ls : NULL; }
float dt_optim_loss_scale(const dt_optim *o) { return o->scaling ? o->ls.scale : 1.0f; }
/* Ranges k of params/grads with the state at off[k] (off NULL: packed, one after another). */
static void step_ranges(dt_optim *o, int nr, float *const *params, const float *const *grads, const size_t *off,
                        const size_t *len, float lr) {
    size_t at = 0;
    for (int k = 0; k < nr; k++) {
        if (off) at = off[k];
        float *m = o->m.data ? o->m.data + at : NULL, *v = o->v.data ? o->v.data + at : NULL;
        if (len[k] == 0) continue;
        update(o, params[k], grads[k], m, v, len[k], lr);
        at += len[k];
    }
    o->t++;
}

void dt_optim_step_ranges(dt_optim *o, int nr, float *const *params, const float *const *grads, const size_t *len,
                          float lr) {
    step_ranges(o, nr, params, grads, NULL, len, lr);
}

void dt_optim_step_at(dt_optim *o, int nr, float *const *params, const float *const *grads, const size_t *off,
                      const size_t *len, float lr) {
    step_ranges(o, nr, params, grads, off, len, lr);
}

/* Replaces slab *s by the values of ranges [off[k], off[k]+len[k]) packed in order. */
static dt_status pack_slab(dt_slab *s, int nr, const size_t *off, const size_t *len, size_t total) {
    if (!s->data) return DT_OK;
    dt_slab packed;
    DT_TRY(dt_slab_init(&packed, total ? total : 1));
    size_t at = 0;
    for (int k = 0; k < nr; k++) memcpy(packed.data + at, s->data + off[k], len[k] * sizeof(float)), at += len[k];
    dt_slab_free(s);
    *s = packed;
    return DT_OK;
}

/* dt_optim_shard of state on device d: the ranges copied into new blocks, the whole ones freed. */
static dt_status shard_on_device(dt_optim *o, dt_dev *d, int nr, const size_t *off, const size_t *len, size_t total) {
    dt_slab *s[2] = {&o->m, &o->v};
    float *packed[2] = {NULL, NULL};
    for (int j = 0; j < 2; j++)
        if (s[j]->data && !(packed[j] = d->ops->alloc(d, (total ? total : 1) * sizeof(float)))) {
            d->ops->free(d, packed[0]); /* the optimizer stays whole */
            return dt_error_wrap(DT_ENOMEM, "optimizer: its shard of %zu values on device %s", total, d->kind->name);
        }
    for (int j = 0; j < 2; j++) {
        if (!packed[j]) continue;
        size_t at = 0;
        for (int k = 0; k < nr; k++)
            d->ops->copy(d, packed[j] + at, s[j]->data + off[k], len[k] * sizeof(float)), at += len[k];
        d->ops->free(d, s[j]->data);
        *s[j] = (dt_slab){.data = packed[j], .n = total};
    }
    o->n = total;
    return DT_OK;
}

dt_status dt_optim_shard(dt_optim *o, int nr, const size_t *off, const size_t *len) {
    size_t total = 0;
    for (int k = 0; k < nr; k++) {
        if (off[k] + len[k] > o->n)
            return dt_error(DT_EINVAL, "optimizer: shard range [%zu, %zu) beyond its %zu values", off[k],
                            off[k] + len[k], o->n);
        total += len[k];
    }
    if (o->dev_state) return shard_on_device(o, o->dev, nr, off, len, total);
    dt_slab m = o->m, v = o->v;
    DT_TRY(pack_slab(&o->m, nr, off, len, total));
    if (pack_slab(&o->v, nr, off, len, total) != DT_OK) { /* keep the optimizer whole */
        dt_slab_free(&o->m);
        o->m = m, o->v = v;
        return DT_ENOMEM;
    }
    o->n = total;
    return DT_OK;
}

int dt_optim_num_states(const dt_optim *o) { return (o->m.data != NULL) + (o->v.data != NULL); }

float *dt_optim_state(dt_optim *o, int i, const char **name) {
    const bool sgd = o->cfg.kind == DT_OPTIM_SGD;
    if (i == 0 && o->m.data) {
        if (name) *name = sgd ? "momentum" : "m";
        return o->m.data;
    }
    if (i == 1 && o->v.data) {
        if (name) *name = "v";
        return o->v.data;
    }
    return NULL;
}

size_t dt_optim_size(const dt_optim *o) { return o->n; }
int64_t dt_optim_steps(const dt_optim *o) { return o->t; }
void dt_optim_set_steps(dt_optim *o, int64_t t) { o->t = t; }
const dt_optim_config *dt_optim_config_of(const dt_optim *o) { return &o->cfg; }

dt_status dt_optim_place(dt_optim *o, const dt_range *own, int nown) {
    if (o->dev_state && own)
        return dt_error(DT_ENOTSUP,
                        "optimizer: placing a part of its state on device %s is not device-neutral yet: "
                        "use `device` cpu",
                        o->dev->kind->name);
    if (o->dev_state) return DT_OK;
    DT_TRY(dt_slab_place(&o->m, own, nown, "placing the optimizer state"));
    return dt_slab_place(&o->v, own, nown, "placing the optimizer state");
}

void dt_optim_free_state(dt_optim *o) {
    if (o->dev_state) {
        o->dev->ops->free(o->dev, o->m.data), o->dev->ops->free(o->dev, o->v.data);
        o->m = o->v = (dt_slab){0};
        return;
    }
    dt_slab_free(&o->m);
    dt_slab_free(&o->v);
}

/* dt_clip_grad_norm on device d (dt_clip_grad_pieces with one piece, no other rank); dev_ss: a
 * double of d's memory for the sum (NULL: a host one). */
static float clip_on(dt_dev *d, double *dev_ss, float *g, size_t n, float max_norm) {
    const dt_grad_piece whole = {g, n};
    const dt_clip_spec c = {
        .dev = d, .dev_ss = dev_ss, .nss = 1, .norm = &whole, .nnorm = 1, .scale = &whole, .nscale = 1};
    float norm = 0;
    (void)dt_clip_grad_pieces(&c, max_norm, &norm); /* no reduction: it cannot fail */
    return norm;
}

float dt_clip_grad_norm(float *g, size_t n, float max_norm) { return clip_on(dt_device_cpu(), NULL, g, n, max_norm); }

float dt_optim_clip_grad_norm(dt_optim *o, float *g, size_t n, float max_norm) {
    return clip_on(o->dev, o->dev_state ? o->scalars : NULL, g, n, max_norm);
}

bool dt_optim_unscale(dt_optim *o, float *g, size_t n) {
    int32_t *flag = o->dev_state ? (int32_t *)(void *)((char *)o->scalars + sizeof(double)) : NULL;
    return !o->scaling || dt_loss_scaler_unscale_on(&o->ls, o->dev, flag, g, n);
}
