/* The federated-learning client: connects to the server (reconnecting with jittered exponential
 * back-off while it is away, e.g. restarting from its checkpoint, or turns the client away),
 * announces its sample count, and for each model it receives trains locally and sends the
 * update, in the clear or through the secure-aggregation exchange. Test hooks make it die, fall
 * silent or send garbage. */
#include "fl/fl.h"
#include "fl/secagg.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const dt_fl_client_config *cfg;
    dt_model *m;
    const dt_dataset *ds;
    int fd;
    dt_fl_reader rd;
    char who[96];
    float *delta;
    int sent;
    int heard;      /* the current session got a message from the server */
    double wait;    /* the next back-off (s): 0.1 doubling to 2 */
    double give_up; /* when failures in a row started + connect_timeout (0: none in a row) */
    uint64_t tries; /* back-offs taken: the jitter's index */
} client;

static void nap(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)}, rest;
    while (nanosleep(&t, &rest) != 0 && errno == EINTR) t = rest; /* a signal must not shorten a back-off */
}

#define BACKOFF_MIN 0.1
#define BACKOFF_MAX 2.0

static void backoff_reset(client *c) { c->wait = BACKOFF_MIN, c->give_up = 0; }

/* Sleeps before the next attempt after a failure (why): a time drawn from [w/2, w) by client id
 * (clients that lost the server together do not come back together), then w doubles up to 2 s.
 * DT_ETIMEDOUT naming the server once connect_timeout has passed since the first failure in a row. */
static dt_status backoff(client *c, const char *why) {
    double now = dt_now();
    if (c->give_up == 0) c->give_up = now + c->cfg->connect_timeout;
    double u = (double)(dt_rng_u64(c->cfg->client_id, dt_rng_key(DT_RNG_USER + 19, 0), c->tries++) >> 11) * 0x1p-53;
    double t = c->wait * (0.5 + 0.5 * u);
    if (now + t > c->give_up)
        return dt_error(DT_ETIMEDOUT,
                        "fl client %llu: no session with the server %s for %g s (`connect_timeout`); "
                        "last: %s. Is fl-server running there, with room for this client (`max_clients`)?",
                        (unsigned long long)c->cfg->client_id, c->cfg->server, c->cfg->connect_timeout, why);
    nap(t);
    c->wait = c->wait * 2 > BACKOFF_MAX ? BACKOFF_MAX : c->wait * 2;
    return DT_OK;
}

/* Connects, backing off between attempts (DT_ETIMEDOUT when the server stays unreachable). */
static dt_status connect_backoff(client *c) {
    struct sockaddr_in a;
    DT_TRY(dt_fl_parse_addr(c->cfg->server, "`server`", &a));
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return dt_error(DT_EIO, "fl client: socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            c->fd = fd;
            return DT_OK;
        }
        char why[128];
        snprintf(why, sizeof why, "connect: %s", strerror(errno));
        close(fd);
        DT_TRY(backoff(c, why));
    }
}

static dt_status send_buf(client *c, uint16_t type, dt_fl_buf *b) {
    dt_status s = b->bad ? dt_error(DT_ENOMEM, "fl client: out of memory")
                         : dt_fl_send(c->fd, type, b->p, (uint32_t)b->n, dt_now() + c->cfg->idle_timeout, c->who);
    dt_fl_buf_free(b);
    return s;
}

/* Receives the next frame, which must be of `type` (BYE ends the run: DT_EINTR). */
static dt_status expect(client *c, uint16_t type, uint8_t **p, uint32_t *len) {
    uint16_t got;
    DT_TRY(dt_fl_recv(c->fd, &c->rd, &got, p, len, dt_now() + c->cfg->idle_timeout, c->who));
    c->heard = 1;
    if (got == DT_FL_BYE) {
        free(*p);
        *p = NULL;
        return DT_EINTR;
    }
    if (got != type) {
        free(*p);
        *p = NULL;
        return dt_error(DT_EFORMAT, "fl client: expected message type %u from the server, got %u", type, got);
    }
    return DT_OK;
}

/* The secure exchange after local training: roster -> shares -> masked input -> unmasking. */
static dt_status secure_update(client *c, const dt_fl_model_msg *mm, dt_fl_sa_client *sa) {
    uint8_t *p = NULL;
    uint32_t len;
    DT_TRY(expect(c, DT_FL_SA_ROSTER, &p, &len));
    dt_fl_cur cur = {p, len, 0, 0};
    static __thread dt_fl_sa_roster r;
    uint32_t round = dt_fl_get_u32(&cur), n = dt_fl_get_u32(&cur), t = dt_fl_get_u32(&cur), slot = dt_fl_get_u32(&cur);
    dt_status s = DT_OK;
    if (cur.bad || round != mm->round || n < 2 || n > DT_SA_MAX || len != 16 + 64 * n)
        s = dt_error(DT_EFORMAT, "fl client: a malformed secure-aggregation roster (%u bytes)", len);
    r.n = (int)n, r.t = (int)t;
    for (uint32_t v = 0; s == DT_OK && v < n; v++)
        memcpy(r.cpk[v], dt_fl_get_bytes(&cur, 32), 32), memcpy(r.spk[v], dt_fl_get_bytes(&cur, 32), 32);
    free(p);
    dt_fl_buf b = {0};
    dt_fl_put_u32(&b, mm->round);
    if (s == DT_OK) s = dt_fl_sa_client_share(sa, &r, (int)slot, &b);
    if (s == DT_OK) s = send_buf(c, DT_FL_SA_SHARES, &b);
    dt_fl_buf_free(&b);
    DT_TRY(s);
    DT_TRY(expect(c, DT_FL_SA_SHARES, &p, &len));
    cur = (dt_fl_cur){p, len, 0, 0};
    round = dt_fl_get_u32(&cur), n = dt_fl_get_u32(&cur);
    uint8_t alive2[DT_SA_MAX + 1] = {0};
    const uint8_t *a = dt_fl_get_bytes(&cur, n);
    if (cur.bad || round != mm->round || n != (uint32_t)r.n)
        s = dt_error(DT_EFORMAT, "fl client: malformed forwarded shares");
    if (s == DT_OK) memcpy(alive2 + 1, a, n), s = dt_fl_sa_client_receive(sa, p + cur.off, len - cur.off);
    free(p);
    DT_TRY(s);
    size_t words = mm->n + 1;
    uint32_t *x = malloc(words * 4), *y = malloc(words * 4);
    if (!x || !y) s = dt_error(DT_ENOMEM, "fl client: out of memory");
    double w = (mm->flags & DT_FL_F_UNWEIGHTED) ? 1.0 : (double)dt_dataset_len(c->ds);
    if (s == DT_OK) {
        size_t cl = dt_fl_sa_encode(x, c->delta, mm->n, w, mm->range, (int)mm->frac);
        if (cl) dt_log(DT_LOG_WARN, "fl client: %zu update values clamped to +-%g (`sa_range`)", cl, mm->range);
        float one = mm->range;
        dt_fl_sa_encode(x + mm->n, &one, 1, w, mm->range, (int)mm->frac);
        s = dt_fl_sa_client_mask(sa, alive2, x, words, y);
    }
    dt_fl_put_u32(&b, mm->round);
    if (s == DT_OK) dt_fl_put_bytes(&b, y, words * 4), s = send_buf(c, DT_FL_SA_MASKED, &b);
    free(x), free(y);
    dt_fl_buf_free(&b);
    DT_TRY(s);
    if (c->cfg->fault == DT_FL_FAULT_DROP_AFTER_MASK)
        return dt_error(DT_EINTR, "fault injection: dropped after masking");
    DT_TRY(expect(c, DT_FL_SA_UNMASK, &p, &len));
    cur = (dt_fl_cur){p, len, 0, 0};
    round = dt_fl_get_u32(&cur), n = dt_fl_get_u32(&cur);
    uint8_t alive3[DT_SA_MAX + 1] = {0};
    a = dt_fl_get_bytes(&cur, n);
    if (cur.bad || round != mm->round || n != (uint32_t)r.n || cur.off != len)
        s = dt_error(DT_EFORMAT, "fl client: malformed unmask request");
    if (s == DT_OK) memcpy(alive3 + 1, a, n);
    free(p);
    dt_fl_put_u32(&b, mm->round);
    if (s == DT_OK) s = dt_fl_sa_client_unmask(sa, alive3, &b);
    if (s == DT_OK) s = send_buf(c, DT_FL_SA_UNMASK, &b);
    dt_fl_buf_free(&b);
    return s;
}

/* Test hooks: act out a failure on the model just received. Returns DT_EINTR to stop. */
static dt_status fault(client *c) {
    switch (c->cfg->fault) {
    case DT_FL_FAULT_DIE: return dt_error(DT_EINTR, "fault injection: killed mid-round");
    case DT_FL_FAULT_SILENT: {
        uint16_t t;
        uint8_t *p = NULL;
        uint32_t len;
        /* never answer; read until the server says BYE or goes away */
        while (dt_fl_recv(c->fd, &c->rd, &t, &p, &len, dt_now() + c->cfg->idle_timeout, c->who) == DT_OK) {
            free(p);
            if (t == DT_FL_BYE) break;
        }
        return dt_error(DT_EINTR, "fault injection: stayed silent");
    }
    case DT_FL_FAULT_GARBAGE: {
        uint8_t junk[4096];
        dt_rng_fill_uniform((float *)junk, sizeof junk / 4, -1e30f, 1e30f, c->cfg->client_id, 99);
        dt_fl_send(c->fd, DT_FL_UPDATE, junk, 17, dt_now() + 5, c->who); /* a well framed, malformed update */
        (void)!send(c->fd, junk, sizeof junk, MSG_NOSIGNAL);             /* and raw noise */
        nap(0.2);
        return dt_error(DT_EINTR, "fault injection: sent garbage");
    }
    default: return DT_OK;
    }
}

static dt_status on_model(client *c, uint8_t *p, uint32_t len) {
    dt_fl_model_msg mm;
    DT_TRY(dt_fl_model_decode(p, len, &mm));
    dt_fl_sa_client *sa = NULL;
    if (mm.flags & DT_FL_F_SECURE) {
        DT_TRY(dt_fl_sa_client_create(&sa, mm.round, NULL));
        dt_fl_buf b = {0};
        uint8_t keys[64];
        dt_fl_sa_client_keys(sa, keys, keys + 32);
        dt_fl_put_u32(&b, mm.round);
        dt_fl_put_bytes(&b, keys, 64);
        dt_status s = send_buf(c, DT_FL_SA_KEYS, &b);
        if (s != DT_OK) return dt_fl_sa_client_free(sa), s;
    }
    if (c->cfg->fault != DT_FL_FAULT_NONE && c->cfg->fault != DT_FL_FAULT_DROP_AFTER_MASK) {
        dt_fl_sa_client_free(sa);
        return fault(c);
    }
    float loss;
    dt_status s = dt_fl_local_train(c->m, c->ds, mm.params, &mm, c->delta, &loss);
    if (s == DT_OK && mm.clip > 0) dt_fl_clip(c->delta, mm.n, mm.clip);
    if (s == DT_OK && sa) {
        s = secure_update(c, &mm, sa);
    } else if (s == DT_OK) {
        dt_fl_update_msg u = {
            .round = mm.round, .samples = (uint32_t)dt_dataset_len(c->ds), .n = mm.n, .delta = c->delta};
        dt_fl_buf b = {0};
        s = dt_fl_update_encode(&b, &u);
        if (s == DT_OK) s = send_buf(c, DT_FL_UPDATE, &b);
        dt_fl_buf_free(&b);
    }
    dt_fl_sa_client_free(sa);
    if (s == DT_OK) c->sent++;
    return s;
}

/* One connection's life: hello, then models until BYE (DT_OK) or the connection fails. */
static dt_status session(client *c) {
    dt_fl_buf b = {0};
    dt_fl_hello h = {c->cfg->client_id, (uint32_t)dt_dataset_len(c->ds)};
    DT_TRY(dt_fl_hello_encode(&b, &h));
    DT_TRY(send_buf(c, DT_FL_HELLO, &b));
    for (;;) {
        uint8_t *p = NULL;
        uint32_t len;
        dt_status s = expect(c, DT_FL_MODEL, &p, &len);
        if (s == DT_EINTR) return DT_OK; /* BYE */
        DT_TRY(s);
        s = on_model(c, p, len);
        free(p);
        DT_TRY(s);
    }
}

dt_status dt_fl_client_run(const dt_fl_client_config *cfg, dt_model *m, const dt_dataset *ds, int *rounds) {
    client c = {.cfg = cfg, .m = m, .ds = ds, .fd = -1};
    snprintf(c.who, sizeof c.who, "client %llu: server %s", (unsigned long long)cfg->client_id, cfg->server);
    if (dt_dataset_len(ds) == 0 || dt_dataset_len(ds) > UINT32_MAX)
        return dt_error(DT_EINVAL, "fl client %llu: %zu local samples", (unsigned long long)cfg->client_id,
                        dt_dataset_len(ds));
    if (!(c.delta = malloc(dt_model_num_params(m) * sizeof(float))))
        return dt_error(DT_ENOMEM, "fl client: out of memory");
    dt_status s;
    backoff_reset(&c);
    for (;;) {
        dt_fl_reader_init(&c.rd, DT_FL_MAX_PAYLOAD);
        c.heard = 0;
        s = connect_backoff(&c);
        if (s == DT_OK) s = session(&c);
        if (c.fd >= 0) close(c.fd), c.fd = -1;
        dt_fl_reader_free(&c.rd);
        if (s != DT_EPEER) break;
        /* the server went away (or restarts, or turned us away): reconnect after a back-off that
         * starts over only when this session got somewhere, so a server that closes every
         * connection at once sees (and logs) a few attempts, not a flood */
        if (c.heard) backoff_reset(&c);
        char why[256];
        snprintf(why, sizeof why, "%s", dt_last_error());
        if (!cfg->quiet)
            dt_log(DT_LOG_WARN, "fl client %llu: %s; reconnecting in %.1f-%.1f s", (unsigned long long)cfg->client_id,
                   why, c.wait / 2, c.wait);
        if ((s = backoff(&c, why)) != DT_OK) break;
    }
    free(c.delta);
    if (rounds) *rounds = c.sent;
    return s;
}
