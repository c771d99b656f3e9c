/* The shared decoded data-set cache: an IDX images/labels pair is decoded once into a file under
 * /dev/shm (or $DTRAIN_DATA_CACHE) and every process of the machine maps that one read-only copy
 * instead of holding its own. Layout, keying and rebuild rules are documented in data.h. A
 * failure of the cache itself (disabled, no directory, not writable, full, lock wait too long)
 * falls back to private decoding with an info log line: it never fails a run. */
#include "data/data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define CACHE_MAGIC "DTDCACHE"
#define CACHE_VERSION 1
#define CACHE_HDR 4096          /* header page; samples start page-aligned after it */
#define CACHE_PATH 1024         /* longest source path recorded (longer: no cache) */
#define CACHE_FP 65536          /* bytes at each end of a source file that are fingerprinted */
#define CACHE_LOCK_WAIT_S 300.0 /* then decode privately instead of waiting for the builder */
#define DT_CACHE_DEFAULT_MAX 8  /* entries kept per user (DTRAIN_DATA_CACHE_MAX) */

/* Identity of one source file: a changed, replaced or rewritten file no longer matches. */
typedef struct {
    char path[CACHE_PATH];      /* canonical path, zero padded */
    uint64_t size, mtime_ns, ctime_ns, ino, dev;
    uint32_t head_crc, tail_crc; /* CRC32 of the first and last 64 KiB (a gzip trailer holds the
                                  * CRC and size of all the data) */
} cache_src;

/* The header at offset 0 of a cache file; host byte order, no padding holes. */
typedef struct {
    char magic[8];
    uint32_t version, byte_order, header_bytes, idx_type; /* idx_type: IDX code of the samples */
    uint32_t C, H, W, reserved;
    uint64_t n, x_off, x_bytes, y_off, y_bytes, file_bytes; /* samples, then n int32 labels */
    cache_src src[2];                                        /* images, labels */
    uint32_t payload_crc;                                    /* CRC32 of bytes [x_off, file_bytes) */
    uint32_t header_crc;                                     /* CRC32 of this struct, field = 0 */
} cache_header;

_Static_assert(sizeof(cache_header) <= CACHE_HDR, "cache header must fit its page");

static const struct { unsigned code; dt_dtype t; } g_types[] = {
    {0x08, DT_U8}, {0x09, DT_I8}, {0x0B, DT_I16}, {0x0C, DT_I32}, {0x0D, DT_F32}, {0x0E, DT_F64}};

static bool type_of_code(unsigned code, dt_dtype *t) {
    for (size_t i = 0; i < sizeof g_types / sizeof *g_types; i++)
        if (g_types[i].code == code) return *t = g_types[i].t, true;
    return false;
}

static unsigned code_of_type(dt_dtype t) {
    for (size_t i = 0; i < sizeof g_types / sizeof *g_types; i++)
        if (g_types[i].t == t) return g_types[i].code;
    return 0;
}

static uint32_t crc_bytes(uint32_t crc, const void *p, size_t n) {
    const unsigned char *b = p;
    while (n) {
        unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
        crc = (uint32_t)crc32(crc, b, chunk);
        b += chunk, n -= chunk;
    }
    return crc;
}

static uint32_t header_crc(const cache_header *h) {
    cache_header c = *h;
    c.header_crc = 0;
    return crc_bytes(0, &c, sizeof c);
}

static uint64_t align64(uint64_t v) { return (v + 63) & ~(uint64_t)63; }

/* The cache directory, or false when the cache is off (DTRAIN_DATA_CACHE=0). */
bool dt_cache_dir(char *dir, size_t cap) {
    const char *env = getenv("DTRAIN_DATA_CACHE");
    if (env && !strcmp(env, "0")) return false;
    const char *d = env && *env && strcmp(env, "1") ? env : "/dev/shm";
    if (strlen(d) + 64 >= cap) {
        dt_log(DT_LOG_INFO, "data cache: directory name %s is too long: decoding privately", d);
        return false;
    }
    snprintf(dir, cap, "%s", d);
    struct stat st;
    if (stat(dir, &st) != 0 && errno == ENOENT && mkdir(dir, 0700) != 0 && errno != EEXIST) {
        dt_log(DT_LOG_INFO, "data cache: cannot create %s (%s): decoding privately", dir, strerror(errno));
        return false;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        dt_log(DT_LOG_INFO, "data cache: %s is not a directory: decoding privately", dir);
        return false;
    }
    return true;
}

/* Fills the identity of a source file; false when it cannot be read (the private path then
 * reports the problem) or its path is too long to record. */
static bool source_ident(cache_src *o, const char *path) {
    char *rp = realpath(path, NULL);
    if (!rp) return false;
    size_t len = strlen(rp);
    if (len >= CACHE_PATH) {
        free(rp);
        return false;
    }
    memcpy(o->path, rp, len);
    free(rp);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return false;
    bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (ok) {
        o->size = (uint64_t)st.st_size;
        o->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
        o->ctime_ns = (uint64_t)st.st_ctim.tv_sec * 1000000000u + (uint64_t)st.st_ctim.tv_nsec;
        o->ino = (uint64_t)st.st_ino;
        o->dev = (uint64_t)st.st_dev;
        unsigned char *buf = malloc(CACHE_FP);
        size_t k = o->size < CACHE_FP ? (size_t)o->size : CACHE_FP;
        ok = buf && pread(fd, buf, k, 0) == (ssize_t)k;
        if (ok) o->head_crc = crc_bytes(0, buf, k);
        ok = ok && pread(fd, buf, k, (off_t)(o->size - k)) == (ssize_t)k;
        if (ok) o->tail_crc = crc_bytes(0, buf, k);
        free(buf);
    }
    close(fd);
    return ok;
}

/* Checks a header read from a file of file_bytes bytes against the wanted sources; on a
 * mismatch writes why into why and returns false. */
static bool header_ok(const cache_header *h, const cache_header *want, uint64_t file_bytes, char *why, size_t cap) {
    dt_dtype t;
    if (memcmp(h->magic, CACHE_MAGIC, 8) != 0) return snprintf(why, cap, "wrong magic"), false;
    if (h->version != CACHE_VERSION || h->byte_order != 0x01020304u || h->header_bytes != CACHE_HDR)
        return snprintf(why, cap, "version %u, not %d", h->version, CACHE_VERSION), false;
    if (h->header_crc != header_crc(h)) return snprintf(why, cap, "header checksum mismatch"), false;
    for (int i = 0; i < 2; i++)
        if (memcmp(&h->src[i], &want->src[i], sizeof h->src[i]) != 0)
            return snprintf(why, cap, "%s changed since the cache was built", want->src[i].path), false;
    if (!type_of_code(h->idx_type, &t) || h->n == 0 || h->n > UINT32_MAX || !h->C || !h->H || !h->W)
        return snprintf(why, cap, "bad type or shape"), false;
    uint64_t D = (uint64_t)h->C * h->H * h->W;
    if (D > UINT64_MAX / 8 / h->n || h->x_off != CACHE_HDR || h->x_bytes != h->n * D * dt_dtype_size(t) ||
        h->y_off != align64(h->x_off + h->x_bytes) || h->y_bytes != h->n * 4 || h->file_bytes != h->y_off + h->y_bytes)
        return snprintf(why, cap, "inconsistent sizes"), false;
    if (h->file_bytes != file_bytes)
        return snprintf(why, cap, "file holds %llu bytes, header says %llu", (unsigned long long)file_bytes,
                        (unsigned long long)h->file_bytes), false;
    return true;
}

/* Views a validated mapping as a data set (labels checked as the private path does). */
static dt_status dataset_over(dt_dataset **out, void *map, const cache_header *h, const char *images_path, const char *labels_path,
                              const char *file) {
    dt_dataset *ds = dt_dataset_alloc();
    if (!ds) {
        munmap(map, h->file_bytes);
        return DT_ENOMEM;
    }
    dt_idx im = {.ndim = 1, .dims = {(int64_t)h->n}};
    type_of_code(h->idx_type, &im.dtype);
    dt_dataset_init_idx(ds, &im, (int)h->C, (int)h->H, (int)h->W, images_path);
    ds->map = map;
    ds->map_len = h->file_bytes;
    ds->x = (char *)map + h->x_off;
    ds->y = (int32_t *)(void *)((char *)map + h->y_off);
    snprintf(ds->cache, sizeof ds->cache, "%s", file);
    dt_status st = dt_dataset_check_labels(ds, 0, labels_path);
    if (st != DT_OK) {
        dt_dataset_free(ds);
        return st;
    }
    dt_dataset_update_lut(ds);
    *out = ds;
    return DT_OK;
}

enum { MAP_OK, MAP_ABSENT, MAP_STALE, MAP_UNUSABLE };

/* Maps an existing cache file read-only after checking its header, sources and checksum. */
static int map_existing(const char *file, const cache_header *want, void **map, cache_header *h, char *why, size_t cap) {
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(why, cap, "%s", strerror(errno));
        return errno == ENOENT ? MAP_ABSENT : MAP_UNUSABLE;
    }
    struct stat st;
    int rc = MAP_STALE;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        snprintf(why, cap, "not a regular file of this user");
        rc = MAP_UNUSABLE;
    } else if (pread(fd, h, sizeof *h, 0) != (ssize_t)sizeof *h) {
        snprintf(why, cap, "truncated header");
    } else if (header_ok(h, want, (uint64_t)st.st_size, why, cap)) {
        void *m = mmap(NULL, h->file_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (m == MAP_FAILED) {
            snprintf(why, cap, "mmap: %s", strerror(errno));
            rc = MAP_UNUSABLE;
        } else if (crc_bytes(0, (char *)m + h->x_off, h->file_bytes - h->x_off) != h->payload_crc) {
            snprintf(why, cap, "payload checksum mismatch");
            munmap(m, h->file_bytes);
        } else {
            *map = m;
            rc = MAP_OK;
        }
    }
    close(fd);
    return rc;
}

/* True when fd (locked) is still the file at path: the holder before us may have removed it. */
static bool lock_is_current(int fd, const char *path) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

/* Takes the builder lock of one cache entry; -1 (logged) when it cannot. Waits by sleeping, up to
 * CACHE_LOCK_WAIT_S; a builder that dies releases it. The lock file exists only while someone
 * holds it: its holder removes it before letting go (unlock_entry), so failed decodes and
 * finished builds leave no .lock behind; a waiter that then gets the lock of a removed file
 * starts over on a fresh one. */
static int lock_entry(const char *lockfile) {
    double t0 = dt_now();
    long sleep_ns = 1000000;
    int fd = -1;
    for (;;) {
        if (fd < 0 && (fd = open(lockfile, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0) {
            dt_log(DT_LOG_INFO, "data cache: cannot create %s (%s): decoding privately", lockfile, strerror(errno));
            return -1;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            if (lock_is_current(fd, lockfile)) return fd;
            close(fd); /* removed by the holder before us: lock the new one */
            fd = -1;
            continue;
        }
        if (errno != EWOULDBLOCK && errno != EINTR) {
            dt_log(DT_LOG_INFO, "data cache: cannot lock %s (%s): decoding privately", lockfile, strerror(errno));
            break;
        }
        if (dt_now() - t0 > CACHE_LOCK_WAIT_S) {
            dt_log(DT_LOG_INFO, "data cache: %s has been held for %.0f s by another process: decoding privately", lockfile,
                   CACHE_LOCK_WAIT_S);
            break;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 50000000) sleep_ns *= 2;
    }
    close(fd);
    return -1;
}

/* Removes the lock file, then releases it (see lock_entry). */
static void unlock_entry(const char *lockfile, int fd) {
    unlink(lockfile);
    close(fd);
}

/* Removes path when it is a lock file nobody holds (left by a dtrain before this rule). */
static void remove_if_stale_lock(const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        lock_is_current(fd, path))
        unlink(path);
    close(fd);
}

/* Most entries of this user kept in the cache directory (DTRAIN_DATA_CACHE_MAX, default 8): a
 * new build removes the least recently opened ones beyond it. */
static int max_entries(void) {
    const char *e = getenv("DTRAIN_DATA_CACHE_MAX");
    int v = e && *e ? atoi(e) : DT_CACHE_DEFAULT_MAX;
    return v >= 1 ? v : DT_CACHE_DEFAULT_MAX;
}

/* Removes this user's oldest entries (by last open) so that at most max_entries() - 1 remain
 * besides `name`, the one being built. Processes that map a removed entry keep working. */
static void bound_entries(const char *dir, const char *name) {
    enum { CAP = 256 };
    struct { char f[64]; double t; } *v = calloc(CAP, sizeof *v);
    DIR *d = v ? opendir(dir) : NULL;
    if (!d) {
        free(v);
        return;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < CAP) {
        size_t flen = strlen(e->d_name);
        struct stat st;
        if (strncmp(e->d_name, "dtrain-data-", 12) || flen < 4 || flen >= 64 || strcmp(e->d_name + flen - 3, ".v1") ||
            !strcmp(e->d_name, name) || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            st.st_uid != geteuid())
            continue;
        memcpy(v[n].f, e->d_name, flen + 1); /* flen < 64 = sizeof v[n].f (checked above) */
        v[n++].t = (double)st.st_atim.tv_sec + st.st_atim.tv_nsec * 1e-9;
    }
    for (int keep = max_entries() - 1; n > keep; n--) {
        int oldest = 0;
        for (int i = 1; i < n; i++)
            if (v[i].t < v[oldest].t) oldest = i;
        dt_log(DT_LOG_INFO, "data cache: removing %s/%s (more than %d entries; DTRAIN_DATA_CACHE_MAX)", dir,
               v[oldest].f, max_entries());
        unlinkat(dirfd(d), v[oldest].f, 0);
        v[oldest] = v[n - 1];
    }
    closedir(d);
    free(v);
}

/* Housekeeping while building (rare): removes this entry's leftover temp files (we hold its lock,
 * so their builders died), other entries' leftovers whose lock is free or gone, lock files
 * nobody holds, this user's entries whose source files no longer exist, and the oldest entries
 * beyond DTRAIN_DATA_CACHE_MAX. */
static void collect_garbage(const char *dir, const char *name) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[PATH_MAX], base[PATH_MAX];
    size_t nlen = strlen(name);
    for (int pass = 0; pass < 2; pass++, rewinddir(d)) /* temp files first: the locks still exist */
        while ((e = readdir(d))) {
            const char *f = e->d_name, *tmp = strstr(f, ".v1.tmp.");
            size_t flen = strlen(f);
            if (strncmp(f, "dtrain-data-", 12) != 0 || snprintf(path, sizeof path, "%s/%s", dir, f) >= (int)sizeof path) continue;
            if (pass == 0 && tmp) {
                if (!strncmp(f, name, nlen) && !strncmp(f + nlen, ".tmp.", 5)) {
                    unlink(path);
                    continue;
                }
                /* a builder holds the lock file for as long as its temp file exists */
                snprintf(base, sizeof base, "%s/%.*s.lock", dir, (int)(tmp - f), f);
                int lfd = open(base, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
                if (lfd < 0 ? errno == ENOENT : flock(lfd, LOCK_EX | LOCK_NB) == 0) unlink(path);
                if (lfd >= 0) close(lfd);
            }
            if (pass == 0 && flen > 5 && !strcmp(f + flen - 5, ".lock") && strncmp(f, name, nlen - 3) != 0)
                remove_if_stale_lock(path);
            if (pass == 0 || flen < 4 || strcmp(f + flen - 3, ".v1") != 0 || !strncmp(f, name, nlen)) continue;
            int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
            if (fd < 0) continue;
            cache_header h;
            struct stat st;
            bool gone = false;
            if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h &&
                !memcmp(h.magic, CACHE_MAGIC, 8) && h.version == CACHE_VERSION && h.header_crc == header_crc(&h)) {
                struct stat s2;
                for (int i = 0; i < 2; i++)
                    if (h.src[i].path[CACHE_PATH - 1] == '\0' && stat(h.src[i].path, &s2) != 0 && errno == ENOENT) gone = true;
            }
            close(fd);
            if (gone) {
                unlink(path);
                snprintf(base, sizeof base, "%s/%.*s.lock", dir, (int)(flen - 3), f);
                remove_if_stale_lock(base);
            }
        }
    closedir(d);
    bound_entries(dir, name);
}

/* Decodes the pair into a new cache file and publishes it as file (lock held). DT_OK with
 * *map NULL when the cache cannot take it; other statuses are errors in the data files. */
static dt_status build(const char *dir, const char *file, cache_header *h, const char *images_path, const char *labels_path,
                       void **map, bool *published) {
    *map = NULL;
    *published = false;
    dt_stream s;
    dt_idx im, lb;
    DT_TRY(dt_idx_open_header(&s, images_path, &im));
    dt_status st = dt_idx_read(labels_path, &lb);
    if (st != DT_OK) {
        dt_stream_close(&s);
        return st;
    }
    int C, H, W;
    char tmp[PATH_MAX + 16];
    int fd = -1;
    void *m = MAP_FAILED;
    if ((st = dt_idx_pair_shape(&im, &lb, images_path, labels_path, &C, &H, &W)) != DT_OK) goto out;
    h->idx_type = code_of_type(im.dtype);
    h->C = (uint32_t)C, h->H = (uint32_t)H, h->W = (uint32_t)W;
    h->n = (uint64_t)im.dims[0];
    h->x_off = CACHE_HDR;
    h->x_bytes = im.count * dt_dtype_size(im.dtype);
    h->y_off = align64(h->x_off + h->x_bytes);
    h->y_bytes = h->n * 4;
    h->file_bytes = h->y_off + h->y_bytes;

    struct statvfs vfs;
    struct rlimit fsz;
    if (statvfs(dir, &vfs) == 0 && vfs.f_blocks > 0 &&
        (double)vfs.f_bavail * vfs.f_frsize < (double)h->file_bytes + (double)vfs.f_blocks * vfs.f_frsize / 4) {
        dt_log(DT_LOG_INFO, "data cache: a %.1f MB entry would leave less than a quarter of %s free: decoding privately",
               (double)h->file_bytes / 1e6, dir);
        goto out;
    }
    if (getrlimit(RLIMIT_FSIZE, &fsz) == 0 && fsz.rlim_cur != RLIM_INFINITY && fsz.rlim_cur < h->file_bytes) {
        dt_log(DT_LOG_INFO, "data cache: file size limit (ulimit -f) is below %.1f MB: decoding privately", (double)h->file_bytes / 1e6);
        goto out;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", file);
    if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
        dt_log(DT_LOG_INFO, "data cache: cannot create a file in %s (%s): decoding privately", dir, strerror(errno));
        goto out;
    }
    int e = posix_fallocate(fd, 0, (off_t)h->file_bytes); /* reserve now: no SIGBUS when full */
    if (e != 0) {
        dt_log(DT_LOG_INFO, "data cache: cannot reserve %.1f MB in %s (%s): decoding privately", (double)h->file_bytes / 1e6, dir,
               strerror(e));
        goto out;
    }
    m = mmap(NULL, h->file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
        dt_log(DT_LOG_INFO, "data cache: cannot map %s (%s): decoding privately", tmp, strerror(errno));
        goto out;
    }
    st = dt_idx_read_body(&s, &im, (char *)m + h->x_off);
    if (st != DT_OK) goto out;
    dt_convert((char *)m + h->y_off, DT_I32, lb.data, lb.dtype, h->n);
    h->payload_crc = crc_bytes(0, (char *)m + h->x_off, h->file_bytes - h->x_off);
    h->header_crc = header_crc(h);
    memcpy(m, h, sizeof *h);
    mprotect(m, h->file_bytes, PROT_READ);
    if (rename(tmp, file) == 0) {
        *published = true;
    } else {
        dt_log(DT_LOG_INFO, "data cache: cannot publish %s (%s): this process keeps an unshared copy", file, strerror(errno));
        unlink(tmp);
    }
    tmp[0] = '\0';
    *map = m;
    m = MAP_FAILED;
out:
    dt_stream_close(&s);
    if (m != MAP_FAILED) munmap(m, h->file_bytes);
    if (fd >= 0) {
        if (tmp[0]) unlink(tmp);
        close(fd);
    }
    dt_idx_free(&lb);
    return st;
}

dt_status dt_cache_open_idx(dt_dataset **out, const char *images_path, const char *labels_path) {
    *out = NULL;
    char dir[PATH_MAX - 128], file[PATH_MAX], lockfile[PATH_MAX], why[256] = "";
    if (!dt_cache_dir(dir, sizeof dir)) return DT_OK;
    cache_header *want = calloc(2, sizeof *want), *h = want + 1;
    if (!want) return DT_OK;
    if (!source_ident(&want->src[0], images_path) || !source_ident(&want->src[1], labels_path)) {
        free(want);
        return DT_OK; /* unreadable sources: the private path says what is wrong */
    }
    /* key: user + canonical paths (FNV-1a), so a changed source replaces its own entry */
    uint64_t key = 1469598103934665603ull;
    uint32_t uid = (uint32_t)geteuid();
    for (size_t i = 0; i < 4; i++) key = (key ^ ((uid >> (8 * i)) & 255)) * 1099511628211ull;
    for (int k = 0; k < 2; k++)
        for (const char *p = want->src[k].path;; p++) {
            key = (key ^ (unsigned char)*p) * 1099511628211ull;
            if (!*p) break;
        }
    char name[64];
    snprintf(name, sizeof name, "dtrain-data-%016llx.v1", (unsigned long long)key);
    snprintf(file, sizeof file, "%s/%s", dir, name);
    snprintf(lockfile, sizeof lockfile, "%s/dtrain-data-%016llx.lock", dir, (unsigned long long)key);
    memcpy(want->magic, CACHE_MAGIC, 8);
    want->version = CACHE_VERSION;
    want->byte_order = 0x01020304u;
    want->header_bytes = CACHE_HDR;

    void *map = NULL;
    dt_status st = DT_OK;
    int rc = map_existing(file, want, &map, h, why, sizeof why);
    if (rc == MAP_OK) goto done;
    if (rc == MAP_UNUSABLE) {
        dt_log(DT_LOG_INFO, "data cache: cannot use %s (%s): decoding privately", file, why);
        goto done;
    }
    int lfd = lock_entry(lockfile);
    if (lfd < 0) goto done;
    /* another process may have built it while we waited for the lock */
    rc = map_existing(file, want, &map, h, why, sizeof why);
    if (rc == MAP_STALE) dt_log(DT_LOG_INFO, "data cache: rebuilding %s: %s", file, why);
    if (rc == MAP_STALE || rc == MAP_ABSENT) {
        collect_garbage(dir, name);
        *h = *want;
        bool published;
        double t0 = dt_now();
        st = build(dir, file, h, images_path, labels_path, &map, &published);
        if (map) dt_log(DT_LOG_DEBUG, "data cache: decoded %s into %s in %.3f s", images_path, file, dt_now() - t0);
        if (map && !published) file[0] = '\0';
    } else if (rc == MAP_UNUSABLE) {
        dt_log(DT_LOG_INFO, "data cache: cannot use %s (%s): decoding privately", file, why);
    }
    unlock_entry(lockfile, lfd);
done:
    if (map) st = dataset_over(out, map, h, images_path, labels_path, file);
    free(want);
    return st;
}

/* Classifies a file name of the cache directory; false for names that are not ours. */
static bool file_kind(const char *f, dt_cache_kind *k) {
    size_t flen = strlen(f);
    if (strncmp(f, "dtrain-data-", 12) != 0) return false;
    if (strstr(f, ".v1.tmp.")) *k = DT_CACHE_TEMP;
    else if (flen > 5 && !strcmp(f + flen - 5, ".lock")) *k = DT_CACHE_LOCK;
    else if (flen > 3 && !strcmp(f + flen - 3, ".v1")) *k = DT_CACHE_ENTRY;
    else return false;
    return true;
}

/* Whether the builder lock that guards f (a lock or temp file) is held by a live process. */
static bool guard_busy(const char *dir, const char *f) {
    char lock[PATH_MAX];
    size_t stem = strcspn(f + 12, ".") + 12;
    snprintf(lock, sizeof lock, "%s/%.*s.lock", dir, (int)stem, f);
    int fd = open(lock, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return false;
    bool busy = flock(fd, LOCK_SH | LOCK_NB) != 0;
    close(fd);
    return busy;
}

bool dt_cache_list(char *dir, size_t cap, void (*fn)(void *ctx, const dt_cache_file *f), void *ctx) {
    if (!dt_cache_dir(dir, cap)) return false;
    DIR *d = fn ? opendir(dir) : NULL;
    if (!d) return true;
    struct dirent *e;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    while ((e = readdir(d))) {
        dt_cache_file f = {.name = e->d_name, .source = ""};
        struct stat st;
        if (!file_kind(e->d_name, &f.kind) || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            st.st_uid != geteuid())
            continue;
        f.bytes = (uint64_t)st.st_size;
        f.idle_s = (double)(now.tv_sec - st.st_atim.tv_sec) + (double)(now.tv_nsec - st.st_atim.tv_nsec) * 1e-9;
        cache_header h;
        int fd = f.kind == DT_CACHE_ENTRY ? openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
        if (fd >= 0 && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.header_crc == header_crc(&h) &&
            h.src[0].path[CACHE_PATH - 1] == '\0')
            f.source = h.src[0].path;
        if (fd >= 0) close(fd);
        f.busy = f.kind != DT_CACHE_ENTRY && guard_busy(dir, e->d_name);
        fn(ctx, &f);
    }
    closedir(d);
    return true;
}

typedef struct {
    const char *dir;
    int removed;
    uint64_t bytes;
} clear_ctx;

static void clear_one(void *ctx, const dt_cache_file *f) {
    clear_ctx *c = ctx;
    if (f->busy) return;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", c->dir, f->name);
    if (f->kind == DT_CACHE_LOCK) {
        remove_if_stale_lock(path);
        if (access(path, F_OK) == 0) return;
    } else if (unlink(path) != 0) {
        return;
    }
    c->removed++;
    c->bytes += f->bytes;
}

void dt_cache_clear(int *removed, uint64_t *bytes) {
    char dir[PATH_MAX - 128];
    clear_ctx c = {.dir = dir};
    dt_cache_list(dir, sizeof dir, clear_one, &c);
    if (removed) *removed = c.removed;
    if (bytes) *bytes = c.bytes;
}
