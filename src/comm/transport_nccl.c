/* The NCCL transport: collectives and point-to-point on CUDA device buffers through NCCL, beside
 * a bootstrap transport (shm for local workers, mpi under mpirun) that carries the NCCL unique id,
 * every host-memory message, op descriptors and abort notices. Creation checks on every rank
 * that it has a CUDA device (rank 0 gathers the answers over the bootstrap, so all ranks fail
 * together naming the rank without one), then runs ncclCommInitRankConfig nonblocking, polled
 * with the creation deadline (ncclCommAbort when it passes). Split = the bootstrap's split plus a
 * new NCCL communicator over it. Its registry entry is chosen automatically when every rank keeps
 * model memory on a CUDA device (dt_comm_config.device "cuda[:N]"). Collectives: transport_nccl_coll.c.
 * Without DT_HAVE_NCCL the entry exists and says how to build it. */
#include "comm/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DT_HAVE_NCCL

static bool nccl_probe(const dt_transport_params *p, char *why, size_t n) {
    (void)p;
    snprintf(why, n, "built without NCCL");
    return false;
}
static dt_status nccl_create(dt_transport **out, const dt_transport_params *p) {
    (void)p;
    *out = NULL;
    return dt_error(DT_ENOTSUP, "the nccl transport is not built in: install CUDA with NCCL (nccl.h and libnccl under "
                                "CUDA_HOME=/usr/local/cuda) and rebuild with NCCL=1, or use `backend` shm or mpi");
}

#else
#include "comm/transport_nccl.h"

#include <unistd.h>

/* "cuda" or "cuda:N": a CUDA device spec */
static bool cuda_spec(const char *device) {
    return device && !strncmp(device, "cuda", 4) && (device[4] == 0 || device[4] == ':');
}

/* "" or "bootstrap=shm|mpi" -> the bootstrap's registry name ("" = by the launcher) */
static dt_status parse_options(const char *opts, char *boot, size_t n) {
    boot[0] = 0;
    if (!opts || !*opts) return DT_OK;
    if (!strncmp(opts, "bootstrap=", 10) && (!strcmp(opts + 10, "shm") || !strcmp(opts + 10, "mpi"))) {
        snprintf(boot, n, "%s", opts + 10);
        return DT_OK;
    }
    return dt_error(DT_EINVAL, "nccl transport: unknown option '%s' (it takes bootstrap=shm or bootstrap=mpi)", opts);
}

/* This rank's CUDA device: "cuda:N", else local_rank modulo the devices; 0 or a reason in msg. */
static int local_device(const char *device, int local_rank, int *dev, char *msg, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        snprintf(msg, n, "no usable CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return -1;
    }
    const char *colon = device ? strchr(device, ':') : NULL;
    *dev = colon ? atoi(colon + 1) : local_rank % count;
    if (*dev < 0 || *dev >= count) {
        snprintf(msg, n, "device %s but only %d CUDA device(s) are visible", device, count);
        return -1;
    }
    if ((e = cudaSetDevice(*dev)) != cudaSuccess) {
        snprintf(msg, n, "cudaSetDevice(%d): %s", *dev, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

typedef struct {
    int32_t ok, dev;
    char msg[200];
} nccl_hello;
typedef struct {
    int32_t ok;
    ncclUniqueId id;
    char msg[300];
} nccl_reply;

/* Rank 0 gathers every rank's device answer over the bootstrap and sends back the unique id, or
 * the first rank without a device: so every rank fails alike. */
static dt_status exchange_id(dt_transport *h, const nccl_hello *mine, nccl_reply *rep, double deadline) {
    const dt_transport_ops *o = h->ops;
    dt_status st = DT_OK;
    if (h->rank != 0) {
        dt_treq sreq, rreq;
        memset(&sreq, 0, sizeof sreq), memset(&rreq, 0, sizeof rreq);
        DT_TRY(o->isend(h, 0, DT_TAG_COLL, mine, sizeof *mine, &sreq));
        DT_TRY(o->irecv(h, 0, DT_TAG_COLL, rep, sizeof *rep, &rreq));
        dt_treq *both[2] = {&sreq, &rreq};
        return o->waitall(h, both, 2, deadline);
    }
    nccl_hello *all = calloc((size_t)h->size, sizeof *all);
    dt_treq *reqs = calloc((size_t)h->size, sizeof *reqs);
    dt_treq **ptrs = calloc((size_t)h->size, sizeof *ptrs);
    if (!all || !reqs || !ptrs) st = dt_error(DT_ENOMEM, "nccl transport: out of memory");
    for (int r = 1; st == DT_OK && r < h->size; r++) st = o->irecv(h, r, DT_TAG_COLL, &all[r], sizeof *all, &reqs[r]);
    for (int r = 1; r < h->size; r++) ptrs[r - 1] = &reqs[r];
    if (st == DT_OK && h->size > 1) st = o->waitall(h, ptrs, h->size - 1, deadline);
    if (st == DT_OK) {
        all[0] = *mine;
        memset(rep, 0, sizeof *rep);
        rep->ok = 1;
        for (int r = 0; r < h->size && rep->ok; r++)
            if (!all[r].ok) rep->ok = 0, snprintf(rep->msg, sizeof rep->msg, "rank %d: %s", r, all[r].msg);
        ncclResult_t nr = rep->ok ? ncclGetUniqueId(&rep->id) : ncclSuccess;
        if (nr != ncclSuccess)
            rep->ok = 0, snprintf(rep->msg, sizeof rep->msg, "rank 0: ncclGetUniqueId: %s", ncclGetErrorString(nr));
        memset(reqs, 0, (size_t)h->size * sizeof *reqs);
        for (int r = 1; st == DT_OK && r < h->size; r++) st = o->isend(h, r, DT_TAG_COLL, rep, sizeof *rep, &reqs[r]);
        if (st == DT_OK && h->size > 1) st = o->waitall(h, ptrs, h->size - 1, deadline);
    }
    free(all), free(reqs), free(ptrs);
    return st;
}

/* ncclCommInitRankConfig (nonblocking) and the stream and event, on n whose host and dev are set. */
static dt_status init_comm(dt_nccl *n, const ncclUniqueId *id, double deadline) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, n->base.size, *id, n->base.rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) return dt_nccl_error(n, DT_EPEER, r, "ncclCommInitRankConfig");
    DT_TRY(dt_nccl_wait_enqueued(n, deadline, "ncclCommInitRankConfig"));
    cudaError_t e = cudaStreamCreateWithFlags(&n->own, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return dt_error(DT_ENOTSUP, "nccl transport: creating its stream: %s", cudaGetErrorString(e));
    return DT_OK;
}

/* A transport over bootstrap h (owned from here on): the device check on every rank, the id, NCCL. */
static dt_status nccl_over(dt_transport *h, const char *device, int local_rank, int dev, double timeout_s,
                           dt_transport **out) {
    *out = NULL;
    dt_nccl *n = calloc(1, sizeof *n);
    if (!n) {
        h->ops->destroy(h);
        return dt_error(DT_ENOMEM, "out of memory creating the nccl transport");
    }
    n->base.ops = &dt_nccl_ops;
    n->base.rank = h->rank, n->base.size = h->size;
    n->host = h;
    n->timeout_s = timeout_s;
    nccl_hello me = {.ok = 1};
    if (dev >= 0) n->dev = dev, me.ok = cudaSetDevice(dev) == cudaSuccess;
    else me.ok = local_device(device, local_rank, &n->dev, me.msg, sizeof me.msg) == 0;
    me.dev = n->dev;
    nccl_reply rep;
    double deadline = dt_now() + timeout_s;
    dt_status st = exchange_id(h, &me, &rep, deadline);
    if (st == DT_OK && !rep.ok)
        st = dt_error(DT_ENOTSUP,
                      "the nccl transport needs a CUDA device on every rank, and %s: run on GPUs, or "
                      "use `backend` shm or mpi (host-staged collectives)",
                      rep.msg);
    if (st == DT_OK) st = init_comm(n, &rep.id, deadline);
    if (st != DT_OK) {
        n->broken = true;
        dt_nccl_destroy(&n->base);
        return st;
    }
    *out = &n->base;
    return DT_OK;
}

static dt_status nccl_create(dt_transport **out, const dt_transport_params *p) {
    *out = NULL;
    char boot[8];
    DT_TRY(parse_options(p->options, boot, sizeof boot));
    const dt_transport_kind *k;
    DT_TRY(dt_transport_find(*boot ? boot : p->launcher == DT_LAUNCH_MPI ? "mpi" : "shm", &k, NULL));
    dt_transport_params hp = *p;
    hp.options = "";
    char job[DT_COMM_JOB_ID_MAX + 1];
    if (p->size == 1) { /* one process: its own bootstrap segment, whatever job id it was given */
        snprintf(job, sizeof job, "%.180s.%d", p->job_id && *p->job_id ? p->job_id : "nccl", (int)getpid());
        hp.job_id = job;
    }
    dt_transport *h = NULL;
    DT_TRY(dt_transport_create(k, &h, &hp));
    if (!h) return dt_error(DT_EINTERNAL, "nccl transport: the %s bootstrap made no transport", k->name);
    return nccl_over(h, p->device, p->local_rank, -1, p->timeout_s > 0 ? p->timeout_s : 300, out);
}

dt_status dt_nccl_split(dt_transport *t, int color, const int *members, int new_size, int new_rank, uint64_t split_id,
                        double deadline, dt_transport **out) {
    dt_nccl *n = (dt_nccl *)t;
    *out = NULL;
    if (!n->host->ops->split) return dt_error(DT_ENOTSUP, "the %s bootstrap of nccl cannot split", n->host->ops->name);
    dt_transport *h = NULL;
    DT_TRY(n->host->ops->split(n->host, color, members, new_size, new_rank, split_id, deadline, &h));
    double left = deadline - dt_now();
    return nccl_over(h, NULL, 0, n->dev, left > 1 ? left : 1, out);
}

void dt_nccl_destroy(dt_transport *t) {
    if (!t) return;
    dt_nccl *n = (dt_nccl *)t;
    if (n->comm) {
        cudaSetDevice(n->dev);
        ncclResult_t r = n->broken ? ncclInternalError : ncclCommFinalize(n->comm);
        bool clean = r == ncclSuccess || r == ncclInProgress;
        if (clean && dt_nccl_wait_enqueued(n, dt_now() + n->timeout_s, "ncclCommFinalize") != DT_OK) clean = false;
        if (clean) ncclCommDestroy(n->comm);
        else ncclCommAbort(n->comm);
    }
    for (int i = 0; i < n->ndreq; i++)
        if (n->dreq[i]->priv.p[0]) cudaEventDestroy((cudaEvent_t)n->dreq[i]->priv.p[0]);
    if (n->ev) cudaEventDestroy(n->ev);
    if (n->own) cudaStreamDestroy(n->own);
    if (n->host) n->host->ops->destroy(n->host);
    free(n);
}

static bool nccl_probe(const dt_transport_params *p, char *why, size_t n) {
    if (p->size > 1 && cuda_spec(p->device)) return true;
    snprintf(why, n, "%s",
             p->size > 1 ? "model memory is not on a CUDA device (`device` cuda)" : "one process needs no transport");
    return false;
}

#endif

const dt_transport_kind dt_transport_kind_nccl = {
    .name = "nccl",
    .help = "NCCL collectives and send/recv on CUDA device memory (default when every rank is on --device cuda), "
            "bootstrapped over shm or mpi",
    .options = "bootstrap=shm|mpi",
    .probe = nccl_probe,
    .create = nccl_create,
};
