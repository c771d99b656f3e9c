/* The strategy registry: the table of strategies by name (DT_STRATEGIES, and those registered from
 * outside the library), the spec parser ("ps(servers=2,
 * staleness=4)": each strategy's options live in its own struct, set key by key through its
 * entry), the factory and the data part of a rank. No code here knows a strategy by name. */
#include "parallel/strategy.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The registry: a strategy is its file plus its name here (dt_strategy_NAME_entry); the order of
 * the help and of the messages that list them. dt_strategy_register adds one from outside. */
#define DT_STRATEGIES(X) X(single) X(ddp) X(localsgd) X(ps) X(tp) X(pp)

#define DT_STRATEGY_DECL(n) extern const dt_strategy_entry dt_strategy_##n##_entry;
#define DT_STRATEGY_REF(n) &dt_strategy_##n##_entry,
#define DT_STRATEGY_ONE(n) +1
DT_STRATEGIES(DT_STRATEGY_DECL)
enum { N_BUILTIN = 0 DT_STRATEGIES(DT_STRATEGY_ONE), MAX_ENTRIES = N_BUILTIN + 8 };
static const dt_strategy_entry *g_entries[MAX_ENTRIES] = {DT_STRATEGIES(DT_STRATEGY_REF)};
static int g_n = N_BUILTIN;

const dt_strategy_entry *const *dt_strategy_entries(int *n) {
    *n = g_n;
    return g_entries;
}

/* Whether every key of e->keys is written KEY= in e->options. */
static bool options_name_keys(const dt_strategy_entry *e) {
    for (const char *k = e->keys; *k;) {
        while (*k == ',' || *k == ' ') k++;
        size_t len = strcspn(k, ", ");
        if (!len) break;
        bool found = false;
        for (const char *o = e->options; !found && *o; o += strcspn(o, ","), o += *o == ',')
            found = !strncmp(o, k, len) && o[len] == '=';
        if (!found) return false;
        k += len;
    }
    return true;
}

dt_status dt_strategy_register(const dt_strategy_entry *e) {
    if (!e || !e->name || !e->name[0] || strpbrk(e->name, "(),= ") || !e->help || !e->help[0] || !e->options ||
        !e->keys || !e->create || (e->keys[0] && !e->set))
        return dt_error(DT_EINVAL,
                        "strategy registry: entry '%s' needs a name (without '(),= '), help, options (\"\" "
                        "for none), keys, create, and set when it has keys",
                        e && e->name ? e->name : "(null)");
    if (!options_name_keys(e))
        return dt_error(DT_EINVAL,
                        "strategy registry: entry '%s': its options '%s' do not show every key of '%s' as "
                        "KEY=...",
                        e->name, e->options, e->keys);
    if (e->opts_size > sizeof(dt_strategy_opts))
        return dt_error(DT_EINVAL, "strategy registry: entry '%s': options of %zu bytes do not fit dt_strategy_opts",
                        e->name, e->opts_size);
    if (dt_strategy_find(e->name)) return dt_error(DT_EINVAL, "strategy registry: '%s' is registered already", e->name);
    if (g_n == MAX_ENTRIES) return dt_error(DT_ENOMEM, "strategy registry: full (%d entries)", MAX_ENTRIES);
    g_entries[g_n++] = e;
    return DT_OK;
}

const dt_strategy_entry *dt_strategy_find(const char *name) {
    for (int i = 0; name && i < g_n; i++)
        if (!strcmp(g_entries[i]->name, name)) return g_entries[i];
    return NULL;
}

dt_strategy_class dt_strategy_entry_class(const dt_strategy_entry *e) {
    if (!e->needs_comm) return DT_STRATEGY_ONE_PROCESS;
    if (e->servers) return DT_STRATEGY_SERVERS;
    if (e->mesh) return DT_STRATEGY_MODEL_PARALLEL;
    return DT_STRATEGY_REPLICAS;
}

const char *dt_strategy_names_where(bool (*pred)(const dt_strategy_entry *e, const void *arg), const void *arg,
                                    const char *last, char *out, size_t cap) {
    int m = 0, shown = 0;
    for (int i = 0; i < g_n; i++) m += pred(g_entries[i], arg);
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < g_n && k < cap; i++) {
        if (!pred(g_entries[i], arg)) continue;
        if (shown) k += (size_t)snprintf(out + k, cap - k, shown == m - 1 ? " %s " : ", ", last);
        if (k < cap) k += (size_t)snprintf(out + k, cap - k, "%s", g_entries[i]->name);
        shown++;
    }
    return out;
}

const char *dt_strategy_default_name(int world) {
    return world > 1 ? dt_strategy_ddp_entry.name : dt_strategy_single_entry.name;
}

/* "single, ddp, localsgd or ps" */
static const char *entry_names(void) {
    static char buf[256];
    size_t k = 0;
    for (int i = 0; i < g_n && k < sizeof buf; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s",
                              i == 0         ? ""
                              : i == g_n - 1 ? " or "
                                             : ", ",
                              g_entries[i]->name);
    return buf;
}

/* A spec cut into its name and (key, value) texts. */
enum { MAX_OPTS = 16, TEXT = 256 };
typedef struct {
    char name[64];
    int n;
    char key[MAX_OPTS][64], value[MAX_OPTS][TEXT];
} spec_parts;

/* Copies [a, b) without surrounding spaces into out (cap); false when it does not fit. */
static bool trimmed(const char *a, const char *b, char *out, size_t cap) {
    while (a < b && isspace((unsigned char)*a)) a++;
    while (b > a && isspace((unsigned char)b[-1])) b--;
    if ((size_t)(b - a) >= cap) return false;
    memcpy(out, a, (size_t)(b - a));
    out[b - a] = 0;
    return true;
}

static dt_status malformed(const char *spec, const char *why) {
    return dt_error(DT_EINVAL, "`strategy` '%s': %s; write NAME or NAME(KEY=VALUE,...), e.g. ps(servers=2,staleness=4)",
                    spec, why);
}

static dt_status split_spec(const char *spec, spec_parts *p) {
    memset(p, 0, sizeof *p);
    const char *open = strchr(spec, '('), *end = spec + strlen(spec);
    if (!trimmed(spec, open ? open : end, p->name, sizeof p->name) || !p->name[0])
        return malformed(spec, "no strategy name");
    if (!open) return DT_OK;
    const char *close = end;
    while (close > open && isspace((unsigned char)close[-1])) close--;
    if (close == open + 1 || close[-1] != ')') return malformed(spec, "no closing ')'");
    close--;
    const char *last = close; /* a trailing comma leaves an empty option */
    while (last > open + 1 && isspace((unsigned char)last[-1])) last--;
    if (last[-1] == ',') return dt_error(DT_EINVAL, "`strategy` %s: option '' is not KEY=VALUE", p->name);
    for (const char *a = open + 1; a < close;) {
        const char *comma = memchr(a, ',', (size_t)(close - a));
        const char *b = comma ? comma : close;
        const char *eq = memchr(a, '=', (size_t)(b - a));
        char item[TEXT];
        if (!trimmed(a, b, item, sizeof item)) return malformed(spec, "an option is too long");
        if (item[0] || comma) {
            if (p->n == MAX_OPTS) return malformed(spec, "too many options");
            if (!eq || !trimmed(a, eq, p->key[p->n], sizeof p->key[0]) || !p->key[p->n][0] ||
                !trimmed(eq + 1, b, p->value[p->n], sizeof p->value[0]) || !p->value[p->n][0])
                return dt_error(DT_EINVAL, "`strategy` %s: option '%s' is not KEY=VALUE", p->name, item);
            if (strchr(p->value[p->n], '(') || strchr(p->value[p->n], ')'))
                return malformed(spec, "unbalanced parentheses");
            p->n++;
        }
        a = comma ? comma + 1 : close;
    }
    return DT_OK;
}

/* Whether key is one of the entry's keys (a comma-separated list). */
bool dt_strategy_entry_takes(const dt_strategy_entry *e, const char *key) {
    size_t n = strlen(key);
    for (const char *k = e->keys; k && *k;) {
        while (*k == ',' || *k == ' ') k++;
        size_t len = strcspn(k, ", ");
        if (len == n && !strncmp(k, key, n)) return true;
        k += len;
    }
    return false;
}

static dt_status unknown_key(const dt_strategy_entry *e, const char *key) {
    if (!e->keys || !e->keys[0])
        return dt_error(DT_EINVAL, "`strategy` %s: unknown option '%s' (%s takes no options)", e->name, key, e->name);
    return dt_error(DT_EINVAL, "`strategy` %s: unknown option '%s' (%s takes %s)", e->name, key, e->name, e->keys);
}

static dt_status find_entry(const char *name, const dt_strategy_entry **entry) {
    if (!(*entry = dt_strategy_find(name)))
        return dt_error(DT_EINVAL, "`strategy` %s: unknown strategy (choose %s)", name, entry_names());
    return DT_OK;
}

/* Sets the options of p on opts (defaults first); no check. */
static dt_status set_parts(const dt_strategy_entry *e, const spec_parts *p, void *opts) {
    memset(opts, 0, e->opts_size);
    if (e->defaults) e->defaults(opts);
    for (int i = 0; i < p->n; i++) {
        if (!dt_strategy_entry_takes(e, p->key[i])) return unknown_key(e, p->key[i]);
        for (int j = 0; j < i; j++)
            if (!strcmp(p->key[i], p->key[j]))
                return dt_error(DT_EINVAL, "`strategy` %s: option '%s' is given twice", e->name, p->key[i]);
        DT_TRY(e->set(opts, p->key[i], p->value[i]));
    }
    return DT_OK;
}

dt_status dt_strategy_parse(const char *spec, const dt_strategy_entry **entry, void *opts) {
    *entry = NULL;
    if (!spec) return dt_error(DT_EINVAL, "`strategy`: no strategy given (choose %s)", entry_names());
    spec_parts *p = malloc(sizeof *p);
    if (!p) return dt_error(DT_ENOMEM, "strategy spec: out of memory");
    const dt_strategy_entry *e = NULL;
    dt_status st = split_spec(spec, p);
    if (st == DT_OK) st = find_entry(p->name, &e);
    if (st == DT_OK && e->opts_size > sizeof(dt_strategy_opts))
        st = dt_error(DT_EINTERNAL, "strategy %s: options of %zu bytes do not fit dt_strategy_opts", e->name,
                      e->opts_size);
    if (st == DT_OK) st = set_parts(e, p, opts);
    if (st == DT_OK && e->check) st = e->check(opts);
    free(p);
    if (st == DT_OK) *entry = e;
    return st;
}

dt_status dt_strategy_spec_add(const char *spec, const char *key, const char *value, char *out, size_t cap) {
    spec_parts *p = malloc(sizeof *p);
    if (!p) return dt_error(DT_ENOMEM, "strategy spec: out of memory");
    const dt_strategy_entry *e = NULL;
    dt_status st = split_spec(spec, p);
    if (st == DT_OK) st = find_entry(p->name, &e);
    if (st == DT_OK && !dt_strategy_entry_takes(e, key)) st = unknown_key(e, key);
    int have = -1;
    for (int i = 0; st == DT_OK && i < p->n; i++)
        if (!strcmp(p->key[i], key)) have = i;
    if (st == DT_OK && have >= 0) { /* the same value as parsed? */
        dt_strategy_opts a, b;
        spec_parts one = {.n = 1};
        snprintf(one.key[0], sizeof one.key[0], "%s", key);
        snprintf(one.value[0], sizeof one.value[0], "%s", value);
        st = set_parts(e, &one, &a);
        snprintf(one.value[0], sizeof one.value[0], "%s", p->value[have]);
        if (st == DT_OK) st = set_parts(e, &one, &b);
        if (st == DT_OK && memcmp(&a, &b, e->opts_size) != 0)
            st = dt_error(DT_EINVAL, "`strategy` %s sets %s=%s", spec, key, p->value[have]);
    } else if (st == DT_OK && p->n == MAX_OPTS) {
        st = malformed(spec, "too many options");
    } else if (st == DT_OK) {
        snprintf(p->key[p->n], sizeof p->key[0], "%s", key);
        snprintf(p->value[p->n], sizeof p->value[0], "%s", value);
        p->n++;
    }
    size_t k = 0;
    if (st == DT_OK) k = (size_t)snprintf(out, cap, "%s(", e->name);
    for (int i = 0; st == DT_OK && i < p->n && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%s=%s", i ? "," : "", p->key[i], p->value[i]);
    if (st == DT_OK && k < cap) k += (size_t)snprintf(out + k, cap - k, ")");
    if (st == DT_OK && k >= cap) st = dt_error(DT_EINVAL, "`strategy` %s: the spec is too long", spec);
    free(p);
    return st;
}

dt_status dt_strategy_create_with(dt_strategy **out, const dt_strategy_entry *e, const void *opts, dt_comm *comm,
                                  dt_model *m, dt_optim *o, dt_trace *trace) {
    *out = NULL;
    if (e->needs_comm && !comm)
        return dt_error(DT_EINVAL, "`strategy` %s needs more than one rank (`workers` N, dtrain launch or mpirun)",
                        e->name);
    if (!e->needs_comm && comm)
        return dt_error(DT_EINVAL,
                        "`strategy` %s trains one process; with %d ranks use a strategy of more ranks "
                        "(ddp, localsgd or ps)",
                        e->name, dt_comm_size(comm));
    dt_strategy *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ENOMEM, "strategy: out of memory");
    s->comm = comm, s->model = m, s->optim = o, s->trace = trace;
    s->role = DT_ROLE_REPLICA;
    s->data_rank = dt_comm_rank(comm), s->data_world = dt_comm_size(comm);
    dt_status st = e->create(s, opts);
    if (st != DT_OK) {
        free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

dt_status dt_strategy_create(dt_strategy **out, const char *spec, dt_comm *comm, dt_model *m, dt_optim *o,
                             dt_trace *trace) {
    *out = NULL;
    dt_strategy_opts opts;
    const dt_strategy_entry *e;
    DT_TRY(dt_strategy_parse(spec, &e, &opts));
    return dt_strategy_create_with(out, e, &opts, comm, m, o, trace);
}

dt_status dt_strategy_placement(const dt_strategy_entry *e, const void *opts, const dt_model *m, int rank, int size,
                                dt_range **own, int *nown, bool *whole) {
    *own = NULL, *nown = 0, *whole = true;
    if (!e->place) return DT_OK;
    dt_status s = e->place(opts, m, rank, size, own, nown, whole);
    if (s != DT_OK || *whole) free(*own), *own = NULL, *nown = 0;
    return s;
}

dt_status dt_strategy_data_part(const dt_strategy_entry *e, const void *opts, int rank, int size, int *data_rank,
                                int *data_world) {
    *data_rank = rank, *data_world = size;
    if (e->data_part) e->data_part(opts, rank, size, data_rank, data_world);
    const int S = e->servers ? e->servers(opts) : 0;
    if (S <= 0) return DT_OK;
    if (S >= size)
        return dt_error(DT_EINVAL,
                        "`strategy` %s with %d server%s needs more than %d ranks (servers plus at least one "
                        "worker); this job has %d",
                        e->name, S, S > 1 ? "s" : "", S, size);
    *data_world = size - S;
    *data_rank = rank >= S ? rank - S : 0;
    return DT_OK;
}

bool dt_strategy_hands_out_batches(const dt_strategy *s) { return s->ops->first_unit && s->ops->next_unit; }

dt_status dt_strategy_parse_balance(const char *strategy, const char *value, bool *dynamic) {
    if (!strcmp(value, "dynamic") || !strcmp(value, "static")) {
        *dynamic = !strcmp(value, "dynamic");
        return DT_OK;
    }
    return dt_error(DT_EINVAL,
                    "`strategy` %s: balance=%s: choose static (every rank its equal share of each "
                    "global batch) or dynamic (each global batch cut by the ranks' measured speed)",
                    strategy, value);
}
