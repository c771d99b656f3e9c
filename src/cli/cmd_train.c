/* dtrain train / dtrain eval: flags -> dt_train_config, a progress bar (terminal) or plain
 * progress lines (pipes), and one line per epoch with train/test loss, accuracy and speed. */
#include "cli/cli.h"
#include "cli/train_uneven.h"
#include "dtrain/dtrain.h"
#include "run/elastic.h"
#include "run/launch.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    bool quiet, tty;
    int epochs;
    dt_epoch_info last;  /* the last finished epoch, for the closing line */
} progress_ctx;

static void fmt_duration(char *buf, size_t cap, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%d:%02d", t / 60, t % 60);
}

static void on_progress(void *ctx, const dt_progress_info *p) {
    progress_ctx *pc = ctx;
    if (pc->quiet) return;
    char eta[32];
    fmt_duration(eta, sizeof eta, p->eta_s);
    if (pc->tty) {
        enum { WIDTH = 28 };
        int fill = p->steps_per_epoch ? (int)(WIDTH * p->step_in_epoch / p->steps_per_epoch) : 0;
        char bar[WIDTH + 1];
        for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(stderr, "\r\033[Kepoch %d/%d [%s] %lld/%lld loss %.4f %.0f samples/s ETA %s", p->epoch + 1,
                p->epochs, bar, (long long)p->step_in_epoch, (long long)p->steps_per_epoch, p->loss,
                p->samples_per_s, eta);
        fflush(stderr);
    } else if (p->step_in_epoch < p->steps_per_epoch) {
        /* plain lines for logs: at most one every few seconds */
        static double last;
        if (p->elapsed_s - last < 5.0 && last <= p->elapsed_s) return;
        last = p->elapsed_s;
        fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f %.0f samples/s ETA %s\n", p->epoch + 1, p->epochs,
                (long long)p->step_in_epoch, (long long)p->steps_per_epoch, p->loss, p->samples_per_s, eta);
    }
}

static void on_epoch(void *ctx, const dt_epoch_info *e) {
    progress_ctx *pc = ctx;
    pc->last = *e;
    if (pc->tty && !pc->quiet) fprintf(stderr, "\r\033[K");
    printf("epoch %d/%d: train_loss %.4f test_loss %.4f test_acc %.4f %.0f samples/s (%.1fs)\n", e->epoch,
           pc->epochs, e->train_loss, e->test_loss, e->test_acc, e->samples_per_s, e->epoch_s);
    fflush(stdout);
}

static volatile sig_atomic_t g_stop;
static void on_stop_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static void on_note(void *ctx, const char *msg) {
    (void)ctx;
    printf("dtrain: %s\n", msg);
    fflush(stdout);
}

static void print_launch_event(void *ctx, const char *msg) {
    (void)ctx;
    fprintf(stderr, "dtrain train: %s\n", msg);
}

/* Exit status of a rank whose set-up failed with s: a peer's failure or a deadline is
 * DT_EXIT_PEER (the launcher blames the other rank), anything else is bad flags/data/model. */
static int setup_exit(dt_status s) {
    return s == DT_EPEER || s == DT_ETIMEDOUT ? DT_EXIT_PEER : DT_EXIT_CONFIG;
}

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
    for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
    dt_launch_result res;
    dt_status s;
    if (elastic) {
        int lo, hi;
        char tail;
        if (sscanf(elastic, "%d:%d%c", &lo, &hi, &tail) != 2) {
            free(args);
            return dt_cli_fail("e.g. --elastic 1:4", "--elastic '%s' is not MIN:MAX", elastic);
        }
        if (!checkpoint_dir) {
            free(args);
            return dt_cli_fail("add --checkpoint-dir DIR --checkpoint-every STEPS (or --checkpoint-secs S)",
                               "--elastic restarts from checkpoints, so it needs --checkpoint-dir");
        }
        dt_elastic_config ec = {.workers = workers, .min_workers = lo, .max_workers = hi,
                                .max_restarts = max_restarts, .argv = args, .argc = argc + 1,
                                .checkpoint_dir = checkpoint_dir, .notify = print_launch_event};
        s = dt_elastic_run(&ec, &res);
        if (s == DT_EINVAL) {
            free(args);
            return dt_cli_fail(NULL, "%s", dt_last_error());
        }
    } else {
        dt_launch_config lc = {.nranks = workers, .notify = print_launch_event, .expendable = expendable};
        s = dt_launch_run(&lc, args, &res);
    }
    free(args);
    if (s == DT_EINTR && res.all_exited_0) return 0; /* preempted: the ranks checkpointed and said how to resume */
    if (s != DT_OK && res.failed_rank < 0 && res.exit_code == 0) return dt_cli_fail(NULL, "%s", dt_last_error());
    return res.exit_code;
}

static const char TRAIN_USAGE[] =
    "Usage: dtrain train [FLAGS]\n\n"
    "Trains a model: in one process, on N local workers (--workers N), or as one rank of a job\n"
    "started by 'dtrain launch' or mpirun/srun.\n"
    "Example: dtrain train --data fashion-mnist --model mlp --epochs 2 --batch 32 --optimizer adam --lr 0.001\n"
    "Model specs are layers separated by spaces, e.g.\n"
    "  \"conv(32,3,pad=1) relu maxpool(2) flatten linear(128) relu linear(10)\"\n"
    "layers: linear(out[,bias=0]) conv(out,k[,stride=,pad=,bias=]) maxpool(k[,stride=]) avgpool(k[,stride=])\n"
    "        relu gelu tanh sigmoid dropout(p) flatten layernorm([eps=]) batchnorm([eps=,momentum=])\n"
    "presets: mlp (784-128-10, ReLU), cnn (the spec above with a second conv(64,3,pad=1) relu maxpool(2))\n\n"
    "Data parallel: --workers N starts N local ranks (shared memory); 'mpirun -np N dtrain train ...'\n"
    "or 'dtrain launch -n N -- dtrain train ...' run the same job. --batch is per rank; each step\n"
    "averages gradients over the global batch of N*batch samples (--strategy ddp).\n\n"
    "Uneven workers: --strategy localsgd --sync-every H trains locally and averages the models every\n"
    "H steps; --balance dynamic (ddp, localsgd) cuts each global batch by the workers' measured speed.\n"
    "--strategy ps --servers S: a parameter server; --workers N then starts S server ranks plus N\n"
    "workers (under mpirun/launch the first S ranks serve). Servers shard the parameters and apply\n"
    "the optimizer as pushes arrive; --staleness S bounds how far a worker may run ahead of the\n"
    "slowest (0 = synchronous, inf = fully asynchronous). A ps worker that dies is dropped and the\n"
    "others go on; rank 0 (server 0) evaluates and prints. --slow RANK:FACTOR is a testing and\n"
    "benchmark aid that makes one rank FACTOR times slower by sleeping.";

int dt_cmd_train(int argc, char **argv) {
    dt_train_config cfg = dt_train_defaults();
    cfg.model = NULL; /* mlp, or the model of the checkpoint being resumed */
    const char *optimizer = "adam", *schedule = "constant";
    float lr = 1e-3f, momentum = 0, wd = -1, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    int64_t seed = 42, warmup = 0, step_size = 0, max_steps = 0;
    float gamma = 0.1f, min_lr = 0;
    bool nesterov = false, quiet = false, normalize = false;
    int workers = 1;
    const char *backend = "auto";
    float bucket_mb = 0, timeout = 0, ckpt_secs = 0;
    const char *elastic = NULL;
    dt_cli_uneven uneven = {0};
    int max_restarts = 3;
    const dt_flag flags[] = {
        {"data", DT_FLAG_STR, &cfg.data, "DIR", "IDX directory (train-*/t10k-* files), fashion-mnist, mnist or a .csv"},
        {"model", DT_FLAG_STR, &cfg.model, "SPEC", "model spec or preset mlp, cnn (default mlp; when resuming, the checkpoint's)"},
        {"epochs", DT_FLAG_INT, &cfg.epochs, "N", "passes over the training set"},
        {"batch", DT_FLAG_INT, &cfg.batch, "N", "samples per step"},
        {"optimizer", DT_FLAG_STR, &optimizer, "NAME", "sgd, adam or adamw"},
        {"lr", DT_FLAG_FLOAT, &lr, "X", "learning rate"},
        {"momentum", DT_FLAG_FLOAT, &momentum, "X", "sgd momentum"},
        {"nesterov", DT_FLAG_BOOL, &nesterov, NULL, "sgd: Nesterov momentum"},
        {"weight-decay", DT_FLAG_FLOAT, &wd, "X", "L2 (sgd, adam) or decoupled (adamw) decay; default 0, adamw 0.01"},
        {"beta1", DT_FLAG_FLOAT, &beta1, "X", "adam/adamw beta1"},
        {"beta2", DT_FLAG_FLOAT, &beta2, "X", "adam/adamw beta2"},
        {"eps", DT_FLAG_FLOAT, &eps, "X", "adam/adamw epsilon"},
        {"schedule", DT_FLAG_STR, &schedule, "NAME", "learning-rate schedule: constant, step or cosine"},
        {"warmup", DT_FLAG_I64, &warmup, "STEPS", "linear warm-up steps"},
        {"step-size", DT_FLAG_I64, &step_size, "STEPS", "step schedule: decay every STEPS steps"},
        {"gamma", DT_FLAG_FLOAT, &gamma, "X", "step schedule: decay factor"},
        {"min-lr", DT_FLAG_FLOAT, &min_lr, "X", "cosine schedule: final learning rate"},
        {"clip", DT_FLAG_FLOAT, &cfg.clip_norm, "X", "clip the gradient L2 norm to X (0 = off)"},
        {"normalize", DT_FLAG_BOOL, &normalize, NULL, "standardise inputs with the training set mean/std"},
        {"seed", DT_FLAG_I64, &seed, "N", "seed of init, shuffling and dropout"},
        {"threads", DT_FLAG_INT, &cfg.threads, "N", "BLAS threads of this worker"},
        {"max-steps", DT_FLAG_I64, &max_steps, "N", "stop after N steps in total (0 = all epochs)"},
        {"save", DT_FLAG_STR, &cfg.save, "FILE", "write a checkpoint (safetensors) after every epoch"},
        {"resume", DT_FLAG_STR, &cfg.resume, "FILE", "continue from a checkpoint (--save or --checkpoint-dir); auto = newest valid one in --checkpoint-dir"},
        {"metrics", DT_FLAG_STR, &cfg.metrics, "FILE", "write one JSON object per epoch (JSON Lines; appended when resuming)"},
        {"quiet", DT_FLAG_BOOL, &quiet, NULL, "no progress output, only the per-epoch lines"},
        {"workers", DT_FLAG_INT, &workers, "N", "run N local data-parallel worker processes"},
        {"strategy", DT_FLAG_STR, &cfg.strategy, "NAME", "distribution strategy: ddp (default when > 1 rank), localsgd, ps"},
        {"servers", DT_FLAG_INT, &cfg.servers, "S", "ps: ranks holding the parameters (the first S ranks)"},
        {"staleness", DT_FLAG_STR, &uneven.staleness, "S", "ps: steps a worker may run ahead of the slowest (default inf: async)"},
        {"sync-every", DT_FLAG_INT, &cfg.sync_every, "H", "localsgd: average the models every H steps"},
        {"balance", DT_FLAG_STR, &uneven.balance, "MODE", "ddp/localsgd: static (default) or dynamic (cut batches by speed)"},
        {"slow", DT_FLAG_STR, &uneven.slow, "RANK:F", "testing aid: rank RANK sleeps to run F times slower"},
        {"backend", DT_FLAG_STR, &backend, "NAME", "transport between ranks: auto, shm or mpi"},
        {"bucket-mb", DT_FLAG_FLOAT, &bucket_mb, "MB", "ddp gradient bucket size in MB (0 = default 1)"},
        {"timeline", DT_FLAG_STR, &cfg.timeline, "FILE", "write a Chrome trace of every rank (Perfetto, chrome://tracing)"},
        {"timeout", DT_FLAG_FLOAT, &timeout, "S", "deadline of any wait for another rank, seconds (0 = DTRAIN_TIMEOUT or default 300)"},
        {"checkpoint-dir", DT_FLAG_STR, &cfg.checkpoint_dir, "DIR", "numbered checkpoints ckpt-STEP.safetensors go here (read by --resume auto)"},
        {"checkpoint-every", DT_FLAG_I64, &cfg.checkpoint_every, "STEPS", "checkpoint every STEPS steps"},
        {"checkpoint-secs", DT_FLAG_FLOAT, &ckpt_secs, "S", "checkpoint every S seconds"},
        {"keep", DT_FLAG_INT, &cfg.keep, "K", "keep only the newest K checkpoints in --checkpoint-dir (0 = all)"},
        {"elastic", DT_FLAG_STR, &elastic, "MIN:MAX", "with --workers: restart failed jobs from the last checkpoint"},
        {"max-restarts", DT_FLAG_INT, &max_restarts, "R", "with --elastic: give up after R restarts"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof *flags), TRAIN_USAGE, NULL, 0, NULL,
                           NULL);
    if (r) return r < 0 ? 2 : 0;
    if (workers < 1) return dt_cli_fail(NULL, "--workers %d: need at least 1", workers);
    if (dt_cli_flag_given(argc, argv, "max-restarts") && !elastic)
        return dt_cli_fail("e.g. --workers 4 --elastic 2:4 --max-restarts 5", "--max-restarts needs --elastic");
    if (elastic && !dt_comm_env_is_rank() && cfg.checkpoint_every <= 0 && ckpt_secs <= 0)
        return dt_cli_fail("add --checkpoint-every STEPS or --checkpoint-secs S",
                           "--elastic restarts from the newest checkpoint, so it needs periodic checkpoints");
    if (elastic && workers < 2 && !dt_comm_env_is_rank())
        return dt_cli_fail("e.g. --workers 4 --elastic 2:4", "--elastic needs --workers N (N >= 2)");
    if ((r = dt_cli_uneven_parse(&uneven, &cfg)) != 0) return r;
    const int job_ranks = dt_cli_job_ranks(&cfg, workers);  /* ps: servers + workers */
    if (job_ranks > 1 && !dt_comm_env_is_rank()) {
        bool *expendable = dt_cli_expendable(&cfg, job_ranks);
        int rc = run_workers(argc, argv, job_ranks, elastic, max_restarts, cfg.checkpoint_dir, expendable);
        free(expendable);
        return rc;
    }
    if (dt_optim_parse(optimizer, &cfg.optim.kind) != DT_OK)
        return dt_cli_fail("use --optimizer sgd, adam or adamw", "%s", dt_last_error());
    dt_optim_kind kind = cfg.optim.kind;
    cfg.optim = dt_optim_defaults(kind);
    cfg.optim.momentum = momentum;
    cfg.optim.nesterov = nesterov;
    if (wd >= 0) cfg.optim.weight_decay = wd;
    cfg.optim.beta1 = beta1, cfg.optim.beta2 = beta2, cfg.optim.eps = eps;
    if (dt_lr_parse(schedule, &cfg.lr.kind) != DT_OK)
        return dt_cli_fail("use --schedule constant, step or cosine", "%s", dt_last_error());
    cfg.lr.base_lr = lr;
    cfg.lr.warmup_steps = warmup;
    cfg.lr.step_size = step_size;
    cfg.lr.gamma = gamma;
    cfg.lr.min_lr = min_lr;
    cfg.seed = (uint64_t)seed;
    cfg.max_steps = max_steps;
    cfg.normalize = normalize;
    cfg.bucket_mb = bucket_mb;
    cfg.checkpoint_secs = ckpt_secs;
    cfg.stop = &g_stop;

    /* one rank of a job (or a single process): the communicator comes from the environment */
    dt_comm_config cc = dt_comm_config_default();
    if (dt_backend_parse(backend, &cc.backend) != DT_OK)
        return dt_cli_fail("use --backend auto, shm or mpi", "%s", dt_last_error());
    if (timeout < 0) return dt_cli_fail(NULL, "--timeout %g: must not be negative (0 = default)", timeout);
    if (timeout > 0) cc.timeout_s = timeout;
    dt_comm *comm = NULL;
    dt_status cs = dt_comm_create_from_env(&comm, &cc);
    if (cs != DT_OK) {
        dt_cli_fail("start ranks with --workers N, dtrain launch or mpirun", "%s", dt_last_error());
        return setup_exit(cs);
    }
    int rank = dt_comm_rank(comm), world = dt_comm_size(comm);
    if (dt_cli_flag_given(argc, argv, "workers") && job_ranks > 1 && world != job_ranks) {
        dt_comm_destroy(comm);
        return dt_cli_fail("leave out --workers when mpirun/srun/dtrain launch sets the number of ranks",
                           "--workers %d but this job has %d ranks", job_ranks, world);
    }
    if (world > 1) cfg.comm = comm;
    dt_log_set_rank(world > 1 ? rank : -1);
    if (rank != 0) quiet = true;
    progress_ctx pc = {.quiet = quiet, .tty = isatty(2), .epochs = cfg.epochs};
    cfg.on_progress = on_progress;
    cfg.on_epoch = on_epoch;
    cfg.on_note = on_note;
    cfg.cb_ctx = &pc;

    dt_trainer *t;
    dt_status s = dt_trainer_create(&t, &cfg);
    if (s != DT_OK) {
        const char *hint = strstr(dt_last_error(), "data set") || strstr(dt_last_error(), "--data")
                               ? "check --data (an IDX directory, fashion-mnist, mnist or a .csv file)"
                           : strstr(dt_last_error(), "model spec") ? "see 'dtrain train --help' for the spec syntax"
                                                                   : NULL;
        dt_comm_destroy(comm);
        dt_cli_fail(hint, "%s", dt_last_error());
        return setup_exit(s);
    }
    /* from here on SIGTERM/SIGINT mean: finish the step, checkpoint, exit 0 (a second one kills);
     * during set-up they still interrupt at once */
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESETHAND};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    const int64_t first_step = dt_trainer_step(t);
    if (!quiet) {
        printf("dtrain: model %s (%zu parameters), data %s, batch %d, %s lr %g, seed %llu, %d thread%s\n",
               dt_model_spec(dt_trainer_model(t)), dt_model_num_params(dt_trainer_model(t)), cfg.data, cfg.batch,
               optimizer, lr, (unsigned long long)cfg.seed, cfg.threads, cfg.threads > 1 ? "s" : "");
        if (world > 1 && dt_cli_is_ps(&cfg)) {
            char st[32] = "inf";
            if (cfg.staleness >= 0) snprintf(st, sizeof st, "%d", cfg.staleness);
            printf("dtrain: %d ranks over %s, strategy ps: %d server%s, %d workers x batch %d, staleness %s\n", world,
                   dt_comm_backend_name(comm), cfg.servers, cfg.servers > 1 ? "s" : "", world - cfg.servers,
                   cfg.batch, st);
        } else if (world > 1)
            printf("dtrain: %d ranks over %s, strategy %s, global batch %d%s\n", world, dt_comm_backend_name(comm),
                   cfg.strategy ? cfg.strategy : "ddp", cfg.batch * world,
                   cfg.balance ? " (cut among the ranks by measured speed)" : "");
        fflush(stdout);
    }
    s = dt_trainer_run(t);
    const bool trained = dt_trainer_step(t) > first_step;
    const int64_t last_step = dt_trainer_step(t);
    dt_trainer_free(t);
    dt_comm_destroy(comm);
    if (s == DT_EINTR) {
        if (rank == 0) printf("dtrain: %s\n", dt_last_error());
        return 0;
    }
    if (s != DT_OK) {
        if (world == 1) return dt_cli_fail(NULL, "%s", dt_last_error());
        dt_cli_fail(NULL, "rank %d: %s", rank, dt_last_error());
        /* stopped because another rank died or stalled: say so to the launcher */
        return s == DT_EPEER || s == DT_ETIMEDOUT ? DT_EXIT_PEER : 1;
    }
    if (pc.last.epoch > 0)
        printf("dtrain: done: test accuracy %.4f, test loss %.4f after %lld steps (%.1fs)\n", pc.last.test_acc,
               pc.last.test_loss, (long long)pc.last.global_step, pc.last.wall_s);
    if (!trained && rank == 0)
        printf("dtrain: nothing to train: already at step %lld, the end of --epochs %d%s\n", (long long)last_step,
               cfg.epochs, cfg.max_steps ? " or --max-steps" : "");
    else if (cfg.save && !quiet) printf("dtrain: checkpoint saved to %s\n", cfg.save);
    return 0;
}

static const char EVAL_USAGE[] =
    "Usage: dtrain eval --checkpoint FILE [--data DIR] [--batch N]\n\n"
    "Evaluates a checkpoint written by 'dtrain train --save' on the test split of a data set.";

int dt_cmd_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = "fashion-mnist";
    int batch = 256, threads = 1;
    const dt_flag flags[] = {
        {"checkpoint", DT_FLAG_STR, &ckpt, "FILE", "checkpoint to evaluate (required)"},
        {"data", DT_FLAG_STR, &data, "DIR", "IDX directory, fashion-mnist, mnist or a .csv"},
        {"batch", DT_FLAG_INT, &batch, "N", "evaluation batch size"},
        {"threads", DT_FLAG_INT, &threads, "N", "BLAS threads"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof *flags), EVAL_USAGE, NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    if (!ckpt) return dt_cli_fail("pass --checkpoint FILE (written by dtrain train --save)", "no --checkpoint given");
    if (batch < 1) return dt_cli_fail(NULL, "--batch %d: need at least 1", batch);
    if (threads < 1) return dt_cli_fail(NULL, "--threads %d: need at least 1", threads);
    dt_set_threads(threads);
    float loss, acc;
    int64_t n;
    const char *split = "test";
    dt_status s = dt_evaluate_checkpoint(ckpt, data, batch, &loss, &acc, &n, &split);
    if (s != DT_OK) return dt_cli_fail(NULL, "%s", dt_last_error());
    printf("eval: %lld samples, loss %.4f, accuracy %.4f%s\n", (long long)n, loss, acc,
           strcmp(split, "test") ? " (training split: the data set has no test split)" : "");
    return 0;
}
