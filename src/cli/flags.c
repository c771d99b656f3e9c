/* Table-driven flag parsing and usage text for every dtrain subcommand. */
#include "cli/cli.h"
#include "dtrain/core.h"
#include "run/checkpoint.h"
#include "run/launch.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

const char dt_cli_exit_help[] =
    "Exit status: 0 done; 1 failed at run time (I/O, memory, a diverged run); 2 wrong command line\n"
    "(unknown flag, bad value, flags that do not go together); 73 an output file or directory that\n"
    "cannot be written; 75 stopped because another rank failed or stalled; 78 a data set, checkpoint\n"
    "or model that cannot be used; 124 dtrain launch --timeout;\n"
    "128+N killed by signal N. With --workers or dtrain launch, the status of the rank that failed.";

static void vfail(const char *hint, const char *fmt, va_list ap) {
    char msg[8192], out[8192]; /* the library's terms (`grad_accum`) as flags (--grad-accum) */
    vsnprintf(msg, sizeof msg, fmt, ap);
    dt_cli_flag_terms(msg, out, sizeof out);
    fprintf(stderr, "dtrain: error: %s\n", out);
    if (hint) dt_cli_flag_terms(hint, out, sizeof out), fprintf(stderr, "HINT: %s\n", out);
}

int dt_cli_fail(const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(hint, fmt, ap);
    va_end(ap);
    return 1;
}

int dt_cli_usage(const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(hint, fmt, ap);
    va_end(ap);
    return DT_EXIT_USAGE;
}

int dt_cli_setup_status(int s) {
    switch (s) {
    case DT_OK: return 0;
    case DT_EINVAL: return DT_EXIT_USAGE;
    case DT_EPEER:
    case DT_ETIMEDOUT: return DT_EXIT_PEER;
    case DT_EFORMAT:
    case DT_ENOENT:
    case DT_EIO:
    case DT_EMISMATCH:
    case DT_ENOTSUP: return DT_EXIT_CONFIG;
    default: return 1;
    }
}

int dt_cli_checkpoint(const char *flag, const char *path, char *out, size_t cap) {
    bool from_dir;
    dt_status s = dt_checkpoint_resolve(path, out, cap, &from_dir);
    if (s != DT_OK) return dt_cli_fail(NULL, "--%s %s", flag, dt_last_error()), dt_cli_setup_status(s);
    if (from_dir) fprintf(stderr, "dtrain: --%s %s: its newest usable checkpoint, %s\n", flag, path, out);
    return 0;
}

bool dt_cli_checkpoint_data_here(const char *checkpoint, const char *data) {
    const char *file = !strncmp(data, "text:", 5)     ? data + 5
                       : !strncmp(data, "tokens:", 7) ? data + 7
                       : !strncmp(data, "npy:", 4)    ? data + 4
                                                      : data; /* npy: its first path */
    char first[4096];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(file, ","), file);
    file = first;
    struct stat st;
    if (*file != '/' || stat(file, &st) == 0) return true; /* a name (kjv, fashion-mnist), or there */
    fprintf(stderr,
            "dtrain: note: %s was trained on --data %s, which is not on this machine; pass --data to use "
            "another copy\n",
            checkpoint, data);
    return false;
}

void dt_cli_checkpoint_trained_on(const char *checkpoint, dt_cli_trained_on *t) {
    snprintf(t->data, sizeof t->data, "fashion-mnist");
    t->val_fraction = 0.1;
    dt_ckpt_info info; /* one read of the file; one that cannot be read is reported later */
    if (!checkpoint || dt_checkpoint_read_info(checkpoint, &info) != DT_OK) return (void)dt_error_clear();
    if (info.val_fraction > 0) t->val_fraction = info.val_fraction;
    if (info.data[0] && dt_cli_checkpoint_data_here(checkpoint, info.data))
        snprintf(t->data, sizeof t->data, "%s", info.data);
}

void (*dt_flags_usage_hook)(const char *usage, const dt_flag *flags, int n);

void dt_flag_default_text(const dt_flag *f, char *buf, size_t cap) {
    buf[0] = 0;
    if (strstr(f->help, "default")) return;
    switch (f->type) {
    case DT_FLAG_BOOL: break;
    case DT_FLAG_INT: snprintf(buf, cap, " (default %d)", *(int *)f->value); break;
    case DT_FLAG_I64: snprintf(buf, cap, " (default %lld)", (long long)*(int64_t *)f->value); break;
    case DT_FLAG_FLOAT: snprintf(buf, cap, " (default %g)", *(float *)f->value); break;
    case DT_FLAG_STR:
        if (*(const char **)f->value) snprintf(buf, cap, " (default %s)", *(const char **)f->value);
        break;
    }
}

void (*dt_flags_help_hook)(const dt_flag_help *help, const dt_flag *flags, int n);

/* Whether the space-separated list names holds name. */
static bool names_hold(const char *names, const char *name) {
    size_t len = strlen(name);
    for (const char *p = names; *p;) {
        while (*p == ' ') p++;
        size_t w = strcspn(p, " ");
        if (w == len && !strncmp(p, name, len)) return true;
        p += w;
    }
    return false;
}

static int group_count(const dt_flag_help *help) {
    int g = 0;
    while (help->groups && help->groups[g].title) g++;
    return g;
}

/* The group that collects the flags no group names: the one titled "Advanced", else one past the
 * given groups. */
static int advanced_group(const dt_flag_help *help) {
    int ng = group_count(help);
    for (int g = 0; g < ng; g++)
        if (!strcmp(help->groups[g].title, "Advanced")) return g;
    return ng;
}

const char *dt_flags_group_title(const dt_flag_help *help, int g) {
    if (!help->groups) return "Flags";
    return g < group_count(help) ? help->groups[g].title : "Advanced";
}

int dt_flags_help_order(const dt_flag_help *help, const dt_flag *flags, int n, int *order, int *group) {
    int ng = group_count(help), adv = advanced_group(help), m = 0;
    if (!help->groups) {
        for (int k = 0; k < n; k++) order[k] = k, group[k] = 0;
        return n ? 1 : 0;
    }
    for (int g = 0; g <= ng; g++) {
        const char *names = g < ng ? help->groups[g].names : "";
        for (const char *p = names; *p;) { /* the group's names, in its order */
            while (*p == ' ') p++;
            size_t w = strcspn(p, " ");
            for (int k = 0; k < n && w; k++) {
                if (strlen(flags[k].name) != w || strncmp(flags[k].name, p, w)) continue;
                bool placed = false; /* named by an earlier group (or twice in this one) */
                for (int i = 0; i < m; i++) placed |= order[i] == k;
                if (!placed) order[m] = k, group[m++] = g;
            }
            p += w;
        }
        if (g != adv) continue;
        for (int k = 0; k < n; k++) { /* then every flag that no group names */
            bool named = false;
            for (int h = 0; h < ng; h++) named |= names_hold(help->groups[h].names, flags[k].name);
            if (!named) order[m] = k, group[m++] = g;
        }
    }
    int shown = 0;
    for (int i = 0; i < m; i++) shown += i == 0 || group[i] != group[i - 1];
    return shown;
}

void dt_flags_usage(const char *usage, const dt_flag *flags, int n) {
    const dt_flag_help help = {.usage = usage};
    dt_flags_usage_help(&help, flags, n);
}

/* The width --help wraps its flag lines at on a terminal (COLUMNS, else the terminal's, at least
 * 60); 0 when stdout is no terminal: one line per flag, for scripts that read it. */
static int help_width(void) {
    if (!isatty(STDOUT_FILENO)) return 0;
    const char *c = getenv("COLUMNS");
    int w = c ? atoi(c) : 0;
    struct winsize ws;
    if (w <= 0 && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) w = ws.ws_col;
    return w <= 0 ? 80 : w < 60 ? 60 : w;
}

/* One flag's line: "  --name META" padded to column 27, then its help and default; wrapped at
 * width (0: not wrapped) between words, the continuation lines indented to that column. */
static void print_flag(const dt_flag *f, int width) {
    char left[64], text[8400], dflt[4200];
    snprintf(left, sizeof left, "--%s%s%s", f->name, f->meta ? " " : "", f->meta ? f->meta : "");
    dt_flag_default_text(f, dflt, sizeof dflt);
    snprintf(text, sizeof text, "%s%s", f->help, dflt);
    int col = printf("  %-24s ", left), x = col;
    if (!width) {
        printf("%s\n", text);
        return;
    }
    for (const char *p = text; *p;) {
        while (*p == ' ') p++;
        int w = (int)strcspn(p, " ");
        if (!w) break;
        if (x > col && x + 1 + w > width) x = printf("\n%*s", col, "") - 1;
        else if (x > col) x += printf(" ");
        x += printf("%.*s", w, p);
        p += w;
    }
    printf("\n");
}

void dt_flags_usage_help(const dt_flag_help *help, const dt_flag *flags, int n) {
    if (dt_flags_help_hook || dt_flags_usage_hook) {
        if (dt_flags_help_hook) dt_flags_help_hook(help, flags, n);
        else dt_flags_usage_hook(help->usage, flags, n);
        return;
    }
    int *order = calloc((size_t)n + 1, sizeof *order), *group = calloc((size_t)n + 1, sizeof *group);
    if (!order || !group) {
        free(order), free(group);
        dt_cli_fail(NULL, "out of memory");
        return;
    }
    dt_flags_help_order(help, flags, n, order, group);
    printf("%s\n", help->usage);
    const int width = help_width();
    for (int i = 0; i < n; i++) {
        if (i == 0 || group[i] != group[i - 1]) printf("\n%s:\n", dt_flags_group_title(help, group[i]));
        print_flag(&flags[order[i]], width);
    }
    free(order), free(group);
    if (n && help->groups) printf("\n");
    printf("  %-24s %s\n", "--help", "show this help");
    if (help->notes) printf("\n%s\n", help->notes);
    printf("\n%s\n", dt_cli_exit_help);
}

/* Why a value is not one of its flag's kind. */
typedef enum { V_OK, V_BAD, V_HIGH, V_LOW, V_NONFINITE } value_fault;

static value_fault set_value(const dt_flag *f, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case DT_FLAG_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes")) *(bool *)f->value = true;
        else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no")) *(bool *)f->value = false;
        else return V_BAD;
        return V_OK;
    case DT_FLAG_INT: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end) return V_BAD;
        if (errno == ERANGE || x < -2147483647LL || x > 2147483647LL) return *v == '-' ? V_LOW : V_HIGH;
        *(int *)f->value = (int)x;
        return V_OK;
    }
    case DT_FLAG_I64: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end) return V_BAD;
        if (errno == ERANGE) return *v == '-' ? V_LOW : V_HIGH;
        *(int64_t *)f->value = x;
        return V_OK;
    }
    case DT_FLAG_FLOAT: { /* nan and inf are no setting: "inf" where a flag means none is a string flag */
        float x = strtof(v, &end);
        if (end == v || *end) return V_BAD;
        if (!isfinite(x)) return V_NONFINITE;
        *(float *)f->value = x;
        return V_OK;
    }
    case DT_FLAG_STR: *(const char **)f->value = v; return V_OK;
    }
    return V_BAD;
}

static const char *type_word(dt_flag_type t) {
    switch (t) {
    case DT_FLAG_INT:
    case DT_FLAG_I64: return "an integer";
    case DT_FLAG_FLOAT: return "a number";
    case DT_FLAG_BOOL: return "true or false";
    default: return "a value";
    }
}

/* The HINT for a flag given a bad value or none: "--lr X: learning rate (default 0.001)". */
static void flag_hint(const dt_flag *f, char *hint, size_t cap) {
    char dflt[4200];
    dt_flag_default_text(f, dflt, sizeof dflt);
    snprintf(hint, cap, "--%s%s%s: %s%s", f->name, f->meta ? " " : "", f->meta ? f->meta : "", f->help, dflt);
}

/* Says that v is no value of flag f: what is wrong with it, and the flag's meaning and default. */
static void value_usage(const dt_flag *f, const char *v, value_fault why) {
    char hint[4400];
    flag_hint(f, hint, sizeof hint);
    const char *range = f->type == DT_FLAG_INT ? (why == V_HIGH ? "at most 2147483647" : "at least -2147483647")
                        : why == V_HIGH        ? "at most 9223372036854775807"
                                               : "at least -9223372036854775808";
    if (why == V_HIGH || why == V_LOW)
        dt_cli_usage(hint, "flag --%s: '%s' is too %s (%s)", f->name, v, why == V_HIGH ? "large" : "small", range);
    else if (why == V_NONFINITE) dt_cli_usage(hint, "flag --%s needs a finite number, got '%s'", f->name, v);
    else dt_cli_usage(hint, "flag --%s needs %s, got '%s'", f->name, type_word(f->type), v);
}

/* Edit distance of a[0..la) and b (insertions, deletions, substitutions, swaps of neighbours),
 * or 3 when it is more than 2: only near misses matter. */
static int near_distance(const char *a, size_t la, const char *b) {
    size_t lb = strlen(b);
    if (la > 64 || lb > 64 || (la > lb ? la - lb : lb - la) > 2) return 3;
    int d[65][65];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[la][lb] > 2 ? 3 : d[la][lb];
}

const char *dt_cli_suggest(const char *word, size_t len, const char *const *names, int n) {
    const char *prefix = NULL, *near = NULL;
    int nprefix = 0, best = 3, nbest = 0;
    for (int k = 0; k < n; k++) {
        if (len >= 3 && !strncmp(names[k], word, len)) prefix = names[k], nprefix++;
        int d = near_distance(word, len, names[k]);
        if (d < best) best = d, near = names[k], nbest = 1;
        else if (d == best) nbest++;
    }
    if (nprefix == 1) return prefix;
    return nbest == 1 && best <= (len <= 4 ? 1 : 2) ? near : NULL;
}

/* The flag an unknown --name most likely meant (dt_cli_suggest over the table's names). */
static const char *suggest_flag(const char *name, size_t len, const dt_flag *flags, int n) {
    const char **names = calloc((size_t)n + 1, sizeof *names);
    if (!names) return NULL;
    for (int k = 0; k < n; k++) names[k] = flags[k].name;
    const char *g = dt_cli_suggest(name, len, names, n);
    free(names);
    return g;
}

/* "-epochs" for "--epochs": a usage error that names the flag (true), or not a flag's name (false). */
static bool single_dash_flag(const char *a, const dt_flag *flags, int n) {
    if (a[0] != '-' || !((a[1] >= 'a' && a[1] <= 'z') || (a[1] >= 'A' && a[1] <= 'Z'))) return false;
    size_t len = strcspn(a + 1, "=");
    const char *g = suggest_flag(a + 1, len, flags, n);
    if (!g) return false;
    char hint[128];
    snprintf(hint, sizeof hint, "did you mean --%s? (flags take two dashes; run with --help to see them)", g);
    dt_cli_usage(hint, "unknown flag '%.*s'", (int)len + 1, a);
    return true;
}

int dt_flags_parse_help(int argc, char **argv, int first, const dt_flag *flags, int n, const dt_flag_help *help,
                        const char **pos, int max_pos, int *npos, int *rest) {
    if (npos) *npos = 0;
    if (rest) *rest = argc;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            if (rest) {
                *rest = i + 1;
                return 0;
            }
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            dt_flags_usage_help(help, flags, n);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (single_dash_flag(a, flags, n)) return -1;
            if (!pos || !npos || *npos >= max_pos) {
                dt_cli_usage("run with --help to see the accepted flags", "unexpected argument '%s'", a);
                return -1;
            }
            pos[(*npos)++] = a;
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const dt_flag *f = NULL;
        for (int k = 0; k < n; k++)
            if (strlen(flags[k].name) == len && !strncmp(flags[k].name, name, len)) f = &flags[k];
        if (!f) {
            const char *g = suggest_flag(name, len, flags, n);
            char hint[128];
            snprintf(hint, sizeof hint, "did you mean --%s? (run with --help to see the accepted flags)", g ? g : "");
            dt_cli_usage(g ? hint : "run with --help to see the accepted flags", "unknown flag '--%.*s'", (int)len,
                         name);
            return -1;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v && f->type == DT_FLAG_BOOL) {
            *(bool *)f->value = true;
            continue;
        }
        if (!v) {
            if (i + 1 >= argc) {
                char hint[4400];
                flag_hint(f, hint, sizeof hint);
                dt_cli_usage(hint, "flag --%s needs %s", f->name, type_word(f->type));
                return -1;
            }
            v = argv[++i];
        }
        value_fault why = set_value(f, v);
        if (why != V_OK) {
            value_usage(f, v, why);
            return -1;
        }
    }
    return 0;
}

int dt_flags_parse(int argc, char **argv, int first, const dt_flag *flags, int n, const char *usage, const char **pos,
                   int max_pos, int *npos, int *rest) {
    const dt_flag_help help = {.usage = usage};
    return dt_flags_parse_help(argc, argv, first, flags, n, &help, pos, max_pos, npos, rest);
}

bool dt_cli_flag_given(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (!strncmp(a, "--", 2) && !strncmp(a + 2, name, n) && (a[2 + n] == '\0' || a[2 + n] == '=')) return true;
    }
    return false;
}
