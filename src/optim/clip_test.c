/* dt_clip_grad_pieces on the cpu device and on the checked one (pieces in device memory): the norm
 * of the counted pieces plus the other ranks' part (a reduction that adds a known sum), the scale
 * pieces multiplied by torch's factor and nothing else touched, the partials summed in piece order
 * whatever the batch of device partials (nss), no scaling under the limit, with max_norm 0, or
 * when the reduction fails. */
#include "core/test.h"
#include "optim/clip.h"

#include <math.h>
#include <string.h>

#define N 40

static dt_status add_other(void *ctx, double *ss) {
    *ss += *(const double *)ctx; /* the other ranks' squares */
    return DT_OK;
}

static dt_status fail_reduce(void *ctx, double *ss) {
    (void)ctx, (void)ss;
    return dt_error(DT_EIO, "planted reduction failure");
}

/* Clips x (host values) placed on d: the norm pieces [0,7) [9,20) [25,40) (20..25 shared by no
 * one here), the scale pieces [0,20) [20,40); returns the norm, *out the values after. */
static float clip_on(dt_dev *d, const float *x, int nss, float max_norm, double other,
                     dt_status (*reduce)(void *, double *), dt_status *st, float *out) {
    float *g = d->ops->alloc(d, N * sizeof(float));
    double *ss = d->host_memory ? NULL : d->ops->alloc(d, (size_t)nss * sizeof(double));
    d->ops->upload(d, g, x, N * sizeof(float));
    const dt_grad_piece norm[] = {{g, 7}, {g + 9, 11}, {g + 25, 15}}, scale[] = {{g, 20}, {g + 20, 20}};
    const dt_clip_spec c = {.dev = d,
                            .dev_ss = ss,
                            .nss = nss,
                            .norm = norm,
                            .nnorm = 3,
                            .scale = scale,
                            .nscale = 2,
                            .reduce = reduce,
                            .reduce_ctx = &other};
    float got = -1;
    *st = dt_clip_grad_pieces(&c, max_norm, &got);
    d->ops->download(d, out, g, N * sizeof(float));
    d->ops->free(d, g);
    if (ss) d->ops->free(d, ss);
    return got;
}

static void on_device(dt_dev *d, const char *name) {
    float x[N], y[N], y2[N];
    for (int i = 0; i < N; i++) x[i] = (float)((i * 37) % 11) / 7.0f - 0.6f;
    double want = 0;
    for (int i = 0; i < N; i++)
        if (i < 7 || (i >= 9 && i < 20) || i >= 25) want += (double)x[i] * x[i];
    const double other = 2.5;
    dt_status st;
    const float norm = clip_on(d, x, 3, 0.5f, other, add_other, &st, y);
    CHECK_MSG(st == DT_OK && fabs(norm - sqrt(want + other)) < 1e-5, "%s: norm %g, want %g", name, norm,
              sqrt(want + other));
    const float f = 0.5f / (norm + 1e-6f);
    int scaled = 0;
    for (int i = 0; i < N; i++) scaled += y[i] == x[i] * f;
    CHECK_MSG(scaled == N, "%s: %d of %d values scaled by max_norm / (norm + 1e-6)", name, scaled, N);
    const float norm1 = clip_on(d, x, 1, 0.5f, other, add_other, &st, y2); /* one partial downloaded at a time */
    CHECK_MSG(norm1 == norm && !memcmp(y, y2, sizeof y), "%s: nss 1 and 3 differ", name);
    clip_on(d, x, 3, 100.0f, other, add_other, &st, y);
    CHECK_MSG(!memcmp(x, y, sizeof x), "%s: scaled under the limit", name);
    const float measured = clip_on(d, x, 3, 0.0f, other, add_other, &st, y);
    CHECK_MSG(measured == norm && !memcmp(x, y, sizeof x), "%s: max_norm 0 measures only", name);
    clip_on(d, x, 2, 0.5f, other, fail_reduce, &st, y);
    CHECK_MSG(st == DT_EIO && !memcmp(x, y, sizeof x), "%s: a failed reduction scales nothing (%s)", name,
              dt_status_str(st));
}

int main(void) {
    on_device(dt_device_cpu(), "cpu");
    dt_dev *checked = NULL;
    CHECK_OK(dt_device_create(&checked, "checked"));
    if (checked) on_device(checked, "checked");
    dt_device_destroy(checked);

    dt_grad_pieces l = {0};
    float v[3];
    CHECK_OK(dt_grad_pieces_add(&l, v, 0));
    CHECK(l.n == 0);
    for (int i = 0; i < 40; i++) CHECK_OK(dt_grad_pieces_add(&l, v + i % 3, 1));
    CHECK(l.n == 40 && l.p[39].g == v);
    dt_grad_pieces_free(&l);
    CHECK(l.n == 0 && !l.p);
    return dt_test_summary("clip_test");
}
