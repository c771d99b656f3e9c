/* Test helpers of the MPI tests (transport_mpi_test, transport_mpi_inband_test, comm_mpi_test):
 * a program run plainly starts itself under mpirun and counts the ranks that passed in their
 * output; under mpirun, transport tests drive the transport's vtable as the communicator does. */
#ifndef DT_COMM_MPI_TESTLIB_H
#define DT_COMM_MPI_TESTLIB_H

#include "comm/transport.h"
#include "core/test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Before a program starts itself under mpirun: 0, or 77 after saying why when mpirun is not
 * installed. Sets what every launch needs: OpenMPI's own leaks at exit off under ASan (memory
 * errors are still checked) and mpirun allowed to run as root. */
static inline int dt_mpi_test_launch_env(void) {
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("skip: mpirun not found (install openmpi-bin)\n");
        return 77;
    }
    char asan[512];
    snprintf(asan, sizeof asan, "%s%sdetect_leaks=0", getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "",
             getenv("ASAN_OPTIONS") ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    return 0;
}

/* Runs this program as `timeout -k 5 LIMIT mpirun -np NP FLAGS SELF ARGS` and reads its output
 * (stdout and stderr, at most cap - 1 bytes) into out. Returns mpirun's exit status, 128 when it
 * ended by a signal, -1 when it could not start. */
static inline int dt_mpi_test_mpirun(int np, int limit_s, const char *flags, const char *args, char *out, size_t cap) {
    char cmd[1024], self[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = 0;
    snprintf(cmd, sizeof cmd, "timeout -k 5 %d mpirun -np %d %s %s %s 2>&1", limit_s, np, flags, self, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t len = fread(out, 1, cap - 1, p);
    out[len] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* How many times marker (e.g. a rank's "checks, 0 failures") occurs in out. */
static inline int dt_mpi_test_count(const char *out, const char *marker) {
    int k = 0;
    for (const char *p = out; (p = strstr(p, marker)); p++) k++;
    return k;
}

static uint64_t dt_mpi_test_seq; /* sequence number of the last op dt_mpi_test_coll posted */

/* Runs one native collective through t's vtable as the communicator does: begin, then coll
 * (the next sequence number, a 30 s deadline). */
static inline dt_status dt_mpi_test_coll(dt_transport *t, int op, dt_dtype dt, dt_redop rop, int root, size_t count,
                                         const void *send, void *recv, const size_t *counts, const size_t *displs) {
    dt_coll_args a = {.d = {.seq = ++dt_mpi_test_seq,
                            .op = (uint8_t)op,
                            .dtype = (uint8_t)dt,
                            .redop = (uint8_t)rop,
                            .root = root,
                            .count = count},
                      .send = send,
                      .recv = recv,
                      .counts = counts,
                      .displs = displs,
                      .algo = DT_ALGO_NATIVE,
                      .deadline = dt_now() + 30};
    DT_TRY(t->ops->begin(t, &a.d));
    return t->ops->coll(t, &a);
}

/* A fresh transport over all of w's ranks (split `id`), for an error case that breaks its own
 * transport; NULL after a failed check. */
static inline dt_transport *dt_mpi_test_fresh(dt_transport *w, uint64_t id) {
    int members[64];
    for (int r = 0; r < w->size && r < 64; r++) members[r] = r;
    dt_transport *s = NULL;
    CHECK_OK(w->ops->split(w, 0, members, w->size, w->rank, id, dt_now() + 30, &s));
    return s;
}

#endif
