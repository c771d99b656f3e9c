/* Checkpoint directories: numbered files, newest-valid lookup with fallback, retention. */
#include "run/ckpt_dir.h"

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
            return dt_error(DT_EIO, "--checkpoint-dir %s: cannot create %s: %s", dir, tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return dt_error(DT_EIO, "--checkpoint-dir %s: cannot create it: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_error(DT_EIO, "--checkpoint-dir %s: not a directory", dir);
    return DT_OK;
}

/* Steps of the checkpoints in dir, sorted descending. */
static dt_status list_steps(const char *dir, int64_t **steps, size_t *n) {
    *steps = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return DT_OK;
        return dt_error(DT_EIO, "--checkpoint-dir %s: cannot read: %s", dir, strerror(errno));
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
    for (size_t i = 1; i < *n; i++)  /* insertion sort, descending: directories hold a handful */
        for (size_t j = i; j > 0 && (*steps)[j] > (*steps)[j - 1]; j--) {
            int64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1], (*steps)[j - 1] = t;
        }
    return DT_OK;
}

dt_status dt_ckpt_dir_latest(const char *dir, char *out, size_t cap, bool *found,
                             void (*report)(void *ctx, const char *path, const char *reason), void *ctx) {
    *found = false;
    int64_t *steps;
    size_t n;
    DT_TRY(list_steps(dir, &steps, &n));
    for (size_t i = 0; i < n && !*found; i++) {
        dt_ckpt_dir_path(out, cap, dir, steps[i]);
        dt_st_file *f = NULL;
        if (dt_st_open(&f, out) == DT_OK) *found = true;
        else if (report) report(ctx, out, dt_last_error());
        dt_st_close(f);
    }
    free(steps);
    return DT_OK;
}

void dt_ckpt_remove_stale_temps(const char *path) {
    char dir[4096], base[1024];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash && slash == path) snprintf(dir, sizeof dir, "/");
    snprintf(base, sizeof base, "%s.tmp.", slash ? slash + 1 : path);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, base, strlen(base)) != 0) continue;
        char *end;
        long pid = strtol(e->d_name + strlen(base), &end, 10);
        if (pid > 0 && !*end && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            char full[8192];
            snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
            unlink(full);
        }
    }
    closedir(d);
}

/* The temp files of every numbered checkpoint name in dir ("ckpt-*.safetensors.tmp.<pid>"). */
static void remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *t = strstr(e->d_name, SUFFIX ".tmp.");
        if (strncmp(e->d_name, PREFIX, strlen(PREFIX)) != 0 || !t) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%.*s", dir, (int)(t - e->d_name + strlen(SUFFIX)), e->d_name);
        dt_ckpt_remove_stale_temps(path);
    }
    closedir(d);
}

dt_status dt_ckpt_dir_prune(const char *dir, int keep) {
    remove_stale_temps(dir);
    int64_t *steps;
    size_t n;
    DT_TRY(list_steps(dir, &steps, &n));
    dt_status s = DT_OK;
    for (size_t i = keep > 0 ? (size_t)keep : n; i < n; i++) {
        char path[4096];
        dt_ckpt_dir_path(path, sizeof path, dir, steps[i]);
        if (unlink(path) != 0 && errno != ENOENT && s == DT_OK)
            s = dt_error(DT_EIO, "--keep: cannot remove old checkpoint %s: %s", path, strerror(errno));
    }
    free(steps);
    return s;
}
