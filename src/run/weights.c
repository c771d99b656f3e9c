/* Plain weights files: loading a PyTorch state_dict saved as safetensors (by name, every shape
 * checked, F32/F16/BF16) into a model, and writing a weights-only file that a strict torch
 * load_state_dict accepts (no optimizer state, num_batches_tracked present, --normalize folded
 * into the first layer). Prediction in batches lives here too (dt_model_predict). */
#include "dtrain/io.h"

#include "dtrain/safetensors.h"
#include "nn/graph_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "[128, 784]" */
static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

/* Appends one problem to the report (its first 8 in full, then a count). */
typedef struct {
    char text[3072];
    size_t len;
    int n;
} report;

static void report_add(report *r, const char *fmt, const char *a, const char *b, const char *c) {
    if (r->n++ >= 8 || r->len >= sizeof r->text - 1) return;
    r->len += (size_t)snprintf(r->text + r->len, sizeof r->text - r->len, "%s", r->n > 1 ? "; " : "");
    if (r->len < sizeof r->text) r->len += (size_t)snprintf(r->text + r->len, sizeof r->text - r->len, fmt, a, b, c);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Whether file tensor `name`, absent from the model, is one a PyTorch state_dict carries beside
 * ours: a batchnorm's step counter, the GPT's tied output head, a dtrain checkpoint's optimizer. */
static bool ignorable(const dt_model *m, const char *name, bool dtrain_ckpt) {
    if (dtrain_ckpt && !strncmp(name, "optim.", 6)) return true;
    if (!strcmp(name, "lm_head.weight")) return dt_model_find_tensor(m, "transformer.wte.weight") >= 0;
    if (!ends_with(name, ".num_batches_tracked")) return false;
    char stat[160];
    snprintf(stat, sizeof stat, "%.*s.running_mean", (int)(strlen(name) - strlen(".num_batches_tracked")), name);
    return dt_model_find_tensor(m, stat) >= 0;
}

/* Checks file tensor st against model tensor p; adds a problem to r when they do not fit. */
static void check_tensor(const dt_st_tensor *st, const dt_param_info *p, report *r) {
    char want[96], have[96];
    fmt_shape(want, sizeof want, p->ndim, p->shape);
    bool same = st->t.ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = st->t.shape[d] == p->shape[d];
    if (!same) {
        fmt_shape(have, sizeof have, st->t.ndim, st->t.shape);
        report_add(r, "'%s' has shape %s, the model expects %s", p->name, have, want);
    } else if (st->t.dtype != DT_F32 && st->t.dtype != DT_F16 && st->t.dtype != DT_BF16)
        report_add(r, "'%s' is %s%s (F32, F16 or BF16 are read)", p->name, dt_dtype_name(st->t.dtype), "");
}

/* Converts a file tensor (F32/F16/BF16, possibly unaligned in a foreign file) to f32 at dst. */
static void copy_tensor(float *dst, const dt_st_tensor *st) {
    const size_t n = st->nbytes / dt_dtype_size(st->t.dtype);
    if (st->t.dtype == DT_F32) {
        memcpy(dst, st->t.data, n * sizeof(float));
        return;
    }
    const unsigned char *src = st->t.data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = st->t.dtype == DT_F16 ? dt_f16_to_f32(h) : dt_bf16_to_f32(h);
    }
}

dt_status dt_weights_load(dt_model *m, const char *path) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, path));
    const bool ckpt = dt_st_meta(f, "dtrain.kind") != NULL;
    report r = {0};
    char want[96];
    for (int i = 0; i < dt_model_num_tensors(m); i++) { /* missing or mis-shaped */
        const dt_param_info *p = dt_model_tensor(m, i);
        dt_st_tensor st;
        if (dt_st_find(f, p->name, &st) == DT_OK) check_tensor(&st, p, &r);
        else {
            fmt_shape(want, sizeof want, p->ndim, p->shape);
            report_add(&r, "'%s' (expected shape %s) is missing%s", p->name, want, "");
        }
    }
    for (int i = 0; i < dt_st_count(f); i++) { /* extra */
        dt_st_tensor st;
        dt_st_at(f, i, &st);
        if (dt_model_find_tensor(m, st.name) < 0 && !ignorable(m, st.name, ckpt))
            report_add(&r, "'%s' is not a tensor of the model%s%s", st.name, "", "");
    }
    if (r.n) {
        dt_status s = dt_error(DT_EFORMAT, "%s does not fit `model` %s: %s%s%s; pass the `model` the weights were saved "
                               "from (the tensor names are torch.nn.Sequential's or nanoGPT's)", path, dt_model_spec(m),
                               r.text, r.n > 8 ? "; and more" : "", "");
        dt_st_close(f);
        return s;
    }
    dt_error_clear();
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < dt_model_num_tensors(m); i++) {
        const dt_param_info *p = dt_model_tensor(m, i);
        float *dst = (p->is_buffer ? dt_model_buffers(m) : dt_model_params(m)) + p->offset, *host = NULL;
        dt_st_tensor st;
        dt_st_find(f, p->name, &st);
        if (m->dev->host_memory) {
            copy_tensor(dst, &st);
        } else if ((host = malloc(p->numel * sizeof(float) + 1))) {  /* through a host copy onto the device */
            copy_tensor(host, &st);
            m->dev->ops->upload(m->dev, dst, host, p->numel * sizeof(float));
            free(host);
        } else {
            s = dt_error(DT_ENOMEM, "%s: no host memory for tensor '%s'", path, p->name);
        }
    }
    dt_st_close(f);
    return s;
}

dt_status dt_weights_spec(const char *path, char *spec, size_t cap, int *C, int *H, int *W) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, path));
    const char *s = dt_st_meta(f, "dtrain.model_spec"), *shape = dt_st_meta(f, "dtrain.input_shape");
    char tail;
    dt_status st = DT_OK;
    if (!s || !shape)
        st = dt_error(DT_ENOENT, "%s records no model (metadata dtrain.model_spec); pass `model` SPEC", path);
    else if (sscanf(shape, "%d,%d,%d%c", C, H, W, &tail) != 3 || *C < 1 || *H < 1 || *W < 1)
        st = dt_error(DT_EFORMAT, "%s: bad dtrain.input_shape '%.40s' (want C,H,W)", path, shape);
    else snprintf(spec, cap, "%s", s);
    dt_st_close(f);
    return st;
}

/* ---- writing ------------------------------------------------------------------------------ */

/* The first node with parameters, after only nodes that commute with x -> (x - mean) / std
 * (flatten, reshape, pooling, dropout); -1 with an error naming the node otherwise. */
static int first_param_node(const dt_model *m) {
    for (int i = 0; i < m->n; i++) {
        const dt_node *n = &m->nodes[i];
        if (n->input_index >= 0) continue;
        if (n->ntensor > 0) return i;
        dt_layer_kind k = n->a.kind;
        if (k != DT_LAYER_FLATTEN && k != DT_LAYER_RESHAPE && k != DT_LAYER_MAXPOOL2D && k != DT_LAYER_AVGPOOL2D &&
            k != DT_LAYER_DROPOUT)
            break;
    }
    return -1;
}

/* Folds norm into the tensors of the first layer, in the copy `params`/`buffers` of the slabs
 * (NULL: only checks that it can). */
static dt_status fold_norm(const dt_model *m, const dt_input_norm *norm, float *params, float *buffers) {
    const int i = first_param_node(m);
    const dt_node *n = i >= 0 ? &m->nodes[i] : NULL;
    const dt_layer_kind k = n ? n->a.kind : DT_LAYER_KIND_COUNT;
    const bool ok = k == DT_LAYER_BATCHNORM2D || ((k == DT_LAYER_LINEAR || k == DT_LAYER_CONV2D) && n->a.bias &&
                                                 !n->a.tie && (k == DT_LAYER_LINEAR || n->a.pad == 0));
    if (!ok)
        return dt_error(DT_EINVAL, "the input normalisation (`normalize`, mean %g std %g) cannot be folded exactly into "
                        "the first layer%s%s%s (only a linear or conv layer with a bias and no padding, or a batchnorm, "
                        "takes it); train without `normalize` to save plain weights, or export to ONNX, which keeps it",
                        norm->mean, norm->std, n ? " " : "", n ? n->name : "", n ? (k == DT_LAYER_CONV2D && n->a.pad ?
                        " (a padded conv: the zero padding is not the mean)" : "") : "");
    if (!params) return DT_OK; /* only checking */
    const double mu = norm->mean, sd = norm->std;
    const dt_param_info *w = &m->tensors[n->tensor[0]], *b = &m->tensors[n->tensor[1]];
    if (k == DT_LAYER_BATCHNORM2D) { /* eval: (x' - rm) / sqrt(rv + eps) with x' = (x - mu) / sd */
        float *rm = buffers + m->tensors[n->tensor[2]].offset, *rv = buffers + m->tensors[n->tensor[3]].offset;
        for (size_t c = 0; c < w->numel; c++) {
            rm[c] = (float)(mu + sd * rm[c]);
            rv[c] = (float)(sd * sd * ((double)rv[c] + n->a.eps) - n->a.eps);
        }
        return DT_OK;
    }
    const size_t rows = b->numel, cols = w->numel / rows; /* (out, in) or (out, in*k*k) */
    float *W = params + w->offset, *B = params + b->offset;
    for (size_t o = 0; o < rows; o++) {
        double sum = 0;
        for (size_t j = 0; j < cols; j++) sum += W[o * cols + j];
        B[o] = (float)((double)B[o] - mu / sd * sum);
        for (size_t j = 0; j < cols; j++) W[o * cols + j] = (float)(W[o * cols + j] / sd);
    }
    return DT_OK;
}

dt_status dt_weights_check_fold(const dt_model *m, const dt_input_norm *norm) {
    return norm && norm->on ? fold_norm(m, norm, NULL, NULL) : DT_OK;
}

/* Adds the tensors, the batchnorm counters and a GPT's lm_head to w (data in params/buffers). */
static dt_status add_tensors(const dt_model *m, dt_st_writer *w, const float *params, const float *buffers) {
    static const int64_t zero = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const dt_param_info *p = &m->tensors[i];
        DT_TRY(dt_st_writer_add(w, p->name, DT_F32, p->ndim, p->shape, (p->is_buffer ? buffers : params) + p->offset));
        if (p->is_buffer && ends_with(p->name, ".running_var")) {
            char name[96];
            snprintf(name, sizeof name, "%.*s.num_batches_tracked", (int)(strlen(p->name) - 12), p->name);
            DT_TRY(dt_st_writer_add(w, name, DT_I64, 0, NULL, &zero));
        }
    }
    int wte = dt_model_find_tensor(m, "transformer.wte.weight");
    if (wte >= 0 && dt_model_find_tensor(m, "lm_head.weight") < 0) {
        const dt_param_info *p = &m->tensors[wte];
        DT_TRY(dt_st_writer_add(w, "lm_head.weight", DT_F32, p->ndim, p->shape, params + p->offset));
    }
    return DT_OK;
}

dt_status dt_weights_save_slabs(const dt_model *m, float *params, float *buffers, const char *path,
                               const dt_input_norm *norm, int C, int H, int W) {
    dt_st_writer *w = NULL;
    dt_status s = norm && norm->on ? fold_norm(m, norm, params, buffers) : DT_OK;
    char shape[64];
    snprintf(shape, sizeof shape, "%d,%d,%d", C, H, W);
    if (s == DT_OK) s = dt_st_writer_create(&w);
    if (s == DT_OK) s = add_tensors(m, w, params, buffers);
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.kind", "dtrain-weights");
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.model_spec", m->spec);
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.input_shape", shape);
    if (s == DT_OK && norm && norm->on) s = dt_st_writer_meta(w, "dtrain.normalize", "folded into the first layer");
    if (s == DT_OK) s = dt_st_writer_write(w, path);
    dt_st_writer_destroy(w);
    return s;
}

dt_status dt_weights_save(const dt_model *m, const char *path, const dt_input_norm *norm, int C, int H, int W) {
    const size_t np = m->params.n, nb = m->buffers.n;
    float *params = malloc((np + nb + 1) * sizeof(float)), *buffers = params + np;
    if (!params) return dt_error(DT_ENOMEM, "`save_weights` %s: out of memory", path);
    m->dev->ops->download(m->dev, params, m->params.data, np * sizeof(float));
    if (nb) m->dev->ops->download(m->dev, buffers, m->buffers.data, nb * sizeof(float));
    dt_status s = dt_weights_save_slabs(m, params, buffers, path, norm, C, H, W);
    free(params);
    return s;
}

/* ---- prediction --------------------------------------------------------------------------- */

dt_status dt_model_predict(dt_model *m, const void *x, int64_t n, float *logits) {
    enum { CHUNK = 256 };
    const size_t in = (size_t)dt_model_in_size(m) * DT_FEED_VALUE_BYTES, out = (size_t)dt_model_out_size(m);
    for (int64_t i = 0; i < n; i += CHUNK) {
        const int b = (int)(n - i < CHUNK ? n - i : CHUNK);
        dt_feed f = {.x = (const char *)x + (size_t)i * in, .y = NULL, .n = b};
        DT_TRY(dt_model_run(m, &f, false, 0, NULL));
        dt_model_read_output(m, 0, (size_t)b * out, logits + (size_t)i * out);  /* downloaded once a batch */
    }
    return DT_OK;
}
