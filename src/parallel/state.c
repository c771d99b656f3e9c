/* The training state as pieces of tensors (dt_state_piece), for checkpoints that do not depend on
 * how a strategy lays it out: the replicated visitor (every placed tensor whole, with its
 * optimizer moments), the strategy's entry point, and the whole model assembled on one rank from
 * the pieces every rank reports (a weights file under ZeRO; pieces on a device downloaded). */
#include "device/device.h"
#include "parallel/strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_state_visit_model(dt_model *m, dt_optim *o, dt_state_visit_fn fn, void *ctx) {
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        if (!dt_model_tensor_placed(m, i)) continue; /* another rank's (pipeline stages) */
        float *base = t->is_buffer ? dt_model_buffers(m) : dt_model_params(m);
        dt_state_piece p = {.name = t->name,
                            .buf = {base + t->offset, DT_F32, t->numel, DT_DEVICE_CPU},
                            .ndim = t->ndim,
                            .numel = t->numel};
        for (int d = 0; d < t->ndim; d++) p.shape[d] = t->shape[d];
        DT_TRY(fn(ctx, &p));
        for (int k = 0; o && !t->is_buffer && k < dt_optim_num_states(o); k++) {
            const char *sname;
            float *st = dt_optim_state(o, k, &sname);
            char name[96];
            snprintf(name, sizeof name, "optim.%s.%s", sname, t->name);
            p.name = name, p.buf.data = st + t->offset, p.is_optim = true;
            DT_TRY(fn(ctx, &p));
        }
    }
    return DT_OK;
}

dt_status dt_strategy_visit_state(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    if (s->ops->visit_state) return s->ops->visit_state(s, fn, ctx);
    return dt_state_visit_model(s->model, s->optim, fn, ctx);
}

/* ---- the whole model on one rank from every rank's pieces ---- */

enum { GATHER_TAG = DT_COMM_TAG_MAX - 2 }; /* pp's stage gathers use TAG_MAX and TAG_MAX - 1 */

typedef struct {
    int64_t (*head)[3]; /* per piece: tensor index, offset, count */
    const float **data;
    int n, cap;
    dt_model *m;
} model_pieces;

static dt_status collect_piece(void *ctx, const dt_state_piece *p) {
    model_pieces *c = ctx;
    if (p->is_optim || p->buf.count == 0) return DT_OK;
    const int i = dt_model_find_tensor(c->m, p->name);
    if (i < 0 || p->buf.dtype != DT_F32 || p->offset + p->buf.count > dt_model_tensor(c->m, i)->numel)
        return dt_error(DT_EINTERNAL, "state gather: piece '%s' [%zu, +%zu) is not f32 of a model tensor", p->name,
                        p->offset, p->buf.count);
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        void *h = realloc(c->head, sizeof *c->head * (size_t)cap),
             *d = h ? realloc(c->data, sizeof *c->data * (size_t)cap) : NULL;
        if (h) c->head = h;
        if (!d) return dt_error(DT_ENOMEM, "state gather: out of memory");
        c->data = d, c->cap = cap;
    }
    c->head[c->n][0] = i, c->head[c->n][1] = (int64_t)p->offset, c->head[c->n][2] = (int64_t)p->buf.count;
    c->data[c->n++] = p->buf.data;
    return DT_OK;
}

/* Where piece (tensor i, offset) lands in the whole slabs. */
static float *landing(dt_model *m, const int64_t h[3], float *params, float *buffers) {
    const dt_param_info *t = dt_model_tensor(m, (int)h[0]);
    return (t->is_buffer ? buffers : params) + t->offset + (size_t)h[1];
}

/* Root: rank r's pieces into the slabs; *got grows by their values. */
static dt_status receive_pieces(dt_strategy *s, int r, float *params, float *buffers, size_t *got) {
    int64_t n = 0;
    DT_TRY(dt_comm_recv(s->comm, &n, 1, DT_I64, r, GATHER_TAG));
    int64_t(*head)[3] = malloc(sizeof *head * (size_t)(n > 0 ? n : 1));
    if (!head) return dt_error(DT_ENOMEM, "state gather: out of memory");
    dt_status st = n > 0 ? dt_comm_recv(s->comm, head, 3 * (size_t)n, DT_I64, r, GATHER_TAG) : DT_OK;
    const int nt = dt_model_num_tensors(s->model);
    for (int64_t k = 0; st == DT_OK && k < n; k++) {
        if (head[k][0] < 0 || head[k][0] >= nt || head[k][1] < 0 || head[k][2] < 1 ||
            (size_t)(head[k][1] + head[k][2]) > dt_model_tensor(s->model, (int)head[k][0])->numel) {
            st = dt_error(DT_EINTERNAL, "state gather: rank %d sent piece %lld outside the model", r, (long long)k);
            break;
        }
        st = dt_comm_recv(s->comm, landing(s->model, head[k], params, buffers), (size_t)head[k][2], DT_F32, r,
                          GATHER_TAG);
        *got += (size_t)head[k][2];
    }
    free(head);
    return st;
}

/* A rank's piece k to root: from device memory (dl) through a host copy of it. */
static dt_status send_piece(dt_strategy *s, dt_dev *dl, const model_pieces *c, int k, int root) {
    const size_t n = (size_t)c->head[k][2];
    if (!dl) return dt_comm_send(s->comm, c->data[k], n, DT_F32, root, GATHER_TAG);
    float *h = dt_alloc(n * sizeof(float));
    if (!h) return dt_error(DT_ENOMEM, "state gather: no host memory for a piece of %zu values", n);
    dl->ops->download(dl, h, c->data[k], n * sizeof(float));
    dt_status st = dt_comm_send(s->comm, h, n, DT_F32, root, GATHER_TAG);
    dt_free(h);
    return st;
}

dt_status dt_strategy_gather_model(dt_strategy *s, int root, float *params, float *buffers) {
    model_pieces c = {.m = s->model};
    dt_dev *dev = dt_model_device(s->model), *dl = dev->host_memory ? NULL : dev; /* pieces on a device */
    const int me = s->comm ? dt_comm_rank(s->comm) : 0, N = s->comm ? dt_comm_size(s->comm) : 1;
    dt_status st = dt_strategy_visit_state(s, collect_piece, &c);
    size_t got = 0;
    if (me == root) {
        for (int k = 0; st == DT_OK && k < c.n; k++) {
            float *to = landing(s->model, c.head[k], params, buffers);
            if (dl) dl->ops->download(dl, to, c.data[k], (size_t)c.head[k][2] * sizeof(float));
            else memcpy(to, c.data[k], (size_t)c.head[k][2] * sizeof(float));
            got += (size_t)c.head[k][2];
        }
        for (int r = 0; st == DT_OK && r < N; r++)
            if (r != root) st = receive_pieces(s, r, params, buffers, &got);
        const size_t want = dt_model_num_params(s->model) + dt_model_num_buffers(s->model);
        if (st == DT_OK && got != want)
            st = dt_error(DT_EINTERNAL, "state gather: the ranks' pieces hold %zu of the model's %zu values", got,
                          want);
    } else {
        int64_t n = st == DT_OK ? c.n : 0; /* a rank that failed sends nothing: the root reports the gap */
        dt_status sent = dt_comm_send(s->comm, &n, 1, DT_I64, root, GATHER_TAG);
        if (sent == DT_OK && n > 0) sent = dt_comm_send(s->comm, c.head, 3 * (size_t)n, DT_I64, root, GATHER_TAG);
        for (int64_t k = 0; sent == DT_OK && k < n; k++) sent = send_piece(s, dl, &c, (int)k, root);
        if (st == DT_OK) st = sent;
    }
    free(c.head), free(c.data);
    return st;
}
