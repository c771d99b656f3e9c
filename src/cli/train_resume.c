/* dtrain train --resume FILE continues the run that wrote FILE: the flags a user leaves out
 * are that run's, not dtrain's defaults (--model already was; --precision too). */
#include "cli/train_resume.h"

#include "cli/cli.h"
#include "run/checkpoint.h"
#include "run/ckpt_dir.h"

#include <stdio.h>
#include <string.h>

#define GIVEN(flag) dt_cli_flag_given(argc, argv, flag)

/* The optimizer and its hyper-parameters: another kind first takes that kind's defaults for the
 * ones not given, then the checkpoint's own values where it stores them. */
static void take_optimizer(int argc, char **argv, dt_train_config *c, const dt_ckpt_info *info) {
    dt_optim_config *o = &c->optim;
    dt_optim_kind kind;
    if (!GIVEN("optimizer") && info->optimizer[0] && dt_optim_parse(info->optimizer, &kind) == DT_OK &&
        kind != o->kind) {
        const dt_optim_config d = dt_optim_defaults(kind);
        o->kind = kind;
        if (!GIVEN("momentum")) o->momentum = d.momentum;
        if (!GIVEN("nesterov")) o->nesterov = d.nesterov;
        if (!GIVEN("weight-decay")) o->weight_decay = d.weight_decay;
        if (!GIVEN("beta1")) o->beta1 = d.beta1;
        if (!GIVEN("beta2")) o->beta2 = d.beta2;
        if (!GIVEN("eps")) o->eps = d.eps;
    }
    if (!info->has_settings || info->optim_cfg.kind != o->kind) return; /* another optimizer: refused later */
    const dt_optim_config *p = &info->optim_cfg;
    if (!GIVEN("momentum")) o->momentum = p->momentum;
    if (!GIVEN("nesterov")) o->nesterov = p->nesterov;
    if (!GIVEN("weight-decay")) o->weight_decay = p->weight_decay;
    if (!GIVEN("beta1")) o->beta1 = p->beta1;
    if (!GIVEN("beta2")) o->beta2 = p->beta2;
    if (!GIVEN("eps")) o->eps = p->eps;
}

/* The checkpoint's strategy spec when the command line named none and it is one a data-parallel
 * resume continues as it was: ddp or localsgd with options (--compress, --sync-every,
 * --bucket-mb, --allreduce). Layouts stay the flags' to choose, as a resume may change them: ZeRO,
 * tp, pp, and ps (whose servers are ranks the launcher counts before any checkpoint is read).
 * Static storage. */
static const char *strategy_to_take(const dt_train_config *c, const dt_ckpt_info *info) {
    static char spec[sizeof info->strategy];
    dt_strategy_class k;
    if (c->strategy || !info->strategy[0] || dt_strategy_spec_is_default(info->strategy) ||
        dt_strategy_spec_class(info->strategy, &k) != DT_OK)
        return dt_error_clear(), NULL;
    if (k != DT_STRATEGY_REPLICAS || strstr(info->strategy, "zero=")) return NULL;
    snprintf(spec, sizeof spec, "%s", info->strategy);
    return spec;
}

bool dt_cli_resume_settings(int argc, char **argv, dt_train_config *c) {
    if (!c->resume) return false;
    char path[4096];
    bool found = true;
    bool from_dir;
    if (strcmp(c->resume, "auto") != 0) found = dt_checkpoint_resolve(c->resume, path, sizeof path, &from_dir) == DT_OK;
    else if (!c->checkpoint_dir ||
             dt_ckpt_dir_latest(c->checkpoint_dir, path, sizeof path, &found, NULL, NULL) != DT_OK)
        found = false;
    dt_ckpt_info info;
    if (!found || dt_checkpoint_read_info(path, &info) != DT_OK) {
        dt_error_clear();
        return false;
    }
    take_optimizer(argc, argv, c, &info);
    static char data[sizeof info.data]; /* the data set it trained on (--data left out) */
    if (!GIVEN("data") && info.data[0] && dt_cli_checkpoint_data_here(path, info.data))
        c->data = strcpy(data, info.data);
    if (!GIVEN("seed")) c->seed = info.seed;
    if (info.has_settings) {
        const dt_lr_schedule *w = &info.sched;
        if (!GIVEN("lr")) c->lr.base_lr = w->base_lr;
        if (!GIVEN("schedule")) c->lr.kind = w->kind;
        if (!GIVEN("warmup")) c->lr.warmup_steps = w->warmup_steps;
        if (!GIVEN("step-size")) c->lr.step_size = w->step_size;
        if (!GIVEN("gamma")) c->lr.gamma = w->gamma;
        if (!GIVEN("min-lr")) c->lr.min_lr = w->min_lr;
        if (!GIVEN("clip")) c->clip_norm = info.clip;
        if (!GIVEN("grad-accum")) c->grad_accum = info.grad_accum;
        if (!GIVEN("precision") && info.precision[0]) c->precision = dt_ckpt_precision_name(info.precision);
        if (!GIVEN("val-fraction") && info.val_fraction >= 0) c->val_fraction = info.val_fraction;
    }
    /* the stored batch is a step's: --batch x --grad-accum */
    const int accum = c->grad_accum > 1 ? c->grad_accum : 1;
    if (!GIVEN("batch") && info.batch > 0 && info.batch % accum == 0) c->batch = info.batch / accum;
    const char *spec = strategy_to_take(c, &info);
    if (spec) c->strategy = spec;
    return spec != NULL;
}
