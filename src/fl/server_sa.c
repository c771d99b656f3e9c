/* The server's secure-aggregation round (Bonawitz et al. 2017, four exchanges): collect the
 * sampled clients' public keys (U1) and send the roster; collect their encrypted shares (U2) and
 * forward each to its addressee; collect masked fixed-point updates (U3); ask U3 for the shares
 * that unmask the sum, and decode it. A client lost at any step only shrinks the sets; the round
 * fails (and is retried) when a set falls below the threshold t. */
#include "fl/server_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The exchange state of the server's secure round in progress (s->sar). */
struct dt_fl_sa_round {
    int phase; /* 1 keys, 2 shares, 3 masked, 4 unmask */
    dt_fl_sa_roster r;
    int slot_of[DT_FL_MAX_CLIENTS]; /* selection index -> roster slot (0: not in U1) */
    int sel_of[DT_SA_MAX + 1];      /* roster slot -> selection index */
    uint8_t have[DT_SA_MAX + 1];    /* replied in the current phase */
    uint8_t *shares[DT_SA_MAX + 1];
    size_t nshares[DT_SA_MAX + 1];
    int count;
    size_t words;
    uint32_t round;
};
#define SAR (*s->sar) /* every function here has the server s in scope */

static int sel_index(const dt_fl_server *s, int c) { return s->conns[c].in_round - 1; }

static int on_keys(dt_fl_server *s, int c, dt_fl_cur *cur) {
    int i = sel_index(s, c);
    const uint8_t *k = dt_fl_get_bytes(cur, 64);
    if (!k || cur->off != cur->n)
        return dt_error(DT_EFORMAT, "secure aggregation: keys message of %zu bytes", cur->n), 1;
    if (SAR.slot_of[i]) return dt_error(DT_EFORMAT, "secure aggregation: keys sent twice"), 1;
    int slot = ++SAR.r.n;
    memcpy(SAR.r.cpk[slot - 1], k, 32), memcpy(SAR.r.spk[slot - 1], k + 32, 32);
    SAR.slot_of[i] = slot, SAR.sel_of[slot] = i;
    SAR.count++;
    return 0;
}

static int on_shares(dt_fl_server *s, int slot, dt_fl_cur *cur) {
    size_t len = cur->n - cur->off;
    const uint8_t *p = dt_fl_get_bytes(cur, len);
    if (len != (size_t)(SAR.r.n - 1) * DT_SA_SHARE_MSG)
        return dt_error(DT_EFORMAT, "secure aggregation: %zu bytes of shares, expected %d records", len, SAR.r.n - 1),
               1;
    for (size_t off = 0; off < len; off += DT_SA_SHARE_MSG)
        if (p[off] != slot || p[off + 1] < 1 || p[off + 1] > SAR.r.n || p[off + 1] == slot)
            return dt_error(DT_EFORMAT, "secure aggregation: a share record with from %d to %d", p[off], p[off + 1]), 1;
    if (!(SAR.shares[slot] = malloc(len ? len : 1))) return dt_error(DT_ENOMEM, "out of memory"), 1;
    memcpy(SAR.shares[slot], p, len);
    SAR.nshares[slot] = len;
    dt_fl_sa_server_shared(s->sa, slot);
    return 0;
}

int dt_fl_server_sa_frame(dt_fl_server *s, int c, uint16_t type, const uint8_t *p, uint32_t len) {
    dt_fl_cur cur = {p, len, 0, 0};
    int i = sel_index(s, c);
    uint32_t round = dt_fl_get_u32(&cur);
    static const uint16_t want[5] = {0, DT_FL_SA_KEYS, DT_FL_SA_SHARES, DT_FL_SA_MASKED, DT_FL_SA_UNMASK};
    if (!s->cfg.secure || !s->sar || i < 0 || cur.bad)
        return dt_error(DT_EFORMAT, "secure aggregation: message type %u from a client outside any round", type), 1;
    if (round != SAR.round) {
        dt_log(DT_LOG_INFO, "fl server: ignoring a late secure-aggregation message of round %u", round);
        return 0;
    }
    if (SAR.phase < 1 || SAR.phase > 4 || type != want[SAR.phase])
        return dt_error(DT_EFORMAT, "secure aggregation: message type %u out of turn (phase %d)", type, SAR.phase), 1;
    int slot = i >= 0 ? SAR.slot_of[i] : 0;
    if (SAR.phase == 1) return on_keys(s, c, &cur);
    if (!slot || SAR.have[slot]) return dt_error(DT_EFORMAT, "secure aggregation: a message from outside the round"), 1;
    SAR.have[slot] = 1;
    SAR.count++;
    if (SAR.phase == 2) return on_shares(s, slot, &cur);
    size_t rest = len - cur.off;
    const uint8_t *q = dt_fl_get_bytes(&cur, rest);
    if (SAR.phase == 3) {
        if (rest != SAR.words * 4)
            return dt_error(DT_EFORMAT, "secure aggregation: masked input of %zu bytes", rest), 1;
        uint32_t *y = malloc(rest);
        if (!y) return dt_error(DT_ENOMEM, "out of memory"), 1;
        memcpy(y, q, rest);
        dt_status st = dt_fl_sa_server_add_masked(s->sa, slot, y, SAR.words);
        free(y);
        return st != DT_OK;
    }
    return dt_fl_sa_server_add_unmask(s->sa, slot, q, rest) != DT_OK;
}

/* Whether roster slot u is expected to reply in the current phase. */
static int expected(const dt_fl_server *s, int u) {
    if (SAR.phase == 3) return dt_fl_sa_server_alive2(s->sa)[u];
    if (SAR.phase == 4) return dt_fl_sa_server_alive3(s->sa)[u];
    return 1;
}

/* Pumps until every expected, still connected participant replied or the deadline passed. */
static void wait_phase(dt_fl_server *s, double deadline) {
    while (dt_now() < deadline) {
        int pending = 0;
        if (SAR.phase == 1) {
            for (int i = 0; i < s->nsel; i++) pending += s->sel[i] >= 0 && !SAR.slot_of[i];
        } else {
            for (int u = 1; u <= SAR.r.n; u++) pending += expected(s, u) && !SAR.have[u] && s->sel[SAR.sel_of[u]] >= 0;
        }
        if (!pending) return;
        dt_fl_server_pump(s, deadline);
    }
    static const char *step[5] = {"", "public keys", "encrypted shares", "masked update", "unmasking shares"};
    uint8_t late[DT_FL_MAX_CLIENTS];
    for (int i = 0; i < s->nsel; i++) {
        int u = SAR.slot_of[i];
        late[i] = SAR.phase == 1 ? !u : u && expected(s, u) && !SAR.have[u];
    }
    /* the round goes on without them (as if they had dropped), and later rounds do not wait on them */
    dt_fl_server_drop_late(s, late, step[SAR.phase]);
}

static void next_phase(dt_fl_server *s, int phase) {
    SAR.phase = phase, SAR.count = 0;
    memset(SAR.have, 0, sizeof SAR.have);
}

/* Sends every live member of U2 its forwarded shares and the U2 set. */
static void forward_shares(dt_fl_server *s) {
    const uint8_t *a2 = dt_fl_sa_server_alive2(s->sa);
    for (int v = 1; v <= SAR.r.n; v++) {
        int c = s->sel[SAR.sel_of[v]];
        if (!a2[v] || c < 0) continue;
        dt_fl_buf b = {0};
        dt_fl_put_u32(&b, SAR.round);
        dt_fl_put_u32(&b, (uint32_t)SAR.r.n);
        dt_fl_put_bytes(&b, a2 + 1, (size_t)SAR.r.n);
        for (int u = 1; u <= SAR.r.n; u++)
            for (size_t off = 0; a2[u] && u != v && off < SAR.nshares[u]; off += DT_SA_SHARE_MSG)
                if (SAR.shares[u][off + 1] == v) dt_fl_put_bytes(&b, SAR.shares[u] + off, DT_SA_SHARE_MSG);
        if (!b.bad) dt_fl_conn_queue(s, c, DT_FL_SA_SHARES, b.p, (uint32_t)b.n);
        dt_fl_buf_free(&b);
    }
}

static void send_roster(dt_fl_server *s) {
    for (int u = 1; u <= SAR.r.n; u++) {
        int c = s->sel[SAR.sel_of[u]];
        if (c < 0) continue;
        dt_fl_buf b = {0};
        dt_fl_put_u32(&b, SAR.round);
        dt_fl_put_u32(&b, (uint32_t)SAR.r.n);
        dt_fl_put_u32(&b, (uint32_t)SAR.r.t);
        dt_fl_put_u32(&b, (uint32_t)u);
        for (int v = 0; v < SAR.r.n; v++) dt_fl_put_bytes(&b, SAR.r.cpk[v], 32), dt_fl_put_bytes(&b, SAR.r.spk[v], 32);
        if (!b.bad) dt_fl_conn_queue(s, c, DT_FL_SA_ROSTER, b.p, (uint32_t)b.n);
        dt_fl_buf_free(&b);
    }
}

static void send_unmask(dt_fl_server *s) {
    const uint8_t *a3 = dt_fl_sa_server_alive3(s->sa);
    for (int u = 1; u <= SAR.r.n; u++) {
        int c = s->sel[SAR.sel_of[u]];
        if (!a3[u] || c < 0) continue;
        dt_fl_buf b = {0};
        dt_fl_put_u32(&b, SAR.round);
        dt_fl_put_u32(&b, (uint32_t)SAR.r.n);
        dt_fl_put_bytes(&b, a3 + 1, (size_t)SAR.r.n);
        if (!b.bad) dt_fl_conn_queue(s, c, DT_FL_SA_UNMASK, b.p, (uint32_t)b.n);
        dt_fl_buf_free(&b);
    }
}

static int threshold(const dt_fl_server *s, int n) {
    int t = s->cfg.sa_threshold > 0 ? s->cfg.sa_threshold : n / 2 + 1;
    return t < 2 ? 2 : t;
}

/* Decodes the unmasked sum: words 0..np-1 the weighted values, word np the total weight * range. */
static dt_status decode_sum(dt_fl_server *s, const dt_fl_model_msg *mm, double *agg, int *nupd) {
    uint32_t *sum = malloc(SAR.words * 4);
    if (!sum) return dt_error(DT_ENOMEM, "out of memory");
    dt_status st = dt_fl_sa_server_finish(s->sa, sum);
    if (st == DT_OK) {
        double W = dt_fl_sa_decode(sum[s->np], (int)mm->frac) / mm->range;
        double div = s->cfg.dp_clip > 0 ? 1.0 : W;
        for (size_t i = 0; i < s->np; i++) agg[i] = dt_fl_sa_decode(sum[i], (int)mm->frac) / div;
        const uint8_t *a3 = dt_fl_sa_server_alive3(s->sa);
        for (int u = 1; u <= SAR.r.n; u++) *nupd += a3[u];
        if (!(W > 0.5)) st = dt_error(DT_EPEER, "secure aggregation: the unmasked total weight is %g", W);
    }
    free(sum);
    return st;
}

static void reset(dt_fl_server *s) {
    for (int u = 0; u <= DT_SA_MAX; u++) free(SAR.shares[u]);
    memset(&SAR, 0, sizeof SAR);
}

dt_status dt_fl_server_sa_round(dt_fl_server *s, dt_fl_model_msg *mm, double *agg, int *nupd) {
    if (!s->sar && !(s->sar = calloc(1, sizeof *s->sar)))
        return dt_error(DT_ENOMEM, "secure aggregation: out of memory");
    reset(s);
    SAR.round = mm->round, SAR.words = s->np + 1;
    double W = 0;
    for (int i = 0; i < s->nsel; i++) W += s->cfg.dp_clip > 0 ? 1 : s->conns[s->sel[i]].samples;
    double range = s->cfg.dp_clip > 0 ? s->cfg.dp_clip : s->cfg.sa_range;
    int frac = dt_fl_sa_frac_bits(range, W);
    if (frac < 4)
        return dt_error(DT_EINVAL,
                        "`secure_agg`: total weight %g times `sa_range` %g leaves %d fraction bits in 32-bit "
                        "words (need 4); lower `sa_range` or `clients_per_round`",
                        W, range, frac);
    mm->flags = DT_FL_F_SECURE | (s->cfg.dp_clip > 0 ? DT_FL_F_UNWEIGHTED : 0);
    mm->range = (float)range, mm->frac = (uint32_t)frac, mm->clip = (float)s->cfg.dp_clip;
    dt_fl_buf b = {0};
    DT_TRY(dt_fl_model_encode(&b, mm));
    for (int i = 0; i < s->nsel; i++) dt_fl_conn_queue(s, s->sel[i], DT_FL_MODEL, b.p, (uint32_t)b.n);
    dt_fl_buf_free(&b);
    double T = s->cfg.round_timeout;
    next_phase(s, 1);
    wait_phase(s, dt_now() + T);
    SAR.r.t = threshold(s, s->nsel);
    dt_status st = DT_OK;
    if (SAR.r.n < SAR.r.t)
        st = dt_error(DT_EPEER, "secure aggregation: %d of %d clients sent keys, threshold %d", SAR.r.n, s->nsel,
                      SAR.r.t);
    if (st == DT_OK) st = dt_fl_sa_server_create(&s->sa, &SAR.r, SAR.round, SAR.words);
    if (st == DT_OK) {
        send_roster(s);
        next_phase(s, 2);
        wait_phase(s, dt_now() + T);
        forward_shares(s);
        next_phase(s, 3);
        wait_phase(s, dt_now() + T);
        send_unmask(s);
        next_phase(s, 4);
        wait_phase(s, dt_now() + T);
        st = decode_sum(s, mm, agg, nupd);
    }
    dt_fl_sa_server_free(s->sa);
    s->sa = NULL;
    reset(s);
    return st;
}

void dt_fl_server_sa_free(dt_fl_server *s) {
    if (!s->sar) return;
    reset(s);
    free(s->sar);
    s->sar = NULL;
}
