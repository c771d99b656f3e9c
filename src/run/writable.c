/* The write probe of a run's outputs (writable.h): mkstemp in the directory, then unlink. */
#include "run/writable.h"

#include "core/sys.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dt_dir_probe_write(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/.dtrain-probe-XXXXXX", dir) >= (int)sizeof p) return ENAMETOOLONG;
    int fd = mkstemp(p);
    if (fd < 0) return errno;
    close(fd);
    unlink(p);
    return 0;
}

int dt_path_probe_write(const char *path, char *dir, size_t cap) {
    if (dt_path_dir(dir, cap, path) >= cap) return ENAMETOOLONG;
    return dt_dir_probe_write(dir);
}

/* Copies text into out (cap bytes); DT_EINVAL naming what and path when it does not fit. */
static dt_status output_copy(const char *what, const char *path, const char *text, char *out, size_t cap) {
    if (strlen(text) >= cap)
        return dt_error(DT_EINVAL, "%s%s%s: the file it names is too long a path", what, *what ? " " : "", path);
    memcpy(out, text, strlen(text) + 1);
    return DT_OK;
}

/* A path into a process's descriptor table (/dev/stdout -> /proc/self/fd/1, /dev/fd/N): what it
 * leads to is an open file of this process, which a rename must not replace. */
static bool names_descriptor(const char *p) {
    return !strncmp(p, "/dev/fd/", 8) || !strncmp(p, "/dev/std", 8) ||
           (!strncmp(p, "/proc/", 6) && strstr(p, "/fd/") != NULL);
}

int dt_path_descriptor(const char *path) {
    static const char *const std[] = {"/dev/stdin", "/dev/stdout", "/dev/stderr"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(path, std[i])) return i;
    const char *n = !strncmp(path, "/dev/fd/", 8) ? path + 8 : !strncmp(path, "/proc/self/fd/", 14) ? path + 14 : NULL;
    char *end;
    const long fd = n && *n ? strtol(n, &end, 10) : -1;
    return fd >= 0 && fd < 1 << 20 && !*end ? (int)fd : -1;
}

dt_status dt_output_path(const char *what, const char *path, char *out, size_t cap) {
    const char *sep = *what ? " " : "";
    char cur[PATH_MAX], link[PATH_MAX], next[2 * PATH_MAX];
    if (snprintf(cur, sizeof cur, "%s", path) >= (int)sizeof cur) return output_copy(what, path, path, out, 0);
    for (int hop = 0; hop < 40; hop++) { /* follow the links one by one to the file they name */
        struct stat st;
        if (names_descriptor(cur) || (lstat(cur, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)))
            return dt_error(DT_EINVAL,
                            "%s%s%s: not a regular file (a device, FIFO, directory or descriptor such as "
                            "/dev/stdout): dtrain writes its outputs to a temp file and renames it into "
                            "place, which would replace it; name a file",
                            what, sep, path);
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) return output_copy(what, path, cur, out, cap);
        const ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0) return output_copy(what, path, cur, out, cap);
        link[n] = '\0';
        char dir[PATH_MAX];
        dt_path_dir(dir, sizeof dir, cur);
        if (link[0] == '/') snprintf(next, sizeof next, "%s", link);
        else snprintf(next, sizeof next, "%s/%s", dir, link);
        if (strlen(next) >= sizeof cur) return output_copy(what, path, next, out, 0);
        memcpy(cur, next, strlen(next) + 1);
    }
    return dt_error(DT_EINVAL, "%s%s%s: too many levels of symbolic links", what, sep, path);
}
