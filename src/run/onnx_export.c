/* ONNX export (IR 8, opset 17) of a model graph, the protobuf written with protobuf-c from the
 * schema python3-onnx ships (generated into the build directory at build time). Each graph node
 * becomes one or a few ONNX nodes; parameters become initializers under their own names. Built
 * without protobuf-c (ONNX=0), dt_onnx_export says how to get it. */
#include "dtrain/io.h"

#include "nn/graph_internal.h"
#include "run/writable.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef DT_HAVE_ONNX
dt_status dt_onnx_export(const dt_model *m, const char *path, const dt_input_norm *norm, int C, int H, int W) {
    (void)m, (void)norm, (void)C, (void)H, (void)W;
    return dt_error(DT_ENOTSUP, "%s: built without ONNX export: install protobuf-c-compiler, libprotobuf-c-dev and "
                    "python3-onnx (scripts/install-deps) and rebuild", path);
}
#else
#include "onnx.pb-c.h"

extern const char dt_onnx_producer_version[]; /* DTRAIN_VERSION (model_io.c: dtrain.h and the graph's
                                                * internals do not mix) */

enum { IR_VERSION = 8, OPSET = 17 };

/* The ONNX graph being built; every allocation is tracked and freed together. */
typedef struct {
    void **mem;
    size_t nmem, capmem;
    Onnx__NodeProto **nodes;
    size_t nn, capn;
    Onnx__TensorProto **inits;
    size_t ni, capi;
    bool failed;
    int tmp;                  /* counter of intermediate value names */
} onnx_b;

static void *grow(void *p, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return p;
    size_t c = *cap ? 2 * *cap : 64;
    void *q = realloc(p, c * elem);
    if (q) *cap = c;
    return q;
}

static void *ob_alloc(onnx_b *b, size_t bytes) {
    void **mem = grow(b->mem, &b->capmem, b->nmem, sizeof *mem);
    void *p = mem ? calloc(1, bytes ? bytes : 1) : NULL;
    if (mem) b->mem = mem;
    if (!p) return b->failed = true, NULL;
    b->mem[b->nmem++] = p;
    return p;
}

static char *ob_str(onnx_b *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *ob_str(onnx_b *b, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *s = ob_alloc(b, strlen(buf) + 1);
    if (s) strcpy(s, buf);
    return s;
}

/* A node op(in[0..nin)) -> one output; returns the output's name ("t<k>" unless out is given). */
static Onnx__NodeProto *ob_node(onnx_b *b, const char *op, const char *const *in, int nin, const char *out) {
    Onnx__NodeProto *n = ob_alloc(b, sizeof *n);
    char **ins = ob_alloc(b, sizeof(char *) * (size_t)nin), **outs = ob_alloc(b, sizeof(char *));
    Onnx__NodeProto **nodes = grow(b->nodes, &b->capn, b->nn, sizeof *nodes);
    if (!n || !ins || !outs || !nodes) return b->failed = true, NULL;
    b->nodes = nodes;
    onnx__node_proto__init(n);
    for (int i = 0; i < nin; i++) ins[i] = (char *)in[i];
    outs[0] = out ? (char *)out : ob_str(b, "t%d", b->tmp++);
    n->op_type = (char *)op;
    n->name = ob_str(b, "%s_%zu", op, b->nn);
    n->n_input = (size_t)nin, n->input = ins, n->n_output = 1, n->output = outs;
    b->nodes[b->nn++] = n;
    return n;
}
static const char *out_of(const Onnx__NodeProto *n) { return n ? n->output[0] : "?"; }

static Onnx__AttributeProto *ob_attr(onnx_b *b, Onnx__NodeProto *n, const char *name) {
    Onnx__AttributeProto *a = ob_alloc(b, sizeof *a), **all = n ? ob_alloc(b, sizeof *all * (n->n_attribute + 1)) : NULL;
    if (!a || !all) return b->failed = true, NULL;
    onnx__attribute_proto__init(a);
    a->name = (char *)name;
    for (size_t i = 0; i < n->n_attribute; i++) all[i] = n->attribute[i];
    all[n->n_attribute] = a;
    n->attribute = all, n->n_attribute++;
    return a;
}
static void attr_i(onnx_b *b, Onnx__NodeProto *n, const char *name, int64_t v) {
    Onnx__AttributeProto *a = ob_attr(b, n, name);
    if (a) a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT, a->has_i = 1, a->i = v;
}
static void attr_f(onnx_b *b, Onnx__NodeProto *n, const char *name, float v) {
    Onnx__AttributeProto *a = ob_attr(b, n, name);
    if (a) a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT, a->has_f = 1, a->f = v;
}
static void attr_ints(onnx_b *b, Onnx__NodeProto *n, const char *name, const int64_t *v, int k) {
    Onnx__AttributeProto *a = ob_attr(b, n, name);
    int64_t *c = ob_alloc(b, sizeof *c * (size_t)k);
    if (!a || !c) return;
    memcpy(c, v, sizeof *c * (size_t)k);
    a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS, a->n_ints = (size_t)k, a->ints = c;
}

/* An initializer `name` of dims[0..ndim) and elem_type (FLOAT or INT64), bytes copied from host
 * memory, or (dev non-NULL) downloaded from that device's memory. */
static const char *ob_init(onnx_b *b, const char *name, const int64_t *dims, int ndim, int elem_type,
                           const void *data, size_t bytes, dt_dev *dev) {
    Onnx__TensorProto *t = ob_alloc(b, sizeof *t);
    int64_t *d = ob_alloc(b, sizeof *d * (size_t)(ndim ? ndim : 1));
    void *raw = ob_alloc(b, bytes);
    Onnx__TensorProto **inits = grow(b->inits, &b->capi, b->ni, sizeof *inits);
    if (!t || !d || !raw || !inits) return b->failed = true, name;
    b->inits = inits;
    onnx__tensor_proto__init(t);
    if (ndim) memcpy(d, dims, sizeof *d * (size_t)ndim);
    if (dev) dev->ops->download(dev, raw, data, bytes);
    else memcpy(raw, data, bytes);
    t->name = (char *)name, t->n_dims = (size_t)ndim, t->dims = d;
    t->has_data_type = 1, t->data_type = elem_type;
    t->has_raw_data = 1, t->raw_data.len = bytes, t->raw_data.data = raw;
    b->inits[b->ni++] = t;
    return name;
}
/* v: host memory, or (dev non-NULL) that device's. */
static const char *init_f32_on(onnx_b *b, const char *name, const int64_t *dims, int ndim, const float *v, dt_dev *dev) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)dims[d];
    return ob_init(b, name, dims, ndim, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, v, n * sizeof(float), dev);
}
static const char *init_f32(onnx_b *b, const char *name, const int64_t *dims, int ndim, const float *v) {
    return init_f32_on(b, name, dims, ndim, v, NULL);
}
static const char *init_i64(onnx_b *b, const char *name, const int64_t *v, int n) {
    const int64_t dims[1] = {n};
    return ob_init(b, name, dims, 1, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, v, (size_t)n * sizeof(int64_t), NULL);
}
static const char *scalar(onnx_b *b, float v) {
    return init_f32(b, ob_str(b, "const_%d", b->tmp++), NULL, 0, &v);
}

/* ---- graph nodes to ONNX nodes ----------------------------------------------------------- */

/* The initializer of tensor k of node n (under the tensor's name; a tied tensor is emitted once,
 * by its first user), with its own dims or, when ndim > 0, dims[0..ndim): downloaded from the
 * model's device into the initializer (the host never reads model memory in place). */
static const char *param(onnx_b *b, const dt_model *m, const dt_node *n, int k, const int64_t *dims, int ndim) {
    const dt_param_info *p = &m->tensors[n->tensor[k]];
    for (size_t i = 0; i < b->ni; i++)
        if (!strcmp(b->inits[i]->name, p->name)) return b->inits[i]->name;
    const float *data = (p->is_buffer ? m->buffers.data : m->params.data) + p->offset;
    return init_f32_on(b, p->name, ndim ? dims : p->shape, ndim ? ndim : p->ndim, data, m->dev);
}

static const char *node1(onnx_b *b, const char *op, const char *a) { return out_of(ob_node(b, op, &a, 1, NULL)); }
static const char *node2(onnx_b *b, const char *op, const char *a, const char *c) {
    const char *in[2] = {a, c};
    return out_of(ob_node(b, op, in, 2, NULL));
}

/* x @ W^T (+ bias): Gemm for a (N, in) input, else Transpose + MatMul (+ Add) over the last dim. */
static const char *linear(onnx_b *b, const dt_model *m, const dt_node *n, const char *x) {
    const dt_node *in = dt_node_input(m, n, 0);
    const bool bias = n->ntensor > 1;
    const char *w = param(b, m, n, 0, NULL, 0);
    if (n->a.flatten || in->ndim <= 1) {
        if (in->ndim > 1) { /* (N, C, H, W) -> (N, C*H*W) */
            Onnx__NodeProto *f = ob_node(b, "Flatten", &x, 1, NULL);
            attr_i(b, f, "axis", 1);
            x = out_of(f);
        }
        const char *g[3] = {x, w, bias ? param(b, m, n, 1, NULL, 0) : NULL};
        Onnx__NodeProto *gemm = ob_node(b, "Gemm", g, bias ? 3 : 2, NULL);
        attr_i(b, gemm, "transB", 1);
        return out_of(gemm);
    }
    Onnx__NodeProto *t = ob_node(b, "Transpose", &w, 1, NULL);
    const int64_t perm[2] = {1, 0};
    attr_ints(b, t, "perm", perm, 2);
    const char *y = node2(b, "MatMul", x, out_of(t));
    return bias ? node2(b, "Add", y, param(b, m, n, 1, NULL, 0)) : y;
}

static const char *conv_pool(onnx_b *b, const dt_model *m, const dt_node *n, const char *x) {
    const dt_layer_kind k = n->a.kind;
    const int64_t ks[2] = {n->a.k, n->a.k}, st[2] = {n->a.stride, n->a.stride};
    Onnx__NodeProto *o;
    if (k == DT_LAYER_CONV2D) {
        const int64_t pads[4] = {n->a.pad, n->a.pad, n->a.pad, n->a.pad};
        const char *in[3] = {x, param(b, m, n, 0, NULL, 0), n->ntensor > 1 ? param(b, m, n, 1, NULL, 0) : NULL};
        o = ob_node(b, "Conv", in, n->ntensor > 1 ? 3 : 2, NULL);
        attr_ints(b, o, "pads", pads, 4);
    } else o = ob_node(b, k == DT_LAYER_MAXPOOL2D ? "MaxPool" : "AveragePool", &x, 1, NULL);
    attr_ints(b, o, "kernel_shape", ks, 2);
    attr_ints(b, o, "strides", st, 2);
    return out_of(o);
}

/* Layer norm over the whole sample (sequential: scale and bias shaped as the input's sample) or
 * over the last dim (GPT); batchnorm with its running statistics. */
static const char *norm_layer(onnx_b *b, const dt_model *m, const dt_node *n, const char *x) {
    const dt_node *in = dt_node_input(m, n, 0);
    if (n->a.kind == DT_LAYER_BATCHNORM2D) {
        const char *bn[5] = {x, param(b, m, n, 0, NULL, 0), param(b, m, n, 1, NULL, 0), param(b, m, n, 2, NULL, 0),
                             param(b, m, n, 3, NULL, 0)};
        Onnx__NodeProto *o = ob_node(b, "BatchNormalization", bn, 5, NULL);
        attr_f(b, o, "epsilon", n->a.eps);
        return out_of(o);
    }
    int64_t dims[4];
    int nd = 0;
    if (n->a.flatten)
        for (int d = 0; d < in->ndim; d++) dims[nd++] = in->shape[d];
    const char *ln[3] = {x, param(b, m, n, 0, dims, nd), param(b, m, n, 1, dims, nd)};
    Onnx__NodeProto *o = ob_node(b, "LayerNormalization", ln, 3, NULL);
    attr_i(b, o, "axis", n->a.flatten ? 1 : -1);
    attr_f(b, o, "epsilon", n->a.eps);
    return out_of(o);
}

/* Causal multi-head self-attention of qkv (N, T, 3C): softmax(q k^T / sqrt(D) + mask) v. */
static const char *attention(onnx_b *b, const dt_node *n, const char *qkv) {
    const int T = n->shape[0], Cc = n->shape[1], NH = n->a.heads, D = Cc / NH;
    const int64_t split[3] = {Cc, Cc, Cc}, hshape[4] = {0, 0, NH, D}, oshape[3] = {0, 0, Cc};
    const int64_t p_q[4] = {0, 2, 1, 3}, p_k[4] = {0, 2, 3, 1};
    const char *sin[2] = {qkv, init_i64(b, ob_str(b, "split_%d", b->tmp++), split, 3)};
    Onnx__NodeProto *sp = ob_node(b, "Split", sin, 2, NULL);
    char **outs = ob_alloc(b, 3 * sizeof(char *));
    if (!sp || !outs) return "?";
    outs[0] = sp->output[0], outs[1] = ob_str(b, "t%d", b->tmp++), outs[2] = ob_str(b, "t%d", b->tmp++);
    sp->output = outs, sp->n_output = 3;
    attr_i(b, sp, "axis", 2);
    const char *hs = init_i64(b, ob_str(b, "shape_%d", b->tmp++), hshape, 4), *qkv3[3];
    for (int j = 0; j < 3; j++) {
        Onnx__NodeProto *t = ob_node(b, "Transpose", (const char *[]){node2(b, "Reshape", outs[j], hs)}, 1, NULL);
        attr_ints(b, t, "perm", j == 1 ? p_k : p_q, 4);
        qkv3[j] = out_of(t);
    }
    float *mask = ob_alloc(b, sizeof(float) * (size_t)T * T);
    for (int i = 0; mask && i < T; i++)
        for (int j = 0; j < T; j++) mask[(size_t)i * T + j] = j <= i ? 0.0f : -1e30f;
    const int64_t mdims[2] = {T, T};
    const char *mk = mask ? init_f32(b, ob_str(b, "causal_mask_%d", b->tmp++), mdims, 2, mask) : "?";
    const char *att = node2(b, "Mul", node2(b, "MatMul", qkv3[0], qkv3[1]), scalar(b, 1.0f / sqrtf((float)D)));
    Onnx__NodeProto *sm = ob_node(b, "Softmax", (const char *[]){node2(b, "Add", att, mk)}, 1, NULL);
    attr_i(b, sm, "axis", -1);
    Onnx__NodeProto *t = ob_node(b, "Transpose", (const char *[]){node2(b, "MatMul", out_of(sm), qkv3[2])}, 1, NULL);
    attr_ints(b, t, "perm", p_q, 4);
    return node2(b, "Reshape", out_of(t), init_i64(b, ob_str(b, "shape_%d", b->tmp++), oshape, 3));
}

/* Token rows Gather(W, ids), or position rows Gather(W, [0..T)) (broadcast over the batch). */
static const char *embedding(onnx_b *b, const dt_model *m, const dt_node *n, const char *ids) {
    const char *w = param(b, m, n, 0, NULL, 0);
    if (!n->a.pos) return node2(b, "Gather", w, ids);
    const int T = n->shape[0];
    int64_t *pos = ob_alloc(b, sizeof(int64_t) * (size_t)T);
    for (int i = 0; pos && i < T; i++) pos[i] = i;
    return node2(b, "Gather", w, pos ? init_i64(b, ob_str(b, "positions_%d", b->tmp++), pos, T) : "?");
}

/* x * 0.5 * (1 + erf(x / sqrt(2))): dtrain's exact GELU (opset 17 has no Gelu op). */
static const char *gelu(onnx_b *b, const char *x) {
    const char *e = node1(b, "Erf", node2(b, "Mul", x, scalar(b, (float)M_SQRT1_2)));
    return node2(b, "Mul", node2(b, "Mul", x, node2(b, "Add", e, scalar(b, 1.0f))), scalar(b, 0.5f));
}

/* The ONNX nodes of graph node n; *out gets the name of its value. */
static dt_status onnx_op(onnx_b *b, const dt_model *m, const dt_node *n, const char **val, const char **out) {
    const char *x = val[n->in[0]];
    switch (n->a.kind) {
    case DT_LAYER_LINEAR: *out = linear(b, m, n, x); break;
    case DT_LAYER_MATMUL_T: *out = linear(b, m, n, x); break;
    case DT_LAYER_CONV2D: case DT_LAYER_MAXPOOL2D: case DT_LAYER_AVGPOOL2D: *out = conv_pool(b, m, n, x); break;
    case DT_LAYER_LAYERNORM: case DT_LAYER_BATCHNORM2D: *out = norm_layer(b, m, n, x); break;
    case DT_LAYER_RELU: *out = node1(b, "Relu", x); break;
    case DT_LAYER_TANH: *out = node1(b, "Tanh", x); break;
    case DT_LAYER_SIGMOID: *out = node1(b, "Sigmoid", x); break;
    case DT_LAYER_GELU: *out = gelu(b, x); break;
    case DT_LAYER_DROPOUT: *out = node1(b, "Identity", x); break;  /* evaluation: no dropout */
    case DT_LAYER_FLATTEN: {
        Onnx__NodeProto *f = ob_node(b, "Flatten", &x, 1, NULL);
        attr_i(b, f, "axis", 1);
        *out = out_of(f);
        break;
    }
    case DT_LAYER_RESHAPE: {
        int64_t shp[5] = {-1};
        for (int d = 0; d < n->ndim; d++) shp[1 + d] = n->shape[d];
        *out = node2(b, "Reshape", x, init_i64(b, ob_str(b, "shape_%d", b->tmp++), shp, 1 + n->ndim));
        break;
    }
    case DT_LAYER_EMBEDDING: *out = embedding(b, m, n, x); break;
    case DT_LAYER_ADD: *out = node2(b, "Add", x, val[n->in[1]]); break;
    case DT_LAYER_ATTENTION: *out = attention(b, n, x); break;
    default:
        return dt_error(DT_ENOTSUP, "export: node '%s' (%s) has no ONNX form", n->name, dt_layer_name(n->a.kind));
    }
    return DT_OK;
}

/* A graph input/output declaration: name, elem type, dims (a negative dim is the batch "N"). */
static Onnx__ValueInfoProto *value_info(onnx_b *b, const char *name, int elem, const int64_t *dims, int ndim) {
    Onnx__ValueInfoProto *v = ob_alloc(b, sizeof *v);
    Onnx__TypeProto *tp = ob_alloc(b, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = ob_alloc(b, sizeof *tt);
    Onnx__TensorShapeProto *sh = ob_alloc(b, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **dv = ob_alloc(b, sizeof *dv * (size_t)ndim);
    if (!v || !tp || !tt || !sh || !dv) return NULL;
    onnx__value_info_proto__init(v), onnx__type_proto__init(tp), onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    for (int d = 0; d < ndim; d++) {
        if (!(dv[d] = ob_alloc(b, sizeof **dv))) return NULL;
        onnx__tensor_shape_proto__dimension__init(dv[d]);
        if (dims[d] < 0) dv[d]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM, dv[d]->dim_param = "N";
        else dv[d]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE, dv[d]->dim_value = dims[d];
    }
    sh->n_dim = (size_t)ndim, sh->dim = dv;
    tt->has_elem_type = 1, tt->elem_type = elem, tt->shape = sh;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE, tp->tensor_type = tt;
    v->name = (char *)name, v->type = tp;
    return v;
}

/* Packs the model and writes it atomically (temp file, fsync, rename). */
static dt_status write_model(const Onnx__ModelProto *mp, const char *named) {
    char path[4096];  /* named, or the file a symbolic link named leads to */
    DT_TRY(dt_output_path("export", named, path, sizeof path));
    size_t len = onnx__model_proto__get_packed_size(mp);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return dt_error(DT_ENOMEM, "export %s: out of memory (%zu bytes)", path, len);
    onnx__model_proto__pack(mp, buf);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    dt_status s = DT_OK;
    if (!f) s = dt_error(DT_EIO, "export %s: cannot create %s: %s", path, tmp, strerror(errno));
    else {
        bool ok = fwrite(buf, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
        if (fclose(f) != 0) ok = false;
        if (!ok || rename(tmp, path) != 0) {
            s = dt_error(DT_EIO, "export %s: write failed: %s", path, strerror(errno));
            unlink(tmp);
        }
    }
    free(buf);
    return s;
}

dt_status dt_onnx_export(const dt_model *m, const char *path, const dt_input_norm *norm, int C, int H, int W) {
    onnx_b b = {0};
    const char **val = calloc((size_t)m->n, sizeof *val);
    dt_status s = val ? DT_OK : dt_error(DT_ENOMEM, "export: out of memory");
    const bool ids = m->ninputs > 0 && m->nodes[m->inputs[0]].dtype == DT_I32;
    const dt_node *in0 = m->ninputs > 0 ? &m->nodes[m->inputs[0]] : NULL;
    int64_t idims[5] = {-1, C, H, W}, odims[4] = {-1};
    int ind = 4, ond = 1 + m->nodes[m->output].ndim;
    if (ids) { /* (N, T) token ids */
        ind = 1 + in0->ndim;
        for (int d = 0; d < in0->ndim; d++) idims[1 + d] = in0->shape[d];
    }
    for (int d = 0; d + 1 < ond; d++) odims[1 + d] = m->nodes[m->output].shape[d];
    const char *input = ids ? "ids" : "input", *x = input;
    if (s == DT_OK && norm && norm->on && !ids) {
        const char *sub[2] = {x, scalar(&b, norm->mean)};
        x = out_of(ob_node(&b, "Sub", sub, 2, NULL));
        const char *div[2] = {x, scalar(&b, norm->std)};
        x = out_of(ob_node(&b, "Div", div, 2, NULL));
    }
    for (int i = 0; s == DT_OK && i < m->n; i++) {
        const dt_node *n = &m->nodes[i];
        if (n->input_index >= 0) val[i] = n->input_index == 0 ? x : NULL;
        else if (i != m->loss) s = onnx_op(&b, m, n, val, &val[i]);
    }
    if (s == DT_OK) {
        const char *last[1] = {val[m->output]};
        ob_node(&b, "Identity", last, 1, "logits");
        Onnx__ValueInfoProto *vin = value_info(&b, input, ids ? ONNX__TENSOR_PROTO__DATA_TYPE__INT32
                                                              : ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, idims, ind);
        Onnx__ValueInfoProto *vout = value_info(&b, "logits", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, odims, ond);
        Onnx__GraphProto g = ONNX__GRAPH_PROTO__INIT;
        Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT, *ops[1] = {&opset};
        Onnx__ModelProto mp = ONNX__MODEL_PROTO__INIT;
        opset.domain = "", opset.has_version = 1, opset.version = OPSET;
        g.name = ob_str(&b, "dtrain %s", m->spec);
        g.n_node = b.nn, g.node = b.nodes, g.n_initializer = b.ni, g.initializer = b.inits;
        g.n_input = 1, g.input = &vin, g.n_output = 1, g.output = &vout;
        mp.has_ir_version = 1, mp.ir_version = IR_VERSION, mp.n_opset_import = 1, mp.opset_import = ops;
        mp.producer_name = "dtrain", mp.producer_version = (char *)dt_onnx_producer_version, mp.graph = &g;
        if (b.failed || !vin || !vout) s = dt_error(DT_ENOMEM, "export %s: out of memory", path);
        else s = write_model(&mp, path);
    }
    for (size_t i = 0; i < b.nmem; i++) free(b.mem[i]);
    free(b.mem), free(b.nodes), free(b.inits), free(val);
    return s;
}
#endif
