/* Values that only bf16 linears read, stored bf16 (nn/graph_layout.c, plan_linear_inputs): which
 * nodes the plan picks in a GPT, an MLP and the CNN, that the memory it counts is what a step
 * takes, and that training with the plan is BITWISE the same as without it (each linear rounds
 * its input to bf16 anyway). The plan needs linears that take bf16 values, which the onednn bf16
 * table has only where the CPU has AVX512-BF16; on any CPU it is made with a copy of that table
 * whose predicate says yes (its kernels widen the values back where oneDNN has no bf16 GEMM, so
 * the comparison holds everywhere). And the gradients of plan_linear_grads (a c_fc's and a
 * c_attn's, which the GELU and the attention round to bf16): the same GEMM results, the bias
 * gradients within bf16 rounding. */
#include "backend/backend.h"
#include "core/test.h"
#include "dtrain/core.h"
#include "dtrain/layers.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "nn/graph_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool yes(void) { return true; }
static bool no(void) { return false; }

/* A model of spec on table t (its own plan); NULL when it cannot be built. */
static dt_model *build(const char *spec, int C, int H, int W, const dt_backend *t) {
    dt_model *m = NULL;
    CHECK_OK(dt_model_build(&m, spec, C, H, W));
    if (!m) return NULL;
    dt_model_init(m, 5);
    m->be = t;
    dt_graph_plan_bf16(m);
    return m;
}

static bool ends_with(const char *s, const char *tail) {
    const size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* The GPT's layernorms, attention outputs and GELUs are stored bf16, nothing else; of the
 * gradients, the c_fc's and c_attn's (a GELU, an attention their only reader) where the table
 * has the entries for it. */
static void check_gpt_plan(const dt_backend *t) {
    dt_model *m = build("gpt:L=2,H=2,C=32,T=8,V=64", 0, 0, 0, t);
    if (!m) return;
    int nbf = 0;
    for (int i = 0; i < m->n; i++) {
        const dt_node *n = &m->nodes[i];
        const bool want = ends_with(n->name, "ln_1") || ends_with(n->name, "ln_2") || ends_with(n->name, "ln_f") ||
                          ends_with(n->name, "attn.attention") || ends_with(n->name, "mlp.gelu");
        const bool want_grad = (ends_with(n->name, "mlp.c_fc") || ends_with(n->name, "attn.c_attn")) &&
                               t->gelu_backward_bf16 && t->linear_backward_bf16_grad;
        CHECK_MSG(n->bf16 == want && n->grad_bf16 == want_grad, "gpt node %s: bf16 %d (want %d), gradient bf16 %d",
                  n->name, n->bf16, want, n->grad_bf16);
        nbf += n->bf16;
    }
    CHECK_MSG(nbf == 2 * 4 + 1, "gpt: %d bf16 values (want 9)", nbf);
    dt_model_free(m);
}

static void check_plans(const dt_backend *be) {
    dt_backend t = *be;
    t.linear_bf16_values = yes;
    check_gpt_plan(&t);
    t.linear_backward_bf16_grad = NULL;
    check_gpt_plan(&t);
    t = *be;
    t.linear_bf16_values = yes;
    dt_model *m = build("mlp", 1, 28, 28, &t);  /* flatten linear relu linear: the relu; no gradient */
    if (m) {
        for (int i = 0; i < m->n; i++)
            CHECK_MSG(m->nodes[i].bf16 == (m->nodes[i].a.kind == DT_LAYER_RELU) && !m->nodes[i].grad_bf16,
                      "mlp node %s: bf16 %d, gradient bf16 %d", m->nodes[i].name, m->nodes[i].bf16,
                      m->nodes[i].grad_bf16);
        dt_model_free(m);
    }
    /* the CNN: the relu between its linears, besides its conv chain */
    t.conv2d_bf16_values = NULL;
    if ((m = build("cnn", 1, 28, 28, &t))) {
        int nbf = 0;
        for (int i = 0; i < m->n; i++) nbf += m->nodes[i].bf16;
        CHECK_MSG(nbf == 1, "cnn without bf16 convs: %d bf16 values (want the relu's)", nbf);
        dt_model_free(m);
    }
    t = *be;
    t.linear_bf16_values = no;
    if ((m = build("gpt:L=2,H=2,C=32,T=8,V=64", 0, 0, 0, &t))) {
        for (int i = 0; i < m->n; i++) CHECK(!m->nodes[i].bf16);
        dt_model_free(m);
    }
}

/* steps of training (plain SGD on the gradients) with and without the plan of values: bitwise
 * equal losses, gradients and parameters; the memory a step takes is what the plan counts. */
static void check_same(const dt_backend *be, const char *spec, int C, int H, int W, const void *x, int B) {
    dt_backend on = *be, off = *be;
    on.linear_bf16_values = yes, off.linear_bf16_values = no;
    on.linear_backward_bf16_grad = NULL;  /* values only: check_grads has the gradients */
    dt_model *a = build(spec, C, H, W, &on), *b = build(spec, C, H, W, &off);
    if (!a || !b) return dt_model_free(a), dt_model_free(b);
    const int T = C ? 1 : a->nodes[a->output].shape[0];
    int32_t *y = malloc(sizeof(int32_t) * (size_t)B * T);
    for (int i = 0; i < B * T; i++) y[i] = (int32_t)((i * 7 + 3) % 10);
    const dt_feed f = {.x = x, .y = y, .n = B};
    const size_t np = dt_model_num_params(a);
    bool same = true;
    for (int step = 0; step < 3; step++) {
        float la = 0, lb = 0;
        CHECK_OK(dt_model_prepare(a, B, true, 0));
        CHECK_OK(dt_model_prepare(b, B, true, 0));
        const size_t before = dt_mem_used();
        CHECK_OK(dt_model_run(a, &f, true, 0, &la));
        CHECK_OK(dt_model_run(b, &f, true, 0, &lb));
        dt_model_zero_grad(a), dt_model_zero_grad(b);
        CHECK_OK(dt_model_backward_loss(a, 1.0f, NULL, NULL));
        CHECK_OK(dt_model_backward_loss(b, 1.0f, NULL, NULL));
        CHECK_MSG(dt_mem_used() == before, "%s: a step with bf16 values took %zu more bytes", spec,
                  dt_mem_used() - before);
        const float *ga = dt_model_grads(a), *gb = dt_model_grads(b);
        same &= la == lb && !memcmp(ga, gb, np * sizeof(float));
        CHECK_MSG(same, "%s step %d: loss %.9g with bf16 values, %.9g without; gradients %s", spec, step, la, lb,
                  memcmp(ga, gb, np * sizeof(float)) ? "differ" : "equal");
        float *pa = dt_model_params(a), *pb = dt_model_params(b);
        for (size_t i = 0; i < np; i++) pa[i] -= 0.05f * ga[i], pb[i] -= 0.05f * gb[i];
    }
    int nbf = 0;
    for (int i = 0; i < a->n; i++) nbf += a->nodes[i].bf16;
    CHECK(nbf > 0);
    printf("%s: 3 steps with %d bf16 values equal the f32 ones bitwise: %s\n", spec, nbf, same ? "yes" : "no");
    free(y);
    dt_model_free(a), dt_model_free(b);
}

/* The GPT with and without bf16 c_fc and c_attn gradients (both with bf16 values), one step: the
 * loss and every gradient bitwise equal but those linears' biases' (the GEMMs take the same
 * rounded values), and each of those within the rounding of its terms: |db - db32| <= 2^-8 *
 * sum |dout| plus the f32 sums' own rounding (B * T terms, 2^-24 each, bounded by 2^-20 *
 * sum |dout|). */
static void check_grads(const dt_backend *be, const int32_t *ids, int B) {
    dt_backend on = *be, off = *be;
    on.linear_bf16_values = off.linear_bf16_values = yes;
    off.linear_backward_bf16_grad = NULL;
    const char *spec = "gpt:L=2,H=2,C=32,T=8,V=64";
    dt_model *a = build(spec, 0, 0, 0, &on), *b = build(spec, 0, 0, 0, &off);
    if (!a || !b) return dt_model_free(a), dt_model_free(b);
    const int T = a->nodes[a->output].shape[0];
    int32_t *y = malloc(sizeof(int32_t) * (size_t)B * T);
    for (int i = 0; i < B * T; i++) y[i] = (int32_t)((i * 7 + 3) % 64);
    const dt_feed f = {.x = ids, .y = y, .n = B};
    float la = 0, lb = 0;
    CHECK_OK(dt_model_prepare(a, B, true, 0));
    CHECK_OK(dt_model_prepare(b, B, true, 0));
    CHECK_OK(dt_model_run(a, &f, true, 0, &la));
    CHECK_OK(dt_model_run(b, &f, true, 0, &lb));
    dt_model_zero_grad(a), dt_model_zero_grad(b);
    CHECK_OK(dt_model_backward_loss(a, 1.0f, NULL, NULL));
    CHECK_OK(dt_model_backward_loss(b, 1.0f, NULL, NULL));
    CHECK(la == lb);
    const size_t np = dt_model_num_params(a);
    bool *bias = calloc(np, sizeof(bool));
    const float *ga = dt_model_grads(a), *gb = dt_model_grads(b);
    int planned = 0, diff = 0, nbias = 0;
    double worst = 0;
    for (int i = 0; bias && i < a->n; i++) {
        const dt_node *n = &a->nodes[i];
        if (!n->grad_bf16) continue;
        planned++;
        const int OC = n->a.out, rows = B * (int)(n->out_n / (size_t)OC);
        const float *g32 = b->nodes[i].grad;  /* the f32 gradient the other plan keeps */
        const size_t off0 = dt_node_tensor_off(a, n, 1);
        for (int j = 0; j < OC; j++) {
            double mass = 0;
            for (int r = 0; r < rows; r++) mass += fabs(g32[(size_t)r * OC + j]);
            const double err = fabs((double)ga[off0 + j] - gb[off0 + j]), tol = mass * (0x1p-8 + 0x1p-20);
            bias[off0 + j] = true, nbias++;
            diff += ga[off0 + j] != gb[off0 + j];
            if (tol > 0 && err / tol > worst) worst = err / tol;
            CHECK_MSG(err <= tol, "%s bias %d: gradient %.9g with bf16 gradients, %.9g without (tolerance %.3g)",
                      n->name, j, ga[off0 + j], gb[off0 + j], tol);
        }
    }
    CHECK_MSG(planned == 4, "gpt: %d linears with bf16 gradients (want the 2 c_fc and 2 c_attn)", planned);
    size_t other = 0;
    for (size_t i = 0; bias && i < np; i++) other += !bias[i] && memcmp(&ga[i], &gb[i], sizeof(float));
    CHECK_MSG(other == 0, "gpt: %zu gradients besides the c_fc and c_attn biases differ with bf16 gradients",
              other);
    printf("%s: bf16 c_fc and c_attn gradients: %d of the %d biases' gradients differ, worst %.3f of the rounding bound; "
           "the other %zu equal bitwise\n", spec, diff, nbias, worst, np - (size_t)nbias);
    free(bias), free(y);
    dt_model_free(a), dt_model_free(b);
}

int main(void) {
    const dt_backend *be = NULL;
    if (dt_kernels_select("onednn", "bf16") != DT_OK || dt_backend_find("onednn", DT_BF16, &be) != DT_OK) {
        printf("graph_bf16_test: skipped (built without oneDNN)\n");
        return dt_test_summary("graph_bf16_test");
    }
    printf("linears take bf16 values natively here: %s\n", be->linear_bf16_values() ? "yes" : "no");
    check_plans(be);
    enum { B = 5 };
    int32_t ids[B * 8];
    for (int i = 0; i < B * 8; i++) ids[i] = (int32_t)((i * 13 + 1) % 64);
    check_same(be, "gpt:L=2,H=2,C=32,T=8,V=64", 0, 0, 0, ids, B);
    check_grads(be, ids, B);
    float *x = malloc(sizeof(float) * B * 784);
    if (x) {
        dt_rng_fill_uniform(x, B * 784, 0, 1, 5, 0);
        check_same(be, "mlp", 1, 28, 28, x, B);
        check_same(be, "cnn", 1, 28, 28, x, B);
    }
    free(x);
    /* the blas bf16 table has no bf16 linears: nothing is planned */
    CHECK_OK(dt_kernels_select("blas", "bf16"));
    dt_model *m = NULL;
    CHECK_OK(dt_model_build(&m, "gpt:L=1,H=2,C=32,T=8,V=64", 0, 0, 0));
    for (int i = 0; m && i < m->n; i++) CHECK(!m->nodes[i].bf16);
    dt_model_free(m);
    CHECK_OK(dt_kernels_select("blas", "fp32"));
    return dt_test_summary("graph_bf16_test");
}
