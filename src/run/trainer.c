/* The training loop: loads data, builds model + optimizer, runs epochs of forward / loss /
 * backward / strategy step (gradient sync, clip, optimizer), evaluates on the (sharded) test
 * set, writes JSON-Lines metrics, a timeline and checkpoints, and resumes exactly where a
 * checkpoint left off. The same loop runs one process or N data-parallel ranks; ps server ranks
 * run the strategy's serve loop instead and server 0 reports the epochs (serve_run). */
#include "core/trace.h"
#include "dist/strategy.h"
#include "dtrain/data.h"
#include "dtrain/layers.h"
#include "dtrain/train.h"
#include "run/balance.h"
#include "run/checkpoint.h"
#include "run/ckpt_dir.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_trainer {
    dt_train_config cfg;
    dt_dataset *train, *test;
    dt_model *model;
    dt_optim *optim;
    dt_loader *loader;
    int C, H, W, classes;
    float *probs, *dlogits;   /* (batch, classes) */
    int64_t step;             /* optimizer steps done */
    int64_t epoch;            /* current epoch (0-based) */
    int64_t step_in_epoch;    /* batches consumed in the current epoch */
    float norm_mean, norm_std;
    bool has_norm;
    double t_start;
    int rank, world;
    dt_strategy *strategy;
    dt_trace trace;           /* empty unless cfg.timeline */
    char resume_path[4096];   /* the checkpoint resumed from (resolves "auto") */
    char last_ckpt[4096];     /* last checkpoint written or resumed from */
    double last_ckpt_time;
    int64_t saved_step;       /* step of the last numbered checkpoint (-1: none) */
    int resume_noted;         /* the "training again" note was given */
    /* uneven workers (ps, localsgd, --balance, --slow) */
    int drank, dworld;        /* this rank's part of the data: the loader's rank and world */
    dt_comm *dcomm;           /* the ranks that reduce epoch figures together; NULL = this one alone */
    dt_balance *balance;      /* --slow sleep, --balance cut, per-worker figures (training ranks) */
    dt_worker_info *workers;  /* [dworld] */
};

dt_train_config dt_train_defaults(void) {
    dt_train_config c = {
        .data = "fashion-mnist",
        .model = "mlp",
        .epochs = 1,
        .batch = 32,
        .optim = dt_optim_defaults(DT_OPTIM_ADAM),
        .lr = {.kind = DT_LR_CONSTANT, .base_lr = 1e-3f, .gamma = 0.1f},
        .seed = 42,
        .threads = 1,
        .progress_interval_s = 0.2,
        .servers = 1,
        .staleness = -1,
        .sync_every = 8,
    };
    return c;
}

void dt_trainer_free(dt_trainer *t) {
    if (!t) return;
    dt_strategy_destroy(t->strategy);
    dt_balance_free(t->balance);
    free(t->workers);
    dt_trace_free(&t->trace);
    dt_loader_free(t->loader);
    dt_optim_free(t->optim);
    dt_model_free(t->model);
    dt_dataset_free(t->train);
    dt_dataset_free(t->test);
    dt_free(t->probs);
    dt_free(t->dlogits);
    free(t);
}

static void note(const dt_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const dt_trainer *t, const char *fmt, ...) {
    if (t->rank != 0 || !t->cfg.on_note) return;
    char msg[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    t->cfg.on_note(t->cfg.cb_ctx, msg);
}

static void report_damaged(void *ctx, const char *path, const char *reason) {
    note(ctx, "skipping damaged checkpoint %s: %s", path, reason);
}

/* Resolves cfg->resume into t->resume_path ("" = start fresh). */
static dt_status resolve_resume(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    t->resume_path[0] = '\0';
    if (!c->resume) return DT_OK;
    if (strcmp(c->resume, "auto") != 0) {
        snprintf(t->resume_path, sizeof t->resume_path, "%s", c->resume);
        return DT_OK;
    }
    if (!c->checkpoint_dir)
        return dt_error(DT_EINVAL, "--resume auto needs --checkpoint-dir DIR (where to look for checkpoints)");
    bool found;
    DT_TRY(dt_ckpt_dir_latest(c->checkpoint_dir, t->resume_path, sizeof t->resume_path, &found, report_damaged, t));
    if (!found) {
        t->resume_path[0] = '\0';
        note(t, "no usable checkpoint in %s: starting from scratch", c->checkpoint_dir);
    }
    return DT_OK;
}

static dt_status check_config(const dt_train_config *c) {
    if (c->epochs < 1) return dt_error(DT_EINVAL, "--epochs %d: need at least 1", c->epochs);
    if (c->batch < 1) return dt_error(DT_EINVAL, "--batch %d: need at least 1", c->batch);
    if (!(c->lr.base_lr > 0) || !isfinite(c->lr.base_lr))
        return dt_error(DT_EINVAL, "--lr %g: need a positive learning rate", c->lr.base_lr);
    if (c->threads < 1) return dt_error(DT_EINVAL, "--threads %d: need at least 1", c->threads);
    if ((c->checkpoint_every > 0 || c->checkpoint_secs > 0 || c->keep > 0) && !c->checkpoint_dir)
        return dt_error(DT_EINVAL, "--checkpoint-every/--checkpoint-secs/--keep need --checkpoint-dir DIR");
    if (c->checkpoint_every < 0 || c->checkpoint_secs < 0 || c->keep < 0)
        return dt_error(DT_EINVAL, "--checkpoint-every, --checkpoint-secs and --keep must not be negative");
    return DT_OK;
}

/* Uneven workers: which ranks reduce together, the balancer of training ranks, and the options
 * a strategy cannot take. */
static dt_status setup_uneven(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    const dt_role role = t->strategy->role;
    const char *name = t->strategy->ops->name;
    t->dcomm = role == DT_ROLE_REPLICA && t->world > 1 ? c->comm : NULL;
    if (c->balance && strcmp(name, "ddp") != 0 && strcmp(name, "localsgd") != 0)
        return dt_error(DT_EINVAL, "--balance dynamic works with --strategy ddp or localsgd, not %s", name);
    if (role != DT_ROLE_REPLICA && (c->timeline || c->checkpoint_dir))
        return dt_error(DT_EINVAL, "--strategy %s does not support --%s yet (use --save for the final model)", name,
                        c->timeline ? "timeline" : "checkpoint-dir");
    if (role == DT_ROLE_SERVER) {
        if (c->slow_factor > 1 && c->slow_rank == t->rank)
            return dt_error(DT_EINVAL, "--slow %d:%g: rank %d is a ps server; pick a worker rank (%d..%d)", c->slow_rank,
                            c->slow_factor, t->rank, t->world - t->dworld, t->world - 1);
        return DT_OK;
    }
    dt_balance_config bc = {.rank = t->drank, .world = t->dworld, .job_rank0 = t->strategy->job_rank0,
                            .batch = c->batch, .dynamic = c->balance,
                            .slow = c->slow_factor > 1 && c->slow_rank == t->rank ? c->slow_factor : 1};
    DT_TRY(dt_balance_create(&t->balance, &bc));
    if (!(t->workers = calloc((size_t)t->dworld, sizeof *t->workers)))
        return dt_error(DT_ENOMEM, "trainer: out of memory");
    return DT_OK;
}

dt_status dt_trainer_create(dt_trainer **out, const dt_train_config *cfg) {
    *out = NULL;
    DT_TRY(check_config(cfg));
    dt_trainer *t = calloc(1, sizeof *t);
    if (!t) return dt_error(DT_ENOMEM, "trainer: out of memory");
    t->cfg = *cfg;
    t->t_start = dt_now();
    t->rank = cfg->comm ? dt_comm_rank(cfg->comm) : 0;
    t->world = cfg->comm ? dt_comm_size(cfg->comm) : 1;
    t->saved_step = -1;
    dt_set_threads(cfg->threads);
    /* a bad spec is reported before any data is read */
    dt_layer_spec layers[DT_MAX_LAYERS];
    int nlayers;
    dt_status s = dt_spec_parse(cfg->model, layers, DT_MAX_LAYERS, &nlayers);
    if (s != DT_OK) goto fail;
    s = dt_dataset_open(&t->train, &t->test, cfg->data);
    if (s != DT_OK) goto fail;
    dt_dataset_shape(t->train, &t->C, &t->H, &t->W);
    t->classes = dt_dataset_classes(t->train);

    dt_ckpt_info info = {0};
    if ((s = resolve_resume(t)) != DT_OK) goto fail;
    const char *resume = t->resume_path[0] ? t->resume_path : NULL;
    if (resume) {
        s = dt_checkpoint_read_info(resume, &info);
        if (s != DT_OK) goto fail;
        if (info.C != t->C || info.H != t->H || info.W != t->W) {
            s = dt_error(DT_EINVAL, "%s: checkpoint expects inputs %dx%dx%d but --data %s has %dx%dx%d", resume,
                         info.C, info.H, info.W, cfg->data, t->C, t->H, t->W);
            goto fail;
        }
        if (info.seed != cfg->seed) dt_log(DT_LOG_WARN, "resuming with --seed %llu over checkpoint seed %llu",
                                           (unsigned long long)cfg->seed, (unsigned long long)info.seed);
    }
    s = dt_model_create(&t->model, layers, nlayers, t->C, t->H, t->W);
    if (s != DT_OK) goto fail;
    if (dt_model_out_size(t->model) != t->classes) {
        s = dt_error(DT_EINVAL, "model '%s' outputs %d values per sample but --data %s has %d classes; end the "
                                "spec with linear(%d)",
                     dt_model_spec(t->model), dt_model_out_size(t->model), cfg->data, t->classes, t->classes);
        goto fail;
    }
    dt_model_init(t->model, cfg->seed);
    s = dt_optim_create(&t->optim, &cfg->optim, dt_model_num_params(t->model));
    if (s != DT_OK) goto fail;
    if (cfg->normalize) {
        double mean, sd;
        dt_dataset_stats(t->train, &mean, &sd);
        t->has_norm = true, t->norm_mean = (float)mean, t->norm_std = (float)sd;
    }
    if (resume) {
        s = dt_checkpoint_restore(resume, t->model, t->optim, &info);
        if (s != DT_OK) goto fail;
        t->step = info.step, t->epoch = info.epoch, t->step_in_epoch = info.step_in_epoch;
        snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", resume);
        if (info.has_norm) t->has_norm = true, t->norm_mean = info.norm_mean, t->norm_std = info.norm_std;
    }
    if (t->has_norm) {
        if ((s = dt_dataset_set_normalize(t->train, t->norm_mean, t->norm_std)) != DT_OK) goto fail;
        if (t->test && (s = dt_dataset_set_normalize(t->test, t->norm_mean, t->norm_std)) != DT_OK) goto fail;
    }
    const char *strategy = cfg->strategy ? cfg->strategy : t->world > 1 ? "ddp" : "single";
    dt_strategy_config sc = {.bucket_mb = cfg->bucket_mb, .trace = cfg->timeline ? &t->trace : NULL,
                             .servers = cfg->servers, .staleness = cfg->staleness, .sync_every = cfg->sync_every};
    if ((s = dt_strategy_data_part(strategy, &sc, t->rank, t->world, &t->drank, &t->dworld)) != DT_OK) goto fail;
    const int max_batch = cfg->balance ? cfg->batch * t->dworld : cfg->batch;  /* a balanced cut may be larger */
    dt_loader_config lc = {.batch = cfg->batch, .shuffle = true, .seed = cfg->seed, .rank = t->drank,
                           .world = t->dworld, .prefetch = -1, .max_batch = max_batch};
    if ((s = dt_loader_create(&t->loader, t->train, &lc)) != DT_OK) goto fail;
    if (resume && (info.world_size != t->dworld || info.batch != cfg->batch) && t->step_in_epoch > 0) {
        /* another global batch: continue after the samples already seen this epoch */
        int64_t seen = t->step_in_epoch * (int64_t)info.batch * info.world_size;
        int64_t gb = (int64_t)cfg->batch * t->dworld;
        t->step_in_epoch = seen / gb;
        note(t, "resuming %s (trained on %d rank(s) x batch %d) on %d rank(s) x batch %d: continuing at batch %lld "
                "of epoch %lld; the result differs from an uninterrupted run",
             resume, info.world_size, info.batch, t->world, cfg->batch, (long long)t->step_in_epoch,
             (long long)t->epoch + 1);
    }
    if (t->cfg.lr.kind == DT_LR_COSINE && t->cfg.lr.total_steps <= 0) {
        /* cosine decays over the whole run (after warm-up) unless told otherwise */
        int64_t total = (int64_t)cfg->epochs * (int64_t)dt_loader_batches(t->loader) - cfg->lr.warmup_steps;
        t->cfg.lr.total_steps = total > 1 ? total : 1;
    }
    t->probs = dt_alloc((size_t)max_batch * t->classes * sizeof(float));
    t->dlogits = dt_alloc((size_t)max_batch * t->classes * sizeof(float));
    if (!t->probs || !t->dlogits) {
        s = dt_error(DT_ENOMEM, "trainer: out of memory");
        goto fail;
    }
    if (cfg->timeline && (s = dt_trace_init(&t->trace, t->rank, 1 << 18, t->t_start)) != DT_OK) goto fail;
    if ((s = dt_strategy_create(&t->strategy, strategy, t->world > 1 ? cfg->comm : NULL, t->model, t->optim, &sc)) !=
        DT_OK)
        goto fail;
    if ((s = t->strategy->ops->init(t->strategy)) != DT_OK) goto fail;
    if ((s = setup_uneven(t)) != DT_OK) goto fail;
    *out = t;
    return DT_OK;
fail:
    dt_trainer_free(t);
    return s;
}

dt_model *dt_trainer_model(dt_trainer *t) { return t->model; }
const char *dt_trainer_last_checkpoint(const dt_trainer *t) { return t->last_ckpt; }
int64_t dt_trainer_step(const dt_trainer *t) { return t->step; }

/* Loss and accuracy of model on a whole data set, in batches of `batch`; with comm, each rank
 * evaluates its shard and the sums are reduced. */
static dt_status evaluate(dt_model *m, const dt_dataset *ds, int batch, float *probs, dt_comm *comm, float *loss,
                          float *acc) {
    dt_loader *l = NULL;
    dt_loader_config lc = {.batch = batch, .shuffle = false, .rank = comm ? dt_comm_rank(comm) : 0,
                           .world = comm ? dt_comm_size(comm) : 1, .prefetch = -1};
    DT_TRY(dt_loader_create(&l, ds, &lc));
    dt_status s = dt_loader_start_epoch(l, 0, 0);
    double sum_loss = 0;
    int64_t correct = 0, n = 0;
    const int V = dt_model_out_size(m);
    dt_batch b;
    while (s == DT_OK && (s = dt_loader_next(l, &b)) == DT_OK) {
        if (b.n == 0) continue;
        const float *logits;
        if ((s = dt_model_forward(m, b.x, b.n, false, 0, &logits)) != DT_OK) break;
        sum_loss += (double)dt_softmax_xent_forward(probs, logits, b.y, b.n, V) * b.n;
        for (int i = 0; i < b.n; i++) {
            const float *row = logits + (size_t)i * V;
            int best = 0;
            for (int k = 1; k < V; k++)
                if (row[k] > row[best]) best = k;
            correct += best == b.y[i];
        }
        n += b.n;
    }
    dt_loader_free(l);
    if (s != DT_ENOENT) return s;
    double sums[3] = {sum_loss, (double)correct, (double)n};
    if (comm) DT_TRY(dt_comm_allreduce(comm, sums, sums, 3, DT_F64, DT_OP_SUM));
    *loss = sums[2] > 0 ? (float)(sums[0] / sums[2]) : NAN;
    *acc = sums[2] > 0 ? (float)(sums[1] / sums[2]) : NAN;
    return DT_OK;
}

dt_status dt_trainer_evaluate(dt_trainer *t, float *loss, float *acc) {
    *loss = *acc = NAN;
    if (!t->test) return DT_OK;
    return evaluate(t->model, t->test, t->cfg.batch, t->probs, t->dcomm, loss, acc);
}

static void fill_info(const dt_trainer *t, dt_ckpt_info *info) {
    memset(info, 0, sizeof *info);
    snprintf(info->spec, sizeof info->spec, "%s", dt_model_spec(t->model));
    info->C = t->C, info->H = t->H, info->W = t->W;
    info->step = t->step;
    info->epoch = t->epoch;
    info->step_in_epoch = t->step_in_epoch;
    info->seed = t->cfg.seed;
    info->batch = t->cfg.batch;
    info->world_size = t->dworld;  /* data-parallel ranks (ps: the workers) */
    snprintf(info->optimizer, sizeof info->optimizer, "%s", dt_optim_name(t->cfg.optim.kind));
    info->lr = dt_lr_at(&t->cfg.lr, t->step);
    info->has_norm = t->has_norm;
    info->norm_mean = t->norm_mean, info->norm_std = t->norm_std;
}

dt_status dt_trainer_save(dt_trainer *t, const char *path) {
    dt_ckpt_info info;
    fill_info(t, &info);
    DT_TRY(dt_checkpoint_write(path, t->model, t->optim, &info));
    snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", path);
    return DT_OK;
}

/* Rank 0 writes the next numbered checkpoint into checkpoint_dir and prunes old ones. */
static dt_status save_numbered(dt_trainer *t) {
    if (t->strategy->ops->sync) DT_TRY(t->strategy->ops->sync(t->strategy));  /* localsgd: average first */
    t->last_ckpt_time = dt_now();
    t->saved_step = t->step;
    if (t->rank != 0) return DT_OK;
    char path[4096];
    dt_ckpt_dir_path(path, sizeof path, t->cfg.checkpoint_dir, t->step);
    DT_TRY(dt_trainer_save(t, path));
    return dt_ckpt_dir_prune(t->cfg.checkpoint_dir, t->cfg.keep);
}

/* Samples in global batch b of the epoch, over all ranks. */
static int global_count(const dt_trainer *t, size_t b) {
    size_t n = dt_dataset_len(t->train), gb = (size_t)t->cfg.batch * (size_t)t->dworld, start = b * gb;
    return (int)(start + gb <= n ? gb : n - start);
}

/* Per-epoch accumulators of the step loop. */
typedef struct {
    double loss_sum;     /* sum of per-sample losses (this rank) */
    int64_t samples;     /* this rank */
    int64_t steps;
    double compute_s, comm_wait_s;
} epoch_acc;

/* One optimizer step on this rank's part b of a global batch. The local loss gradient is
 * weighted by n_local*world/n_global so that averaging over ranks gives exactly the mean
 * gradient over the global batch (also when the final batch is spread unevenly or the batch is
 * cut by speed); strategies that step on the local mean (localsgd, ps) get weight 1. */
static dt_status train_step(dt_trainer *t, const dt_batch *b, epoch_acc *acc) {
    const int V = t->classes;
    const double t0 = dt_now();
    dt_strategy *st = t->strategy;
    st->ops->begin_step(st, t->step);
    dt_model_zero_grad(t->model);
    if (b->n > 0) {
        const float *logits;
        DT_TRY(dt_model_forward(t->model, b->x, b->n, true, (uint64_t)t->step, &logits));
        float loss = dt_softmax_xent_forward(t->probs, logits, b->y, b->n, V);
        if (!isfinite(loss))
            return dt_error(DT_EINVAL, "training diverged: loss is %g at step %lld on rank %d; lower --lr or set --clip",
                            loss, (long long)t->step, t->rank);
        acc->loss_sum += (double)loss * b->n;
        acc->samples += b->n;
        float scale = st->local_mean ? 1.0f : (float)((double)b->n * t->dworld / global_count(t, b->index));
        dt_softmax_xent_backward(t->dlogits, t->probs, b->y, b->n, V, scale);
        const double t1 = dt_now();
        dt_trace_add(&t->trace, "forward", 0, t0, t1, t->step);
        DT_TRY(dt_model_backward(t->model, t->dlogits, dt_strategy_grad_hook, st));
        dt_trace_add(&t->trace, "backward", 0, t1, dt_now(), t->step);
        st->cur.loss_sum = (double)loss * b->n;
    }
    double busy = dt_now() - t0;
    busy += dt_balance_compute_done(t->balance, b->n, busy);  /* sleeps on a --slow rank */
    st->cur.n = b->n, st->cur.epoch = t->epoch, st->cur.busy_s = busy;
    if (b->n == 0) st->cur.loss_sum = 0;
    dt_step_stats ss;
    DT_TRY(st->ops->step(st, dt_lr_at(&t->cfg.lr, t->step), t->cfg.clip_norm, &ss));
    DT_TRY(dt_balance_step_end(t->balance, t->dcomm, t->loader));
    acc->comm_wait_s += ss.comm_wait_s;
    acc->compute_s += dt_now() - t0 - ss.comm_wait_s;
    acc->steps++;
    t->step++;
    return DT_OK;
}

static void json_num(char *buf, size_t cap, double v) {
    if (isnan(v)) snprintf(buf, cap, "null");
    else snprintf(buf, cap, "%.6g", v);
}

static void write_metrics(FILE *f, const dt_epoch_info *e, const dt_trainer *t) {
    char tl[32], ta[32];
    json_num(tl, sizeof tl, e->test_loss);
    json_num(ta, sizeof ta, e->test_acc);
    double per = e->steps > 0 ? 1e3 / (double)e->steps : 0;
    fprintf(f,
            "{\"epoch\": %d, \"step\": %lld, \"train_loss\": %.6g, \"test_loss\": %s, \"test_acc\": %s, "
            "\"samples_per_s\": %.1f, \"epoch_s\": %.3f, \"wall_s\": %.3f, \"data_wait_s\": %.4f, \"lr\": %.6g, "
            "\"batch\": %d, \"world_size\": %d, \"global_batch\": %d, \"strategy\": \"%s\", \"backend\": \"%s\", "
            "\"step_ms\": {\"compute\": %.4f, \"comm_wait\": %.4f, \"data_wait\": %.4f}, \"model\": \"%s\"",
            e->epoch, (long long)e->global_step, e->train_loss, tl, ta, e->samples_per_s, e->epoch_s, e->wall_s,
            e->data_wait_s, e->lr, t->cfg.batch, e->world_size, e->global_batch, t->strategy->ops->name,
            t->world > 1 ? dt_comm_backend_name(t->cfg.comm) : "self",
            e->compute_s * per, e->comm_wait_s * per, e->data_wait_s * per, dt_model_spec(t->model));
    dt_balance_write_json(f, e);  /* per-worker figures, ps staleness */
    fputs("}\n", f);
    fflush(f);
}

/* Gathers every rank's timeline events on rank 0 and writes the Chrome trace there. */
static dt_status write_timeline(dt_trainer *t) {
    dt_comm *c = t->world > 1 ? t->cfg.comm : NULL;
    const size_t esz = sizeof(dt_trace_event);
    if (!c) return dt_trace_write_json(t->cfg.timeline, t->trace.ev, t->trace.n);
    int W = t->world;
    int64_t mine = (int64_t)t->trace.n;
    int64_t *counts = calloc((size_t)W, sizeof *counts);
    size_t *bytes = calloc((size_t)W, sizeof *bytes);
    if (!counts || !bytes) {
        free(counts), free(bytes);
        return dt_error(DT_ENOMEM, "timeline: out of memory");
    }
    dt_status s = dt_comm_allgather(c, &mine, counts, 1, DT_I64);
    size_t total = 0;
    for (int r = 0; r < W; r++) bytes[r] = (size_t)counts[r] * esz, total += (size_t)counts[r];
    dt_trace_event *all = s == DT_OK ? calloc(total ? total : 1, esz) : NULL;
    if (s == DT_OK && !all) s = dt_error(DT_ENOMEM, "timeline: out of memory for %zu events", total);
    if (s == DT_OK) s = dt_comm_allgatherv(c, t->trace.ev, all, bytes, NULL, DT_U8);
    if (s == DT_OK && t->rank == 0) s = dt_trace_write_json(t->cfg.timeline, all, total);
    free(all), free(counts), free(bytes);
    return s;
}

/* ---- ps servers: serve, and on server 0 report each epoch once every live worker finished it ---- */
typedef struct {
    dt_trainer *t;
    FILE *mf;
    double t0;
} serve_ctx;

static dt_status serve_epoch(void *ctx, const dt_serve_epoch *r) {
    serve_ctx *sc = ctx;
    dt_trainer *t = sc->t;
    const dt_train_config *c = &t->cfg;
    const int64_t spe = (int64_t)dt_loader_batches(t->loader);
    t->step = r->step;  /* the model (assembled by the servers) is the one after this many worker steps */
    t->epoch = r->complete ? r->epoch + 1 : r->epoch;
    t->step_in_epoch = r->complete ? 0 : r->step - (r->step / spe) * spe;
    dt_epoch_info e = {.epoch = (int)r->epoch + 1, .global_step = r->step,
                       .train_loss = r->samples > 0 ? (float)(r->loss_sum / (double)r->samples) : NAN,
                       .samples_per_s = r->epoch_s > 0 ? (double)r->samples / r->epoch_s : 0, .epoch_s = r->epoch_s,
                       .world_size = t->world, .global_batch = c->batch * t->dworld,
                       .lr = dt_lr_at(&c->lr, r->step > 0 ? r->step - 1 : 0), .nworkers = r->nworkers,
                       .workers = r->workers, .staleness = r->staleness, .max_clock_gap = r->max_clock_gap};
    DT_TRY(dt_trainer_evaluate(t, &e.test_loss, &e.test_acc));
    e.wall_s = dt_now() - t->t_start;
    if (sc->mf) write_metrics(sc->mf, &e, t);
    if (c->on_epoch) c->on_epoch(c->cb_ctx, &e);
    if (c->save) DT_TRY(dt_trainer_save(t, c->save));
    return DT_OK;
}

static void serve_progress(void *ctx, int64_t min_step, int64_t samples, double loss_sum) {
    serve_ctx *sc = ctx;
    const dt_train_config *c = &sc->t->cfg;
    const int64_t spe = (int64_t)dt_loader_batches(sc->t->loader);
    double el = dt_now() - sc->t0;
    int64_t in = min_step % spe;
    dt_progress_info p = {.epoch = (int)(min_step / spe), .epochs = c->epochs, .step_in_epoch = in,
                          .steps_per_epoch = spe, .global_step = min_step,
                          .loss = samples ? (float)(loss_sum / (double)samples) : NAN, .elapsed_s = el,
                          .samples_per_s = el > 0 ? (double)samples / el : 0,
                          .eta_s = in > 0 ? el / (double)in * (double)(spe - in) : 0};
    if (c->on_progress) c->on_progress(c->cb_ctx, &p);
}

static void serve_note(void *ctx, const char *msg) { note(((serve_ctx *)ctx)->t, "%s", msg); }

static dt_status save_interrupted(dt_trainer *t);

static dt_status serve_run(dt_trainer *t, FILE *mf) {
    const dt_train_config *c = &t->cfg;
    serve_ctx sc = {.t = t, .mf = mf, .t0 = dt_now()};
    int64_t stopped = -1;
    dt_serve_config cfg = {.start_step = t->step, .start_epoch = t->epoch, .start_step_in_epoch = t->step_in_epoch,
                           .steps_per_epoch = (int64_t)dt_loader_batches(t->loader), .epochs = c->epochs,
                           .max_steps = c->max_steps, .batch = c->batch, .want_optim = true,
                           .progress_s = c->progress_interval_s > 0 ? c->progress_interval_s : 0.2,
                           .stop = c->stop, .stopped_step = &stopped,
                           .on_epoch = serve_epoch, .on_progress = serve_progress, .on_note = serve_note, .ctx = &sc};
    dt_status s = t->strategy->ops->serve(t->strategy, &cfg);
    if (s == DT_EINTR && stopped >= 0) {  /* server 0 holds the model of an interrupted run */
        const int64_t spe = cfg.steps_per_epoch;
        t->step = stopped, t->epoch = stopped / spe, t->step_in_epoch = stopped % spe;
        return save_interrupted(t);
    }
    return s;
}

/* Whether the run must stop after this step: the stop flag (a signal) of any rank, agreed by
 * every rank with one tiny allreduce every STOP_VOTE_EVERY steps, so all ranks stop after the
 * same step; a single process checks its flag every step. */
enum { STOP_VOTE_EVERY = 8 };

static dt_status stop_vote(const dt_trainer *t, bool *stop) {
    int32_t mine = t->cfg.stop && *t->cfg.stop, any = mine;
    *stop = false;
    if (t->dcomm) {
        if (t->step % STOP_VOTE_EVERY != 0) return DT_OK;
        DT_TRY(dt_comm_allreduce(t->dcomm, &mine, &any, 1, DT_I32, DT_OP_MAX));
    }
    *stop = any != 0;
    return DT_OK;
}

/* Writes the checkpoint of an interrupted run and returns DT_EINTR saying how to resume. */
static dt_status save_interrupted(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    dt_status s = DT_OK;
    if (c->checkpoint_dir) s = save_numbered(t);
    else if (t->rank == 0) s = dt_trainer_save(t, c->save ? c->save : "dtrain-interrupted.safetensors");
    if (s != DT_OK) return dt_error_wrap(s, "stopped at step %lld but the checkpoint failed", (long long)t->step);
    if (c->checkpoint_dir)
        return dt_error(DT_EINTR, "stopped at step %lld; checkpoint %s; to continue, run the same command with "
                                  "--resume auto (and --checkpoint-dir %s)",
                        (long long)t->step, t->last_ckpt, c->checkpoint_dir);
    return dt_error(DT_EINTR, "stopped at step %lld; checkpoint %s; to continue, run the same command with --resume %s",
                    (long long)t->step, t->last_ckpt, t->last_ckpt);
}

dt_status dt_trainer_run(dt_trainer *t) {
    const dt_train_config *c = &t->cfg;
    dt_comm *comm = t->dcomm;
    const bool lead = t->rank == 0;
    FILE *mf = NULL;
    if (c->checkpoint_dir && lead) DT_TRY(dt_ckpt_dir_ensure(c->checkpoint_dir));
    if (c->metrics && lead) {
        mf = fopen(c->metrics, t->cfg.resume ? "a" : "w");
        if (!mf) return dt_error(DT_EIO, "--metrics %s: cannot open for writing", c->metrics);
    }
    if (t->strategy->role == DT_ROLE_SERVER) {  /* ps servers serve instead of stepping */
        dt_status s = serve_run(t, mf);
        if (mf && fclose(mf) != 0 && s == DT_OK) s = dt_error(DT_EIO, "--metrics %s: write failed", c->metrics);
        return s;
    }
    const int64_t spe = (int64_t)dt_loader_batches(t->loader);
    t->last_ckpt_time = dt_now();
    bool stop = false, ckpt_due = false;
    dt_status s = DT_OK;
    while (t->epoch < c->epochs && s == DT_OK && !stop) {
        if (c->max_steps && t->step >= c->max_steps) break;
        if ((s = dt_loader_start_epoch(t->loader, (uint64_t)t->epoch, (size_t)t->step_in_epoch)) != DT_OK) break;
        double t0 = dt_now(), last_progress = 0, wait0 = dt_loader_wait_seconds(t->loader);
        epoch_acc acc = {0};
        dt_batch b;
        for (;;) {
            double tw = dt_now();
            if ((s = dt_loader_next(t->loader, &b)) != DT_OK) break;
            dt_trace_add(&t->trace, "data", 2, tw, dt_now(), t->step);
            s = train_step(t, &b, &acc);
            if (s == DT_OK) s = stop_vote(t, &stop);
            if (s != DT_OK) {
                s = dt_error_wrap(s, "step %lld (epoch %lld, batch %lld)", (long long)t->step + 1,
                                  (long long)t->epoch + 1, (long long)t->step_in_epoch + 1);
                break;
            }
            if (t->resume_path[0] && !t->resume_noted++)
                note(t, "resumed from %s: training again at step %lld, %.2f s after start", t->resume_path,
                     (long long)t->step, dt_now() - t->t_start);
            t->step_in_epoch++;
            double now = dt_now();
            if (lead && c->on_progress &&
                (now - last_progress >= c->progress_interval_s || t->step_in_epoch == spe)) {
                last_progress = now;
                double el = now - t0;
                dt_progress_info p = {.epoch = (int)t->epoch, .epochs = c->epochs, .step_in_epoch = t->step_in_epoch,
                                      .steps_per_epoch = spe, .global_step = t->step,
                                      .loss = acc.samples ? (float)(acc.loss_sum / (double)acc.samples) : NAN,
                                      .elapsed_s = el,
                                      .samples_per_s = el > 0 ? (double)acc.samples * t->dworld / el : 0,
                                      .eta_s = el / (double)acc.steps * (double)(spe - t->step_in_epoch)};
                c->on_progress(c->cb_ctx, &p);
            }
            ckpt_due = c->checkpoint_dir && ((c->checkpoint_every > 0 && t->step % c->checkpoint_every == 0) ||
                                             (c->checkpoint_secs > 0 && now - t->last_ckpt_time >= c->checkpoint_secs));
            if (stop || (c->max_steps && t->step >= c->max_steps)) {
                s = DT_ENOENT;
                break;
            }
            /* a checkpoint at an epoch's last step waits for the epoch's end (so it resumes after it) */
            if (ckpt_due && t->step_in_epoch < spe) {
                if ((s = save_numbered(t)) != DT_OK) break;
                ckpt_due = false;
            }
        }
        if (s != DT_ENOENT) break;
        s = DT_OK;
        double epoch_s = dt_now() - t0;
        bool finished = t->step_in_epoch >= spe;
        if (finished) {
            t->epoch++;
            t->step_in_epoch = 0;
        }
        if (stop) break;
        if (t->strategy->role == DT_ROLE_WORKER) continue;  /* ps: the servers report epochs */
        if (t->strategy->ops->sync && (s = t->strategy->ops->sync(t->strategy)) != DT_OK) break;
        if ((s = dt_balance_epoch(t->balance, comm, epoch_s, t->workers)) != DT_OK) break;
        /* global training loss and sample count of the epoch */
        double sums[2] = {acc.loss_sum, (double)acc.samples};
        if (comm && (s = dt_comm_allreduce(comm, sums, sums, 2, DT_F64, DT_OP_SUM)) != DT_OK) break;
        dt_epoch_info e = {.epoch = (int)t->epoch + (finished ? 0 : 1), .global_step = t->step,
                           .train_loss = sums[1] > 0 ? (float)(sums[0] / sums[1]) : NAN,
                           .samples_per_s = epoch_s > 0 ? sums[1] / epoch_s : 0, .epoch_s = epoch_s,
                           .data_wait_s = dt_loader_wait_seconds(t->loader) - wait0, .compute_s = acc.compute_s,
                           .comm_wait_s = acc.comm_wait_s, .steps = acc.steps, .world_size = t->world,
                           .global_batch = c->batch * t->dworld,
                           .lr = dt_lr_at(&c->lr, t->step > 0 ? t->step - 1 : 0),
                           .nworkers = t->dworld, .workers = t->workers, .max_clock_gap = -1};
        if ((s = dt_trainer_evaluate(t, &e.test_loss, &e.test_acc)) != DT_OK) break;
        e.wall_s = dt_now() - t->t_start;
        if (mf) write_metrics(mf, &e, t);
        if (lead && c->on_epoch) c->on_epoch(c->cb_ctx, &e);
        if (lead && c->save && (s = dt_trainer_save(t, c->save)) != DT_OK) break;
        if (ckpt_due && (s = save_numbered(t)) != DT_OK) break;
        ckpt_due = false;
    }
    if (s == DT_OK && stop) s = save_interrupted(t);
    else if (s == DT_OK && c->checkpoint_dir && t->saved_step != t->step) s = save_numbered(t);
    if ((s == DT_OK || s == DT_EINTR) && c->timeline) {
        dt_status ts = write_timeline(t);
        if (ts != DT_OK) s = ts;
    }
    if (mf && fclose(mf) != 0 && s == DT_OK) s = dt_error(DT_EIO, "--metrics %s: write failed", c->metrics);
    return s;
}

dt_status dt_evaluate_checkpoint(const char *checkpoint, const char *data, int batch, float *loss, float *acc,
                                 int64_t *samples) {
    dt_ckpt_info info;
    DT_TRY(dt_checkpoint_read_info(checkpoint, &info));
    dt_dataset *train = NULL, *test = NULL;
    dt_model *m = NULL;
    float *probs = NULL;
    dt_status s = dt_dataset_open(&train, &test, data);
    if (s != DT_OK) return s;
    const dt_dataset *ds = test ? test : train;
    int C, H, W;
    dt_dataset_shape(ds, &C, &H, &W);
    if (C != info.C || H != info.H || W != info.W) {
        s = dt_error(DT_EINVAL, "%s: model expects inputs %dx%dx%d but --data %s has %dx%dx%d", checkpoint, info.C,
                     info.H, info.W, data, C, H, W);
        goto done;
    }
    if ((s = dt_model_create_from_spec(&m, info.spec, C, H, W)) != DT_OK) goto done;
    if ((s = dt_checkpoint_restore(checkpoint, m, NULL, &info)) != DT_OK) goto done;
    if (info.has_norm && (s = dt_dataset_set_normalize((dt_dataset *)ds, info.norm_mean, info.norm_std)) != DT_OK)
        goto done;
    if (!(probs = dt_alloc((size_t)batch * dt_model_out_size(m) * sizeof(float)))) {
        s = dt_error(DT_ENOMEM, "eval: out of memory");
        goto done;
    }
    s = evaluate(m, ds, batch, probs, NULL, loss, acc);
    *samples = (int64_t)dt_dataset_len(ds);
done:
    dt_free(probs);
    dt_model_free(m);
    dt_dataset_free(train);
    dt_dataset_free(test);
    return s;
}
