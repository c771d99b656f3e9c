/* conv -> relu -> max pool in one pass (conv_pool.h), on VW output channels at a time: vectors of
 * GCC's vector extension as wide as the CPU's registers (16 floats with AVX-512, 8 with AVX, 4
 * with SSE: backend/vec_native.h), so the same code runs (and is tested) on every x86-64 CPU.
 * Forward sums the conv's outputs of one pooled row and pools them: for 3x3 convs with 2x2
 * windows (a CNN's usual first layer) a 2 x 4 block at a time in registers, otherwise whole conv
 * rows through a small buffer. It keeps one byte per pooled value: the max's window position, or
 * a mark where the relu stops the gradient. Backward rebuilds the conv's gradient of each pooled
 * row from those bytes and the pooled gradient (the pooled one at the max's position, 0
 * elsewhere; 5 bytes read per pooled value) and sums the weight gradient from it. Each sample's
 * input is copied into a zero-padded plane first, so no loop tests the border. Sums run in a
 * fixed order: results are deterministic. */
#include "backend/conv_pool.h"

#include <stdint.h>
#include <string.h>

#include "backend/blocked.h"
#include "backend/vec_native.h"

/* a * b + c as one fused multiply-add where the CPU has one (ISO C mode turns contraction off) */
#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

/* vectors pass by value between the static functions below; GCC notes that the ABI of such
 * arguments changed, which matters only across files */
#if defined(__GNUC__) /* gcc and clang: the vectors pass between static functions only */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define BL DT_BLOCK /* channels per block of the blocked layout (blocked.h) */

/* The per-call state: the padded sample, the weights of each VW-channel group as [tap][VW]
 * vectors (tap = (c * K + ky) * K + kx), and room for PK conv rows and one pooled row. */
typedef struct {
    int HP, WP, CH, CW, OH, OW, T;
    float *xp;
    vf *wv, *rows, *row_g, *row_y;
    vi *row_w;
} work;

/* The pieces of the caller's workspace (dt_conv_pool_workspace bytes, 64-byte aligned), in order:
 * the padded sample, the weight vectors, PK conv rows, one pooled row's gradients, values and
 * window positions, and backward's per-group and per-sample sums. Each piece starts 64-aligned. */
static size_t piece(size_t bytes) { return (bytes + 63) / 64 * 64; }

static void work_sizes(const dt_conv_pool_shape *s, size_t sz[8]) {
    const size_t HP = (size_t)s->H + 2 * s->P, WP = (size_t)s->W + 2 * s->P, T = (size_t)s->C * s->K * s->K;
    const size_t CW = WP - (size_t)s->K + 1, OW = CW / (size_t)s->PK;
    sz[0] = (size_t)s->C * HP * WP * sizeof(float) + BL * sizeof(float);
    sz[1] = (size_t)s->OC / VW * T * sizeof(vf);
    sz[2] = (size_t)s->PK * CW * sizeof(vf);
    sz[3] = sz[4] = OW * sizeof(vf);
    sz[5] = OW * sizeof(vi);
    sz[6] = (size_t)s->OC / VW * (T + 1) * sizeof(vf); /* backward: tot */
    sz[7] = (T + 1) * sizeof(vf);                      /* backward: smp */
}

size_t dt_conv_pool_workspace(const dt_conv_pool_shape *s) {
    size_t sz[8], total = 0;
    work_sizes(s, sz);
    for (int i = 0; i < 8; i++) total += piece(sz[i]);
    return total;
}

/* The state over the caller's workspace ws; its last two pieces (backward's sums) at *rest. */
static work work_of(const dt_conv_pool_shape *s, const float *w, void *ws, char **rest) {
    work k = {.HP = s->H + 2 * s->P, .WP = s->W + 2 * s->P, .T = s->C * s->K * s->K};
    k.CH = k.HP - s->K + 1, k.CW = k.WP - s->K + 1, k.OH = k.CH / s->PK, k.OW = k.CW / s->PK;
    size_t sz[8];
    work_sizes(s, sz);
    char *at = ws;
    void *p[6];
    for (int i = 0; i < 6; i++) p[i] = at, at += piece(sz[i]);
    k.xp = p[0], k.wv = p[1], k.rows = p[2], k.row_g = p[3], k.row_y = p[4], k.row_w = p[5];
    memset(k.xp, 0, sz[0]);
    for (int o = 0; o < s->OC; o++)
        for (int t = 0; t < k.T; t++) k.wv[(size_t)(o / VW) * k.T + t][o % VW] = w ? w[(size_t)o * k.T + t] : 0.0f;
    if (rest) *rest = at;
    return k;
}

/* Sample n's planes into the padded buffer (its border stays 0). */
static void pad_sample(const dt_conv_pool_shape *s, const work *k, const float *in, int n) {
    for (int c = 0; c < s->C; c++)
        for (int y = 0; y < s->H; y++)
            memcpy(k->xp + ((size_t)c * k->HP + y + s->P) * k->WP + s->P,
                   in + (((size_t)n * s->C + c) * s->H + y) * s->W, (size_t)s->W * sizeof(float));
}

/* conv_row for 3x3 kernels: eight outputs at a time, each (c, ky)'s three taps in registers. */
static int conv_row3(const dt_conv_pool_shape *s, const work *k, vf *restrict r, const vf *restrict wv, vf bv, int cy) {
    int cx = 0;
    for (; cx + 8 <= k->CW; cx += 8) {
        vf a0 = bv, a1 = bv, a2 = bv, a3 = bv, a4 = bv, a5 = bv, a6 = bv, a7 = bv;
        for (int c = 0; c < s->C; c++)
            for (int ky = 0; ky < 3; ky++) {
                const float *x = k->xp + ((size_t)c * k->HP + cy + ky) * k->WP + cx;
                const vf *w = wv + (c * 3 + ky) * 3;
                for (int kx = 0; kx < 3; kx++) {
                    const vf t = w[kx];
                    a0 += t * x[kx], a1 += t * x[kx + 1], a2 += t * x[kx + 2], a3 += t * x[kx + 3];
                    a4 += t * x[kx + 4], a5 += t * x[kx + 5], a6 += t * x[kx + 6], a7 += t * x[kx + 7];
                }
            }
        r[cx] = a0, r[cx + 1] = a1, r[cx + 2] = a2, r[cx + 3] = a3;
        r[cx + 4] = a4, r[cx + 5] = a5, r[cx + 6] = a6, r[cx + 7] = a7;
    }
    return cx;
}

/* Conv row cy of one channel block (weights wv, bias bv) into r[0..CW). Several outputs at a time:
 * independent sums hide the FMA latency. */
static void conv_row(const dt_conv_pool_shape *s, const work *k, vf *restrict r, const vf *restrict wv, vf bv, int cy) {
    const int K = s->K, CW = k->CW;
    int cx = K == 3 ? conv_row3(s, k, r, wv, bv, cy) : 0;
    for (; cx + 4 <= CW; cx += 4) {
        vf a0 = bv, a1 = bv, a2 = bv, a3 = bv;
        const vf *wt = wv;
        for (int c = 0; c < s->C; c++)
            for (int ky = 0; ky < K; ky++) {
                const float *x = k->xp + ((size_t)c * k->HP + cy + ky) * k->WP + cx;
                for (int kx = 0; kx < K; kx++, wt++)
                    a0 += *wt * x[kx], a1 += *wt * x[kx + 1], a2 += *wt * x[kx + 2], a3 += *wt * x[kx + 3];
            }
        r[cx] = a0, r[cx + 1] = a1, r[cx + 2] = a2, r[cx + 3] = a3;
    }
    for (; cx < CW; cx++) {
        vf a = bv;
        const vf *wt = wv;
        for (int c = 0; c < s->C; c++)
            for (int ky = 0; ky < K; ky++)
                for (int kx = 0; kx < K; kx++, wt++) a += *wt * k->xp[((size_t)c * k->HP + cy + ky) * k->WP + cx + kx];
        r[cx] = a;
    }
}

/* Where the first channel of (sample n, channel group ob: channels ob * VW on, pooled row oy,
 * column ox) lives in out's layout, with *ls the stride between the group's channels (a group
 * lies inside one block, as VW divides BL). */
_Static_assert(BL % VW == 0, "a channel group of VW must lie inside one block of the layout");
static size_t out_at(const dt_conv_pool_shape *s, const work *k, int n, int ob, int oy, int ox, size_t *ls) {
    const size_t OHW = (size_t)k->OH * k->OW, p = (size_t)oy * k->OW + ox, c0 = (size_t)ob * VW;
    *ls = s->out_bl ? 1 : OHW;
    if (s->out_bl && s->out_nhwc) return ((size_t)n * OHW + p) * s->OC + c0;
    return s->out_bl ? (((size_t)n * (s->OC / BL) + c0 / BL) * OHW + p) * BL + c0 % BL
                     : ((size_t)n * s->OC + c0) * OHW + p;
}

/* One step of a window's max: v (at window position q) replaces m when larger or NaN. */
static inline void max_step(vf *m, vi *at, vf v, int q) {
    const vi t = (v > *m) | (v != v);
    *m = vf_select(t, v, *m);
    *at = (t & q) | (*at & ~t);
}

/* The relu after the pool: 0 and no gradient where the max is not positive. */
static inline void relu_step(vf *m, vi *at) {
    const vi pass = *m > 0;
    *m = vf_select(pass, *m, (vf){0});
    *at = (*at & pass) | (DT_CONV_POOL_STOP & ~pass);
}

/* Pools rows[0..PK) (the conv rows of pooled row oy) into row_y / row_w. */
static void pool_row(const dt_conv_pool_shape *s, const work *k) {
    const int PK = s->PK;
    for (int ox = 0; ox < k->OW; ox++) {
        vf m = k->rows[ox * PK];
        vi at = (vi){0};
        for (int py = 0; py < PK; py++)
            for (int px = !py; px < PK; px++) /* window order; (0, 0) is m's start */
                max_step(&m, &at, k->rows[(size_t)py * k->CW + ox * PK + px], py * PK + px);
        if (s->relu) relu_step(&m, &at);
        k->row_y[ox] = m, k->row_w[ox] = at;
    }
}

/* 3x3 convs and 2x2 windows: the conv's 2 x NC block at (2 oy, 2 ox0) summed in registers and
 * pooled there, into row_y / row_w [ox0, ox0 + NC / 2); NC is 4 or 2 (a constant once inlined). */
static inline __attribute__((always_inline)) void conv_pool_block(const dt_conv_pool_shape *s, const work *k,
                                                                  const vf *restrict wv, vf bv, int oy, int ox0,
                                                                  const int NC) {
    vf a0[4] = {bv, bv, bv, bv}, a1[4] = {bv, bv, bv, bv}; /* conv rows 2 oy and 2 oy + 1 */
    for (int c = 0; c < s->C; c++)
        for (int t = 0; t < 4; t++) { /* input row 2 oy + t: tap row t of a0, t - 1 of a1 */
            const float *x = k->xp + ((size_t)c * k->HP + 2 * oy + t) * k->WP + 2 * ox0;
            for (int kx = 0; kx < 3; kx++) {
                if (t < 3) {
                    const vf w = wv[(c * 3 + t) * 3 + kx];
                    for (int j = 0; j < NC; j++) a0[j] += w * x[kx + j];
                }
                if (t > 0) {
                    const vf w = wv[(c * 3 + t - 1) * 3 + kx];
                    for (int j = 0; j < NC; j++) a1[j] += w * x[kx + j];
                }
            }
        }
    for (int q = 0; q < NC / 2; q++) {
        vf m = a0[2 * q];
        vi at = (vi){0};
        max_step(&m, &at, a0[2 * q + 1], 1);
        max_step(&m, &at, a1[2 * q], 2);
        max_step(&m, &at, a1[2 * q + 1], 3);
        if (s->relu) relu_step(&m, &at);
        k->row_y[ox0 + q] = m, k->row_w[ox0 + q] = at;
    }
}

/* Pooled row oy of one channel block into row_y / row_w. */
static void conv_pool_row(const dt_conv_pool_shape *s, const work *k, const vf *wv, vf bv, int oy) {
    if (s->K == 3 && s->PK == 2) {
        int ox = 0;
        for (; ox + 2 <= k->OW; ox += 2) conv_pool_block(s, k, wv, bv, oy, ox, 4);
        if (ox < k->OW) conv_pool_block(s, k, wv, bv, oy, ox, 2);
        return;
    }
    for (int py = 0; py < s->PK; py++) conv_row(s, k, k->rows + (size_t)py * k->CW, wv, bv, oy * s->PK + py);
    pool_row(s, k);
}

void dt_conv_pool_forward(const dt_conv_pool_shape *s, float *out, uint8_t *win, const float *in, const float *w,
                          const float *b, void *ws) {
    work k = work_of(s, w, ws, NULL);
    for (int n = 0; n < s->B; n++) {
        pad_sample(s, &k, in, n);
        for (int ob = 0; ob < s->OC / VW; ob++) {
            const vf bv = b ? vf_load(b + ob * VW) : (vf){0};
            for (int oy = 0; oy < k.OH; oy++) {
                conv_pool_row(s, &k, k.wv + (size_t)ob * k.T, bv, oy);
                for (int ox = 0; ox < k.OW; ox++) {
                    size_t ls, o = out_at(s, &k, n, ob, oy, ox, &ls);
                    const vb wb = vi_low8(k.row_w[ox]);
                    if (s->out_bf16) { /* blocked or NHWC (ls 1): VW bf16 values */
                        const vh h = vf_to_bf16(k.row_y[ox]);
                        memcpy((uint16_t *)out + o, &h, sizeof h), memcpy(win + o, &wb, sizeof wb);
                    } else if (ls == 1) memcpy(out + o, &k.row_y[ox], sizeof(vf)), memcpy(win + o, &wb, sizeof wb);
                    else
                        for (int l = 0; l < VW; l++) out[o + l * ls] = k.row_y[ox][l], win[o + l * ls] = wb[l];
                }
            }
        }
    }
}

/* weight_row for 3x3 kernels: each (c, ky)'s three taps at once (one load of g for three), over
 * even and odd columns: six independent sums. */
static void weight_row3(const dt_conv_pool_shape *s, const work *k, vf *restrict acc, const vf *restrict g, int ncx,
                        int cy) {
    for (int c = 0; c < s->C; c++)
        for (int ky = 0; ky < 3; ky++) {
            const float *x = k->xp + ((size_t)c * k->HP + cy + ky) * k->WP;
            vf e0 = {0}, e1 = {0}, e2 = {0}, o0 = {0}, o1 = {0}, o2 = {0};
            int cx = 0;
            for (; cx + 2 <= ncx; cx += 2) {
                const vf ge = g[cx], go = g[cx + 1];
                e0 += ge * x[cx], e1 += ge * x[cx + 1], e2 += ge * x[cx + 2];
                o0 += go * x[cx + 1], o1 += go * x[cx + 2], o2 += go * x[cx + 3];
            }
            if (cx < ncx) e0 += g[cx] * x[cx], e1 += g[cx] * x[cx + 1], e2 += g[cx] * x[cx + 2];
            vf *a = acc + (c * 3 + ky) * 3;
            a[0] += e0 + o0, a[1] += e1 + o1, a[2] += e2 + o2;
        }
}

/* dw of one conv row: acc[t] += sum over the row's columns cx of g[cx] * x(tap t, cx). */
static void weight_row(const dt_conv_pool_shape *s, const work *k, vf *restrict acc, const vf *restrict g, int ncx,
                       int cy) {
    const int K = s->K;
    if (K == 3) return weight_row3(s, k, acc, g, ncx, cy);
    vf *a = acc;
    for (int c = 0; c < s->C; c++)
        for (int ky = 0; ky < K; ky++)
            for (int kx = 0; kx < K; kx++, a++) {
                const float *x = k->xp + ((size_t)c * k->HP + cy + ky) * k->WP + kx;
                vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
                int cx = 0;
                for (; cx + 4 <= ncx; cx += 4)
                    a0 += g[cx] * x[cx], a1 += g[cx + 1] * x[cx + 1], a2 += g[cx + 2] * x[cx + 2],
                        a3 += g[cx + 3] * x[cx + 3];
                for (; cx < ncx; cx++) a0 += g[cx] * x[cx];
                *a += (a0 + a1) + (a2 + a3);
            }
}

/* The pooled gradient of (n, ob, oy) into row_g, 0 where the relu stopped it, and the window
 * positions into row_w; the gradient's sum into db. */
static void load_grad_row(const dt_conv_pool_shape *s, work *k, const float *dout, const uint8_t *win, int n, int ob,
                          int oy, vf *db) {
    vf sum = *db;
    for (int ox = 0; ox < k->OW; ox++) {
        size_t ls, o = out_at(s, k, n, ob, oy, ox, &ls);
        vb wb;
        vf g; /* in registers: a store of halves read back whole cannot be forwarded (a stall) */
        if (ls == 1) g = vf_load(dout + o), memcpy(&wb, win + o, sizeof wb);
        else
            for (int l = 0; l < VW; l++) g[l] = dout[o + l * ls], wb[l] = win[o + l * ls];
        const vi w = __builtin_convertvector(wb, vi);
        g = vf_select(w != DT_CONV_POOL_STOP, g, (vf){0});
        k->row_w[ox] = w, k->row_g[ox] = g;
        sum += g;
    }
    *db = sum;
}

void dt_conv_pool_backward(const dt_conv_pool_shape *s, float *dw, float *db, const float *dout, const uint8_t *win,
                           const float *in, void *ws) {
    char *rest;
    work k = work_of(s, NULL, ws, &rest);
    const int OB = s->OC / VW, PK = s->PK, ncx = k.OW * PK;
    vf *tot = (vf *)rest, *smp = (vf *)(rest + piece((size_t)OB * (k.T + 1) * sizeof(vf)));
    memset(tot, 0, (size_t)OB * (k.T + 1) * sizeof(vf));
    for (int n = 0; n < s->B; n++) {
        pad_sample(s, &k, in, n);
        for (int ob = 0; ob < OB; ob++) {
            memset(smp, 0, (size_t)(k.T + 1) * sizeof(vf)); /* the sample's sums, then added: shorter sums */
            for (int oy = 0; oy < k.OH; oy++) {
                load_grad_row(s, &k, dout, win, n, ob, oy, &smp[k.T]);
                for (int py = 0; py < PK; py++) {
                    vf *gc = k.rows; /* the conv's gradient on row oy * PK + py */
                    for (int ox = 0; ox < k.OW; ox++)
                        for (int px = 0; px < PK; px++)
                            gc[ox * PK + px] = vf_select(k.row_w[ox] == py * PK + px, k.row_g[ox], (vf){0});
                    weight_row(s, &k, smp, gc, ncx, oy * PK + py);
                }
            }
            for (int t = 0; t <= k.T; t++) tot[(size_t)ob * (k.T + 1) + t] += smp[t];
        }
    }
    for (int o = 0; o < s->OC; o++) {
        const vf *v = tot + (size_t)(o / VW) * (k.T + 1);
        for (int t = 0; t < k.T; t++) dw[(size_t)o * k.T + t] += v[t][o % VW];
        if (db) db[o] += v[k.T][o % VW];
    }
}
