/* A deterministic hold-out split of a feature data set (--val-split F): a (seed)-keyed
 * permutation of the samples, its first round(n*F) the validation part, the rest the training
 * part, each kept in the original sample order. The same seed always gives the same split, on
 * any number of workers and after a resume. The parts are views: index lists into the one set's
 * samples (a copy of each was 47 MB more per rank for Fashion-MNIST, in no memory plan). */
#include "data/data_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The epoch number whose shuffle keys the split: one no real epoch reaches. */
#define SPLIT_EPOCH ((uint64_t)0xFFFFFFFFFFFF)

static int by_index(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A view of ds's samples idx[0..n), same dtype, scale, normalisation and classes: it reads ds's
 * own samples (no copy; a view of a view reads the first one's base) and keeps that set alive. */
static dt_status subset(const dt_dataset *ds, const uint32_t *idx, size_t n, const char *part, dt_dataset **out) {
    dt_dataset *s = dt_dataset_alloc();
    if (!s) return DT_ENOMEM;
    if (!(s->rows = malloc(n * sizeof *s->rows))) {
        dt_dataset_destroy(s);
        return dt_error(DT_ENOMEM, "`val_split`: out of memory indexing %zu samples", n);
    }
    for (size_t i = 0; i < n; i++) s->rows[i] = (uint32_t)dt_dataset_row(ds, idx[i]);
    s->base = ds->base ? ds->base : (dt_dataset *)ds; /* held, never written: see refs */
    __atomic_fetch_add(&s->base->refs, 1, __ATOMIC_RELAXED);
    s->x = s->base->x, s->y = s->base->y;
    s->dtype = ds->dtype, s->n = n, s->D = ds->D, s->C = ds->C, s->H = ds->H, s->W = ds->W;
    s->classes = ds->classes, s->targets = ds->targets, s->scale = ds->scale, s->mean = ds->mean, s->std = ds->std;
    snprintf(s->source, sizeof s->source, "%.400s (%s of `val_split`)", ds->source, part);
    if (ds->labels[0]) snprintf(s->labels, sizeof s->labels, "%.400s (%s of `val_split`)", ds->labels, part);
    dt_dataset_update_lut(s);
    *out = s;
    return DT_OK;
}

dt_status dt_dataset_split(const dt_dataset *ds, double fraction, uint64_t seed, dt_dataset **train, dt_dataset **val) {
    *train = *val = NULL;
    if (ds->T > 0)
        return dt_error(DT_EINVAL,
                        "`val_split`: %s is text, whose last `val_fraction` is already held out; use "
                        "`val_fraction`",
                        ds->source);
    const size_t n = ds->n, k = (size_t)floor((double)n * fraction + 0.5);
    if (!(fraction > 0 && fraction < 1) || k < 1 || k >= n)
        return dt_error(DT_EINVAL,
                        "`val_split` %g: need a fraction in (0, 1) that leaves at least one sample on each "
                        "side (%zu samples)",
                        fraction, n);
    uint32_t *order = malloc(n * sizeof *order);
    if (!order) return dt_error(DT_ENOMEM, "`val_split`: out of memory");
    dt_sampler_order(order, n, seed, SPLIT_EPOCH, true);
    qsort(order, k, sizeof *order, by_index);
    qsort(order + k, n - k, sizeof *order, by_index);
    dt_status s = subset(ds, order, k, "validation part", val);
    if (s == DT_OK) s = subset(ds, order + k, n - k, "training part", train);
    if (s != DT_OK) {
        dt_dataset_destroy(*val);
        *val = NULL;
    }
    free(order);
    return s;
}
