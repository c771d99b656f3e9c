/* The public face of the strategy registry (dtrain/train.h): what the CLI and embedders learn
 * from a --strategy spec without the internal headers of parallel/. */
#include "dtrain/train.h"
#include "parallel/strategy.h"

#include <stdio.h>
#include <string.h>

dt_status dt_strategy_spec_info(const char *spec, char *name, size_t cap, int *servers) {
    dt_strategy_opts opts;
    const dt_strategy_entry *e;
    DT_TRY(dt_strategy_parse(spec, &e, &opts));
    if (name && cap) snprintf(name, cap, "%s", e->name);
    if (servers) *servers = e->servers ? e->servers(&opts) : 0;
    return DT_OK;
}

int dt_strategy_spec_data_world(const char *spec, int world) {
    dt_strategy_opts opts;
    const dt_strategy_entry *e;
    int dr, dw;
    if (dt_strategy_parse(spec, &e, &opts) != DT_OK || dt_strategy_data_part(e, &opts, 0, world, &dr, &dw) != DT_OK)
        return world;
    return dw;
}

dt_status dt_strategy_spec_mesh(const char *spec, int *tp, int *pp, int *microbatches, const char **schedule) {
    dt_strategy_opts opts;
    const dt_strategy_entry *e;
    *tp = *pp = *microbatches = 1, *schedule = NULL;
    DT_TRY(dt_strategy_parse(spec, &e, &opts));
    if (e->mesh) e->mesh(&opts, tp, pp, microbatches, schedule);
    if (*pp > 1 && *microbatches < 1) *microbatches = *pp;
    if (*pp == 1) *microbatches = 1, *schedule = NULL;
    return DT_OK;
}

dt_status dt_strategy_spec_canonical(const char *spec, char *out, size_t cap) {
    dt_strategy_opts opts;
    const dt_strategy_entry *e;
    DT_TRY(dt_strategy_parse(spec, &e, &opts));
    char inside[512] = "";
    if (e->format) e->format(&opts, inside, sizeof inside);
    if ((size_t)snprintf(out, cap, inside[0] ? "%s(%s)" : "%s%s", e->name, inside) >= cap)
        return dt_error(DT_EINVAL, "`strategy` %s: the spec is too long", spec);
    return DT_OK;
}

dt_status dt_strategy_spec_add_option(const char *spec, const char *key, const char *value, char *out, size_t cap) {
    return dt_strategy_spec_add(spec, key, value, out, cap);
}

const char *dt_strategy_spec_help(void) {
    static char buf[1024];
    if (buf[0]) return buf;
    int n;
    const dt_strategy_entry *const *e = dt_strategy_entries(&n);
    size_t k = 0;
    for (int i = 0; i < n && k < sizeof buf; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, e[i]->options[0] ? "%s(%s)\n" : "%s%s\n", e[i]->name,
                              e[i]->options);
    return buf;
}

dt_status dt_strategy_spec_class(const char *spec, dt_strategy_class *out) {
    dt_strategy_opts opts;
    const dt_strategy_entry *e;
    DT_TRY(dt_strategy_parse(spec, &e, &opts));
    *out = dt_strategy_entry_class(e);
    return DT_OK;
}

bool dt_strategy_spec_takes(const char *spec, const char *key) {
    dt_strategy_opts opts;
    const dt_strategy_entry *e;
    if (dt_strategy_parse(spec, &e, &opts) != DT_OK) return dt_error_clear(), false;
    return dt_strategy_entry_takes(e, key);
}

static bool takes(const dt_strategy_entry *e, const void *key) { return dt_strategy_entry_takes(e, key); }
static bool of_class(const dt_strategy_entry *e, const void *c) {
    return dt_strategy_entry_class(e) == *(const dt_strategy_class *)c;
}

const char *dt_strategy_takers(const char *key, const char *last, char *out, size_t cap) {
    return dt_strategy_names_where(takes, key, last, out, cap);
}

const char *dt_strategy_names_of_class(dt_strategy_class c, const char *last, char *out, size_t cap) {
    return dt_strategy_names_where(of_class, &c, last, out, cap);
}

const char *dt_strategy_spec_default(int world) { return dt_strategy_default_name(world); }

bool dt_strategy_spec_is_default(const char *spec) {
    return spec && (!strcmp(spec, dt_strategy_default_name(1)) || !strcmp(spec, dt_strategy_default_name(2)));
}
