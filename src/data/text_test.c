/* Tests for text data sets and their sampling: window inputs and targets are exactly the file's
 * bytes, the train/validation split at the end of the file, every target byte once per epoch
 * over 1, 2 and 3 ranks (uneven final batch, uneven cut), the same global order for 1 and N
 * ranks, epoch_len for text and image sets, resuming at a batch, pipes (read, not mapped), the
 * "kjv" override and missing-bible message, and every error message. The corpus is written by
 * the test into a mkdtemp directory, removed at the end. */
#include "core/test.h"
#include "dtrain/data.h"
#include "data/data_internal.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { L = 1000, T = 7 }; /* 10%: 900 train bytes (128 windows), 100 validation bytes (14) */

static char g_dir[256], g_file[300];
static uint8_t g_bytes[L];

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static const char *spec_of(const char *path) {
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "text:%s", path);
    return buf[k];
}

static const char *tmp_path(const char *name) {
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* Checks that the windows of ds are bytes[base + i*T ...] of `bytes`, inputs and targets. */
static void check_windows(const dt_dataset *ds, const uint8_t *bytes, size_t base, size_t n) {
    CHECK(dt_dataset_len(ds) == n);
    uint32_t *idx = malloc(n * sizeof *idx);
    int32_t *tok = malloc(n * T * sizeof *tok), *tgt = malloc(n * T * sizeof *tgt);
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)(n - 1 - i); /* any order */
    CHECK_OK(dt_dataset_batch_tokens(ds, idx, (int)n, tok, tgt));
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        for (int t = 0; t < T; t++) {
            size_t s = base + (size_t)idx[i] * T + (size_t)t;
            bad += tok[i * T + (size_t)t] != bytes[s] || tgt[i * T + (size_t)t] != bytes[s + 1];
        }
    CHECK_MSG(bad == 0, "%d token/target values differ from the file", bad);
    CHECK_OK(dt_dataset_batch_tokens(ds, idx, 3, NULL, tgt)); /* either output may be skipped */
    CHECK_OK(dt_dataset_batch_tokens(ds, idx, 3, tok, NULL));
    free(idx), free(tok), free(tgt);
}

static void test_open(void) {
    dt_dataset *tr, *va;
    CHECK_OK(dt_dataset_open_text(&tr, &va, spec_of(g_file), T, 0.1));
    if (!tr || !va) return;
    int C, H, W;
    dt_dataset_shape(tr, &C, &H, &W);
    CHECK(C == 1 && H == 1 && W == T);
    CHECK(dt_dataset_classes(tr) == 256 && dt_dataset_classes(va) == 256);
    CHECK(dt_dataset_dtype(tr) == DT_U8 && dt_dataset_is_text(tr) && dt_dataset_is_text(va));
    CHECK(dt_dataset_window(tr) == T && dt_dataset_window(va) == T);
    CHECK(!strcmp(dt_dataset_source(tr), g_file) && !strcmp(dt_dataset_cache_file(tr), ""));
    /* 900 train bytes: (900-1)/7 = 128 windows; the last target is byte 896 < 900 (no crossing) */
    check_windows(tr, g_bytes, 0, 128);
    check_windows(va, g_bytes, 900, 14);
    /* the wrong batch call names the right one */
    uint32_t i0 = 0;
    float x[T];
    int32_t y[T];
    CHECK(dt_dataset_batch(tr, &i0, 1, x, y) == DT_EINVAL && strstr(dt_last_error(), "dt_dataset_batch_tokens"));
    uint32_t past = 128;
    CHECK(dt_dataset_batch_tokens(tr, &past, 1, y, y) == DT_EINVAL && strstr(dt_last_error(), "128 windows"));
    /* normalisation is the identity; classes may rise, and fall only to the largest byte + 1 */
    double m = -1, sd = -1;
    dt_dataset_stats(tr, &m, &sd);
    CHECK(m == 0 && sd == 1);
    CHECK(dt_dataset_set_normalize(tr, 0.5f, 0.2f) == DT_EINVAL && strstr(dt_last_error(), "`normalize`"));
    CHECK_OK(dt_dataset_set_normalize(tr, 0, 1));
    CHECK_OK(dt_dataset_set_classes(tr, 300));
    CHECK(dt_dataset_classes(tr) == 300);
    CHECK(dt_dataset_set_classes(tr, 100) == DT_EFORMAT && strstr(dt_last_error(), "vocabulary of 100"));
    dt_dataset_destroy(va); /* either order */
    dt_dataset_destroy(tr);

    /* val NULL: the same train set; val_fraction 0: all bytes train, *val = NULL */
    CHECK_OK(dt_dataset_open_text(&tr, NULL, spec_of(g_file), T, 0.1));
    if (tr) check_windows(tr, g_bytes, 0, 128);
    dt_dataset_destroy(tr);
    va = (dt_dataset *)&i0;
    CHECK_OK(dt_dataset_open_text(&tr, &va, spec_of(g_file), T, 0));
    CHECK(va == NULL);
    if (tr) check_windows(tr, g_bytes, 0, (L - 1) / T);
    dt_dataset_destroy(tr);
    /* T = 1: every byte but the first is a target */
    CHECK_OK(dt_dataset_open_text(&tr, NULL, spec_of(g_file), 1, 0.5));
    if (tr) CHECK(dt_dataset_len(tr) == 499);
    dt_dataset_destroy(tr);

    /* an ASCII file fits 128 classes */
    char ascii[64];
    for (int i = 0; i < 64; i++) ascii[i] = (char)('a' + i % 26);
    write_file(tmp_path("ascii.txt"), ascii, sizeof ascii);
    CHECK_OK(dt_dataset_open_text(&tr, NULL, spec_of(tmp_path("ascii.txt")), 4, 0));
    if (tr) CHECK_OK(dt_dataset_set_classes(tr, 128));
    dt_dataset_destroy(tr);

    /* a feature data set refuses the token call */
    float fx[4] = {0, 1, 2, 3};
    int32_t fy[4] = {0, 1, 0, 1};
    dt_dataset *img;
    CHECK_OK(dt_dataset_create(&img, DT_F32, fx, fy, 4, 1, 1, 1, 2));
    CHECK(!dt_dataset_is_text(img) && dt_dataset_window(img) == 0);
    CHECK(dt_dataset_batch_tokens(img, &i0, 1, y, y) == DT_EINVAL && strstr(dt_last_error(), "use dt_dataset_batch"));
    dt_dataset_destroy(img);

    CHECK(dt_data_is_text("kjv") && dt_data_is_text("text:a.txt") && dt_data_is_text("text:"));
    CHECK(dt_dataset_open(&tr, NULL, "kjv") == DT_EINVAL && tr == NULL &&
          strstr(dt_last_error(), "dt_dataset_open_text"));
    CHECK(!dt_data_is_text("fashion-mnist") && !dt_data_is_text("kjv.txt") && !dt_data_is_text("a.csv") &&
          !dt_data_is_text(NULL));
}

/* A pipe is read once into memory (not mapped): the same windows. */
static void test_pipe(void) {
    int p[2];
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], g_bytes, L) == L);
    close(p[1]);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", p[0]);
    dt_dataset *tr, *va;
    CHECK_OK(dt_dataset_open_text(&tr, &va, spec_of(path), T, 0.1));
    close(p[0]);
    if (!tr || !va) return;
    check_windows(tr, g_bytes, 0, 128);
    check_windows(va, g_bytes, 900, 14);
    dt_dataset_destroy(tr);
    dt_dataset_destroy(va);
}

/* Collects every batch of one epoch over W ranks (prefetch differs per rank) into seq, as window
 * indices identified by content, in global order (batch b: rank 0's rows, rank 1's, ...).
 * Returns the number of rows; checks each batch's layout. */
static size_t epoch_rows(const dt_dataset *ds, const uint8_t *bytes, size_t nwin, int W, int B, size_t epoch_len,
                         uint64_t epoch, size_t skip, const int *cut, uint32_t *seq) {
    dt_loader *l[3] = {0};
    for (int r = 0; r < W; r++) {
        dt_loader_config lc = {.batch = B,
                               .shuffle = true,
                               .seed = 5,
                               .rank = r,
                               .world = W,
                               .prefetch = r % 2 ? 3 : 0,
                               .max_batch = cut ? B * W : 0,
                               .epoch_len = epoch_len};
        CHECK_OK(dt_loader_create(&l[r], ds, &lc));
        if (!l[r]) return 0;
        if (cut) CHECK_OK(dt_loader_set_cut(l[r], cut));
        CHECK_OK(dt_loader_start_epoch(l[r], epoch, skip));
    }
    size_t k = 0, nb = dt_loader_batches(l[0]);
    for (size_t b = skip; b < nb; b++)
        for (int r = 0; r < W; r++) {
            dt_batch bt;
            CHECK_OK(dt_loader_next(l[r], &bt));
            CHECK(bt.x == NULL && bt.tok != NULL && bt.y != NULL && bt.T == T && bt.index == b && bt.epoch == epoch);
            for (int i = 0; i < bt.n; i++) {
                uint32_t found = UINT32_MAX;
                for (size_t w = 0; w < nwin && found == UINT32_MAX; w++) {
                    const uint8_t *s = bytes + w * T;
                    bool eq = true;
                    for (int t = 0; t < T && eq; t++) eq = bt.tok[i * T + t] == s[t] && bt.y[i * T + t] == s[t + 1];
                    if (eq) found = (uint32_t)w;
                }
                CHECK_MSG(found != UINT32_MAX, "rank %d batch %zu row %d is no window of the file", r, b, i);
                seq[k++] = found;
            }
        }
    for (int r = 0; r < W; r++) {
        dt_batch bt;
        CHECK(dt_loader_next(l[r], &bt) == DT_ENOENT);
        dt_loader_destroy(l[r]);
    }
    return k;
}

static void test_epochs(void) {
    dt_dataset *tr;
    CHECK_OK(dt_dataset_open_text(&tr, NULL, spec_of(g_file), T, 0.1));
    if (!tr) return;
    enum { N = 128, B = 5 };
    static uint32_t one[N], got[N], e1[N];
    /* 1 rank: 26 batches, the last of 3 */
    CHECK(epoch_rows(tr, g_bytes, N, 1, B, 0, 0, 0, NULL, one) == N);
    int cover[L] = {0}; /* every target byte of the train part (1..N*T) exactly once */
    for (int i = 0; i < N; i++)
        for (int t = 1; t <= T; t++) cover[one[i] * T + (unsigned)t]++;
    int badc = 0;
    for (int s = 0; s < L; s++) badc += cover[s] != (s >= 1 && s <= N * T);
    CHECK_MSG(badc == 0, "%d train bytes are not a target exactly once", badc);
    uint32_t ref[N];
    dt_sampler_order(ref, N, 5, 0, true);
    CHECK(memcmp(one, ref, sizeof one) == 0);
    /* 2 and 3 ranks (uneven final global batches of 8 = 4+4 and 8 = 3+3+2): the same sequence */
    for (int W = 2; W <= 3; W++) {
        CHECK_MSG(epoch_rows(tr, g_bytes, N, W, B, 0, 0, 0, NULL, got) == N && memcmp(got, one, sizeof one) == 0,
                  "%d ranks: another global order than 1 rank", W);
    }
    /* an uneven cut keeps the order and covers every window once */
    const int cut[3] = {7, 2, 6};
    CHECK(epoch_rows(tr, g_bytes, N, 3, B, 0, 0, 0, cut, got) == N && memcmp(got, one, sizeof one) == 0);
    /* another epoch, another order */
    CHECK(epoch_rows(tr, g_bytes, N, 2, B, 0, 1, 0, NULL, e1) == N && memcmp(e1, one, sizeof one) != 0);
    /* resume at batch 4 of 13 (2 ranks x 5): the rest of the epoch, the same windows */
    size_t k = epoch_rows(tr, g_bytes, N, 2, B, 0, 1, 4, NULL, got);
    CHECK(k == N - 40 && memcmp(got, e1 + 40, k * sizeof *got) == 0);

    /* epoch_len 40: the first 40 of the epoch's order of all 128, different ones each epoch */
    for (uint64_t ep = 0; ep < 2; ep++) {
        dt_sampler_order(ref, N, 5, ep, true);
        for (int W = 1; W <= 3; W++) {
            k = epoch_rows(tr, g_bytes, N, W, 4, 40, ep, 0, NULL, got);
            CHECK_MSG(k == 40 && memcmp(got, ref, 40 * sizeof *got) == 0, "epoch_len 40, %d ranks, epoch %llu", W,
                      (unsigned long long)ep);
        }
        memcpy(ep ? e1 : one, ref, 40 * sizeof *ref);
    }
    CHECK(memcmp(one, e1, 40 * sizeof *one) != 0);
    k = epoch_rows(tr, g_bytes, N, 3, 4, 40, 0, 2, NULL, got); /* resume inside a short epoch */
    CHECK(k == 40 - 24 && memcmp(got, one + 24, k * sizeof *got) == 0);
    dt_loader *l;
    dt_loader_config lc = {.batch = 4, .shuffle = true, .seed = 5, .world = 3, .epoch_len = 40};
    CHECK_OK(dt_loader_create(&l, tr, &lc));
    if (l) {
        CHECK(dt_loader_batches(l) == 4); /* 40 / 12, rounded up */
        dt_batch bt;
        CHECK_OK(dt_loader_take(l, 0, 9, &bt)); /* units of 4 over the 40 */
        CHECK(bt.n == 4 && bt.T == T && bt.tok && !bt.x);
        CHECK(dt_loader_take(l, 0, 10, &bt) == DT_EINVAL);
        dt_loader_destroy(l);
    }
    lc.epoch_len = N + 1;
    CHECK(dt_loader_create(&l, tr, &lc) == DT_EINVAL && strstr(dt_last_error(), "`epoch_windows` 129") &&
          strstr(dt_last_error(), "128 windows"));
    lc = (dt_loader_config){.batch = 20, .world = 3, .drop_last = true, .epoch_len = 40};
    CHECK(dt_loader_create(&l, tr, &lc) == DT_EINVAL && strstr(dt_last_error(), "`epoch_windows`"));
    dt_dataset_destroy(tr);
}

/* epoch_len on an image data set: labels name the samples. */
static void test_epoch_len_images(void) {
    enum { N = 50, E = 23 };
    float x[N];
    int32_t y[N];
    for (int i = 0; i < N; i++) x[i] = (float)i, y[i] = i;
    dt_dataset *ds;
    CHECK_OK(dt_dataset_create(&ds, DT_F32, x, y, N, 1, 1, 1, N));
    if (!ds) return;
    uint32_t ref[N];
    for (uint64_t ep = 0; ep < 2; ep++) {
        dt_sampler_order(ref, N, 3, ep, true);
        for (int W = 1; W <= 3; W++) {
            dt_loader *l[3];
            for (int r = 0; r < W; r++) {
                dt_loader_config lc = {
                    .batch = 3, .shuffle = true, .seed = 3, .rank = r, .world = W, .prefetch = r, .epoch_len = E};
                CHECK_OK(dt_loader_create(&l[r], ds, &lc));
                CHECK_OK(dt_loader_start_epoch(l[r], ep, 0));
            }
            CHECK(dt_loader_batches(l[0]) == (E + 3 * (size_t)W - 1) / (3 * (size_t)W));
            int k = 0, bad = 0;
            for (size_t b = 0; b < dt_loader_batches(l[0]); b++)
                for (int r = 0; r < W; r++) {
                    dt_batch bt;
                    CHECK_OK(dt_loader_next(l[r], &bt));
                    CHECK(bt.T == 1 && bt.tok == NULL && bt.x != NULL);
                    for (int i = 0; i < bt.n; i++, k++)
                        bad += k >= E || bt.y[i] != (int32_t)ref[k] || bt.x[i] != (float)ref[k];
                }
            CHECK_MSG(k == E && bad == 0, "images, %d ranks, epoch %llu: %d of %d samples off the order", W,
                      (unsigned long long)ep, bad, k);
            for (int r = 0; r < W; r++) dt_loader_destroy(l[r]);
        }
    }
    dt_loader *l;
    dt_loader_config lc = {.batch = 3, .epoch_len = N + 5};
    CHECK(dt_loader_create(&l, ds, &lc) == DT_EINVAL && strstr(dt_last_error(), "`epoch_windows` 55") &&
          strstr(dt_last_error(), "50 samples"));
    dt_dataset_destroy(ds);
}

/* Opens spec expecting status want and a message holding each of the (up to 3) strings. */
static void expect_error(const char *spec, int Tw, double f, dt_status want, const char *a, const char *b,
                         const char *c) {
    dt_dataset *tr = (dt_dataset *)g_dir, *va = (dt_dataset *)g_dir;
    dt_status s = dt_dataset_open_text(&tr, &va, spec, Tw, f);
    const char *m = dt_last_error();
    bool outs = want == DT_OK ? tr != NULL : tr == NULL && va == NULL;
    CHECK_MSG(s == want && outs, "%s T=%d f=%g: got %s (%s)", spec, Tw, f, dt_status_str(s), s ? m : "");
    const char *need[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (need[i]) CHECK_MSG(strstr(m, need[i]) != NULL, "%s: message lacks \"%s\": %s", spec, need[i], m);
    if (s != DT_OK) printf("error as expected: %s\n", m);
    if (s == DT_OK) dt_dataset_destroy(tr), dt_dataset_destroy(va);
}

static void test_errors(void) {
    expect_error(spec_of(tmp_path("missing.txt")), T, 0.1, DT_ENOENT, "missing.txt", "no such file", NULL);
    write_file(tmp_path("empty.txt"), "", 0);
    expect_error(spec_of(tmp_path("empty.txt")), T, 0.1, DT_EFORMAT, "empty.txt", "is empty", "2T+1 = 15 bytes");
    write_file(tmp_path("short.txt"), g_bytes, 2 * T); /* 13 targets: 1 window */
    expect_error(spec_of(tmp_path("short.txt")), T, 0, DT_EFORMAT, "short.txt", "holds 1 window", "smaller T");
    write_file(tmp_path("short2.txt"), g_bytes, 2 * T + 1); /* 2 windows: fine */
    expect_error(spec_of(tmp_path("short2.txt")), T, 0, DT_OK, NULL, NULL, NULL);
    expect_error(spec_of(g_file), T, 0.01, DT_EFORMAT, "validation part", "`val_fraction`", "`val_fraction` 0");
    expect_error(spec_of(g_file), 500, 0.1, DT_EFORMAT, "train part", "smaller T", "smaller `val_fraction`");
    expect_error(spec_of(g_file), 0, 0.1, DT_EINVAL, "T = 0", "context length", NULL);
    expect_error(spec_of(g_file), T, 0.6, DT_EINVAL, "`val_fraction` 0.6", "[0, 0.5]", NULL);
    expect_error(spec_of(g_file), T, -0.1, DT_EINVAL, "`val_fraction`", NULL, NULL);
    expect_error(spec_of(g_file), T, NAN, DT_EINVAL, "`val_fraction`", NULL, NULL);
    expect_error("text:", T, 0.1, DT_EINVAL, "`data` text:FILE", NULL, NULL);
    expect_error(spec_of(g_dir), T, 0.1, DT_EFORMAT, "is a directory", NULL, NULL);
    /* a device would be read without end (/dev/zero: 812 MB in 5 s); a pipe is read up to a bound */
    expect_error("text:/dev/zero", T, 0.1, DT_EFORMAT, "/dev/zero is a character device, not a file", "pass a file",
                 NULL);
    int p[2];
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], g_bytes, 100) == 100);
    close(p[1]);
    uint8_t *buf = NULL;
    size_t len = 0;
    dt_status s = dt_text_read_stream(p[0], 99, &buf, &len);
    CHECK_MSG(s == DT_EFORMAT && strstr(dt_last_error(), "more than 99 bytes") && len == 100,
              "100 bytes over a bound of 99: "
              "%s, %zu read",
              dt_status_str(s), len);
    free(buf), close(p[0]);
    CHECK(pipe(p) == 0);
    CHECK(write(p[1], g_bytes, 100) == 100);
    close(p[1]);
    s = dt_text_read_stream(p[0], 100, &buf, &len);
    CHECK_MSG(s == DT_OK && len == 100 && !memcmp(buf, g_bytes, 100), "100 bytes under a bound of 100: %s",
              dt_status_str(s));
    free(buf), close(p[0]);
    expect_error("fashion-mnist", T, 0.1, DT_EINVAL, "not a text data set", "text:FILE", NULL);
    if (geteuid() != 0) { /* root reads anything */
        write_file(tmp_path("locked.txt"), g_bytes, L);
        chmod(tmp_path("locked.txt"), 0);
        expect_error(spec_of(tmp_path("locked.txt")), T, 0.1, DT_EIO, "locked.txt", "permissions", NULL);
    }
}

/* "kjv": $DTRAIN_DATASETS/kjv.txt wins; with neither it nor `bible`, the message says what to
 * install. (kjv_test checks the text that bible-kjv generates.) */
static void test_kjv_resolution(void) {
    char root[320], empty[320], old_path[4096];
    snprintf(root, sizeof root, "%s/datasets", g_dir);
    snprintf(empty, sizeof empty, "%s/nothing", g_dir);
    mkdir(root, 0700);
    mkdir(empty, 0700);
    char kjv[400];
    snprintf(kjv, sizeof kjv, "%s/kjv.txt", root);
    write_file(kjv, g_bytes, L);
    const char *p = getenv("PATH");
    snprintf(old_path, sizeof old_path, "%s", p ? p : "/usr/bin:/bin");
    setenv("DTRAIN_DATASETS", root, 1);
    dt_dataset *tr, *va;
    CHECK_OK(dt_dataset_open_text(&tr, &va, "kjv", T, 0.1));
    if (tr) {
        CHECK(!strcmp(dt_dataset_source(tr), kjv) && !strcmp(dt_dataset_cache_file(tr), ""));
        check_windows(tr, g_bytes, 0, 128);
        check_windows(va, g_bytes, 900, 14);
    }
    dt_dataset_destroy(tr);
    dt_dataset_destroy(va);
    setenv("DTRAIN_DATASETS", empty, 1);
    setenv("PATH", empty, 1);
    expect_error("kjv", T, 0.1, DT_ENOENT, "install bible-kjv (scripts/install-deps)", "nothing/kjv.txt", NULL);
    setenv("PATH", old_path, 1);
    unsetenv("DTRAIN_DATASETS");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-text-test-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    uint64_t s = 0x9e3779b97f4a7c15ull; /* bytes of all values, windows distinct */
    for (int i = 0; i < L; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        g_bytes[i] = (uint8_t)(s >> 24);
    }
    snprintf(g_file, sizeof g_file, "%s/corpus.bin", g_dir);
    write_file(g_file, g_bytes, L);
    test_open();
    test_pipe();
    test_epochs();
    test_epoch_len_images();
    test_errors();
    test_kjv_resolution();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
    return dt_test_summary("text_test");
}
