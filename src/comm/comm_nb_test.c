/* Non-blocking ops (overlap with computation, progress without polling, several outstanding,
 * isend/irecv posted in any order), split into sub-communicators, creation from the
 * environment, issue order of ops whose input overlaps their output, and the small-message stress
 * run: 8 ranks x 1000 allreduces. */
#include "comm/comm_testlib.h"

#include <math.h>
#include <stdlib.h>

static int test_nonblocking(int R, int N, const char *job, void *arg) {
    (void)arg;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 60));
    if (!c) return 1;
    /* overlap: start a 4 MiB allreduce, compute, then wait */
    size_t n = 1 << 20;
    float *g = malloc(n * 4), *out = malloc(n * 4);
    for (size_t i = 0; i < n; i++) g[i] = (float)((R + i) % 7);
    dt_request *rq = NULL;
    CHECK_OK(dt_comm_iallreduce(c, g, out, n, DT_F32, DT_OP_SUM, &rq));
    double acc = 0;
    const size_t M = 2000000;
    for (size_t i = 0; i < M; i++) acc += sin((double)i * 1e-3);
    /* the computation overlapped with the allreduce, and it was right: sum_{i<M} sin(i h) =
     * sin(M h / 2) sin((M - 1) h / 2) / sin(h / 2) */
    const double closed = sin(M * 1e-3 / 2) * sin((M - 1) * 1e-3 / 2) / sin(1e-3 / 2);
    CHECK_MSG(fabs(acc - closed) < 1e-6, "compute during the allreduce: %.9g, closed form %.9g", acc, closed);
    /* the input of an out-of-place allreduce is left alone while it runs */
    size_t changed = 0;
    for (size_t i = 0; i < n; i++) changed += g[i] != (float)((R + i) % 7);
    CHECK_MSG(changed == 0, "iallreduce changed %zu elements of its input", changed);
    CHECK_OK(dt_request_wait(&rq));
    CHECK(rq == NULL);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < N; r++) want += (float)((r + i) % 7);
        bad += out[i] != want;
    }
    CHECK_MSG(bad == 0, "iallreduce: %zu wrong elements", bad);

    /* progress without polling: nobody calls into the communicator while it runs */
    CHECK_OK(dt_comm_iallreduce(c, g, g, n, DT_F32, DT_OP_MAX, &rq));
    /* dt_request_test only reads a flag; sleep between looks (long enough for a loaded machine) */
    bool done = false;
    for (int tries = 0; tries < 300 && !done; tries++) {
        usleep(100000);
        CHECK_OK(dt_request_test(&rq, &done));
    }
    CHECK_MSG(done, "iallreduce of 4 MiB not finished after 30 s without a wait");
    if (!done) CHECK_OK(dt_request_wait(&rq));

    /* several outstanding ops of different kinds, then a blocking one */
    int64_t bc[1000];
    float ag[64 * 8], ag_in[8], rs_in[8 * 64], rs_out[8];
    for (int i = 0; i < 1000; i++) bc[i] = R == N - 1 ? i * 3 : -1;
    for (int i = 0; i < 8; i++) ag_in[i] = (float)(R * 8 + i);
    for (int i = 0; i < 8 * N; i++) rs_in[i] = (float)(i + R);
    dt_request *rs[4];
    CHECK_OK(dt_comm_ibroadcast(c, bc, 1000, DT_I64, N - 1, &rs[0]));
    CHECK_OK(dt_comm_iallgather(c, ag_in, ag, 8, DT_F32, &rs[1]));
    CHECK_OK(dt_comm_ireduce_scatter(c, rs_in, rs_out, 8, DT_F32, DT_OP_SUM, &rs[2]));
    CHECK_OK(dt_comm_iallreduce(c, out, out, 1000, DT_F32, DT_OP_MIN, &rs[3]));
    float one = (float)R, sum = 0;
    CHECK_OK(dt_comm_allreduce(c, &one, &sum, 1, DT_F32, DT_OP_SUM));
    CHECK(sum == (float)(N * (N - 1) / 2));
    CHECK_OK(dt_request_waitall(rs, 4));
    for (int i = 0; i < 1000; i++) bad += bc[i] != i * 3;
    for (int i = 0; i < 8 * N; i++) bad += ag[i] != (float)i;
    for (int i = 0; i < 8; i++) {
        float want = 0;
        for (int r = 0; r < N; r++) want += (float)(R * 8 + i + r);
        bad += rs_out[i] != want;
    }
    CHECK_MSG(bad == 0, "outstanding non-blocking ops: %zu wrong elements", bad);

    /* isend/irecv: everyone posts receives first (two tags, in the opposite order of the sends) */
    if (N > 1) {
        int right = (R + 1) % N, left = (R + N - 1) % N;
        size_t m = 200003;
        float *a = malloc(m * 4), *b = malloc(m * 4), small_in = -1, small_out = (float)R;
        for (size_t i = 0; i < m; i++) a[i] = (float)(R * 1000 + (int)(i % 1000));
        dt_request *p[4];
        CHECK_OK(dt_comm_irecv(c, b, m, DT_F32, left, 7, &p[0]));
        CHECK_OK(dt_comm_irecv(c, &small_in, 1, DT_F32, left, 8, &p[1]));
        CHECK_OK(dt_comm_isend(c, &small_out, 1, DT_F32, right, 8, &p[2]));
        CHECK_OK(dt_comm_isend(c, a, m, DT_F32, right, 7, &p[3]));
        CHECK_OK(dt_request_waitall(p, 4));
        for (size_t i = 0; i < m; i++) bad += b[i] != (float)(left * 1000 + (int)(i % 1000));
        CHECK_MSG(bad == 0 && small_in == (float)left, "isend/irecv: %zu wrong, small %g", bad, small_in);
        /* a blocking collective while a receive is still pending, then its send */
        dt_request *late;
        CHECK_OK(dt_comm_irecv(c, &small_in, 1, DT_F32, left, 9, &late));
        CHECK_OK(dt_comm_barrier(c));
        CHECK_OK(dt_comm_send(c, &small_out, 1, DT_F32, right, 9));
        CHECK_OK(dt_request_wait(&late));
        CHECK(small_in == (float)left);
        /* a receive that waits in the background for longer than the progress thread's naps */
        small_in = -1;
        CHECK_OK(dt_comm_irecv(c, &small_in, 1, DT_F32, left, 10, &late));
        usleep(300000);
        CHECK_OK(dt_comm_isend(c, &small_out, 1, DT_F32, right, 10, &p[0]));
        CHECK_OK(dt_request_wait(&p[0]));
        CHECK_OK(dt_request_wait(&late));
        CHECK(small_in == (float)left);
        CHECK_OK(dt_comm_barrier(c)); /* the background wait left the job healthy */
        /* rank 0 sends a large tag-21 message then a small tag-22 one; rank 1 receives 22 first,
         * so 21 is buffered as unexpected, and its receive is posted while that is under way */
        if (R == 0) {
            CHECK_OK(dt_comm_isend(c, a, m, DT_F32, 1, 21, &p[0]));
            CHECK_OK(dt_comm_isend(c, &small_out, 1, DT_F32, 1, 22, &p[1]));
            CHECK_OK(dt_request_waitall(p, 2));
        } else if (R == 1) {
            small_in = -1;
            memset(b, 0, m * 4);
            CHECK_OK(dt_comm_irecv(c, &small_in, 1, DT_F32, 0, 22, &p[0]));
            CHECK_OK(dt_comm_irecv(c, b, m, DT_F32, 0, 21, &p[1]));
            CHECK_OK(dt_request_waitall(p, 2));
            for (size_t i = 0; i < m; i++) bad += b[i] != (float)(int)(i % 1000);
            CHECK_MSG(bad == 0 && small_in == 0.0f, "unexpected-message path: %zu wrong", bad);
        }
        free(a);
        free(b);
    }
    free(g);
    free(out);
    dt_comm_destroy(c);
    return dt_test_failures;
}

static int test_split(int R, int N, const char *job, void *arg) {
    (void)arg;
    dt_comm *c = NULL, *s = NULL, *s2 = NULL, *none = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 60));
    if (!c) return 1;
    /* even/odd, ordered by descending parent rank */
    CHECK_OK(dt_comm_split(c, R % 2, -R, &s));
    if (!s) return 1;
    int members = (N - R % 2 + 1) / 2, pos = 0;
    for (int r = N - 1; r > R; r--) pos += r % 2 == R % 2;
    CHECK_MSG(dt_comm_size(s) == members && dt_comm_rank(s) == pos, "split: rank %d size %d, want %d of %d",
              dt_comm_rank(s), dt_comm_size(s), pos, members);
    int64_t v = R, sum = 0;
    CHECK_OK(dt_comm_allreduce(s, &v, &sum, 1, DT_I64, DT_OP_SUM));
    int64_t want = 0;
    for (int r = R % 2; r < N; r += 2) want += r;
    CHECK(sum == want);
    /* the parent still works, interleaved with the child */
    CHECK_OK(dt_comm_allreduce(c, &v, &sum, 1, DT_I64, DT_OP_MAX));
    CHECK(sum == N - 1);
    /* split of a split; and a color that opts out */
    CHECK_OK(dt_comm_split(s, dt_comm_rank(s) < 2 ? 0 : 1, 0, &s2));
    if (s2) {
        int64_t one = 1, cnt = 0;
        CHECK_OK(dt_comm_allreduce(s2, &one, &cnt, 1, DT_I64, DT_OP_SUM));
        CHECK(cnt == dt_comm_size(s2));
    }
    CHECK_OK(dt_comm_split(c, R == 0 ? DT_COMM_UNDEFINED : 5, R, &none));
    CHECK(R == 0 ? none == NULL : none != NULL && dt_comm_size(none) == N - 1 && dt_comm_rank(none) == R - 1);
    if (none) {
        float x = 1, y = 0;
        CHECK_OK(dt_comm_allreduce(none, &x, &y, 1, DT_F32, DT_OP_SUM));
        CHECK(y == (float)(N - 1));
    }
    CHECK_OK(dt_comm_barrier(c));
    dt_comm_destroy(none);
    dt_comm_destroy(s2);
    dt_comm_destroy(s);
    dt_comm_destroy(c);
    return dt_test_failures;
}

static int test_from_env(int R, int N, const char *job, void *arg) {
    (void)arg;
    char buf[32];
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_RANK");
    unsetenv("SLURM_PROCID");
    snprintf(buf, sizeof buf, "%d", R);
    setenv("DTRAIN_RANK", buf, 1);
    setenv("DTRAIN_LOCAL_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", N);
    setenv("DTRAIN_WORLD_SIZE", buf, 1);
    setenv("DTRAIN_JOB_ID", job, 1);
    setenv("DTRAIN_TIMEOUT", "30", 1);
    dt_comm *c = NULL;
    CHECK_OK(dt_comm_create_from_env(&c, NULL));
    if (!c) return 1;
    CHECK(dt_comm_rank(c) == R && dt_comm_size(c) == N && !strcmp(dt_comm_backend_name(c), "shm"));
    double x = R + 1, y = 0;
    CHECK_OK(dt_comm_allreduce(c, &x, &y, 1, DT_F64, DT_OP_SUM));
    CHECK(y == N * (N + 1) / 2.0);
    dt_comm_destroy(c);
    /* no launcher environment: a world of one */
    unsetenv("DTRAIN_RANK");
    unsetenv("DTRAIN_WORLD_SIZE");
    CHECK_OK(dt_comm_create_from_env(&c, NULL));
    CHECK(c && dt_comm_size(c) == 1 && !strcmp(dt_comm_backend_name(c), "self"));
    dt_comm_destroy(c);
    /* a bad environment is an error that names the variable */
    setenv("DTRAIN_RANK", "x", 1);
    setenv("DTRAIN_WORLD_SIZE", "2", 1);
    CHECK(dt_comm_create_from_env(&c, NULL) == DT_EINVAL && strstr(dt_last_error(), "DTRAIN_RANK"));
    return dt_test_failures;
}

/* Issue order with overlapping slices: an op whose input overlaps its output (a private copy of
 * the input is made) must take that copy when it runs, after every earlier op of the
 * communicator, not when it is issued: here its input is the result of an earlier in-place
 * iallreduce on the neighbouring slice. Rank 0 issues both ops while the first cannot have
 * finished (the other ranks join it only once rank 0 says both are issued: a shared flag, no
 * timing), so a copy taken at issue time reads the un-reduced values on rank 0 (and its memmove
 * writes into the slice the first op is still reducing). */
typedef struct {
    volatile int issued;
} order_arg;

static int test_issue_order(int R, int N, const char *job, void *arg) {
    order_arg *oa = arg;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 60));
    if (!c) return 1;
    enum { M = 96, S = 16 }; /* a: in place on x[0, 2M); b: x[M, 2M) -> x[M + S, 2M + S); rs: y */
    float x[3 * M], y[2 * M * 8];
    size_t bad = 0;
    for (int i = 0; i < 3 * M; i++) x[i] = (float)((R + i) % 5);
    for (int i = 0; i < 2 * M * 8; i++) y[i] = (float)((R * 3 + i) % 7);
    if (R != 0)
        for (int k = 0; k < 30000 && !oa->issued; k++) usleep(1000); /* join only after rank 0 issued */
    dt_request *rq[4];
    CHECK_OK(dt_comm_iallreduce(c, x, x, 2 * M, DT_F32, DT_OP_SUM, &rq[0]));
    CHECK_OK(dt_comm_iallreduce(c, x + M, x + M + S, M, DT_F32, DT_OP_SUM, &rq[1]));
    /* reduce-scatter of y's first N*M floats (in place) whose result block feeds an overlapping one */
    CHECK_OK(dt_comm_iallreduce(c, y, y, (size_t)N * M, DT_F32, DT_OP_SUM, &rq[2]));
    CHECK_OK(dt_comm_ireduce_scatter(c, y, y + M / 2, M, DT_F32, DT_OP_SUM, &rq[3]));
    if (R == 0) oa->issued = 1;
    CHECK_OK(dt_request_waitall(rq, 4));
    for (int i = 0; i < M; i++) { /* x[0, M): reduced once; x[M + S, 2M + S): x[M, 2M) reduced, reduced again */
        float a = 0;
        for (int r = 0; r < N; r++) a += (float)((r + i) % 5);
        bad += x[i] != a;
        float b = 0;
        for (int r = 0; r < N; r++) b += (float)((r + M + i) % 5);
        bad += x[M + S + i] != (float)N * b;
    }
    for (int i = 0; i < M; i++) { /* block R of the allreduced y, summed over N ranks */
        float a = 0;
        for (int r = 0; r < N; r++) a += (float)((r * 3 + R * M + i) % 7);
        bad += y[M / 2 + i] != (float)N * a;
    }
    CHECK_MSG(bad == 0,
              "rank %d: %zu wrong elements: an overlapping input was copied before the earlier op that "
              "writes it ran",
              R, bad);
    dt_comm_destroy(c);
    return dt_test_failures;
}

static int test_stress(int R, int N, const char *job, void *arg) {
    double *elapsed = arg;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 60));
    if (!c) return 1;
    float v[16], out[16];
    double t0 = dt_now();
    size_t bad = 0;
    for (int it = 0; it < 1000; it++) {
        for (int i = 0; i < 16; i++) v[i] = (float)(R + it + i);
        dt_status st = dt_comm_allreduce(c, v, out, 16, DT_F32, DT_OP_SUM);
        if (st != DT_OK) {
            CHECK_OK(st);
            break;
        }
        for (int i = 0; i < 16; i++) bad += out[i] != (float)(N * (N - 1) / 2 + N * (it + i));
    }
    CHECK_MSG(bad == 0, "stress: %zu wrong results", bad);
    if (R == 0) *elapsed = dt_now() - t0;
    dt_comm_destroy(c);
    return dt_test_failures;
}

int main(void) {
    static const int sizes[] = {1, 2, 3, 5, 8};
    for (int k = 0; k < 5; k++) {
        CHECK_MSG(dt_run_ranks(sizes[k], test_nonblocking, NULL, 60) == 0, "non-blocking, %d ranks", sizes[k]);
        CHECK(dt_test_shm_gone(dt_test_job));
    }
    for (int n = 2; n <= 7; n += 5) {
        CHECK_MSG(dt_run_ranks(n, test_split, NULL, 60) == 0, "split, %d ranks", n);
        char pat[160];
        snprintf(pat, sizeof pat, "ls /dev/shm | grep -q 'dtrain-%s'", dt_test_job);
        CHECK_MSG(system(pat) != 0, "split segments of job %s left in /dev/shm", dt_test_job);
    }
    CHECK_MSG(dt_run_ranks(3, test_from_env, NULL, 60) == 0, "create from environment");
    order_arg *oa = dt_test_shared(sizeof *oa);
    for (int n = 2; n <= 4; n++) {
        oa->issued = 0;
        CHECK_MSG(dt_run_ranks(n, test_issue_order, oa, 60) == 0, "issue order of overlapping ops, %d ranks", n);
    }
    double *elapsed = dt_test_shared(sizeof(double));
    CHECK_MSG(dt_run_ranks(8, test_stress, elapsed, 60) == 0, "stress");
    printf("8 ranks x 1000 allreduces of 16 floats: %.2f s (%.1f us each)\n", *elapsed, *elapsed * 1e3);
    /* no time bound here (a loaded CI machine only slows it): a rank that spins instead of
     * yielding shows as a hang, which dt_run_ranks' 60 s deadline fails */
    return dt_test_summary("comm_nb_test");
}
