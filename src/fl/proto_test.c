/* Tests of the federated-learning wire protocol: frames round-trip whole and byte by byte;
 * truncated, oversized, bit-flipped and foreign frames are refused before any payload is
 * allocated; message decoders refuse bad counts, lengths and non-finite values. */
#include "core/test.h"
#include "fl/fl.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static size_t frame(uint8_t *out, uint16_t type, const void *p, uint32_t len) {
    dt_fl_header_encode(out, type, p, len);
    memcpy(out + DT_FL_HEADER, p, len);
    return DT_FL_HEADER + len;
}

/* Feeds buf[0..n) in chunks of `step`; returns 1 frame ready, 0 incomplete, <0 error. */
static int feed_all(dt_fl_reader *r, const uint8_t *buf, size_t n, size_t step) {
    size_t off = 0;
    while (off < n) {
        size_t k = n - off < step ? n - off : step, used;
        int rc = dt_fl_reader_feed(r, buf + off, k, &used);
        off += used;
        if (rc) return rc;
    }
    return 0;
}

static void test_frames(void) {
    uint8_t payload[300], buf[400];
    for (int i = 0; i < 300; i++) payload[i] = (uint8_t)(i * 7 + 1);
    size_t n = frame(buf, DT_FL_UPDATE, payload, 300);
    for (size_t step = 1; step <= n; step = step * 3 + 1) {
        dt_fl_reader r;
        dt_fl_reader_init(&r, 1000);
        CHECK(feed_all(&r, buf, n, step) == 1);
        CHECK(r.type == DT_FL_UPDATE && r.len == 300);
        uint8_t *p = dt_fl_reader_take(&r);
        CHECK(p && !memcmp(p, payload, 300));
        free(p);
        dt_fl_reader_free(&r);
    }
    /* truncated: never completes */
    for (size_t cut = 0; cut < n; cut += 37) {
        dt_fl_reader r;
        dt_fl_reader_init(&r, 1000);
        CHECK(feed_all(&r, buf, cut, 5) == 0);
        dt_fl_reader_free(&r);
    }
    /* oversized: refused at the header, before the payload is allocated */
    dt_fl_reader r;
    dt_fl_reader_init(&r, 299);
    CHECK(feed_all(&r, buf, DT_FL_HEADER, 64) == DT_EFORMAT);
    CHECK(r.payload == NULL);
    CHECK(strstr(dt_last_error(), "exceeds the limit") != NULL);
    dt_fl_reader_free(&r);
    /* every single bit flip anywhere in the frame is caught */
    int caught = 0, total = 0;
    for (size_t byte = 0; byte < n; byte++)
        for (int bit = 0; bit < 8; bit++) {
            buf[byte] ^= (uint8_t)(1 << bit);
            dt_fl_reader_init(&r, 1000);
            int rc = feed_all(&r, buf, n, 64);
            caught += rc < 0; /* the header CRC covers the length: a flip is refused, never awaited */
            total++;
            dt_fl_reader_free(&r);
            buf[byte] ^= (uint8_t)(1 << bit);
        }
    CHECK_MSG(caught == total, "%d of %d bit flips caught", caught, total);
    /* wrong magic and version are named */
    buf[0] ^= 1;
    dt_fl_reader_init(&r, 1000);
    CHECK(feed_all(&r, buf, n, 64) == DT_EFORMAT && strstr(dt_last_error(), "magic"));
    dt_fl_reader_free(&r);
    buf[0] ^= 1;
}

static void test_socket(void) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    uint8_t payload[5000];
    for (int i = 0; i < 5000; i++) payload[i] = (uint8_t)i;
    CHECK_OK(dt_fl_send(sv[0], DT_FL_MODEL, payload, 5000, dt_now() + 10, "test"));
    CHECK_OK(dt_fl_send(sv[0], DT_FL_BYE, NULL, 0, dt_now() + 10, "test"));
    dt_fl_reader r;
    dt_fl_reader_init(&r, DT_FL_MAX_PAYLOAD);
    uint16_t type;
    uint8_t *p = NULL;
    uint32_t len;
    CHECK_OK(dt_fl_recv(sv[1], &r, &type, &p, &len, dt_now() + 10, "test"));
    CHECK(type == DT_FL_MODEL && len == 5000 && p && !memcmp(p, payload, 5000));
    free(p);
    CHECK_OK(dt_fl_recv(sv[1], &r, &type, &p, &len, dt_now() + 10, "test"));
    CHECK(type == DT_FL_BYE && len == 0);
    free(p);
    /* nothing more: the deadline ends the wait */
    CHECK(dt_fl_recv(sv[1], &r, &type, &p, &len, dt_now() + 0.05, "peer 3") == DT_ETIMEDOUT);
    CHECK(strstr(dt_last_error(), "peer 3") != NULL);
    close(sv[0]);
    CHECK(dt_fl_recv(sv[1], &r, &type, &p, &len, dt_now() + 10, "peer 3") == DT_EPEER);
    dt_fl_reader_free(&r);
    close(sv[1]);
}

static void test_messages(void) {
    float params[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    dt_fl_buf b = {0};
    dt_fl_model_msg m = {
        .round = 3, .epochs = 2, .batch = 16, .lr = 0.1f, .mu = 0.01f, .seed = 9, .n = 10, .params = params};
    CHECK_OK(dt_fl_model_encode(&b, &m));
    dt_fl_model_msg d;
    CHECK_OK(dt_fl_model_decode(b.p, (uint32_t)b.n, &d));
    CHECK(d.round == 3 && d.epochs == 2 && d.batch == 16 && d.n == 10 && d.seed == 9 && d.params[9] == 10);
    CHECK(dt_fl_model_decode(b.p, (uint32_t)b.n - 1, &d) == DT_EFORMAT);
    CHECK(dt_fl_model_decode(b.p, 20, &d) == DT_EFORMAT);
    b.p[44] = 0xff, b.p[45] = 0xff, b.p[46] = 0xff, b.p[47] = 0x7f; /* n = 2^31-1 */
    CHECK(dt_fl_model_decode(b.p, (uint32_t)b.n, &d) == DT_EFORMAT && strstr(dt_last_error(), "limit"));
    dt_fl_buf_free(&b);

    dt_fl_update_msg u = {.round = 1, .samples = 50, .n = 10, .delta = params};
    CHECK_OK(dt_fl_update_encode(&b, &u));
    dt_fl_update_msg du;
    CHECK_OK(dt_fl_update_decode(b.p, (uint32_t)b.n, 10, &du));
    CHECK(du.samples == 50 && du.delta[0] == 1);
    CHECK(dt_fl_update_decode(b.p, (uint32_t)b.n, 11, &du) == DT_EFORMAT);
    uint32_t nan = 0x7fc00000;
    memcpy(b.p + 12 + 4 * 5, &nan, 4);
    CHECK(dt_fl_update_decode(b.p, (uint32_t)b.n, 10, &du) == DT_EFORMAT && strstr(dt_last_error(), "finite"));
    dt_fl_buf_free(&b);

    dt_fl_hello h = {77, 600}, dh;
    CHECK_OK(dt_fl_hello_encode(&b, &h));
    CHECK_OK(dt_fl_hello_decode(b.p, (uint32_t)b.n, &dh));
    CHECK(dh.client_id == 77 && dh.samples == 600);
    CHECK(dt_fl_hello_decode(b.p, (uint32_t)b.n + 0 - 1, &dh) == DT_EFORMAT);
    dt_fl_buf_free(&b);
}

int main(void) {
    test_frames();
    test_socket();
    test_messages();
    return dt_test_summary("proto_test");
}
