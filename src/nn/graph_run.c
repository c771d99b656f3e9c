/* Running the graph: activation memory per batch size, the forward pass in node order and the
 * backward pass in reverse. Where a node's values feed several nodes, the first gradient written
 * (in backward order) overwrites and the others accumulate through a scratch buffer; a tied
 * tensor's gradient is reported final (grad-ready hook) after its last user's backward. */
#include "nn/graph_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The node whose memory holds n's values and gradient (follows aliases). */
static dt_node *owner(dt_model *m, dt_node *n) {
    while (n->alias) n = &m->nodes[n->in[0]];
    return n;
}

/* Whether the input nodes hold device memory the feed is uploaded into (a device whose memory
 * is not the host's); on the host they point at the fed memory. */
static bool inputs_uploaded(const dt_model *m) { return !m->dev->host_memory; }

static void free_activations(dt_model *m) {
    dt_dev *d = m->dev;
    for (int i = 0; i < m->n; i++) {
        dt_node *n = &m->nodes[i];
        if ((n->input_index < 0 || inputs_uploaded(m)) && !n->alias) d->ops->free(d, n->out);
        d->ops->free(d, n->grad);
        d->ops->free(d, n->saved);
        n->out = n->grad = NULL, n->saved = NULL;
    }
    for (int k = 0; k < DT_NODE_MAX_IN; k++) d->ops->free(d, m->scratch[k]), m->scratch[k] = NULL;
    d->ops->free(d, m->work);
    m->work = NULL;
    m->cap_B = 0;
}

void dt_model_destroy(dt_model *m) {
    if (!m) return;
    if (m->nodes) free_activations(m);
    free(m->nodes);
    free(m->tensors);
    free(m->last_user);
    free(m->own);
    free(m->bound_p), free(m->bound_g);
    if (m->dev_slabs) {
        m->dev->ops->free(m->dev, m->params.data), m->dev->ops->free(m->dev, m->grads.data);
        m->dev->ops->free(m->dev, m->buffers.data);
    } else {
        dt_slab_free(&m->params);
        dt_slab_free(&m->grads);
        dt_slab_free(&m->buffers);
    }
    if (m->dev_correct) m->dev->ops->free(m->dev, m->dev_correct);
    if (m->owns_dev) dt_device_destroy(m->dev); /* every block of it freed above */
    free(m);
}

/* What ensure_batch gives node n at batch B, in bytes (0: nothing), and its workspace in floats.
 * A value or gradient stored bf16 (dt_node.bf16, grad_bf16) has the 4 bytes of an f32 one as
 * well, of which it fills the first half: a pipeline sends, receives and copies a node's values
 * and gradient as B * out_n floats (pp_step.c, pp_eval.c, dt_model_backward_nodes). */
typedef struct {
    size_t vals, grad, saved, work;
} node_mem;

static node_mem node_mem_of(const dt_model *m, const dt_node *n, int B) {
    node_mem r = {0, 0, 0, 0};
    if (n->input_index >= 0 && inputs_uploaded(m)) r.vals = (size_t)B * n->out_n * DT_FEED_VALUE_BYTES;
    if (n->input_index >= 0 || n->alias) return r; /* the fed memory (or the batch's upload); the owner's */
    if (n->fused_pool < 0) r.vals = (size_t)B * n->out_n * sizeof(float); /* else never written (graph_fuse.c) */
    r.grad = n->needs_grad ? r.vals : 0;
    r.saved = n->op->saved_bytes ? n->op->saved_bytes(m, n, B) : 0;
    r.work = n->op->workspace ? n->op->workspace(m, n, B) : 0;
    return r;
}

/* (Re)allocates activation memory for batch B. */
static dt_status ensure_batch(dt_model *m, int B) {
    if (B <= m->cap_B) return DT_OK;
    free_activations(m);
    dt_dev *d = m->dev;
    size_t work = 0, maxact = 0;
    for (int i = 0; i < m->n; i++) {
        dt_node *n = &m->nodes[i];
        const node_mem r = node_mem_of(m, n, B);
        if (r.vals > maxact && n->input_index < 0) maxact = r.vals;
        if (r.vals && !(n->out = d->ops->alloc(d, r.vals))) goto oom;
        if (r.grad && !(n->grad = d->ops->alloc(d, r.grad))) goto oom;
        if (r.saved && !(n->saved = d->ops->alloc(d, r.saved))) goto oom;
        if (r.work > work) work = r.work;
    }
    for (int k = 0; k < m->nscratch; k++)
        if (!(m->scratch[k] = d->ops->alloc(d, maxact))) goto oom;
    if (work && !(m->work = d->ops->alloc(d, work * sizeof(float)))) goto oom;
    m->work_n = work, m->scratch_n = maxact / sizeof(float);
    m->cap_B = B;
    return DT_OK;
oom:
    free_activations(m);
    if (dt_mem_limit_hit()) return dt_error_wrap(DT_ENOMEM, "model: activations for batch %d", B);
    return dt_error(DT_ENOMEM, "model: cannot allocate activations for batch %d", B);
}

/* The bytes dt_alloc holds for a block of `bytes` (0: none allocated). */
static size_t held(size_t bytes) { return bytes ? dt_alloc_size(bytes) : 0; }

size_t dt_model_activation_bytes(const dt_model *m, int B) {
    size_t bytes = 0, work = 0, maxact = 0;
    for (int i = 0; i < m->n; i++) { /* the blocks ensure_batch allocates */
        const node_mem r = node_mem_of(m, &m->nodes[i], B);
        if (r.vals > maxact && m->nodes[i].input_index < 0) maxact = r.vals;
        bytes += held(r.vals) + held(r.grad) + held(r.saved);
        if (r.work > work) work = r.work;
    }
    return bytes + (size_t)m->nscratch * dt_alloc_size(maxact) + held(work * sizeof(float));
}

static dt_run_ctx run_ctx(const dt_model *m) {
    return (dt_run_ctx){.be = m->be,
                        .dev = m->dev,
                        .B = m->B,
                        .train = m->train,
                        .step = m->step,
                        .seed = m->seed,
                        .params = m->params.data,
                        .grads = m->grads.data,
                        .buffers = m->buffers.data,
                        .work = m->work};
}

/* Where a strategy binds tensors (m->bound_p: ZeRO on a device), node n runs only if each of its
 * parameters (and in backward, gradients) has memory: a hook that could not gather or make a
 * block (out of device memory) leaves it in none, and the op would read through NULL. */
static dt_status check_bound(const dt_model *m, const dt_node *n, bool grads) {
    for (int k = 0; k < n->ntensor; k++) {
        const int t = n->tensor[k];
        if (m->tensors[t].is_buffer) continue;
        if ((m->bound_p[t] || m->params.data) && (!grads || m->bound_g[t] || m->grads.data)) continue;
        return dt_error(DT_ENOMEM,
                        "model: node '%s' cannot run: its tensor '%s' has no %s in device memory (the "
                        "strategy could not place them; with `mem_limit`, see `dry_run`)",
                        n->name, m->tensors[t].name, grads ? "parameters or gradients" : "parameters");
    }
    return DT_OK;
}

/* A kernel of node n that could not run (backend.h: dt_kernel_fail) fails the step, naming n. */
static dt_status kernel_status(const dt_node *n) {
    char why[192];
    if (!dt_kernel_error_take(why, sizeof why)) return DT_OK;
    return dt_error(DT_ENOMEM, "model: node '%s': its kernel could not run: %s (lower `batch` or free memory)", n->name,
                    why);
}

/* Forward of nodes [lo, hi); input nodes hold their fed memory (bind_feed), aliases their input's. */
static dt_status forward_range(dt_model *m, int lo, int hi) {
    const dt_run_ctx c = run_ctx(m);
    for (int i = lo; i < hi; i++) {
        dt_node *n = &m->nodes[i];
        if (n->input_index >= 0) continue;
        if (m->before_forward) m->before_forward(m->hook_ctx, i);
        if (n->alias) {
            n->out = owner(m, n)->out;
            continue;
        }
        dt_status s = m->bound_p ? check_bound(m, n, false) : DT_OK;
        if (s == DT_OK) s = n->op->forward(m, n, &c);
        if (s == DT_OK) s = kernel_status(n);
        if (s != DT_OK) return s;
        if (m->after_forward) m->after_forward(m->after_forward_ctx, i);
    }
    return DT_OK;
}

/* Points input 0 at f->x and input 1 at f->y (NULL: not fed), or uploads them into the input
 * nodes' device memory. */
static void bind_feed(dt_model *m, const dt_feed *f) {
    const void *feed[2] = {f->x, f->y};
    for (int k = 0; k < m->ninputs && k < 2; k++) {
        dt_node *in = &m->nodes[m->inputs[k]];
        m->feed_host[k] = feed[k];
        if (!inputs_uploaded(m)) in->out = (float *)feed[k];
        else if (feed[k]) m->dev->ops->upload(m->dev, in->out, feed[k], (size_t)f->n * in->out_n * DT_FEED_VALUE_BYTES);
    }
}

dt_status dt_model_prepare(dt_model *m, int B, bool train, uint64_t step) {
    if (!m->finished) return dt_error(DT_EINVAL, "model: dt_graph_finish was not called");
    if (B <= 0) return dt_error(DT_EINVAL, "model forward: batch %d must be positive", B);
    DT_TRY(ensure_batch(m, B));
    m->B = B, m->train = train, m->step = step;
    return DT_OK;
}

dt_status dt_model_run(dt_model *m, const dt_feed *f, bool train, uint64_t step, float *loss) {
    if (loss) *loss = NAN;
    DT_TRY(dt_model_prepare(m, f->n, train, step));
    const bool with_loss = m->loss >= 0 && f->y;
    const int hi = with_loss ? m->loss + 1 : m->output + 1;
    for (int k = with_loss ? 2 : 1; k < m->ninputs; k++) /* an input the feed does not carry, read below hi */
        if (m->first_reader[k] < hi)
            return dt_error(DT_EINVAL, "model: node '%s' reads input '%s', which is not fed",
                            m->nodes[m->first_reader[k]].name, m->nodes[m->inputs[k]].name);
    bind_feed(m, f);
    DT_TRY(forward_range(m, 0, hi));
    if (with_loss && loss) m->dev->ops->download(m->dev, loss, m->nodes[m->loss].out, sizeof *loss); /* one float */
    return DT_OK;
}

dt_status dt_model_forward(dt_model *m, const float *x, int B, bool train, uint64_t step, const float **out) {
    if (m->finished && dt_model_in_dtype(m) != DT_F32)
        return dt_error(DT_EINVAL, "model forward: this model takes int32 ids; use dt_model_run");
    dt_feed f = {.x = x, .n = B};
    DT_TRY(dt_model_run(m, &f, train, step, NULL));
    *out = dt_model_output(m);
    return DT_OK;
}

int dt_model_cut_inputs(const dt_model *m, int k, int *nodes, int cap) {
    int n = 0;
    for (int i = 0; i < k && i < m->n; i++) {
        if (m->nodes[i].input_index >= 0) continue;
        bool read = false;
        for (int j = k; j < m->n && !read; j++)
            for (int q = 0; q < m->nodes[j].nin; q++) read |= m->nodes[j].in[q] == i;
        if (!read) continue;
        if (n < cap) nodes[n] = i;
        n++;
    }
    return n;
}

float *dt_model_node_values_mut(dt_model *m, int node) {
    if (node < 0 || node >= m->n) return NULL;
    return owner(m, &m->nodes[node])->out;
}

float *dt_model_node_grad_mut(dt_model *m, int node) {
    if (node < 0 || node >= m->n) return NULL;
    return owner(m, &m->nodes[node])->grad;
}

float *dt_model_node_buffer(dt_model *m, int node) {
    if (node < 0 || node >= m->n || m->cap_B == 0) return NULL;
    return owner(m, &m->nodes[node])->out;
}

dt_status dt_model_forward_nodes(dt_model *m, const dt_feed *f, int lo, int hi) {
    if (lo < 0 || hi > m->n || lo > hi) return dt_error(DT_EINVAL, "model: node range [%d, %d) of %d", lo, hi, m->n);
    if (m->cap_B == 0 || f->n != m->B)
        return dt_error(DT_EINVAL, "model: forward_nodes of %d samples after dt_model_prepare of %d", f->n, m->B);
    bind_feed(m, f);
    /* aliases below lo (a stage's first node may read one: a relu its maxpool applies) point at
     * their owner's memory, which the previous stage's values were received into */
    for (int i = 0; i < lo; i++)
        if (m->nodes[i].alias) m->nodes[i].out = owner(m, &m->nodes[i])->out;
    return forward_range(m, lo, hi);
}

/* Reports the tensors of node i whose last user it is, merging contiguous ranges. */
static void report_ready(dt_model *m, const dt_node *n, dt_grad_ready_fn hook, void *ctx) {
    size_t lo = 0, hi = 0;
    for (int k = 0; k < n->ntensor; k++) {
        const dt_param_info *t = &m->tensors[n->tensor[k]];
        if (t->is_buffer || m->last_user[n->tensor[k]] != n->id) continue;
        if (hi > lo && t->offset == hi) hi += t->numel;
        else {
            if (hi > lo) hook(ctx, lo, hi - lo);
            lo = t->offset, hi = t->offset + t->numel;
        }
    }
    if (hi > lo) hook(ctx, lo, hi - lo);
}

/* Backward of node n: picks where each input's gradient goes, runs the op, adds the scratch
 * gradients of a second use. */
static void backward_node(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    float *din[DT_NODE_MAX_IN] = {0};
    dt_node *dst[DT_NODE_MAX_IN] = {0};
    int ns = 0;
    for (int j = 0; j < n->nin; j++) {
        dt_node *in = owner(m, &m->nodes[n->in[j]]);
        if (!in->needs_grad) continue;
        bool taken = in->grad_set;
        for (int k = 0; k < j; k++) taken |= dst[k] == in;
        dst[j] = in;
        din[j] = taken ? m->scratch[ns++] : in->grad;
    }
    n->op->backward(m, n, c, din);
    for (int j = 0; j < n->nin; j++) {
        if (!dst[j]) continue;
        if (din[j] != dst[j]->grad) m->dev->ops->accumulate(m->dev, dst[j]->grad, din[j], (size_t)m->B * dst[j]->out_n);
        dst[j]->grad_set = true;
    }
}

static dt_status backward_range(dt_model *m, int lo, int hi, dt_grad_ready_fn hook, void *ctx) {
    const dt_run_ctx c = run_ctx(m);
    for (int i = hi - 1; i >= lo; i--) {
        dt_node *n = &m->nodes[i];
        if (!n->needs_grad || n->alias || n->input_index >= 0) continue;
        if (m->before_backward) m->before_backward(m->hook_ctx, i);
        if (m->bound_p) DT_TRY(check_bound(m, n, true));
        if (n->grad_set || i == m->loss) {
            backward_node(m, n, &c);
            DT_TRY(kernel_status(n));
        }
        if (m->after_backward) m->after_backward(m->hook_ctx, i);
        if (hook) report_ready(m, n, hook, ctx);
    }
    return DT_OK;
}

static void clear_grad_flags(dt_model *m) {
    for (int i = 0; i < m->n; i++) m->nodes[i].grad_set = false;
}

dt_status dt_model_backward_loss(dt_model *m, float scale, dt_grad_ready_fn hook, void *ctx) {
    if (m->B <= 0) return dt_error(DT_EINVAL, "model backward: no forward pass to differentiate");
    if (m->loss < 0) return dt_error(DT_EINVAL, "model backward: the graph has no loss node");
    clear_grad_flags(m);
    m->nodes[m->loss].dloss = scale;
    return backward_range(m, 0, m->loss + 1, hook, ctx);
}

dt_status dt_model_backward(dt_model *m, const float *dout, dt_grad_ready_fn hook, void *ctx) {
    if (m->B <= 0) return dt_error(DT_EINVAL, "model backward: no forward pass to differentiate");
    clear_grad_flags(m);
    dt_node *o = owner(m, &m->nodes[m->output]);
    if (!o->needs_grad) return DT_OK;
    m->dev->ops->copy(m->dev, o->grad, dout, (size_t)m->B * o->out_n * sizeof(float));
    o->grad_set = true;
    return backward_range(m, 0, m->output + 1, hook, ctx);
}

dt_status dt_model_backward_nodes(dt_model *m, int lo, int hi, const float *dout, float scale, dt_grad_ready_fn hook,
                                  void *ctx) {
    if (lo < 0 || hi > m->n || lo >= hi) return dt_error(DT_EINVAL, "model: node range [%d, %d) of %d", lo, hi, m->n);
    if (m->B <= 0) return dt_error(DT_EINVAL, "model backward: no forward pass to differentiate");
    clear_grad_flags(m);
    if (m->loss >= lo && m->loss < hi) {
        m->nodes[m->loss].dloss = scale;
        return backward_range(m, lo, m->loss + 1, hook, ctx);
    }
    dt_node *o = owner(m, &m->nodes[hi - 1]);
    if (!dout)
        return dt_error(DT_EINVAL, "model backward: nodes [%d, %d) hold no loss; pass the gradient of '%s'", lo, hi,
                        m->nodes[hi - 1].name);
    if (o->needs_grad) {
        m->dev->ops->copy(m->dev, o->grad, dout, (size_t)m->B * o->out_n * sizeof(float));
        o->grad_set = true;
    }
    return backward_range(m, lo, hi, hook, ctx);
}

const float *dt_model_node_values(const dt_model *m, int node) { return m->nodes[node].out; }
const float *dt_model_node_grad(const dt_model *m, int node) {
    const dt_node *n = &m->nodes[node];
    while (n->alias) n = &m->nodes[n->in[0]];
    return n->grad_set ? n->grad : NULL;
}

double dt_model_train_flops(const dt_model *m, int B) {
    double f = 0;
    for (int i = 0; i < m->n; i++) {
        const dt_node *n = &m->nodes[i];
        if (!n->op->flops) continue;
        bool need_din = false;
        for (int j = 0; j < n->nin; j++) need_din |= m->nodes[n->in[j]].needs_grad;
        f += n->op->flops(m, n, B, need_din);
    }
    return f;
}

bool dt_model_range_reads_input(const dt_model *m, int lo, int hi, int k) {
    if (k < 0 || k >= m->ninputs) return false;
    for (int i = lo < 0 ? 0 : lo; i < hi && i < m->n; i++)
        for (int q = 0; q < m->nodes[i].nin; q++)
            if (m->nodes[i].in[q] == m->inputs[k]) return true;
    return false;
}

double dt_model_node_flops(const dt_model *m, int node, int B) {
    const dt_node *n = &m->nodes[node];
    if (!n->op->flops) return 0;
    bool need_din = false;
    for (int j = 0; j < n->nin; j++) need_din |= m->nodes[n->in[j]].needs_grad;
    return n->op->flops(m, n, B, need_din);
}

size_t dt_model_node_size(const dt_model *m, int node) { return m->nodes[node].out_n; }

int dt_model_node_owner(const dt_model *m, int node) { return owner((dt_model *)m, &m->nodes[node])->id; }

/* The count on the device, from the labels the last run uploaded (labels is that feed's host
 * memory); -1 when they are not there or the count has no device memory. */
static int64_t count_on_device(const dt_model *m, const int32_t *labels, int64_t rows, int V) {
    if (m->ninputs < 2 || labels != m->feed_host[1] || m->nodes[m->inputs[1]].dtype != DT_I32) return -1;
    dt_model *w = (dt_model *)m; /* its count's memory, kept for the next batch */
    if (!w->dev_correct && !(w->dev_correct = m->dev->ops->alloc(m->dev, sizeof(int64_t)))) return dt_error_clear(), -1;
    int64_t correct = -1;
    m->be->count_correct(w->dev_correct, dt_model_output(m), (const int32_t *)m->nodes[m->inputs[1]].out, rows, V);
    m->dev->ops->download(m->dev, &correct, w->dev_correct, sizeof correct);
    return correct;
}

int64_t dt_model_count_correct(const dt_model *m, const int32_t *labels, int n) {
    const int V = dt_model_classes(m);
    const int64_t rows = (int64_t)n * (dt_model_out_size(m) / V);
    const float *logits = dt_model_output(m);
    float *host = NULL;
    if (!m->dev->host_memory) { /* the logits are the device's: counted there (8 bytes come back) */
        const int64_t c = count_on_device(m, labels, rows, V);
        if (c >= 0) return c;
        /* labels of another feed: the logits downloaded once */
        if (!(host = malloc((size_t)rows * (size_t)V * sizeof(float) + 1))) return -1;
        m->dev->ops->download(m->dev, host, logits, (size_t)rows * (size_t)V * sizeof(float));
        logits = host;
    }
    int64_t correct = 0; /* host logits: the CPU's count_correct kernel */
    (host ? dt_backend_cpu() : m->be)->count_correct(&correct, logits, labels, rows, V);
    free(host);
    return correct;
}
