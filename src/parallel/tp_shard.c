/* Tensor-parallel shards of a GPT (tp.h): which tensor splits how, the copy of one rank's part in
 * and out of a whole tensor, and the scatter / gather of a whole model and optimizer state. The
 * whole model is what checkpoints hold (one PyTorch-loadable file, layout independent): a run
 * resumes under any --tp by scattering it, and saves by gathering. */
#include "parallel/tp.h"

#include <stdlib.h>
#include <string.h>

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

dt_tp_split dt_tp_split_of(const char *name) {
    if (ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_attn.bias")) return DT_TP_ROWS3;
    if (ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_fc.bias")) return DT_TP_ROWS;
    if (!strcmp(name, "transformer.wte.weight")) return DT_TP_ROWS;
    if (ends_with(name, ".c_proj.weight")) return DT_TP_COLS;
    if (ends_with(name, ".c_proj.bias")) return DT_TP_RANK0;
    return DT_TP_REPL;
}

static void move(float *full, float *local, size_t n, bool to_local) {
    if (to_local) memcpy(local, full, n * sizeof(float));
    else memcpy(full, local, n * sizeof(float));
}

void dt_tp_copy(dt_tp_split k, float *full, float *local, const dt_param_info *ft, int K, int r, bool to_local) {
    const size_t R = (size_t)ft->shape[0], Cc = ft->numel / R;
    switch (k) {
    case DT_TP_REPL: move(full, local, ft->numel, to_local); break;
    case DT_TP_RANK0:
        if (r == 0) move(full, local, ft->numel, to_local);
        else if (to_local) memset(local, 0, ft->numel * sizeof(float));
        break;
    case DT_TP_ROWS: {
        const size_t lr = R / (size_t)K;
        move(full + (size_t)r * lr * Cc, local, lr * Cc, to_local);
        break;
    }
    case DT_TP_ROWS3: {
        const size_t third = R / 3, lr = third / (size_t)K;
        for (size_t j = 0; j < 3; j++) move(full + (j * third + (size_t)r * lr) * Cc, local + j * lr * Cc, lr * Cc, to_local);
        break;
    }
    case DT_TP_COLS: {
        const size_t lc = Cc / (size_t)K;
        for (size_t row = 0; row < R; row++) move(full + row * Cc + (size_t)r * lc, local + row * lc, lc, to_local);
        break;
    }
    }
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
    float *tmp = NULL;  /* an unplaced whole tensor's initial values, one at a time */
    dt_status st = DT_OK;
    for (int j = 0; st == DT_OK && j < dt_model_num_tensors(local); j++) {
        const dt_param_info *lt = dt_model_tensor(local, j), *ft = whole_of(full, lt);
        if (!ft) {
            st = DT_EINVAL;
            break;
        }
        if (!dt_model_tensor_placed(local, j)) continue;  /* another stage's (tp x pp) */
        const dt_tp_split k = dt_tp_split_of(lt->name);
        const int i = dt_model_find_tensor(full, lt->name);
        float *fb = (lt->is_buffer ? dt_model_buffers(full) : dt_model_params(full)) + ft->offset;
        float *lb = lt->is_buffer ? dt_model_buffers(local) : dt_model_params(local);
        const bool placed = dt_model_tensor_placed(full, i);
        if (!placed && !tmp && !(tmp = malloc(largest_tensor(full) * sizeof(float)))) {
            st = dt_error(DT_ENOMEM, "tensor parallel: out of memory initialising the shards");
            break;
        }
        if (!placed && (st = dt_model_init_tensor(full, i, tmp)) != DT_OK) break;
        dt_tp_copy(k, placed ? fb : tmp, lb + lt->offset, ft, K, r, true);
        for (int s = 0; placed && fo && lo && !lt->is_buffer && s < dt_optim_num_states(lo); s++) {
            const char *nm;  /* unplaced: fresh moments (a resume restores the shards in place after) */
            dt_tp_copy(k, dt_optim_state(fo, s, &nm) + ft->offset, dt_optim_state(lo, s, &nm) + lt->offset, ft, K, r,
                       true);
        }
    }
    free(tmp);
    if (st == DT_OK && fo && lo) dt_optim_set_steps(lo, dt_optim_steps(fo));
    return st;
}

dt_status dt_tp_gather_tensor(dt_comm *comm, int K, const dt_param_info *ft, const dt_param_info *lt, const float *src,
                              float *dst, float *tmp, bool to_all) {
    const dt_tp_split k = dt_tp_split_of(lt->name);
    if (!comm) memcpy(tmp, src, lt->numel * sizeof(float));
    else if (to_all) DT_TRY(dt_comm_allgather(comm, src, tmp, lt->numel, DT_F32));
    else DT_TRY(dt_comm_gather(comm, src, tmp, lt->numel, DT_F32, 0));
    if (!to_all && comm && dt_comm_rank(comm) != 0) return DT_OK;
    for (int q = 0; q < K; q++)
        if (q == 0 || (k != DT_TP_REPL && k != DT_TP_RANK0))
            dt_tp_copy(k, dst, tmp + (size_t)q * lt->numel, ft, K, q, false);
    return DT_OK;
}

/* Every rank's part of local tensor lt into its whole tensor ft's place in whole (a slab's base). */
static dt_status gather_tensor(dt_comm *comm, int K, const dt_param_info *ft, const dt_param_info *lt, const float *src,
                               float *whole, float *tmp, bool to_all) {
    return dt_tp_gather_tensor(comm, K, ft, lt, src, whole + ft->offset, tmp, to_all);
}

/* The scratch of gather_tensor for the largest tensor of local. */
static float *gather_scratch(const dt_model *local, int K) {
    float *tmp = malloc((size_t)K * largest_tensor(local) * sizeof(float));
    if (!tmp) dt_error(DT_ENOMEM, "tensor parallel: out of memory gathering the shards");
    return tmp;
}

dt_status dt_tp_gather(dt_comm *comm, dt_model *full, dt_model *local, dt_optim *lo, int K, float *const *moments) {
    float *tmp = gather_scratch(local, K);
    if (!tmp) return DT_ENOMEM;
    dt_status s = DT_OK;
    for (int j = 0; s == DT_OK && j < dt_model_num_tensors(local); j++) {
        const dt_param_info *lt = dt_model_tensor(local, j), *ft = whole_of(full, lt);
        if (!ft) s = DT_EINVAL;
        float *lb = lt->is_buffer ? dt_model_buffers(local) : dt_model_params(local);
        float *fb = lt->is_buffer ? dt_model_buffers(full) : dt_model_params(full);
        if (s == DT_OK) s = gather_tensor(comm, K, ft, lt, lb + lt->offset, fb, tmp, true);
        for (int k = 0; s == DT_OK && moments && !lt->is_buffer && k < dt_optim_num_states(lo); k++) {
            const char *nm;
            s = gather_tensor(comm, K, ft, lt, dt_optim_state(lo, k, &nm) + lt->offset, moments[k], tmp, false);
        }
    }
    free(tmp);
    return s == DT_OK ? DT_OK : dt_error_wrap(s, "tensor parallel: gathering the shards into the whole model");
}
