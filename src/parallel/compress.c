/* The compressor registry (grad_sync.h): every compressor is one entry {name, help, options,
 * parse, format, stage functions} defined in its own file; DT_COMPRESSORS below lists them (the
 * order of the help), dt_compress_register adds one from outside the library (tests/toy/). This
 * file parses "--compress NAME[:ARGS]" by finding NAME and handing ARGS to the entry's parser,
 * writes the canonical text back, and makes the list of accepted forms the messages show. No code
 * here knows a compressor's options. */
#include "parallel/grad_sync.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The registry: a compressor is its file plus its name here. */
#define DT_COMPRESSORS(X) X(none) X(fp16) X(bf16) X(topk) X(powersgd)

#define DT_COMPRESS_DECL(n) extern const dt_compressor dt_compress_##n;
#define DT_COMPRESS_REF(n) &dt_compress_##n,
#define DT_COMPRESS_ONE(n) +1
DT_COMPRESSORS(DT_COMPRESS_DECL)
enum { N_BUILTIN = 0 DT_COMPRESSORS(DT_COMPRESS_ONE), MAX_ENTRIES = N_BUILTIN + 8 };
static const dt_compressor *g_entries[MAX_ENTRIES] = {DT_COMPRESSORS(DT_COMPRESS_REF)};
static int g_n = N_BUILTIN;

const dt_compressor *const *dt_compressors(int *n) {
    *n = g_n;
    return g_entries;
}

/* The entry whose name is the len bytes at name, or NULL. */
static const dt_compressor *find_len(const char *name, size_t len) {
    for (int i = 0; i < g_n; i++)
        if (strlen(g_entries[i]->name) == len && !strncmp(g_entries[i]->name, name, len)) return g_entries[i];
    return NULL;
}

const dt_compressor *dt_compress_find(const char *name) { return name ? find_len(name, strlen(name)) : NULL; }

dt_status dt_compress_register(const dt_compressor *c) {
    if (!c || !c->name || !c->name[0] || strchr(c->name, ':') || !c->help || !c->help[0] || !c->options || !c->start ||
        !c->advance)
        return dt_error(DT_EINVAL,
                        "compressor registry: entry '%s' needs a name (without ':'), help, options (\"\" "
                        "for none), start and advance",
                        c && c->name ? c->name : "(null)");
    if (c->opts_size > DT_COMPRESS_OPTS_MAX || (c->opts_size && !c->parse) || (c->options[0] && !c->parse))
        return dt_error(DT_EINVAL,
                        "compressor registry: entry '%s': its options need a parse function and at most %d "
                        "bytes (it has %zu)",
                        c->name, DT_COMPRESS_OPTS_MAX, c->opts_size);
    if (dt_compress_find(c->name))
        return dt_error(DT_EINVAL, "compressor registry: '%s' is registered already", c->name);
    if (g_n == MAX_ENTRIES) return dt_error(DT_ENOMEM, "compressor registry: full (%d entries)", MAX_ENTRIES);
    g_entries[g_n++] = c;
    return DT_OK;
}

/* "none, fp16, bf16, topk:RATIO[:momentum=M][:warmup=STEPS] or powersgd:RANK[:warmup=STEPS][:min_rate=X]" */
static const char *forms(char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < g_n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%s%s%s",
                              i == 0         ? ""
                              : i == g_n - 1 ? " or "
                                             : ", ",
                              g_entries[i]->name, g_entries[i]->options[0] ? ":" : "", g_entries[i]->options);
    return buf;
}

dt_status dt_compress_bad(const char *text, const char *why) {
    char f[512];
    return dt_error(DT_EINVAL, "`compress` %s: %s (use %s, e.g. `compress` topk:0.01)", text, why, forms(f, sizeof f));
}

bool dt_compress_num(const char **p, double lo, double hi, double *out) {
    char *e;
    errno = 0;
    double v = strtod(*p, &e);
    if (errno || e == *p || (*e && *e != ':') || !isfinite(v) || v < lo || v > hi) return false;
    *out = v, *p = e;
    return true;
}

dt_status dt_compress_parse(const char *text, dt_compress_spec *o) {
    memset(o, 0, sizeof *o);
    o->c = &dt_compress_none;
    if (!text || !*text) return DT_OK;
    const char *colon = strchr(text, ':');
    const dt_compressor *c = find_len(text, colon ? (size_t)(colon - text) : strlen(text));
    if (!c) return dt_compress_bad(text, "unknown compressor");
    o->c = c;
    if (!c->parse) {
        if (colon) return o->c = &dt_compress_none, dt_compress_bad(text, "it takes no options");
        return DT_OK;
    }
    dt_status s = c->parse(text, colon ? colon + 1 : "", o->opts.bytes);
    if (s != DT_OK) o->c = &dt_compress_none;
    return s;
}

void dt_compress_format(const dt_compress_spec *s, char *out, size_t cap) {
    const dt_compressor *c = s->c ? s->c : &dt_compress_none;
    char opts[256] = "";
    if (c->format) c->format(s->opts.bytes, opts, sizeof opts);
    snprintf(out, cap, opts[0] ? "%s:%s" : "%s%s", c->name, opts);
}

bool dt_compress_is_none(const dt_compress_spec *s) { return !s->c || s->c == &dt_compress_none; }
