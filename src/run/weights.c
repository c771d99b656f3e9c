/* Plain weights files: loading a PyTorch state_dict saved as safetensors (by name, every shape
 * checked, F32/F16/BF16) into a model, and writing a weights-only file that a strict torch
 * load_state_dict accepts (no optimizer state, num_batches_tracked present, --normalize folded
 * into the first layer). The state_dict's entries beyond the model's tensors and the folding come
 * from the model's ops (nn/interchange.h). Prediction in batches lives here too (dt_model_predict). */
#include "dtrain/io.h"

#include "device/device.h"
#include "dtrain/safetensors.h"
#include "nn/interchange.h"

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

/* Whether file tensor `name`, absent from the model, is one a PyTorch state_dict carries beside
 * ours: an entry the model's ops add (a batchnorm's step counter, the GPT's tied output head), a
 * dtrain checkpoint's optimizer. */
static bool ignorable(const dt_model *m, const char *name, bool dtrain_ckpt) {
    if (dtrain_ckpt && !strncmp(name, "optim.", 6)) return true;
    return dt_model_torch_extra(m, name);
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
        dt_status s = dt_error(DT_EFORMAT,
                               "%s does not fit `model` %s: %s%s%s; pass the `model` the weights were saved "
                               "from (the tensor names are torch.nn.Sequential's or nanoGPT's)",
                               path, dt_model_spec(m), r.text, r.n > 8 ? "; and more" : "", "");
        dt_st_destroy(f);
        return s;
    }
    dt_error_clear();
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < dt_model_num_tensors(m); i++) {
        const dt_param_info *p = dt_model_tensor(m, i);
        float *dst = (p->is_buffer ? dt_model_buffers(m) : dt_model_params(m)) + p->offset, *host = NULL;
        dt_st_tensor st;
        dt_st_find(f, p->name, &st);
        dt_dev *dev = dt_model_device(m);
        if (dev->host_memory) {
            copy_tensor(dst, &st);
        } else if ((host = malloc(p->numel * sizeof(float) + 1))) { /* through a host copy onto the device */
            copy_tensor(host, &st);
            dev->ops->upload(dev, dst, host, p->numel * sizeof(float));
            free(host);
        } else {
            s = dt_error(DT_ENOMEM, "%s: no host memory for tensor '%s'", path, p->name);
        }
    }
    dt_st_destroy(f);
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
    dt_st_destroy(f);
    return st;
}

/* ---- writing ------------------------------------------------------------------------------ */

/* Folds norm into the tensors of the first layer (its op's fold_input_norm), in the copy
 * `params`/`buffers` of the slabs (NULL: only checks that it can). */
static dt_status fold_norm(const dt_model *m, const dt_input_norm *norm, float *params, float *buffers) {
    const int i = dt_model_norm_node(m);
    const char *why = "", *name = i >= 0 ? dt_model_node_name(m, i) : NULL;
    const bool ok = i >= 0 && dt_model_fold_input_norm(m, i, norm->mean, norm->std, NULL, NULL, &why);
    if (!ok)
        return dt_error(
            DT_EINVAL,
            "the input normalisation (`normalize`, mean %g std %g) cannot be folded exactly into "
            "the first layer%s%s%s (only a linear or conv layer with a bias and no padding, or a batchnorm, "
            "takes it); train without `normalize` to save plain weights, or export to ONNX, which keeps it",
            norm->mean, norm->std, name ? " " : "", name ? name : "", why);
    if (params) dt_model_fold_input_norm(m, i, norm->mean, norm->std, params, buffers, &why);
    return DT_OK;
}

dt_status dt_weights_check_fold(const dt_model *m, const dt_input_norm *norm) {
    return norm && norm->on ? fold_norm(m, norm, NULL, NULL) : DT_OK;
}

/* Adds each entry of the model's PyTorch state_dict (nn/interchange.h) to the writer: a tensor's
 * values from params/buffers under its name (a tied one under each of its names), a step counter
 * as an int64 0. */
typedef struct {
    const dt_model *m;
    dt_st_writer *w;
    const float *params, *buffers;
} add_ctx;

static dt_status add_entry(void *ctx, const dt_torch_entry *e) {
    static const int64_t zero = 0;
    const add_ctx *a = ctx;
    if (e->tensor < 0) return dt_st_writer_add(a->w, e->name, DT_I64, 0, NULL, &zero);
    const dt_param_info *p = dt_model_tensor(a->m, e->tensor);
    const float *slab = p->is_buffer ? a->buffers : a->params;
    return dt_st_writer_add(a->w, e->name, DT_F32, p->ndim, p->shape, slab + p->offset);
}

dt_status dt_weights_save_slabs(const dt_model *m, float *params, float *buffers, const char *path,
                                const dt_input_norm *norm, int C, int H, int W) {
    dt_st_writer *w = NULL;
    dt_status s = norm && norm->on ? fold_norm(m, norm, params, buffers) : DT_OK;
    char shape[64];
    snprintf(shape, sizeof shape, "%d,%d,%d", C, H, W);
    if (s == DT_OK) s = dt_st_writer_create(&w);
    add_ctx a = {m, w, params, buffers};
    if (s == DT_OK) s = dt_model_torch_state(m, add_entry, &a);
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.kind", "dtrain-weights");
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.model_spec", dt_model_spec(m));
    if (s == DT_OK) s = dt_st_writer_meta(w, "dtrain.input_shape", shape);
    if (s == DT_OK && norm && norm->on) s = dt_st_writer_meta(w, "dtrain.normalize", "folded into the first layer");
    if (s == DT_OK) s = dt_st_writer_write(w, path);
    dt_st_writer_destroy(w);
    return s;
}

dt_status dt_weights_save(const dt_model *m, const char *path, const dt_input_norm *norm, int C, int H, int W) {
    const size_t np = dt_model_num_params(m), nb = dt_model_num_buffers(m);
    float *params = malloc((np + nb + 1) * sizeof(float)), *buffers = params + np;
    if (!params) return dt_error(DT_ENOMEM, "`save_weights` %s: out of memory", path);
    dt_model *mm = (dt_model *)m; /* the slab accessors take a mutable model; nothing is written */
    dt_dev *dev = dt_model_device(m);
    dev->ops->download(dev, params, dt_model_params(mm), np * sizeof(float));
    if (nb) dev->ops->download(dev, buffers, dt_model_buffers(mm), nb * sizeof(float));
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
        dt_model_read_output(m, 0, (size_t)b * out, logits + (size_t)i * out); /* downloaded once a batch */
    }
    return DT_OK;
}
