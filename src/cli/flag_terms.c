/* The library's terms in the CLI's words: library messages name a setting by its config field or
 * spec key in backticks (`grad_accum`, `strategy`); dtrain prints it as the flag that sets it
 * (--grad-accum, --strategy). The table of every such term lives here (docs/library.md, "Errors"). */
#include "cli/cli.h"
#include "dtrain/core.h"

#include <stdio.h>
#include <string.h>

/* Every term a library message may put in backticks; its flag is the term with '-' for '_',
 * unless RENAMED gives another. tests/layering.sh reads this list: a term used in a library
 * message and missing here fails it. */
static const char *const TERMS[] = {
    /* dtrain train: dt_train_config's fields, and the settings of the job around it */
    "data",
    "model",
    "epochs",
    "batch",
    "grad_accum",
    "epoch_windows",
    "val_fraction",
    "val_split",
    "optimizer",
    "lr",
    "momentum",
    "nesterov",
    "beta1",
    "beta2",
    "weight_decay",
    "eps",
    "clip_norm",
    "schedule",
    "warmup",
    "step_size",
    "gamma",
    "min_lr",
    "seed",
    "threads",
    "kernels",
    "precision",
    "device",
    "normalize",
    "max_steps",
    "save",
    "resume",
    "weights",
    "save_weights",
    "checkpoint_dir",
    "checkpoint_every",
    "checkpoint_secs",
    "keep",
    "keep_best",
    "early_stop",
    "metrics",
    "timeline",
    "tensorboard",
    "log_every",
    "eval_every",
    "eval_batches",
    "strategy",
    "balance",
    "slow",
    "mem_limit",
    "dry_run",
    "workers",
    "elastic",
    "max_restarts",
    "backend",
    "timeout",
    /* the options of strategy specs that dtrain train sets by their own flags */
    "compress",
    "bucket_mb",
    "zero",
    "tp",
    "pp",
    "pp_split",
    "pp_schedule",
    "microbatches",
    "servers",
    "sync_every",
    "ps_overlap",
    /* dtrain eval, predict, sample */
    "checkpoint",
    "optimizer_state",
    "prompt",
    /* federated learning: fl-server and fl-client */
    "listen",
    "server",
    "clients",
    "partition",
    "max_clients",
    "max_pending",
    "min_clients",
    "clients_per_round",
    "hello_timeout",
    "wait_timeout",
    "round_timeout",
    "connect_timeout",
    "secure_agg",
    "sa_range",
};

/* Terms whose flag is not the term with '-' for '_'. */
static const struct {
    const char *term, *flag;
} RENAMED[] = {
    {"clip_norm", "clip"},
};

/* The flag of term[0..len) into flag (cap bytes), or false when it is no term of the table. */
static bool term_flag(const char *term, size_t len, char *flag, size_t cap) {
    for (size_t k = 0; k < sizeof TERMS / sizeof *TERMS; k++) {
        if (strlen(TERMS[k]) != len || strncmp(TERMS[k], term, len)) continue;
        const char *name = TERMS[k];
        for (size_t r = 0; r < sizeof RENAMED / sizeof *RENAMED; r++)
            if (!strcmp(RENAMED[r].term, name)) name = RENAMED[r].flag;
        size_t i = 0;
        for (; name[i] && i + 1 < cap; i++) flag[i] = name[i] == '_' ? '-' : name[i];
        flag[i] = '\0';
        return true;
    }
    return false;
}

size_t dt_cli_flag_terms(const char *msg, char *out, size_t cap) {
    size_t n = 0;
    char flag[64];
    for (const char *p = msg; *p;) {
        size_t len = p[0] == '`' ? strspn(p + 1, "abcdefghijklmnopqrstuvwxyz0123456789_") : 0;
        const char *add = p;
        size_t alen = 1;
        char text[72];
        if (len && p[1 + len] == '`' && term_flag(p + 1, len, flag, sizeof flag)) {
            alen = (size_t)snprintf(text, sizeof text, "--%s", flag);
            add = text;
            p += len + 2;
        } else {
            p++;
        }
        for (size_t i = 0; i < alen; i++, n++)
            if (n + 1 < cap) out[n] = add[i];
    }
    if (cap) out[n < cap ? n : cap - 1] = '\0';
    return n;
}

const char *dt_cli_last_error(void) {
    static _Thread_local char buf[2048];
    dt_cli_flag_terms(dt_last_error(), buf, sizeof buf);
    return buf;
}

/* The library's log lines, in the CLI's words, to stderr. */
static void log_line(void *ctx, const char *line) {
    (void)ctx;
    char buf[4096];
    dt_cli_flag_terms(line, buf, sizeof buf);
    fprintf(stderr, "%s\n", buf);
}

void dt_cli_flag_terms_install(void) { dt_log_set_sink(log_line, NULL); }
