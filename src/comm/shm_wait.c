/* How a rank of the shm transport waits for its peers (dt_shm_block in transport_shm.c): it spins
 * for a while, then yields a few times, then sleeps on its doorbell futex. What fits depends on
 * who else needs the CPU:
 *   - more ranks than the CPUs they may run on together (oversubscribed: 8 ranks on 2 cores, or
 *     ranks pinned to a shared core), or a split of such a job (ps's 2-rank server-worker pairs
 *     of 5 ranks on 2 cores: the pair's CPUs are shared with the job's other ranks): no spin, two
 *     yields, then sleep, so that the peer being waited for gets the core at once;
 *   - the thread that created the transport, the rank's own (a blocking collective: DDP's last
 *     bucket, its parameter allgather): it has nothing else to run, so it spins without yielding,
 *     SPIN_US;
 *   - any other thread (the communicator's progress thread running non-blocking ops during
 *     backward, ps's exchange and handler threads): it shares its core with the compute thread,
 *     so it spins shorter, SPIN_BG_US, and yields every 16 rounds (as every wait did before).
 * Why the caller spins 200 us and does not yield: a wait that outlasts the spin sleeps, and the wake
 * of a sleeping rank costs the late rank a futex call and the early rank a scheduling delay (more
 * when another process took its core); a yield hands the core to any other runnable process for
 * its time slice. Longer spins are cut by the scheduler's time slice; the sweep that chose 200 us
 * is in docs/why.md, "How long a waiting rank spins". */
#include "comm/shm.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SPIN_US = 200, SPIN_BG_US = 50, OVER_YIELDS = 2 };

dt_shm_wait_policy dt_shm_wait_policy_for(bool over, bool background, const char *env_us) {
    dt_shm_wait_policy p = {.spin_s = over ? 0 : (background ? SPIN_BG_US : SPIN_US) * 1e-6,
                            .spin_yields = background,
                            .yields = over ? OVER_YIELDS : 0};
    if (env_us && *env_us) p.spin_s = atof(env_us) * 1e-6; /* DTRAIN_SHM_SPIN_US: both threads */
    if (!(p.spin_s >= 0)) p.spin_s = 0;
    return p;
}

void dt_shm_publish_cpus(dt_shm *s) {
    shm_rank *me = shm_rank_at(s, s->me);
    cpu_set_t set;
    memset(me->cpus, 0, sizeof me->cpus);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE && c < SHM_MAX_CPUS; c++)
            if (CPU_ISSET(c, &set)) me->cpus[c / 64] |= 1ull << (c % 64);
    } else { /* unknown: the online CPUs */
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        for (long c = 0; c < n && c < SHM_MAX_CPUS; c++) me->cpus[c / 64] |= 1ull << (c % 64);
    }
}

int dt_shm_job_cpus(dt_shm *s) {
    uint64_t all[SHM_MAX_CPUS / 64] = {0};
    for (int r = 0; r < s->n; r++)
        for (int w = 0; w < SHM_MAX_CPUS / 64; w++) all[w] |= shm_rank_at(s, r)->cpus[w];
    int n = 0;
    for (int w = 0; w < SHM_MAX_CPUS / 64; w++) n += __builtin_popcountll(all[w]);
    return n;
}
