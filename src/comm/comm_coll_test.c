/* Collective correctness (nccl-tests style: every rank computes the expected result itself):
 * every collective, dtype and reduction op, for world sizes 1..8 (including 3, 5, 7), counts
 * 0, 1, primes and a large one, every algorithm, in-place forms, tagged point-to-point.
 * Inputs are small integers (or powers of two for prod) so every result is exact in every
 * dtype and algorithm, and results are compared bit for bit. */
#include "comm/comm_testlib.h"

#include <stdlib.h>

static const dt_dtype g_types[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64};
static const dt_redop g_ops[] = {DT_OP_SUM, DT_OP_AVG, DT_OP_MAX, DT_OP_MIN, DT_OP_PROD};
#define BIG 100003

static int first_bad(const void *p, dt_dtype t, size_t n, double (*want)(size_t, void *), void *ctx) {
    for (size_t i = 0; i < n; i++)
        if (dt_test_get(p, t, i) != want(i, ctx)) return (int)i;
    return -1;
}

typedef struct {
    dt_redop op;
    dt_dtype t;
    int n;
} red_ctx;
static double want_red(size_t i, void *ctx) {
    red_ctx *c = ctx;
    return dt_test_expect(c->op, c->t, c->n, i);
}

static void test_allreduce(dt_comm *c, int R, int N, void *send, void *recv) {
    static const dt_comm_algo algos[] = {DT_ALGO_AUTO, DT_ALGO_RING, DT_ALGO_RD, DT_ALGO_RHD, DT_ALGO_DIRECT};
    static const size_t counts[] = {0, 1, 7, 131};
    for (int a = 0; a < 5; a++) {
        dt_comm_set_algo(c, algos[a]);
        for (int ti = 0; ti < 6; ti++)
            for (int oi = 0; oi < 5; oi++)
                for (int ci = 0; ci < 4; ci++) {
                    dt_dtype t = g_types[ti];
                    dt_redop op = g_ops[oi];
                    size_t n = counts[ci];
                    for (size_t i = 0; i < n; i++) dt_test_put(send, t, i, dt_test_input(op, R, i));
                    memset(recv, 0xee, n * 8 + 8);
                    CHECK_OK(dt_comm_allreduce(c, send, recv, n, t, op));
                    red_ctx x = {op, t, N};
                    int bad = first_bad(recv, t, n, want_red, &x);
                    CHECK_MSG(bad < 0, "allreduce %s %s %s n=%zu size %d: [%d] = %g, want %g",
                              dt_comm_algo_name(algos[a]), dt_dtype_name(t), dt_redop_name(op), n, N, bad,
                              bad < 0 ? 0 : dt_test_get(recv, t, (size_t)bad),
                              bad < 0 ? 0 : dt_test_expect(op, t, N, (size_t)bad));
                }
        /* in place and a large count */
        dt_dtype big_t[3] = {DT_F32, DT_BF16, DT_F64};
        dt_redop big_op[3] = {DT_OP_SUM, DT_OP_AVG, DT_OP_MAX};
        for (int k = 0; k < 3; k++) {
            for (size_t i = 0; i < BIG; i++) dt_test_put(recv, big_t[k], i, dt_test_input(big_op[k], R, i));
            CHECK_OK(dt_comm_allreduce(c, recv, recv, BIG, big_t[k], big_op[k]));
            red_ctx x = {big_op[k], big_t[k], N};
            int bad = first_bad(recv, big_t[k], BIG, want_red, &x);
            CHECK_MSG(bad < 0, "in-place allreduce %s %s n=%d size %d: first bad [%d]", dt_comm_algo_name(algos[a]),
                      dt_dtype_name(big_t[k]), BIG, N, bad);
        }
    }
    dt_comm_set_algo(c, DT_ALGO_AUTO);
}

/* Counts around multiples of the shm chunk (the one this run set, or the default 512 KiB): two
 * ranks reduce buffers of up to four chunks whole (one, two and four chunks here) and larger ones
 * in slices; in place (DDP's buckets) and not; reduce to a root, whose peer only posts. */
static void test_allreduce_chunks(dt_comm *c, int R, int N, void *send, void *recv, size_t cap) {
    const char *e = getenv("DTRAIN_SHM_CHUNK");
    const size_t chunk = e && *e ? (size_t)atoll(e) : 512u << 10, ce = chunk / 4;
    const size_t counts[] = {ce, ce + 1, 3 * ce + 5, 4 * ce, 4 * ce + 1};
    for (int ci = 0; ci < 5; ci++)
        for (int k = 0; k < 3; k++) {
            size_t n = counts[ci];
            if (n * 4 > cap) continue;
            const dt_redop op = k == 1 ? DT_OP_SUM : DT_OP_AVG;
            unsigned char *src = k == 0 ? (unsigned char *)recv : (unsigned char *)send;
            for (size_t i = 0; i < n; i++) dt_test_put(src, DT_F32, i, dt_test_input(op, R, i));
            if (k) memset(recv, 0xee, n * 4);
            if (k == 2) { /* reduce to rank N-1: only it has the result */
                CHECK_OK(dt_comm_reduce(c, send, recv, n, DT_F32, op, N - 1));
                if (R != N - 1) continue;
            } else {
                CHECK_OK(dt_comm_allreduce(c, src, recv, n, DT_F32, op));
            }
            red_ctx x = {op, DT_F32, N};
            int bad = first_bad(recv, DT_F32, n, want_red, &x);
            CHECK_MSG(bad < 0, "%s %s n=%zu (%zu-byte chunks) size %d: first bad [%d]",
                      k == 2   ? "reduce"
                      : k == 0 ? "in-place allreduce"
                               : "allreduce",
                      dt_redop_name(op), n, chunk, N, bad);
        }
}

typedef struct {
    int r;
} mv_ctx;
static double want_mv(size_t i, void *ctx) { return dt_test_vmove(((mv_ctx *)ctx)->r, i); }

static void test_broadcast_reduce(dt_comm *c, int R, int N, void *send, void *recv) {
    static const dt_comm_algo algos[] = {DT_ALGO_AUTO, DT_ALGO_TREE, DT_ALGO_RING};
    static const size_t counts[] = {0, 1, 7, 131, BIG};
    static const dt_dtype types[] = {DT_F32, DT_I64, DT_BF16};
    for (int a = 0; a < 3; a++) {
        dt_comm_set_algo(c, algos[a]);
        for (int ti = 0; ti < 3; ti++)
            for (int ci = 0; ci < 5; ci++)
                for (int root = 0; root<N; root += N> 1 ? N - 1 : 1) {
                    dt_dtype t = types[ti];
                    size_t n = counts[ci];
                    for (size_t i = 0; i < n; i++) dt_test_put(recv, t, i, R == root ? dt_test_vmove(root, i) : -1);
                    CHECK_OK(dt_comm_broadcast(c, recv, n, t, root));
                    mv_ctx x = {root};
                    int bad = first_bad(recv, t, n, want_mv, &x);
                    CHECK_MSG(bad < 0, "broadcast %s %s n=%zu root %d size %d: first bad [%d]",
                              dt_comm_algo_name(algos[a]), dt_dtype_name(t), n, root, N, bad);
                }
        static const dt_dtype rtypes[] = {DT_F32, DT_BF16, DT_I32, DT_F64};
        for (int ti = 0; ti < 4; ti++)
            for (int oi = 0; oi < 5; oi++)
                for (int ci = 0; ci < 5; ci++) {
                    dt_dtype t = rtypes[ti];
                    dt_redop op = g_ops[oi];
                    size_t n = counts[ci];
                    int root = (ci + oi) % N;
                    if (n == BIG && op != DT_OP_SUM) continue;
                    for (size_t i = 0; i < n; i++) dt_test_put(send, t, i, dt_test_input(op, R, i));
                    memset(recv, 0xee, 64);
                    CHECK_OK(dt_comm_reduce(c, send, R == root ? recv : NULL, n, t, op, root));
                    red_ctx x = {op, t, N};
                    int bad = R == root ? first_bad(recv, t, n, want_red, &x) : -1;
                    CHECK_MSG(bad < 0, "reduce %s %s %s n=%zu root %d size %d: first bad [%d]",
                              dt_comm_algo_name(algos[a]), dt_dtype_name(t), dt_redop_name(op), n, root, N, bad);
                }
    }
    dt_comm_set_algo(c, DT_ALGO_AUTO);
}

static void test_gathers(dt_comm *c, int R, int N, unsigned char *send, unsigned char *recv) {
    static const dt_comm_algo algos[] = {DT_ALGO_AUTO, DT_ALGO_RING, DT_ALGO_RD};
    static const size_t counts[] = {0, 1, 7, 1021, 33331};
    static const dt_dtype types[] = {DT_F32, DT_I64, DT_F16};
    for (int a = 0; a < 3; a++) {
        dt_comm_set_algo(c, algos[a]);
        for (int ti = 0; ti < 3; ti++)
            for (int ci = 0; ci < 5; ci++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    dt_dtype t = types[ti];
                    size_t n = counts[ci], esz = dt_dtype_size(t);
                    memset(recv, 0xee, n * esz * (size_t)N + 8);
                    unsigned char *src = inplace ? recv + (size_t)R * n * esz : send;
                    for (size_t i = 0; i < n; i++) dt_test_put(src, t, i, dt_test_vmove(R, i));
                    CHECK_OK(dt_comm_allgather(c, src, recv, n, t));
                    for (int r = 0; r < N; r++) {
                        mv_ctx x = {r};
                        int bad = first_bad(recv + (size_t)r * n * esz, t, n, want_mv, &x);
                        CHECK_MSG(bad < 0, "allgather %s %s n=%zu%s size %d: block %d first bad [%d]",
                                  dt_comm_algo_name(algos[a]), dt_dtype_name(t), n, inplace ? " in place" : "", N, r,
                                  bad);
                    }
                }
    }
    /* allgatherv: rank r contributes (r*3+k) % 5 * 13 elements, packed and with gaps */
    for (int k = 0; k < 3; k++)
        for (int gaps = 0; gaps < 2; gaps++) {
            size_t counts_v[64], displs[64], off = 0;
            for (int r = 0; r < N; r++) {
                counts_v[r] = (size_t)((r * 3 + k) % 5) * 13;
                displs[r] = off + (gaps ? 5 : 0);
                off = displs[r] + counts_v[r];
            }
            for (size_t i = 0; i < counts_v[R]; i++) dt_test_put(send, DT_I32, i, dt_test_vmove(R, i));
            memset(recv, 0xee, off * 4 + 8);
            CHECK_OK(dt_comm_allgatherv(c, send, recv, counts_v, gaps ? displs : NULL, DT_I32));
            for (int r = 0; r < N; r++) {
                mv_ctx x = {r};
                size_t d = gaps ? displs[r] : displs[r];
                int bad = first_bad(recv + d * 4, DT_I32, counts_v[r], want_mv, &x);
                CHECK_MSG(bad < 0, "allgatherv k=%d gaps=%d size %d: block %d bad [%d]", k, gaps, N, r, bad);
            }
        }
    dt_comm_set_algo(c, DT_ALGO_AUTO);
}

typedef struct {
    dt_redop op;
    dt_dtype t;
    int n;
    size_t base;
} rs_ctx;
static double want_rs(size_t i, void *ctx) {
    rs_ctx *c = ctx;
    return dt_test_expect(c->op, c->t, c->n, c->base + i);
}

static void test_reduce_scatter(dt_comm *c, int R, int N, unsigned char *send, unsigned char *recv) {
    static const dt_comm_algo algos[] = {DT_ALGO_AUTO, DT_ALGO_RING};
    static const size_t counts[] = {0, 1, 7, 1021};
    static const dt_dtype types[] = {DT_F32, DT_BF16, DT_I64};
    for (int a = 0; a < 2; a++) {
        dt_comm_set_algo(c, algos[a]);
        for (int ti = 0; ti < 3; ti++)
            for (int oi = 0; oi < 5; oi++)
                for (int ci = 0; ci < 4; ci++)
                    for (int inplace = 0; inplace < 2; inplace++) {
                        dt_dtype t = types[ti];
                        dt_redop op = g_ops[oi];
                        size_t n = counts[ci], esz = dt_dtype_size(t), all = n * (size_t)N;
                        unsigned char *src = inplace ? recv : send;
                        for (size_t i = 0; i < all; i++) dt_test_put(src, t, i, dt_test_input(op, R, i));
                        CHECK_OK(dt_comm_reduce_scatter(c, src, recv, n, t, op));
                        rs_ctx x = {op, t, N, (size_t)R * n};
                        int bad = first_bad(recv, t, n, want_rs, &x);
                        CHECK_MSG(bad < 0, "reduce_scatter %s %s %s n=%zu%s size %d: first bad [%d]",
                                  dt_comm_algo_name(algos[a]), dt_dtype_name(t), dt_redop_name(op), n,
                                  inplace ? " in place" : "", N, bad);
                        (void)esz;
                    }
        size_t n = 33331;
        for (size_t i = 0; i < n * (size_t)N; i++) dt_test_put(send, DT_F32, i, dt_test_input(DT_OP_SUM, R, i));
        CHECK_OK(dt_comm_reduce_scatter(c, send, recv, n, DT_F32, DT_OP_SUM));
        rs_ctx x = {DT_OP_SUM, DT_F32, N, (size_t)R * n};
        CHECK_MSG(first_bad(recv, DT_F32, n, want_rs, &x) < 0, "large reduce_scatter %s size %d",
                  dt_comm_algo_name(algos[a]), N);
    }
    dt_comm_set_algo(c, DT_ALGO_AUTO);
}

static void test_rooted_and_alltoall(dt_comm *c, int R, int N, unsigned char *send, unsigned char *recv) {
    static const size_t counts[] = {0, 1, 7, 1021};
    for (int ci = 0; ci < 4; ci++)
        for (int root = 0; root<N; root += N> 1 ? N - 1 : 1) {
            size_t n = counts[ci];
            for (size_t i = 0; i < n; i++) dt_test_put(send, DT_F32, i, dt_test_vmove(R, i));
            memset(recv, 0xee, n * 4 * (size_t)N + 8);
            CHECK_OK(dt_comm_gather(c, send, R == root ? recv : NULL, n, DT_F32, root));
            for (int r = 0; R == root && r < N; r++) {
                mv_ctx x = {r};
                CHECK_MSG(first_bad(recv + (size_t)r * n * 4, DT_F32, n, want_mv, &x) < 0,
                          "gather n=%zu root %d block %d", n, root, r);
            }
            if (R == root)
                for (int r = 0; r < N; r++)
                    for (size_t i = 0; i < n; i++) dt_test_put(send, DT_I32, (size_t)r * n + i, dt_test_vmove(r, i));
            CHECK_OK(dt_comm_scatter(c, R == root ? send : NULL, recv, n, DT_I32, root));
            mv_ctx x = {R};
            CHECK_MSG(first_bad(recv, DT_I32, n, want_mv, &x) < 0, "scatter n=%zu root %d size %d", n, root, N);
        }
    for (int ci = 0; ci < 4; ci++) {
        size_t n = counts[ci];
        for (int j = 0; j < N; j++)
            for (size_t i = 0; i < n; i++) dt_test_put(send, DT_F64, (size_t)j * n + i, dt_test_vmove(R * 16 + j, i));
        CHECK_OK(dt_comm_alltoall(c, send, recv, n, DT_F64));
        for (int r = 0; r < N; r++) {
            mv_ctx x = {r * 16 + R};
            CHECK_MSG(first_bad(recv + (size_t)r * n * 8, DT_F64, n, want_mv, &x) < 0, "alltoall n=%zu from %d", n, r);
        }
    }
    for (int k = 0; k < 3; k++) CHECK_OK(dt_comm_barrier(c));
}

static void test_p2p(dt_comm *c, int R, int N, unsigned char *send, unsigned char *recv) {
    if (N < 2) return;
    int right = (R + 1) % N, left = (R + N - 1) % N;
    /* ring pass, even ranks send first; a large message (more than a channel holds) */
    size_t n = 300007;
    for (size_t i = 0; i < n; i++) dt_test_put(send, DT_F32, i, dt_test_vmove(R, i));
    if (R % 2 == 0) {
        CHECK_OK(dt_comm_send(c, send, n, DT_F32, right, 3));
        CHECK_OK(dt_comm_recv(c, recv, n, DT_F32, left, 3));
    } else {
        CHECK_OK(dt_comm_recv(c, recv, n, DT_F32, left, 3));
        CHECK_OK(dt_comm_send(c, send, n, DT_F32, right, 3));
    }
    mv_ctx x = {left};
    CHECK_MSG(first_bad(recv, DT_F32, n, want_mv, &x) < 0, "p2p ring pass size %d", N);
    /* tags received out of order: rank 0 sends tag 1 (small) then tag 2 (large) to rank 1 */
    if (R == 0) {
        CHECK_OK(dt_comm_send(c, send, 100, DT_F32, 1, 1));
        CHECK_OK(dt_comm_send(c, send, n, DT_F32, 1, 2));
    } else if (R == 1) {
        float small[100];
        CHECK_OK(dt_comm_recv(c, recv, n, DT_F32, 0, 2));
        CHECK_OK(dt_comm_recv(c, small, 100, DT_F32, 0, 1));
        mv_ctx z = {0};
        CHECK(first_bad(recv, DT_F32, n, want_mv, &z) < 0);
        CHECK(first_bad(small, DT_F32, 100, want_mv, &z) < 0);
    }
    CHECK(dt_comm_send(c, send, 1, DT_F32, R, 0) == DT_EINVAL);
    CHECK(dt_comm_send(c, send, 1, DT_F32, right, DT_COMM_TAG_MAX + 1) == DT_EINVAL);
}

static void run_all(dt_comm *c, int R, int N) {
    size_t cap = (size_t)BIG * 8 * 8 + 4096;
    unsigned char *send = malloc(cap), *recv = malloc(cap);
    test_allreduce(c, R, N, send, recv);
    test_allreduce_chunks(c, R, N, send, recv, cap);
    test_broadcast_reduce(c, R, N, send, recv);
    test_gathers(c, R, N, send, recv);
    test_reduce_scatter(c, R, N, send, recv);
    test_rooted_and_alltoall(c, R, N, send, recv);
    test_p2p(c, R, N, send, recv);
    CHECK(dt_comm_allreduce(c, send, recv, 4, DT_U8, DT_OP_SUM) == DT_EINVAL);
    CHECK(dt_comm_broadcast(c, recv, 4, DT_F32, N) == DT_EINVAL);
    free(send);
    free(recv);
}

static int rank_main(int R, int N, const char *job, void *arg) {
    (void)arg;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 60));
    if (!c) return 1;
    CHECK(dt_comm_rank(c) == R && dt_comm_size(c) == N);
    CHECK(!strcmp(dt_comm_backend_name(c), N > 1 ? "shm" : "self"));
    CHECK_MSG(dt_test_shm_gone(job), "segment of job %s still in /dev/shm after every rank attached", job);
    run_all(c, R, N);
    dt_comm_destroy(c);
    if (R == 0) printf("  rank 0 of %d: %d checks, %d failures\n", N, dt_test_checks, dt_test_failures);
    return dt_test_failures;
}

/* under mpirun: the same checks over the mpi transport (native and our algorithms) */
static int mpi_main(void) {
    dt_comm_config cfg = dt_comm_config_default();
    cfg.backend = DT_BACKEND_MPI;
    cfg.timeout_s = 120;
    dt_comm *c = NULL;
    CHECK_OK(dt_comm_create_from_env(&c, &cfg));
    if (!c) return 1;
    int R = dt_comm_rank(c), N = dt_comm_size(c);
    CHECK(!strcmp(dt_comm_backend_name(c), "mpi"));
    run_all(c, R, N);
    dt_comm_destroy(c);
    char name[64];
    snprintf(name, sizeof name, "comm_coll_test (mpi, rank %d of %d)", R, N);
    return dt_test_summary(name);
}

int main(int argc, char **argv) {
    static const int sizes[] = {1, 2, 3, 4, 5, 7, 8, 2};
    if (argc > 1 && !strcmp(argv[1], "mpi")) return mpi_main();
    int only = argc > 1 ? atoi(argv[1]) : 0;
    /* some sizes also run with small shm chunks/fragments, streaming stores everywhere, or no
     * whole-buffer fast path, so the pipelines rotate their slots many times */
    static const char *const env[8][4] = {
        {NULL},
        {"DTRAIN_SHM_CHUNK", "16384", "DTRAIN_SHM_NT", "65536"},
        {"DTRAIN_SHM_SMALL", "0", "DTRAIN_SHM_FRAG", "4096"},
        {NULL},
        {"DTRAIN_SHM_CHUNK", "16384", "DTRAIN_SHM_NT", "0"},
        {"DTRAIN_SHM_SMALL", "0", "DTRAIN_SHM_CHUNK", "20480"},
        {NULL},
        {NULL}}; /* two ranks again with the default geometry (DDP's: buckets up to 2 MiB reduced whole) */
    for (int k = 0; k < 8; k++) {
        int n = sizes[k];
        if (only && n != only) continue;
        unsetenv("DTRAIN_SHM_CHUNK"), unsetenv("DTRAIN_SHM_NT"), unsetenv("DTRAIN_SHM_SMALL"),
            unsetenv("DTRAIN_SHM_FRAG");
        for (int e = 0; e < 4 && env[k][e]; e += 2) setenv(env[k][e], env[k][e + 1], 1);
        double t0 = dt_now();
        int failed = dt_run_ranks(n, rank_main, NULL, 120);
        CHECK_MSG(failed == 0, "%d of %d ranks failed", failed, n);
        CHECK_MSG(dt_test_shm_gone(dt_test_job), "segment of job %s left in /dev/shm", dt_test_job);
        printf("world size %d: %.2f s\n", n, dt_now() - t0);
    }
    return dt_test_summary("comm_coll_test");
}
