/* dtrain train: flags -> dt_train_config, one rank or --workers N local ranks
 * (supervised, --elastic), and the run's end lines. What rank 0 prints while it trains (the
 * progress bar, one line per epoch) is in train_progress.c. */
#include "cli/cli.h"
#include "cli/cmd_plan.h"
#include "cli/train_uneven.h"
#include "cli/train_mesh.h"
#include "cli/train_pp.h"
#include "cli/train_progress.h"
#include "cli/train_mem.h"
#include "cli/stop_signal.h"
#include "cli/train_outputs.h"
#include "cli/train_resume.h"
#include "cli/train_usage.h"
#include "dtrain/dtrain.h"
#include "run/ckpt_dir.h"
#include "run/elastic.h"
#include "run/launch.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;

static void print_launch_event(void *ctx, const char *msg) {
    (void)ctx;
    char out[4096];
    dt_cli_flag_terms(msg, out, sizeof out);
    fprintf(stderr, "dtrain train: %s\n", out);
}

/* Exit status of a rank whose set-up failed with s: a peer's failure or a deadline is
 * DT_EXIT_PEER (the launcher blames the other rank), a bad flag value DT_EXIT_USAGE, bad data,
 * checkpoint or model DT_EXIT_CONFIG (dt_cli_setup_status). */
static int setup_exit(dt_status s) { return dt_cli_setup_status(s); }

/* --workers N: re-runs this very command as N local ranks (shared-memory transport) and
 * supervises them; rank 0 prints, the others only report errors. With --elastic MIN:MAX a
 * failed job is restarted from its newest checkpoint, up to max_restarts times. */
static int run_workers(int argc, char **argv, int workers, const char *elastic, int max_restarts,
                       const char *checkpoint_dir, const bool *expendable) {
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return dt_cli_fail(NULL, "--workers: cannot find this program's path (/proc/self/exe)");
    exe[len] = '\0';
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) return dt_cli_fail(NULL, "out of memory");
    args[0] = exe;
    args[1] = "train";
    /* rank 0's stderr is the launcher's pipe: tell it the user sees a terminal (progress bar) */
    if (isatty(2)) setenv("DTRAIN_PROGRESS_TTY", "1", 1);
    for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
    dt_launch_result res;
    dt_status s;
    if (elastic) {
        int lo, hi;
        char tail;
        if (sscanf(elastic, "%d:%d%c", &lo, &hi, &tail) != 2) {
            free(args);
            return dt_cli_usage("e.g. --elastic 1:4", "--elastic '%s' is not MIN:MAX", elastic);
        }
        if (!checkpoint_dir) {
            free(args);
            return dt_cli_usage("add --checkpoint-dir DIR --checkpoint-every STEPS (or --checkpoint-secs S)",
                                "--elastic restarts from checkpoints, so it needs --checkpoint-dir");
        }
        dt_elastic_config ec = {.workers = workers,
                                .min_workers = lo,
                                .max_workers = hi,
                                .max_restarts = max_restarts,
                                .argv = args,
                                .argc = argc + 1,
                                .checkpoint_dir = checkpoint_dir,
                                .notify = print_launch_event};
        s = dt_elastic_run(&ec, &res);
        if (s == DT_EINVAL) {
            free(args);
            return dt_cli_usage(NULL, "%s", dt_last_error());
        }
    } else {
        dt_launch_config lc = {.nranks = workers, .notify = print_launch_event, .expendable = expendable};
        s = dt_launch_run(&lc, args, &res);
    }
    free(args);
    if (checkpoint_dir) dt_ckpt_dir_prune(checkpoint_dir, 0); /* a rank killed mid-write left its temp file */
    if (s == DT_EINTR && res.all_exited_0) return 0; /* preempted: the ranks checkpointed and said how to resume */
    if (s != DT_OK && res.failed_rank < 0 && res.exit_code == 0) return dt_cli_fail(NULL, "%s", dt_last_error());
    return res.exit_code;
}

/* Everything `dtrain train` accepts: the trainer config plus the flags that shape it. */
typedef struct {
    dt_train_config cfg;
    const char *optimizer, *schedule, *backend, *elastic;
    const char *tensorboard;
    float lr, momentum, wd, beta1, beta2, eps, gamma, min_lr, bucket_mb, timeout, ckpt_secs, val_fraction;
    float val_split;
    int64_t seed, warmup, step_size, max_steps;
    bool nesterov, quiet, normalize;
    int workers, max_restarts;
    dt_cli_uneven uneven;
    int tp;                     /* --tp K (0: not given) */
    dt_cli_pp pp;               /* --pp, --microbatches, --pp-schedule, --pp-split */
    const char *mem_limit_text; /* --mem-limit, --dry-run, --zero (train_mem.c) */
    size_t mem_limit;
    bool dry_run;
    bool strategy_from_ckpt; /* --resume took the checkpoint's strategy spec (train_resume.h) */
} train_opts;

/* --backend's help, from the transport registry */
static const char *backend_help(void) {
    static char buf[1200];
    snprintf(buf, sizeof buf, "transport between ranks: %s", dt_comm_transport_help());
    return buf;
}

/* Room for every flag of train: each of the two tables below holds at most half. */
#define TRAIN_MAX_FLAGS 96

/* The flags of the model, data, optimizer and outputs (into o), appended to f from n; the new count. */
static int train_flags_model(train_opts *o, dt_flag *f, int n) {
    dt_train_config *c = &o->cfg;
    const dt_flag flags[] = {
        {"data", DT_FLAG_STR, &c->data, "DIR",
         "IDX directory (train-*/t10k-* files), fashion-mnist, mnist, a .csv, npy:X.npy,Y.npy or npy:DIR (x_train.npy, "
         "y_train.npy, x_test.npy, y_test.npy); for a GPT: text:FILE, kjv or tokens:DIR (nanoGPT train.bin/val.bin, "
         "llm.c shards)"},
        {"model", DT_FLAG_STR, &c->model, "SPEC",
         "model spec or preset mlp, cnn, gpt[:L=4,H=4,C=128,T=64] (default mlp; when resuming, the checkpoint's)"},
        {"epochs", DT_FLAG_INT, &c->epochs, "N", "passes over the training set"},
        {"batch", DT_FLAG_INT, &c->batch, "N", "samples per step (per micro-batch with --grad-accum)"},
        {"grad-accum", DT_FLAG_INT, &c->grad_accum, "N", "accumulate N micro-batches of --batch per optimizer step"},
        {"epoch-windows", DT_FLAG_I64, &c->epoch_windows, "N",
         "samples (text: windows) per epoch, drawn from each epoch's shuffle (0 = all)"},
        {"val-fraction", DT_FLAG_FLOAT, &o->val_fraction, "F",
         "text data: the last fraction F of the file is the validation set"},
        {"optimizer", DT_FLAG_STR, &o->optimizer, "NAME", "sgd, adam or adamw"},
        {"lr", DT_FLAG_FLOAT, &o->lr, "X", "learning rate"},
        {"momentum", DT_FLAG_FLOAT, &o->momentum, "X", "sgd momentum"},
        {"nesterov", DT_FLAG_BOOL, &o->nesterov, NULL, "sgd: Nesterov momentum"},
        {"weight-decay", DT_FLAG_FLOAT, &o->wd, "X",
         "L2 (sgd, adam) or decoupled (adamw) decay; default 0, adamw 0.01"},
        {"beta1", DT_FLAG_FLOAT, &o->beta1, "X", "adam/adamw beta1"},
        {"beta2", DT_FLAG_FLOAT, &o->beta2, "X", "adam/adamw beta2"},
        {"eps", DT_FLAG_FLOAT, &o->eps, "X", "adam/adamw epsilon"},
        {"schedule", DT_FLAG_STR, &o->schedule, "NAME", "learning-rate schedule: constant, step or cosine"},
        {"warmup", DT_FLAG_I64, &o->warmup, "STEPS", "linear warm-up steps"},
        {"step-size", DT_FLAG_I64, &o->step_size, "STEPS", "step schedule: decay every STEPS steps"},
        {"gamma", DT_FLAG_FLOAT, &o->gamma, "X", "step schedule: decay factor"},
        {"min-lr", DT_FLAG_FLOAT, &o->min_lr, "X", "cosine schedule: final learning rate"},
        {"clip", DT_FLAG_FLOAT, &c->clip_norm, "X", "clip the gradient L2 norm to X (0 = off)"},
        {"normalize", DT_FLAG_BOOL, &o->normalize, NULL, "standardise inputs with the training set mean/std"},
        {"seed", DT_FLAG_I64, &o->seed, "N", "seed of init, shuffling and dropout"},
        {"threads", DT_FLAG_INT, &c->threads, "N", "BLAS threads of this worker"},
        {"kernels", DT_FLAG_STR, &c->kernels, "LIB", "kernel library: onednn (default where built) or blas"},
        {"device", DT_FLAG_STR, &c->device, "DEV", dt_train_device_help()},
        {"precision", DT_FLAG_STR, &c->precision, "P",
         "GEMM inputs fp32 (default), bf16 or fp16 (f32 master weights; fp16: loss scaling; where the CPU has no such "
         "GEMM: inputs rounded, f32 GEMMs, not faster; when resuming, the checkpoint's)"},
        {"max-steps", DT_FLAG_I64, &o->max_steps, "N",
         "stop after N steps in total (ps: N batches per worker; 0 = all epochs)"},
        {"save", DT_FLAG_STR, &c->save, "FILE", "write a checkpoint (safetensors) after every epoch"},
        {"resume", DT_FLAG_STR, &c->resume, "FILE",
         "continue from a checkpoint (a --save file, or a directory of numbered ones: its newest usable one; auto = "
         "that of --checkpoint-dir); the training flags left out (--optimizer, --lr, schedule, --seed, --batch, ...) "
         "are the checkpoint's"},
        {"metrics", DT_FLAG_STR, &c->metrics, "FILE",
         "write one JSON object per epoch and per --log-every / --eval-every record (JSON Lines; appended when "
         "resuming)"},
        {"tensorboard", DT_FLAG_STR, &o->tensorboard, "DIR",
         "write TensorBoard event files (scalars per epoch, per --log-every / --eval-every record) into DIR"},
        {"log-every", DT_FLAG_I64, &c->log_every, "STEPS",
         "every STEPS steps a line and a record (--metrics, --tensorboard): train loss, lr, samples/s, gradient norm"},
        {"eval-every", DT_FLAG_I64, &c->eval_every, "STEPS",
         "also evaluate every STEPS steps (a line and a record), not only at each epoch's end"},
        {"eval-batches", DT_FLAG_I64, &c->eval_batches, "N",
         "each evaluation while training covers the first N batches of the test (and --val-split) set; 0 = all of it"},
        {"quiet", DT_FLAG_BOOL, &o->quiet, NULL, "no progress output, only the per-epoch lines"},
    };
    _Static_assert(sizeof flags / sizeof *flags <= TRAIN_MAX_FLAGS / 2, "raise TRAIN_MAX_FLAGS");
    memcpy(f + n, flags, sizeof flags);
    return n + (int)(sizeof flags / sizeof *flags);
}

/* The flags of the job: ranks, strategies, transport, checkpoints, memory (into o), appended to f
 * from n; the new count. */
static int train_flags_job(train_opts *o, dt_flag *f, int n) {
    dt_train_config *c = &o->cfg;
    const dt_flag flags[] = {
        {"workers", DT_FLAG_INT, &o->workers, "N", "run N local data-parallel worker processes"},
        {"tp", DT_FLAG_INT, &o->tp, "K",
         "tensor parallel GPT over K ranks (--strategy tp; with --pp: K ranks per stage); the rest of the ranks are "
         "data parallel"},
        {"strategy", DT_FLAG_STR, &c->strategy, "SPEC", dt_train_strategy_help()},
        {"servers", DT_FLAG_INT, &o->uneven.servers, "S", "ps: ranks holding the parameters (the first S ranks)"},
        {"staleness", DT_FLAG_STR, &o->uneven.staleness, "S",
         "ps: global batches a worker may run ahead of the oldest one in training (default inf: async)"},
        {"sync-every", DT_FLAG_INT, &o->uneven.sync_every, "H", "localsgd: average the models every H steps"},
        {"balance", DT_FLAG_STR, &o->uneven.balance, "MODE",
         "ddp/localsgd: static (default) or dynamic (cut batches by speed); ps: dynamic (default) or static"},
        {"ps-overlap", DT_FLAG_BOOL, &o->uneven.overlap, NULL,
         "ps: push/pull in the background while the worker trains its next batch (--staleness inf only)"},
        {"slow", DT_FLAG_STR, &o->uneven.slow, "RANK:F", "testing aid: rank RANK sleeps to run F times slower"},
        {"pp", DT_FLAG_INT, &o->pp.pp, "K",
         "pipeline parallel: K stages (--workers a multiple of K; the rest is data parallel)"},
        {"microbatches", DT_FLAG_INT, &o->pp.microbatches, "M", "pp: micro-batches per rank-batch (default K)"},
        {"pp-schedule", DT_FLAG_STR, &o->pp.schedule, "NAME", "pp: gpipe or 1f1b (default)"},
        {"pp-split", DT_FLAG_STR, &o->pp.split, "N1:N2",
         "pp: first node (index or name) of stages 1..K-1 (default: balanced by flops)"},
        {"backend", DT_FLAG_STR, &o->backend, "NAME", backend_help()},
        {"bucket-mb", DT_FLAG_FLOAT, &o->bucket_mb, "MB", "ddp gradient bucket size in MB (0 = default 1)"},
        {"allreduce", DT_FLAG_STR, &o->uneven.allreduce, "MODE",
         "ddp: auto (hierarchical when ranks span hosts), flat or hier"},
        {"compress", DT_FLAG_STR, &o->uneven.compress, "C", dt_train_compress_help()},
        {"timeline", DT_FLAG_STR, &c->timeline, "FILE",
         "write a Chrome trace of every rank (Perfetto, chrome://tracing)"},
        {"timeout", DT_FLAG_FLOAT, &o->timeout, "S",
         "deadline of any wait for another rank, seconds (0 = DTRAIN_TIMEOUT or default 300)"},
        {"checkpoint-dir", DT_FLAG_STR, &c->checkpoint_dir, "DIR",
         "numbered checkpoints ckpt-STEP.safetensors go here (read by --resume auto)"},
        {"checkpoint-every", DT_FLAG_I64, &c->checkpoint_every, "STEPS", "checkpoint every STEPS steps"},
        {"checkpoint-secs", DT_FLAG_FLOAT, &o->ckpt_secs, "S", "checkpoint every S seconds"},
        {"keep", DT_FLAG_INT, &c->keep, "K", "keep only the newest K checkpoints in --checkpoint-dir (0 = all)"},
        {"elastic", DT_FLAG_STR, &o->elastic, "MIN:MAX",
         "with --workers: restart failed jobs from the last checkpoint"},
        {"max-restarts", DT_FLAG_INT, &o->max_restarts, "R", "with --elastic: give up after R restarts"},
        {"zero", DT_FLAG_INT, &o->uneven.zero, "N",
         "ZeRO stage 1 (shard optimizer state), 2 (+ gradients), 3 (+ parameters), over the data-parallel ranks; also "
         "with --tp, --pp and --tp --pp"},
        {"mem-limit", DT_FLAG_STR, &o->mem_limit_text, "BYTES", "fail when a rank would hold more (K, M, G suffixes)"},
        {"dry-run", DT_FLAG_BOOL, &o->dry_run, NULL, "print each rank's predicted memory for this layout and exit"},
        {"weights", DT_FLAG_STR, &c->weights, "FILE",
         "start from plain safetensors weights (PyTorch state_dict names; with --model): fine-tuning"},
        {"save-weights", DT_FLAG_STR, &c->save_weights, "FILE",
         "write a weights-only file after every epoch (strict torch load_state_dict; --normalize folded in)"},
        {"val-split", DT_FLAG_FLOAT, &o->val_split, "F",
         "hold out fraction F of the training set (by --seed) to validate on after every epoch"},
        {"early-stop", DT_FLAG_INT, &c->early_stop, "PATIENCE",
         "with --val-split: stop after PATIENCE epochs without a lower validation loss"},
        {"keep-best", DT_FLAG_BOOL, &c->keep_best, NULL,
         "with --val-split and --save: also write the best epoch's checkpoint (NAME.best.safetensors)"},
    };
    _Static_assert(sizeof flags / sizeof *flags <= TRAIN_MAX_FLAGS / 2, "raise TRAIN_MAX_FLAGS");
    memcpy(f + n, flags, sizeof flags);
    return n + (int)(sizeof flags / sizeof *flags);
}

/* The flags that depend on each other, once parsed: -1 = fine, else the exit status (after saying
 * what is wrong). */
static int check_train_flags(int argc, char **argv, train_opts *o) {
    dt_train_config *c = &o->cfg;
    int r;
    if (o->workers < 1) return dt_cli_usage(NULL, "--workers %d: need at least 1", o->workers);
    if (o->seed < 0) return dt_cli_usage("e.g. --seed 42", "--seed %lld: need an integer >= 0", (long long)o->seed);
    if (dt_cli_flag_given(argc, argv, "max-restarts") && !o->elastic)
        return dt_cli_usage("e.g. --workers 4 --elastic 2:4 --max-restarts 5", "--max-restarts needs --elastic");
    if (o->elastic && !dt_comm_env_is_rank() && c->checkpoint_every <= 0 && o->ckpt_secs <= 0)
        return dt_cli_usage("add --checkpoint-every STEPS or --checkpoint-secs S",
                            "--elastic restarts from the newest checkpoint, so it needs periodic checkpoints");
    if (o->elastic && o->workers < 2 && !dt_comm_env_is_rank())
        return dt_cli_usage("e.g. --workers 4 --elastic 2:4", "--elastic needs --workers N (N >= 2)");
    if (o->timeout < 0) return dt_cli_usage(NULL, "--timeout %g: must not be negative (0 = default)", o->timeout);
    if ((r = dt_cli_pp_parse(&o->pp, c, o->workers)) != 0) return r;
    o->uneven.servers_given = dt_cli_flag_given(argc, argv, "servers");
    o->uneven.sync_every_given = dt_cli_flag_given(argc, argv, "sync-every");
    o->uneven.bucket_mb = o->bucket_mb;
    o->uneven.zero_given = dt_cli_flag_given(argc, argv, "zero");
    if (o->mem_limit_text && (r = dt_cli_mem_limit_parse(o->mem_limit_text, &o->mem_limit)) != 0) return r;
    /* --tp K takes --zero N and --bucket-mb MB as its own options (its inner ddp over the dp axis):
     * tp(tp=K,zero=N,bucket_mb=MB) */
    const bool mesh_zero = o->tp > 0 && o->uneven.zero_given;
    const double mesh_bucket = o->tp > 0 ? o->uneven.bucket_mb : 0;
    if (mesh_zero) o->uneven.zero_given = false;
    if (o->tp > 0) o->uneven.bucket_mb = 0;
    if ((r = dt_cli_uneven_parse(&o->uneven, c)) != 0) return r;
    const dt_cli_mesh_flags mf = {.tp = o->tp,
                                  .zero = mesh_zero ? o->uneven.zero : -1,
                                  .bucket_mb = mesh_bucket,
                                  .implicit_ddp = o->uneven.implicit_ddp};
    if ((r = dt_cli_mesh_parse(&mf, c)) != 0) return r;
    if ((r = dt_cli_pp_check_batch(c)) != 0) return r;
    return -1;
}

/* Parses argv into o; returns -1 to continue, else the exit status (help, bad flags). */
static int parse_train_flags(int argc, char **argv, train_opts *o) {
    *o = (train_opts){.cfg = dt_train_defaults(),
                      .optimizer = "adam",
                      .schedule = "constant",
                      .backend = "auto",
                      .lr = 1e-3f,
                      .wd = -1,
                      .beta1 = 0.9f,
                      .beta2 = 0.999f,
                      .eps = 1e-8f,
                      .gamma = 0.1f,
                      .seed = 42,
                      .workers = 1,
                      .max_restarts = 3,
                      .val_fraction = 0.1f,
                      .uneven = {.servers = 1, .sync_every = 8}};
    o->cfg.model = NULL; /* mlp, or the model of the checkpoint being resumed */
    dt_flag flags[TRAIN_MAX_FLAGS];
    const int n = train_flags_job(o, flags, train_flags_model(o, flags, 0));
    int r = dt_flags_parse_help(argc, argv, 1, flags, n, dt_train_help(), NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    return check_train_flags(argc, argv, o);
}

/* Turns the optimizer and schedule flags into the trainer config (with --resume, the ones not
 * given are the checkpoint's); -1 = fine, else exit status. */
static int build_train_config(int argc, char **argv, train_opts *o) {
    dt_train_config *c = &o->cfg;
    if (dt_optim_parse(o->optimizer, &c->optim.kind) != DT_OK)
        return dt_cli_usage("use --optimizer sgd, adam or adamw", "%s", dt_last_error());
    c->optim = dt_optim_defaults(c->optim.kind);
    c->optim.momentum = o->momentum;
    c->optim.nesterov = o->nesterov;
    if (o->wd >= 0) c->optim.weight_decay = o->wd;
    c->optim.beta1 = o->beta1, c->optim.beta2 = o->beta2, c->optim.eps = o->eps;
    if (dt_lr_parse(o->schedule, &c->lr.kind) != DT_OK)
        return dt_cli_usage("use --schedule constant, step or cosine", "%s", dt_last_error());
    c->lr.base_lr = o->lr;
    c->lr.warmup_steps = o->warmup;
    c->lr.step_size = o->step_size;
    c->lr.gamma = o->gamma;
    c->lr.min_lr = o->min_lr;
    c->seed = (uint64_t)o->seed;
    c->max_steps = o->max_steps;
    c->normalize = o->normalize;
    c->val_fraction = o->val_fraction;
    c->val_split = o->val_split;
    c->checkpoint_secs = o->ckpt_secs;
    c->stop = &g_stop;
    o->strategy_from_ckpt = dt_cli_resume_settings(argc, argv, c);
    return -1;
}

/* Whether this rank runs under Open MPI's mpirun without --enable-recovery, which ends the whole
 * job when one rank dies (a ps job could otherwise go on without a dead worker). */
static bool ompi_ends_job_on_death(void) {
    static const char *yes[] = {"1", "t", "true", "y", "yes", "enabled"};
    const char *r = getenv("OMPI_MCA_orte_enable_recovery");
    if (!getenv("OMPI_COMM_WORLD_SIZE")) return false;
    for (size_t i = 0; r && i < sizeof yes / sizeof *yes; i++)
        if (!strcasecmp(r, yes[i])) return false;
    return true;
}

/* Rank 0's (or a single process's) opening lines. */
static void print_header(const train_opts *o, dt_trainer *t, dt_comm *comm, int world) {
    const dt_train_config *c = &o->cfg;
    printf("dtrain: model %s (%zu parameters), data %s, batch %d, %s lr %g, seed %llu, %d thread%s\n",
           dt_model_spec(dt_trainer_model(t)), dt_model_num_params(dt_trainer_model(t)), c->data, c->batch,
           dt_optim_name(c->optim.kind), c->lr.base_lr, (unsigned long long)c->seed, c->threads,
           c->threads > 1 ? "s" : "");
    printf("dtrain: kernels %s\n", dt_kernels_describe());
    char note[512];
    if (dt_kernels_note()) dt_cli_flag_terms(dt_kernels_note(), note, sizeof note), printf("dtrain: note: %s\n", note);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && c->threads > cores)
        printf("dtrain: note: --threads %d on %ld cores: the threads take turns on them (slower than --threads %ld)\n",
               c->threads, cores, cores);
    char spec[512] = "";
    if (world > 1 && dt_strategy_spec_canonical(c->strategy ? c->strategy : dt_strategy_spec_default(world), spec,
                                                sizeof spec) != DT_OK)
        snprintf(spec, sizeof spec, "%s", c->strategy);
    if (world > 1 && dt_cli_is_ps(c)) {
        const int S = dt_cli_servers(c);
        printf("dtrain: %d ranks over %s, strategy %s: %d server%s, %d workers x batch %d\n", world,
               dt_comm_backend_name(comm), spec, S, S > 1 ? "s" : "", world - S, c->batch);
        if (!strcmp(dt_comm_backend_name(comm), "mpi") && ompi_ends_job_on_death())
            printf("dtrain: note: mpirun ends the whole job if a worker dies; start it with 'mpirun --enable-recovery' "
                   "to let the servers go on without it\n");
    } else if (world > 1) {
        const char *choice = dt_trainer_strategy_choice(t);
        printf("dtrain: %d ranks over %s, strategy %s%s%s, global batch %d%s\n", world, dt_comm_backend_name(comm),
               spec, choice ? ", " : "", choice ? choice : "",
               c->batch *
                   dt_strategy_spec_data_world(c->strategy ? c->strategy : dt_strategy_spec_default(world), world),
               strstr(spec, "balance=dynamic") ? " (cut among the ranks by measured speed)" : "");
    }
    fflush(stdout);
}

/* The job's ranks against the flags: --workers N (or what an elastic supervisor shrank it to) and
 * --slow RANK. 0 when they fit, else the exit status (after saying what is wrong). */
static int check_job_size(int argc, char **argv, const train_opts *o, int job_ranks, int world) {
    job_ranks = dt_elastic_job_workers(job_ranks); /* an elastic job that lost a rank slot is smaller */
    if (dt_cli_flag_given(argc, argv, "workers") && job_ranks > 1 && world != job_ranks) {
        if (dt_cli_is_ps(&o->cfg))
            return dt_cli_usage("leave out --workers when mpirun/srun/dtrain launch sets the number of ranks",
                                "--workers %d with --servers %d makes %d ranks, but this job has %d", o->workers,
                                dt_cli_servers(&o->cfg), job_ranks, world);
        return dt_cli_usage("leave out --workers when mpirun/srun/dtrain launch sets the number of ranks",
                            "--workers %d but this job has %d ranks", job_ranks, world);
    }
    const dt_train_aids *a = o->cfg.aids;
    if (a && a->slow_factor > 1 && a->slow_rank >= world)
        return dt_cli_usage("pick a rank below the job's ranks", "--slow %d:%g: this job has only %d rank(s) (0..%d)",
                            a->slow_rank, a->slow_factor, world, world - 1);
    return 0;
}

/* This rank's communicator, from the environment (--workers, dtrain launch, mpirun), checked against
 * the flags: -1 = fine (*out set), else the exit status (after saying what is wrong). */
static int open_rank_comm(int argc, char **argv, const train_opts *o, int job_ranks, dt_comm **out) {
    dt_comm_config cc = dt_comm_config_default();
    if (dt_comm_transport_check(o->backend) != DT_OK) return dt_cli_usage(NULL, "--backend: %s", dt_last_error());
    cc.transport = o->backend;
    cc.device = o->cfg.device;
    if (o->timeout > 0) cc.timeout_s = o->timeout;
    cc.timeout_knob = "--timeout"; /* it overrides DTRAIN_TIMEOUT: the one to raise */
    dt_comm *comm = NULL;
    dt_status cs = dt_comm_create_from_env(&comm, &cc);
    if (cs != DT_OK) {
        dt_cli_fail(cs == DT_ENOTSUP ? NULL : "start ranks with --workers N, dtrain launch or mpirun", "%s",
                    dt_last_error());
        return setup_exit(cs);
    }
    int r = check_job_size(argc, argv, o, job_ranks, dt_comm_size(comm));
    if (r) {
        dt_comm_destroy(comm);
        return r;
    }
    *out = comm;
    return -1;
}

/* The strategy flags against the job's size: one process drops what needs several (saying so). */
static void fit_strategy_to_world(int argc, char **argv, const train_opts *o, dt_train_config *cfg, int rank,
                                  int world) {
    if (world == 1 && o->uneven.implicit_ddp) { /* --bucket-mb, --compress, --zero, --balance of one process */
        cfg->strategy = NULL;
        if (o->uneven.zero_given && o->uneven.zero > 0)
            fprintf(stderr, "dtrain: note: --zero %d with one worker shards nothing (use --workers N)\n",
                    o->uneven.zero);
        if (o->uneven.balance && !strcmp(o->uneven.balance, "dynamic"))
            fprintf(stderr, "dtrain: note: --balance dynamic with one worker has no batch to cut (use --workers N)\n");
        if (o->uneven.compress && strcmp(o->uneven.compress, "none"))
            fprintf(stderr, "dtrain: note: --compress %s with one worker sends nothing to compress (use --workers N)\n",
                    o->uneven.compress);
    }
    if (world == 1 && o->strategy_from_ckpt) { /* the checkpoint's ddp/localsgd needs more ranks */
        fprintf(stderr,
                "dtrain: note: the checkpoint's --strategy %s needs more than one rank; this resume trains on "
                "one (add --workers N to continue it)\n",
                cfg->strategy);
        cfg->strategy = NULL;
    }
    /* --tp / --pp with --zero on exactly one model copy: the data-parallel axis ZeRO shards over is 1 rank */
    if (world > 1 && rank == 0 && o->uneven.zero > 0 && dt_cli_flag_given(argc, argv, "zero") && cfg->strategy &&
        dt_strategy_spec_data_world(cfg->strategy, world) == 1)
        fprintf(stderr,
                "dtrain: note: --zero %d on one model copy (%d ranks) shards nothing: its data-parallel axis has "
                "1 rank (use more copies, e.g. --workers %d)\n",
                o->uneven.zero, world, 2 * world);
}

/* The trainer's callbacks: progress lines and records into pc (TensorBoard when asked, rank 0). */
static int set_rank_reporting(const train_opts *o, dt_train_config *cfg, dt_train_progress *pc, int rank) {
    const bool quiet = o->quiet || rank != 0;
    const bool tty = isatty(2) || (rank == 0 && getenv("DTRAIN_PROGRESS_TTY") && dt_comm_env_is_rank());
    *pc = (dt_train_progress){.quiet = quiet, .tty = tty, .epochs = cfg->epochs, .eval_batches = cfg->eval_batches};
    pc->predicted_step_s = cfg->predicted_step_s = dt_cli_plan_from_env(&cfg->plan_layout); /* --strategy auto */
    cfg->keep_sharded = true; /* nothing reads the whole model after the run (tp, pp: it may not fit) */
    cfg->on_progress = dt_train_print_progress;
    cfg->on_epoch = dt_train_print_epoch;
    cfg->on_note = dt_train_print_note;
    cfg->on_step = dt_train_print_step;
    cfg->cb_ctx = pc;
    if (o->tensorboard && rank == 0 && dt_tb_writer_create(&pc->tb, o->tensorboard) != DT_OK) {
        dt_cli_fail("give a directory you can write", "%s", dt_last_error());
        return DT_EXIT_OUTPUT;
    }
    return -1;
}

/* The trainer for cfg, or the exit status (after saying what is wrong). */
static int create_rank_trainer(dt_trainer **t, const dt_train_config *cfg) {
    dt_status s = dt_trainer_create(t, cfg);
    if (s == DT_OK) return -1;
    *t = NULL;
    /* an error that starts with its flag ("--batch 9 is ...: use ...") carries its own advice */
    const char *msg = dt_cli_last_error();
    const char *hint = !strncmp(msg, "--", 2) ? NULL
                       : strstr(msg, "data set") || strstr(msg, "--data")
                           ? "check --data (fashion-mnist, mnist, an IDX directory, a .csv file, text:FILE or kjv)"
                       : strstr(msg, "model spec") ? "see 'dtrain train --help' for the spec syntax"
                                                   : NULL;
    dt_cli_fail(hint, "%s", msg);
    return setup_exit(s);
}

/* The exit status of a rank whose run ended with s (after saying why it stopped). */
static int rank_failure_exit(dt_status s, int rank, int world) {
    if (s == DT_EINTR) {
        if (rank == 0) printf("dtrain: %s\n", dt_cli_last_error());
        return 0;
    }
    if (world == 1) return dt_cli_fail(NULL, "%s", dt_last_error());
    if (s == DT_EPEER && dt_last_error_peer() >= 0) { /* it only followed: the culprit says why */
        fprintf(stderr, "dtrain: stopped: world rank %d failed (see its message, or the launcher's)\n",
                dt_last_error_peer());
        return DT_EXIT_PEER;
    }
    dt_cli_fail(NULL, "rank %d: %s", rank, dt_last_error());
    /* stopped because another rank died or stalled: say so to the launcher */
    return s == DT_EPEER || s == DT_ETIMEDOUT ? DT_EXIT_PEER : 1;
}

/* A finished run's closing lines. */
static void print_rank_done(const dt_train_progress *pc, const dt_train_config *cfg, bool trained, int64_t last_step,
                            int rank) {
    if (pc->last.epoch > 0 && !isnan(pc->last.test_loss))
        printf("dtrain: done: test accuracy %.4f, test loss %.4f after %lld steps (%.1fs)\n", pc->last.test_acc,
               pc->last.test_loss, (long long)pc->last.global_step, pc->last.wall_s);
    else if (pc->last.epoch > 0)
        printf("dtrain: done: %lld steps (%.1fs); no test set to evaluate on (a --data with a test split, or "
               "--val-split F)\n",
               (long long)pc->last.global_step, pc->last.wall_s);
    if (!trained && rank == 0)
        printf("dtrain: nothing to train: already at step %lld, the end of --epochs %d%s\n", (long long)last_step,
               cfg->epochs, cfg->max_steps ? " or --max-steps" : "");
    else if (cfg->save && !pc->quiet) printf("dtrain: checkpoint saved to %s\n", cfg->save);
}

/* One rank of a job (or a single process): the communicator comes from the environment. */
static int run_rank(int argc, char **argv, train_opts *o, int job_ranks) {
    dt_train_config cfg = o->cfg;
    dt_comm *comm = NULL;
    int r = open_rank_comm(argc, argv, o, job_ranks, &comm);
    if (r >= 0) return r;
    const int rank = dt_comm_rank(comm), world = dt_comm_size(comm);
    if (world > 1) cfg.comm = comm;
    fit_strategy_to_world(argc, argv, o, &cfg, rank, world);
    dt_log_set_rank(world > 1 ? rank : -1);
    dt_train_progress pc;
    if ((r = set_rank_reporting(o, &cfg, &pc, rank)) >= 0) {
        dt_comm_destroy(comm);
        return r;
    }
    /* from here on SIGTERM/SIGINT mean: finish the step, checkpoint, exit 0 (a second one kills).
     * Set before the trainer's set-up, so a signal that arrives while this rank still loads (the
     * launcher forwards it to every rank at once) is not lost: the run stops at its first chance.
     * Before this (connecting the ranks) they still interrupt at once. */
    if (dt_cli_stop_on_signals(&g_stop) != 0)
        fprintf(stderr, "dtrain: warning: cannot start the signal thread (%s); SIGTERM may interrupt a kernel\n",
                strerror(errno));
    dt_trainer *t = NULL;
    if ((r = create_rank_trainer(&t, &cfg)) >= 0 || (r = dt_cli_mem_limit_apply(o->mem_limit, rank)) != 0) {
        if (r != 0 && t) dt_trainer_destroy(t);
        dt_comm_destroy(comm);
        dt_tb_writer_destroy(pc.tb);
        return r;
    }
    const int64_t first_step = dt_trainer_step(t);
    if (!pc.quiet) print_header(o, t, comm, world);
    dt_status s = dt_trainer_run(t);
    if (o->mem_limit && s == DT_OK) /* the accounted peak (core/mem.c), not the OS's resident set */
        printf("dtrain: rank %d held at most %zu bytes of its --mem-limit %zu\n", rank, dt_mem_peak(), o->mem_limit);
    const int64_t last_step = dt_trainer_step(t);
    dt_trainer_destroy(t);
    dt_comm_destroy(comm);
    if (dt_tb_writer_destroy(pc.tb) != DT_OK && s == DT_OK) return dt_cli_fail("check the disk", "%s", dt_last_error());
    if (s != DT_OK) return rank_failure_exit(s, rank, world);
    print_rank_done(&pc, &cfg, last_step > first_step, last_step, rank);
    return 0;
}

/* --workers N on this host: refused past DT_LAUNCH_MAX_RANKS (exit 2), with a note where the ranks
 * outnumber the cores (they run, taking turns). -1 = fine. */
static int check_local_ranks(const train_opts *o, int job_ranks) {
    if (job_ranks > DT_LAUNCH_MAX_RANKS)
        return dt_cli_usage("more ranks run across hosts: start dtrain train under mpirun or srun",
                            "--workers %d%s: at most %d local ranks on one host", o->workers,
                            job_ranks != o->workers ? " (with the ps servers)" : "", DT_LAUNCH_MAX_RANKS);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && job_ranks > cores)
        fprintf(stderr,
                "dtrain: note: %d ranks on %ld cores: the ranks take turns on them, and every step waits for "
                "the slowest (--workers %ld or fewer runs faster)\n",
                job_ranks, cores, cores);
    return -1;
}

int dt_cmd_train(int argc, char **argv) {
    if (dt_cli_strategy_is_auto(argc, argv)) return dt_cli_train_auto(argc, argv, dt_cmd_train);
    train_opts o;
    int r = parse_train_flags(argc, argv, &o);
    if (r >= 0) return r;
    const int job_ranks = dt_cli_job_ranks(&o.cfg, o.workers); /* ps: servers + workers */
    if (o.dry_run) {
        if ((r = build_train_config(argc, argv, &o)) >= 0) return r;
        return dt_cli_dry_run(&o.cfg, job_ranks, o.uneven.zero, o.bucket_mb, o.mem_limit);
    }
    if ((r = dt_cli_check_outputs(&o.cfg)) >= 0) return r; /* before an epoch is spent (and once, not per rank) */
    if (job_ranks > 1 && !dt_comm_env_is_rank()) {
        const dt_train_config *c = &o.cfg;
        const int S = dt_cli_servers(c);
        if ((r = check_local_ranks(&o, job_ranks)) >= 0) return r;
        const dt_train_aids *a = c->aids;
        if (a && a->slow_factor > 1 && (a->slow_rank >= job_ranks || (dt_cli_is_ps(c) && a->slow_rank < S))) {
            if (dt_cli_is_ps(c))
                return dt_cli_usage("ranks 0..servers-1 serve; the workers are the ranks after them",
                                    "--slow %d:%g: rank %d is %s; pick a worker rank (%d..%d)", a->slow_rank,
                                    a->slow_factor, a->slow_rank, a->slow_rank < S ? "a ps server" : "not in the job",
                                    S, job_ranks - 1);
            return dt_cli_usage(NULL, "--slow %d:%g: this job has only %d ranks (0..%d)", a->slow_rank, a->slow_factor,
                                job_ranks, job_ranks - 1);
        }
        bool *expendable = dt_cli_expendable(&o.cfg, job_ranks);
        int rc = run_workers(argc, argv, job_ranks, o.elastic, o.max_restarts, o.cfg.checkpoint_dir, expendable);
        free(expendable);
        return rc;
    }
    if ((r = build_train_config(argc, argv, &o)) >= 0) return r;
    return run_rank(argc, argv, &o, job_ranks);
}
