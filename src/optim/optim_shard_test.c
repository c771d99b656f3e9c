/* Optimizer shards (ZeRO): dt_optim_shard keeps exactly the state of the given ranges, and
 * dt_optim_step_ranges over those ranges updates them bitwise as the whole optimizer does
 * (SGD with momentum and Nesterov, Adam with L2, AdamW), with one step counted per call; on the
 * checked device (ZeRO on a device) the shard is packed there and updates bitwise as on the host. */
#include "core/test.h"
#include "device/device.h"
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
    bool untouched = true; /* values outside the ranges keep the warm-up step's result only */
    static float ref[N];
    memcpy(ref, ps, sizeof ref);
    for (int i = 100; i < 400; i++) untouched &= ps[i] != pw[i];
    CHECK(untouched);
    const size_t bad_off[1] = {990}, bad_len[1] = {20};
    CHECK(dt_optim_shard(sh, 1, bad_off, bad_len) == DT_EINVAL);
    dt_optim_destroy(whole), dt_optim_destroy(sh);
}

/* The same shard on the checked device: its state packed into device blocks by the device's copy,
 * the ranges updated on device pointers, bitwise the host shard's parameters and moments. */
static void test_device(dt_optim_kind kind) {
    dt_dev *d = NULL;
    CHECK_OK(dt_device_create(&d, "checked"));
    dt_optim_config oc = dt_optim_defaults(kind);
    if (kind == DT_OPTIM_SGD) oc.momentum = 0.9f;
    dt_optim *host, *dev;
    CHECK_OK(dt_optim_create(&host, &oc, N));
    CHECK_OK(dt_optim_create(&dev, &oc, N));
    CHECK_OK(dt_optim_set_device(dev, d));
    static float ph[N], g[N], out[N];
    for (int i = 0; i < N; i++)
        ph[i] = dt_rng_uniform(2, 1, (uint64_t)i) - 0.5f, g[i] = dt_rng_uniform(2, 2, (uint64_t)i);
    float *pd = d->ops->alloc(d, N * sizeof(float)), *gd = d->ops->alloc(d, N * sizeof(float));
    d->ops->upload(d, pd, ph, sizeof ph), d->ops->upload(d, gd, g, sizeof g);
    dt_optim_step(host, ph, g, 0.01f);
    dt_optim_step(dev, pd, gd, 0.01f);
    const size_t off[3] = {700, 10, 400}, len[3] = {300, 90, 0};
    CHECK_OK(dt_optim_shard(host, 3, off, len));
    CHECK_OK(dt_optim_shard(dev, 3, off, len));
    CHECK(dt_optim_size(dev) == 390);
    for (int t = 0; t < STEPS; t++) {
        for (int i = 0; i < N; i++) g[i] = dt_rng_uniform(2, 3 + (uint64_t)t, (uint64_t)i) - 0.5f;
        d->ops->upload(d, gd, g, sizeof g);
        float *p[3] = {ph + 700, ph + 10, ph + 400}, *q[3] = {pd + 700, pd + 10, pd + 400};
        const float *gr[3] = {g + 700, g + 10, g + 400}, *gq[3] = {gd + 700, gd + 10, gd + 400};
        dt_optim_step_ranges(host, 3, p, gr, len, 0.01f);
        dt_optim_step_ranges(dev, 3, q, gq, len, 0.01f);
    }
    d->ops->download(d, out, pd, sizeof out);
    CHECK_MSG(!memcmp(out, ph, sizeof out), "%s on checked: the shard's update differs from the host's",
              dt_optim_name(kind));
    CHECK(dt_optim_num_states(dev) == dt_optim_num_states(host));
    for (int k = 0; k < dt_optim_num_states(dev); k++) {
        d->ops->download(d, out, dt_optim_state(dev, k, NULL), 390 * sizeof(float));
        CHECK(!memcmp(out, dt_optim_state(host, k, NULL), 390 * sizeof(float)));
    }
    dt_optim_destroy(host), dt_optim_destroy(dev);
    d->ops->free(d, pd), d->ops->free(d, gd);
    dt_device_destroy(d);
}

int main(void) {
    test_kind(DT_OPTIM_SGD, false);
    test_kind(DT_OPTIM_SGD, true);
    test_kind(DT_OPTIM_ADAM, false);
    test_kind(DT_OPTIM_ADAMW, false);
    test_device(DT_OPTIM_SGD);
    test_device(DT_OPTIM_ADAMW);
    return dt_test_summary("optim_shard_test");
}
