/* Tests for the data layer's CSV reader: header detection, label column first or last, u8 pixel
 * data scaled and float features unscaled, gzip'd files, explicit options (shape, classes),
 * errors that name the file, line and column, a line longer than the reader's buffer, and the
 * "train" -> "test" sibling dt_dataset_open finds. Files go into a mkdtemp directory. */
#include "core/test.h"
#include "data/data_testlib.h"
#include "dtrain/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static void write_text(const char *path, const char *text, bool gz) {
    dt_test_write_bytes(path, text, strlen(text), gz);
}

static void test_csv(void) {
    dt_dataset *ds, *te;
    /* header (auto), label first, pixel data -> u8 and scaled */
    write_text(dt_test_path("a.csv"), "label,p1,p2,p3\n3,0,255,17\n1, 2 ,3,4\r\n\n0,9,8,7\n", false);
    CHECK_OK(dt_dataset_open_csv(&ds, dt_test_path("a.csv"), NULL));
    int C, H, W;
    dt_dataset_shape(ds, &C, &H, &W);
    CHECK(dt_dataset_len(ds) == 3 && C == 1 && H == 1 && W == 3 && dt_dataset_classes(ds) == 4 &&
          dt_dataset_dtype(ds) == DT_U8);
    uint32_t idx[3] = {0, 1, 2};
    float x[9];
    int32_t y[3];
    CHECK_OK(dt_dataset_batch(ds, idx, 3, x, y));
    CHECK(y[0] == 3 && y[1] == 1 && y[2] == 0);
    CHECK(x[0] == 0 && x[1] == 1.0f && x[2] == (float)(17 / 255.0) && x[3] == (float)(2 / 255.0) &&
          x[8] == (float)(7 / 255.0));
    dt_dataset_destroy(ds);
    /* no header, label last, float features -> f32 unscaled; the switch from u8 mid-file keeps
     * earlier rows; gzip'd */
    write_text(dt_test_path("b.csv.gz"), "1,2,0\n3,4,1\n0.5,-1e3,2\n7,8,1\n", true);
    dt_csv_options o = {.label_col = -1};
    CHECK_OK(dt_dataset_open_csv(&ds, dt_test_path("b.csv.gz"), &o));
    CHECK(dt_dataset_len(ds) == 4 && dt_dataset_dtype(ds) == DT_F32 && dt_dataset_classes(ds) == 3);
    float xb[8];
    int32_t yb[4];
    uint32_t i4[4] = {0, 1, 2, 3};
    CHECK_OK(dt_dataset_batch(ds, i4, 4, xb, yb));
    CHECK(xb[0] == 1 && xb[1] == 2 && xb[2] == 3 && xb[3] == 4 && xb[4] == 0.5f && xb[5] == -1000 && xb[6] == 7 &&
          xb[7] == 8);
    CHECK(yb[0] == 0 && yb[1] == 1 && yb[2] == 2 && yb[3] == 1);
    dt_dataset_destroy(ds);
    /* explicit options: header yes, no scaling, a shape, a class count */
    write_text(dt_test_path("c.csv"), "a,b,c,d,e\n1,10,20,30,40\n0,1,2,3,4\n", false);
    o = (dt_csv_options){.header = DT_CSV_YES, .scale = DT_CSV_NO, .shape = {1, 2, 2}, .classes = 5};
    CHECK_OK(dt_dataset_open_csv(&ds, dt_test_path("c.csv"), &o));
    dt_dataset_shape(ds, &C, &H, &W);
    CHECK(C == 1 && H == 2 && W == 2 && dt_dataset_classes(ds) == 5);
    CHECK_OK(dt_dataset_batch(ds, idx, 1, x, y));
    CHECK(x[0] == 10 && x[3] == 40 && y[0] == 1);
    dt_dataset_destroy(ds);
    o.shape[2] = 3;
    CHECK(dt_dataset_open_csv(&ds, dt_test_path("c.csv"), &o) == DT_EINVAL && strstr(dt_last_error(), "shape"));
    /* errors name the file and the line */
    write_text(dt_test_path("d.csv"), "1,2,3\n0,4,5\n1,x7,6\n", false);
    CHECK(dt_dataset_open_csv(&ds, dt_test_path("d.csv"), NULL) == DT_EFORMAT && ds == NULL);
    CHECK_MSG(strstr(dt_last_error(), "d.csv:3: column 2: 'x7' is not a number"), "%s", dt_last_error());
    write_text(dt_test_path("e.csv"), "1,2,3\n0,4,5\n\n1,6\n", false);
    CHECK(dt_dataset_open_csv(&ds, dt_test_path("e.csv"), NULL) == DT_EFORMAT);
    CHECK_MSG(strstr(dt_last_error(), "e.csv:4: 2 fields, expected 3"), "%s", dt_last_error());
    write_text(dt_test_path("f.csv"), "1,2,3\n0,4,5\n2.5,1,1\n", false);
    CHECK(dt_dataset_open_csv(&ds, dt_test_path("f.csv"), NULL) == DT_EFORMAT &&
          strstr(dt_last_error(), "f.csv:3: label '2.5'"));
    write_text(dt_test_path("g.csv"), "1,2,3\n-1,4,5\n", false);
    CHECK(dt_dataset_open_csv(&ds, dt_test_path("g.csv"), NULL) == DT_EFORMAT &&
          strstr(dt_last_error(), "g.csv:2: label '-1'"));
    o = (dt_csv_options){.classes = 2};
    write_text(dt_test_path("h.csv"), "1,2,3\n0,4,5\n2,4,5\n", false);
    CHECK(dt_dataset_open_csv(&ds, dt_test_path("h.csv"), &o) == DT_EFORMAT &&
          strstr(dt_last_error(), "h.csv:3: label '2'") && strstr(dt_last_error(), "[0, 2)"));
    o = (dt_csv_options){.header = DT_CSV_NO};
    CHECK(dt_dataset_open_csv(&ds, dt_test_path("a.csv"), &o) == DT_EFORMAT &&
          strstr(dt_last_error(), "a.csv:1: column 1: 'label'"));
    write_text(dt_test_path("empty.csv"), "label,x\n", false);
    CHECK(dt_dataset_open_csv(&ds, dt_test_path("empty.csv"), NULL) == DT_EFORMAT &&
          strstr(dt_last_error(), "no data rows"));
    CHECK(dt_dataset_open_csv(&ds, dt_test_path("none.csv"), NULL) == DT_ENOENT && strstr(dt_last_error(), "none.csv"));
    /* a long line (beyond the reader's first buffer) */
    size_t F = 300000;
    char *big = malloc(F * 4 + 16), *p = big;
    p += sprintf(p, "1");
    for (size_t i = 0; i < F; i++) p += sprintf(p, ",%d", (int)(i % 200));
    sprintf(p, "\n");
    write_text(dt_test_path("long.csv"), big, false);
    free(big);
    CHECK_OK(dt_dataset_open_csv(&ds, dt_test_path("long.csv"), NULL));
    CHECK(dt_dataset_len(ds) == 1);
    dt_dataset_shape(ds, NULL, NULL, &W);
    CHECK(W == (int)F);
    dt_dataset_destroy(ds);
    /* no newline in 64 MiB (a binary file; a sparse one here): refused, holding no more than that */
    FILE *z = fopen(dt_test_path("zeros.csv"), "w");
    CHECK(z && ftruncate(fileno(z), (off_t)65 << 20) == 0);
    if (z) fclose(z);
    CHECK_MSG(dt_dataset_open_csv(&ds, dt_test_path("zeros.csv"), NULL) == DT_EFORMAT && ds == NULL &&
                  strstr(dt_last_error(), "zeros.csv:1: a line longer than 64 MiB"),
              "%s", dt_last_error());
    unlink(dt_test_path("zeros.csv"));
    /* a device is no data file (a .csv link to /dev/zero was read until memory ran out): checked
     * in a child with a memory bound and a deadline, so that a regression fails instead of eating
     * the machine's memory (no bound under a sanitizer, whose shadow maps exceed it) */
    if (symlink("/dev/zero", dt_test_path("dev.csv")) == 0) {
        pid_t child = fork();
        if (child == 0) {
            struct rlimit lim = {(rlim_t)1 << 30, (rlim_t)1 << 30};
            if (!getenv("DTRAIN_SANITIZED")) setrlimit(RLIMIT_DATA, &lim);
            alarm(60);
            dt_dataset *d = NULL;
            dt_status st = dt_dataset_open_csv(&d, dt_test_path("dev.csv"), NULL);
            _exit(st == DT_EFORMAT && strstr(dt_last_error(), "is a character device, not a file") ? 0 : 1);
        }
        int status = 0;
        waitpid(child, &status, 0);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a .csv link to /dev/zero: not refused (status %d)",
                  status);
        unlink(dt_test_path("dev.csv"));
    }
    /* dt_dataset_open on a .csv: the test set is the "train" -> "test" sibling when it exists */
    write_text(dt_test_path("mnist_train.csv"), "label,a,b\n0,1,2\n1,3,4\n", false);
    CHECK_OK(dt_dataset_open(&ds, &te, dt_test_path("mnist_train.csv")));
    CHECK(ds && te == NULL && dt_dataset_len(ds) == 2);
    dt_dataset_destroy(ds);
    write_text(dt_test_path("mnist_test.csv"), "label,a,b\n2,1,2\n", false);
    CHECK_OK(dt_dataset_open(&ds, &te, dt_test_path("mnist_train.csv")));
    CHECK(ds && te && dt_dataset_len(te) == 1 && dt_dataset_classes(ds) == 3 && dt_dataset_classes(te) == 3);
    dt_dataset_destroy(ds);
    dt_dataset_destroy(te);
    write_text(dt_test_path("mnist_test.csv"), "label,a\n2,1\n", false);
    CHECK(dt_dataset_open(&ds, &te, dt_test_path("mnist_train.csv")) == DT_EFORMAT && ds == NULL && te == NULL);
}

int main(void) {
    if (dt_test_dir_make("/tmp/dtrain-csv-test-XXXXXX") != 0) return 1;
    test_csv();
    dt_test_dir_remove();
    return dt_test_summary("csv_test");
}
