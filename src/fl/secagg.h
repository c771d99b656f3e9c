/* Secure aggregation (Bonawitz et al., CCS 2017, the semi-honest protocol with double masking).
 * Each participant u of a round (slot 1..n, n <= 255) has two fresh X25519 key pairs: c (to
 * encrypt its Shamir shares to the others: XSalsa20-Poly1305 under a key hashed from the c
 * agreement) and s (pairwise masks). It masks its fixed-point vector x_u (u32 words, arithmetic
 * mod 2^32) as
 *     y_u = x_u + PRG(b_u) + sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)
 * with s_uv = H(X25519(s_u, s_v) | keys) and PRG = ChaCha20 keystream (libsodium). b_u and the s
 * secret key are Shamir-shared t-of-n over GF(2^8) (libgfshare). Summing the y of the survivors
 * U3 cancels every pairwise mask between survivors; the server removes each survivor's b_u and
 * the pairwise masks of those who dropped after sharing (U2 \ U3) from t shares each. A single y_u
 * is uniform: PRG(b_u) is a one-time pad the server never learns for a survivor. */
#ifndef DT_FL_SECAGG_H
#define DT_FL_SECAGG_H

#include "fl/fl.h"

#define DT_SA_MAX 255
#define DT_SA_KEY 32
/* One encrypted share: from u8, to u8, pad u16, then secretbox(MAC 16 + share of b 32 + share of
 * s 32 + from/to 2). */
#define DT_SA_CT (16 + 32 + 32 + 2)
#define DT_SA_SHARE_MSG (4 + DT_SA_CT)

typedef struct {
    int n; /* participants (U1), slots 1..n */
    uint8_t cpk[DT_SA_MAX][DT_SA_KEY];
    uint8_t spk[DT_SA_MAX][DT_SA_KEY];
    int t; /* threshold */
} dt_fl_sa_roster;

/* ---- client side --------------------------------------------------------------------------- */
typedef struct dt_fl_sa_client dt_fl_sa_client;

/* Fresh keys and self-mask seed for one round; seed (may be NULL: OS randomness) makes them
 * deterministic, for tests. */
dt_status dt_fl_sa_client_create(dt_fl_sa_client **c, uint32_t round, const uint8_t *seed);
void dt_fl_sa_client_free(dt_fl_sa_client *c);
/* The two public keys, for SA_KEYS. */
void dt_fl_sa_client_keys(const dt_fl_sa_client *c, uint8_t *cpk, uint8_t *spk);
/* Given the roster and this client's slot, writes one encrypted share per other participant to
 * out (DT_SA_SHARE_MSG bytes each, for the server to forward). */
dt_status dt_fl_sa_client_share(dt_fl_sa_client *c, const dt_fl_sa_roster *r, int slot, dt_fl_buf *out);
/* Takes the shares the server forwarded (from the members of U2): p is a sequence of
 * DT_SA_SHARE_MSG records addressed to this client. Each is decrypted and checked now. */
dt_status dt_fl_sa_client_receive(dt_fl_sa_client *c, const uint8_t *p, size_t len);
/* y[n] = x[n] masked against every member of U2 (alive2[slot] != 0, slots 1..r->n). */
dt_status dt_fl_sa_client_mask(dt_fl_sa_client *c, const uint8_t *alive2, const uint32_t *x, size_t n, uint32_t *y);
/* For the unmasking request (alive3: who the server holds a masked input from): one record per
 * member u != me of U2 whose share this client holds: slot u8, kind u8 (1 = b_u, survivor;
 * 2 = s key, dropped), 32 share bytes. */
dt_status dt_fl_sa_client_unmask(dt_fl_sa_client *c, const uint8_t *alive3, dt_fl_buf *out);

/* ---- server side --------------------------------------------------------------------------- */
typedef struct dt_fl_sa_server dt_fl_sa_server;

/* A round's aggregation state for vectors of n words (roster copied). */
dt_status dt_fl_sa_server_create(dt_fl_sa_server **s, const dt_fl_sa_roster *r, uint32_t round, size_t n);
void dt_fl_sa_server_free(dt_fl_sa_server *s);
/* Marks slot as having shared (U2). */
void dt_fl_sa_server_shared(dt_fl_sa_server *s, int slot);
const uint8_t *dt_fl_sa_server_alive2(const dt_fl_sa_server *s);
const uint8_t *dt_fl_sa_server_alive3(const dt_fl_sa_server *s);
/* Adds slot's masked vector (U3). DT_EFORMAT when slot is not in U2 or already added. */
dt_status dt_fl_sa_server_add_masked(dt_fl_sa_server *s, int slot, const uint32_t *y, size_t n);
/* Takes holder's unmasking records (dt_fl_sa_client_unmask's output); DT_EFORMAT when malformed. */
dt_status dt_fl_sa_server_add_unmask(dt_fl_sa_server *s, int holder, const uint8_t *p, size_t len);
/* Number of holders whose unmasking records came. */
int dt_fl_sa_server_unmasked(const dt_fl_sa_server *s);
/* Reconstructs the secrets (t shares each) and writes the sum of U3's x into sum[n]. DT_EPEER
 * when fewer than t shares of some secret came (the round must be retried). */
dt_status dt_fl_sa_server_finish(dt_fl_sa_server *s, uint32_t *sum);

/* ---- shared by both sides ------------------------------------------------------------------ */
/* key[32] = H(X25519(sk, peer) | both public keys, sorted | tag); DT_EFORMAT for a bad key. */
dt_status dt_fl_sa_agree(uint8_t key[32], const uint8_t *sk, const uint8_t *mypk, const uint8_t *peer, char tag);
/* acc[n] += sign * ChaCha20 keystream words of (key, nonce = round), mod 2^32. */
void dt_fl_sa_prg_add(uint32_t *acc, size_t n, const uint8_t key[32], uint32_t round, int sign);

/* ---- fixed point --------------------------------------------------------------------------- *
 * x = round(clamp(v, -range, range) * w * 2^frac) as a two's complement word. The sum over a
 * round cannot wrap when sum(w) * range * 2^frac < 2^31: dt_fl_sa_frac_bits picks the largest
 * such frac (at most 24) for the round's announced total weight. */
int dt_fl_sa_frac_bits(double range, double total_weight);
/* Encodes v[n] into x[n]; returns the number of values that were clamped. */
size_t dt_fl_sa_encode(uint32_t *x, const float *v, size_t n, double w, double range, int frac);
/* Decodes a summed word. */
static inline double dt_fl_sa_decode(uint32_t x, int frac) { return (double)(int32_t)x / (double)(1u << frac); }

#endif
