/* dtrain man: the manual page dtrain(1) in troff (man(7) macros), made from the very tables that
 * --help prints: every command's flag table in its groups (through dt_flags_help_hook), the command
 * lists of dtrain and dtrain bench, the environment of dtrain --help and the exit statuses; then
 * EXAMPLES. `make` writes
 * it to build/dtrain.1 and `make install` installs it; tests/man.sh checks it against --help. */
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "run/launch.h"
#include "run/writable.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static FILE *g_out;

/* Text escaped for troff: backslashes, '-' as \-, a line start of '.' or '\'' guarded. */
static void put_text(const char *s, bool line_start) {
    for (; *s; s++) {
        if (line_start && (*s == '.' || *s == '\'')) fputs("\\&", g_out);
        line_start = *s == '\n';
        if (*s == '\\') fputs("\\e", g_out);
        else if (*s == '-') fputs("\\-", g_out);
        else fputc(*s, g_out);
    }
}

/* One flag's tagged paragraph: name, metavar, help and default, as --help prints them. */
static void man_flag(const dt_flag *f) {
    char dflt[4200];
    dt_flag_default_text(f, dflt, sizeof dflt);
    fputs(".TP\n\\fB", g_out);
    put_text("--", false);
    put_text(f->name, false);
    fputs("\\fR", g_out);
    if (f->meta) {
        fputs(" \\fI", g_out);
        put_text(f->meta, false);
        fputs("\\fR", g_out);
    }
    fputc('\n', g_out);
    put_text(f->help, true);
    put_text(dflt, false);
    fputc('\n', g_out);
}

/* Text as it is, in a no-fill block. */
static void man_block(const char *text) {
    fputs(".nf\n", g_out);
    put_text(text, true);
    fputs("\n.fi\n", g_out);
}

/* One command's help: its usage text, the flags under their group titles (in --help's order,
 * dt_flags_help_order), then its notes. */
static void man_help(const dt_flag_help *help, const dt_flag *flags, int n) {
    int *order = calloc((size_t)n + 1, sizeof *order), *group = calloc((size_t)n + 1, sizeof *group);
    if (!order || !group) {
        free(order), free(group);
        return;
    }
    man_block(help->usage);
    int ng = dt_flags_help_order(help, flags, n, order, group);
    for (int i = 0; i < n; i++) {
        if (ng > 1 && (i == 0 || group[i] != group[i - 1])) {
            fputs(".PP\n\\fB", g_out);
            put_text(dt_flags_group_title(help, group[i]), false);
            fputs(":\\fR\n", g_out);
        }
        man_flag(&flags[order[i]]);
    }
    free(order), free(group);
    if (help->notes) {
        fputs(".PP\n", g_out);
        man_block(help->notes);
    }
}

/* The section of one command: its --help rendered through the hook. */
static void man_command(const char *title, const dt_command *c) {
    fputs(".SS \"", g_out);
    put_text(title, false);
    fputs("\"\n", g_out);
    char *argv[] = {(char *)c->name, "--help", NULL};
    fflush(stdout);
    c->run(2, argv);
}

/* The text dtrain --help prints after "Environment:" up to the exit statuses. */
static void man_environment(void) {
    FILE *tmp = tmpfile();
    if (!tmp) return;
    fflush(stdout);
    int saved = dup(1);
    dup2(fileno(tmp), 1);
    dt_cli_main_usage();
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    char buf[16384];
    rewind(tmp);
    size_t n = fread(buf, 1, sizeof buf - 1, tmp);
    buf[n] = 0;
    fclose(tmp);
    char *env = strstr(buf, "Environment:\n"), *end = env ? strstr(env, dt_cli_exit_help) : NULL;
    if (!env || !end) return;
    *end = 0;
    fputs(".SH ENVIRONMENT\n.nf\n", g_out);
    put_text(env + strlen("Environment:\n"), true);
    fputs(".fi\n", g_out);
}

/* EXAMPLES: what a user runs first, each a sentence and its commands (tests/man.sh checks that
 * every flag they give is one the command takes). */
static const struct {
    const char *what, *cmds;
} g_examples[] = {
    {"Train the reference MLP on Fashion-MNIST, keeping a checkpoint and one JSON line of metrics per epoch; "
     "then evaluate the checkpoint and continue the run for two more epochs (bit for bit as if it had not stopped):",
     "dtrain train --data fashion-mnist --model mlp --epochs 2 --save mlp.safetensors --metrics mlp.jsonl\n"
     "dtrain eval --checkpoint mlp.safetensors\n"
     "dtrain train --resume mlp.safetensors --epochs 4 --save mlp.safetensors"},
    {"Draw its loss and accuracy curves, write its predictions, export it to ONNX:",
     "dtrain plot mlp.jsonl -o mlp.png\n"
     "dtrain predict --checkpoint mlp.safetensors -o preds.csv\n"
     "dtrain export --checkpoint mlp.safetensors -o mlp.onnx"},
    {"Hold out 10% of the training set, stop after 3 epochs without progress, keep the best epoch:",
     "dtrain train --model cnn --epochs 20 --val-split 0.1 --early-stop 3 --keep-best --save cnn.safetensors"},
    {"The same job on 4 local worker processes, and as 8 MPI ranks on the hosts of a hostfile:",
     "dtrain train --workers 4 --model cnn --batch 32\n"
     "mpirun -np 8 --hostfile hosts dtrain train --model cnn --batch 32"},
    {"Survive dead workers: checkpoint every 200 steps, restart from the newest checkpoint with 2 to 4 workers:",
     "dtrain train --workers 4 --elastic 2:4 --checkpoint-dir ck --checkpoint-every 200 --keep 3"},
    {"A byte-level GPT on the King James Bible, then text from it:",
     "dtrain train --data kjv --model gpt:L=4,H=4,C=128,T=64 --batch 12 --optimizer adamw --max-steps 2000 "
     "--save kjv.safetensors\n"
     "dtrain sample --checkpoint kjv.safetensors --prompt \"And God said\" --tokens 200 --temperature 0.8"},
    {"The GPT split over 2 ranks by tensor parallelism (2 copies on 4 workers); the memory each rank would "
     "hold under ZeRO stage 3, without training:",
     "dtrain train --data kjv --model gpt --batch 8 --tp 2 --workers 4\n"
     "dtrain train --data kjv --model gpt --workers 4 --zero 3 --dry-run"},
    {"Fine-tune the weights of a PyTorch state_dict saved with safetensors:",
     "dtrain train --weights model.safetensors --model mlp --epochs 1 --lr 1e-4 --save tuned.safetensors"},
};

static void man_examples(void) {
    fputs(".SH EXAMPLES\n", g_out);
    for (size_t i = 0; i < sizeof g_examples / sizeof *g_examples; i++) {
        fputs(".PP\n", g_out);
        put_text(g_examples[i].what, true);
        fputs("\n.RS\n", g_out);
        man_block(g_examples[i].cmds);
        fputs(".RE\n", g_out);
    }
}

static void man_page(void) {
    fprintf(g_out, ".TH DTRAIN 1 \"\" \"dtrain %s\" \"User Commands\"\n", DTRAIN_VERSION);
    fputs(".SH NAME\ndtrain \\- distributed deep\\-learning training in C\n"
          ".SH SYNOPSIS\n.B dtrain\n.I COMMAND\n[\\fIFLAGS\\fR]\n.br\n.B dtrain\n.I COMMAND\n.B \\-\\-help\n"
          ".SH DESCRIPTION\n",
          g_out);
    put_text("dtrain trains neural networks in one process, on N local worker processes (--workers N) or as "
             "the ranks of an MPI job (mpirun, srun). It is the command of libdtrain, a C11 library with the same "
             "capabilities (pkg-config dtrain). Each command's flags follow; every flag takes --NAME VALUE or "
             "--NAME=VALUE.\n",
             true);
    fputs(".SH COMMANDS\n", g_out);
    for (const dt_command *c = dt_cli_commands(); c->name; c++) {
        fputs(".TP\n.B ", g_out);
        put_text(c->name, false);
        fputc('\n', g_out);
        put_text(c->summary, true);
        fputc('\n', g_out);
    }
    fputs(".SH OPTIONS\n", g_out);
    void (*old)(const dt_flag_help *, const dt_flag *, int) = dt_flags_help_hook;
    dt_flags_help_hook = man_help;
    char title[128];
    for (const dt_command *c = dt_cli_commands(); c->name; c++) {
        if (!strcmp(c->name, "bench")) {
            for (const dt_command *b = dt_bench_commands(); b->name; b++) {
                snprintf(title, sizeof title, "dtrain bench %s", b->name);
                man_command(title, b);
            }
            continue;
        }
        snprintf(title, sizeof title, "dtrain %s", c->name);
        man_command(title, c);
    }
    dt_flags_help_hook = old;
    man_environment();
    fputs(".SH EXIT STATUS\n", g_out);
    put_text(dt_cli_exit_help, true);
    fputc('\n', g_out);
    man_examples();
    fputs(".SH SEE ALSO\n.BR mpirun (1),\n.BR gnuplot (1),\n.BR pkg-config (1);\n", g_out);
    put_text("README.md and docs/ in the source tree.\n", true);
}

static const char MAN_USAGE[] =
    "Usage: dtrain man [-o FILE] | dtrain man --flags COMMAND\n\n"
    "Writes the manual page dtrain(1) (troff) to stdout or FILE, from the flag tables of every\n"
    "command's --help. Read it with: dtrain man | man -l -\n"
    "--flags COMMAND prints that command's flag table as JSON instead (what bindings are made from).";

int dt_cmd_man(int argc, char **argv) {
    const char *out = NULL, *json = NULL;
    const dt_flag flags[] = {
        {"output", DT_FLAG_STR, &out, "FILE", "write the page to FILE (also -o FILE)"},
        {"flags", DT_FLAG_STR, &json, "COMMAND", "print COMMAND's flags as JSON (train, bench ddp, ...)"}};
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) return dt_cli_fail(NULL, "out of memory");
    for (int i = 0; i < argc; i++) args[i] = strcmp(argv[i], "-o") ? argv[i] : "--output";
    int r = dt_flags_parse(argc, args, 1, flags, 2, MAN_USAGE, NULL, 0, NULL, NULL);
    free(args);
    if (r) return r < 0 ? DT_EXIT_USAGE : 0;
    if (json && out) return dt_cli_usage("leave out -o", "--flags prints to stdout");
    if (json) return dt_cli_flags_json(json);
    char tmp[4200], dest[4096]; /* dest: -o, or the file a symbolic link -o names leads to */
    g_out = stdout;
    if (out) {
        if (dt_output_path("-o", out, dest, sizeof dest) != DT_OK) return dt_cli_usage(NULL, "%s", dt_last_error());
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", dest, (int)getpid());
        if (!(g_out = fopen(tmp, "w"))) return dt_cli_fail(NULL, "-o %s: %s", out, strerror(errno));
    }
    man_page();
    if (!out) return fflush(stdout) == 0 ? 0 : 1;
    bool ok = fflush(g_out) == 0 && !ferror(g_out);
    ok = fclose(g_out) == 0 && ok;
    if (!ok || rename(tmp, dest) != 0) {
        unlink(tmp);
        return dt_cli_fail("check the disk (free space, permissions)", "-o %s: cannot write it: %s", out,
                           strerror(errno));
    }
    return 0;
}
