/* The vocabulary-parallel cross-entropy of tensor parallelism (Megatron-LM's
 * vocab_parallel_cross_entropy): each rank holds the logits of its slice of the vocabulary; the
 * row maxima, the sums of exponentials and the target logits are reduced across the ranks (two
 * allreduces of N and 2N floats), so the (N, V) logits are never gathered. The gradient of a rank's
 * slice is its softmax slice minus the one-hot target where the target is in the slice. */
#include "parallel/tp.h"

#include <float.h>
#include <math.h>

dt_status dt_tp_xent(dt_comm *comm, const float *logits, const int32_t *targets, int N, int Vl, int lo, int vocab,
                     int ignore, float scale, float *dlogits, float *work, double *loss, int *counted) {
    float *mx = work, *sums = work + N;  /* sums: (sum of exp, target logit) per row */
    for (int i = 0; i < N; i++) {
        const int32_t y = targets[i];
        if (y != ignore && (y < 0 || y >= vocab))
            return dt_error(DT_EINVAL, "model: node 'loss': target %d of row %d is outside [0, %d) (the vocabulary)",
                            y, i, vocab);
        const float *z = logits + (size_t)i * Vl;
        float m = -FLT_MAX;
        for (int v = 0; v < Vl; v++) m = z[v] > m ? z[v] : m;
        mx[i] = m;
    }
    if (comm) DT_TRY(dt_comm_allreduce(comm, mx, mx, (size_t)N, DT_F32, DT_OP_MAX));
    for (int i = 0; i < N; i++) {
        const float *z = logits + (size_t)i * Vl;
        float *p = dlogits + (size_t)i * Vl;
        double s = 0;
        for (int v = 0; v < Vl; v++) s += (p[v] = expf(z[v] - mx[i]));
        const int32_t y = targets[i];
        sums[2 * i] = (float)s;
        sums[2 * i + 1] = y >= lo && y < lo + Vl ? z[y - lo] : 0.0f;
    }
    if (comm) DT_TRY(dt_comm_allreduce(comm, sums, sums, 2 * (size_t)N, DT_F32, DT_OP_SUM));
    int n = 0;
    for (int i = 0; i < N; i++) n += targets[i] != ignore;
    double l = 0;
    const float g = n > 0 ? scale / (float)n : 0.0f;
    for (int i = 0; i < N; i++) {
        float *p = dlogits + (size_t)i * Vl;
        const int32_t y = targets[i];
        if (y == ignore) {
            for (int v = 0; v < Vl; v++) p[v] = 0.0f;
            continue;
        }
        l += log((double)sums[2 * i]) + mx[i] - sums[2 * i + 1];
        const float inv = 1.0f / sums[2 * i];
        for (int v = 0; v < Vl; v++) p[v] *= inv * g;
        if (y >= lo && y < lo + Vl) p[y - lo] -= g;
    }
    *loss = n > 0 ? l / n : 0.0;
    *counted = n;
    return DT_OK;
}
