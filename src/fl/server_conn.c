/* The federated-learning server's connections: a listener plus non-blocking client sockets, one
 * poll loop that accepts, reads frames incrementally (headers checked before allocation) and
 * drains send queues, so that one slow, silent or hostile client never stalls the others. */
#include "fl/server_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

dt_status dt_fl_parse_addr(const char *spec, const char *flag, struct sockaddr_in *addr) {
    const char *colon = spec ? strrchr(spec, ':') : NULL;
    if (!colon || colon == spec)
        return dt_error(DT_EINVAL, "%s '%s': expected HOST:PORT (e.g. 127.0.0.1:7070)", flag, spec ? spec : "");
    char host[256], *end;
    size_t hl = (size_t)(colon - spec);
    if (hl >= sizeof host) return dt_error(DT_EINVAL, "%s: host name too long", flag);
    memcpy(host, spec, hl);
    host[hl] = '\0';
    long port = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || port < 0 || port > 65535)
        return dt_error(DT_EINVAL, "%s '%s': port must be 0..65535", flag, spec);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc) return dt_error(DT_EINVAL, "%s '%s': cannot resolve '%s' (%s)", flag, spec, host, gai_strerror(rc));
    memcpy(addr, res->ai_addr, sizeof *addr);
    addr->sin_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return DT_OK;
}

/* Index of the connection that has waited longest for its HELLO (-1: none). */
static int oldest_pending(const dt_fl_server *s) {
    int o = -1;
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].fd >= 0 && !s->conns[i].registered && (o < 0 || s->conns[i].since < s->conns[o].since)) o = i;
    return o;
}

static int pending(const dt_fl_server *s) {
    int n = 0;
    for (int i = 0; i < s->nconns; i++) n += s->conns[i].fd >= 0 && !s->conns[i].registered;
    return n;
}

/* Accepts one connection: 1 when one came (or was turned away), 0 when none waits. A peer that
 * would pass --max-pending makes the oldest pending one go, so idle strangers cannot lock the
 * clients out: they only push each other out. */
static int accept_one(dt_fl_server *s) {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    int fd = accept4(s->lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        int o = oldest_pending(s);
        if (o < 0) { /* every descriptor is a registered client's: let the listener rest a moment */
            dt_log(DT_LOG_WARN, "fl server: out of file descriptors (%s) with %d clients; raise `ulimit -n`",
                   strerror(errno), s->nconns);
            s->accept_pause = dt_now() + 0.5;
            return 0;
        }
        dt_fl_conn_drop_counted(s, o, &s->n_evicted, "out of file descriptors: making way for a new connection");
        return 1;
    }
    if (fd < 0) return 0;
    if (pending(s) >= s->cfg.max_pending)
        dt_fl_conn_drop_counted(s, oldest_pending(s), &s->n_evicted,
                                "no HELLO yet and `max_pending` connections wait for theirs: making way for a new one");
    if (s->nconns >= s->cap) { /* cannot happen: registered <= max_clients, pending < max_pending here */
        close(fd);
        return 1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    dt_fl_conn *c = &s->conns[s->nconns++];
    memset(c, 0, sizeof *c);
    c->fd = fd, c->since = dt_now();
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    snprintf(c->name, sizeof c->name, "peer %s:%d", ip, ntohs(a.sin_port));
    dt_fl_reader_init(&c->rd, DT_FL_HELLO_SIZE); /* a stranger gets HELLO's size, not a model's */
    return 1;
}

/* Drops the pending peers whose HELLO is overdue; returns the next such deadline (or `until`). */
static double expire_pending(dt_fl_server *s, double until) {
    double now = dt_now(), next = until;
    char why[96];
    for (int i = 0; i < s->nconns; i++) {
        dt_fl_conn *c = &s->conns[i];
        if (c->fd < 0 || c->registered) continue;
        double due = c->since + s->cfg.hello_timeout;
        if (due <= now) {
            snprintf(why, sizeof why, "no HELLO within %g s of connecting (`hello_timeout`)", s->cfg.hello_timeout);
            dt_fl_conn_drop_counted(s, i, &s->n_hello_late, why);
        } else if (due < next) {
            next = due;
        }
    }
    return next;
}

void dt_fl_conn_queue(dt_fl_server *s, int ci, uint16_t type, const void *payload, uint32_t len) {
    dt_fl_conn *c = &s->conns[ci];
    if (c->fd < 0) return;
    size_t need = c->tx_n - c->tx_off + DT_FL_HEADER + len;
    if (need > s->tx_max) { /* a client that does not read would make the server hold a model per round */
        char why[160];
        snprintf(why, sizeof why, "it does not read what the server sends: %zu bytes would be queued to it (limit %zu)",
                 need, s->tx_max);
        dt_fl_conn_drop(s, ci, why);
        return;
    }
    uint8_t *q = malloc(need);
    if (!q) {
        dt_fl_conn_drop(s, ci, "out of memory queueing a message");
        return;
    }
    size_t pending = c->tx_n - c->tx_off;
    if (pending) memcpy(q, c->tx + c->tx_off, pending);
    dt_fl_header_encode(q + pending, type, payload, len);
    if (len) memcpy(q + pending + DT_FL_HEADER, payload, len);
    free(c->tx);
    c->tx = q, c->tx_n = need, c->tx_off = 0;
    s->bytes_out += DT_FL_HEADER + len;
}

static void conn_close(dt_fl_server *s, int ci, dt_log_level lvl, const char *why, const char *more) {
    dt_fl_conn *c = &s->conns[ci];
    if (c->fd < 0) return;
    dt_log(lvl, "fl server: dropping %s: %s%s", c->name, why, more);
    close(c->fd);
    c->fd = -1;
    if (c->in_round) {
        s->sel[c->in_round - 1] = -1;
        s->ndropped++;
    }
    dt_fl_reader_free(&c->rd);
    free(c->tx);
    c->tx = NULL, c->tx_n = c->tx_off = 0;
}

void dt_fl_conn_drop(dt_fl_server *s, int ci, const char *why) { conn_close(s, ci, DT_LOG_WARN, why, ""); }

void dt_fl_conn_drop_counted(dt_fl_server *s, int ci, uint64_t *count, const char *why) {
    uint64_t n = ++*count, p = 1;
    while (p < n && p <= UINT64_MAX / 10) p *= 10;
    char more[64] = "";
    if (p == n && n > 1) snprintf(more, sizeof more, " (%llu such so far)", (unsigned long long)n);
    conn_close(s, ci, p == n ? DT_LOG_WARN : DT_LOG_INFO, why, more);
}

void dt_fl_server_drop_late(dt_fl_server *s, const uint8_t *late, const char *what) {
    char why[160];
    for (int i = 0; i < s->nsel; i++) {
        if (!late[i] || s->sel[i] < 0) continue;
        snprintf(why, sizeof why, "round %d: sent no %s by the deadline (%.1f s, `round_timeout`)", s->round + 1, what,
                 s->cfg.round_timeout);
        dt_fl_conn_drop(s, s->sel[i], why);
        s->nlate++;
    }
}

/* Removes closed connections, keeping the round's slot indices pointing at the right conns. */
static void compact(dt_fl_server *s) {
    int j = 0;
    for (int i = 0; i < s->nconns; i++) {
        if (s->conns[i].fd < 0) continue;
        if (s->conns[i].in_round) s->sel[s->conns[i].in_round - 1] = j;
        if (j != i) s->conns[j] = s->conns[i];
        j++;
    }
    s->nconns = j;
}

/* Drops conn ci for why: one log line each once it said HELLO, counted lines before (strangers
 * that connect and go, or talk another protocol, come by the thousand). */
static void drop_peer(dt_fl_server *s, int ci, const char *why) {
    if (s->conns[ci].registered) return dt_fl_conn_drop(s, ci, why);
    dt_fl_conn_drop_counted(s, ci, &s->n_stranger, why);
}

static void read_conn(dt_fl_server *s, int ci) {
    uint8_t buf[65536];
    dt_fl_conn *c = &s->conns[ci];
    ssize_t got = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (got == 0) return drop_peer(s, ci, "connection closed");
    if (got < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) drop_peer(s, ci, strerror(errno));
        return;
    }
    s->bytes_in += (uint64_t)got;
    size_t off = 0;
    while (off < (size_t)got && s->conns[ci].fd >= 0) {
        size_t used;
        int rc = dt_fl_reader_feed(&c->rd, buf + off, (size_t)got - off, &used);
        off += used;
        if (rc < 0) return drop_peer(s, ci, dt_last_error());
        if (rc == 1) {
            uint16_t type = c->rd.type;
            uint32_t len = c->rd.len;
            uint8_t *p = dt_fl_reader_take(&c->rd);
            int bad = dt_fl_server_on_frame(s, ci, type, p, len);
            free(p);
            if (bad) return drop_peer(s, ci, dt_last_error());
        }
    }
}

static void write_conn(dt_fl_server *s, int ci) {
    dt_fl_conn *c = &s->conns[ci];
    while (c->tx_off < c->tx_n) {
        ssize_t w = send(c->fd, c->tx + c->tx_off, c->tx_n - c->tx_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            c->tx_off += (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        return dt_fl_conn_drop(s, ci, "connection lost while sending");
    }
    free(c->tx);
    c->tx = NULL, c->tx_n = c->tx_off = 0;
}

void dt_fl_server_pump(dt_fl_server *s, double deadline) {
    double wake = expire_pending(s, deadline), now = dt_now();
    compact(s);
    struct pollfd *pf = s->pf;
    for (int i = 0; i < s->nconns; i++) {
        pf[i] = (struct pollfd){.fd = s->conns[i].fd, .events = POLLIN};
        if (s->conns[i].tx_n > s->conns[i].tx_off) pf[i].events |= POLLOUT;
    }
    int listening = now >= s->accept_pause;
    if (!listening && s->accept_pause < wake) wake = s->accept_pause;
    pf[s->nconns] = (struct pollfd){.fd = listening ? s->lfd : -1, .events = POLLIN};
    double left = wake - now;
    int ms = left <= 0 ? 0 : left > 1000 ? 1000000 : (int)(left * 1000) + 1;
    int n = s->nconns, rc = poll(pf, (nfds_t)n + 1, ms);
    if (rc <= 0) return;
    for (int i = 0; i < n; i++) {
        if (s->conns[i].fd < 0) continue;
        if (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) read_conn(s, i);
        if (s->conns[i].fd >= 0 && (pf[i].revents & POLLOUT)) write_conn(s, i);
    }
    compact(s);
    if (pf[n].revents & POLLIN) /* a burst of connections is taken in one go (and pruned at once) */
        for (int k = 0; k < 64 && accept_one(s); k++) compact(s);
}

void dt_fl_server_flush(dt_fl_server *s, double deadline) {
    for (;;) {
        int pending = 0;
        for (int i = 0; i < s->nconns; i++) pending |= s->conns[i].tx_n > s->conns[i].tx_off;
        if (!pending || dt_now() >= deadline) return;
        dt_fl_server_pump(s, deadline);
    }
}

void dt_fl_conns_close(dt_fl_server *s) {
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].fd >= 0) {
            close(s->conns[i].fd);
            dt_fl_reader_free(&s->conns[i].rd);
            free(s->conns[i].tx);
        }
    s->nconns = 0;
    if (s->lfd >= 0) close(s->lfd);
    s->lfd = -1;
}
