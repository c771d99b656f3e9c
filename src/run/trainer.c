/* The trainer: loads data, builds model + optimizer (+ strategy), restores a checkpoint
 * (--resume FILE|auto, also on another world size). The checkpoints it writes are in
 * trainer_save.c, the epochs run in train_loop.c, evaluation in evaluate.c. */
#include "run/train_aids.h"
#include "run/trainer_internal.h"

#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "run/checkpoint.h"
#include "run/ckpt_dir.h"
#include "run/writable.h"
#include "device/device.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>

dt_train_config dt_train_defaults(void) {
    dt_train_config c = {
        .size = sizeof(dt_train_config),
        .version = DT_TRAIN_CONFIG_VERSION,
        .data = "fashion-mnist",
        .model = "mlp",
        .epochs = 1,
        .batch = 32,
        .grad_accum = 1,
        .val_fraction = 0.1,
        .optim = dt_optim_defaults(DT_OPTIM_ADAM),
        .lr = {.kind = DT_LR_CONSTANT, .base_lr = 1e-3f, .gamma = 0.1f},
        .seed = 42,
        .threads = 1,
        .progress_interval_s = 0.2,
    };
    return c;
}

/* DT_EINVAL when the caller's layout (size, version) is not this library's: what each is and what
 * to do. */
static dt_status layout_check(size_t size, unsigned version, const char *who) {
    if (size == sizeof(dt_train_config) && version == DT_TRAIN_CONFIG_VERSION) return DT_OK;
    if (size == 0 && version == 0)
        return dt_error(DT_EINVAL,
                        "%s: the dt_train_config was not set up (size 0): start from "
                        "dt_train_config_init(&cfg) or dt_train_defaults(), then set its fields",
                        who);
    return dt_error(DT_EINVAL,
                    "%s: the dt_train_config has size %zu and version %u, but this library (dtrain %s) "
                    "has size %zu and version %u: the caller was compiled against another dtrain/train.h; rebuild "
                    "it against this library's headers",
                    who, size, version, dt_version(), sizeof(dt_train_config), (unsigned)DT_TRAIN_CONFIG_VERSION);
}

dt_status dt_train_config_init_sized(dt_train_config *cfg, size_t size, unsigned version) {
    DT_TRY(layout_check(size, version, "dt_train_config_init"));
    *cfg = dt_train_defaults();
    return DT_OK;
}

dt_status dt_train_config_check_layout(const dt_train_config *cfg, const char *who) {
    return layout_check(cfg->size, cfg->version, who);
}

void dt_trainer_destroy(dt_trainer *t) {
    if (!t) return;
    dt_strategy_destroy(t->strategy);
    dt_balance_destroy(t->balance);
    free(t->workers);
    dt_trace_free(&t->trace);
    dt_loader_destroy(t->loader);
    dt_optim_destroy(t->optim);
    dt_model_destroy(t->model);
    dt_device_destroy(t->dev);
    if (!t->borrowed_data) {
        dt_dataset_destroy(t->train);
        dt_dataset_destroy(t->test);
    }
    dt_dataset_destroy(t->own_train);
    dt_dataset_destroy(t->val);
    free(t);
}

void dt_trainer_note(const dt_trainer *t, const char *fmt, ...) {
    if (t->rank != 0 || !t->cfg.on_note) return;
    char msg[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    t->cfg.on_note(t->cfg.cb_ctx, msg);
}

static void report_damaged(void *ctx, const char *path, const char *reason) {
    dt_trainer_note(ctx, "skipping damaged checkpoint %s: %s", path, reason);
}

/* Resolves cfg->resume into t->resume_path ("" = start fresh). */
static dt_status resolve_resume(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    t->resume_path[0] = '\0';
    if (!c->resume) return DT_OK;
    if (strcmp(c->resume, "auto") != 0) { /* a file, or a directory's newest usable checkpoint */
        bool from_dir;
        DT_TRY(dt_checkpoint_resolve(c->resume, t->resume_path, sizeof t->resume_path, &from_dir));
        if (from_dir) dt_trainer_note(t, "`resume` %s: its newest usable checkpoint, %s", c->resume, t->resume_path);
        return DT_OK;
    }
    if (!c->checkpoint_dir)
        return dt_error(DT_EINVAL, "`resume` auto needs `checkpoint_dir` DIR (where to look for checkpoints)");
    bool found;
    DT_TRY(dt_ckpt_dir_latest(c->checkpoint_dir, t->resume_path, sizeof t->resume_path, &found, report_damaged, t));
    if (!found) {
        t->resume_path[0] = '\0';
        dt_trainer_note(t, "no usable checkpoint in %s: starting from scratch", c->checkpoint_dir);
    }
    return DT_OK;
}

/* Fails early (not after an epoch) when the directory of an output file is missing or read-only,
 * or, for an output replaced by a rename (replaced), when it names a device, FIFO or descriptor
 * (dt_output_path; a symbolic link: the directory of the file it leads to). */
static dt_status check_writable(const char *flag, const char *path, bool replaced) {
    if (!path) return DT_OK;
    char file[4096], dir[4096];
    if (replaced) DT_TRY(dt_output_path(flag, path, file, sizeof file));
    else snprintf(file, sizeof file, "%s", path);
    struct stat st;
    if (!replaced && stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return DT_OK; /* appended to: /dev/stdout */
    int e = dt_path_probe_write(file, dir, sizeof dir);
    if (e) return dt_error(DT_EIO, "%s %s: cannot write into directory %s: %s", flag, path, dir, strerror(e));
    return DT_OK;
}

static dt_status check_config(const dt_train_config *c) {
    if (c->device && !dt_device_find(c->device)) return DT_EINVAL; /* before any data is read; it names the devices */
    if (c->epochs < 1) return dt_error(DT_EINVAL, "`epochs` %d: need at least 1", c->epochs);
    if (c->batch < 1) return dt_error(DT_EINVAL, "`batch` %d: need at least 1", c->batch);
    if (c->epoch_windows < 0)
        return dt_error(DT_EINVAL, "`epoch_windows` %lld: must not be negative (0 = all)", (long long)c->epoch_windows);
    if (!(c->val_fraction >= 0 && c->val_fraction <= 0.5))
        return dt_error(DT_EINVAL, "`val_fraction` %g: need 0..0.5 (the last part of the text held out)",
                        c->val_fraction);
    if (c->grad_accum < 1 || c->grad_accum > 65536)
        return dt_error(DT_EINVAL, "`grad_accum` %d: need 1..65536 micro-batches per step", c->grad_accum);
    if (c->grad_accum > 1 && (int64_t)c->batch * c->grad_accum > INT32_MAX / 4)
        return dt_error(DT_EINVAL, "`batch` %d x `grad_accum` %d samples per step is too large", c->batch,
                        c->grad_accum);
    if (!(c->lr.base_lr > 0) || !isfinite(c->lr.base_lr))
        return dt_error(DT_EINVAL, "`lr` %g: need a positive learning rate", c->lr.base_lr);
    if (c->threads < 1 || c->threads > 1024) return dt_error(DT_EINVAL, "`threads` %d: need 1..1024", c->threads);
    const dt_optim_config *o = &c->optim;
    if (!(o->momentum >= 0 && o->momentum < 1))
        return dt_error(DT_EINVAL, "`momentum` %g: need a value in [0, 1)", o->momentum);
    if (!(o->weight_decay >= 0)) return dt_error(DT_EINVAL, "`weight_decay` %g: must not be negative", o->weight_decay);
    if (o->kind != DT_OPTIM_SGD && !(o->eps > 0))
        return dt_error(DT_EINVAL, "`eps` %g: adam/adamw need a positive epsilon (default 1e-8)", o->eps);
    if (!(c->clip_norm >= 0))
        return dt_error(DT_EINVAL, "`clip_norm` %g: must not be negative (0 = off)", c->clip_norm);
    if (c->lr.warmup_steps < 0)
        return dt_error(DT_EINVAL, "`warmup` %lld: must not be negative", (long long)c->lr.warmup_steps);
    if (c->lr.kind == DT_LR_STEP && c->lr.step_size <= 0)
        return dt_error(DT_EINVAL, "`schedule` step needs `step_size` STEPS > 0");
    /* whatever schedule: the checkpoint stores these and reads back only what is legal here */
    if (c->lr.step_size < 0)
        return dt_error(DT_EINVAL, "`step_size` %lld: must not be negative", (long long)c->lr.step_size);
    if (!(c->lr.gamma >= 0 && c->lr.gamma <= 1))
        return dt_error(DT_EINVAL, "`gamma` %g: need a decay factor in [0, 1] (e.g. 0.1)", c->lr.gamma);
    if (!(c->lr.min_lr >= 0) || !isfinite(c->lr.min_lr))
        return dt_error(DT_EINVAL, "`min_lr` %g: need a final learning rate >= 0", c->lr.min_lr);
    if (c->weights && c->resume)
        return dt_error(DT_EINVAL,
                        "`weights` %s starts a new run from plain weights, `resume` %s continues one: pass "
                        "one of them",
                        c->weights, c->resume);
    if (c->max_steps < 0) return dt_error(DT_EINVAL, "`max_steps` %lld: must not be negative", (long long)c->max_steps);
    if (c->log_every < 0 || c->eval_every < 0 || c->eval_batches < 0)
        return dt_error(DT_EINVAL,
                        "`log_every` %lld, `eval_every` %lld, `eval_batches` %lld: none may be negative "
                        "(0 = off, the whole set for `eval_batches`)",
                        (long long)c->log_every, (long long)c->eval_every, (long long)c->eval_batches);
    DT_TRY(check_writable("`save`", c->save, true));
    DT_TRY(check_writable("`metrics`", c->metrics, false)); /* appended (a resume rewrites a file only) */
    DT_TRY(check_writable("`timeline`", c->timeline, true));
    DT_TRY(check_writable("`save_weights`", c->save_weights, true));
    if ((c->checkpoint_every > 0 || c->checkpoint_secs > 0 || c->keep > 0) && !c->checkpoint_dir)
        return dt_error(DT_EINVAL, "`checkpoint_every`/`checkpoint_secs`/`keep` need `checkpoint_dir` DIR");
    if (c->checkpoint_every < 0 || c->checkpoint_secs < 0 || c->keep < 0)
        return dt_error(DT_EINVAL, "`checkpoint_every`, `checkpoint_secs` and `keep` must not be negative");
    return DT_OK;
}

static bool scales_loss(const dt_strategy_entry *e, const void *arg) {
    (void)arg;
    return e->loss_scaling;
}

/* Uneven workers: which ranks reduce together, the balancer of training ranks (its spec's
 * balance=dynamic: entry.balanced), and the options a strategy cannot take. */
static dt_status setup_uneven(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    const dt_role role = t->strategy->role;
    const char *name = t->strategy->ops->name;
    t->dcomm = role == DT_ROLE_REPLICA && t->world > 1 ? c->comm : NULL;
    if (role != DT_ROLE_REPLICA && (c->timeline || c->checkpoint_dir))
        return dt_error(DT_EINVAL, "`strategy` %s does not support `%s` yet%s", name,
                        c->timeline ? "timeline" : "checkpoint_dir",
                        c->timeline ? "" : " (use `save` FILE, written after every epoch and on SIGTERM)");
    const bool slow = c->aids && c->aids->slow_factor > 1 && c->aids->slow_rank == t->rank; /* a test aid */
    if (role == DT_ROLE_SERVER) {
        if (slow)
            return dt_error(DT_EINVAL, "`slow` %d:%g: rank %d is a ps server; pick a worker rank (%d..%d)",
                            c->aids->slow_rank, c->aids->slow_factor, t->rank, t->world - t->dworld, t->world - 1);
        return DT_OK;
    }
    dt_balance_config bc = {.rank = t->drank,
                            .world = t->dworld,
                            .job_rank0 = t->strategy->job_rank0,
                            .batch = c->batch,
                            .dynamic = t->balanced,
                            .slow = slow ? c->aids->slow_factor : 1};
    DT_TRY(dt_balance_create(&t->balance, &bc));
    if (!(t->workers = calloc((size_t)t->dworld, sizeof *t->workers)))
        return dt_error(DT_ENOMEM, "trainer: out of memory");
    return DT_OK;
}

/* Parses a model spec (gpt or sequential) without building it: a bad spec is reported before any
 * data is read. */
static dt_status check_spec(const char *spec) {
    if (dt_model_spec_is_gpt(spec)) {
        dt_gpt_config g;
        return dt_gpt_parse(spec, &g);
    }
    dt_layer_spec layers[DT_MAX_LAYERS];
    int n;
    return dt_spec_parse(spec, layers, DT_MAX_LAYERS, &n);
}

/* Opens --data for model `spec`: a text corpus (text:FILE, kjv) as windows of the GPT's context
 * with the last val_fraction as the test set, else an image/CSV data set. */
dt_status dt_trainer_open_data(const char *data, const char *spec, double val_fraction, dt_dataset **train,
                               dt_dataset **test) {
    const bool text = dt_data_is_text(data), gpt = dt_model_spec_is_gpt(spec);
    if (text != gpt)
        return dt_error(DT_EINVAL,
                        text ? "`data` %s is text (byte tokens) and model '%s' takes no token ids: use a "
                               "`model` gpt[:L=..,H=..,C=..,T=..] (or its checkpoint)"
                             : "`data` %s is not text and model '%s' reads token ids: give it `data` "
                               "text:FILE, `data` kjv or `data` tokens:DIR",
                        data, spec);
    if (!text) return dt_dataset_open(train, test, data);
    dt_gpt_config g;
    DT_TRY(dt_gpt_parse(spec, &g));
    if (!dt_data_is_tokens(data) && g.V < 256)
        return dt_error(DT_EINVAL, "`model` %s: V=%d, but text data has 256 byte values; use V=256", spec, g.V);
    return dt_dataset_open_text(train, test, data, g.T, val_fraction);
}

/* True when a GPT spec sets V= itself. */
static bool spec_sets_vocab(const char *spec) {
    const char *p = strchr(spec, ':');
    for (; p; p = strchr(p + 1, ','))
        if (!strncmp(p + 1, "V=", 2)) return true;
    return false;
}

/* Token files (16-bit token sets) and a GPT spec without V=: the spec with the data's vocabulary,
 * the largest token of the train and test sets + 1, in t->vocab_spec; else spec unchanged. */
static dt_status data_vocab_spec(dt_trainer *t, const char **spec) {
    if (!dt_model_spec_is_gpt(*spec) || !dt_dataset_is_text(t->train) || dt_dataset_dtype(t->train) != DT_I16 ||
        spec_sets_vocab(*spec))
        return DT_OK;
    dt_gpt_config g;
    DT_TRY(dt_gpt_parse(*spec, &g));
    g.V = dt_dataset_classes(t->train);
    if (t->test && dt_dataset_classes(t->test) > g.V) g.V = dt_dataset_classes(t->test);
    dt_gpt_format(t->vocab_spec, sizeof t->vocab_spec, &g);
    *spec = t->vocab_spec;
    return DT_OK;
}

/* The strategy spec this run trains with: the configured one, else ddp (more than one rank) or single. */
const char *dt_trainer_strategy_spec(const dt_trainer *t) {
    return t->cfg.strategy ? t->cfg.strategy : dt_strategy_default_name(t->world);
}

/* A resumed run whose flags change a training setting is no longer the run that wrote the
 * checkpoint: say once what changed (the resume itself is allowed: fine-tuning does exactly this;
 * the command line takes every setting it is not given from the checkpoint, so these are
 * deliberate). */
static void check_resume_changes(const dt_trainer *t, const dt_ckpt_info *info, const char *path) {
    char what[1024];
    dt_ckpt_settings_changes(info, &t->cfg, dt_trainer_strategy_spec(t), what, sizeof what);
    if (what[0])
        dt_trainer_note(t,
                        "resuming %s with other settings: %s. This continues as a different run, not the one "
                        "that wrote the checkpoint",
                        path, what);
}

/* The global batch must fit the training set, and the buffers it needs (the loader's prefetched
 * batches of float inputs, the loss's probabilities and gradients) must fit the memory that is
 * available: a huge --batch is an error naming it, not an allocation failure or an abort. */
static dt_status check_batch(const dt_trainer *t, int max_batch) {
    const dt_train_config *c = &t->cfg;
    const size_t n = dt_trainer_epoch_len(t), per = (size_t)dt_trainer_step_batch(t) / (size_t)c->batch;
    const long long global = (long long)dt_trainer_step_batch(t) * t->dworld;
    const char *accum = per > 1 ? " x `grad_accum`" : "";
    const char *what = n < dt_dataset_len(t->train) ? "an epoch (`epoch_windows`)" : "the training set";
    if (global > (long long)n) {
        if (t->dworld > 1)
            return dt_error(DT_EINVAL,
                            "`batch` %d%s x %d workers = %lld samples per step is more than %s (%zu samples "
                            "of `data` %s): use `batch` %zu or less",
                            c->batch, accum, t->dworld, global, what, n, c->data, n / (size_t)t->dworld / per);
        if (per > 1)
            return dt_error(DT_EINVAL,
                            "`batch` %d x `grad_accum` = %lld samples per step is more than %s (%zu samples "
                            "of `data` %s): use `batch` %zu or less",
                            c->batch, global, what, n, c->data, n / per);
        return dt_error(DT_EINVAL, "`batch` %d is more than %s (%zu samples of `data` %s): use `batch` %zu or less",
                        c->batch, what, n, c->data, n);
    }
    const double in = (double)t->C * t->H * t->W, slots = DT_LOADER_DEFAULT_PREFETCH + 1;
    const double need = (double)max_batch * (slots * (in + 1) + 2.0 * t->classes) * sizeof(float);
    struct sysinfo si;
    if (sysinfo(&si) == 0) {
        const double avail = ((double)si.freeram + (double)si.bufferram) * si.mem_unit;
        if (need > avail && need > 256e6)
            return dt_error(DT_ENOMEM,
                            "`batch` %d needs about %.1f GB for its input buffers alone, more than the %.1f GB "
                            "of free memory: use a smaller `batch`",
                            c->batch, need / 1e9, avail / 1e9);
    }
    return DT_OK;
}

/* The data set for model `spec` and its checks against a resumed checkpoint's input shape. */
static dt_status setup_data(dt_trainer *t, const char *spec, const char *resume, const dt_ckpt_info *info) {
    const dt_train_config *c = &t->cfg;
    if (c->train_set) {
        t->train = c->train_set, t->test = c->test_set, t->borrowed_data = true;
        if (dt_model_spec_is_gpt(spec) != dt_dataset_is_text(t->train))
            return dt_error(DT_EINVAL, "dt_train_config.train_set (%s) %s, but `model` %s %s", c->data,
                            dt_dataset_is_text(t->train) ? "is text" : "holds features", spec,
                            dt_model_spec_is_gpt(spec) ? "reads token ids" : "reads features");
    } else {
        DT_TRY(dt_trainer_open_data(c->data, spec, c->val_fraction, &t->train, &t->test));
    }
    DT_TRY(dt_trainer_split_val(t));
    dt_dataset_shape(t->train, &t->C, &t->H, &t->W);
    t->classes = dt_dataset_classes(t->train);
    if (c->normalize && dt_dataset_is_text(t->train))
        return dt_error(DT_EINVAL,
                        "`normalize` standardises image features, but `data` %s is token ids: drop `normalize`",
                        c->data);
    if (!resume) return DT_OK;
    if (info->C != t->C || info->H != t->H || info->W != t->W)
        return dt_error(DT_EMISMATCH, "%s: checkpoint expects inputs %dx%dx%d but `data` %s has %dx%dx%d", resume,
                        info->C, info->H, info->W, c->data, t->C, t->H, t->W);
    return DT_OK;
}

/* The model placed as the strategy says (only the part this rank holds is charged and
 * initialised: pipeline stages their tensors, tensor parallelism none of the whole model), and
 * the optimizer: a strategy that places keeps its optimizer state in optimizers of its own, so
 * the trainer's holds only what a resume restores for it to take (nothing on a fresh run). A
 * resume from a sharded (ZeRO) checkpoint, or --weights, places the whole model: they load every
 * tensor, and the strategy narrows it after taking its part. */
static dt_status place_model(dt_trainer *t, const dt_strategy_entry *se, const dt_strategy_opts *so, bool resume,
                             bool whole_load) {
    static const dt_range none = {0, 0};
    dt_range *own = NULL;
    int nown = 0;
    bool whole = true;
    /* on a device the model's slabs are whole device blocks, placed whole: ZeRO-2/3 then hold their
     * buckets in blocks of their own (parallel/zero_blocks.c); pp's stages hold the whole model there;
     * a strategy that is not device-neutral is refused by move_to_device */
    const bool on_device = t->cfg.device && strcmp(t->cfg.device, "cpu");
    if (!whole_load && !on_device)
        DT_TRY(dt_strategy_placement(se, so, t->model, t->rank, t->world, &own, &nown, &whole));
    const dt_range *part = whole ? NULL : own ? own : &none;
    dt_status s = dt_model_place(t->model, part, nown);
    if (s == DT_OK)
        s = dt_optim_create_placed(&t->optim, &t->cfg.optim, dt_model_num_params(t->model),
                                   whole    ? NULL
                                   : resume ? part
                                            : &none,
                                   whole || resume ? nown : 0);
    free(own);
    return s;
}

dt_status dt_trainer_check_loss(const dt_model *m, const dt_dataset *ds, const char *data) {
    const bool mse = dt_model_node_kind(m, dt_model_loss_node(m)) == DT_LAYER_MSE, targets = dt_dataset_has_targets(ds);
    if (mse && !targets)
        return dt_error(DT_EINVAL,
                        "model '%s' ends in mse (regression) but `data` %s holds class labels: give it float "
                        "targets (an IDX label file of floats), or end the model in linear(CLASSES) without mse",
                        dt_model_spec(m), data);
    if (!mse && targets)
        return dt_error(DT_EINVAL,
                        "`data` %s holds float targets (regression) but model '%s' ends in softmax "
                        "cross-entropy over classes: end its spec with linear(1) mse",
                        data, dt_model_spec(m));
    return DT_OK;
}

static bool device_neutral(const dt_strategy_entry *e, const void *arg) {
    (void)arg;
    return e->device_neutral;
}

/* --device: the model and optimizer moved onto it (before initialisation: the initial values are
 * uploaded), for a strategy whose registry entry says it is device-neutral. */
static dt_status move_to_device(dt_trainer *t, const dt_strategy_entry *se) {
    const char *spec = t->cfg.device;
    if (!spec || !strcmp(spec, "cpu")) return DT_OK;
    if (!se->device_neutral) {
        char names[128];
        dt_strategy_names_where(device_neutral, NULL, "and", names, sizeof names);
        return dt_error(DT_ENOTSUP,
                        "`device` %s: the %s strategy does not run on a device yet (its sharding and "
                        "staging still touch model memory from the host); strategies that do: %s; or use `device` "
                        "cpu",
                        spec, se->name, names);
    }
    DT_TRY(dt_device_create(&t->dev, spec));
    DT_TRY(dt_model_set_device(t->model, t->dev));
    return dt_optim_set_device(t->optim, t->dev);
}

/* The model (its outputs checked against the data's classes or targets), placed, initialised,
 * and its optimizer. */
static dt_status setup_model(dt_trainer *t, const char *spec, const dt_strategy_entry *se, const dt_strategy_opts *so,
                             const char *resume) {
    const dt_train_config *c = &t->cfg;
    DT_TRY(dt_model_build_unplaced(&t->model, spec, t->C, t->H, t->W));
    if (dt_model_num_params(t->model) == 0)
        return dt_error(DT_EINVAL, "model '%s' has no trainable parameters; add a linear or conv layer",
                        dt_model_spec(t->model));
    DT_TRY(dt_trainer_check_loss(t->model, t->train, c->data));
    const int nout = dt_model_classes(t->model);
    if (dt_dataset_has_targets(t->train)) {
        /* regression: one target a sample against the model's one output (the mse node checks) */
    } else if (nout > t->classes && t->classes > 0) {
        /* fewer classes in the data than outputs is fine (e.g. a subset): train with `out` classes */
        DT_TRY(dt_dataset_set_classes(t->train, nout));
        if (t->test) DT_TRY(dt_dataset_set_classes(t->test, nout));
        t->classes = nout;
    } else if (nout != t->classes) {
        /* a label beyond the model's outputs: name the first such sample (a corrupt label, or the
         * wrong model) */
        dt_status s = dt_dataset_set_classes(t->train, nout);
        if (s == DT_OK && t->test) s = dt_dataset_set_classes(t->test, nout);
        if (dt_dataset_is_text(t->train)) /* a GPT's V below a token of the data: the message names it */
            return dt_error_wrap(DT_EINVAL, "`model` %s: V=%d is too small for `data` %s", dt_model_spec(t->model),
                                 nout, c->data);
        return dt_error_wrap(DT_EFORMAT,
                             "model '%s' outputs %d classes but `data` %s has labels up to %d; if they are "
                             "right, end the spec with linear(%d)",
                             dt_model_spec(t->model), nout, c->data, t->classes - 1, t->classes);
    }
    DT_TRY(place_model(t, se, so, resume != NULL, (resume && dt_checkpoint_is_sharded(resume)) || c->weights));
    DT_TRY(move_to_device(t, se));
    dt_model_init(t->model, c->seed);
    if (c->weights) DT_TRY(dt_weights_load(t->model, c->weights)); /* fine-tuning: start from them */
    return DT_OK;
}

/* Input normalisation (--normalize, or as the resumed run had it) and the resumed state. */
static dt_status restore_and_normalize(dt_trainer *t, const char *resume, dt_ckpt_info *info) {
    const dt_train_config *c = &t->cfg;
    if (c->normalize) {
        double mean, sd;
        dt_dataset_stats(t->train, &mean, &sd);
        t->has_norm = true, t->norm_mean = (float)mean, t->norm_std = (float)sd;
    }
    if (resume) {
        DT_TRY(dt_checkpoint_restore(resume, t->model, t->optim, info));
        t->step = info->step, t->epoch = info->epoch, t->step_in_epoch = info->step_in_epoch;
        snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", resume);
        if (c->normalize && !info->has_norm)
            return dt_error(DT_EINVAL, "%s: this run was trained without `normalize`; leave it out to resume it",
                            resume);
        /* the inputs are scaled as the checkpoint's run scaled them */
        t->has_norm = info->has_norm != 0, t->norm_mean = info->norm_mean, t->norm_std = info->norm_std;
    }
    if (!t->has_norm) return DT_OK;
    DT_TRY(dt_dataset_set_normalize(t->train, t->norm_mean, t->norm_std));
    if (t->val) DT_TRY(dt_dataset_set_normalize(t->val, t->norm_mean, t->norm_std));
    return t->test ? dt_dataset_set_normalize(t->test, t->norm_mean, t->norm_std) : DT_OK;
}

/* Batches built on the rank's own thread where the job's ranks take every CPU of this host
 * (dt_loader_prefetch_for). */
static int loader_prefetch(const dt_trainer *t) {
    int ranks = 0;
    const int cpus = dt_comm_host_cpus(t->cfg.comm, &ranks); /* 0 for a single process */
    return dt_loader_prefetch_for(ranks, t->cfg.threads, cpus);
}

/* This rank's part of the data under the strategy and the loader over it; a resume on another
 * global batch continues after the samples already seen this epoch. */
static dt_status setup_loader(dt_trainer *t, const dt_strategy_entry *se, const dt_strategy_opts *so,
                              const char *resume, const dt_ckpt_info *info) {
    const dt_train_config *c = &t->cfg;
    DT_TRY(dt_strategy_data_part(se, so, t->rank, t->world, &t->drank, &t->dworld));
    const int step_batch = dt_trainer_step_batch(t);
    const int max_batch = t->balanced ? step_batch * t->dworld : step_batch; /* a balanced cut may be larger */
    DT_TRY(check_batch(t, max_batch));
    dt_loader_config lc = {.batch = step_batch,
                           .epoch_len = (size_t)c->epoch_windows,
                           .shuffle = true,
                           .seed = c->seed,
                           .rank = t->drank,
                           .world = t->dworld,
                           .prefetch = loader_prefetch(t),
                           .max_batch = max_batch};
    DT_TRY(dt_loader_create(&t->loader, t->train, &lc));
    if (resume && (info->world_size != t->dworld || info->batch != step_batch) && t->step_in_epoch > 0) {
        int64_t seen = t->step_in_epoch * (int64_t)info->batch * info->world_size;
        int64_t gb = (int64_t)step_batch * t->dworld;
        t->step_in_epoch = seen / gb;
        dt_trainer_note(t,
                        "resuming %s (trained on %d worker(s) x batch %d) on %d worker(s) x batch %d: continuing "
                        "at batch %lld of epoch %lld; the result differs from an uninterrupted run",
                        resume, info->world_size, info->batch, t->dworld, step_batch, (long long)t->step_in_epoch,
                        (long long)t->epoch + 1);
    }
    if (resume && t->step_in_epoch > (int64_t)dt_loader_batches(t->loader))
        return dt_error(DT_EFORMAT,
                        "%s: it stopped at batch %lld of epoch %lld, but an epoch of this run has %zu "
                        "batches (`epoch_windows`, `batch` or the data changed?); resume with the settings it was "
                        "trained with",
                        resume, (long long)t->step_in_epoch, (long long)t->epoch + 1, dt_loader_batches(t->loader));
    if (t->cfg.lr.kind == DT_LR_COSINE && t->cfg.lr.total_steps <= 0) {
        /* cosine decays over the whole run (after warm-up) unless told otherwise */
        int64_t total = (int64_t)c->epochs * (int64_t)dt_loader_batches(t->loader) - c->lr.warmup_steps;
        t->cfg.lr.total_steps = total > 1 ? total : 1;
    }
    return DT_OK;
}

/* Loads the data, builds the model and optimizer, restores the checkpoint, makes the loader and
 * the strategy (from the registry, by its spec). */
static dt_status trainer_setup(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    /* the checkpoint to resume from, then the model (default: the checkpoint's, else mlp); a bad
     * spec is reported before any data is read */
    dt_ckpt_info info = {0};
    DT_TRY(resolve_resume(t));
    const char *resume = t->resume_path[0] ? t->resume_path : NULL;
    if (resume) DT_TRY(dt_checkpoint_read_info(resume, &info));
    DT_TRY(dt_trainer_setup_val(t, resume, &info));
    const char *spec = c->model ? c->model : resume ? info.spec : "mlp";
    dt_status s = check_spec(spec);
    if (s != DT_OK) return spec == info.spec ? dt_error_wrap(DT_EFORMAT, "%s: its dtrain.model_spec", resume) : s;
    const char *strategy = dt_trainer_strategy_spec(t);
    dt_strategy_opts sopts;
    const dt_strategy_entry *sentry;
    DT_TRY(dt_strategy_parse(strategy, &sentry, &sopts));
    t->balanced = sentry->balanced && sentry->balanced(&sopts);
    /* fp16: dynamic loss scaling (unscaled in dt_strategy_apply_update; its state is checkpointed);
     * refused before any data is read, so no rank is stopped while it loads */
    const char *prec = dt_ckpt_precision_name(c->precision); /* "f16" is fp16 too */
    const bool fp16 = prec && !strcmp(prec, "fp16");
    if (fp16 && !sentry->loss_scaling) {
        const char *ck = resume ? dt_ckpt_precision_name(info.precision) : NULL;
        char who[128];
        dt_strategy_names_where(scales_loss, NULL, "or", who, sizeof who);
        if (ck && !strcmp(ck, "fp16")) /* a resume without --precision takes the checkpoint's */
            return dt_error(DT_EINVAL,
                            "`precision` fp16 (given, or kept from %s, which was trained at fp16): loss "
                            "scaling works with `strategy` %s, not %s; resume with "
                            "`precision` bf16 or fp32",
                            resume, who, sentry->name);
        return dt_error(DT_EINVAL,
                        "`precision` fp16: loss scaling works with `strategy` %s, not %s; "
                        "use `precision` bf16",
                        who, sentry->name);
    }
    DT_TRY(setup_data(t, spec, resume, &info));
    DT_TRY(data_vocab_spec(t, &spec));
    DT_TRY(setup_model(t, spec, sentry, &sopts, resume));
    if (fp16) DT_TRY(dt_optim_set_loss_scaling(t->optim, true, NULL));
    DT_TRY(restore_and_normalize(t, resume, &info));
    DT_TRY(setup_loader(t, sentry, &sopts, resume, &info));
    if (resume) check_resume_changes(t, &info, resume);
    if (c->timeline) DT_TRY(dt_trace_init(&t->trace, t->rank, 1 << 18, t->t_start));
    DT_TRY(dt_strategy_create_with(&t->strategy, sentry, &sopts, t->world > 1 ? c->comm : NULL, t->model, t->optim,
                                   c->timeline ? &t->trace : NULL));
    /* state only the strategy holds (--compress error feedback) comes back through its visitor (a
     * sharding strategy, ZeRO, took its shards from the whole state restored above) */
    if (resume && t->strategy->ops->visit_state && t->strategy->role == DT_ROLE_REPLICA && !t->strategy->shards_state)
        DT_TRY(dt_checkpoint_restore_strategy(resume, t->strategy, &info));
    DT_TRY(t->strategy->ops->init(t->strategy));
    DT_TRY(setup_uneven(t));
    if (c->eval_every > 0 && !t->test && !t->val)
        return dt_error(DT_EINVAL,
                        "`eval_every` %lld: nothing to evaluate on: `data` %s has no test split; add "
                        "`val_split` F to hold out part of the training set",
                        (long long)c->eval_every, c->data ? c->data : "(in memory)");
    return dt_trainer_check_io(t);
}

dt_status dt_trainer_create(dt_trainer **out, const dt_train_config *cfg) {
    *out = NULL;
    DT_TRY(dt_train_config_check_layout(cfg, "dt_trainer_create"));
    DT_TRY(check_config(cfg));
    DT_TRY(dt_kernels_select(cfg->kernels, cfg->precision));
    if (cfg->save) dt_ckpt_remove_stale_temps(cfg->save); /* left by a run killed mid-write */
    dt_trainer *t = calloc(1, sizeof *t);
    if (!t) return dt_error(DT_ENOMEM, "trainer: out of memory");
    t->cfg = *cfg;
    if (cfg->train_set) /* data is unused: messages name the data set by its source */
        t->cfg.data = dt_dataset_source(cfg->train_set)[0] ? dt_dataset_source(cfg->train_set) : "(in-memory data set)";
    t->lr_step = -1;
    t->t_start = dt_now();
    t->rank = cfg->comm ? dt_comm_rank(cfg->comm) : 0;
    t->world = cfg->comm ? dt_comm_size(cfg->comm) : 1;
    t->saved_step = -1;
    t->best_val = INFINITY;
    dt_set_threads(cfg->threads);
    dt_status s = trainer_setup(t);
    if (s != DT_OK) {
        dt_trainer_destroy(t);
        return s;
    }
    *out = t;
    return DT_OK;
}

dt_model *dt_trainer_model(dt_trainer *t) { return t->model; }
const char *dt_trainer_last_checkpoint(const dt_trainer *t) { return t->last_ckpt; }
int64_t dt_trainer_step(const dt_trainer *t) { return t->step; }
const char *dt_trainer_strategy_choice(const dt_trainer *t) { return t->strategy ? t->strategy->choice : NULL; }
