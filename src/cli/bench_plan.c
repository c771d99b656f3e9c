/* dtrain bench plan: the planner's predictions against measured step times. Per scenario (a model,
 * its data, a global batch, local ranks, or ranks on emulated hosts joined by a capped link) it runs
 * `dtrain plan --json` on this host, picks the chosen layout and the best of every other family
 * (ddp, ZeRO 1-3, tp, pp, tp x pp) plus variants, and trains each with the real command
 * (--timeline: the median time between rank 0's step starts, the first two steps left out as
 * warm-up; enough steps for --seconds of training; ps, which has no --timeline yet: the epoch's mean
 * step from its metrics). Unless --no-replan, the prediction of each layout is the mean of two
 * fresh plans, one just before its run and one just after (the per-op times and the load of this
 * shared host on either side of the run: the load moves within minutes). The emulated-host
 * scenarios (net1g, net100m) run
 * the ranks in network namespaces (scripts/netns-hosts, tc tbf at 1 Gbit/s or 100 Mbit/s, MPI over
 * TCP) and are skipped, saying why, where that cannot be done. It prints predicted and measured ms
 * per step, the error, the load average and the two plans' predictions per layout, the mean absolute
 * and worst error, whether the chosen layout is within 10% of the fastest measured one, how many
 * measured steps lie between their two plans, and a JSON line. */
#include "cli/bench_util.h"
#include "cli/cli.h"

#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *name, *model, *data;
    int G, ranks;
    const char *rate;     /* emulated hosts (one rank each): tc's rate of their link, else NULL */
    double gbit;          /* the same in Gbit/s, for the plan */
    const char *consider; /* dtrain plan --consider: the layouts that change the algorithm too */
} scenario;

static const scenario g_scen[] = {
    {"mlp", "mlp", "fashion-mnist", 256, 2, NULL, 0, NULL},
    {"cnn", "cnn", "fashion-mnist", 64, 2, NULL, 0, NULL},
    {"gpt", "gpt", "kjv", 24, 2, NULL, 0, NULL},
    {"mlp4", "mlp", "fashion-mnist", 256, 4, NULL, 0, NULL},
    {"net1g", "mlp", "fashion-mnist", 256, 2, "1gbit", 1, NULL},
    {"net100m", "mlp", "fashion-mnist", 256, 2, "100mbit", 0.1, NULL},
    {"algos", "mlp", "fashion-mnist", 256, 2, NULL, 0, "all"},
    {"algos100m", "mlp", "fashion-mnist", 256, 2, "100mbit", 0.1, "all"},
};

enum { MAX_RUNS = 8 };

typedef struct {
    char layout[96], flags[256];
    double pred, meas;
    double before, after; /* the plans just before and just after the run (re-planned; else both pred) */
    bool chosen;
} run;

/* `dtrain plan --json` of s into a parsed cJSON (free with cJSON_Delete), or NULL after saying why. */
static cJSON *plan_json(const scenario *s) {
    char exe[PATH_MAX], cmd[8192];
    if (dt_bench_self(exe, sizeof exe)) return NULL;
    int n0 = snprintf(cmd, sizeof cmd,
                      "'%s' plan --model '%s' --data '%s' --batch %d --workers %d --json --top 100000 --measure-ops",
                      exe, s->model, s->data, s->G, s->ranks);
    if (s->rate) n0 += snprintf(cmd + n0, sizeof cmd - (size_t)n0, " --hosts %d --inter-gbit %g", s->ranks, s->gbit);
    if (s->consider) snprintf(cmd + n0, sizeof cmd - (size_t)n0, " --consider %s", s->consider);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t n = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += k;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    const int rc = pclose(p);
    if (!buf) return NULL;
    buf[n] = '\0';
    cJSON *j = rc == 0 ? cJSON_Parse(buf) : NULL;
    if (!j) dt_cli_fail(NULL, "bench plan: '%s' gave no plan (exit %d): %.300s", cmd, rc, buf);
    free(buf);
    return j;
}

/* Whether name is one of the comma-separated list's items. */
static bool listed(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ',' || !p[n])) return true;
    return false;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(x) ? x->valuestring : "";
}
static double num(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : 0;
}

/* A layout's family key: coarse (the mesh and ZeRO stage) or fine (also pipeline micro-batches and
 * gradient accumulation). */
static void family(const cJSON *l, bool fine, char *out, size_t cap) {
    const int pp = (int)num(l, "pp"), micro = (int)num(l, "micro");
    snprintf(out, cap, "d%g t%g p%d z%g a%g c%g m%d", num(l, "dp"), num(l, "tp"), pp, num(l, "zero"), num(l, "algo"),
             num(l, "compress") >= 3 ? num(l, "compress") : 0,
             !fine    ? 0
             : pp > 1 ? micro
                      : (micro > 1 ? 2 : 1));
}

/* The layouts to run: the chosen one, the best of each coarse family, then the best of each fine
 * one (pipeline micro-batch counts, accumulation) while there is room. */
static int pick(const cJSON *layouts, run *out) {
    int n = 0;
    char keys[2 * MAX_RUNS][128];
    int nk = 0;
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *l;
        cJSON_ArrayForEach(l, layouts) {
            if (n == MAX_RUNS) break;
            char fam[128];
            family(l, pass == 1, fam, sizeof fam);
            bool seen = false;
            for (int k = 0; k < nk && !seen; k++) seen = !strcmp(keys[k], fam);
            for (int k = 0; k < n && !seen; k++) seen = !strcmp(out[k].flags, str(l, "flags"));
            if (seen) continue;
            snprintf(keys[nk++], sizeof keys[0], "%s", fam);
            run *r = &out[n++];
            snprintf(r->layout, sizeof r->layout, "%s", str(l, "layout"));
            snprintf(r->flags, sizeof r->flags, "%s", str(l, "flags"));
            r->pred = num(l, "step_s"), r->chosen = n == 1;
        }
    }
    return n;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The lowest rank (pid) with step events in a trace's events (a ps run's rank 0 serves), or -1. */
static int first_stepping_pid(const cJSON *events) {
    int pid = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        if (!strcmp(str(e, "ph"), "X") && cJSON_GetObjectItemCaseSensitive(args, "step") &&
            (pid < 0 || num(e, "pid") < pid))
            pid = (int)num(e, "pid");
    }
    return pid;
}

/* The median seconds between the starts of the first stepping rank's consecutive steps in a Chrome
 * trace (steps from 2 on: the first ones warm up), or -1. */
static double median_step(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n > 0 ? malloc((size_t)n + 1) : NULL;
    const bool got = buf && fread(buf, 1, (size_t)n, f) == (size_t)n;
    fclose(f);
    cJSON *j = got ? (buf[n] = '\0', cJSON_Parse(buf)) : NULL;
    free(buf);
    enum { MAXS = 4096 };
    static double start[MAXS], d[MAXS];
    for (int i = 0; i < MAXS; i++) start[i] = INFINITY;
    int last = -1;
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(j, "traceEvents"), *e;
    const int pid = first_stepping_pid(events);
    cJSON_ArrayForEach(e, events) {
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        const int st = (int)num(args, "step");
        if (strcmp(str(e, "ph"), "X") || num(e, "pid") != pid || !cJSON_GetObjectItemCaseSensitive(args, "step") ||
            st < 0 || st >= MAXS)
            continue;
        if (num(e, "ts") < start[st]) start[st] = num(e, "ts");
        if (st > last) last = st;
    }
    cJSON_Delete(j);
    int nd = 0;
    for (int s = 2; s < last; s++)
        if (isfinite(start[s]) && isfinite(start[s + 1])) d[nd++] = (start[s + 1] - start[s]) * 1e-6;
    if (!nd) return -1;
    qsort(d, (size_t)nd, sizeof *d, cmp_double);
    return nd % 2 ? d[nd / 2] : 0.5 * (d[nd / 2 - 1] + d[nd / 2]);
}

/* The step time a fresh plan of s predicts for the layout with these flags (the plan's per-op times
 * measured now), or `fallback` when the plan has no such fitting layout. */
static double predict_now(const scenario *s, const char *flags, double fallback) {
    cJSON *j = plan_json(s);
    double t = fallback;
    const cJSON *l;
    cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(j, "layouts")) if (!strcmp(str(l, "flags"), flags)) {
        t = num(l, "step_s");
        break;
    }
    cJSON_Delete(j);
    return t;
}

/* The 1-minute load average now, or -1. */
static double load_now(void) {
    double load = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &load) != 1) load = -1;
    if (f) fclose(f);
    return load;
}

/* scripts/netns-hosts beside this executable's build directory (or under DTRAIN_ROOT) into out. */
static bool netns_script(char *out, size_t cap) {
    char exe[PATH_MAX];
    const char *root = getenv("DTRAIN_ROOT");
    if (root && *root) snprintf(out, cap, "%s/scripts/netns-hosts", root);
    else if (dt_bench_self(exe, sizeof exe)) return false;
    else {
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        snprintf(out, cap, "%s/../scripts/netns-hosts", exe);
    }
    return access(out, X_OK) == 0;
}

/* Whether emulated hosts can run here; why not into why. */
static bool netns_ok(char *why, size_t cap) {
    char script[PATH_MAX + 32], cmd[PATH_MAX + 128];
    if (!netns_script(script, sizeof script)) {
        snprintf(why, cap, "scripts/netns-hosts not found (set DTRAIN_ROOT to the source tree)");
        return false;
    }
    snprintf(cmd, sizeof cmd, "'%s' check 2>&1 && command -v mpirun >/dev/null 2>&1 || echo 'mpirun not found'",
             script);
    FILE *p = popen(cmd, "r");
    why[0] = '\0';
    if (p && !fgets(why, (int)cap, p)) why[0] = '\0';
    if (p) pclose(p);
    why[strcspn(why, "\n")] = '\0';
    return !why[0];
}

/* The flags of r without "--workers N" (under mpirun the job's size is mpirun's). */
static void drop_workers(const char *flags, char *out, size_t cap) {
    const char *w = strstr(flags, "--workers ");
    if (!w) {
        snprintf(out, cap, "%s", flags);
        return;
    }
    const char *after = w + strlen("--workers ");
    while (*after && *after != ' ') after++;
    while (*after == ' ') after++;
    snprintf(out, cap, "%.*s%s", (int)(w - flags), flags, after);
}

/* Trains args on s's emulated hosts (one rank each, the link capped at s->rate) under mpirun. */
static int run_hosts(const scenario *s, const char *args) {
    char script[PATH_MAX + 32], exe[PATH_MAX], cmd[16384];
    if (!netns_script(script, sizeof script) || dt_bench_self(exe, sizeof exe)) return 1;
    char slots[64] = "1";
    for (int i = 1; i < s->ranks && strlen(slots) + 3 < sizeof slots; i++) strcat(slots, ",1");
    snprintf(cmd, sizeof cmd,
             "RATE=%s '%s' session dbp %d '%s' mpirun %s -np %d '%s' train --backend mpi %s --quiet "
             "> /dev/null 2>&1",
             s->rate, script, s->ranks, script, slots, s->ranks, exe, args);
    return system(cmd) == 0 ? 0 : dt_cli_fail(NULL, "bench plan: '%s' failed", cmd);
}

/* Top-k and PowerSGD start with 1000 steps of (nearly) plain allreduces by default (warmup=S); the
 * plan predicts their steady state, so the bench runs them with warmup=0. */
static void steady_compress(char *flags, size_t cap) {
    char *c = strstr(flags, "--compress topk:");
    if (!c) c = strstr(flags, "--compress powersgd:");
    if (!c) return;
    char *end = strchr(c + strlen("--compress "), ' '), rest[512];
    snprintf(rest, sizeof rest, "%s", end ? end : "");
    const size_t at = (size_t)(end ? end - flags : (ptrdiff_t)strlen(flags));
    snprintf(flags + at, cap - at, ":warmup=0%s", rest);
}

/* Measured seconds per step of r on s: the median step of a steps-long run (its Chrome trace). */
static int measure(const scenario *s, const run *r, int steps, double *out) {
    char args[1024], line[16384], metrics[64], trace[64], flags[256];
    snprintf(metrics, sizeof metrics, "/tmp/dtrain-bench-plan-%d.jsonl", (int)getpid());
    snprintf(trace, sizeof trace, "/tmp/dtrain-bench-plan-%d.trace.json", (int)getpid());
    if (s->rate) drop_workers(r->flags, flags, sizeof flags);
    else snprintf(flags, sizeof flags, "%s", r->flags);
    steady_compress(flags, sizeof flags);
    if (strstr(flags, "--strategy ps") && !s->rate) { /* ps has no --timeline: the mean step of its metrics */
        snprintf(args, sizeof args, "--model '%s' --data '%s' %s --max-steps %d --epochs 1", s->model, s->data, flags,
                 steps);
        if (dt_bench_train_run(args, metrics, line, sizeof line)) return 1;
        const double es = dt_bench_json_field(line, "epoch_s"), st = dt_bench_json_field(line, "step");
        *out = es > 0 && st > 0 ? es / st : -1;
        return *out > 0 ? 0 : dt_cli_fail(NULL, "bench plan: no epoch time in the metrics of %s", r->flags);
    }
    snprintf(args, sizeof args, "--model '%s' --data '%s' %s --max-steps %d --epochs 1 --timeline '%s'", s->model,
             s->data, flags, steps, trace);
    if (s->rate ? run_hosts(s, args) : dt_bench_train_run(args, metrics, line, sizeof line)) return 1;
    *out = median_step(trace);
    unlink(trace);
    if (*out <= 0) return dt_cli_fail(NULL, "bench plan: no steps in the trace of %s", r->flags);
    return 0;
}

typedef struct {
    int steps;
    float seconds;
    bool replan;
    double sum, worst;
    int n, chosen_ok, scen_n;
    int bracketed; /* runs whose measured step lies between the plans before and after it */
    char json[32768];
    int jn;
} bench;

/* Runs scenario s's layouts and prints its rows; 0 or the exit status. */
static int run_scenario(bench *b, const scenario *s) {
    char why[512];
    if (s->rate && !netns_ok(why, sizeof why)) {
        printf("# %s: skipped: emulated hosts cannot run here: %s\n", s->name, why);
        return 0;
    }
    cJSON *j = plan_json(s);
    if (!j) return 1;
    run runs[MAX_RUNS];
    const int nr = pick(cJSON_GetObjectItemCaseSensitive(j, "layouts"), runs);
    cJSON_Delete(j);
    double best = 1e30, chosen = 0;
    for (int i = 0; i < nr; i++) {
        run *r = &runs[i];
        r->before = b->replan ? predict_now(s, r->flags, r->pred) : r->pred;
        int steps = (int)ceil(b->seconds / (r->before > 0 ? r->before : 1));
        if (steps < b->steps) steps = b->steps;
        if (steps > 2000) steps = 2000;
        const double load = load_now();
        if (measure(s, r, steps, &r->meas)) {
            printf("# %s: %s: not measured (said above); left out\n", s->name, r->layout);
            continue;
        }
        /* the load moves within minutes: the plans on either side of the run, their mean predicts it */
        r->after = b->replan ? predict_now(s, r->flags, r->before) : r->pred;
        r->pred = 0.5 * (r->before + r->after);
        const double e = r->meas / r->pred - 1;
        const double lo = fmin(r->before, r->after), hi = fmax(r->before, r->after);
        b->bracketed += r->meas >= lo && r->meas <= hi;
        b->sum += fabs(e), b->n++;
        if (fabs(e) > b->worst) b->worst = fabs(e);
        if (r->meas < best) best = r->meas;
        if (r->chosen) chosen = r->meas;
        printf("%-7s %-30s %10.3f %10.3f %+7.1f%% %5.1f %5d %8.3f %8.3f  %s%s\n", s->name, r->layout, r->pred * 1e3,
               r->meas * 1e3, 100 * e, load, steps, r->before * 1e3, r->after * 1e3, r->flags,
               r->chosen ? "  (chosen)" : "");
        fflush(stdout);
        b->jn += snprintf(
            b->json + b->jn, sizeof b->json - (size_t)b->jn,
            "%s{\"scenario\": \"%s\", \"layout\": \"%s\", "
            "\"predicted_s\": %.6g, \"predicted_before_s\": %.6g, \"predicted_after_s\": %.6g, \"measured_s\": %.6g, "
            "\"load\": %.2f, \"chosen\": %s}",
            b->n > 1 ? ", " : "", s->name, r->layout, r->pred, r->before, r->after, r->meas, load,
            r->chosen ? "true" : "false");
    }
    b->scen_n++;
    const bool ok = chosen <= 1.10 * best;
    b->chosen_ok += ok;
    printf("# %s: chosen %.3f ms, fastest measured %.3f ms: %s\n", s->name, chosen * 1e3, best * 1e3,
           ok ? "within 10%" : "MORE than 10% slower");
    return 0;
}

int dt_bench_plan(int argc, char **argv) {
    static bench b;
    memset(&b, 0, sizeof b);
    b.steps = 20, b.seconds = 2;
    bool no_replan = false;
    const char *only = NULL;
    const dt_flag flags[] = {
        {"steps", DT_FLAG_INT, &b.steps, "N",
         "least steps each layout trains (the median step from the third on counts)"},
        {"seconds", DT_FLAG_FLOAT, &b.seconds, "S",
         "train each layout for about S seconds (predicted), at most 2000 steps"},
        {"no-replan", DT_FLAG_BOOL, &no_replan, NULL, "predict every layout from the scenario's first plan only"},
        {"scenarios", DT_FLAG_STR, &only, "LIST",
         "mlp, cnn, gpt, mlp4 (4 ranks on this host), net1g, net100m "
         "(2 emulated hosts at 1 Gbit/s, 100 Mbit/s), algos, algos100m (the MLP with top-k, PowerSGD, localsgd and "
         "ps searched too), comma-separated"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, 4,
                           "Usage: dtrain bench plan [--steps N] [--seconds S] [--no-replan] [--scenarios LIST]\n\n"
                           "The planner's predicted step time against the measured one over the layouts it ranks, "
                           "on this host (and on emulated hosts where root and ip netns allow).",
                           NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    if (b.steps < 5 || b.steps > 2000) return dt_cli_usage(NULL, "--steps %d: 5..2000", b.steps);
    if (!(b.seconds >= 0 && b.seconds <= 600)) return dt_cli_usage(NULL, "--seconds %g: 0..600", b.seconds);
    b.replan = !no_replan;
    dt_bench_print_machine();
    printf("%-7s %-30s %10s %10s %8s %5s %5s %8s %8s  %s\n", "scen", "layout", "pred ms", "meas ms", "error", "load",
           "steps", "before", "after", "flags");
    b.jn = snprintf(b.json, sizeof b.json, "{\"bench\": \"plan\", \"runs\": [");
    for (size_t k = 0; k < sizeof g_scen / sizeof *g_scen; k++)
        if ((!only || listed(only, g_scen[k].name)) && (r = run_scenario(&b, &g_scen[k]))) return r;
    printf("# %d layouts: mean absolute error %.1f%%, worst %.1f%%; the chosen layout within 10%% of the fastest "
           "in %d of %d scenarios; %d measured between the plans before and after their run\n",
           b.n, b.n ? 100 * b.sum / b.n : 0, 100 * b.worst, b.chosen_ok, b.scen_n, b.bracketed);
    snprintf(b.json + b.jn, sizeof b.json - (size_t)b.jn,
             "], \"mae\": %.4f, \"worst\": %.4f, \"chosen_within_10pct\": "
             "%d, \"scenarios\": %d, \"bracketed\": %d}",
             b.n ? b.sum / b.n : 0, b.worst, b.chosen_ok, b.scen_n, b.bracketed);
    printf("%s\n", b.json);
    return 0;
}
