/* Gradient-norm clipping over pieces of a gradient (clip.h): the one clipping that the single
 * optimizer, ddp's sharded update, ZeRO, tensor and pipeline parallelism share. */
#include "optim/clip.h"

#include <math.h>
#include <stdlib.h>

dt_status dt_grad_pieces_add(dt_grad_pieces *l, float *g, size_t n) {
    if (!n) return DT_OK;
    if (l->n == l->cap) {
        const int cap = l->cap ? 2 * l->cap : 16;
        dt_grad_piece *p = realloc(l->p, (size_t)cap * sizeof *p);
        if (!p) return dt_error(DT_ENOMEM, "gradient clipping: out of memory for %d pieces of the norm", cap);
        l->p = p, l->cap = cap;
    }
    l->p[l->n++] = (dt_grad_piece){g, n};
    return DT_OK;
}

void dt_grad_pieces_free(dt_grad_pieces *l) {
    free(l->p);
    *l = (dt_grad_pieces){0};
}

/* The sum of the pieces' squares: one device partial per piece, added in piece order. */
static double pieces_sqnorm(const dt_clip_spec *c) {
    dt_dev *d = c->dev;
    double ss = 0, part[64];
    const int room = c->dev_ss ? (c->nss < 64 ? c->nss : 64) : 1;
    for (int i = 0; i < c->nnorm; i += room) {
        const int k = c->nnorm - i < room ? c->nnorm - i : room;
        for (int j = 0; j < k; j++)
            d->ops->sqnorm(d, c->dev_ss ? c->dev_ss + j : part + j, c->norm[i + j].g, c->norm[i + j].n);
        if (c->dev_ss) d->ops->download(d, part, c->dev_ss, (size_t)k * sizeof(double));
        for (int j = 0; j < k; j++) ss += part[j];
    }
    return ss;
}

dt_status dt_clip_grad_pieces(const dt_clip_spec *c, float max_norm, float *norm_out) {
    double ss = pieces_sqnorm(c);
    if (c->reduce) DT_TRY(c->reduce(c->reduce_ctx, &ss));
    const float norm = (float)sqrt(ss);
    *norm_out = norm;
    if (!(max_norm > 0 && norm > max_norm)) return DT_OK;
    const float f = max_norm / (norm + 1e-6f);
    for (int i = 0; i < c->nscale; i++) c->dev->ops->scale(c->dev, c->scale[i].g, f, c->scale[i].n);
    return DT_OK;
}
