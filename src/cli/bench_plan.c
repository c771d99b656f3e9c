/* dtrain bench plan: the planner's predictions against measured step times. Per scenario (a model,
 * its data, a global batch, local ranks) it runs `dtrain plan --json` on this host, picks the
 * chosen layout and the best of every other family (ddp, ZeRO 1-3, tp, pp, tp x pp) plus pipeline
 * micro-batch variants, and trains each with the real command (--timeline: the median time
 * between rank 0's step starts, the first two steps left out as warm-up). It prints
 * predicted and measured ms per step and the error per layout, the mean absolute and worst error,
 * whether the chosen layout is within 10% of the fastest measured one, and a JSON line. */
#include "cli/bench_util.h"
#include "cli/cli.h"

#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *name, *model, *data;
    int G, ranks;
} scenario;

static const scenario g_scen[] = {
    {"mlp", "mlp", "fashion-mnist", 256, 2},
    {"cnn", "cnn", "fashion-mnist", 64, 2},
    {"gpt", "gpt", "kjv", 24, 2},
    {"mlp4", "mlp", "fashion-mnist", 256, 4},
};

enum { MAX_RUNS = 8 };

typedef struct {
    char layout[96], flags[256];
    double pred, meas;
    bool chosen;
} run;

/* `dtrain plan --json` of s into a parsed cJSON (free with cJSON_Delete), or NULL after saying why. */
static cJSON *plan_json(const scenario *s) {
    char exe[PATH_MAX], cmd[8192];
    if (dt_bench_self(exe, sizeof exe)) return NULL;
    snprintf(cmd, sizeof cmd, "'%s' plan --model '%s' --data '%s' --batch %d --workers %d --json --top 100000", exe,
             s->model, s->data, s->G, s->ranks);
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
    snprintf(out, cap, "d%g t%g p%d z%g m%d", num(l, "dp"), num(l, "tp"), pp, num(l, "zero"),
             !fine ? 0 : pp > 1 ? micro : (micro > 1 ? 2 : 1));
}

/* The layouts to run: the chosen one, the best of each coarse family, then the best of each fine
 * one (pipeline micro-batch counts, accumulation) while there is room. */
static int pick(const cJSON *layouts, run *out) {
    int n = 0;
    char keys[2 * MAX_RUNS][48];
    int nk = 0;
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *l;
        cJSON_ArrayForEach(l, layouts) {
            if (n == MAX_RUNS) break;
            char fam[48];
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

/* The median seconds between the starts of rank 0's consecutive steps in a Chrome trace (steps
 * from 2 on: the first ones warm up), or -1. */
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
    double start[MAXS];
    for (int i = 0; i < MAXS; i++) start[i] = INFINITY;
    int last = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) {
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        const int st = (int)num(args, "step");
        if (strcmp(str(e, "ph"), "X") || num(e, "pid") != 0 || !cJSON_GetObjectItemCaseSensitive(args, "step") ||
            st < 0 || st >= MAXS)
            continue;
        if (num(e, "ts") < start[st]) start[st] = num(e, "ts");
        if (st > last) last = st;
    }
    cJSON_Delete(j);
    double d[MAXS];
    int nd = 0;
    for (int s = 2; s < last; s++)
        if (isfinite(start[s]) && isfinite(start[s + 1])) d[nd++] = (start[s + 1] - start[s]) * 1e-6;
    if (!nd) return -1;
    qsort(d, (size_t)nd, sizeof *d, cmp_double);
    return nd % 2 ? d[nd / 2] : 0.5 * (d[nd / 2 - 1] + d[nd / 2]);
}

/* Measured seconds per step of r on s: the median step of a steps-long run (its Chrome trace). */
static int measure(const scenario *s, const run *r, int steps, double *out) {
    char args[1024], line[16384], metrics[64], trace[64];
    snprintf(metrics, sizeof metrics, "/tmp/dtrain-bench-plan-%d.jsonl", (int)getpid());
    snprintf(trace, sizeof trace, "/tmp/dtrain-bench-plan-%d.trace.json", (int)getpid());
    snprintf(args, sizeof args, "--model '%s' --data '%s' %s --max-steps %d --epochs 1 --timeline '%s'", s->model,
             s->data, r->flags, steps, trace);
    if (dt_bench_train_run(args, metrics, line, sizeof line)) return 1;
    *out = median_step(trace);
    unlink(trace);
    if (*out <= 0) return dt_cli_fail(NULL, "bench plan: no steps in the trace of %s", r->flags);
    return 0;
}

int dt_bench_plan(int argc, char **argv) {
    int steps = 30;
    const char *only = NULL;
    const dt_flag flags[] = {
        {"steps", DT_FLAG_INT, &steps, "N", "steps each layout trains (the median step from the third on counts)"},
        {"scenarios", DT_FLAG_STR, &only, "LIST", "mlp, cnn, gpt, mlp4 (4 ranks on this host), comma-separated"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, 2,
                           "Usage: dtrain bench plan [--steps N] [--scenarios LIST]\n\nThe planner's predicted step "
                           "time against the measured one over the layouts it ranks, on this host.",
                           NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    if (steps < 5 || steps > 4000) return dt_cli_usage(NULL, "--steps %d: 5..4000", steps);
    dt_bench_print_machine();
    printf("%-6s %-30s %10s %10s %8s  %s\n", "scen", "layout", "pred ms", "meas ms", "error", "flags");
    double sum = 0, worst = 0;
    int n = 0, chosen_ok = 0, scen_n = 0;
    char json[16384];
    int jn = snprintf(json, sizeof json, "{\"bench\": \"plan\", \"runs\": [");
    for (size_t k = 0; k < sizeof g_scen / sizeof *g_scen; k++) {
        const scenario *s = &g_scen[k];
        if (only && !listed(only, s->name)) continue;
        cJSON *j = plan_json(s);
        if (!j) return 1;
        run runs[MAX_RUNS];
        const int nr = pick(cJSON_GetObjectItemCaseSensitive(j, "layouts"), runs);
        cJSON_Delete(j);
        double best = 1e30, chosen = 0;
        for (int i = 0; i < nr; i++) {
            if (measure(s, &runs[i], steps, &runs[i].meas)) return 1;
            const double e = runs[i].meas / runs[i].pred - 1;
            sum += fabs(e), n++;
            if (fabs(e) > worst) worst = fabs(e);
            if (runs[i].meas < best) best = runs[i].meas;
            if (runs[i].chosen) chosen = runs[i].meas;
            printf("%-6s %-30s %10.3f %10.3f %+7.1f%%  %s%s\n", s->name, runs[i].layout, runs[i].pred * 1e3,
                   runs[i].meas * 1e3, 100 * e, runs[i].flags, runs[i].chosen ? "  (chosen)" : "");
            fflush(stdout);
            jn += snprintf(json + jn, sizeof json - (size_t)jn, "%s{\"scenario\": \"%s\", \"layout\": \"%s\", "
                           "\"predicted_s\": %.6g, \"measured_s\": %.6g, \"chosen\": %s}", n > 1 ? ", " : "", s->name,
                           runs[i].layout, runs[i].pred, runs[i].meas, runs[i].chosen ? "true" : "false");
        }
        scen_n++;
        const bool ok = chosen <= 1.10 * best;
        chosen_ok += ok;
        printf("# %s: chosen %.3f ms, fastest measured %.3f ms: %s\n", s->name, chosen * 1e3, best * 1e3,
               ok ? "within 10%" : "MORE than 10% slower");
    }
    printf("# %d layouts: mean absolute error %.1f%%, worst %.1f%%; the chosen layout within 10%% of the fastest "
           "in %d of %d scenarios\n", n, n ? 100 * sum / n : 0, 100 * worst, chosen_ok, scen_n);
    snprintf(json + jn, sizeof json - (size_t)jn, "], \"mae\": %.4f, \"worst\": %.4f, \"chosen_within_10pct\": %d, "
             "\"scenarios\": %d}", n ? sum / n : 0, worst, chosen_ok, scen_n);
    printf("%s\n", json);
    return 0;
}
