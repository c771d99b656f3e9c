/* Dynamic loss scaling (fp16): the scaler's arithmetic (unscale, skip on inf/NaN, back off,
 * grow after `interval` good steps), and the wiring through the shared train step: with an
 * initial scale of 2^100 the scaled fp16 gradients overflow, so the first steps are skipped
 * (parameters and the optimizer's step count unchanged, the scale halved each time) until the
 * scale fits; the first applied update then equals the update of an unscaled fp16 run. */
#include "core/test.h"
#include "dtrain/dtrain.h"
#include "parallel/strategy.h"

#include <string.h>

static void test_arithmetic(void) {
    dt_loss_scaler s = {.scale = 8, .growth = 2, .backoff = 0.5f, .interval = 3};
    CHECK_OK(dt_loss_scaler_check(&s));
    float g[3] = {8, 16, -24};
    CHECK(dt_loss_scaler_unscale(&s, g, 3) && g[0] == 1 && g[1] == 2 && g[2] == -3 && s.good == 1);
    float bad[3] = {1, INFINITY, 2};
    CHECK(!dt_loss_scaler_unscale(&s, bad, 3) && bad[0] == 1 && bad[2] == 2);
    CHECK(s.scale == 4 && s.skipped == 1 && s.good == 0);
    float nan[20] = {0};
    nan[17] = NAN; /* past the 16-wide loop */
    CHECK(!dt_loss_scaler_unscale(&s, nan, 20) && s.scale == 2 && s.skipped == 2);
    for (int i = 0; i < 3; i++) {
        float ok[2] = {2, 4};
        CHECK(dt_loss_scaler_unscale(&s, ok, 2));
    }
    CHECK_MSG(s.scale == 4 && s.good == 0, "after 3 good steps the scale doubles: %g", s.scale);
    dt_loss_scaler d = dt_loss_scaler_default();
    CHECK(d.scale == 65536 && d.growth == 2 && d.backoff == 0.5f && d.interval == 2000);
    dt_loss_scaler wrong = d;
    wrong.backoff = 1.5f;
    CHECK(dt_loss_scaler_check(&wrong) == DT_EINVAL);
}

typedef struct {
    dt_model *m;
    dt_optim *o;
    dt_strategy *s;
} rig;

static dt_status rig_open(rig *r, const dt_loss_scaler *ls) {
    memset(r, 0, sizeof *r);
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_SGD);
    DT_TRY(dt_model_create_from_spec(&r->m, "linear(16) relu linear(4)", 12, 1, 1));
    dt_model_init(r->m, 3);
    DT_TRY(dt_optim_create(&r->o, &oc, dt_model_num_params(r->m)));
    if (ls) DT_TRY(dt_optim_set_loss_scaling(r->o, true, ls));
    DT_TRY(dt_strategy_create(&r->s, "single", NULL, r->m, r->o, NULL));
    return r->s->ops->init(r->s);
}

static void rig_close(rig *r) {
    dt_strategy_destroy(r->s);
    dt_optim_destroy(r->o);
    dt_model_destroy(r->m);
}

static dt_status rig_step(rig *r, int64_t k) {
    float x[8 * 12];
    int32_t y[8];
    dt_rng_fill_uniform(x, 8 * 12, -1, 1, 5, 1);
    for (int i = 0; i < 8; i++) y[i] = i % 4;
    dt_step_batch b = {.feed = {.x = x, .y = y, .n = 8}, .n_global = 8, .world = 1, .step = k, .lr = 0.5f};
    dt_step_result res;
    return dt_strategy_train_step(r->s, &b, &res);
}

static void test_overflow_skips(void) {
    char lib[16] = "";
    sscanf(dt_kernels_describe(), "%15s", lib); /* the default library, restored at the end */
    CHECK_OK(dt_kernels_select("blas", "fp16"));
    dt_loss_scaler ls = dt_loss_scaler_default();
    ls.scale = 0x1p100f; /* gradients x 2^100 overflow fp16 (max 65504) */
    rig a, ref;
    CHECK_OK(rig_open(&a, &ls));
    CHECK_OK(rig_open(&ref, NULL));
    const size_t np = dt_model_num_params(a.m);
    float *p0 = malloc(np * sizeof *p0);
    memcpy(p0, dt_model_params(a.m), np * sizeof *p0);
    CHECK(memcmp(p0, dt_model_params(ref.m), np * sizeof *p0) == 0);
    int skipped = 0;
    for (int k = 0; k < 120; k++) {
        CHECK_OK(rig_step(&a, 0));
        if (memcmp(p0, dt_model_params(a.m), np * sizeof *p0)) break;
        skipped++;
        CHECK(dt_optim_steps(a.o) == 0);
    }
    const dt_loss_scaler *now = dt_optim_loss_scaler(a.o);
    printf("scale 2^100: %d steps skipped, then applied at scale 2^%d\n", skipped, (int)log2f(now->scale));
    CHECK_MSG(skipped >= 80 && skipped < 120, "%d steps skipped (2^100 must come down below fp16's range)", skipped);
    CHECK(now->skipped == skipped && now->scale == ldexpf(1.0f, 100 - skipped) && dt_optim_steps(a.o) == 1);
    CHECK(dt_optim_loss_scale(a.o) == now->scale && now->good == 1);
    /* the applied update equals the unscaled fp16 run's (the scale is a power of two) */
    CHECK_OK(rig_step(&ref, 0));
    double d = dt_test_maxdiff(dt_model_params(a.m), dt_model_params(ref.m), np),
           moved = dt_test_maxdiff(p0, dt_model_params(ref.m), np);
    CHECK_MSG(d <= 1e-3 * moved, "scaled update differs from the unscaled one by %g (update size %g)", d, moved);
    printf("update vs unscaled run: max diff %.2e of an update of %.2e\n", d, moved);
    free(p0);
    rig_close(&a), rig_close(&ref);
    CHECK_OK(dt_kernels_select(lib, "fp32"));
}

int main(void) {
    dt_set_threads(1);
    test_arithmetic();
    test_overflow_skips();
    return dt_test_summary("loss_scale_test");
}
