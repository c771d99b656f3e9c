/* The kernel ceiling of a lower GEMM precision at the reference models' own shapes: microseconds
 * per call (best of 5 repeats, so a loaded machine costs little) of the backend tables' linear
 * and conv kernels, forward and backward (both GEMMs), at onednn fp32, onednn bf16 and blas fp32,
 * interleaved shape by shape; the "bf16 gain" column is fp32 time / bf16 time, the most that bf16
 * GEMM inputs can give those layers on this CPU. Prints a table, then one JSON line.
 *   make && cc -O2 -march=native -Iinclude -Isrc bench/gemm_precision.c build/libdtrain.a \
 *        $(make -s print-ldlibs) -o build/bench_gemm_precision && build/bench_gemm_precision [seconds] */
#include "backend/backend.h"
#include "dtrain/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *model;
    int conv; /* 0: linear B,C,OC; 1: conv B,C,H(=W),OC,K,S,P */
    int B, C, H, OC, K, S, P, din;
} shape;

typedef struct {
    const dt_backend *be;
    const shape *s;
    float *in, *w, *b, *out, *dout, *din, *dw, *db, *work;
    int pass; /* 0 forward, 1 backward */
} call;

static double g_min = 0.5;

static void run(call *c) {
    const shape *s = c->s;
    if (!s->conv) {
        if (c->pass == 0) c->be->linear_forward(c->out, c->in, c->w, c->b, c->work, s->B, s->C, s->OC);
        else c->be->linear_backward(c->din, c->dw, c->db, c->dout, c->in, c->w, c->work, s->B, s->C, s->OC);
    } else if (c->pass == 0)
        c->be->conv2d_forward(c->out, c->in, c->w, c->b, c->work, s->B, s->C, s->H, s->H, s->OC, s->K, s->S, s->P);
    else
        c->be->conv2d_backward(c->din, c->dw, c->db, c->dout, c->in, c->w, c->work, s->B, s->C, s->H, s->H, s->OC, s->K,
                               s->S, s->P);
}

/* Best-of-5 seconds per call. */
static double time_call(call *c) {
    double best = 1e30;
    run(c); /* warm-up: creates the primitives */
    for (int r = 0; r < 5; r++) {
        int it = 0;
        double t0 = dt_now(), t;
        do run(c), it++;
        while ((t = dt_now() - t0) < g_min / 5);
        if (t / it < best) best = t / it;
    }
    return best;
}

static float *buf(size_t n, uint64_t key) {
    float *p = dt_alloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "bench: out of memory (%zu floats)\n", n);
        exit(1);
    }
    dt_rng_fill_uniform(p, n, -0.5f, 0.5f, 3, key);
    return p;
}

int main(int argc, char **argv) {
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : dt_blas_better_coretype();
    if (core) { /* OpenBLAS runs generic kernels on this CPU: again with the right set (read at load) */
        setenv("OPENBLAS_CORETYPE", core, 1);
        execv("/proc/self/exe", argv);
    }
    if (argc > 1) g_min = atof(argv[1]);
    dt_set_threads(1);
    static const shape shapes[] = {
        {"mlp", 0, 128, 784, 0, 128, 0, 0, 0, 0},  {"mlp", 0, 128, 128, 0, 10, 0, 0, 0, 1},
        {"cnn", 1, 128, 1, 28, 32, 3, 1, 1, 0},    {"cnn", 1, 128, 32, 14, 64, 3, 1, 1, 1},
        {"cnn", 0, 128, 3136, 0, 128, 0, 0, 0, 1}, {"gpt", 0, 768, 128, 0, 384, 0, 0, 0, 1},
        {"gpt", 0, 768, 128, 0, 128, 0, 0, 0, 1},  {"gpt", 0, 768, 128, 0, 512, 0, 0, 0, 1},
        {"gpt", 0, 768, 512, 0, 128, 0, 0, 0, 1},  {"gpt", 0, 768, 128, 0, 256, 0, 0, 0, 1},
    };
    const dt_backend *be[3] = {0};
    if (dt_backend_find("onednn", DT_F32, &be[0]) != DT_OK || dt_backend_find("onednn", DT_BF16, &be[1]) != DT_OK ||
        dt_backend_find("blas", DT_F32, &be[2]) != DT_OK) {
        fprintf(stderr, "bench: %s (this bench compares oneDNN's precisions: build with oneDNN)\n", dt_last_error());
        return 1;
    }
    printf("# gemm_precision: one thread, best of 5 x %.2f s; load average ", g_min / 5);
    FILE *la = fopen("/proc/loadavg", "r");
    char lbuf[64] = "?";
    if (la && fgets(lbuf, sizeof lbuf, la)) printf("%.*s\n", (int)strcspn(lbuf, " "), lbuf);
    else printf("?\n");
    if (la) fclose(la);
    printf("# openblas: %s kernels; bf16 times include converting the f32 inputs (the backend's reorders)\n",
           dt_blas_corename());
    printf("%-5s %-40s %-4s %12s %12s %12s %9s %9s\n", "model", "layer", "pass", "fp32 us", "bf16 us", "blas us",
           "bf16 gain", "GFLOP/s");
    char json[8192];
    int jn = snprintf(json, sizeof json, "{\"bench\": \"gemm_precision\", \"rows\": [");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        const int OH = s->conv ? (s->H + 2 * s->P - s->K) / s->S + 1 : 0;
        const size_t nin = s->conv ? (size_t)s->B * s->C * s->H * s->H : (size_t)s->B * s->C;
        const size_t nw = s->conv ? (size_t)s->OC * s->C * s->K * s->K : (size_t)s->OC * s->C;
        const size_t nout = s->conv ? (size_t)s->B * s->OC * OH * OH : (size_t)s->B * s->OC;
        const dt_kernel_table *big = dt_backend_blas_lowp(DT_BF16); /* the largest workspace: its rounded copies */
        const size_t ws = s->conv ? big->conv2d_workspace(s->B, s->C, s->H, s->H, s->OC, s->K, s->S, s->P)
                                  : dt_linear_workspace_of(big, s->B, s->C, s->OC);
        call c = {NULL,          s,
                  buf(nin, 1),   buf(nw, 2),
                  buf(s->OC, 3), buf(nout, 4),
                  buf(nout, 5),  s->din ? buf(nin, 6) : NULL,
                  buf(nw, 7),    buf(s->OC, 8),
                  buf(ws, 9),    0};
        const double mac = s->conv ? (double)s->B * s->OC * OH * OH * s->C * s->K * s->K : (double)s->B * s->C * s->OC;
        char layer[64];
        if (s->conv) snprintf(layer, sizeof layer, "conv %d->%d %dx%d k%d B=%d", s->C, s->OC, s->H, s->H, s->K, s->B);
        else snprintf(layer, sizeof layer, "linear %d->%d N=%d", s->C, s->OC, s->B);
        for (int pass = 0; pass < 2; pass++) {
            double t[3];
            c.pass = pass;
            for (int k = 0; k < 3; k++) c.be = be[k], t[k] = time_call(&c);
            const double flops = 2 * mac * (pass == 0 ? 1 : s->din ? 2 : 1);
            printf("%-5s %-40s %-4s %12.1f %12.1f %12.1f %8.2fx %9.1f\n", s->model, layer, pass ? "bwd" : "fwd",
                   t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, t[0] / t[1], flops / t[0] / 1e9);
            if (jn < (int)sizeof json - 200)
                jn += snprintf(json + jn, sizeof json - (size_t)jn,
                               "%s{\"model\": \"%s\", \"layer\": \"%s\", \"pass\": \"%s\", \"fp32_us\": %.1f, "
                               "\"bf16_us\": %.1f, \"blas_us\": %.1f}",
                               i || pass ? ", " : "", s->model, layer, pass ? "bwd" : "fwd", t[0] * 1e6, t[1] * 1e6,
                               t[2] * 1e6);
        }
        dt_free(c.in), dt_free(c.w), dt_free(c.b), dt_free(c.out), dt_free(c.dout), dt_free(c.din), dt_free(c.dw),
            dt_free(c.db), dt_free(c.work);
    }
    char impls[1536];
    dt_onednn_impls(impls, sizeof impls);
    printf("# onednn chose: %s\n%s], \"onednn_impls\": \"%s\"}\n", impls, json, impls);
    return 0;
}
