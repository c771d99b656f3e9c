/* A checkpoint's metadata reads back whatever a run may write: each value at the legal extremes
 * that dtrain train accepts (--lr, --min-lr 0, --gamma 0, --warmup 0, --momentum 0, epoch 0, the
 * scheduled rate 0 at the end of a cosine run, ...) is written and read back equal, so no run's
 * own checkpoint is refused as damaged (issue 37). Values no run writes are still refused. */
#include "core/test.h"
#include "run/checkpoint.h"
#include "run/ckpt_dir.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *SPEC = "linear(3)";

/* The info of a run with every value at its low (hi = false) or high end. */
static dt_ckpt_info extreme_info(bool hi, dt_optim_kind kind) {
    dt_ckpt_info in = {.C = 1, .H = 1, .W = hi ? 1 << 16 : 1, .has_settings = true};
    snprintf(in.spec, sizeof in.spec, "%s", SPEC);
    snprintf(in.optimizer, sizeof in.optimizer, "%s", dt_optim_name(kind));
    in.step = hi ? INT64_MAX / 2 : 0, in.epoch = hi ? INT32_MAX : 0, in.step_in_epoch = hi ? INT64_MAX / 2 : 0;
    in.seed = hi ? UINT64_MAX : 0;
    in.batch = hi ? INT32_MAX : 1, in.world_size = hi ? 1 << 24 : 1;
    in.lr = hi ? FLT_MAX : 0.0f; /* the scheduled rate: 0 at the end of a cosine run to --min-lr 0 */
    in.has_norm = 1, in.norm_mean = hi ? FLT_MAX : -FLT_MAX, in.norm_std = hi ? FLT_MAX : FLT_TRUE_MIN;
    in.val_split = hi ? nextafter(1.0, 0.0) : DBL_MIN,
    in.best_val = hi ? 0.0f : INFINITY; /* none before its first validated epoch */
    in.best_epoch = hi ? INT32_MAX : 0, in.bad_epochs = hi ? INT32_MAX : 0;
    in.sched = (dt_lr_schedule){.kind = hi ? DT_LR_COSINE : DT_LR_STEP,
                                .base_lr = hi ? FLT_MAX : FLT_TRUE_MIN,
                                .warmup_steps = hi ? INT64_MAX : 0,
                                .step_size = hi ? INT64_MAX : 0,
                                .gamma = hi ? 1.0f : 0.0f,
                                .min_lr = hi ? FLT_MAX : 0.0f};
    in.optim_cfg = (dt_optim_config){.kind = kind,
                                     .momentum = hi ? nextafterf(1.0f, 0.0f) : 0.0f,
                                     .nesterov = hi,
                                     .weight_decay = hi ? FLT_MAX : 0.0f,
                                     .beta1 = hi ? nextafterf(1.0f, 0.0f) : 0.0f,
                                     .beta2 = hi ? nextafterf(1.0f, 0.0f) : 0.0f,
                                     .eps = kind == DT_OPTIM_SGD ? -FLT_MAX
                                            : hi                 ? FLT_MAX
                                                                 : FLT_TRUE_MIN};
    in.clip = hi ? FLT_MAX : 0.0f, in.grad_accum = hi ? 65536 : 1, in.val_fraction = hi ? 0.5 : 0.0;
    snprintf(in.precision, sizeof in.precision, "%s", hi ? "fp16" : "bf16");
    snprintf(in.strategy, sizeof in.strategy, "%s", hi ? "ddp(compress=topk:0.1)" : "single");
    snprintf(in.data, sizeof in.data, "%s", "/data/train.csv");
    return in;
}

/* Writes in, reads it back and checks every field came back as written. */
static void round_trip(const char *path, dt_model *m, dt_optim *o, const dt_ckpt_info *in, const char *what) {
    dt_status s = dt_checkpoint_write(path, m, o, in);
    CHECK_MSG(s == DT_OK, "%s: write: %s", what, dt_last_error());
    dt_ckpt_info got;
    s = dt_checkpoint_read_info(path, &got);
    CHECK_MSG(s == DT_OK, "%s: read: %s", what, dt_last_error());
    if (s != DT_OK) return;
#define SAME(field) CHECK_MSG(got.field == in->field, "%s: " #field " came back other than written", what)
    SAME(C);
    SAME(H);
    SAME(W);
    SAME(step);
    SAME(epoch);
    SAME(step_in_epoch);
    SAME(seed);
    SAME(batch);
    SAME(world_size);
    SAME(lr);
    SAME(has_norm);
    SAME(norm_mean);
    SAME(norm_std);
    SAME(val_split);
    SAME(best_val);
    SAME(best_epoch);
    SAME(bad_epochs);
    SAME(has_settings);
    SAME(sched.kind);
    SAME(sched.base_lr);
    SAME(sched.warmup_steps);
    SAME(sched.step_size);
    SAME(sched.gamma);
    SAME(sched.min_lr);
    SAME(optim_cfg.kind);
    SAME(optim_cfg.momentum);
    SAME(optim_cfg.nesterov);
    SAME(optim_cfg.weight_decay);
    SAME(optim_cfg.beta1);
    SAME(optim_cfg.beta2);
    SAME(optim_cfg.eps);
    SAME(clip);
    SAME(grad_accum);
    SAME(val_fraction);
#undef SAME
    CHECK_MSG(!strcmp(got.spec, in->spec) && !strcmp(got.optimizer, in->optimizer) &&
                  !strcmp(got.precision, in->precision) && !strcmp(got.strategy, in->strategy) &&
                  !strcmp(got.data, in->data),
              "%s: a text field came back other than written", what);
}

/* A value no run writes is still refused, naming its key. */
static void refused(const char *path, dt_model *m, dt_optim *o, dt_ckpt_info in, const char *key) {
    CHECK_OK(dt_checkpoint_write(path, m, o, &in));
    dt_ckpt_info got;
    dt_status s = dt_checkpoint_read_info(path, &got);
    CHECK_MSG(s == DT_EFORMAT && strstr(dt_last_error(), key), "%s: %s", key, s ? dt_last_error() : "accepted");
}

static void note_skip(void *ctx, const char *path, const char *reason) {
    (void)path;
    snprintf(ctx, 256, "%s", reason);
}

/* --resume auto (dt_ckpt_dir_latest) skips a newer checkpoint it could not resume from, and says why. */
static void latest_skips_unusable(dt_model *m) {
    char dir[64], a[128], b[128], got[4096], why[256] = "";
    if (dt_test_mkdtemp(dir, sizeof dir, "/tmp/dt_ckmeta_dir.XXXXXX") != 0) return;
    dt_ckpt_dir_path(a, sizeof a, dir, 1), dt_ckpt_dir_path(b, sizeof b, dir, 2);
    dt_ckpt_info in = extreme_info(false, DT_OPTIM_ADAM);
    CHECK_OK(dt_checkpoint_write(a, m, NULL, &in));
    in.lr = -1; /* CRCs fine, a value no run writes */
    CHECK_OK(dt_checkpoint_write(b, m, NULL, &in));
    bool found = false;
    CHECK_OK(dt_ckpt_dir_latest(dir, got, sizeof got, &found, note_skip, why));
    CHECK_MSG(found && !strcmp(got, a) && strstr(why, "dtrain.lr"), "latest: %s (%s)", found ? got : "none", why);
    unlink(a), unlink(b), rmdir(dir);
}

int main(void) {
    dt_model *m;
    CHECK_OK(dt_model_create_from_spec(&m, SPEC, 1, 1, 1));
    char path[64];
    snprintf(path, sizeof path, "/tmp/dtrain-ckpt-meta-%d.st", (int)getpid());
    const dt_optim_kind kinds[] = {DT_OPTIM_SGD, DT_OPTIM_ADAM, DT_OPTIM_ADAMW};
    for (int k = 0; k < 3; k++)
        for (int hi = 0; hi < 2; hi++) {
            dt_optim_config oc = dt_optim_defaults(kinds[k]);
            dt_optim *o;
            CHECK_OK(dt_optim_create(&o, &oc, dt_model_num_params(m)));
            char what[64];
            snprintf(what, sizeof what, "%s, %s ends", dt_optim_name(kinds[k]), hi ? "high" : "low");
            const dt_ckpt_info in = extreme_info(hi, kinds[k]);
            round_trip(path, m, o, &in, what);
            dt_optim_destroy(o);
        }
    dt_ckpt_info bad = extreme_info(false, DT_OPTIM_ADAM);
    bad.lr = -1e-3f;
    refused(path, m, NULL, bad, "dtrain.lr");
    bad = extreme_info(false, DT_OPTIM_ADAM);
    bad.norm_std = 0;
    refused(path, m, NULL, bad, "dtrain.norm_std");
    bad = extreme_info(false, DT_OPTIM_ADAM);
    bad.sched.base_lr = 0;
    refused(path, m, NULL, bad, "lr=0");
    latest_skips_unusable(m);
    unlink(path);
    dt_model_destroy(m);
    return dt_test_summary("checkpoint_meta_test");
}
