/* Tests for the data layer's IDX reader and in-memory data sets: IDX round trips (every dtype,
 * several ranks, raw and gzip'd), corrupt and mismatched files, IDX directories and aliases,
 * scaling and normalisation. Test files are written by hand (big-endian bytes) into a mkdtemp
 * directory. The CSV reader's tests are csv_test.c. */
#include "core/test.h"
#include "data/data_testlib.h"
#include "dtrain/data.h"

#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* Writes an IDX file: header for (code, ndim, dims), then count elements of esz bytes given in
 * host order, stored big-endian. Returns the size in bytes. */
static size_t write_idx(const char *path, int code, int ndim, const uint32_t *dims, const void *data, size_t esz,
                        bool gz) {
    size_t count = 1;
    for (int i = 0; i < ndim; i++) count *= dims[i];
    size_t n = 4 + 4 * (size_t)ndim + count * esz;
    unsigned char *b = malloc(n), *p = b;
    *p++ = 0, *p++ = 0, *p++ = (unsigned char)code, *p++ = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++) *p++ = dims[i] >> 24, *p++ = dims[i] >> 16, *p++ = dims[i] >> 8, *p++ = dims[i];
    const unsigned char *s = data;
    for (size_t i = 0; i < count; i++)
        for (size_t j = 0; j < esz; j++) *p++ = s[i * esz + esz - 1 - j]; /* little-endian host -> BE */
    dt_test_write_bytes(path, b, n, gz);
    free(b);
    return n;
}

static void test_idx_roundtrip(void) {
    static const struct {
        int code;
        dt_dtype t;
        size_t esz;
    } types[] = {{0x08, DT_U8, 1},  {0x09, DT_I8, 1},  {0x0B, DT_I16, 2},
                 {0x0C, DT_I32, 4}, {0x0D, DT_F32, 4}, {0x0E, DT_F64, 8}};
    static const uint32_t shapes[][5] = {{7}, {3, 5}, {4, 3, 2}, {2, 3, 2, 2}, {2, 1, 3, 1, 2}};
    static const int ranks[] = {1, 2, 3, 4, 5};
    for (size_t ti = 0; ti < 6; ti++)
        for (int si = 0; si < 5; si++)
            for (int gz = 0; gz < 2; gz++) {
                size_t count = 1;
                for (int i = 0; i < ranks[si]; i++) count *= shapes[si][i];
                unsigned char *src = malloc(count * types[ti].esz);
                for (size_t i = 0; i < count; i++) {
                    double v = (double)i * 7 - 11;
                    switch (types[ti].t) {
                    case DT_U8: src[i] = (uint8_t)(i * 37 + 200); break;
                    case DT_I8: ((int8_t *)src)[i] = (int8_t)(i * 29 - 100); break;
                    case DT_I16: ((int16_t *)src)[i] = (int16_t)(i * 1000 - 30000); break;
                    case DT_I32: ((int32_t *)src)[i] = (int32_t)(i * 123456789u); break;
                    case DT_F32: ((float *)src)[i] = (float)(v / 3); break;
                    default: ((double *)src)[i] = v / 3; break;
                    }
                }
                const char *p = dt_test_path(gz ? "rt.idx.gz" : "rt.idx");
                write_idx(p, types[ti].code, ranks[si], shapes[si], src, types[ti].esz, gz);
                dt_idx x;
                CHECK_OK(dt_idx_read(p, &x));
                CHECK_MSG(x.dtype == types[ti].t && x.ndim == ranks[si] && x.count == count, "type %d rank %d",
                          types[ti].code, ranks[si]);
                for (int i = 0; i < ranks[si] && i < x.ndim; i++) CHECK(x.dims[i] == shapes[si][i]);
                CHECK_MSG(x.data && memcmp(x.data, src, count * types[ti].esz) == 0,
                          "data of type 0x%02x rank %d gz %d", types[ti].code, ranks[si], gz);
                dt_idx_free(&x);
                CHECK(x.data == NULL);
                free(src);
            }
    dt_idx_free(NULL);
    /* a gzip'd file without a .gz name and a raw one with it: detection is by magic */
    uint8_t v[3] = {1, 2, 3};
    uint32_t d = 3;
    write_idx(dt_test_path("named.gz"), 0x08, 1, &d, v, 1, false);
    write_idx(dt_test_path("plain"), 0x08, 1, &d, v, 1, true);
    dt_idx a, b;
    CHECK_OK(dt_idx_read(dt_test_path("named.gz"), &a));
    CHECK_OK(dt_idx_read(dt_test_path("plain"), &b));
    CHECK(a.count == 3 && b.count == 3 && !memcmp(a.data, v, 3) && !memcmp(b.data, v, 3));
    dt_idx_free(&a);
    dt_idx_free(&b);
}

/* Expects dt_idx_read(path) to fail with st and a message containing the path and each needle. */
static void expect_idx_error(const char *path, dt_status st, const char *n1, const char *n2) {
    dt_idx x;
    dt_status got = dt_idx_read(path, &x);
    const char *m = dt_last_error();
    CHECK_MSG(got == st, "%s: got %s (%s)", path, dt_status_str(got), m);
    CHECK_MSG(strstr(m, path) != NULL, "message does not name the file: %s", m);
    CHECK_MSG(!n1 || strstr(m, n1), "message lacks '%s': %s", n1, m);
    CHECK_MSG(!n2 || strstr(m, n2), "message lacks '%s': %s", n2, m);
    CHECK(x.data == NULL && x.count == 0);
}

static void test_idx_errors(void) {
    expect_idx_error(dt_test_path("does-not-exist"), DT_ENOENT, "cannot open", NULL);
    for (int gz = 0; gz < 2; gz++) {
        const char *p = dt_test_path(gz ? "bad.gz" : "bad");
        unsigned char magic[] = {0x01, 0x02, 0x08, 0x01, 0, 0, 0, 1, 9};
        dt_test_write_bytes(p, magic, sizeof magic, gz);
        expect_idx_error(p, DT_EFORMAT, "not an IDX file", "01 02 08 01");
        unsigned char shorthdr[] = {0, 0};
        dt_test_write_bytes(p, shorthdr, sizeof shorthdr, gz);
        expect_idx_error(p, DT_EFORMAT, "truncated header", NULL);
        dt_test_write_bytes(p, "", 0, gz);
        expect_idx_error(p, DT_EFORMAT, "truncated header", NULL);
        unsigned char shortdims[] = {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0};
        dt_test_write_bytes(p, shortdims, sizeof shortdims, gz);
        expect_idx_error(p, DT_EFORMAT, "truncated header", "3 dims");
        unsigned char badtype[] = {0, 0, 0x0A, 1, 0, 0, 0, 1, 0};
        dt_test_write_bytes(p, badtype, sizeof badtype, gz);
        expect_idx_error(p, DT_EFORMAT, "unsupported IDX data type 0x0a", NULL);
        /* body cut short: 5 items of 2x2 i32 (16 bytes each), 50 bytes of data */
        unsigned char body[4 + 12 + 50] = {0, 0, 0x0C, 3, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 2};
        dt_test_write_bytes(p, body, sizeof body, gz);
        expect_idx_error(p, DT_EFORMAT, "truncated: header says 5 items of 16 bytes",
                         gz ? "file holds 50 bytes" : NULL);
        /* trailing garbage */
        unsigned char trail[] = {0, 0, 0x08, 1, 0, 0, 0, 2, 7, 8, 9, 9};
        dt_test_write_bytes(p, trail, sizeof trail, gz);
        expect_idx_error(p, DT_EFORMAT, "2 bytes of trailing data", NULL);
    }
    /* raw truncation names the exact size too */
    unsigned char body[4 + 12 + 50] = {0, 0, 0x0C, 3, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 2};
    dt_test_write_bytes(dt_test_path("cut"), body, sizeof body, false);
    expect_idx_error(dt_test_path("cut"), DT_EFORMAT, "file holds 50 bytes of data", NULL);
    /* a gzip file cut in the middle of the deflate stream */
    uint8_t big[4096];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
    uint32_t d = sizeof big;
    write_idx(dt_test_path("cut.gz"), 0x08, 1, &d, big, 1, true);
    struct stat st;
    stat(dt_test_path("cut.gz"), &st);
    CHECK(truncate(dt_test_path("cut.gz"), st.st_size / 2) == 0);
    expect_idx_error(dt_test_path("cut.gz"), DT_EFORMAT, "truncated", "cut short");
    /* corrupt deflate data after a valid gzip header */
    unsigned char junk[64] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    memset(junk + 10, 0xff, sizeof junk - 10);
    dt_test_write_bytes(dt_test_path("junk.gz"), junk, sizeof junk, false);
    expect_idx_error(dt_test_path("junk.gz"), DT_EFORMAT, "gzip", NULL);
    /* a directory is not a file */
    expect_idx_error(dt_test_dir, DT_EIO, "directory", NULL);
}

/* The gzip reader is strict: no trailer, trailing garbage or a bad CRC are errors naming the
 * file and byte; two members one after the other are one valid file. */
static void test_gzip_strict(void) {
    uint8_t big[4096];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
    uint32_t d = sizeof big;
    struct stat st;
    /* all the data but no trailer (CRC-32, length): accepted before */
    write_idx(dt_test_path("notrailer.gz"), 0x08, 1, &d, big, 1, true);
    stat(dt_test_path("notrailer.gz"), &st);
    CHECK(truncate(dt_test_path("notrailer.gz"), st.st_size - 8) == 0);
    expect_idx_error(dt_test_path("notrailer.gz"), DT_EFORMAT, "before its CRC/length trailer", NULL);
    /* trailing garbage after a complete member: accepted before (zlib's gzread ignores it) */
    write_idx(dt_test_path("garbage.gz"), 0x08, 1, &d, big, 1, true);
    stat(dt_test_path("garbage.gz"), &st);
    FILE *gf = fopen(dt_test_path("garbage.gz"), "ab");
    fputs("garbage", gf);
    fclose(gf);
    char where[64];
    snprintf(where, sizeof where, "trailing garbage after the gzip data (at byte %lld)", (long long)st.st_size);
    expect_idx_error(dt_test_path("garbage.gz"), DT_EFORMAT, where, NULL);
    /* a CRC that does not match the data */
    write_idx(dt_test_path("crc.gz"), 0x08, 1, &d, big, 1, true);
    stat(dt_test_path("crc.gz"), &st);
    gf = fopen(dt_test_path("crc.gz"), "r+b");
    unsigned char c0 = 0;
    CHECK(fseek(gf, st.st_size - 8, SEEK_SET) == 0 && fread(&c0, 1, 1, gf) == 1);
    CHECK(fseek(gf, st.st_size - 8, SEEK_SET) == 0 && fputc(c0 ^ 1, gf) != EOF);
    fclose(gf);
    expect_idx_error(dt_test_path("crc.gz"), DT_EFORMAT, "incorrect data check", NULL);
    /* two members one after the other are one valid gzip file (as gunzip reads them) */
    unsigned char head[12] = {0, 0, 0x08, 1, 0, 0, 0, 8, 1, 2, 3, 4}, tail[4] = {5, 6, 7, 8};
    dt_test_write_bytes(dt_test_path("two.gz"), head, sizeof head, true);
    char two[4096];
    snprintf(two, sizeof two, "%s.2", dt_test_path("two.gz"));
    dt_test_write_bytes(two, tail, sizeof tail, true);
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "cat '%s' >> '%s'", two, dt_test_path("two.gz"));
    CHECK(system(cmd) == 0);
    dt_idx two_x;
    CHECK_OK(dt_idx_read(dt_test_path("two.gz"), &two_x));
    CHECK(two_x.count == 8 && ((uint8_t *)two_x.data)[7] == 8);
    dt_idx_free(&two_x);
}

/* Writes an images/labels pair: n images of h x w u8 with pixel (i,j) = (i*31 + j) & 255, labels
 * i % classes. */
static void write_pair(const char *img, const char *lab, uint32_t n, uint32_t h, uint32_t w, int classes, bool gz) {
    uint8_t *px = malloc((size_t)n * h * w), *lb = malloc(n);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < (size_t)h * w; j++) px[i * h * w + j] = (uint8_t)((i * 31 + j) & 255);
        lb[i] = (uint8_t)(i % (size_t)classes);
    }
    uint32_t dims[3] = {n, h, w};
    write_idx(img, 0x08, 3, dims, px, 1, gz);
    write_idx(lab, 0x08, 1, dims, lb, 1, gz);
    free(px);
    free(lb);
}

static void test_idx_dataset(void) {
    write_pair(dt_test_path("im"), dt_test_path("lb"), 20, 3, 4, 7, false);
    dt_dataset *ds;
    CHECK_OK(dt_dataset_open_idx(&ds, dt_test_path("im"), dt_test_path("lb")));
    int C, H, W;
    dt_dataset_shape(ds, &C, &H, &W);
    CHECK(C == 1 && H == 3 && W == 4 && dt_dataset_len(ds) == 20 && dt_dataset_classes(ds) == 7);
    CHECK(dt_dataset_dtype(ds) == DT_U8 && strstr(dt_dataset_source(ds), "im"));
    uint32_t idx[3] = {5, 0, 19};
    float x[36];
    int32_t y[3];
    CHECK_OK(dt_dataset_batch(ds, idx, 3, x, y));
    CHECK(y[0] == 5 && y[1] == 0 && y[2] == 19 % 7);
    int bad = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 12; j++) bad += x[i * 12 + j] != (float)((double)((idx[i] * 31 + j) & 255) / 255.0);
    CHECK_MSG(bad == 0, "%d pixels differ from u8/255", bad);
    idx[1] = 20;
    CHECK(dt_dataset_batch(ds, idx, 3, x, y) == DT_EINVAL && strstr(dt_last_error(), "position 1") &&
          strstr(dt_last_error(), "20"));
    /* normalisation: (v/255 - mean) / std */
    CHECK(dt_dataset_set_normalize(ds, 0.5f, 0.0f) == DT_EINVAL);
    CHECK_OK(dt_dataset_set_normalize(ds, 0.25f, 0.5f));
    idx[1] = 1;
    CHECK_OK(dt_dataset_batch(ds, idx, 3, x, NULL));
    double worst = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 12; j++) {
            double want = ((double)((idx[i] * 31 + j) & 255) / 255.0 - 0.25) / 0.5, d = fabs(x[i * 12 + j] - want);
            if (d > worst) worst = d;
        }
    CHECK_MSG(worst < 1e-6, "normalised values off by %g", worst);
    /* stats are of the scaled data, independent of normalisation */
    double m, s, sum = 0, sum2 = 0;
    for (int i = 0; i < 20; i++)
        for (int j = 0; j < 12; j++) {
            double v = ((i * 31 + j) & 255) / 255.0;
            sum += v, sum2 += v * v;
        }
    dt_dataset_stats(ds, &m, &s);
    CHECK_MSG(fabs(m - sum / 240) < 1e-12 && fabs(s - sqrt(sum2 / 240 - (sum / 240) * (sum / 240))) < 1e-9,
              "stats %g %g", m, s);
    CHECK(dt_dataset_set_classes(ds, 6) == DT_EFORMAT && strstr(dt_last_error(), "sample 6"));
    CHECK_OK(dt_dataset_set_classes(ds, 12));
    CHECK(dt_dataset_classes(ds) == 12);
    dt_dataset_destroy(ds);
    dt_dataset_destroy(NULL);

    /* count mismatch names both files */
    write_pair(dt_test_path("im2"), dt_test_path("lb2"), 21, 3, 4, 7, true);
    CHECK(dt_dataset_open_idx(&ds, dt_test_path("im"), dt_test_path("lb2")) == DT_EFORMAT && ds == NULL);
    CHECK_MSG(strstr(dt_last_error(), "21 labels") && strstr(dt_last_error(), "20 images") &&
                  strstr(dt_last_error(), dt_test_path("lb2")),
              "%s", dt_last_error());
    /* a negative label names its index; float labels are regression targets (test_targets); labels
     * must be 1-dim */
    int32_t lab[20];
    for (int i = 0; i < 20; i++) lab[i] = i == 13 ? -2 : i % 3;
    uint32_t n = 20, d2[2] = {20, 1};
    write_idx(dt_test_path("lbneg"), 0x0C, 1, &n, lab, 4, false);
    CHECK(dt_dataset_open_idx(&ds, dt_test_path("im"), dt_test_path("lbneg")) == DT_EFORMAT);
    CHECK_MSG(strstr(dt_last_error(), "sample 13") && strstr(dt_last_error(), "-2"), "%s", dt_last_error());
    float flab[20] = {0};
    write_idx(dt_test_path("lbf"), 0x0D, 1, &n, flab, 4, false);
    CHECK(dt_dataset_open_idx(&ds, dt_test_path("im"), dt_test_path("lbf")) == DT_OK && ds &&
          dt_dataset_has_targets(ds));
    dt_dataset_destroy(ds);
    ds = NULL;
    write_idx(dt_test_path("lb2d"), 0x0C, 2, d2, lab, 4, false);
    CHECK(dt_dataset_open_idx(&ds, dt_test_path("im"), dt_test_path("lb2d")) == DT_EFORMAT &&
          strstr(dt_last_error(), "1 dim"));
    /* 2-dim rows -> (1,1,n); 4-dim -> (C,H,W); f32 samples pass through unchanged */
    float rows[6] = {1.5f, -2, 3, 4, 5, 6.25f};
    uint32_t rd[2] = {2, 3}, r4[4] = {1, 2, 3, 1};
    write_idx(dt_test_path("rows"), 0x0D, 2, rd, rows, 4, true);
    uint8_t two[2] = {1, 0};
    uint32_t two_n = 2, one_n = 1;
    write_idx(dt_test_path("two"), 0x08, 1, &two_n, two, 1, false);
    CHECK_OK(dt_dataset_open_idx(&ds, dt_test_path("rows"), dt_test_path("two")));
    dt_dataset_shape(ds, &C, &H, &W);
    CHECK(C == 1 && H == 1 && W == 3 && dt_dataset_classes(ds) == 2);
    uint32_t ii[2] = {1, 0};
    float xr[6];
    CHECK_OK(dt_dataset_batch(ds, ii, 2, xr, NULL));
    CHECK(xr[0] == 4 && xr[2] == 6.25f && xr[3] == 1.5f && xr[4] == -2);
    dt_dataset_destroy(ds);
    write_idx(dt_test_path("r4"), 0x08, 4, r4, rows, 1, false);
    write_idx(dt_test_path("one"), 0x08, 1, &one_n, two, 1, false);
    CHECK_OK(dt_dataset_open_idx(&ds, dt_test_path("r4"), dt_test_path("one")));
    dt_dataset_shape(ds, &C, &H, &W);
    CHECK(C == 2 && H == 3 && W == 1);
    dt_dataset_destroy(ds);
}

/* An IDX directory holds whatever its headers declare: 4-d C x H x W images (idx4), float32
 * feature rows (idx2), raw or .gz; only idx3 names were looked for. */
static void test_open_dir_general(void) {
    char d4[300], d2[300], p[400];
    snprintf(d4, sizeof d4, "%s/idx4", dt_test_dir);
    snprintf(d2, sizeof d2, "%s/idx2", dt_test_dir);
    mkdir(d4, 0755);
    mkdir(d2, 0755);
    uint8_t px[6 * 2 * 2 * 3], lab[6] = {0, 1, 2, 0, 1, 2};
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 5);
    uint32_t dims4[4] = {6, 2, 2, 3}, n = 6;
    float rows[6 * 5];
    for (int i = 0; i < 30; i++) rows[i] = (float)i * 0.25f - 3;
    uint32_t dims2[2] = {6, 5};
    const char *split[2] = {"train", "t10k"};
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/%s-images-idx4-ubyte.gz", d4, split[k]);
        write_idx(p, 0x08, 4, dims4, px, 1, true);
        snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", d4, split[k]);
        write_idx(p, 0x08, 1, &n, lab, 1, false);
        snprintf(p, sizeof p, "%s/%s-images-idx2-float", d2, split[k]);
        write_idx(p, 0x0D, 2, dims2, rows, 4, false);
        snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte.gz", d2, split[k]);
        write_idx(p, 0x08, 1, &n, lab, 1, true);
    }
    dt_dataset *tr = NULL, *te = NULL;
    int C, H, W;
    CHECK_OK(dt_dataset_open(&tr, &te, d4));
    if (tr) dt_dataset_shape(tr, &C, &H, &W);
    CHECK_MSG(tr && te && C == 2 && H == 2 && W == 3 && dt_dataset_len(te) == 6, "idx4: %d x %d x %d", C, H, W);
    float x[12];
    uint32_t i5 = 5;
    if (tr) CHECK_OK(dt_dataset_batch(tr, &i5, 1, x, NULL));
    CHECK(x[11] == (float)((uint8_t)((5 * 12 + 11) * 5) / 255.0));
    dt_dataset_destroy(tr), dt_dataset_destroy(te);
    tr = te = NULL;
    CHECK_OK(dt_dataset_open(&tr, &te, d2));
    if (tr) dt_dataset_shape(tr, &C, &H, &W);
    CHECK_MSG(tr && C == 1 && H == 1 && W == 5, "idx2: %d x %d x %d", C, H, W);
    if (tr) CHECK_OK(dt_dataset_batch(tr, &i5, 1, x, NULL));
    CHECK(x[0] == 25 * 0.25f - 3 && x[4] == 29 * 0.25f - 3);
    dt_dataset_destroy(tr), dt_dataset_destroy(te);
    /* two candidates for one role: refused, naming both */
    snprintf(p, sizeof p, "%s/train-images-idx3-float", d2);
    write_idx(p, 0x0D, 2, dims2, rows, 4, false);
    tr = te = NULL;
    CHECK(dt_dataset_open(&tr, &te, d2) == DT_EFORMAT && strstr(dt_last_error(), "more than one IDX file"));
}

/* An IDX label file of floats holds regression targets: one f32 a sample, whose bits the batch
 * writes into the label slot, no classes; views keep it; a test set of the other kind is refused. */
static void test_targets(void) {
    char d[300], p[400];
    snprintf(d, sizeof d, "%s/targets", dt_test_dir);
    mkdir(d, 0755);
    float rows[5 * 2], tg[5] = {0.5f, -1.25f, 3e-3f, 7.0f, -0.0f};
    for (int i = 0; i < 10; i++) rows[i] = (float)i;
    uint32_t dims[2] = {5, 2}, n = 5;
    snprintf(p, sizeof p, "%s/train-images-idx2-float", d);
    write_idx(p, 0x0D, 2, dims, rows, 4, false);
    snprintf(p, sizeof p, "%s/train-labels-idx1-float", d);
    write_idx(p, 0x0D, 1, &n, tg, 4, false);
    dt_dataset *tr = NULL, *te = NULL;
    CHECK_OK(dt_dataset_open(&tr, &te, d));
    CHECK(tr && te == NULL && dt_dataset_has_targets(tr) && dt_dataset_classes(tr) == 0);
    uint32_t idx[2] = {3, 1};
    float x[4];
    int32_t y[2];
    if (tr) CHECK_OK(dt_dataset_batch(tr, idx, 2, x, y));
    float got[2];
    memcpy(got, y, sizeof got);
    CHECK_MSG(got[0] == 7.0f && got[1] == -1.25f && x[0] == 6 && x[3] == 3, "targets %g %g", got[0], got[1]);
    if (tr) CHECK(dt_dataset_set_classes(tr, 2) == DT_EINVAL && strstr(dt_last_error(), "regression targets"));
    dt_dataset *a = NULL, *b = NULL; /* --val-split's views */
    if (tr) CHECK_OK(dt_dataset_split(tr, 0.4, 1, &a, &b));
    CHECK(a && b && dt_dataset_has_targets(a) && dt_dataset_has_targets(b));
    dt_dataset_destroy(a), dt_dataset_destroy(b);
    dt_dataset_destroy(tr);
    /* a test set of class labels beside training targets */
    uint8_t lab[5] = {0, 1, 0, 1, 0};
    snprintf(p, sizeof p, "%s/t10k-images-idx2-float", d);
    write_idx(p, 0x0D, 2, dims, rows, 4, false);
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", d);
    write_idx(p, 0x08, 1, &n, lab, 1, false);
    CHECK(dt_dataset_open(&tr, &te, d) == DT_EFORMAT && tr == NULL && te == NULL &&
          strstr(dt_last_error(), "holds class labels but"));
}

static void test_open_dir_and_alias(void) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/fashion-mnist", dt_test_dir);
    mkdir(dir, 0755);
    char a[400], b[400];
    snprintf(a, sizeof a, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(b, sizeof b, "%s/train-labels-idx1-ubyte", dir);
    /* train labels raw, train images gzip'd: mixing is fine */
    write_pair(a, b, 30, 2, 2, 4, false);
    write_pair(a, dt_test_path("unused"), 30, 2, 2, 4, true);
    dt_dataset *tr, *te;
    setenv("DTRAIN_DATASETS", dt_test_dir, 1);
    /* the test files are missing: the alias says what to install */
    CHECK(dt_dataset_open(&tr, &te, "fashion-mnist") == DT_ENOENT && tr == NULL && te == NULL);
    CHECK_MSG(strstr(dt_last_error(), "apt-get install dataset-fashion-mnist") &&
                  strstr(dt_last_error(), "t10k-images-idx3-ubyte"),
              "%s", dt_last_error());
    CHECK(dt_dataset_open(&tr, &te, "mnist") == DT_ENOENT);
    CHECK_MSG(strstr(dt_last_error(), "'mnist' is not installed") && strstr(dt_last_error(), "dataset-fashion-mnist"),
              "%s", dt_last_error());
    /* train only needs just the two train files */
    CHECK_OK(dt_dataset_open(&tr, NULL, "fashion-mnist"));
    CHECK(dt_dataset_len(tr) == 30 && dt_dataset_classes(tr) == 4);
    dt_dataset_destroy(tr);
    /* a plain directory without t10k files is a training set alone (what dtrain's Python binding
     * writes for x, y without x_test); with one of the two, the missing one is named */
    CHECK_OK(dt_dataset_open(&tr, &te, dir));
    CHECK(tr && te == NULL && dt_dataset_len(tr) == 30);
    dt_dataset_destroy(tr);
    snprintf(a, sizeof a, "%s/t10k-images-idx3-ubyte", dir);
    snprintf(b, sizeof b, "%s/t10k-labels-idx1-ubyte.gz", dir);
    write_pair(a, dt_test_path("unused2"), 9, 2, 2, 6, false);
    CHECK(dt_dataset_open(&tr, &te, dir) == DT_ENOENT && strstr(dt_last_error(), "t10k-labels-idx1-ubyte"));
    write_pair(a, b, 9, 2, 2, 6, false);
    CHECK_OK(dt_dataset_open(&tr, &te, "fashion-mnist"));
    CHECK(tr && te && dt_dataset_len(tr) == 30 && dt_dataset_len(te) == 9);
    CHECK(dt_dataset_classes(tr) == 6 && dt_dataset_classes(te) == 6); /* shared: the larger */
    dt_dataset_destroy(tr);
    dt_dataset_destroy(te);
    /* test images of another shape are refused */
    write_pair(a, b, 9, 2, 3, 6, false);
    CHECK(dt_dataset_open(&tr, &te, dir) == DT_EFORMAT && strstr(dt_last_error(), "differs from the train set"));
    unsetenv("DTRAIN_DATASETS");
    CHECK(dt_dataset_open(&tr, &te, dt_test_path("nowhere")) == DT_ENOENT && strstr(dt_last_error(), "nowhere"));
    CHECK(dt_dataset_open(&tr, &te, dt_test_path("im")) == DT_EFORMAT &&
          strstr(dt_last_error(), "text:FILE or kjv")); /* a file that is no data set: unusable data */
}

static void test_create(void) {
    int16_t x[6] = {-3, 100, 7, 0, 1, 2};
    int32_t y[2] = {1, 0};
    dt_dataset *ds;
    CHECK_OK(dt_dataset_create(&ds, DT_I16, x, y, 2, 1, 3, 1, 0));
    CHECK(dt_dataset_classes(ds) == 2);
    CHECK_OK(dt_dataset_set_normalize(ds, 1.0f, 2.0f));
    float out[6];
    uint32_t idx[2] = {0, 1};
    CHECK_OK(dt_dataset_batch(ds, idx, 2, out, NULL));
    CHECK(out[0] == -2 && out[1] == 49.5f && out[3] == -0.5f);
    double m, s;
    dt_dataset_stats(ds, &m, &s);
    CHECK(fabs(m - 107.0 / 6) < 1e-9);
    dt_dataset_destroy(ds);
    /* every byte value through the vectorised u8/255 path (259 = chunks + tail) is correctly
     * rounded; turning normalisation on and off again restores the same bits */
    uint8_t all[2 * 259];
    for (int i = 0; i < 2 * 259; i++) all[i] = (uint8_t)(i * 3 + 1);
    float fa[2 * 259], fb[2 * 259];
    CHECK_OK(dt_dataset_create(&ds, DT_U8, all, y, 2, 1, 1, 259, 0));
    CHECK_OK(dt_dataset_batch(ds, idx, 2, fa, NULL));
    int bad = 0;
    for (int i = 0; i < 2 * 259; i++) bad += fa[i] != (float)(all[i] / 255.0);
    CHECK_MSG(bad == 0, "%d of the u8/255 values are not correctly rounded", bad);
    CHECK_OK(dt_dataset_set_normalize(ds, 0.0f, 1.0f));
    CHECK_OK(dt_dataset_set_normalize(ds, 1.0f, 3.0f));
    CHECK_OK(dt_dataset_set_normalize(ds, 0.0f, 1.0f));
    CHECK_OK(dt_dataset_batch(ds, idx, 2, fb, NULL));
    CHECK(memcmp(fa, fb, sizeof fa) == 0);
    dt_dataset_destroy(ds);
    CHECK(dt_dataset_create(&ds, DT_I16, x, y, 2, 1, 3, 1, 1) == DT_EFORMAT && strstr(dt_last_error(), "sample 0"));
    CHECK(dt_dataset_create(&ds, DT_BF16, x, y, 2, 1, 3, 1, 0) == DT_EINVAL);
    /* a label of INT32_MAX: "max label + 1" classes overflowed (UBSan: signed overflow) */
    const int32_t huge[2] = {0, INT32_MAX};
    CHECK_MSG(dt_dataset_create(&ds, DT_I16, x, huge, 2, 1, 3, 1, 0) == DT_EFORMAT &&
                  strstr(dt_last_error(), "label 2147483647 of sample 1 is too large"),
              "%s", dt_last_error());
    const int32_t top[2] = {0, DT_MAX_CLASSES - 1};
    CHECK_OK(dt_dataset_create(&ds, DT_I16, x, top, 2, 1, 3, 1, 0));
    CHECK(dt_dataset_classes(ds) == DT_MAX_CLASSES);
    dt_dataset_destroy(ds);
}

/* The u8/255 fast path (a mul and an fma, not a division) against the plain f32 division, bit for
 * bit: 256 samples of odd D = 2 * 64 + 7 with pixel j of sample s = (s + 7j) & 255, so every
 * position (the vectorised chunks and the scalar tail) sees each of the 256 byte values once; the
 * batch is gathered in a shuffled order with an odd count (labels too). */
static void test_u8_unit_exact(void) {
    enum { N = 256, D = 135 };
    static uint8_t px[N * D];
    static float got[N * D];
    int32_t lab[N], ylab[N];
    uint32_t idx[N];
    for (int s = 0; s < N; s++) {
        for (int j = 0; j < D; j++) px[s * D + j] = (uint8_t)((s + 7 * j) & 255);
        lab[s] = s % 10;
        idx[s] = (uint32_t)((s * 97 + 13) % N); /* 97 odd: a permutation of 0..255 */
    }
    volatile float d255 = 255.0f; /* the division itself, never folded into a multiply */
    dt_dataset *ds;
    CHECK_OK(dt_dataset_create(&ds, DT_U8, px, lab, N, 1, 1, D, 10));
    for (int n = N - 1; n <= N; n++) {
        memset(got, 0xff, sizeof got);
        CHECK_OK(dt_dataset_batch(ds, idx, n, got, ylab));
        int bad = 0, badlab = 0, first = -1;
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < D; j++) {
                uint8_t b = px[idx[i] * D + j];
                float want = (float)b / d255;
                if (memcmp(&got[i * D + j], &want, sizeof want)) bad++, first = first < 0 ? b : first;
            }
            badlab += ylab[i] != lab[idx[i]];
        }
        CHECK_MSG(bad == 0, "batch of %d: %d u8/255 values differ from the f32 division (first: byte %d)", n, bad,
                  first);
        CHECK_MSG(badlab == 0, "batch of %d: %d labels gathered wrong", n, badlab);
        CHECK_MSG(n == N || got[n * D] != got[n * D], "batch of %d wrote past its end", n); /* still 0xff: a NaN */
    }
    dt_dataset_destroy(ds);
}

int main(void) {
    if (dt_test_dir_make("/tmp/dtrain-data-test-XXXXXX") != 0) return 1;
    test_idx_roundtrip();
    test_idx_errors();
    test_gzip_strict();
    test_idx_dataset();
    test_open_dir_and_alias();
    test_open_dir_general();
    test_targets();
    test_create();
    test_u8_unit_exact();
    dt_test_dir_remove();
    return dt_test_summary("data_test");
}
