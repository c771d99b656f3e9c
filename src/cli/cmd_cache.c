/* dtrain cache ls|clear: the shared decoded data-set cache (/dev/shm or $DTRAIN_DATA_CACHE):
 * list this user's files in it, or remove those no running build holds. */
#include "cli/cli.h"
#include "dtrain/dtrain.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char CACHE_USAGE[] =
    "Usage: dtrain cache ls|clear\n\n"
    "The data-set cache holds IDX data sets decoded once and mapped by every process of the machine\n"
    "(/dev/shm, or the directory in DTRAIN_DATA_CACHE; DTRAIN_DATA_CACHE=0 turns it off). It keeps at\n"
    "most DTRAIN_DATA_CACHE_MAX entries per user (default 8), dropping the least recently used.\n"
    "  ls     list your cache files: entries (with the images file they hold), builders' locks and\n"
    "         temp files, with sizes and how long since each was last used\n"
    "  clear  remove them, except the lock and temp file of a build that is running now (processes\n"
    "         that map an entry keep working)";

static void print_file(void *ctx, const dt_cache_file *f) {
    static const char *kinds[] = {"entry", "lock", "temp"};
    int *n = ctx;
    if ((*n)++ == 0) printf("%-6s %10s %10s  %-32s %s\n", "kind", "MB", "idle_s", "file", "source");
    printf("%-6s %10.1f %10.0f  %-32s %s%s\n", kinds[f->kind], (double)f->bytes / 1e6, f->idle_s, f->name, f->source,
           f->busy ? "(build running)" : "");
}

int dt_cmd_cache(int argc, char **argv) {
    const char *pos[1];
    int npos = 0;
    int r = dt_flags_parse(argc, argv, 1, NULL, 0, CACHE_USAGE, pos, 1, &npos, NULL);
    if (r) return r < 0 ? 2 : 0;
    if (npos != 1 || (strcmp(pos[0], "ls") && strcmp(pos[0], "clear"))) {
        return dt_cli_usage("run 'dtrain cache ls' or 'dtrain cache clear'", "cache: expected ls or clear%s%s",
                            npos ? ", got " : "", npos ? pos[0] : "");
    }
    char dir[PATH_MAX];
    if (!strcmp(pos[0], "ls")) {
        int n = 0;
        if (!dt_cache_list(dir, sizeof dir, print_file, &n)) {
            printf("the data cache is off (DTRAIN_DATA_CACHE=0)\n");
            return 0;
        }
        printf("%d file%s in %s\n", n, n == 1 ? "" : "s", dir);
        return 0;
    }
    int removed;
    uint64_t bytes;
    if (!dt_cache_list(dir, sizeof dir, NULL, NULL)) {
        printf("the data cache is off (DTRAIN_DATA_CACHE=0)\n");
        return 0;
    }
    dt_cache_clear(&removed, &bytes);
    printf("removed %d file%s (%.1f MB) from %s\n", removed, removed == 1 ? "" : "s", (double)bytes / 1e6, dir);
    return 0;
}
