/* A checkpoint's training settings (dtrain.settings): what a resume that leaves a flag out takes
 * from the checkpoint, and what it compares the flags it is given against. */
#include "run/checkpoint.h"

#include "dtrain/dtrain.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY "dtrain.settings"

static const char *const g_schedules[] = {"constant", "step", "cosine"};

dt_status dt_ckpt_settings_write(dt_st_writer *w, const dt_ckpt_info *info) {
    const dt_lr_schedule *l = &info->sched;
    const dt_optim_config *o = &info->optim_cfg;
    const int k = (int)l->kind >= 0 && (int)l->kind < 3 ? (int)l->kind : 0;
    char buf[512];
    snprintf(
        buf, sizeof buf,
        "lr=%.9g,schedule=%s,warmup=%" PRId64 ",step_size=%" PRId64 ",gamma=%.9g,min_lr=%.9g,momentum=%.9g,"
        "nesterov=%d,weight_decay=%.9g,beta1=%.9g,beta2=%.9g,eps=%.9g,clip=%.9g,grad_accum=%d,val_fraction=%.17g%s%s",
        l->base_lr, g_schedules[k], l->warmup_steps, l->step_size, l->gamma, l->min_lr, o->momentum,
        o->nesterov ? 1 : 0, o->weight_decay, o->beta1, o->beta2, o->eps, info->clip,
        info->grad_accum > 1 ? info->grad_accum : 1, info->val_fraction >= 0 ? info->val_fraction : 0.1,
        info->precision[0] ? ",precision=" : "", info->precision);
    return dt_st_writer_meta(w, KEY, buf);
}

const char *dt_ckpt_precision_name(const char *p) {
    if (!p || !strcmp(p, "fp32") || !strcmp(p, "f32")) return "fp32";
    if (!strcmp(p, "bf16")) return "bf16";
    if (!strcmp(p, "fp16") || !strcmp(p, "f16")) return "fp16";
    return NULL;
}

typedef enum { S_FLOAT, S_DOUBLE, S_I64, S_BOOL, S_INT, S_SCHED, S_PREC } setting_kind;

/* Sets the setting `name` of info from text v; false when v is not a value of its kind. */
static bool set_setting(dt_ckpt_info *info, const char *name, const char *v) {
    dt_lr_schedule *l = &info->sched;
    dt_optim_config *o = &info->optim_cfg;
    const struct {
        const char *name;
        setting_kind kind;
        void *p;
    } keys[] = {
        {"lr", S_FLOAT, &l->base_lr},
        {"schedule", S_SCHED, &l->kind},
        {"warmup", S_I64, &l->warmup_steps},
        {"step_size", S_I64, &l->step_size},
        {"gamma", S_FLOAT, &l->gamma},
        {"min_lr", S_FLOAT, &l->min_lr},
        {"momentum", S_FLOAT, &o->momentum},
        {"nesterov", S_BOOL, &o->nesterov},
        {"weight_decay", S_FLOAT, &o->weight_decay},
        {"beta1", S_FLOAT, &o->beta1},
        {"beta2", S_FLOAT, &o->beta2},
        {"eps", S_FLOAT, &o->eps},
        {"clip", S_FLOAT, &info->clip},
        {"grad_accum", S_INT, &info->grad_accum},
        {"precision", S_PREC, info->precision},
        {"val_fraction", S_DOUBLE, &info->val_fraction},
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        if (strcmp(keys[i].name, name)) continue;
        char *end;
        errno = 0;
        if (keys[i].kind == S_SCHED) return dt_lr_parse(v, keys[i].p) == DT_OK;
        if (keys[i].kind == S_PREC) {
            const char *name = dt_ckpt_precision_name(v);
            if (name) snprintf(info->precision, sizeof info->precision, "%s", name);
            return name != NULL;
        }
        if (keys[i].kind == S_DOUBLE) {
            const double x = strtod(v, &end);
            if (end == v || *end || !(x >= 0 && x <= 0.5)) return false;
            *(double *)keys[i].p = x;
            return true;
        }
        if (keys[i].kind == S_FLOAT) {
            const float x = strtof(v, &end);
            if (end == v || *end || !isfinite(x)) return false;
            *(float *)keys[i].p = x;
            return true;
        }
        const long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || x < 0) return false;
        if (keys[i].kind == S_BOOL) *(bool *)keys[i].p = x != 0;
        else if (keys[i].kind == S_INT) *(int *)keys[i].p = x < 1 || x > 65536 ? -1 : (int)x;
        else *(int64_t *)keys[i].p = x;
        return keys[i].kind != S_INT || *(int *)keys[i].p > 0;
    }
    return true; /* a setting of a newer version: not used here */
}

dt_status dt_ckpt_settings_parse(const dt_st_file *f, dt_ckpt_info *info) {
    info->has_settings = false;
    info->precision[0] = '\0';
    info->val_fraction = -1;
    const char *v = dt_st_meta(f, KEY);
    if (!v) return DT_OK;
    char buf[1024];
    if (strlen(v) >= sizeof buf)
        return dt_error(DT_EFORMAT, "%s: metadata %s is too long; the checkpoint is damaged", dt_st_path(f), KEY);
    snprintf(buf, sizeof buf, "%s", v);
    info->grad_accum = 1;
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq) *eq = '\0';
        if (!eq || !set_setting(info, kv, eq + 1))
            return dt_error(DT_EFORMAT,
                            "%s: metadata %s has a bad entry '%.40s%s%.40s'; the checkpoint is damaged or "
                            "was not written by dtrain",
                            dt_st_path(f), KEY, kv, eq ? "=" : "", eq ? eq + 1 : "");
    }
    if (!(info->sched.base_lr > 0))
        return dt_error(DT_EFORMAT, "%s: metadata %s: lr=%g is not a positive learning rate", dt_st_path(f), KEY,
                        info->sched.base_lr);
    info->has_settings = true;
    return DT_OK;
}

/* Appends "; --FLAG NOW (the checkpoint's run: THEN)" to what[*len] when now and then differ. */
static void note_change(char *what, size_t cap, size_t *len, const char *term, double now, double then) {
    if (now == then || (then != 0 && fabs(now - then) <= 1e-6 * fabs(then)) || *len >= cap) return;
    *len += (size_t)snprintf(what + *len, cap - *len, "%s`%s` %g (the checkpoint's run: %g)", *len ? "; " : "", term,
                             now, then);
}

void dt_ckpt_settings_changes(const dt_ckpt_info *info, const dt_train_config *c, const char *strategy, char *what,
                              size_t cap) {
    size_t len = 0;
    what[0] = '\0';
    char now[512], then[512]; /* compared spelled out: "ddp" is "ddp(bucket_mb=1)" */
    /* the default strategies (single for one rank, ddp for more) differ by the number of ranks,
     * which the resume reports on its own: only other specs are compared */
    if (info->strategy[0] && strategy &&
        !(dt_strategy_spec_is_default(strategy) && dt_strategy_spec_is_default(info->strategy)) &&
        (dt_strategy_spec_canonical(strategy, now, sizeof now) != DT_OK ||
         dt_strategy_spec_canonical(info->strategy, then, sizeof then) != DT_OK || strcmp(now, then)))
        len += (size_t)snprintf(what, cap, "`strategy` %s (the checkpoint's run: %s)", strategy, info->strategy);
    dt_error_clear();
    if (info->has_settings) {
        const dt_lr_schedule *l = &c->lr, *w = &info->sched;
        const dt_optim_config *o = &c->optim, *p = &info->optim_cfg;
        note_change(what, cap, &len, "lr", l->base_lr, w->base_lr);
        if (l->kind != w->kind && len < cap)
            len += (size_t)snprintf(what + len, cap - len, "%sanother `schedule`", len ? "; " : "");
        note_change(what, cap, &len, "warmup", (double)l->warmup_steps, (double)w->warmup_steps);
        if (l->kind == DT_LR_STEP)
            note_change(what, cap, &len, "step_size", (double)l->step_size, (double)w->step_size);
        if (l->kind == DT_LR_STEP) note_change(what, cap, &len, "gamma", l->gamma, w->gamma);
        if (l->kind == DT_LR_COSINE) note_change(what, cap, &len, "min_lr", l->min_lr, w->min_lr);
        if (o->kind == p->kind && o->kind == DT_OPTIM_SGD) {
            note_change(what, cap, &len, "momentum", o->momentum, p->momentum);
            note_change(what, cap, &len, "nesterov", o->nesterov, p->nesterov);
        }
        if (o->kind == p->kind && o->kind != DT_OPTIM_SGD) {
            note_change(what, cap, &len, "beta1", o->beta1, p->beta1);
            note_change(what, cap, &len, "beta2", o->beta2, p->beta2);
            note_change(what, cap, &len, "eps", o->eps, p->eps);
        }
        if (o->kind == p->kind) note_change(what, cap, &len, "weight_decay", o->weight_decay, p->weight_decay);
        note_change(what, cap, &len, "clip_norm", c->clip_norm, info->clip);
        const bool text = c->data && (!strncmp(c->data, "text:", 5) || !strcmp(c->data, "kjv"));
        if (text && info->val_fraction >= 0) /* another held-out part: other training windows */
            note_change(what, cap, &len, "val_fraction", c->val_fraction, info->val_fraction);
        if (info->step_in_epoch == 0)
            note_change(what, cap, &len, "grad_accum", c->grad_accum > 1 ? c->grad_accum : 1, info->grad_accum);
        const char *prec = dt_ckpt_precision_name(c->precision);
        if (info->precision[0] && prec && strcmp(prec, info->precision) && len < cap)
            len += (size_t)snprintf(what + len, cap - len, "%s`precision` %s (the checkpoint's run: %s)",
                                    len ? "; " : "", prec, info->precision);
    }
    const float lr = dt_lr_at(&c->lr, info->step);
    if (!len && info->lr > 0 && fabsf(lr - info->lr) > 1e-6f * info->lr)
        len += (size_t)snprintf(what + len, cap - len,
                                "the learning rate at step %lld is %g with these flags "
                                "(`lr`, `schedule`, `warmup`, `epochs`), the checkpoint's run used %g",
                                (long long)info->step, lr, info->lr);
    if (info->seed != c->seed && len < cap)
        len += (size_t)snprintf(what + len, cap - len, "%s`seed` %llu (the checkpoint's run: %llu)", len ? "; " : "",
                                (unsigned long long)c->seed, (unsigned long long)info->seed);
    /* the stored batch is a step's (--batch x --grad-accum): what a step trains is compared, and
     * named in the flags of both runs (a changed --grad-accum alone is noted above) */
    const int accum = c->grad_accum > 1 ? c->grad_accum : 1, then_accum = info->grad_accum > 1 ? info->grad_accum : 1;
    if (info->batch <= 0 || info->batch == c->batch * accum || info->step_in_epoch != 0 || len >= cap) return;
    if (info->has_settings && info->batch % then_accum == 0 && (accum > 1 || then_accum > 1))
        snprintf(what + len, cap - len,
                 "%s`batch` %d x `grad_accum` %d = %d samples a step (the checkpoint's run: "
                 "%d x %d = %d)",
                 len ? "; " : "", c->batch, accum, c->batch * accum, info->batch / then_accum, then_accum, info->batch);
    else if (info->has_settings)
        snprintf(what + len, cap - len, "%s`batch` %d (the checkpoint's run: %d)", len ? "; " : "", c->batch * accum,
                 info->batch);
    else
        snprintf(what + len, cap - len, "%s%d samples a step (`batch` x `grad_accum`; the checkpoint's run: %d)",
                 len ? "; " : "", c->batch * accum, info->batch);
}
