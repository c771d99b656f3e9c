/* make test-gpu, part 1 (ggml's test-backend-ops is the model): every training-step primitive and
 * every kernel slot of the cuda device against the cpu device (the blas f32 table) on random
 * inputs, one line per op: name, max abs and rel error, the tolerance, PASS or FAIL. Casts, the
 * elementwise step updates, dropout's mask and the reductions the cuda kernels run in the CPU's
 * order are checked bitwise (tolerance 0); GEMMs, convolutions, transcendental functions and
 * tree reductions at f32 tolerances. Exit 0 only when every op passes.
 *
 *   cuda_ops_test           run every op
 *   cuda_ops_test --probe   exit 0 where a cuda device can be created, else print why and exit 3
 *   cuda_ops_test --device SPEC [--probe]   another device (checked: the harness itself, on any machine)
 *
 * Uses device/device.h only (no CUDA headers): it runs whatever the registry's "cuda" kind is. */
#include "device/device.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_dev *g;
    const dt_kernel_table *cpu, *gpu;
    int fails, ops;
    uint64_t rng;
} ctx;

/* A host array (the cpu side's) and its device copy. */
typedef struct {
    void *h, *d;
    size_t bytes;
} buf;

static float frand(ctx *c) {
    c->rng ^= c->rng << 13, c->rng ^= c->rng >> 7, c->rng ^= c->rng << 17;
    return (float)((c->rng >> 40) * (1.0 / 16777216.0));
}

static buf mk_bytes(ctx *c, const void *host, size_t bytes) {
    buf b = {malloc(bytes ? bytes : 1), c->g->ops->alloc(c->g, bytes ? bytes : 1), bytes};
    if (!b.h || !b.d) {
        fprintf(stderr, "cuda_ops_test: cannot allocate %zu bytes: %s\n", bytes, dt_last_error());
        exit(1);
    }
    if (host) memcpy(b.h, host, bytes);
    else memset(b.h, 0, bytes);
    c->g->ops->upload(c->g, b.d, b.h, bytes);
    return b;
}

/* n floats uniform in [lo, hi) */
static buf mk(ctx *c, size_t n, float lo, float hi) {
    float *v = malloc(n * sizeof *v + 1);
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * frand(c);
    buf b = mk_bytes(c, v, n * sizeof *v);
    free(v);
    return b;
}
static buf zeros(ctx *c, size_t n) { return mk_bytes(c, NULL, n * sizeof(float)); }
static buf ids(ctx *c, size_t n, int V) {
    int32_t *v = malloc(n * sizeof *v + 1);
    for (size_t i = 0; i < n; i++) v[i] = (int32_t)(frand(c) * V) % V;
    buf b = mk_bytes(c, v, n * sizeof *v);
    free(v);
    return b;
}
static void drop(ctx *c, buf *b) {
    free(b->h);
    c->g->ops->free(c->g, b->d);
    b->h = b->d = NULL;
}
#define F(b) ((float *)(b).h)
#define G(b) ((float *)(b).d)

/* Compares the device copy of f32 b with its host values: |gpu - cpu| <= atol + rtol |cpu| (NaN
 * must match NaN); folds the errors into *ea, *er; false on a mismatch. */
static bool close_f32(ctx *c, const buf *b, double atol, double rtol, double *ea, double *er) {
    const size_t n = b->bytes / sizeof(float);
    float *got = malloc(b->bytes + 1);
    c->g->ops->download(c->g, got, b->d, b->bytes);
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        const double want = F(*b)[i], have = got[i];
        if (isnan(want) || isnan(have)) {
            ok = ok && isnan(want) && isnan(have);
            continue;
        }
        const double e = fabs(have - want), r = e / (fabs(want) > 1e-30 ? fabs(want) : 1e-30);
        if (e > *ea) *ea = e;
        if (r > *er && fabs(want) > atol) *er = r;
        if (atol == 0 && rtol == 0 ? memcmp(&got[i], &F(*b)[i], 4) != 0 : e > atol + rtol * fabs(want)) ok = false;
    }
    free(got);
    return ok;
}

static bool same_bytes(ctx *c, const buf *b) {
    unsigned char *got = malloc(b->bytes + 1);
    c->g->ops->download(c->g, got, b->d, b->bytes);
    const bool ok = memcmp(got, b->h, b->bytes) == 0;
    free(got);
    return ok;
}

static void report(ctx *c, const char *op, bool ok, double ea, double er, double atol, double rtol) {
    c->ops++;
    if (!ok) c->fails++;
    printf("%-34s max_abs %-10.3g max_rel %-10.3g tol %g+%g|x|  %s\n", op, ea, er, atol, rtol, ok ? "PASS" : "FAIL");
    fflush(stdout);
}

/* check(c, name, atol, rtol, outputs...): compares each f32 output, prints one line */
static void check(ctx *c, const char *op, double atol, double rtol, int n, buf *outs) {
    c->g->ops->synchronize(c->g);
    double ea = 0, er = 0;
    bool ok = true;
    for (int i = 0; i < n; i++) ok = close_f32(c, &outs[i], atol, rtol, &ea, &er) && ok;
    report(c, op, ok, ea, er, atol, rtol);
}
#define CHECK(c, op, atol, rtol, ...)                                         \
    do {                                                                      \
        buf outs_[] = {__VA_ARGS__};                                          \
        check(c, op, atol, rtol, (int)(sizeof outs_ / sizeof *outs_), outs_); \
    } while (0)

#include "cuda_ops_cases.h"

int main(int argc, char **argv) {
    ctx c = {.rng = 0x9E3779B97F4A7C15ull};
    const char *spec = argc > 2 && !strcmp(argv[1], "--device") ? argv[2] : "cuda";
    const dt_status s = dt_device_create(&c.g, spec);
    if (s != DT_OK) {
        printf("cuda_ops_test: no %s device: %s\n", spec, dt_last_error());
        return 3;
    }
    if (!strcmp(argv[argc - 1], "--probe")) return 0;
    c.cpu = dt_backend_cpu();
    c.gpu = c.g->ops->kernels(c.g, c.cpu);
    if (!c.gpu) {
        printf("cuda_ops_test: the cuda device has no kernel table: %s\n", dt_last_error());
        return 1;
    }
    run_primitives(&c);
    run_kernels(&c);
    dt_device_destroy(c.g);
    printf("cuda_ops_test: %d ops, %d failed\n", c.ops, c.fails);
    return c.fails ? 1 : 0;
}
