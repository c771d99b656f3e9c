/* Bodies of the federated-learning messages: hello, model and update. Every decoder checks each
 * count against the protocol limits and the payload length before it trusts it, and rejects
 * trailing bytes and non-finite values. */
#include "fl/fl.h"

#include <math.h>
#include <string.h>

static dt_status done(dt_fl_buf *b) {
    return b->bad ? dt_error(DT_ENOMEM, "fl: out of memory encoding a message") : DT_OK;
}

dt_status dt_fl_hello_encode(dt_fl_buf *b, const dt_fl_hello *h) {
    dt_fl_put_u64(b, h->client_id);
    dt_fl_put_u32(b, h->samples);
    return done(b);
}

dt_status dt_fl_hello_decode(const uint8_t *p, uint32_t len, dt_fl_hello *h) {
    dt_fl_cur c = {p, len, 0, 0};
    h->client_id = dt_fl_get_u64(&c);
    h->samples = dt_fl_get_u32(&c);
    if (c.bad || c.off != len) return dt_error(DT_EFORMAT, "fl hello: %u bytes, expected 12", len);
    if (h->samples == 0)
        return dt_error(DT_EFORMAT, "fl hello: client %llu has no samples", (unsigned long long)h->client_id);
    return DT_OK;
}

/* Checks n floats at p are finite (a NaN or Inf update would poison the aggregate). */
static dt_status check_finite(const uint8_t *p, uint32_t n, const char *what) {
    for (uint32_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, p + 4 * (size_t)i, 4);
        if (!isfinite(f)) return dt_error(DT_EFORMAT, "fl %s: value %u is not finite", what, i);
    }
    return DT_OK;
}

dt_status dt_fl_model_encode(dt_fl_buf *b, const dt_fl_model_msg *m) {
    dt_fl_put_u32(b, m->round);
    dt_fl_put_u32(b, m->epochs);
    dt_fl_put_u32(b, m->batch);
    dt_fl_put_f32(b, m->lr);
    dt_fl_put_f32(b, m->mu);
    dt_fl_put_u32(b, m->flags);
    dt_fl_put_u64(b, m->seed);
    dt_fl_put_f32(b, m->clip);
    dt_fl_put_f32(b, m->range);
    dt_fl_put_u32(b, m->frac);
    dt_fl_put_u32(b, m->n);
    dt_fl_put_bytes(b, m->params, (size_t)m->n * 4);
    return done(b);
}

dt_status dt_fl_model_decode(const uint8_t *p, uint32_t len, dt_fl_model_msg *m) {
    dt_fl_cur c = {p, len, 0, 0};
    m->round = dt_fl_get_u32(&c);
    m->epochs = dt_fl_get_u32(&c);
    m->batch = dt_fl_get_u32(&c);
    m->lr = dt_fl_get_f32(&c);
    m->mu = dt_fl_get_f32(&c);
    m->flags = dt_fl_get_u32(&c);
    m->seed = dt_fl_get_u64(&c);
    m->clip = dt_fl_get_f32(&c);
    m->range = dt_fl_get_f32(&c);
    m->frac = dt_fl_get_u32(&c);
    m->n = dt_fl_get_u32(&c);
    if (c.bad) return dt_error(DT_EFORMAT, "fl model: truncated header (%u bytes)", len);
    if (m->n == 0 || m->n > DT_FL_MAX_PARAMS)
        return dt_error(DT_EFORMAT, "fl model: %u parameters (limit %u)", m->n, DT_FL_MAX_PARAMS);
    if ((size_t)m->n * 4 != len - c.off)
        return dt_error(DT_EFORMAT, "fl model: %u parameters but %zu bytes of them", m->n, len - c.off);
    if (m->epochs > 1000 || !(m->lr > 0) || !isfinite(m->lr) || !(m->mu >= 0) || !isfinite(m->mu) || !(m->clip >= 0) ||
        !isfinite(m->clip) || m->frac > 30 || ((m->flags & DT_FL_F_SECURE) && (!(m->range > 0) || !isfinite(m->range))))
        return dt_error(DT_EFORMAT, "fl model: bad settings (epochs %u, lr %g, mu %g, clip %g, range %g, frac %u)",
                        m->epochs, m->lr, m->mu, m->clip, m->range, m->frac);
    m->params = (const float *)(p + c.off); /* payloads are malloc'd; offset 48 keeps 4-byte alignment */
    return check_finite(p + c.off, m->n, "model");
}

dt_status dt_fl_update_encode(dt_fl_buf *b, const dt_fl_update_msg *u) {
    dt_fl_put_u32(b, u->round);
    dt_fl_put_u32(b, u->samples);
    dt_fl_put_u32(b, u->n);
    dt_fl_put_bytes(b, u->delta, (size_t)u->n * 4);
    return done(b);
}

dt_status dt_fl_update_decode(const uint8_t *p, uint32_t len, uint32_t expect_n, dt_fl_update_msg *u) {
    dt_fl_cur c = {p, len, 0, 0};
    u->round = dt_fl_get_u32(&c);
    u->samples = dt_fl_get_u32(&c);
    u->n = dt_fl_get_u32(&c);
    if (c.bad) return dt_error(DT_EFORMAT, "fl update: truncated header (%u bytes)", len);
    if (u->n == 0 || u->n > DT_FL_MAX_PARAMS || (expect_n && u->n != expect_n))
        return dt_error(DT_EFORMAT, "fl update: %u parameters, expected %u", u->n, expect_n);
    if ((size_t)u->n * 4 != len - c.off)
        return dt_error(DT_EFORMAT, "fl update: %u parameters but %zu bytes of them", u->n, len - c.off);
    if (u->samples == 0) return dt_error(DT_EFORMAT, "fl update: zero samples");
    u->delta = (const float *)(p + c.off);
    return check_finite(p + c.off, u->n, "update");
}
