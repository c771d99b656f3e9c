/* Communicator lifetime: explicit creation (rank/size/job id), creation from the environment
 * (dtrain launch -> shm, mpirun/srun -> mpi, nothing -> one process), split into
 * sub-communicators, destroy, and the small queries. */
#include "comm/comm_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_comm_config dt_comm_config_default(void) {
    dt_comm_config c;
    memset(&c, 0, sizeof c);
    c.size = 1;
    c.backend = DT_BACKEND_AUTO;
    c.algo = DT_ALGO_AUTO;
    return c;
}

static dt_status env_int(const char *name, int lo, int *out, bool *found) {
    const char *e = getenv(name);
    *found = e && *e;
    if (!*found) return DT_OK;
    char *end;
    errno = 0;
    long v = strtol(e, &end, 10);
    if (errno || *end || v < lo || v > 1 << 24)
        return dt_error(DT_EINVAL, "environment variable %s='%s' is not a valid number (>= %d)", name, e, lo);
    *out = (int)v;
    return DT_OK;
}

static dt_status resolve_timeout(double cfg, double *out) {
    if (cfg > 0) {
        *out = cfg;
        return DT_OK;
    }
    *out = 300;
    const char *e = getenv("DTRAIN_TIMEOUT");
    if (e && *e) {
        char *end;
        double v = strtod(e, &end);
        if (*end || !(v > 0)) return dt_error(DT_EINVAL, "DTRAIN_TIMEOUT='%s' is not a positive number of seconds", e);
        *out = v;
    }
    return DT_OK;
}

static dt_status comm_new(dt_comm **out, int rank, int size, const dt_transport_kind *kind, dt_transport *t,
                          dt_comm_algo algo, double timeout, const char *knob) {
    dt_comm *c = calloc(1, sizeof *c);
    if (!c) return dt_error(DT_ENOMEM, "out of memory creating a communicator");
    c->rank = rank;
    c->size = size;
    c->kind = kind;
    c->t = t;
    c->algo = algo;
    c->timeout_s = timeout;
    snprintf(c->timeout_knob, sizeof c->timeout_knob, "%s", knob);
    if (t) snprintf(t->timeout_knob, sizeof t->timeout_knob, "%s", knob);
    c->seg_bytes = 256 << 10;
    const char *seg = getenv("DTRAIN_COMM_SEG");
    if (seg && atol(seg) >= 4096) c->seg_bytes = (size_t)atol(seg);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = c;
    return DT_OK;
}

static dt_status resolve_algo(dt_comm_algo cfg, dt_comm_algo *out) {
    *out = cfg;
    if (cfg != DT_ALGO_AUTO) return DT_OK;
    const char *e = getenv("DTRAIN_COMM_ALGO");
    if (e && *e && dt_comm_algo_parse(e, out) != DT_OK) return dt_error_wrap(DT_EINVAL, "DTRAIN_COMM_ALGO");
    return DT_OK;
}

/* *kind = the registry entry cfg names (transport, else a backend other than AUTO), else the first
 * whose probe accepts p; *opts gets the spec's options. */
static dt_status pick_kind(const dt_comm_config *d, const dt_transport_params *p, const dt_transport_kind **kind,
                           const char **opts) {
    const char *spec = d->transport && *d->transport && strcmp(d->transport, "auto") ? d->transport
                       : d->backend != DT_BACKEND_AUTO                               ? dt_backend_name(d->backend)
                                                                                     : NULL;
    *opts = "";
    return spec ? dt_transport_find(spec, kind, opts) : dt_transport_choose(p, kind);
}

/* dt_comm_create, with who started the ranks (the automatic choice's input) */
static dt_status comm_create(dt_comm **out, const dt_comm_config *cfg, dt_launcher launcher) {
    *out = NULL;
    dt_comm_config d = cfg ? *cfg : dt_comm_config_default();
    if (d.size < 1 || d.rank < 0 || d.rank >= d.size)
        return dt_error(DT_EINVAL, "rank %d is out of range for world size %d", d.rank, d.size);
    double timeout;
    dt_comm_algo algo;
    DT_TRY(resolve_timeout(d.timeout_s, &timeout));
    const char *knob = d.timeout_knob    ? d.timeout_knob
                       : d.timeout_s > 0 ? "dt_comm_config.timeout_s"
                                         : "DTRAIN_TIMEOUT";
    DT_TRY(resolve_algo(d.algo, &algo));
    dt_transport_params p = {.rank = d.rank,
                             .size = d.size,
                             .local_rank = d.local_rank,
                             .job_id = d.job_id,
                             .timeout_s = timeout,
                             .device = d.device,
                             .launcher = launcher};
    const dt_transport_kind *kind;
    DT_TRY(pick_kind(&d, &p, &kind, &p.options));
    dt_transport *t = NULL;
    DT_TRY(dt_transport_create(kind, &t, &p));
    if (t && d.size > 1 && t->size != d.size) {
        int got = t->size;
        t->ops->destroy(t);
        return dt_error(DT_EMISMATCH,
                        "the MPI world has %d rank(s) but the job expects %d: start the ranks with "
                        "mpirun/srun -n %d (dtrain launch starts shm jobs)",
                        got, d.size, d.size);
    }
    int rank = t ? t->rank : 0, size = t ? t->size : 1;
    dt_status st = comm_new(out, rank, size, kind, t, algo, timeout, knob);
    if (st != DT_OK && t) t->ops->destroy(t);
    if (st == DT_OK) dt_log_set_rank(rank);
    return st;
}

dt_status dt_comm_create(dt_comm **out, const dt_comm_config *cfg) { return comm_create(out, cfg, DT_LAUNCH_NONE); }

/* rank and world size variables of the launchers we understand, in order of preference */
static const char *const g_launchers[][2] = {
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"}, {"SLURM_PROCID", "SLURM_NTASKS"}};
#define N_LAUNCHERS ((int)(sizeof g_launchers / sizeof *g_launchers))

static bool env_set(const char *name) {
    const char *e = getenv(name);
    return e && *e;
}

bool dt_comm_env_is_rank(void) {
    if (env_set("DTRAIN_RANK") || env_set("DTRAIN_WORLD_SIZE")) return true;
    for (int i = 0; i < N_LAUNCHERS; i++)
        if (env_set(g_launchers[i][0]) && env_set(g_launchers[i][1])) return true;
    return false;
}

bool dt_comm_job_id_valid(const char *id) {
    if (!id || !*id || strlen(id) > DT_COMM_JOB_ID_MAX) return false;
    for (const char *p = id; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '.') return false;
    return true;
}

/* a job id for shm under mpirun/srun (all ranks on one host): DTRAIN_JOB_ID or the launcher's */
static void launcher_job_id(char *out, size_t n) {
    const char *v = getenv("DTRAIN_JOB_ID");
    if (!v || !*v) v = getenv("PMIX_NAMESPACE");
    if (!v || !*v) v = getenv("OMPI_MCA_ess_base_jobid");
    if (!v || !*v) v = getenv("SLURM_JOB_ID");
    snprintf(out, n, "%s", v && *v ? v : "mpi");
    for (char *p = out; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '.') *p = '_'; /* dt_comm_job_id_valid */
}

/* cfg's explicit transport name ("shm:..." -> "shm"), or NULL when the choice is automatic */
static const char *named_transport(const dt_comm_config *d, char *buf, size_t n) {
    const char *spec = d->transport && *d->transport && strcmp(d->transport, "auto") ? d->transport
                       : d->backend != DT_BACKEND_AUTO                               ? dt_backend_name(d->backend)
                                                                                     : NULL;
    if (!spec) return NULL;
    snprintf(buf, n, "%.*s", (int)strcspn(spec, ":"), spec);
    return buf;
}

dt_status dt_comm_create_from_env(dt_comm **out, const dt_comm_config *cfg) {
    *out = NULL;
    dt_comm_config d = cfg ? *cfg : dt_comm_config_default();
    int rank = 0, size = 1, local = 0;
    bool fr, fs, fl;
    dt_launcher found = DT_LAUNCH_NONE;
    DT_TRY(env_int("DTRAIN_RANK", 0, &rank, &fr));
    DT_TRY(env_int("DTRAIN_WORLD_SIZE", 1, &size, &fs));
    DT_TRY(env_int("DTRAIN_LOCAL_RANK", 0, &local, &fl));
    if (fr != fs)
        return dt_error(DT_EINVAL,
                        "DTRAIN_RANK and DTRAIN_WORLD_SIZE must be set together (start workers with 'dtrain launch')");
    if (fs) found = DT_LAUNCH_LOCAL;
    for (int i = 0; i < N_LAUNCHERS && found == DT_LAUNCH_NONE; i++) {
        DT_TRY(env_int(g_launchers[i][0], 0, &rank, &fr));
        DT_TRY(env_int(g_launchers[i][1], 1, &size, &fs));
        if (fr && fs) found = DT_LAUNCH_MPI;
    }
    if (!fl) local = rank;
    char job[220], name[32];
    const char *jid = getenv("DTRAIN_JOB_ID");
    if (found == DT_LAUNCH_MPI || !jid) launcher_job_id(job, sizeof job);
    else snprintf(job, sizeof job, "%s", jid);
    const char *named = named_transport(&d, name, sizeof name);
    bool shm_job = named ? !strcmp(named, "shm") : found == DT_LAUNCH_LOCAL;
    if (shm_job && found == DT_LAUNCH_LOCAL && (!jid || !*jid) && size > 1)
        return dt_error(DT_EINVAL,
                        "DTRAIN_WORLD_SIZE=%d but DTRAIN_JOB_ID is not set (start workers with 'dtrain launch')", size);
    if (named && !strcmp(named, "shm") && size == 1) d.transport = "self", d.backend = DT_BACKEND_AUTO;
    if (named && !strcmp(named, "self") && size > 1)
        return dt_error(DT_EINVAL, "backend 'self' runs one process but the environment says world size %d", size);
    d.rank = rank;
    d.size = size;
    d.local_rank = local;
    d.job_id = job;
    return comm_create(out, &d, found);
}

void dt_comm_destroy(dt_comm *c) {
    if (!c) return;
    dt_comm_stop_thread(c);
    dt_comm_hier_free(c->hier);
    if (c->t) c->t->ops->destroy(c->t);
    for (int i = 0; i < 2; i++) dt_free(c->scratch.buf[i]);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->world_of);
    free(c);
}

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : 0; }
int dt_comm_size(const dt_comm *c) { return c ? c->size : 1; }
bool dt_comm_device_native(const dt_comm *c, const char *device) {
    if (!c || !c->t || !c->t->ops->device_native || dt_comm_hier_active(c)) return false;
    return c->t->ops->device_native(c->t, device);
}

void dt_comm_set_stream(dt_comm *c, void *stream) {
    if (!c || !c->t || !c->t->ops->set_stream) return;
    dt_comm_acquire(c); /* after every queued op: the progress thread is not inside the transport */
    c->t->ops->set_stream(c->t, stream);
    dt_comm_release(c);
}

int dt_comm_host_cpus(const dt_comm *c, int *ranks) {
    *ranks = 0;
    if (!c || !c->t || !c->t->ops->host_cpus) return 0;
    return c->t->ops->host_cpus(c->t, ranks);
}
const char *dt_comm_backend_name(const dt_comm *c) { return c && c->t ? c->t->ops->name : "self"; }
void dt_comm_set_algo(dt_comm *c, dt_comm_algo algo) {
    if (c && (unsigned)algo < DT_ALGO_COUNT) c->algo = algo;
}

dt_status dt_comm_split(dt_comm *c, int color, int key, dt_comm **out) {
    *out = NULL;
    if (!c) return dt_error(DT_EINVAL, "dt_comm_split: communicator is NULL");
    if (color < 0) color = DT_COMM_UNDEFINED;
    int32_t mine[2] = {color, key};
    int32_t *all = malloc((size_t)c->size * sizeof mine);
    int *members = malloc((size_t)c->size * sizeof *members);
    if (!all || !members) {
        free(all);
        free(members);
        return dt_error(DT_ENOMEM, "dt_comm_split: out of memory");
    }
    dt_status st = dt_comm_allgather_bytes(c, mine, all, sizeof mine, DT_COLL_SPLIT);
    uint64_t id = ++c->splits;
    int n = 0, me = -1;
    if (st == DT_OK && color >= 0) {
        for (int r = 0; r < c->size; r++) { /* members of my color ordered by (key, rank) */
            if (all[2 * r] != color) continue;
            int i = n++;
            while (i > 0 && all[2 * members[i - 1] + 1] > all[2 * r + 1]) {
                members[i] = members[i - 1];
                i--;
            }
            members[i] = r;
        }
        for (int i = 0; i < n; i++)
            if (members[i] == c->rank) me = i;
        dt_transport *nt = NULL;
        if (c->t) {
            if (!c->t->ops->split) st = dt_error(DT_ENOTSUP, "the %s transport cannot split", c->t->ops->name);
            else {
                dt_comm_acquire(c);
                st = dt_comm_fail(c, c->t->ops->split(c->t, color, members, n, me, id, dt_now() + c->timeout_s, &nt));
                dt_comm_release(c);
            }
        }
        if (st == DT_OK) {
            st = comm_new(out, me, n, c->kind, nt, c->algo, c->timeout_s, c->timeout_knob);
            if (st != DT_OK && nt) nt->ops->destroy(nt);
            if (st == DT_OK && !((*out)->world_of = malloc((size_t)n * sizeof(int)))) {
                dt_comm_destroy(*out);
                *out = NULL;
                st = dt_error(DT_ENOMEM, "dt_comm_split: out of memory");
            }
            for (int i = 0; st == DT_OK && i < n; i++)
                (*out)->world_of[i] = c->world_of ? c->world_of[members[i]] : members[i];
        }
    }
    free(all);
    free(members);
    return st;
}
