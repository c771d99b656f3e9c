/* dtrain train --help: the description printed first, the groups its flags are listed in, and
 * the notes after them (the flags' lines come from the flag table in cmd_train.c, the layers a
 * model spec may name from the op registry: dt_spec_help). dtrain man renders the same. */
#include "cli/train_usage.h"

#include "dtrain/nn.h"

#include <stdio.h>

const char dt_train_usage[] =
    "Usage: dtrain train [FLAGS]\n\n"
    "Trains a model on a data set: in one process, on N local workers (--workers N), or as one rank\n"
    "of a job started by 'dtrain launch' or mpirun/srun. Writes checkpoints, metrics and plots as it\n"
    "goes, and resumes bit for bit. The same seed and flags give the same weights.\n"
    "Example: dtrain train --data fashion-mnist --model mlp --epochs 2 --batch 32 --optimizer adam --lr 0.001";

/* A flag no group names (one added later) is listed under Advanced. Names the table lacks are
 * skipped: --eval-every, --eval-batches and --log-every belong with the outputs once built. */
const dt_flag_group dt_train_groups[] = {
    {"Data", "data val-split val-fraction epoch-windows normalize"},
    {"Model", "model weights precision"},
    {"Optimisation", "epochs max-steps batch grad-accum optimizer lr schedule warmup step-size gamma min-lr "
                     "momentum nesterov weight-decay beta1 beta2 eps clip seed early-stop"},
    {"Parallelism", "workers strategy zero tp pp microbatches pp-schedule pp-split servers staleness sync-every "
                    "balance ps-overlap compress allreduce bucket-mb backend mem-limit dry-run"},
    {"Outputs", "save save-weights keep-best metrics tensorboard eval-every eval-batches log-every timeline quiet"},
    {"Checkpoints and faults", "resume checkpoint-dir checkpoint-every checkpoint-secs keep elastic max-restarts timeout"},
    {"Advanced", "threads kernels device slow"},
    {NULL, NULL},
};

static const char notes_model[] =
    "Model specs are layers separated by spaces, e.g.\n"
    "  \"conv(32,3,pad=1) relu maxpool(2) flatten linear(128) relu linear(10)\"\n";

const char dt_train_notes[] =
    "No softmax layer: the loss (softmax cross-entropy) applies it; end with the last linear layer.\n"
    "presets: mlp (784-128-10, ReLU), cnn (the spec above with a second conv(64,3,pad=1) relu maxpool(2)),\n"
    "gpt[:L=,H=,C=,T=,V=] (a decoder-only transformer for text data).\n\n"
    "Data parallel: --workers N starts N local ranks (shared memory); 'mpirun -np N dtrain train ...'\n"
    "or 'dtrain launch -n N -- dtrain train ...' run the same job. --batch is per rank; each step\n"
    "averages gradients over the global batch of N*batch samples (--strategy ddp).\n\n"
    "Strategies: --strategy NAME or NAME(KEY=VALUE,...), one of\n"
    "  single                            one process (the default without ranks)\n"
    "  ddp(bucket_mb=MB)                 synchronous data parallel (the default with ranks; --bucket-mb)\n"
    "  ddp(zero=1|2|3)                   ZeRO: shard optimizer state, + gradients, + parameters (--zero)\n"
    "  localsgd(sync_every=H)            local steps, models averaged every H (--sync-every)\n"
    "  ps(servers=S,staleness=S|inf,shards=dynamic|fixed,overlap=0|1)\n"
    "                                    parameter server (--servers, --staleness, --balance, --ps-overlap)\n"
    "  tp(tp=K,pp=1,bucket_mb=MB,zero=N) Megatron tensor parallel GPT (--tp K): K ranks per model copy,\n"
    "                                    (or a sequential model's linear -> relu -> linear pairs, pp=1)\n"
    "                                    the other ranks data parallel; --workers N counts all ranks.\n"
    "                                    Mesh order, TP innermost: rank = (dp_i*PP + pp_i)*TP + tp_i\n"
    "  pp(stages=K,microbatches=M,schedule=gpipe|1f1b,split=N1:N2,tp=T)\n"
    "                                    pipeline parallel (--pp, --microbatches, --pp-schedule, --pp-split);\n"
    "                                    tp=T (--tp T --pp K): each stage a tensor-parallel group of T ranks\n"
    "                                    zero=1|2|3 (tp, pp, tp x pp): ZeRO over the mesh's dp axis (--zero)\n"
    "e.g. --strategy \"ps(servers=2,staleness=4)\". The flags in parentheses set the same options;\n"
    "a flag and a spec option that disagree are an error. ddp and localsgd also take compress=C\n"
    "(--compress) and ddp allreduce=auto|flat|hier (--allreduce) and update=auto|full|shard.\n"
    "How each strategy works and when to use it: docs/parallel.md; examples: man dtrain (EXAMPLES).";

const dt_flag_help *dt_train_help(void) {
    static char notes[sizeof notes_model + 2048 + sizeof dt_train_notes];
    static dt_flag_help help;
    if (!help.usage) {
        snprintf(notes, sizeof notes, "%s%s%s", notes_model, dt_spec_help(), dt_train_notes);
        help = (dt_flag_help){dt_train_usage, dt_train_groups, notes};
    }
    return &help;
}
