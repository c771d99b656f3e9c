/* Learning-rate schedules (dt_lr_at) against values worked out by hand: constant, step decay and
 * cosine decay, each with and without linear warm-up, at the boundaries (first step, end of
 * warm-up, each decay, the end of the cosine horizon and past it). */
#include "core/test.h"
#include "dtrain/optim.h"

#include <math.h>

static void expect(const dt_lr_schedule *s, int64_t step, double want, const char *what) {
    double got = dt_lr_at(s, step);
    CHECK_MSG(fabs(got - want) <= 1e-6 * fabs(want) + 1e-12, "%s: step %lld: lr %.9g, want %.9g", what, (long long)step,
              got, want);
}

int main(void) {
    dt_lr_schedule c = {.kind = DT_LR_CONSTANT, .base_lr = 0.1f};
    expect(&c, 0, 0.1, "constant");
    expect(&c, 100000, 0.1, "constant");
    c.warmup_steps = 4; /* (step+1)/4 of the rate, then the rate */
    expect(&c, 0, 0.025, "constant+warmup");
    expect(&c, 2, 0.075, "constant+warmup");
    expect(&c, 3, 0.1, "constant+warmup");
    expect(&c, 4, 0.1, "constant+warmup");

    dt_lr_schedule st = {.kind = DT_LR_STEP, .base_lr = 1.0f, .step_size = 10, .gamma = 0.5f};
    expect(&st, 0, 1.0, "step");
    expect(&st, 9, 1.0, "step");
    expect(&st, 10, 0.5, "step");
    expect(&st, 29, 0.25, "step");
    expect(&st, 30, 0.125, "step");
    st.warmup_steps = 5; /* decays count from the end of warm-up */
    expect(&st, 4, 1.0, "step+warmup");
    expect(&st, 14, 1.0, "step+warmup");
    expect(&st, 15, 0.5, "step+warmup");

    /* cosine from 1e-3 to 1e-5 over 100 steps: lr = min + (base - min) (1 + cos(pi t / T)) / 2 */
    dt_lr_schedule cs = {.kind = DT_LR_COSINE, .base_lr = 1e-3f, .min_lr = 1e-5f, .total_steps = 100};
    const double base = 1e-3f, lo = 1e-5f;
    expect(&cs, 0, base, "cosine");
    expect(&cs, 25, lo + (base - lo) * (1 + sqrt(0.5)) / 2, "cosine");
    expect(&cs, 50, lo + (base - lo) / 2, "cosine");
    expect(&cs, 75, lo + (base - lo) * (1 - sqrt(0.5)) / 2, "cosine");
    expect(&cs, 100, lo, "cosine");
    expect(&cs, 1000, lo, "cosine");
    /* it decreases monotonically (a sign flip of the cosine would make it rise) */
    bool down = true;
    for (int64_t t = 1; t <= 100; t++) down = down && dt_lr_at(&cs, t) <= dt_lr_at(&cs, t - 1);
    CHECK_MSG(down, "cosine schedule is not monotonically decreasing");
    cs.warmup_steps = 10;
    expect(&cs, 0, base / 10, "cosine+warmup");
    expect(&cs, 9, base, "cosine+warmup");
    expect(&cs, 10, base, "cosine+warmup");
    expect(&cs, 60, lo + (base - lo) / 2, "cosine+warmup");
    expect(&cs, 110, lo, "cosine+warmup");

    dt_lr_kind k;
    CHECK(dt_lr_parse("cosine", &k) == DT_OK && k == DT_LR_COSINE);
    CHECK(dt_lr_parse("step", &k) == DT_OK && k == DT_LR_STEP);
    CHECK(dt_lr_parse("linear", &k) == DT_EINVAL);
    return dt_test_summary("schedule_test");
}
