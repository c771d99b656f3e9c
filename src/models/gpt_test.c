/* GPT builder: spec parsing, nanoGPT tensor names and shapes, the tied head, loss at
 * initialisation (~ln V), finite-difference spot checks through the whole model (the tied
 * weight included), and that Adam overfits one batch. The PyTorch reference comparison is
 * src/nn/graph_ref_test.c. */
#include "core/test.h"
#include "dtrain/models.h"
#include "dtrain/optim.h"

#include <string.h>

static void fill_ids(int32_t *ids, int n, int V, uint32_t seed) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(dt_rng_u64(seed, 7, (uint64_t)i) % (uint64_t)V);
}

static void test_parse(void) {
    dt_gpt_config c;
    CHECK_OK(dt_gpt_parse("gpt", &c));
    CHECK(c.L == 4 && c.H == 4 && c.C == 128 && c.T == 64 && c.V == 256);
    CHECK_OK(dt_gpt_parse("gpt:L=2,H=2,C=16,T=8", &c));
    CHECK(c.L == 2 && c.H == 2 && c.C == 16 && c.T == 8 && c.V == 256);
    CHECK(dt_gpt_parse("gpt:L=2,H=3,C=16", &c) == DT_EINVAL && strstr(dt_last_error(), "multiple of the H=3"));
    CHECK(dt_gpt_parse("gpt:X=2", &c) == DT_EINVAL && strstr(dt_last_error(), "unknown key 'X'"));
    CHECK(dt_gpt_parse("gpt:L=", &c) == DT_EINVAL);
    CHECK(dt_gpt_parse("gpt:L", &c) == DT_EINVAL);
    CHECK(dt_model_spec_is_gpt("gpt:L=1") && dt_model_spec_is_gpt("gpt") && !dt_model_spec_is_gpt("gpt2"));
    char buf[64];
    dt_gpt_format(buf, sizeof buf, &c);
    CHECK(!strcmp(buf, "gpt:L=2,H=2,C=16,T=8,V=256") || (strstr(buf, "gpt:L=") == buf));
}

static void test_names(void) {
    dt_gpt_config c = {.L = 2, .H = 2, .C = 16, .T = 8, .V = 32};
    dt_model *m;
    CHECK_OK(dt_gpt_create(&m, &c));
    if (!m) return;
    const char *want[] = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                          "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.bias",
                          "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight",
                          "transformer.ln_f.bias"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) CHECK_MSG(dt_model_find_tensor(m, want[i]) >= 0, "%s", want[i]);
    CHECK(dt_model_find_tensor(m, "lm_head.weight") < 0);  /* tied: stored once, as wte */
    CHECK(dt_model_num_tensors(m) == 2 + 12 * c.L + 2);
    const dt_param_info *fc = dt_model_tensor(m, dt_model_find_tensor(m, "transformer.h.1.mlp.c_fc.weight"));
    CHECK(fc->ndim == 2 && fc->shape[0] == 64 && fc->shape[1] == 16);
    size_t P = (size_t)c.V * c.C + (size_t)c.T * c.C + (size_t)c.L * (12 * c.C * c.C + 13 * c.C) + 2 * c.C;
    CHECK_MSG(dt_model_num_params(m) == P, "%zu params, want %zu", dt_model_num_params(m), P);
    CHECK(dt_model_in_dtype(m) == DT_I32 && dt_model_in_size(m) == c.T && dt_model_classes(m) == c.V);
    dt_model_free(m);
}

/* loss(p + h e_i) - loss(p - h e_i) over 2h, in double through the f32 model */
static double numeric(dt_model *m, const dt_feed *f, size_t i, float h) {
    float *p = dt_model_params(m), keep = p[i], lp, lm;
    p[i] = keep + h;
    dt_model_run(m, f, true, 0, &lp);
    p[i] = keep - h;
    dt_model_run(m, f, true, 0, &lm);
    p[i] = keep;
    return ((double)lp - (double)lm) / (2.0 * h);
}

static void test_loss_and_grads(void) {
    dt_gpt_config c = {.L = 2, .H = 2, .C = 16, .T = 8, .V = 32};
    dt_model *m;
    CHECK_OK(dt_gpt_create(&m, &c));
    if (!m) return;
    dt_model_init(m, 3);
    enum { B = 3 };
    int32_t ids[B * 8], tg[B * 8];
    fill_ids(ids, B * c.T, c.V, 1);
    fill_ids(tg, B * c.T, c.V, 2);
    dt_feed f = {.x = ids, .y = tg, .n = B};
    float loss;
    CHECK_OK(dt_model_run(m, &f, true, 0, &loss));
    CHECK_MSG(fabsf(loss - logf((float)c.V)) < 0.1f, "loss at init %g, ln V = %g", loss, logf((float)c.V));
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_backward_loss(m, 1.0f, NULL, NULL));
    /* spot checks: a used row of the tied wte (both uses), wpe, c_attn, the last c_proj, ln_f */
    const char *names[] = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight",
                           "transformer.h.1.mlp.c_proj.weight", "transformer.ln_f.weight"};
    const float *g = dt_model_grads(m);
    double worst = 0;
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        const dt_param_info *t = dt_model_tensor(m, dt_model_find_tensor(m, names[k]));
        for (int j = 0; j < 4; j++) {
            size_t i = t->offset + (k == 0 ? (size_t)ids[j] * c.C + (size_t)j : (size_t)(j * 37) % t->numel);
            double num = numeric(m, &f, i, 1e-2f), an = g[i];
            double err = fabs(num - an) / fmax(1e-3, fabs(num) + fabs(an));
            if (err > worst) worst = err;
            CHECK_MSG(err < 2e-2, "%s[%zu]: analytic %g, numeric %g", names[k], i - t->offset, an, num);
        }
    }
    CHECK(worst < 2e-2);
    dt_model_free(m);
}

static void test_overfit(void) {
    dt_gpt_config c = {.L = 1, .H = 2, .C = 16, .T = 8, .V = 16};
    dt_model *m;
    CHECK_OK(dt_gpt_create(&m, &c));
    if (!m) return;
    dt_model_init(m, 5);
    int32_t ids[2 * 8], tg[2 * 8];
    fill_ids(ids, 16, c.V, 4);
    for (int i = 0; i < 16; i++) tg[i] = (ids[i] + 1) % c.V;  /* learnable: the next id */
    dt_feed f = {.x = ids, .y = tg, .n = 2};
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
    dt_optim *o;
    CHECK_OK(dt_optim_create(&o, &oc, dt_model_num_params(m)));
    float first = 0, loss = 0;
    for (int s = 0; s < 60; s++) {
        CHECK_OK(dt_model_run(m, &f, true, (uint64_t)s, &loss));
        if (s == 0) first = loss;
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward_loss(m, 1.0f, NULL, NULL));
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 1e-2f);
    }
    CHECK_MSG(loss < 0.2f * first, "loss %g -> %g after 60 Adam steps on one batch", first, loss);
    /* an id outside the vocabulary is refused with its place */
    ids[5] = c.V;
    CHECK(dt_model_run(m, &f, false, 0, &loss) == DT_EINVAL && strstr(dt_last_error(), "position 5"));
    dt_optim_free(o);
    dt_model_free(m);
}

int main(void) {
    test_parse();
    test_names();
    test_loss_and_grads();
    test_overfit();
    return dt_test_summary("gpt_test");
}
