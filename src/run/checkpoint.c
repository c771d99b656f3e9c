/* Training checkpoints: model tensors, optimizer state and run position in one safetensors
 * file. Integrity (CRCs, atomic replace) comes from the safetensors layer. */
#include "run/checkpoint.h"
#include "run/ckpt_dir.h"

#include "dtrain/dtrain.h"
#include "dtrain/safetensors.h"
#include "dtrain/models.h"
#include "parallel/strategy.h"
#include "device/device.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CKPT_KIND "dtrain-train-state"

static dt_status meta_i64(dt_st_writer *w, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return dt_st_writer_meta(w, key, buf);
}

static dt_status meta_f32(dt_st_writer *w, const char *key, float v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", v);
    return dt_st_writer_meta(w, key, buf);
}

/* --val-split and the early-stop counters (a resumed run keeps the split and the counters). */
static dt_status write_val_meta(dt_st_writer *w, const dt_ckpt_info *info) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.17g", info->val_split);
    DT_TRY(dt_st_writer_meta(w, "dtrain.val_split", buf));
    if (info->best_epoch > 0) DT_TRY(meta_f32(w, "dtrain.best_val_loss", info->best_val));
    DT_TRY(meta_i64(w, "dtrain.best_epoch", info->best_epoch));
    return meta_i64(w, "dtrain.bad_epochs", info->bad_epochs);
}

/* Collects the pieces of the training state into the writer. Whole tensors are referenced; the
 * slices of a sharded tensor are assembled into a buffer of their own (kept until the write),
 * and every tensor must be whole by the end. */
typedef struct {
    char *name;
    float *data;        /* the whole tensor, assembled from its slices */
    size_t have, numel; /* elements filled so far, of numel */
} assembled;

typedef struct {
    dt_st_writer *w;
    assembled *t;
    int n, cap;
    dt_dev *dev; /* the state's device when the host cannot read it (NULL: host memory) */
} write_ctx;

/* The assembly buffer of tensor p->name, made (and given to the writer) on its first slice. */
static dt_status assembly_of(write_ctx *c, const dt_state_piece *p, assembled **out) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->t[i].name, p->name)) return *out = &c->t[i], DT_OK;
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        assembled *t = realloc(c->t, sizeof *t * (size_t)cap);
        if (!t) return dt_error(DT_ENOMEM, "checkpoint: out of memory");
        c->t = t, c->cap = cap;
    }
    assembled *a = &c->t[c->n];
    *a = (assembled){
        .name = strdup(p->name), .data = calloc(p->numel ? p->numel : 1, sizeof(float)), .numel = p->numel};
    if (!a->name || !a->data) {
        free(a->name), free(a->data);
        return dt_error(DT_ENOMEM, "checkpoint: out of memory");
    }
    c->n++;
    *out = a;
    return dt_st_writer_add(c->w, p->name, DT_F32, p->ndim, p->shape, a->data);
}

static dt_status add_piece(void *ctx, const dt_state_piece *p) {
    write_ctx *c = ctx;
    if (p->buf.dtype != DT_F32 || p->buf.device != DT_DEVICE_CPU)
        return dt_error(DT_ENOTSUP, "checkpoint: tensor '%s' is %s on device %d; only f32 host state is written",
                        p->name, dt_dtype_name(p->buf.dtype), (int)p->buf.device);
    if (c->dev && !p->host) { /* device memory: downloaded into the tensor's host copy */
        assembled *a = NULL;
        if (p->offset + p->buf.count > p->numel)
            return dt_error(DT_EINTERNAL, "checkpoint: piece [%zu, %zu) of '%s' exceeds its %zu elements", p->offset,
                            p->offset + p->buf.count, p->name, p->numel);
        DT_TRY(assembly_of(c, p, &a));
        c->dev->ops->download(c->dev, a->data + p->offset, p->buf.data, p->buf.count * sizeof(float));
        a->have += p->buf.count;
        return DT_OK;
    }
    if (p->offset == 0 && p->buf.count == p->numel)
        return dt_st_writer_add(c->w, p->name, DT_F32, p->ndim, p->shape, p->buf.data);
    if (p->offset + p->buf.count > p->numel)
        return dt_error(DT_EINTERNAL, "checkpoint: piece [%zu, %zu) of '%s' exceeds its %zu elements", p->offset,
                        p->offset + p->buf.count, p->name, p->numel);
    assembled *a = NULL;
    DT_TRY(assembly_of(c, p, &a));
    memcpy(a->data + p->offset, p->buf.data, p->buf.count * sizeof(float));
    a->have += p->buf.count;
    return DT_OK;
}

static void write_ctx_free(write_ctx *c) {
    for (int i = 0; i < c->n; i++) free(c->t[i].name), free(c->t[i].data);
    free(c->t);
}

/* Writes the state visit(src) yields, with the optimizer's metadata when o != NULL. */
static dt_status write_state(const char *path, dt_status (*visit)(void *src, dt_state_visit_fn fn, void *ctx),
                             void *src, dt_optim *o, const dt_ckpt_info *info, int shards, const char *save_id,
                             dt_dev *dev) {
    write_ctx c = {.dev = dev && !dev->host_memory ? dev : NULL};
    DT_TRY(dt_st_writer_create(&c.w));
    dt_st_writer *w = c.w;
    dt_status s = visit ? visit(src, add_piece, &c) : DT_OK;
    for (int i = 0; s == DT_OK && i < c.n; i++)
        if (c.t[i].have != c.t[i].numel)
            s = dt_error(DT_EINTERNAL,
                         "checkpoint: the pieces of '%s' cover %zu of its %zu elements (this rank does "
                         "not hold the whole tensor)",
                         c.t[i].name, c.t[i].have, c.t[i].numel);
    char shape[64], seed[32];
    snprintf(shape, sizeof shape, "%d,%d,%d", info->C, info->H, info->W);
    snprintf(seed, sizeof seed, "%" PRIu64, info->seed);
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.kind", CKPT_KIND);
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.version", DTRAIN_VERSION);
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.model_spec", info->spec);
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.input_shape", shape);
    if (s == DT_OK) s = meta_i64(w, "dtrain.step", info->step);
    if (s == DT_OK) s = meta_i64(w, "dtrain.epoch", info->epoch);
    if (s == DT_OK) s = meta_i64(w, "dtrain.step_in_epoch", info->step_in_epoch);
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.seed", seed);
    if (s == DT_OK)
        s = dt_st_writer_meta(w, "dtrain.rng", "philox4x32-10, counter-based: (seed, epoch, step) is the state");
    if (s == DT_OK) s = meta_i64(w, "dtrain.batch", info->batch);
    if (s == DT_OK) s = meta_i64(w, "dtrain.world_size", info->world_size);
    if (s == DT_OK && o) s = dt_st_writer_meta(w, "dtrain.optimizer", info->optimizer);
    if (s == DT_OK && o) s = meta_i64(w, "dtrain.optim_steps", dt_optim_steps(o));
    if (s == DT_OK && o && dt_optim_loss_scaler(o)) { /* fp16: "scale,good steps,skipped steps" */
        const dt_loss_scaler *ls = dt_optim_loss_scaler(o);
        char buf[64];
        snprintf(buf, sizeof buf, "%.9g,%d,%" PRId64, ls->scale, ls->good, ls->skipped);
        s = dt_st_writer_meta(w, "dtrain.loss_scale", buf);
    }
    if (s == DT_OK) s = meta_f32(w, "dtrain.lr", info->lr);
    if (s == DT_OK && info->has_settings) s = dt_ckpt_settings_write(w, info);
    if (s == DT_OK && info->strategy[0]) s = dt_st_writer_meta(w, "dtrain.strategy", info->strategy);
    if (s == DT_OK && info->data[0]) s = dt_st_writer_meta(w, "dtrain.data", info->data);
    if (s == DT_OK && info->has_norm) s = meta_f32(w, "dtrain.norm_mean", info->norm_mean);
    if (s == DT_OK && info->has_norm) s = meta_f32(w, "dtrain.norm_std", info->norm_std);
    if (s == DT_OK && shards > 0) s = meta_i64(w, "dtrain.shards", shards);
    if (s == DT_OK && save_id) s = dt_st_writer_meta(w, "dtrain.save_id", save_id);
    if (s == DT_OK && info->val_split > 0) s = write_val_meta(w, info);
    if (s == DT_OK) s = dt_st_writer_write(w, path);
    if (s == DT_OK) dt_ckpt_remove_stale_shards(path, shards); /* an earlier save's with other ranks */
    dt_st_writer_destroy(w);
    write_ctx_free(&c);
    return s;
}

typedef struct {
    dt_model *m;
    dt_optim *o;
} model_src;

static dt_status visit_model(void *src, dt_state_visit_fn fn, void *ctx) {
    model_src *ms = src;
    return dt_state_visit_model(ms->m, ms->o, fn, ctx);
}

static dt_status visit_strategy(void *src, dt_state_visit_fn fn, void *ctx) {
    return dt_strategy_visit_state(src, fn, ctx);
}

dt_status dt_checkpoint_write(const char *path, dt_model *m, dt_optim *o, const dt_ckpt_info *info) {
    model_src ms = {m, o};
    return write_state(path, visit_model, &ms, o, info, 0, NULL, dt_model_device(m));
}

dt_status dt_checkpoint_write_strategy(const char *path, dt_strategy *s, const dt_ckpt_info *info) {
    return write_state(path, visit_strategy, s, s->optim, info, 0, NULL, dt_model_device(s->model));
}

dt_status dt_checkpoint_write_index(const char *path, dt_optim *o, const dt_ckpt_info *info, int n,
                                    const char *save_id) {
    return write_state(path, NULL, NULL, o, info, n, save_id, NULL);
}

static dt_status need_meta(const dt_st_file *f, const char *key, const char **out) {
    *out = dt_st_meta(f, key);
    if (!*out)
        return dt_error(DT_EFORMAT, "%s: not a dtrain training checkpoint (metadata '%s' is missing)", dt_st_path(f),
                        key);
    return DT_OK;
}

/* Integer metadata `key` in [lo, hi] into *out; absent: *out = dflt, or an error when required. */
static dt_status meta_int(const dt_st_file *f, const char *key, bool required, int64_t dflt, int64_t lo, int64_t hi,
                          int64_t *out) {
    const char *v = dt_st_meta(f, key);
    *out = dflt;
    if (!v) return required ? need_meta(f, key, &v) : DT_OK;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return dt_error(DT_EFORMAT,
                        "%s: metadata %s='%.40s' is not an integer in [%lld, %lld]; the checkpoint is "
                        "damaged or was not written by dtrain",
                        dt_st_path(f), key, v, (long long)lo, (long long)hi);
    *out = x;
    return DT_OK;
}

/* What a float metadata value may be beside finite: any, >= 0 (a scheduled learning rate, which
 * a cosine schedule ends at --min-lr 0 and a step schedule's --gamma 0 reaches), or > 0. */
typedef enum { META_ANY, META_NONNEG, META_POSITIVE } meta_sign;

/* Float metadata `key` (absent: dflt) that must be finite and of the sign `sign` asks. */
static dt_status meta_float(const dt_st_file *f, const char *key, float dflt, meta_sign sign, float *out) {
    const char *v = dt_st_meta(f, key);
    *out = dflt;
    if (!v) return DT_OK;
    char *end;
    float x = strtof(v, &end);
    if (end == v || *end || !isfinite(x) || (sign == META_POSITIVE && !(x > 0)) || (sign == META_NONNEG && !(x >= 0)))
        return dt_error(DT_EFORMAT,
                        "%s: metadata %s='%.40s' is not a %snumber; the checkpoint is damaged or was not "
                        "written by dtrain",
                        dt_st_path(f), key, v,
                        sign == META_POSITIVE ? "positive "
                        : sign == META_NONNEG ? "non-negative "
                                              : "");
    *out = x;
    return DT_OK;
}

static dt_status parse_info(const dt_st_file *f, dt_ckpt_info *info) {
    memset(info, 0, sizeof *info);
    const char *v;
    DT_TRY(need_meta(f, "dtrain.kind", &v));
    if (strcmp(v, CKPT_KIND) != 0)
        return dt_error(DT_EFORMAT, "%s: checkpoint kind '%s' is not '%s'%s", dt_st_path(f), v, CKPT_KIND,
                        !strcmp(v, "dtrain-weights") ? " (a weights file: start from it with dtrain train `weights` "
                                                       "FILE, or read it with dtrain eval `weights` FILE)"
                        : !strcmp(v, "dtrain-train-shard") ? " (one shard of a sharded checkpoint: pass its index, the "
                                                             "file name without .rR-of-N)"
                                                           : "");
    DT_TRY(need_meta(f, "dtrain.model_spec", &v));
    snprintf(info->spec, sizeof info->spec, "%s", v);
    DT_TRY(need_meta(f, "dtrain.input_shape", &v));
    char tail;
    if (sscanf(v, "%d,%d,%d%c", &info->C, &info->H, &info->W, &tail) != 3 || info->C < 1 || info->H < 1 ||
        info->W < 1 || info->C > 1 << 16 || info->H > 1 << 16 || info->W > 1 << 16)
        return dt_error(DT_EFORMAT, "%s: bad dtrain.input_shape '%s' (want C,H,W of positive sizes)", dt_st_path(f), v);
    const int64_t BIG = INT64_MAX / 2;
    int64_t x;
    DT_TRY(meta_int(f, "dtrain.step", true, 0, 0, BIG, &info->step));
    DT_TRY(meta_int(f, "dtrain.epoch", true, 0, 0, INT32_MAX, &info->epoch));
    DT_TRY(meta_int(f, "dtrain.step_in_epoch", true, 0, 0, BIG, &info->step_in_epoch));
    DT_TRY(need_meta(f, "dtrain.seed", &v));
    char *end;
    errno = 0;
    info->seed = strtoull(v, &end, 10);
    if (errno || end == v || *end || *v == '-')
        return dt_error(DT_EFORMAT, "%s: metadata dtrain.seed='%.40s' is not an unsigned integer", dt_st_path(f), v);
    DT_TRY(meta_int(f, "dtrain.batch", false, 0, 1, INT32_MAX, &x));
    info->batch = (int)x;
    DT_TRY(meta_int(f, "dtrain.world_size", false, 1, 1, 1 << 24, &x));
    info->world_size = (int)x;
    if ((v = dt_st_meta(f, "dtrain.optimizer"))) snprintf(info->optimizer, sizeof info->optimizer, "%s", v);
    DT_TRY(meta_int(f, "dtrain.optim_steps", false, 0, 0, BIG, &x));
    DT_TRY(meta_float(f, "dtrain.lr", 0, META_NONNEG, &info->lr));
    if (dt_st_meta(f, "dtrain.norm_mean")) {
        info->has_norm = 1;
        DT_TRY(meta_float(f, "dtrain.norm_mean", 0, META_ANY, &info->norm_mean));
        DT_TRY(meta_float(f, "dtrain.norm_std", 1, META_POSITIVE, &info->norm_std));
    }
    info->best_val = INFINITY;
    if ((v = dt_st_meta(f, "dtrain.val_split"))) {
        info->val_split = strtod(v, &end);
        if (*end || !(info->val_split > 0 && info->val_split < 1))
            return dt_error(DT_EFORMAT, "%s: metadata dtrain.val_split='%.40s' is not a fraction in (0, 1)",
                            dt_st_path(f), v);
        DT_TRY(meta_int(f, "dtrain.best_epoch", false, 0, 0, INT32_MAX, &info->best_epoch));
        DT_TRY(meta_int(f, "dtrain.bad_epochs", false, 0, 0, INT32_MAX, &info->bad_epochs));
        if (info->best_epoch > 0) DT_TRY(meta_float(f, "dtrain.best_val_loss", INFINITY, META_ANY, &info->best_val));
    }
    DT_TRY(dt_ckpt_settings_parse(f, info));
    const struct {
        const char *key;
        char *to;
        size_t cap;
    } texts[] = {{"dtrain.strategy", info->strategy, sizeof info->strategy},
                 {"dtrain.data", info->data, sizeof info->data}};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        texts[i].to[0] = '\0';
        if (!(v = dt_st_meta(f, texts[i].key))) continue;
        if (strlen(v) >= texts[i].cap)
            return dt_error(DT_EFORMAT, "%s: metadata %s is too long; the checkpoint is damaged", dt_st_path(f),
                            texts[i].key);
        snprintf(texts[i].to, texts[i].cap, "%s", v);
    }
    if (info->has_settings && info->optimizer[0]) (void)dt_optim_parse(info->optimizer, &info->optim_cfg.kind);
    return DT_OK;
}

dt_status dt_checkpoint_resolve(const char *path, char *out, size_t cap, bool *from_dir) {
    struct stat st;
    *from_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    if (!*from_dir) {
        if ((size_t)snprintf(out, cap, "%s", path) >= cap) return dt_error(DT_EINVAL, "%s: path too long", path);
        return DT_OK;
    }
    bool found;
    DT_TRY(dt_ckpt_dir_latest(path, out, cap, &found, NULL, NULL));
    if (!found)
        return dt_error(DT_ENOENT,
                        "%s: a directory without a usable checkpoint (ckpt-<step>.safetensors, written by "
                        "dtrain train `checkpoint_dir`); pass a checkpoint file or such a directory",
                        path);
    return DT_OK;
}

dt_status dt_checkpoint_info_of(const dt_st_file *f, dt_ckpt_info *info) { return parse_info(f, info); }

dt_status dt_checkpoint_read_info(const char *path, dt_ckpt_info *info) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, path));
    dt_status s = parse_info(f, info);
    dt_st_destroy(f);
    return s;
}

bool dt_checkpoint_is_sharded(const char *path) {
    dt_st_file *f = NULL;
    if (dt_st_open(&f, path) != DT_OK) return dt_error_clear(), false;
    const bool sharded = dt_st_meta(f, "dtrain.shards") != NULL;
    dt_st_destroy(f);
    return sharded;
}

/* Copies the range of tensor p->name (F32 of p's global shape) that p holds from the file ctx. */
static dt_status restore_piece(void *ctx, const dt_state_piece *p) {
    const dt_st_file *f = ctx;
    dt_st_tensor st;
    dt_status s = dt_st_find(f, p->name, &st);
    if (s != DT_OK && p->hint) return dt_error_clear(), DT_OK; /* optional state: starts afresh */
    if (s != DT_OK) return s;
    bool same = st.t.dtype == DT_F32 && st.t.ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = st.t.shape[d] == p->shape[d];
    if (!same && p->hint)
        return dt_error(DT_EFORMAT, "%s: tensor '%s' has shape [%lld, %lld], this run's is [%lld, %lld]: %s",
                        dt_st_path(f), p->name, (long long)st.t.shape[0],
                        (long long)(st.t.ndim > 1 ? st.t.shape[1] : 1), (long long)p->shape[0], (long long)p->shape[1],
                        p->hint);
    if (!same)
        return dt_error(DT_EFORMAT,
                        "%s: tensor '%s' has dtype %s and %d dims, the model expects F32 with %d dims of "
                        "the model's shape; was it written for another `model`?",
                        dt_st_path(f), p->name, dt_dtype_name(st.t.dtype), st.t.ndim, p->ndim);
    memcpy(p->buf.data, (const float *)st.t.data + p->offset, p->buf.count * sizeof(float));
    return DT_OK;
}

/* A restore visitor (restore, with its ctx) into device memory the host cannot write: through a
 * host copy, uploaded. */
typedef struct {
    dt_state_visit_fn restore;
    void *ctx;
    dt_dev *dev;
} device_restore;

static dt_status restore_piece_device(void *ctx, const dt_state_piece *p) {
    const device_restore *r = ctx;
    dt_state_piece h = *p;
    if (!(h.buf.data = malloc(p->buf.count * sizeof(float) + 1)))
        return dt_error(DT_ENOMEM, "checkpoint: out of memory");
    r->dev->ops->download(r->dev, h.buf.data, p->buf.data, p->buf.count * sizeof(float)); /* kept where it is absent */
    dt_status s = r->restore(r->ctx, &h);
    if (s == DT_OK) r->dev->ops->upload(r->dev, p->buf.data, h.buf.data, p->buf.count * sizeof(float));
    free(h.buf.data);
    return s;
}

/* The checkpoint's fp16 loss scaler ("scale,good steps,skipped steps"): false where it has none
 * or it does not parse to a positive finite scale. */
static bool checkpoint_loss_scaler(const dt_st_file *f, dt_loss_scaler *got) {
    const char *v = dt_st_meta(f, "dtrain.loss_scale");
    dt_loss_scaler r = *got;
    long long skipped = 0;
    if (!v || sscanf(v, "%g,%d,%lld", &r.scale, &r.good, &skipped) != 3 || !(r.scale > 0) || !isfinite(r.scale))
        return false;
    r.skipped = skipped;
    *got = r;
    return true;
}

/* fp16: the loss scaler continues where it was (a checkpoint without one leaves it as it is). */
static void restore_loss_scale(const dt_st_file *f, dt_optim *o) {
    dt_loss_scaler *ls = o ? dt_optim_loss_scaler(o) : NULL;
    dt_loss_scaler got = ls ? *ls : (dt_loss_scaler){0};
    if (ls && checkpoint_loss_scaler(f, &got)) *ls = got;
}

dt_status dt_checkpoint_restore(const char *path, dt_model *m, dt_optim *o, dt_ckpt_info *info) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, path));
    dt_status s = parse_info(f, info);
    if (s == DT_OK && strcmp(info->spec, dt_model_spec(m)) != 0)
        s = dt_error(DT_EFORMAT, "%s: checkpoint is for model '%s' but this run builds '%s'; pass the same `model`",
                     path, info->spec, dt_model_spec(m));
    const char *steps = NULL;
    if (s == DT_OK && o) { /* the optimizer must match before its state tensors are looked up */
        const char *kind = dt_st_meta(f, "dtrain.optimizer");
        steps = dt_st_meta(f, "dtrain.optim_steps");
        if (!steps || !kind)
            s = dt_error(DT_EFORMAT, "%s: checkpoint holds no optimizer state; it cannot be resumed", path);
        else if (strcmp(kind, dt_optim_name(dt_optim_config_of(o)->kind)) != 0)
            s = dt_error(DT_EFORMAT, "%s: checkpoint was trained with `optimizer` %s, this run uses %s", path, kind,
                         dt_optim_name(dt_optim_config_of(o)->kind));
        else if (dt_optim_num_states(o) > 0 && !dt_st_meta(f, "dtrain.shards")) {
            /* momentum on/off changes the state tensors: say so instead of "no tensor named" */
            const char *sname;
            dt_optim_state(o, 0, &sname);
            char probe[96];
            snprintf(probe, sizeof probe, "optim.%s.%s", sname, dt_model_tensor(m, 0)->name);
            dt_st_tensor st;
            if (dt_st_find(f, probe, &st) != DT_OK)
                s = dt_error(DT_EFORMAT,
                             "%s: checkpoint has no '%s' optimizer state (trained with other `momentum`?); "
                             "resume with the optimizer settings it was trained with",
                             path, sname);
        }
    }
    int64_t shards = 0;
    if (s == DT_OK) s = meta_int(f, "dtrain.shards", false, 0, 1, 1 << 24, &shards);
    if (s == DT_OK && shards > 0) s = dt_checkpoint_restore_shards(path, (int)shards, m, o);
    else if (s == DT_OK && !dt_model_device(m)->host_memory) {
        device_restore r = {restore_piece, f, dt_model_device(m)};
        s = dt_state_visit_model(m, o, restore_piece_device, &r);
    } else if (s == DT_OK) s = dt_state_visit_model(m, o, restore_piece, f);
    if (s == DT_OK && o) dt_optim_set_steps(o, strtoll(steps, NULL, 10));
    if (s == DT_OK) restore_loss_scale(f, o);
    dt_st_destroy(f);
    return s;
}

/* restore_piece, and the error-feedback residual ("compress.<name>.state") that the file holds
 * multiplied by ef_factor: it holds gradients at the loss scale of the run that wrote it (fp16),
 * so a resume at another scale (--precision changed across fp16) converts it. A factor that is
 * not finite (scales far apart) clears it, as a skipped step does (dt_grad_sync_rescale_state). */
typedef struct {
    const dt_st_file *f;
    float ef_factor;
    dt_dev *dev; /* the model's device when the host cannot write it (NULL: host memory) */
} restore_ctx;

static dt_status restore_piece_rescaled(void *ctx, const dt_state_piece *p) {
    const restore_ctx *c = ctx;
    if (c->dev && !p->host) { /* model memory on the device: through a host copy (no residual there) */
        device_restore r = {restore_piece, (void *)c->f, c->dev};
        return restore_piece_device(&r, p);
    }
    DT_TRY(restore_piece((void *)c->f, p));
    const size_t n = strlen(p->name);
    dt_st_tensor st;
    if (c->ef_factor == 1.0f || strncmp(p->name, "compress.", 9) || n < 6 || strcmp(p->name + n - 6, ".state") ||
        dt_st_find(c->f, p->name, &st) != DT_OK) /* not in the file: the state starts afresh, as it is */
        return dt_error_clear(), DT_OK;
    float *x = p->buf.data;
    const float k = isfinite(c->ef_factor) ? c->ef_factor : 0.0f;
    for (size_t i = 0; i < p->buf.count; i++) x[i] = k == 0.0f ? 0.0f : x[i] * k;
    return DT_OK;
}

dt_status dt_checkpoint_restore_strategy(const char *path, dt_strategy *st, dt_ckpt_info *info) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, path));
    dt_status s = parse_info(f, info);
    if (s == DT_OK && strcmp(info->spec, dt_model_spec(st->model)) != 0)
        s = dt_error(DT_EFORMAT, "%s: checkpoint is for model '%s' but this run builds '%s'; pass the same `model`",
                     path, info->spec, dt_model_spec(st->model));
    const char *steps = dt_st_meta(f, "dtrain.optim_steps");
    int64_t shards = 0;
    if (s == DT_OK) s = meta_int(f, "dtrain.shards", false, 0, 1, 1 << 24, &shards);
    /* a sharded checkpoint (ZeRO) holds whole-model state only: its pieces go into the ones the
     * strategy reports (tp: its shards); strategy-only state starts afresh */
    if (s == DT_OK) restore_loss_scale(f, st->optim);
    if (s == DT_OK && shards > 0) s = dt_checkpoint_restore_shards_into(path, (int)shards, st);
    else if (s == DT_OK) {
        const dt_loss_scaler *ls = st->optim ? dt_optim_loss_scaler(st->optim) : NULL;
        dt_loss_scaler ck = {.scale = 1.0f}; /* the checkpoint's scale: 1 without fp16 */
        checkpoint_loss_scaler(f, &ck);
        dt_dev *dev = dt_model_device(st->model);
        restore_ctx c = {.f = f, .ef_factor = (ls ? ls->scale : 1.0f) / ck.scale, .dev = dev->host_memory ? NULL : dev};
        s = dt_strategy_visit_state(st, restore_piece_rescaled, &c);
    }
    if (s == DT_OK && st->optim && steps) dt_optim_set_steps(st->optim, strtoll(steps, NULL, 10));
    dt_st_destroy(f);
    return s;
}

dt_status dt_checkpoint_consolidate(const char *in, const char *out, bool optim) {
    dt_ckpt_info info;
    DT_TRY(dt_checkpoint_read_info(in, &info));
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_status s = dt_model_build(&m, info.spec, info.C, info.H, info.W);
    if (s != DT_OK) s = dt_error_wrap(DT_EFORMAT, "%s: its dtrain.model_spec", in);
    dt_optim_kind kind = DT_OPTIM_ADAM;
    if (s == DT_OK && optim) {
        if (!info.optimizer[0] || dt_optim_parse(info.optimizer, &kind) != DT_OK)
            s = dt_error(DT_EFORMAT, "%s: holds no optimizer state to consolidate; leave out `optimizer_state`", in);
    }
    if (s == DT_OK && optim) {
        dt_optim_config oc = dt_optim_defaults(kind);
        if (kind == DT_OPTIM_SGD) oc.momentum = 0.9f; /* a momentum buffer, when the file has one */
        s = dt_optim_create(&o, &oc, dt_model_num_params(m));
    }
    dt_ckpt_info got;
    if (s == DT_OK) s = dt_checkpoint_restore(in, m, o, &got);
    if (s == DT_OK) s = dt_checkpoint_write(out, m, o, &info);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return s;
}
