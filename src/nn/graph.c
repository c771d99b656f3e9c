/* The graph: building (inputs and nodes in topological order, shape inference by each op,
 * sticky errors), the slab layout of parameters and buffers, seeded initialisation and the
 * accessors of include/dtrain/nn.h. Running it is graph_run.c. */
#include "nn/graph_parallel.h"
#include "nn/graph_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_graph_create(dt_model **out) {
    *out = NULL;
    dt_model *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ENOMEM, "model: out of memory");
    m->output = m->loss = -1;
    m->be = m->be_cpu = dt_backend_default();
    m->dev = dt_device_cpu();
    *out = m;
    return DT_OK;
}

dt_status dt_graph_fail(dt_model *m, const dt_node *n, const char *fmt, ...) {
    if (m->err != DT_OK) return m->err;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n) snprintf(m->errmsg, sizeof m->errmsg, "model: node '%s' (%s): %s", n->name, n->op ? n->op->name : "?", msg);
    else snprintf(m->errmsg, sizeof m->errmsg, "model: %s", msg);
    m->err = DT_EINVAL;
    return dt_error(DT_EINVAL, "%s", m->errmsg);
}

/* A new node slot, or NULL (error set). */
static dt_node *new_node(dt_model *m, const char *name) {
    if (m->finished) {
        dt_graph_fail(m, NULL, "node '%s' added after dt_graph_finish", name ? name : "");
        return NULL;
    }
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 32;
        dt_node *nn = realloc(m->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            m->err = dt_error(DT_ENOMEM, "model: out of memory");
            return NULL;
        }
        m->nodes = nn, m->cap = cap;
    }
    dt_node *n = &m->nodes[m->n];
    memset(n, 0, sizeof *n);
    n->id = m->n;
    n->layer = m->n;
    n->input_index = -1;
    n->fused_pool = -1;
    snprintf(n->name, sizeof n->name, "%s", name && *name ? name : "");
    if (!n->name[0]) snprintf(n->name, sizeof n->name, "%d", n->id);
    return n;
}

int dt_graph_input(dt_model *m, const char *name, dt_dtype dtype, int ndim, const int *shape) {
    if (m->err != DT_OK) return -1;
    dt_node *n = new_node(m, name);
    if (!n) return -1;
    n->a = dt_layer_default(DT_LAYER_INPUT);
    n->op = dt_op_of(DT_LAYER_INPUT);
    if (dtype != DT_F32 && dtype != DT_I32)
        return dt_graph_fail(m, n, "inputs are f32 or i32, not %s", dt_dtype_name(dtype)), -1;
    if (ndim < 0 || ndim > 4) return dt_graph_fail(m, n, "%d dims (0..4 per sample)", ndim), -1;
    if (m->ninputs == DT_GRAPH_MAX_INPUTS) return dt_graph_fail(m, n, "more than %d inputs", DT_GRAPH_MAX_INPUTS), -1;
    n->dtype = dtype, n->ndim = ndim, n->out_n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0) return dt_graph_fail(m, n, "dim %d is %d (must be positive)", i, shape[i]), -1;
        n->shape[i] = shape[i];
        n->out_n *= (size_t)shape[i];
    }
    n->input_index = m->ninputs;
    m->inputs[m->ninputs++] = n->id;
    return m->n++;
}

int dt_graph_node(dt_model *m, const char *name, const dt_layer_spec *spec, int layer, const int *inputs, int nin) {
    if (m->err != DT_OK) return -1;
    dt_node *n = new_node(m, name);
    if (!n) return -1;
    n->a = *spec;
    n->op = dt_op_of(spec->kind);
    if (layer >= 0) n->layer = layer;
    if (!n->op || spec->kind == DT_LAYER_INPUT) return dt_graph_fail(m, n, "unknown op kind %d", (int)spec->kind), -1;
    if (nin < n->op->min_in || nin > n->op->max_in)
        return dt_graph_fail(m, n, "takes %d..%d inputs, given %d", n->op->min_in, n->op->max_in, nin), -1;
    for (int j = 0; j < nin; j++) {
        if (inputs[j] < 0 || inputs[j] >= m->n)
            return dt_graph_fail(m, n, "input %d names node %d, which does not exist (yet)", j, inputs[j]), -1;
        n->in[j] = inputs[j];
    }
    n->nin = nin;
    if (n->op->infer(m, n) != DT_OK || m->err != DT_OK) return -1;
    for (int j = 0; j < nin; j++) m->nodes[inputs[j]].consumers++;
    return m->n++;
}

int dt_graph_declare(dt_model *m, dt_node *n, const char *suffix, bool buffer, int ndim, const int64_t *shape) {
    if (n->ntensor == DT_NODE_MAX_TENSORS) return dt_graph_fail(m, n, "too many tensors"), -1;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= (size_t)shape[i];
    if (n->a.tie && !buffer && !strcmp(suffix, "weight")) {
        int t = dt_model_find_tensor(m, n->a.tie);
        if (t < 0) return dt_graph_fail(m, n, "tied weight '%s' does not exist", n->a.tie), -1;
        const dt_param_info *p = &m->tensors[t];
        bool same = p->ndim == ndim && !p->is_buffer;
        for (int i = 0; same && i < ndim; i++) same = p->shape[i] == shape[i];
        if (!same) return dt_graph_fail(m, n, "tied weight '%s' has another shape", n->a.tie), -1;
        n->tensor[n->ntensor++] = t;
        return t;
    }
    if (m->ntensors == m->tensors_cap) {
        int cap = m->tensors_cap ? 2 * m->tensors_cap : 64;
        dt_param_info *t = realloc(m->tensors, (size_t)cap * sizeof *t);
        if (!t) return (m->err = dt_error(DT_ENOMEM, "model: out of memory")), -1;
        m->tensors = t, m->tensors_cap = cap;
    }
    dt_param_info *t = &m->tensors[m->ntensors];
    memset(t, 0, sizeof *t);
    if (snprintf(t->name, sizeof t->name, "%s.%s", n->name, suffix) >= (int)sizeof t->name)
        return dt_graph_fail(m, n, "tensor name longer than %zu characters", sizeof t->name - 1), -1;
    t->is_buffer = buffer;
    t->layer = n->layer;
    t->numel = numel;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    n->tensor[n->ntensor++] = m->ntensors;
    return m->ntensors++;
}

/* relu directly before a maxpool (its only consumer, not the output): the pool runs first and
 * applies the relu to its 4x smaller output (identical values and gradients: relu is monotone) */
static void fuse_relu_maxpool(dt_model *m) {
    for (int i = 0; i < m->n; i++) {
        dt_node *p = &m->nodes[i];
        if (p->a.kind != DT_LAYER_MAXPOOL2D || i == m->output) continue;
        dt_node *r = &m->nodes[p->in[0]];
        if (r->a.kind == DT_LAYER_RELU && r->consumers == 1 && r->id != m->output) r->alias = p->fused_relu = true;
    }
}

/* Offsets (params and buffers in declaration order), the last user of each tensor, which nodes
 * need gradients, and the scratch gradients a node with a shared input needs. */
static dt_status layout(dt_model *m) {
    size_t np = 0, nb = 0;
    for (int t = 0; t < m->ntensors; t++) {
        dt_param_info *p = &m->tensors[t];
        p->offset = p->is_buffer ? nb : np;
        *(p->is_buffer ? &nb : &np) += p->numel;
    }
    if (!(m->last_user = calloc(m->ntensors > 0 ? (size_t)m->ntensors : 1u, sizeof(int))))
        return dt_error(DT_ENOMEM, "model: out of memory");
    for (int t = 0; t < m->ntensors; t++) m->last_user[t] = -1;
    for (int k = 0; k < m->ninputs; k++) m->first_reader[k] = m->n;
    for (int i = 0; i < m->n; i++) {
        dt_node *n = &m->nodes[i];
        bool has_params = false;
        for (int k = 0; k < n->ntensor; k++) { /* backward runs in reverse: the first user is the last there */
            if (m->last_user[n->tensor[k]] < 0) m->last_user[n->tensor[k]] = i;
            has_params |= !m->tensors[n->tensor[k]].is_buffer;
        }
        n->needs_grad = has_params;
        for (int j = 0; j < n->nin; j++) {
            const dt_node *in = &m->nodes[n->in[j]];
            n->needs_grad |= in->needs_grad;
            if (in->input_index >= 0 && m->first_reader[in->input_index] > i) m->first_reader[in->input_index] = i;
        }
        int shared = 0;
        for (int j = 0; j < n->nin; j++) shared += m->nodes[n->in[j]].consumers > 1 || (j && n->in[j] == n->in[0]);
        if (shared > m->nscratch) m->nscratch = shared;
    }
    fuse_relu_maxpool(m);
    DT_TRY(dt_graph_plan_layouts(m, m->dev));
    dt_graph_fuse_conv_pool(m);
    dt_graph_plan_bf16(m);
    DT_TRY(dt_slab_reserve(&m->params, np));
    DT_TRY(dt_slab_reserve(&m->grads, np));
    DT_TRY(dt_slab_init(&m->buffers, nb ? nb : 1));
    m->buffers.n = nb;
    return DT_OK;
}

dt_status dt_graph_finish(dt_model *m, int output, int loss, const char *spec) {
    if (m->err != DT_OK) return dt_error(m->err, "%s", m->errmsg);
    if (output < 0 || output >= m->n)
        return dt_graph_fail(m, NULL, "output node %d is not a node of the graph (it has %d)", output, m->n);
    if (m->nodes[output].input_index >= 0)
        return dt_graph_fail(m, &m->nodes[output], "a graph input cannot be the output; add a node after it");
    if (loss >= 0) {
        if (loss >= m->n || (m->nodes[loss].a.kind != DT_LAYER_XENT && m->nodes[loss].a.kind != DT_LAYER_MSE))
            return dt_graph_fail(m, NULL, "loss node %d is not an xent or mse node", loss);
        if (m->nodes[loss].in[0] != output)
            return dt_graph_fail(m, &m->nodes[loss], "its first input must be the output node '%s'",
                                 m->nodes[output].name);
    }
    if (m->ninputs == 0 || m->nodes[m->inputs[0]].id != m->inputs[0])
        return dt_graph_fail(m, NULL, "the graph has no input");
    m->output = output, m->loss = loss;
    snprintf(m->spec, sizeof m->spec, "%s", spec ? spec : "");
    dt_status s = layout(m);
    if (s == DT_OK && !m->defer_place) s = dt_model_place(m, NULL, 0);
    if (s != DT_OK) return s;
    for (int i = 0; i < m->n; i++) /* batchnorm running_var starts at 1 */
        if (m->nodes[i].a.kind == DT_LAYER_BATCHNORM2D) {
            const dt_param_info *rv = &m->tensors[m->nodes[i].tensor[3]];
            m->dev->ops->fill_f32(m->dev, m->buffers.data + rv->offset, 1.0f, rv->numel);
        }
    m->finished = true;
    return DT_OK;
}

void dt_graph_defer_placement(dt_model *m) { m->defer_place = true; }

/* Whether node i declares parameter tensors and none of them is placed (its init would only
 * write memory this process does not hold). */
static bool declares_none_placed(const dt_model *m, int i) {
    const dt_node *n = &m->nodes[i];
    bool declares = false;
    for (int k = 0; k < n->ntensor; k++) {
        if (m->last_user[n->tensor[k]] != i || m->tensors[n->tensor[k]].is_buffer) continue;
        if (dt_model_tensor_placed(m, n->tensor[k])) return false;
        declares = true;
    }
    return declares;
}

/* Gives back the pages node i's init wrote outside the placed ranges: a tensor only partly
 * placed (a ZeRO shard cuts it) is initialised whole, as on one worker, and keeps its placed part. */
static void discard_unplaced(dt_model *m, int i) {
    const dt_node *n = &m->nodes[i];
    for (int k = 0; k < n->ntensor; k++) {
        const dt_param_info *p = &m->tensors[n->tensor[k]];
        if (p->is_buffer || m->last_user[n->tensor[k]] != i) continue;
        size_t at = p->offset;
        const size_t end = p->offset + p->numel;
        for (int r = 0; r <= m->nown && at < end; r++) { /* the ranges are in slab order */
            size_t lo = r < m->nown ? m->own[r].lo : end;
            if (lo > end) lo = end;
            if (lo > at) dt_mem_discard(m->params.data + at, (lo - at) * sizeof(float));
            if (r < m->nown && m->own[r].hi > at) at = m->own[r].hi;
        }
    }
}

/* dt_model_init of a model on a device whose memory the host cannot touch: the same values
 * (each node's init, host Philox) written into a host copy of the parameter slab, uploaded. */
static void init_on_device(dt_model *m, uint64_t seed) {
    const size_t bytes = m->params.n * sizeof(float);
    float *host = dt_alloc(bytes ? bytes : sizeof(float));
    if (!host) { /* dt_model_init returns nothing: the parameters stay as they were (zeros) */
        dt_error_clear();
        m->err = dt_error(DT_ENOMEM, "model: no host memory for the %zu-byte initial values of the parameters", bytes);
        return;
    }
    m->dev->ops->download(m->dev, host, m->params.data, bytes);
    for (int i = 0; i < m->n; i++)
        if (m->nodes[i].op->init) m->nodes[i].op->init(m, &m->nodes[i], host, seed);
    m->dev->ops->upload(m->dev, m->params.data, host, bytes);
    dt_free(host);
}

void dt_model_init(dt_model *m, uint64_t seed) {
    m->seed = seed;
    if (m->dev_slabs) {
        init_on_device(m, seed);
        return;
    }
    for (int i = 0; i < m->n; i++) {
        dt_node *n = &m->nodes[i];
        if (!n->op->init || declares_none_placed(m, i)) continue;
        n->op->init(m, n, m->params.data, seed);
        if (m->own) discard_unplaced(m, i);
    }
}

bool dt_model_tensor_placed(const dt_model *m, int t) {
    const dt_param_info *p = &m->tensors[t];
    if (p->is_buffer || !m->own) return true;
    for (int i = 0; i < m->nown; i++)
        if (m->own[i].lo < p->offset + p->numel && p->offset < m->own[i].hi) return true;
    return false;
}

const dt_range *dt_model_placement(const dt_model *m, int *nown) {
    *nown = m->nown;
    return m->own;
}

dt_status dt_model_tensor_ranges(const dt_model *m, const bool *keep, dt_range **own, int *nown) {
    *own = NULL, *nown = 0;
    dt_range *r = malloc(((size_t)m->ntensors + 1) * sizeof *r);
    if (!r) return dt_error(DT_ENOMEM, "model: out of memory");
    int n = 0;
    for (int t = 0; t < m->ntensors; t++) { /* parameter offsets increase in table order */
        const dt_param_info *p = &m->tensors[t];
        if (p->is_buffer || !keep[t] || p->numel == 0) continue;
        if (n && r[n - 1].hi == p->offset) r[n - 1].hi += p->numel;
        else r[n++] = (dt_range){p->offset, p->offset + p->numel};
    }
    if (n == 0) free(r), r = NULL;
    *own = r, *nown = n;
    return DT_OK;
}

dt_status dt_model_place(dt_model *m, const dt_range *own, int nown) {
    if (m->dev_slabs && own) /* the slabs are whole device blocks */
        return dt_error(DT_ENOTSUP,
                        "model: placing a part of the parameters (ZeRO, pipeline or tensor parallel) on "
                        "device %s is not device-neutral yet: use `device` cpu",
                        m->dev->kind->name);
    if (m->dev_slabs) return DT_OK;
    dt_range *copy = NULL;
    if (own && !(copy = malloc(((size_t)nown + 1) * sizeof *copy))) return dt_error(DT_ENOMEM, "model: out of memory");
    if (own) memcpy(copy, own, (size_t)nown * sizeof *copy);
    const bool was_placed = m->params.placed > 0;
    dt_status s = dt_slab_place(&m->params, own, nown, "placing the model's parameters");
    if (s != DT_OK) return free(copy), s;
    if ((s = dt_slab_place(&m->grads, own, nown, "placing the model's gradients")) != DT_OK) {
        /* the parameters as they were: narrowing back, or nothing placed, fits (and keeps the error) */
        const dt_range none = {0, 0};
        (void)dt_slab_place(&m->params, was_placed ? m->own : &none, was_placed ? m->nown : 0, "");
        free(copy);
        return s;
    }
    free(m->own);
    m->own = copy, m->nown = own ? nown : 0;
    return DT_OK;
}

dt_status dt_model_init_tensor(dt_model *m, int t, float *out) {
    const dt_param_info *p = &m->tensors[t];
    float *base = p->is_buffer ? m->buffers.data : m->params.data;
    const int d = m->last_user[t];
    dt_node *n = &m->nodes[d];
    if (p->is_buffer || dt_model_tensor_placed(m, t) || !n->op->init) { /* what it holds (zeros: no init) */
        m->dev->ops->download(m->dev, out, base + p->offset, p->numel * sizeof(float));
        return DT_OK;
    }
    size_t lo = p->offset, hi = p->offset + p->numel; /* the span of the node's own tensors */
    for (int k = 0; k < n->ntensor; k++) {
        const dt_param_info *q = &m->tensors[n->tensor[k]];
        if (q->is_buffer || m->last_user[n->tensor[k]] != d) continue;
        if (q->offset < lo) lo = q->offset;
        if (q->offset + q->numel > hi) hi = q->offset + q->numel;
    }
    DT_TRY(dt_mem_charge((hi - lo) * sizeof(float), "initialising a tensor"));
    n->op->init(m, n, m->params.data, m->seed);
    m->dev->ops->download(m->dev, out, base + p->offset, p->numel * sizeof(float));
    dt_mem_discard(m->params.data + lo, (hi - lo) * sizeof(float));
    dt_mem_uncharge((hi - lo) * sizeof(float));
    return DT_OK;
}

/* A slab of n floats (at least one) in device memory, zeroed, or from a host slab's values. */
static float *device_slab(dt_dev *d, const dt_slab *from, bool copy, size_t n) {
    float *p = d->ops->alloc(d, (n ? n : 1) * sizeof(float));
    if (!p) return NULL;
    d->ops->fill_f32(d, p, 0.0f, n ? n : 1);
    if (copy && n) d->ops->upload(d, p, from->data, n * sizeof(float));
    return p;
}

dt_status dt_model_set_device(dt_model *m, dt_dev *d) {
    if (!m->finished) return dt_error(DT_EINVAL, "model: set its device after dt_graph_finish");
    if (d == m->dev) return DT_OK;
    if (m->dev_slabs || m->cap_B > 0 || m->own)
        return dt_error(DT_EINVAL,
                        "model: moving to device %s after it ran, was placed in parts or moved already: "
                        "set the device right after building it",
                        d->kind->name);
    const dt_kernel_table *be = d->ops->kernels(d, m->be_cpu);
    if (!be) return dt_error_wrap(DT_ENOTSUP, "model: device %s", d->kind->name);
    m->be = be;
    DT_TRY(dt_graph_plan_layouts(m, d)); /* the new device's plan for its table */
    dt_graph_fuse_conv_pool(m);
    dt_graph_plan_bf16(m);
    if (d->host_memory) {
        m->dev = d;
        return DT_OK;
    }
    const bool placed = m->params.placed > 0 || !m->params.reserved;
    float *p = device_slab(d, &m->params, placed, m->params.n),
          *g = p ? device_slab(d, &m->grads, false, m->grads.n) : NULL;
    float *b = g ? device_slab(d, &m->buffers, true, m->buffers.n) : NULL;
    if (!b) {
        d->ops->free(d, p), d->ops->free(d, g);
        return dt_error_wrap(DT_ENOMEM, "model: its %zu parameters on device %s", m->params.n, d->kind->name);
    }
    const size_t np = m->params.n, nb = m->buffers.n;
    dt_slab_free(&m->params), dt_slab_free(&m->grads), dt_slab_free(&m->buffers);
    m->params = (dt_slab){.data = p, .n = np}, m->grads = (dt_slab){.data = g, .n = np};
    m->buffers = (dt_slab){.data = b, .n = nb};
    m->dev = d, m->dev_slabs = true;
    return DT_OK;
}

dt_status dt_model_adopt_device(dt_model *m, dt_dev *d) {
    DT_TRY(dt_model_set_device(m, d));
    m->owns_dev = d != dt_device_cpu();
    return DT_OK;
}

dt_dev *dt_model_device(const dt_model *m) { return m->dev; }

const char *dt_model_spec(const dt_model *m) { return m->spec; }
int dt_model_in_size(const dt_model *m) { return (int)m->nodes[m->inputs[0]].out_n; }
int dt_model_input_values(const dt_model *m, int k) {
    return k >= 0 && k < m->ninputs ? (int)m->nodes[m->inputs[k]].out_n : 0;
}
dt_dtype dt_model_in_dtype(const dt_model *m) { return m->nodes[m->inputs[0]].dtype; }
int dt_model_out_size(const dt_model *m) { return (int)m->nodes[m->output].out_n; }
int dt_model_classes(const dt_model *m) { return dt_shape_last(&m->nodes[m->output]); }
size_t dt_model_num_params(const dt_model *m) { return m->params.n; }
size_t dt_model_num_buffers(const dt_model *m) { return m->buffers.n; }
float *dt_model_params(dt_model *m) { return m->params.data; }
float *dt_model_grads(dt_model *m) { return m->grads.data; }
float *dt_model_buffers(dt_model *m) { return m->buffers.data; }
int dt_model_num_tensors(const dt_model *m) { return m->ntensors; }
const dt_param_info *dt_model_tensor(const dt_model *m, int i) { return &m->tensors[i]; }
void dt_model_zero_grad(dt_model *m) {
    if (!m->grads.data) return;
    if (!m->own) m->dev->ops->fill_f32(m->dev, m->grads.data, 0.0f, m->grads.n);
    for (int i = 0; m->own && i < m->nown; i++)
        m->dev->ops->fill_f32(m->dev, m->grads.data + m->own[i].lo, 0.0f, m->own[i].hi - m->own[i].lo);
}
void dt_model_release_grads(dt_model *m) {
    if (m->dev_slabs) m->dev->ops->free(m->dev, m->grads.data), m->grads = (dt_slab){0};
    dt_slab_free(&m->grads);
}
static dt_status bind_tables(dt_model *m) {
    if (m->bound_p) return DT_OK;
    m->bound_p = calloc((size_t)m->ntensors + 1, sizeof *m->bound_p);
    m->bound_g = calloc((size_t)m->ntensors + 1, sizeof *m->bound_g);
    if (m->bound_p && m->bound_g) return DT_OK;
    free(m->bound_p), free(m->bound_g);
    m->bound_p = m->bound_g = NULL;
    return dt_error(DT_ENOMEM, "model: out of memory for the tensor bindings");
}
dt_status dt_model_bind_param(dt_model *m, int t, float *p) {
    DT_TRY(bind_tables(m));
    m->bound_p[t] = p;
    return DT_OK;
}
dt_status dt_model_bind_grad(dt_model *m, int t, float *g) {
    DT_TRY(bind_tables(m));
    m->bound_g[t] = g;
    return DT_OK;
}
float *dt_model_tensor_grad(dt_model *m, int t) {
    if (m->bound_g && m->bound_g[t]) return m->bound_g[t];
    return m->grads.data ? m->grads.data + m->tensors[t].offset : NULL;
}
float *dt_model_take_params(dt_model *m) {
    if (!m->dev_slabs) return NULL;
    float *p = m->params.data;
    m->params.data = NULL;
    return p;
}
void dt_model_put_params(dt_model *m, float *p) {
    if (m->dev_slabs) m->params.data = p;
}
int dt_model_num_nodes(const dt_model *m) { return m->n; }
const char *dt_model_node_name(const dt_model *m, int node) { return m->nodes[node].name; }
dt_layer_kind dt_model_node_kind(const dt_model *m, int node) { return m->nodes[node].a.kind; }
int dt_model_output_node(const dt_model *m) { return m->output; }
int dt_model_node_input(const dt_model *m, int node, int j) {
    return node >= 0 && node < m->n && j >= 0 && j < m->nodes[node].nin ? m->nodes[node].in[j] : -1;
}
int dt_model_input_shape(const dt_model *m, int shape[4]) {
    const dt_node *x = &m->nodes[m->inputs[0]];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    return x->ndim;
}

dt_status dt_model_mark_tp(dt_model *m, int node, dt_tp_mark mark, int parts) {
    if (node < 0 || node >= m->n)
        return dt_error(DT_EINVAL, "model: tensor-parallel mark on node %d: the model has nodes 0..%d", node, m->n - 1);
    if (mark < DT_TP_MARK_NONE || mark > DT_TP_MARK_VOCAB || (parts != 1 && parts != 3) ||
        (parts == 3 && mark != DT_TP_MARK_COLUMN))
        return dt_error(DT_EINVAL,
                        "model: node '%s': tensor-parallel mark %d with %d parts (need a dt_tp_mark; parts "
                        "1, or 3 for a fused q,k,v column-parallel node)",
                        m->nodes[node].name, (int)mark, parts);
    m->nodes[node].tp_mark = (unsigned char)mark, m->nodes[node].tp_parts = (unsigned char)parts;
    return DT_OK;
}
dt_tp_mark dt_model_node_tp(const dt_model *m, int node, int *parts) {
    if (parts) *parts = m->nodes[node].tp_parts ? m->nodes[node].tp_parts : 1;
    return (dt_tp_mark)m->nodes[node].tp_mark;
}
bool dt_model_has_tp_marks(const dt_model *m) {
    for (int i = 0; i < m->n; i++)
        if (m->nodes[i].tp_mark) return true;
    return false;
}
int dt_model_loss_node(const dt_model *m) { return m->loss; }
const float *dt_model_output(const dt_model *m) { return m->nodes[m->output].out; }
void dt_model_read_output(const dt_model *m, size_t first, size_t n, float *host) {
    m->dev->ops->download(m->dev, host, m->nodes[m->output].out + first, n * sizeof(float));
}

int dt_model_find_tensor(const dt_model *m, const char *name) {
    for (int t = 0; t < m->ntensors; t++)
        if (!strcmp(m->tensors[t].name, name)) return t;
    return -1;
}

void dt_model_set_node_hooks(dt_model *m, dt_node_hook_fn before_forward, dt_node_hook_fn after_backward, void *ctx) {
    m->before_forward = before_forward, m->after_backward = after_backward, m->hook_ctx = ctx;
}

void dt_model_set_after_forward_hook(dt_model *m, dt_node_hook_fn after_forward, void *ctx) {
    m->after_forward = after_forward, m->after_forward_ctx = ctx;
}

void dt_model_set_backward_hook(dt_model *m, dt_node_hook_fn before_backward) { m->before_backward = before_backward; }

void dt_model_node_hooks(const dt_model *m, dt_node_hook_fn *before_forward, dt_node_hook_fn *after_backward,
                         dt_node_hook_fn *before_backward, void **ctx) {
    *before_forward = m->before_forward, *after_backward = m->after_backward;
    *before_backward = m->before_backward, *ctx = m->hook_ctx;
}

int dt_model_node_tensors(const dt_model *m, int node, int *idx, int cap) {
    if (node < 0 || node >= m->n) return 0;
    const dt_node *n = &m->nodes[node];
    for (int k = 0; k < n->ntensor && k < cap; k++) idx[k] = n->tensor[k];
    return n->ntensor;
}
