/* Shared helpers of the data readers' tests: a mkdtemp directory for the test files (the data
 * cache of IDX opens inside it, not in /dev/shm), paths in it, files written raw or gzip'd. */
#ifndef DT_DATA_TESTLIB_H
#define DT_DATA_TESTLIB_H

#include "core/test.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>

static char dt_test_dir[256];

/* Makes dt_test_dir from tmpl ("/tmp/NAME-XXXXXX") and points DTRAIN_DATA_CACHE into it: 0, or -1
 * after saying why. */
static inline int dt_test_dir_make(const char *tmpl) {
    if (dt_test_mkdtemp(dt_test_dir, sizeof dt_test_dir, tmpl) != 0) return -1;
    char cache[300];
    snprintf(cache, sizeof cache, "%s/cache", dt_test_dir);
    setenv("DTRAIN_DATA_CACHE", cache, 1);
    return 0;
}

/* Removes dt_test_dir and everything in it. */
static inline void dt_test_dir_remove(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dt_test_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dt_test_dir);
}

/* dt_test_dir/name, in one of 4 static buffers (4 paths may be live at once). */
static inline const char *dt_test_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dt_test_dir, name);
    return buf[k];
}

/* Writes n bytes of p to path, gzip'd when gz. */
static inline void dt_test_write_bytes(const char *path, const void *p, size_t n, bool gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (n) gzwrite(f, p, (unsigned)n);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        fwrite(p, 1, n, f);
        fclose(f);
    }
}

#endif
