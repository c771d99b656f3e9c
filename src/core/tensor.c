/* Tensor views and flat slabs: 64-byte aligned zeroed memory (core/mem.c) that tensors point into. */
#include "dtrain/core.h"

#include <stdlib.h>
#include <string.h>

dt_status dt_slab_alloc(dt_slab *s, size_t n) {
    s->data = dt_alloc(n * sizeof(float));
    s->n = s->data ? n : 0;
    if (!s->data && dt_mem_limit_hit())
        return dt_error_wrap(DT_ENOMEM, "cannot allocate a slab of %zu floats (%.1f MB)", n, n * 4.0 / 1e6);
    if (!s->data) return dt_error(DT_ENOMEM, "cannot allocate a slab of %zu floats (%.1f MB)", n, n * 4.0 / 1e6);
    return DT_OK;
}

void dt_slab_free(dt_slab *s) {
    if (!s) return;
    dt_free(s->data);
    s->data = NULL;
    s->n = 0;
}

int64_t dt_tensor_numel(const dt_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

dt_tensor dt_tensor_view(void *data, dt_dtype dtype, int ndim, const int64_t *shape) {
    dt_tensor t = {.data = data, .dtype = dtype, .ndim = ndim};
    for (int i = 0; i < ndim && i < DT_MAX_DIMS; i++) t.shape[i] = shape[i];
    return t;
}
