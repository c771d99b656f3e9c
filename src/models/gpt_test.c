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
    const char *want[] = {"transformer.wte.weight",
                          "transformer.wpe.weight",
                          "transformer.h.0.ln_1.weight",
                          "transformer.h.0.attn.c_attn.weight",
                          "transformer.h.0.attn.c_proj.bias",
                          "transformer.h.1.mlp.c_fc.weight",
                          "transformer.h.1.mlp.c_proj.weight",
                          "transformer.ln_f.bias"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        CHECK_MSG(dt_model_find_tensor(m, want[i]) >= 0, "%s", want[i]);
    CHECK(dt_model_find_tensor(m, "lm_head.weight") < 0); /* tied: stored once, as wte */
    CHECK(dt_model_num_tensors(m) == 2 + 12 * c.L + 2);
    const dt_param_info *fc = dt_model_tensor(m, dt_model_find_tensor(m, "transformer.h.1.mlp.c_fc.weight"));
    CHECK(fc->ndim == 2 && fc->shape[0] == 64 && fc->shape[1] == 16);
    size_t P = (size_t)c.V * c.C + (size_t)c.T * c.C + (size_t)c.L * (12 * c.C * c.C + 13 * c.C) + 2 * c.C;
    CHECK_MSG(dt_model_num_params(m) == P, "%zu params, want %zu", dt_model_num_params(m), P);
    CHECK(dt_model_in_dtype(m) == DT_I32 && dt_model_in_size(m) == c.T && dt_model_classes(m) == c.V);
    dt_model_destroy(m);
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
    dt_model_destroy(m);
}

static void test_overfit(void) {
    dt_gpt_config c = {.L = 1, .H = 2, .C = 16, .T = 8, .V = 16};
    dt_model *m;
    CHECK_OK(dt_gpt_create(&m, &c));
    if (!m) return;
    dt_model_init(m, 5);
    int32_t ids[2 * 8], tg[2 * 8];
    fill_ids(ids, 16, c.V, 4);
    for (int i = 0; i < 16; i++) tg[i] = (ids[i] + 1) % c.V; /* learnable: the next id */
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
    dt_optim_destroy(o);
    dt_model_destroy(m);
}

static int find_node(const dt_model *m, const char *name) {
    for (int i = 0; i < dt_model_num_nodes(m); i++)
        if (!strcmp(dt_model_node_name(m, i), name)) return i;
    return -1;
}

/* The GPT cut between its blocks into two stages held by two copies of the model (as two
 * pipeline processes would): the boundary is one tensor, the stages' forward gives the whole
 * model's loss, and their backward (the boundary gradient handed back) gives its gradients, the
 * tied wte's being the sum of the first stage's (embedding) and the last's (head) exactly. */
static void test_pipeline_cut(void) {
    dt_gpt_config c = {.L = 2, .H = 2, .C = 16, .T = 8, .V = 32};
    dt_model *mf, *m1, *m2;
    CHECK_OK(dt_gpt_create(&mf, &c));
    CHECK_OK(dt_gpt_create(&m1, &c));
    CHECK_OK(dt_gpt_create(&m2, &c));
    if (!mf || !m1 || !m2) return;
    dt_model_init(mf, 8), dt_model_init(m1, 8), dt_model_init(m2, 8);
    enum { B = 3 };
    int32_t ids[B * 8], tg[B * 8];
    fill_ids(ids, B * c.T, c.V, 5);
    fill_ids(tg, B * c.T, c.V, 6);
    dt_feed f = {.x = ids, .y = tg, .n = B};
    float lf;
    CHECK_OK(dt_model_run(mf, &f, true, 0, &lf));
    dt_model_zero_grad(mf);
    CHECK_OK(dt_model_backward_loss(mf, 1.0f, NULL, NULL));
    const int k = find_node(mf, "transformer.h.0.residual_mlp") + 1, n = dt_model_num_nodes(mf);
    int cut[4];
    CHECK(k > 0 && dt_model_cut_inputs(mf, k, cut, 4) == 1 && cut[0] == k - 1);
    const size_t vals = (size_t)B * c.T * c.C;
    CHECK_OK(dt_model_prepare(m1, B, true, 0));
    CHECK_OK(dt_model_forward_nodes(m1, &f, 0, k));
    CHECK_OK(dt_model_prepare(m2, B, true, 0));
    memcpy(dt_model_node_buffer(m2, k - 1), dt_model_node_values(m1, k - 1), vals * sizeof(float)); /* "send" */
    CHECK_OK(dt_model_forward_nodes(m2, &f, k, n));
    float l2 = dt_model_node_values(m2, dt_model_loss_node(m2))[0];
    CHECK_MSG(l2 == lf, "stage loss %g, whole model %g", l2, lf);
    dt_model_zero_grad(m1), dt_model_zero_grad(m2);
    CHECK_OK(dt_model_backward_nodes(m2, k, n, NULL, 1.0f, NULL, NULL));
    const float *gb = dt_model_node_grad(m2, k - 1); /* "send back" */
    CHECK(gb != NULL);
    if (gb) CHECK_OK(dt_model_backward_nodes(m1, 0, k, gb, 1.0f, NULL, NULL));
    CHECK(dt_model_backward_nodes(m1, 0, k, NULL, 1.0f, NULL, NULL) == DT_EINVAL); /* no loss, no gradient */
    /* bitwise, but for the tied wte: the whole model adds the embedding's rows onto the head's,
     * the stages sum them the other way round (float addition does not associate) */
    const size_t P = dt_model_num_params(mf),
                 wte = dt_model_tensor(mf, dt_model_find_tensor(mf, "transformer.wte.weight"))->numel;
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < P; i++) {
        float a = dt_model_grads(m1)[i] + dt_model_grads(m2)[i], b = dt_model_grads(mf)[i];
        if (i >= wte) bad += a != b;
        else worst = fmax(worst, fabs((double)a - b));
    }
    CHECK_MSG(bad == 0, "%zu of %zu gradients outside wte differ from the whole model's", bad, P - wte);
    CHECK_MSG(worst < 1e-7, "tied wte: max |stages - whole| = %g", worst);
    dt_model_destroy(mf), dt_model_destroy(m1), dt_model_destroy(m2);
}

/* Node hooks fire once per node: before each forward in node order, after each backward in
 * reverse. */
typedef struct {
    int fwd[256], bwd[256], nf, nb;
} hook_log;
static void log_fwd(void *ctx, int node) {
    hook_log *h = ctx;
    if (h->nf < 256) h->fwd[h->nf++] = node;
}
static void log_bwd(void *ctx, int node) {
    hook_log *h = ctx;
    if (h->nb < 256) h->bwd[h->nb++] = node;
}

static void test_node_hooks(void) {
    dt_gpt_config c = {.L = 1, .H = 1, .C = 8, .T = 4, .V = 16};
    dt_model *m;
    CHECK_OK(dt_gpt_create(&m, &c));
    if (!m) return;
    dt_model_init(m, 1);
    static hook_log h;
    dt_model_set_node_hooks(m, log_fwd, log_bwd, &h);
    int32_t ids[4] = {1, 2, 3, 4};
    dt_feed f = {.x = ids, .y = ids, .n = 1};
    CHECK_OK(dt_model_run(m, &f, true, 0, NULL));
    CHECK_OK(dt_model_backward_loss(m, 1.0f, NULL, NULL));
    bool inc = h.nf > 0, dec = h.nb > 0;
    for (int i = 1; i < h.nf; i++) inc &= h.fwd[i] > h.fwd[i - 1];
    for (int i = 1; i < h.nb; i++) dec &= h.bwd[i] < h.bwd[i - 1];
    CHECK_MSG(inc && h.nf == dt_model_num_nodes(m) - 2, "%d forward hooks for %d nodes", h.nf, dt_model_num_nodes(m));
    CHECK(dec && h.bwd[0] == dt_model_loss_node(m));
    dt_model_destroy(m);
}

int main(void) {
    test_parse();
    test_names();
    test_loss_and_grads();
    test_overfit();
    test_pipeline_cut();
    test_node_hooks();
    return dt_test_summary("gpt_test");
}
