/* Timeline tracing: a fixed-size in-memory buffer of complete events (name, rank, thread,
 * start, duration) that costs one store per event, and a writer for the Chrome trace-event JSON
 * format (viewable in Perfetto or chrome://tracing). Gathering ranks' events is up to the caller. */
#ifndef DT_CORE_TRACE_H
#define DT_CORE_TRACE_H

#include "dtrain/core.h"

/* One complete ("ph":"X") event; plain data so ranks can exchange them as bytes. */
typedef struct {
    char name[24]; /* "forward", "allreduce b3", ... */
    int32_t rank;  /* -> "pid" */
    int32_t tid;   /* lane within the rank: 0 compute, 1 communication, 2 data */
    double ts;     /* start, seconds since the trace's zero */
    double dur;    /* seconds */
    int64_t step;  /* training step, shown in args */
} dt_trace_event;

typedef struct {
    dt_trace_event *ev;
    size_t n, cap;
    size_t dropped; /* events that did not fit */
    int rank;
    double zero; /* dt_now() at the trace's time zero */
} dt_trace;

/* Allocates room for cap events; zero is the dt_now() value that maps to time 0. */
dt_status dt_trace_init(dt_trace *t, int rank, size_t cap, double zero);
void dt_trace_free(dt_trace *t);
/* Records an event from absolute dt_now() times t0..t1. No-op on a NULL or full trace. */
void dt_trace_add(dt_trace *t, const char *name, int tid, double t0, double t1, int64_t step);
/* Writes events (from any number of ranks) as a Chrome trace JSON file, atomically. */
dt_status dt_trace_write_json(const char *path, const dt_trace_event *ev, size_t n);

#endif
