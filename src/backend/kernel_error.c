/* The kernels' sticky error (backend.h: dt_kernel_fail, dt_kernel_error_take): a kernel slot
 * returns void, so one that cannot run leaves its reason in a per-thread message the graph takes
 * after the op. */
#include "backend/backend.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local struct {
    bool set;
    char msg[192];
} kerr;

void dt_kernel_fail(const char *fmt, ...) {
    if (kerr.set) return; /* the first cause is the one worth reporting */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kerr.msg, sizeof kerr.msg, fmt, ap);
    va_end(ap);
    kerr.set = true;
}

bool dt_kernel_error_take(char *buf, size_t n) {
    if (!kerr.set) return false;
    if (n) snprintf(buf, n, "%s", kerr.msg);
    kerr.set = false;
    return true;
}
