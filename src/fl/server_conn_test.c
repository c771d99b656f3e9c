/* Tests of the federated-learning server's limits on its peers, over real loopback TCP against
 * the server's own poll loop (issue 37): the oldest pending peer makes way past --max-pending, so
 * idle connections cannot lock a client out; a peer gets HELLO's 12 bytes of frame before its
 * HELLO (a larger header is refused before anything is allocated) and its model's update size
 * after; --hello-timeout closes idle peers; --max-clients counts registered clients only; a client
 * that does not read is dropped before a third model is queued to it. */
#include "core/test.h"
#include "fl/server_internal.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static dt_model *model(void) {
    dt_model *m;
    if (dt_model_create_from_spec(&m, "linear(4)", 1, 1, 6) != DT_OK) return NULL;
    dt_model_init(m, 1);
    return m;
}

static dt_fl_server *server(dt_model *m, int max_clients, int max_pending, double hello_timeout) {
    dt_fl_server_config c = {.listen = "127.0.0.1:0",
                             .rounds = 1,
                             .clients_per_round = 1,
                             .round_timeout = 1,
                             .wait_timeout = 1,
                             .hello_timeout = hello_timeout,
                             .max_clients = max_clients,
                             .max_pending = max_pending,
                             .lr = 0.1f,
                             .quiet = 1};
    dt_fl_server *s = NULL;
    CHECK_OK(dt_fl_server_create(&s, &c, m, NULL));
    return s;
}

static int dial(const dt_fl_server *s) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)dt_fl_server_port(s))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) close(fd), fd = -1;
    return fd;
}

static void hello(int fd, uint64_t id) {
    dt_fl_buf b = {0};
    dt_fl_hello h = {id, 5};
    CHECK_OK(dt_fl_hello_encode(&b, &h));
    CHECK_OK(dt_fl_send(fd, DT_FL_HELLO, b.p, (uint32_t)b.n, dt_now() + 10, "test"));
    dt_fl_buf_free(&b);
}

/* Whether the server closed fd (EOF or reset), waiting up to `wait` seconds while it pumps. */
static int closed(dt_fl_server *s, int fd, double wait) {
    double end = dt_now() + wait;
    for (;;) {
        dt_fl_server_pump(s, dt_now() + 0.02);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        char c;
        if (poll(&p, 1, 0) == 1 && recv(fd, &c, 1, MSG_DONTWAIT) <= 0) return 1;
        if (dt_now() >= end) return 0;
    }
}

static int count(const dt_fl_server *s, int reg) {
    int n = 0;
    for (int i = 0; i < s->nconns; i++) n += s->conns[i].fd >= 0 && s->conns[i].registered == reg;
    return n;
}

/* Pumps until the server has taken `want` connections in all, held or evicted (at most `wait` s:
 * a hang guard). */
static void settle(dt_fl_server *s, int want, double wait) {
    for (double end = dt_now() + wait; s->nconns + (int)s->n_evicted < want && dt_now() < end;)
        dt_fl_server_pump(s, dt_now() + 0.02);
}

static void pump_for(dt_fl_server *s, double secs) {
    for (double end = dt_now() + secs; dt_now() < end;) dt_fl_server_pump(s, end);
}

/* 10 idle peers against --max-pending 4: the 6 oldest go; a real client still registers. */
static void test_pending_limit(dt_model *m) {
    dt_fl_server *s = server(m, 2, 4, 100);
    int fd[10];
    for (int i = 0; i < 10; i++) fd[i] = dial(s), settle(s, i + 1, 10);
    CHECK_MSG(count(s, 0) == 4, "%d pending", count(s, 0));
    for (int i = 0; i < 6; i++) CHECK_MSG(closed(s, fd[i], 10), "idle peer %d (one of the oldest) still open", i);
    for (int i = 6; i < 10; i++) CHECK_MSG(!closed(s, fd[i], 0), "idle peer %d (one of the newest) closed", i);
    CHECK(s->n_evicted == 6);
    int c = dial(s);
    hello(c, 42);
    for (double end = dt_now() + 10; count(s, 1) < 1 && dt_now() < end;) dt_fl_server_pump(s, dt_now() + 0.02);
    CHECK_MSG(count(s, 1) == 1 && count(s, 0) == 3, "%d registered, %d pending", count(s, 1), count(s, 0));
    for (int i = 0; i < 10; i++) close(fd[i]);
    close(c);
    dt_fl_server_destroy(s);
}

/* Before HELLO a peer's frame limit is HELLO's 12 bytes (a 13-byte header is refused with nothing
 * allocated); after it, the model's update (12 + 4 n bytes). */
static void test_frame_limits(dt_model *m) {
    dt_fl_server *s = server(m, 2, 4, 100);
    CHECK_MSG(s->frame_max == 12 + 4 * s->np, "frame_max %u for %zu parameters", s->frame_max, s->np);
    int a = dial(s), b = dial(s);
    settle(s, 2, 10);
    for (int i = 0; i < s->nconns; i++) CHECK(s->conns[i].rd.max_len == DT_FL_HELLO_SIZE);
    uint8_t hdr[DT_FL_HEADER], junk[13] = {0};
    dt_fl_header_encode(hdr, DT_FL_HELLO, junk, 13);
    CHECK(send(a, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr);
    CHECK_MSG(closed(s, a, 10), "a 13-byte frame before HELLO was not refused");
    CHECK(strstr(dt_last_error(), "exceeds the limit of 12") != NULL);
    uint8_t big[DT_FL_HEADER]; /* a 60 MiB declaration: refused at its header, nothing allocated */
    dt_fl_header_encode(big, DT_FL_UPDATE, NULL, 60u << 20);
    CHECK(send(b, big, 12, 0) == 12); /* part of it: still no allocation */
    pump_for(s, 0.2);
    for (int i = 0; i < s->nconns; i++) CHECK(s->conns[i].rd.payload == NULL);
    CHECK(send(b, big + 12, sizeof big - 12, 0) == (ssize_t)sizeof big - 12);
    CHECK_MSG(closed(s, b, 10), "a 60 MiB frame before HELLO was not refused");
    int c = dial(s);
    hello(c, 7);
    for (double end = dt_now() + 10; count(s, 1) < 1 && dt_now() < end;) dt_fl_server_pump(s, dt_now() + 0.02);
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].registered) CHECK(s->conns[i].rd.max_len == s->frame_max);
    close(a), close(b), close(c);
    dt_fl_server_destroy(s);
}

/* --hello-timeout 0.2: an idle peer is closed (the hang guard is 30 s), a registered one is not. */
static void test_hello_deadline(dt_model *m) {
    dt_fl_server *s = server(m, 2, 4, 0.2);
    int idle = dial(s), c = dial(s);
    hello(c, 9);
    CHECK_MSG(closed(s, idle, 30), "an idle peer outlived --hello-timeout");
    CHECK(s->n_hello_late == 1);
    CHECK_MSG(!closed(s, c, 0.5) && count(s, 1) == 1, "the client that said HELLO was closed");
    close(idle), close(c);
    dt_fl_server_destroy(s);
}

/* --max-clients 2 counts registered clients: a third HELLO is refused, pending peers are not counted. */
static void test_max_clients(dt_model *m) {
    dt_fl_server *s = server(m, 2, 4, 100);
    int idle[3], c[3];
    for (int i = 0; i < 3; i++) idle[i] = dial(s);
    for (int i = 0; i < 2; i++) c[i] = dial(s), hello(c[i], (uint64_t)i + 1);
    for (double end = dt_now() + 10; count(s, 1) < 2 && dt_now() < end;) dt_fl_server_pump(s, dt_now() + 0.02);
    CHECK_MSG(count(s, 1) == 2, "%d registered with 3 idle peers around", count(s, 1));
    c[2] = dial(s), hello(c[2], 3);
    CHECK_MSG(closed(s, c[2], 10), "a third client was registered past --max-clients 2");
    CHECK(s->n_full == 1 && count(s, 1) == 2);
    for (int i = 0; i < 3; i++) close(idle[i]), close(c[i]);
    dt_fl_server_destroy(s);
}

/* Models queued to a registered client that reads nothing: once the kernel's socket buffers are
 * full, the server's queue grows by a model a round until a third would pass tx_max (two models
 * and 1 MiB) and the client is dropped; one that reads them keeps getting them. A 1M-parameter
 * model (4 MB) so that a few rounds outgrow the kernel's buffers. */
static void test_send_queue(void) {
    dt_model *m;
    CHECK_OK(dt_model_create_from_spec(&m, "linear(1000)", 1, 1, 1000));
    dt_fl_server *s = server(m, 2, 4, 100);
    int deaf = dial(s), ok = dial(s);
    hello(deaf, 1), hello(ok, 2);
    for (double end = dt_now() + 10; count(s, 1) < 2 && dt_now() < end;) dt_fl_server_pump(s, dt_now() + 0.02);
    CHECK(count(s, 1) == 2);
    size_t len = 48 + 4 * s->np, most = 0;
    uint8_t *model = calloc(1, len), *sink = malloc(1 << 20);
    CHECK(s->tx_max == 2 * (DT_FL_HEADER + len) + (1u << 20));
    int rounds = 0;
    for (; rounds < 40 && count(s, 1) == 2; rounds++) {
        for (int i = 0; i < s->nconns; i++) dt_fl_conn_queue(s, i, DT_FL_MODEL, model, (uint32_t)len);
        for (int i = 0; i < s->nconns; i++)
            if (s->conns[i].fd >= 0 && s->conns[i].tx_n - s->conns[i].tx_off > most)
                most = s->conns[i].tx_n - s->conns[i].tx_off;
        /* the reading client drains its queue; the deaf one never reads */
        for (double end = dt_now() + 30; dt_now() < end;) {
            dt_fl_server_pump(s, dt_now() + 0.01);
            while (recv(ok, sink, 1 << 20, MSG_DONTWAIT) > 0) {}
            int queued = 0;
            for (int i = 0; i < s->nconns; i++)
                queued |= s->conns[i].fd >= 0 && s->conns[i].id == 2 && s->conns[i].tx_n > s->conns[i].tx_off;
            if (!queued) break;
        }
    }
    int deaf_held = 0; /* the server's side: the deaf client's socket may still hold unread models */
    for (int i = 0; i < s->nconns; i++) deaf_held |= s->conns[i].fd >= 0 && s->conns[i].id == 1;
    CHECK_MSG(!deaf_held, "a client that reads nothing is still connected after %d models", rounds);
    CHECK_MSG(most <= s->tx_max, "%zu bytes were queued to one client (limit %zu)", most, s->tx_max);
    CHECK_MSG(count(s, 1) == 1 && !closed(s, ok, 0.1), "the client that reads was dropped");
    free(model), free(sink);
    close(deaf), close(ok);
    dt_fl_server_destroy(s);
    dt_model_destroy(m);
}

int main(void) {
    dt_model *m = model();
    CHECK(m != NULL);
    if (m) {
        test_pending_limit(m);
        test_frame_limits(m);
        test_hello_deadline(m);
        test_max_clients(m);
        test_send_queue();
    }
    dt_model_destroy(m);
    return dt_test_summary("server_conn_test");
}
