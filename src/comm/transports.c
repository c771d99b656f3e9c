/* The transport registry (NCCL's ncclTransports[], redis's connTypeRegister): every transport is
 * one entry {name, help, options, probe, create} defined in its own file; this file lists them
 * (DT_TRANSPORT_KINDS, in the automatic choice's order), finds them by name, runs the automatic
 * choice, and writes the help text the CLI and the man page show. "self" (one process, no
 * transport) is an entry too, so every name a user can give is here. */
#include "comm/transport.h"

#include <stdio.h>
#include <string.h>

/* One process: no transport at all (the communicator's collectives copy in place). */
static bool self_probe(const dt_transport_params *p, char *why, size_t n) {
    if (p->size == 1) return true;
    snprintf(why, n, "runs one process, the job has %d", p->size);
    return false;
}
static dt_status self_create(dt_transport **out, const dt_transport_params *p) {
    *out = NULL;
    if (p->size != 1) return dt_error(DT_EINVAL, "backend 'self' runs one process but the world size is %d", p->size);
    return DT_OK;
}
const dt_transport_kind dt_transport_kind_self = {
    .name = "self",
    .help = "one process, no transport",
    .options = "",
    .probe = self_probe,
    .create = self_create,
};

/* The registry: a transport is its file plus its name here. Order = preference of the automatic
 * choice (a device-memory transport before the host ones, mpi before shm under mpirun). */
#define DT_TRANSPORT_KINDS(X) X(nccl) X(mpi) X(shm) X(self)

#define DT_KIND_DECL(n) extern const dt_transport_kind dt_transport_kind_##n;
#define DT_KIND_REF(n) &dt_transport_kind_##n,
DT_TRANSPORT_KINDS(DT_KIND_DECL)
static const dt_transport_kind *const g_kinds[] = {DT_TRANSPORT_KINDS(DT_KIND_REF)};
#define N_KINDS ((int)(sizeof g_kinds / sizeof *g_kinds))

const dt_transport_kind *const *dt_transport_kinds(int *n) {
    *n = N_KINDS;
    return g_kinds;
}

/* "shm, mpi, nccl or self" */
static void name_list(char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < N_KINDS && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s",
                                i == 0             ? ""
                                : i == N_KINDS - 1 ? " or "
                                                   : ", ",
                                g_kinds[i]->name);
}

dt_status dt_transport_find(const char *spec, const dt_transport_kind **out, const char **options) {
    const char *colon = spec ? strchr(spec, ':') : NULL;
    size_t len = spec ? (colon ? (size_t)(colon - spec) : strlen(spec)) : 0;
    if (options) *options = colon ? colon + 1 : "";
    *out = NULL;
    for (int i = 0; i < N_KINDS && !*out; i++)
        if (len && strlen(g_kinds[i]->name) == len && !strncmp(spec, g_kinds[i]->name, len)) *out = g_kinds[i];
    if (*out) return DT_OK;
    char names[160];
    name_list(names, sizeof names);
    return dt_error(DT_EINVAL, "unknown transport '%s' (expected auto, %s)", spec ? spec : "", names);
}

dt_status dt_transport_choose(const dt_transport_params *p, const dt_transport_kind **out) {
    char why[N_KINDS][200], all[1024];
    for (int i = 0; i < N_KINDS; i++) {
        why[i][0] = 0;
        if (g_kinds[i]->probe(p, why[i], sizeof why[i])) {
            *out = g_kinds[i];
            return DT_OK;
        }
    }
    *out = NULL;
    size_t len = 0;
    for (int i = 0; i < N_KINDS && len < sizeof all; i++)
        len += (size_t)snprintf(all + len, sizeof all - len, "%s%s: %s", i ? "; " : "", g_kinds[i]->name, why[i]);
    return dt_error(DT_ENOTSUP, "no transport can run this job of %d ranks (%s)", p->size, all);
}

dt_status dt_transport_create(const dt_transport_kind *kind, dt_transport **out, const dt_transport_params *p) {
    *out = NULL;
    if (p->options && *p->options && !*kind->options)
        return dt_error(DT_EINVAL, "the %s transport takes no options, got '%s'", kind->name, p->options);
    return kind->create(out, p);
}

/* ---- the public side (dtrain/comm.h) ---- */

const char *dt_comm_transport_help(void) {
    static char buf[1024];
    if (buf[0]) return buf;
    size_t len = (size_t)snprintf(buf, sizeof buf, "auto (the first of");
    for (int i = 0; i < N_KINDS; i++) len += (size_t)snprintf(buf + len, sizeof buf - len, " %s", g_kinds[i]->name);
    len += (size_t)snprintf(buf + len, sizeof buf - len, " that can run the job)");
    for (int i = 0; i < N_KINDS && len < sizeof buf; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "; %s%s%s%s: %s", g_kinds[i]->name,
                                *g_kinds[i]->options ? "[:" : "", g_kinds[i]->options, *g_kinds[i]->options ? "]" : "",
                                g_kinds[i]->help);
    return buf;
}

const char *dt_comm_transport_names(void) {
    static char buf[160];
    if (!buf[0]) name_list(buf, sizeof buf);
    return buf;
}

dt_status dt_comm_transport_check(const char *spec) {
    if (spec && !strcmp(spec, "auto")) return DT_OK;
    const char *opts;
    const dt_transport_kind *k;
    DT_TRY(dt_transport_find(spec, &k, &opts));
    if (*opts && !*k->options) return dt_error(DT_EINVAL, "the %s transport takes no options, got '%s'", k->name, opts);
    return DT_OK;
}
