/* dtrain plan --probe: this host as a cluster. It measures allreduce latency (4 KB) and bandwidth
 * (8 MB) between N local ranks (forked, the shm transport), fitted to the ring formula the cost
 * model uses (2(p-1)/p n / bw + 2(p-1) lat), and the memory bandwidth of one rank (a 64 MB copy),
 * and a blocking collective's wait for ranks the scheduler has not run (the last rank's 4 KB
 * allreduce after a millisecond of compute, less its one without), and caches them per rank count in
 * DTRAIN_PLAN_CACHE (default ~/.cache/dtrain) as a cluster file.
 * The per-op times at the plan's shapes are cached beside them by plan_opcache.c. */
#include "cli/cli.h"
#include "cli/cmd_plan.h"
#include "dtrain/dtrain.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

bool dt_cli_plan_cache_dir(char *buf, size_t cap, bool make) {
    const char *dir = getenv("DTRAIN_PLAN_CACHE"), *home = getenv("HOME");
    int n;
    if (dir && *dir) n = snprintf(buf, cap, "%s", dir);
    else if (home && *home) n = snprintf(buf, cap, "%s/.cache/dtrain", home);
    else return false;
    if (n < 0 || (size_t)n >= cap) return false;
    if (make) {
        char up[3072];
        snprintf(up, sizeof up, "%s", buf);
        for (char *p = up + 1; *p; p++)
            if (*p == '/') *p = '\0', mkdir(up, 0755), *p = '/';
        mkdir(up, 0755);
    }
    return true;
}

/* The cache file of `ranks` ranks into buf (its directory made); false when there is no home. */
static bool cache_path(int ranks, char *buf, size_t cap, bool make) {
    char d[3072];
    if (!dt_cli_plan_cache_dir(d, sizeof d, make)) return false;
    char host[256] = "host";
    gethostname(host, sizeof host - 1);
    return (size_t)snprintf(buf, cap, "%s/plan-%s-%dranks.json", d, host, ranks) < cap;
}

bool dt_cli_plan_host_cluster(int ranks, dt_plan_cluster *c) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    *c = (dt_plan_cluster){.hosts = 1,
                           .ranks_per_host = ranks,
                           .efficiency = 0.5,
                           .mem_bw = 8e9,
                           .overlap = 0.3,
                           .link = {{4e9, 5e-6, 1}, {4e9, 5e-6, 1}}};
    snprintf(c->name, sizeof c->name, "this-host");
    c->peak[0] = 1e11;
    char path[4096];
    bool cached = false;
    dt_plan_cluster k;
    if (cache_path(ranks, path, sizeof path, false) && access(path, R_OK) == 0 &&
        dt_plan_cluster_load(path, &k) == DT_OK && k.ranks_per_host == ranks)
        *c = k, cached = true;
    c->mem_bytes = pages > 0 && psz > 0 ? (double)pages * (double)psz / ranks : 4e9;
    c->oversub = dt_plan_oversub(ranks, cores > 0 ? (int)cores : 1, dt_cli_plan_busy());
    return cached;
}

double dt_cli_plan_busy(void) {
    /* /proc/loadavg's 4th field: runnable tasks now, this reader included; sampled while this
     * process sleeps between reads, over 40 ms */
    double sum = 0;
    int n = 0;
    for (int i = 0; i < 8; i++) {
        FILE *f = fopen("/proc/loadavg", "r");
        int run = 0, all = 0;
        double a, b, c3;
        if (f && fscanf(f, "%lf %lf %lf %d/%d", &a, &b, &c3, &run, &all) == 5 && run >= 1) sum += run - 1, n++;
        if (f) fclose(f);
        usleep(5000);
    }
    return n ? sum / n : 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* About a millisecond of one core's arithmetic (a dependent chain: no memory traffic). */
static double compute_ms(double x) {
    for (int i = 0; i < 1000000; i++) x = x * 0.999999 + 1e-7;
    return x;
}

/* One forked rank: times reps allreduces of n floats one by one after a warm-up; the slowest
 * rank's median call (a call another process preempted on this shared host does not count, as
 * the bench's median step leaves such steps out) into t[0], the fastest rank's into t[1] (the
 * rank that arrives last: it waits only for the others to be scheduled and the transfer). With
 * `after_compute` each call follows a millisecond of arithmetic, as a step's collective follows
 * its backward. */
static dt_status time_allreduce(dt_comm *comm, size_t n, int reps, bool after_compute, double t[2]) {
    float *buf = calloc(n, sizeof(float));
    double *each = calloc((size_t)reps, sizeof(double));
    dt_status s = buf && each ? dt_comm_allreduce(comm, buf, buf, n, DT_F32, DT_OP_SUM)
                              : dt_error(DT_ENOMEM, "probe: out of memory");
    if (s == DT_OK) s = dt_comm_barrier(comm);
    volatile double sink = 1;
    for (int i = 0; i < reps && s == DT_OK; i++) {
        if (after_compute) sink = compute_ms(sink);
        const double t0 = dt_now();
        s = dt_comm_allreduce(comm, buf, buf, n, DT_F32, DT_OP_SUM);
        each[i] = dt_now() - t0;
    }
    double med = 0;
    if (s == DT_OK) {
        qsort(each, (size_t)reps, sizeof *each, cmp_double);
        med = each[reps / 2];
        s = dt_comm_allreduce(comm, &med, &t[0], 1, DT_F64, DT_OP_MAX);
        if (s == DT_OK) s = dt_comm_allreduce(comm, &med, &t[1], 1, DT_F64, DT_OP_MIN);
    }
    free(buf), free(each);
    return s;
}

/* One forked rank: the 4 KB allreduce, one of `big` floats and the 4 KB one after compute; sends
 * t[3]: the slowest rank's first two, and the 4 KB call's wait after compute (the fastest rank's
 * median after compute less its median without). */
static int probe_rank(int r, int ranks, const char *job, int fd, size_t big) {
    dt_comm_config cfg = dt_comm_config_default();
    cfg.rank = r, cfg.size = ranks, cfg.local_rank = r, cfg.job_id = job, cfg.backend = DT_BACKEND_SHM;
    dt_comm *comm;
    if (dt_comm_create(&comm, &cfg) != DT_OK) {
        fprintf(stderr, "dtrain plan: probe rank %d: %s\n", r, dt_cli_last_error());
        return 1;
    }
    double t[3] = {0, 0, 0}, small[2] = {0, 0}, large[2] = {0, 0}, after[2] = {0, 0};
    dt_status s = time_allreduce(comm, 1024, 200, false, small);
    if (s == DT_OK) s = time_allreduce(comm, big, big > (1u << 20) ? 15 : 50, false, large);
    if (s == DT_OK) s = time_allreduce(comm, 1024, 40, true, after);
    t[0] = small[0], t[1] = large[0], t[2] = after[1] > small[1] ? after[1] - small[1] : 0;
    if (s != DT_OK) fprintf(stderr, "dtrain plan: probe rank %d: %s\n", r, dt_cli_last_error());
    if (s == DT_OK && r == 0 && write(fd, t, sizeof t) != (ssize_t)sizeof t) s = DT_EIO;
    dt_comm_destroy(comm);
    return s == DT_OK ? 0 : 1;
}

/* Allreduce seconds at 4 KB, of `big` floats and the wait of a 4 KB one after compute between
 * `ranks` forked local ranks into t[3]; 0 or exit status. */
static int probe_comm(int ranks, double t[3], size_t big) {
    int fd[2];
    if (pipe(fd)) return dt_cli_fail(NULL, "--probe: pipe: %s", strerror(errno));
    char job[64];
    snprintf(job, sizeof job, "plan%d", (int)getpid());
    fflush(stdout);
    pid_t pids[4096];
    int rc = 0, started = 0;
    for (int r = 0; r < ranks; r++, started++)
        if ((pids[r] = fork()) == 0) _exit(probe_rank(r, ranks, job, fd[1], big));
        else if (pids[r] < 0) {
            rc = dt_cli_fail(NULL, "--probe: fork: %s", strerror(errno));
            break;
        }
    close(fd[1]);
    for (int r = 0; r < started; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = 1;
    }
    const bool got = read(fd[0], t, 3 * sizeof(double)) == (ssize_t)(3 * sizeof(double));
    close(fd[0]);
    dt_comm_shm_cleanup(job);
    if (!rc && !got) rc = dt_cli_fail(NULL, "--probe: rank 0 sent no timings");
    return rc;
}

/* One rank's memory bandwidth: bytes read and written per second by a 64 MB copy (best of 5). */
static double probe_memory(void) {
    const size_t n = 64u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a), free(b);
        return 0;
    }
    memset(a, 1, n), memset(b, 2, n);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        const double t0 = dt_now();
        memcpy(b, a, n);
        const double dt = dt_now() - t0;
        if (dt < best) best = dt;
        a[i] = b[n - 1 - i]; /* the copy is used */
    }
    free(a), free(b);
    return 2.0 * n / best;
}

int dt_cli_plan_probe(int ranks, dt_plan_cluster *c) {
    dt_cli_plan_host_cluster(ranks, c);
    c->mem_bw = probe_memory();
    if (ranks > 1) {
        double t[3];
        int r = probe_comm(ranks, t, 2u << 20);
        if (r) return r;
        const int p = ranks;
        const double n = (2u << 20) * 4.0, steps = 2.0 * (p - 1);
        c->link[DT_PLAN_INTRA].lat = t[0] / steps;
        const double wire = t[1] - steps * c->link[DT_PLAN_INTRA].lat;
        c->link[DT_PLAN_INTRA].bw = wire > 0 ? steps / p * n / wire : steps / p * n / t[1];
        c->link[DT_PLAN_INTRA].rs_factor = 1;
        c->link[DT_PLAN_INTER] = c->link[DT_PLAN_INTRA];
        c->coll_wait = t[2];
        printf("dtrain plan: probe: allreduce over %d local ranks: 4 KB %.1f us, 8 MB %.3f ms -> latency %.2f us, "
               "bandwidth %.2f GB/s; a blocking collective's wait after 1 ms of compute %.1f us\n",
               ranks, t[0] * 1e6, t[1] * 1e3, c->link[0].lat * 1e6, c->link[0].bw / 1e9, c->coll_wait * 1e6);
    }
    printf("dtrain plan: probe: memory bandwidth %.2f GB/s (64 MB copy)\n", c->mem_bw / 1e9);
    char path[4096];
    if (!cache_path(ranks, path, sizeof path, true))
        return dt_cli_fail("set DTRAIN_PLAN_CACHE=DIR", "--probe: no cache directory (HOME is unset)");
    if (dt_plan_cluster_save(c, path) != DT_OK) return dt_cli_fail("set DTRAIN_PLAN_CACHE=DIR", "%s", dt_last_error());
    printf("dtrain plan: probe: cached in %s\n", path);
    return 0;
}

int dt_cli_plan_links_now(int ranks, double values, dt_plan_cluster *c) {
    if (ranks < 2) return 0;
    const size_t big = values < 4096 ? 4096 : values > (2u << 20) ? (2u << 20) : (size_t)values;
    double t[3] = {0, 0, 0};
    const int r = probe_comm(ranks, t, big);
    if (r) return r;
    const double steps = 2.0 * (ranks - 1), lat = t[0] / steps, wire = t[1] - steps * lat;
    const double bw = steps / ranks * (double)big * 4 / (wire > 0 ? wire : t[1]);
    for (int k = 0; k < 2; k++) c->link[k] = (dt_plan_link){bw, lat, 1};
    c->coll_wait = t[2];
    return 0;
}
