/* Tests for the shared decoded data-set cache: one cache file mapped by two processes that open
 * the same IDX directory together, transparent rebuilds of damaged files (payload byte flip,
 * header damage, truncation, wrong magic) and of entries whose sources changed, DTRAIN_DATA_CACHE=0,
 * fallbacks when the directory is unusable, and housekeeping of dead entries. Everything lives
 * in a mkdtemp directory (DTRAIN_DATA_CACHE points into it), removed at the end. */
#include "core/test.h"
#include "dtrain/data.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

static char g_dir[256], g_cache[300], g_data[300], g_img[400], g_lab[400];

static const char *dpath(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_data, name);
    return buf[k];
}

/* Writes a gzip'd (or raw) u8 IDX file with dims (n[, h, w]) and bytes v(i) = (i * mul + seed) & 255. */
static void write_idx(const char *path, int ndim, const uint32_t *dims, unsigned mul, unsigned seed, bool gz) {
    size_t count = 1;
    for (int i = 0; i < ndim; i++) count *= dims[i];
    size_t n = 4 + 4 * (size_t)ndim + count;
    unsigned char *b = malloc(n), *p = b;
    *p++ = 0, *p++ = 0, *p++ = 0x08, *p++ = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++) *p++ = dims[i] >> 24, *p++ = dims[i] >> 16, *p++ = dims[i] >> 8, *p++ = dims[i];
    for (size_t i = 0; i < count; i++) *p++ = (unsigned char)((i * mul + seed) & 255);
    if (gz) {
        gzFile f = gzopen(path, "wb1");
        gzwrite(f, b, (unsigned)n);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
    }
    free(b);
}

/* An images/labels pair: n images of 28x28, pixel bytes (i*7 + seed) & 255, labels i & 255. */
static void write_pair(const char *img, const char *lab, uint32_t n, unsigned seed) {
    uint32_t d[3] = {n, 28, 28};
    write_idx(img, 3, d, 7, seed, true);
    write_idx(lab, 1, d, 1, 0, true);
}

/* Checks every sample and label of ds against write_pair(n, seed). */
static bool data_ok(const dt_dataset *ds, uint32_t n, unsigned seed) {
    if (!ds || dt_dataset_len(ds) != n) return false;
    float *x = malloc(784 * sizeof *x);
    bool ok = true;
    for (uint32_t i = 0; i < n && ok; i++) {
        int32_t y;
        if (dt_dataset_batch(ds, &i, 1, x, &y) != DT_OK || y != (int32_t)(i & 255)) ok = false;
        for (size_t j = 0; j < 784 && ok; j++) {
            size_t e = (size_t)i * 784 + j;
            ok = x[j] == (float)((double)((e * 7 + seed) & 255) / 255.0);
        }
    }
    free(x);
    return ok;
}

/* Number of files in dir whose name ends with suffix (and contains infix, if given). */
static int count_files(const char *dir, const char *infix, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t a = strlen(e->d_name), b = strlen(suffix);
        if (a >= b && !strcmp(e->d_name + a - b, suffix) && (!infix || strstr(e->d_name, infix))) k++;
    }
    closedir(d);
    return k;
}

/* Inode of the mapping of file in /proc/<pid>/maps (0 = none); *deleted when it was unlinked. */
static unsigned long mapped_inode(pid_t pid, const char *file, bool *deleted) {
    char p[64], line[1024];
    snprintf(p, sizeof p, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(p, "r");
    unsigned long ino = 0;
    if (deleted) *deleted = false;
    while (f && fgets(line, sizeof line, f)) {
        char perms[8];
        unsigned long i;
        int off = 0;
        if (sscanf(line, "%*s %7s %*s %*s %lu %n", perms, &i, &off) < 2 || !off) continue;
        if (strncmp(line + off, file, strlen(file)) != 0) continue;
        ino = i;
        if (deleted) *deleted = strstr(line + off, "(deleted)") != NULL;
        if (strcmp(perms, "r--s") != 0) ino = 1; /* must be a read-only shared mapping */
    }
    if (f) fclose(f);
    return ino;
}

static unsigned long inode_of(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (unsigned long)st.st_ino : 0;
}

static void clear_dir(const char *dir) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/* 2>/dev/null", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot clear %s\n", dir);
}

/* Opens the pair, checks it maps a cache file of g_cache, returns that file's inode. */
static unsigned long open_cached(const char *img, const char *lab, uint32_t n, unsigned seed, char *file, size_t cap) {
    dt_dataset *ds = NULL;
    CHECK_OK(dt_dataset_open_idx(&ds, img, lab));
    CHECK_MSG(data_ok(ds, n, seed), "data of %s (seed %u) differs", img, seed);
    const char *cf = ds ? dt_dataset_cache_file(ds) : "";
    CHECK_MSG(!strncmp(cf, g_cache, strlen(g_cache)), "not cached: '%s'", cf);
    snprintf(file, cap, "%s", cf);
    unsigned long ino = mapped_inode(getpid(), cf, NULL);
    CHECK_MSG(ino > 1 && ino == inode_of(cf), "mapping inode %lu, file inode %lu", ino, inode_of(cf));
    dt_dataset_destroy(ds);
    CHECK(!*file || mapped_inode(getpid(), file, NULL) == 0); /* freed: unmapped */
    return ino;
}

static void test_basic_and_dir(void) {
    char file[600];
    write_pair(dpath("train-images-idx3-ubyte.gz"), dpath("train-labels-idx1-ubyte.gz"), 600, 0);
    write_pair(dpath("t10k-images-idx3-ubyte.gz"), dpath("t10k-labels-idx1-ubyte.gz"), 100, 3);
    unsigned long a = open_cached(dpath("train-images-idx3-ubyte.gz"), dpath("train-labels-idx1-ubyte.gz"), 600, 0,
                                  file, sizeof file);
    CHECK(count_files(g_cache, NULL, ".v1") == 1 && count_files(g_cache, NULL, ".lock") == 0);
    struct stat st;
    CHECK(stat(file, &st) == 0 && (st.st_mode & 0777) == 0600 && st.st_size == 4096 + 600 * 784 + 600 * 4);
    /* warm: the same file, not rebuilt */
    unsigned long b = open_cached(dpath("train-images-idx3-ubyte.gz"), dpath("train-labels-idx1-ubyte.gz"), 600, 0,
                                  file, sizeof file);
    CHECK_MSG(a == b, "warm open rebuilt the cache (inode %lu -> %lu)", a, b);
    /* a directory: train and test each get one entry; both stay mapped while open */
    dt_dataset *tr, *te;
    CHECK_OK(dt_dataset_open(&tr, &te, g_data));
    CHECK(tr && te && data_ok(tr, 600, 0) && data_ok(te, 100, 3) && dt_dataset_classes(tr) == 256);
    CHECK(count_files(g_cache, NULL, ".v1") == 2 && count_files(g_cache, ".tmp.", "") == 0);
    CHECK(tr && te && strcmp(dt_dataset_cache_file(tr), dt_dataset_cache_file(te)) != 0);
    CHECK(tr && mapped_inode(getpid(), dt_dataset_cache_file(tr), NULL) == b);
    dt_dataset_destroy(tr);
    dt_dataset_destroy(te);
}

/* Processes open the same directory at the same moment: one decodes, all map one file. The
 * train set is large enough (15 MB) that the opens overlap. */
#define NPROC 3
#define BIG_N 20000
static void test_processes_share(void) {
    clear_dir(g_cache);
    char big[400], img[500], lab[500];
    snprintf(big, sizeof big, "%s/big", g_dir);
    mkdir(big, 0755);
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", big);
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", big);
    write_pair(img, lab, BIG_N, 0);
    snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte", big);
    snprintf(lab, sizeof lab, "%s/t10k-labels-idx1-ubyte", big);
    write_pair(img, lab, 100, 3);
    int go[2], rep[2], rel[2];
    CHECK(pipe(go) == 0 && pipe(rep) == 0 && pipe(rel) == 0);
    pid_t pid[NPROC];
    for (int k = 0; k < NPROC; k++) {
        pid[k] = fork();
        if (pid[k] == 0) {
            char c;
            close(go[1]), close(rep[0]), close(rel[1]);
            if (read(go[0], &c, 1) != 1) _exit(2);
            dt_dataset *tr = NULL, *te = NULL;
            unsigned long ino[2] = {0, 0};
            if (dt_dataset_open(&tr, &te, big) == DT_OK && data_ok(tr, BIG_N, 0) && data_ok(te, 100, 3)) {
                ino[0] = mapped_inode(getpid(), dt_dataset_cache_file(tr), NULL);
                ino[1] = mapped_inode(getpid(), dt_dataset_cache_file(te), NULL);
            }
            if (write(rep[1], ino, sizeof ino) != sizeof ino) _exit(2);
            if (read(rel[0], &c, 1) < 0) _exit(2); /* keep the mapping until the parent looked */
            dt_dataset_destroy(tr);
            dt_dataset_destroy(te);
            _exit(0);
        }
    }
    close(go[0]), close(rep[1]), close(rel[0]);
    CHECK(write(go[1], "ggg", NPROC) == NPROC);
    unsigned long ino[NPROC][2] = {{0}};
    for (int k = 0; k < NPROC; k++) CHECK(read(rep[0], ino[k], sizeof ino[k]) == (ssize_t)sizeof ino[k]);
    /* exactly one cache file per data set, no leftovers, every process maps the published inode */
    CHECK(count_files(g_cache, NULL, ".v1") == 2 && count_files(g_cache, ".tmp.", "") == 0);
    DIR *d = opendir(g_cache);
    struct dirent *e;
    int matched = 0;
    while (d && (e = readdir(d))) {
        if (!strstr(e->d_name, ".v1")) continue;
        char f[600];
        snprintf(f, sizeof f, "%s/%s", g_cache, e->d_name);
        for (int k = 0; k < NPROC; k++) {
            bool deleted;
            unsigned long m = mapped_inode(pid[k], f, &deleted);
            CHECK_MSG(m == inode_of(f) && !deleted, "process %d maps inode %lu%s of %s (file inode %lu)", k, m,
                      deleted ? " (deleted)" : "", f, inode_of(f));
            matched += m == inode_of(f);
        }
    }
    if (d) closedir(d);
    CHECK(matched == 2 * NPROC);
    for (int k = 1; k < NPROC; k++)
        CHECK_MSG(ino[0][0] && ino[k][0] == ino[0][0] && ino[k][1] == ino[0][1],
                  "process %d mapped %lu/%lu, process 0 %lu/%lu", k, ino[k][0], ino[k][1], ino[0][0], ino[0][1]);
    close(rel[1]);
    for (int k = 0; k < NPROC; k++) {
        int status = 0;
        waitpid(pid[k], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    close(go[1]), close(rep[0]);
}

/* Damages the cache file and checks the next open rebuilds it with the right data. */
static void test_corruption(void) {
    const char *img = g_img, *lab = g_lab;
    char file[600];
    static const char *kinds[] = {"payload byte", "label byte", "header byte", "truncated",
                                  "wrong magic",  "grown",      "empty"};
    for (int k = 0; k < 7; k++) {
        unsigned long before = open_cached(img, lab, 600, 0, file, sizeof file);
        int fd = open(file, O_RDWR);
        unsigned char c;
        off_t at = k == 0 ? 4096 + 600 * 784 / 2 : k == 1 ? 4096 + 600 * 784 + 8 * 4 : k == 2 ? 52 : 0;
        if (k <= 2) {
            CHECK(pread(fd, &c, 1, at) == 1);
            c ^= 0x10;
            CHECK(pwrite(fd, &c, 1, at) == 1);
        } else if (k == 3) {
            CHECK(ftruncate(fd, 4096 + 1000) == 0);
        } else if (k == 4) {
            CHECK(pwrite(fd, "XTDCACHE", 8, 0) == 8);
        } else if (k == 5) {
            CHECK(pwrite(fd, "x", 1, 4096 + 600 * 784 + 600 * 4) == 1);
        } else {
            CHECK(ftruncate(fd, 0) == 0);
        }
        close(fd);
        unsigned long after = open_cached(img, lab, 600, 0, file, sizeof file);
        CHECK_MSG(after != before, "%s: not rebuilt", kinds[k]);
        CHECK_MSG(open_cached(img, lab, 600, 0, file, sizeof file) == after, "%s: rebuilt twice", kinds[k]);
        CHECK(count_files(g_cache, ".tmp.", "") == 0);
    }
    /* a symlink planted at the cache path is not followed: private copy, link left alone */
    dt_dataset *ds;
    unlink(file);
    CHECK(symlink(img, file) == 0);
    CHECK_OK(dt_dataset_open_idx(&ds, img, lab));
    CHECK(ds && data_ok(ds, 600, 0) && !strcmp(dt_dataset_cache_file(ds), ""));
    struct stat st;
    CHECK(lstat(file, &st) == 0 && S_ISLNK(st.st_mode));
    dt_dataset_destroy(ds);
    unlink(file);
}

/* A changed source (new mtime, new content, new size, new labels) invalidates its entry. */
static void test_source_changes(void) {
    const char *img = g_img, *lab = g_lab;
    char file[600], file2[600];
    unsigned long a = open_cached(img, lab, 600, 0, file, sizeof file);
    int entries = count_files(g_cache, NULL, ".v1");
    /* touch: same bytes, newer mtime */
    struct timespec ts[2] = {{0, UTIME_OMIT}, {2000000000, 5}};
    CHECK(utimensat(AT_FDCWD, img, ts, 0) == 0);
    unsigned long b = open_cached(img, lab, 600, 0, file2, sizeof file2);
    CHECK_MSG(b != a && !strcmp(file, file2), "touch: inode %lu -> %lu, %s -> %s", a, b, file, file2);
    /* new content of the same size, rewritten in place, mtime set back (cp -p style) */
    write_pair(img, lab, 600, 1);
    CHECK(utimensat(AT_FDCWD, img, ts, 0) == 0);
    unsigned long c = open_cached(img, lab, 600, 1, file2, sizeof file2);
    CHECK(c != b && !strcmp(file, file2));
    /* more images and labels, replaced by rename */
    write_pair(dpath("new-img"), dpath("new-lab"), 700, 2);
    CHECK(rename(dpath("new-img"), img) == 0 && rename(dpath("new-lab"), lab) == 0);
    unsigned long d = open_cached(img, lab, 700, 2, file2, sizeof file2);
    CHECK(d != c && !strcmp(file, file2));
    /* only the label file changes */
    uint32_t dims[1] = {700};
    write_idx(lab, 1, dims, 1, 0, false); /* same labels, now raw: other size and mtime */
    unsigned long e = open_cached(img, lab, 700, 2, file2, sizeof file2);
    CHECK(e != d && !strcmp(file, file2));
    CHECK(count_files(g_cache, NULL, ".v1") == entries &&
          count_files(g_cache, ".tmp.", "") == 0); /* replaced, not added */
    /* a broken source is reported exactly as without the cache, and leaves nothing behind */
    struct stat st;
    stat(img, &st);
    CHECK(truncate(img, st.st_size / 2) == 0);
    dt_dataset *ds = NULL;
    CHECK(dt_dataset_open_idx(&ds, img, lab) == DT_EFORMAT && ds == NULL);
    char with_cache[1024];
    snprintf(with_cache, sizeof with_cache, "%s", dt_last_error());
    CHECK(strstr(with_cache, img) && strstr(with_cache, "truncated"));
    setenv("DTRAIN_DATA_CACHE", "0", 1);
    CHECK(dt_dataset_open_idx(&ds, img, lab) == DT_EFORMAT && !strcmp(dt_last_error(), with_cache));
    setenv("DTRAIN_DATA_CACHE", g_cache, 1);
    CHECK(count_files(g_cache, ".tmp.", "") == 0);
    write_pair(img, lab, 600, 0);
}

/* Opens the pair and expects a private (unmapped) copy with the right data. */
static bool opens_private(const char *img, const char *lab) {
    dt_dataset *ds = NULL;
    bool ok = dt_dataset_open_idx(&ds, img, lab) == DT_OK && data_ok(ds, 600, 0) &&
              !strcmp(dt_dataset_cache_file(ds), "");
    dt_dataset_destroy(ds);
    return ok;
}

static bool no_cache_mapping(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    bool none = true;
    while (f && fgets(line, sizeof line, f)) none = none && !strstr(line, "dtrain-data-");
    if (f) fclose(f);
    return none;
}

static void test_disabled_and_fallbacks(void) {
    const char *img = g_img, *lab = g_lab;
    clear_dir(g_cache);
    /* DTRAIN_DATA_CACHE=0: private, nothing written, nothing mapped */
    setenv("DTRAIN_DATA_CACHE", "0", 1);
    dt_dataset *ds = NULL;
    CHECK_OK(dt_dataset_open_idx(&ds, img, lab));
    CHECK(ds && data_ok(ds, 600, 0) && !strcmp(dt_dataset_cache_file(ds), "") && no_cache_mapping());
    dt_dataset_destroy(ds);
    CHECK(count_files(g_cache, NULL, "") == 2); /* . and .. */
    /* a regular file, or a directory that cannot be created */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/plain-file", g_dir);
    FILE *f = fopen(bad, "w");
    if (f) fclose(f);
    setenv("DTRAIN_DATA_CACHE", bad, 1);
    CHECK(opens_private(img, lab));
    snprintf(bad, sizeof bad, "%s/no/such/dir", g_dir);
    setenv("DTRAIN_DATA_CACHE", bad, 1);
    CHECK(opens_private(img, lab));
    /* a read-only directory; as root (which writes anyway) the check runs as user nobody */
    char ro[700];
    snprintf(ro, sizeof ro, "%s/ro", g_dir);
    CHECK(mkdir(ro, 0555) == 0 || chmod(ro, 0555) == 0);
    setenv("DTRAIN_DATA_CACHE", ro, 1);
    pid_t pid = fork();
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
        _exit(opens_private(img, lab) && no_cache_mapping() ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "read-only dir: child status %d", status);
    CHECK(count_files(ro, NULL, "") == 2);
    /* a file size limit below the entry (as on a full file system): private */
    setenv("DTRAIN_DATA_CACHE", g_cache, 1);
    pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit r = {100000, 100000};
        setrlimit(RLIMIT_FSIZE, &r);
        _exit(opens_private(img, lab) ? 0 : 1);
    }
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "size limit: child status %d", status);
    CHECK(count_files(g_cache, NULL, ".v1") == 0 && count_files(g_cache, ".tmp.", "") == 0);
}

/* Building an entry removes entries whose sources are gone and temp files of dead builders. */
static void test_housekeeping(void) {
    char other[700], img[800], lab[800], file[600];
    clear_dir(g_cache);
    snprintf(other, sizeof other, "%s/gone", g_dir);
    mkdir(other, 0755);
    snprintf(img, sizeof img, "%s/img.gz", other);
    snprintf(lab, sizeof lab, "%s/lab.gz", other);
    write_pair(img, lab, 600, 0);
    open_cached(img, lab, 600, 0, file, sizeof file);
    char orphan[1024];
    snprintf(orphan, sizeof orphan, "%s.tmp.dead01", file); /* its builder "died": lock is free */
    FILE *f = fopen(orphan, "w");
    if (f) fclose(f);
    unlink(img);
    CHECK(count_files(g_cache, NULL, ".v1") == 1 && count_files(g_cache, ".tmp.", "") == 1);
    open_cached(dpath("train-images-idx3-ubyte.gz"), dpath("train-labels-idx1-ubyte.gz"), 600, 0, file, sizeof file);
    CHECK_MSG(count_files(g_cache, NULL, ".v1") == 1 && count_files(g_cache, NULL, ".lock") == 0 &&
                  count_files(g_cache, ".tmp.", "") == 0,
              "%d entries, %d locks, %d temp files", count_files(g_cache, NULL, ".v1"),
              count_files(g_cache, NULL, ".lock"), count_files(g_cache, ".tmp.", ""));
}

static void count_kinds(void *ctx, const dt_cache_file *f) {
    int *k = ctx;
    k[f->kind]++;
    if (f->kind == DT_CACHE_ENTRY) k[3] += f->source[0] == '/';
}

/* Bounds: a failed decode leaves no lock; a lock left by an older dtrain is removed; at most
 * DTRAIN_DATA_CACHE_MAX entries stay; dt_cache_list sees them and dt_cache_clear removes them. */
static void test_bounds(void) {
    clear_dir(g_cache);
    char img[800], lab[800], file[600];
    snprintf(img, sizeof img, "%s/broken-img.gz", g_data);
    snprintf(lab, sizeof lab, "%s/broken-lab.gz", g_data);
    write_pair(img, lab, 50, 0);
    struct stat st;
    stat(img, &st);
    CHECK(truncate(img, st.st_size - 8) == 0); /* no gzip trailer: the decode fails */
    dt_dataset *ds = NULL;
    CHECK(dt_dataset_open_idx(&ds, img, lab) == DT_EFORMAT);
    CHECK_MSG(count_files(g_cache, NULL, ".lock") == 0 && count_files(g_cache, NULL, ".v1") == 0,
              "a failed decode left %d lock(s), %d entries", count_files(g_cache, NULL, ".lock"),
              count_files(g_cache, NULL, ".v1"));
    char stale[700];
    snprintf(stale, sizeof stale, "%s/dtrain-data-0123456789abcdef.lock", g_cache);
    FILE *f = fopen(stale, "w");
    if (f) fclose(f);
    setenv("DTRAIN_DATA_CACHE_MAX", "2", 1);
    for (unsigned k = 0; k < 4; k++) {
        snprintf(img, sizeof img, "%s/b%u-img.gz", g_data, k);
        snprintf(lab, sizeof lab, "%s/b%u-lab.gz", g_data, k);
        write_pair(img, lab, 40 + k, k);
        open_cached(img, lab, 40 + k, k, file, sizeof file);
    }
    unsetenv("DTRAIN_DATA_CACHE_MAX");
    CHECK_MSG(access(stale, F_OK) != 0, "stale lock %s not removed", stale);
    CHECK_MSG(count_files(g_cache, NULL, ".v1") == 2 && access(file, F_OK) == 0,
              "%d entries with DTRAIN_DATA_CACHE_MAX=2", count_files(g_cache, NULL, ".v1"));
    int kinds[4] = {0};
    char dir[512];
    CHECK(dt_cache_list(dir, sizeof dir, count_kinds, kinds) && !strcmp(dir, g_cache));
    CHECK_MSG(kinds[DT_CACHE_ENTRY] == 2 && kinds[3] == 2 && kinds[DT_CACHE_LOCK] == 0 && kinds[DT_CACHE_TEMP] == 0,
              "listed %d entries (%d with a source), %d locks, %d temp", kinds[0], kinds[3], kinds[1], kinds[2]);
    int removed = 0;
    uint64_t bytes = 0;
    dt_cache_clear(&removed, &bytes);
    CHECK_MSG(removed == 2 && bytes > 2 * 40 * 784 && count_files(g_cache, "dtrain-data-", "") == 0,
              "clear removed %d (%llu bytes), %d left", removed, (unsigned long long)bytes,
              count_files(g_cache, "dtrain-data-", ""));
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-cache-test-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    chmod(g_dir, 0755); /* the read-only check may run as another user */
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_dir);
    snprintf(g_data, sizeof g_data, "%s/data", g_dir);
    mkdir(g_cache, 0700);
    mkdir(g_data, 0755);
    snprintf(g_img, sizeof g_img, "%s/train-images-idx3-ubyte.gz", g_data);
    snprintf(g_lab, sizeof g_lab, "%s/train-labels-idx1-ubyte.gz", g_data);
    setenv("DTRAIN_DATA_CACHE", g_cache, 1);
    test_basic_and_dir();
    test_processes_share();
    test_corruption();
    test_source_changes();
    test_disabled_and_fallbacks();
    test_housekeeping();
    test_bounds();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'; rm -rf '%s'", g_dir, g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return dt_test_summary("cache_test");
}
