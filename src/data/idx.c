/* IDX reader (the MNIST file format): raw or gzip'd files, any number of dims, every IDX dtype.
 * The data is read straight into its final buffer (one pass, no intermediate copy). */
#include "data/data_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ---- a byte stream over a raw fd or a gzip stream ----------------------------------------- */

#define GZ_IN_CAP (1 << 18)

dt_status dt_stream_open(dt_stream *s, const char *path) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return dt_error(e == ENOENT ? DT_ENOENT : DT_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dt_error(DT_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return dt_error(DT_EIO, "%s: cannot read: is a directory", path);
    }
    if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) || S_ISSOCK(st.st_mode)) { /* /dev/zero: read without end */
        close(fd);
        return dt_error(DT_EFORMAT, "%s is a %s, not a file: pass a data file (or a pipe)", path,
                        S_ISCHR(st.st_mode)   ? "character device"
                        : S_ISBLK(st.st_mode) ? "block device"
                                              : "socket");
    }
    s->fd = fd;
    s->sized = S_ISREG(st.st_mode);
    s->file_size = (uint64_t)st.st_size;
    unsigned char magic[2] = {0, 0};
    ssize_t got = pread(fd, magic, 2, 0);
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        s->gz = calloc(1, sizeof *s->gz);
        s->in = malloc(GZ_IN_CAP);
        if (!s->gz || !s->in || inflateInit2(s->gz, 16 + MAX_WBITS) != Z_OK) { /* 16: gzip wrapper only */
            free(s->in);
            free(s->gz);
            s->gz = NULL;
            close(fd);
            return dt_error(DT_ENOMEM, "%s: cannot start the gzip reader (out of memory)", path);
        }
    }
    return DT_OK;
}

/* Tops the gzip input buffer up to at least `need` bytes unless the file ends first. Returns
 * the bytes available, or -1 on a read error. */
static int64_t gz_fill(dt_stream *s, size_t need) {
    z_stream *z = s->gz;
    if (z->avail_in >= need) return z->avail_in;
    s->in_off += (uint64_t)(z->next_in ? z->next_in - s->in : 0);
    memmove(s->in, z->next_in ? z->next_in : s->in, z->avail_in);
    z->next_in = s->in;
    while (z->avail_in < need) {
        ssize_t r = read(s->fd, s->in + z->avail_in, GZ_IN_CAP - z->avail_in);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            dt_error(DT_EIO, "%s: read failed: %s", s->path, strerror(errno));
            return -1;
        }
        if (r == 0) break;
        z->avail_in += (unsigned)r;
    }
    return z->avail_in;
}

/* Inflates into buf[len]: returns the bytes produced (short at the end of the data) or -1. */
static int64_t gz_read(dt_stream *s, unsigned char *buf, size_t len) {
    z_stream *z = s->gz;
    size_t done = 0;
    while (done < len && !s->eof) {
        int64_t avail = gz_fill(s, s->in_member ? 1 : 2);
        if (avail < 0) return -1;
        if (!s->in_member) { /* the start, or after a member's trailer: a gzip member or the end */
            if (avail == 0 && s->members > 0) {
                s->eof = true;
                break;
            }
            if (avail < 2 || z->next_in[0] != 0x1f || z->next_in[1] != 0x8b) {
                dt_error(DT_EFORMAT,
                         "%s: trailing garbage after the gzip data (at byte %llu): the file is damaged "
                         "or is not one gzip file; re-download or re-compress it",
                         s->path, (unsigned long long)(s->in_off + (uint64_t)(z->next_in - s->in)));
                return -1;
            }
            s->in_member = true;
        }
        if (avail == 0) {
            dt_error(DT_EFORMAT,
                     "%s: the gzip data is cut short (it ends inside a member, before its CRC/length "
                     "trailer): the file is truncated; re-download it",
                     s->path);
            return -1;
        }
        size_t room = len - done > (1u << 30) ? (1u << 30) : len - done;
        z->next_out = buf + done;
        z->avail_out = (unsigned)room;
        int rc = inflate(z, Z_NO_FLUSH);
        done += room - z->avail_out;
        if (rc == Z_STREAM_END) { /* trailer checked (CRC-32, length) */
            s->in_member = false;
            s->members++;
            inflateReset(z);
        } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
            dt_error(DT_EFORMAT, "%s: corrupt gzip data: %s", s->path, z->msg ? z->msg : zError(rc));
            return -1;
        }
    }
    return (int64_t)done;
}

/* Reads up to len bytes; returns the number read (short only at end of data), or -1 with the
 * last error set (corrupt gzip data or a read error). */
int64_t dt_stream_read(dt_stream *s, void *buf, size_t len) {
    if (s->gz) return gz_read(s, buf, len);
    size_t done = 0;
    while (done < len) {
        size_t chunk = len - done > (1u << 30) ? (1u << 30) : len - done;
        ssize_t r = read(s->fd, (char *)buf + done, chunk);
        if (r < 0) {
            if (errno == EINTR) continue;
            dt_error(DT_EIO, "%s: read failed: %s", s->path, strerror(errno));
            return -1;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    return (int64_t)done;
}

void dt_stream_close(dt_stream *s) {
    if (s->gz) {
        inflateEnd(s->gz);
        free(s->gz);
        free(s->in);
    }
    if (s->fd >= 0) close(s->fd);
    s->gz = NULL;
    s->in = NULL;
    s->fd = -1;
}

/* ---- IDX ---------------------------------------------------------------------------------- */

static int idx_dtype(unsigned code, dt_dtype *t) {
    switch (code) {
    case 0x08: *t = DT_U8; return 1;
    case 0x09: *t = DT_I8; return 1;
    case 0x0B: *t = DT_I16; return 1;
    case 0x0C: *t = DT_I32; return 1;
    case 0x0D: *t = DT_F32; return 1;
    case 0x0E: *t = DT_F64; return 1;
    }
    return 0;
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Converts count elements of size esz from big-endian to host order, in place. */
static void swap_to_host(void *data, size_t count, size_t esz) {
    const uint16_t probe = 1;
    if (esz == 1 || *(const unsigned char *)&probe == 0) return; /* big-endian host */
    unsigned char *p = data;
    if (esz == 2) {
        for (size_t i = 0; i < count; i++) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            v = __builtin_bswap16(v);
            memcpy(p + 2 * i, &v, 2);
        }
    } else if (esz == 4) {
        for (size_t i = 0; i < count; i++) {
            uint32_t v;
            memcpy(&v, p + 4 * i, 4);
            v = __builtin_bswap32(v);
            memcpy(p + 4 * i, &v, 4);
        }
    } else {
        for (size_t i = 0; i < count; i++) {
            uint64_t v;
            memcpy(&v, p + 8 * i, 8);
            v = __builtin_bswap64(v);
            memcpy(p + 8 * i, &v, 8);
        }
    }
}

static void shape_str(char *buf, size_t cap, const dt_idx *x) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < x->ndim && k + 24 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "x" : "", (long long)x->dims[i]);
    if (x->ndim == 0) snprintf(buf, cap, "scalar");
}

dt_status dt_idx_open_header(dt_stream *s, const char *path, dt_idx *out) {
    memset(out, 0, sizeof *out);
    DT_TRY(dt_stream_open(s, path));
    dt_status st = DT_OK;
    unsigned char hdr[4 + 4 * DT_IDX_MAX_DIMS];
    int64_t got = dt_stream_read(s, hdr, 4);
    if (got < 0) {
        st = DT_EFORMAT;
        goto fail;
    }
    if (got < 4) {
        st = dt_error(DT_EFORMAT, "%s: truncated header: file holds %lld bytes, an IDX header needs at least 4", path,
                      (long long)got);
        goto fail;
    }
    if (hdr[0] != 0 || hdr[1] != 0) {
        st = dt_error(DT_EFORMAT, "%s: not an IDX file: magic %02x %02x %02x %02x, expected 00 00 <type> <ndim>%s",
                      path, hdr[0], hdr[1], hdr[2], hdr[3], s->gz ? " (after gunzip)" : "");
        goto fail;
    }
    if (!idx_dtype(hdr[2], &out->dtype)) {
        st = dt_error(DT_EFORMAT,
                      "%s: unsupported IDX data type 0x%02x (supported: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D "
                      "f32, 0x0E f64)",
                      path, hdr[2]);
        goto fail;
    }
    out->ndim = hdr[3];
    size_t dim_bytes = 4 * (size_t)out->ndim;
    got = dt_stream_read(s, hdr + 4, dim_bytes);
    if (got < 0) {
        st = DT_EFORMAT;
        goto fail;
    }
    if ((size_t)got < dim_bytes) {
        st = dt_error(DT_EFORMAT, "%s: truncated header: %d dims need %zu bytes of sizes, file holds %lld", path,
                      out->ndim, dim_bytes, (long long)got);
        goto fail;
    }
    size_t esz = dt_dtype_size(out->dtype);
    size_t count = 1;
    for (int i = 0; i < out->ndim; i++) {
        out->dims[i] = be32(hdr + 4 + 4 * i);
        if (out->dims[i] && count > SIZE_MAX / esz / (size_t)out->dims[i]) {
            st = dt_error(DT_EFORMAT, "%s: header declares an impossible size (dim %d = %lld overflows)", path, i,
                          (long long)out->dims[i]);
            goto fail;
        }
        count *= (size_t)out->dims[i];
    }
    out->count = count;
    size_t bytes = count * esz, hbytes = 4 + dim_bytes;
    size_t item_bytes = out->ndim ? (out->dims[0] ? bytes / (size_t)out->dims[0] : 0) : bytes;
    long long items = out->ndim ? (long long)out->dims[0] : 1;
    /* refuse absurd allocations early: raw files have an exact size, and deflate cannot expand
     * data by more than ~1032x */
    uint64_t limit = s->gz ? s->file_size * 1100 + 4096 : (s->file_size > hbytes ? s->file_size - hbytes : 0);
    if (s->sized && bytes > limit) {
        if (!s->gz) {
            st = dt_error(DT_EFORMAT,
                          "%s: truncated: header says %lld items of %zu bytes, file holds %llu bytes of data", path,
                          items, item_bytes, (unsigned long long)limit);
        } else {
            st = dt_error(DT_EFORMAT,
                          "%s: truncated: header says %lld items of %zu bytes (%zu bytes), more than a %llu-byte gzip "
                          "file can hold",
                          path, items, item_bytes, bytes, (unsigned long long)s->file_size);
        }
        goto fail;
    }
    return DT_OK;
fail:
    dt_stream_close(s);
    memset(out, 0, sizeof *out);
    return st;
}

dt_status dt_idx_read_body(dt_stream *s, const dt_idx *hdr, void *dst) {
    const char *path = s->path;
    size_t esz = dt_dtype_size(hdr->dtype), bytes = hdr->count * esz;
    size_t item_bytes = hdr->ndim ? (hdr->dims[0] ? bytes / (size_t)hdr->dims[0] : 0) : bytes;
    long long items = hdr->ndim ? (long long)hdr->dims[0] : 1;
    dt_status st = DT_OK;
    int64_t got = dt_stream_read(s, dst, bytes);
    if (got < 0) {
        st = DT_EFORMAT;
        goto done;
    }
    if ((size_t)got < bytes) {
        st = dt_error(DT_EFORMAT, "%s: truncated: header says %lld items of %zu bytes, file holds %lld bytes of data",
                      path, items, item_bytes, (long long)got);
        goto done;
    }
    unsigned char extra[64];
    got = dt_stream_read(s, extra, sizeof extra);
    if (got < 0) {
        st = DT_EFORMAT;
        goto done;
    }
    if (got > 0) {
        char shp[128];
        shape_str(shp, sizeof shp, hdr);
        st = dt_error(DT_EFORMAT,
                      "%s: %s%lld bytes of trailing data after the %s %s elements the header declares (wrong or "
                      "concatenated file?)",
                      path, got == (int64_t)sizeof extra ? "at least " : "", (long long)got, shp,
                      dt_dtype_name(hdr->dtype));
        goto done;
    }
    swap_to_host(dst, hdr->count, esz);
done:
    dt_stream_close(s);
    return st;
}

dt_status dt_idx_read(const char *path, dt_idx *out) {
    dt_stream s;
    DT_TRY(dt_idx_open_header(&s, path, out));
    size_t bytes = out->count * dt_dtype_size(out->dtype);
    out->data = malloc(bytes ? bytes : 1);
    if (!out->data) {
        dt_stream_close(&s);
        dt_idx_free(out);
        return dt_error(DT_ENOMEM, "%s: cannot allocate %zu bytes for the data", path, bytes);
    }
    dt_status st = dt_idx_read_body(&s, out, out->data);
    if (st != DT_OK) dt_idx_free(out);
    return st;
}

void dt_idx_free(dt_idx *idx) {
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
