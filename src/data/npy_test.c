/* Tests for the .npy reader with files written byte by byte here (independent of numpy): header
 * versions 1.0 and 3.0, spacing and key order as the format allows, gzip'd files, the IDX shape
 * rule for 1 to 5 dims, each features dtype read exactly (uint8 scaled by 1/255), each integer
 * labels dtype and shape (n,1), and the refusals that need a hand-made file (a header without
 * 'shape', version 4, trailing bytes, a label beyond the class limit). */
#include "data/data_testlib.h"
#include "dtrain/data.h"

#include <math.h>
#include <string.h>

/* Writes an .npy file: version major, the dict text (padded with spaces and a newline to a
 * multiple of 64 as numpy does), then n bytes of data. */
static void write_npy(const char *path, int major, const char *dict, const void *data, size_t n, bool gz) {
    unsigned char buf[4096 + 256];
    size_t pre = major == 1 ? 10 : 12, len = strlen(dict) + 1;
    while ((pre + len) % 64) len++;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major, buf[7] = 0;
    for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (unsigned char)(len >> (8 * i));
    memset(buf + pre, ' ', len);
    memcpy(buf + pre, dict, strlen(dict));
    buf[pre + len - 1] = '\n';
    memcpy(buf + pre + len, data, n);
    dt_test_write_bytes(path, buf, pre + len + n, gz);
}

static int32_t g_y[8] = {0, 1, 2, 1, 0, 2, 1, 0};

static void write_labels(const char *name, int n) {
    char dict[128];
    snprintf(dict, sizeof dict, "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", n);
    write_npy(dt_test_path(name), 1, dict, g_y, (size_t)n * 4, false);
}

/* Opens x with labels y (n samples): shape (C,H,W) and sample 1's first value as float. */
static void expect_open(const char *x, const char *y, int C, int H, int W, float first1, const char *what) {
    dt_dataset *ds = NULL;
    dt_status s = dt_dataset_open_npy(&ds, dt_test_path(x), dt_test_path(y));
    CHECK_MSG(s == DT_OK, "%s: %s", what, dt_last_error());
    if (!ds) return;
    int c, h, w;
    dt_dataset_shape(ds, &c, &h, &w);
    CHECK_MSG(c == C && h == H && w == W, "%s: shape (%d,%d,%d), want (%d,%d,%d)", what, c, h, w, C, H, W);
    float xb[512];
    int32_t yb[1];
    uint32_t i = 1;
    CHECK_OK(dt_dataset_batch(ds, &i, 1, xb, yb));
    CHECK_MSG(fabsf(xb[0] - first1) < 1e-6f && yb[0] == g_y[1], "%s: sample 1 starts %g (want %g), label %d", what,
              (double)xb[0], (double)first1, yb[0]);
    dt_dataset_destroy(ds);
}

static void test_shapes_and_dtypes(void) {
    float f[2 * 2 * 3 * 4 * 5];
    for (int i = 0; i < 240; i++) f[i] = (float)i * 0.5f;
    write_labels("y2.npy", 2);
    write_npy(dt_test_path("x1.npy"), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f, 8, false);
    expect_open("x1.npy", "y2.npy", 1, 1, 1, 0.5f, "(n)");
    write_npy(dt_test_path("x2.npy"), 1, "{'shape': (2, 6), 'fortran_order': False, 'descr': '<f4'}", f, 48, false);
    expect_open("x2.npy", "y2.npy", 1, 1, 6, 3.0f, "(n,W), keys in another order");
    write_npy(dt_test_path("x3.npy"), 3, "{ 'descr':'<f4','fortran_order':False,'shape':( 2 ,3,4 ) }", f, 96, true);
    expect_open("x3.npy", "y2.npy", 1, 3, 4, 6.0f, "(n,H,W), version 3.0, gzip'd, tight spacing");
    write_npy(dt_test_path("x5.npy"), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 3, 4, 5), }", f, 960,
              false);
    expect_open("x5.npy", "y2.npy", 6, 4, 5, 60.0f, "(n,A,B,H,W): A*B channels");
    uint8_t u8[4] = {0, 0, 255, 51};
    write_npy(dt_test_path("xu8.npy"), 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }", u8, 4, false);
    expect_open("xu8.npy", "y2.npy", 1, 1, 2, 1.0f, "uint8 scaled by 1/255");
    int16_t i16[4] = {0, 0, -300, 7};
    write_npy(dt_test_path("xi2.npy"), 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 2), }", i16, 8, false);
    expect_open("xi2.npy", "y2.npy", 1, 1, 2, -300.0f, "int16 features, signed");
    double f8[4] = {0, 0, 1e-3, 2};
    write_npy(dt_test_path("xf8.npy"), 1, "{'descr': '<f8', 'fortran_order': True, 'shape': (4,), }", f8, 32, false);
    write_labels("y4.npy", 4);
    expect_open("xf8.npy", "y4.npy", 1, 1, 1, 0.0f, "float64, 1-d Fortran order is C order");
    /* labels: uint8 of shape (n, 1), int16, uint64 */
    uint8_t yu8[2] = {0, 1};
    write_npy(dt_test_path("yu8.npy"), 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 1), }", yu8, 2, false);
    expect_open("x2.npy", "yu8.npy", 1, 1, 6, 3.0f, "uint8 labels of shape (n, 1)");
    int16_t yi2[2] = {0, 1};
    write_npy(dt_test_path("yi2.npy"), 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }", yi2, 4, false);
    expect_open("x2.npy", "yi2.npy", 1, 1, 6, 3.0f, "int16 labels");
    uint64_t yu64[2] = {0, 1};
    write_npy(dt_test_path("yu64.npy"), 1, "{'descr': '<u8', 'fortran_order': False, 'shape': (2,), }", yu64, 16,
              false);
    expect_open("x2.npy", "yu64.npy", 1, 1, 6, 3.0f, "uint64 labels");
}

static void expect_refused(const char *x, const char *y, const char *needle) {
    dt_dataset *ds = (dt_dataset *)1;
    dt_status s = dt_dataset_open_npy(&ds, dt_test_path(x), dt_test_path(y));
    CHECK_MSG(s == DT_EFORMAT && !ds && strstr(dt_last_error(), needle), "%s/%s: status %d, want '%s': %s", x, y, s,
              needle, dt_last_error());
}

static void test_refusals(void) {
    float f[4] = {0};
    write_npy(dt_test_path("noshape.npy"), 1, "{'descr': '<f4', 'fortran_order': False}", f, 16, false);
    expect_refused("noshape.npy", "y2.npy", "lacks 'descr', 'fortran_order' or 'shape'");
    write_npy(dt_test_path("v4.npy"), 4, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", f, 16, false);
    expect_refused("v4.npy", "y2.npy", "version 4.0 is not supported");
    write_npy(dt_test_path("long.npy"), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1), }", f, 16, false);
    expect_refused("long.npy", "y2.npy", "trailing data");
    int32_t big[2] = {0, DT_MAX_CLASSES};
    write_npy(dt_test_path("ybig.npy"), 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", big, 8, false);
    expect_refused("x2.npy", "ybig.npy", "label 16777216 of sample 1");
    int8_t neg[2] = {0, -2};
    write_npy(dt_test_path("yneg.npy"), 1, "{'descr': '|i1', 'fortran_order': False, 'shape': (2,), }", neg, 2, false);
    expect_refused("x2.npy", "yneg.npy", "label -2 of sample 1");
    write_npy(dt_test_path("huge.npy"), 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (4000000000, 1000), }", f,
              16, false);
    expect_refused("huge.npy", "y2.npy", "more than the"); /* refused before allocating 32 TB */
    write_npy(dt_test_path("x0.npy"), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0), }", f, 0, false);
    expect_refused("x0.npy", "y2.npy", "samples of zero size");
}

int main(void) {
    if (dt_test_dir_make("/tmp/dtrain-npy-test-XXXXXX") != 0) return 1;
    test_shapes_and_dtypes();
    test_refusals();
    dt_test_dir_remove();
    return dt_test_summary("npy_test");
}
