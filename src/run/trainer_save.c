/* The trainer's checkpoints: what one records of the run (dt_ckpt_info: position, settings,
 * strategy, data set) and the writes, whole or sharded, plain or numbered in --checkpoint-dir. */
#include "run/trainer_internal.h"

#include "run/checkpoint.h"
#include "run/ckpt_dir.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* data (a --data value) into out with files as absolute paths (symbolic links kept), so a later
 * eval or resume from another directory finds them: text:FILE, tokens:DIR, each path of npy:A,B..,
 * a .csv or an IDX directory that exists; names such as kjv or fashion-mnist as they are; "" for
 * NULL or a value that does not fit. */
static void data_name_absolute(const char *data, char *out, size_t cap) {
    out[0] = '\0';
    if (!data) return;
    static const char *prefixes[] = {"text:", "tokens:", "npy:"};
    size_t pre = 0;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (!strncmp(data, prefixes[i], strlen(prefixes[i]))) pre = strlen(prefixes[i]);
    if (!pre && (!strcmp(data, "kjv") || !strcmp(data, "fashion-mnist") || !strcmp(data, "mnist"))) pre = strlen(data);
    char cwd[PATH_MAX],
        part[PATH_MAX]; /* absolute, links kept (train.csv -> a store blob keeps its name and test.csv) */
    const bool have_cwd = getcwd(cwd, sizeof cwd) != NULL;
    size_t n = (size_t)snprintf(out, cap, "%.*s", (int)pre, data);
    const bool list = !strncmp(data, "npy:", 4); /* comma-separated paths */
    for (const char *p = data + pre; *p && n < cap;) {
        size_t len = list ? strcspn(p, ",") : strlen(p);
        snprintf(part, sizeof part, "%.*s", (int)len, p);
        struct stat st;
        const bool rel = part[0] != '/' && have_cwd && stat(part, &st) == 0;
        n += (size_t)snprintf(out + n, cap - n, "%s%s%s%s", p == data + pre ? "" : ",", rel ? cwd : "", rel ? "/" : "",
                              part);
        p += len + (p[len] == ',');
    }
    if (n >= cap) out[0] = '\0';
}

static void fill_info(const dt_trainer *t, dt_ckpt_info *info) {
    memset(info, 0, sizeof *info);
    snprintf(info->spec, sizeof info->spec, "%s", dt_model_spec(t->model));
    info->C = t->C, info->H = t->H, info->W = t->W;
    info->step = t->step;
    info->epoch = t->epoch;
    info->step_in_epoch = t->step_in_epoch;
    info->seed = t->cfg.seed;
    info->batch = dt_trainer_step_batch(t);
    info->world_size = t->dworld; /* data-parallel ranks (ps: the workers) */
    snprintf(info->optimizer, sizeof info->optimizer, "%s", dt_optim_name(t->cfg.optim.kind));
    info->lr = dt_lr_at(&t->cfg.lr, t->step);
    info->has_settings = true;
    info->sched = t->cfg.lr;
    info->optim_cfg = t->cfg.optim;
    info->clip = t->cfg.clip_norm;
    info->grad_accum = t->cfg.grad_accum > 1 ? t->cfg.grad_accum : 1;
    const char *prec = dt_ckpt_precision_name(t->cfg.precision);
    snprintf(info->precision, sizeof info->precision, "%s", prec ? prec : "");
    const char *strategy = dt_trainer_strategy_spec(t); /* a spec too long to keep is not kept (not cut) */
    if (strlen(strategy) < sizeof info->strategy) snprintf(info->strategy, sizeof info->strategy, "%s", strategy);
    data_name_absolute(t->cfg.data, info->data, sizeof info->data);
    info->val_fraction = t->cfg.val_fraction;
    info->has_norm = t->has_norm;
    info->norm_mean = t->norm_mean, info->norm_std = t->norm_std;
    info->val_split = t->val ? t->cfg.val_split : 0;
    info->best_val = t->best_val, info->best_epoch = t->best_epoch, info->bad_epochs = t->bad_epochs;
}

dt_status dt_trainer_save(dt_trainer *t, const char *path) {
    dt_ckpt_info info;
    fill_info(t, &info);
    if (t->strategy->shards_state && t->strategy->comm) DT_TRY(dt_checkpoint_write_sharded(path, t->strategy, &info));
    else DT_TRY(dt_checkpoint_write_strategy(path, t->strategy, &info));
    snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", path);
    return DT_OK;
}

/* Rank 0 writes the next numbered checkpoint into checkpoint_dir and prunes old ones. */
dt_status dt_trainer_save_numbered(dt_trainer *t) {
    if (t->strategy->ops->sync) DT_TRY(t->strategy->ops->sync(t->strategy)); /* localsgd: average first */
    t->last_ckpt_time = dt_now();
    t->saved_step = t->step;
    if (t->rank != 0 && !t->strategy->shards_state) return DT_OK;
    char path[4096];
    dt_ckpt_dir_path(path, sizeof path, t->cfg.checkpoint_dir, t->step);
    DT_TRY(dt_trainer_save(t, path));
    if (t->rank != 0) return DT_OK; /* a sharded checkpoint: rank 0 prunes */
    return dt_ckpt_dir_prune(t->cfg.checkpoint_dir, t->cfg.keep);
}
