/* Hierarchical allreduce for ranks that span hosts: a shared-memory reduce to one leader per host,
 * an allreduce among the leaders (over the parent's transport: MPI between hosts), and a
 * shared-memory broadcast from each leader. Only the leaders' traffic crosses the network: with
 * H hosts of L ranks a ring over all H*L ranks pushes 2(HL-1)/(HL) of the data through each host
 * link, the leaders' ring 2(H-1)/H. dt_comm_set_hier learns the hosts (hostnames, allgathered;
 * DTRAIN_HOSTNAME names the host instead, for tests on one machine), makes the per-host shm
 * communicator and the leaders' split, and decides: AUTO turns it on when some host has more than
 * one rank and there is more than one host. Then every allreduce of the communicator (blocking or
 * not: the progress thread runs it the same way) goes this way. */
#include "comm/comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/reduce.h"

enum { NAME = 64 };
/* Pipeline chunk: 1 MiB, the best of a sweep (docs/why.md, "Hierarchical allreduce chunk");
 * buffers up to 1 MiB stay one piece (no per-chunk cost where there is little to hide) */
#define DEFAULT_CHUNK (1u << 20)

struct dt_comm_hier {
    dt_comm *local;   /* the ranks of this host, over shm (NULL: alone on its host) */
    dt_comm *leaders; /* local rank j < slices of every host (NULL elsewhere): slice j's allreduce */
    int hosts, host, local_rank, local_size;
    int slices;         /* leaders per host: each owns 1/slices of the buffer across hosts */
    size_t chunk_bytes; /* pipeline chunk (0: the whole buffer in one piece) */
    bool on, profile;
    /* DTRAIN_HIER_PROFILE=1: seconds in the host reduce, waiting for the leaders' allreduce, in
     * the final wait for the broadcasts, and in all, summed over calls (printed when freed) */
    double t_reduce, t_inter, t_tail, t_all;
    long calls;
    size_t prof_bytes; /* the size those calls had (a new size prints them; under 64 KiB: not counted) */
};

static void host_name(char *out) {
    const char *e = getenv("DTRAIN_HOSTNAME");
    memset(out, 0, NAME);
    if (e && *e) snprintf(out, NAME, "%s", e);
    else if (gethostname(out, NAME - 1) != 0) snprintf(out, NAME, "unknown");
}

/* Host index (first-seen order), local rank and local size of each rank from the names. */
static void layout(const char *names, int size, int rank, dt_comm_hier *h, int *host_of) {
    h->hosts = 0;
    for (int r = 0; r < size; r++) {
        host_of[r] = -1;
        for (int q = 0; q < r && host_of[r] < 0; q++)
            if (!strncmp(names + (size_t)q * NAME, names + (size_t)r * NAME, NAME)) host_of[r] = host_of[q];
        if (host_of[r] < 0) host_of[r] = h->hosts++;
    }
    h->host = host_of[rank];
    h->local_rank = h->local_size = 0;
    for (int r = 0; r < size; r++)
        if (host_of[r] == h->host) h->local_rank += r < rank, h->local_size++;
    /* slices: DTRAIN_HIER_LEADERS=N leaders per host, at most the fewest ranks any host has
     * (default 1: on the loaded 2-core test machine 2 leaders measured no better; see
     * bench/compress_cluster.sh) */
    const char *e = getenv("DTRAIN_HIER_LEADERS");
    h->slices = e && *e ? atoi(e) : 1;
    for (int g = 0; g < h->hosts; g++) {
        int n = 0;
        for (int r = 0; r < size; r++) n += host_of[r] == g;
        if (n < h->slices) h->slices = n;
    }
    if (h->slices < 1) h->slices = 1;
    /* DTRAIN_HIER_CHUNK=BYTES: the pipeline's chunk (0: one piece); default DEFAULT_CHUNK across
     * hosts, none on one (forced on: no link to hide the host's phases behind) */
    e = getenv("DTRAIN_HIER_CHUNK");
    h->chunk_bytes = e && *e ? (size_t)atoll(e) : h->hosts > 1 ? DEFAULT_CHUNK : 0;
    e = getenv("DTRAIN_HIER_PROFILE");
    h->profile = e && *e && strcmp(e, "0");
}

/* Prints the profile of the calls so far (one size) and starts over. */
static void profile_print(dt_comm_hier *h) {
    if (!h->calls) return;
    double n = (double)h->calls;
    fprintf(stderr,
            "hier profile: host %d local rank %d%s: %ld calls of %zu B, chunk %zu B: reduce %.1f ms, wait inter "
            "%.1f ms, wait broadcast %.1f ms, total %.1f ms per call\n",
            h->host, h->local_rank, h->leaders ? " (leader)" : "", h->calls, h->prof_bytes, h->chunk_bytes,
            1e3 * h->t_reduce / n, 1e3 * h->t_inter / n, 1e3 * h->t_tail / n, 1e3 * h->t_all / n);
    h->t_reduce = h->t_inter = h->t_tail = h->t_all = 0, h->calls = 0;
}

void dt_comm_hier_free(dt_comm_hier *h) {
    if (!h) return;
    if (h->profile) profile_print(h);
    dt_comm_destroy(h->local);
    dt_comm_destroy(h->leaders);
    free(h);
}

/* The per-host shm communicator (job id: rank 0's base id, broadcast, and the host index). */
static dt_status make_local(dt_comm *c, dt_comm_hier *h) {
    char base[NAME] = {0};
    if (c->rank == 0) snprintf(base, sizeof base, "hier%ldx%llu", (long)getpid(), (unsigned long long)c->splits);
    DT_TRY(dt_comm_broadcast(c, base, sizeof base, DT_U8, 0));
    if (h->local_size < 2) return DT_OK;
    char job[2 * NAME];
    snprintf(job, sizeof job, "%s.h%d", base, h->host);
    dt_comm_config cc = dt_comm_config_default();
    cc.rank = h->local_rank, cc.size = h->local_size, cc.job_id = job, cc.backend = DT_BACKEND_SHM;
    cc.timeout_s = c->timeout_s, cc.timeout_knob = c->timeout_knob;
    dt_status st = dt_comm_create(&h->local, &cc);
    dt_log_set_rank(c->rank); /* the sub-communicator set the log's rank to its own */
    return st;
}

dt_status dt_comm_set_hier(dt_comm *c, dt_comm_hier_mode mode) {
    if (!c) return dt_error(DT_EINVAL, "dt_comm_set_hier: communicator is NULL");
    dt_comm_hier_free(c->hier);
    c->hier = NULL;
    if (mode == DT_HIER_FLAT || c->size == 1) return DT_OK;
    char *names = calloc((size_t)c->size, NAME);
    int *host_of = calloc((size_t)c->size, sizeof *host_of);
    dt_comm_hier *h = calloc(1, sizeof *h);
    dt_status st = names && host_of && h ? DT_OK : dt_error(DT_ENOMEM, "hierarchical allreduce: out of memory");
    char mine[NAME];
    host_name(mine);
    if (st == DT_OK) st = dt_comm_allgather(c, mine, names, NAME, DT_U8);
    if (st == DT_OK) {
        layout(names, c->size, c->rank, h, host_of);
        /* more than one host, and some host with more than one rank */
        h->on = mode == DT_HIER_ON || (h->hosts > 1 && h->hosts < c->size);
    }
    if (st == DT_OK && h->on) st = make_local(c, h);
    if (st == DT_OK && h->on)
        st = dt_comm_split(c, h->local_rank < h->slices ? h->local_rank : DT_COMM_UNDEFINED, h->host, &h->leaders);
    free(names), free(host_of);
    if (st != DT_OK || !h->on) {
        if (st == DT_OK) c->hier = h; /* off: kept for dt_comm_hosts */
        else dt_comm_hier_free(h);
        return st == DT_OK ? DT_OK : dt_error_wrap(st, "hierarchical allreduce setup");
    }
    c->hier = h;
    return DT_OK;
}

bool dt_comm_hier_active(const dt_comm *c) { return c && c->hier && c->hier->on; }
int dt_comm_hosts(const dt_comm *c) { return c && c->hier ? c->hier->hosts : 0; }

/* Chunk k of the buffer: elements [k*chunk, k*chunk + n). */
typedef struct {
    const unsigned char *send;
    unsigned char *recv;
    size_t chunk, count, esz;
} chunks;

static size_t chunk_len(const chunks *c, size_t k) {
    size_t off = k * c->chunk;
    return c->count - off < c->chunk ? c->count - off : c->chunk;
}

/* The host's reduction of chunk k (into recv on the leader; a lone rank copies). */
static dt_status local_reduce(dt_comm_hier *h, const chunks *c, size_t k, dt_dtype t, dt_redop op) {
    size_t off = k * c->chunk * c->esz, n = chunk_len(c, k);
    if (h->local)
        return dt_comm_reduce(h->local, c->send + off, h->local_rank == 0 ? c->recv + off : NULL, n, t, op, 0);
    if (c->send != c->recv && n) memcpy(c->recv + off, c->send + off, n * c->esz);
    return DT_OK;
}

/* Several leaders per host (h->slices = S >= 2): slice j of the buffer is reduced within the host
 * to local rank j, allreduced across hosts among the local ranks j (the S slices' transfers run
 * at once, over S connections, so no single process carries all the host's network traffic and
 * reduction), then broadcast within the host from local rank j. */
static dt_status sliced_allreduce(dt_comm_hier *h, const unsigned char *send, unsigned char *recv, size_t count,
                                  dt_dtype t, dt_redop part) {
    size_t esz = dt_dtype_size(t), base = count / (size_t)h->slices, rem = count % (size_t)h->slices;
#define SLICE_OFF(j) ((size_t)(j)*base + ((size_t)(j) < rem ? (size_t)(j) : rem))
    for (int j = 0; j < h->slices; j++) {
        size_t off = SLICE_OFF(j) * esz, n = SLICE_OFF(j + 1) - SLICE_OFF(j);
        DT_TRY(dt_comm_reduce(h->local, send + off, h->local_rank == j ? recv + off : NULL, n, t, part, j));
    }
    if (h->leaders) {
        size_t off = SLICE_OFF(h->local_rank) * esz, n = SLICE_OFF(h->local_rank + 1) - SLICE_OFF(h->local_rank);
        DT_TRY(dt_comm_allreduce(h->leaders, recv + off, recv + off, n, t, part));
    }
    for (int j = 0; j < h->slices; j++) {
        size_t off = SLICE_OFF(j) * esz, n = SLICE_OFF(j + 1) - SLICE_OFF(j);
        DT_TRY(dt_comm_broadcast(h->local, recv + off, n, t, j));
    }
#undef SLICE_OFF
    return DT_OK;
}

dt_status dt_comm_hier_allreduce(dt_comm_hier *h, int world, const void *send, void *recv, size_t count, dt_dtype t,
                                 dt_redop op) {
    dt_redop part = op == DT_OP_AVG ? DT_OP_SUM : op;
    if (h->slices > 1) {
        DT_TRY(sliced_allreduce(h, send, recv, count, t, part));
        if (op == DT_OP_AVG) dt_reduce_scale(recv, count, t, world);
        return DT_OK;
    }
    /* Pipelined in chunks of h->chunk_bytes: chunk k's allreduce among the leaders is queued as
     * soon as the host has reduced it, behind chunk k-1's (each communicator runs its ops in issue
     * order on its progress thread, so the link always has the next chunk waiting); when chunk
     * k-1's has finished its broadcast within the host is queued, and the host reduces chunk k+1
     * while chunk k crosses the network. What the link does not hide: the first chunk's reduce
     * and the last chunk's broadcast. */
    bool prof = h->profile && count * dt_dtype_size(t) >= 65536;
    if (prof && count * dt_dtype_size(t) != h->prof_bytes) profile_print(h), h->prof_bytes = count * dt_dtype_size(t);
    double t0 = prof ? dt_now() : 0, t1;
    chunks c = {send, recv, 0, count, dt_dtype_size(t)};
    size_t per = h->chunk_bytes / c.esz;
    c.chunk = per && per < count ? per : count ? count : 1;
    size_t nch = count ? (count + c.chunk - 1) / c.chunk : 1;
    dt_request **bc = calloc(2 * nch, sizeof *bc), **ia = bc + nch;
    if (!bc) return dt_error(DT_ENOMEM, "hierarchical allreduce: out of memory");
    dt_status st = DT_OK;
    for (size_t k = 0; k <= nch && st == DT_OK; k++) {
        if (k < nch) {
            t1 = prof ? dt_now() : 0;
            st = local_reduce(h, &c, k, t, part);
            if (prof) h->t_reduce += dt_now() - t1;
            if (st == DT_OK && h->leaders) {
                unsigned char *p = c.recv + k * c.chunk * c.esz;
                st = dt_comm_iallreduce(h->leaders, p, p, chunk_len(&c, k), t, part, &ia[k]);
            }
        }
        if (st == DT_OK && k > 0) {
            t1 = prof ? dt_now() : 0;
            if (h->leaders) st = dt_request_wait(&ia[k - 1]);
            if (prof) h->t_inter += dt_now() - t1;
            if (st == DT_OK && h->local)
                st = dt_comm_ibroadcast(h->local, c.recv + (k - 1) * c.chunk * c.esz, chunk_len(&c, k - 1), t, 0,
                                        &bc[k - 1]);
        }
    }
    t1 = prof ? dt_now() : 0;
    dt_status w = dt_request_waitall(bc, (int)(2 * nch)); /* also the leaders' ops an error left queued */
    if (prof) h->t_tail += dt_now() - t1, h->t_all += dt_now() - t0, h->calls++;
    free(bc);
    if (st == DT_OK) st = w;
    if (st == DT_OK && op == DT_OP_AVG) dt_reduce_scale(recv, count, t, world);
    return st;
}

dt_status dt_comm_set_hier_chunk(dt_comm *c, size_t bytes) {
    if (!c) return dt_error(DT_EINVAL, "dt_comm_set_hier_chunk: communicator is NULL");
    if (c->hier) c->hier->chunk_bytes = bytes;
    return DT_OK;
}
