/* Gradient-norm clipping over pieces of a gradient, for every strategy: the squared norm of the
 * pieces that count on this rank (the device's sqnorm, one partial per piece, summed in order),
 * summed over the ranks that hold the other shards (the caller's reduction), and the pieces to
 * scale when the norm exceeds the limit (torch.nn.utils.clip_grad_norm_'s formula). */
#ifndef DT_OPTIM_CLIP_H
#define DT_OPTIM_CLIP_H

#include "device/device.h"

/* n gradient values at g, in the memory of the clip's device. */
typedef struct {
    float *g;
    size_t n;
} dt_grad_piece;

/* A growable list of pieces (zero-initialise; dt_grad_pieces_free releases it). */
typedef struct {
    dt_grad_piece *p;
    int n, cap;
} dt_grad_pieces;

/* Appends [g, g + n) (nothing when n is 0). DT_ENOMEM when the list cannot grow. */
dt_status dt_grad_pieces_add(dt_grad_pieces *l, float *g, size_t n);
void dt_grad_pieces_free(dt_grad_pieces *l);

typedef struct {
    dt_dev *dev;    /* where the pieces live */
    double *dev_ss; /* nss doubles of dev's memory for the partial sums, downloaded nss at
                     * a time (NULL: sqnorm writes a host double; a host-memory device) */
    int nss;
    const dt_grad_piece *norm; /* this rank's part of the norm */
    int nnorm;
    const dt_grad_piece *scale; /* what the update reads, scaled when the norm exceeds the limit */
    int nscale;
    /* sums *ss (this rank's part) over the ranks that hold the rest of the gradient; NULL: none */
    dt_status (*reduce)(void *ctx, double *ss);
    void *reduce_ctx;
} dt_clip_spec;

/* *norm_out = the norm of the whole gradient; when max_norm > 0 and the norm exceeds it, every
 * scale piece is multiplied by max_norm / (norm + 1e-6) (torch adds 1e-6). A failure is the
 * reduction's, and then nothing is scaled. */
dt_status dt_clip_grad_pieces(const dt_clip_spec *c, float max_norm, float *norm_out);

#endif
