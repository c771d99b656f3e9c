/* Tests for core: dtype conversion (bf16/f16 rounding and specials), RNG determinism and
 * statistics, error messages and slabs, the directory part of a path. */
#include "core/sys.h"
#include "core/test.h"
#include "dtrain/core.h"
#include "dtrain/dtrain.h" /* DTRAIN_VERSION */

#include <string.h>

static void test_bf16(void) {
    CHECK(dt_bf16_to_f32(dt_f32_to_bf16(1.0f)) == 1.0f);
    CHECK(dt_bf16_to_f32(dt_f32_to_bf16(-2.5f)) == -2.5f);
    /* 1 + 2^-8 is exactly half way between bf16 neighbours 1 and 1+2^-7: ties to even -> 1 */
    CHECK(dt_bf16_to_f32(dt_f32_to_bf16(1.0f + 1.0f / 256)) == 1.0f);
    CHECK(dt_bf16_to_f32(dt_f32_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
    float nan = NAN;
    CHECK(isnan(dt_bf16_to_f32(dt_f32_to_bf16(nan))));
    CHECK(isinf(dt_bf16_to_f32(dt_f32_to_bf16(INFINITY))));
}

static void test_f16(void) {
    float vals[] = {0.0f, 1.0f, -1.0f, 0.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 1000.5f};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++)
        CHECK_MSG(dt_f16_to_f32(dt_f32_to_f16(vals[i])) == vals[i], "value %g", vals[i]);
    CHECK(isinf(dt_f16_to_f32(dt_f32_to_f16(70000.0f))));
    CHECK(isnan(dt_f16_to_f32(dt_f32_to_f16(NAN))));
    /* ties to even: 1 + 2^-11 lies between 1 and 1+2^-10 -> 1 */
    CHECK(dt_f16_to_f32(dt_f32_to_f16(1.0f + 1.0f / 2048)) == 1.0f);
    /* max relative error over a sweep stays under 2^-11 */
    double worst = 0;
    for (float x = 1e-4f; x < 6e4f; x *= 1.001f) {
        double r = fabs(dt_f16_to_f32(dt_f32_to_f16(x)) - x) / x;
        if (r > worst) worst = r;
    }
    CHECK_MSG(worst <= 1.0 / 2048 + 1e-9, "worst rel err %g", worst);
    /* every f16 bit pattern (non-NaN) round-trips exactly */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_f16_to_f32((uint16_t)h);
        if (!isnan(f) && dt_f32_to_f16(f) != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d f16 patterns do not round-trip", bad);
}

static void test_convert(void) {
    float src[5] = {1, -2, 3.5f, 100, 0};
    uint16_t bf[5];
    float back[5];
    dt_convert(bf, DT_BF16, src, DT_F32, 5);
    dt_convert(back, DT_F32, bf, DT_BF16, 5);
    CHECK(memcmp(src, back, sizeof src) == 0);
    int64_t i64[5];
    dt_convert(i64, DT_I64, src, DT_F32, 5);
    CHECK(i64[1] == -2 && i64[3] == 100);
    dt_dtype t;
    CHECK(dt_dtype_parse("BF16", &t) == DT_OK && t == DT_BF16);
    CHECK(dt_dtype_parse("F128", &t) == DT_EINVAL && strstr(dt_last_error(), "F128"));
}

/* dt_convert's array conversions (vector forms where built) give the scalar functions' bits: every
 * 509th f32 bit pattern narrowed (8.4 million: each exponent, f16 subnormals and overflow, ties,
 * NaNs, both signs), every bf16 and f16 pattern widened, at an odd length (the vectors' tails),
 * and after a NaN (the vectors stop there). */
static void test_convert_arrays(void) {
    enum { M = (1 << 16) + 5 };
    static float f[M], back[M];
    static uint16_t h[M], b[M];
    size_t bad_h = 0, bad_b = 0;
    uint64_t bits = 0;
    while (bits < (1ull << 32)) {
        size_t m = 0;
        for (; m < M && bits < (1ull << 32); m++, bits += 509) {
            uint32_t u = (uint32_t)bits;
            memcpy(&f[m], &u, 4);
        }
        dt_convert(h, DT_F16, f, DT_F32, m);
        dt_convert(b, DT_BF16, f, DT_F32, m);
        for (size_t i = 0; i < m; i++) bad_h += h[i] != dt_f32_to_f16(f[i]), bad_b += b[i] != dt_f32_to_bf16(f[i]);
    }
    CHECK_MSG(bad_h == 0 && bad_b == 0, "f32 -> f16: %zu, f32 -> bf16: %zu values differ from the scalar conversion",
              bad_h, bad_b);
    for (int t = 0; t < 2; t++) {
        for (size_t i = 0; i < M; i++) h[i] = (uint16_t)(i * 40503u); /* every pattern (40503 is odd), shuffled */
        dt_convert(back, DT_F32, h, t ? DT_BF16 : DT_F16, M);
        size_t bad = 0;
        for (size_t i = 0; i < M; i++) {
            float want = t ? dt_bf16_to_f32(h[i]) : dt_f16_to_f32(h[i]);
            bad += memcmp(&want, &back[i], 4) != 0;
        }
        CHECK_MSG(bad == 0, "%s -> f32: %zu values differ from the scalar conversion", t ? "bf16" : "f16", bad);
    }
}

static void test_rng(void) {
    /* Philox-4x32-10 known-answer test (Random123 kat_vectors: ctr=0, key=0) */
    uint32_t r[4];
    dt_philox4x32(0, 0, 0, r);
    CHECK(r[0] == 0x6627e8d5u && r[1] == 0xe169c58du && r[2] == 0xbc57ac4cu && r[3] == 0x9b00dbd8u);
    CHECK(dt_rng_u64(1, 2, 3) == dt_rng_u64(1, 2, 3));
    CHECK(dt_rng_u64(1, 2, 3) != dt_rng_u64(1, 2, 4));
    CHECK(dt_rng_u64(1, 2, 3) != dt_rng_u64(2, 2, 3));
    enum { N = 200000 };
    float *x = malloc(N * sizeof *x);
    dt_rng_fill_normal(x, N, 0, 1, 42, dt_rng_key(DT_RNG_INIT, 0));
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) s += x[i], s2 += (double)x[i] * x[i];
    CHECK_MSG(fabs(s / N) < 0.01 && fabs(s2 / N - 1) < 0.02, "mean %g var %g", s / N, s2 / N);
    dt_rng_fill_uniform(x, N, -1, 1, 42, 7);
    s = 0;
    float lo = 1, hi = -1;
    for (int i = 0; i < N; i++) s += x[i], lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;
    CHECK(fabs(s / N) < 0.01 && lo >= -1 && hi < 1);
    /* a prefix draw is independent of the fill length */
    float y[10];
    dt_rng_fill_uniform(y, 10, -1, 1, 42, 7);
    CHECK(memcmp(x, y, sizeof y) == 0);
    free(x);
}

static void test_errors_and_slabs(void) {
    CHECK(dt_error(DT_EIO, "cannot open %s", "x.bin") == DT_EIO);
    CHECK(strcmp(dt_last_error(), "cannot open x.bin") == 0);
    dt_error_wrap(DT_EIO, "loading model");
    CHECK(strcmp(dt_last_error(), "loading model: cannot open x.bin") == 0);
    CHECK(dt_last_error_peer() == -1);
    /* the peer an error blames survives wrapping; a new error or a clear forgets it */
    CHECK(dt_error_peer(DT_EPEER, 3, "rank 3 died") == DT_EPEER && dt_last_error_peer() == 3);
    dt_error_wrap(DT_EPEER, "step 1");
    CHECK(dt_last_error_peer() == 3 && strcmp(dt_last_error(), "step 1: rank 3 died") == 0);
    dt_error(DT_EIO, "disk full");
    CHECK(dt_last_error_peer() == -1);
    dt_error_peer(DT_EPEER, 1, "rank 1 left");
    dt_error_clear();
    CHECK(dt_last_error_peer() == -1);
    dt_slab s;
    CHECK_OK(dt_slab_init(&s, 1000));
    CHECK(((uintptr_t)s.data & 63) == 0 && s.data[999] == 0.0f);
    dt_slab_free(&s);
    dt_slab_free(&s);
    int64_t shape[2] = {3, 4};
    dt_tensor t = dt_tensor_view(NULL, DT_F32, 2, shape);
    CHECK(dt_tensor_numel(&t) == 12);
}

/* dt_path_dir: the text before the last '/', "/" for the root, "." without one; snprintf's
 * length and truncation */
static void test_path_dir(void) {
    static const char *cases[][2] = {
        {"a/b/c.st", "a/b"}, {"/abs/x", "/abs"}, {"a/b/", "a/b"}, {"dir/", "dir"}, {"bare.st", "."},
        {"", "."},           {"/x.st", "/"},     {"/", "/"},      {"./x", "."},    {"../up/x", "../up"},
        {"//x", "/"},        {"a//b", "a/"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[16] = "junk";
        size_t n = dt_path_dir(out, sizeof out, cases[i][0]);
        CHECK_MSG(!strcmp(out, cases[i][1]) && n == strlen(cases[i][1]),
                  "dt_path_dir(\"%s\") = \"%s\" (%zu), want \"%s\"", cases[i][0], out, n, cases[i][1]);
    }
    char small[4];
    CHECK(dt_path_dir(small, sizeof small, "abcdef/x") == 6 && !strcmp(small, "abc"));
    CHECK(dt_path_dir(small, 1, "abcdef/x") == 6 && small[0] == '\0');
    CHECK(dt_path_dir(NULL, 0, "ab/x") == 2);
    CHECK(dt_path_dir(small, sizeof small, "x") == 1 && !strcmp(small, "."));
}

/* dt_version is the header's DTRAIN_VERSION (the library and its headers agree), as a static string. */
static void test_version(void) {
    CHECK(dt_version() != NULL && strcmp(dt_version(), DTRAIN_VERSION) == 0);
    CHECK(dt_version() == dt_version());
}

/* DT_TRY_GOTO: a failing step jumps to the cleanup with its status kept; each step runs once. */
static int g_steps;
static dt_status step(dt_status s) {
    g_steps++;
    return s;
}
static dt_status two_steps(dt_status first, dt_status second, bool *cleaned) {
    dt_status s;
    DT_TRY_GOTO(s = step(first), fail);
    DT_TRY_GOTO(s = step(second), fail);
    return DT_OK;
fail:
    *cleaned = true;
    return s;
}
static void test_try_goto(void) {
    bool cleaned = false;
    g_steps = 0;
    CHECK(two_steps(DT_OK, DT_OK, &cleaned) == DT_OK && !cleaned && g_steps == 2);
    g_steps = 0;
    CHECK(two_steps(DT_EIO, DT_OK, &cleaned) == DT_EIO && cleaned && g_steps == 1);
    cleaned = false, g_steps = 0;
    CHECK(two_steps(DT_OK, DT_ENOMEM, &cleaned) == DT_ENOMEM && cleaned && g_steps == 2);
}

/* dt_log_set_sink: each line, with its prefix, reaches the sink instead of stderr, until NULL. */
static char g_line[256];
static int g_lines;
static void keep_line(void *ctx, const char *line) {
    snprintf(g_line, sizeof g_line, "%s%s", (const char *)ctx, line);
    g_lines++;
}

static void test_log_sink(void) {
    dt_log_set_sink(keep_line, "sink: ");
    dt_log(DT_LOG_ERROR, "`batch` %d: need at least 1", 0);
    CHECK_MSG(g_lines == 1 && !strcmp(g_line, "sink: [dtrain] error: `batch` 0: need at least 1"), "%d '%s'", g_lines,
              g_line);
    dt_log_set_sink(NULL, NULL);
    dt_log(DT_LOG_ERROR, "core_test: this line goes to stderr again (dt_log_set_sink(NULL))");
    CHECK(g_lines == 1);
}

int main(void) {
    test_log_sink();
    test_version();
    test_try_goto();
    test_bf16();
    test_f16();
    test_convert();
    test_convert_arrays();
    test_rng();
    test_errors_and_slabs();
    test_path_dir();
    return dt_test_summary("core_test");
}
