/* Status codes and the per-thread last-error message (dt_error / dt_last_error). */
#include "dtrain/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DT_ERRMSG_MAX 1024
static _Thread_local char g_errmsg[DT_ERRMSG_MAX];
static _Thread_local int g_errpeer = -1; /* the peer rank the last error blames, or -1 */

const char *dt_status_str(dt_status s) {
    switch (s) {
    case DT_OK: return "DT_OK: success";
    case DT_EINVAL: return "DT_EINVAL: invalid argument";
    case DT_ENOMEM: return "DT_ENOMEM: out of memory";
    case DT_EIO: return "DT_EIO: I/O error";
    case DT_EFORMAT: return "DT_EFORMAT: bad file or message format";
    case DT_ENOTSUP: return "DT_ENOTSUP: not supported";
    case DT_ETIMEDOUT: return "DT_ETIMEDOUT: deadline passed";
    case DT_EPEER: return "DT_EPEER: peer failure";
    case DT_EMISMATCH: return "DT_EMISMATCH: ranks disagree";
    case DT_EINTERNAL: return "DT_EINTERNAL: internal error";
    case DT_ENOENT: return "DT_ENOENT: not found";
    case DT_EINTR: return "DT_EINTR: interrupted";
    }
    return "DT_E?: unknown status";
}

const char *dt_last_error(void) { return g_errmsg; }

void dt_error_clear(void) {
    g_errmsg[0] = '\0';
    g_errpeer = -1;
}

int dt_last_error_peer(void) { return g_errpeer; }

void dt_error_set_peer(int peer) { g_errpeer = peer < 0 ? -1 : peer; }

dt_status dt_error(dt_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_errmsg, sizeof g_errmsg, fmt, ap);
    va_end(ap);
    g_errpeer = -1;
    return s;
}

dt_status dt_error_peer(dt_status s, int peer, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_errmsg, sizeof g_errmsg, fmt, ap);
    va_end(ap);
    dt_error_set_peer(peer);
    return s;
}

dt_status dt_error_wrap(dt_status s, const char *fmt, ...) {
    char old[DT_ERRMSG_MAX];
    memcpy(old, g_errmsg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_errmsg, sizeof g_errmsg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n + 2 < sizeof g_errmsg && old[0]) {
        /* append ": old", cut to fit */
        size_t room = sizeof g_errmsg - (size_t)n - 3, len = strnlen(old, room);
        memcpy(g_errmsg + n, ": ", 2);
        memcpy(g_errmsg + n + 2, old, len);
        g_errmsg[(size_t)n + 2 + len] = '\0';
    }
    return s;
}
