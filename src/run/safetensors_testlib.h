/* Shared helpers of the safetensors tests: a mkdtemp directory for their files, paths in it, whole
 * files read and written, a plain safetensors file written by hand (no CRCs), the header CRC
 * filled in as the format documents, and the check that dt_st_open refuses a file and says why. */
#ifndef DT_RUN_SAFETENSORS_TESTLIB_H
#define DT_RUN_SAFETENSORS_TESTLIB_H

#include "core/test.h"
#include "dtrain/safetensors.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static char st_dir[64];

/* Makes st_dir from tmpl ("/tmp/NAME.XXXXXX"): 0, or -1 after saying why. */
static inline int st_dir_make(const char *tmpl) { return dt_test_mkdtemp(st_dir, sizeof st_dir, tmpl); }

/* Removes dir and everything below it. */
static inline void st_rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    char sub[512];
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name) >= (int)sizeof sub) continue;
        if (e->d_type == DT_DIR) st_rm_tree(sub);
        else unlink(sub);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* Removes st_dir and everything in it. */
static inline void st_dir_remove(void) { st_rm_tree(st_dir); }

/* "<st_dir>/name"; each call returns a fresh buffer that stays valid (at most 64 calls). */
static inline char *st_path(const char *name) {
    static char buf[64][256];
    static int k;
    if (k == 64) {
        fprintf(stderr, "st_path: too many paths\n");
        exit(2);
    }
    snprintf(buf[k], sizeof buf[k], "%s/%s", st_dir, name);
    return buf[k++];
}

/* The whole file (malloc'd, its length in *len), or NULL. */
static inline unsigned char *st_read_all(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, fp) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(fp);
    *len = (size_t)n;
    return b;
}

/* Writes n bytes of b to path; exits the test (status 2) when it cannot. */
static inline void st_write_all(const char *path, const void *b, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        perror(path);
        exit(2);
    }
    if (n && fwrite(b, 1, n, fp) != n) {
        perror(path);
        exit(2);
    }
    fclose(fp);
}

/* dt_st_open must fail with status st and a message naming the file and containing why. */
#define ST_EXPECT_BAD(path, st, why)                                                                         \
    do {                                                                                                     \
        dt_st_file *f_ = (dt_st_file *)1;                                                                    \
        dt_status s_ = dt_st_open(&f_, path);                                                                \
        CHECK_MSG(s_ == (st) && f_ == NULL && strstr(dt_last_error(), path) && strstr(dt_last_error(), why), \
                  "want '%s', got %s: %s", why, dt_status_str(s_), dt_last_error());                         \
        dt_st_destroy(s_ == DT_OK ? f_ : NULL);                                                              \
    } while (0)

/* A plain safetensors file: 8-byte length, header text (unpadded), data. */
static inline void st_write_raw(const char *path, const char *json, const void *data, size_t dlen) {
    size_t n = strlen(json);
    unsigned char *b = malloc(8 + n + dlen);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(b + 8, json, n);
    if (dlen) memcpy(b + 8 + n, data, dlen);
    st_write_all(path, b, 8 + n + dlen);
    free(b);
}

/* Fills in "dtrain.header_crc32":"00000000" of json as the header documents (independent of the
 * library): crc32 over the header bytes with the 8 digits set to '0'. */
static inline void st_seal(char *json) {
    char *d = strstr(json, "\"dtrain.header_crc32\":\"") + 23;
    memset(d, '0', 8);
    char hex[9];
    snprintf(hex, sizeof hex, "%08lx", crc32(0, (const Bytef *)json, (uInt)strlen(json)) & 0xffffffffUL);
    memcpy(d, hex, 8);
}

#endif
