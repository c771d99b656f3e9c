/* Test of the MPI transport, driven through its vtable as the communicator drives it.
 * Run plainly, it starts itself under mpirun: "ok" mode with 2, 3 and 4 ranks (tagged
 * point-to-point, every native collective with several dtypes and ops, in-place forms, split,
 * the benchmark baseline), then "errors" mode with 3 ranks (deadline -> DT_ETIMEDOUT naming the
 * rank, wrong receive size and mismatched collectives -> DT_EMISMATCH, abort reaching every
 * rank; the mismatches only the in-band check words catch are transport_mpi_inband_test.c), then "dead" mode with 3
 * ranks under mpirun --enable-recovery (a killed rank is DT_EPEER on the ranks waiting for it within seconds, not at
 * their deadline). Expected values are computed on every rank. Exit 77 when built without MPI. Under mpirun directly:
 * `transport_mpi_test [ok|errors|dead|bench SIZE...]` runs one mode (used by tests/mpi_netns.sh across emulated hosts).
 */
#include "comm/comm_testlib.h"
#include "comm/mpi_testlib.h"
#include "comm/transport.h"
#include "core/test.h"
#ifdef DT_HAVE_MPI
#include "comm/transport_mpi.h"
#endif

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef DT_HAVE_MPI
int main(void) {
    dt_transport *t = NULL;
    CHECK(dt_transport_mpi_create(&t, NULL) == DT_ENOTSUP && t == NULL);
    CHECK(strstr(dt_last_error(), "built without MPI") != NULL);
    printf("skip: built without MPI (install libopenmpi-dev and rebuild)\n");
    return dt_test_failures ? 1 : 77;
}
#else

static int R, N; /* this rank, world size */

static double val(int r, size_t i) { return (double)(((r * 7 + (int)i * 3) % 5) + 1); }

static double expect_reduce(size_t i, dt_redop op, dt_dtype t) {
    double acc = val(0, i);
    for (int r = 1; r < N; r++) {
        double v = val(r, i);
        if (op == DT_OP_SUM || op == DT_OP_AVG) acc += v;
        else if (op == DT_OP_MAX) acc = v > acc ? v : acc;
        else if (op == DT_OP_MIN) acc = v < acc ? v : acc;
        else acc *= v;
    }
    if (op == DT_OP_AVG) {
        if (t == DT_I32 || t == DT_I64) acc = (double)((int64_t)acc / N);
        else if (t == DT_F32) acc = (float)((float)acc / (float)N);
        else acc = acc / N;
    }
    return acc;
}

static size_t mismatches(const void *buf, dt_dtype t, size_t n, double (*want)(size_t, void *), void *ctx) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (dt_test_get(buf, t, i) != want(i, ctx)) bad++;
    return bad;
}

typedef struct {
    dt_redop op;
    dt_dtype t;
    int rank;
    size_t count;
} ctx_t;
static double w_reduce(size_t i, void *c) { return expect_reduce(i, ((ctx_t *)c)->op, ((ctx_t *)c)->t); }
static double w_rs(size_t i, void *c) {
    ctx_t *x = c;
    return expect_reduce((size_t)R * x->count + i, x->op, x->t);
}
static double w_bcast(size_t i, void *c) { return val(((ctx_t *)c)->rank, i); }
static double w_gather(size_t i, void *c) {
    size_t n = ((ctx_t *)c)->count;
    return val((int)(i / n), i % n);
}
static double w_scatter(size_t i, void *c) {
    size_t n = ((ctx_t *)c)->count;
    return val(((ctx_t *)c)->rank, (size_t)R * n + i);
}
static double w_a2a(size_t i, void *c) {
    size_t n = ((ctx_t *)c)->count;
    return val((int)(i / n), (size_t)R * n + i % n);
}

/* n = 1000: allreduce and allgather carry the op check in their data (in-band); 40000 x 8 bytes
 * is over DT_MPI_INBAND_MAX, so f64/i64 take the descriptor message */
static void test_collectives(dt_transport *t, size_t n) {
    const dt_dtype red_types[] = {DT_F32, DT_F64, DT_I32, DT_I64};
    const dt_redop ops[] = {DT_OP_SUM, DT_OP_AVG, DT_OP_MAX, DT_OP_MIN, DT_OP_PROD};
    char *in = malloc(n * 8 * (size_t)N), *out = malloc(n * 8 * (size_t)N);
    for (int ti = 0; ti < 4; ti++) {
        dt_dtype dt = red_types[ti];
        for (int oi = 0; oi < 5; oi++) {
            ctx_t c = {ops[oi], dt, 0, n};
            for (int inplace = 0; inplace < 2; inplace++) { /* allreduce */
                for (size_t i = 0; i < n; i++) dt_test_put(in, dt, i, val(R, i));
                CHECK_OK(
                    dt_mpi_test_coll(t, DT_COLL_ALLREDUCE, dt, ops[oi], -1, n, in, inplace ? in : out, NULL, NULL));
                CHECK_MSG(mismatches(inplace ? in : out, dt, n, w_reduce, &c) == 0, "allreduce %s %s inplace=%d",
                          dt_dtype_name(dt), dt_redop_name(ops[oi]), inplace);
            }
            int root = 1 % N; /* reduce, in place at the root */
            for (size_t i = 0; i < n; i++) dt_test_put(in, dt, i, val(R, i));
            CHECK_OK(dt_mpi_test_coll(t, DT_COLL_REDUCE, dt, ops[oi], root, n, in, R == root ? in : NULL, NULL, NULL));
            if (R == root)
                CHECK_MSG(mismatches(in, dt, n, w_reduce, &c) == 0, "reduce %s %s", dt_dtype_name(dt),
                          dt_redop_name(ops[oi]));
            for (int inplace = 0; inplace < 2; inplace++) { /* reduce_scatter */
                for (size_t i = 0; i < n * (size_t)N; i++) dt_test_put(in, dt, i, val(R, i));
                CHECK_OK(dt_mpi_test_coll(t, DT_COLL_REDUCE_SCATTER, dt, ops[oi], -1, n, in, inplace ? in : out, NULL,
                                          NULL));
                CHECK_MSG(mismatches(inplace ? in : out, dt, n, w_rs, &c) == 0, "reduce_scatter %s %s inplace=%d",
                          dt_dtype_name(dt), dt_redop_name(ops[oi]), inplace);
            }
        }
    }
    /* bf16 reductions are the communicator's job: DT_ENOTSUP without side effects */
    dt_test_put(in, DT_BF16, 0, 3.0);
    dt_coll_args a = {.d = {.seq = 0, .op = DT_COLL_ALLREDUCE, .dtype = DT_BF16, .count = 1},
                      .send = in,
                      .recv = in,
                      .algo = DT_ALGO_NATIVE,
                      .deadline = dt_now() + 5};
    CHECK(t->ops->coll(t, &a) == DT_ENOTSUP && dt_test_get(in, DT_BF16, 0) == 3.0);
    a.d.dtype = DT_F32;
    a.algo = DT_ALGO_RING;
    CHECK(t->ops->coll(t, &a) == DT_ENOTSUP);

    const dt_dtype mv_types[] = {DT_F32, DT_BF16, DT_U8, DT_I64};
    for (int ti = 0; ti < 4; ti++) {
        dt_dtype dt = mv_types[ti];
        size_t es = dt_dtype_size(dt);
        int root = N - 1;
        ctx_t c = {DT_OP_SUM, dt, root, n};
        for (size_t i = 0; i < n; i++) dt_test_put(in, dt, i, R == root ? val(root, i) : -1);
        CHECK_OK(dt_mpi_test_coll(t, DT_COLL_BROADCAST, dt, DT_OP_SUM, root, n, in, in, NULL, NULL));
        CHECK_MSG(mismatches(in, dt, n, w_bcast, &c) == 0, "broadcast %s", dt_dtype_name(dt));
        for (int mode = 0; mode < 3; mode++) { /* allgather: separate, in place (send == own block or == recv) */
            memset(out, 0xff, n * es * (size_t)N);
            char *src = mode == 0 ? in : mode == 1 ? out + (size_t)R * n * es : out;
            for (size_t i = 0; i < n; i++) dt_test_put(mode ? out + (size_t)R * n * es : in, dt, i, val(R, i));
            CHECK_OK(dt_mpi_test_coll(t, DT_COLL_ALLGATHER, dt, DT_OP_SUM, -1, n, src, out, NULL, NULL));
            CHECK_MSG(mismatches(out, dt, n * (size_t)N, w_gather, &c) == 0, "allgather %s mode %d", dt_dtype_name(dt),
                      mode);
        }
        size_t counts[8], displs[8], tot = 0; /* allgatherv: rank r gives r+1 elements */
        for (int r = 0; r < N; r++) {
            counts[r] = (size_t)r + 1;
            displs[r] = tot;
            tot += counts[r];
        }
        for (size_t i = 0; i < counts[R]; i++) dt_test_put(in, dt, i, val(R, i));
        CHECK_OK(dt_mpi_test_coll(t, DT_COLL_ALLGATHERV, dt, DT_OP_SUM, -1, counts[R], in, out, counts, displs));
        size_t bad = 0;
        for (int r = 0; r < N; r++)
            for (size_t i = 0; i < counts[r]; i++) bad += dt_test_get(out, dt, displs[r] + i) != val(r, i);
        CHECK_MSG(bad == 0, "allgatherv %s", dt_dtype_name(dt));
        c.rank = 0; /* gather to 0, in place at the root */
        memset(out, 0, n * es * (size_t)N);
        char *gsrc = R == 0 ? out : in;
        for (size_t i = 0; i < n; i++) dt_test_put(gsrc, dt, i, val(R, i));
        CHECK_OK(dt_mpi_test_coll(t, DT_COLL_GATHER, dt, DT_OP_SUM, 0, n, gsrc, R == 0 ? out : NULL, NULL, NULL));
        if (R == 0) CHECK_MSG(mismatches(out, dt, n * (size_t)N, w_gather, &c) == 0, "gather %s", dt_dtype_name(dt));
        c.rank = root; /* scatter from the last rank, in place at the root */
        for (size_t i = 0; i < n * (size_t)N; i++) dt_test_put(in, dt, i, R == root ? val(root, i) : -1);
        char *sdst = R == root ? in + (size_t)root * n * es : out;
        CHECK_OK(dt_mpi_test_coll(t, DT_COLL_SCATTER, dt, DT_OP_SUM, root, n, in, sdst, NULL, NULL));
        CHECK_MSG(mismatches(sdst, dt, n, w_scatter, &c) == 0, "scatter %s", dt_dtype_name(dt));
        for (size_t i = 0; i < n * (size_t)N; i++) dt_test_put(in, dt, i, val(R, i));
        CHECK_OK(dt_mpi_test_coll(t, DT_COLL_ALLTOALL, dt, DT_OP_SUM, -1, n, in, out, NULL, NULL));
        CHECK_MSG(mismatches(out, dt, n * (size_t)N, w_a2a, &c) == 0, "alltoall %s", dt_dtype_name(dt));
    }
    CHECK_OK(dt_mpi_test_coll(t, DT_COLL_BARRIER, DT_F32, DT_OP_SUM, -1, 0, NULL, NULL, NULL, NULL));
    free(in);
    free(out);
}

/* Ring exchange with a user tag and collective traffic, several messages in flight per pair. */
static void test_p2p(dt_transport *t) {
    int right = (R + 1) % N, left = (R + N - 1) % N;
    enum { M = 4, LEN = 3000 };
    static int sbuf[M][LEN], rbuf[M][LEN];
    dt_treq req[2 * M];
    dt_treq *rp[2 * M];
    memset(req, 0, sizeof req);
    for (int m = 0; m < M; m++) {
        for (int i = 0; i < LEN; i++) sbuf[m][i] = R * 100000 + m * 1000 + i;
        int tag = m % 2 ? 5 : DT_TAG_COLL;
        CHECK_OK(t->ops->irecv(t, left, tag, rbuf[m], sizeof rbuf[m], &req[2 * m]));
        CHECK_OK(t->ops->isend(t, right, tag, sbuf[m], sizeof sbuf[m], &req[2 * m + 1]));
        rp[2 * m] = &req[2 * m];
        rp[2 * m + 1] = &req[2 * m + 1];
    }
    CHECK_OK(t->ops->waitall(t, rp, 2 * M, dt_now() + 30));
    int bad = 0;
    for (int m = 0; m < M; m++)
        for (int i = 0; i < LEN; i++) bad += rbuf[m][i] != left * 100000 + m * 1000 + i;
    CHECK_MSG(bad == 0, "p2p data from rank %d", left);
    /* test() polls without blocking; a zero-byte message to self */
    dt_treq a = {0}, b = {0};
    CHECK_OK(t->ops->irecv(t, R, DT_COMM_TAG_MAX, NULL, 0, &a));
    CHECK_OK(t->ops->isend(t, R, DT_COMM_TAG_MAX, NULL, 0, &b));
    bool done = false;
    double end = dt_now() + 10;
    while (!done && dt_now() < end) CHECK_OK(t->ops->test(t, &a, &done));
    CHECK(done && a.status == DT_OK);
    dt_treq *bp = &b;
    CHECK_OK(t->ops->waitall(t, &bp, 1, dt_now() + 10));
    CHECK(t->ops->isend(t, R, DT_COMM_TAG_MAX + 1, sbuf, 4, &b) == DT_EINVAL);
}

static int mode_ok(void) {
    dt_transport *t = NULL;
    CHECK_OK(dt_transport_mpi_create(&t, &(dt_transport_params){.timeout_s = 30}));
    if (!t) return dt_test_summary("transport_mpi_test");
    R = t->rank;
    N = t->size;
    CHECK(!strcmp(t->ops->name, "mpi") && N == atoi(getenv("OMPI_COMM_WORLD_SIZE")));
    char host[256] = "?";
    gethostname(host, sizeof host);
    printf("rank %d/%d on host %s\n", R, N, host);
    test_p2p(t);
    test_collectives(t, 1000);
    test_collectives(t, 40000);
    /* more in-band ops in a row than the op check remembers (64), then ops by message: a stale
     * expectation of the check must not turn them into a false mismatch */
    float one = 1, sum = 0;
    for (int i = 0; i < 200; i++)
        CHECK_OK(dt_mpi_test_coll(t, DT_COLL_ALLREDUCE, DT_F32, DT_OP_SUM, -1, 1, &one, &sum, NULL, NULL));
    for (int i = 0; i < 3; i++)
        CHECK_OK(dt_mpi_test_coll(t, DT_COLL_BROADCAST, DT_F32, DT_OP_SUM, 0, 1, &one, &one, NULL, NULL));
    CHECK_MSG(sum == (float)N, "in-band allreduce of ones: %g, not %d", sum, N);
    /* split: even and odd ranks; rank order reversed inside the group */
    int color = R % 2, members[8], ns = 0;
    for (int r = N - 1; r >= 0; r--)
        if (r % 2 == color) members[ns++] = r;
    int nr = 0;
    while (members[nr] != R) nr++;
    dt_transport *s = NULL;
    dt_coll_desc sd = {.seq = ++dt_mpi_test_seq, .op = DT_COLL_SPLIT, .root = -1};
    CHECK_OK(t->ops->begin(t, &sd));
    CHECK_OK(t->ops->split(t, color, members, ns, nr, 1, dt_now() + 30, &s));
    if (s) {
        CHECK(s->rank == nr && s->size == ns);
        int x = R, sum = 0;
        dt_coll_args a = {.d = {.seq = 1, .op = DT_COLL_ALLREDUCE, .dtype = DT_I32, .count = 1},
                          .send = &x,
                          .recv = &sum,
                          .algo = DT_ALGO_AUTO,
                          .deadline = dt_now() + 30};
        CHECK_OK(s->ops->begin(s, &a.d));
        CHECK_OK(s->ops->coll(s, &a));
        int want = 0;
        for (int i = 0; i < ns; i++) want += members[i];
        CHECK_MSG(sum == want, "split allreduce %d != %d", sum, want);
        int saveR = R, saveN = N;
        R = s->rank;
        N = s->size;
        if (N > 1) test_p2p(s);
        R = saveR;
        N = saveN;
        s->ops->destroy(s);
    }
    double us = 0;
    CHECK_OK(dt_comm_bench_mpi_allreduce(1024, 2, 10, &us));
    CHECK(us > 0);
    t->ops->destroy(t);
    char name[64];
    snprintf(name, sizeof name, "transport_mpi_test rank %d/%d", R, N);
    return dt_test_summary(name);
}

static int mode_errors(void) {
    dt_transport *w = NULL;
    CHECK_OK(dt_transport_mpi_create(&w, &(dt_transport_params){.timeout_s = 30}));
    if (!w) return dt_test_summary("transport_mpi_test errors");
    R = w->rank;
    N = w->size;
    int x[4] = {0}, y[4] = {0};
    /* 1. deadline: rank 0 waits 0.3 s for rank 1, which never sends */
    dt_transport *s = dt_mpi_test_fresh(w, 10);
    dt_treq q = {0}, *qp = &q;
    if (R == 0) {
        CHECK_OK(s->ops->irecv(s, 1, 7, x, sizeof x, &q));
        double t0 = dt_now();
        dt_status st = s->ops->waitall(s, &qp, 1, t0 + 0.3);
        CHECK(st == DT_ETIMEDOUT && dt_now() - t0 >= 0.299); /* not before its deadline (no upper bound: load) */
        printf("rank %d timeout: %s\n", R, dt_last_error());
        CHECK_MSG(strstr(dt_last_error(), "rank 1 (receive of 16 bytes") && strstr(dt_last_error(), "tag 7"), "%s",
                  dt_last_error());
        CHECK(s->ops->waitall(s, &qp, 1, dt_now() + 1) == DT_ETIMEDOUT); /* stays broken */
    } else if (R == 1) { /* waits on rank 0, which tells everyone when its own wait fails */
        CHECK_OK(s->ops->irecv(s, 0, 8, x, sizeof x, &q));
        dt_status st = s->ops->waitall(s, &qp, 1, dt_now() + 20);
        CHECK(st == DT_ETIMEDOUT);
        CHECK_MSG(strstr(dt_last_error(), "rank 0 failed: timed out"), "%s", dt_last_error());
        printf("rank %d timeout notice: %s\n", R, dt_last_error());
    }
    /* 2. receive of the wrong size */
    dt_transport *s2 = dt_mpi_test_fresh(w, 11);
    memset(&q, 0, sizeof q);
    if (R == 0) {
        CHECK_OK(s2->ops->isend(s2, 1, 3, x, 8, &q));
        CHECK_OK(s2->ops->waitall(s2, &qp, 1, dt_now() + 10));
    } else if (R == 1) {
        CHECK_OK(s2->ops->irecv(s2, 0, 3, y, 16, &q));
        CHECK(s2->ops->waitall(s2, &qp, 1, dt_now() + 10) == DT_EMISMATCH);
        CHECK_MSG(strstr(dt_last_error(), "rank 0 sent 8 bytes but rank 1 expected 16"), "%s", dt_last_error());
        printf("rank %d size: %s\n", R, dt_last_error());
    }
    /* 3. mismatched collectives: rank 0 broadcasts while the others allreduce */
    dt_transport *s3 = dt_mpi_test_fresh(w, 12);
    dt_coll_args a = {.d = {.seq = 1,
                            .op = R == 0 ? DT_COLL_BROADCAST : DT_COLL_ALLREDUCE,
                            .dtype = DT_F32,
                            .count = 4,
                            .root = R == 0 ? 0 : -1},
                      .send = x,
                      .recv = y,
                      .algo = DT_ALGO_NATIVE,
                      .deadline = dt_now() + 10};
    dt_status st = s3->ops->begin(s3, &a.d);
    if (st == DT_OK) st = s3->ops->coll(s3, &a);
    /* rank 1 sees rank 0's broadcast, rank 0 sees rank 2's allreduce; rank 2 may finish its
     * (undefined) MPI op first and then hears it from them in its next wait */
    if (st == DT_OK && R == 2) {
        memset(&q, 0, sizeof q);
        CHECK_OK(s3->ops->irecv(s3, 0, 1, y, 4, &q));
        st = s3->ops->waitall(s3, &qp, 1, dt_now() + 10);
    }
    CHECK_MSG(st == DT_EMISMATCH, "rank %d: %s %s", R, dt_status_str(st), dt_last_error());
    CHECK_MSG(strstr(dt_last_error(), "but rank") && strstr(dt_last_error(), "broadcast"), "%s", dt_last_error());
    printf("rank %d mismatch: %s\n", R, dt_last_error());
    /* 4. abort: rank 2 aborts, the others wait for a message that never comes and learn why */
    dt_transport *s4 = dt_mpi_test_fresh(w, 13);
    memset(&q, 0, sizeof q);
    if (R == 2) {
        s4->ops->abort(s4, DT_EINVAL, "rank 2 found a NaN in its gradients");
    } else {
        CHECK_OK(s4->ops->irecv(s4, 2, 9, x, 4, &q));
        double t0 = dt_now();
        st = s4->ops->waitall(s4, &qp, 1, t0 + 10);
        CHECK(st == DT_EINVAL); /* the abort, not the 10 s deadline (that would be DT_ETIMEDOUT) */
        CHECK_MSG(strstr(dt_last_error(), "rank 2 aborted: rank 2 found a NaN"), "%s", dt_last_error());
        printf("rank %d abort: %s\n", R, dt_last_error());
    }
    printf("errors rank %d: %d checks, %d failures\n", R, dt_test_checks, dt_test_failures);
    fflush(stdout);
    /* everyone has reported before anyone exits: a rank leaving without MPI_Finalize (on purpose
     * after failures, peers may be stuck) makes mpirun kill the rest */
    dt_mpi_test_seq = 0;
    CHECK_OK(dt_mpi_test_coll(w, DT_COLL_BARRIER, DT_F32, DT_OP_SUM, -1, 0, NULL, NULL, NULL, NULL));
    s->ops->destroy(s);
    s2->ops->destroy(s2);
    s3->ops->destroy(s3);
    s4->ops->destroy(s4);
    w->ops->destroy(w);
    return dt_test_failures ? 1 : 0;
}

/* "dead" (3 ranks, mpirun --enable-recovery): rank 2 is killed while rank 0 waits for a message
 * from it and rank 1 for a broadcast it roots on their pair; both waits must end with DT_EPEER
 * naming it (MPI itself reports nothing) well before their 20 s deadline. */
static int mode_dead(void) {
    dt_transport *w = NULL, *pair = NULL;
    CHECK_OK(dt_transport_mpi_create(&w, &(dt_transport_params){.timeout_s = 30}));
    if (!w || w->size != 3) return dt_test_summary("transport_mpi_test dead (needs 3 ranks)") + 1;
    R = w->rank;
    N = w->size;
    int members[2] = {1, 2};
    if (R > 0) CHECK_OK(w->ops->split(w, 1, members, 2, R - 1, 20, dt_now() + 30, &pair));
    dt_mpi_test_seq = 0;
    /* the pairs are made */
    CHECK_OK(dt_mpi_test_coll(w, DT_COLL_BARRIER, DT_F32, DT_OP_SUM, -1, 0, NULL, NULL, NULL, NULL));
    if (R == 2) raise(SIGKILL);
    int x[4] = {0};
    double t0 = dt_now();
    dt_status st;
    if (R == 0) {
        dt_treq q = {0}, *qp = &q;
        CHECK_OK(w->ops->irecv(w, 2, 5, x, sizeof x, &q));
        st = w->ops->waitall(w, &qp, 1, t0 + 20);
        CHECK_MSG(st == DT_EPEER && strstr(dt_last_error(), "rank 2 died during") &&
                      strstr(dt_last_error(), "receive of 16 bytes, tag 5") && strstr(dt_last_error(), "is gone"),
                  "%s: %s", dt_status_str(st), dt_last_error());
    } else {
        dt_coll_args a = {.d = {.seq = 1, .op = DT_COLL_BROADCAST, .dtype = DT_I32, .root = 1, .count = 4},
                          .send = x,
                          .recv = x,
                          .algo = DT_ALGO_NATIVE,
                          .deadline = t0 + 20};
        st = pair->ops->begin(pair, &a.d);
        if (st == DT_OK) st = pair->ops->coll(pair, &a);
        CHECK_MSG(st == DT_EPEER && strstr(dt_last_error(), "rank 1 died") &&
                      strstr(dt_last_error(), "(world rank 2, pid"),
                  "%s: %s", dt_status_str(st), dt_last_error());
    }
    double dt = dt_now() - t0;
    CHECK_MSG(dt < 5, "rank %d took %.1f s to see rank 2 die", R, dt);
    printf("rank %d after %.2f s: %s\n", R, dt, dt_last_error());
    printf("dead rank %d: %d checks, %d failures\n", R, dt_test_checks, dt_test_failures);
    fflush(stdout);
    if (pair) pair->ops->destroy(pair);
    w->ops->destroy(w); /* broken: no MPI_Finalize, and under --enable-recovery mpirun lets it go */
    return dt_test_failures ? 1 : 0;
}

static size_t parse_bytes(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'k' || *end == 'K') v *= 1024;
    else if (*end == 'm' || *end == 'M') v *= 1024 * 1024;
    return v < 4 ? 4 : (size_t)v;
}

/* "bench SIZE...": f32 sum allreduce of each size (bytes, k/m suffixes): plain blocking
 * MPI_Allreduce against the transport's native path (MPI_Iallreduce polled against a
 * deadline, with the op check). Best of 3 rounds; for measuring, never asserted. */
static int mode_bench(int nsizes, char **sizes) {
    dt_transport *t = NULL;
    CHECK_OK(dt_transport_mpi_create(&t, &(dt_transport_params){.timeout_s = 60}));
    if (!t) return 1;
    R = t->rank;
    N = t->size;
    if (R == 0)
        printf("%12s %10s %14s %10s %14s %10s\n", "bytes", "ranks", "MPI_Allreduce", "busbw", "native", "busbw");
    for (int k = 0; k < nsizes; k++) {
        size_t bytes = parse_bytes(sizes[k]), n = bytes / 4;
        int iters = (int)(50e6 / (double)(bytes + 20000)); /* about 50 ms per round */
        iters = iters < 5 ? 5 : iters > 2000 ? 2000 : iters;
        float *a = dt_alloc(n * 4), *b = dt_alloc(n * 4);
        double base = 1e30, nat = 1e30;
        for (int round = 0; round < 3; round++) {
            double us = 0;
            CHECK_OK(dt_comm_bench_mpi_allreduce(n, 2, iters, &us));
            if (us < base) base = us;
            dt_coll_args x = {.d = {.op = DT_COLL_ALLREDUCE, .dtype = DT_F32, .count = n},
                              .send = a,
                              .recv = b,
                              .algo = DT_ALGO_NATIVE};
            double t0 = 0;
            for (int i = 0; i < iters + 2; i++) {
                if (i == 2) t0 = dt_now();
                x.d.seq = ++dt_mpi_test_seq;
                x.deadline = dt_now() + 60;
                CHECK_OK(t->ops->begin(t, &x.d));
                CHECK_OK(t->ops->coll(t, &x));
            }
            double mine = (dt_now() - t0) / iters * 1e6, worst = 0;
            x = (dt_coll_args){.d = {.seq = ++dt_mpi_test_seq,
                                     .op = DT_COLL_ALLREDUCE,
                                     .dtype = DT_F64,
                                     .redop = DT_OP_MAX,
                                     .count = 1},
                               .send = &mine,
                               .recv = &worst,
                               .algo = DT_ALGO_NATIVE,
                               .deadline = dt_now() + 60};
            CHECK_OK(t->ops->begin(t, &x.d));
            CHECK_OK(t->ops->coll(t, &x)); /* time of the slowest rank, like the baseline */
            if (worst < nat) nat = worst;
        }
        double f = 2.0 * (N - 1) / N * (double)n * 4 / 1e3; /* busbw in GB/s = f / usec */
        if (R == 0)
            printf("%12zu %10d %11.1f us %6.2f GB/s %11.1f us %6.2f GB/s\n", n * 4, N, base, f / base, nat, f / nat);
        dt_free(a);
        dt_free(b);
    }
    t->ops->destroy(t);
    return dt_test_failures ? 1 : 0;
}

/* The polling loop's naps (pure arithmetic): none while a collective's data can still be moving
 * (a 64 MiB reduce napped 640 us between the MPI_Tests that drive libnbc: ~400x too slow), short
 * ones up to 10x that time, the long ones only after. */
static void test_naps(void) {
    dt_mpi_idle w = dt_mpi_idle_for(64.0 * 1048576);
    CHECK_MSG(w.busy_s > 0.25 && w.busy_s < 0.3, "busy window %g s for 64 MiB", w.busy_s);
    CHECK(dt_mpi_nap_ns(&w, 0.0001, 200e-6) == 0 && dt_mpi_nap_ns(&w, 0.2, 200e-6) == 0);
    w.naps = 6;
    CHECK(dt_mpi_nap_ns(&w, 0.5, 200e-6) == 20000 && dt_mpi_nap_ns(&w, 3.0, 200e-6) == 320000);
    w.naps = 9;
    CHECK(dt_mpi_nap_ns(&w, 3.0, 200e-6) == 640000);
    dt_mpi_idle small = dt_mpi_idle_for(0); /* a barrier: 1 ms */
    CHECK(dt_mpi_nap_ns(&small, 0.0005, 200e-6) == 0 && dt_mpi_nap_ns(&small, 0.002, 200e-6) == 5000);
}

/* mpirun's flags for every mode: any number of ranks on this machine, shared memory and TCP */
#define FLAGS "--oversubscribe --bind-to none --mca btl self,vader,tcp"

int main(int argc, char **argv) {
    if (!getenv("OMPI_COMM_WORLD_SIZE")) test_naps();
    if (getenv("OMPI_COMM_WORLD_SIZE")) {
        if (argc > 2 && !strcmp(argv[1], "bench")) return mode_bench(argc - 2, argv + 2);
        if (argc > 1 && !strcmp(argv[1], "dead")) return mode_dead();
        return argc > 1 && !strcmp(argv[1], "errors") ? mode_errors() : mode_ok();
    }
    if (argc > 1 && !strcmp(argv[1], "--probe-only")) return 0; /* built with MPI */
    int skip = dt_mpi_test_launch_env();
    if (skip) return skip;
    static char out[1 << 16];
    for (int np = 2; np <= 4; np++) {
        double t0 = dt_now();
        int rc = dt_mpi_test_mpirun(np, 90, FLAGS, "ok", out, sizeof out);
        CHECK_MSG(rc == 0, "mpirun -np %d exited %d:\n%s", np, rc, out);
        int passed = dt_mpi_test_count(out, ", 0 failures");
        CHECK_MSG(passed == np, "%d of %d ranks passed:\n%s", passed, np, out);
        printf("ok mode, %d ranks: %s (%.1f s)\n", np, rc == 0 && passed == np ? "passed" : "FAILED", dt_now() - t0);
    }
    /* errors mode ends without MPI_Finalize on purpose, so mpirun's own status is not checked */
    double t0 = dt_now();
    dt_mpi_test_mpirun(3, 90, "--quiet " FLAGS, "errors", out, sizeof out);
    int passed = dt_mpi_test_count(out, "checks, 0 failures");
    CHECK_MSG(passed == 3, "errors mode: %d of 3 ranks passed:\n%s", passed, out);
    printf("errors mode, 3 ranks: %s (%.1f s)\n", passed == 3 ? "passed" : "FAILED", dt_now() - t0);
    /* a killed rank: mpirun --enable-recovery keeps the others (and exits 0 whatever they do) */
    t0 = dt_now();
    dt_mpi_test_mpirun(3, 90, "--quiet --enable-recovery " FLAGS, "dead", out, sizeof out);
    passed = dt_mpi_test_count(out, "checks, 0 failures");
    CHECK_MSG(passed == 2, "dead mode: %d of 2 surviving ranks passed:\n%s", passed, out);
    printf("dead mode, 3 ranks, rank 2 killed: %s (%.1f s)\n", passed == 2 ? "passed" : "FAILED", dt_now() - t0);
    return dt_test_summary("transport_mpi_test");
}
#endif
