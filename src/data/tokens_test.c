/* Tests for token-file data sets (tokens:DIR): nanoGPT's train.bin/val.bin and llm.c's shards give
 * windows whose inputs and targets are exactly the files' uint16 tokens (little-endian, values
 * above a byte), several shards read as one stream in name order, the vocabulary is the largest
 * token + 1 and can be raised but not lowered below a token, the held-out end without a
 * validation file, and every refused file gets an error naming it. Files are written by the
 * test into a mkdtemp directory, removed at the end. */
#include "data/data_testlib.h"
#include "dtrain/data.h"

#include <string.h>
#include <sys/stat.h>

enum { N = 3000, T = 8 };
static uint16_t g_tok[N];

/* Writes tokens [first, first+n) of g_tok to path, with llm.c's header when llmc (version and
 * count as given). */
static void write_tokens(const char *path, int first, int n, bool llmc, int32_t version, int32_t count) {
    FILE *f = fopen(path, "wb");
    if (llmc) {
        int32_t h[256] = {20240520, version, count};
        fwrite(h, sizeof h, 1, f);
    }
    for (int i = 0; i < n; i++) {
        uint8_t le[2] = {(uint8_t)(g_tok[first + i] & 0xff), (uint8_t)(g_tok[first + i] >> 8)};
        fwrite(le, 2, 1, f);
    }
    fclose(f);
}

/* Every window of ds is tokens [base + i*T, base + i*T + T] of g_tok: inputs then next tokens. */
static void check_windows(const dt_dataset *ds, int base, const char *what) {
    const size_t n = dt_dataset_len(ds);
    int32_t tok[T], tgt[T];
    int bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        CHECK_OK(dt_dataset_batch_tokens(ds, &i, 1, tok, tgt));
        for (int t = 0; t < T; t++)
            bad += tok[t] != g_tok[base + (int)i * T + t] || tgt[t] != g_tok[base + (int)i * T + t + 1];
    }
    CHECK_MSG(bad == 0, "%s: %d tokens differ from the file's", what, bad);
}

static uint16_t max_of(int first, int n) {
    uint16_t m = 0;
    for (int i = first; i < first + n; i++) m = g_tok[i] > m ? g_tok[i] : m;
    return m;
}

static void test_nanogpt(void) {
    mkdir(dt_test_path("ng"), 0700);
    write_tokens(dt_test_path("ng/train.bin"), 0, 2700, false, 0, 0);
    write_tokens(dt_test_path("ng/val.bin"), 2700, 300, false, 0, 0);
    char spec[600];
    snprintf(spec, sizeof spec, "tokens:%s", dt_test_path("ng"));
    CHECK(dt_data_is_text(spec) && dt_data_is_tokens(spec));
    dt_dataset *tr = NULL, *va = NULL;
    CHECK_OK(dt_dataset_open_text(&tr, &va, spec, T, 0.1));
    if (!tr || !va) return;
    CHECK(dt_dataset_len(tr) == (2700 - 1) / T && dt_dataset_len(va) == (300 - 1) / T);
    CHECK(dt_dataset_window(tr) == T && dt_dataset_is_text(tr) && dt_dataset_dtype(tr) == DT_I16);
    CHECK_MSG(dt_dataset_classes(tr) == max_of(0, 2700) + 1, "vocabulary %d, largest token %u", dt_dataset_classes(tr),
              max_of(0, 2700));
    CHECK(dt_dataset_classes(va) == max_of(2700, 300) + 1);
    check_windows(tr, 0, "train.bin");
    check_windows(va, 2700, "val.bin");
    const int V = dt_dataset_classes(tr) + 10; /* a model's padded V */
    CHECK_OK(dt_dataset_set_classes(tr, V));
    CHECK(dt_dataset_classes(tr) == V);
    CHECK(dt_dataset_set_classes(va, 1000) == DT_EINVAL &&
          strstr(dt_last_error(), "does not fit a vocabulary of 1000") && strstr(dt_last_error(), "val.bin"));
    dt_dataset_destroy(tr);
    dt_dataset_destroy(va);
    /* --val-fraction 0: no validation set even where val.bin exists */
    CHECK_OK(dt_dataset_open_text(&tr, &va, spec, T, 0));
    CHECK(tr && !va);
    dt_dataset_destroy(tr);
}

static void test_llmc(void) {
    mkdir(dt_test_path("lc"), 0700);
    write_tokens(dt_test_path("lc/x_val_000000.bin"), 0, 400, true, 1, 400);
    write_tokens(dt_test_path("lc/x_train_000002.bin"), 1400, 1600, true, 1, 1600); /* listed out of order */
    write_tokens(dt_test_path("lc/x_train_000001.bin"), 400, 1000, true, 1, 1000);
    char spec[600];
    snprintf(spec, sizeof spec, "tokens:%s", dt_test_path("lc"));
    dt_dataset *tr = NULL, *va = NULL;
    CHECK_OK(dt_dataset_open_text(&tr, &va, spec, T, 0.1));
    if (!tr || !va) return;
    CHECK(dt_dataset_len(tr) == (2600 - 1) / T && dt_dataset_len(va) == (400 - 1) / T);
    check_windows(tr, 400, "two train shards in name order");
    check_windows(va, 0, "the val shard");
    dt_dataset_destroy(tr);
    dt_dataset_destroy(va);
    /* one shard named directly, no validation file: its last 10% validates */
    snprintf(spec, sizeof spec, "tokens:%s", dt_test_path("lc/x_train_000002.bin"));
    CHECK_OK(dt_dataset_open_text(&tr, &va, spec, T, 0.1));
    if (!tr || !va) return;
    CHECK(dt_dataset_len(tr) == (1440 - 1) / T && dt_dataset_len(va) == (160 - 1) / T);
    check_windows(tr, 1400, "a shard's train part");
    check_windows(va, 1400 + 1440, "a shard's held-out end");
    dt_dataset_destroy(tr);
    dt_dataset_destroy(va);
}

/* spec opens with status want and a message holding both needles. */
static void expect_error(const char *dir, dt_status want, const char *n1, const char *n2) {
    char spec[600];
    snprintf(spec, sizeof spec, "tokens:%s", dt_test_path(dir));
    dt_dataset *tr = (dt_dataset *)1, *va = (dt_dataset *)1;
    dt_status s = dt_dataset_open_text(&tr, &va, spec, T, 0.1);
    CHECK_MSG(s == want && !tr && !va && strstr(dt_last_error(), n1) && strstr(dt_last_error(), n2),
              "%s: status %d (want %d): %s", dir, s, want, dt_last_error());
}

static void test_errors(void) {
    const char *dirs[] = {"e1", "e2", "e3", "e4", "e5", "e6"};
    for (int i = 0; i < 6; i++) mkdir(dt_test_path(dirs[i]), 0700);
    write_tokens(dt_test_path("e1/train.bin"), 0, 100, false, 0, 0);
    FILE *f = fopen(dt_test_path("e1/train.bin"), "ab");
    fputc(7, f); /* 201 bytes */
    fclose(f);
    expect_error("e1", DT_EFORMAT, "e1/train.bin has 201 bytes, an odd count", "uint16");
    write_tokens(dt_test_path("e2/a_train_000001.bin"), 0, 100, false, 0, 0);
    expect_error("e2", DT_EFORMAT, "a_train_000001.bin is named like an llm.c shard", "magic 20240520");
    write_tokens(dt_test_path("e3/a_train_000001.bin"), 0, 100, true, 7, 100);
    expect_error("e3", DT_EFORMAT, "version 7", "only version 1");
    write_tokens(dt_test_path("e4/a_train_000001.bin"), 0, 100, true, 1, 120);
    expect_error("e4", DT_EFORMAT, "says 120 tokens", "cut short");
    expect_error("e5", DT_ENOENT, "holds neither train.bin", "_train_");
    expect_error("missing", DT_ENOENT, "no such directory", "missing");
    write_tokens(dt_test_path("e6/train.bin"), 0, 12, false, 0, 0);
    expect_error("e6", DT_EINVAL, "at least 2 are needed", "train.bin");
}

int main(void) {
    if (dt_test_dir_make("/tmp/dtrain-tokens-test-XXXXXX") != 0) return 1;
    uint64_t s = 0x9e3779b97f4a7c15ull; /* tokens up to 65535: both bytes matter */
    for (int i = 0; i < N; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        g_tok[i] = (uint16_t)(s >> 20);
    }
    test_nanogpt();
    test_llmc();
    test_errors();
    dt_test_dir_remove();
    return dt_test_summary("tokens_test");
}
