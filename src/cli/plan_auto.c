/* dtrain train --strategy auto: the planner chooses the layout before any rank starts. The flags
 * the plan needs (--model, --data, --batch per rank x --workers = the global batch, --optimizer,
 * --momentum, --precision, --mem-limit, --val-fraction) are read off argv; the layout's own flags
 * (--tp, --pp, --zero, ...) must not be given. The plan is printed, then train runs with argv's
 * --strategy auto, --workers and --batch replaced by the chosen layout's flags, and the predicted
 * step time in DTRAIN_PLAN_STEP_S, which each rank's metrics carry beside the measured one. */
#include "cli/cli.h"
#include "cli/cmd_plan.h"
#include "cli/train_mem.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value of --name in argv (--name VALUE or --name=VALUE), or NULL. */
static const char *flag_value(int argc, char **argv, const char *name) {
    const size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (strncmp(argv[i], "--", 2) || strncmp(argv[i] + 2, name, n)) continue;
        if (argv[i][2 + n] == '=') return argv[i] + 3 + n;
        if (!argv[i][2 + n] && i + 1 < argc) return argv[i + 1];
    }
    return NULL;
}

bool dt_cli_strategy_is_auto(int argc, char **argv) {
    const char *s = flag_value(argc, argv, "strategy");
    return s && !strcmp(s, "auto");
}

static const char *const g_owned[] = {"tp",        "pp",         "zero",     "microbatches", "pp-schedule",
                                      "pp-split",  "grad-accum", "compress", "bucket-mb",    "servers",
                                      "staleness", "sync-every", "resume"};

/* Plans on this host; the best layout into *best and the plan printed; 0 or the exit status. */
static int choose(int argc, char **argv, dt_plan_entry *best, int *G) {
    for (size_t k = 0; k < sizeof g_owned / sizeof *g_owned; k++)
        if (dt_cli_flag_given(argc, argv, g_owned[k]))
            return dt_cli_usage("drop it, or drop --strategy auto and choose the layout yourself (dtrain plan shows "
                                "the options)",
                                "--%s with --strategy auto: the planner chooses the layout", g_owned[k]);
    if (dt_comm_env_is_rank())
        return dt_cli_usage("run it with --workers N, or run dtrain plan and pass its flags to mpirun",
                            "--strategy auto plans before the ranks start; this process is already one rank of a job");
    const char *w = flag_value(argc, argv, "workers"), *b = flag_value(argc, argv, "batch");
    const int workers = w ? atoi(w) : 1, batch = b ? atoi(b) : dt_train_defaults().batch;
    if (workers < 1 || batch < 1) return dt_cli_usage(NULL, "--workers %s, --batch %s: need >= 1", w, b);
    *G = workers * batch;
    char gs[32], ws[32];
    snprintf(gs, sizeof gs, "%d", *G), snprintf(ws, sizeof ws, "%d", workers);
    const char *pass[] = {"model", "data", "optimizer", "momentum", "precision", "mem-limit", "val-fraction"};
    char *args[40] = {"plan", "--batch", gs, "--workers", ws, "--top", "3"};
    int n = 7;
    for (size_t k = 0; k < sizeof pass / sizeof *pass; k++) {
        const char *v = flag_value(argc, argv, pass[k]);
        if (!v) continue;
        static char names[8][32];
        snprintf(names[k], sizeof names[k], "--%s", pass[k]);
        args[n++] = names[k], args[n++] = (char *)v;
    }
    /* a run that saves must fit while the save gathers the model */
    if (dt_cli_flag_given(argc, argv, "save") || dt_cli_flag_given(argc, argv, "save-weights") ||
        dt_cli_flag_given(argc, argv, "checkpoint-every"))
        args[n++] = "--saves";
    return dt_cli_plan_run(n, args, best);
}

int dt_cli_train_auto(int argc, char **argv, int (*run)(int, char **)) {
    dt_plan_entry best;
    int G = 0, r = choose(argc, argv, &best, &G);
    if (r) return r;
    char flags[256], name[96], pred[32];
    dt_plan_flags(&best.l, G, flags, sizeof flags);
    dt_plan_name(&best.l, name, sizeof name);
    printf("dtrain: --strategy auto chose %s: %s (predicted %.3f ms per step, %.1f MB per rank)\n", name, flags,
           best.c.total * 1e3, best.c.mem / 1048576.0);
    fflush(stdout);
    snprintf(pred, sizeof pred, "%.9g", best.c.total);
    setenv("DTRAIN_PLAN_STEP_S", pred, 1);
    setenv("DTRAIN_PLAN_LAYOUT", name, 1);
    /* argv without --strategy auto, --workers and --batch, then the layout's flags */
    char **out = calloc((size_t)argc + 32, sizeof *out);
    if (!out) return dt_cli_fail(NULL, "out of memory");
    int n = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const bool skip2 = !strcmp(a, "--strategy") || !strcmp(a, "--workers") || !strcmp(a, "--batch");
        if (!strncmp(a, "--strategy=", 11) || !strncmp(a, "--workers=", 10) || !strncmp(a, "--batch=", 8)) continue;
        if (skip2) {
            i++;
            continue;
        }
        out[n++] = argv[i];
    }
    for (char *save, *t = strtok_r(flags, " ", &save); t; t = strtok_r(NULL, " ", &save)) out[n++] = t;
    r = run(n, out);
    free(out);
    return r;
}

double dt_cli_plan_from_env(const char **layout) {
    const char *step = getenv("DTRAIN_PLAN_STEP_S");
    *layout = step ? getenv("DTRAIN_PLAN_LAYOUT") : NULL;
    return step ? atof(step) : 0;
}
