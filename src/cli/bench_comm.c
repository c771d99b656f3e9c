/* dtrain bench comm: collective benchmark in the style of nccl-tests. Starts N local ranks
 * itself (fork, shm transport) or, under mpirun/srun or `dtrain launch`, uses the ranks it was
 * started as (mpi and, when every rank is on this host, shm). Prints per collective and
 * transport: size, count, time, algbw and busbw (nccl-tests formulas), plus plain
 * MPI_Allreduce as a baseline under mpirun, and one JSON line with every row. */
#include "cli/cli.h"
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SIZES 32
#define MAX_ROWS 512

typedef struct {
    const char *backend, *coll;
    char algo[32];
    size_t bytes, count;
    double us, algbw, busbw;
    bool wrong;
} row;

typedef struct {
    size_t sizes[MAX_SIZES];
    int nsizes, iters, warmup, trials;
    const char *colls, *algo_name;
    dt_comm_algo algo;
    const char *allreduce; /* --allreduce: modes to compare ("flat,hier"), NULL = as created */
    char mode_name[32];    /* the --allreduce mode running, as rows name it ("hier:1M") */
    bool no_baseline;      /* --no-mpi-baseline: leave out plain MPI_Allreduce */
    row rows[MAX_ROWS];
    int nrows;
} bench_opts;

static const char *const g_colls[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"};

/* One size at s ("4M", "64K", "1024"): the bytes in *out, *end past it; false if none */
static bool parse_size(const char *s, size_t *out, char **end) {
    double v = strtod(s, end);
    if (*end == s || v < 0) return false;
    if (**end == 'K' || **end == 'k') v *= 1024, (*end)++;
    else if (**end == 'M' || **end == 'm') v *= 1024 * 1024, (*end)++;
    else if (**end == 'G' || **end == 'g') v *= 1024.0 * 1024 * 1024, (*end)++;
    if (**end == 'B' || **end == 'b') (*end)++;
    *out = (size_t)v;
    return true;
}

static bool parse_one_size(const char *s, size_t *out) {
    char *end;
    return parse_size(s, out, &end) && !*end;
}

static int parse_sizes(const char *s, bench_opts *o) {
    o->nsizes = 0;
    while (*s && o->nsizes < MAX_SIZES) {
        char *end;
        if (!parse_size(s, &o->sizes[o->nsizes++], &end)) return -1;
        if (*end == ',') end++;
        else if (*end) return -1;
        s = end;
    }
    return o->nsizes ? 0 : -1;
}

/* nccl-tests: size is the whole buffer (allgather output, reduce_scatter input); busbw factor */
static double bus_factor(const char *coll, int n) {
    if (!strcmp(coll, "allreduce")) return 2.0 * (n - 1) / n;
    if (!strcmp(coll, "allgather") || !strcmp(coll, "reduce_scatter") || !strcmp(coll, "alltoall"))
        return (double)(n - 1) / n;
    return 1.0;
}

static dt_status run_coll(dt_comm *c, const char *coll, float *send, float *recv, size_t count) {
    if (!strcmp(coll, "allreduce")) return dt_comm_allreduce(c, send, recv, count, DT_F32, DT_OP_SUM);
    if (!strcmp(coll, "broadcast")) return dt_comm_broadcast(c, recv, count, DT_F32, 0);
    if (!strcmp(coll, "reduce")) return dt_comm_reduce(c, send, recv, count, DT_F32, DT_OP_SUM, 0);
    if (!strcmp(coll, "allgather")) return dt_comm_allgather(c, send, recv, count, DT_F32);
    if (!strcmp(coll, "reduce_scatter")) return dt_comm_reduce_scatter(c, send, recv, count, DT_F32, DT_OP_SUM);
    return dt_comm_alltoall(c, send, recv, count, DT_F32);
}

/* every element of every result is known: inputs are rank + 1 */
static bool check_result(dt_comm *c, const char *coll, const float *recv, size_t count) {
    int n = dt_comm_size(c), r = dt_comm_rank(c);
    float sum = (float)(n * (n + 1) / 2);
    size_t m = count;
    float want = sum;
    if (!strcmp(coll, "broadcast")) want = 1;
    else if (!strcmp(coll, "reduce") && r != 0) return true;
    if (!strcmp(coll, "allgather") || !strcmp(coll, "alltoall")) {
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < m; i++)
                if (recv[(size_t)p * m + i] != (float)(p + 1)) return false;
        return true;
    }
    for (size_t i = 0; i < m; i++)
        if (recv[i] != want) return false;
    return true;
}

static int bench_one(dt_comm *c, const char *backend, const char *coll, bench_opts *o, float *send, float *recv) {
    int n = dt_comm_size(c), R = dt_comm_rank(c);
    bool per_rank = !strcmp(coll, "allgather") || !strcmp(coll, "reduce_scatter") || !strcmp(coll, "alltoall");
    for (int k = 0; k < o->nsizes; k++) {
        size_t bytes = o->sizes[k], count = bytes / 4 / (per_rank ? (size_t)n : 1);
        if (count == 0) continue;
        size_t in_elems = !strcmp(coll, "reduce_scatter") || !strcmp(coll, "alltoall") ? count * (size_t)n : count;
        for (size_t i = 0; i < in_elems; i++) send[i] = (float)(R + 1);
        int iters = o->iters > 0 ? o->iters : (int)((256u << 20) / bytes), warm = o->warmup;
        if (iters < 5) iters = 5;
        if (iters > 2000) iters = 2000;
        if (warm < 0) warm = iters / 10 > 2 ? iters / 10 : 2;
        dt_status st = DT_OK;
        for (int i = 0; i < warm && st == DT_OK; i++) {
            if (!strcmp(coll, "broadcast"))
                for (size_t j = 0; j < count; j++) recv[j] = R == 0 ? 1.0f : 0.0f;
            st = run_coll(c, coll, send, recv, count);
        }
        bool ok = st == DT_OK && check_result(c, coll, recv, count);
        double best = 1e30;
        for (int t = 0; t < o->trials && st == DT_OK; t++) { /* best of the trials: the machine is shared */
            st = dt_comm_barrier(c);
            double t0 = dt_now();
            for (int i = 0; i < iters && st == DT_OK; i++) st = run_coll(c, coll, send, recv, count);
            double el = dt_now() - t0, worst = 0;
            if (st == DT_OK) st = dt_comm_allreduce(c, &el, &worst, 1, DT_F64, DT_OP_MAX);
            if (worst < best) best = worst;
        }
        double worst = best;
        int bad = !ok, anybad = 0;
        if (st == DT_OK) st = dt_comm_allreduce(c, &bad, &anybad, 1, DT_I32, DT_OP_MAX);
        if (st != DT_OK)
            return dt_cli_fail("see the message above; DTRAIN_TIMEOUT sets the deadline", "bench comm: %s on %s: %s",
                               coll, backend, dt_last_error());
        if (o->nrows < MAX_ROWS && R == 0) {
            row *w = &o->rows[o->nrows++];
            w->backend = backend;
            w->coll = coll;
            snprintf(w->algo, sizeof w->algo, "%s", o->algo_name);
            w->bytes = bytes;
            w->count = count;
            w->us = worst / iters * 1e6;
            w->algbw = (double)bytes / (worst / iters) / 1e9;
            w->busbw = w->algbw * bus_factor(coll, n);
            w->wrong = anybad;
            printf("%16s %12zu %12zu %12.2f %10.2f %10.2f %6s\n", coll, bytes, count, w->us, w->algbw, w->busbw,
                   anybad ? "WRONG" : "ok");
            fflush(stdout);
        }
    }
    return 0;
}

static void header(const char *backend, int n, const char *algo) {
    printf("#\n# backend %s, %d ranks, algo %s, f32 sum (time: mean per call of the slowest rank, best of the "
           "trials)\n#\n",
           backend, n, algo);
    printf("%16s %12s %12s %12s %10s %10s %6s\n", "collective", "size(B)", "count", "time(us)", "algbw(GB/s)",
           "busbw(GB/s)", "check");
}

/* Whether --colls asks for coll. */
static bool wants(const bench_opts *o, const char *coll) {
    char pat[64], list[512];
    snprintf(pat, sizeof pat, ",%s,", coll);
    snprintf(list, sizeof list, ",%s,", o->colls);
    return strstr(list, pat) || !strcmp(o->colls, "all");
}

/* Plain blocking MPI_Allreduce, and MPI_Reduce when reduce is benchmarked: our non-blocking
 * collectives must come close to them (a reduce 400x slower than MPI_Reduce went unseen when
 * only MPI_Allreduce was shown). */
static int mpi_baseline(dt_comm *c, bench_opts *o, float *scratch) {
    (void)scratch;
    int n = dt_comm_size(c);
    static const struct {
        const char *name, *coll;
        dt_status (*run)(size_t, int, int, double *);
    } plain[] = {{"MPI_Allreduce", "allreduce", dt_comm_bench_mpi_allreduce},
                 {"MPI_Reduce", "reduce", dt_comm_bench_mpi_reduce}};
    if (dt_comm_rank(c) == 0) {
        printf("#\n# baseline: plain blocking MPI_Allreduce%s on MPI_COMM_WORLD, %d ranks, f32 sum\n#\n",
               wants(o, "reduce") ? " and MPI_Reduce (root 0)" : "", n);
        printf("%16s %12s %12s %12s %10s %10s\n", "collective", "size(B)", "count", "time(us)", "algbw(GB/s)",
               "busbw(GB/s)");
    }
    for (int p = 0; p < 2; p++) {
        if (p == 1 && !wants(o, "reduce")) continue;
        for (int k = 0; k < o->nsizes; k++) {
            size_t bytes = o->sizes[k], count = bytes / 4;
            int iters = o->iters > 0 ? o->iters : (int)((256u << 20) / (bytes ? bytes : 1));
            if (iters < 5) iters = 5;
            if (iters > 2000) iters = 2000;
            double us = 0;
            for (int t = 0; t < o->trials; t++) {
                double one = 0;
                if (plain[p].run(count, iters / 10 > 2 ? iters / 10 : 2, iters, &one) != DT_OK)
                    return dt_cli_fail(NULL, "bench comm: MPI baseline: %s", dt_last_error());
                if (t == 0 || one < us) us = one;
            }
            if (dt_comm_rank(c) == 0 && o->nrows < MAX_ROWS) {
                row *w = &o->rows[o->nrows++];
                *w = (row){.backend = "mpi-baseline",
                           .coll = plain[p].name,
                           .algo = "mpi",
                           .bytes = bytes,
                           .count = count,
                           .us = us,
                           .algbw = (double)bytes / us / 1e3};
                w->busbw = w->algbw * bus_factor(plain[p].coll, n);
                printf("%16s %12zu %12zu %12.2f %10.2f %10.2f\n", plain[p].name, bytes, count, us, w->algbw, w->busbw);
            }
        }
    }
    return 0;
}

static int run_backend(dt_comm *c, const char *backend, bench_opts *o) {
    size_t max = 0;
    for (int k = 0; k < o->nsizes; k++)
        if (o->sizes[k] > max) max = o->sizes[k];
    float *send = dt_alloc(max + 64), *recv = dt_alloc(max + 64);
    if (!send || !recv) {
        dt_free(send);
        dt_free(recv);
        return dt_cli_fail("use smaller --sizes", "bench comm: cannot allocate 2 x %zu bytes", max);
    }
    if (dt_comm_rank(c) == 0) header(backend, dt_comm_size(c), o->algo_name);
    int rc = 0;
    for (int i = 0; i < 6 && rc == 0; i++) {
        if (wants(o, g_colls[i])) rc = bench_one(c, backend, g_colls[i], o, send, recv);
    }
    if (rc == 0 && !strcmp(backend, "mpi") && !o->no_baseline) rc = mpi_baseline(c, o, send);
    dt_free(send);
    dt_free(recv);
    return rc;
}

/* --allreduce flat,hier: the collectives once per mode, on the same ranks (A vs B in one run) */
static int run_modes(dt_comm *c, bench_opts *o) {
    static const char *const names[] = {"auto", "flat", "hier"};
    char list[512];
    if (strlen(o->allreduce) >= sizeof list)
        return dt_cli_usage(NULL, "--allreduce: the list is too long (at most %zu characters)", sizeof list - 1);
    snprintf(list, sizeof list, "%s", o->allreduce);
    const char *algo = o->algo_name;
    int rc = 0;
    for (char *save = NULL, *m = strtok_r(list, ",", &save); m && rc == 0; m = strtok_r(NULL, ",", &save)) {
        char *arg = strchr(m, ':'); /* hier:CHUNK (bytes, K/M suffix; 0: no pipelining), flat:ALGO */
        if (arg) *arg++ = '\0';
        int k = 0;
        while (k < 3 && strcmp(m, names[k])) k++;
        if (k == 3)
            return dt_cli_usage("e.g. --allreduce flat,hier,flat:ring,hier:1M",
                                "--allreduce %s: choose auto, flat[:ALGO] or hier[:CHUNK]", m);
        size_t chunk_bytes = 0;
        dt_comm_algo flat_algo = o->algo;
        if (arg && k == 2 && !parse_one_size(arg, &chunk_bytes))
            return dt_cli_usage("e.g. --allreduce hier:1M (0: no pipelining)",
                                "--allreduce hier:%s: the chunk is one size in bytes", arg);
        if (arg && k != 2 && dt_comm_algo_parse(arg, &flat_algo) != DT_OK)
            return dt_cli_usage("e.g. --allreduce flat:ring", "--allreduce %s:%s: %s", m, arg, dt_last_error());
        if (dt_comm_set_hier(c, (dt_comm_hier_mode)k) != DT_OK ||
            (arg && k == 2 && dt_comm_set_hier_chunk(c, chunk_bytes) != DT_OK))
            return dt_cli_fail(NULL, "bench comm: --allreduce %s: %s", m, dt_last_error());
        dt_comm_set_algo(c, flat_algo);
        snprintf(o->mode_name, sizeof o->mode_name, "%s%s%s", dt_comm_hier_active(c) ? "hier" : algo, arg ? ":" : "",
                 arg ? arg : "");
        o->algo_name = o->mode_name;
        if (dt_comm_rank(c) == 0)
            printf("# allreduce %s%s%s: %d hosts, hierarchical %s\n", m, arg ? ":" : "", arg ? arg : "",
                   dt_comm_hosts(c), dt_comm_hier_active(c) ? "on" : "off");
        rc = run_backend(c, dt_comm_backend_name(c), o);
        dt_comm_set_algo(c, o->algo);
    }
    o->algo_name = algo;
    return rc;
}

static void print_json(const bench_opts *o, int n) {
    printf("{\"bench\": \"comm\", \"ranks\": %d, \"dtype\": \"f32\", \"op\": \"sum\", \"results\": [", n);
    for (int i = 0; i < o->nrows; i++) {
        const row *w = &o->rows[i];
        printf("%s{\"backend\": \"%s\", \"coll\": \"%s\", \"algo\": \"%s\", \"bytes\": %zu, \"count\": %zu, "
               "\"time_us\": %.3f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f%s}",
               i ? ", " : "", w->backend, w->coll, w->algo, w->bytes, w->count, w->us, w->algbw, w->busbw,
               w->wrong ? ", \"wrong\": true" : "");
    }
    printf("]}\n");
}

/* one rank: every requested backend, then rank 0 prints the JSON line */
static int rank_main(const char *backends, bench_opts *o, const dt_comm_config *explicit_cfg) {
    int rc = 0, n = 1;
    bool root = false;
    char list[64];
    snprintf(list, sizeof list, "%s", backends);
    for (char *save = NULL, *b = strtok_r(list, ",", &save); b && rc == 0; b = strtok_r(NULL, ",", &save)) {
        dt_comm_config cfg = explicit_cfg ? *explicit_cfg : dt_comm_config_default();
        if (dt_comm_transport_check(b) != DT_OK)
            return dt_cli_usage("--backend takes a transport or a list such as mpi,shm", "%s", dt_last_error());
        cfg.transport = b;
        cfg.algo = o->algo;
        dt_comm *c = NULL;
        dt_status st = explicit_cfg ? dt_comm_create(&c, &cfg) : dt_comm_create_from_env(&c, &cfg);
        if (st != DT_OK)
            return dt_cli_fail(st == DT_ENOTSUP ? "rebuild with MPI=1 and run under mpirun" : NULL,
                               "bench comm: cannot start backend %s: %s", b, dt_last_error());
        n = dt_comm_size(c);
        root = dt_comm_rank(c) == 0;
        if (o->allreduce) rc = run_modes(c, o);
        else rc = run_backend(c, dt_comm_backend_name(c), o);
        dt_comm_destroy(c);
    }
    if (rc == 0 && root) print_json(o, n);
    return rc;
}

/* --backend's help: the transport registry's names */
static const char *backends_help(void) {
    static char buf[256];
    snprintf(buf, sizeof buf, "a transport (%s) or a list such as mpi,shm (default: shm; under mpirun: mpi,shm)",
             dt_comm_transport_names());
    return buf;
}

static bool under_launcher(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("SLURM_NTASKS") ||
           getenv("DTRAIN_WORLD_SIZE");
}

static const char USAGE[] =
    "Usage: dtrain bench comm [-n N] [--sizes LIST] [--colls LIST] [--algo A] [--backend B] [--iters I]\n\n"
    "Collective bandwidth and latency (nccl-tests style): starts N local ranks on the shm transport,\n"
    "or runs on the ranks of mpirun/srun/dtrain launch (then --backend mpi,shm adds MPI and plain\n"
    "MPI_Allreduce as a baseline). Sizes are whole buffers (allgather output, reduce_scatter input).";

int dt_bench_comm(int argc, char **argv) {
    int ranks = 2, iters = 0, trials = 3;
    const char *sizes = "4K,64K,1M,4M,16M,64M", *colls = "allreduce,broadcast,reduce,allgather,reduce_scatter,alltoall";
    const char *algo = "auto", *backend = NULL, *allreduce = NULL;
    bool no_baseline = false;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-n")) argv[i] = "--ranks";
    const dt_flag flags[] = {
        {"ranks", DT_FLAG_INT, &ranks, "N", "local ranks to start (also -n; ignored under mpirun/launch)"},
        {"sizes", DT_FLAG_STR, &sizes, "LIST", "buffer sizes in bytes, K/M/G suffixes"},
        {"colls", DT_FLAG_STR, &colls, "LIST",
         "collectives (allreduce,broadcast,reduce,allgather,reduce_scatter,alltoall|all)"},
        {"algo", DT_FLAG_STR, &algo, "A", "auto, ring, rd, rhd, tree, direct or native"},
        {"backend", DT_FLAG_STR, &backend, "B", backends_help()},
        {"iters", DT_FLAG_INT, &iters, "I", "timed calls per size (0: about 256 MiB of traffic, 5..2000)"},
        {"trials", DT_FLAG_INT, &trials, "T", "timed runs per size; the fastest is reported"},
        {"allreduce", DT_FLAG_STR, &allreduce, "LIST", "hierarchical allreduce modes to compare: flat,hier (or auto)"},
        {"no-mpi-baseline", DT_FLAG_BOOL, &no_baseline, NULL, "leave out the plain MPI_Allreduce rows"},
    };
    int pr = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof flags[0]), USAGE, NULL, 0, NULL, NULL);
    if (pr != 0) return pr < 0 ? 2 : 0;
    static bench_opts o;
    memset(&o, 0, sizeof o);
    o.iters = iters;
    o.trials = trials < 1 ? 1 : trials;
    o.warmup = -1;
    o.colls = colls;
    o.algo_name = algo;
    o.allreduce = allreduce;
    o.no_baseline = no_baseline;
    if (parse_sizes(sizes, &o) != 0) return dt_cli_usage("e.g. --sizes 4K,1M,64M", "bad --sizes '%s'", sizes);
    if (dt_comm_algo_parse(algo, &o.algo) != DT_OK) return dt_cli_usage(NULL, "--algo: %s", dt_last_error());
    if (ranks < 1 || ranks > 64) return dt_cli_usage(NULL, "--ranks %d must be 1..64", ranks);
    if (under_launcher()) {
        bool local = !getenv("OMPI_COMM_WORLD_LOCAL_SIZE") ||
                     !strcmp(getenv("OMPI_COMM_WORLD_LOCAL_SIZE"),
                             getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : "");
        if (!backend) backend = getenv("DTRAIN_WORLD_SIZE") ? "shm" : local ? "mpi,shm" : "mpi";
        return rank_main(backend, &o, NULL);
    }
    if (!backend) backend = "shm";
    if (strstr(backend, "mpi"))
        return dt_cli_usage("run it as: mpirun -n N dtrain bench comm --backend mpi,shm",
                            "bench comm: the mpi backend needs ranks started by mpirun/srun");
    char job[64];
    snprintf(job, sizeof job, "bench%d", (int)getpid());
    fflush(stdout);
    pid_t pids[64];
    for (int r = 0; r < ranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) return dt_cli_fail(NULL, "bench comm: fork failed");
        if (pids[r] == 0) {
            dt_comm_config cfg = dt_comm_config_default();
            cfg.rank = r;
            cfg.size = ranks;
            cfg.local_rank = r;
            cfg.job_id = job;
            int rc = rank_main(backend, &o, &cfg);
            fflush(stdout);
            _exit(rc);
        }
    }
    int rc = 0;
    for (int r = 0; r < ranks; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
    }
    dt_comm_shm_cleanup(job);
    return rc;
}
