/* Model spec strings: parsing "conv(32,3,pad=1) relu maxpool(2) ..." and the presets into
 * dt_layer_spec arrays, and formatting them back to a canonical string, with each op's syntax
 * from the op registry (dt_op_syntax: its arguments, defaults and canonical form). Errors quote
 * the bad token and its position. Also the usage text of the layers (dt_spec_help). */
#include "nn/graph_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const PRESET_MLP = "flatten linear(128) relu linear(10)";
static const char *const PRESET_CNN =
    "conv(32,3,pad=1) relu maxpool(2) conv(64,3,pad=1) relu maxpool(2) flatten linear(128) relu linear(10)";

dt_layer_spec dt_layer_default(dt_layer_kind kind) {
    dt_layer_spec l = {
        .kind = kind, .bias = true, .p = 0.5f, .eps = 1e-5f, .momentum = 0.1f, .stride = 0, .ignore_index = -100};
    return l;
}

/* The i-th word of a space separated list, or NULL. */
static bool word_at(const char *list, int i, char *out, size_t cap) {
    const char *p = list;
    for (;;) {
        while (*p == ' ') p++;
        if (!*p || *p == '|') return false;
        size_t len = strcspn(p, " |");
        if (i-- == 0) {
            snprintf(out, cap, "%.*s", (int)len, p);
            return true;
        }
        p += len;
    }
}

/* Whether w is one of the words of list. Only a non-empty word of letters can match: an empty
 * one would be found at every position, a separator would match itself. */
static bool word_in(const char *list, const char *w) {
    size_t wl = strlen(w);
    if (wl == 0) return false;
    for (size_t i = 0; i < wl; i++)
        if (!isalpha((unsigned char)w[i])) return false;
    for (const char *p = list; (p = strstr(p, w)) != NULL; p += wl) {
        bool start = p == list || p[-1] == ' ' || p[-1] == '|';
        bool end = p[wl] == '\0' || p[wl] == ' ' || p[wl] == '|';
        if (start && end) return true;
    }
    return false;
}

typedef struct {
    const char *spec; /* whole string, for positions */
    const char *tok;  /* start of the current token */
    int toklen;
} parse_ctx;

static dt_status bad(const parse_ctx *c, const char *fmt, const char *detail) {
    char why[320];
    snprintf(why, sizeof why, fmt, detail);
    return dt_error(DT_EINVAL, "model spec: bad token '%.*s' at position %d: %s", c->toklen, c->tok,
                    (int)(c->tok - c->spec) + 1, why);
}

static dt_status set_arg(const parse_ctx *c, dt_layer_spec *l, const char *key, const char *val) {
    char *end;
    errno = 0;
    if (!strcmp(key, "p") || !strcmp(key, "eps") || !strcmp(key, "momentum")) {
        float f = strtof(val, &end);
        if (errno || end == val || *end) return bad(c, "'%s' is not a number", val);
        if (!strcmp(key, "p")) {
            if (!(f >= 0 && f < 1)) return bad(c, "dropout p must be in [0,1), got %s", val);
            l->p = f;
        } else if (!strcmp(key, "eps")) {
            if (!(f > 0)) return bad(c, "eps must be > 0, got %s", val);
            l->eps = f;
        } else {
            if (!(f >= 0 && f <= 1)) return bad(c, "momentum must be in [0,1], got %s", val);
            l->momentum = f;
        }
        return DT_OK;
    }
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end) return bad(c, "'%s' is not an integer", val);
    if (!strcmp(key, "bias")) {
        if (v != 0 && v != 1) return bad(c, "bias must be 0 or 1, got %s", val);
        l->bias = v == 1;
        return DT_OK;
    }
    long lo = !strcmp(key, "pad") ? 0 : 1;
    if (v < lo || v > 65536) return bad(c, "value %s is out of range", val);
    if (!strcmp(key, "out")) l->out = (int)v;
    else if (!strcmp(key, "k")) l->k = (int)v;
    else if (!strcmp(key, "stride")) l->stride = (int)v;
    else if (!strcmp(key, "pad")) l->pad = (int)v;
    return DT_OK;
}

/* "linear conv ...; aliases dense conv2d ...": the names the usage text lists (dt_spec_help). */
static void known_names(char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int alias = 0; alias < 2; alias++) {
        if (alias && len < cap) len += (size_t)snprintf(buf + len, cap - len, "; aliases");
        for (int k = 0; k < dt_op_count() && len < cap; k++) {
            const dt_op *op = dt_op_of((dt_layer_kind)k);
            const char *w = !op->syntax || !op->syntax->usage ? NULL : alias ? op->syntax->alias : op->name;
            if (w) len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? " " : "", w);
        }
    }
}

/* The arguments "(a,b,key=v)" of a token whose op has syntax syn, from open to its end. */
static dt_status parse_args(const parse_ctx *c, const dt_op *op, const char *open, dt_layer_spec *l) {
    const dt_op_syntax *syn = op->syntax;
    char w[32];
    int npos = 0;
    if (open) {
        const char *close = c->tok + c->toklen - 1;
        if (*close != ')') return bad(c, "%s", "missing ')'");
        const char *p = open + 1;
        while (p < close) {
            const char *comma = memchr(p, ',', (size_t)(close - p));
            const char *argend = comma ? comma : close;
            char arg[64], msg[160];
            while (p < argend && isspace((unsigned char)*p)) p++;
            int alen = (int)(argend - p);
            while (alen > 0 && isspace((unsigned char)p[alen - 1])) alen--;
            if (alen <= 0 || alen >= (int)sizeof arg) return bad(c, "%s", "empty or overlong argument");
            memcpy(arg, p, (size_t)alen);
            arg[alen] = '\0';
            char *eq = strchr(arg, '=');
            if (eq) {
                *eq = '\0';
                for (char *e = eq - 1; e >= arg && isspace((unsigned char)*e); e--) *e = '\0';
                if (!arg[0]) {
                    snprintf(msg, sizeof msg, "an argument has '=' but no name before it (%s takes: %s)", op->name,
                             syn->args);
                    return bad(c, "%s", msg);
                }
                if (!word_in(syn->args, arg)) {
                    snprintf(msg, sizeof msg, "unknown argument '%s' for %s (takes: %s)", arg, op->name, syn->args);
                    return bad(c, "%s", msg);
                }
                DT_TRY(set_arg(c, l, arg, eq + 1));
            } else {
                if (!word_at(syn->args, npos, w, sizeof w)) {
                    snprintf(msg, sizeof msg, "too many arguments for %s (takes: %s)", op->name, syn->args);
                    return bad(c, "%s", msg);
                }
                DT_TRY(set_arg(c, l, w, arg));
                npos++;
            }
            p = argend + 1;
        }
    }
    if (npos < syn->required) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s needs %d argument%s (%s)", op->name, syn->required, syn->required > 1 ? "s" : "",
                 syn->args);
        return bad(c, "%s", msg);
    }
    if (syn->finish) syn->finish(l);
    return DT_OK;
}

/* Parses one token "name" or "name(a,b,key=v)". */
static dt_status parse_token(const parse_ctx *c, dt_layer_spec *l) {
    const char *open = memchr(c->tok, '(', (size_t)c->toklen);
    int namelen = open ? (int)(open - c->tok) : c->toklen;
    char name[32];
    if (namelen <= 0 || namelen >= (int)sizeof name) return bad(c, "%s", "expected a layer name");
    memcpy(name, c->tok, (size_t)namelen);
    name[namelen] = '\0';
    for (char *p = name; *p; p++) *p = (char)tolower((unsigned char)*p);
    dt_layer_kind kind;
    const dt_op *op = dt_op_find(name, &kind);
    if (op && !op->syntax) op = NULL; /* graph builders only: not a layer of a spec */
    if (!op && (!strcmp(name, "softmax") || !strcmp(name, "logsoftmax") || !strcmp(name, "log_softmax")))
        return bad(c,
                   "%s: the loss (softmax cross-entropy) already applies softmax to the model's outputs; end "
                   "the spec with the last linear layer",
                   name);
    if (!op) {
        char known[200], msg[288]; /* name (31) and known (199) fit */
        known_names(known, sizeof known);
        snprintf(msg, sizeof msg, "unknown layer '%s' (known: %s)", name, known);
        return bad(c, "%s", msg);
    }
    *l = dt_layer_default(kind);
    return parse_args(c, op, open, l);
}

dt_status dt_spec_parse(const char *spec, dt_layer_spec *layers, int max_layers, int *n) {
    *n = 0;
    if (!spec) return dt_error(DT_EINVAL, "model spec: empty");
    if (!strcmp(spec, "mlp")) spec = PRESET_MLP;
    else if (!strcmp(spec, "cnn")) spec = PRESET_CNN;
    parse_ctx c = {.spec = spec};
    const char *p = spec;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        if (!*p) break;
        /* a token runs to whitespace outside parentheses */
        const char *q = p;
        int depth = 0;
        while (*q && (depth > 0 || !isspace((unsigned char)*q))) {
            if (*q == '(') depth++;
            else if (*q == ')') depth--;
            q++;
        }
        c.tok = p;
        c.toklen = (int)(q - p);
        if (depth != 0) return bad(&c, "%s", "unbalanced parentheses");
        if (*n >= max_layers) return bad(&c, "%s", "too many layers");
        DT_TRY(parse_token(&c, &layers[*n]));
        (*n)++;
        p = q;
    }
    if (*n == 0) return dt_error(DT_EINVAL, "model spec '%s' has no layers (try `model` mlp or `model` cnn)", spec);
    return DT_OK;
}

void dt_spec_format(char *buf, size_t cap, const dt_layer_spec *layers, int n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++) {
        const dt_layer_spec *l = &layers[i];
        const dt_op *op = dt_op_of(l->kind);
        const dt_op_syntax *syn = op ? op->syntax : NULL;
        char args[128] = "";
        if (syn && syn->format) syn->format(args, sizeof args, l);
        int w = snprintf(buf + len, cap - len, "%s%s%s", i ? " " : "", syn ? op->name : "?", args);
        if (w < 0) break;
        len += (size_t)w;
    }
}

/* The usage text being written: words on lines of at most HELP_COLUMNS columns. */
enum { HELP_COLUMNS = 104 };
typedef struct {
    char *buf;
    size_t cap, len, col; /* col: the current line's length */
    int words;            /* of the current list */
} help_text;

static void help_put(help_text *h, const char *s) {
    if (h->len >= h->cap) return;
    int w = snprintf(h->buf + h->len, h->cap - h->len, "%s", s);
    if (w > 0) h->len += (size_t)w;
}

/* Adds word to the list after sep; where the line would pass HELP_COLUMNS, sep without its
 * trailing space ends the line and the word starts the next, indented by `indent`. */
static void help_word(help_text *h, const char *sep, const char *word, size_t indent) {
    const size_t seplen = h->words ? strlen(sep) : 0, wl = strlen(word);
    if (h->words && h->col + seplen + wl > HELP_COLUMNS) {
        char end[32];
        snprintf(end, sizeof end, "%.*s\n%*s", (int)strcspn(sep, " "), sep, (int)indent, "");
        help_put(h, end);
        h->col = indent;
    } else if (h->words) {
        help_put(h, sep);
        h->col += seplen;
    }
    help_put(h, word);
    h->col += wl;
    h->words++;
}

const char *dt_spec_help(void) {
    static char buf[2048];
    help_text h = {.buf = buf, .cap = sizeof buf};
    for (int alias = 0; alias < 2; alias++) {
        const char *title = alias ? "aliases: " : "layers: ";
        help_put(&h, title);
        h.col = strlen(title), h.words = 0;
        for (int k = 0; k < dt_op_count(); k++) {
            const dt_op_syntax *syn = dt_op_of((dt_layer_kind)k)->syntax;
            if (!syn || !syn->usage) continue;
            if (!alias) help_word(&h, " ", syn->usage, 8);
            else if (syn->alias_usage) help_word(&h, ", ", syn->alias_usage, 9);
        }
        help_put(&h, alias ? ".\n" : "\n");
    }
    return buf;
}
