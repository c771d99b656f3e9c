/* dtrain plan --probe's cache of per-op times: each node's t_fix + t_per x batch, the optimizer's
 * update per value and the step's calibrated overhead at the shapes a plan runs, in DTRAIN_PLAN_CACHE (default
 * ~/.cache/dtrain) as ops-HOST-HASH.json. The key names the model spec, the data set, the two measured batches, the
 * rank count, the precisions, whether the overhead was calibrated and this CPU (its model name and core count): a
 * change to any of them misses, and the plan measures again. The file also keeps the other runnable tasks at the time,
 * so a later plan can scale the times to its own load (cmd_plan.c). */
#include "cli/cli.h"
#include "cli/cmd_plan.h"

#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* This CPU: /proc/cpuinfo's first "model name" and the online cores. */
static void cpu_name(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            const char *v = strchr(line, ':') + 1;
            while (*v == ' ') v++;
            snprintf(buf, cap, "%.*s", (int)strcspn(v, "\n"), v);
            break;
        }
    if (f) fclose(f);
    const size_t n = strlen(buf);
    snprintf(buf + n, cap > n ? cap - n : 0, " x%ld", sysconf(_SC_NPROCESSORS_ONLN));
}

void dt_cli_plan_ops_key(const char *spec, const char *data, int b1, int b2, int ranks, const char *prec,
                         bool calibrated, char *buf, size_t cap) {
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    snprintf(buf, cap, "model=%s; data=%s; batches=%d,%d; ranks=%d; precision=%s; calibrated=%d; cpu=%s", spec,
             data ? data : "", b1, b2, ranks, prec, calibrated, cpu);
}

/* The file of key into buf: its FNV-1a hash names it (the key itself is inside, and checked). */
static bool ops_path(const char *key, char *buf, size_t cap, bool make) {
    char d[3072], host[256] = "host";
    if (!dt_cli_plan_cache_dir(d, sizeof d, make)) return false;
    gethostname(host, sizeof host - 1);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = key; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return (size_t)snprintf(buf, cap, "%s/ops-%s-%016llx.json", d, host, (unsigned long long)h) < cap;
}

static cJSON *read_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 22);
    const size_t n = buf ? fread(buf, 1, (1 << 22) - 1, f) : 0;
    fclose(f);
    if (!buf) return NULL;
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    return j;
}

/* Array field name of j with `n` numbers into out; false when it is not that. */
static bool numbers(const cJSON *j, const char *name, int n, double *out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) return false;
    int i = 0;
    for (const cJSON *x = a->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0) return false;
        out[i] = x->valuedouble;
    }
    return true;
}

bool dt_cli_plan_ops_load(const char *key, dt_plan_model *pm, double *busy) {
    char path[4096];
    if (!ops_path(key, path, sizeof path, false)) return false;
    cJSON *j = read_json(path);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "key"), *b = cJSON_GetObjectItemCaseSensitive(j, "busy");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(j, "ovh_fix"),
                *op = cJSON_GetObjectItemCaseSensitive(j, "ovh_per");
    double *fix = calloc((size_t)pm->nodes, sizeof(double)), *per = calloc((size_t)pm->nodes, sizeof(double));
    const bool ok = fix && per && cJSON_IsString(k) && !strcmp(k->valuestring, key) && cJSON_IsNumber(b) &&
                    cJSON_IsNumber(of) && cJSON_IsNumber(op) && numbers(j, "t_fix", pm->nodes, fix) &&
                    numbers(j, "t_per", pm->nodes, per);
    if (ok) {
        free(pm->t_fix), free(pm->t_per);
        pm->t_fix = fix, pm->t_per = per, pm->ovh_fix = of->valuedouble, pm->ovh_per = op->valuedouble;
        const cJSON *ov = cJSON_GetObjectItemCaseSensitive(j, "opt_per"); /* absent in older caches */
        pm->opt_per = cJSON_IsNumber(ov) ? ov->valuedouble : 0;
        *busy = b->valuedouble;
    } else {
        free(fix), free(per);
    }
    cJSON_Delete(j);
    return ok;
}

int dt_cli_plan_ops_save(const char *key, const dt_plan_model *pm, double busy) {
    char path[4096], tmp[4200];
    if (!ops_path(key, path, sizeof path, true))
        return dt_cli_fail("set DTRAIN_PLAN_CACHE=DIR",
                           "--probe: no cache directory for the per-op times (HOME is unset)");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "key", key);
    cJSON_AddNumberToObject(j, "busy", busy);
    cJSON_AddItemToObject(j, "t_fix", cJSON_CreateDoubleArray(pm->t_fix, pm->nodes));
    cJSON_AddItemToObject(j, "t_per", cJSON_CreateDoubleArray(pm->t_per, pm->nodes));
    cJSON_AddNumberToObject(j, "ovh_fix", pm->ovh_fix);
    cJSON_AddNumberToObject(j, "ovh_per", pm->ovh_per);
    cJSON_AddNumberToObject(j, "opt_per", pm->opt_per);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = text ? fopen(tmp, "w") : NULL;
    const bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    const bool closed = f && fclose(f) == 0;
    free(text);
    if (!ok || !closed || rename(tmp, path) != 0) {
        unlink(tmp);
        return dt_cli_fail("set DTRAIN_PLAN_CACHE to a writable directory", "--probe: cannot write %s", path);
    }
    printf("dtrain plan: probe: per-op times of %d nodes cached in %s\n", pm->nodes, path);
    return 0;
}
