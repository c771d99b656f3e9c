/* Gradient compression tests over real shared-memory ranks (forked processes, W = 2 and 3):
 * - every compressor: every rank gets bitwise the same result; the error-feedback identity holds
 *   (the sum over steps of the synced mean plus the mean of the ranks' residuals equals the sum of
 *   the mean gradients: what was not sent this step is sent later); top-k sends exactly k pairs per
 *   bucket (bytes counted) and warms its ratio up; top-k 1.0, PowerSGD at full rank and "none"
 *   give the plain mean; fp16/bf16 give it to their rounding; PowerSGD sends a matrix whose factors
 *   are not min_rate times smaller than it whole (PyTorch's min_compression_rate);
 * - trainer level: ddp with topk:1.0 and powersgd at full rank equal plain ddp, fp16/bf16 ddp
 *   match fp32 ddp to a stated tolerance, localsgd with topk:1.0 equals plain localsgd.
 * The parse of --compress texts (good and bad) is checked too. */
#include "core/test.h"
#include "parallel/grad_sync.h"
#include "parallel/parallel_testlib.h"
#include "dtrain/dtrain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[64], g_csv[128];
enum { T = 6, CAP = 4096 };
#define SMALL_MODEL "linear(16) relu linear(4)" /* 12 features: 276 parameters, 2 buckets below */

/* What the tests need of a spec, read back from its canonical text (dt_compress_format): each
 * compressor's options are private to its file. */
typedef struct {
    char name[128];
    double ratio, momentum, min_rate;
    int warmup, rank;
} spec_view;

static spec_view view_of(const dt_compress_spec *cs) {
    char t[128], *p;
    dt_compress_format(cs, t, sizeof t);
    spec_view v = {.ratio = 1, .min_rate = 2};
    char *colon = strchr(t, ':');
    if (colon) *colon = 0;
    snprintf(v.name, sizeof v.name, "%s", t);
    if (!colon) return v;
    double first = strtod(colon + 1, &p);
    if (!strcmp(v.name, "topk")) v.ratio = first;
    else v.rank = (int)first;
    while (*p == ':') {
        p++;
        if (!strncmp(p, "momentum=", 9)) v.momentum = strtod(p + 9, &p);
        else if (!strncmp(p, "warmup=", 7)) v.warmup = (int)strtod(p + 7, &p);
        else if (!strncmp(p, "min_rate=", 9)) v.min_rate = strtod(p + 9, &p);
        else break;
    }
    return v;
}

static bool is(const spec_view *v, const char *name) { return !strcmp(v->name, name); }

static void g_of(float *g, size_t n, int rank, int step) {
    dt_rng_fill_normal(g, n, 0.0f, 1.0f, 77, dt_rng_key(DT_RNG_USER + 1, (uint64_t)(rank * 100 + step)));
}

/* The step's figures: f32 bytes of the vector; top-k: k pairs of 8 bytes per bucket (ceil(density
 * n), after the warm-up), at most W*k values set; casts: 2 bytes a value. */
static void check_bytes(const spec_view *cs, dt_grad_sync_stats st, const float *x, size_t n, int W, int t) {
    CHECK(st.raw_bytes == (double)n * 4);
    if (is(cs, "topk")) {
        double d = cs->warmup && t < cs->warmup ? pow(cs->ratio, (t + 1.0) / cs->warmup) : cs->ratio;
        double k = ceil(d * 68 - 1e-9) + ceil(d * 208 - 1e-9);
        CHECK_MSG(st.payload_bytes == 8 * k, "topk step %d: %g payload bytes, want %g", t, st.payload_bytes, 8 * k);
        size_t nz = 0;
        for (size_t i = 0; i < n; i++) nz += x[i] != 0;
        CHECK_MSG(nz <= (size_t)W * (size_t)k, "topk step %d: %zu values set, at most %g sent", t, nz, W * k);
    }
    if (is(cs, "fp16") || is(cs, "bf16")) CHECK(st.payload_bytes == (double)n * 2);
}

/* True when every rank of c holds the same bits in x[0..n) (a hash compared by min and max). */
static bool same_on_all_ranks(dt_comm *c, const float *x, size_t n) {
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        h = h * 31 + u;
    }
    int64_t crc = (int64_t)(h >> 1), a = 0, b = 1;
    if (dt_comm_allreduce(c, &crc, &a, 1, DT_I64, DT_OP_MIN) != DT_OK ||
        dt_comm_allreduce(c, &crc, &b, 1, DT_I64, DT_OP_MAX) != DT_OK)
        return false;
    return a == b;
}

/* One rank of the identity test of compressor `text` on W ranks; returns its failures. */
static int identity_rank(const char *text, int r, int W, const char *job) {
    dt_test_failures = 0; /* a forked rank counts its own */
    dt_comm *c = dt_test_rank_comm(r, W, job);
    dt_model *m;
    CHECK_OK(dt_model_create_from_spec(&m, SMALL_MODEL, 1, 1, 12));
    const size_t n = dt_model_num_params(m);
    size_t lo[2] = {208, 0}, hi[2] = {n, 208}; /* the last layer's bucket first, as ddp issues them */
    dt_compress_spec spec;
    CHECK_OK(dt_compress_parse(text, &spec));
    const spec_view cs = view_of(&spec);
    dt_grad_sync_config gc = {.comm = c, .model = m, .n = n, .lo = lo, .hi = hi, .nb = 2};
    dt_grad_sync *gs;
    CHECK_OK(dt_grad_sync_create(&gs, &spec, &gc));
    static float x[CAP], g[CAP], mean[CAP], sum_out[CAP], sum_g[CAP], res[CAP], lossless_err[1];
    memset(sum_out, 0, sizeof sum_out), memset(sum_g, 0, sizeof sum_g);
    lossless_err[0] = 0;
    const bool lossless = is(&cs, "none") || (is(&cs, "topk") && cs.ratio == 1.0 && !cs.warmup) ||
                          (is(&cs, "powersgd") && cs.rank >= 16);
    for (int t = 0; t < T; t++) {
        memset(mean, 0, n * sizeof(float));
        for (int q = 0; q < W; q++) {
            g_of(g, n, q, t);
            for (size_t i = 0; i < n; i++) mean[i] += g[i] / (float)W;
        }
        g_of(x, n, r, t);
        for (size_t i = 0; i < n; i++) sum_g[i] += mean[i];
        dt_grad_sync_begin_step(gs, t);
        dt_grad_sync_start(gs, 0, x);
        dt_grad_sync_poll(gs);
        dt_grad_sync_start(gs, 1, x);
        CHECK_OK(dt_grad_sync_finish(gs, 0));
        CHECK_OK(dt_grad_sync_finish(gs, 1));
        check_bytes(&cs, dt_grad_sync_step_stats(gs), x, n, W, t);
        for (size_t i = 0; i < n; i++) sum_out[i] += x[i];
        double e = dt_test_maxdiff(x, mean, n);
        if (e > lossless_err[0]) lossless_err[0] = (float)e;
        if (is(&cs, "powersgd") && t < cs.warmup) /* warm-up steps: plain allreduce */
            CHECK_MSG(e <= 1e-6, "%s step %d (warm-up): result differs from the mean by %g", text, t, e);
        CHECK_MSG(same_on_all_ranks(c, x, n), "%s step %d: the ranks' results differ", text, t);
    }
    /* sum_t out_t + mean_r residual_r == sum_t mean_t g: nothing is lost, only delayed */
    dt_grad_sync_residual(gs, res);
    CHECK_OK(dt_comm_allreduce(c, res, res, n, DT_F32, DT_OP_AVG));
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)sum_out[i] + res[i] - sum_g[i]));
        scale = fmax(scale, fabs((double)sum_g[i]));
    }
    /* the casts round the mean once more on the way back (not fed back): their tolerance per step */
    double ltol = is(&cs, "powersgd") ? 2e-4 : is(&cs, "fp16") ? 2e-3 : is(&cs, "bf16") ? 2e-2 : 1e-6;
    double rtol = is(&cs, "powersgd") ? 2e-4 : ltol > 1e-5 ? ltol : 2e-5;
    if (cs.momentum == 0) /* with momentum correction the velocities are what travels, not the gradients */
        CHECK_MSG(worst <= rtol * (scale + 1),
                  "%s: sum of sent + residual is off the sum of gradients by %g (scale %g)", text, worst, scale);
    if (lossless || is(&cs, "fp16") || is(&cs, "bf16"))
        CHECK_MSG(lossless_err[0] <= ltol, "%s: result differs from the plain mean by %g (tolerance %g)", text,
                  lossless_err[0], ltol);
    if (r == 0 && cs.momentum == 0)
        printf("%-26s W=%d: error-feedback identity off by %.3g (scale %.3g), max |result - mean| %.3g\n", text, W,
               worst, scale, lossless_err[0]);
    else if (r == 0)
        printf("%-26s W=%d: ranks agree (with momentum correction the velocities travel: no gradient identity)\n", text,
               W);
    fflush(stdout);
    dt_grad_sync_destroy(gs);
    dt_model_destroy(m);
    dt_comm_destroy(c);
    return dt_test_failures;
}

/* A one-process communicator and a linear(1000) model over 100 inputs: one bucket of 101000
 * values (past the casts' conversion blocks, with an odd tail; large enough for top-k's sample). */
static void one_process_bucket(dt_comm **c, dt_model **m) {
    dt_comm_config cc = dt_comm_config_default();
    CHECK_OK(dt_comm_create(c, &cc));
    CHECK_OK(dt_model_create_from_spec(m, "linear(1000)", 1, 1, 100));
}

/* The casts on a 101000-value bucket (one process, past the conversion blocks, an odd tail):
 * each step sends v = g + residual rounded to fp16/bf16, and the new residual is exactly
 * v - round(v), for every value; the gradients span fp16's subnormals up to 2. */
static void test_cast_exact(void) {
    dt_comm *c;
    dt_model *m;
    one_process_bucket(&c, &m);
    const size_t n = dt_model_num_params(m);
    size_t lo = 0, hi = n;
    float *x = malloc(n * sizeof *x), *v = malloc(n * sizeof *v), *res = malloc(n * sizeof *res);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        dt_compress_spec cs;
        CHECK_OK(dt_compress_parse(bf16 ? "bf16" : "fp16", &cs));
        dt_grad_sync_config gc = {.comm = c, .model = m, .n = n, .lo = &lo, .hi = &hi, .nb = 1};
        dt_grad_sync *gs;
        CHECK_OK(dt_grad_sync_create(&gs, &cs, &gc));
        size_t bad_sent = 0, bad_res = 0;
        for (int step = 0; step < 3; step++) {
            g_of(x, n, 0, 60 + step);
            for (size_t i = 0; i < n; i++) x[i] = ldexpf(x[i], -(int)(i % 26)); /* 2^-25 .. 2 */
            dt_grad_sync_residual(gs, res);
            for (size_t i = 0; i < n; i++) v[i] = x[i] + res[i];
            dt_grad_sync_begin_step(gs, step);
            dt_grad_sync_start(gs, 0, x);
            CHECK_OK(dt_grad_sync_finish(gs, 0));
            dt_grad_sync_residual(gs, res);
            for (size_t i = 0; i < n; i++) {
                float r = bf16 ? dt_bf16_to_f32(dt_f32_to_bf16(v[i])) : dt_f16_to_f32(dt_f32_to_f16(v[i]));
                bad_sent += x[i] != r, bad_res += res[i] != v[i] - r;
            }
        }
        CHECK_MSG(bad_sent == 0 && bad_res == 0, "%s: %zu values sent and %zu residuals not exact (of 3 x %zu)",
                  cs.c->name, bad_sent, bad_res, n);
        dt_grad_sync_destroy(gs);
    }
    printf("fp16, bf16 on a %zu-value bucket: sent values and residuals exact\n", n);
    free(x), free(v), free(res);
    dt_model_destroy(m);
    dt_comm_destroy(c);
}

/* Loss scaling's hook (dt_grad_sync_rescale_state) on fp16, top-k and PowerSGD buckets: after a
 * step whose gradients hold an inf (the overflow that makes loss scaling skip the step), the
 * residual holds inf or NaN; the skip clears it, and the next steps send finite values. A finite
 * residual is multiplied by the scale's change, and a NaN left in it (not sent) is zeroed. */
typedef struct {
    float *data;
    size_t n; /* floats of the row (one process: the whole piece) */
} state_ref;

static dt_status state_row(void *ctx, const dt_state_piece *p) {
    *(state_ref *)ctx = (state_ref){p->buf.data, p->numel};
    return DT_OK;
}

static void test_rescale_state(void) {
    dt_comm *c;
    dt_model *m;
    one_process_bucket(&c, &m);
    const size_t n = dt_model_num_params(m);
    size_t lo = 0, hi = n;
    float *x = malloc(n * sizeof *x), *r0 = malloc(n * sizeof *r0), *r1 = malloc(n * sizeof *r1);
    const char *texts[] = {"fp16", "topk:0.1:warmup=0", "powersgd:2:warmup=0"};
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        dt_compress_spec cs;
        CHECK_OK(dt_compress_parse(texts[k], &cs));
        dt_grad_sync_config gc = {.comm = c, .model = m, .n = n, .lo = &lo, .hi = &hi, .nb = 1};
        dt_grad_sync *gs;
        CHECK_OK(dt_grad_sync_create(&gs, &cs, &gc));
        size_t bad = 0, nonzero = 0, unscaled = 0, kept_nan = 0;
        for (int step = 0; step < 4; step++) {
            g_of(x, n, 0, 70 + step);
            if (step == 1) x[n / 3] = INFINITY;
            dt_grad_sync_begin_step(gs, step);
            dt_grad_sync_start(gs, 0, x);
            CHECK_OK(dt_grad_sync_finish(gs, 0));
            dt_grad_sync_residual(gs, r0);
            if (step == 1) {
                size_t inf = 0;
                for (size_t i = 0; i < n; i++) inf += !isfinite(r0[i]) || !isfinite(x[i]);
                CHECK_MSG(inf > 0, "%s: an inf gradient left no inf in the result or the residual", texts[k]);
                dt_grad_sync_rescale_state(gs, 0.0f); /* the step is skipped */
                dt_grad_sync_residual(gs, r1);
                for (size_t i = 0; i < n; i++) nonzero += r1[i] != 0;
            } else {
                for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]) || !isfinite(r0[i]);
                if (step == 2) { /* a NaN in the state that was not sent: zeroed, the rest kept */
                    state_ref row = {0};
                    CHECK_OK(dt_grad_sync_visit_state(gs, state_row, &row));
                    size_t at = 0;
                    while (at < n && r0[at] == 0) at++; /* a value of the residual (PowerSGD: of e) */
                    CHECK(at < n);
                    if (at == n) at = 0;
                    for (size_t i = 0; i < row.n; i++) kept_nan += row.data[i] == r0[at]; /* where it is in the row */
                    for (size_t i = 0; i < row.n; i++)
                        if (row.data[i] == r0[at]) row.data[i] = NAN;
                    dt_grad_sync_rescale_state(gs, 1.0f);
                    dt_grad_sync_residual(gs, r1);
                    for (size_t i = 0; i < n; i++) bad += i == at ? r1[i] != 0 : r1[i] != r0[i];
                    kept_nan = kept_nan == 0; /* 1: the value was not found in the row */
                }
                if (step == 3) {
                    dt_grad_sync_rescale_state(gs, 2.0f); /* the scale grew */
                    dt_grad_sync_residual(gs, r1);
                    for (size_t i = 0; i < n; i++) unscaled += r1[i] != 2.0f * r0[i];
                }
            }
        }
        CHECK_MSG(nonzero == 0, "%s: %zu residual values survived the skipped step", texts[k], nonzero);
        CHECK_MSG(bad == 0, "%s: %zu values not finite in the steps after the skip", texts[k], bad);
        CHECK_MSG(unscaled == 0, "%s: %zu residual values not doubled with the scale", texts[k], unscaled);
        CHECK_MSG(kept_nan == 0, "%s: the residual's value not found in the state row", texts[k]);
        dt_grad_sync_destroy(gs);
    }
    printf("fp16, topk, powersgd: a skipped step clears the residual, a scale change rescales it\n");
    free(x), free(r0), free(r1);
    dt_model_destroy(m);
    dt_comm_destroy(c);
}

static void test_identities(void) {
    const char *texts[] = {"none",
                           "fp16",
                           "bf16",
                           "topk:1:warmup=0",
                           "topk:0.1:warmup=0",
                           "topk:0.05:momentum=0.9:warmup=0",
                           "topk:0.02:warmup=4",
                           "powersgd:1:warmup=0",
                           "powersgd:2:warmup=0",
                           "powersgd:2:warmup=3",
                           "powersgd:16:warmup=0:min_rate=0"};
    for (int W = 2; W <= 3; W++)
        for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
            char job[64];
            snprintf(job, sizeof job, "cmpid%d_%d_%zu", (int)getpid(), W, k);
            fflush(stdout); /* the forked ranks would print what is buffered again */
            for (int r = 0; r < W; r++)
                if (fork() == 0) _exit(identity_rank(texts[k], r, W, job) ? 1 : 0);
            CHECK_MSG(dt_test_wait_children() == 0, "%s on %d ranks failed", texts[k], W);
        }
}

/* One step of `text` on SMALL_MODEL in one process (one bucket): *bytes gets the payload, and the
 * return value is how many values of the 4 x 16 weight came back other than the gradient sent. */
static size_t min_rate_step(const char *text, double *bytes, size_t *lossy_16x12) {
    dt_comm *c;
    dt_comm_config cc = dt_comm_config_default();
    CHECK_OK(dt_comm_create(&c, &cc));
    dt_model *m;
    CHECK_OK(dt_model_create_from_spec(&m, SMALL_MODEL, 1, 1, 12));
    const size_t n = dt_model_num_params(m);
    size_t lo = 0, hi = n, off4 = 0, off16 = 0, changed = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        if (t->ndim == 2 && t->shape[0] == 4) off4 = t->offset;
        if (t->ndim == 2 && t->shape[0] == 16) off16 = t->offset;
    }
    dt_compress_spec cs;
    CHECK_OK(dt_compress_parse(text, &cs));
    dt_grad_sync_config gc = {.comm = c, .model = m, .n = n, .lo = &lo, .hi = &hi, .nb = 1};
    dt_grad_sync *gs;
    CHECK_OK(dt_grad_sync_create(&gs, &cs, &gc));
    static float x[CAP], g[CAP];
    g_of(g, n, 0, 90);
    memcpy(x, g, n * sizeof *x);
    dt_grad_sync_begin_step(gs, 0);
    dt_grad_sync_start(gs, 0, x);
    CHECK_OK(dt_grad_sync_finish(gs, 0));
    *bytes = dt_grad_sync_step_stats(gs).payload_bytes;
    for (size_t i = 0; i < 64; i++) changed += x[off4 + i] != g[off4 + i];
    *lossy_16x12 = 0;
    for (size_t i = 0; i < 192; i++) *lossy_16x12 += x[off16 + i] != g[off16 + i];
    dt_grad_sync_destroy(gs);
    dt_model_destroy(m);
    dt_comm_destroy(c);
    return changed;
}

/* PyTorch's min_compression_rate: at rank 2 the 4 x 16 weight's factors (20 x 2 = 40 values) are
 * not 2x smaller than its 64, so by default it travels whole (exact) with the biases, while the
 * 16 x 12 (56 against 192) is compressed; min_rate=0 compresses both. */
static void test_min_rate(void) {
    double bytes;
    size_t lossy;
    size_t changed = min_rate_step("powersgd:2:warmup=0", &bytes, &lossy);
    CHECK_MSG(changed == 0, "powersgd:2: %zu of the 4x16 weight's 64 values were approximated (want it sent whole)",
              changed);
    CHECK_MSG(bytes == 4.0 * (16 + 4 + 64 + 16 * 2 + 12 * 2), "powersgd:2: %g payload bytes, want %g", bytes,
              4.0 * (16 + 4 + 64 + 16 * 2 + 12 * 2));
    CHECK_MSG(lossy > 0, "powersgd:2: the 16x12 weight came back exact: it was not compressed");
    changed = min_rate_step("powersgd:2:warmup=0:min_rate=0", &bytes, &lossy);
    CHECK_MSG(changed > 0 && lossy > 0,
              "powersgd:2:min_rate=0: the 4x16 weight (%zu values changed) or the 16x12 "
              "(%zu) was not compressed",
              changed, lossy);
    CHECK_MSG(bytes == 4.0 * (16 + 4 + 16 * 2 + 4 * 2 + 12 * 2 + 16 * 2), "powersgd:2:min_rate=0: %g payload bytes",
              bytes);
    printf("powersgd:2 min_rate: a 4x16 weight travels whole by default, compressed with min_rate=0\n");
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* A bucket large enough for the sampled threshold (101000 values, one process): top-k keeps
 * exactly the k largest magnitudes, bit for bit, and leaves the rest in the residual. */
static void test_topk_large(void) {
    dt_comm *c;
    dt_model *m;
    one_process_bucket(&c, &m);
    const size_t n = dt_model_num_params(m);
    size_t lo = 0, hi = n;
    dt_compress_spec cs;
    CHECK_OK(dt_compress_parse("topk:0.01:warmup=0", &cs));
    dt_grad_sync_config gc = {.comm = c, .model = m, .n = n, .lo = &lo, .hi = &hi, .nb = 1};
    dt_grad_sync *gs;
    CHECK_OK(dt_grad_sync_create(&gs, &cs, &gc));
    float *x = malloc(n * sizeof *x), *g = malloc(n * sizeof *g), *mag = malloc(n * sizeof *mag);
    float *res = malloc(n * sizeof *res);
    for (int step = 0; step < 3; step++) {
        g_of(g, n, 0, 50 + step);
        dt_grad_sync_residual(gs, res);
        for (size_t i = 0; i < n; i++) x[i] = g[i], mag[i] = fabsf(g[i] + res[i]); /* what is up for sending */
        qsort(mag, n, sizeof *mag, cmp_desc);
        size_t k = (size_t)ceil(0.01 * (double)n);
        dt_grad_sync_begin_step(gs, step);
        dt_grad_sync_start(gs, 0, x);
        CHECK_OK(dt_grad_sync_finish(gs, 0));
        size_t sent = 0, wrong = 0;
        for (size_t i = 0; i < n; i++)
            if (x[i] != 0) sent++, wrong += fabsf(x[i]) < mag[k - 1];
        CHECK_MSG(sent == k && wrong == 0, "step %d: %zu values sent (want %zu), %zu below the k-th magnitude %g", step,
                  sent, k, wrong, mag[k - 1]);
    }
    printf("topk:0.01 on a %zu-value bucket: exactly the k largest magnitudes sent\n", n);
    free(x), free(g), free(mag), free(res);
    dt_grad_sync_destroy(gs);
    dt_model_destroy(m);
    dt_comm_destroy(c);
}

static void test_parse(void) {
    dt_compress_spec s;
    spec_view v;
    CHECK_OK(dt_compress_parse("topk:0.01:momentum=0.9:warmup=100", &s));
    v = view_of(&s);
    CHECK(is(&v, "topk") && v.ratio == 0.01 && v.momentum == 0.9 && v.warmup == 100);
    CHECK_OK(dt_compress_parse("powersgd:4", &s));
    v = view_of(&s);
    CHECK(is(&v, "powersgd") && v.rank == 4 && v.warmup == 1000); /* PyTorch's start_powerSGD_iter */
    CHECK(v.min_rate == 2.0);                                     /* PyTorch's min_compression_rate */
    CHECK_OK(dt_compress_parse("topk:0.01", &s));
    v = view_of(&s);
    CHECK(is(&v, "topk") && v.warmup == 1000);
    /* the canonical text keeps every warm-up, the default's and an explicit 0, through a round trip
     * (the options as parsed, byte for byte) */
    const char *trip[] = {"powersgd:4",
                          "powersgd:4:warmup=0",
                          "topk:0.01",
                          "topk:0.01:warmup=0",
                          "powersgd:2:min_rate=0",
                          "powersgd:2:min_rate=1.5:warmup=7",
                          "fp16",
                          "none"};
    for (size_t i = 0; i < sizeof trip / sizeof *trip; i++) {
        dt_compress_spec a, b;
        char text[96];
        CHECK_OK(dt_compress_parse(trip[i], &a));
        dt_compress_format(&a, text, sizeof text);
        CHECK_OK(dt_compress_parse(text, &b));
        CHECK_MSG(a.c == b.c && !memcmp(&a, &b, sizeof a), "%s -> %s: reads back other options", trip[i], text);
    }
    CHECK_OK(dt_compress_parse("powersgd:2:warmup=3", &s));
    v = view_of(&s);
    CHECK(is(&v, "powersgd") && v.rank == 2 && v.warmup == 3);
    /* the messages list every compressor of the registry with its syntax */
    CHECK(dt_compress_parse("zip", &s) == DT_EINVAL);
    int n;
    const dt_compressor *const *all = dt_compressors(&n);
    CHECK(n >= 5);
    for (int i = 0; i < n; i++) {
        char form[128];
        snprintf(form, sizeof form, "%s%s%s", all[i]->name, all[i]->options[0] ? ":" : "", all[i]->options);
        CHECK_MSG(strstr(dt_last_error(), form) != NULL, "the message lists %s: %s", form, dt_last_error());
    }
    /* registering: refused without help, with options but no parser, or under a taken name
     * (tests/toy/ registers a compressor that trains) */
    dt_compressor planted = *dt_compress_find("fp16");
    planted.name = "nohelp", planted.help = "";
    CHECK(dt_compress_register(&planted) == DT_EINVAL && strstr(dt_last_error(), "nohelp"));
    planted.help = "h", planted.options = "K";
    CHECK(dt_compress_register(&planted) == DT_EINVAL && strstr(dt_last_error(), "parse"));
    planted.name = "topk", planted.options = "";
    CHECK(dt_compress_register(&planted) == DT_EINVAL && strstr(dt_last_error(), "registered already"));
    CHECK(dt_compressors(&n) && n == 5);
    const char *bad[] = {"topk",
                         "topk:0",
                         "topk:1.5",
                         "topk:0.1:foo=1",
                         "powersgd:0",
                         "powersgd:1.5",
                         "powersgd:2:warmup=x",
                         "powersgd:2:min_rate=-1",
                         "powersgd:2:min_rate=",
                         "powersgd:2:rate=2",
                         "zip",
                         "fp16:2",
                         "none:x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(dt_compress_parse(bad[i], &s) == DT_EINVAL);
        CHECK_MSG(strstr(dt_last_error(), bad[i]) != NULL, "the error names '%s': %s", bad[i], dt_last_error());
    }
}

/* Trains `spec` on W forked ranks; rank 0 writes the final parameters to path. */
static int train_ranks(const char *spec, int W, const char *path, const char *job) {
    fflush(stdout);
    for (int r = 0; r < W; r++) {
        if (fork() != 0) continue;
        dt_comm *c = dt_test_rank_comm(r, W, job);
        dt_train_config cfg = dt_train_defaults();
        cfg.data = g_csv, cfg.model = "linear(16) relu linear(16) relu linear(4)", cfg.epochs = 2, cfg.batch = 8;
        cfg.max_steps = 24, cfg.seed = 5, cfg.comm = c, cfg.strategy = spec;
        cfg.optim = dt_optim_defaults(DT_OPTIM_SGD);
        cfg.lr.base_lr = 0.05f;
        dt_trainer *t;
        dt_status s = dt_trainer_create(&t, &cfg);
        if (s == DT_OK) s = dt_trainer_run(t);
        if (s != DT_OK) {
            fprintf(stderr, "rank %d (%s): %s\n", r, spec, dt_last_error());
            _exit(3);
        }
        dt_model *m = dt_trainer_model(t);
        if (r == 0 && dt_test_write_floats(path, dt_model_params(m), dt_model_num_params(m)) != 0) _exit(4);
        dt_trainer_destroy(t);
        dt_comm_destroy(c);
        _exit(0);
    }
    return dt_test_wait_children();
}

static void test_trainer(void) {
    static float ref[CAP], got[CAP];
    struct {
        const char *base, *spec;
        double tol;
    } cases[] = {
        {"ddp(bucket_mb=0.0005)", "ddp(bucket_mb=0.0005,compress=topk:1:warmup=0)", 1e-5},
        {"ddp(bucket_mb=0.0005)", "ddp(bucket_mb=0.0005,compress=powersgd:64:warmup=0:min_rate=0)", 1e-5},
        {"ddp(bucket_mb=0.0005)", "ddp(bucket_mb=0.0005,compress=fp16)", 1e-3},
        {"ddp(bucket_mb=0.0005)", "ddp(bucket_mb=0.0005,compress=bf16)", 1e-2},
        {"localsgd(sync_every=4)", "localsgd(sync_every=4,compress=topk:1:warmup=0)", 1e-5},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char pa[128], pb[128], job[64];
        snprintf(pa, sizeof pa, "%s/ref%zu", g_dir, k);
        snprintf(pb, sizeof pb, "%s/got%zu", g_dir, k);
        snprintf(job, sizeof job, "cmptr%d_%zua", (int)getpid(), k);
        CHECK(train_ranks(cases[k].base, 2, pa, job) == 0);
        snprintf(job, sizeof job, "cmptr%d_%zub", (int)getpid(), k);
        CHECK(train_ranks(cases[k].spec, 2, pb, job) == 0);
        size_t na = dt_test_read_floats(pa, ref, CAP), nb = dt_test_read_floats(pb, got, CAP);
        double d = na == nb && na ? dt_test_maxdiff(ref, got, na) : INFINITY;
        printf("trainer: %-44s vs %-24s 2 ranks, 24 steps: max |diff| %.3g (tolerance %g)\n", cases[k].spec,
               cases[k].base, d, cases[k].tol);
        CHECK_MSG(d <= cases[k].tol, "%s differs from %s by %g", cases[k].spec, cases[k].base, d);
    }
}

int main(void) {
    dt_test_write_toy_csv(g_dir, g_csv, "/tmp/dtrain-cmp-XXXXXX", 9);
    test_parse();
    test_topk_large();
    test_min_rate();
    test_cast_exact();
    test_rescale_state();
    test_identities();
    test_trainer();
    dt_test_remove_dir(g_dir);
    return dt_test_summary("compress_test");
}
