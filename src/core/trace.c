/* Timeline tracing: event buffer and Chrome trace-event JSON writer. */
#include "core/trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

dt_status dt_trace_init(dt_trace *t, int rank, size_t cap, double zero) {
    memset(t, 0, sizeof *t);
    t->ev = calloc(cap ? cap : 1, sizeof *t->ev);
    if (!t->ev) return dt_error(DT_ENOMEM, "trace: cannot allocate %zu events", cap);
    t->cap = cap;
    t->rank = rank;
    t->zero = zero;
    return DT_OK;
}

void dt_trace_free(dt_trace *t) {
    if (!t) return;
    free(t->ev);
    memset(t, 0, sizeof *t);
}

void dt_trace_add(dt_trace *t, const char *name, int tid, double t0, double t1, int64_t step) {
    if (!t || !t->ev) return;
    if (t->n == t->cap) {
        t->dropped++;
        return;
    }
    dt_trace_event *e = &t->ev[t->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->rank = t->rank;
    e->tid = tid;
    e->ts = t0 - t->zero;
    e->dur = t1 > t0 ? t1 - t0 : 0;
    e->step = step;
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputc('"', f);
}

dt_status dt_trace_write_json(const char *path, const dt_trace_event *ev, size_t n) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return dt_error(DT_EIO, "`timeline` %s: cannot create %s", path, tmp);
    static const char *lanes[] = {"compute", "communication", "data"};
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    /* name each rank's process and lanes */
    int max_rank = -1;
    for (size_t i = 0; i < n; i++) max_rank = ev[i].rank > max_rank ? ev[i].rank : max_rank;
    bool first = true;
    for (int r = 0; r <= max_rank; r++) {
        fprintf(f, "%s{\"ph\": \"M\", \"pid\": %d, \"name\": \"process_name\", \"args\": {\"name\": \"rank %d\"}}",
                first ? "" : ",\n", r, r);
        first = false;
        for (int l = 0; l < 3; l++)
            fprintf(
                f,
                ",\n{\"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"name\": \"thread_name\", \"args\": {\"name\": \"%s\"}}",
                r, l, lanes[l]);
    }
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s{\"ph\": \"X\", \"name\": ", first ? "" : ",\n");
        first = false;
        json_string(f, ev[i].name);
        fprintf(f, ", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"step\": %lld}}", ev[i].rank,
                ev[i].tid, ev[i].ts * 1e6, ev[i].dur * 1e6, (long long)ev[i].step);
    }
    fprintf(f, "\n]}\n");
    /* a write that failed inside fprintf leaves only the error flag: check it, then sync and close */
    bool ok = fflush(f) == 0 && !ferror(f) && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) ok = false, e = errno;
    if (ok && rename(tmp, path) != 0) ok = false, e = errno;
    if (!ok) {
        unlink(tmp);
        return dt_error(DT_EIO, "`timeline` %s: writing %s failed: %s; check the disk (free space, permissions)", path,
                        tmp, strerror(e));
    }
    return DT_OK;
}
