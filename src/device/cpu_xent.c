/* The CPU kernel of the device's vocabulary-sharded softmax cross-entropy (device.h xent_shard,
 * Megatron-LM's vocab_parallel_cross_entropy), phase by phase: the row maxima of a slice, the
 * exponentials with their sums and the target logits, then the loss and the logits' gradient.
 * The caller reduces the rows over the slices' ranks between the phases (tensor parallelism,
 * parallel/tp_xent.c). The CPU device runs it on host memory, the checked device in its arena. */
#include "device/device.h"

#include <float.h>
#include <math.h>

static void rows_max(const dt_xent_shard_args *a) {
    for (int i = 0; i < a->N; i++) {
        const float *z = a->logits + (size_t)i * a->Vl;
        float m = -FLT_MAX;
        for (int v = 0; v < a->Vl; v++) m = z[v] > m ? z[v] : m;
        a->rows[i] = m;
    }
}

static void rows_sums(const dt_xent_shard_args *a) {
    const float *mx = a->rows;
    float *sums = a->rows + a->N;
    for (int i = 0; i < a->N; i++) {
        const float *z = a->logits + (size_t)i * a->Vl;
        float *p = a->dlogits + (size_t)i * a->Vl;
        double s = 0;
        for (int v = 0; v < a->Vl; v++) s += (p[v] = expf(z[v] - mx[i]));
        const int32_t y = a->targets[i];
        sums[2 * i] = (float)s;
        sums[2 * i + 1] = y >= a->lo && y < a->lo + a->Vl ? z[y - a->lo] : 0.0f;
    }
}

static void loss_grad(const dt_xent_shard_args *a) {
    const float *mx = a->rows, *sums = a->rows + a->N;
    const int Vl = a->Vl, lo = a->lo;
    int n = 0;
    for (int i = 0; i < a->N; i++) n += a->targets[i] != a->ignore;
    double l = 0;
    const float g = n > 0 ? a->scale / (float)n : 0.0f;
    for (int i = 0; i < a->N; i++) {
        float *p = a->dlogits + (size_t)i * Vl;
        const int32_t y = a->targets[i];
        if (y == a->ignore) {
            for (int v = 0; v < Vl; v++) p[v] = 0.0f;
            continue;
        }
        l += log((double)sums[2 * i]) + mx[i] - sums[2 * i + 1];
        const float inv = 1.0f / sums[2 * i];
        for (int v = 0; v < Vl; v++) p[v] *= inv * g;
        if (y >= lo && y < lo + Vl) p[y - lo] -= g;
    }
    *a->loss = n > 0 ? l / n : 0.0;
    *a->counted = n;
}

void dt_cpu_xent_shard(dt_dev *d, dt_xent_phase phase, const dt_xent_shard_args *a) {
    (void)d;
    switch (phase) {
    case DT_XENT_MAX: rows_max(a); break;
    case DT_XENT_SUMS: rows_sums(a); break;
    case DT_XENT_GRAD: loss_grad(a); break;
    }
}
