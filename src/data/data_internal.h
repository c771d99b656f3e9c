/* Internals shared by the data-layer files: a byte stream over raw or gzip'd files and the
 * layout of dt_dataset. Not part of the public API. */
#ifndef DT_DATA_INTERNAL_H
#define DT_DATA_INTERNAL_H

#include "dtrain/data.h"

#include <zlib.h>

/* A readable file, transparently gunzipped when it starts with 1f 8b. */
typedef struct {
    int fd;              /* raw file, or -1 */
    gzFile gz;           /* gzip stream, or NULL */
    const char *path;    /* for messages (not owned) */
    uint64_t file_size;  /* on-disk size */
    bool sized;          /* file_size is meaningful (a regular file) */
} dt_stream;

/* Opens path (DT_ENOENT / DT_EIO with a message naming it). */
dt_status dt_stream_open(dt_stream *s, const char *path);
/* Reads up to len bytes; returns the count (short only at end of data) or -1 with the error set. */
int64_t dt_stream_read(dt_stream *s, void *buf, size_t len);
/* Closes the stream; safe twice. */
void dt_stream_close(dt_stream *s);

struct dt_dataset {
    dt_dtype dtype;    /* stored dtype of samples */
    void *x;           /* n * D elements, owned */
    int32_t *y;        /* n labels, owned */
    size_t n, D;       /* samples, elements per sample */
    int C, H, W;
    int classes;
    double scale;      /* raw -> scaled value factor (1/255 for 8-bit integer images) */
    double mean, std;  /* normalisation of scaled values */
    float lut[256];    /* u8/i8: raw byte -> final f32 value */
    char source[512];  /* file(s) it came from */
};

/* Allocates a zeroed data set with scale 1, mean 0, std 1. NULL on failure (error set). */
dt_dataset *dt_dataset_alloc(void);
/* Recomputes the conversion table after dtype/scale/mean/std change. */
void dt_dataset_update_lut(dt_dataset *ds);
/* Sets classes = max label + 1 (classes == 0) or checks labels against classes; checks for
 * negative labels. what names the origin in messages. */
dt_status dt_dataset_check_labels(dt_dataset *ds, int classes, const char *what);

#endif
