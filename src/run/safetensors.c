/* Safetensors reader: loads a checkpoint file whole into one aligned buffer, validates its
 * structure (header length, JSON, dtype/shape/data_offsets, bounds, overlaps, truncation) and,
 * when the file carries dtrain integrity metadata, the header and per-tensor CRC32s. Tensors are
 * then views into that buffer. The layout is described in include/dtrain/safetensors.h. */
#include "dtrain/safetensors.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

struct dt_st_file {
    char *path;
    unsigned char *mem;        /* the whole file, placed so that the data section is 64-aligned */
    const unsigned char *data; /* data section */
    size_t data_len;
    cJSON *root;
    dt_st_tensor *t;    /* header order */
    const char **tname; /* t[i].name */
    int nt;
    int *by_name;              /* tensor indices sorted by name */
    const char **mkey, **mval; /* metadata, header order */
    int nm;
    int *meta_by_key;
    bool verified;
};

static const char HCRC_NEEDLE[] = "\"dtrain.header_crc32\":\"";
static const char CORRUPT[] = "(file corrupted); use an earlier checkpoint";
static const char TRUNC[] = "(file truncated); use an earlier checkpoint";
static const char NOTST[] = "not a safetensors file, or corrupted; use an earlier checkpoint";

/* DT_EFORMAT with "<path>: <message>". */
static dt_status bad(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static dt_status bad(const char *path, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_error(DT_EFORMAT, "%s: %s", path, msg);
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static bool get_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

/* 8 hex digits -> value; false if s is not exactly that. */
static bool parse_hex8(const char *s, size_t n, uint32_t *out) {
    if (n != 8) return false;
    uint32_t v = 0;
    for (size_t i = 0; i < 8; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return false;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return true;
}

static int cmp_name(const void *a, const void *b, void *names) {
    const char **v = names;
    return strcmp(v[*(const int *)a], v[*(const int *)b]);
}
/* Indices 0..n-1 sorted by names[i] (for binary search and duplicate detection). */
static int *sorted_index(const char **names, int n) {
    int *idx = malloc((size_t)(n > 0 ? n : 1) * sizeof *idx);
    if (!idx) return NULL;
    for (int i = 0; i < n; i++) idx[i] = i;
    qsort_r(idx, (size_t)n, sizeof *idx, cmp_name, names);
    return idx;
}
/* Binary search of key in names[] through the sorted index idx; -1 if absent. */
static int lookup(const int *idx, const char **names, int n, const char *key) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(key, names[idx[mid]]);
        if (!c) return idx[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

/* Reads the whole file into f->mem; the data section lands 64-byte aligned. */
static dt_status load_bytes(dt_st_file *f, size_t *hlen_out, const unsigned char **hdr_out) {
    const char *path = f->path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt_error(errno == ENOENT ? DT_ENOENT : DT_EIO, "%s: cannot open: %s; check the path", path,
                        strerror(errno));
    dt_status s = DT_OK;
    struct stat st;
    unsigned char len8[8];
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = dt_error(DT_EIO, "%s: not a regular file; pass a checkpoint file", path);
        goto out;
    }
    size_t size = (size_t)st.st_size;
    if (size < 8) {
        s = bad(path, "file is %zu bytes, shorter than the 8-byte header length %s", size, TRUNC);
        goto out;
    }
    if (pread(fd, len8, 8, 0) != 8) {
        s = dt_error(DT_EIO, "%s: read failed: %s", path, strerror(errno));
        goto out;
    }
    uint64_t N = 0;
    for (int b = 7; b >= 0; b--) N = N << 8 | len8[b];
    if (N > DT_ST_MAX_HEADER) {
        s = bad(path, "header length %" PRIu64 " is absurd (over %d bytes): %s", N, DT_ST_MAX_HEADER, NOTST);
        goto out;
    }
    if (N > size - 8) {
        s = bad(path, "header length %" PRIu64 " runs past the end of the %zu-byte file %s", N, size, TRUNC);
        goto out;
    }
    if (N < 2) {
        s = bad(path, "header length %" PRIu64 " is too small for a JSON header %s", N, CORRUPT);
        goto out;
    }
    size_t pad = (64 - (8 + N) % 64) % 64;
    void *mem = NULL;
    if (posix_memalign(&mem, 64, pad + size + 1) != 0) {
        s = dt_error(DT_ENOMEM, "%s: out of memory reading a %zu-byte checkpoint", path, size);
        goto out;
    }
    f->mem = mem;
    for (size_t got = 0; got < size;) {
        size_t want = size - got > (1u << 30) ? (1u << 30) : size - got;
        ssize_t k = pread(fd, f->mem + pad + got, want, (off_t)got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            s = k < 0 ? dt_error(DT_EIO, "%s: read failed: %s", path, strerror(errno))
                      : bad(path, "file shrank while reading (another process is writing it?); retry");
            goto out;
        }
        got += (size_t)k;
    }
    *hdr_out = f->mem + pad + 8;
    *hlen_out = N;
    f->data = f->mem + pad + 8 + N;
    f->data_len = size - 8 - N;
out:
    close(fd);
    return s;
}

/* If the header carries dtrain.header_crc32, verifies it over the raw header bytes. */
static dt_status check_header_crc(const dt_st_file *f, unsigned char *hdr, size_t N, bool *present) {
    size_t nl = sizeof HCRC_NEEDLE - 1;
    unsigned char *hit = memmem(hdr, N, HCRC_NEEDLE, nl);
    *present = hit != NULL;
    if (!hit) return DT_OK;
    if (memmem(hit + 1, (size_t)(hdr + N - hit - 1), HCRC_NEEDLE, nl))
        return bad(f->path, "header holds dtrain.header_crc32 twice %s", CORRUPT);
    unsigned char *digits = hit + nl;
    uint32_t stored;
    if ((size_t)(digits - hdr) + 9 > N || digits[8] != '"' || !parse_hex8((const char *)digits, 8, &stored))
        return bad(f->path, "dtrain.header_crc32 is not 8 hex digits %s", CORRUPT);
    unsigned char save[8];
    memcpy(save, digits, 8);
    memset(digits, '0', 8);
    uint32_t crc = (uint32_t)crc32_z(0, hdr, N);
    memcpy(digits, save, 8);
    if (crc != stored)
        return bad(f->path, "header fails its CRC32 check (stored %08" PRIx32 ", computed %08" PRIx32 ") %s", stored,
                   crc, CORRUPT);
    return DT_OK;
}

/* Parses one tensor entry {"dtype","shape","data_offsets"} into *t and its offsets. */
static dt_status parse_tensor(const dt_st_file *f, const cJSON *j, dt_st_tensor *t, uint64_t off[2]) {
    const char *p = f->path, *name = j->string;
    t->name = name;
    if (!cJSON_IsObject(j)) return bad(p, "tensor '%s' is not a JSON object %s", name, CORRUPT);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt)) return bad(p, "tensor '%s' has no string 'dtype' %s", name, CORRUPT);
    if (dt_dtype_parse(dt->valuestring, &t->t.dtype) != DT_OK)
        return bad(p, "tensor '%s' has dtype '%s', which dtrain does not support (F32 F64 BF16 F16 I32 I64 U8 I8 I16)",
                   name, dt->valuestring);
    if (!cJSON_IsArray(sh)) return bad(p, "tensor '%s' has no 'shape' list %s", name, CORRUPT);
    int nd = cJSON_GetArraySize(sh);
    if (nd > DT_MAX_DIMS) return bad(p, "tensor '%s' has %d dims; dtrain supports at most %d", name, nd, DT_MAX_DIMS);
    t->t.ndim = nd;
    uint64_t bytes = dt_dtype_size(t->t.dtype), d;
    int i = 0;
    for (const cJSON *e = sh->child; e; e = e->next, i++) {
        if (!get_uint(e, &d))
            return bad(p, "tensor '%s': shape[%d] is not a non-negative integer %s", name, i, CORRUPT);
        t->t.shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > (1ull << 53))
            return bad(p, "tensor '%s': shape is absurdly large %s", name, CORRUPT);
    }
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 || !get_uint(of->child, &off[0]) ||
        !get_uint(of->child->next, &off[1]))
        return bad(p, "tensor '%s': 'data_offsets' is not a list of two non-negative integers %s", name, CORRUPT);
    if (off[1] < off[0])
        return bad(p, "tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] end before they begin %s", name, off[0],
                   off[1], CORRUPT);
    if (off[1] - off[0] != bytes)
        return bad(p,
                   "tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64 "] span %" PRIu64
                   " bytes but dtype x shape needs %" PRIu64 " %s",
                   name, off[0], off[1], off[1] - off[0], bytes, CORRUPT);
    t->nbytes = (size_t)bytes;
    return DT_OK;
}

static dt_status parse_meta(dt_st_file *f, const cJSON *m) {
    if (!cJSON_IsObject(m)) return bad(f->path, "'__metadata__' is not a JSON object %s", CORRUPT);
    int n = cJSON_GetArraySize(m);
    f->mkey = malloc((size_t)(n > 0 ? n : 1) * sizeof *f->mkey);
    f->mval = malloc((size_t)(n > 0 ? n : 1) * sizeof *f->mval);
    if (!f->mkey || !f->mval) return dt_error(DT_ENOMEM, "%s: out of memory", f->path);
    for (const cJSON *e = m->child; e; e = e->next) {
        if (!cJSON_IsString(e)) return bad(f->path, "metadata '%s' is not a string %s", e->string, CORRUPT);
        f->mkey[f->nm] = e->string;
        f->mval[f->nm++] = e->valuestring;
    }
    if (!(f->meta_by_key = sorted_index(f->mkey, f->nm))) return dt_error(DT_ENOMEM, "%s: out of memory", f->path);
    for (int i = 1; i < f->nm; i++)
        if (!strcmp(f->mkey[f->meta_by_key[i]], f->mkey[f->meta_by_key[i - 1]]))
            return bad(f->path, "metadata key '%s' appears twice %s", f->mkey[f->meta_by_key[i]], CORRUPT);
    return DT_OK;
}

static int cmp_off(const void *a, const void *b, void *offs) {
    const uint64_t *o = offs;
    uint64_t x = o[2 * *(const int *)a], y = o[2 * *(const int *)b];
    return x < y ? -1 : x > y;
}

/* Checks bounds against the data section and that no two non-empty tensors overlap. */
static dt_status check_layout(dt_st_file *f, uint64_t *offs) {
    int last = -1;
    for (int i = 0; i < f->nt; i++)
        if (last < 0 || offs[2 * i + 1] > offs[2 * last + 1]) last = i;
    if (last >= 0 && offs[2 * last + 1] > f->data_len)
        return bad(f->path, "data section holds %zu bytes but tensor '%s' ends at byte %" PRIu64 " %s", f->data_len,
                   f->tname[last], offs[2 * last + 1], TRUNC);
    const uint64_t used = last >= 0 ? offs[2 * last + 1] : 0; /* the layout ends its data (no trailing bytes) */
    if (used < f->data_len)
        return bad(f->path,
                   "%zu bytes follow the end of the last tensor's data (at byte %" PRIu64 " of the data "
                   "section): something was appended to the file %s",
                   f->data_len - (size_t)used, used, CORRUPT);
    int *ord = malloc((size_t)(f->nt > 0 ? f->nt : 1) * sizeof *ord);
    if (!ord) return dt_error(DT_ENOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < f->nt; i++) ord[i] = i;
    qsort_r(ord, (size_t)f->nt, sizeof *ord, cmp_off, offs);
    dt_status s = DT_OK;
    int prev = -1; /* the non-empty tensor reaching furthest so far */
    for (int k = 0; k < f->nt && s == DT_OK; k++) {
        int i = ord[k];
        if (offs[2 * i] == offs[2 * i + 1]) continue;
        if (prev >= 0 && offs[2 * i] < offs[2 * prev + 1])
            s = bad(f->path,
                    "tensors '%s' [%" PRIu64 ",%" PRIu64 ") and '%s' [%" PRIu64 ",%" PRIu64
                    ") overlap in the data section %s",
                    f->tname[prev], offs[2 * prev], offs[2 * prev + 1], f->tname[i], offs[2 * i], offs[2 * i + 1],
                    CORRUPT);
        if (prev < 0 || offs[2 * i + 1] > offs[2 * prev + 1]) prev = i;
    }
    free(ord);
    return s;
}

/* Verifies dtrain's integrity metadata. Plain safetensors files written by other tools have no
 * "dtrain.format" and no CRC keys: they pass with structural validation only (verified=false). */
static dt_status check_integrity(dt_st_file *f, bool have_hcrc) {
    const char *p = f->path, *fmt = dt_st_meta(f, "dtrain.format");
    if (fmt) {
        const char *ver = dt_st_meta(f, "dtrain.format_version");
        char *end = NULL;
        long v = ver ? strtol(ver, &end, 10) : 0;
        if (strcmp(fmt, DT_ST_FORMAT) != 0)
            return bad(p, "dtrain.format is '%s', expected '%s' %s", fmt, DT_ST_FORMAT, CORRUPT);
        if (!ver || !*ver || *end || v < 1)
            return bad(p, "dtrain.format_version is missing or not a positive integer %s", CORRUPT);
        if (v > DT_ST_FORMAT_VERSION)
            return bad(p,
                       "written by a newer dtrain (checkpoint format version %ld, this build reads up to %d); "
                       "upgrade dtrain",
                       v, DT_ST_FORMAT_VERSION);
        if (!have_hcrc) return bad(p, "dtrain checkpoint without dtrain.header_crc32 (header damaged) %s", CORRUPT);
    }
    int ncrc = 0;
    for (int i = 0; i < f->nt; i++) {
        const dt_st_tensor *t = &f->t[i];
        size_t kl = strlen(t->name) + sizeof "dtrain.crc32.";
        char *key = malloc(kl);
        if (!key) return dt_error(DT_ENOMEM, "%s: out of memory", p);
        snprintf(key, kl, "dtrain.crc32.%s", t->name);
        const char *hex = dt_st_meta(f, key);
        free(key);
        uint32_t stored;
        if (!hex) {
            if (fmt) return bad(p, "tensor '%s' has no dtrain.crc32 entry (header damaged) %s", t->name, CORRUPT);
            continue;
        }
        if (!parse_hex8(hex, strlen(hex), &stored))
            return bad(p, "dtrain.crc32.%s is not 8 hex digits %s", t->name, CORRUPT);
        uint32_t crc = (uint32_t)crc32_z(0, t->t.data, t->nbytes);
        if (crc != stored)
            return bad(p, "tensor '%s' fails its CRC32 check (stored %08" PRIx32 ", computed %08" PRIx32 ") %s",
                       t->name, stored, crc, CORRUPT);
        ncrc++;
    }
    for (int i = 0; i < f->nm; i++)
        if (!strncmp(f->mkey[i], "dtrain.crc32.", 13) && lookup(f->by_name, f->tname, f->nt, f->mkey[i] + 13) < 0)
            return bad(p, "dtrain.crc32 entry for tensor '%s', which the file does not hold (header damaged) %s",
                       f->mkey[i] + 13, CORRUPT);
    f->verified = have_hcrc && ncrc == f->nt;
    return DT_OK;
}

static dt_status parse_header(dt_st_file *f, const unsigned char *hdr, size_t N, uint64_t **offs_out) {
    const char *p = f->path;
    if (hdr[0] != '{') return bad(p, "header does not start with '{': %s", NOTST);
    const char *end = NULL;
    f->root = cJSON_ParseWithLengthOpts((const char *)hdr, N, &end, 0);
    if (!f->root)
        return bad(p, "header is not valid JSON (error near byte %zu of %zu) %s",
                   end ? (size_t)(end - (const char *)hdr) : 0, N, CORRUPT);
    for (const char *c = end; c < (const char *)hdr + N; c++)
        if (!*c || !strchr(" \t\r\n", *c))
            return bad(p, "header has stray bytes after its JSON (at byte %zu of %zu) %s",
                       (size_t)(c - (const char *)hdr), N, CORRUPT);
    if (!cJSON_IsObject(f->root)) return bad(p, "header is not a JSON object %s", CORRUPT);
    int n = cJSON_GetArraySize(f->root);
    f->t = calloc((size_t)(n > 0 ? n : 1), sizeof *f->t);
    f->tname = calloc((size_t)(n > 0 ? n : 1), sizeof *f->tname);
    uint64_t *offs = *offs_out = calloc((size_t)(n > 0 ? n : 1), 2 * sizeof *offs);
    if (!f->t || !f->tname || !offs) return dt_error(DT_ENOMEM, "%s: out of memory", p);
    const cJSON *meta = NULL;
    for (const cJSON *e = f->root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (meta) return bad(p, "header holds '__metadata__' twice %s", CORRUPT);
            DT_TRY(parse_meta(f, meta = e));
            continue;
        }
        DT_TRY(parse_tensor(f, e, &f->t[f->nt], offs + 2 * f->nt));
        f->tname[f->nt++] = e->string;
    }
    if (!meta && !(f->meta_by_key = sorted_index(NULL, 0))) return dt_error(DT_ENOMEM, "%s: out of memory", p);
    if (!(f->by_name = sorted_index(f->tname, f->nt))) return dt_error(DT_ENOMEM, "%s: out of memory", p);
    for (int i = 1; i < f->nt; i++)
        if (!strcmp(f->tname[f->by_name[i]], f->tname[f->by_name[i - 1]]))
            return bad(p, "tensor '%s' appears twice in the header %s", f->tname[f->by_name[i]], CORRUPT);
    return DT_OK;
}

dt_status dt_st_open(dt_st_file **out, const char *path) {
    *out = NULL;
    dt_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dt_error(DT_ENOMEM, "%s: out of memory", path);
    }
    uint64_t *offs = NULL;
    size_t N = 0;
    const unsigned char *hdr = NULL;
    bool have_hcrc = false;
    dt_status s = load_bytes(f, &N, &hdr);
    if (s == DT_OK) s = check_header_crc(f, (unsigned char *)hdr, N, &have_hcrc);
    if (s == DT_OK) s = parse_header(f, hdr, N, &offs);
    if (s == DT_OK) s = check_layout(f, offs);
    if (s == DT_OK) {
        for (int i = 0; i < f->nt; i++) f->t[i].t.data = (void *)(f->data + offs[2 * i]);
        s = check_integrity(f, have_hcrc);
    }
    free(offs);
    if (s != DT_OK) {
        dt_st_destroy(f);
        return s;
    }
    *out = f;
    return DT_OK;
}

void dt_st_destroy(dt_st_file *f) {
    if (!f) return;
    cJSON_Delete(f->root);
    free(f->mem);
    free(f->t);
    free(f->tname);
    free(f->by_name);
    free(f->mkey);
    free(f->mval);
    free(f->meta_by_key);
    free(f->path);
    free(f);
}

dt_status dt_st_find(const dt_st_file *f, const char *name, dt_st_tensor *out) {
    int i = lookup(f->by_name, f->tname, f->nt, name);
    if (i < 0) return dt_error(DT_ENOENT, "%s: no tensor named '%s' (the file holds %d tensors)", f->path, name, f->nt);
    *out = f->t[i];
    return DT_OK;
}

int dt_st_count(const dt_st_file *f) { return f->nt; }

void dt_st_at(const dt_st_file *f, int i, dt_st_tensor *out) {
    if (i >= 0 && i < f->nt) *out = f->t[i];
    else memset(out, 0, sizeof *out);
}

const char *dt_st_meta(const dt_st_file *f, const char *key) {
    int i = lookup(f->meta_by_key, f->mkey, f->nm, key);
    return i < 0 ? NULL : f->mval[i];
}

int dt_st_meta_count(const dt_st_file *f) { return f->nm; }

const char *dt_st_meta_at(const dt_st_file *f, int i, const char **key) {
    if (i < 0 || i >= f->nm) {
        *key = NULL;
        return NULL;
    }
    *key = f->mkey[i];
    return f->mval[i];
}

bool dt_st_verified(const dt_st_file *f) { return f->verified; }

const char *dt_st_path(const dt_st_file *f) { return f->path; }
