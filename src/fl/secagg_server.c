/* Secure aggregation, the server's side (see secagg.h): sums the masked vectors of U3, keeps the
 * shares survivors send back, reconstructs each survivor's self-mask seed and each dropped
 * sharer's mask key from them (t-of-n, libgfshare), and strips those masks from the sum. Also
 * the fixed-point encoding both sides use. */
#include "fl/secagg.h"

#include <libgfshare.h>
#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

struct dt_fl_sa_server {
    dt_fl_sa_roster r;
    uint32_t round;
    size_t n;
    uint32_t *sum;
    uint8_t alive2[DT_SA_MAX + 1], alive3[DT_SA_MAX + 1], unmasked[DT_SA_MAX + 1];
    uint8_t *sh; /* [owner][holder] 33 bytes: kind (0 none, 1 b, 2 s key) + share */
    int nunmasked;
};

#define SH(s, owner, holder) ((s)->sh + ((size_t)(owner) * (DT_SA_MAX + 1) + (size_t)(holder)) * 33)

dt_status dt_fl_sa_server_create(dt_fl_sa_server **out, const dt_fl_sa_roster *r, uint32_t round, size_t n) {
    *out = NULL;
    if (r->n < 2 || r->n > DT_SA_MAX || r->t < 1 || r->t > r->n)
        return dt_error(DT_EINVAL, "secure aggregation: %d participants with threshold %d (need 2..255, 1 <= t <= n)",
                        r->n, r->t);
    dt_fl_sa_server *s = calloc(1, sizeof *s);
    if (s) s->sum = calloc(n, sizeof *s->sum), s->sh = calloc((size_t)(r->n + 1) * (DT_SA_MAX + 1) * 33, 1);
    if (!s || !s->sum || !s->sh) {
        dt_fl_sa_server_free(s);
        return dt_error(DT_ENOMEM, "secure aggregation: out of memory for %zu words", n);
    }
    s->r = *r, s->round = round, s->n = n;
    *out = s;
    return DT_OK;
}

void dt_fl_sa_server_free(dt_fl_sa_server *s) {
    if (!s) return;
    free(s->sum), free(s->sh), free(s);
}

void dt_fl_sa_server_shared(dt_fl_sa_server *s, int slot) {
    if (slot >= 1 && slot <= s->r.n) s->alive2[slot] = 1;
}
const uint8_t *dt_fl_sa_server_alive2(const dt_fl_sa_server *s) { return s->alive2; }
const uint8_t *dt_fl_sa_server_alive3(const dt_fl_sa_server *s) { return s->alive3; }
int dt_fl_sa_server_unmasked(const dt_fl_sa_server *s) { return s->nunmasked; }

dt_status dt_fl_sa_server_add_masked(dt_fl_sa_server *s, int slot, const uint32_t *y, size_t n) {
    if (slot < 1 || slot > s->r.n || !s->alive2[slot] || s->alive3[slot] || n != s->n)
        return dt_error(DT_EFORMAT, "secure aggregation: unexpected masked input from slot %d (%zu words)", slot, n);
    for (size_t i = 0; i < n; i++) s->sum[i] += y[i];
    s->alive3[slot] = 1;
    return DT_OK;
}

dt_status dt_fl_sa_server_add_unmask(dt_fl_sa_server *s, int holder, const uint8_t *p, size_t len) {
    if (holder < 1 || holder > s->r.n || !s->alive3[holder] || s->unmasked[holder] || len % 34)
        return dt_error(DT_EFORMAT, "secure aggregation: unexpected unmasking reply from slot %d", holder);
    for (size_t off = 0; off < len; off += 34) {
        int u = p[off], kind = p[off + 1];
        int want = u >= 1 && u <= s->r.n && s->alive2[u] ? (s->alive3[u] ? 1 : 2) : 0;
        if (kind != want)
            return dt_error(DT_EFORMAT, "secure aggregation: slot %d sent a share of kind %d for slot %d", holder, kind,
                            u);
        uint8_t *d = SH(s, u, holder);
        d[0] = (uint8_t)kind;
        memcpy(d + 1, p + off + 2, 32);
    }
    s->unmasked[holder] = 1;
    s->nunmasked++;
    return DT_OK;
}

/* Recombines owner's secret of `kind` from every share that came; DT_EPEER below threshold. */
static dt_status recombine(dt_fl_sa_server *s, int owner, int kind, uint8_t secret[32]) {
    unsigned char nrs[DT_SA_MAX], *shares[DT_SA_MAX];
    unsigned cnt = 0;
    for (int h = 1; h <= s->r.n; h++) {
        uint8_t *d = SH(s, owner, h);
        if (d[0] == kind) nrs[cnt] = (unsigned char)h, shares[cnt++] = d + 1;
    }
    if ((int)cnt < s->r.t)
        return dt_error(DT_EPEER, "secure aggregation: %u shares of slot %d's %s, threshold %d", cnt, owner,
                        kind == 1 ? "self-mask seed" : "mask key", s->r.t);
    gfshare_ctx *g = gfshare_ctx_init_dec(nrs, cnt, 32);
    if (!g) return dt_error(DT_ENOMEM, "secure aggregation: out of memory");
    for (unsigned i = 0; i < cnt; i++) gfshare_ctx_dec_giveshare(g, (unsigned char)i, shares[i]);
    gfshare_ctx_dec_extract(g, secret);
    gfshare_ctx_free(g);
    return DT_OK;
}

/* Removes the masks that dropped sharer d left in the survivors' inputs. */
static dt_status strip_dropped(dt_fl_sa_server *s, int d) {
    uint8_t ssk[32], spk[32];
    DT_TRY(recombine(s, d, 2, ssk));
    crypto_scalarmult_base(spk, ssk);
    if (memcmp(spk, s->r.spk[d - 1], 32))
        return dt_error(DT_EPEER,
                        "secure aggregation: the reconstructed mask key of slot %d does not match its "
                        "public key (a corrupt share)",
                        d);
    for (int u = 1; u <= s->r.n; u++) {
        if (!s->alive3[u]) continue;
        uint8_t key[32];
        DT_TRY(dt_fl_sa_agree(key, ssk, s->r.spk[d - 1], s->r.spk[u - 1], 's'));
        /* u added +PRG(s_ud) when d > u and -PRG when d < u */
        dt_fl_sa_prg_add(s->sum, s->n, key, s->round, d > u ? -1 : +1);
    }
    sodium_memzero(ssk, sizeof ssk);
    return DT_OK;
}

dt_status dt_fl_sa_server_finish(dt_fl_sa_server *s, uint32_t *sum) {
    int n3 = 0;
    for (int u = 1; u <= s->r.n; u++) n3 += s->alive3[u];
    if (n3 < s->r.t) return dt_error(DT_EPEER, "secure aggregation: %d masked inputs, threshold %d", n3, s->r.t);
    for (int u = 1; u <= s->r.n; u++) {
        if (s->alive3[u]) {
            uint8_t b[32];
            DT_TRY(recombine(s, u, 1, b));
            dt_fl_sa_prg_add(s->sum, s->n, b, s->round, -1);
        } else if (s->alive2[u]) {
            DT_TRY(strip_dropped(s, u));
        }
    }
    memcpy(sum, s->sum, s->n * 4);
    return DT_OK;
}

int dt_fl_sa_frac_bits(double range, double total_weight) {
    double lim = 2147483647.0 / (range * total_weight);
    int f = (int)floor(log2(lim));
    return f > 24 ? 24 : f;
}

size_t dt_fl_sa_encode(uint32_t *x, const float *v, size_t n, double w, double range, int frac) {
    size_t clamped = 0;
    double k = w * ldexp(1.0, frac);
    for (size_t i = 0; i < n; i++) {
        double a = v[i];
        if (a > range) a = range, clamped++;
        else if (a < -range) a = -range, clamped++;
        x[i] = (uint32_t)(int32_t)llrint(a * k);
    }
    return clamped;
}
