/* Internals of the federated-learning server: its client connections (non-blocking, each with
 * an incremental frame reader and a send queue) and the state of the round in progress.
 * What a peer can make the server hold is bounded: before HELLO, a frame of DT_FL_HELLO_SIZE
 * bytes for at most --hello-timeout seconds, and at most --max-pending such peers (the oldest
 * makes way for a new one); after it, one frame of at most frame_max bytes in flight, one stored
 * update and at most tx_max queued bytes (a client that does not read is dropped), for at most
 * --max-clients peers. */
#ifndef DT_FL_SERVER_INTERNAL_H
#define DT_FL_SERVER_INTERNAL_H

#include "fl/fl.h"
#include "fl/secagg.h"

#include <poll.h>

typedef struct {
    int fd;
    char name[64]; /* "client 7 (127.0.0.1:51234)" for log lines */
    dt_fl_reader rd;
    uint8_t *tx; /* queued bytes to send */
    size_t tx_n, tx_off;
    int registered; /* a valid hello came */
    uint64_t id;
    uint32_t samples;
    int in_round; /* sampled for the current round: its slot + 1 */
    double since; /* when it was accepted (dt_now()): its HELLO is due by since + hello_timeout */
} dt_fl_conn;

struct dt_fl_server {
    dt_fl_server_config cfg;
    dt_model *m;
    const dt_dataset *test;
    int lfd, port;
    dt_fl_conn *conns;
    int nconns, cap;   /* cap: max_clients + max_pending + 1 (a newcomer before the oldest makes way) */
    struct pollfd *pf; /* cap + 1 (the listener) */
    uint32_t
        frame_max; /* the largest frame a registered client may send (its update, or secure-aggregation messages) */
    size_t tx_max; /* the most bytes queued to one client: two model frames and 1 MiB (roster, shares, BYE) */
    double accept_pause; /* out of file descriptors with nobody to evict: the listener rests until then */
    /* pending peers evicted, past the HELLO deadline, gone or malformed before HELLO; HELLOs refused */
    uint64_t n_evicted, n_hello_late, n_stranger, n_full;
    size_t np;
    float *global;
    int round;   /* rounds completed */
    int started; /* the first round of this process began */
    uint64_t bytes_in, bytes_out;
    /* the round in progress */
    int nsel;
    int sel[DT_FL_MAX_CLIENTS]; /* conn indices; -1 once that client is gone */
    uint64_t sel_id[DT_FL_MAX_CLIENTS];
    float *upd[DT_FL_MAX_CLIENTS]; /* plain updates received (NULL: none yet) */
    uint32_t upd_samples[DT_FL_MAX_CLIENTS];
    int nupd, ndropped, nlate;
    dt_fl_sa_server *sa;        /* secure aggregation of the round (NULL: plain) */
    struct dt_fl_sa_round *sar; /* its exchange state (server_sa.c) */
};

/* Accepts, reads and writes whatever is ready, waiting at most until deadline; complete frames
 * go to dt_fl_server_on_frame. A peer that sends a malformed frame or closes is dropped with a
 * log line naming it and why. */
void dt_fl_server_pump(dt_fl_server *s, double deadline);
/* Queues a frame to conn c (dropping it when out of memory). */
void dt_fl_conn_queue(dt_fl_server *s, int c, uint16_t type, const void *payload, uint32_t len);
/* Closes conn c, logging why; marks it gone in the round. */
void dt_fl_conn_drop(dt_fl_server *s, int c, const char *why);
/* Drops a peer for something that strangers do by the thousand (idle, late, over a limit): the
 * log line is WARN when *count reaches 1, 10, 100, ... and INFO otherwise. */
void dt_fl_conn_drop_counted(dt_fl_server *s, int c, uint64_t *count, const char *why);
/* Drops the sampled clients that did not answer by the round's (or a secure-aggregation step's)
 * deadline: late[i] != 0 marks selection slot i. Counted in ndropped and nlate. */
void dt_fl_server_drop_late(dt_fl_server *s, const uint8_t *late, const char *what);
/* Frees every connection and the listener. */
void dt_fl_conns_close(dt_fl_server *s);
/* Pending output of every conn is flushed, or the deadline passed. */
void dt_fl_server_flush(dt_fl_server *s, double deadline);
/* Frees the secure-aggregation exchange state. */
void dt_fl_server_sa_free(dt_fl_server *s);
/* Handles one complete frame from conn c; returns non-zero to drop c (the error set says why). */
int dt_fl_server_on_frame(dt_fl_server *s, int c, uint16_t type, const uint8_t *p, uint32_t len);

#endif
