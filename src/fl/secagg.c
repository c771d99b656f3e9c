/* Secure aggregation, the cryptographic core (see secagg.h): X25519 agreements (libsodium),
 * ChaCha20 mask expansion, XSalsa20-Poly1305 encrypted Shamir shares (libgfshare, GF(2^8)),
 * mask cancellation and the server's reconstruction for survivors and dropped clients, and the
 * fixed-point encoding. Transport-agnostic: the server and client exchange its byte records. */
#include "fl/secagg.h"

#include <libgfshare.h>
#include <math.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

struct dt_fl_sa_client {
    uint32_t round;
    uint8_t csk[32], cpk[32], ssk[32], spk[32], b[32];
    int slot;
    dt_fl_sa_roster r;
    uint8_t bsh[DT_SA_MAX + 1][32], ssh[DT_SA_MAX + 1][32]; /* shares held, by owner slot */
    uint8_t have[DT_SA_MAX + 1];
    uint8_t alive2[DT_SA_MAX + 1];
};

static void fill_rand(unsigned char *p, unsigned int n) { randombytes_buf(p, n); }
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_sodium_ok;
static void init_once(void) {
    g_sodium_ok = sodium_init() >= 0;
    gfshare_fill_rand = fill_rand; /* never libgfshare's random()-based default */
}
static dt_status sa_init(void) {
    pthread_once(&g_once, init_once);
    return g_sodium_ok ? DT_OK : dt_error(DT_EINTERNAL, "secure aggregation: libsodium failed to initialise");
}

/* (secagg.h) key = H(X25519(sk, peer) | the two public keys in sorted order | tag). */
dt_status dt_fl_sa_agree(uint8_t key[32], const uint8_t *sk, const uint8_t *mypk, const uint8_t *peer, char tag) {
    uint8_t sh[32];
    if (crypto_scalarmult(sh, sk, peer) != 0)
        return dt_error(DT_EFORMAT, "secure aggregation: a peer's public key is invalid (low order)");
    const uint8_t *lo = memcmp(mypk, peer, 32) < 0 ? mypk : peer, *hi = lo == mypk ? peer : mypk;
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, sh, 32);
    crypto_generichash_update(&st, lo, 32);
    crypto_generichash_update(&st, hi, 32);
    crypto_generichash_update(&st, (const uint8_t *)&tag, 1);
    crypto_generichash_final(&st, key, 32);
    sodium_memzero(sh, sizeof sh);
    return DT_OK;
}

/* acc[n] += sign * ChaCha20(key, nonce = round) as u32 words. */
void dt_fl_sa_prg_add(uint32_t *acc, size_t n, const uint8_t key[32], uint32_t round, int sign) {
    uint8_t nonce[crypto_stream_chacha20_NONCEBYTES] = {0};
    memcpy(nonce, &round, 4);
    uint32_t buf[1024];
    for (size_t off = 0; off < n; off += 1024) {
        size_t k = n - off < 1024 ? n - off : 1024;
        /* the keystream continues across chunks: block counter = off / 16 words per block */
        crypto_stream_chacha20_xor_ic((uint8_t *)buf, (const uint8_t *)memset(buf, 0, k * 4), k * 4, nonce,
                                      (uint64_t)(off / 16), key);
        if (sign > 0)
            for (size_t i = 0; i < k; i++) acc[off + i] += buf[i];
        else
            for (size_t i = 0; i < k; i++) acc[off + i] -= buf[i];
    }
}

dt_status dt_fl_sa_client_create(dt_fl_sa_client **out, uint32_t round, const uint8_t *seed) {
    *out = NULL;
    DT_TRY(sa_init());
    dt_fl_sa_client *c = calloc(1, sizeof *c);
    if (!c) return dt_error(DT_ENOMEM, "secure aggregation: out of memory");
    c->round = round;
    uint8_t rnd[96];
    if (seed) randombytes_buf_deterministic(rnd, sizeof rnd, seed);
    else randombytes_buf(rnd, sizeof rnd);
    memcpy(c->csk, rnd, 32), memcpy(c->ssk, rnd + 32, 32), memcpy(c->b, rnd + 64, 32);
    crypto_scalarmult_base(c->cpk, c->csk);
    crypto_scalarmult_base(c->spk, c->ssk);
    sodium_memzero(rnd, sizeof rnd);
    *out = c;
    return DT_OK;
}

void dt_fl_sa_client_free(dt_fl_sa_client *c) {
    if (!c) return;
    sodium_memzero(c, sizeof *c);
    free(c);
}

void dt_fl_sa_client_keys(const dt_fl_sa_client *c, uint8_t *cpk, uint8_t *spk) {
    memcpy(cpk, c->cpk, 32), memcpy(spk, c->spk, 32);
}

static void share_nonce(uint8_t nonce[crypto_secretbox_NONCEBYTES], uint32_t round, int from, int to) {
    memset(nonce, 0, crypto_secretbox_NONCEBYTES);
    memcpy(nonce, "SAsh", 4);
    memcpy(nonce + 4, &round, 4);
    nonce[8] = (uint8_t)from, nonce[9] = (uint8_t)to;
}

dt_status dt_fl_sa_client_share(dt_fl_sa_client *c, const dt_fl_sa_roster *r, int slot, dt_fl_buf *out) {
    if (r->n < 2 || r->n > DT_SA_MAX || slot < 1 || slot > r->n || r->t < 1 || r->t > r->n)
        return dt_error(DT_EFORMAT, "secure aggregation: bad roster (n %d, t %d, slot %d)", r->n, r->t, slot);
    if (memcmp(r->cpk[slot - 1], c->cpk, 32) || memcmp(r->spk[slot - 1], c->spk, 32))
        return dt_error(DT_EFORMAT, "secure aggregation: the roster's keys for slot %d are not ours", slot);
    c->r = *r, c->slot = slot;
    unsigned char nrs[DT_SA_MAX];
    for (int i = 0; i < r->n; i++) nrs[i] = (unsigned char)(i + 1);
    gfshare_ctx *gb = gfshare_ctx_init_enc(nrs, (unsigned)r->n, (unsigned char)r->t, 32);
    gfshare_ctx *gs = gfshare_ctx_init_enc(nrs, (unsigned)r->n, (unsigned char)r->t, 32);
    if (!gb || !gs) {
        gfshare_ctx_free(gb), gfshare_ctx_free(gs);
        return dt_error(DT_ENOMEM, "secure aggregation: out of memory splitting secrets");
    }
    gfshare_ctx_enc_setsecret(gb, c->b);
    gfshare_ctx_enc_setsecret(gs, c->ssk);
    dt_status st = DT_OK;
    for (int v = 1; v <= r->n && st == DT_OK; v++) {
        uint8_t plain[66], rec[DT_SA_SHARE_MSG] = {0}, key[32], nonce[crypto_secretbox_NONCEBYTES];
        gfshare_ctx_enc_getshare(gb, (unsigned char)(v - 1), plain);
        gfshare_ctx_enc_getshare(gs, (unsigned char)(v - 1), plain + 32);
        if (v == slot) { /* our own share of b (it may help unmask ourselves) */
            memcpy(c->bsh[slot], plain, 32), memcpy(c->ssh[slot], plain + 32, 32), c->have[slot] = 1;
            continue;
        }
        plain[64] = (uint8_t)slot, plain[65] = (uint8_t)v;
        if ((st = dt_fl_sa_agree(key, c->csk, c->cpk, r->cpk[v - 1], 'c')) != DT_OK) break;
        rec[0] = (uint8_t)slot, rec[1] = (uint8_t)v;
        share_nonce(nonce, c->round, slot, v);
        crypto_secretbox_easy(rec + 4, plain, sizeof plain, nonce, key);
        dt_fl_put_bytes(out, rec, sizeof rec);
        sodium_memzero(plain, sizeof plain), sodium_memzero(key, sizeof key);
    }
    gfshare_ctx_free(gb), gfshare_ctx_free(gs);
    if (st == DT_OK && out->bad) st = dt_error(DT_ENOMEM, "secure aggregation: out of memory");
    return st;
}

dt_status dt_fl_sa_client_receive(dt_fl_sa_client *c, const uint8_t *p, size_t len) {
    if (!c->slot) return dt_error(DT_EFORMAT, "secure aggregation: shares arrived before the roster");
    if (len % DT_SA_SHARE_MSG) return dt_error(DT_EFORMAT, "secure aggregation: share records of %zu bytes", len);
    for (size_t off = 0; off < len; off += DT_SA_SHARE_MSG) {
        const uint8_t *rec = p + off;
        int from = rec[0], to = rec[1];
        if (to != c->slot || from < 1 || from > c->r.n || from == c->slot)
            return dt_error(DT_EFORMAT, "secure aggregation: a share from slot %d to %d reached slot %d", from, to,
                            c->slot);
        uint8_t key[32], nonce[crypto_secretbox_NONCEBYTES], plain[66];
        DT_TRY(dt_fl_sa_agree(key, c->csk, c->cpk, c->r.cpk[from - 1], 'c'));
        share_nonce(nonce, c->round, from, to);
        if (crypto_secretbox_open_easy(plain, rec + 4, DT_SA_CT, nonce, key) != 0 || plain[64] != from ||
            plain[65] != to)
            return dt_error(DT_EFORMAT, "secure aggregation: the share from slot %d does not authenticate", from);
        memcpy(c->bsh[from], plain, 32), memcpy(c->ssh[from], plain + 32, 32), c->have[from] = 1;
        sodium_memzero(plain, sizeof plain), sodium_memzero(key, sizeof key);
    }
    return DT_OK;
}

dt_status dt_fl_sa_client_mask(dt_fl_sa_client *c, const uint8_t *alive2, const uint32_t *x, size_t n, uint32_t *y) {
    if (!c->slot) return dt_error(DT_EFORMAT, "secure aggregation: masking before the roster");
    memcpy(c->alive2 + 1, alive2 + 1, (size_t)c->r.n);
    if (!c->alive2[c->slot])
        return dt_error(DT_EFORMAT, "secure aggregation: slot %d is not among the sharers", c->slot);
    memcpy(y, x, n * 4);
    dt_fl_sa_prg_add(y, n, c->b, c->round, +1);
    for (int v = 1; v <= c->r.n; v++) {
        if (v == c->slot || !c->alive2[v]) continue;
        uint8_t key[32];
        DT_TRY(dt_fl_sa_agree(key, c->ssk, c->spk, c->r.spk[v - 1], 's'));
        dt_fl_sa_prg_add(y, n, key, c->round, v > c->slot ? +1 : -1);
        sodium_memzero(key, sizeof key);
    }
    return DT_OK;
}

dt_status dt_fl_sa_client_unmask(dt_fl_sa_client *c, const uint8_t *alive3, dt_fl_buf *out) {
    for (int u = 1; u <= c->r.n; u++) {
        if (!c->alive2[u] || !c->have[u]) continue;
        if (u == c->slot && !alive3[u]) continue;
        uint8_t rec[34] = {(uint8_t)u, alive3[u] ? 1 : 2};
        if (u == c->slot && alive3[u]) rec[1] = 1;
        memcpy(rec + 2, alive3[u] ? c->bsh[u] : c->ssh[u], 32);
        dt_fl_put_bytes(out, rec, sizeof rec);
    }
    return out->bad ? dt_error(DT_ENOMEM, "secure aggregation: out of memory") : DT_OK;
}
