/* The oneDNN backend: a second table beside the OpenBLAS one. oneDNN runs the GEMMs (linear and
 * matmul_t forward, both backward GEMMs; convolution forward, backward data and backward
 * weights) at f32, bf16 or fp16 inputs with f32 accumulation; every other op reuses the cpu
 * kernels. Primitives are created once per op, shape and precision and cached per thread, so a
 * short last batch costs one creation, not one per step. oneDNN runs OpenMP threads: their
 * number follows dt_set_threads (--threads). At bf16 on a CPU with AVX512-BF16 the GEMMs' B
 * operands are packed and a linear layer's output gradient is cast by our code
 * (cpu_onednn_pack.c), not by oneDNN's reorders. On a CPU without it, bf16 GEMMs and convolutions
 * run oneDNN's f32 kernels on inputs rounded to bf16 (dt_onednn_bf16_native). Without oneDNN
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
    dt_dnnl_entry e[DT_DNNL_CACHE];
    int n, threads;
    unsigned long long clock;   /* lookups so far: an entry's `last` */
    size_t misses;
    void *conv[4];
    size_t conv_n[4];
} tls;

/* A thread's cache goes when the thread does (fl-sim's client threads, a caller's worker pool):
 * the key's destructor runs at thread exit, while the thread's own tls is still there. */
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void entry_clear(dt_dnnl_entry *e);

static void tls_free(void *unused) {
    (void)unused;
    for (int i = 0; i < tls.n; i++) entry_clear(&tls.e[i]);
    for (int k = 0; k < 4; k++) free(tls.conv[k]), tls.conv[k] = NULL, tls.conv_n[k] = 0;
    if (tls.stream) dnnl_stream_destroy(tls.stream);
    if (tls.eng) dnnl_engine_destroy(tls.eng);
    tls.stream = NULL, tls.eng = NULL, tls.n = 0;
}

static void tls_key_make(void) { pthread_key_create(&tls_key, tls_free); }

dnnl_engine_t dt_dnnl_engine(void) {
    if (!tls.eng) {
        pthread_once(&tls_once, tls_key_make);
        pthread_setspecific(tls_key, &tls);  /* non-NULL: the destructor runs for this thread */
        if (dnnl_engine_create(&tls.eng, dnnl_cpu, 0) != dnnl_success) return tls.eng = NULL;
        if (dnnl_stream_create(&tls.stream, tls.eng, dnnl_stream_default_flags) != dnnl_success) {
            dnnl_engine_destroy(tls.eng);
            return tls.eng = NULL;
        }
    }
    return tls.eng;
}

static void entry_clear(dt_dnnl_entry *e) {
    for (int i = 0; i < e->nsteps; i++) dnnl_primitive_destroy(e->step[i].p);
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
    kt.d[DT_DNNL_KEY_INTS - 1] = tls.threads;  /* a primitive is made for a thread count */
    for (int i = 0; i < tls.n; i++)
        if (!memcmp(&tls.e[i].key, k, sizeof *k)) return tls.e[i].last = ++tls.clock, &tls.e[i];
    dt_dnnl_entry *e;
    if (tls.n < DT_DNNL_CACHE) e = &tls.e[tls.n++];
    else {  /* full: evict the least recently used entry, never one that the op now running holds
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
        size_t at = strlen(e->impl);  /* a second main primitive (conv_bwd: weights, then data) */
        if (!at) snprintf(e->impl, sizeof e->impl, "%s", impl);
        else if (strcmp(e->impl, impl)) snprintf(e->impl + at, sizeof e->impl - at, " + %s", impl);
    }
    dt_dnnl_step *st = &e->step[e->nsteps];
    ok = ok && dnnl_primitive_create(&st->p, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (!ok) return false;
    st->nargs = nargs;
    for (int i = 0; i < nargs; i++) st->args[i] = (dnnl_exec_arg_t){arg[i], m[i]};
    e->nsteps++;
    return true;
}

static bool reorder_step(dt_dnnl_entry *e, dnnl_memory_t from, dnnl_memory_t to) {
    const dnnl_memory_desc_t *a, *b;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_memory_get_memory_desc(from, &a) != dnnl_success || dnnl_memory_get_memory_desc(to, &b) != dnnl_success ||
        dnnl_reorder_primitive_desc_create(&pd, a, tls.eng, b, tls.eng, NULL) != dnnl_success)
        return false;
    const int arg[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    const dnnl_memory_t m[2] = {from, to};
    return dt_dnnl_step_add(e, pd, 2, arg, m, false);
}

dnnl_memory_t dt_dnnl_input(dt_dnnl_entry *e, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *want, int ext) {
    dnnl_memory_t outside = dt_dnnl_mem(e, plain, ext);
    if (!outside || dnnl_memory_desc_equal(plain, want)) return outside;
    dnnl_memory_t inside = dt_dnnl_mem(e, want, -1);
    return inside && reorder_step(e, outside, inside) ? inside : NULL;
}

dnnl_memory_t dt_dnnl_output(dt_dnnl_entry *e, const dnnl_memory_desc_t *plain, const dnnl_memory_desc_t *want, int ext) {
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
    sync_threads();
    for (int i = 0; i < e->nmem; i++)
        if (e->ext[i] >= 0) dnnl_memory_set_data_handle_v2(e->mem[i], data[e->ext[i]], tls.stream);
    for (int i = 0; i < e->nsteps; i++) dnnl_primitive_execute(e->step[i].p, tls.stream, e->step[i].nargs, e->step[i].args);
    dnnl_stream_wait(tls.stream);
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

static void *grow(int slot, size_t bytes) {
    if (bytes > tls.conv_n[slot]) {
        void *p = realloc(tls.conv[slot], bytes);
        if (!p) abort();  /* kernels cannot fail; out of memory here is fatal */
        tls.conv[slot] = p, tls.conv_n[slot] = bytes;
    }
    return tls.conv[slot];
}

float *dt_dnnl_rounded(int slot, const float *src, size_t n, dt_dtype p) {
    float *d = grow(slot, n * sizeof(float) + 4);
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
        snprintf(item, sizeof item, "%s(%s) %s", ops[e->key.op], e->key.dt == dnnl_f32 ? "f32" : e->key.dt == dnnl_bf16 ? "bf16" : "f16",
                 e->impl);
        if (strstr(buf, item)) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? "; " : "", item);
        if (w < 0 || (size_t)w >= n - len) break;
        len += (size_t)w;
    }
}

/* ---- matmul: C(M,N) (+)= A(M,K) @ B(K,N) [+ bias(N)], A and B strided, C row-major ----------- */

typedef struct {
    int M, N, K;
    int64_t sa[2], sb[2];
    bool bias, accumulate;
    bool a_bf16;  /* at bf16: A arrives cast already (dt_cast_bf16), not f32 */
    bool b_bf16;  /* at bf16: B arrives as bf16 values (row-major), not f32 */
} mm_shape;

static dnnl_data_type_t dnnl_type(dt_dtype p) { return p == DT_BF16 ? dnnl_bf16 : p == DT_F16 ? dnnl_f16 : dnnl_f32; }

bool dt_onednn_bf16_native(void) { return __builtin_cpu_supports("avx512bf16"); }

/* The entry of s with inputs of dtype p (f32 when p is), NULL when oneDNN has none (or only an
 * emulated bf16 one: dt_onednn_bf16_native). */
static dt_dnnl_entry *mm_entry(const mm_shape *s, dt_dtype p) {
    if (p == DT_BF16 && !dt_onednn_bf16_native()) return NULL;
    dt_dnnl_key k = {.op = DT_DNNL_MATMUL, .dt = dnnl_type(p),
                     .d = {s->M, s->N, s->K, (int)s->sa[0], (int)s->sa[1], (int)s->sb[0], (int)s->sb[1], s->bias,
                           s->accumulate, s->a_bf16 && p == DT_BF16, s->b_bf16 && p == DT_BF16}};
    dt_dnnl_entry *e = dt_dnnl_lookup(&k);
    if (!e || e->used) return e && !e->failed ? e : NULL;
    int64_t ad[2] = {s->M, s->K}, bd[2] = {s->K, s->N}, cd[2] = {s->M, s->N}, biasd[2] = {1, s->N};
    dnnl_memory_desc_t md[4] = {dt_dnnl_md(2, ad, k.dt, s->sa), dt_dnnl_md(2, bd, k.dt, s->sb),
                                dt_dnnl_md(2, cd, dnnl_f32, NULL), dt_dnnl_md(2, biasd, dnnl_f32, NULL)};
    /* low precision: B in the layout oneDNN wants (bf16 brgemm takes pairs interleaved, VNNI);
     * f32 inputs outside, reorders convert A and B */
    const bool lowp = k.dt != dnnl_f32;
    const dnnl_memory_desc_t ext[2] = {dt_dnnl_md(2, ad, dnnl_f32, s->sa),
                                       dt_dnnl_md(2, bd, k.d[10] ? dnnl_bf16 : dnnl_f32, s->sb)};
    if (lowp) {
        const dnnl_dims_t b2 = {s->K, s->N};
        dnnl_memory_desc_init_by_tag(&md[1], 2, b2, k.dt, dnnl_format_tag_any);
    }
    int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_matmul_desc_init(&desc, &md[0], &md[1], s->bias ? &md[3] : NULL, &md[2]) == dnnl_success &&
        dnnl_primitive_attr_create(&attr) == dnnl_success) {
        if (s->accumulate && dnnl_post_ops_create(&po) == dnnl_success) {
            dnnl_post_ops_append_sum(po, 1.0f);
            dnnl_primitive_attr_set_post_ops(attr, po);
        }
        if (dnnl_primitive_desc_create(&pd, &desc, attr, tls.eng, NULL) != dnnl_success) pd = NULL;
    }
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    const int nargs = s->bias ? 4 : 3;
    dnnl_memory_t m[4] = {0};
    if (!pd) return dt_dnnl_ready(e, false), NULL;
    if (lowp) md[1] = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    /* B dense (row- or column-major) in a VNNI layout: packed by dt_dnnl_vnni_pack at each run
     * (cpu_onednn_pack.c) */
    const bool dense = s->sb[1] == 1 || (s->sb[0] == 1 && !k.d[10]);  /* bf16 B: row-major only */
    const int nb = lowp && k.dt == dnnl_bf16 && dense ? dt_dnnl_vnni_block(&md[1], s->K, s->N) : 0;
    if (nb && (e->tmp = malloc(dnnl_memory_desc_get_size(&md[1])))) e->pack_nb = nb, e->pack_kp = dt_dnnl_vnni_padded_k(&md[1]);
    for (int i = 0; i < nargs; i++)
        m[i] = lowp && i < 2 && !(i == 1 && e->pack_nb) && !(i == 0 && k.d[9]) ? dt_dnnl_input(e, &ext[i], &md[i], i)
                                                                                : dt_dnnl_mem(e, &md[i], i);
    return dt_dnnl_ready(e, dt_dnnl_step_add(e, pd, nargs, arg, m, true)) ? e : NULL;
}

/* A matmul ready to run at precision p: the entry, and whether the inputs go in as f32 (f32, or
 * native low precision: its reorders convert) or rounded to p (oneDNN lacks the kernel at p). */
typedef struct {
    dt_dnnl_entry *e;
    dt_dtype p;
    bool round;
    const mm_shape *s;
} mm_plan;

static bool mm_prepare(mm_plan *pl, const mm_shape *s, dt_dtype p) {
    pl->p = p, pl->round = false, pl->s = s;
    if ((pl->e = mm_entry(s, p))) return true;
    pl->round = p != DT_F32;
    return pl->round && (pl->e = mm_entry(s, DT_F32));
}

/* x (n floats) as plan pl takes it: as is (f32, or a native low-precision entry, whose reorders
 * convert), or rounded to the precision (the f32 fallback; slot 0..2). */
static const void *mm_operand(const mm_plan *pl, int slot, const float *x, size_t n) {
    return pl->p != DT_F32 && pl->round ? (const void *)dt_dnnl_rounded(slot, x, n, pl->p) : x;
}

static void mm_run(const mm_plan *pl, float *c, const void *a, const void *b, const float *bias) {
    if (pl->e->pack_nb) {
        const mm_shape *s = pl->s;
        const bool cols = s->sb[1] != 1;
        if (pl->e->key.d[10]) dt_dnnl_vnni_pack_bf16(pl->e->tmp, b, s->K, s->N, s->sb[0], pl->e->pack_nb, pl->e->pack_kp);
        else
            dt_dnnl_vnni_pack(pl->e->tmp, b, s->K, s->N, cols ? s->sb[1] : s->sb[0], pl->e->pack_nb, pl->e->pack_kp,
                              cols);
        b = pl->e->tmp;
    }
    void *data[4] = {(void *)a, (void *)b, c, (void *)bias};
    dt_dnnl_run(pl->e, data);
}

/* The blas kernels at precision p: the fallback where oneDNN has no primitive or a dim is 0. */
static const dt_backend *fallback(dt_dtype p) { return p == DT_F32 ? dt_backend_cpu() : dt_backend_blas_lowp(p); }

static void linear_forward(dt_dtype p, float *out, const float *in, const float *w, const float *b, int B, int C,
                           int OC) {
    mm_shape s = {.M = B, .N = OC, .K = C, .sa = {C, 1}, .sb = {1, C}, .bias = b != NULL};
    mm_plan pl;
    if (B <= 0 || OC <= 0 || C <= 0 || !mm_prepare(&pl, &s, p))
        return fallback(p)->linear_forward(out, in, w, b, B, C, OC);
    mm_run(&pl, out, mm_operand(&pl, 0, in, (size_t)B * C), mm_operand(&pl, 1, w, (size_t)OC * C), b);
}

/* in (n bf16) widened to f32 (slot 3): for a GEMM that has no bf16 entry here (rounding it again
 * to bf16 gives the same values). */
static const float *widened(const uint16_t *in, size_t n) {
    float *f = grow(3, n * sizeof(float) + 4);
    dt_widen_bf16(f, in, n);
    return f;
}

/* The bf16 table's linear of a bf16 in: a native entry takes it as A as it is. */
static void lf_bf16_in(float *out, const uint16_t *in, const float *w, const float *b, int B, int C, int OC) {
    mm_shape s = {.M = B, .N = OC, .K = C, .sa = {C, 1}, .sb = {1, C}, .bias = b != NULL, .a_bf16 = true};
    mm_plan pl;
    if (B > 0 && OC > 0 && C > 0 && mm_prepare(&pl, &s, DT_BF16) && !pl.round) return mm_run(&pl, out, in, w, b);
    linear_forward(DT_BF16, out, widened(in, (size_t)B * C), w, b, B, C, OC);
}

/* d16 (B, OC) = dout cast to bf16, and db (OC; NULL: none) += dout's column sums, row by row (the
 * row is summed while the cast has it in cache; each column is summed in row order, as before). */
static void cast_and_bias_sums(uint16_t *d16, float *db, const float *dout, int B, int OC) {
    for (int i = 0; i < B; i++) {
        const float *restrict row = dout + (size_t)i * OC;
        dt_cast_bf16(d16 + (size_t)i * OC, row, (size_t)OC);
        if (db)
            for (int j = 0; j < OC; j++) db[j] += row[j];
    }
}

/* db (OC) += the column sums of dout (B, OC); db NULL: nothing. */
static void bias_sums(float *db, const float *dout, int B, int OC) {
    if (db)
        for (int i = 0; i < B; i++) {
            const float *restrict row = dout + (size_t)i * OC;
            for (int j = 0; j < OC; j++) db[j] += row[j];
        }
}

/* dw (OC,C) += dout^T (OC,B) @ in (B,C);  din (B,C) = dout (B,OC) @ w (OC,C). in is f32, or bf16
 * (in16, at bf16: a native dw entry packs it as it is; in is NULL then). */
static void linear_backward_of(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                               const uint16_t *in16, const float *w, int B, int C, int OC) {
    /* at bf16 where the CPU casts fast, dout is cast once for both GEMMs (else each converts it) */
    const bool cast = p == DT_BF16 && dw && din && dt_dnnl_cast_fast();
    mm_shape sw = {.M = OC, .N = C, .K = B, .sa = {1, OC}, .sb = {C, 1}, .accumulate = true, .a_bf16 = cast,
                   .b_bf16 = in16 != NULL};
    mm_shape sd = {.M = B, .N = C, .K = OC, .sa = {OC, 1}, .sb = {C, 1}, .a_bf16 = cast};
    mm_plan pw = {0}, pd = {0};
    const bool ok = B > 0 && OC > 0 && C > 0 && (!dw || mm_prepare(&pw, &sw, p)) && (!din || mm_prepare(&pd, &sd, p));
    if (in16 && (!ok || (dw && pw.round)))  /* no native dw entry for a bf16 in */
        return linear_backward_of(p, din, dw, db, dout, widened(in16, (size_t)B * C), NULL, w, B, C, OC);
    if (!ok) return fallback(p)->linear_backward(din, dw, db, dout, in, w, B, C, OC);
    const void *b_in = in16 ? (const void *)in16 : (const void *)in;
    if (cast && !pw.round && !pd.round) {  /* both native bf16 entries, keyed to take the cast */
        uint16_t *d16 = grow(0, (size_t)B * OC * sizeof(uint16_t));
        cast_and_bias_sums(d16, db, dout, B, OC);
        mm_run(&pw, dw, d16, b_in, NULL);
        return mm_run(&pd, din, d16, w, NULL);
    }
    if (cast) {  /* an f32 fallback entry: the a_bf16 key never reached a bf16 entry */
        sw.a_bf16 = sd.a_bf16 = false;
        if (!mm_prepare(&pw, &sw, p) || !mm_prepare(&pd, &sd, p))
            return linear_backward_of(p, din, dw, db, dout, in ? in : widened(in16, (size_t)B * C), NULL, w, B, C, OC);
    }
    /* dout is rounded once when both GEMMs take it the same way (fallback), else passed as is */
    const void *d = mm_operand(dw ? &pw : &pd, 0, dout, (size_t)B * OC);
    if (dw) mm_run(&pw, dw, d, in16 ? b_in : mm_operand(&pw, 1, in, (size_t)B * C), NULL);
    bias_sums(db, dout, B, OC);
    if (din) {
        if (dw && pw.round != pd.round) d = mm_operand(&pd, 0, dout, (size_t)B * OC);
        mm_run(&pd, din, d, mm_operand(&pd, 2, w, (size_t)OC * C), NULL);
    }
}

static void linear_backward(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                            const float *w, int B, int C, int OC) {
    linear_backward_of(p, din, dw, db, dout, in, NULL, w, B, C, OC);
}

static void lb_bf16_in(float *din, float *dw, float *db, const float *dout, const uint16_t *in, const float *w, int B,
                       int C, int OC) {
    linear_backward_of(DT_BF16, din, dw, db, dout, NULL, in, w, B, C, OC);
}

/* Whether the bf16 table's linears take bf16 values: where its GEMMs are native bf16. */
static bool linear_bf16_values(void) { return dt_onednn_bf16_native() && dt_dnnl_cast_fast(); }

#define DT_ONEDNN_WRAPPERS(sfx, P)                                                                                      \
    static void lf_##sfx(float *out, const float *in, const float *w, const float *b, int B, int C, int OC) {         \
        linear_forward(P, out, in, w, b, B, C, OC);                                                                     \
    }                                                                                                                   \
    static void lb_##sfx(float *din, float *dw, float *db, const float *dout, const float *in, const float *w, int B,  \
                         int C, int OC) {                                                                               \
        linear_backward(P, din, dw, db, dout, in, w, B, C, OC);                                                         \
    }                                                                                                                   \
    static void cf_##sfx(float *out, const float *in, const float *w, const float *b, float *work, int B, int C,       \
                         int H, int W, int OC, int K, int S, int Pd) {                                                  \
        dt_dnnl_conv_forward(P, out, in, w, b, work, B, C, H, W, OC, K, S, Pd);                                         \
    }                                                                                                                   \
    static void cb_##sfx(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,         \
                         float *work, int B, int C, int H, int W, int OC, int K, int S, int Pd) {                       \
        dt_dnnl_conv_backward(P, din, dw, db, dout, in, w, work, B, C, H, W, OC, K, S, Pd);                             \
    }
DT_ONEDNN_WRAPPERS(f32, DT_F32)
DT_ONEDNN_WRAPPERS(bf16, DT_BF16)
DT_ONEDNN_WRAPPERS(f16, DT_F16)

/* the blocked convolutions at bf16 and fp16 (f32 has its own entries) */
#define DT_ONEDNN_BLOCKED_WRAPPERS(sfx, P)                                                                              \
    static void cfb_##sfx(float *out, const float *in, const float *w, const float *b, int B, int C, int H, int W,     \
                          int OC, int K, int S, int Pd, dt_layout in_l, dt_layout out_l) {                              \
        dt_dnnl_conv_forward_blocked_lowp(P, out, in, w, b, B, C, H, W, OC, K, S, Pd, in_l, out_l);                     \
    }                                                                                                                   \
    static void cbb_##sfx(float *din, float *dw, float *db, const float *dout, const float *in, const float *w, int B, \
                          int C, int H, int W, int OC, int K, int S, int Pd, dt_layout in_l, dt_layout out_l) {         \
        dt_dnnl_conv_backward_blocked_lowp(P, din, dw, db, dout, in, w, B, C, H, W, OC, K, S, Pd, in_l, out_l);         \
    }
DT_ONEDNN_BLOCKED_WRAPPERS(bf16, DT_BF16)
DT_ONEDNN_BLOCKED_WRAPPERS(f16, DT_F16)

static dt_backend tables[3];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void fill_tables(void) {
    static const dt_dtype prec[3] = {DT_F32, DT_BF16, DT_F16};
    for (int i = 0; i < 3; i++) {
        dt_backend *t = &tables[i];
        *t = *dt_backend_cpu();
        t->name = "onednn";
        t->precision = prec[i];
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
        t->conv_pool_forward = dt_conv_pool_forward, t->conv_pool_backward = dt_conv_pool_backward;
        /* at bf16 the values between bf16 convs and max pools may stay bf16 (nn/graph_layout.c) */
        if (i == 1) {
            t->linear_bf16_values = linear_bf16_values;
            t->linear_forward_bf16 = lf_bf16_in, t->linear_backward_bf16 = lb_bf16_in;
            t->conv2d_bf16_values = dt_dnnl_conv_bf16_values;
            t->maxpool2d_forward_blocked_bf16 = dt_maxpool2d_forward_blocked_bf16;
            t->maxpool2d_backward_blocked_bf16 = dt_maxpool2d_backward_blocked_bf16;
        }
    }
}

const dt_backend *dt_backend_onednn(dt_dtype precision) {
    int i = precision == DT_F32 ? 0 : precision == DT_BF16 ? 1 : precision == DT_F16 ? 2 : -1;
    if (i < 0) return NULL;
    pthread_once(&tables_once, fill_tables);
    return &tables[i];
}

bool dt_onednn_built(void) { return true; }

#else /* built without oneDNN */

const dt_backend *dt_backend_onednn(dt_dtype precision) { return (void)precision, NULL; }
bool dt_onednn_built(void) { return false; }
bool dt_onednn_bf16_native(void) { return false; }
size_t dt_onednn_cache_misses(void) { return 0; }
int dt_onednn_cache_capacity(void) { return 0; }
void dt_onednn_impls(char *buf, size_t n) {
    if (n) snprintf(buf, n, "built without oneDNN");
}

#endif
