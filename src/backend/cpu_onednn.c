/* The oneDNN backend: a second table beside the OpenBLAS one. oneDNN runs the GEMMs (linear and
 * matmul_t forward, both backward GEMMs; convolution forward, backward data and backward
 * weights) at f32, bf16 or fp16 inputs with f32 accumulation; every other op reuses the cpu
 * kernels. Primitives are created once per op, shape and precision and cached per thread, so a
 * short last batch costs one creation, not one per step. oneDNN runs OpenMP threads: their
 * number follows dt_set_threads (--threads). The matmuls and linear layers are in
 * cpu_onednn_matmul.c, the convolutions in cpu_onednn_conv.c; this file has the engine, the
 * primitive cache and the tables. On a CPU without AVX512-BF16, bf16 GEMMs and convolutions run
 * oneDNN's f32 kernels on inputs rounded to bf16 (dt_onednn_bf16_native). Without oneDNN
 * (DNNL=0) only the stubs at the end are compiled. */
#include "backend/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if DT_HAVE_DNNL
#include <omp.h>

#include "backend/blocked.h"
#include "backend/onednn.h"
#include "backend/kern.h"

#define DT_DNNL_CACHE 128

static _Thread_local struct {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_attr_t attr;
    void *pad; /* the scratchpad of every primitive this thread runs (they run one at a time) */
    size_t pad_n;
    dt_dnnl_entry e[DT_DNNL_CACHE];
    int n, threads;
    unsigned long long clock; /* lookups so far: an entry's `last` */
    size_t misses;
    void *conv[DT_DNNL_SCRATCH_SLOTS];
    size_t conv_n[DT_DNNL_SCRATCH_SLOTS];
} tls;

/* A thread's cache goes when the thread does (fl-sim's client threads, a caller's worker pool):
 * the key's destructor runs at thread exit, while the thread's own tls is still there. */
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void entry_clear(dt_dnnl_entry *e);

static void tls_free(void *unused) {
    (void)unused;
    for (int i = 0; i < tls.n; i++) entry_clear(&tls.e[i]);
    for (int k = 0; k < DT_DNNL_SCRATCH_SLOTS; k++) free(tls.conv[k]), tls.conv[k] = NULL, tls.conv_n[k] = 0;
    free(tls.pad), tls.pad = NULL, tls.pad_n = 0;
    if (tls.attr) dnnl_primitive_attr_destroy(tls.attr);
    tls.attr = NULL;
    if (tls.stream) dnnl_stream_destroy(tls.stream);
    if (tls.eng) dnnl_engine_destroy(tls.eng);
    tls.stream = NULL, tls.eng = NULL, tls.n = 0;
}

static void tls_key_make(void) { pthread_key_create(&tls_key, tls_free); }

dnnl_engine_t dt_dnnl_engine(void) {
    if (!tls.eng) {
        pthread_once(&tls_once, tls_key_make);
        pthread_setspecific(tls_key, &tls); /* non-NULL: the destructor runs for this thread */
        if (dnnl_engine_create(&tls.eng, dnnl_cpu, 0) != dnnl_success) return tls.eng = NULL;
        if (dnnl_stream_create(&tls.stream, tls.eng, dnnl_stream_default_flags) != dnnl_success) {
            dnnl_engine_destroy(tls.eng);
            return tls.eng = NULL;
        }
        if (dnnl_primitive_attr_create(&tls.attr) != dnnl_success ||
            dnnl_primitive_attr_set_scratchpad_mode(tls.attr, dnnl_scratchpad_mode_user) != dnnl_success) {
            if (tls.attr) dnnl_primitive_attr_destroy(tls.attr);
            dnnl_stream_destroy(tls.stream), dnnl_engine_destroy(tls.eng);
            tls.attr = NULL, tls.stream = NULL;
            return tls.eng = NULL;
        }
    }
    return tls.eng;
}

dnnl_primitive_attr_t dt_dnnl_attr(void) { return dt_dnnl_engine() ? tls.attr : NULL; }

static void entry_clear(dt_dnnl_entry *e) {
    for (int i = 0; i < e->nsteps; i++) {
        dnnl_primitive_destroy(e->step[i].p);
        if (e->step[i].pad) dnnl_memory_destroy(e->step[i].pad);
    }
    for (int i = 0; i < e->nmem; i++) dnnl_memory_destroy(e->mem[i]);
    free(e->tmp);
    dt_dnnl_key k = e->key;
    memset(e, 0, sizeof *e);
    e->key = k;
}

/* OpenMP threads of this thread's parallel regions = dt_get_threads(). oneDNN sizes a primitive's
 * work split when it is created, so this runs before creating one as well as before running. */
static void sync_threads(void) {
    int t = dt_get_threads();
    if (tls.threads != t) omp_set_num_threads(t), tls.threads = t;
}

dt_dnnl_entry *dt_dnnl_lookup(const dt_dnnl_key *key) {
    if (!dt_dnnl_engine()) return NULL;
    sync_threads();
    dt_dnnl_key kt = *key, *k = &kt;
    kt.d[DT_DNNL_KEY_INTS - 1] = tls.threads; /* a primitive is made for a thread count */
    for (int i = 0; i < tls.n; i++)
        if (!memcmp(&tls.e[i].key, k, sizeof *k)) return tls.e[i].last = ++tls.clock, &tls.e[i];
    dt_dnnl_entry *e;
    if (tls.n < DT_DNNL_CACHE) e = &tls.e[tls.n++];
    else { /* full: evict the least recently used entry, never one that the op now running holds
            * (a backward looks up two entries, then runs both) */
        e = &tls.e[0];
        for (int i = 1; i < DT_DNNL_CACHE; i++)
            if (tls.e[i].last < e->last) e = &tls.e[i];
        entry_clear(e);
    }
    memset(e, 0, sizeof *e);
    e->key = *k;
    e->last = ++tls.clock;
    tls.misses++;
    return e;
}

dnnl_memory_t dt_dnnl_mem(dt_dnnl_entry *e, const dnnl_memory_desc_t *md, int ext) {
    if (e->nmem == DT_DNNL_MEMS) return NULL;
    dnnl_memory_t m;
    if (dnnl_memory_create(&m, md, tls.eng, ext >= 0 ? DNNL_MEMORY_NONE : DNNL_MEMORY_ALLOCATE) != dnnl_success)
        return NULL;
    e->ext[e->nmem] = ext;
    return e->mem[e->nmem++] = m;
}

bool dt_dnnl_step_add(dt_dnnl_entry *e, dnnl_primitive_desc_t pd, int nargs, const int *arg, const dnnl_memory_t *m,
                      bool main) {
    if (!pd) return false;
    bool ok = e->nsteps < DT_DNNL_STEPS;
    for (int i = 0; i < nargs; i++) ok &= m[i] != NULL;
    const char *impl = NULL;
    if (ok && main && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl) {
        size_t at = strlen(e->impl); /* a second main primitive (conv_bwd: weights, then data) */
        if (!at) snprintf(e->impl, sizeof e->impl, "%s", impl);
        else if (strcmp(e->impl, impl)) snprintf(e->impl + at, sizeof e->impl - at, " + %s", impl);
    }
    dt_dnnl_step *st = &e->step[e->nsteps];
    const dnnl_memory_desc_t *sp = ok ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    const size_t pad_n = sp ? dnnl_memory_desc_get_size(sp) : 0;
    st->pad = NULL;
    ok = ok && nargs < DT_DNNL_ARGS && dnnl_primitive_create(&st->p, pd) == dnnl_success;
    if (ok && pad_n && dnnl_memory_create(&st->pad, sp, tls.eng, DNNL_MEMORY_NONE) != dnnl_success) {
        dnnl_primitive_destroy(st->p);
        st->pad = NULL, ok = false;
    }
    dnnl_primitive_desc_destroy(pd);
    if (!ok) return false;
    st->nargs = nargs;
    for (int i = 0; i < nargs; i++) st->args[i] = (dnnl_exec_arg_t){arg[i], m[i]};
    if (st->pad) st->args[st->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, st->pad};
    if (pad_n > e->pad_n) e->pad_n = pad_n;
    e->nsteps++;
    return true;
}

static bool reorder_step(dt_dnnl_entry *e, dnnl_memory_t from, dnnl_memory_t to) {
    const dnnl_memory_desc_t *a, *b;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_memory_get_memory_desc(from, &a) != dnnl_success || dnnl_memory_get_memory_desc(to, &b) != dnnl_success ||
        dnnl_reorder_primitive_desc_create(&pd, a, tls.eng, b, tls.eng, tls.attr) != dnnl_success)
        return false;
    const int arg[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    const dnnl_memory_t m[2] = {from, to};
    return dt_dnnl_step_add(e, pd, 2, arg, m, false);
}

dnnl_memory_t dt_dnnl_input(dt_dnnl_entry *e, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *want,
                            int ext) {
    dnnl_memory_t outside = dt_dnnl_mem(e, plain, ext);
    if (!outside || dnnl_memory_desc_equal(plain, want)) return outside;
    dnnl_memory_t inside = dt_dnnl_mem(e, want, -1);
    return inside && reorder_step(e, outside, inside) ? inside : NULL;
}

dnnl_memory_t dt_dnnl_output(dt_dnnl_entry *e, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *want,
                             int ext) {
    dnnl_memory_t outside = dt_dnnl_mem(e, plain, ext);
    if (!outside || dnnl_memory_desc_equal(plain, want)) return outside;
    dnnl_memory_t inside = dt_dnnl_mem(e, want, -1);
    if (!inside || e->npost == 3) return NULL;
    e->post_from[e->npost] = inside, e->post_to[e->npost++] = outside;
    return inside;
}

bool dt_dnnl_ready(dt_dnnl_entry *e, bool ok) {
    for (int i = 0; ok && i < e->npost; i++) ok = reorder_step(e, e->post_from[i], e->post_to[i]);
    e->used = true;
    e->failed = !ok;
    if (!ok) {
        entry_clear(e);
        e->used = e->failed = true;
    }
    return ok;
}

void dt_dnnl_run(dt_dnnl_entry *e, void *const *data) {
    if (e->pad_n > tls.pad_n) {
        free(tls.pad);
        tls.pad = dt_dnnl_alloc(e->pad_n);
        tls.pad_n = tls.pad ? e->pad_n : 0;
        if (!tls.pad) return dt_kernel_fail("oneDNN scratchpad: out of memory for %zu bytes", e->pad_n);
    }
    sync_threads();
    for (int i = 0; i < e->nmem; i++)
        if (e->ext[i] >= 0) dnnl_memory_set_data_handle_v2(e->mem[i], data[e->ext[i]], tls.stream);
    for (int i = 0; i < e->nsteps; i++)
        if (e->step[i].pad) dnnl_memory_set_data_handle_v2(e->step[i].pad, tls.pad, tls.stream);
    dnnl_status_t st = dnnl_success;
    for (int i = 0; i < e->nsteps && st == dnnl_success; i++)
        if ((st = dnnl_primitive_execute(e->step[i].p, tls.stream, e->step[i].nargs, e->step[i].args)) != dnnl_success)
            dt_kernel_fail("oneDNN: step %d of %d (%s) failed with status %d", i + 1, e->nsteps,
                           e->impl[0] ? e->impl : "a reorder", (int)st);
    if (dnnl_stream_wait(tls.stream) != dnnl_success) dt_kernel_fail("oneDNN: waiting for its stream failed");
}

dnnl_memory_desc_t dt_dnnl_md(int ndim, const int64_t *dims, dnnl_data_type_t dt, const int64_t *strides) {
    dnnl_dims_t d, s;
    for (int i = ndim - 1; i >= 0; i--) {
        d[i] = dims[i];
        s[i] = strides ? strides[i] : (i == ndim - 1 ? 1 : s[i + 1] * d[i + 1]);
    }
    dnnl_memory_desc_t md;
    dnnl_memory_desc_init_by_strides(&md, ndim, d, dt, s);
    return md;
}

void *dt_dnnl_alloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) & ~(size_t)63); }

void *dt_dnnl_scratch(int slot, size_t bytes) {
    if (bytes > tls.conv_n[slot]) {
        free(tls.conv[slot]);
        tls.conv[slot] = dt_dnnl_alloc(bytes);
        tls.conv_n[slot] = tls.conv[slot] ? bytes : 0;
        if (!tls.conv[slot]) dt_kernel_fail("oneDNN scratch: out of memory for %zu bytes", bytes);
    }
    return tls.conv[slot];
}

float *dt_dnnl_rounded(int slot, const float *src, size_t n, dt_dtype p) {
    float *d = src ? dt_dnnl_scratch(slot, n * sizeof(float) + 4) : NULL;
    if (!d) return NULL;
    if (p == DT_BF16) dt_round_bf16(d, src, n);
    else dt_round_f16(d, src, n);
    return d;
}

size_t dt_onednn_cache_misses(void) { return tls.misses; }
int dt_onednn_cache_capacity(void) { return DT_DNNL_CACHE; }

void dt_onednn_impls(char *buf, size_t n) {
    static const char *ops[] = {"", "matmul", "conv_fwd", "conv_bwd_data", "conv_bwd_weights", "conv_bwd"};
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < tls.n; i++) {
        const dt_dnnl_entry *e = &tls.e[i];
        if (e->failed || !e->impl[0]) continue;
        char item[128];
        snprintf(item, sizeof item, "%s(%s) %s", ops[e->key.op],
                 e->key.dt == dnnl_f32    ? "f32"
                 : e->key.dt == dnnl_bf16 ? "bf16"
                                          : "f16",
                 e->impl);
        if (strstr(buf, item)) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? "; " : "", item);
        if (w < 0 || (size_t)w >= n - len) break;
        len += (size_t)w;
    }
}

bool dt_onednn_bf16_native(void) { return __builtin_cpu_supports("avx512bf16"); }

#define DT_ONEDNN_WRAPPERS(sfx, P)                                                                               \
    static void lf_##sfx(float *out, const float *in, const float *w, const float *b, float *work, int B, int C, \
                         int OC) {                                                                               \
        (void)work; /* oneDNN's own scratch (cpu_onednn.c dt_dnnl_scratch) */                                    \
        dt_dnnl_linear_forward(P, out, in, w, b, B, C, OC);                                                      \
    }                                                                                                            \
    static void lb_##sfx(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,   \
                         float *work, int B, int C, int OC) {                                                    \
        (void)work;                                                                                              \
        dt_dnnl_linear_backward(P, din, dw, db, dout, in, w, B, C, OC);                                          \
    }                                                                                                            \
    static void cf_##sfx(float *out, const float *in, const float *w, const float *b, float *work, int B, int C, \
                         int H, int W, int OC, int K, int S, int Pd) {                                           \
        dt_dnnl_conv_forward(P, out, in, w, b, work, B, C, H, W, OC, K, S, Pd);                                  \
    }                                                                                                            \
    static void cb_##sfx(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,   \
                         float *work, int B, int C, int H, int W, int OC, int K, int S, int Pd) {                \
        dt_dnnl_conv_backward(P, din, dw, db, dout, in, w, work, B, C, H, W, OC, K, S, Pd);                      \
    }
DT_ONEDNN_WRAPPERS(f32, DT_F32)
DT_ONEDNN_WRAPPERS(bf16, DT_BF16)
DT_ONEDNN_WRAPPERS(f16, DT_F16)

/* the blocked convolutions at bf16 and fp16 (f32 has its own entries) */
#define DT_ONEDNN_BLOCKED_WRAPPERS(sfx, P)                                                                             \
    static void cfb_##sfx(float *out, const float *in, const float *w, const float *b, int B, int C, int H, int W,     \
                          int OC, int K, int S, int Pd, dt_layout in_l, dt_layout out_l) {                             \
        dt_dnnl_conv_forward_blocked_lowp(P, out, in, w, b, B, C, H, W, OC, K, S, Pd, in_l, out_l);                    \
    }                                                                                                                  \
    static void cbb_##sfx(float *din, float *dw, float *db, const float *dout, const float *in, const float *w, int B, \
                          int C, int H, int W, int OC, int K, int S, int Pd, dt_layout in_l, dt_layout out_l) {        \
        dt_dnnl_conv_backward_blocked_lowp(P, din, dw, db, dout, in, w, B, C, H, W, OC, K, S, Pd, in_l, out_l);        \
    }
DT_ONEDNN_BLOCKED_WRAPPERS(bf16, DT_BF16)
DT_ONEDNN_BLOCKED_WRAPPERS(f16, DT_F16)

static dt_kernel_table tables[3];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void fill_tables(void) {
    static const dt_dtype prec[3] = {DT_F32, DT_BF16, DT_F16};
    for (int i = 0; i < 3; i++) {
        dt_kernel_table *t = &tables[i];
        *t = *dt_backend_cpu();
        t->name = "onednn";
        t->precision = prec[i];
        t->linear_workspace = NULL; /* the blas table's copy: oneDNN rounds in its own scratch */
        t->linear_forward = i == 0 ? lf_f32 : i == 1 ? lf_bf16 : lf_f16;
        t->linear_backward = i == 0 ? lb_f32 : i == 1 ? lb_bf16 : lb_f16;
        t->conv2d_forward = i == 0 ? cf_f32 : i == 1 ? cf_bf16 : cf_f16;
        t->conv2d_backward = i == 0 ? cb_f32 : i == 1 ? cb_bf16 : cb_f16;
        /* conv chains run in oneDNN's blocked layout; at bf16/fp16 the values stay f32 blocked
         * and each conv converts them (a cast, no transpose) */
        t->conv2d_forward_blocked = i == 0 ? dt_dnnl_conv_forward_blocked : i == 1 ? cfb_bf16 : cfb_f16;
        t->conv2d_backward_blocked = i == 0 ? dt_dnnl_conv_backward_blocked : i == 1 ? cbb_bf16 : cbb_f16;
        /* and a first conv (<= 4 input channels) with its relu and maxpool in one f32 pass, at every
         * precision: bf16/fp16 run convs over < 16 input channels at f32 anyway (blas stays the
         * unfused reference) */
        t->conv_pool_workspace = dt_conv_pool_workspace;
        t->conv_pool_forward = dt_conv_pool_forward, t->conv_pool_backward = dt_conv_pool_backward;
        /* at bf16 the values between bf16 convs and max pools may stay bf16 (nn/graph_layout.c) */
        if (i == 1) {
            t->linear_bf16_values = dt_dnnl_linear_bf16_values;
            t->linear_forward_bf16 = dt_dnnl_linear_forward_bf16,
            t->linear_backward_bf16 = dt_dnnl_linear_backward_bf16;
            t->linear_backward_bf16_grad = dt_dnnl_linear_backward_bf16_grad;
            t->linear_forward_bf16io = dt_dnnl_linear_forward_bf16io;
            t->linear_backward_bf16_din = dt_dnnl_linear_backward_bf16_din;
            t->conv2d_bf16_values = dt_dnnl_conv_bf16_values;
            t->conv2d_bf16_nhwc = dt_dnnl_conv_bf16_nhwc;
            t->maxpool2d_forward_blocked_bf16 = dt_maxpool2d_forward_blocked_bf16;
            t->maxpool2d_backward_blocked_bf16 = dt_maxpool2d_backward_blocked_bf16;
            t->maxpool2d_blocked_bf16_workspace = dt_maxpool2d_blocked_bf16_workspace;
        }
    }
}

const dt_kernel_table *dt_backend_onednn(dt_dtype precision) {
    int i = precision == DT_F32 ? 0 : precision == DT_BF16 ? 1 : precision == DT_F16 ? 2 : -1;
    if (i < 0) return NULL;
    pthread_once(&tables_once, fill_tables);
    return &tables[i];
}

bool dt_onednn_built(void) { return true; }

#else /* built without oneDNN */

const dt_kernel_table *dt_backend_onednn(dt_dtype precision) { return (void)precision, NULL; }
bool dt_onednn_built(void) { return false; }
bool dt_onednn_bf16_native(void) { return false; }
size_t dt_onednn_cache_misses(void) { return 0; }
int dt_onednn_cache_capacity(void) { return 0; }
void dt_onednn_impls(char *buf, size_t n) {
    if (n) snprintf(buf, n, "built without oneDNN");
}

#endif
