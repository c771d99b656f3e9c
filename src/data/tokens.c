/* Pre-tokenized token files as GPT data sets (--data tokens:DIR): nanoGPT's prepare.py output
 * (train.bin and val.bin: raw little-endian uint16 tokens) and llm.c's shards (a header of 256
 * little-endian int32: magic 20240520, version 1, token count; then that many uint16 tokens; the
 * files *_train_*.bin and *_val_*.bin of a directory, in name order). Each set is cut into windows
 * of T+1 tokens exactly as a text set is (data.h). A set that lies in one file is mapped read-only
 * (no copy); a set of several shards is read into one buffer. The vocabulary is the set's largest
 * token + 1 unless the caller sets more. Semantics and errors are documented in data.h. */
#include "data/data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240520
#define LLMC_HEADER 1024 /* bytes: 256 int32 */

typedef struct {
    char path[PATH_MAX];
    uint64_t off;  /* byte offset of the first token (0, or the llm.c header) */
    uint64_t ntok; /* tokens in the file */
} tok_file;

typedef struct {
    tok_file *f;
    int n;
    uint64_t ntok; /* all files together */
} tok_list;

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads path's layout into f: an llm.c shard (its header checked against the size) or raw uint16
 * tokens. shard: the name says llm.c shard, so a header is required. DT_ENOENT / DT_EIO / DT_EFORMAT
 * naming the file. */
static dt_status probe(const char *spec, const char *path, bool shard, tok_file *f) {
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt_error(errno == ENOENT ? DT_ENOENT : DT_EIO, "`data` %s: cannot open %s (%s)", spec, path,
                        strerror(errno));
    struct stat st;
    uint8_t h[LLMC_HEADER];
    ssize_t got = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, h, sizeof h, 0) : -2;
    close(fd);
    if (got == -2) return dt_error(DT_EFORMAT, "`data` %s: %s is not a regular file", spec, path);
    if (got < 0) return dt_error(DT_EIO, "`data` %s: cannot read %s (%s)", spec, path, strerror(errno));
    const uint64_t size = (uint64_t)st.st_size;
    if (got == (ssize_t)sizeof h && le32(h) == LLMC_MAGIC) {
        const uint32_t version = le32(h + 4), count = le32(h + 8);
        if (version != 1)
            return dt_error(DT_EFORMAT,
                            "`data` %s: %s is an llm.c token shard of version %u; only version 1 (uint16 "
                            "tokens) is supported: write it with llm.c's dev/data/data_common.py (GPT-2 tokens)",
                            spec, path, version);
        if (size != LLMC_HEADER + 2 * (uint64_t)count)
            return dt_error(DT_EFORMAT,
                            "`data` %s: %s: its llm.c header says %u tokens (%llu bytes with the header) but the file "
                            "has %llu bytes: it is cut short or damaged; write it again",
                            spec, path, count, (unsigned long long)(LLMC_HEADER + 2 * (uint64_t)count),
                            (unsigned long long)size);
        f->off = LLMC_HEADER, f->ntok = count;
        return DT_OK;
    }
    if (shard)
        return dt_error(DT_EFORMAT,
                        "`data` %s: %s is named like an llm.c shard but does not start with its header (int32 "
                        "magic 20240520, version 1, token count): rename it, or write it with llm.c's data_common.py",
                        spec, path);
    if (size == 0 || size % 2)
        return dt_error(DT_EFORMAT,
                        "`data` %s: %s has %llu bytes, %s: nanoGPT's prepare.py writes uint16 tokens "
                        "(np.uint16 .tofile), 2 bytes each",
                        spec, path, (unsigned long long)size, size ? "an odd count" : "none");
    f->off = 0, f->ntok = size / 2;
    return DT_OK;
}

/* Appends path (probed) to l. */
static dt_status list_add(tok_list *l, const char *spec, const char *path, bool shard) {
    tok_file *f = realloc(l->f, (size_t)(l->n + 1) * sizeof *f);
    if (!f) return dt_error(DT_ENOMEM, "`data` %s: out of memory", spec);
    l->f = f;
    DT_TRY(probe(spec, path, shard, &l->f[l->n]));
    l->ntok += l->f[l->n++].ntok;
    return DT_OK;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* llm.c's shards of dir whose names hold `part` ("_train_" or "_val_") and end in .bin, in name
 * order, into l. */
static dt_status list_shards(tok_list *l, const char *spec, const char *dir, const char *part) {
    DIR *d = opendir(dir);
    if (!d) return dt_error(DT_EIO, "`data` %s: cannot read the directory %s (%s)", spec, dir, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    dt_status s = DT_OK;
    for (struct dirent *e; s == DT_OK && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (!strstr(e->d_name, part) || len < 4 || strcmp(e->d_name + len - 4, ".bin")) continue;
        char **nn = realloc(names, (n + 1) * sizeof *names);
        if (!nn || !(nn[n] = strdup(e->d_name))) s = dt_error(DT_ENOMEM, "`data` %s: out of memory", spec);
        if (nn) names = nn, n += s == DT_OK;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_name);
    char path[PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (s == DT_OK) s = list_add(l, spec, path, true);
        free(names[i]);
    }
    free(names);
    return s;
}

/* The files of spec's directory (or the one file it names): train and val (val may stay empty). */
static dt_status list_files(const char *spec, tok_list *train, tok_list *val) {
    const char *dir = spec + 7;
    struct stat st;
    if (!*dir)
        return dt_error(
            DT_EINVAL,
            "`data` tokens: needs a directory: pass `data` tokens:DIR (nanoGPT's train.bin/val.bin or llm.c's shards)");
    if (stat(dir, &st) != 0)
        return dt_error(DT_ENOENT,
                        "`data` %s: %s: no such directory: pass the directory nanoGPT's prepare.py (train.bin, "
                        "val.bin) or llm.c (*_train_*.bin, *_val_*.bin) wrote",
                        spec, dir);
    if (S_ISREG(st.st_mode)) return list_add(train, spec, dir, false); /* one file: its end validates */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/train.bin", dir);
    if (access(path, F_OK) == 0) { /* nanoGPT */
        DT_TRY(list_add(train, spec, path, false));
        snprintf(path, sizeof path, "%s/val.bin", dir);
        return access(path, F_OK) == 0 ? list_add(val, spec, path, false) : DT_OK;
    }
    DT_TRY(list_shards(train, spec, dir, "_train_"));
    DT_TRY(list_shards(val, spec, dir, "_val_"));
    if (!train->n)
        return dt_error(DT_ENOENT,
                        "`data` %s: %s holds neither train.bin (nanoGPT's prepare.py) nor *_train_*.bin shards "
                        "(llm.c)%s: pass the directory they are in",
                        spec, dir, val->n ? " (only validation shards)" : "");
    return DT_OK;
}

/* Copies tokens [first, first+n) of the files' concatenation into dst (2n bytes). */
static dt_status read_range(const tok_list *l, uint64_t first, uint64_t n, uint8_t *dst) {
    for (int i = 0; i < l->n && n; i++) {
        const tok_file *f = &l->f[i];
        if (first >= f->ntok) {
            first -= f->ntok;
            continue;
        }
        uint64_t take = f->ntok - first < n ? f->ntok - first : n;
        int fd = open(f->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return dt_error(DT_EIO, "%s: cannot open (%s)", f->path, strerror(errno));
        for (uint64_t done = 0; done < 2 * take;) {
            ssize_t r = pread(fd, dst + done, 2 * take - done, (off_t)(f->off + 2 * first + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                close(fd);
                return dt_error(DT_EIO, "%s: cannot read (%s)", f->path,
                                r < 0 ? strerror(errno) : "it shrank while read");
            }
            done += (uint64_t)r;
        }
        close(fd);
        dst += 2 * take, n -= take, first = 0;
    }
    return DT_OK;
}

/* Points ds->x at tokens [first, first+n): a read-only mapping when they lie in one file, else a
 * buffer read from the shards. */
static dt_status load_range(dt_dataset *ds, const tok_list *l, uint64_t first, uint64_t n) {
    uint64_t at = first;
    for (int i = 0; i < l->n; i++) {
        const tok_file *f = &l->f[i];
        if (at >= f->ntok) {
            at -= f->ntok;
            continue;
        }
        if (at + n > f->ntok) break; /* spans files: read below */
        int fd = open(f->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return dt_error(DT_EIO, "%s: cannot open (%s)", f->path, strerror(errno));
        const uint64_t off = f->off + 2 * at, pg = (uint64_t)sysconf(_SC_PAGESIZE), aoff = off / pg * pg;
        void *m = mmap(NULL, off + 2 * n - aoff, PROT_READ, MAP_SHARED, fd, (off_t)aoff);
        close(fd);
        if (m == MAP_FAILED)
            return dt_error(DT_EIO, "%s: cannot map %llu tokens (%s)", f->path, (unsigned long long)n, strerror(errno));
        ds->map = m, ds->map_len = off + 2 * n - aoff;
        ds->x = (uint8_t *)m + (off - aoff);
        return DT_OK;
    }
    if (n > SIZE_MAX / 2 || !(ds->x = malloc(2 * n)))
        return dt_error(DT_ENOMEM, "%s: out of memory for %llu tokens", ds->source, (unsigned long long)n);
    return read_range(l, first, n, ds->x);
}

/* Checks that n tokens give at least 2 windows of T+1 and at most 2^32-1. */
static dt_status check_part(const char *spec, const char *part, const char *what, uint64_t n, int T) {
    const uint64_t w = n ? (n - 1) / (uint64_t)T : 0;
    if (w > UINT32_MAX)
        return dt_error(DT_EINVAL,
                        "`data` %s: the %s set (%s) gives %llu windows of T+1 = %d tokens, more than the 2^32-1 a "
                        "data set can index: use a larger T (the model's context length)",
                        spec, part, what, (unsigned long long)w, T + 1);
    if (w >= 2) return DT_OK;
    return dt_error(DT_EINVAL,
                    "`data` %s: the %s set (%s) has %llu tokens, %llu window(s) of T+1 = %d, but at least 2 are "
                    "needed: use more data or a smaller T (the model's context length)%s",
                    spec, part, what, (unsigned long long)n, (unsigned long long)w, T + 1,
                    strcmp(part, "train") ? ", or `val_fraction` 0 for no validation set" : "");
}

/* The data set of tokens [first, first+n) of l, windows of T, vocabulary its largest token + 1. */
static dt_status make_set(dt_dataset **out, const tok_list *l, uint64_t first, uint64_t n, int T, const char *source) {
    dt_dataset *ds = dt_dataset_alloc();
    if (!ds) return DT_ENOMEM;
    snprintf(ds->source, sizeof ds->source, "%.*s", (int)sizeof ds->source - 1, source);
    dt_status s = load_range(ds, l, first, n);
    if (s != DT_OK) {
        dt_dataset_destroy(ds);
        return s;
    }
    ds->dtype = DT_I16, ds->tok16 = true;
    ds->T = T, ds->text_len = (size_t)n, ds->n = (size_t)((n - 1) / (uint64_t)T);
    ds->C = 1, ds->H = 1, ds->W = T, ds->D = (size_t)T;
    uint32_t mx = 0;
    const uint8_t *p = ds->x;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
        if (v > mx) mx = v;
    }
    ds->classes = (int)mx + 1;
    *out = ds;
    return DT_OK;
}

/* Names a list for messages: the file, or "N shards DIR/..._train_*.bin". */
static void describe(char *buf, size_t cap, const tok_list *l, const char *spec, const char *part) {
    if (l->n == 1) snprintf(buf, cap, "%s", l->f[0].path);
    else snprintf(buf, cap, "%d llm.c shards %s/*%s*.bin", l->n, spec + 7, part);
}

dt_status dt_tokens_open(dt_dataset **train, dt_dataset **val, const char *spec, int T, double val_fraction) {
    tok_list tl = {0}, vl = {0};
    dt_dataset *tr = NULL, *va = NULL;
    char what[PATH_MAX + 64], vwhat[2 * PATH_MAX];
    dt_status s;
    DT_TRY_GOTO(s = list_files(spec, &tl, &vl), done);
    describe(what, sizeof what, &tl, spec, "_train_");
    uint64_t tlen = tl.ntok;
    const bool hold_out = val_fraction > 0 && vl.n == 0; /* no validation file: the end of the train tokens */
    if (hold_out) {
        uint64_t vlen = (uint64_t)floor((double)tl.ntok * val_fraction);
        tlen -= vlen;
        snprintf(vwhat, sizeof vwhat, "the last %llu tokens of %s, `val_fraction` %g", (unsigned long long)vlen, what,
                 val_fraction);
        DT_TRY_GOTO(s = check_part(spec, "validation", vwhat, vlen, T), done);
        if (val) DT_TRY_GOTO(s = make_set(&va, &tl, tlen, vlen, T, what), done);
    } else if (val_fraction > 0) {
        describe(vwhat, sizeof vwhat, &vl, spec, "_val_");
        DT_TRY_GOTO(s = check_part(spec, "validation", vwhat, vl.ntok, T), done);
        if (val) DT_TRY_GOTO(s = make_set(&va, &vl, 0, vl.ntok, T, vwhat), done);
    }
    DT_TRY_GOTO(s = check_part(spec, "train", what, tlen, T), done);
    DT_TRY_GOTO(s = make_set(&tr, &tl, 0, tlen, T, what), done);
    *train = tr, tr = NULL;
    if (val) *val = va, va = NULL;
done:
    dt_dataset_destroy(tr);
    dt_dataset_destroy(va);
    free(tl.f);
    free(vl.f);
    return s;
}
