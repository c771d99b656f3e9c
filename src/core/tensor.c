/* Tensor views and flat slabs: 64-byte aligned zeroed memory (core/mem.c) that tensors point into. */
#include "dtrain/core.h"

#include <stdlib.h>
#include <string.h>

dt_status dt_slab_init(dt_slab *s, size_t n) {
    *s = (dt_slab){.data = dt_alloc(n * sizeof(float))}; /* not reserved: charged whole by dt_alloc */
    s->n = s->data ? n : 0;
    if (!s->data && dt_mem_limit_hit())
        return dt_error_wrap(DT_ENOMEM, "cannot allocate a slab of %zu floats (%.1f MB)", n, n * 4.0 / 1e6);
    if (!s->data) return dt_error(DT_ENOMEM, "cannot allocate a slab of %zu floats (%.1f MB)", n, n * 4.0 / 1e6);
    return DT_OK;
}

void dt_slab_free(dt_slab *s) {
    if (!s) return;
    if (s->reserved) dt_mem_uncharge(s->placed);
    dt_free(s->data);
    *s = (dt_slab){0};
}

dt_status dt_slab_reserve(dt_slab *s, size_t n) {
    *s = (dt_slab){.data = dt_alloc_reserved((n ? n : 1) * sizeof(float)), .n = n, .reserved = true};
    if (!s->data) {
        *s = (dt_slab){0};
        return dt_error(DT_ENOMEM, "cannot reserve a slab of %zu floats (%.1f MB)", n, n * 4.0 / 1e6);
    }
    return DT_OK;
}

dt_status dt_slab_place(dt_slab *s, const dt_range *own, int nown, const char *what) {
    if (!s->data) return DT_OK;
    const dt_range whole = {0, s->n};
    if (!own) own = &whole, nown = 1;
    size_t want = 0;
    for (int i = 0; i < nown; i++) want += (own[i].hi - own[i].lo) * sizeof(float);
    if (want > s->placed) DT_TRY(dt_mem_charge(want - s->placed, what));
    else dt_mem_uncharge(s->placed - want);
    s->placed = want;
    size_t at = 0; /* the gaps between the ranges go back to the OS */
    for (int i = 0; i <= nown; i++) {
        const size_t end = i < nown ? own[i].lo : s->n;
        if (end > at) dt_mem_discard(s->data + at, (end - at) * sizeof(float));
        if (i < nown) at = own[i].hi;
    }
    return DT_OK;
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
