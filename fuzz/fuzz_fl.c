/* libFuzzer target: the federated-learning wire protocol. The input is a byte stream as a peer
 * would send it, fed to the incremental frame reader in chunks whose sizes come from the input;
 * every complete frame goes to the decoder of its type (hello, model, update) and to the
 * secure-aggregation parsers (forwarded shares, unmasking records, masked input). */
#include "fuzz/fuzz_common.h"
#include "fl/fl.h"
#include "fl/secagg.h"

#include <stdlib.h>
#include <string.h>

static void decode(uint16_t type, const uint8_t *p, uint32_t len) {
    dt_fl_hello h;
    dt_fl_model_msg m;
    dt_fl_update_msg u;
    switch (type) {
    case DT_FL_HELLO: (void)dt_fl_hello_decode(p, len, &h); break;
    case DT_FL_MODEL: (void)dt_fl_model_decode(p, len, &m); break;
    case DT_FL_UPDATE: (void)dt_fl_update_decode(p, len, 0, &u); break;
    default: {
        /* a 3-member roster: the client's share parser and the server's unmasking parser */
        dt_fl_sa_roster r = {.n = 3, .t = 2};
        dt_fl_sa_client *c[3] = {0};
        dt_fl_buf b = {0};
        for (int i = 0; i < 3; i++) {
            uint8_t seed[32] = {(uint8_t)(i + 1)};
            if (dt_fl_sa_client_create(&c[i], 1, seed) != DT_OK) goto out;
            dt_fl_sa_client_keys(c[i], r.cpk[i], r.spk[i]);
        }
        if (dt_fl_sa_client_share(c[0], &r, 1, &b) != DT_OK) goto out;
        (void)dt_fl_sa_client_receive(c[0], p, len);
        dt_fl_sa_server *s;
        if (dt_fl_sa_server_create(&s, &r, 1, 4) == DT_OK) {
            for (int i = 1; i <= 3; i++) dt_fl_sa_server_shared(s, i);
            uint32_t y[4] = {1, 2, 3, 4}, sum[4];
            (void)dt_fl_sa_server_add_masked(s, 1, y, 4);
            (void)dt_fl_sa_server_add_masked(s, 2, y, 4);
            (void)dt_fl_sa_server_add_unmask(s, 1, p, len);
            (void)dt_fl_sa_server_add_unmask(s, 2, p, len);
            (void)dt_fl_sa_server_finish(s, sum);
            dt_fl_sa_server_free(s);
        }
    out:
        dt_fl_buf_free(&b);
        for (int i = 0; i < 3; i++) dt_fl_sa_client_free(c[i]);
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t step = (size_t)data[0] % 61 + 1; /* chunking as a socket might deliver it */
    data++, size--;
    dt_fl_reader r;
    dt_fl_reader_init(&r, 1u << 20);
    size_t off = 0;
    while (off < size) {
        size_t k = size - off < step ? size - off : step, used;
        int rc = dt_fl_reader_feed(&r, data + off, k, &used);
        off += used;
        if (rc < 0) break; /* the peer would be dropped here */
        if (rc == 1) {
            uint16_t type = r.type;
            uint32_t len = r.len;
            uint8_t *p = dt_fl_reader_take(&r);
            decode(type, p, len);
            free(p);
        }
    }
    dt_fl_reader_free(&r);
    return 0;
}
