/* Optimizer shards (ZeRO): dt_optim_shard keeps exactly the state of the given ranges, and
 * dt_optim_step_ranges over those ranges updates them bitwise as the whole optimizer does
 * (SGD with momentum and Nesterov, Adam with L2, AdamW), with one step counted per call. */
#include "core/test.h"
#include "dtrain/optim.h"

#include <string.h>

enum { N = 1000, STEPS = 5 };

static void test_kind(dt_optim_kind kind, bool nesterov) {
    dt_optim_config oc = dt_optim_defaults(kind);
    if (kind == DT_OPTIM_SGD) oc.momentum = 0.9f, oc.nesterov = nesterov, oc.weight_decay = 0.01f;
    if (kind == DT_OPTIM_ADAM) oc.weight_decay = 0.02f;
    dt_optim *whole, *sh;
    CHECK_OK(dt_optim_create(&whole, &oc, N));
    CHECK_OK(dt_optim_create(&sh, &oc, N));
    static float pw[N], ps[N], g[N];
    for (int i = 0; i < N; i++) pw[i] = ps[i] = dt_rng_uniform(1, 1, (uint64_t)i) - 0.5f;
    /* warm both up whole, so the shard starts from non-zero moments */
    for (int i = 0; i < N; i++) g[i] = dt_rng_uniform(1, 2, (uint64_t)i) - 0.5f;
    dt_optim_step(whole, pw, g, 0.01f);
    dt_optim_step(sh, ps, g, 0.01f);
    const size_t off[3] = {700, 10, 400}, len[3] = {300, 90, 0};
    CHECK_OK(dt_optim_shard(sh, 3, off, len));
    CHECK(dt_optim_size(sh) == 390 && dt_optim_steps(sh) == 1);
    for (int k = 0; k < dt_optim_num_states(sh); k++) {
        float *a = dt_optim_state(whole, k, NULL), *b = dt_optim_state(sh, k, NULL);
        CHECK(!memcmp(b, a + 700, 300 * sizeof(float)) && !memcmp(b + 300, a + 10, 90 * sizeof(float)));
    }
    for (int t = 0; t < STEPS; t++) {
        for (int i = 0; i < N; i++) g[i] = dt_rng_uniform(1, 3 + (uint64_t)t, (uint64_t)i) - 0.5f;
        dt_optim_step(whole, pw, g, 0.01f);
        float *p[3] = {ps + 700, ps + 10, ps + 400};
        const float *gr[3] = {g + 700, g + 10, g + 400};
        dt_optim_step_ranges(sh, 3, p, gr, len, 0.01f);
    }
    CHECK(dt_optim_steps(sh) == 1 + STEPS);
    CHECK_MSG(!memcmp(pw + 700, ps + 700, 300 * sizeof(float)) && !memcmp(pw + 10, ps + 10, 90 * sizeof(float)),
              "%s: the shard's update differs from the whole optimizer's", dt_optim_name(kind));
    bool untouched = true;  /* values outside the ranges keep the warm-up step's result only */
    static float ref[N];
    memcpy(ref, ps, sizeof ref);
    for (int i = 100; i < 400; i++) untouched &= ps[i] != pw[i];
    CHECK(untouched);
    const size_t bad_off[1] = {990}, bad_len[1] = {20};
    CHECK(dt_optim_shard(sh, 1, bad_off, bad_len) == DT_EINVAL);
    dt_optim_free(whole), dt_optim_free(sh);
}

int main(void) {
    test_kind(DT_OPTIM_SGD, false);
    test_kind(DT_OPTIM_SGD, true);
    test_kind(DT_OPTIM_ADAM, false);
    test_kind(DT_OPTIM_ADAMW, false);
    return dt_test_summary("optim_shard_test");
}
