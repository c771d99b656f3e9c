/* ONNX export (IR 8, opset 17) of a model graph, the protobuf written with protobuf-c from the
 * schema python3-onnx ships (generated into the build directory at build time). This file is the
 * file's framing: the graph's input (and --normalize's Sub/Div), its output, the model and opset
 * records, and the functions through which each op emits its own nodes (its onnx slot,
 * nn/interchange.h); parameters become initializers under their own names. Built without
 * protobuf-c (ONNX=0), dt_onnx_export says how to get it. */
#include "dtrain/io.h"

#include "nn/graph_internal.h"
#include "nn/interchange.h"
#include "run/writable.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef DT_HAVE_ONNX
dt_status dt_onnx_export(const dt_model *m, const char *path, const dt_input_norm *norm, int C, int H, int W) {
    (void)m, (void)norm, (void)C, (void)H, (void)W;
    return dt_error(DT_ENOTSUP,
                    "%s: built without ONNX export: install protobuf-c-compiler, libprotobuf-c-dev and "
                    "python3-onnx (scripts/install-deps) and rebuild",
                    path);
}
#else
#include "onnx.pb-c.h"

extern const char dt_onnx_producer_version[]; /* DTRAIN_VERSION (model_io.c: dtrain.h and the graph's
                                               * internals do not mix) */

enum { IR_VERSION = 8, OPSET = 17 };

/* The ONNX graph being built; every allocation is tracked and freed together. */
typedef struct {
    dt_onnx api; /* what the ops' onnx slots call (first: a dt_onnx * is an onnx_b *) */
    void **mem;
    size_t nmem, capmem;
    Onnx__NodeProto **nodes;
    size_t nn, capn;
    Onnx__TensorProto **inits;
    size_t ni, capi;
    bool failed;
    int tmp; /* counter of intermediate value names */
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

/* A node op(in[0..nin)) -> nout outputs, named "t<k>" in turn (the first `out` when given). */
static Onnx__NodeProto *ob_node_n(onnx_b *b, const char *op, const char *const *in, int nin, int nout,
                                  const char *out) {
    Onnx__NodeProto *n = ob_alloc(b, sizeof *n);
    char **ins = ob_alloc(b, sizeof(char *) * (size_t)nin), **outs = ob_alloc(b, sizeof(char *) * (size_t)nout);
    Onnx__NodeProto **nodes = grow(b->nodes, &b->capn, b->nn, sizeof *nodes);
    if (!n || !ins || !outs || !nodes) return b->failed = true, NULL;
    b->nodes = nodes;
    onnx__node_proto__init(n);
    for (int i = 0; i < nin; i++) ins[i] = (char *)in[i];
    for (int j = 0; j < nout; j++) outs[j] = out && j == 0 ? (char *)out : ob_str(b, "t%d", b->tmp++);
    n->op_type = (char *)op;
    n->name = ob_str(b, "%s_%zu", op, b->nn);
    n->n_input = (size_t)nin, n->input = ins, n->n_output = (size_t)nout, n->output = outs;
    b->nodes[b->nn++] = n;
    return n;
}
static Onnx__NodeProto *ob_node(onnx_b *b, const char *op, const char *const *in, int nin, const char *out) {
    return ob_node_n(b, op, in, nin, 1, out);
}
static const char *out_of(const Onnx__NodeProto *n) { return n ? n->output[0] : "?"; }

static Onnx__AttributeProto *ob_attr(onnx_b *b, Onnx__NodeProto *n, const char *name) {
    Onnx__AttributeProto *a = ob_alloc(b, sizeof *a),
                         **all = n ? ob_alloc(b, sizeof *all * (n->n_attribute + 1)) : NULL;
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
static const char *ob_init(onnx_b *b, const char *name, const int64_t *dims, int ndim, int elem_type, const void *data,
                           size_t bytes, dt_dev *dev) {
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
static const char *init_f32_on(onnx_b *b, const char *name, const int64_t *dims, int ndim, const float *v,
                               dt_dev *dev) {
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

/* ---- the functions ops emit their nodes with (dt_onnx, nn/interchange.h) ----------------- */

static onnx_b *ob_of(dt_onnx *o) { return (onnx_b *)(void *)o; }

static dt_onnx_node *api_node(dt_onnx *o, const char *op, const char *const *in, int nin, int nout) {
    return (dt_onnx_node *)ob_node_n(ob_of(o), op, in, nin, nout, NULL);
}
static const char *api_out(const dt_onnx_node *n, int j) {
    const Onnx__NodeProto *p = (const Onnx__NodeProto *)n;
    return p && (size_t)j < p->n_output ? p->output[j] : "?";
}
static void api_attr_i(dt_onnx *o, dt_onnx_node *n, const char *name, int64_t v) {
    if (n) attr_i(ob_of(o), (Onnx__NodeProto *)n, name, v);
}
static void api_attr_f(dt_onnx *o, dt_onnx_node *n, const char *name, float v) {
    if (n) attr_f(ob_of(o), (Onnx__NodeProto *)n, name, v);
}
static void api_attr_ints(dt_onnx *o, dt_onnx_node *n, const char *name, const int64_t *v, int k) {
    if (n) attr_ints(ob_of(o), (Onnx__NodeProto *)n, name, v, k);
}
static const char *api_const_f32(dt_onnx *o, const char *prefix, const int64_t *dims, int ndim, const float *v) {
    onnx_b *b = ob_of(o);
    return init_f32(b, ob_str(b, "%s_%d", prefix, b->tmp++), dims, ndim, v);
}
static const char *api_const_i64(dt_onnx *o, const char *prefix, const int64_t *v, int n) {
    onnx_b *b = ob_of(o);
    return init_i64(b, ob_str(b, "%s_%d", prefix, b->tmp++), v, n);
}
static const char *scalar(onnx_b *b, float v) { return api_const_f32(&b->api, "const", NULL, 0, &v); }

/* The initializer of tensor k of node n (under the tensor's name; a tied tensor is emitted once,
 * by its first user), with its own dims or, when ndim > 0, dims[0..ndim): downloaded from the
 * model's device into the initializer (the host never reads model memory in place). */
static const char *api_param(dt_onnx *o, const dt_model *m, const dt_node *n, int k, const int64_t *dims, int ndim) {
    onnx_b *b = ob_of(o);
    const dt_param_info *p = &m->tensors[n->tensor[k]];
    for (size_t i = 0; i < b->ni; i++)
        if (!strcmp(b->inits[i]->name, p->name)) return b->inits[i]->name;
    const float *data = (p->is_buffer ? m->buffers.data : m->params.data) + p->offset;
    return init_f32_on(b, p->name, ndim ? dims : p->shape, ndim ? ndim : p->ndim, data, m->dev);
}

static const dt_onnx g_api = {.node = api_node,
                              .out = api_out,
                              .attr_i = api_attr_i,
                              .attr_f = api_attr_f,
                              .attr_ints = api_attr_ints,
                              .const_f32 = api_const_f32,
                              .const_i64 = api_const_i64,
                              .param = api_param};

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
        if (dims[d] < 0)
            dv[d]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM, dv[d]->dim_param = "N";
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
    char path[4096]; /* named, or the file a symbolic link named leads to */
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
    onnx_b b = {.api = g_api};
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
        else if (i != m->loss) s = dt_onnx_node_emit(&b.api, m, i, val, &val[i]);
    }
    if (s == DT_OK) {
        const char *last[1] = {val[m->output]};
        ob_node(&b, "Identity", last, 1, "logits");
        Onnx__ValueInfoProto *vin = value_info(
            &b, input, ids ? ONNX__TENSOR_PROTO__DATA_TYPE__INT32 : ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, idims, ind);
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
