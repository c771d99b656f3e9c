/* Tensor-parallel shards of a GPT (tp.h): which tensor splits how, the copy of one rank's part in
 * and out of a whole tensor, and the scatter / gather of a whole model and optimizer state. The
 * whole model is what checkpoints hold (one PyTorch-loadable file, layout independent): a run
 * resumes under any --tp by scattering it, and saves by gathering. The tensors are device memory:
 * moved with the device's copy, upload and download (memcpy where both sides are host memory). */
#include "nn/graph_parallel.h"
#include "parallel/tp.h"

#include <stdlib.h>
#include <string.h>

/* The node of model m that declares tensor `name` ("<node>.<suffix>"), or -1. */
static int owner(const dt_model *m, const char *name, const char **suffix) {
    const char *dot = strrchr(name, '.');
    if (!dot) return -1;
    *suffix = dot + 1;
    const size_t len = (size_t)(dot - name);
    for (int i = 0; i < dt_model_num_nodes(m); i++) {
        const char *nm = dt_model_node_name(m, i);
        if (strlen(nm) == len && !strncmp(nm, name, len)) return i;
    }
    return -1;
}

dt_tp_split dt_tp_split_of(const dt_model *m, const char *name) {
    const char *suffix = "";
    const int node = owner(m, name, &suffix);
    if (node < 0) return DT_TP_REPL;
    int parts;
    const bool weight = !strcmp(suffix, "weight"), bias = !strcmp(suffix, "bias");
    switch (dt_model_node_tp(m, node, &parts)) {
    case DT_TP_MARK_COLUMN: return weight || bias ? (parts == 3 ? DT_TP_ROWS3 : DT_TP_ROWS) : DT_TP_REPL;
    case DT_TP_MARK_ROW: return weight ? DT_TP_COLS : bias ? DT_TP_RANK0 : DT_TP_REPL;
    case DT_TP_MARK_VOCAB: return weight ? DT_TP_ROWS : DT_TP_REPL;
    default: return DT_TP_REPL;
    }
}

dt_status dt_mem_part_values(const dt_model *m, int first, int last, int tp, double *out) {
    const int nt = dt_model_num_tensors(m);
    bool *used = calloc((size_t)nt + 1, 1);
    if (!used) return dt_error(DT_ENOMEM, "memory plan: out of memory");
    for (int i = first; i < last; i++) {
        int ids[8];
        const int n = dt_model_node_tensors(m, i, ids, 8);
        for (int j = 0; j < n && j < 8; j++) used[ids[j]] = true;
    }
    double o = 0;
    for (int t = 0; t < nt; t++) {
        const dt_param_info *p = dt_model_tensor(m, t);
        if (!used[t] || p->is_buffer) continue;
        const dt_tp_split k = dt_tp_split_of(m, p->name);
        o += tp > 1 && k != DT_TP_REPL && k != DT_TP_RANK0 ? (double)p->numel / tp : (double)p->numel;
    }
    free(used);
    *out = o;
    return DT_OK;
}

/* Where the whole tensor and the rank's part are: host memory, or device d's. */
typedef struct {
    dt_dev *d;
    bool full_host, local_host;
} sides;

static void move(const sides *s, float *full, float *local, size_t n, bool to_local) {
    float *dst = to_local ? local : full;
    const float *src = to_local ? full : local;
    const bool dh = to_local ? s->local_host : s->full_host, sh = to_local ? s->full_host : s->local_host;
    const size_t b = n * sizeof(float);
    if (dh && sh) memcpy(dst, src, b);
    else if (dh) s->d->ops->download(s->d, dst, src, b);
    else if (sh) s->d->ops->upload(s->d, dst, src, b);
    else s->d->ops->copy(s->d, dst, src, b);
}

static void copy_on(const sides *s, dt_tp_split k, float *full, float *local, const dt_param_info *ft, int K, int r,
                    bool to_local) {
    const size_t R = (size_t)ft->shape[0], Cc = ft->numel / R;
    switch (k) {
    case DT_TP_REPL: move(s, full, local, ft->numel, to_local); break;
    case DT_TP_RANK0:
        if (r == 0) move(s, full, local, ft->numel, to_local);
        else if (to_local && s->local_host) memset(local, 0, ft->numel * sizeof(float));
        else if (to_local) s->d->ops->fill_f32(s->d, local, 0.0f, ft->numel);
        break;
    case DT_TP_ROWS: {
        const size_t lr = R / (size_t)K;
        move(s, full + (size_t)r * lr * Cc, local, lr * Cc, to_local);
        break;
    }
    case DT_TP_ROWS3: {
        const size_t third = R / 3, lr = third / (size_t)K;
        for (size_t j = 0; j < 3; j++)
            move(s, full + (j * third + (size_t)r * lr) * Cc, local + j * lr * Cc, lr * Cc, to_local);
        break;
    }
    case DT_TP_COLS: {
        const size_t lc = Cc / (size_t)K;
        for (size_t row = 0; row < R; row++) move(s, full + row * Cc + (size_t)r * lc, local + row * lc, lc, to_local);
        break;
    }
    }
}

void dt_tp_copy(dt_tp_split k, float *full, float *local, const dt_param_info *ft, int K, int r, bool to_local) {
    const sides host = {dt_device_cpu(), true, true};
    copy_on(&host, k, full, local, ft, K, r, to_local);
}

void dt_tp_copy_on(dt_dev *d, bool full_host, bool local_host, dt_tp_split k, float *full, float *local,
                   const dt_param_info *ft, int K, int r, bool to_local) {
    const sides sd = {d, full_host, local_host};
    copy_on(&sd, k, full, local, ft, K, r, to_local);
}

/* The whole tensor of local tensor j, or NULL with the error set. */
static const dt_param_info *whole_of(dt_model *full, const dt_param_info *lt) {
    int i = dt_model_find_tensor(full, lt->name);
    if (i < 0) {
        dt_error(DT_EINVAL, "tensor parallel: the shard's tensor '%s' is not in the whole model", lt->name);
        return NULL;
    }
    return dt_model_tensor(full, i);
}

/* The largest tensor of m, in values. */
static size_t largest_tensor(const dt_model *m) {
    size_t most = 1;
    for (int j = 0; j < dt_model_num_tensors(m); j++)
        if (dt_model_tensor(m, j)->numel > most) most = dt_model_tensor(m, j)->numel;
    return most;
}

dt_status dt_tp_scatter(dt_model *full, dt_optim *fo, dt_model *local, dt_optim *lo, int K, int r) {
    float *tmp = NULL; /* an unplaced whole tensor's initial values, one at a time */
    dt_status st = DT_OK;
    for (int j = 0; st == DT_OK && j < dt_model_num_tensors(local); j++) {
        const dt_param_info *lt = dt_model_tensor(local, j), *ft = whole_of(full, lt);
        if (!ft) {
            st = DT_EINVAL;
            break;
        }
        if (!dt_model_tensor_placed(local, j)) continue; /* another stage's (tp x pp) */
        const dt_tp_split k = dt_tp_split_of(local, lt->name);
        const int i = dt_model_find_tensor(full, lt->name);
        float *fb = (lt->is_buffer ? dt_model_buffers(full) : dt_model_params(full)) + ft->offset;
        float *lb = lt->is_buffer ? dt_model_buffers(local) : dt_model_params(local);
        const bool placed = dt_model_tensor_placed(full, i);
        const sides sd = {dt_model_device(local), !placed || dt_model_device(full)->host_memory,
                          dt_model_device(local)->host_memory};
        if (!placed && !tmp && !(tmp = malloc(largest_tensor(full) * sizeof(float)))) {
            st = dt_error(DT_ENOMEM, "tensor parallel: out of memory initialising the shards");
            break;
        }
        if (!placed && (st = dt_model_init_tensor(full, i, tmp)) != DT_OK) break;
        copy_on(&sd, k, placed ? fb : tmp, lb + lt->offset, ft, K, r, true);
        for (int s = 0; placed && fo && lo && !lt->is_buffer && s < dt_optim_num_states(lo); s++) {
            const char *nm; /* unplaced: fresh moments (a resume restores the shards in place after) */
            copy_on(&sd, k, dt_optim_state(fo, s, &nm) + ft->offset, dt_optim_state(lo, s, &nm) + lt->offset, ft, K, r,
                    true);
        }
    }
    free(tmp);
    if (st == DT_OK && fo && lo) dt_optim_set_steps(lo, dt_optim_steps(fo));
    return st;
}

dt_status dt_tp_gather_tensor_on(const dt_model *m, dt_dev *d, dt_comm *comm, int K, const dt_param_info *ft,
                                 const dt_param_info *lt, const float *src, float *dst, float *tmp, bool to_all) {
    const dt_tp_split k = dt_tp_split_of(m, lt->name);
    const size_t n = lt->numel;
    const float *send = src;
    if (!d->host_memory) { /* staged: the part downloaded, gathered on the host, placed by uploads */
        float *h = comm ? tmp + (size_t)K * n : tmp;
        d->ops->download(d, h, src, n * sizeof(float));
        send = h;
    }
    if (!comm) {
        if (send != tmp) memcpy(tmp, send, n * sizeof(float));
    } else if (to_all) DT_TRY(dt_comm_allgather(comm, send, tmp, n, DT_F32));
    else DT_TRY(dt_comm_gather(comm, send, tmp, n, DT_F32, 0));
    if (!to_all && comm && dt_comm_rank(comm) != 0) return DT_OK;
    const sides sd = {d, d->host_memory, true};
    for (int q = 0; q < K; q++)
        if (q == 0 || (k != DT_TP_REPL && k != DT_TP_RANK0)) copy_on(&sd, k, dst, tmp + (size_t)q * n, ft, K, q, false);
    return DT_OK;
}

dt_status dt_tp_gather_tensor(const dt_model *m, dt_comm *comm, int K, const dt_param_info *ft, const dt_param_info *lt,
                              const float *src, float *dst, float *tmp, bool to_all) {
    return dt_tp_gather_tensor_on(m, dt_device_cpu(), comm, K, ft, lt, src, dst, tmp, to_all);
}

/* Every rank's part of local tensor lt into its whole tensor ft's place in whole (a slab's base). */
static dt_status gather_tensor(const dt_model *m, dt_dev *d, dt_comm *comm, int K, const dt_param_info *ft,
                               const dt_param_info *lt, const float *src, float *whole, float *tmp, bool to_all) {
    return dt_tp_gather_tensor_on(m, d, comm, K, ft, lt, src, whole + ft->offset, tmp, to_all);
}

/* The scratch of gather_tensor for the largest tensor of local (and its staging on a device). */
static float *gather_scratch(const dt_model *local, int K) {
    const size_t parts = (size_t)K + !dt_model_device(local)->host_memory;
    float *tmp = malloc(parts * largest_tensor(local) * sizeof(float));
    if (!tmp) dt_error(DT_ENOMEM, "tensor parallel: out of memory gathering the shards");
    return tmp;
}

dt_status dt_tp_gather(dt_comm *comm, dt_model *full, dt_model *local, dt_optim *lo, int K, float *const *moments) {
    float *tmp = gather_scratch(local, K);
    if (!tmp) return DT_ENOMEM;
    dt_dev *d = dt_model_device(local); /* full's and the moments' too */
    dt_status s = DT_OK;
    for (int j = 0; s == DT_OK && j < dt_model_num_tensors(local); j++) {
        const dt_param_info *lt = dt_model_tensor(local, j), *ft = whole_of(full, lt);
        if (!ft) s = DT_EINVAL;
        float *lb = lt->is_buffer ? dt_model_buffers(local) : dt_model_params(local);
        float *fb = lt->is_buffer ? dt_model_buffers(full) : dt_model_params(full);
        if (s == DT_OK) s = gather_tensor(local, d, comm, K, ft, lt, lb + lt->offset, fb, tmp, true);
        for (int k = 0; s == DT_OK && moments && !lt->is_buffer && k < dt_optim_num_states(lo); k++) {
            const char *nm;
            s = gather_tensor(local, d, comm, K, ft, lt, dt_optim_state(lo, k, &nm) + lt->offset, moments[k], tmp,
                              false);
        }
    }
    free(tmp);
    return s == DT_OK ? DT_OK : dt_error_wrap(s, "tensor parallel: gathering the shards into the whole model");
}
