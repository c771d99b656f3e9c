/* Test of the NCCL transport (transport_nccl*.c), through the communicator.
 * Everywhere it is built: the registry picks nccl for ranks on "cuda" and not otherwise, and on a
 * machine without a usable GPU, 2 forked ranks naming it both fail with DT_ENOTSUP and one
 * message that names a rank and says what to use instead (nothing hangs).
 * With GPUs (run by `make test-gpu`, tests/gpu/nccl.sh): ranks = min(2, GPUs), one per GPU (NCCL
 * cannot run two ranks on one GPU): every collective on cudaMalloc'ed buffers against values
 * computed on the host (comm_testlib's exact small integers), the in-place forms, grouped device
 * send/recv in a pairwise exchange, host buffers still going through the bootstrap, and with 2
 * ranks a rank that skips an allreduce: the other fails with DT_ETIMEDOUT by its deadline.
 * Exit 77 (skipped) when built without NCCL. */
#include "comm/comm_testlib.h"

#ifndef DT_HAVE_NCCL
int main(void) {
    printf("transport_nccl_test: skipped: built without NCCL (make NCCL=1 with CUDA_HOME/include/nccl.h)\n");
    return 77;
}
#else
#include <cuda_runtime_api.h>
#include <stdlib.h>

static int gpu_count(void) { /* in a child: CUDA must not be initialised in the parent before fork */
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess ? (n > 100 ? 100 : n) : 0);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

static dt_status nccl_comm(dt_comm **c, int rank, int size, const char *job, double timeout) {
    char dev[16];
    snprintf(dev, sizeof dev, "cuda:%d", rank);
    dt_comm_config cfg = dt_comm_config_default();
    cfg.rank = rank, cfg.size = size, cfg.job_id = job, cfg.timeout_s = timeout;
    cfg.transport = "nccl";
    cfg.device = dev;
    return dt_comm_create(c, &cfg);
}

/* no usable GPU: both ranks fail alike, naming a rank and the way out */
static int no_gpu_rank(int rank, int size, const char *job, void *arg) {
    (void)arg;
    dt_comm *c = NULL;
    CHECK(nccl_comm(&c, rank, size, job, 20) == DT_ENOTSUP && c == NULL);
    CHECK_MSG(strstr(dt_last_error(), "needs a CUDA device on every rank") && strstr(dt_last_error(), "rank 0: ") &&
                  strstr(dt_last_error(), "`backend` shm or mpi"),
              "rank %d: %s", rank, dt_last_error());
    return dt_test_failures;
}

static void *dalloc(size_t bytes) {
    void *p = NULL;
    return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}
static void up(void *d, const float *h, size_t n) { cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice); }
static void down(float *h, const void *d, size_t n) { cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost); }

/* input element i of rank r for op, and the result of the sum over n ranks */
static float in(int r, size_t i) { return (float)dt_test_vsum(r, i); }
static float sum(int n, size_t i) {
    float s = 0;
    for (int r = 0; r < n; r++) s += in(r, i);
    return s;
}

/* allreduce (out of and in place), reduce-scatter (both), allgather (both), broadcast, reduce */
static void reductions(dt_comm *c, int R, int N, size_t cnt, float *h, float *g, float *dv, float *dw) {
    for (size_t i = 0; i < N * cnt; i++) h[i] = in(R, i);
    up(dv, h, N * cnt);
    CHECK_OK(dt_comm_allreduce(c, dv, dw, N * cnt, DT_F32, DT_OP_SUM));
    down(g, dw, N * cnt);
    for (size_t i = 0; i < N * cnt; i++) CHECK_MSG(g[i] == sum(N, i), "allreduce [%zu] %g != %g", i, g[i], sum(N, i));
    CHECK_OK(dt_comm_allreduce(c, dv, dv, N * cnt, DT_F32, DT_OP_AVG));
    down(g, dv, N * cnt);
    for (size_t i = 0; i < N * cnt; i++) CHECK(g[i] == sum(N, i) / N);
    up(dv, h, N * cnt);
    CHECK_OK(dt_comm_reduce_scatter(c, dv, dw, cnt, DT_F32, DT_OP_SUM));
    down(g, dw, cnt);
    for (size_t i = 0; i < cnt; i++) CHECK_MSG(g[i] == sum(N, R * cnt + i), "reduce_scatter [%zu]", i);
    CHECK_OK(dt_comm_reduce_scatter(c, dv, dv, cnt, DT_F32, DT_OP_SUM)); /* in place: result at the start */
    down(g, dv, cnt);
    for (size_t i = 0; i < cnt; i++) CHECK_MSG(g[i] == sum(N, R * cnt + i), "reduce_scatter in place [%zu]", i);
    up(dv, h, cnt);
    CHECK_OK(dt_comm_allgather(c, dv, dw, cnt, DT_F32));
    down(g, dw, N * cnt);
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < cnt; i++) CHECK_MSG(g[r * cnt + i] == in(r, i), "allgather block %d [%zu]", r, i);
    up((float *)dw + R * cnt, h, cnt);
    CHECK_OK(dt_comm_allgather(c, (float *)dw + R * cnt, dw, cnt, DT_F32)); /* in place */
    down(g, dw, N * cnt);
    for (int r = 0; r < N; r++) CHECK(g[r * cnt + 1] == in(r, 1));
    int root = N - 1;
    up(dv, h, cnt);
    CHECK_OK(dt_comm_broadcast(c, dv, cnt, DT_F32, root));
    down(g, dv, cnt);
    for (size_t i = 0; i < cnt; i++) CHECK_MSG(g[i] == in(root, i), "broadcast [%zu]", i);
    up(dv, h, cnt);
    CHECK_OK(dt_comm_reduce(c, dv, dw, cnt, DT_F32, DT_OP_MAX, 0));
    down(g, dw, cnt);
    for (size_t i = 0; R == 0 && i < cnt; i++) {
        float m = in(0, i);
        for (int r = 1; r < N; r++) m = in(r, i) > m ? in(r, i) : m;
        CHECK_MSG(g[i] == m, "reduce max [%zu]", i);
    }
}

/* allgatherv, gather, scatter, alltoall, a pairwise device send/recv exchange */
static void moves(dt_comm *c, int R, int N, size_t cnt, float *h, float *g, float *dv, float *dw) {
    size_t counts[2] = {cnt, cnt / 2 + 1}, displs[2] = {0, cnt};
    for (size_t i = 0; i < N * cnt; i++) h[i] = in(R, i);
    up(dv, h, N * cnt);
    CHECK_OK(dt_comm_allgatherv(c, dv, dw, counts, N > 1 ? displs : NULL, DT_F32));
    down(g, dw, cnt + counts[1]);
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < counts[r]; i++) CHECK_MSG(g[displs[r] + i] == in(r, i), "allgatherv %d [%zu]", r, i);
    CHECK_OK(dt_comm_gather(c, dv, dw, cnt, DT_F32, 0));
    down(g, dw, N * cnt);
    for (int r = 0; R == 0 && r < N; r++) CHECK_MSG(g[r * cnt + 2] == in(r, 2), "gather block %d", r);
    CHECK_OK(dt_comm_scatter(c, dv, dw, cnt, DT_F32, 0)); /* rank 0's block R */
    down(g, dw, cnt);
    CHECK_MSG(g[3] == in(0, R * cnt + 3), "scatter on rank %d", R);
    CHECK_OK(dt_comm_alltoall(c, dv, dw, cnt, DT_F32)); /* block r of mine is rank r's block R */
    down(g, dw, N * cnt);
    for (int r = 0; r < N; r++) CHECK_MSG(g[r * cnt + 4] == in(r, R * cnt + 4), "alltoall from %d", r);
    if (N < 2) return;
    int peer = 1 - R;
    dt_request *s = NULL, *q = NULL;
    CHECK_OK(dt_comm_isend(c, dv, cnt, DT_F32, peer, 5, &s)); /* both send first: grouped, no deadlock */
    CHECK_OK(dt_comm_irecv(c, dw, cnt, DT_F32, peer, 5, &q));
    CHECK_OK(dt_request_wait(&s));
    CHECK_OK(dt_request_wait(&q));
    down(g, dw, cnt);
    CHECK_MSG(g[6] == in(peer, 6), "device send/recv from %d", peer);
}

static int gpu_rank(int rank, int size, const char *job, void *arg) {
    (void)arg;
    const size_t cnt = 1000;
    dt_comm *c = NULL;
    CHECK_OK(nccl_comm(&c, rank, size, job, 20));
    if (!c) return 1;
    CHECK(!strcmp(dt_comm_backend_name(c), "nccl") && dt_comm_device_native(c, "cuda"));
    float *h = malloc(2 * cnt * sizeof *h), *g = malloc(2 * cnt * sizeof *g);
    float *dv = dalloc(2 * cnt * sizeof *dv), *dw = dalloc(2 * cnt * sizeof *dw);
    CHECK(h && g && dv && dw);
    reductions(c, rank, size, cnt, h, g, dv, dw);
    moves(c, rank, size, cnt, h, g, dv, dw);
    float hv[4] = {(float)rank, 1, 2, 3}; /* host memory: the bootstrap transport */
    CHECK_OK(dt_comm_allreduce(c, hv, hv, 4, DT_F32, DT_OP_SUM));
    CHECK(hv[0] == (float)(size * (size - 1) / 2) && hv[3] == 3.0f * size);
    if (size == 2) { /* rank 1 skips an allreduce: rank 0 times out by its deadline, naming the op */
        dt_comm_set_algo(c, DT_ALGO_AUTO);
        if (rank == 0) {
            dt_status st = dt_comm_allreduce(c, dv, dw, cnt, DT_F32, DT_OP_SUM);
            CHECK_MSG(st == DT_ETIMEDOUT && strstr(dt_last_error(), "allreduce") &&
                          strstr(dt_last_error(), "rank 1 never started it"),
                      "skipped allreduce: %d %s", st, dt_last_error());
        } else sleep(8);
    }
    cudaFree(dv), cudaFree(dw), free(h), free(g);
    dt_comm_destroy(c);
    return dt_test_failures;
}

int main(void) {
    setenv("DTRAIN_TIMEOUT", "5", 1);
    int gpus = gpu_count();
    if (gpus < 1) {
        printf("transport_nccl_test: no usable GPU here: checking the clear error of 2 ranks on nccl\n");
        CHECK(dt_run_ranks(2, no_gpu_rank, NULL, 60) == 0);
        return dt_test_summary("transport_nccl_test");
    }
    int n = gpus >= 2 ? 2 : 1;
    if (n == 1) printf("transport_nccl_test: 1 GPU: 1 rank (NCCL cannot run two ranks on one GPU)\n");
    else printf("transport_nccl_test: %d GPUs: 2 ranks, one per GPU\n", gpus);
    CHECK(dt_run_ranks(n, gpu_rank, NULL, 120) == 0);
    return dt_test_summary("transport_nccl_test");
}
#endif
