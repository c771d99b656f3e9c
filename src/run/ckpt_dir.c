/* Checkpoint directories: numbered files, newest-valid lookup with fallback, retention. */
#include "run/ckpt_dir.h"
#include "run/checkpoint.h"

#include "core/sys.h"
#include "dtrain/safetensors.h"

#include <dirent.h>
#include <signal.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PREFIX "ckpt-"
#define SUFFIX ".safetensors"

void dt_ckpt_dir_path(char *out, size_t cap, const char *dir, int64_t step) {
    snprintf(out, cap, "%s/" PREFIX "%010" PRId64 SUFFIX, dir, step);
}

dt_status dt_ckpt_dir_ensure(const char *dir) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return dt_error(DT_EIO, "`checkpoint_dir` %s: cannot create %s: %s", dir, tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return dt_error(DT_EIO, "`checkpoint_dir` %s: cannot create it: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_error(DT_EIO, "`checkpoint_dir` %s: not a directory", dir);
    return DT_OK;
}

/* Steps of the checkpoints in dir, sorted descending. */
static dt_status list_steps(const char *dir, int64_t **steps, size_t *n) {
    *steps = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return DT_OK;
        return dt_error(DT_EIO, "`checkpoint_dir` %s: cannot read: %s", dir, strerror(errno));
    }
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t step;
        char tail[32];
        if (sscanf(e->d_name, PREFIX "%" SCNd64 "%31s", &step, tail) != 2 || strcmp(tail, SUFFIX) != 0) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *p = realloc(*steps, cap * sizeof *p);
            if (!p) {
                closedir(d);
                return dt_error(DT_ENOMEM, "out of memory listing %s", dir);
            }
            *steps = p;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    for (size_t i = 1; i < *n; i++) /* insertion sort, descending: directories hold a handful */
        for (size_t j = i; j > 0 && (*steps)[j] > (*steps)[j - 1]; j--) {
            int64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1], (*steps)[j - 1] = t;
        }
    return DT_OK;
}

/* The shards of a sharded checkpoint's index f (none: true) all open and validate. */
static bool shards_valid(const char *path, const dt_st_file *f) {
    const char *v = dt_st_meta(f, "dtrain.shards");
    int n = v ? atoi(v) : 0;
    for (int r = 0; r < n; r++) {
        char shard[4200];
        dt_ckpt_shard_path(shard, sizeof shard, path, r, n);
        dt_st_file *g = NULL;
        dt_status s = dt_st_open(&g, shard);
        dt_st_destroy(g);
        if (s != DT_OK) return false;
    }
    return true;
}

static void unlink_if_writer_dead(const char *dir, const char *name, size_t stem_len);

/* The length of the shard tag ".rR-of-N" that name[0..stem) ends with, or 0. */
static size_t shard_tag_len(const char *name, size_t stem) {
    for (size_t p = stem; p-- > 0;) {
        if (name[p] != '.' || name[p + 1] != 'r') continue;
        int r, k, used = 0;
        if (sscanf(name + p, ".r%d-of-%d%n", &r, &k, &used) == 2 && (size_t)used == stem - p && r >= 0 && k > 0)
            return stem - p;
        return 0; /* only the last ".r" can start the tag */
    }
    return 0;
}

/* Removes the shard files "<path>.rR-of-N" of a checkpoint (any N), and the temp files
 * "<path>.rR-of-N.tmp.<pid>" of ranks that died writing one. */
static void remove_shards(const char *dir, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    DIR *d = opendir(dir);
    if (!d) return;
    size_t n = strlen(base);
    for (struct dirent *e; (e = readdir(d));) {
        int r, k, used = 0;
        if (strncmp(e->d_name, base, n) != 0 || sscanf(e->d_name + n, ".r%d-of-%d%n", &r, &k, &used) != 2) continue;
        if (e->d_name[n + (size_t)used]) {
            unlink_if_writer_dead(dir, e->d_name, n + (size_t)used);
            continue;
        }
        char full[8192];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        unlink(full);
    }
    closedir(d);
}

dt_status dt_ckpt_dir_latest(const char *dir, char *out, size_t cap, bool *found,
                             void (*report)(void *ctx, const char *path, const char *reason), void *ctx) {
    *found = false;
    int64_t *steps;
    size_t n;
    DT_TRY(list_steps(dir, &steps, &n));
    dt_ckpt_info *info = malloc(sizeof *info); /* its metadata too: a file --resume could not use is skipped */
    if (!info) {
        free(steps);
        return dt_error(DT_ENOMEM, "out of memory listing %s", dir);
    }
    for (size_t i = 0; i < n && !*found; i++) {
        dt_ckpt_dir_path(out, cap, dir, steps[i]);
        dt_st_file *f = NULL;
        if (dt_st_open(&f, out) == DT_OK && dt_checkpoint_info_of(f, info) == DT_OK) *found = shards_valid(out, f);
        if (!*found && report) report(ctx, out, dt_last_error());
        dt_st_destroy(f);
    }
    free(info);
    free(steps);
    return DT_OK;
}

/* Unlinks dir/name when name is "<stem>.tmp.<pid>" and that pid no longer exists. */
static void unlink_if_writer_dead(const char *dir, const char *name, size_t stem_len) {
    const char *tmp = name + stem_len;
    if (strncmp(tmp, ".tmp.", 5) != 0) return;
    char *end;
    long pid = strtol(tmp + 5, &end, 10);
    if (pid <= 0 || *end || kill((pid_t)pid, 0) == 0 || errno != ESRCH) return;
    char full[8192];
    snprintf(full, sizeof full, "%s/%s", dir, name);
    unlink(full);
}

/* Calls unlink_if_writer_dead on the temp files "<stem>.tmp.<pid>" in dir whose stem, less a
 * shard tag ".rR-of-N" (a ZeRO rank's piece), starts with prefix and, if suffix is non-NULL, ends
 * with it; else is prefix itself. */
static void scan_temps(const char *dir, const char *prefix, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return;
    const size_t np = strlen(prefix), ns = suffix ? strlen(suffix) : 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, np) != 0) continue;
        const char *t = strstr(e->d_name, ".tmp.");
        if (!t) continue;
        const size_t stem = (size_t)(t - e->d_name), whole = stem - shard_tag_len(e->d_name, stem);
        if (suffix && (whole < np + ns || strncmp(e->d_name + whole - ns, suffix, ns) != 0)) continue;
        if (!suffix && whole != np) continue;
        unlink_if_writer_dead(dir, e->d_name, stem);
    }
    closedir(d);
}

void dt_ckpt_remove_stale_temps(const char *path) {
    char dir[4096];
    dt_path_dir(dir, sizeof dir, path);
    const char *slash = strrchr(path, '/');
    scan_temps(dir, slash ? slash + 1 : path, NULL);
}

/* Removes shard files "ckpt-<step>.safetensors.rR-of-N" older than step `newest` whose index is
 * missing: a save that died between its shards and its index (nothing can load them). */
static void remove_orphan_shards(const char *dir, int64_t newest) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t step;
        int r, k, used = 0;
        if (sscanf(e->d_name, PREFIX "%" SCNd64 SUFFIX ".r%d-of-%d%n", &step, &r, &k, &used) != 3 || e->d_name[used] ||
            step >= newest)
            continue;
        char index[4096], full[8192];
        dt_ckpt_dir_path(index, sizeof index, dir, step);
        if (access(index, F_OK) == 0) continue; /* a checkpoint's own shard */
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        unlink(full);
    }
    closedir(d);
}

dt_status dt_ckpt_dir_prune(const char *dir, int keep) {
    scan_temps(dir, PREFIX, SUFFIX); /* "ckpt-*.safetensors.tmp.<pid>" of killed ranks */
    int64_t *steps;
    size_t n;
    DT_TRY(list_steps(dir, &steps, &n));
    if (n > 0) remove_orphan_shards(dir, steps[0]);
    dt_status s = DT_OK;
    for (size_t i = keep > 0 ? (size_t)keep : n; i < n; i++) {
        char path[4096];
        dt_ckpt_dir_path(path, sizeof path, dir, steps[i]);
        if (unlink(path) != 0 && errno != ENOENT && s == DT_OK)
            s = dt_error(DT_EIO, "`keep`: cannot remove old checkpoint %s: %s", path, strerror(errno));
        remove_shards(dir, path);
    }
    free(steps);
    return s;
}
