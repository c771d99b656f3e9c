/* Loader for the PyTorch reference fixtures written by tests/ref/gen_ref.py (test-only, header
 * only). Format, little-endian: magic "DTRNNREF", u32 version (1), u32 count, then count entries
 * { u32 name_len, name, u32 dtype (0 f32, 1 i32), u32 ndim, ndim x u32 dims, values }. */
#ifndef DT_NN_FIXTURE_H
#define DT_NN_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT_FX_MAGIC "DTRNNREF"
#define DT_FX_VERSION 1u

typedef struct {
    char name[96];
    uint32_t dtype; /* 0 f32, 1 i32 */
    uint32_t ndim, dims[6];
    size_t n;   /* number of values */
    void *data; /* malloc'd, n values (4 bytes each) */
} dt_fx_entry;

typedef struct {
    char path[512];
    int count;
    dt_fx_entry *e;
} dt_fx;

/* Frees the fixture's entries; safe on a zeroed struct. */
static inline void dt_fx_free(dt_fx *f) {
    for (int i = 0; f->e && i < f->count; i++) free(f->e[i].data);
    free(f->e);
    f->e = NULL;
    f->count = 0;
}

/* Loads the fixture file at path. Returns 0, or -1 with a message saying what is wrong and how
 * to regenerate in err. */
static inline int dt_fx_load_path(dt_fx *f, const char *path, char *err, size_t errcap) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    FILE *fp = fopen(f->path, "rb");
    if (!fp) {
        snprintf(err, errcap, "%s: cannot open (run from the repository root or set DTRAIN_ROOT)", f->path);
        return -1;
    }
    char magic[8];
    uint32_t hdr[2];
    const char *why = NULL;
    if (fread(magic, 1, 8, fp) != 8 || memcmp(magic, DT_FX_MAGIC, 8) || fread(hdr, 4, 2, fp) != 2)
        why = "not a dtrain reference fixture (bad magic)";
    else if (hdr[0] != DT_FX_VERSION) why = "unsupported fixture version";
    else if (hdr[1] > 100000) why = "absurd tensor count";
    if (!why) {
        f->e = calloc(hdr[1] ? hdr[1] : 1, sizeof *f->e);
        if (!f->e) why = "out of memory";
    }
    for (uint32_t i = 0; !why && i < hdr[1]; i++) {
        dt_fx_entry *e = &f->e[i];
        uint32_t len, meta[2];
        if (fread(&len, 4, 1, fp) != 1 || len == 0 || len >= sizeof e->name || fread(e->name, 1, len, fp) != len ||
            fread(meta, 4, 2, fp) != 2 || meta[0] > 1 || meta[1] > 6 || fread(e->dims, 4, meta[1], fp) != meta[1]) {
            why = "truncated or corrupt entry header";
            break;
        }
        f->count = (int)i + 1;
        e->name[len] = 0;
        e->dtype = meta[0];
        e->ndim = meta[1];
        e->n = 1;
        for (uint32_t d = 0; d < e->ndim; d++) e->n *= e->dims[d];
        if (e->n > (1u << 26) || !(e->data = malloc(e->n ? e->n * 4 : 4)) || fread(e->data, 4, e->n, fp) != e->n) {
            why = "truncated or corrupt tensor data";
            break;
        }
    }
    if (!why && fgetc(fp) != EOF) why = "trailing bytes after the last tensor";
    fclose(fp);
    if (why) {
        snprintf(err, errcap, "%s: %s; regenerate with `make fixtures` (needs python3-torch)", f->path, why);
        dt_fx_free(f);
        return -1;
    }
    return 0;
}

/* Loads $DTRAIN_ROOT/tests/ref/<file> (or ./tests/ref/<file>), as dt_fx_load_path. */
static inline int dt_fx_load(dt_fx *f, const char *file, char *err, size_t errcap) {
    char path[512];
    const char *root = getenv("DTRAIN_ROOT");
    snprintf(path, sizeof path, "%s/tests/ref/%s", root && *root ? root : ".", file);
    return dt_fx_load_path(f, path, err, errcap);
}

/* Frees f and loads tests/ref/<file> into it (dt_fx_load); a file that does not load is a failed
 * check with the loader's message (needs core/test.h). Returns 0, or -1 after that failure. */
static inline int dt_fx_reload(dt_fx *f, const char *file) {
    char err[768];
    dt_fx_free(f);
    if (dt_fx_load(f, file, err, sizeof err) != 0) {
        CHECK_MSG(0, "%s", err);
        return -1;
    }
    return 0;
}

/* The entry called name, or NULL. */
static inline const dt_fx_entry *dt_fx_find(const dt_fx *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (!strcmp(f->e[i].name, name)) return &f->e[i];
    return NULL;
}

/* Defines entry(fmt, ...) for a test over fixture `fx`: the entry by printf-style name; a missing
 * one means the fixture and the test disagree: a failed check, and test `test` ends (needs
 * core/test.h and <stdarg.h>). FX/FXI/FXN give its f32 data, i32 data and value count. */
#define DT_FX_DEFINE_ENTRY(fx, test)                                                                    \
    static const dt_fx_entry *entry(const char *fmt, ...) __attribute__((format(printf, 1, 2)));        \
    static const dt_fx_entry *entry(const char *fmt, ...) {                                             \
        char name_[128];                                                                                \
        va_list ap_;                                                                                    \
        va_start(ap_, fmt);                                                                             \
        vsnprintf(name_, sizeof name_, fmt, ap_);                                                       \
        va_end(ap_);                                                                                    \
        const dt_fx_entry *e_ = dt_fx_find(&(fx), name_);                                               \
        CHECK_MSG(e_ != NULL, "%s: no entry '%s' (regenerate with `make fixtures`)", (fx).path, name_); \
        if (!e_) exit(dt_test_summary(test));                                                           \
        return e_;                                                                                      \
    }
#define FX(...) ((const float *)entry(__VA_ARGS__)->data)
#define FXI(...) ((const int32_t *)entry(__VA_ARGS__)->data)
#define FXN(...) (entry(__VA_ARGS__)->n)

#endif
