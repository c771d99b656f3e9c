/* NumPy .npy arrays as data sets (--data npy:...): a features array and an integer labels array,
 * read through the data layer's byte stream (raw or gzip'd). The .npy header (magic, version 1-3,
 * a Python dict literal with 'descr', 'fortran_order' and 'shape') is parsed as the format
 * specifies; dtypes, layouts and shapes the data set cannot hold are refused with an error naming
 * the file and the numpy call that converts it. Semantics are documented in data.h. */
#include "data/data_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NPY_MAX_DIMS 32

typedef struct {
    char kind; /* 'u', 'i', 'f', 'b', 'c', ... (numpy's dtype.kind) */
    int size;  /* bytes per element */
    bool big;  /* '>' byte order */
    bool fortran;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    uint64_t count; /* elements */
} npy_header;

bool dt_data_is_npy(const char *spec) { return spec && !strncmp(spec, "npy:", 4); }

/* ---- the header's dict literal ------------------------------------------------------------ */

static const char *skip_ws(const char *p) {
    while (*p && isspace((unsigned char)*p)) p++;
    return p;
}

/* A quoted Python string at p into out; the position after it, or NULL. */
static const char *parse_str(const char *p, char *out, size_t cap) {
    const char q = *p;
    if (q != '\'' && q != '"') return NULL;
    size_t n = 0;
    for (p++; *p && *p != q; p++)
        if (n + 1 < cap) out[n++] = *p;
    out[n] = '\0';
    return *p == q ? p + 1 : NULL;
}

/* A tuple of non-negative integers "(a, b, )" at p into h->shape; the position after it, or NULL. */
static const char *parse_shape(const char *p, npy_header *h) {
    if (*p != '(') return NULL;
    p = skip_ws(p + 1);
    h->ndim = 0;
    while (*p != ')') {
        char *end;
        if (!isdigit((unsigned char)*p) || h->ndim == NPY_MAX_DIMS) return NULL;
        long long v = strtoll(p, &end, 10);
        h->shape[h->ndim++] = v;
        p = skip_ws(end);
        if (*p == 'L') p = skip_ws(p + 1); /* Python 2 longs */
        if (*p == ',') p = skip_ws(p + 1);
        else if (*p != ')') return NULL;
    }
    return p + 1;
}

/* The value of one key at p; the position after it, or NULL with the error set. */
static const char *parse_value(const char *p, const char *key, npy_header *h, const char *path, int *seen) {
    char s[64];
    if (!strcmp(key, "descr")) {
        if (*p == '[')
            return dt_error(DT_EFORMAT,
                            "%s: a structured array (fields %.40s...) is not supported: save plain arrays "
                            "(np.save(path, x.astype(np.float32)))",
                            path, p),
                   NULL;
        if (!(p = parse_str(p, s, sizeof s)) || strlen(s) < 3 || !strchr("<>|=", s[0]) || !isdigit((unsigned char)s[2]))
            return dt_error(DT_EFORMAT, "%s: bad 'descr' in the .npy header", path), NULL;
        h->big = s[0] == '>', h->kind = s[1], h->size = atoi(s + 2);
        *seen |= 1;
    } else if (!strcmp(key, "fortran_order")) {
        if (!strncmp(p, "True", 4)) h->fortran = true, p += 4;
        else if (!strncmp(p, "False", 5)) h->fortran = false, p += 5;
        else return dt_error(DT_EFORMAT, "%s: bad 'fortran_order' in the .npy header", path), NULL;
        *seen |= 2;
    } else if (!strcmp(key, "shape")) {
        if (!(p = parse_shape(p, h))) return dt_error(DT_EFORMAT, "%s: bad 'shape' in the .npy header", path), NULL;
        *seen |= 4;
    } else {
        return dt_error(DT_EFORMAT, "%s: unknown key '%s' in the .npy header", path, key), NULL;
    }
    return p;
}

/* Parses the header dict text into h. */
static dt_status parse_dict(const char *text, npy_header *h, const char *path) {
    const char *p = skip_ws(text);
    int seen = 0;
    if (*p++ != '{') return dt_error(DT_EFORMAT, "%s: the .npy header is not a dict", path);
    for (p = skip_ws(p); *p != '}';) {
        char key[32];
        if (!(p = parse_str(p, key, sizeof key))) return dt_error(DT_EFORMAT, "%s: bad key in the .npy header", path);
        p = skip_ws(p);
        if (*p++ != ':') return dt_error(DT_EFORMAT, "%s: bad .npy header (no ':' after '%s')", path, key);
        if (!(p = parse_value(skip_ws(p), key, h, path, &seen))) return DT_EFORMAT;
        p = skip_ws(p);
        if (*p == ',') p = skip_ws(p + 1);
        else if (*p != '}') return dt_error(DT_EFORMAT, "%s: bad .npy header after '%s'", path, key);
    }
    if (seen != 7) return dt_error(DT_EFORMAT, "%s: the .npy header lacks 'descr', 'fortran_order' or 'shape'", path);
    h->count = 1;
    for (int i = 0; i < h->ndim; i++) {
        if (h->shape[i] > 0 && h->count > UINT64_MAX / (uint64_t)h->shape[i])
            return dt_error(DT_EFORMAT, "%s: shape too large", path);
        h->count *= (uint64_t)h->shape[i];
    }
    return DT_OK;
}

/* Opens path and reads its header into h, leaving s at the data. On error s is closed. */
static dt_status read_header(dt_stream *s, const char *path, npy_header *h) {
    memset(h, 0, sizeof *h);
    DT_TRY(dt_stream_open(s, path));
    uint8_t pre[12];
    dt_status st = DT_EFORMAT;
    char *text = NULL;
    int64_t got = dt_stream_read(s, pre, 10);
    if (got < 0) {
        st = DT_EIO;
        goto fail;
    }
    if (got < 10 || memcmp(pre, "\x93NUMPY", 6)) {
        st = dt_error(DT_EFORMAT, "%s: not a .npy file (it does not start with \\x93NUMPY): write it with np.save",
                      path);
        goto fail;
    }
    uint32_t len = pre[8] | (uint32_t)pre[9] << 8;
    if (pre[6] >= 2 && pre[6] <= 3) { /* versions 2 and 3: a 4-byte length */
        if (dt_stream_read(s, pre + 10, 2) != 2) goto truncated;
        len |= (uint32_t)pre[10] << 16 | (uint32_t)pre[11] << 24;
    } else if (pre[6] != 1) {
        st = dt_error(DT_EFORMAT, "%s: .npy format version %u.%u is not supported (1.0 to 3.0 are)", path, pre[6],
                      pre[7]);
        goto fail;
    }
    if (len > (1u << 20) || !(text = malloc(len + 1))) {
        st = dt_error(DT_EFORMAT, "%s: .npy header of %u bytes", path, len);
        goto fail;
    }
    if (dt_stream_read(s, text, len) != (int64_t)len) goto truncated;
    text[len] = '\0';
    st = parse_dict(text, h, path);
    free(text);
    /* the file can hold what its header promises (gzip: at most ~1100x its size, as IDX): checked
     * before the data is allocated */
    const uint64_t limit = s->gz ? s->file_size * 1100 + 4096 : s->file_size;
    if (st == DT_OK && s->sized && h->size > 0 && h->count > limit / (uint64_t)h->size)
        st = dt_error(DT_EFORMAT,
                      "%s: cut short: its header promises %llu elements of %d bytes, more than the %llu-byte "
                      "file holds",
                      path, (unsigned long long)h->count, h->size, (unsigned long long)s->file_size);
    if (st == DT_OK) return DT_OK;
    dt_stream_close(s);
    return st;
truncated:
    st = dt_error(DT_EFORMAT, "%s: the .npy header is cut short", path);
fail:
    free(text);
    dt_stream_close(s);
    return st;
}

/* Reads the h->count elements that follow the header into dst and checks that nothing follows.
 * Always closes s. */
static dt_status read_body(dt_stream *s, const char *path, const npy_header *h, void *dst) {
    const uint64_t bytes = h->count * (uint64_t)h->size;
    int64_t got = dt_stream_read(s, dst, bytes);
    uint8_t extra;
    dt_status st = DT_OK;
    if (got < 0) st = DT_EIO;
    else if ((uint64_t)got != bytes)
        st = dt_error(DT_EFORMAT, "%s: cut short: its header promises %llu bytes of data, it holds %lld", path,
                      (unsigned long long)bytes, (long long)got);
    else if ((got = dt_stream_read(s, &extra, 1)) != 0)
        st = got < 0 ? DT_EIO
                     : dt_error(DT_EFORMAT, "%s: trailing data after the %llu bytes its header promises", path,
                                (unsigned long long)bytes);
    dt_stream_close(s);
    return st;
}

/* ---- features and labels ------------------------------------------------------------------ */

/* The data set dtype of a features array, or DT_EFORMAT naming what to convert. */
static dt_status feature_dtype(const npy_header *h, const char *path, dt_dtype *out) {
    static const struct {
        char kind;
        int size;
        dt_dtype t;
    } map[] = {{'u', 1, DT_U8},  {'i', 1, DT_I8},  {'i', 2, DT_I16},
               {'i', 4, DT_I32}, {'f', 4, DT_F32}, {'f', 8, DT_F64}};
    if (h->big && h->size > 1)
        return dt_error(DT_EFORMAT, "%s: big-endian data: save it little-endian (x.astype(x.dtype.newbyteorder('<')))",
                        path);
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (map[i].kind == h->kind && map[i].size == h->size) return *out = map[i].t, DT_OK;
    return dt_error(DT_EFORMAT,
                    "%s: features of dtype %c%d are not supported (uint8, int8, int16, int32, float32 and "
                    "float64 are): convert them, e.g. np.save(path, x.astype(np.float32))",
                    path, h->kind, h->size);
}

/* Sample shape of a features array as IDX's: (n) -> (1,1,1), (n,W) -> (1,1,W), (n,H,W) -> (1,H,W),
 * (n,C,H,W), more dims fold into C. */
static dt_status feature_shape(const npy_header *h, const char *path, int *C, int *H, int *W) {
    if (h->ndim < 1 || h->shape[0] < 1 || h->shape[0] > UINT32_MAX)
        return dt_error(DT_EFORMAT,
                        "%s: a features array needs a first dimension of 1..2^32-1 samples (shape has %d dims%s)", path,
                        h->ndim, h->ndim ? ", the first 0 or too large" : "");
    if (h->fortran && h->ndim > 1)
        return dt_error(DT_EFORMAT,
                        "%s: Fortran-ordered (column-major) array: save it C-ordered "
                        "(np.save(path, np.ascontiguousarray(x)))",
                        path);
    int64_t d[3] = {1, 1, 1};
    const int k = h->ndim - 1;
    for (int i = 1; i < h->ndim; i++) {
        int slot = k >= 3 ? (i <= k - 2 ? 0 : i - (k - 2)) : 3 - k + (i - 1);
        d[slot] *= h->shape[i];
        if (d[slot] > INT32_MAX) return dt_error(DT_EFORMAT, "%s: a sample of this shape is too large", path);
    }
    if (d[0] * d[1] * d[2] == 0) return dt_error(DT_EFORMAT, "%s: samples of zero size", path);
    *C = (int)d[0], *H = (int)d[1], *W = (int)d[2];
    return DT_OK;
}

/* Labels of n samples from path into y (int32 class ids); DT_EFORMAT for a shape, dtype or value
 * that is not a class id. */
static dt_status read_labels(const char *path, size_t n, const char *x_path, int32_t *y) {
    dt_stream s;
    npy_header h;
    DT_TRY(read_header(&s, path, &h));
    dt_status st = DT_OK;
    if (h.kind != 'i' && h.kind != 'u')
        st = dt_error(DT_EFORMAT,
                      "%s: labels must be integer class ids, this array holds dtype %c%d: save "
                      "y.astype(np.int64) when they are whole numbers (float regression targets: the Python API)",
                      path, h.kind, h.size);
    else if (h.size != 1 && h.size != 2 && h.size != 4 && h.size != 8)
        st = dt_error(DT_EFORMAT, "%s: integer size %d", path, h.size);
    else if (h.big && h.size > 1) st = dt_error(DT_EFORMAT, "%s: big-endian labels: save them little-endian", path);
    else if (!(h.ndim == 1 || (h.ndim == 2 && h.shape[1] == 1)) || (uint64_t)h.shape[0] != n)
        st = dt_error(DT_EFORMAT,
                      "%s: labels must have shape (%zu,) or (%zu, 1), one per sample of %s; this array has %d "
                      "dims, the first %lld",
                      path, n, n, x_path, h.ndim, h.ndim ? (long long)h.shape[0] : 0LL);
    uint8_t *raw = st == DT_OK ? malloc(n * (size_t)h.size) : NULL;
    if (st == DT_OK && !raw) st = dt_error(DT_ENOMEM, "%s: out of memory", path);
    if (st != DT_OK) {
        dt_stream_close(&s);
        return st;
    }
    if ((st = read_body(&s, path, &h, raw)) == DT_OK)
        for (size_t i = 0; i < n; i++) {
            int64_t v = 0;
            uint64_t u = 0;
            memcpy(&u, raw + i * (size_t)h.size, (size_t)h.size); /* little-endian host */
            v = h.kind == 'u' || h.size == 8 ? (int64_t)u : (int64_t)(u << (64 - 8 * h.size)) >> (64 - 8 * h.size);
            if (v < 0 || v >= DT_MAX_CLASSES || (h.kind == 'u' && h.size == 8 && u > INT64_MAX)) {
                st = dt_error(DT_EFORMAT, "%s: label %lld of sample %zu is not a class id in [0, %d)", path,
                              (long long)v, i, DT_MAX_CLASSES);
                break;
            }
            y[i] = (int32_t)v;
        }
    free(raw);
    return st;
}

dt_status dt_dataset_open_npy(dt_dataset **out, const char *x_path, const char *y_path) {
    *out = NULL;
    dt_stream s;
    npy_header h;
    dt_dtype dtype = DT_F32;
    int C = 0, H = 0, W = 0;
    DT_TRY(read_header(&s, x_path, &h));
    dt_status st = feature_dtype(&h, x_path, &dtype);
    if (st == DT_OK) st = feature_shape(&h, x_path, &C, &H, &W);
    dt_dataset *ds = st == DT_OK ? dt_dataset_alloc() : NULL;
    if (st == DT_OK && !ds) st = DT_ENOMEM;
    if (st != DT_OK) {
        dt_stream_close(&s);
        return st;
    }
    ds->dtype = dtype, ds->n = (size_t)h.shape[0], ds->C = C, ds->H = H, ds->W = W, ds->D = (size_t)C * H * W;
    ds->scale = dtype == DT_U8 ? 1.0 / 255 : 1.0; /* as IDX and dt_dataset_create: 8-bit pixels */
    snprintf(ds->source, sizeof ds->source, "%s", x_path);
    ds->x = malloc(h.count * (size_t)h.size);
    ds->y = malloc(ds->n * sizeof *ds->y);
    if (!ds->x || !ds->y)
        st = dt_error(DT_ENOMEM, "%s: out of memory for %llu bytes", x_path, (unsigned long long)(h.count * h.size));
    if (st == DT_OK) st = read_body(&s, x_path, &h, ds->x);
    else dt_stream_close(&s);
    if (st == DT_OK) st = read_labels(y_path, ds->n, x_path, ds->y);
    if (st == DT_OK) st = dt_dataset_check_labels(ds, 0, y_path);
    if (st != DT_OK) {
        dt_dataset_destroy(ds);
        return st;
    }
    dt_dataset_update_lut(ds);
    *out = ds;
    return DT_OK;
}

/* ---- the --data spec ---------------------------------------------------------------------- */

bool dt_data_is_npy_dir(const char *path) {
    char p[PATH_MAX];
    struct stat st;
    if (!path || stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    snprintf(p, sizeof p, "%s/x_train.npy", path);
    return access(p, F_OK) == 0;
}

/* Splits "npy:A,B[,C,D]" into up to 4 paths (in buf); their count, or -1 for another count. */
static int split_paths(const char *list, char *buf, size_t cap, char *paths[4]) {
    snprintf(buf, cap, "%s", list);
    int n = 0;
    for (char *p = buf, *comma; p; p = comma ? comma + 1 : NULL) {
        if ((comma = strchr(p, ','))) *comma = '\0';
        if (n == 4) return -1;
        paths[n++] = p;
    }
    return n == 2 || n == 4 ? n : -1;
}

/* The train set and (when both exist) the test set of an npy directory's Keras-style files. */
static int dir_paths(const char *dir, char p[4][PATH_MAX]) {
    static const char *names[4] = {"x_train.npy", "y_train.npy", "x_test.npy", "y_test.npy"};
    for (int i = 0; i < 4; i++) snprintf(p[i], PATH_MAX, "%s/%s", dir, names[i]);
    return access(p[2], F_OK) == 0 || access(p[3], F_OK) == 0 ? 4 : 2;
}

dt_status dt_dataset_open_npy_spec(dt_dataset **train, dt_dataset **test, const char *spec) {
    *train = NULL;
    if (test) *test = NULL;
    const char *arg = dt_data_is_npy(spec) ? spec + 4 : spec;
    char buf[4 * PATH_MAX], dirp[4][PATH_MAX], *paths[4];
    struct stat st;
    int n;
    if (!strchr(arg, ',') && stat(arg, &st) == 0 && S_ISDIR(st.st_mode)) {
        n = dir_paths(arg, dirp);
        for (int i = 0; i < 4; i++) paths[i] = dirp[i];
    } else if ((n = split_paths(arg, buf, sizeof buf, paths)) < 0) {
        return dt_error(DT_EINVAL,
                        "`data` %s: pass npy:X.npy,Y.npy (features, labels), npy:X.npy,Y.npy,XTEST.npy,YTEST.npy, "
                        "or npy:DIR with x_train.npy, y_train.npy (and x_test.npy, y_test.npy)",
                        spec);
    }
    for (int i = 0; i < n; i++)
        if (access(paths[i], R_OK) != 0)
            return dt_error(
                DT_ENOENT, "`data` %s: %s: no such file%s", spec, paths[i],
                n == 4 && i >= 2 && paths[0] == dirp[0] ? " (a test set needs both x_test.npy and y_test.npy)" : "");
    DT_TRY(dt_dataset_open_npy(train, paths[0], paths[1]));
    if (n == 2 || !test) return DT_OK;
    dt_status s = dt_dataset_open_npy(test, paths[2], paths[3]);
    if (s == DT_OK && (*test)->D != (*train)->D)
        s = dt_error(DT_EFORMAT, "%s: %zu values per sample, but the train set %s has %zu", paths[2], (*test)->D,
                     paths[0], (*train)->D);
    if (s == DT_OK) {
        int k = (*train)->classes > (*test)->classes ? (*train)->classes : (*test)->classes;
        (*train)->classes = (*test)->classes = k;
        return DT_OK;
    }
    dt_dataset_destroy(*train);
    dt_dataset_destroy(*test);
    *train = *test = NULL;
    return s;
}
