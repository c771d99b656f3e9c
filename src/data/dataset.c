/* The in-memory data set: samples in their compact stored dtype plus int32 labels, opened from
 * IDX files, an IDX directory or alias, or memory; scaling, normalisation and batch assembly
 * (the conversion to f32 happens here, on the hot path). */
#include "data/data_internal.h"

#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

dt_dataset *dt_dataset_alloc(void) {
    dt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) {
        dt_error(DT_ENOMEM, "out of memory allocating a data set");
        return NULL;
    }
    ds->scale = 1.0;
    ds->std = 1.0;
    return ds;
}

void dt_dataset_destroy(dt_dataset *ds) {
    if (!ds) return;
    /* a view still reads it: the last holder to go frees it (atomic: threads may split one
     * borrowed set, each its own views) */
    if (__atomic_fetch_sub(&ds->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (ds->base) {
        free(ds->rows);
        dt_dataset_destroy(ds->base);
    } else if (ds->map) {
        munmap(ds->map, ds->map_len);
    } else {
        free(ds->x);
        free(ds->y);
    }
    free(ds);
}

size_t dt_dataset_len(const dt_dataset *ds) { return ds->n; }
int dt_dataset_classes(const dt_dataset *ds) { return ds->classes; }
bool dt_dataset_has_targets(const dt_dataset *ds) { return ds->targets; }
dt_dtype dt_dataset_dtype(const dt_dataset *ds) { return ds->dtype; }
const char *dt_dataset_source(const dt_dataset *ds) { return ds->source; }
const char *dt_dataset_cache_file(const dt_dataset *ds) { return ds->cache; }

void dt_dataset_shape(const dt_dataset *ds, int *C, int *H, int *W) {
    if (C) *C = ds->C;
    if (H) *H = ds->H;
    if (W) *W = ds->W;
}

void dt_dataset_update_lut(dt_dataset *ds) {
    for (int b = 0; b < 256; b++) {
        double raw = ds->dtype == DT_I8 ? (double)(int8_t)(uint8_t)b : (double)b;
        double v = ds->scale == 1.0 / 255 ? raw / 255.0 : raw * ds->scale;
        ds->lut[b] = (float)((v - ds->mean) / ds->std);
    }
}

dt_status dt_dataset_check_labels(dt_dataset *ds, int classes, const char *what) {
    int32_t mx = -1;
    for (size_t i = 0; i < ds->n; i++) {
        int32_t v = ds->y[dt_dataset_row(ds, i)];
        if (classes <= 0 && v >= DT_MAX_CLASSES)
            return dt_error(DT_EFORMAT, "%s: label %d of sample %zu is too large: at most %d classes (labels 0..%d)",
                            what, v, i, DT_MAX_CLASSES, DT_MAX_CLASSES - 1);
        if (v < 0 || (classes > 0 && v >= classes)) {
            if (classes > 0)
                return dt_error(DT_EFORMAT, "%s: label %d of sample %zu is outside [0, %d)", what, v, i, classes);
            return dt_error(DT_EFORMAT,
                            "%s: label %d of sample %zu is negative (labels must be class indices 0, 1, ...)", what, v,
                            i);
        }
        if (v > mx) mx = v;
    }
    ds->classes = classes > 0 ? classes : mx + 1;
    return DT_OK;
}

dt_status dt_dataset_set_classes(dt_dataset *ds, int classes) {
    if (classes <= 0) return dt_error(DT_EINVAL, "class count must be positive, got %d", classes);
    if (ds->targets)
        return dt_error(DT_EINVAL, "%s holds regression targets (floats), not class labels: a model for it ends in mse",
                        ds->source[0] ? ds->source : "data set");
    if (ds->T) return dt_text_set_classes(ds, classes);
    return dt_dataset_check_labels(ds, classes, ds->labels[0] ? ds->labels : ds->source[0] ? ds->source : "data set");
}

dt_status dt_dataset_set_normalize(dt_dataset *ds, float mean, float std) {
    if (!(std > 0) || mean != mean)
        return dt_error(DT_EINVAL, "normalisation needs a finite mean and std > 0, got mean %g std %g", (double)mean,
                        (double)std);
    if (ds->T && (mean != 0 || std != 1))
        return dt_error(DT_EINVAL, "%s is a text data set (token ids): `normalize` does not apply to it; leave it out",
                        ds->source);
    ds->mean = mean;
    ds->std = std;
    dt_dataset_update_lut(ds);
    return DT_OK;
}

/* The scaled (pre-normalisation) value of element i of the stored data. */
static double raw_at(const dt_dataset *ds, size_t i) {
    switch (ds->dtype) {
    case DT_U8: return ((const uint8_t *)ds->x)[i];
    case DT_I8: return ((const int8_t *)ds->x)[i];
    case DT_I16: return ((const int16_t *)ds->x)[i];
    case DT_I32: return ((const int32_t *)ds->x)[i];
    case DT_F32: return ((const float *)ds->x)[i];
    case DT_F64: return ((const double *)ds->x)[i];
    default: return 0;
    }
}

void dt_dataset_stats(const dt_dataset *ds, double *mean, double *std) {
    if (ds->T) { /* token ids: the identity normalisation */
        if (mean) *mean = 0;
        if (std) *std = 1;
        return;
    }
    size_t total = ds->n * ds->D;
    double m = 0, var = 0;
    if (total && (ds->dtype == DT_U8 || ds->dtype == DT_I8)) {
        uint64_t hist[256] = {0};
        for (size_t r = 0; r < ds->n; r++) {
            const uint8_t *p = (const uint8_t *)ds->x + dt_dataset_row(ds, r) * ds->D;
            for (size_t j = 0; j < ds->D; j++) hist[p[j]]++;
        }
        double s = 0, s2 = 0;
        for (int b = 0; b < 256; b++) {
            double raw = ds->dtype == DT_I8 ? (double)(int8_t)(uint8_t)b : (double)b;
            double v = raw * ds->scale;
            s += (double)hist[b] * v;
            s2 += (double)hist[b] * v * v;
        }
        m = s / (double)total;
        var = s2 / (double)total - m * m;
    } else if (total) {
        /* Welford: stable for large float data */
        size_t i = 0;
        for (size_t r = 0; r < ds->n; r++)
            for (size_t j = 0, off = dt_dataset_row(ds, r) * ds->D; j < ds->D; j++, i++) {
                double v = raw_at(ds, off + j) * ds->scale, d = v - m;
                m += d / (double)(i + 1);
                var += d * (v - m);
            }
        var /= (double)total;
    }
    if (mean) *mean = m;
    if (std) *std = var > 0 ? sqrt(var) : 0;
}

/* ---- batch assembly (the hot path) -------------------------------------------------------- */

/* A byte b as b / 255.0f, bit for bit, without the division: b * (HI + LO), 1/255 split into
 * two floats (HI = 1/255 rounded, LO the rest), with one rounding (the fma). b * LO is off by
 * under 2^-56 of the result and the fma's sum by nothing before its rounding, while b/255 lies at
 * least 0.0019 ulp from a rounding boundary for every byte, so both round to the same float;
 * data_test checks all 256 through dt_dataset_batch. A mul and an fma instead of a vdivps per 16
 * values (docs/why.md, "Bytes to floats without a division"). Without an fma instruction fmaf
 * would be a libm call: the division stays there. */
static inline float u8_unit(uint8_t b) {
#ifdef __FMA__
    const float x = (float)b;
    return fmaf(x, 0x1.010102p-8f, x * -0x1.fdfdfep-33f);
#else
    return (float)b / 255.0f;
#endif
}

static void convert_sample(const dt_dataset *ds, size_t idx, float *restrict dst) {
    size_t D = ds->D, off = dt_dataset_row(ds, idx) * D;
    if (ds->dtype == DT_U8 && ds->scale == 1.0 / 255 && ds->mean == 0.0 && ds->std == 1.0) {
        /* the common case, u8/255: fixed-size chunks let -O2 vectorise it (1.7x the table
         * lookup); u8_unit gives exactly the table's values for all 256 bytes */
        const uint8_t *restrict src = (const uint8_t *)ds->x + off;
        size_t j = 0;
        for (; j + 64 <= D; j += 64)
            for (int k = 0; k < 64; k++) dst[j + k] = u8_unit(src[j + k]);
        for (; j < D; j++) dst[j] = u8_unit(src[j]);
        return;
    }
    if (ds->dtype == DT_U8 || ds->dtype == DT_I8) {
        const uint8_t *restrict src = (const uint8_t *)ds->x + off;
        const float *restrict lut = ds->lut;
        for (size_t j = 0; j < D; j++) dst[j] = lut[src[j]];
        return;
    }
    if (ds->dtype == DT_F32 && ds->scale == 1.0 && ds->mean == 0.0 && ds->std == 1.0) {
        memcpy(dst, (const float *)ds->x + off, D * sizeof(float));
        return;
    }
    double a = ds->scale / ds->std, b = -ds->mean / ds->std;
    for (size_t j = 0; j < D; j++) dst[j] = (float)(raw_at(ds, off + j) * a + b);
}

dt_status dt_dataset_batch(const dt_dataset *ds, const uint32_t *indices, int n, float *x, int32_t *y) {
    if (ds->T)
        return dt_error(DT_EINVAL,
                        "%s is a text data set: build its batches with dt_dataset_batch_tokens (or a loader)",
                        ds->source);
    if (n < 0) return dt_error(DT_EINVAL, "batch size %d is negative", n);
    for (int i = 0; i < n; i++)
        if (indices[i] >= ds->n)
            return dt_error(DT_EINVAL,
                            "batch position %d: sample index %u is out of range (data set %s has %zu samples)", i,
                            indices[i], ds->source[0] ? ds->source : "(memory)", ds->n);
    /* the samples sit at random places in a large array: the load of the sample three ahead
     * is started (prefetched) while this one converts, so batch assembly is not bound by the
     * memory latency of each sample (about half the CPU per MLP batch of 128; it matters where
     * the loader shares a core with a training rank) */
    const size_t bytes = x ? ds->D * dt_dtype_size(ds->dtype) : 0;
    for (int i = 0; i < n; i++) {
        if (i + 3 < n) {
            const size_t ahead = dt_dataset_row(ds, indices[i + 3]);
            for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)ds->x + ahead * bytes + o);
            if (y) __builtin_prefetch(&ds->y[ahead]);
        }
        if (x) convert_sample(ds, indices[i], x + (size_t)i * ds->D);
        if (y) y[i] = ds->y[dt_dataset_row(ds, indices[i])];
    }
    return DT_OK;
}

/* ---- construction ------------------------------------------------------------------------- */

dt_status dt_dataset_create(dt_dataset **out, dt_dtype dtype, const void *x, const int32_t *y, size_t n, int C, int H,
                            int W, int classes) {
    *out = NULL;
    if (dtype != DT_U8 && dtype != DT_I8 && dtype != DT_I16 && dtype != DT_I32 && dtype != DT_F32 && dtype != DT_F64)
        return dt_error(DT_EINVAL, "data set dtype %s is not supported (use U8, I8, I16, I32, F32 or F64)",
                        dt_dtype_name(dtype));
    if (C <= 0 || H <= 0 || W <= 0 || n == 0 || n > UINT32_MAX)
        return dt_error(DT_EINVAL, "data set needs 1..2^32-1 samples of positive shape, got n=%zu shape (%d,%d,%d)", n,
                        C, H, W);
    dt_dataset *ds = dt_dataset_alloc();
    if (!ds) return DT_ENOMEM;
    ds->dtype = dtype;
    ds->n = n;
    ds->C = C, ds->H = H, ds->W = W;
    ds->D = (size_t)C * H * W;
    ds->scale = dtype == DT_U8 ? 1.0 / 255 : 1.0;
    size_t bytes = n * ds->D * dt_dtype_size(dtype);
    ds->x = malloc(bytes);
    ds->y = malloc(n * sizeof(int32_t));
    if (!ds->x || !ds->y) {
        dt_dataset_destroy(ds);
        return dt_error(DT_ENOMEM, "out of memory copying a %zu-byte data set", bytes);
    }
    memcpy(ds->x, x, bytes);
    memcpy(ds->y, y, n * sizeof(int32_t));
    dt_status st = dt_dataset_check_labels(ds, classes, "data set");
    if (st != DT_OK) {
        dt_dataset_destroy(ds);
        return st;
    }
    dt_dataset_update_lut(ds);
    *out = ds;
    return DT_OK;
}

dt_status dt_idx_pair_shape(const dt_idx *im, const dt_idx *lb, const char *images_path, const char *labels_path,
                            int *C, int *H, int *W) {
    if (im->ndim < 1 || im->dims[0] == 0)
        return dt_error(DT_EFORMAT, "%s: image file holds no items (%d dims)", images_path, im->ndim);
    if (lb->ndim != 1)
        return dt_error(DT_EFORMAT, "%s: a label file must have 1 dim (one label per item), this one has %d",
                        labels_path, lb->ndim);
    if (lb->dims[0] != im->dims[0])
        return dt_error(DT_EFORMAT, "%s holds %lld labels but %s holds %lld images: the files do not belong together",
                        labels_path, (long long)lb->dims[0], images_path, (long long)im->dims[0]);
    if ((uint64_t)im->dims[0] > UINT32_MAX)
        return dt_error(DT_EFORMAT, "%s: %lld items is more than the 2^32-1 a data set can index", images_path,
                        (long long)im->dims[0]);
    int64_t c = 1, h = 1, w = 1;
    if (im->ndim >= 2) w = im->dims[im->ndim - 1];
    if (im->ndim >= 3) h = im->dims[im->ndim - 2];
    for (int i = 1; i < im->ndim - 2; i++) c *= im->dims[i];
    if (c * h * w == 0 || c > INT_MAX || h > INT_MAX || w > INT_MAX)
        return dt_error(DT_EFORMAT, "%s: sample shape (%lld,%lld,%lld) is empty or too large", images_path,
                        (long long)c, (long long)h, (long long)w);
    *C = (int)c, *H = (int)h, *W = (int)w;
    return DT_OK;
}

void dt_dataset_init_idx(dt_dataset *ds, const dt_idx *im, int C, int H, int W, const char *images_path,
                         const char *labels_path) {
    ds->n = (size_t)im->dims[0];
    ds->C = C, ds->H = H, ds->W = W;
    ds->D = (size_t)C * H * W;
    ds->dtype = im->dtype;
    ds->scale = im->dtype == DT_U8 ? 1.0 / 255 : 1.0;
    snprintf(ds->source, sizeof ds->source, "%s", images_path);
    snprintf(ds->labels, sizeof ds->labels, "%s", labels_path);
}

/* Whether the IDX file at path holds floats (regression targets when it is a label file). */
static bool idx_holds_floats(const char *path) {
    dt_stream s;
    dt_idx h;
    if (dt_idx_open_header(&s, path, &h) != DT_OK) return dt_error_clear(), false; /* reported by the read */
    dt_stream_close(&s);
    return h.dtype == DT_F32 || h.dtype == DT_F64;
}

dt_status dt_dataset_open_idx(dt_dataset **out, const char *images_path, const char *labels_path) {
    *out = NULL;
    const bool targets = idx_holds_floats(labels_path); /* regression: decoded privately, not cached */
    dt_status st = targets ? DT_OK : dt_cache_open_idx(out, images_path, labels_path);
    if (st != DT_OK || *out) return st;
    /* no cache: decode into private memory */
    dt_idx im, lb;
    DT_TRY(dt_idx_read(images_path, &im));
    st = dt_idx_read(labels_path, &lb);
    if (st != DT_OK) {
        dt_idx_free(&im);
        return st;
    }
    dt_dataset *ds = NULL;
    int C, H, W;
    DT_TRY_GOTO(st = dt_idx_pair_shape(&im, &lb, images_path, labels_path, &C, &H, &W), fail);
    if (!(ds = dt_dataset_alloc())) {
        st = DT_ENOMEM;
        goto fail;
    }
    dt_dataset_init_idx(ds, &im, C, H, W, images_path, labels_path);
    if (!(ds->y = malloc(ds->n * sizeof(int32_t)))) {
        st = dt_error(DT_ENOMEM, "%s: out of memory for %zu labels", labels_path, ds->n);
        goto fail;
    }
    dt_convert(ds->y, targets ? DT_F32 : DT_I32, lb.data, lb.dtype, ds->n); /* targets: f32 bits */
    ds->x = im.data;                                                        /* keep the compact data as read: no copy */
    im.data = NULL;
    ds->targets = targets;
    if (!targets) DT_TRY_GOTO(st = dt_dataset_check_labels(ds, 0, labels_path), fail);
    dt_dataset_update_lut(ds);
    dt_idx_free(&im);
    dt_idx_free(&lb);
    *out = ds;
    return DT_OK;
fail:
    dt_dataset_destroy(ds);
    dt_idx_free(&im);
    dt_idx_free(&lb);
    return st;
}

/* ---- opening by path, directory or alias -------------------------------------------------- */

static bool path_exists(const char *p) { return access(p, F_OK) == 0; }

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Finds the IDX file of one role in dir: dir/name[.gz] (the MNIST name), else any
 * dir/<stem>-idx<D>-<type>[.gz] (stem "train-images", D the number of dims: idx2 feature rows,
 * idx4 C x H x W images, any element type; the header says what it holds). 0 when found, -1
 * when none, 2 when several match (out names two of them). */
static int find_idx(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
    if (path_exists(out)) return 0;
    snprintf(out, cap, "%s/%s.gz", dir, name);
    if (path_exists(out)) return 0;
    char pat[PATH_MAX];
    const char *dash = strstr(name, "-idx");
    snprintf(pat, sizeof pat, "%s/%.*s-idx[0-9]-*", dir, (int)(dash - name), name);
    glob_t g;
    int found = glob(pat, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    int rc = -1;
    if (found >= 1) {
        /* name.gz beside name is one file, not two */
        bool pair = found == 2 && ends_with(g.gl_pathv[1], ".gz") &&
                    strlen(g.gl_pathv[1]) == strlen(g.gl_pathv[0]) + 3 &&
                    !strncmp(g.gl_pathv[0], g.gl_pathv[1], strlen(g.gl_pathv[0]));
        snprintf(out, cap, "%s", g.gl_pathv[0]);
        rc = found == 1 || pair ? 0 : 2;
        if (rc == 2) snprintf(out, cap, "%s and %s", g.gl_pathv[0], g.gl_pathv[1]);
    }
    if (found) globfree(&g);
    return rc;
}

static dt_status missing_alias(const char *alias, const char *dir, const char *what) {
    if (!strcmp(alias, "fashion-mnist"))
        return dt_error(DT_ENOENT,
                        "data set 'fashion-mnist' is not installed (%s%s missing): install it with "
                        "`apt-get install dataset-fashion-mnist` (or run scripts/install-deps)",
                        dir, what);
    return dt_error(DT_ENOENT,
                    "data set '%s' is not installed (%s%s missing): no Debian package ships it; put the four IDX files "
                    "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
                    "t10k-labels-idx1-ubyte.gz) "
                    "into %s, or use 'fashion-mnist' (`apt-get install dataset-fashion-mnist`)",
                    alias, dir, what, dir);
}

/* Gives *train and *test the larger class count of the two; both freed and NULL when one holds
 * class labels and the other regression targets. */
static dt_status share_classes(dt_dataset **trainp, dt_dataset **testp) {
    dt_dataset *train = *trainp, *test = *testp;
    if (!test) return DT_OK;
    if (train->targets != test->targets) {
        dt_status s = dt_error(DT_EFORMAT, "%s holds %s but %s holds %s: give both sets the same kind", test->source,
                               test->targets ? "regression targets (floats)" : "class labels", train->source,
                               train->targets ? "regression targets" : "class labels");
        dt_dataset_destroy(train), dt_dataset_destroy(test);
        *trainp = *testp = NULL;
        return s;
    }
    int k = train->classes > test->classes ? train->classes : test->classes;
    train->classes = test->classes = k;
    return DT_OK;
}

static dt_status open_dir(dt_dataset **train, dt_dataset **test, const char *dir, const char *alias) {
    static const char *names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                   "t10k-labels-idx1-ubyte"};
    char p[4][PATH_MAX];
    int need = test ? 4 : 2;
    if (test && !alias && find_idx(p[2], sizeof p[2], dir, names[2]) < 0 &&
        find_idx(p[3], sizeof p[3], dir, names[3]) < 0)
        need = 2, test = NULL; /* a directory of a training set alone (as a .csv without its test sibling) */
    for (int i = 0; i < need; i++) {
        int f = find_idx(p[i], sizeof p[i], dir, names[i]);
        if (f == 2)
            return dt_error(DT_EFORMAT, "%s: more than one IDX file for %.*s: %s; keep one", dir,
                            (int)(strstr(names[i], "-idx") - names[i]), names[i], p[i]);
        if (f != 0) {
            char what[300];
            snprintf(what, sizeof what, "/%s[.gz]", names[i]);
            if (alias) return missing_alias(alias, dir, what);
            return dt_error(
                DT_ENOENT,
                "%s/%s: not found (nor with .gz, nor another train-images-idxD-*): an IDX data "
                "directory needs train-images-idxD-*, train-labels-idx1-*, t10k-images-idxD-* and "
                "t10k-labels-idx1-* (D the dims the header declares: idx2 rows, idx3 images, idx4 C x H x W), "
                "raw or .gz",
                dir, names[i]);
        }
    }
    DT_TRY(dt_dataset_open_idx(train, p[0], p[1]));
    if (!test) return DT_OK;
    dt_status st = dt_dataset_open_idx(test, p[2], p[3]);
    if (st != DT_OK) {
        dt_dataset_destroy(*train);
        *train = NULL;
        return st;
    }
    dt_dataset *a = *train, *b = *test;
    if (a->C != b->C || a->H != b->H || a->W != b->W) {
        st = dt_error(DT_EFORMAT, "%s: sample shape (%d,%d,%d) differs from the train set's (%d,%d,%d) in %s", p[2],
                      b->C, b->H, b->W, a->C, a->H, a->W, p[0]);
        dt_dataset_destroy(a);
        dt_dataset_destroy(b);
        *train = *test = NULL;
        return st;
    }
    return share_classes(train, test);
}

/* The test CSV that goes with a train CSV: "train" -> "test" in the file name, if it exists. */
static bool csv_sibling(char *out, size_t cap, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *hit = NULL;
    for (const char *q = base; (q = strstr(q, "train")); q++) hit = q;
    if (!hit) return false;
    int n = snprintf(out, cap, "%.*stest%s", (int)(hit - path), path, hit + 5);
    return n > 0 && (size_t)n < cap && path_exists(out);
}

/* Every kind of --data, for the messages about one that is missing or not a data set. */
#define DATA_SOURCES "fashion-mnist, mnist, an IDX directory, a .csv file, or text:FILE or kjv (bytes, for a GPT)"

dt_status dt_dataset_open(dt_dataset **train, dt_dataset **test, const char *path) {
    *train = NULL;
    if (test) *test = NULL;
    if (!path || !*path) return dt_error(DT_EINVAL, "no data set given: pass " DATA_SOURCES);
    if (dt_data_is_text(path))
        return dt_error(
            DT_EINVAL,
            "`data` %s is a text data set: open it with dt_dataset_open_text and the model's context length T", path);
    if (dt_data_is_npy(path) || dt_data_is_npy_dir(path)) return dt_dataset_open_npy_spec(train, test, path);
    if (!strcmp(path, "fashion-mnist") || !strcmp(path, "mnist")) {
        const char *root = getenv("DTRAIN_DATASETS");
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", root && *root ? root : "/usr/share/datasets", path);
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return missing_alias(path, dir, "");
        return open_dir(train, test, dir, path);
    }
    if (ends_with(path, ".csv") || ends_with(path, ".csv.gz")) {
        DT_TRY(dt_dataset_open_csv(train, path, NULL));
        char sib[PATH_MAX];
        if (!test || !csv_sibling(sib, sizeof sib, path)) return DT_OK;
        dt_status st = dt_dataset_open_csv(test, sib, NULL);
        if (st == DT_OK && ((*test)->D != (*train)->D)) {
            st = dt_error(DT_EFORMAT, "%s: %zu features per row, but the train set %s has %zu", sib, (*test)->D, path,
                          (*train)->D);
            dt_dataset_destroy(*test);
            *test = NULL;
        }
        if (st != DT_OK) {
            dt_dataset_destroy(*train);
            *train = NULL;
            return st;
        }
        return share_classes(train, test);
    }
    struct stat st;
    if (stat(path, &st) != 0) return dt_error(DT_ENOENT, "%s: no such data set: pass " DATA_SOURCES, path);
    if (!S_ISDIR(st.st_mode)) return dt_error(DT_EFORMAT, "%s: not a directory or .csv file: pass " DATA_SOURCES, path);
    return open_dir(train, test, path, NULL);
}
