/* Names, parsing and formatting for the communicator: reduction ops, the dt_backend enum's names
 * (transports themselves are named by their registry entries, transports.c), algorithms,
 * and the op descriptors (dt_coll_desc) used for mismatch detection and error messages. */
#include "comm/transport.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static const char *const g_redops[DT_OP_COUNT] = {"sum", "avg", "max", "min", "prod"};
static const char *const g_backends[] = {"auto", "shm", "mpi", "self"};
static const char *const g_algos[DT_ALGO_COUNT] = {"auto", "ring", "rd", "rhd", "tree", "direct", "native"};
static const char *const g_ops[DT_COLL_OP_COUNT] = {"?",          "allreduce",      "broadcast", "reduce",  "allgather",
                                                    "allgatherv", "reduce_scatter", "gather",    "scatter", "alltoall",
                                                    "barrier",    "split",          "send",      "recv"};

const char *dt_redop_name(dt_redop op) { return (unsigned)op < DT_OP_COUNT ? g_redops[op] : "?"; }

dt_status dt_redop_parse(const char *s, dt_redop *out) {
    for (int i = 0; i < DT_OP_COUNT; i++)
        if (s && !strcmp(s, g_redops[i])) {
            *out = (dt_redop)i;
            return DT_OK;
        }
    return dt_error(DT_EINVAL, "unknown reduction '%s' (expected sum, avg, max, min or prod)", s ? s : "");
}

const char *dt_backend_name(dt_backend b) { return (unsigned)b <= DT_BACKEND_SELF ? g_backends[b] : "?"; }

dt_status dt_backend_parse(const char *s, dt_backend *out) {
    for (int i = 0; i <= DT_BACKEND_SELF; i++)
        if (s && !strcmp(s, g_backends[i])) {
            *out = (dt_backend)i;
            return DT_OK;
        }
    const dt_transport_kind *k;
    DT_TRY(dt_transport_find(s, &k, NULL)); /* not a transport at all: the registry's message */
    return dt_error(DT_EINVAL, "transport '%s' has no dt_backend value: name it in dt_comm_config.transport", s);
}

const char *dt_comm_algo_name(dt_comm_algo a) { return (unsigned)a < DT_ALGO_COUNT ? g_algos[a] : "?"; }

dt_status dt_comm_algo_parse(const char *s, dt_comm_algo *out) {
    for (int i = 0; i < DT_ALGO_COUNT; i++)
        if (s && !strcmp(s, g_algos[i])) {
            *out = (dt_comm_algo)i;
            return DT_OK;
        }
    return dt_error(DT_EINVAL, "unknown algorithm '%s' (expected auto, ring, rd, rhd, tree, direct or native)",
                    s ? s : "");
}

const char *dt_coll_op_name(dt_coll_op op) { return (unsigned)op < DT_COLL_OP_COUNT ? g_ops[op] : "?"; }

static void lower_dtype(char *out, size_t n, int dtype) {
    snprintf(out, n, "%s", dt_dtype_name((dt_dtype)dtype));
    for (char *p = out; *p; p++) *p = (char)tolower((unsigned char)*p);
}

static int has_root(int op) {
    return op == DT_COLL_BROADCAST || op == DT_COLL_REDUCE || op == DT_COLL_GATHER || op == DT_COLL_SCATTER;
}

const char *dt_coll_desc_call_str(const dt_coll_desc *d, char *buf, size_t n) {
    char ty[16];
    lower_dtype(ty, sizeof ty, d->dtype);
    const char *name = dt_coll_op_name((dt_coll_op)d->op);
    if (d->op == DT_COLL_BARRIER || d->op == DT_COLL_SPLIT) snprintf(buf, n, "%s()", name);
    else if (d->op == DT_COLL_SEND || d->op == DT_COLL_RECV)
        snprintf(buf, n, "%s(%s x %llu, %s rank %d, tag %d)", name, ty, (unsigned long long)d->count,
                 d->op == DT_COLL_SEND ? "to" : "from", d->root, d->tag);
    else if (has_root(d->op))
        snprintf(buf, n, "%s(%s x %llu, root %d%s%s)", name, ty, (unsigned long long)d->count, d->root,
                 d->op == DT_COLL_REDUCE ? ", " : "", d->op == DT_COLL_REDUCE ? dt_redop_name((dt_redop)d->redop) : "");
    else if (d->op == DT_COLL_ALLREDUCE || d->op == DT_COLL_REDUCE_SCATTER)
        snprintf(buf, n, "%s(%s x %llu, %s)", name, ty, (unsigned long long)d->count,
                 dt_redop_name((dt_redop)d->redop));
    else snprintf(buf, n, "%s(%s x %llu)", name, ty, (unsigned long long)d->count);
    return buf;
}

const char *dt_coll_desc_str(const dt_coll_desc *d, char *buf, size_t n) {
    char ty[16];
    lower_dtype(ty, sizeof ty, d->dtype);
    const char *name = dt_coll_op_name((dt_coll_op)d->op);
    if (d->op == DT_COLL_SEND || d->op == DT_COLL_RECV)
        snprintf(buf, n, "%s %s rank %d tag %d (%s x %llu)", name, d->op == DT_COLL_SEND ? "to" : "from", d->root,
                 d->tag, ty, (unsigned long long)d->count);
    else if (d->op == DT_COLL_BARRIER || d->op == DT_COLL_SPLIT)
        snprintf(buf, n, "%s #%llu", name, (unsigned long long)d->seq);
    else snprintf(buf, n, "%s #%llu (%s x %llu)", name, (unsigned long long)d->seq, ty, (unsigned long long)d->count);
    return buf;
}

bool dt_coll_desc_match(const dt_coll_desc *a, const dt_coll_desc *b) {
    if (a->seq != b->seq || a->op != b->op) return false;
    switch (a->op) {
    case DT_COLL_BARRIER:
    case DT_COLL_SPLIT: return true;
    case DT_COLL_ALLGATHERV: return a->dtype == b->dtype; /* counts differ per rank */
    default: break;
    }
    if (a->dtype != b->dtype || a->count != b->count) return false;
    if ((a->op == DT_COLL_ALLREDUCE || a->op == DT_COLL_REDUCE || a->op == DT_COLL_REDUCE_SCATTER) &&
        a->redop != b->redop)
        return false;
    if (has_root(a->op) && a->root != b->root) return false;
    return true;
}
