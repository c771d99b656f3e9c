/* The communicator over MPI (nccl-tests style, every rank computes the expected result): the
 * public dt_comm API created from the mpirun environment, every collective with each algorithm
 * that applies (native MPI and the communicator's own ring / recursive doubling / halving-
 * doubling / tree over MPI point-to-point), several dtypes and reduction ops, in-place forms,
 * non-blocking ops on the progress thread, split and tagged point-to-point. Inputs are small
 * integers so every result is exact and compared bit for bit.
 * Run plainly it starts itself with mpirun -np 2, 3 and 4; exit 77 when built without MPI. */
#include "comm/comm_testlib.h"
#include "comm/mpi_testlib.h"
#include "core/test.h"
#include "dtrain/comm.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int R, N;

/* index of the first element of a reduction result that differs, -1 if none; off = first index */
static long bad_reduce(const void *p, dt_dtype t, dt_redop op, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (dt_test_get(p, t, i) != dt_test_expect(op, t, N, off + i)) return (long)i;
    return -1;
}

static long bad_move(const void *p, dt_dtype t, int r, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (dt_test_get(p, t, i) != dt_test_vmove(r, off + i)) return (long)i;
    return -1;
}

static const dt_dtype g_types[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64};
static const dt_redop g_ops[] = {DT_OP_SUM, DT_OP_AVG, DT_OP_MAX, DT_OP_MIN, DT_OP_PROD};

static void test_reductions(dt_comm *c, unsigned char *a, unsigned char *b) {
    static const dt_comm_algo algos[] = {DT_ALGO_AUTO, DT_ALGO_NATIVE, DT_ALGO_RING, DT_ALGO_RD, DT_ALGO_RHD};
    static const size_t counts[] = {1, 1021, 40000};
    for (int al = 0; al < 5; al++) {
        dt_comm_set_algo(c, algos[al]);
        const char *an = dt_comm_algo_name(algos[al]);
        for (int ti = 0; ti < 6; ti++)
            for (int oi = 0; oi < 5; oi++)
                for (int ci = 0; ci < 3; ci++) {
                    dt_dtype t = g_types[ti];
                    dt_redop op = g_ops[oi];
                    size_t n = counts[ci];
                    bool inplace = ci == 1;
                    for (size_t i = 0; i < n; i++) dt_test_put(a, t, i, dt_test_input(op, R, i));
                    CHECK_OK(dt_comm_allreduce(c, a, inplace ? a : b, n, t, op));
                    long bad = bad_reduce(inplace ? a : b, t, op, 0, n);
                    CHECK_MSG(bad < 0, "allreduce %s %s %s n=%zu: [%ld]", an, dt_dtype_name(t), dt_redop_name(op), n,
                              bad);
                }
        /* reduce (root N-1, in place at the root) and reduce_scatter (in place) */
        for (int ti = 0; ti < 6; ti += 2)
            for (int oi = 0; oi < 2; oi++) {
                dt_dtype t = g_types[ti];
                dt_redop op = g_ops[oi];
                size_t n = 1021;
                int root = N - 1;
                for (size_t i = 0; i < n; i++) dt_test_put(a, t, i, dt_test_input(op, R, i));
                CHECK_OK(dt_comm_reduce(c, a, R == root ? a : NULL, n, t, op, root));
                if (R == root)
                    CHECK_MSG(bad_reduce(a, t, op, 0, n) < 0, "reduce %s %s %s", an, dt_dtype_name(t),
                              dt_redop_name(op));
                for (int inplace = 0; inplace < 2; inplace++) {
                    for (size_t i = 0; i < n * (size_t)N; i++) dt_test_put(a, t, i, dt_test_input(op, R, i));
                    CHECK_OK(dt_comm_reduce_scatter(c, a, inplace ? a : b, n, t, op));
                    CHECK_MSG(bad_reduce(inplace ? a : b, t, op, (size_t)R * n, n) < 0, "reduce_scatter %s %s %s%s", an,
                              dt_dtype_name(t), dt_redop_name(op), inplace ? " in place" : "");
                }
            }
    }
    dt_comm_set_algo(c, DT_ALGO_AUTO);
}

static void test_movement(dt_comm *c, unsigned char *a, unsigned char *b) {
    static const dt_comm_algo algos[] = {DT_ALGO_AUTO, DT_ALGO_NATIVE, DT_ALGO_RING, DT_ALGO_TREE, DT_ALGO_RD};
    for (int al = 0; al < 5; al++) {
        dt_comm_set_algo(c, algos[al]);
        const char *an = dt_comm_algo_name(algos[al]);
        size_t n = 777;
        for (int root = 0; root < N; root += N - 1) {
            for (size_t i = 0; i < n; i++) dt_test_put(a, DT_I64, i, R == root ? dt_test_vmove(root, i) : -1);
            CHECK_OK(dt_comm_broadcast(c, a, n, DT_I64, root));
            CHECK_MSG(bad_move(a, DT_I64, root, 0, n) < 0, "broadcast %s root %d", an, root);
            for (size_t i = 0; i < n; i++) dt_test_put(a, DT_F32, i, dt_test_vmove(R, i));
            memset(b, 0xee, n * 4 * (size_t)N);
            CHECK_OK(dt_comm_gather(c, a, R == root ? b : NULL, n, DT_F32, root));
            for (int r = 0; R == root && r < N; r++)
                CHECK_MSG(bad_move(b + (size_t)r * n * 4, DT_F32, r, 0, n) < 0, "gather %s root %d block %d", an, root,
                          r);
            for (int r = 0; R == root && r < N; r++)
                for (size_t i = 0; i < n; i++) dt_test_put(a, DT_I32, (size_t)r * n + i, dt_test_vmove(r, i));
            CHECK_OK(dt_comm_scatter(c, R == root ? a : NULL, b, n, DT_I32, root));
            CHECK_MSG(bad_move(b, DT_I32, R, 0, n) < 0, "scatter %s root %d", an, root);
        }
        for (int mode = 0; mode < 3; mode++) { /* allgather: separate, in place (own block / send == recv) */
            memset(b, 0xee, n * 2 * (size_t)N);
            unsigned char *own = b + (size_t)R * n * 2;
            for (size_t i = 0; i < n; i++) dt_test_put(mode ? own : a, DT_BF16, i, dt_test_vmove(R, i));
            CHECK_OK(dt_comm_allgather(c, mode == 0 ? a : mode == 1 ? own : b, b, n, DT_BF16));
            for (int r = 0; r < N; r++)
                CHECK_MSG(bad_move(b + (size_t)r * n * 2, DT_BF16, r, 0, n) < 0, "allgather %s mode %d block %d", an,
                          mode, r);
        }
        size_t cnt[8], dsp[8], tot = 0; /* allgatherv with gaps between blocks */
        for (int r = 0; r < N; r++) {
            cnt[r] = (size_t)r * 5 + 1;
            dsp[r] = tot;
            tot += cnt[r] + 3;
        }
        for (size_t i = 0; i < cnt[R]; i++) dt_test_put(a, DT_F64, i, dt_test_vmove(R, i));
        CHECK_OK(dt_comm_allgatherv(c, a, b, cnt, dsp, DT_F64));
        for (int r = 0; r < N; r++)
            CHECK_MSG(bad_move(b + dsp[r] * 8, DT_F64, r, 0, cnt[r]) < 0, "allgatherv %s block %d", an, r);
        for (int j = 0; j < N; j++)
            for (size_t i = 0; i < n; i++) dt_test_put(a, DT_F32, (size_t)j * n + i, dt_test_vmove(R * 16 + j, i));
        CHECK_OK(dt_comm_alltoall(c, a, b, n, DT_F32));
        for (int r = 0; r < N; r++)
            CHECK_MSG(bad_move(b + (size_t)r * n * 4, DT_F32, r * 16 + R, 0, n) < 0, "alltoall %s from %d", an, r);
        CHECK_OK(dt_comm_barrier(c));
    }
    dt_comm_set_algo(c, DT_ALGO_AUTO);
}

/* non-blocking ops queued together on the progress thread, overlapping with p2p */
static void test_nonblocking(dt_comm *c) {
    enum { K = 4, M = 5000 };
    static float in[K][M], out[K][M], ring_s[M], ring_r[M], ag[8 * M];
    dt_request *q[K + 4] = {0};
    for (int k = 0; k < K; k++) {
        for (size_t i = 0; i < M; i++) in[k][i] = (float)dt_test_input(DT_OP_SUM, R + k, i);
        CHECK_OK(dt_comm_iallreduce(c, in[k], out[k], M, DT_F32, DT_OP_SUM, &q[k]));
    }
    int right = (R + 1) % N, left = (R + N - 1) % N;
    for (size_t i = 0; i < M; i++) ring_s[i] = (float)dt_test_vmove(R, i);
    CHECK_OK(dt_comm_irecv(c, ring_r, M, DT_F32, left, 9, &q[K]));
    CHECK_OK(dt_comm_isend(c, ring_s, M, DT_F32, right, 9, &q[K + 1]));
    for (size_t i = 0; i < M; i++) ag[(size_t)R * M + i] = (float)dt_test_vmove(R, i);
    CHECK_OK(dt_comm_iallgather(c, ag + (size_t)R * M, ag, M, DT_F32, &q[K + 2]));
    CHECK_OK(dt_request_waitall(q, K + 3));
    for (int k = 0; k < K; k++) {
        long bad = -1;
        for (size_t i = 0; i < M && bad < 0; i++) {
            double want = 0;
            for (int r = 0; r < N; r++) want += dt_test_input(DT_OP_SUM, r + k, i);
            if (out[k][i] != (float)want) bad = (long)i;
        }
        CHECK_MSG(bad < 0, "iallreduce %d: [%ld]", k, bad);
    }
    CHECK_MSG(bad_move(ring_r, DT_F32, left, 0, M) < 0, "isend/irecv from %d", left);
    for (int r = 0; r < N; r++) CHECK_MSG(bad_move(ag + (size_t)r * M, DT_F32, r, 0, M) < 0, "iallgather block %d", r);
}

static void test_split_p2p(dt_comm *c) {
    dt_comm *s = NULL;
    CHECK_OK(dt_comm_split(c, R % 2, -R, &s)); /* key -R: reversed order */
    if (s) {
        int ns = (N - R % 2 + 1) / 2, want = 0, x = R, sum = 0;
        CHECK(dt_comm_size(s) == ns && !strcmp(dt_comm_backend_name(s), "mpi"));
        for (int r = R % 2; r < N; r += 2) want += r;
        CHECK_OK(dt_comm_allreduce(s, &x, &sum, 1, DT_I32, DT_OP_SUM));
        CHECK_MSG(sum == want, "split allreduce %d, want %d", sum, want);
        dt_comm_set_algo(s, DT_ALGO_RING);
        sum = 0;
        CHECK_OK(dt_comm_allreduce(s, &x, &sum, 1, DT_I32, DT_OP_SUM));
        CHECK_MSG(sum == want, "split ring allreduce %d, want %d", sum, want);
        dt_comm_destroy(s);
    }
    CHECK_OK(dt_comm_split(c, R == 0 ? DT_COMM_UNDEFINED : 1, 0, &s));
    CHECK(R == 0 ? s == NULL : s != NULL && dt_comm_size(s) == N - 1);
    dt_comm_destroy(s);
    static float big[300007], got[300007];
    for (size_t i = 0; i < 300007; i++) big[i] = (float)dt_test_vmove(R, i);
    int right = (R + 1) % N, left = (R + N - 1) % N;
    if (R % 2 == 0) {
        CHECK_OK(dt_comm_send(c, big, 300007, DT_F32, right, 3));
        CHECK_OK(dt_comm_recv(c, got, 300007, DT_F32, left, 3));
    } else {
        CHECK_OK(dt_comm_recv(c, got, 300007, DT_F32, left, 3));
        CHECK_OK(dt_comm_send(c, big, 300007, DT_F32, right, 3));
    }
    CHECK_MSG(bad_move(got, DT_F32, left, 0, 300007) < 0, "p2p ring from %d", left);
}

static int rank_main(void) {
    dt_comm *c = NULL;
    dt_comm_config cfg = dt_comm_config_default();
    cfg.timeout_s = 60;
    CHECK_OK(dt_comm_create_from_env(&c, &cfg));
    if (!c) return dt_test_summary("comm_mpi_test");
    R = dt_comm_rank(c);
    N = dt_comm_size(c);
    CHECK(!strcmp(dt_comm_backend_name(c), "mpi") && N == atoi(getenv("OMPI_COMM_WORLD_SIZE")));
    size_t cap = 40000 * 8 * 8 + 4096;
    unsigned char *a = malloc(cap), *b = malloc(cap);
    test_reductions(c, a, b);
    test_movement(c, a, b);
    test_nonblocking(c);
    test_split_p2p(c);
    free(a);
    free(b);
    dt_comm_destroy(c);
    char name[64];
    snprintf(name, sizeof name, "comm_mpi_test rank %d/%d", R, N);
    return dt_test_summary(name);
}

int main(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE")) return rank_main();
#ifndef DT_HAVE_MPI
    printf("skip: built without MPI (install libopenmpi-dev and rebuild)\n");
    return 77;
#else
    int skip = dt_mpi_test_launch_env();
    if (skip) return skip;
    static char out[1 << 15];
    for (int np = 2; np <= 4; np++) {
        double t0 = dt_now();
        int rc = dt_mpi_test_mpirun(np, 150, "--oversubscribe --bind-to none", "", out, sizeof out);
        int passed = dt_mpi_test_count(out, ", 0 failures");
        CHECK_MSG(rc == 0 && passed == np, "mpirun -np %d: %d of %d ranks passed:\n%s", np, passed, np, out);
        printf("%d ranks over MPI: %s (%.1f s)\n", np, passed == np ? "passed" : "FAILED", dt_now() - t0);
    }
    return dt_test_summary("comm_mpi_test");
#endif
}
