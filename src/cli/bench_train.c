/* dtrain bench train: single-worker training throughput (samples/s, achieved GFLOP/s) of the
 * reference models at the reference batch sizes, next to OpenBLAS sgemm's single-core rate,
 * as a table and one JSON line. Data is synthetic (fixed random batches in memory), so the
 * figure is the compute path alone: forward, loss, backward, optimizer step. */
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name, *spec;
    int batch;
    double min_s;
} bench_case;

/* sgemm GFLOP/s on square n x n matrices (best of a few runs). */
static double sgemm_gflops(int n, double min_s) {
    float *a = dt_alloc((size_t)n * n * 4), *b = dt_alloc((size_t)n * n * 4), *c = dt_alloc((size_t)n * n * 4);
    if (!a || !b || !c) return 0;
    dt_rng_fill_uniform(a, (size_t)n * n, -1, 1, 1, 1);
    dt_rng_fill_uniform(b, (size_t)n * n, -1, 1, 1, 2);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    int iters = 0;
    double t0 = dt_now(), t;
    do {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        iters++;
    } while ((t = dt_now() - t0) < min_s);
    dt_free(a), dt_free(b), dt_free(c);
    return 2.0 * n * n * (double)n * iters / t / 1e9;
}

/* Trains `spec` on synthetic data (1x28x28 images and labels, or random token ids and next
 * tokens for a GPT) for at least min_s seconds; returns samples/s and GFLOP/s. */
static dt_status bench_model(const bench_case *bc, double *sps, double *gflops) {
    dt_model *m = NULL;
    dt_optim *o = NULL;
    DT_TRY(dt_model_build(&m, bc->spec, 1, 28, 28));
    dt_model_init(m, 1);
    const bool tokens = dt_model_in_dtype(m) == DT_I32;
    dt_optim_config oc = dt_optim_defaults(tokens ? DT_OPTIM_ADAMW : DT_OPTIM_ADAM);
    dt_status s = dt_optim_create(&o, &oc, dt_model_num_params(m));
    enum { NB = 8 };
    const int B = bc->batch, V = dt_model_classes(m), in = dt_model_in_size(m), ny = dt_model_input_values(m, 1);
    void *x = dt_alloc((size_t)NB * B * in * DT_FEED_VALUE_BYTES);
    int32_t *y = dt_alloc((size_t)NB * B * ny * sizeof(int32_t));
    if (s == DT_OK && (!x || !y)) s = dt_error(DT_ENOMEM, "bench: out of memory");
    if (s == DT_OK) {
        if (tokens)
            for (size_t i = 0; i < (size_t)NB * B * in; i++) ((int32_t *)x)[i] = (int32_t)(dt_rng_u64(7, 1, i) % (uint64_t)V);
        else
            dt_rng_fill_uniform(x, (size_t)NB * B * in, 0, 1, 7, 1);
        for (size_t i = 0; i < (size_t)NB * B * ny; i++) y[i] = (int32_t)(dt_rng_u64(7, 2, i) % (uint64_t)V);
    }
    /* 3 untimed warm-up steps, then whole groups of 8 steps until min_s has passed */
    int64_t steps = 0;
    double t0 = 0, t = 0;
    for (int64_t i = 0; s == DT_OK; i++) {
        if (i == 3) t0 = dt_now();
        dt_feed f = {.x = (const char *)x + (size_t)(i % NB) * B * in * DT_FEED_VALUE_BYTES, .y = y + (size_t)(i % NB) * B * ny, .n = B};
        float loss;
        if ((s = dt_model_run(m, &f, true, (uint64_t)i, &loss)) != DT_OK) break;
        dt_model_zero_grad(m);
        if ((s = dt_model_backward_loss(m, 1.0f, NULL, NULL)) != DT_OK) break;
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 1e-3f);
        if (i >= 3 && (i - 3) % 8 == 7 && (t = dt_now() - t0) >= bc->min_s) {
            steps = i - 2;
            break;
        }
    }
    if (s == DT_OK) {
        *sps = (double)steps * B / t;
        *gflops = dt_model_train_flops(m, B) * (double)steps / t / 1e9;
    }
    dt_free(x), dt_free(y);
    dt_optim_free(o);
    dt_model_free(m);
    return s;
}

static const char USAGE[] =
    "Usage: dtrain bench train [--seconds S] [--threads N]\n\n"
    "Single-worker training throughput of the reference models on synthetic data: MLP at batch 32\n"
    "and 128, CNN at batch 128 (Adam, 28x28 inputs), GPT L4 H4 C128 T64 at batch 12 (AdamW, random\n"
    "bytes; tokens/s = samples/s x 64); plus OpenBLAS sgemm GFLOP/s for scale.";

int dt_bench_train(int argc, char **argv) {
    float seconds = 3;
    int threads = 1, only_batch = 0;
    const char *only_model = NULL;
    const dt_flag flags[] = {
        {"seconds", DT_FLAG_FLOAT, &seconds, "S", "time per case"},
        {"threads", DT_FLAG_INT, &threads, "N", "BLAS threads"},
        {"model", DT_FLAG_STR, &only_model, "NAME", "run only the cases of this model (mlp, cnn or gpt)"},
        {"batch", DT_FLAG_INT, &only_batch, "N", "run only the cases with this batch"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, 4, USAGE, NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    dt_set_threads(threads);
    const bench_case cases[] = {
        {"mlp", "mlp", 32, seconds},
        {"mlp", "mlp", 128, seconds},
        {"cnn", "cnn", 128, seconds},
        {"gpt", "gpt:L=4,H=4,C=128,T=64", 12, seconds},
    };
    double sg = sgemm_gflops(1024, seconds < 1 ? seconds : 1);
    printf("# dtrain bench train: %d thread%s, synthetic data\n", threads, threads > 1 ? "s" : "");
    dt_bench_print_machine();
    printf("# sgemm 1024^3: %.1f GFLOP/s\n", sg);
    printf("%-6s %6s %14s %12s %10s %10s\n", "model", "batch", "samples/s", "tokens/s", "GFLOP/s", "of sgemm");
    char json[1024];
    int jn = snprintf(json, sizeof json, "{\"bench\": \"train\", \"threads\": %d, \"sgemm_gflops\": %.2f, \"cases\": [",
                      threads, sg);
    int done = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if ((only_model && strcmp(only_model, cases[i].name)) || (only_batch && only_batch != cases[i].batch)) continue;
        double sps, gf;
        dt_status s = bench_model(&cases[i], &sps, &gf);
        if (s != DT_OK) return dt_cli_fail(NULL, "bench %s: %s", cases[i].name, dt_last_error());
        const int T = dt_model_spec_is_gpt(cases[i].spec) ? 64 : 1;
        printf("%-6s %6d %14.0f %12.0f %10.1f %9.0f%%\n", cases[i].name, cases[i].batch, sps, sps * T, gf, 100 * gf / sg);
        fflush(stdout);
        jn += snprintf(json + jn, sizeof json - (size_t)jn,
                       "%s{\"model\": \"%s\", \"batch\": %d, \"samples_per_s\": %.1f, \"tokens_per_s\": %.1f, "
                       "\"gflops\": %.2f}", done++ ? ", " : "", cases[i].name, cases[i].batch, sps, sps * T, gf);
    }
    if (!done) return dt_cli_usage("models: mlp (batch 32, 128), cnn (batch 128), gpt (batch 12)", "no benchmark case matches");
    printf("%s]}\n", json);
    return 0;
}
