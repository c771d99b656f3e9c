/* Checkpoint files in the safetensors layout: an 8-byte little-endian header length N, N bytes of
 * JSON header (space-padded to a multiple of 8), then the raw little-endian tensor bytes. The
 * header maps each tensor name to {"dtype","shape","data_offsets":[begin,end)} (offsets relative
 * to the data section) and holds string metadata under "__metadata__". PyTorch/HF tools read
 * these files unchanged.
 *
 * Files written here also carry integrity metadata (all plain strings, so still valid
 * safetensors):
 *   "dtrain.format"         = "dtrain-ckpt"
 *   "dtrain.format_version" = "1"
 *   "dtrain.crc32.<name>"   = zlib crc32 of that tensor's bytes, 8 lowercase hex digits
 *   "dtrain.header_crc32"   = crc32 of the N header bytes (JSON and padding) as stored, with the
 *                             8 hex digits of this value replaced by "00000000"; the text
 *                             "dtrain.header_crc32":" occurs exactly once in the header.
 * Those keys are reserved: dt_st_writer_meta refuses them. Plain safetensors files from other
 * tools (no such keys) load too, with structural validation only. */
#ifndef DTRAIN_SAFETENSORS_H
#define DTRAIN_SAFETENSORS_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_ST_FORMAT "dtrain-ckpt"
#define DT_ST_FORMAT_VERSION 1
#define DT_ST_MAX_HEADER 100000000 /* bytes; larger headers are rejected as absurd */

/* ---- writer ------------------------------------------------------------------------------- */

typedef struct dt_st_writer dt_st_writer;

/* Creates an empty writer in *w. DT_ENOMEM on failure. Free with dt_st_writer_destroy. */
dt_status dt_st_writer_create(dt_st_writer **w);
/* Adds tensor `name` (copied) of dtype/shape (copied, ndim 0..DT_MAX_DIMS). `data` (contiguous,
 * little-endian) is only referenced: it must stay valid and unchanged until the last write.
 * data may be NULL for a zero-sized tensor. DT_EINVAL for a duplicate/empty name or bad shape. */
dt_status dt_st_writer_add(dt_st_writer *w, const char *name, dt_dtype dtype, int ndim, const int64_t *shape,
                           const void *data);
/* Adds metadata key = value (both copied). DT_EINVAL for an empty, duplicate or reserved key
 * ("dtrain.format", "dtrain.format_version", "dtrain.header_crc32", "dtrain.crc32.*"). */
dt_status dt_st_writer_meta(dt_st_writer *w, const char *key, const char *value);
/* Writes the file atomically: "<path>.tmp.<pid>" in the same directory, fsync, rename over path,
 * fsync the directory. On error the temp file is removed and an existing file at path is left
 * untouched. The writer stays usable (it may be written again). */
dt_status dt_st_writer_write(const dt_st_writer *w, const char *path);
/* Frees the writer (not the tensor data); NULL is a no-op. */
void dt_st_writer_destroy(dt_st_writer *w);

/* ---- reader ------------------------------------------------------------------------------- */

typedef struct dt_st_file dt_st_file;

/* One tensor of an open file. name and t.data point into the file object (valid until
 * dt_st_destroy). t.data is aligned to the element size in files written by dtrain (and by the
 * HF writers); a foreign file may give a less aligned pointer. */
typedef struct {
    const char *name;
    dt_tensor t;   /* dtype, ndim, shape, data */
    size_t nbytes; /* numel * dtype size */
} dt_st_tensor;

/* Reads path whole and validates it: structure, offsets, sizes and, where present, the CRC32s.
 * Any problem is DT_EFORMAT (DT_ENOENT/DT_EIO for open/read failures) with a message naming
 * the file, the problem and what to do. On success *f owns one copy of the file's bytes. */
dt_status dt_st_open(dt_st_file **f, const char *path);
/* Closes the file and frees its memory; NULL is a no-op. */
void dt_st_destroy(dt_st_file *f);
/* Looks up a tensor by name into *out. DT_ENOENT (message names file and tensor) if absent. */
dt_status dt_st_find(const dt_st_file *f, const char *name, dt_st_tensor *out);
/* Number of tensors; dt_st_at fills *out with tensor i (0 <= i < count, header order). */
int dt_st_count(const dt_st_file *f);
void dt_st_at(const dt_st_file *f, int i, dt_st_tensor *out);
/* Metadata value of key, or NULL if absent. Owned by f. */
const char *dt_st_meta(const dt_st_file *f, const char *key);
/* Number of metadata entries; dt_st_meta_at returns the value of entry i and sets *key. */
int dt_st_meta_count(const dt_st_file *f);
const char *dt_st_meta_at(const dt_st_file *f, int i, const char **key);
/* True when the file carried dtrain CRC32s and all of them matched (false: plain safetensors). */
bool dt_st_verified(const dt_st_file *f);
/* The path the file was opened from. */
const char *dt_st_path(const dt_st_file *f);

#ifdef __cplusplus
}
#endif
#endif
