/* Training checkpoints on top of the safetensors layer: the model's tensors under their
 * torch.nn.Sequential names, optimizer moments as "optim.<state>.<name>", and the run's
 * position and config in __metadata__ ("dtrain.*" keys). */
#ifndef DT_RUN_CHECKPOINT_H
#define DT_RUN_CHECKPOINT_H

#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/safetensors.h"
#include "dtrain/train.h"

/* Position and identity of a run, stored in a checkpoint's metadata. */
typedef struct {
    char spec[1024];       /* canonical model spec */
    int C, H, W;           /* input shape */
    int64_t step;          /* optimizer steps completed */
    int64_t epoch;         /* epochs completed (resume starts here) */
    int64_t step_in_epoch; /* batches already consumed of epoch `epoch` */
    uint64_t seed;
    int batch;          /* per rank */
    int world_size;     /* ranks that trained it (a resume may use another number) */
    char optimizer[16]; /* "sgd" | "adam" | "adamw" */
    float lr;
    int has_norm; /* inputs standardised with mean/std */
    float norm_mean, norm_std;
    double val_split;               /* --val-split fraction (0: none) */
    float best_val;                 /* lowest validation loss so far (INFINITY: none) */
    int64_t best_epoch, bad_epochs; /* its epoch; epochs since without a lower one (--early-stop) */
    /* the run's training settings (dtrain.settings; absent in checkpoints of older versions) */
    bool has_settings;
    dt_lr_schedule sched;      /* --lr, --schedule, --warmup, --step-size, --gamma, --min-lr (no total_steps) */
    dt_optim_config optim_cfg; /* the optimizer's hyper-parameters (kind: from `optimizer`) */
    float clip;                /* --clip */
    int grad_accum;            /* --grad-accum (batch above is batch x grad_accum) */
    char precision[8];         /* --precision: "fp32", "bf16", "fp16" ("": not stored, older versions) */
    double val_fraction;       /* --val-fraction (text: the held-out last part; -1: not stored, older versions) */
    char data[1024];           /* the --data it trained on (files as absolute paths; dtrain.data; "": older) */
    char strategy[256];        /* the strategy spec it trained with (dtrain.strategy: "ddp", "single",
                                * "localsgd(sync_every=4)", "ddp(compress=topk:0.1)"; "": older versions) */
} dt_ckpt_info;

typedef struct dt_strategy dt_strategy;

/* ckpt_settings.c: info's training settings as the metadata "dtrain.settings"
 * ("lr=0.01,schedule=cosine,...,grad_accum=1"), and back (has_settings = false when absent;
 * DT_EFORMAT naming the key when a value is bad; keys it does not know are skipped). */
dt_status dt_ckpt_settings_write(dt_st_writer *w, const dt_ckpt_info *info);
dt_status dt_ckpt_settings_parse(const dt_st_file *f, dt_ckpt_info *info);
/* The name a --precision value is stored under ("fp32" for NULL, "f32" and "fp32"; "bf16";
 * "fp16" for "f16" and "fp16"), static text; NULL when p is no precision. */
const char *dt_ckpt_precision_name(const char *p);
/* Describes into what[cap] ("" when none) the settings of c, and the strategy spec this run
 * trains with, that differ from the checkpoint's info: "--strategy ddp (the checkpoint's run:
 * localsgd(sync_every=4)); --lr 0.005 (the checkpoint's run: 0.01); --seed 3 (...)"; without
 * stored settings only the learning rate at the resumed step, the seed and the batch. */
void dt_ckpt_settings_changes(const dt_ckpt_info *info, const dt_train_config *c, const char *strategy, char *what,
                              size_t cap);

/* Writes the training state the strategy reports (dt_strategy_visit_state: whole tensors, or the
 * slices of sharded ones when this rank holds all of them) and info atomically to path. */
dt_status dt_checkpoint_write_strategy(const char *path, dt_strategy *s, const dt_ckpt_info *info);
/* Restores into the pieces the strategy reports (each gets its range of the file's tensor). */
dt_status dt_checkpoint_restore_strategy(const char *path, dt_strategy *s, dt_ckpt_info *info);
/* Writes model (+ optimizer if non-NULL) and info atomically to path. */
dt_status dt_checkpoint_write(const char *path, dt_model *m, dt_optim *o, const dt_ckpt_info *info);
/* The checkpoint file that path names, into out: path itself, or for a directory the newest usable
 * checkpoint in it (its numbered ckpt-<step> files; damaged ones skipped, as --resume auto picks),
 * then *from_dir is true. DT_ENOENT naming the directory when it holds none. */
dt_status dt_checkpoint_resolve(const char *path, char *out, size_t cap, bool *from_dir);
/* The metadata of the open checkpoint f into info; DT_EFORMAT naming the key that no run writes. */
dt_status dt_checkpoint_info_of(const dt_st_file *f, dt_ckpt_info *info);
/* Reads only the metadata of a checkpoint (validates the whole file). */
dt_status dt_checkpoint_read_info(const char *path, dt_ckpt_info *info);
/* Restores tensors into a model built with the same spec (and the optimizer if non-NULL);
 * DT_EFORMAT naming the file and tensor when a tensor is missing or has another shape. */
dt_status dt_checkpoint_restore(const char *path, dt_model *m, dt_optim *o, dt_ckpt_info *info);

/* ---- sharded checkpoints (ckpt_shard.c): an index file plus one shard file per rank ---- */

/* "<path>.rR-of-N": shard R of an N-shard checkpoint whose index is path. */
void dt_ckpt_shard_path(char *out, size_t cap, const char *path, int r, int n);
/* Removes the shard files "<path>.rR-of-M" in path's directory that are not shards of an n-shard
 * checkpoint (M != n, or R >= M; n 0: every one): what an earlier save under path with another
 * number of ranks left. Called once the new checkpoint is in place (index or file renamed). */
void dt_ckpt_remove_stale_shards(const char *path, int n);
/* Collective over s->comm: every rank writes the pieces it owns (dt_strategy_visit_state) to its
 * shard file, then rank 0 writes the index (written last: the checkpoint exists once it does).
 * An error on any rank is reported on every rank, and no index is written. */
dt_status dt_checkpoint_write_sharded(const char *path, dt_strategy *s, const dt_ckpt_info *info);
/* Writes the index of an n-shard checkpoint: info (and o's metadata) with no tensors, and the id
 * its shards carry (dtrain.save_id: a load refuses shards of another save). */
dt_status dt_checkpoint_write_index(const char *path, dt_optim *o, const dt_ckpt_info *info, int n,
                                    const char *save_id);
/* Restores the n shards of index path into whole tensors of m (and o when non-NULL); DT_EFORMAT
 * naming the shard when one is missing, damaged, of another model or leaves a value unset. */
dt_status dt_checkpoint_restore_shards(const char *path, int n, dt_model *m, dt_optim *o);
/* Whether path is the index of a sharded checkpoint (false when it cannot be read: its restore
 * reports that). */
bool dt_checkpoint_is_sharded(const char *path);
/* Restores the n shards of index path into the pieces strategy s reports (dt_strategy_visit_state:
 * a tensor-parallel rank's shards, a replica's whole tensors), one shard file in memory at a time:
 * each piece gets its overlaps with the shards' pieces. Pieces with a hint (strategy-only state)
 * are left as they are where no shard holds them. DT_EFORMAT naming the shard when one is missing,
 * damaged or of another model, or when the shards leave a reported value unset. */
dt_status dt_checkpoint_restore_shards_into(const char *path, int n, dt_strategy *s);
/* Reads checkpoint `in` (one file or a sharded index) and writes it to `out` as one file, the
 * model's tensors (and the optimizer state with `optim`), for PyTorch's safetensors loader. */
dt_status dt_checkpoint_consolidate(const char *in, const char *out, bool optim);

#endif
