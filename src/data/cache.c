/* The shared decoded data-set cache: an IDX images/labels pair is decoded once into a file under
 * /dev/shm (or $DTRAIN_DATA_CACHE) and every process of the machine maps that one read-only copy
 * instead of holding its own. Layout, keying and rebuild rules are documented in data.h. A
 * failure of the cache itself (disabled, no directory, not writable, full, lock wait too long)
 * falls back to private decoding with an info log line: it never fails a run. */
#include "data/cache_internal.h"

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

static const struct {
    unsigned code;
    dt_dtype t;
} g_types[] = {{0x08, DT_U8}, {0x09, DT_I8}, {0x0B, DT_I16}, {0x0C, DT_I32}, {0x0D, DT_F32}, {0x0E, DT_F64}};

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

uint32_t dt_cache_header_crc(const cache_header *h) {
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
    if (h->header_crc != dt_cache_header_crc(h)) return snprintf(why, cap, "header checksum mismatch"), false;
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
                        (unsigned long long)h->file_bytes),
               false;
    return true;
}

/* Views a validated mapping as a data set (labels checked as the private path does). */
static dt_status dataset_over(dt_dataset **out, void *map, const cache_header *h, const char *images_path,
                              const char *labels_path, const char *file) {
    dt_dataset *ds = dt_dataset_alloc();
    if (!ds) {
        munmap(map, h->file_bytes);
        return DT_ENOMEM;
    }
    dt_idx im = {.ndim = 1, .dims = {(int64_t)h->n}};
    type_of_code(h->idx_type, &im.dtype);
    dt_dataset_init_idx(ds, &im, (int)h->C, (int)h->H, (int)h->W, images_path, labels_path);
    ds->map = map;
    ds->map_len = h->file_bytes;
    ds->x = (char *)map + h->x_off;
    ds->y = (int32_t *)(void *)((char *)map + h->y_off);
    snprintf(ds->cache, sizeof ds->cache, "%s", file);
    dt_status st = dt_dataset_check_labels(ds, 0, labels_path);
    if (st != DT_OK) {
        dt_dataset_destroy(ds);
        return st;
    }
    dt_dataset_update_lut(ds);
    *out = ds;
    return DT_OK;
}

enum { MAP_OK, MAP_ABSENT, MAP_STALE, MAP_UNUSABLE };

/* Maps an existing cache file read-only after checking its header, sources and checksum. */
static int map_existing(const char *file, const cache_header *want, void **map, cache_header *h, char *why,
                        size_t cap) {
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

/* Whether dir can take a cache entry of `bytes`: it leaves a quarter of the file system free and
 * fits the file size limit; logs why not. */
static bool room_for(const char *dir, uint64_t bytes) {
    struct statvfs vfs;
    struct rlimit fsz;
    if (statvfs(dir, &vfs) == 0 && vfs.f_blocks > 0 &&
        (double)vfs.f_bavail * vfs.f_frsize < (double)bytes + (double)vfs.f_blocks * vfs.f_frsize / 4) {
        dt_log(DT_LOG_INFO,
               "data cache: a %.1f MB entry would leave less than a quarter of %s free: decoding privately",
               (double)bytes / 1e6, dir);
        return false;
    }
    if (getrlimit(RLIMIT_FSIZE, &fsz) == 0 && fsz.rlim_cur != RLIM_INFINITY && fsz.rlim_cur < bytes) {
        dt_log(DT_LOG_INFO, "data cache: file size limit (ulimit -f) is below %.1f MB: decoding privately",
               (double)bytes / 1e6);
        return false;
    }
    return true;
}

/* Decodes the pair into a new cache file and publishes it as file (lock held). DT_OK with
 * *map NULL when the cache cannot take it; other statuses are errors in the data files. */
static dt_status build(const char *dir, const char *file, cache_header *h, const char *images_path,
                       const char *labels_path, void **map, bool *published) {
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
    DT_TRY_GOTO(st = dt_idx_pair_shape(&im, &lb, images_path, labels_path, &C, &H, &W), out);
    h->idx_type = code_of_type(im.dtype);
    h->C = (uint32_t)C, h->H = (uint32_t)H, h->W = (uint32_t)W;
    h->n = (uint64_t)im.dims[0];
    h->x_off = CACHE_HDR;
    h->x_bytes = im.count * dt_dtype_size(im.dtype);
    h->y_off = align64(h->x_off + h->x_bytes);
    h->y_bytes = h->n * 4;
    h->file_bytes = h->y_off + h->y_bytes;

    if (!room_for(dir, h->file_bytes)) goto out;
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", file);
    if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
        dt_log(DT_LOG_INFO, "data cache: cannot create a file in %s (%s): decoding privately", dir, strerror(errno));
        goto out;
    }
    int e = posix_fallocate(fd, 0, (off_t)h->file_bytes); /* reserve now: no SIGBUS when full */
    if (e != 0) {
        dt_log(DT_LOG_INFO, "data cache: cannot reserve %.1f MB in %s (%s): decoding privately",
               (double)h->file_bytes / 1e6, dir, strerror(e));
        goto out;
    }
    m = mmap(NULL, h->file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) {
        dt_log(DT_LOG_INFO, "data cache: cannot map %s (%s): decoding privately", tmp, strerror(errno));
        goto out;
    }
    DT_TRY_GOTO(st = dt_idx_read_body(&s, &im, (char *)m + h->x_off), out);
    dt_convert((char *)m + h->y_off, DT_I32, lb.data, lb.dtype, h->n);
    h->payload_crc = crc_bytes(0, (char *)m + h->x_off, h->file_bytes - h->x_off);
    h->header_crc = dt_cache_header_crc(h);
    memcpy(m, h, sizeof *h);
    mprotect(m, h->file_bytes, PROT_READ);
    if (rename(tmp, file) == 0) {
        *published = true;
    } else {
        dt_log(DT_LOG_INFO, "data cache: cannot publish %s (%s): this process keeps an unshared copy", file,
               strerror(errno));
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
    int lfd = dt_cache_lock_entry(lockfile);
    if (lfd < 0) goto done;
    /* another process may have built it while we waited for the lock */
    rc = map_existing(file, want, &map, h, why, sizeof why);
    if (rc == MAP_STALE) dt_log(DT_LOG_INFO, "data cache: rebuilding %s: %s", file, why);
    if (rc == MAP_STALE || rc == MAP_ABSENT) {
        dt_cache_collect_garbage(dir, name);
        *h = *want;
        bool published;
        double t0 = dt_now();
        st = build(dir, file, h, images_path, labels_path, &map, &published);
        if (map) dt_log(DT_LOG_DEBUG, "data cache: decoded %s into %s in %.3f s", images_path, file, dt_now() - t0);
        if (map && !published) file[0] = '\0';
    } else if (rc == MAP_UNUSABLE) {
        dt_log(DT_LOG_INFO, "data cache: cannot use %s (%s): decoding privately", file, why);
    }
    dt_cache_unlock_entry(lockfile, lfd);
done:
    if (map) st = dataset_over(out, map, h, images_path, labels_path, file);
    free(want);
    return st;
}
