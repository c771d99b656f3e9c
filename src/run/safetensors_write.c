/* Safetensors writer: collects tensors (by reference) and metadata, then writes a dtrain
 * checkpoint atomically (temp file + fsync + rename + directory fsync) with per-tensor and
 * header CRC32s. The layout and reserved keys are described in include/dtrain/safetensors.h. */
#include "dtrain/safetensors.h"
#include "core/sys.h"
#include "run/writable.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

typedef struct {
    char *name;
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    const void *data;
    size_t nbytes;
} st_entry;

struct dt_st_writer {
    st_entry *t;
    int nt, capt;
    char **mkey, **mval;
    int nm, capm;
};

/* Tensor bytes are written as they lie in memory; safetensors is little-endian. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors checkpoints need a little-endian host");

static const char HCRC_NEEDLE[] = "\"dtrain.header_crc32\":\"";

dt_status dt_st_writer_create(dt_st_writer **w) {
    *w = calloc(1, sizeof **w);
    return *w ? DT_OK : dt_error(DT_ENOMEM, "out of memory creating a checkpoint writer");
}

void dt_st_writer_destroy(dt_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->nt; i++) free(w->t[i].name);
    for (int i = 0; i < w->nm; i++) {
        free(w->mkey[i]);
        free(w->mval[i]);
    }
    free(w->t);
    free(w->mkey);
    free(w->mval);
    free(w);
}

dt_status dt_st_writer_add(dt_st_writer *w, const char *name, dt_dtype dtype, int ndim, const int64_t *shape,
                           const void *data) {
    if (!name || !name[0] || !strcmp(name, "__metadata__"))
        return dt_error(DT_EINVAL, "checkpoint tensor name '%s' is empty or reserved", name ? name : "(null)");
    if ((unsigned)dtype >= DT_DTYPE_COUNT)
        return dt_error(DT_EINVAL, "checkpoint tensor '%s': invalid dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > DT_MAX_DIMS)
        return dt_error(DT_EINVAL, "checkpoint tensor '%s': ndim %d outside 0..%d", name, ndim, DT_MAX_DIMS);
    size_t nbytes = dt_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(nbytes, (uint64_t)shape[i], &nbytes) || nbytes > (1ull << 53))
            return dt_error(DT_EINVAL, "checkpoint tensor '%s': bad shape (dim %d = %" PRId64 ")", name, i, shape[i]);
    }
    if (nbytes && !data) return dt_error(DT_EINVAL, "checkpoint tensor '%s': data is NULL", name);
    for (int i = 0; i < w->nt; i++)
        if (!strcmp(w->t[i].name, name)) return dt_error(DT_EINVAL, "checkpoint tensor '%s' added twice", name);
    if (w->nt == w->capt) {
        int cap = w->capt ? 2 * w->capt : 16;
        st_entry *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return dt_error(DT_ENOMEM, "out of memory adding checkpoint tensor '%s'", name);
        w->t = t;
        w->capt = cap;
    }
    st_entry *e = &w->t[w->nt];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return dt_error(DT_ENOMEM, "out of memory adding checkpoint tensor '%s'", name);
    e->dtype = dtype;
    e->ndim = ndim;
    if (ndim) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->data = data;
    e->nbytes = nbytes;
    w->nt++;
    return DT_OK;
}

static bool reserved_key(const char *k) {
    return !strcmp(k, "dtrain.format") || !strcmp(k, "dtrain.format_version") || !strcmp(k, "dtrain.header_crc32") ||
           !strncmp(k, "dtrain.crc32.", 13);
}

dt_status dt_st_writer_meta(dt_st_writer *w, const char *key, const char *value) {
    if (!key || !key[0] || !value || reserved_key(key))
        return dt_error(DT_EINVAL, "checkpoint metadata key '%s' is empty, reserved or has no value",
                        key ? key : "(null)");
    for (int i = 0; i < w->nm; i++)
        if (!strcmp(w->mkey[i], key)) return dt_error(DT_EINVAL, "checkpoint metadata key '%s' set twice", key);
    if (w->nm == w->capm) {
        int cap = w->capm ? 2 * w->capm : 16;
        char **k = realloc(w->mkey, (size_t)cap * sizeof *k);
        if (k) w->mkey = k;
        char **v = realloc(w->mval, (size_t)cap * sizeof *v);
        if (v) w->mval = v;
        if (!k || !v) return dt_error(DT_ENOMEM, "out of memory adding checkpoint metadata '%s'", key);
        w->capm = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return dt_error(DT_ENOMEM, "out of memory adding checkpoint metadata '%s'", key);
    }
    w->mkey[w->nm] = k;
    w->mval[w->nm] = v;
    w->nm++;
    return DT_OK;
}

/* "[a,b,c]" with exact 64-bit integers (cJSON numbers are doubles; raw text keeps them exact). */
static cJSON *int_list(const int64_t *v, int n) {
    char buf[32 * (DT_MAX_DIMS + 2)];
    size_t off = 0;
    buf[off++] = '[';
    for (int i = 0; i < n; i++) off += (size_t)snprintf(buf + off, sizeof buf - off, "%s%" PRId64, i ? "," : "", v[i]);
    snprintf(buf + off, sizeof buf - off, "]");
    return cJSON_CreateRaw(buf);
}

/* Data order: larger elements first, so every tensor starts aligned to its element size. */
static int *data_order(const dt_st_writer *w) {
    int *ord = malloc((size_t)(w->nt > 0 ? w->nt : 1) * sizeof *ord);
    if (!ord) return NULL;
    int n = 0;
    for (size_t sz = 8; sz >= 1; sz /= 2)
        for (int i = 0; i < w->nt; i++)
            if (dt_dtype_size(w->t[i].dtype) == sz) ord[n++] = i;
    return ord;
}

/* Builds the padded header (with CRCs filled in) into *out (8-byte length prefix included). */
static dt_status build_header(const dt_st_writer *w, const int *ord, char **out, size_t *out_len) {
    dt_status s = dt_error(DT_ENOMEM, "out of memory building a checkpoint header");
    char *text = NULL;
    int64_t *offs = calloc((size_t)(w->nt > 0 ? w->nt : 1), 2 * sizeof *offs);
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = root ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
    if (!offs || !meta) goto fail;
    for (int i = 0; i < w->nm; i++)
        if (!cJSON_AddStringToObject(meta, w->mkey[i], w->mval[i])) goto fail;
    char ver[16], hex[9];
    snprintf(ver, sizeof ver, "%d", DT_ST_FORMAT_VERSION);
    if (!cJSON_AddStringToObject(meta, "dtrain.format", DT_ST_FORMAT) ||
        !cJSON_AddStringToObject(meta, "dtrain.format_version", ver))
        goto fail;
    int64_t pos = 0;
    for (int k = 0; k < w->nt; k++) {
        const st_entry *e = &w->t[ord[k]];
        offs[2 * ord[k]] = pos;
        offs[2 * ord[k] + 1] = pos += (int64_t)e->nbytes;
    }
    for (int i = 0; i < w->nt; i++) {
        const st_entry *e = &w->t[i];
        cJSON *o = cJSON_AddObjectToObject(root, e->name);
        if (!o || !cJSON_AddStringToObject(o, "dtype", dt_dtype_name(e->dtype))) goto fail;
        cJSON *shape = int_list(e->shape, e->ndim), *range = int_list(offs + 2 * i, 2);
        bool ok = shape && cJSON_AddItemToObject(o, "shape", shape);
        if (!ok) cJSON_Delete(shape);
        ok = ok && range && cJSON_AddItemToObject(o, "data_offsets", range);
        if (!ok) {
            cJSON_Delete(range);
            goto fail;
        }
        uLong crc = e->nbytes ? crc32_z(0, e->data, e->nbytes) : 0;
        snprintf(hex, sizeof hex, "%08lx", crc & 0xffffffffUL);
        char *ck = malloc(strlen(e->name) + sizeof "dtrain.crc32.");
        if (!ck) goto fail;
        sprintf(ck, "dtrain.crc32.%s", e->name);
        cJSON *item = cJSON_AddStringToObject(meta, ck, hex);
        free(ck);
        if (!item) goto fail;
    }
    if (!cJSON_AddStringToObject(meta, "dtrain.header_crc32", "00000000")) goto fail;
    if (!(text = cJSON_PrintUnformatted(root))) goto fail;
    size_t L = strlen(text), N = (L + 7) & ~(size_t)7;
    char *buf = malloc(8 + N);
    if (!buf) goto fail;
    for (int b = 0; b < 8; b++) buf[b] = (char)((uint64_t)N >> (8 * b));
    memcpy(buf + 8, text, L);
    memset(buf + 8 + L, ' ', N - L);
    char *hit = memmem(buf + 8, N, HCRC_NEEDLE, sizeof HCRC_NEEDLE - 1);
    if (!hit || memmem(hit + 1, (size_t)(buf + 8 + N - hit - 1), HCRC_NEEDLE, sizeof HCRC_NEEDLE - 1)) {
        free(buf);
        s = dt_error(DT_EINVAL, "a checkpoint tensor name or metadata entry contains the reserved text "
                                "'dtrain.header_crc32'; rename it");
        goto fail;
    }
    uLong hcrc = crc32_z(0, (const Bytef *)buf + 8, N);
    snprintf(hex, sizeof hex, "%08lx", hcrc & 0xffffffffUL);
    memcpy(hit + sizeof HCRC_NEEDLE - 1, hex, 8);
    *out = buf;
    *out_len = 8 + N;
    s = DT_OK;
fail:
    free(text);
    free(offs);
    cJSON_Delete(root);
    return s;
}

static dt_status write_all(int fd, const void *p, size_t n, const char *tmp) {
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return dt_error(DT_EIO, "%s: write failed: %s; check free disk space and quotas", tmp,
                            k < 0 ? strerror(errno) : "no progress");
        c += k;
        n -= (size_t)k;
    }
    return DT_OK;
}

/* fsync of the directory holding path, so the rename itself is durable. */
static dt_status sync_dir(const char *path) {
    size_t cap = strlen(path) + 2; /* room for "." */
    char *dir = malloc(cap);
    if (!dir) return dt_error(DT_ENOMEM, "out of memory");
    dt_path_dir(dir, cap, path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    dt_status s = DT_OK;
    if (fd < 0 || fsync(fd) != 0)
        s = dt_error(DT_EIO, "%s: fsync of directory '%s' failed: %s; the checkpoint may not survive a crash", path,
                     dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return s;
}

dt_status dt_st_writer_write(const dt_st_writer *w, const char *named) {
    char path[4096]; /* the file to replace: named, or where a symbolic link named leads */
    DT_TRY(dt_output_path("", named, path, sizeof path));
    int *ord = data_order(w);
    if (!ord) return dt_error(DT_ENOMEM, "out of memory writing %s", path);
    char *hdr = NULL;
    size_t hlen = 0;
    dt_status s = build_header(w, ord, &hdr, &hlen);
    if (s != DT_OK) {
        free(ord);
        return dt_error_wrap(s, "%s", path);
    }
    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    int fd;
    if (!tmp) {
        s = dt_error(DT_ENOMEM, "out of memory writing %s", path);
        goto done;
    }
    snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    /* the name carries our pid, so an existing file of that name is a leftover of ours: truncate */
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        s = dt_error(errno == ENOENT ? DT_ENOENT : DT_EIO,
                     "%s: cannot create temporary file '%s': %s; check that the directory exists and is writable", path,
                     tmp, strerror(errno));
        goto done;
    }
    s = write_all(fd, hdr, hlen, tmp);
    for (int k = 0; k < w->nt && s == DT_OK; k++) s = write_all(fd, w->t[ord[k]].data, w->t[ord[k]].nbytes, tmp);
    if (s == DT_OK && fsync(fd) != 0)
        s = dt_error(DT_EIO, "%s: fsync failed: %s; check the disk", tmp, strerror(errno));
    int rc = close(fd);
    fd = -1;
    if (s == DT_OK && rc != 0) s = dt_error(DT_EIO, "%s: close failed: %s; check the disk", tmp, strerror(errno));
    if (s == DT_OK && rename(tmp, path) != 0)
        s = dt_error(DT_EIO, "%s: cannot rename '%s' over it: %s; the previous file (if any) is unchanged", path, tmp,
                     strerror(errno));
    if (s != DT_OK) {
        unlink(tmp);
        goto done;
    }
    s = sync_dir(path);
done:
    free(tmp);
    free(hdr);
    free(ord);
    return s;
}
