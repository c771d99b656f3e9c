/* TensorBoard writer: CRC32C against its published check value and the bitwise definition (the
 * SSE4.2 path must agree with it), and the TFRecord frames of a written file (lengths, masked
 * CRCs) walked byte by byte; a directory that cannot be made is an error naming it. */
#include "core/test.h"
#include "dtrain/tensorboard.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t crc_bitwise(const unsigned char *b, size_t n) {
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) {
        c ^= b[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}

static uint32_t rd32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint32_t masked(const unsigned char *p, size_t n) {
    uint32_t c = dt_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

int main(void) {
    CHECK(dt_crc32c(0, "123456789", 9) == 0xE3069283u); /* the CRC-32C check value (RFC 3720) */
    unsigned char buf[1003];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131 + 7);
    for (size_t n = 0; n <= sizeof buf; n += 97) CHECK_MSG(dt_crc32c(0, buf, n) == crc_bitwise(buf, n), "n=%zu", n);
    CHECK(dt_crc32c(dt_crc32c(0, buf, 500), buf + 500, 503) == dt_crc32c(0, buf, 1003));

    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/dtrain-tb-test.%d/a/b", (int)getpid());
    dt_tb_writer *w = NULL;
    CHECK_OK(dt_tb_writer_create(&w, dir));
    const char *tags[] = {"x", "skipped"};
    const float vals[] = {1.5f, NAN};
    CHECK_OK(dt_tb_writer_scalars(w, 7, 1.7e9, tags, vals, 2));
    char path[4096];
    snprintf(path, sizeof path, "%s", dt_tb_writer_path(w));
    CHECK_OK(dt_tb_writer_destroy(w));
    FILE *f = fopen(path, "rb");
    unsigned char data[4096];
    size_t n = f ? fread(data, 1, sizeof data, f) : 0;
    if (f) fclose(f);
    int records = 0;
    size_t i = 0;
    while (i + 12 <= n) {
        uint64_t len = rd32(data + i) | (uint64_t)rd32(data + i + 4) << 32;
        if (i + 16 + len > n) break;
        CHECK(rd32(data + i + 8) == masked(data + i, 8));
        CHECK(rd32(data + i + 12 + len) == masked(data + i + 12, len));
        i += 16 + len, records++;
    }
    CHECK_MSG(records == 2 && i == n, "%d records, %zu of %zu bytes", records, i, n);
    CHECK(memmem(data, n, "brain.Event:2", 13) && memmem(data, n, "x", 1) && !memmem(data, n, "skipped", 7));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf /tmp/dtrain-tb-test.%d", (int)getpid());
    CHECK(system(cmd) == 0);
    CHECK(dt_tb_writer_create(&w, "/proc/nope/tb") != DT_OK && w == NULL && strstr(dt_last_error(), "/proc/nope"));
    CHECK(dt_tb_writer_destroy(NULL) == DT_OK);
    return dt_test_summary("tensorboard");
}
