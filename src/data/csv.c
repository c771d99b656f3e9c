/* CSV data sets: numeric rows of one label column plus features, raw or gzip'd, streamed line by
 * line. Features stay u8 while every value is an integer in [0,255] (pixel CSVs such as the
 * popular mnist_train.csv), and switch to f32 at the first value that is not. */
#include "data/data_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Buffered line reader over a dt_stream. */
typedef struct {
    dt_stream s;
    char *buf;
    size_t cap, beg, end;
    bool eof;
    size_t lineno;
} line_reader;

/* The longest line a CSV row may be (1M features of 60 characters), in bytes. */
#define CSV_MAX_LINE (64 << 20)

/* Returns the next line (NUL-terminated, without \n or \r) in *line, 0 at end, -1 on error. */
static int next_line(line_reader *r, char **line) {
    for (;;) {
        char *nl = r->beg < r->end ? memchr(r->buf + r->beg, '\n', r->end - r->beg) : NULL;
        if (nl || (r->eof && r->beg < r->end)) {
            char *start = r->buf + r->beg;
            char *stop = nl ? nl : r->buf + r->end; /* at eof the buffer has room for the NUL */
            *stop = '\0';
            if (stop > start && stop[-1] == '\r') stop[-1] = '\0';
            r->beg = (size_t)(stop - r->buf) + 1;
            if (r->beg > r->end) r->beg = r->end;
            r->lineno++;
            *line = start;
            return 1;
        }
        if (r->eof) return 0;
        /* compact, grow if the partial line fills the buffer, then read more */
        memmove(r->buf, r->buf + r->beg, r->end - r->beg);
        r->end -= r->beg;
        r->beg = 0;
        if (r->cap - r->end < 4096) {
            if (r->cap >= CSV_MAX_LINE) { /* no newline in 64 MiB: a binary file, or a stream without end */
                dt_error(DT_EFORMAT,
                         "%s:%zu: a line longer than %d MiB: not a CSV file (rows of comma-separated "
                         "numbers, one a line)",
                         r->s.path, r->lineno + 1, CSV_MAX_LINE >> 20);
                return -1;
            }
            size_t ncap = r->cap * 2;
            char *nb = realloc(r->buf, ncap);
            if (!nb) {
                dt_error(DT_ENOMEM, "%s:%zu: out of memory for a long line", r->s.path, r->lineno + 1);
                return -1;
            }
            r->buf = nb;
            r->cap = ncap;
        }
        int64_t got = dt_stream_read(&r->s, r->buf + r->end, r->cap - r->end - 1);
        if (got < 0) return -1;
        if (got == 0) r->eof = true;
        r->end += (size_t)got;
    }
}

static bool is_blank(const char *p) {
    while (*p == ' ' || *p == '\t') p++;
    return *p == '\0';
}

/* Parses the field at *pp (up to ',' or end); advances *pp past the comma. Returns 1 and *v on a
 * finite number, 0 when the field is not one (*fs,*fl give the trimmed field for messages). */
static int parse_field(char **pp, double *v, const char **fs, int *fl) {
    char *p = *pp;
    while (*p == ' ' || *p == '\t') p++;
    char *start = p, *q = p;
    bool neg = *q == '-';
    if (*q == '-' || *q == '+') q++;
    uint64_t acc = 0;
    int digits = 0;
    while (*q >= '0' && *q <= '9' && digits < 18) acc = acc * 10 + (uint64_t)(*q++ - '0'), digits++;
    char *e = q;
    int ok = 0;
    if (digits && (*e == ',' || *e == '\0' || *e == ' ' || *e == '\t')) {
        *v = neg ? -(double)acc : (double)acc; /* fast path: a plain integer */
        ok = 1;
    } else if (*start && *start != ',') {
        *v = strtod(start, &e);
        ok = e != start && isfinite(*v);
    }
    while (*e == ' ' || *e == '\t') e++;
    if (*e != ',' && *e != '\0') ok = 0;
    char *end = strchr(start, ',');
    if (!end) end = start + strlen(start);
    *fs = start;
    *fl = (int)(end - start);
    while (*fl > 0 && (start[*fl - 1] == ' ' || start[*fl - 1] == '\t')) (*fl)--;
    *pp = *end ? end + 1 : end;
    return ok;
}

static int count_fields(const char *p) {
    int n = 1;
    for (; *p; p++) n += *p == ',';
    return n;
}

typedef struct {
    uint8_t *u8; /* while every feature fits */
    float *f32;  /* after the first that does not */
    int32_t *y;
    size_t n, cap, F;
} csv_rows;

static dt_status rows_grow(csv_rows *r, const char *path) {
    size_t ncap = r->cap ? r->cap * 2 : 1024;
    size_t esz = r->f32 ? sizeof(float) : 1;
    if (ncap > SIZE_MAX / 8 / r->F) return dt_error(DT_ENOMEM, "%s: too many rows (%zu)", path, r->n);
    void *nx = realloc(r->f32 ? (void *)r->f32 : (void *)r->u8, ncap * r->F * esz);
    int32_t *ny = nx ? realloc(r->y, ncap * sizeof(int32_t)) : NULL;
    if (!nx || !ny) {
        if (nx) {
            if (r->f32) r->f32 = nx;
            else r->u8 = nx;
        }
        return dt_error(DT_ENOMEM, "%s: out of memory after %zu rows", path, r->n);
    }
    if (r->f32) r->f32 = nx;
    else r->u8 = nx;
    r->y = ny;
    r->cap = ncap;
    return DT_OK;
}

/* Switches storage from u8 to f32, converting the rows read so far. */
/* `filled` counts the elements written so far, including those of the row in progress. */
static dt_status rows_to_f32(csv_rows *r, const char *path, size_t filled) {
    float *f = malloc((r->cap ? r->cap : 1) * r->F * sizeof(float));
    if (!f) return dt_error(DT_ENOMEM, "%s: out of memory converting %zu rows to f32", path, r->n);
    for (size_t i = 0; i < filled; i++) f[i] = r->u8[i];
    free(r->u8);
    r->u8 = NULL;
    r->f32 = f;
    return DT_OK;
}

/* The CSV's layout, fixed by its first non-blank line. */
typedef struct {
    int ncols, lc;     /* columns; the label's (0-based) */
    size_t first_line; /* the line that fixed them, for messages */
} csv_layout;

/* The first non-blank line (`nf` fields): the layout, the sample shape against the features, and
 * whether the line is a header (*header). */
static dt_status csv_first_line(csv_layout *L, csv_rows *rows, const dt_csv_options *o, const char *path, size_t lineno,
                                char *line, int nf, bool *header) {
    L->ncols = nf;
    L->first_line = lineno;
    L->lc = o->label_col < 0 ? nf + o->label_col : o->label_col;
    if (nf < 2 || L->lc < 0 || L->lc >= nf)
        return dt_error(DT_EFORMAT, "%s:%zu: %d columns: need a label column (index %d) and at least one feature", path,
                        lineno, nf, o->label_col);
    rows->F = (size_t)nf - 1;
    if (o->shape[0] || o->shape[1] || o->shape[2]) {
        long long prod = (long long)o->shape[0] * o->shape[1] * o->shape[2];
        if (o->shape[0] <= 0 || o->shape[1] <= 0 || o->shape[2] <= 0 || prod != (long long)rows->F)
            return dt_error(DT_EINVAL, "%s: sample shape (%d,%d,%d) does not match the %zu features per row", path,
                            o->shape[0], o->shape[1], o->shape[2], rows->F);
    }
    *header = o->header == DT_CSV_YES;
    if (o->header == DT_CSV_AUTO) { /* a header: some field of the first line is not a number */
        char *p = line;
        double v;
        const char *fs;
        int fl;
        for (int c = 0; c < nf && !*header; c++) *header = !parse_field(&p, &v, &fs, &fl);
    }
    return DT_OK;
}

/* The label column's value v (field fs of length fl, column c): a class index. */
static dt_status csv_label(int32_t *y, double v, const char *fs, int fl, int c, int classes, const char *path,
                           size_t lineno) {
    if (v != floor(v) || v < 0 || v > INT32_MAX || (classes > 0 && v >= classes)) {
        if (classes > 0)
            return dt_error(DT_EFORMAT, "%s:%zu: label '%.*s' (column %d) is not a class index in [0, %d)", path,
                            lineno, fl, fs, c + 1, classes);
        return dt_error(DT_EFORMAT, "%s:%zu: label '%.*s' (column %d) is not a class index (0, 1, ...)", path, lineno,
                        fl, fs, c + 1);
    }
    *y = (int32_t)v;
    return DT_OK;
}

/* One data row (`nf` fields) appended to rows: its label and features (u8 until a value needs f32). */
static dt_status csv_row(csv_rows *rows, const csv_layout *L, int classes, const char *path, size_t lineno, char *line,
                         int nf) {
    if (nf != L->ncols)
        return dt_error(DT_EFORMAT, "%s:%zu: %d fields, expected %d (as on line %zu)", path, lineno, nf, L->ncols,
                        L->first_line);
    if (rows->n == rows->cap) DT_TRY(rows_grow(rows, path));
    if (rows->n >= UINT32_MAX) return dt_error(DT_EFORMAT, "%s:%zu: more than 2^32-1 rows", path, lineno);
    char *p = line;
    size_t base = rows->n * rows->F, k = 0;
    for (int c = 0; c < L->ncols; c++) {
        double v;
        const char *fs;
        int fl;
        if (!parse_field(&p, &v, &fs, &fl))
            return dt_error(DT_EFORMAT, "%s:%zu: column %d: '%.*s' is not a number", path, lineno, c + 1,
                            fl > 40 ? 40 : fl, fs);
        if (c == L->lc) {
            DT_TRY(csv_label(&rows->y[rows->n], v, fs, fl, c, classes, path, lineno));
            continue;
        }
        if (rows->u8 && !(v >= 0 && v <= 255 && v == floor(v))) DT_TRY(rows_to_f32(rows, path, base + k));
        if (rows->u8) rows->u8[base + k++] = (uint8_t)v;
        else rows->f32[base + k++] = (float)v;
    }
    rows->n++;
    return DT_OK;
}

/* The data set made of the rows read (which it takes over: rows' arrays are NULL after). */
static dt_status csv_dataset(dt_dataset **out, csv_rows *rows, const dt_csv_options *o, const char *path) {
    if (rows->n == 0) return dt_error(DT_EFORMAT, "%s: no data rows", path);
    dt_dataset *ds = dt_dataset_alloc();
    if (!ds) return DT_ENOMEM;
    ds->n = rows->n;
    ds->D = rows->F;
    ds->C = o->shape[0] ? o->shape[0] : 1;
    ds->H = o->shape[0] ? o->shape[1] : 1;
    ds->W = o->shape[0] ? o->shape[2] : (int)rows->F;
    ds->dtype = rows->u8 ? DT_U8 : DT_F32;
    ds->x = rows->u8 ? (void *)rows->u8 : (void *)rows->f32;
    ds->y = rows->y;
    rows->u8 = NULL, rows->f32 = NULL, rows->y = NULL;
    bool scale = o->scale == DT_CSV_YES || (o->scale == DT_CSV_AUTO && ds->dtype == DT_U8);
    ds->scale = scale ? 1.0 / 255 : 1.0;
    snprintf(ds->source, sizeof ds->source, "%s", path);
    dt_status st = dt_dataset_check_labels(ds, o->classes, path);
    if (st != DT_OK) {
        dt_dataset_destroy(ds);
        return st;
    }
    dt_dataset_update_lut(ds);
    *out = ds;
    return DT_OK;
}

dt_status dt_dataset_open_csv(dt_dataset **out, const char *path, const dt_csv_options *opt) {
    *out = NULL;
    dt_csv_options o = opt ? *opt : (dt_csv_options){0};
    line_reader r = {.cap = 1 << 20};
    csv_rows rows = {0};
    csv_layout L = {0};
    DT_TRY(dt_stream_open(&r.s, path));
    dt_status st = DT_OK;
    if (!(r.buf = malloc(r.cap))) {
        st = dt_error(DT_ENOMEM, "%s: out of memory for the line buffer", path);
        goto done;
    }
    char *line;
    int rc;
    while ((rc = next_line(&r, &line)) > 0) {
        if (is_blank(line)) continue;
        int nf = count_fields(line);
        if (!L.ncols) {
            bool header = false;
            DT_TRY_GOTO(st = csv_first_line(&L, &rows, &o, path, r.lineno, line, nf, &header), done);
            if (header) continue;
        }
        DT_TRY_GOTO(st = csv_row(&rows, &L, o.classes, path, r.lineno, line, nf), done);
    }
    st = rc < 0 ? DT_EFORMAT : csv_dataset(out, &rows, &o, path);
done:
    free(rows.u8);
    free(rows.f32);
    free(rows.y);
    free(r.buf);
    dt_stream_close(&r.s);
    return st;
}
