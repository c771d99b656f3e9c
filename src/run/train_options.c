/* dt_train_options (dtrain/train_options.h): a dt_train_config set by flag name from strings,
 * owning its strings, and dt_train_local, training a config on N local workers. */
#include "dtrain/launch.h"
#include "dtrain/train_options.h"
#include "run/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STRS 16 /* string fields of a config */

struct dt_train_options {
    dt_train_config cfg;
    char *strs[MAX_STRS]; /* owned copies, by string key index */
};

typedef enum { K_STR, K_INT, K_I64, K_FLOAT, K_DOUBLE, K_U64, K_BOOL, K_OPTIM, K_SCHED } key_kind;
typedef struct {
    const char *name;
    key_kind kind;
    size_t off; /* offset of the field in dt_train_config */
} key_def;

#define F(field) offsetof(dt_train_config, field)
static const key_def g_keys[] = {
    {"data", K_STR, F(data)},
    {"model", K_STR, F(model)},
    {"save", K_STR, F(save)},
    {"resume", K_STR, F(resume)},
    {"metrics", K_STR, F(metrics)},
    {"strategy", K_STR, F(strategy)},
    {"timeline", K_STR, F(timeline)},
    {"checkpoint-dir", K_STR, F(checkpoint_dir)},
    {"epochs", K_INT, F(epochs)},
    {"batch", K_INT, F(batch)},
    {"grad-accum", K_INT, F(grad_accum)},
    {"threads", K_INT, F(threads)},
    {"keep", K_INT, F(keep)},
    {"max-steps", K_I64, F(max_steps)},
    {"epoch-windows", K_I64, F(epoch_windows)},
    {"checkpoint-every", K_I64, F(checkpoint_every)},
    {"checkpoint-secs", K_DOUBLE, F(checkpoint_secs)},
    {"val-fraction", K_DOUBLE, F(val_fraction)},
    {"seed", K_U64, F(seed)},
    {"normalize", K_BOOL, F(normalize)},
    {"clip", K_FLOAT, F(clip_norm)},
    {"lr", K_FLOAT, F(lr.base_lr)},
    {"warmup", K_I64, F(lr.warmup_steps)},
    {"step-size", K_I64, F(lr.step_size)},
    {"gamma", K_FLOAT, F(lr.gamma)},
    {"min-lr", K_FLOAT, F(lr.min_lr)},
    {"schedule", K_SCHED, F(lr.kind)},
    {"optimizer", K_OPTIM, F(optim)},
    {"momentum", K_FLOAT, F(optim.momentum)},
    {"nesterov", K_BOOL, F(optim.nesterov)},
    {"weight-decay", K_FLOAT, F(optim.weight_decay)},
    {"beta1", K_FLOAT, F(optim.beta1)},
    {"beta2", K_FLOAT, F(optim.beta2)},
    {"eps", K_FLOAT, F(optim.eps)},
};
#undef F
#define NKEYS ((int)(sizeof g_keys / sizeof *g_keys))

dt_status dt_train_options_create(dt_train_options **o) {
    *o = calloc(1, sizeof **o);
    if (!*o) return dt_error(DT_ENOMEM, "dt_train_options_create: out of memory");
    (*o)->cfg = dt_train_defaults();
    return DT_OK;
}

void dt_train_options_destroy(dt_train_options *o) {
    if (!o) return;
    for (int i = 0; i < MAX_STRS; i++) free(o->strs[i]);
    free(o);
}

const char *dt_train_options_keys(void) {
    static char keys[1024];
    if (!keys[0])
        for (int i = 0; i < NKEYS; i++) {
            if (i) strcat(keys, " ");
            strcat(keys, g_keys[i].name);
        }
    return keys;
}

/* The key without "--", with '_' read as '-', into out[cap]. */
static void normalize_key(const char *key, char *out, size_t cap) {
    if (!strncmp(key, "--", 2)) key += 2;
    size_t i = 0;
    for (; key[i] && i + 1 < cap; i++) out[i] = key[i] == '_' ? '-' : key[i];
    out[i] = 0;
}

static dt_status bad_value(const char *key, const char *value, const char *want) {
    return dt_error(DT_EINVAL, "`%s` %s: %s", key, value, want);
}

/* Parses value for a numeric or boolean key into the field at p. */
static dt_status set_number(const key_def *k, void *p, const char *value) {
    char *end;
    errno = 0;
    if (k->kind == K_BOOL) {
        if (strcmp(value, "1") && strcmp(value, "0") && strcmp(value, "true") && strcmp(value, "false"))
            return bad_value(k->name, value, "need 1/0 or true/false");
        *(bool *)p = !strcmp(value, "1") || !strcmp(value, "true");
        return DT_OK;
    }
    if (k->kind == K_FLOAT || k->kind == K_DOUBLE) {
        double v = strtod(value, &end);
        if (errno || end == value || *end || !isfinite(v)) return bad_value(k->name, value, "need a number");
        if (k->kind == K_FLOAT) *(float *)p = (float)v;
        else *(double *)p = v;
        return DT_OK;
    }
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end) return bad_value(k->name, value, "need an integer");
    if (k->kind == K_INT) {
        if (v < INT32_MIN || v > INT32_MAX) return bad_value(k->name, value, "out of range");
        *(int *)p = (int)v;
    } else if (k->kind == K_U64) {
        if (v < 0) return bad_value(k->name, value, "must not be negative");
        *(uint64_t *)p = (uint64_t)v;
    } else {
        *(int64_t *)p = v;
    }
    return DT_OK;
}

dt_status dt_train_options_set(dt_train_options *o, const char *key, const char *value) {
    char name[64];
    normalize_key(key ? key : "", name, sizeof name);
    if (!value) return dt_error(DT_EINVAL, "`%s`: no value given", name);
    int i = 0, si = 0;
    for (; i < NKEYS && strcmp(g_keys[i].name, name); i++) si += g_keys[i].kind == K_STR;
    if (i == NKEYS)
        return dt_error(DT_EINVAL, "unknown training option '%s'; the options are: %s", name, dt_train_options_keys());
    const key_def *k = &g_keys[i];
    void *p = (char *)&o->cfg + k->off;
    if (k->kind == K_STR) {
        char *copy = strdup(value);
        if (!copy) return dt_error(DT_ENOMEM, "`%s`: out of memory", name);
        free(o->strs[si]);
        o->strs[si] = copy;
        *(const char **)p = copy;
        return DT_OK;
    }
    if (k->kind == K_OPTIM) {
        dt_optim_kind kind;
        DT_TRY(dt_optim_parse(value, &kind));
        o->cfg.optim = dt_optim_defaults(kind);
        return DT_OK;
    }
    if (k->kind == K_SCHED) return dt_lr_parse(value, &o->cfg.lr.kind);
    return set_number(k, p, value);
}

void dt_train_options_set_data(dt_train_options *o, dt_dataset *train, dt_dataset *test) {
    o->cfg.train_set = train, o->cfg.test_set = test;
}

dt_train_config *dt_train_options_config(dt_train_options *o) { return &o->cfg; }

/* One worker of dt_train_local: the trainer over this worker's communicator, run to the end. */
static dt_status train_worker(dt_comm *comm, void *ctx) {
    dt_train_config c = *(const dt_train_config *)ctx;
    c.comm = comm;
    c.on_progress = NULL, c.on_epoch = NULL, c.on_note = NULL;
    dt_trainer *t = NULL;
    DT_TRY(dt_trainer_create(&t, &c));
    dt_status s = dt_trainer_run(t);
    dt_trainer_destroy(t);
    return s;
}

dt_status dt_train_local(const dt_train_config *cfg, int workers, double timeout_s) {
    DT_TRY(dt_train_config_check_layout(cfg, "dt_train_local")); /* before a copy of its bytes */
    if (workers < 1) return dt_error(DT_EINVAL, "`workers` %d: need at least 1", workers);
    if (workers == 1) {
        dt_train_config c = *cfg;
        c.comm = NULL;
        dt_trainer *t = NULL;
        DT_TRY(dt_trainer_create(&t, &c));
        dt_status s = dt_trainer_run(t);
        dt_trainer_destroy(t);
        return s;
    }
    return dt_launch_workers(workers, train_worker, (void *)cfg, timeout_s);
}
