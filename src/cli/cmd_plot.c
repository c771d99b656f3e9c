/* dtrain plot: draws the curves of one or several runs from their --metrics JSON-Lines files
 * (loss of train, test and validation, their accuracy, throughput and the learning rate, per
 * epoch and, for a run with --log-every / --eval-every, per logged step and evaluation) into a
 * PNG or SVG through gnuplot (Debian gnuplot-nox), and prints the table it plotted. The image is
 * written to a temporary file beside the output and renamed, so a failed plot leaves no
 * half-written file. */
#include "cli/cli.h"
#include "cli/train_outputs.h"
#include "run/launch.h"
#include "run/writable.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RUNS 16
#define GNUPLOT_TIMEOUT_S 120
enum { C_EPOCH, C_STEP, C_TRAIN, C_TEST, C_ACC, C_SPS, C_LR, C_VLOSS, C_VACC, C_ESTEPS, C_SPE, NCOLS };
static const char *const g_cols[NCOLS] = {"epoch",          "step", "train_loss", "test_loss", "test_acc",
                                          "samples_per_s",  "lr",   "val_loss",   "val_acc",   "epoch_steps",
                                          "steps_per_epoch"};
/* A record's kind ("kind": an epoch's has none; "step": --log-every; "eval": --eval-every). */
enum { K_EPOCH, K_STEP, K_EVAL };

typedef struct {
    const char *path;
    char name[128]; /* the file's base name without .jsonl */
    int n, cap;
    double (*rows)[NCOLS];
    int *kinds;     /* [cap] */
    bool has_steps; /* --log-every records: the train curves are theirs, not the epochs' means */
} plot_run;

static const char PLOT_USAGE[] =
    "Usage: dtrain plot METRICS.jsonl... -o curves.png|curves.svg [--title T] [--x epoch|step]\n\n"
    "Draws train, test and validation (--val-split) loss and accuracy, throughput (samples/s) and\n"
    "the learning rate of one or several runs from their 'dtrain train --metrics FILE' records,\n"
    "through gnuplot (apt-get install gnuplot-nox), and prints the table it plotted: per epoch, and\n"
    "for a run with --log-every / --eval-every per logged step and evaluation (the x axis is then\n"
    "the step unless --x epoch). Each file is one run, named by its file name.";

/* A record's number (null -> NaN: no test set); DT_EFORMAT naming file and line if not a number. */
static int field(const cJSON *o, int col, const char *path, int line, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, g_cols[col]);
    if (cJSON_IsNumber(v)) *out = v->valuedouble;
    else if ((!v || cJSON_IsNull(v)) && col != C_EPOCH && col != C_STEP) *out = NAN;
    else {
        dt_cli_fail("plot the files 'dtrain train --metrics FILE' writes",
                    "%s:%d: not a dtrain metrics record ('%s' is %s)", path, line, g_cols[col],
                    v ? "not a number" : "missing");
        return -1;
    }
    return 0;
}

/* Reads a metrics file into r; exit status on failure (78: it cannot be used), else 0. */
static int read_run(plot_run *r, const char *path) {
    r->path = path;
    const char *base = strrchr(path, '/');
    snprintf(r->name, sizeof r->name, "%s", base ? base + 1 : path);
    char *dot = strstr(r->name, ".jsonl");
    if (dot && dot != r->name) *dot = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        dt_cli_fail("give the file 'dtrain train --metrics FILE' wrote", "%s: %s", path, strerror(errno));
        return DT_EXIT_CONFIG;
    }
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, rc = 0;
    while (rc == 0 && getline(&line, &cap, f) > 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        cJSON *o = cJSON_Parse(line);
        if (cJSON_IsObject(o) && r->n == r->cap) {
            int cap = r->cap ? 2 * r->cap : 16;
            double(*rows)[NCOLS] = realloc(r->rows, sizeof *rows * (size_t)cap);
            if (rows) r->rows = rows;
            int *kinds = rows ? realloc(r->kinds, sizeof *kinds * (size_t)cap) : NULL;
            if (kinds) r->kinds = kinds, r->cap = cap;
        }
        if (!cJSON_IsObject(o)) {
            dt_cli_fail("each line must be one JSON object (dtrain train --metrics)", "%s:%d: not a JSON object", path,
                        lineno);
            rc = DT_EXIT_CONFIG;
        } else if (r->n == r->cap) {
            rc = dt_cli_fail(NULL, "out of memory reading %s", path);
        } else {
            for (int c = 0; c < NCOLS && rc == 0; c++)
                if (field(o, c, path, lineno, &r->rows[r->n][c])) rc = DT_EXIT_CONFIG;
            const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "kind"));
            r->kinds[r->n] = !kind ? K_EPOCH : !strcmp(kind, "step") ? K_STEP : !strcmp(kind, "eval") ? K_EVAL : -1;
            r->has_steps |= r->kinds[r->n] == K_STEP;
            if (rc == 0 && r->kinds[r->n] >= 0) r->n++; /* a kind of record this plot does not know: left out */
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    if (rc == 0 && r->n == 0) {
        dt_cli_fail("a run writes one record per finished epoch", "%s: no metrics records", path);
        rc = DT_EXIT_CONFIG;
    }
    return rc;
}

/* True when an executable `prog` is on PATH. */
static bool on_path(const char *prog) {
    const char *path = getenv("PATH");
    char dir[4096];
    for (const char *p = path ? path : ""; *p;) {
        size_t len = strcspn(p, ":");
        snprintf(dir, sizeof dir, "%.*s/%s", (int)len, p, prog);
        if (len && access(dir, X_OK) == 0) return true;
        p += len + (p[len] == ':');
    }
    return false;
}

/* Writes s into a gnuplot single-quoted string (a quote doubles). */
static void put_quoted(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        if (*s != '\n') fputc(*s, f);
    }
    fputc('\'', f);
}

/* A curve of a panel: a column, the label after the run's name, the dash type. */
typedef struct {
    int col;
    const char *label;
    int dash;
} curve;

/* One panel: curves[0..nc) of every run against x, a colour per run. */
static void write_panel(FILE *f, const plot_run *runs, int nr, const char *dir, int xcol, const curve *curves, int nc,
                        const char *title, const char *ylabel) {
    fprintf(f, "set title '%s'\nset ylabel '%s'\nplot ", title, ylabel);
    for (int i = 0; i < nr; i++)
        for (int k = 0; k < nc; k++) {
            char data[4200], label[300];
            snprintf(data, sizeof data, "%s/run%d.dat", dir, i);
            snprintf(label, sizeof label, "%s%s%s", runs[i].name, curves[k].label[0] ? " " : "", curves[k].label);
            fprintf(f, "%s", i || k ? ", \\\n     " : "");
            put_quoted(f, data);
            fprintf(f, " using %d:%d with linespoints lc %d dt %d pt 7 ps 0.5 title ", xcol + 1, curves[k].col + 1,
                    i + 1, curves[k].dash);
            put_quoted(f, label);
        }
    fprintf(f, "\n");
}

/* Whether any run has a value in column col. */
static bool any_value(const plot_run *runs, int nr, int col) {
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < runs[i].n; j++)
            if (!isnan(runs[i].rows[j][col])) return true;
    return false;
}

/* The value of row j of run r in column c as plotted: a step-logged run's train curves (loss,
 * throughput, lr) are its step records', so its epoch records leave them out. */
static double plotted(const plot_run *r, int j, int c) {
    const double *v = r->rows[j];
    if (r->has_steps && r->kinds[j] == K_EPOCH && (c == C_TRAIN || c == C_SPS || c == C_LR)) return NAN;
    /* an epoch cut short (--max-steps) sits at its fraction, as the step records do */
    if (c == C_EPOCH && r->kinds[j] == K_EPOCH && v[C_ESTEPS] < v[C_SPE])
        return v[C_EPOCH] - 1 + v[C_ESTEPS] / v[C_SPE];
    return v[c];
}

/* The learning-rate axis: from 0 to a little above the highest rate, so that its tick labels
 * differ (a constant rate autoscaled to a hair-thin range repeated one label down the axis). */
static void lr_axis(FILE *f, const plot_run *runs, int nr) {
    double hi = 0;
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < runs[i].n; j++)
            if (plotted(&runs[i], j, C_LR) > hi) hi = plotted(&runs[i], j, C_LR);
    if (hi > 0) fprintf(f, "set yrange [0:%.6g]\nset format y '%%.2g'\n", hi * 1.15);
}

/* The data files (one per run, '?' for a missing value) and the gnuplot script in dir. */
static int write_script(const plot_run *runs, int nr, const char *dir, const char *image, bool svg, const char *title,
                        int xcol) {
    for (int i = 0; i < nr; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/run%d.dat", dir, i);
        FILE *d = fopen(p, "w");
        if (!d) return dt_cli_fail(NULL, "cannot write %s: %s", p, strerror(errno));
        for (int j = 0; j < runs[i].n; j++)
            for (int c = 0; c < NCOLS; c++) {
                const double v = plotted(&runs[i], j, c);
                isnan(v) ? fprintf(d, "?%c", c + 1 < NCOLS ? ' ' : '\n')
                         : fprintf(d, "%.9g%c", v, c + 1 < NCOLS ? ' ' : '\n');
            }
        if (fclose(d) != 0) return dt_cli_fail(NULL, "cannot write %s: %s", p, strerror(errno));
    }
    char sp[4200];
    snprintf(sp, sizeof sp, "%s/plot.gp", dir);
    FILE *f = fopen(sp, "w");
    if (!f) return dt_cli_fail(NULL, "cannot write %s: %s", sp, strerror(errno));
    fprintf(f, "set terminal %s size 1200,900 noenhanced font ',10'\nset output ", svg ? "svg dynamic" : "pngcairo");
    put_quoted(f, image);
    fprintf(f,
            "\nset datafile missing '?'\nset grid\nset key top right\nset xlabel '%s'\nset multiplot layout 2,2 title ",
            g_cols[xcol]);
    put_quoted(f, title);
    fprintf(f, "\n");
    double last = 0;
    bool whole = true; /* every x a whole epoch: no step records, no epoch cut short */
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < runs[i].n; j++) {
            const double x = plotted(&runs[i], j, xcol);
            last = fmax(last, x), whole &= x == floor(x);
        }
    if (xcol == C_EPOCH && whole && last <= 20) fprintf(f, "set xtics 1\n"); /* whole epochs */
    const bool val = any_value(runs, nr, C_VLOSS); /* --val-split: validation curves beside the test ones */
    const curve loss[] = {{C_TRAIN, "train", 1}, {C_TEST, "test", 2}, {C_VLOSS, "val", 3}},
                acc[] = {{C_ACC, val ? "test" : "", 1}, {C_VACC, "val", 3}}, sps[] = {{C_SPS, "", 1}},
                lr[] = {{C_LR, "", 1}};
    write_panel(f, runs, nr, dir, xcol, loss, val ? 3 : 2,
                val ? "loss (solid: train, dashed: test, dotted: validation)" : "loss (solid: train, dashed: test)",
                "loss");
    write_panel(f, runs, nr, dir, xcol, acc, val ? 2 : 1,
                val ? "accuracy (solid: test, dotted: validation)" : "test accuracy", "accuracy");
    write_panel(f, runs, nr, dir, xcol, sps, 1, "throughput", "training samples/s");
    lr_axis(f, runs, nr);
    bool steps = false;
    for (int i = 0; i < nr; i++) steps |= runs[i].has_steps;
    write_panel(f, runs, nr, dir, xcol, lr, 1, steps ? "learning rate" : "learning rate (last step of the epoch)",
                "lr");
    fprintf(f, "unset multiplot\n");
    return fclose(f) == 0 ? 0 : dt_cli_fail(NULL, "cannot write %s: %s", sp, strerror(errno));
}

/* Runs gnuplot on the script with a deadline; its messages go to dir/gnuplot.log. */
static int run_gnuplot(const char *dir) {
    char script[4200], log[4200];
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    snprintf(log, sizeof log, "%s/gnuplot.log", dir);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return dt_cli_fail(NULL, "cannot start gnuplot: %s", strerror(errno));
    if (pid == 0) {
        FILE *l = freopen(log, "w", stderr);
        if (l) dup2(fileno(l), 1);
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    for (int waited_ms = 0;; waited_ms += 20) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return dt_cli_fail(NULL, "waiting for gnuplot: %s", strerror(errno));
        if (waited_ms > GNUPLOT_TIMEOUT_S * 1000) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return dt_cli_fail("plot fewer or smaller runs", "gnuplot did not finish within %d s; stopped it",
                               GNUPLOT_TIMEOUT_S);
        }
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    char msg[2048] = "";
    FILE *l = fopen(log, "r");
    if (l) {
        size_t n = fread(msg, 1, sizeof msg - 1, l);
        msg[n] = 0;
        fclose(l);
    }
    return dt_cli_fail("check that gnuplot has the pngcairo and svg terminals (gnuplot-nox does)", "gnuplot failed: %s",
                       msg);
}

/* Prints the table that was plotted: one line per run and epoch. */
static void print_table(const plot_run *runs, int nr) {
    const bool val = any_value(runs, nr, C_VLOSS);
    printf("%-20s %6s %8s %11s %11s %9s %12s %10s%s\n", "run", "epoch", "step", "train_loss", "test_loss", "test_acc",
           "samples/s", "lr", val ? "    val_loss   val_acc" : "");
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < runs[i].n; j++) {
            const double *r = runs[i].rows[j];
            /* an epoch's whole number; a step or evaluation record's fraction of epochs */
            printf("%-20s %6.*f %8.0f %11.6g %11.6g %9.4f %12.1f %10.4g", runs[i].name, runs[i].kinds[j] ? 2 : 0,
                   r[C_EPOCH], r[C_STEP], r[C_TRAIN], r[C_TEST], r[C_ACC], r[C_SPS], r[C_LR]);
            if (val) printf(" %11.6g %9.4f", r[C_VLOSS], r[C_VACC]);
            printf("\n");
        }
}

/* Output name, gnuplot present, the runs; then the plot through a temporary file and a rename. */
static int plot(const char **files, int nfiles, const char *out, const char *title, int xcol) {
    const char *ext = strrchr(out, '.');
    const bool svg = ext && !strcmp(ext, ".svg");
    if (!ext || (!svg && strcmp(ext, ".png")))
        return dt_cli_usage("e.g. -o curves.png or -o curves.svg", "-o %s: the image must end in .png or .svg", out);
    if (!on_path("gnuplot"))
        return dt_cli_fail("install it: sudo apt-get install gnuplot-nox (Debian/Ubuntu; any gnuplot 5 with the "
                           "pngcairo and svg terminals works)",
                           "dtrain plot draws through gnuplot, which is not on PATH");
    plot_run runs[MAX_RUNS] = {{0}};
    int rc = dt_cli_check_output_file("-o", out); /* before gnuplot runs */
    if (rc >= 0) return rc;
    rc = 0;
    for (int i = 0; i < nfiles && rc == 0; i++) rc = read_run(&runs[i], files[i]);
    for (int i = 0; i < nfiles && rc == 0 && xcol < 0; i++) xcol = runs[i].has_steps ? C_STEP : -1;
    if (xcol < 0) xcol = C_EPOCH;
    char dir[] = "/tmp/dtrain-plot.XXXXXX", tmp[4200], dest[4096]; /* dest: -o, or where its link leads */
    if (rc == 0 && dt_output_path("-o", out, dest, sizeof dest) != DT_OK)
        rc = dt_cli_usage(NULL, "%s", dt_last_error());
    snprintf(tmp, sizeof tmp, "%s.tmp.%d%s", rc == 0 ? dest : out, (int)getpid(), svg ? ".svg" : ".png");
    if (rc == 0 && !mkdtemp(dir)) rc = dt_cli_fail(NULL, "cannot make a temporary directory: %s", strerror(errno));
    else if (rc == 0) {
        rc = write_script(runs, nfiles, dir, tmp, svg, title ? title : "dtrain runs", xcol);
        if (rc == 0) rc = run_gnuplot(dir);
        if (rc == 0 && rename(tmp, dest) != 0)
            rc = dt_cli_fail(NULL, "-o %s: cannot write it: %s", out, strerror(errno));
        unlink(tmp);
        char p[4300];
        const char *names[] = {"plot.gp", "gnuplot.log"};
        for (int i = 0; i < 2; i++) snprintf(p, sizeof p, "%s/%s", dir, names[i]), unlink(p);
        for (int i = 0; i < nfiles; i++) snprintf(p, sizeof p, "%s/run%d.dat", dir, i), unlink(p);
        rmdir(dir);
    }
    if (rc == 0) {
        print_table(runs, nfiles);
        printf("wrote %s (%d run%s)\n", out, nfiles, nfiles == 1 ? "" : "s");
    }
    for (int i = 0; i < nfiles; i++) free(runs[i].rows), free(runs[i].kinds);
    return rc;
}

int dt_cmd_plot(int argc, char **argv) {
    const char *out = NULL, *title = NULL, *x = NULL;
    const dt_flag flags[] = {
        {"output", DT_FLAG_STR, &out, "FILE", "the image to write, .png or .svg (also -o FILE)"},
        {"title", DT_FLAG_STR, &title, "TEXT", "the title above the panels (default: dtrain runs)"},
        {"x", DT_FLAG_STR, &x, "AXIS",
         "the x axis: epoch or step (default: step where a run has --log-every records, else epoch)"},
    };
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) return dt_cli_fail(NULL, "out of memory");
    for (int i = 0; i < argc; i++) args[i] = strcmp(argv[i], "-o") ? argv[i] : "--output";
    const char *files[MAX_RUNS + 1];
    int nfiles = 0;
    int r = dt_flags_parse(argc, args, 1, flags, 3, PLOT_USAGE, files, MAX_RUNS + 1, &nfiles, NULL);
    free(args);
    if (r) return r < 0 ? DT_EXIT_USAGE : 0;
    if (nfiles == 0) return dt_cli_usage("e.g. dtrain plot run.jsonl -o curves.png", "plot: no metrics files given");
    if (nfiles > MAX_RUNS) return dt_cli_usage(NULL, "plot: at most %d runs in one plot", MAX_RUNS);
    if (!out)
        return dt_cli_usage("e.g. dtrain plot run.jsonl -o curves.png", "plot: -o FILE (.png or .svg) is missing");
    if (x && strcmp(x, "epoch") && strcmp(x, "step")) return dt_cli_usage(NULL, "--x %s: use epoch or step", x);
    return plot(files, nfiles, out, title, !x ? -1 : strcmp(x, "step") ? C_EPOCH : C_STEP);
}
