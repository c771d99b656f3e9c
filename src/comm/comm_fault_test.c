/* No silent hangs: kill -9 of a rank in the middle of collectives (every live rank gets
 * DT_EPEER naming it, the op and its sequence number, within seconds), mismatched collectives
 * (DT_EMISMATCH naming both sides, direct and ring paths), deadlines (DT_ETIMEDOUT naming the
 * missing rank), a rank that leaves, a p2p size mismatch, and /dev/shm left clean after a
 * normal job and after a crash. Two ranks that find the same failure race to publish it: the
 * loser returns the winner's reason once it is written (it returned DT_OK when it read the
 * status first), or its own when the winner leaves before it finishes. */
#include "comm/comm_testlib.h"
#include "comm/shm.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    double kill_time;   /* set by the parent right after kill -9 */
    double latency[16]; /* per rank: error time - kill time */
    int victim;
} kill_shared;

static int kill_rank(int R, int N, const char *job, void *arg) {
    kill_shared *k = arg;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 60));
    if (!c) return 1;
    size_t n = 1 << 18;
    float *buf = malloc(n * 4);
    for (size_t i = 0; i < n; i++) buf[i] = 1;
    dt_status st = DT_OK;
    for (int it = 0; it < 1000000 && st == DT_OK; it++) {
        if (it % 2) { /* also non-blocking: the error comes back through the request */
            dt_request *rq = NULL;
            st = dt_comm_iallreduce(c, buf, buf, n, DT_F32, DT_OP_AVG, &rq);
            if (st == DT_OK) st = dt_request_wait(&rq);
        } else {
            st = dt_comm_allreduce(c, buf, buf, n, DT_F32, DT_OP_AVG);
        }
    }
    double now = dt_now();
    if (R == k->victim) return 1; /* not reached: the parent kills it */
    k->latency[R] = k->kill_time > 0 ? now - k->kill_time : -1;
    char want[64];
    snprintf(want, sizeof want, "rank %d died during allreduce #", k->victim);
    CHECK_MSG(st == DT_EPEER && strstr(dt_last_error(), want) && strstr(dt_last_error(), "(f32 x 262144)"),
              "rank %d got %s: %s", R, dt_status_str(st), dt_last_error());
    /* later calls fail at once with the same message */
    CHECK(dt_comm_barrier(c) == DT_EPEER && strstr(dt_last_error(), want));
    dt_comm_destroy(c);
    free(buf);
    return dt_test_failures;
}

/* the kill test: ranks publish their pids in shared memory, the test kills one of them */
typedef struct {
    kill_shared ks;
    pid_t pids[16];
    char job[64];
    int started;
} kill_ctl;

static int kill_rank_wrapper(int R, int N, const char *job, void *arg) {
    kill_ctl *kc = arg;
    kc->pids[R] = getpid();
    if (R == 0) snprintf(kc->job, sizeof kc->job, "%s", job);
    __atomic_add_fetch(&kc->started, 1, __ATOMIC_SEQ_CST);
    return kill_rank(R, N, job, &kc->ks);
}

static void run_kill(int n, int victim) {
    kill_ctl *kc = dt_test_shared(sizeof *kc);
    memset(kc, 0, sizeof *kc);
    kc->ks.victim = victim;
    fflush(stdout);
    pid_t runner = fork();
    if (runner == 0) _exit(dt_run_ranks(n, kill_rank_wrapper, kc, 60) == 1 ? 0 : 1);
    while (__atomic_load_n(&kc->started, __ATOMIC_SEQ_CST) < n) usleep(1000);
    usleep(300000);              /* let them run collectives for a while */
    kc->ks.kill_time = dt_now(); /* before the kill: a rank may notice it before the next line runs */
    kill(kc->pids[victim], SIGKILL);
    int st = 0;
    waitpid(runner, &st, 0);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kill -9 with %d ranks: a live rank failed", n);
    for (int r = 0; r < n; r++)
        if (r != victim) {
            CHECK_MSG(kc->ks.latency[r] >= 0 && kc->ks.latency[r] < 3, "rank %d noticed after %.2f s", r,
                      kc->ks.latency[r]);
            printf("  %d ranks: rank %d got DT_EPEER %.3f s after kill -9 of rank %d\n", n, r, kc->ks.latency[r],
                   victim);
        }
    CHECK_MSG(dt_test_shm_gone(kc->job), "segment of crashed job %s left in /dev/shm", kc->job);
    munmap(kc, sizeof *kc);
}

static int mismatch_rank(int R, int N, const char *job, void *arg) {
    int algo = *(int *)arg;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, (dt_comm_algo)algo, 20));
    if (!c) return 1;
    float buf[100] = {0};
    CHECK_OK(dt_comm_barrier(c));
    CHECK_OK(dt_comm_allreduce(c, buf, buf, 100, DT_F32, DT_OP_SUM));
    dt_status st = R == N - 1 ? dt_comm_broadcast(c, buf, 100, DT_F32, 0)
                              : dt_comm_allreduce(c, buf, buf, 100, DT_F32, DT_OP_SUM);
    char want[200];
    snprintf(want, sizeof want,
             "called allreduce(f32 x 100, sum) but rank %d called broadcast(f32 x 100, root 0) at #3", N - 1);
    CHECK_MSG(st == DT_EMISMATCH && strstr(dt_last_error(), want), "rank %d (algo %s) got %s: %s", R,
              dt_comm_algo_name((dt_comm_algo)algo), dt_status_str(st), dt_last_error());
    if (R == 0) printf("  %s: %s\n", dt_comm_algo_name((dt_comm_algo)algo), dt_last_error());
    dt_comm_destroy(c);
    return dt_test_failures;
}

static int count_mismatch_rank(int R, int N, const char *job, void *arg) {
    (void)arg;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 20));
    if (!c) return 1;
    int32_t buf[100] = {0};
    dt_status st = dt_comm_allreduce(c, buf, buf, R == 1 ? 50 : 100, DT_I32, DT_OP_MAX);
    CHECK_MSG(st == DT_EMISMATCH && strstr(dt_last_error(), "rank 0 called allreduce(i32 x 100, max) but rank 1 called "
                                                            "allreduce(i32 x 50, max) at #1"),
              "rank %d got %s: %s", R, dt_status_str(st), dt_last_error());
    dt_comm_destroy(c);
    return dt_test_failures;
}

static int timeout_rank(int R, int N, const char *job, void *arg) {
    (void)arg;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 1.0));
    if (!c) return 1;
    if (R == 1) {
        usleep(2500000); /* misses the barrier's deadline, then finds rank 0 gone */
        dt_status st = dt_comm_barrier(c);
        CHECK_MSG(st == DT_EPEER || st == DT_ETIMEDOUT, "late rank got %s", dt_status_str(st));
    } else {
        double t0 = dt_now();
        dt_status st = dt_comm_barrier(c);
        double dt = dt_now() - t0;
        CHECK_MSG(st == DT_ETIMEDOUT && strstr(dt_last_error(), "barrier #1") && strstr(dt_last_error(), "rank 1"),
                  "got %s: %s", dt_status_str(st), dt_last_error());
        /* the hint names what set the deadline: here the config field, not DTRAIN_TIMEOUT */
        CHECK_MSG(strstr(dt_last_error(), "raise dt_comm_config.timeout_s"), "hint: %s", dt_last_error());
        /* not before the deadline; the upper bound only catches a wait that ignores it (a loaded
         * machine may deliver the wake-up late) */
        CHECK_MSG(dt > 0.9 && dt < 10.0, "timeout after %.2f s, want ~1 s", dt);
        printf("  timeout: %s\n", dt_last_error());
    }
    dt_comm_destroy(c);
    return dt_test_failures;
}

static int left_rank(int R, int N, const char *job, void *arg) {
    (void)arg;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 20));
    if (!c) return 1;
    if (R == 1) {
        dt_comm_destroy(c);
        return dt_test_failures;
    }
    float x = 1;
    dt_status st = dt_comm_allreduce(c, &x, &x, 1, DT_F32, DT_OP_SUM);
    CHECK_MSG(st == DT_EPEER && strstr(dt_last_error(), "rank 1 left") && strstr(dt_last_error(), "allreduce #1"),
              "got %s: %s", dt_status_str(st), dt_last_error());
    dt_comm_destroy(c);
    return dt_test_failures;
}

static int p2p_size_rank(int R, int N, const char *job, void *arg) {
    (void)arg;
    (void)N;
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 20));
    if (!c) return 1;
    float b[20] = {0};
    if (R == 0) CHECK_OK(dt_comm_send(c, b, 20, DT_F32, 1, 4));
    else {
        dt_status st = dt_comm_recv(c, b, 10, DT_F32, 0, 4);
        CHECK_MSG(st == DT_EMISMATCH && strstr(dt_last_error(), "rank 0 sent 80 bytes with tag 4"), "got %s: %s",
                  dt_status_str(st), dt_last_error());
    }
    dt_comm_destroy(c);
    return dt_test_failures;
}

/* A peer that did its part of the last collective and then left is no failure: rank 0 waits for
 * rank 1 (which joins 100 ms late), and a test knob holds rank 0 for 600 ms between its look at
 * the phases and its liveness checks; meanwhile rank 1 finishes the allreduce, destroys its
 * communicator and exits. Rank 0 must see the result, not "rank 1 left". */
static int left_after_done_rank(int R, int N, const char *job, void *arg) {
    volatile int *entered = arg;
    if (R == 0) setenv("DTRAIN_SHM_TEST_CHECK_DELAY_MS", "600", 1);
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 30));
    if (!c) return 1;
    int64_t v = R + 1, sum = 0;
    CHECK_OK(dt_comm_allreduce(c, &v, &sum, 1, DT_I64, DT_OP_SUM)); /* both attached and running */
    if (R == 0) *entered = 1;
    else {
        for (int k = 0; k < 10000 && !*entered; k++) usleep(1000);
        usleep(100000);
    }
    dt_status st = dt_comm_allreduce(c, &v, &sum, 1, DT_I64, DT_OP_MAX);
    CHECK_MSG(st == DT_OK, "rank %d: %s", R, dt_last_error());
    CHECK(sum == N);
    dt_comm_destroy(c);
    return dt_test_failures;
}

/* The winner of the abort race, a thread of rank 0 still writing its reason, finishes after 50 ms. */
static void *finish_abort(void *arg) {
    dt_shm *s = arg;
    usleep(50000);
    s->hdr->abort_status = DT_ETIMEDOUT;
    snprintf(s->hdr->abort_msg, sizeof s->hdr->abort_msg, "the winner's reason");
    atomic_store(&s->hdr->abort_state, 2);
    return NULL;
}

/* Rank 0 loses the race to publish an abort. arg 1: a thread of its own is the winner and
 * finishes; 0: rank 1 is the winner and leaves without finishing. No time bound: the loser waits
 * for as long as the winner lives. */
static int abort_race_rank(int R, int N, const char *job, void *arg) {
    const bool finishes = *(const int *)arg;
    dt_transport *t = NULL;
    dt_transport_params p = {.rank = R, .size = N, .local_rank = R, .job_id = job, .timeout_s = 30};
    CHECK_OK(dt_transport_shm_create(&t, &p));
    if (!t) return 1;
    dt_shm *s = (dt_shm *)t;
    if (R == 1 && !finishes) {
        int32_t zero = 0;
        CHECK(atomic_compare_exchange_strong(&s->hdr->abort_state, &zero, 3 + 1));
    }
    if (R == 0) {
        pthread_t th;
        if (finishes) {
            int32_t zero = 0;
            CHECK(atomic_compare_exchange_strong(&s->hdr->abort_state, &zero, 3 + 0));
            CHECK(pthread_create(&th, NULL, finish_abort, s) == 0);
        } else {
            while (atomic_load(&s->hdr->abort_state) != 3 + 1) sched_yield(); /* rank 1 took it */
        }
        const dt_status st = dt_shm_fail(s, DT_EMISMATCH, "the loser's reason");
        if (finishes) pthread_join(th, NULL);
        const char *want = finishes ? "the winner's reason" : "the loser's reason";
        CHECK_MSG(st == (finishes ? DT_ETIMEDOUT : DT_EMISMATCH) && strstr(dt_last_error(), want),
                  "the loser of the abort race (the winner %s) got %s: %s", finishes ? "finishes" : "leaves",
                  dt_status_str(st), dt_last_error());
    }
    t->ops->destroy(t);
    return dt_test_failures;
}

/* ops->behind (the culprit of work the transport did not carry, e.g. nccl's over this bootstrap):
 * rank 0 begins op #1 and is told rank 1 has not; after rank 1 begins it (and says so), nobody. */
static int behind_rank(int R, int N, const char *job, void *arg) {
    (void)arg;
    dt_transport *t = NULL;
    dt_transport_params p = {.rank = R, .size = N, .local_rank = R, .job_id = job, .timeout_s = 30};
    CHECK_OK(dt_transport_shm_create(&t, &p));
    if (!t) return 1;
    dt_coll_desc d = {.seq = 1, .op = DT_COLL_ALLREDUCE, .dtype = DT_F32, .root = -1, .count = 10};
    int token = 0;
    dt_treq q;
    dt_treq *w = &q;
    if (R == 0) {
        CHECK_OK(t->ops->begin(t, &d));
        CHECK_MSG(t->ops->behind(t, 1) == 1, "rank 1 has not begun #1 yet");
        memset(&q, 0, sizeof q);
        CHECK_OK(t->ops->isend(t, 1, 0, &token, sizeof token, &q)); /* "I checked": rank 1 may begin */
        CHECK_OK(t->ops->waitall(t, &w, 1, dt_now() + 20));
        memset(&q, 0, sizeof q);
        CHECK_OK(t->ops->irecv(t, 1, 0, &token, sizeof token, &q)); /* rank 1: "I began it" */
        CHECK_OK(t->ops->waitall(t, &w, 1, dt_now() + 20));
        CHECK_MSG(t->ops->behind(t, 1) == -1 && t->ops->behind(t, 2) == 1, "after rank 1 began #1");
    } else {
        memset(&q, 0, sizeof q);
        CHECK_OK(t->ops->irecv(t, 0, 0, &token, sizeof token, &q));
        CHECK_OK(t->ops->waitall(t, &w, 1, dt_now() + 20));
        CHECK_OK(t->ops->begin(t, &d));
        memset(&q, 0, sizeof q);
        CHECK_OK(t->ops->isend(t, 0, 0, &token, sizeof token, &q));
        CHECK_OK(t->ops->waitall(t, &w, 1, dt_now() + 20));
    }
    t->ops->destroy(t);
    return dt_test_failures;
}

int main(void) {
    CHECK_MSG(dt_run_ranks(2, behind_rank, NULL, 30) == 0, "shm names the rank behind");
    for (int finishes = 1; finishes >= 0; finishes--)
        CHECK_MSG(dt_run_ranks(2, abort_race_rank, &finishes, 30) == 0, "abort race");
    run_kill(4, 2);
    run_kill(3, 0);
    run_kill(2, 1);
    int algos[] = {DT_ALGO_AUTO, DT_ALGO_RING, DT_ALGO_RD};
    for (int a = 0; a < 3; a++)
        for (int n = 2; n <= 3; n++)
            CHECK_MSG(dt_run_ranks(n, mismatch_rank, &algos[a], 30) == 0, "mismatch %d ranks", n);
    CHECK_MSG(dt_run_ranks(2, count_mismatch_rank, NULL, 30) == 0, "count mismatch");
    CHECK_MSG(dt_run_ranks(2, timeout_rank, NULL, 30) == 0, "timeout");
    CHECK_MSG(dt_run_ranks(3, left_rank, NULL, 30) == 0, "rank left");
    volatile int *entered = dt_test_shared(sizeof *entered);
    CHECK_MSG(dt_run_ranks(2, left_after_done_rank, (void *)entered, 30) == 0, "a peer that left after its part");
    CHECK_MSG(dt_run_ranks(2, p2p_size_rank, NULL, 30) == 0, "p2p size mismatch");
    CHECK(dt_test_shm_gone(dt_test_job));
    /* a stale segment with the job's name is reported, and dt_comm_shm_cleanup removes it */
    const char *job = dt_test_new_job();
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s", job);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    dt_comm *c = NULL;
    dt_status st = dt_test_comm(&c, 0, 2, job, DT_ALGO_AUTO, 2);
    CHECK_MSG(st == DT_EIO && strstr(dt_last_error(), "already exists"), "stale segment: %s", dt_last_error());
    CHECK_OK(dt_comm_shm_cleanup(job));
    CHECK(dt_test_shm_gone(job));
    return dt_test_summary("comm_fault_test");
}
