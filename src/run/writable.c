/* The write probe of a run's outputs (writable.h): mkstemp in the directory, then unlink. */
#include "run/writable.h"

#include "core/sys.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
