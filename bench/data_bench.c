/* Data-layer benchmark: Fashion-MNIST load time, dt_dataset_batch assembly rate and loader
 * throughput (batches/s) at batch 32 and 128, with and without prefetch. Prints a table and one
 * JSON line. Build and run (after `make lib`):
 *   cc -O2 -march=native -Iinclude bench/data_bench.c build/libdtrain.a -lz -lopenblas -lm -pthread -o build/data_bench
 *   build/data_bench [DATA]        (DATA defaults to fashion-mnist) */
#include "dtrain/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double loader_rate(const dt_dataset *ds, int batch, int prefetch, double *wait_s, double *checksum) {
    dt_loader_config cfg = {.batch = batch, .shuffle = true, .seed = 1, .world = 1, .prefetch = prefetch};
    dt_loader *l;
    if (dt_loader_create(&l, ds, &cfg) != DT_OK) {
        fprintf(stderr, "data_bench: %s\n", dt_last_error());
        exit(1);
    }
    size_t nb = 0;
    double t0 = dt_now();
    for (uint64_t e = 0; e < 3; e++) {
        dt_loader_start_epoch(l, e, 0);
        dt_batch b;
        while (dt_loader_next(l, &b) == DT_OK) {
            *checksum += b.x[b.n - 1] + (double)b.y[0]; /* touch the batch */
            nb++;
        }
    }
    double dt = dt_now() - t0;
    *wait_s = dt_loader_wait_seconds(l);
    dt_loader_destroy(l);
    return (double)nb / dt;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "fashion-mnist";
    dt_dataset *tr = NULL, *te = NULL;
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        dt_dataset_destroy(tr);
        dt_dataset_destroy(te);
        double t0 = dt_now();
        if (dt_dataset_open(&tr, &te, path) != DT_OK) {
            fprintf(stderr, "data_bench: %s\n", dt_last_error());
            return 1;
        }
        double t = dt_now() - t0;
        best = t < best ? t : best;
    }
    int C, H, W;
    dt_dataset_shape(tr, &C, &H, &W);
    size_t D = (size_t)C * H * W, n = dt_dataset_len(tr);
    printf("data set %s: %zu train + %zu test samples of (%d,%d,%d); open (gunzip + parse) best of 3: %.3f s\n", path,
           n, te ? dt_dataset_len(te) : 0, C, H, W, best);

    /* raw assembly rate of dt_dataset_batch over a shuffled order */
    uint32_t *order = malloc(n * sizeof *order);
    dt_sampler_order(order, n, 1, 0, true);
    float *x = malloc(128 * D * sizeof(float));
    int32_t y[128];
    double asm_rate[2], asm_cpu_us[2], ld[2][2], waits[2][2], sum = 0;
    int bs[2] = {32, 128};
    for (int k = 0; k < 2; k++) {
        size_t nb = n / (size_t)bs[k], reps = 0;
        double t0 = dt_now(), c0 = thread_cpu();
        while (dt_now() - t0 < 0.5)
            for (size_t b = 0; b < nb; b++, reps++)
                dt_dataset_batch(tr, order + b * (size_t)bs[k], bs[k], x, y), sum += x[0];
        asm_rate[k] = (double)reps / (dt_now() - t0);
        asm_cpu_us[k] = 1e6 * (thread_cpu() - c0) /
                        (double)reps; /* per batch, this thread's CPU: steadier under load */
        for (int p = 0; p < 2; p++) ld[k][p] = loader_rate(tr, bs[k], p ? 3 : 0, &waits[k][p], &sum);
    }
    printf("\n%-6s %16s %14s %18s %18s %12s\n", "batch", "assemble b/s", "CPU us/batch", "loader b/s (sync)",
           "loader b/s (pf 3)", "samples/s");
    for (int k = 0; k < 2; k++)
        printf("%-6d %16.0f %14.2f %18.0f %18.0f %12.0f\n", bs[k], asm_rate[k], asm_cpu_us[k], ld[k][0], ld[k][1],
               ld[k][1] * bs[k]);
    printf("{\"bench\":\"data\",\"data\":\"%s\",\"open_s\":%.4f,\"assemble_bps_32\":%.0f,\"assemble_bps_128\":%.0f,"
           "\"assemble_cpu_us_32\":%.2f,\"assemble_cpu_us_128\":%.2f,"
           "\"loader_bps_32\":%.0f,\"loader_bps_128\":%.0f,\"loader_sync_bps_32\":%.0f,\"loader_sync_bps_128\":%.0f,"
           "\"checksum\":%.1f}\n",
           path, best, asm_rate[0], asm_rate[1], asm_cpu_us[0], asm_cpu_us[1], ld[0][1], ld[1][1], ld[0][0], ld[1][0],
           sum);
    free(order);
    free(x);
    dt_dataset_destroy(tr);
    dt_dataset_destroy(te);
    return 0;
}
