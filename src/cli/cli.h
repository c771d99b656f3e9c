/* The dtrain command: subcommand entry points and the table-driven flag parser they share. */
#ifndef DT_CLI_H
#define DT_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { DT_FLAG_BOOL, DT_FLAG_INT, DT_FLAG_I64, DT_FLAG_FLOAT, DT_FLAG_STR } dt_flag_type;

/* One command-line flag: "--name VALUE" (or "--name" alone for bools, "--name=VALUE" too). */
typedef struct {
    const char *name; /* without dashes, e.g. "epochs" */
    dt_flag_type type;
    void *value;      /* bool*, int*, int64_t*, float*, const char** */
    const char *meta; /* placeholder in help, e.g. "N" */
    const char *help; /* one line */
} dt_flag;

/* Parses argv[first..argc) against flags[0..n). Positional arguments are stored in order into
 * pos[0..max_pos) and counted in *npos (pos may be NULL when none are allowed); "--" stops flag
 * parsing and, if rest is non-NULL, *rest gets the index of the first argument after it.
 * On a bad flag or value it prints an error with a hint and returns -1; "--help"/"-h" prints
 * the usage built from `usage` and the table and returns 1; otherwise 0. */
int dt_flags_parse(int argc, char **argv, int first, const dt_flag *flags, int n, const char *usage, const char **pos,
                   int max_pos, int *npos, int *rest);
/* True when argv[1..argc) has --NAME or --NAME=VALUE (before any "--"). */
bool dt_cli_flag_given(int argc, char **argv, const char *name);
/* Prints the usage text and one line per flag with its default. */
void dt_flags_usage(const char *usage, const dt_flag *flags, int n);

/* A titled group of flags in --help and the man page. names: flag names without dashes, separated
 * by spaces, listed in that order; a name the table lacks is skipped (a flag not built in). */
typedef struct {
    const char *title;
    const char *names;
} dt_flag_group;
/* A command's help around its flag table. usage: the usage line and a short description (printed
 * first); groups: NULL-title-terminated, or NULL for one "Flags:" list; a flag that no group names
 * is listed under the group titled "Advanced" (one is added last where none is given), so a flag
 * added to a table without a group still shows; notes: text after the flags (may be NULL). */
typedef struct {
    const char *usage;
    const dt_flag_group *groups;
    const char *notes;
} dt_flag_help;
/* dt_flags_parse with a grouped --help. */
int dt_flags_parse_help(int argc, char **argv, int first, const dt_flag *flags, int n, const dt_flag_help *help,
                        const char **pos, int max_pos, int *npos, int *rest);
/* Prints the grouped help: usage, each group's flags, "--help", notes, the exit statuses. */
void dt_flags_usage_help(const dt_flag_help *help, const dt_flag *flags, int n);
/* The order --help lists the flags in: order[i] is the table index of the i-th flag listed and
 * group[i] its group (an index into help->groups; the number of groups for an added "Advanced").
 * Both arrays hold n; every flag is listed exactly once. Returns the number of groups shown. */
int dt_flags_help_order(const dt_flag_help *help, const dt_flag *flags, int n, int *order, int *group);
/* The title of group g of dt_flags_help_order ("Advanced" past the given groups, "Flags" without). */
const char *dt_flags_group_title(const dt_flag_help *help, int g);
/* When set, dt_flags_usage_help (and so dt_flags_usage) calls it instead of printing (dtrain man);
 * it takes precedence over dt_flags_usage_hook. */
extern void (*dt_flags_help_hook)(const dt_flag_help *help, const dt_flag *flags, int n);
/* The name among names[0..n) that word[0..len) most likely means: the only one it is a prefix of
 * (3+ letters), else the only nearest within 2 edits (1 for words of up to 4 letters); NULL if none. */
const char *dt_cli_suggest(const char *word, size_t len, const char *const *names, int n);
/* Library messages name settings by their config field or spec key in backticks (`grad_accum`);
 * this writes msg into out (cap bytes, cut to fit) with each term of cli/flag_terms.c's table
 * replaced by its flag (--grad-accum). Returns the length the whole text takes. */
size_t dt_cli_flag_terms(const char *msg, char *out, size_t cap);
/* dt_last_error() in the CLI's words (dt_cli_flag_terms); valid until the next call on this thread. */
const char *dt_cli_last_error(void);
/* Sends the library's log lines through dt_cli_flag_terms to stderr (dt_log_set_sink). */
void dt_cli_flag_terms_install(void);
/* Prints "dtrain: error: MESSAGE" and, when hint is non-NULL, "HINT: hint" to stderr, the
 * library's terms in it as flags (dt_cli_flag_terms); returns 1
 * (a failure at run time). */
int dt_cli_fail(const char *hint, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for a wrong command line; returns DT_EXIT_USAGE (2). */
int dt_cli_usage(const char *hint, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The exit status for a library call's failure s during set-up: DT_EINVAL (a bad flag value or
 * combination) -> 2, DT_EPEER/DT_ETIMEDOUT -> 75, a file, data set, checkpoint or model that
 * cannot be used (DT_EFORMAT, DT_ENOENT, DT_EIO, DT_EMISMATCH, DT_ENOTSUP) -> 78, else 1. */
int dt_cli_setup_status(int s);
/* The checkpoint file of --FLAG path (a file, or the newest usable one of a directory of numbered
 * checkpoints, named on stderr) into out; 0, or the exit status after printing why (78: none). */
int dt_cli_checkpoint(const char *flag, const char *path, char *out, size_t cap);
/* What a checkpoint's run trained on, the defaults of eval and predict: its --data (dtrain.data;
 * "fashion-mnist" without a checkpoint, where it stores none, or where it is not on this machine)
 * and, for text, the fraction it held out at the end (its --val-fraction; 0.1 where it stores
 * none or held out nothing). */
typedef struct {
    char data[1024];
    double val_fraction;
} dt_cli_trained_on;
void dt_cli_checkpoint_trained_on(const char *checkpoint, dt_cli_trained_on *t);
/* Whether the --data a checkpoint stores (an absolute path, or a name) is on this machine; false
 * after a note on stderr that says to pass --data. */
bool dt_cli_checkpoint_data_here(const char *checkpoint, const char *data);
/* When set, dt_flags_usage calls it instead of printing the help text (dtrain man renders the
 * same tables as a man page). */
extern void (*dt_flags_usage_hook)(const char *usage, const dt_flag *flags, int n);
/* The " (default X)" that --help prints after a flag's help ("" when it prints none) into buf. */
void dt_flag_default_text(const dt_flag *f, char *buf, size_t cap);
/* dtrain man --flags COMMAND: prints COMMAND's flag table ("train", "bench ddp") as JSON to stdout
 * (flags_json.c); returns the exit status. */
int dt_cli_flags_json(const char *command);
/* The exit statuses, one line each, for the --help texts. */
extern const char dt_cli_exit_help[];

/* Subcommands: each returns the process exit status. argv[0] is the subcommand name. */
typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} dt_command;

/* The subcommands of dtrain and of dtrain bench (NULL-terminated), and the text of dtrain --help. */
const dt_command *dt_cli_commands(void);
const dt_command *dt_bench_commands(void);
void dt_cli_main_usage(void);

#endif
