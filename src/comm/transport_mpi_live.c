/* Dead-peer detection for the MPI transport. Open MPI 4.1 (no ULFM) reports nothing when a peer
 * process dies: a receive from it, or a collective with it, simply never completes (measured
 * with vader and tcp), so a wait alone would end only at its deadline (--timeout, 300 s by
 * default). So once, when the world transport is created, every rank publishes who it is as a
 * process: pid, start time and a host key (kernel boot id + pid namespace). A waiting rank that
 * shares the host key with a peer it waits for asks the kernel every DT_MPI_LIVE_PERIOD whether
 * that process still runs (kill(pid, 0); /proc/PID/stat for a zombie or a reused pid), the way
 * the shm transport watches its peers. Peers on other hosts are caught by the deadline only. */
#include "comm/transport.h"

#ifdef DT_HAVE_MPI
#include "comm/transport_mpi.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    int32_t pid;
    int32_t pad;
    uint64_t start; /* start time in clock ticks since boot (/proc/PID/stat field 22) */
    char host[80];  /* boot id + pid namespace; "" when unknown (no checks) */
} ident;

static ident *g_id; /* [world size], filled once; read-only afterwards */
static int g_nid, g_me;

/* State and start time of process pid from /proc; false when it has no entry. */
static bool proc_stat(int pid, char *state, uint64_t *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ') return false;
    *state = p[2];
    /* after ") S": fields 4..22; the start time is the 20th of them */
    p += 3;
    for (int field = 4; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    *start = p ? strtoull(p, NULL, 10) : 0;
    return true;
}

static void self_ident(ident *me) {
    memset(me, 0, sizeof *me);
    me->pid = (int32_t)getpid();
    char state = 0, boot[40] = "";
    /* /proc must be this pid namespace's (its stat of our pid exists) for the checks to mean anything */
    if (!proc_stat(me->pid, &state, &me->start)) return;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return;
    bool got = fgets(boot, sizeof boot, f) != NULL;
    fclose(f);
    boot[strcspn(boot, "\n")] = 0;
    struct stat ns;
    if (!got || !boot[0] || stat("/proc/self/ns/pid", &ns) != 0) return;
    snprintf(me->host, sizeof me->host, "%.36s/%llx:%llx", boot, (unsigned long long)ns.st_dev,
             (unsigned long long)ns.st_ino);
}

dt_status dt_mpi_live_init(MPI_Comm comm, double deadline) {
    if (g_id) return DT_OK;
    int size = 0, rank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    ident *all = calloc((size_t)size + 1, sizeof *all), *me = all + size; /* everyone's, then ours to send */
    if (!all) return dt_error(DT_ENOMEM, "out of memory creating the MPI transport");
    self_ident(me);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(me, (int)sizeof *me, MPI_BYTE, all, (int)sizeof *me, MPI_BYTE, comm, &req);
    dt_mpi_idle idle = {0};
    int flag = 0;
    while (rc == MPI_SUCCESS && !flag) {
        rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || flag) break;
        if (dt_now() > deadline) {
            g_id = all; /* kept, never read (g_nid stays 0): the posted request still uses it */
            return dt_error(DT_ETIMEDOUT,
                            "rank %d: timed out exchanging process ids at MPI start-up: a rank did "
                            "not start or is stalled",
                            rank);
        }
        dt_mpi_backoff(&idle);
    }
    if (rc != MPI_SUCCESS) {
        char e[256];
        free(all);
        return dt_error(DT_EPEER, "rank %d: exchanging process ids at MPI start-up failed: %s", rank,
                        dt_mpi_errstr(rc, e, sizeof e));
    }
    for (int r = 0; r < size; r++) all[r].host[sizeof all[r].host - 1] = 0;
    g_id = all, g_nid = size, g_me = rank;
    return DT_OK;
}

void dt_mpi_live_free(void) {
    if (g_nid == 0) return; /* never filled (or a timed-out exchange still owns it) */
    free(g_id);
    g_id = NULL;
    g_nid = 0;
}

int *dt_mpi_live_ranks(MPI_Comm comm, int size) {
    int *mine = malloc((size_t)size * sizeof *mine), *world = malloc((size_t)size * sizeof *world);
    if (!mine || !world) {
        free(mine);
        free(world);
        return NULL;
    }
    for (int r = 0; r < size; r++) mine[r] = r;
    MPI_Group g, wg;
    MPI_Comm_group(comm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    if (MPI_Group_translate_ranks(g, size, mine, wg, world) != MPI_SUCCESS)
        for (int r = 0; r < size; r++) world[r] = MPI_UNDEFINED;
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    free(mine);
    return world;
}

/* Whether the process p (on this host) no longer runs: exited and reaped, a zombie, or its pid
 * now belongs to a newer process. */
static bool gone(const ident *p) {
    if (kill(p->pid, 0) != 0 && errno == ESRCH) return true;
    char state = 0;
    uint64_t start = 0;
    if (!proc_stat(p->pid, &state, &start)) return true; /* reaped meanwhile */
    return state == 'Z' || state == 'X' || start != p->start;
}

int dt_mpi_peer_gone(const dt_mpi_transport *t, int peer) {
    if (!g_id || !t->world || peer < 0 || peer >= t->base.size) return 0;
    int w = t->world[peer];
    if (w < 0 || w >= g_nid || w == g_me) return 0;
    const ident *p = &g_id[w];
    if (!p->host[0] || p->pid <= 0 || strcmp(p->host, g_id[g_me].host) != 0) return 0;
    return gone(p) ? p->pid : 0;
}

int dt_mpi_any_gone(const dt_mpi_transport *t, int *pid) {
    for (int r = 0; r < t->base.size; r++) {
        if (r == t->base.rank) continue;
        int p = dt_mpi_peer_gone(t, r);
        if (p) {
            *pid = p;
            return r;
        }
    }
    return -1;
}

bool dt_mpi_world_lost(void) {
    for (int r = 0; r < g_nid; r++) {
        const ident *p = &g_id[r];
        if (r == g_me || !p->host[0] || p->pid <= 0 || strcmp(p->host, g_id[g_me].host) != 0) continue;
        if (gone(p)) return true;
    }
    return false;
}

#else
typedef int dt_transport_mpi_live_unused; /* built without MPI: see transport_mpi.c */
#endif
