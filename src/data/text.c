/* Text data sets: a file read as raw bytes (vocabulary 256), split by bytes into a train part
 * and a validation part at its end, each cut into windows of T+1 bytes (input T, targets the
 * next T). The file is mapped read-only, each part its own mapping of the one descriptor (the
 * pages are shared), so nothing is copied; an unmappable file (a pipe) is read once. Batches
 * turn windows into int32 token ids. Semantics and errors are documented in data.h. */
#include "data/data_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

bool dt_data_is_text(const char *spec) {
    return spec && (!strncmp(spec, "text:", 5) || !strcmp(spec, "kjv") || dt_data_is_tokens(spec));
}

bool dt_data_is_tokens(const char *spec) { return spec && !strncmp(spec, "tokens:", 7); }

/* Token i of a text set's stored tokens. */
static inline uint32_t token_at(const dt_dataset *ds, size_t i) {
    if (!ds->tok16) return ((const uint8_t *)ds->x)[i];
    const uint8_t *p = (const uint8_t *)ds->x + 2 * i;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8; /* little-endian on any host */
}

bool dt_dataset_is_text(const dt_dataset *ds) { return ds->T > 0; }

int dt_dataset_window(const dt_dataset *ds) { return ds->T; }

dt_status dt_text_set_classes(dt_dataset *ds, int classes) {
    if (classes < (ds->tok16 ? 65536 : 256))
        for (size_t i = 0; i < ds->text_len; i++) {
            const uint32_t v = token_at(ds, i);
            if (v < (uint32_t)classes) continue;
            if (ds->tok16)
                return dt_error(DT_EINVAL,
                                "%s: token %u (token %zu of the set) does not fit a vocabulary of %d: leave V= out "
                                "of `model` gpt:... (it is then the data's largest token + 1) or pass V=%u or more",
                                ds->source, v, i, classes,
                                (uint32_t)ds->classes > v + 1 ? (uint32_t)ds->classes : v + 1);
            return dt_error(DT_EFORMAT,
                            "%s: byte %u (at offset %zu of the set) does not fit a vocabulary of %d: a byte-level "
                            "model needs 256 outputs",
                            ds->source, v, i, classes);
        }
    ds->classes = classes;
    return DT_OK;
}

dt_status dt_dataset_batch_tokens(const dt_dataset *ds, const uint32_t *indices, int n, int32_t *tok, int32_t *tgt) {
    if (!ds->T)
        return dt_error(DT_EINVAL, "data set %s is not a text data set: use dt_dataset_batch for its batches",
                        ds->source[0] ? ds->source : "(memory)");
    if (n < 0) return dt_error(DT_EINVAL, "batch size %d is negative", n);
    for (int i = 0; i < n; i++)
        if (indices[i] >= ds->n)
            return dt_error(DT_EINVAL,
                            "batch position %d: window index %u is out of range (text data set %s has %zu windows)", i,
                            indices[i], ds->source, ds->n);
    const size_t T = (size_t)ds->T;
    if (ds->tok16) {
        for (int i = 0; i < n; i++) {
            const size_t s = (size_t)indices[i] * T; /* window (T+1) */
            for (size_t t = 0; t < T; t++) {
                if (tok) tok[(size_t)i * T + t] = (int32_t)token_at(ds, s + t);
                if (tgt) tgt[(size_t)i * T + t] = (int32_t)token_at(ds, s + t + 1);
            }
        }
        return DT_OK;
    }
    const uint8_t *bytes = ds->x;
    for (int i = 0; i < n; i++) {
        const uint8_t *restrict w = bytes + (size_t)indices[i] * T; /* window (T+1) */
        if (tok) {
            int32_t *restrict o = tok + (size_t)i * T;
            for (size_t t = 0; t < T; t++) o[t] = w[t];
        }
        if (tgt) {
            int32_t *restrict o = tgt + (size_t)i * T;
            for (size_t t = 0; t < T; t++) o[t] = w[t + 1];
        }
    }
    return DT_OK;
}

/* ---- opening ------------------------------------------------------------------------------ */

/* The opened source: a descriptor to map, or (unmappable) its bytes read into buf. */
typedef struct {
    int fd;
    bool mappable;
    uint8_t *buf; /* !mappable: the whole contents (owned until handed to the train set) */
    size_t len;
    char path[PATH_MAX];
    char cache[PATH_MAX];
} text_src;

/* Opens "text:FILE" or "kjv" into src (fd set, mappable decided, len known). */
static dt_status src_open(text_src *src, const char *spec) {
    if (!strcmp(spec, "kjv")) {
        DT_TRY(dt_kjv_open(&src->fd, src->path, sizeof src->path, src->cache, sizeof src->cache));
    } else {
        const char *file = spec + 5;
        if (!*file)
            return dt_error(DT_EINVAL,
                            "`data` text: needs a file name: pass `data` text:FILE (any file, read as bytes)");
        snprintf(src->path, sizeof src->path, "%s", file);
        if ((src->fd = open(file, O_RDONLY | O_CLOEXEC)) < 0) {
            if (errno == ENOENT)
                return dt_error(DT_ENOENT,
                                "`data` %s: %s: no such file: pass an existing file (any file, read as bytes)", spec,
                                file);
            return dt_error(DT_EIO, "`data` %s: cannot open %s (%s): check the path and its permissions", spec, file,
                            strerror(errno));
        }
    }
    struct stat st;
    if (fstat(src->fd, &st) != 0)
        return dt_error(DT_EIO, "`data` %s: cannot stat %s (%s)", spec, src->path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return dt_error(DT_EFORMAT, "`data` %s: %s is a directory: pass a file", spec, src->path);
    if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) /* /dev/zero, /dev/urandom, a disk, a socket */
        return dt_error(DT_EFORMAT,
                        "`data` %s: %s is a %s, not a file: pass a file (or a pipe, which is read up to "
                        "%zu MiB)",
                        spec, src->path,
                        S_ISCHR(st.st_mode)   ? "character device"
                        : S_ISBLK(st.st_mode) ? "block device"
                                              : "socket",
                        (size_t)DT_TEXT_STREAM_MAX >> 20);
    src->mappable = S_ISREG(st.st_mode) && st.st_size > 0;
    if (src->mappable) {
        src->len = (size_t)st.st_size;
        return DT_OK;
    }
    /* a pipe, a /proc file: read it once, up to DT_TEXT_STREAM_MAX bytes */
    dt_status rs = dt_text_read_stream(src->fd, DT_TEXT_STREAM_MAX, &src->buf, &src->len);
    if (rs != DT_OK) return dt_error_wrap(rs, "`data` %s: %s", spec, src->path);
    return DT_OK;
}

dt_status dt_text_read_stream(int fd, size_t max, uint8_t **buf, size_t *len) {
    size_t cap = 1 << 20;
    *len = 0;
    if (!(*buf = malloc(cap))) return dt_error(DT_ENOMEM, "out of memory reading it");
    for (;;) {
        if (*len == cap) {
            uint8_t *b = cap > SIZE_MAX / 2 ? NULL : realloc(*buf, cap * 2);
            if (!b) return dt_error(DT_ENOMEM, "out of memory reading it (%zu bytes so far)", *len);
            *buf = b, cap *= 2;
        }
        const size_t want = cap - *len < max + 1 - *len ? cap - *len : max + 1 - *len; /* one past max: too long */
        ssize_t r = read(fd, *buf + *len, want);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dt_error(DT_EIO, "cannot read it (%s)", strerror(errno));
        if (r == 0) return DT_OK;
        *len += (size_t)r;
        if (*len > max)
            return dt_error(DT_EFORMAT,
                            "a stream of more than %zu bytes (read up to that, it goes on): save it to a file, "
                            "which is mapped whatever its size",
                            max);
    }
}

/* Checks that a part of len bytes gives at least 2 windows of T+1 and at most 2^32-1. */
static dt_status check_part(const char *spec, const text_src *src, const char *part, size_t len, int T, double f) {
    size_t n = len ? (len - 1) / (size_t)T : 0;
    if (n > UINT32_MAX)
        return dt_error(
            DT_EFORMAT,
            "`data` %s: the %s part of %s (%zu bytes) gives %zu windows of T+1 = %d bytes, more than the 2^32-1 a "
            "data set can index: use a larger T (the model's context length) or a shorter file",
            spec, part, src->path, len, n, T + 1);
    if (n >= 2) return DT_OK;
    if (!strcmp(part, "train"))
        return dt_error(
            DT_EFORMAT,
            "`data` %s: %s has %zu bytes; its train part (the first %zu) holds %zu window(s) of T+1 = %d bytes "
            "but at least 2 are needed: use a longer file or a smaller T (the model's context length)%s",
            spec, src->path, src->len, len, n, T + 1, f > 0 ? ", or a smaller `val_fraction`" : "");
    return dt_error(
        DT_EFORMAT,
        "`data` %s: the validation part of %s (its last %zu of %zu bytes, `val_fraction` %g) holds %zu window(s) "
        "of T+1 = %d bytes but at least 2 are needed: raise `val_fraction`, use a longer file or a smaller T, or pass "
        "`val_fraction` 0 for no validation set",
        spec, src->path, len, src->len, f, n, T + 1);
}

/* Makes the data set of bytes [off, off+len) of src; takes src->buf when take_buf. */
static dt_status make_set(dt_dataset **out, text_src *src, size_t off, size_t len, int T, bool take_buf) {
    dt_dataset *ds = dt_dataset_alloc();
    if (!ds) return DT_ENOMEM;
    if (src->mappable) {
        size_t pg = (size_t)sysconf(_SC_PAGESIZE), aoff = off / pg * pg;
        void *m = mmap(NULL, off + len - aoff, PROT_READ, MAP_SHARED, src->fd, (off_t)aoff);
        if (m == MAP_FAILED) {
            dt_dataset_destroy(ds);
            return dt_error(DT_EIO, "%s: cannot map %zu bytes (%s)", src->path, len, strerror(errno));
        }
        ds->map = m, ds->map_len = off + len - aoff;
        ds->x = (uint8_t *)m + (off - aoff);
    } else if (take_buf) {
        ds->x = src->buf; /* the train part starts at 0: the buffer, shrunk to it */
        src->buf = NULL;
        void *b = realloc(ds->x, len);
        if (b) ds->x = b;
    } else {
        if (!(ds->x = malloc(len))) {
            dt_dataset_destroy(ds);
            return dt_error(DT_ENOMEM, "%s: out of memory for the %zu-byte validation part", src->path, len);
        }
        memcpy(ds->x, src->buf + off, len);
    }
    ds->dtype = DT_U8;
    ds->T = T;
    ds->text_len = len;
    ds->n = (len - 1) / (size_t)T;
    ds->C = 1, ds->H = 1, ds->W = T;
    ds->D = (size_t)T;
    ds->classes = 256;
    snprintf(ds->source, sizeof ds->source, "%.*s", (int)sizeof ds->source - 1, src->path);
    snprintf(ds->cache, sizeof ds->cache, "%s", src->cache);
    *out = ds;
    return DT_OK;
}

dt_status dt_dataset_open_text(dt_dataset **train, dt_dataset **val, const char *spec, int T, double val_fraction) {
    *train = NULL;
    if (val) *val = NULL;
    if (!dt_data_is_text(spec))
        return dt_error(DT_EINVAL,
                        "`data` %s is not a text data set: pass `data` text:FILE, `data` kjv or `data` tokens:DIR",
                        spec ? spec : "(none)");
    if (T < 1)
        return dt_error(DT_EINVAL, "`data` %s: the window T = %d must be >= 1 (it is the model's context length)", spec,
                        T);
    if (!(val_fraction >= 0 && val_fraction <= 0.5))
        return dt_error(
            DT_EINVAL,
            "`val_fraction` %g is outside [0, 0.5]: pass e.g. 0.1 (the last 10%% of the bytes validate), or 0 for "
            "no validation set",
            val_fraction);
    if (dt_data_is_tokens(spec)) return dt_tokens_open(train, val, spec, T, val_fraction);
    text_src src = {.fd = -1};
    dt_dataset *tr = NULL, *va = NULL;
    dt_status st;
    DT_TRY_GOTO(st = src_open(&src, spec), done);
    if (src.len == 0) {
        st = dt_error(DT_EFORMAT, "`data` %s: %s is empty: a text data set needs at least 2T+1 = %lld bytes", spec,
                      src.path, 2 * (long long)T + 1);
        goto done;
    }
    size_t vlen = (size_t)floor((double)src.len * val_fraction), tlen = src.len - vlen;
    DT_TRY_GOTO(st = check_part(spec, &src, "train", tlen, T, val_fraction), done);
    if (val_fraction > 0) DT_TRY_GOTO(st = check_part(spec, &src, "validation", vlen, T, val_fraction), done);
    if (val_fraction > 0 && val) DT_TRY_GOTO(st = make_set(&va, &src, tlen, vlen, T, false), done);
    DT_TRY_GOTO(st = make_set(&tr, &src, 0, tlen, T, true), done);
    *train = tr, tr = NULL;
    if (val) *val = va, va = NULL;
done:
    dt_dataset_destroy(tr);
    dt_dataset_destroy(va);
    free(src.buf);
    if (src.fd >= 0) close(src.fd);
    return st;
}
