/* oneDNN matmuls (cpu_onednn.c has the engine and the primitive cache): the linear and matmul_t
 * layers' forward and both backward GEMMs at f32, bf16 or fp16 inputs with f32 accumulation, and
 * at bf16 with bf16 inputs the graph stores (nn/graph_layout.c). At bf16 on a CPU with
 * AVX512-BF16 the GEMMs' B operands are packed and a linear layer's output gradient is cast by
 * our code (cpu_onednn_pack.c, dt_cast_bf16), not by oneDNN's reorders. Only compiled with
 * DT_HAVE_DNNL. */
#include "backend/backend.h"

#if DT_HAVE_DNNL
#include <stdlib.h>

#include "backend/onednn.h"

/* ---- matmul: C(M,N) (+)= A(M,K) @ B(K,N) [+ bias(N)], A and B strided, C row-major ----------- */

typedef struct {
    int M, N, K;
    int64_t sa[2], sb[2];
    bool bias, accumulate;
    bool a_bf16; /* at bf16: A arrives cast already (dt_cast_bf16), not f32 */
    bool b_bf16; /* at bf16: B arrives as bf16 values (row-major), not f32 */
    bool c_bf16; /* at bf16: C is written bf16 (oneDNN rounds it), not f32; never accumulated */
} mm_shape;

static dnnl_data_type_t dnnl_type(dt_dtype p) { return p == DT_BF16 ? dnnl_bf16 : p == DT_F16 ? dnnl_f16 : dnnl_f32; }

/* The entry of s with inputs of dtype p (f32 when p is), NULL when oneDNN has none (or only an
 * emulated bf16 one: dt_onednn_bf16_native). */
static dt_dnnl_entry *mm_entry(const mm_shape *s, dt_dtype p) {
    if (p == DT_BF16 && !dt_onednn_bf16_native()) return NULL;
    dt_dnnl_key k = {.op = DT_DNNL_MATMUL,
                     .dt = dnnl_type(p),
                     .d = {s->M, s->N, s->K, (int)s->sa[0], (int)s->sa[1], (int)s->sb[0], (int)s->sb[1], s->bias,
                           s->accumulate, s->a_bf16 && p == DT_BF16, s->b_bf16 && p == DT_BF16,
                           s->c_bf16 && p == DT_BF16}};
    dt_dnnl_entry *e = dt_dnnl_lookup(&k);
    if (!e || e->used) return e && !e->failed ? e : NULL;
    int64_t ad[2] = {s->M, s->K}, bd[2] = {s->K, s->N}, cd[2] = {s->M, s->N}, biasd[2] = {1, s->N};
    dnnl_memory_desc_t md[4] = {dt_dnnl_md(2, ad, k.dt, s->sa), dt_dnnl_md(2, bd, k.dt, s->sb),
                                dt_dnnl_md(2, cd, k.d[11] ? dnnl_bf16 : dnnl_f32, NULL),
                                dt_dnnl_md(2, biasd, dnnl_f32, NULL)};
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
        dnnl_primitive_attr_create(&attr) == dnnl_success &&
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success) {
        if (s->accumulate && dnnl_post_ops_create(&po) == dnnl_success) {
            dnnl_post_ops_append_sum(po, 1.0f);
            dnnl_primitive_attr_set_post_ops(attr, po);
        }
        if (dnnl_primitive_desc_create(&pd, &desc, attr, dt_dnnl_engine(), NULL) != dnnl_success) pd = NULL;
    }
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    const int nargs = s->bias ? 4 : 3;
    dnnl_memory_t m[4] = {0};
    if (!pd) return dt_dnnl_ready(e, false), NULL;
    if (lowp) md[1] = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    /* B dense (row- or column-major) in a VNNI layout: packed by dt_dnnl_vnni_pack at each run
     * (cpu_onednn_pack.c) */
    const bool dense = s->sb[1] == 1 || (s->sb[0] == 1 && !k.d[10]); /* bf16 B: row-major only */
    const int nb = lowp && k.dt == dnnl_bf16 && dense ? dt_dnnl_vnni_block(&md[1], s->K, s->N) : 0;
    if (nb && (e->tmp = dt_dnnl_alloc(dnnl_memory_desc_get_size(&md[1]))))
        e->pack_nb = nb, e->pack_kp = dt_dnnl_vnni_padded_k(&md[1]);
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
    if (s->c_bf16) return false; /* a bf16 C only from a native entry */
    return pl->round && (pl->e = mm_entry(s, DT_F32));
}

/* x (n floats) as plan pl takes it: as is (f32, or a native low-precision entry, whose reorders
 * convert), or rounded to the precision (the f32 fallback; slot 0..2). */
static const void *mm_operand(const mm_plan *pl, int slot, const float *x, size_t n) {
    return pl->p != DT_F32 && pl->round ? (const void *)dt_dnnl_rounded(slot, x, n, pl->p) : x;
}

static void mm_run(const mm_plan *pl, void *c, const void *a, const void *b, const float *bias) {
    if (!a || !b) return; /* an operand's scratch could not be had: the kernel error is set */
    if (pl->e->pack_nb) {
        const mm_shape *s = pl->s;
        const dt_vnni_src kind = pl->e->key.d[10] ? DT_VNNI_BF16_ROWS
                                 : s->sb[1] != 1  ? DT_VNNI_F32_COLS
                                                  : DT_VNNI_F32_ROWS;
        dt_dnnl_vnni_pack(pl->e->tmp, b, kind, s->K, s->N, kind == DT_VNNI_F32_COLS ? s->sb[1] : s->sb[0],
                          pl->e->pack_nb, pl->e->pack_kp);
        b = pl->e->tmp;
    }
    void *data[4] = {(void *)a, (void *)b, c, (void *)bias};
    dt_dnnl_run(pl->e, data);
}

/* The blas kernels at precision p: the fallback where oneDNN has no primitive or a dim is 0. */
static const dt_kernel_table *fallback(dt_dtype p) { return p == DT_F32 ? dt_backend_cpu() : dt_backend_blas_lowp(p); }

/* The fallback's workspace (its rounded inputs at bf16/fp16): this thread's scratch slot 5. */
static float *fallback_work(dt_dtype p, int B, int C, int OC) {
    const size_t n = p == DT_F32 ? 0 : fallback(p)->linear_workspace(B, C, OC);
    return n ? dt_dnnl_scratch(5, n * sizeof(float)) : NULL;
}

void dt_dnnl_linear_forward(dt_dtype p, float *out, const float *in, const float *w, const float *b, int B, int C,
                            int OC) {
    mm_shape s = {.M = B, .N = OC, .K = C, .sa = {C, 1}, .sb = {1, C}, .bias = b != NULL};
    mm_plan pl;
    if (B <= 0 || OC <= 0 || C <= 0 || !mm_prepare(&pl, &s, p)) {
        float *work = fallback_work(p, B, C, OC);
        if (work || p == DT_F32) fallback(p)->linear_forward(out, in, w, b, work, B, C, OC);
        return;
    }
    mm_run(&pl, out, mm_operand(&pl, 0, in, (size_t)B * C), mm_operand(&pl, 1, w, (size_t)OC * C), b);
}

/* in (n bf16) widened to f32 (slot 3): for a GEMM that has no bf16 entry here (rounding it again
 * to bf16 gives the same values). */
static const float *widened(const uint16_t *in, size_t n) {
    float *f = dt_dnnl_scratch(3, n * sizeof(float) + 4);
    if (f) dt_widen_bf16(f, in, n);
    return f;
}

/* The bf16 table's linear of a bf16 in: a native entry takes it as A as it is. */
void dt_dnnl_linear_forward_bf16(float *out, const uint16_t *in, const float *w, const float *b, int B, int C, int OC) {
    mm_shape s = {.M = B, .N = OC, .K = C, .sa = {C, 1}, .sb = {1, C}, .bias = b != NULL, .a_bf16 = true};
    mm_plan pl;
    if (B > 0 && OC > 0 && C > 0 && mm_prepare(&pl, &s, DT_BF16) && !pl.round) return mm_run(&pl, out, in, w, b);
    const float *f = widened(in, (size_t)B * C);
    if (f) dt_dnnl_linear_forward(DT_BF16, out, f, w, b, B, C, OC);
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

/* Both native bf16 GEMMs of a linear's backward, keyed to take dout cast (a_bf16): dout is cast
 * once (slot 0) with db's sums, then dw (OC,C) += d16^T @ in and din = d16 @ w (f32, or bf16 where
 * pd was keyed with c_bf16). */
static void native_backward(const mm_plan *pw, const mm_plan *pd, void *din, float *dw, float *db, const float *dout,
                            const void *in, const float *w, int B, int OC) {
    uint16_t *d16 = dt_dnnl_scratch(0, (size_t)B * OC * sizeof(uint16_t));
    if (!d16) return;
    cast_and_bias_sums(d16, db, dout, B, OC);
    mm_run(pw, dw, d16, in, NULL);
    mm_run(pd, din, d16, w, NULL);
}

/* dw (OC,C) += dout^T (OC,B) @ in (B,C);  din (B,C) = dout (B,OC) @ w (OC,C). in is f32, or bf16
 * (in16, at bf16: a native dw entry packs it as it is; in is NULL then). */
static void linear_backward_of(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                               const uint16_t *in16, const float *w, int B, int C, int OC) {
    /* at bf16 where the CPU casts fast, dout is cast once for both GEMMs (else each converts it) */
    const bool cast = p == DT_BF16 && dw && din && dt_dnnl_cast_fast();
    mm_shape sw = {.M = OC,
                   .N = C,
                   .K = B,
                   .sa = {1, OC},
                   .sb = {C, 1},
                   .accumulate = true,
                   .a_bf16 = cast,
                   .b_bf16 = in16 != NULL};
    mm_shape sd = {.M = B, .N = C, .K = OC, .sa = {OC, 1}, .sb = {C, 1}, .a_bf16 = cast};
    mm_plan pw = {0}, pd = {0};
    const bool ok = B > 0 && OC > 0 && C > 0 && (!dw || mm_prepare(&pw, &sw, p)) && (!din || mm_prepare(&pd, &sd, p));
    if (in16 && (!ok || (dw && pw.round))) { /* no native dw entry for a bf16 in */
        const float *f = widened(in16, (size_t)B * C);
        if (f) linear_backward_of(p, din, dw, db, dout, f, NULL, w, B, C, OC);
        return;
    }
    if (!ok) {
        float *work = fallback_work(p, B, C, OC);
        if (work || p == DT_F32) fallback(p)->linear_backward(din, dw, db, dout, in, w, work, B, C, OC);
        return;
    }
    const void *b_in = in16 ? (const void *)in16 : (const void *)in;
    if (cast && !pw.round && !pd.round) /* both native bf16 entries, keyed to take the cast */
        return native_backward(&pw, &pd, din, dw, db, dout, b_in, w, B, OC);
    if (cast) { /* an f32 fallback entry: the a_bf16 key never reached a bf16 entry */
        sw.a_bf16 = sd.a_bf16 = false;
        if (!mm_prepare(&pw, &sw, p) || !mm_prepare(&pd, &sd, p)) {
            const float *f = in ? in : widened(in16, (size_t)B * C);
            if (f) linear_backward_of(p, din, dw, db, dout, f, NULL, w, B, C, OC);
            return;
        }
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

void dt_dnnl_linear_backward(dt_dtype p, float *din, float *dw, float *db, const float *dout, const float *in,
                             const float *w, int B, int C, int OC) {
    linear_backward_of(p, din, dw, db, dout, in, NULL, w, B, C, OC);
}

void dt_dnnl_linear_backward_bf16(float *din, float *dw, float *db, const float *dout, const uint16_t *in,
                                  const float *w, int B, int C, int OC) {
    linear_backward_of(DT_BF16, din, dw, db, dout, NULL, in, w, B, C, OC);
}

/* db (OC; NULL: none) += the column sums of the bf16 dout (B, OC), in row order (each row
 * widened a piece at a time). */
static void bias_sums_bf16(float *db, const uint16_t *dout, int B, int OC) {
    float piece[256];
    for (int i = 0; db && i < B; i++)
        for (int j0 = 0; j0 < OC; j0 += 256) {
            const int m = OC - j0 < 256 ? OC - j0 : 256;
            dt_widen_bf16(piece, dout + (size_t)i * OC + j0, (size_t)m);
            for (int j = 0; j < m; j++) db[j0 + j] += piece[j];
        }
}

/* The bf16 table's linear of a bf16 in and a bf16 dout: both native GEMMs take dout as it is (as
 * linear_backward_of takes its cast); else dout is widened where it lies (exact; the buffer holds
 * B * OC floats, the last value first) and goes the f32 way. */
void dt_dnnl_linear_backward_bf16_grad(float *din, float *dw, float *db, uint16_t *dout, const uint16_t *in,
                                       const float *w, int B, int C, int OC) {
    mm_shape sw = {
        .M = OC, .N = C, .K = B, .sa = {1, OC}, .sb = {C, 1}, .accumulate = true, .a_bf16 = true, .b_bf16 = true};
    mm_shape sd = {.M = B, .N = C, .K = OC, .sa = {OC, 1}, .sb = {C, 1}, .a_bf16 = true};
    mm_plan pw, pd;
    bias_sums_bf16(db, dout, B, OC);
    if (B > 0 && OC > 0 && C > 0 && dw && din && dt_dnnl_cast_fast() && mm_prepare(&pw, &sw, DT_BF16) && !pw.round &&
        mm_prepare(&pd, &sd, DT_BF16) && !pd.round) {
        mm_run(&pw, dw, dout, in, NULL);
        return mm_run(&pd, din, dout, w, NULL);
    }
    float *f = (float *)(void *)dout;
    for (size_t i = (size_t)B * OC; i-- > 0;) f[i] = dt_bf16_to_f32(dout[i]); /* in place: the last first */
    linear_backward_of(DT_BF16, din, dw, NULL, f, NULL, in, w, B, C, OC);
}

/* The bf16 table's linears of a bf16 in with a bf16 out (out, B x OC) or a bf16 din (B x C): the
 * native GEMM writes it rounded; else the f32 result (slot 4) is rounded by dt_cast_bf16. */
void dt_dnnl_linear_forward_bf16io(uint16_t *out, const uint16_t *in, const float *w, const float *b, int B, int C,
                                   int OC) {
    mm_shape s = {
        .M = B, .N = OC, .K = C, .sa = {C, 1}, .sb = {1, C}, .bias = b != NULL, .a_bf16 = true, .c_bf16 = true};
    mm_plan pl;
    if (B > 0 && OC > 0 && C > 0 && mm_prepare(&pl, &s, DT_BF16)) return mm_run(&pl, out, in, w, b);
    float *f = dt_dnnl_scratch(4, (size_t)B * OC * sizeof(float));
    if (!f) return;
    dt_dnnl_linear_forward_bf16(f, in, w, b, B, C, OC);
    dt_cast_bf16(out, f, (size_t)B * OC);
}

void dt_dnnl_linear_backward_bf16_din(uint16_t *din, float *dw, float *db, const float *dout, const uint16_t *in,
                                      const float *w, int B, int C, int OC) {
    mm_shape sw = {
        .M = OC, .N = C, .K = B, .sa = {1, OC}, .sb = {C, 1}, .accumulate = true, .a_bf16 = true, .b_bf16 = true};
    mm_shape sd = {.M = B, .N = C, .K = OC, .sa = {OC, 1}, .sb = {C, 1}, .a_bf16 = true, .c_bf16 = true};
    mm_plan pw, pd;
    if (B > 0 && OC > 0 && C > 0 && dw && din && dt_dnnl_cast_fast() && mm_prepare(&pw, &sw, DT_BF16) && !pw.round &&
        mm_prepare(&pd, &sd, DT_BF16)) /* as linear_backward_of's native path, din written bf16 */
        return native_backward(&pw, &pd, din, dw, db, dout, in, w, B, OC);
    float *f = din ? dt_dnnl_scratch(4, (size_t)B * C * sizeof(float)) : NULL;
    if (din && !f) return;
    linear_backward_of(DT_BF16, f, dw, db, dout, NULL, in, w, B, C, OC);
    if (din) dt_cast_bf16(din, f, (size_t)B * C);
}

/* Whether the bf16 table's linears take bf16 values: where its GEMMs are native bf16. */
bool dt_dnnl_linear_bf16_values(void) { return dt_onednn_bf16_native() && dt_dnnl_cast_fast(); }

#endif
