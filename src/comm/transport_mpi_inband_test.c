/* Test of the MPI transport's in-band op check (transport_mpi_check.c): a native allreduce or
 * allgather small enough carries check words in its own data instead of a descriptor message.
 * Mismatches MPI itself completes (the same bytes: another reduction op, another dtype of the same
 * size) must come out as DT_EMISMATCH naming both calls, and so must those that hang MPI (another
 * count, a barrier against an allreduce: the stalled op sends its descriptor after
 * DT_MPI_PROBE_S), within seconds, not at the deadline. Run plainly, it starts itself under
 * mpirun with 3 ranks; each case runs on a fresh transport (a mismatch breaks its own). Exit 77
 * when built without MPI or without mpirun. */
#include "comm/mpi_testlib.h"
#include "core/test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DT_HAVE_MPI
int main(void) {
    printf("skip: built without MPI (install libopenmpi-dev and rebuild)\n");
    return 77;
}
#else

/* The last rank calls op[1], the others op[0]; every rank's error names `want`. */
typedef struct {
    int op[2];
    dt_dtype dt[2];
    dt_redop rop[2];
    size_t n[2];
    const char *want;
} inband_case;

static const inband_case k_cases[] = {
    {{DT_COLL_ALLREDUCE, DT_COLL_ALLREDUCE},
     {DT_F32, DT_F32},
     {DT_OP_SUM, DT_OP_MAX},
     {4, 4},
     "allreduce(f32 x 4, max)"},
    {{DT_COLL_ALLGATHER, DT_COLL_ALLGATHER}, {DT_F32, DT_I32}, {0, 0}, {3, 3}, "allgather(i32 x 3)"},
    {{DT_COLL_ALLREDUCE, DT_COLL_ALLREDUCE},
     {DT_I32, DT_I32},
     {DT_OP_MIN, DT_OP_MIN},
     {4, 2},
     "allreduce(i32 x 2, min)"},
    {{DT_COLL_ALLREDUCE, DT_COLL_BARRIER}, {DT_F32, DT_F32}, {DT_OP_SUM, 0}, {4, 0}, "barrier"},
};

/* One case on a fresh transport split off w (id 20 + c). */
static void run_case(dt_transport *w, int c) {
    const int R = w->rank, N = w->size;
    const inband_case *k = &k_cases[c];
    dt_transport *s = dt_mpi_test_fresh(w, 20 + (uint64_t)c);
    if (!s) return;
    int odd = R == N - 1;
    float big[8] = {0}, got[8 * 8];
    int y[4] = {0};
    dt_coll_args b = {.d = {.seq = 1,
                            .op = (uint8_t)k->op[odd],
                            .dtype = (uint8_t)k->dt[odd],
                            .redop = (uint8_t)k->rop[odd],
                            .count = k->n[odd],
                            .root = -1},
                      .send = big,
                      .recv = got,
                      .algo = DT_ALGO_NATIVE,
                      .deadline = dt_now() + 10};
    double t0 = dt_now();
    dt_status st = s->ops->begin(s, &b.d);
    if (st == DT_OK) st = s->ops->coll(s, &b);
    if (st == DT_OK) { /* finished its part with garbage: it hears it in its next wait */
        dt_treq q = {0}, *qp = &q;
        CHECK_OK(s->ops->irecv(s, (R + 1) % N, 1, y, 4, &q));
        st = s->ops->waitall(s, &qp, 1, dt_now() + 10);
    }
    CHECK_MSG(st == DT_EMISMATCH && strstr(dt_last_error(), k->want) && strstr(dt_last_error(), "but "),
              "case %d rank %d: %s %s", c, R, dt_status_str(st), dt_last_error());
    CHECK_MSG(dt_now() - t0 < 5, "case %d rank %d: the mismatch took %.1f s", c, R, dt_now() - t0);
    printf("rank %d in-band %d: %s\n", R, c, dt_last_error());
    /* s is broken and left as it is, like a communicator after a mismatch */
}

static int rank_main(void) {
    dt_transport *w = NULL;
    CHECK_OK(dt_transport_mpi_create(&w, &(dt_transport_params){.timeout_s = 30}));
    if (!w) return dt_test_summary("transport_mpi_inband_test");
    for (int c = 0; c < (int)(sizeof k_cases / sizeof *k_cases); c++) run_case(w, c);
    printf("in-band rank %d: %d checks, %d failures\n", w->rank, dt_test_checks, dt_test_failures);
    fflush(stdout);
    /* everyone has reported before anyone exits (a rank leaving without MPI_Finalize makes mpirun
     * kill the rest) */
    CHECK_OK(dt_mpi_test_coll(w, DT_COLL_BARRIER, DT_F32, DT_OP_SUM, -1, 0, NULL, NULL, NULL, NULL));
    w->ops->destroy(w);
    return dt_test_failures ? 1 : 0;
}

int main(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE")) return rank_main();
    int skip = dt_mpi_test_launch_env();
    if (skip) return skip;
    static char out[1 << 16];
    double t0 = dt_now();
    /* a process whose transport failed leaves without MPI_Finalize: mpirun's status is not checked */
    dt_mpi_test_mpirun(3, 90, "--quiet --oversubscribe --bind-to none --mca btl self,vader,tcp", "", out, sizeof out);
    int passed = dt_mpi_test_count(out, "checks, 0 failures");
    CHECK_MSG(passed == 3, "in-band mismatches: %d of 3 ranks passed:\n%s", passed, out);
    printf("in-band mismatches, 3 ranks: %s (%.1f s)\n", passed == 3 ? "passed" : "FAILED", dt_now() - t0);
    return dt_test_summary("transport_mpi_inband_test");
}
#endif
