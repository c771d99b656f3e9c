/* The data-set cache's store: the build lock of an entry (flock on a lock file that a dying
 * builder releases), the bound on entries per user, garbage collection of stale or broken
 * entries, and the listing and clearing behind `dtrain cache`. */
#include "data/cache_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* True when fd (locked) is still the file at path: the holder before us may have removed it. */
static bool lock_is_current(int fd, const char *path) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

/* Takes the builder lock of one cache entry; -1 (logged) when it cannot. Waits by sleeping, up to
 * CACHE_LOCK_WAIT_S; a builder that dies releases it. The lock file exists only while someone
 * holds it: its holder removes it before letting go (dt_cache_unlock_entry), so failed decodes and
 * finished builds leave no .lock behind; a waiter that then gets the lock of a removed file
 * starts over on a fresh one. */
int dt_cache_lock_entry(const char *lockfile) {
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
            dt_log(DT_LOG_INFO, "data cache: %s has been held for %.0f s by another process: decoding privately",
                   lockfile, CACHE_LOCK_WAIT_S);
            break;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 50000000) sleep_ns *= 2;
    }
    close(fd);
    return -1;
}

/* Removes the lock file, then releases it (see dt_cache_lock_entry). */
void dt_cache_unlock_entry(const char *lockfile, int fd) {
    unlink(lockfile);
    close(fd);
}

/* Removes path when it is a lock file nobody holds (left by a dtrain before this rule). */
static void remove_if_stale_lock(const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && flock(fd, LOCK_EX | LOCK_NB) == 0 && lock_is_current(fd, path))
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
    struct {
        char f[64];
        double t;
    } *v = calloc(CAP, sizeof *v);
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
void dt_cache_collect_garbage(const char *dir, const char *name) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[PATH_MAX], base[PATH_MAX];
    size_t nlen = strlen(name);
    for (int pass = 0; pass < 2; pass++, rewinddir(d)) /* temp files first: the locks still exist */
        while ((e = readdir(d))) {
            const char *f = e->d_name, *tmp = strstr(f, ".v1.tmp.");
            size_t flen = strlen(f);
            if (strncmp(f, "dtrain-data-", 12) != 0 || snprintf(path, sizeof path, "%s/%s", dir, f) >= (int)sizeof path)
                continue;
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
                !memcmp(h.magic, CACHE_MAGIC, 8) && h.version == CACHE_VERSION &&
                h.header_crc == dt_cache_header_crc(&h)) {
                struct stat s2;
                for (int i = 0; i < 2; i++)
                    if (h.src[i].path[CACHE_PATH - 1] == '\0' && stat(h.src[i].path, &s2) != 0 && errno == ENOENT)
                        gone = true;
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
        if (fd >= 0 && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.header_crc == dt_cache_header_crc(&h) &&
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
