/* The federated-learning wire protocol: frame headers (magic, version, type, length, CRC32 of
 * header and payload), an incremental reader that checks every header field against limits
 * before allocating, deadline-bounded send/receive on sockets, and the bounds-checked cursor
 * the message decoders use. */
#include "fl/fl.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint32_t crc(const void *p, size_t n) { return (uint32_t)crc32(0L, (const Bytef *)p, (uInt)n); }

void dt_fl_header_encode(uint8_t *hdr, uint16_t type, const void *payload, uint32_t len) {
    put32(hdr, DT_FL_MAGIC);
    hdr[4] = DT_FL_VERSION & 0xff, hdr[5] = DT_FL_VERSION >> 8;
    hdr[6] = (uint8_t)type, hdr[7] = (uint8_t)(type >> 8);
    put32(hdr + 8, len);
    put32(hdr + 12, len ? crc(payload, len) : 0);
    put32(hdr + 16, crc(hdr, 16));
}

dt_status dt_fl_header_decode(const uint8_t *hdr, uint32_t max_len, uint16_t *type, uint32_t *len, uint32_t *pcrc) {
    if (get32(hdr) != DT_FL_MAGIC)
        return dt_error(DT_EFORMAT, "fl frame: bad magic 0x%08x (not a dtrain fl peer?)", get32(hdr));
    unsigned ver = hdr[4] | hdr[5] << 8;
    if (ver != DT_FL_VERSION)
        return dt_error(DT_EFORMAT, "fl frame: protocol version %u, this build speaks %u (upgrade both sides)", ver,
                        DT_FL_VERSION);
    if (get32(hdr + 16) != crc(hdr, 16)) return dt_error(DT_EFORMAT, "fl frame: header checksum mismatch");
    *type = (uint16_t)(hdr[6] | hdr[7] << 8);
    *len = get32(hdr + 8);
    *pcrc = get32(hdr + 12);
    if (*type < 1 || *type > DT_FL_TYPE_MAX) return dt_error(DT_EFORMAT, "fl frame: unknown message type %u", *type);
    if (*len > max_len)
        return dt_error(DT_EFORMAT, "fl frame: payload of %u bytes exceeds the limit of %u", *len, max_len);
    return DT_OK;
}

void dt_fl_reader_init(dt_fl_reader *r, uint32_t max_len) {
    memset(r, 0, sizeof *r);
    r->max_len = max_len;
}

void dt_fl_reader_free(dt_fl_reader *r) {
    free(r->payload);
    r->payload = NULL;
    r->have = 0;
}

uint8_t *dt_fl_reader_take(dt_fl_reader *r) {
    uint8_t *p = r->payload;
    r->payload = NULL;
    r->have = 0;
    return p;
}

int dt_fl_reader_feed(dt_fl_reader *r, const uint8_t *data, size_t n, size_t *used) {
    *used = 0;
    if (r->have < DT_FL_HEADER) {
        size_t k = DT_FL_HEADER - r->have;
        if (k > n) k = n;
        memcpy(r->hdr + r->have, data, k);
        r->have += (uint32_t)k, *used += k, data += k, n -= k;
        if (r->have >= 4 && r->have < DT_FL_HEADER && get32(r->hdr) != DT_FL_MAGIC) /* refuse a stranger early */
            return dt_error(DT_EFORMAT, "fl frame: bad magic 0x%08x (not a dtrain fl peer?)", get32(r->hdr));
        if (r->have < DT_FL_HEADER) return 0;
        dt_status s = dt_fl_header_decode(r->hdr, r->max_len, &r->type, &r->len, &r->crc);
        if (s != DT_OK) return s;
        r->payload = malloc(r->len ? r->len : 1);
        if (!r->payload) return dt_error(DT_ENOMEM, "fl frame: out of memory for %u bytes", r->len);
    }
    uint32_t got = r->have - DT_FL_HEADER;
    size_t k = r->len - got;
    if (k > n) k = n;
    memcpy(r->payload + got, data, k);
    r->have += (uint32_t)k, *used += k;
    if (r->have - DT_FL_HEADER < r->len) return 0;
    if (r->len && crc(r->payload, r->len) != r->crc) {
        dt_fl_reader_free(r);
        return dt_error(DT_EFORMAT, "fl frame: payload checksum mismatch (%u bytes, type %u)", r->len, r->type);
    }
    return 1;
}

/* Waits until fd is ready for `events` or the deadline passes. */
static dt_status wait_fd(int fd, short events, double deadline, const char *who, const char *what) {
    for (;;) {
        double left = deadline - dt_now();
        if (left <= 0) return dt_error(DT_ETIMEDOUT, "fl: %s: deadline passed while %s", who, what);
        struct pollfd p = {.fd = fd, .events = events};
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
        int rc = poll(&p, 1, ms);
        if (rc > 0) return DT_OK;
        if (rc < 0 && errno != EINTR) return dt_error(DT_EIO, "fl: %s: poll: %s", who, strerror(errno));
    }
}

static dt_status send_all(int fd, const uint8_t *p, size_t n, double deadline, const char *who) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w, n -= (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            DT_TRY(wait_fd(fd, POLLOUT, deadline, who, "sending"));
            continue;
        }
        return dt_error(DT_EPEER, "fl: %s: connection lost while sending (%s)", who,
                        w < 0 ? strerror(errno) : "closed");
    }
    return DT_OK;
}

dt_status dt_fl_send(int fd, uint16_t type, const void *payload, uint32_t len, double deadline, const char *who) {
    uint8_t hdr[DT_FL_HEADER];
    dt_fl_header_encode(hdr, type, payload, len);
    DT_TRY(send_all(fd, hdr, sizeof hdr, deadline, who));
    return send_all(fd, payload, len, deadline, who);
}

dt_status dt_fl_recv(int fd, dt_fl_reader *r, uint16_t *type, uint8_t **payload, uint32_t *len, double deadline,
                     const char *who) {
    uint8_t buf[65536];
    for (;;) {
        /* never read past the current frame: bytes of the next one stay in the socket */
        size_t want = r->have < DT_FL_HEADER ? DT_FL_HEADER - r->have : r->len - (r->have - DT_FL_HEADER);
        if (want > sizeof buf) want = sizeof buf;
        ssize_t got = want ? recv(fd, buf, want, MSG_DONTWAIT) : 0;
        if (got == 0 && want) return dt_error(DT_EPEER, "fl: %s: connection closed", who);
        if (got < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return dt_error(DT_EPEER, "fl: %s: connection lost (%s)", who, strerror(errno));
            DT_TRY(wait_fd(fd, POLLIN, deadline, who, "waiting for a message"));
            continue;
        }
        size_t used;
        int rc = dt_fl_reader_feed(r, buf, (size_t)got, &used);
        if (rc < 0) return dt_error_wrap(rc, "fl: %s", who);
        if (rc == 1) {
            *type = r->type, *len = r->len;
            *payload = dt_fl_reader_take(r);
            return DT_OK;
        }
    }
}

/* ---- cursor and writer -------------------------------------------------------------------- */

const uint8_t *dt_fl_get_bytes(dt_fl_cur *c, size_t n) {
    if (c->bad || n > c->n - c->off) {
        c->bad = 1;
        return NULL;
    }
    const uint8_t *p = c->p + c->off;
    c->off += n;
    return p;
}
uint32_t dt_fl_get_u32(dt_fl_cur *c) {
    const uint8_t *p = dt_fl_get_bytes(c, 4);
    return p ? get32(p) : 0;
}
uint64_t dt_fl_get_u64(dt_fl_cur *c) {
    uint64_t lo = dt_fl_get_u32(c);
    return lo | (uint64_t)dt_fl_get_u32(c) << 32;
}
float dt_fl_get_f32(dt_fl_cur *c) {
    uint32_t u = dt_fl_get_u32(c);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void dt_fl_put_bytes(dt_fl_buf *b, const void *p, size_t n) {
    if (b->bad) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) {
            b->bad = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
void dt_fl_put_u32(dt_fl_buf *b, uint32_t v) {
    uint8_t q[4];
    put32(q, v);
    dt_fl_put_bytes(b, q, 4);
}
void dt_fl_put_u64(dt_fl_buf *b, uint64_t v) {
    dt_fl_put_u32(b, (uint32_t)v);
    dt_fl_put_u32(b, (uint32_t)(v >> 32));
}
void dt_fl_put_f32(dt_fl_buf *b, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    dt_fl_put_u32(b, u);
}
void dt_fl_buf_free(dt_fl_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
