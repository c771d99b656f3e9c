/* The data-set cache's file format and its directory housekeeping, shared by the cache proper
 * (cache.c: build, validate and map an entry) and its store (cache_store.c: build locks, entry
 * bounds, garbage collection, listing and clearing). */
#ifndef DTRAIN_DATA_CACHE_INTERNAL_H
#define DTRAIN_DATA_CACHE_INTERNAL_H
#include "data/data_internal.h"

#define CACHE_MAGIC "DTDCACHE"
#define CACHE_VERSION 1
#define CACHE_HDR 4096          /* header page; samples start page-aligned after it */
#define CACHE_PATH 1024         /* longest source path recorded (longer: no cache) */
#define CACHE_FP 65536          /* bytes at each end of a source file that are fingerprinted */
#define CACHE_LOCK_WAIT_S 300.0 /* then decode privately instead of waiting for the builder */
#define DT_CACHE_DEFAULT_MAX 8  /* entries kept per user (DTRAIN_DATA_CACHE_MAX) */

/* Identity of one source file: a changed, replaced or rewritten file no longer matches. */
typedef struct {
    char path[CACHE_PATH]; /* canonical path, zero padded */
    uint64_t size, mtime_ns, ctime_ns, ino, dev;
    uint32_t head_crc, tail_crc; /* CRC32 of the first and last 64 KiB (a gzip trailer holds the
                                  * CRC and size of all the data) */
} cache_src;

/* The header at offset 0 of a cache file; host byte order, no padding holes. */
typedef struct {
    char magic[8];
    uint32_t version, byte_order, header_bytes, idx_type; /* idx_type: IDX code of the samples */
    uint32_t C, H, W, reserved;
    uint64_t n, x_off, x_bytes, y_off, y_bytes, file_bytes; /* samples, then n int32 labels */
    cache_src src[2];                                       /* images, labels */
    uint32_t payload_crc;                                   /* CRC32 of bytes [x_off, file_bytes) */
    uint32_t header_crc;                                    /* CRC32 of this struct, field = 0 */
} cache_header;

_Static_assert(sizeof(cache_header) <= CACHE_HDR, "cache header must fit its page");

/* CRC32 of a header with its header_crc field taken as 0. */
uint32_t dt_cache_header_crc(const cache_header *h);
/* Takes the build lock of one entry (waits at most CACHE_LOCK_WAIT_S): its fd, or -1 to decode
 * privately (logged). */
int dt_cache_lock_entry(const char *lockfile);
void dt_cache_unlock_entry(const char *lockfile, int fd);
/* Removes this user's stale and surplus entries of dir before `name` is built. */
void dt_cache_collect_garbage(const char *dir, const char *name);
#endif
