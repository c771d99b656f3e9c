/* Tests of secure aggregation: with 5 participants the unmasked sum equals the plain fixed-point
 * sum exactly; the round survives one client dropping after sending its masked input and one
 * dropping after sharing but before masking; below the threshold it fails with DT_EPEER; a
 * tampered share is refused; a single masked vector is uniform (chi-square, 255 degrees of
 * freedom, against the 0.999 quantile 330.5, on its low and high bytes); fixed-point bounds. */
#include "core/test.h"
#include "fl/secagg.h"

#include <stdlib.h>
#include <string.h>

#define NC 5
#define NW 1000

typedef struct {
    dt_fl_sa_client *c[NC + 1];
    dt_fl_buf shares[NC + 1];
    uint32_t x[NC + 1][NW], y[NC + 1][NW];
} world;

/* Runs a round; drop_before_mask: this slot shares then vanishes; drop_after_mask: this slot sends
 * its masked input then vanishes. Returns finish's status, sum in out. */
static dt_status run_round(world *w, int t, int drop_before_mask, int drop_after_mask, uint32_t *out) {
    dt_fl_sa_roster r = {.n = NC, .t = t};
    for (int u = 1; u <= NC; u++) {
        uint8_t seed[32] = {(uint8_t)u, 42};
        CHECK_OK(dt_fl_sa_client_create(&w->c[u], 7, seed));
        dt_fl_sa_client_keys(w->c[u], r.cpk[u - 1], r.spk[u - 1]);
        memset(&w->shares[u], 0, sizeof w->shares[u]);
    }
    dt_fl_sa_server *s;
    CHECK_OK(dt_fl_sa_server_create(&s, &r, 7, NW));
    for (int u = 1; u <= NC; u++) {
        CHECK_OK(dt_fl_sa_client_share(w->c[u], &r, u, &w->shares[u]));
        dt_fl_sa_server_shared(s, u);
    }
    /* the server forwards each record to its addressee */
    for (int u = 1; u <= NC; u++)
        for (size_t off = 0; off < w->shares[u].n; off += DT_SA_SHARE_MSG) {
            int to = w->shares[u].p[off + 1];
            CHECK_OK(dt_fl_sa_client_receive(w->c[to], w->shares[u].p + off, DT_SA_SHARE_MSG));
        }
    const uint8_t *a2 = dt_fl_sa_server_alive2(s);
    for (int u = 1; u <= NC; u++) {
        if (u == drop_before_mask) continue;
        CHECK_OK(dt_fl_sa_client_mask(w->c[u], a2, w->x[u], NW, w->y[u]));
        CHECK_OK(dt_fl_sa_server_add_masked(s, u, w->y[u], NW));
    }
    const uint8_t *a3 = dt_fl_sa_server_alive3(s);
    for (int u = 1; u <= NC; u++) {
        if (u == drop_before_mask || u == drop_after_mask) continue;
        dt_fl_buf b = {0};
        CHECK_OK(dt_fl_sa_client_unmask(w->c[u], a3, &b));
        CHECK_OK(dt_fl_sa_server_add_unmask(s, u, b.p, b.n));
        dt_fl_buf_free(&b);
    }
    dt_status st = dt_fl_sa_server_finish(s, out);
    dt_fl_sa_server_free(s);
    for (int u = 1; u <= NC; u++) dt_fl_sa_client_free(w->c[u]), dt_fl_buf_free(&w->shares[u]);
    return st;
}

static void test_sum(void) {
    static world w;
    float v[NW];
    for (int u = 1; u <= NC; u++) {
        dt_rng_fill_normal(v, NW, 0, 0.3f, 11, (uint64_t)u);
        CHECK(dt_fl_sa_encode(w.x[u], v, NW, 100.0 * u, 1.0, dt_fl_sa_frac_bits(1.0, 1500)) <= NW);
    }
    uint32_t plain[NW] = {0}, sum[NW], part[NW] = {0};
    for (int u = 1; u <= NC; u++)
        for (int i = 0; i < NW; i++) plain[i] += w.x[u][i];
    CHECK_OK(run_round(&w, 3, 0, 0, sum));
    CHECK_MSG(!memcmp(sum, plain, sizeof sum), "all 5: the unmasked sum is the plain sum");
    /* slot 5 drops after its masked input: still all five inputs */
    CHECK_OK(run_round(&w, 3, 0, 5, sum));
    CHECK_MSG(!memcmp(sum, plain, sizeof sum), "slot 5 dropped after masking");
    /* slot 2 drops after sharing, before masking: the sum of the other four */
    for (int u = 1; u <= NC; u++)
        for (int i = 0; i < NW && u != 2; i++) part[i] += w.x[u][i];
    CHECK_OK(run_round(&w, 3, 2, 0, sum));
    CHECK_MSG(!memcmp(sum, part, sizeof sum), "slot 2 dropped before masking");
    /* both: 3 unmasking replies for threshold 3 still works; threshold 4 cannot */
    memset(part, 0, sizeof part);
    for (int u = 1; u <= NC; u++)
        for (int i = 0; i < NW && u != 2; i++) part[i] += w.x[u][i];
    CHECK_OK(run_round(&w, 3, 2, 5, sum));
    CHECK(!memcmp(sum, part, sizeof sum));
    CHECK(run_round(&w, 4, 2, 5, sum) == DT_EPEER);
    CHECK(strstr(dt_last_error(), "threshold 4") != NULL);
}

static double chi2_bytes(const uint32_t *y, size_t n, int shift) {
    double cnt[256] = {0};
    for (size_t i = 0; i < n; i++) cnt[(y[i] >> shift) & 255]++;
    double e = (double)n / 256, chi = 0;
    for (int k = 0; k < 256; k++) chi += (cnt[k] - e) * (cnt[k] - e) / e;
    return chi;
}

static void test_uniform_and_tamper(void) {
    enum { N = 1 << 16 };
    dt_fl_sa_roster r = {.n = 2, .t = 2};
    dt_fl_sa_client *a, *b;
    uint8_t sa[32] = {1}, sb[32] = {2};
    CHECK_OK(dt_fl_sa_client_create(&a, 1, sa));
    CHECK_OK(dt_fl_sa_client_create(&b, 1, sb));
    dt_fl_sa_client_keys(a, r.cpk[0], r.spk[0]);
    dt_fl_sa_client_keys(b, r.cpk[1], r.spk[1]);
    dt_fl_buf sh = {0}, shb = {0};
    CHECK_OK(dt_fl_sa_client_share(a, &r, 1, &sh));
    CHECK_OK(dt_fl_sa_client_share(b, &r, 2, &shb));
    uint8_t alive[3] = {0, 1, 1};
    uint32_t *x = calloc(N, 4), *y = calloc(N, 4);
    for (int i = 0; i < N; i++) x[i] = (uint32_t)(i % 7); /* a very non-uniform input */
    CHECK_OK(dt_fl_sa_client_mask(a, alive, x, N, y));
    double lo = chi2_bytes(y, N, 0), hi = chi2_bytes(y, N, 24), raw = chi2_bytes(x, N, 0);
    CHECK_MSG(lo < 330.5 && hi < 330.5, "masked bytes chi2 %g (low) %g (high), 0.999 quantile 330.5", lo, hi);
    CHECK(raw > 330.5);
    /* a flipped bit in a share fails authentication */
    sh.p[10] ^= 4;
    CHECK(dt_fl_sa_client_receive(b, sh.p, sh.n) == DT_EFORMAT);
    CHECK(strstr(dt_last_error(), "authenticate") != NULL);
    /* a share addressed to someone else is refused */
    CHECK(dt_fl_sa_client_receive(a, sh.p, sh.n) == DT_EFORMAT);
    free(x), free(y);
    dt_fl_buf_free(&sh), dt_fl_buf_free(&shb);
    dt_fl_sa_client_free(a), dt_fl_sa_client_free(b);
}

static void test_fixed_point(void) {
    int f = dt_fl_sa_frac_bits(1.0, 60000);
    CHECK(f == 15); /* 60000 * 2^15 < 2^31 <= 60000 * 2^16 */
    float v[3] = {0.5f, -2.0f, 0.25f};
    uint32_t x[3];
    CHECK(dt_fl_sa_encode(x, v, 3, 2.0, 1.0, 4) == 1);
    CHECK(dt_fl_sa_decode(x[0], 4) == 1.0 && dt_fl_sa_decode(x[1], 4) == -2.0 && dt_fl_sa_decode(x[2], 4) == 0.5);
}

int main(void) {
    test_sum();
    test_uniform_and_tamper();
    test_fixed_point();
    return dt_test_summary("secagg_test");
}
