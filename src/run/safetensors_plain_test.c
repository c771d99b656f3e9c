/* Tests for the safetensors reader on files dtrain did not write: malformed headers of plain
 * safetensors files (hand-rolled, no CRCs) are refused by the structural checks with a message
 * naming the file and the reason, and plain files of other tools (no padding, no CRCs, odd header
 * length, metadata last or absent) load with structural validation only. */
#include "core/test.h"
#include "dtrain/safetensors.h"
#include "run/safetensors_testlib.h"

#include <stdint.h>
#include <string.h>

/* Malformed plain safetensors headers (hand-rolled, no CRCs): structural checks. */
static void test_malformed(void) {
    const char *p = st_path("m.safetensors");
    unsigned char d[16] = {0};
    struct {
        const char *json;
        size_t dlen;
        const char *why;
    } cases[] = {
        {"{not json at all}", 0, "not valid JSON"},
        {"[1,2]", 0, "does not start with '{'"},
        {"{}  x ", 0, "stray bytes"},
        {"{\"a\":1}", 0, "tensor 'a' is not a JSON object"},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor 'a' has no string 'dtype'"},
        {"{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "does not support"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "no 'shape' list"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
         "shape[0] is not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "7 dims"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 8,
         "'data_offsets' is not a list of two"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "'data_offsets' is not a list of two"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "end before they begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "dtype x shape needs 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
         "data section holds 4 bytes but tensor 'a' ends at byte 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, "tensors 'a' [0,8) and 'b' [4,12) overlap"},
        {"{\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[14,16]}}",
         16, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "tensor 'a' appears twice"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "metadata 'k' is not a string"},
        {"{\"__metadata__\":[]}", 0, "'__metadata__' is not a JSON object"},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "metadata key 'k' appears twice"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "'__metadata__' twice"},
        {"{\"__metadata__\":{\"dtrain.format\":\"dtrain-ckpt\",\"dtrain.format_version\":\"2\"}}", 0,
         "newer dtrain (checkpoint format version 2"},
        {"{\"__metadata__\":{\"dtrain.format\":\"other\"}}", 0, "dtrain.format is 'other'"},
        {"{\"__metadata__\":{\"dtrain.format\":\"dtrain-ckpt\",\"dtrain.format_version\":\"1x\"}}", 0,
         "format_version"},
        {"{\"__metadata__\":{\"dtrain.format\":\"dtrain-ckpt\",\"dtrain.format_version\":\"1\"}}", 0,
         "without dtrain.header_crc32"},
        {"{\"__metadata__\":{\"dtrain.header_crc32\":\"1234\"}}", 0, "dtrain.header_crc32 is not 8 hex digits"},
        {"{\"__metadata__\":{\"dtrain.header_crc32\":\"00000000\",\"x\":\"\\\"dtrain.header_crc32\\\":\\\"\"}}", 0,
         "fails its CRC32"},
        {"{\"__metadata__\":{\"dtrain.crc32.a\":\"zzzzzzzz\"},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":["
         "0,1]}}",
         1, "dtrain.crc32.a is not 8 hex digits"},
        {"{\"__metadata__\":{\"dtrain.crc32.a\":\"00000000\"},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":["
         "0,1]}}",
         1, "tensor 'a' fails its CRC32 check (stored 00000000, computed d202ef8d)"},
        {"{\"__metadata__\":{\"dtrain.crc32.b\":\"00000000\"}}", 0, "tensor 'b', which the file does not hold"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        st_write_raw(p, cases[i].json, d, cases[i].dlen);
        ST_EXPECT_BAD(p, DT_EFORMAT, cases[i].why);
    }
    /* dtrain files whose header CRC is right (sealed here with zlib, as the format documents) but
     * whose CRC entries do not match their tensors */
    char j1[] = "{\"__metadata__\":{\"dtrain.format\":\"dtrain-ckpt\",\"dtrain.format_version\":\"1\","
                "\"dtrain.header_crc32\":\"00000000\"},\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    st_seal(j1);
    st_write_raw(p, j1, d, 1);
    ST_EXPECT_BAD(p, DT_EFORMAT, "tensor 'a' has no dtrain.crc32 entry");
    char j2[] = "{\"__metadata__\":{\"dtrain.format\":\"dtrain-ckpt\",\"dtrain.format_version\":\"1\","
                "\"dtrain.crc32.a\":\"d202ef8d\",\"dtrain.header_crc32\":\"00000000\"},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    st_seal(j2);
    st_write_raw(p, j2, d, 1);
    dt_st_file *f = NULL;
    CHECK_OK(dt_st_open(&f, p)); /* the independent sealing agrees with the reader */
    CHECK(f && dt_st_verified(f));
    dt_st_destroy(f);
}

/* Files written by other tools (here a minimal hand-rolled writer: no padding, no CRCs, odd
 * header length, metadata last or absent) load with structural validation only. */
static void test_plain(void) {
    const char *p = st_path("plain.safetensors");
    float wv[4] = {1, 2, 3, 4};
    unsigned char d[19];
    memcpy(d, wv, 16);
    d[16] = 7, d[17] = 8, d[18] = 9;
    st_write_raw(
        p,
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]},\"__metadata__\":{\"format\":\"pt\"}}",
        d, sizeof d);
    dt_st_file *f = NULL;
    dt_st_tensor t;
    CHECK_OK(dt_st_open(&f, p));
    if (f) {
        CHECK(!dt_st_verified(f) && dt_st_count(f) == 2 && !strcmp(dt_st_meta(f, "format"), "pt"));
        CHECK_OK(dt_st_find(f, "w", &t));
        CHECK(t.t.ndim == 2 && t.t.shape[1] == 2 && !memcmp(t.t.data, wv, 16) && (uintptr_t)t.t.data % 64 == 0);
        CHECK_OK(dt_st_find(f, "b", &t));
        CHECK(t.t.dtype == DT_U8 && t.nbytes == 3 && ((unsigned char *)t.t.data)[2] == 9);
    }
    dt_st_destroy(f);
    st_write_raw(p,
                 "{\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},"
                 "\"z\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[4,4]}}",
                 d, 4);
    CHECK_OK(dt_st_open(&f, p));
    CHECK(f && dt_st_count(f) == 2 && dt_st_meta_count(f) == 0 && dt_st_meta(f, "x") == NULL);
    if (f) CHECK(dt_st_find(f, "z", &t) == DT_OK && t.nbytes == 0 && t.t.shape[1] == 5);
    dt_st_destroy(f);
    st_write_raw(p, "{}", NULL, 0);
    CHECK_OK(dt_st_open(&f, p));
    CHECK(f && dt_st_count(f) == 0);
    dt_st_destroy(f);
}

int main(void) {
    if (st_dir_make("/tmp/dt_st_plain_test.XXXXXX") != 0) return 2;
    test_malformed();
    test_plain();
    st_dir_remove();
    return dt_test_summary("safetensors_plain_test");
}
