/* dtrain man --flags COMMAND: one command's flag table as JSON, the very table its --help and
 * the man page print (through dt_flags_usage_hook). Bindings generate their keywords from it
 * (python/dtrain: every `dtrain train` flag is a keyword of dtrain.Trainer), so a flag added to a
 * table reaches them with no change of theirs. */
#include "cli/cli.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_type_names[] = {[DT_FLAG_BOOL] = "bool",
                                           [DT_FLAG_INT] = "int",
                                           [DT_FLAG_I64] = "int",
                                           [DT_FLAG_FLOAT] = "float",
                                           [DT_FLAG_STR] = "str"};
static cJSON *g_flags; /* the array the hook fills */

/* One flag: {"name", "type", "meta", "help", "default"}; default is the value the table starts
 * with (null for a string flag without one), as --help shows it. */
static cJSON *flag_json(const dt_flag *f) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "name", f->name);
    cJSON_AddStringToObject(o, "type", g_type_names[f->type]);
    if (f->meta) cJSON_AddStringToObject(o, "meta", f->meta);
    else cJSON_AddNullToObject(o, "meta");
    cJSON_AddStringToObject(o, "help", f->help ? f->help : "");
    switch (f->type) {
    case DT_FLAG_BOOL: cJSON_AddBoolToObject(o, "default", *(const bool *)f->value); break;
    case DT_FLAG_INT: cJSON_AddNumberToObject(o, "default", *(const int *)f->value); break;
    case DT_FLAG_I64: cJSON_AddNumberToObject(o, "default", (double)*(const int64_t *)f->value); break;
    case DT_FLAG_FLOAT: { /* the float as --help prints it (0.001, not 0.0010000000474974513) */
        char text[32];
        snprintf(text, sizeof text, "%.9g", *(const float *)f->value);
        cJSON_AddNumberToObject(o, "default", strtod(text, NULL));
        break;
    }
    case DT_FLAG_STR:
        if (*(const char *const *)f->value) cJSON_AddStringToObject(o, "default", *(const char *const *)f->value);
        else cJSON_AddNullToObject(o, "default");
        break;
    }
    return o;
}

/* The usage hook: every flag of the table (entries without a name or a known type, such as group
 * headings, are not flags). */
static void json_usage(const char *usage, const dt_flag *flags, int n) {
    (void)usage;
    for (int i = 0; i < n && g_flags; i++) {
        if (!flags[i].name || !flags[i].name[0] ||
            (unsigned)flags[i].type >= sizeof g_type_names / sizeof *g_type_names)
            continue;
        cJSON *o = flag_json(&flags[i]);
        if (!o || !cJSON_AddItemToArray(g_flags, o)) {
            cJSON_Delete(o);
            cJSON_Delete(g_flags);
            g_flags = NULL;
        }
    }
}

/* The command named name among dtrain's and dtrain bench's ("bench ddp"), or NULL. */
static const dt_command *find_command(const char *name) {
    const dt_command *list = dt_cli_commands();
    if (!strncmp(name, "bench ", 6)) list = dt_bench_commands(), name += 6;
    for (const dt_command *c = list; c->name; c++)
        if (!strcmp(c->name, name)) return c;
    return NULL;
}

int dt_cli_flags_json(const char *command) {
    const dt_command *c = find_command(command);
    if (!c) return dt_cli_usage("e.g. dtrain man --flags train", "--flags %s: no such command", command);
    cJSON *doc = cJSON_CreateObject();
    g_flags = cJSON_CreateArray();
    if (!doc || !g_flags) {
        cJSON_Delete(doc), cJSON_Delete(g_flags);
        return dt_cli_fail(NULL, "out of memory");
    }
    void (*old)(const char *, const dt_flag *, int) = dt_flags_usage_hook;
    dt_flags_usage_hook = json_usage;
    char *argv[] = {(char *)c->name, "--help", NULL};
    fflush(stdout);
    c->run(2, argv);
    dt_flags_usage_hook = old;
    if (!g_flags) {
        cJSON_Delete(doc);
        return dt_cli_fail(NULL, "out of memory");
    }
    cJSON_AddStringToObject(doc, "command", command);
    cJSON_AddItemToObject(doc, "flags", g_flags);
    g_flags = NULL;
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    if (!text) return dt_cli_fail(NULL, "out of memory");
    int ok = puts(text) >= 0 && fflush(stdout) == 0;
    free(text);
    return ok ? 0 : dt_cli_fail("check where stdout goes", "--flags %s: cannot write the table", command);
}
