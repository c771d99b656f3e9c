/* Process-level services: BLAS thread count, monotonic clock, stderr logging, and path names. */
#include "dtrain/core.h"
#include "core/sys.h"

#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_threads = 1;
static int g_log_rank = -1;
static int g_log_level = -1;
static void (*g_log_sink)(void *ctx, const char *line); /* NULL: stderr */
static void *g_log_ctx;

void dt_set_threads(int n) {
    if (n < 1) n = 1;
    g_threads = n;
    openblas_set_num_threads(n);
}

int dt_get_threads(void) { return g_threads; }

double dt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void dt_log_set_rank(int rank) { g_log_rank = rank; }

static int log_level(void) {
    if (g_log_level < 0) {
        const char *e = getenv("DTRAIN_LOG");
        g_log_level = DT_LOG_WARN;
        if (e) {
            if (!strcmp(e, "error")) g_log_level = DT_LOG_ERROR;
            else if (!strcmp(e, "info")) g_log_level = DT_LOG_INFO;
            else if (!strcmp(e, "debug")) g_log_level = DT_LOG_DEBUG;
        }
    }
    return g_log_level;
}

void dt_log(dt_log_level lvl, const char *fmt, ...) {
    if ((int)lvl > log_level()) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char buf[2048];
    int n = g_log_rank >= 0 ? snprintf(buf, sizeof buf, "[dtrain rank %d] %s: ", g_log_rank, names[lvl])
                            : snprintf(buf, sizeof buf, "[dtrain] %s: ", names[lvl]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (g_log_sink) g_log_sink(g_log_ctx, buf);
    else fprintf(stderr, "%s\n", buf);
}

void dt_log_set_sink(void (*sink)(void *ctx, const char *line), void *ctx) {
    g_log_sink = sink;
    g_log_ctx = ctx;
}

size_t dt_path_dir(char *out, size_t cap, const char *path) {
    const char *slash = strrchr(path, '/');
    const char *dir = !slash ? "." : path;
    size_t n = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
    if (cap) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(out, dir, k);
        out[k] = '\0';
    }
    return n;
}
