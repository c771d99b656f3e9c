/* Hierarchical allreduce (comm_hier.c) against the exact expected result, nccl-tests style: every
 * rank computes the expected reduction itself. Integer inputs make every dtype exact, so the
 * hierarchical result must equal the flat one bit for bit. Layouts (host of each rank, named by
 * DTRAIN_HOSTNAME): 2 hosts x 2 ranks, 3 hosts x 1-2 ranks, interleaved hosts, one host forced;
 * every dtype and op, counts 0 .. 100003, in place, non-blocking; AUTO turns it on only where
 * ranks share a host and span hosts; FLAT turns it off; pipelined in chunks with a remainder
 * (DTRAIN_HIER_CHUNK, dt_comm_set_hier_chunk);
 * several leaders per host, each owning a slice (DTRAIN_HIER_LEADERS=2).
 * `comm_hier_test mpi` runs the same checks as one rank of an mpirun job across (emulated) hosts,
 * with real hostnames (tests/hier_netns.sh). */
#include "comm/comm_testlib.h"

#include <stdlib.h>

static const dt_dtype g_types[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64};
static const dt_redop g_ops[] = {DT_OP_SUM, DT_OP_AVG, DT_OP_MAX, DT_OP_MIN, DT_OP_PROD};
#define BIG 100003

/* Every dtype, op and count, blocking and in place, and a non-blocking one: exact results. */
static void check_allreduce(dt_comm *c, int R, int N) {
    static const size_t counts[] = {0, 1, 7, 131, BIG};
    double *send = malloc(BIG * 8), *recv = malloc(BIG * 8);
    for (int ti = 0; ti < 6; ti++)
        for (int oi = 0; oi < 5; oi++)
            for (int ci = 0; ci < 5; ci++) {
                dt_dtype t = g_types[ti];
                dt_redop op = g_ops[oi];
                size_t n = counts[ci];
                for (size_t i = 0; i < n; i++) dt_test_put(send, t, i, dt_test_input(op, R, i));
                bool inplace = ci % 2 == 1, nb = ci == 3;
                if (inplace) memcpy(recv, send, n * dt_dtype_size(t));
                const void *in = inplace ? recv : send;
                if (nb) {
                    dt_request *rq = NULL;
                    CHECK_OK(dt_comm_iallreduce(c, in, recv, n, t, op, &rq));
                    CHECK_OK(dt_request_wait(&rq));
                } else CHECK_OK(dt_comm_allreduce(c, in, recv, n, t, op));
                size_t bad = n;
                for (size_t i = 0; i < n && bad == n; i++)
                    if (dt_test_get(recv, t, i) != dt_test_expect(op, t, N, i)) bad = i;
                CHECK_MSG(bad == n, "rank %d: %s %s x %zu: element %zu is %g, want %g", R, dt_dtype_name(t),
                          dt_redop_name(op), n, bad, dt_test_get(recv, t, bad), dt_test_expect(op, t, N, bad));
            }
    free(send), free(recv);
}

typedef struct {
    const char *hosts[8];
    dt_comm_hier_mode mode;
    bool want_on;
    int want_hosts;
    size_t chunk; /* > 0: dt_comm_set_hier_chunk(c, chunk) after setup */
} layout;

static int rank_main(int r, int n, const char *job, void *arg) {
    const layout *l = arg;
    setenv("DTRAIN_HOSTNAME", l->hosts[r], 1);
    dt_comm *c;
    CHECK_OK(dt_test_comm(&c, r, n, job, DT_ALGO_AUTO, 60));
    CHECK_OK(dt_comm_set_hier(c, l->mode));
    if (l->chunk) CHECK_OK(dt_comm_set_hier_chunk(c, l->chunk));
    CHECK_MSG(dt_comm_hier_active(c) == l->want_on, "rank %d: hierarchical %s, want %s", r,
              dt_comm_hier_active(c) ? "on" : "off", l->want_on ? "on" : "off");
    CHECK_MSG(l->mode == DT_HIER_FLAT || dt_comm_hosts(c) == l->want_hosts, "rank %d: %d hosts, want %d", r,
              dt_comm_hosts(c), l->want_hosts);
    check_allreduce(c, r, n);
    dt_comm_destroy(c);
    return dt_test_failures;
}

static int mpi_main(void) {
    dt_comm *c;
    dt_comm_config cfg = dt_comm_config_default();
    cfg.timeout_s = 60;
    if (dt_comm_create_from_env(&c, &cfg) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 2;
    }
    int R = dt_comm_rank(c), N = dt_comm_size(c);
    CHECK_OK(dt_comm_set_hier(c, DT_HIER_AUTO));
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    printf("rank %d of %d on host %s: %d hosts, hierarchical %s\n", R, N, host, dt_comm_hosts(c),
           dt_comm_hier_active(c) ? "on" : "off");
    CHECK_MSG(dt_comm_hier_active(c), "rank %d: ranks span %d hosts with some shared, but hierarchical is off", R,
              dt_comm_hosts(c));
    check_allreduce(c, R, N);
    dt_comm_destroy(c);
    char name[32];
    snprintf(name, sizeof name, "comm_hier_test rank %d", R);
    return dt_test_summary(name);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "mpi")) return mpi_main();
    const int lite = getenv("DTRAIN_SANITIZED") != NULL;
    layout ls[] = {
        {{"a", "a", "b", "b"}, DT_HIER_AUTO, true, 2, 0},      /* 2 hosts x 2 ranks */
        {{"a", "a", "b", "c", "c"}, DT_HIER_AUTO, true, 3, 0}, /* 3 hosts x 1-2 ranks */
        {{"a", "b", "a", "b", "c"}, DT_HIER_AUTO, true, 3, 0}, /* hosts interleaved in rank order */
        {{"a", "b", "c"}, DT_HIER_AUTO, false, 3, 0},          /* one rank per host: nothing to gain */
        {{"a", "a", "a"}, DT_HIER_AUTO, false, 1, 0},          /* one host */
        {{"a", "a", "a"}, DT_HIER_ON, true, 1, 0},             /* forced */
        {{"a", "a", "b", "b"}, DT_HIER_FLAT, false, 0, 0},     /* forced off */
    };
    int nl = (int)(sizeof ls / sizeof *ls);
    for (int k = 0; k < nl; k++) {
        if (lite && k > 1) break;
        int n = 0;
        while (n < 8 && ls[k].hosts[n]) n++;
        CHECK_MSG(dt_run_ranks(n, rank_main, &ls[k], 120) == 0, "layout %d (%d ranks) failed", k, n);
        printf("layout %d: %d ranks on hosts", k, n);
        for (int r = 0; r < n; r++) printf(" %s", ls[k].hosts[r]);
        printf(", mode %d: exact\n", (int)ls[k].mode);
    }
    layout sliced[] = {
        {{"a", "a", "b", "b"}, DT_HIER_AUTO, true, 2, 0},           /* 2 hosts x 2 ranks, 2 leaders each */
        {{"a", "b", "a", "b", "c", "c"}, DT_HIER_AUTO, true, 3, 0}, /* 3 hosts x 2, interleaved */
        {{"a", "a", "b", "c", "c"}, DT_HIER_AUTO, true, 3, 0},      /* a host of 1: one leader per host */
    };
    setenv("DTRAIN_HIER_LEADERS", "2", 1); /* 2 leaders per host, each owning a slice: exact too */
    for (int k = 0; k < (lite ? 1 : 3); k++) {
        int n = k == 0 ? 4 : k == 1 ? 6 : 5;
        CHECK_MSG(dt_run_ranks(n, rank_main, &sliced[k], 120) == 0, "sliced layout %d failed", k);
        printf("sliced layout %d (%d ranks, 2 leaders per host where every host has 2): exact\n", k, n);
    }
    unsetenv("DTRAIN_HIER_LEADERS");
    /* pipelined: 64 KiB chunks from the environment (f32 x 100003: 6 whole chunks and a
     * remainder), then 40000 B chunks set through the API (f32: 10 whole chunks of 10000 and a
     * remainder of 3; f64: 20 and 3; halves 5 and 3; 131 elements: one short chunk) */
    setenv("DTRAIN_HIER_CHUNK", "65536", 1);
    CHECK_MSG(dt_run_ranks(4, rank_main, &ls[0], 120) == 0, "layout 0 pipelined (64 KiB, environment) failed");
    printf("layout 0 pipelined in 64 KiB chunks (DTRAIN_HIER_CHUNK): exact\n");
    unsetenv("DTRAIN_HIER_CHUNK");
    for (int k = 0; k < 2; k++) {
        layout l = ls[k];
        l.chunk = 40000;
        CHECK_MSG(dt_run_ranks(k ? 5 : 4, rank_main, &l, 120) == 0, "layout %d pipelined (40000 B chunks) failed", k);
        printf("layout %d pipelined in 40000 B chunks (dt_comm_set_hier_chunk; remainder chunks): exact\n", k);
    }
    return dt_test_summary("comm_hier_test");
}
