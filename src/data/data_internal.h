/* Internals shared by the data-layer files: a byte stream over raw or gzip'd files and the
 * layout of dt_dataset. Not part of the public API. */
#ifndef DT_DATA_INTERNAL_H
#define DT_DATA_INTERNAL_H

#include "dtrain/data.h"

#include <limits.h>
#include <zlib.h>

/* A readable file, transparently gunzipped when it starts with 1f 8b. Gzip input is strict: each
 * member must end with its trailer (CRC-32 and length, checked), and whatever follows the last
 * member must be another member: a cut-short file or trailing garbage is an error. */
typedef struct {
    int fd;             /* the file */
    z_stream *gz;       /* inflate state when gzip'd, else NULL */
    unsigned char *in;  /* gzip input buffer */
    bool in_member;     /* inside a gzip member (its trailer not seen yet) */
    int members;        /* gzip members read to their trailer */
    bool eof;           /* no more data */
    uint64_t in_off;    /* compressed bytes consumed before the buffer's start, for messages */
    const char *path;   /* for messages (not owned) */
    uint64_t file_size; /* on-disk size */
    bool sized;         /* file_size is meaningful (a regular file) */
} dt_stream;

/* Opens path (DT_ENOENT / DT_EIO with a message naming it). */
dt_status dt_stream_open(dt_stream *s, const char *path);
/* Reads up to len bytes; returns the count (short only at end of data) or -1 with the error set. */
int64_t dt_stream_read(dt_stream *s, void *buf, size_t len);
/* Closes the stream; safe twice. */
void dt_stream_close(dt_stream *s);

/* Opens an IDX file and parses its header into out (dtype, ndim, dims, count; data NULL), leaving
 * s positioned at the data. On error s is closed, out zeroed and the message names the file. */
dt_status dt_idx_open_header(dt_stream *s, const char *path, dt_idx *out);
/* Reads the hdr->count elements that follow the header into dst (room for count * dtype size),
 * checks for trailing data and converts to host byte order. Always closes s. */
dt_status dt_idx_read_body(dt_stream *s, const dt_idx *hdr, void *dst);

struct dt_dataset {
    dt_dtype dtype; /* stored dtype of samples */
    void *x;        /* n * D elements: owned, or inside map */
    int32_t *y;     /* n labels: owned, or inside map */
    void *map;      /* read-only shared mapping of the decoded cache file, or NULL */
    size_t map_len;
    size_t n, D; /* samples, elements per sample */
    int C, H, W;
    int classes;          /* 0 with targets */
    bool targets;         /* y holds f32 regression targets (their bits), not labels (IDX float labels) */
    double scale;         /* raw -> scaled value factor (1/255 for 8-bit integer images) */
    double mean, std;     /* normalisation of scaled values */
    float lut[256];       /* u8/i8: raw byte -> final f32 value */
    char source[512];     /* file(s) it came from */
    char labels[512];     /* the file its labels came from where that is another (IDX: the labels file), else "" */
    char cache[PATH_MAX]; /* the cache file map came from ("" when private) */
    int T;                /* text: the window (x holds text_len bytes, y is NULL); 0 = features */
    size_t text_len;      /* text: tokens of this set (train or validation part): bytes, or 16-bit tokens */
    bool tok16;           /* text: x holds little-endian uint16 tokens (tokens:DIR), else bytes */
    dt_dataset *base;     /* a view (--val-split's parts): x and y are base's, sample i is its rows[i] */
    uint32_t *rows;       /* a view: its samples' indices in base (owned), else NULL */
    int refs;             /* views holding this set beside its owner (atomic): dt_dataset_destroy waits for them */
};

/* The index in ds->x and ds->y of sample i of ds (its base's row for a view). */
static inline size_t dt_dataset_row(const dt_dataset *ds, size_t i) { return ds->rows ? ds->rows[i] : i; }

/* Allocates a zeroed data set with scale 1, mean 0, std 1. NULL on failure (error set). */
dt_dataset *dt_dataset_alloc(void);
/* Recomputes the conversion table after dtype/scale/mean/std change. */
void dt_dataset_update_lut(dt_dataset *ds);
/* Sets classes = max label + 1 (classes == 0) or checks labels against classes; checks for
 * negative labels. what names the origin in messages. */
dt_status dt_dataset_check_labels(dt_dataset *ds, int classes, const char *what);

/* Checks that an IDX image header and label header form a data set (items, label dims and type,
 * counts) and gives the sample shape; DT_EFORMAT naming the file otherwise. */
dt_status dt_idx_pair_shape(const dt_idx *im, const dt_idx *lb, const char *images_path, const char *labels_path,
                            int *C, int *H, int *W);
/* Fills a data set's shape, dtype, scale, source and labels' file from an IDX image header and
 * its shape. */
void dt_dataset_init_idx(dt_dataset *ds, const dt_idx *im, int C, int H, int W, const char *images_path,
                         const char *labels_path);

/* Opens an images/labels pair through the shared decoded cache (see data.h). DT_OK with *out set:
 * the data set views a read-only shared mapping. DT_OK with *out NULL: no cache this time
 * (disabled, directory not writable, full ...; logged at info level), decode privately. Any other
 * status is an error in the data files themselves, with the same message the private path gives. */
dt_status dt_cache_open_idx(dt_dataset **out, const char *images_path, const char *labels_path);

/* Text data set: sets the class count (vocabulary), at least the largest token + 1 (DT_EINVAL
 * naming the first token that does not fit). */
dt_status dt_text_set_classes(dt_dataset *ds, int classes);

/* Opens "tokens:DIR" (see dt_dataset_open_text): nanoGPT's train.bin / val.bin or llm.c's
 * *_train_*.bin / *_val_*.bin shards, as windows of T 16-bit tokens. Same contract as
 * dt_dataset_open_text. */
dt_status dt_tokens_open(dt_dataset **train, dt_dataset **val, const char *spec, int T, double val_fraction);

/* The shared data cache directory (/dev/shm or $DTRAIN_DATA_CACHE, created 0700 when missing)
 * into dir; false when the cache is off (DTRAIN_DATA_CACHE=0) or the directory is unusable
 * (logged at info level). */
bool dt_cache_dir(char *dir, size_t cap);

/* The most bytes a text data set reads from a pipe or other stream that cannot be mapped. */
#define DT_TEXT_STREAM_MAX ((size_t)1 << 30)
/* Reads fd to its end into *buf (malloc'd, caller frees, also on error) and *len; DT_EFORMAT when
 * it holds more than max bytes (only max + 1 are read), DT_EIO / DT_ENOMEM otherwise. */
dt_status dt_text_read_stream(int fd, size_t max, uint8_t **buf, size_t *len);

/* Resolves "kjv" (see dt_dataset_open_text): *fd is a read-only descriptor of the text (a file,
 * or a sealed-off memory file), path the name for messages, cache the generated cache file it
 * is ("" otherwise). DT_ENOENT when the text is not installed and `bible` is missing, DT_EIO when
 * `bible` fails; the message says what to do. */
dt_status dt_kjv_open(int *fd, char *path, size_t path_cap, char *cache, size_t cache_cap);

#endif
