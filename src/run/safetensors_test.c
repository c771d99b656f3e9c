/* Tests for the safetensors checkpoint layer on the files it writes: round trips of every dtype
 * and odd shapes, metadata, deterministic output, atomic writes that fail cleanly, rejection of
 * corrupted and truncated files (every single-byte flip of a file is caught). Files written by
 * other tools (plain, malformed) are safetensors_plain_test.c.
 * DTRAIN_ST_SAMPLE=path keeps a sample checkpoint there (for tests/ref/read_safetensors.py). */
#include "core/test.h"
#include "dtrain/safetensors.h"
#include "run/safetensors_testlib.h"

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* Number of entries in dir whose name contains ".tmp.". */
static int count_tmp(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

/* ---- the sample checkpoint: several dtypes, a scalar and a zero-sized tensor ---------------- */

static float w0[12], b0[4], scalar = 3.25f;
static uint16_t emb[10], half[3];
static int64_t idx[4] = {-1, 0, (int64_t)1 << 40, 42};
static uint8_t mask[7] = {1, 0, 255, 3, 4, 5, 6};
static int8_t i8[1] = {-7};
static const char *g_meta[][2] = {
    {"model", "mlp:784-128-10"},
    {"step", "1234"},
    {"seed", "42"},
    {"optimizer", "{\"name\":\"adam\",\"lr\":0.001}"},
    {"text", "na\xc3\xafve \"quoted\" \\ tab\tnl\n"},
};
static const struct {
    const char *name;
    dt_dtype dt;
    int nd;
    int64_t shape[3];
    const void *data;
} g_ts[] = {
    {"0.weight", DT_F32, 2, {4, 3}, w0}, {"0.bias", DT_F32, 1, {4}, b0},     {"mask", DT_U8, 1, {7}, mask},
    {"emb", DT_BF16, 2, {2, 5}, emb},    {"half", DT_F16, 1, {3}, half},     {"idx", DT_I64, 2, {2, 2}, idx},
    {"scalar", DT_F32, 0, {0}, &scalar}, {"empty", DT_F32, 2, {3, 0}, NULL}, {"i8", DT_I8, 1, {1}, i8},
};
#define NT ((int)(sizeof g_ts / sizeof *g_ts))
#define NM ((int)(sizeof g_meta / sizeof *g_meta))

static dt_st_writer *sample_writer(void) {
    for (int i = 0; i < 12; i++) w0[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 4; i++) b0[i] = 1.0f / (float)(i + 1);
    for (int i = 0; i < 10; i++) emb[i] = dt_f32_to_bf16((float)i - 4.5f);
    for (int i = 0; i < 3; i++) half[i] = dt_f32_to_f16((float)i * 0.25f);
    dt_st_writer *w = NULL;
    CHECK_OK(dt_st_writer_create(&w));
    for (int i = 0; i < NT; i++)
        CHECK_OK(dt_st_writer_add(w, g_ts[i].name, g_ts[i].dt, g_ts[i].nd, g_ts[i].shape, g_ts[i].data));
    for (int i = 0; i < NM; i++) CHECK_OK(dt_st_writer_meta(w, g_meta[i][0], g_meta[i][1]));
    return w;
}

static void check_sample(const char *path) {
    dt_st_file *f = NULL;
    CHECK_OK(dt_st_open(&f, path));
    if (!f) return;
    CHECK(dt_st_verified(f));
    CHECK(!strcmp(dt_st_path(f), path));
    CHECK(dt_st_count(f) == NT);
    for (int i = 0; i < NT; i++) {
        dt_st_tensor t, a;
        CHECK_OK(dt_st_find(f, g_ts[i].name, &t));
        dt_st_at(f, i, &a);
        CHECK_MSG(!strcmp(a.name, g_ts[i].name), "header order: %s at %d", a.name, i);
        CHECK(t.t.dtype == g_ts[i].dt && t.t.ndim == g_ts[i].nd);
        size_t n = dt_dtype_size(g_ts[i].dt);
        for (int d = 0; d < g_ts[i].nd; d++) {
            CHECK(t.t.shape[d] == g_ts[i].shape[d]);
            n *= (size_t)g_ts[i].shape[d];
        }
        CHECK_MSG(t.nbytes == n && (n == 0 || !memcmp(t.t.data, g_ts[i].data, n)), "tensor %s data", g_ts[i].name);
        CHECK_MSG((uintptr_t)t.t.data % dt_dtype_size(t.t.dtype) == 0, "tensor %s misaligned", g_ts[i].name);
    }
    dt_st_tensor t;
    CHECK(dt_st_find(f, "nope", &t) == DT_ENOENT && strstr(dt_last_error(), "'nope'") && strstr(dt_last_error(), path));
    for (int i = 0; i < NM; i++)
        CHECK_MSG(dt_st_meta(f, g_meta[i][0]) && !strcmp(dt_st_meta(f, g_meta[i][0]), g_meta[i][1]), "meta %s",
                  g_meta[i][0]);
    CHECK(dt_st_meta(f, "missing") == NULL);
    CHECK(!strcmp(dt_st_meta(f, "dtrain.format"), DT_ST_FORMAT) &&
          !strcmp(dt_st_meta(f, "dtrain.format_version"), "1"));
    /* user keys first in their order, then format, version, one CRC per tensor, header CRC */
    CHECK(dt_st_meta_count(f) == NM + 2 + NT + 1);
    const char *k;
    CHECK(!strcmp(dt_st_meta_at(f, 1, &k), "1234") && !strcmp(k, "step"));
    CHECK(dt_st_meta_at(f, dt_st_meta_count(f), &k) == NULL && k == NULL);
    dt_st_destroy(f);
}

static void test_roundtrip(void) {
    dt_st_writer *w = sample_writer();
    const char *p = st_path("a.safetensors"), *q = st_path("b.safetensors");
    CHECK_OK(dt_st_writer_write(w, p));
    check_sample(p);
    CHECK_OK(dt_st_writer_write(w, q)); /* the writer is reusable and its output deterministic */
    size_t na, nb, total = 0;
    unsigned char *a = st_read_all(p, &na), *b = st_read_all(q, &nb);
    CHECK(a && b && na == nb && !memcmp(a, b, na));
    /* layout: 8-aligned header starting '{', data section exactly the tensors (no holes) */
    uint64_t N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | a[i];
    for (int i = 0; i < NT; i++) {
        size_t n = dt_dtype_size(g_ts[i].dt);
        for (int d = 0; d < g_ts[i].nd; d++) n *= (size_t)g_ts[i].shape[d];
        total += n;
    }
    CHECK(N % 8 == 0 && a[8] == '{' && na == 8 + N + total);
    const char *keep = getenv("DTRAIN_ST_SAMPLE");
    if (keep) CHECK_OK(dt_st_writer_write(w, keep));
    /* overwriting an existing file with new contents */
    dt_st_writer *w2 = NULL;
    float v = 7;
    CHECK_OK(dt_st_writer_create(&w2));
    CHECK_OK(dt_st_writer_add(w2, "only", DT_F32, 0, NULL, &v));
    CHECK_OK(dt_st_writer_write(w2, p));
    dt_st_file *f = NULL;
    dt_st_tensor t;
    CHECK_OK(dt_st_open(&f, p));
    CHECK(f && dt_st_count(f) == 1 && dt_st_find(f, "only", &t) == DT_OK && *(float *)t.t.data == 7.0f);
    dt_st_destroy(f);
    /* an empty checkpoint (no tensors, no user metadata) is valid too */
    dt_st_writer *w3 = NULL;
    CHECK_OK(dt_st_writer_create(&w3));
    CHECK_OK(dt_st_writer_write(w3, q));
    CHECK_OK(dt_st_open(&f, q));
    CHECK(f && dt_st_count(f) == 0 && dt_st_verified(f));
    dt_st_destroy(f);
    CHECK(count_tmp(st_dir) == 0);
    dt_st_writer_destroy(w);
    dt_st_writer_destroy(w2);
    dt_st_writer_destroy(w3);
    dt_st_writer_destroy(NULL);
    dt_st_destroy(NULL);
    free(a);
    free(b);
}

static void test_writer_args(void) {
    dt_st_writer *w = NULL;
    float x[2] = {0};
    int64_t sh[7] = {1, 1, 1, 1, 1, 1, 1}, neg = -1;
    CHECK_OK(dt_st_writer_create(&w));
    CHECK_OK(dt_st_writer_add(w, "x", DT_F32, 1, (int64_t[]){2}, x));
    CHECK(dt_st_writer_add(w, "x", DT_F32, 1, (int64_t[]){2}, x) == DT_EINVAL && strstr(dt_last_error(), "twice"));
    CHECK(dt_st_writer_add(w, "", DT_F32, 0, NULL, x) == DT_EINVAL);
    CHECK(dt_st_writer_add(w, "__metadata__", DT_F32, 0, NULL, x) == DT_EINVAL);
    CHECK(dt_st_writer_add(w, "y", DT_F32, 7, sh, x) == DT_EINVAL && strstr(dt_last_error(), "ndim 7"));
    CHECK(dt_st_writer_add(w, "y", DT_F32, 1, &neg, x) == DT_EINVAL && strstr(dt_last_error(), "'y'"));
    CHECK(dt_st_writer_add(w, "y", DT_F32, 1, (int64_t[]){2}, NULL) == DT_EINVAL);
    CHECK(dt_st_writer_add(w, "y", DT_DTYPE_COUNT, 1, (int64_t[]){2}, x) == DT_EINVAL);
    CHECK(dt_st_writer_meta(w, "dtrain.format", "x") == DT_EINVAL && strstr(dt_last_error(), "reserved"));
    CHECK(dt_st_writer_meta(w, "dtrain.crc32.x", "x") == DT_EINVAL);
    CHECK(dt_st_writer_meta(w, "dtrain.header_crc32", "x") == DT_EINVAL);
    CHECK_OK(dt_st_writer_meta(w, "dtrain.version", "0.1.0")); /* other dtrain.* keys are fine */
    CHECK(dt_st_writer_meta(w, "dtrain.version", "0.1.1") == DT_EINVAL);
    /* the reserved text inside a value is escaped in JSON, so it cannot be mistaken for the key */
    const char *tricky = "see \"dtrain.header_crc32\":\"x";
    CHECK_OK(dt_st_writer_meta(w, "note", tricky));
    const char *p = st_path("args.safetensors");
    CHECK_OK(dt_st_writer_write(w, p));
    dt_st_file *f = NULL;
    CHECK_OK(dt_st_open(&f, p));
    CHECK(f && dt_st_verified(f) && !strcmp(dt_st_meta(f, "note"), tricky));
    dt_st_destroy(f);
    /* but a key ending in it prints as ..."dtrain.header_crc32":"...: refused at write time */
    CHECK_OK(dt_st_writer_meta(w, "x\"dtrain.header_crc32", "v"));
    const char *q = st_path("args2.safetensors");
    CHECK(dt_st_writer_write(w, q) == DT_EINVAL && strstr(dt_last_error(), q) && access(q, F_OK) != 0);
    CHECK(count_tmp(st_dir) == 0);
    dt_st_writer_destroy(w);
}

/* A failed write leaves the previous file byte-for-byte intact and no temp file behind. */
static void test_atomic(void) {
    const char *p = st_path("keep.safetensors");
    dt_st_writer *w = sample_writer(), *big = NULL;
    CHECK_OK(dt_st_writer_write(w, p));
    size_t n0, n1;
    unsigned char *before = st_read_all(p, &n0), *after;
    static float payload[16384];
    CHECK_OK(dt_st_writer_create(&big));
    CHECK_OK(dt_st_writer_add(big, "payload", DT_F32, 1, (int64_t[]){16384}, payload));

    const char *nodir = st_path("no/such/dir/x.safetensors");
    CHECK(dt_st_writer_write(big, nodir) == DT_ENOENT && strstr(dt_last_error(), nodir));

    /* the temp name is taken by a directory: creating the temp file fails */
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    CHECK(mkdir(tmp, 0755) == 0);
    CHECK(dt_st_writer_write(big, p) == DT_EIO && strstr(dt_last_error(), "temporary"));
    CHECK(rmdir(tmp) == 0);

    /* the disk "fills up" half way (RLIMIT_FSIZE): write fails after the temp file exists */
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 8192;
    void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    dt_status s = dt_st_writer_write(big, p);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, oldsig);
    CHECK_MSG(s == DT_EIO && strstr(dt_last_error(), "write failed"), "%s", dt_last_error());

    /* the target is a directory: refused before a temp file is made (a rename would fail, or
     * replace an empty one) */
    const char *dirp = st_path("isdir");
    CHECK(mkdir(dirp, 0755) == 0);
    st_write_all(st_path("isdir/x"), "x", 1);
    CHECK(dt_st_writer_write(big, dirp) == DT_EINVAL && strstr(dt_last_error(), "not a regular file"));
    CHECK(count_tmp(st_dir) == 0);

    /* a directory we may not write to (root ignores permissions, so only as a normal user) */
    if (geteuid() != 0) {
        const char *ro = st_path("ro");
        CHECK(mkdir(ro, 0755) == 0);
        const char *rop = st_path("ro/x.safetensors");
        CHECK_OK(dt_st_writer_write(w, rop));
        CHECK(chmod(ro, 0555) == 0);
        CHECK(dt_st_writer_write(big, rop) == DT_EIO && strstr(dt_last_error(), rop));
        chmod(ro, 0755);
        check_sample(rop);
        CHECK(count_tmp(ro) == 0);
    } else {
        printf("note: running as root, the read-only-directory case is not exercised\n");
    }

    after = st_read_all(p, &n1);
    CHECK(after && n0 == n1 && !memcmp(before, after, n0));
    check_sample(p);
    CHECK(count_tmp(st_dir) == 0);
    free(before);
    free(after);
    dt_st_writer_destroy(w);
    dt_st_writer_destroy(big);
}

/* Writes b with byte i xor m to path. */
static void write_flipped(const char *path, const unsigned char *b, size_t n, size_t i, unsigned char m) {
    unsigned char *c = malloc(n);
    memcpy(c, b, n);
    c[i] ^= m;
    st_write_all(path, c, n);
    free(c);
}

/* Every problem is DT_EFORMAT with the file name and the specific reason. */
static void test_corruption(void) {
    const char *good = st_path("good.safetensors"), *bad = st_path("bad.safetensors");
    dt_st_writer *w = sample_writer();
    CHECK_OK(dt_st_writer_write(w, good));
    dt_st_writer_destroy(w);
    size_t n;
    unsigned char *b = st_read_all(good, &n);
    uint64_t N = 0;
    for (int i = 7; i >= 0; i--) N = N << 8 | b[i];

    /* one flipped byte in the data of tensor 'emb' */
    const unsigned char *e = memmem(b + 8 + N, n - 8 - N, emb, sizeof emb);
    CHECK(e != NULL);
    if (e) {
        write_flipped(bad, b, n, (size_t)(e - b) + 3, 0x10);
        ST_EXPECT_BAD(bad, DT_EFORMAT, "tensor 'emb' fails its CRC32 check");
        ST_EXPECT_BAD(bad, DT_EFORMAT, "use an earlier checkpoint");
    }
    /* one flipped byte in the header: a digit of the "step" value, then a padding space */
    const unsigned char *st = memmem(b + 8, N, "\"1234\"", 6);
    CHECK(st != NULL);
    if (st) {
        write_flipped(bad, b, n, (size_t)(st - b) + 2, 0x01);
        ST_EXPECT_BAD(bad, DT_EFORMAT, "header fails its CRC32 check");
    }
    CHECK(b[8 + N - 1] == ' ' || b[8 + N - 1] == '}');
    write_flipped(bad, b, n, 8 + N - 1, 0x01);
    ST_EXPECT_BAD(bad, DT_EFORMAT, "header");

    /* exhaustive: every single-byte flip anywhere in the file is rejected */
    int missed = 0, checked = 0;
    const unsigned char masks[] = {0x01, 0x80, 0xff};
    for (size_t i = 0; i < n; i++)
        for (size_t m = 0; m < sizeof masks; m++) {
            write_flipped(bad, b, n, i, masks[m]);
            dt_st_file *g = NULL;
            dt_status s = dt_st_open(&g, bad);
            checked++;
            if (s != DT_EFORMAT || !strstr(dt_last_error(), bad)) {
                if (!missed)
                    fprintf(stderr, "flip byte %zu ^ %02x: %s: %s\n", i, masks[m], dt_status_str(s), dt_last_error());
                missed++;
            }
            dt_st_destroy(g);
        }
    CHECK_MSG(missed == 0, "%d of %d single-byte flips not rejected", missed, checked);
    printf("corruption: %d of %d single-byte flips over %zu bytes rejected\n", checked - missed, checked, n);

    /* truncation at many points */
    struct {
        size_t len;
        const char *why;
    } cuts[] = {
        {0, "shorter than the 8-byte header length"},
        {5, "shorter than the 8-byte header length"},
        {8, "runs past the end"},
        {8 + N / 2, "runs past the end"},
        {8 + N - 1, "runs past the end"},
        {8 + N, "(file truncated)"},
        {8 + N + 1, "(file truncated)"},
        {n - 1, "(file truncated)"},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        st_write_all(bad, b, cuts[i].len);
        ST_EXPECT_BAD(bad, DT_EFORMAT, cuts[i].why);
    }
    /* bytes appended after the last tensor's data (a file grown by another write) */
    unsigned char *grown = malloc(n + 100);
    memcpy(grown, b, n), memset(grown + n, 0, 100);
    st_write_all(bad, grown, n + 100);
    ST_EXPECT_BAD(bad, DT_EFORMAT, "100 bytes follow the end of the last tensor's data");
    st_write_all(bad, grown, n + 1);
    ST_EXPECT_BAD(bad, DT_EFORMAT, "1 bytes follow the end");
    free(grown);
    /* wrong header lengths */
    struct {
        uint64_t len;
        const char *why;
    } lens[] = {
        {n, "runs past the end"}, {200000000, "absurd"}, {0, "too small"},
        {1, "too small"},         {N - 8, "header"},     {N + 8, "header fails its CRC32"},
        {UINT64_MAX, "absurd"},
    };
    unsigned char *c = malloc(n);
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        memcpy(c, b, n);
        for (int k = 0; k < 8; k++) c[k] = (unsigned char)(lens[i].len >> (8 * k));
        st_write_all(bad, c, n);
        ST_EXPECT_BAD(bad, DT_EFORMAT, lens[i].why);
    }
    free(c);
    free(b);
    ST_EXPECT_BAD(st_path("absent.safetensors"), DT_ENOENT, "cannot open");
}

int main(void) {
    if (st_dir_make("/tmp/dt_st_test.XXXXXX") != 0) return 2;
    test_roundtrip();
    test_writer_args();
    test_atomic();
    test_corruption();
    st_dir_remove();
    return dt_test_summary("safetensors_test");
}
