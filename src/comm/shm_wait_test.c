/* How the shm transport waits (shm_wait.c): the policy's arithmetic; the oversubscription it
 * derives from the CPUs every rank may run on (ranks pinned to one shared CPU: no spin; to CPUs of
 * their own: the caller's long spin); which thread uses which policy (the creating thread the
 * rank's, a helper thread calling a blocking one the other, as the progress thread does: decided
 * by the thread, not by whether a wait happened, which depends on timing); and that a job still
 * finishes promptly and right when its ranks outnumber the cores (DDP's step pattern: reduce-scatter,
 * allgather, a small allreduce; 8 ranks on the machine, 2 ranks pinned to one CPU). */
#include "comm/comm_internal.h"
#include "comm/comm_testlib.h"
#include "comm/shm.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

static void test_policy(void) {
    dt_shm_wait_policy fg = dt_shm_wait_policy_for(false, false, NULL);
    CHECK_MSG(fabs(fg.spin_s - 200e-6) < 1e-12 && !fg.spin_yields && fg.yields == 0,
              "caller's thread: %g s, yields %d/%d", fg.spin_s, fg.spin_yields, fg.yields);
    dt_shm_wait_policy bg = dt_shm_wait_policy_for(false, true, "");
    CHECK_MSG(fabs(bg.spin_s - 50e-6) < 1e-12 && bg.spin_yields && bg.yields == 0,
              "progress thread: %g s, yields %d/%d", bg.spin_s, bg.spin_yields, bg.yields);
    for (int b = 0; b < 2; b++) {
        dt_shm_wait_policy o = dt_shm_wait_policy_for(true, b, NULL);
        CHECK_MSG(o.spin_s == 0 && o.yields == 2, "oversubscribed (%s): %g s, %d yields", b ? "progress" : "caller",
                  o.spin_s, o.yields);
        dt_shm_wait_policy e = dt_shm_wait_policy_for(true, b, "30");
        CHECK_MSG(fabs(e.spin_s - 30e-6) < 1e-12, "DTRAIN_SHM_SPIN_US=30: %g s", e.spin_s);
        CHECK(dt_shm_wait_policy_for(false, b, "-5").spin_s == 0);
    }
}

/* arg: -1 pins every rank to the first allowed CPU, else each rank to allowed CPU (rank). */
typedef struct {
    int pin_shared;
    int cpu[2];
} pin_arg;

static int test_cpus(int R, int N, const char *job, void *arg) {
    const pin_arg *a = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(a->pin_shared ? a->cpu[0] : a->cpu[R], &set);
    CHECK(sched_setaffinity(0, sizeof set, &set) == 0);
    dt_transport *t = NULL;
    dt_transport_params p = {.rank = R, .size = N, .local_rank = R, .job_id = job, .timeout_s = 30};
    CHECK_OK(dt_transport_shm_create(&t, &p));
    if (!t) return 1;
    dt_shm *s = (dt_shm *)t;
    const int want = a->pin_shared ? 1 : 2;
    CHECK_MSG(dt_shm_job_cpus(s) == want, "rank %d: the job's ranks may run on %d CPUs, want %d", R, dt_shm_job_cpus(s),
              want);
    int ranks = 0;
    const int host = t->ops->host_cpus(t, &ranks);
    CHECK_MSG(host == want && ranks == N, "rank %d: host_cpus %d with %d ranks, want %d with %d", R, host, ranks, want,
              N);
    if (a->pin_shared)
        CHECK_MSG(s->wait_fg.spin_s == 0 && s->wait_fg.yields == 2, "2 ranks on one CPU: spin %g s", s->wait_fg.spin_s);
    else
        CHECK_MSG(s->wait_fg.spin_s > 0 && !s->wait_fg.spin_yields && s->wait_bg.spin_yields,
                  "2 ranks on 2 CPUs: spin %g s (yields %d), progress thread yields %d", s->wait_fg.spin_s,
                  s->wait_fg.spin_yields, s->wait_bg.spin_yields);
    t->ops->destroy(t);
    return dt_test_failures;
}

/* A blocking allreduce on a thread of its own (as ps's exchange thread): it must wait as a helper. */
static void *helper_allreduce(void *arg) {
    dt_comm *c = arg;
    const dt_shm *s = (const dt_shm *)c->t;
    const bool bg = dt_shm_wait_here(s) == &s->wait_bg;
    int32_t v = 1, sum = 0;
    dt_status st = dt_comm_allreduce(c, &v, &sum, 1, DT_I32, DT_OP_SUM); /* every rank takes part */
    return bg && st == DT_OK && sum == dt_comm_size(c) ? c : NULL;
}

/* DDP's step on n floats: in-place reduce-scatter (avg), allgather, a 1-value allreduce (the stop
 * vote), `steps` times, the last rank's values checked; `nb` non-blocking ones first (their waits
 * on the progress thread); then which policy the rank's own thread and a helper thread wait with. */
typedef struct {
    int steps, nb, pin_shared, cpu0;
} step_arg;

static int test_steps(int R, int N, const char *job, void *arg) {
    const step_arg *a = arg;
    if (a->pin_shared) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(a->cpu0, &set);
        CHECK(sched_setaffinity(0, sizeof set, &set) == 0);
    }
    dt_comm *c = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 60));
    if (!c) return 1;
    int here = 0; /* what the trainer asks to choose its loader thread (dt_loader_prefetch_for) */
    const int host = dt_comm_host_cpus(c, &here);
    CHECK_MSG(here == N && host >= 1 && (!a->pin_shared || host == 1), "rank %d: %d CPUs for %d ranks here", R, host,
              here);
    const size_t per = 1000 + 3, n = per * (size_t)N;
    float *g = malloc(n * sizeof *g);
    int bad = 0;
    for (int k = 0; k < a->steps && !bad; k++) {
        for (size_t i = 0; i < n; i++) g[i] = (float)((R + k + i) % 5);
        if (k < a->nb) {
            dt_request *rq = NULL;
            CHECK_OK(dt_comm_ireduce_scatter(c, g, g, per, DT_F32, DT_OP_SUM, &rq));
            CHECK_OK(dt_request_wait(&rq));
        } else {
            CHECK_OK(dt_comm_reduce_scatter(c, g, g, per, DT_F32, DT_OP_SUM));
        }
        for (size_t i = 0; i < per; i++) g[i] += 1; /* the "update" of this rank's shard */
        memmove(g + (size_t)R * per, g, per * sizeof *g);
        CHECK_OK(dt_comm_allgather(c, g + (size_t)R * per, g, per, DT_F32));
        for (size_t i = 0; i < n && !bad; i++) {
            float want = 1;
            for (int r = 0; r < N; r++) want += (float)((r + k + i) % 5);
            if (g[i] != want) {
                bad = 1;
                CHECK_MSG(0, "rank %d step %d: element %zu is %g, want %g", R, k, i, g[i], want);
            }
        }
        int32_t v = R, mx = -1;
        CHECK_OK(dt_comm_allreduce(c, &v, &mx, 1, DT_I32, DT_OP_MAX));
        if (mx != N - 1) {
            bad = 1;
            CHECK_MSG(0, "rank %d step %d: max %d", R, k, mx);
        }
    }
    /* which policy a wait takes is decided by the thread alone (no timing: whether an op had to
     * wait at all depends on the peer's speed): the rank's own thread the long spin, any other
     * thread (a helper here; the progress thread the same way) the short one */
    dt_shm *s = (dt_shm *)c->t;
    CHECK_MSG(dt_shm_wait_here(s) == &s->wait_fg, "rank %d: the rank's own thread does not wait with wait_fg", R);
    pthread_t th;
    void *ok = NULL;
    CHECK(pthread_create(&th, NULL, helper_allreduce, c) == 0 && pthread_join(th, &ok) == 0);
    CHECK_MSG(ok == c, "rank %d: the helper thread's allreduce failed or waited with the rank's policy", R);
    free(g);
    dt_comm_destroy(c);
    return dt_test_failures;
}

/* 3 ranks on 2 CPUs (ranks 0 and 2 share the first): oversubscribed. A split of ranks 0 and 1
 * (ps's server-worker pairs) runs on 2 CPUs of its own but still shares them with rank 2: it waits
 * as oversubscribed too, without spinning. */
static int test_split_over(int R, int N, const char *job, void *arg) {
    const pin_arg *a = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(a->cpu[R == 1], &set);
    CHECK(sched_setaffinity(0, sizeof set, &set) == 0);
    dt_comm *c = NULL, *pc = NULL;
    CHECK_OK(dt_test_comm(&c, R, N, job, DT_ALGO_AUTO, 60));
    if (!c) return 1;
    const dt_shm *s = (const dt_shm *)c->t;
    CHECK_MSG(s->wait_fg.spin_s == 0 && s->wait_fg.yields == 2, "rank %d: 3 ranks on 2 CPUs: spin %g s", R,
              s->wait_fg.spin_s);
    CHECK_OK(dt_comm_split(c, R < 2 ? 0 : DT_COMM_UNDEFINED, R, &pc));
    if (R < 2 && pc) {
        const dt_shm *ps = (const dt_shm *)pc->t;
        CHECK_MSG(ps->wait_fg.spin_s == 0 && ps->wait_fg.yields == 2 && ps->wait_bg.spin_s == 0,
                  "rank %d: a 2-rank split of a job oversubscribed spins %g s (helpers %g s), yields %d", R,
                  ps->wait_fg.spin_s, ps->wait_bg.spin_s, ps->wait_fg.yields);
    }
    CHECK_MSG(R == 2 || pc, "rank %d: no split", R);
    dt_comm_destroy(pc);
    dt_comm_destroy(c);
    return dt_test_failures;
}

int main(void) {
    test_policy();
    cpu_set_t all;
    int cpus[2], nc = 0;
    if (sched_getaffinity(0, sizeof all, &all) == 0)
        for (int c = 0; c < CPU_SETSIZE && nc < 2; c++)
            if (CPU_ISSET(c, &all)) cpus[nc++] = c;
    if (nc >= 1) {
        pin_arg shared = {1, {cpus[0], cpus[0]}};
        CHECK_MSG(dt_run_ranks(2, test_cpus, &shared, 60) == 0, "2 ranks pinned to CPU %d", cpus[0]);
    }
    if (nc >= 2) {
        pin_arg own = {0, {cpus[0], cpus[1]}};
        CHECK_MSG(dt_run_ranks(2, test_cpus, &own, 60) == 0, "2 ranks on CPUs %d and %d", cpus[0], cpus[1]);
        CHECK_MSG(dt_run_ranks(3, test_split_over, &own, 60) == 0, "a split of 3 ranks on CPUs %d and %d", cpus[0],
                  cpus[1]);
    }
    /* no time bound (a loaded CI machine only slows them down): a rank that spins where it should
     * give the core to its peer shows as a hang, which dt_run_ranks' deadline fails */
    step_arg two = {.steps = 300, .nb = 20},
             shared = {.steps = 300, .nb = 20, .pin_shared = 1, .cpu0 = nc ? cpus[0] : 0};
    CHECK_MSG(dt_run_ranks(2, test_steps, &two, 60) == 0, "DDP's step pattern, 2 ranks");
    CHECK_MSG(dt_run_ranks(2, test_steps, &shared, 60) == 0, "DDP's step pattern, 2 ranks on one CPU");
    step_arg eight = {.steps = 100, .nb = 10};
    CHECK_MSG(dt_run_ranks(8, test_steps, &eight, 60) == 0, "DDP's step pattern, 8 ranks");
    return dt_test_summary("shm_wait_test");
}
