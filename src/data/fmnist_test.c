/* Cross-module test: the data layer on the real Fashion-MNIST (Debian's dataset-fashion-mnist): shapes, labels, known
 * pixel sums and statistics, and one shuffled epoch through the prefetching loader; a cold (decoding) open of the
 * shared cache, a warm (mapping) one and a private one give identical batches. Skips (exit 77) when the data set is not
 * installed. The cache lives in a mkdtemp directory. */
#include "core/test.h"
#include "dtrain/data.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("skip: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
        return 77;
    }
    unsetenv("DTRAIN_DATASETS");
    char cache[] = "/tmp/dtrain-fmnist-cache-XXXXXX";
    if (!mkdtemp(cache)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("DTRAIN_DATA_CACHE", cache, 1);
    dt_dataset *tr = NULL, *te = NULL;
    double t0 = dt_now();
    CHECK_OK(dt_dataset_open(&tr, &te, "fashion-mnist"));
    double load_s = dt_now() - t0;
    if (!tr || !te) return dt_test_summary("fmnist_test");
    int C, H, W;
    dt_dataset_shape(tr, &C, &H, &W);
    CHECK(dt_dataset_len(tr) == 60000 && dt_dataset_len(te) == 10000 && C == 1 && H == 28 && W == 28);
    dt_dataset_shape(te, &C, &H, &W);
    CHECK(C == 1 && H == 28 && W == 28);
    CHECK(dt_dataset_classes(tr) == 10 && dt_dataset_classes(te) == 10 && dt_dataset_dtype(tr) == DT_U8);

    /* labels: 6000 per class in train, 1000 in test; the first of each set is 9 (ankle boot) */
    int32_t *y = malloc(60000 * sizeof *y);
    uint32_t *idx = malloc(60000 * sizeof *idx);
    for (uint32_t i = 0; i < 60000; i++) idx[i] = i;
    int per[10] = {0}, bad = 0;
    CHECK_OK(dt_dataset_batch(tr, idx, 60000, NULL, y));
    for (int i = 0; i < 60000; i++) {
        if (y[i] < 0 || y[i] > 9) bad++;
        else per[y[i]]++;
    }
    CHECK(bad == 0 && y[0] == 9 && y[59999] == 5);
    for (int k = 0; k < 10; k++) CHECK_MSG(per[k] == 6000, "class %d has %d samples", k, per[k]);
    CHECK_OK(dt_dataset_batch(te, idx, 10000, NULL, y));
    CHECK(y[0] == 9 && y[9999] == 5);

    /* pixel sums of the first and last train image (computed independently with Python gzip) */
    float x[784];
    uint32_t first = 0, last = 59999;
    double s = 0;
    CHECK_OK(dt_dataset_batch(tr, &first, 1, x, NULL));
    for (int j = 0; j < 784; j++) s += x[j] * 255.0;
    CHECK_MSG(fabs(s - 76247) < 0.01, "first image pixel sum %f", s);
    s = 0;
    CHECK_OK(dt_dataset_batch(tr, &last, 1, x, NULL));
    for (int j = 0; j < 784; j++) s += x[j] * 255.0;
    CHECK_MSG(fabs(s - 16684) < 0.01, "last image pixel sum %f", s);
    double mean, std;
    dt_dataset_stats(tr, &mean, &std);
    CHECK_MSG(fabs(mean - 3431114169.0 / 47040000 / 255) < 1e-9 && fabs(std - 0.3530) < 5e-4, "mean %f std %f", mean,
              std);

    /* one shuffled epoch at batch 128 through the prefetching loader covers every sample once */
    dt_loader_config cfg = {.batch = 128, .shuffle = true, .seed = 1, .world = 1, .prefetch = 3};
    dt_loader *l;
    CHECK_OK(dt_loader_create(&l, tr, &cfg));
    CHECK(dt_loader_batches(l) == 469);
    CHECK_OK(dt_loader_start_epoch(l, 0, 0));
    dt_batch b;
    size_t seen = 0, nb = 0;
    double pix = 0;
    t0 = dt_now();
    while (dt_loader_next(l, &b) == DT_OK) {
        seen += (size_t)b.n;
        nb++;
        for (int i = 0; i < b.n * 784; i++) pix += b.x[i];
    }
    double epoch_s = dt_now() - t0;
    CHECK(seen == 60000 && nb == 469);
    CHECK_MSG(fabs(pix * 255 - 3431114169.0) < 1e3, "epoch pixel sum %f", pix * 255);
    printf("fashion-mnist: load %.3f s, mean %.4f std %.4f, one epoch at batch 128: %.3f s (wait %.3f s)\n", load_s,
           mean, std, epoch_s, dt_loader_wait_seconds(l));
    dt_loader_destroy(l);

    /* warm (mapped from the cache built above) and private opens hold the same data */
    CHECK(strncmp(dt_dataset_cache_file(tr), cache, strlen(cache)) == 0 &&
          strncmp(dt_dataset_cache_file(te), cache, strlen(cache)) == 0);
    dt_dataset *w[2] = {NULL, NULL}, *p[2] = {NULL, NULL};
    t0 = dt_now();
    CHECK_OK(dt_dataset_open(&w[0], &w[1], "fashion-mnist"));
    double warm_s = dt_now() - t0;
    setenv("DTRAIN_DATA_CACHE", "0", 1);
    t0 = dt_now();
    CHECK_OK(dt_dataset_open(&p[0], &p[1], "fashion-mnist"));
    double private_s = dt_now() - t0;
    if (w[0] && w[1] && p[0] && p[1]) {
        CHECK(!strcmp(dt_dataset_cache_file(w[0]), dt_dataset_cache_file(tr)) &&
              !strcmp(dt_dataset_cache_file(p[0]), ""));
        float *xa = malloc(1000 * 784 * sizeof *xa), *xb = malloc(1000 * 784 * sizeof *xb),
              *xc = malloc(1000 * 784 * sizeof *xc);
        int32_t ya[1000], yb[1000], yc[1000];
        size_t differ = 0;
        for (int k = 0; k < 2; k++) {
            const dt_dataset *cold = k ? te : tr;
            for (size_t s0 = 0; s0 < dt_dataset_len(cold); s0 += 1000) {
                CHECK_OK(dt_dataset_batch(cold, idx + s0, 1000, xa, ya));
                CHECK_OK(dt_dataset_batch(w[k], idx + s0, 1000, xb, yb));
                CHECK_OK(dt_dataset_batch(p[k], idx + s0, 1000, xc, yc));
                differ += memcmp(xa, xb, 1000 * 784 * sizeof *xa) != 0 ||
                          memcmp(xa, xc, 1000 * 784 * sizeof *xa) != 0 || memcmp(ya, yb, sizeof ya) != 0 ||
                          memcmp(ya, yc, sizeof ya) != 0;
            }
        }
        CHECK_MSG(differ == 0, "%zu chunks of 1000 samples differ between cold, warm and private opens", differ);
        free(xa), free(xb), free(xc);
    }
    printf("fashion-mnist open: cold cache %.3f s, warm cache %.3f s, private %.3f s\n", load_s, warm_s, private_s);
    for (int k = 0; k < 2; k++) dt_dataset_destroy(w[k]), dt_dataset_destroy(p[k]);
    free(y);
    free(idx);
    dt_dataset_destroy(tr);
    dt_dataset_destroy(te);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache);
    return dt_test_summary("fmnist_test");
}
