/* dtrain train --help: the description printed first, the groups its flags are listed in, and
 * the notes after them (the flags' lines come from the flag table in cmd_train.c; the layers a model
 * spec may name from the op registry: dt_spec_help). The strategies
 * and compressors of the notes, and the help of --strategy, --compress and --device, are made
 * from the registries (dt_registry_entry_at). dtrain man renders the same. */
#include "cli/train_usage.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <string.h>

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
    {"Checkpoints and faults",
     "resume checkpoint-dir checkpoint-every checkpoint-secs keep elastic max-restarts timeout"},
    {"Advanced", "threads kernels device slow"},
    {NULL, NULL},
};

/* The notes before the registries' lists: the model spec syntax, its layers (the op registry's:
 * dt_spec_help) and data parallelism. */
static const char NOTES_MODEL[] = "Model specs are layers separated by spaces, e.g.\n"
                                  "  \"conv(32,3,pad=1) relu maxpool(2) flatten linear(128) relu linear(10)\"\n";
static const char NOTES_HEAD[] =
    "No softmax layer: the loss (softmax cross-entropy) applies it; end with the last linear layer.\n"
    "presets: mlp (784-128-10, ReLU), cnn (the spec above with a second conv(64,3,pad=1) relu maxpool(2)),\n"
    "gpt[:L=,H=,C=,T=,V=] (a decoder-only transformer for text data).\n\n"
    "Data parallel: --workers N starts N local ranks (shared memory); 'mpirun -np N dtrain train ...'\n"
    "or 'dtrain launch -n N -- dtrain train ...' run the same job. --batch is per rank; each step\n"
    "averages gradients over the global batch of N*batch samples (--strategy ddp).\n\n";

/* The flags of `dtrain train` that set a strategy option (train_uneven.c, train_mesh.c and
 * train_pp.c add them to the spec): listed after each strategy's help. */
static const struct {
    const char *key, *flag;
} OPTION_FLAGS[] = {
    {"bucket_mb", "--bucket-mb"},
    {"compress", "--compress"},
    {"allreduce", "--allreduce"},
    {"zero", "--zero"},
    {"sync_every", "--sync-every"},
    {"servers", "--servers"},
    {"staleness", "--staleness"},
    {"shards", "--balance"},
    {"overlap", "--ps-overlap"},
    {"tp", "--tp"},
    {"stages", "--pp"},
    {"microbatches", "--microbatches"},
    {"schedule", "--pp-schedule"},
    {"split", "--pp-split"},
};

enum { WIDTH = 100, HELP_COL = 36 };

/* Text appended to a fixed buffer (what does not fit is cut). */
typedef struct {
    char *buf;
    size_t cap, len, col; /* col: the current line's length */
} text_out;

/* A space no line breaks at (NB below). */
#define NB '\x01'

static void put(text_out *t, const char *s, size_t n) {
    for (size_t i = 0; i < n && t->len + 1 < t->cap; i++) {
        t->buf[t->len++] = s[i] == NB ? ' ' : s[i];
        t->col = s[i] == '\n' ? 0 : t->col + 1;
    }
    t->buf[t->len] = 0;
}

static void puts_(text_out *t, const char *s) { put(t, s, strlen(s)); }

static void pad_to(text_out *t, size_t col) {
    while (t->col < col && t->len + 1 < t->cap) put(t, " ", 1);
}

/* Writes s from the current column, breaking lines before a piece that would pass WIDTH (pieces:
 * words; with at_commas, also the parts after each ','), continuing at column indent. */
static void wrapped(text_out *t, const char *s, size_t indent, bool at_commas) {
    while (*s) {
        size_t n = strcspn(s, at_commas ? " ," : " ");
        if (s[n] == ',') n++;
        if (t->col > indent && t->col + n > WIDTH) {
            put(t, "\n", 1);
            pad_to(t, indent);
        }
        put(t, s, n);
        s += n;
        if (*s == ' ') {
            while (*s == ' ') s++;
            if (*s && t->col + 1 + strcspn(s, at_commas ? " ," : " ") <= WIDTH) put(t, " ", 1);
            else if (*s) put(t, "\n", 1), pad_to(t, indent);
        }
    }
}

/* One entry: "  SYNTAX" and its help at HELP_COL (on the next line when the syntax reaches it).
 * No line of the help starts with a flag: the space before "--" does not break. */
static void entry_row(text_out *t, const char *syntax, const char *text) {
    char help[2048];
    size_t k = 0;
    for (const char *p = text; *p && k + 1 < sizeof help; p++)
        help[k++] = *p == ' ' && p[1] == '-' && p[2] == '-' ? NB : *p;
    help[k] = 0;
    pad_to(t, 2);
    const size_t start = t->len;
    wrapped(t, syntax, 4, true);
    if (t->col + 1 > HELP_COL || memchr(t->buf + start, '\n', t->len - start)) put(t, "\n", 1);
    pad_to(t, HELP_COL);
    wrapped(t, help, HELP_COL, false);
    put(t, "\n", 1);
}

/* The flags that set the keys of a strategy's options ("bucket_mb=MB,zero=0|1|2|3"):
 * " (--bucket-mb, --zero)", or "" when none. */
static void option_flags(const char *options, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (const char *o = options; *o; o += strcspn(o, ","), o += *o == ',') {
        const size_t len = strcspn(o, "=,");
        for (size_t f = 0; f < sizeof OPTION_FLAGS / sizeof *OPTION_FLAGS && k < cap; f++)
            if (strlen(OPTION_FLAGS[f].key) == len && !strncmp(o, OPTION_FLAGS[f].key, len))
                k += (size_t)snprintf(out + k, cap - k, "%s%s", k ? ", " : " (", OPTION_FLAGS[f].flag);
    }
    if (k && k < cap) snprintf(out + k, cap - k, ")");
}

/* "Strategies: ..." with each strategy of the registry, its syntax, help and flags. */
static void strategies(text_out *t) {
    puts_(t, "Strategies: --strategy NAME or NAME(KEY=VALUE,...), one of\n");
    dt_registry_entry e;
    for (int i = 0; dt_registry_entry_at(DT_REGISTRY_STRATEGY, i, &e); i++) {
        char syntax[512], help[2048], flags[256];
        snprintf(syntax, sizeof syntax, e.options[0] ? "%s(%s)" : "%s%s", e.name, e.options);
        option_flags(e.options, flags, sizeof flags);
        snprintf(help, sizeof help, "%s%s", e.help, flags);
        entry_row(t, syntax, help);
    }
    puts_(t, "e.g. --strategy \"ps(servers=2,staleness=4)\". The flags in parentheses set the same options;\n"
             "a flag and a spec option that disagree are an error.\n\n");
}

/* "Compressors: ..." with each compressor of the registry. */
static void compressors(text_out *t) {
    char who[128];
    puts_(t, "Compressors: --compress NAME[:OPTIONS] (compress=C of ");
    puts_(t, dt_strategy_takers("compress", "and", who, sizeof who));
    puts_(t, "), one of\n");
    dt_registry_entry e;
    for (int i = 0; dt_registry_entry_at(DT_REGISTRY_COMPRESSOR, i, &e); i++) {
        char syntax[512];
        snprintf(syntax, sizeof syntax, e.options[0] ? "%s:%s" : "%s%s", e.name, e.options);
        entry_row(t, syntax, e.help);
    }
    puts_(t, "\n");
}

const char *dt_train_notes(void) {
    static char buf[16384];
    if (buf[0]) return buf;
    text_out t = {buf, sizeof buf, 0, 0};
    puts_(&t, NOTES_MODEL);
    puts_(&t, dt_spec_help());
    puts_(&t, NOTES_HEAD);
    strategies(&t);
    compressors(&t);
    puts_(&t, "How each strategy works and when to use it: docs/parallel.md; examples: man dtrain (EXAMPLES).");
    return buf;
}

/* "a, b or c" of a registry's names, each followed by ":OPTIONS" when with_options is set,
 * into out. */
static const char *names_of(dt_registry r, bool with_options, char *out, size_t cap) {
    dt_registry_entry e;
    int n = 0;
    while (dt_registry_entry_at(r, n, &e)) n++;
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < n && dt_registry_entry_at(r, i, &e) && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%s%s%s",
                              i == 0       ? ""
                              : i == n - 1 ? " or "
                                           : ", ",
                              e.name, with_options && e.options[0] ? ":" : "", with_options ? e.options : "");
    return out;
}

const char *dt_train_strategy_help(void) {
    static char buf[512];
    char names[256];
    snprintf(buf, sizeof buf,
             "distribution strategy: NAME or NAME(KEY=VALUE,...), one of %s (Strategies, below; "
             "default %s with more than one rank), e.g. ps(servers=2,staleness=4)",
             names_of(DT_REGISTRY_STRATEGY, false, names, sizeof names), dt_strategy_spec_default(2));
    return buf;
}

const char *dt_train_compress_help(void) {
    static char buf[512];
    char names[384], who[128];
    snprintf(buf, sizeof buf, "how %s send gradients: %s (Compressors, below)",
             dt_strategy_takers("compress", "and", who, sizeof who),
             names_of(DT_REGISTRY_COMPRESSOR, true, names, sizeof names));
    return buf;
}

/* "LEAD: cpu: HELP; checked[:arena=BYTES]: HELP; ... (default cpu; TAIL)" into buf. */
static const char *device_help(char *buf, size_t cap, const char *lead, const char *tail) {
    size_t k = (size_t)snprintf(buf, cap, "%s:", lead);
    dt_registry_entry e;
    for (int i = 0; dt_registry_entry_at(DT_REGISTRY_DEVICE, i, &e) && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s %s%s%s%s: %s", i ? ";" : "", e.name, e.options[0] ? "[:" : "",
                              e.options, e.options[0] ? "]" : "", e.help);
    if (k < cap)
        snprintf(buf + k, cap - k, " (default %s; %s)",
                 dt_registry_entry_at(DT_REGISTRY_DEVICE, 0, &e) ? e.name : "cpu", tail);
    return buf;
}

const char *dt_train_device_help(void) {
    static char buf[1024];
    return device_help(buf, sizeof buf, "where model memory lives and kernels run",
                       "the strategies that run there and the options they refuse: docs/device.md");
}

const char *dt_cli_device_help(void) {
    static char buf[1024];
    return device_help(buf, sizeof buf, "where the model runs", "docs/device.md");
}

const dt_flag_help *dt_train_help(void) {
    static dt_flag_help h;
    h = (dt_flag_help){dt_train_usage, dt_train_groups, dt_train_notes()};
    return &h;
}
