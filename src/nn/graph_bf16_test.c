/* Values that only bf16 linears read, stored bf16 (nn/graph_layout.c, plan_linear_inputs): which
 * nodes the plan picks in a GPT, an MLP and the CNN, that the memory it counts is what a step
 * takes, and that training with the plan is BITWISE the same as without it (each linear rounds
 * its input to bf16 anyway). The plan needs linears that take bf16 values, which the onednn bf16
 * table has only where the CPU has AVX512-BF16; on any CPU it is made with a copy of that table
 * whose predicate says yes (its kernels widen the values back where oneDNN has no bf16 GEMM, so
 * the comparison holds everywhere). And the gradients of plan_linear_grads (a c_fc's and a
 * c_attn's, which the GELU and the attention round to bf16): the same GEMM results, the bias
 * gradients within bf16 rounding. With every bf16 plan on, the GPT and the MLP train on the checked
 * device (docs/device.md: memory the host cannot touch) bitwise as on the cpu device: the bf16
 * values, gradients and their casts go through the device. */
#include "backend/backend.h"
#include "core/test.h"
#include "dtrain/core.h"
#include "backend/layers.h"
#include "dtrain/models.h"
#include "device/device.h"
#include "dtrain/nn.h"
#include "nn/graph_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GPT_SPEC "gpt:L=2,H=2,C=32,T=8,V=64"

static bool yes(void) { return true; }
static bool no(void) { return false; }

/* A model of spec on table t (its own plan); NULL when it cannot be built. */
static dt_model *build(const char *spec, int C, int H, int W, const dt_kernel_table *t) {
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

/* The GPT's layernorms, attention outputs and GELUs are stored bf16, and its c_fc's where the
 * table has the GELU plan's entries; of the gradients, the c_fc's and c_attn's (a GELU, an
 * attention their only reader) where it has the entries for them, and the GELU's with the GELU
 * plan. */
static void check_gpt_plan(const dt_kernel_table *t) {
    dt_model *m = build(GPT_SPEC, 0, 0, 0, t);
    if (!m) return;
    int nbf = 0, nbf_want = 0;
    for (int i = 0; i < m->n; i++) {
        const dt_node *n = &m->nodes[i];
        const bool grads = t->gelu_backward_bf16 && t->linear_backward_bf16_grad,
                   gelu_plan = grads && t->linear_forward_bf16io && t->gelu_forward_bf16io;
        const bool want = ends_with(n->name, "ln_1") || ends_with(n->name, "ln_2") || ends_with(n->name, "ln_f") ||
                          ends_with(n->name, "attn.attention") || ends_with(n->name, "mlp.gelu") ||
                          (gelu_plan && ends_with(n->name, "mlp.c_fc"));
        const bool want_grad = ((ends_with(n->name, "mlp.c_fc") || ends_with(n->name, "attn.c_attn")) && grads) ||
                               (gelu_plan && ends_with(n->name, "mlp.gelu"));
        nbf_want += want;
        CHECK_MSG(n->bf16 == want && n->grad_bf16 == want_grad, "gpt node %s: bf16 %d (want %d), gradient bf16 %d",
                  n->name, n->bf16, want, n->grad_bf16);
        nbf += n->bf16;
    }
    CHECK_MSG(nbf == nbf_want && nbf >= 2 * 4 + 1, "gpt: %d bf16 values (want %d)", nbf, nbf_want);
    dt_model_destroy(m);
}

static void check_plans(const dt_kernel_table *be) {
    dt_kernel_table t = *be;
    t.linear_bf16_values = yes;
    check_gpt_plan(&t);
    t.linear_forward_bf16io = NULL;
    check_gpt_plan(&t);
    t.linear_backward_bf16_grad = NULL;
    check_gpt_plan(&t);
    t = *be;
    t.linear_bf16_values = yes;
    dt_model *m = build("mlp", 1, 28, 28, &t); /* flatten linear relu linear: the relu; no gradient */
    if (m) {
        for (int i = 0; i < m->n; i++)
            CHECK_MSG(m->nodes[i].bf16 == (m->nodes[i].a.kind == DT_LAYER_RELU) && !m->nodes[i].grad_bf16,
                      "mlp node %s: bf16 %d, gradient bf16 %d", m->nodes[i].name, m->nodes[i].bf16,
                      m->nodes[i].grad_bf16);
        dt_model_destroy(m);
    }
    /* the CNN: the relu between its linears, besides its conv chain */
    t.conv2d_bf16_values = NULL;
    if ((m = build("cnn", 1, 28, 28, &t))) {
        int nbf = 0;
        for (int i = 0; i < m->n; i++) nbf += m->nodes[i].bf16;
        CHECK_MSG(nbf == 1, "cnn without bf16 convs: %d bf16 values (want the relu's)", nbf);
        dt_model_destroy(m);
    }
    t = *be;
    t.linear_bf16_values = no;
    if ((m = build(GPT_SPEC, 0, 0, 0, &t))) {
        for (int i = 0; i < m->n; i++) CHECK(!m->nodes[i].bf16);
        dt_model_destroy(m);
    }
}

/* steps of training (plain SGD on the gradients) with and without the plan of values: bitwise
 * equal losses, gradients and parameters; the memory a step takes is what the plan counts. */
static void check_same(const dt_kernel_table *be, const char *spec, int C, int H, int W, const void *x, int B) {
    dt_kernel_table on = *be, off = *be;
    on.linear_bf16_values = yes, off.linear_bf16_values = no;
    on.linear_backward_bf16_grad = NULL; /* values only: check_grads has the gradients */
    dt_model *a = build(spec, C, H, W, &on), *b = build(spec, C, H, W, &off);
    if (!a || !b) return dt_model_destroy(a), dt_model_destroy(b);
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
    dt_model_destroy(a), dt_model_destroy(b);
}

/* One forward and backward of the GPT (ids, B samples) on tables ta and tb: the models (NULL
 * when either cannot be built) and their losses. */
static void gpt_step_pair(const dt_kernel_table *ta, const dt_kernel_table *tb, const int32_t *ids, int B, dt_model **a,
                          dt_model **b, float *la, float *lb) {
    *a = build(GPT_SPEC, 0, 0, 0, ta), *b = build(GPT_SPEC, 0, 0, 0, tb);
    if (!*a || !*b) {
        dt_model_destroy(*a), dt_model_destroy(*b);
        *a = *b = NULL;
        return;
    }
    const int T = (*a)->nodes[(*a)->output].shape[0];
    int32_t *y = malloc(sizeof(int32_t) * (size_t)B * T);
    for (int i = 0; y && i < B * T; i++) y[i] = (int32_t)((i * 7 + 3) % 64);
    const dt_feed f = {.x = ids, .y = y, .n = B};
    CHECK_OK(dt_model_prepare(*a, B, true, 0));
    CHECK_OK(dt_model_prepare(*b, B, true, 0));
    CHECK_OK(dt_model_run(*a, &f, true, 0, la));
    CHECK_OK(dt_model_run(*b, &f, true, 0, lb));
    dt_model_zero_grad(*a), dt_model_zero_grad(*b);
    CHECK_OK(dt_model_backward_loss(*a, 1.0f, NULL, NULL));
    CHECK_OK(dt_model_backward_loss(*b, 1.0f, NULL, NULL));
    free(y);
}

/* The GPT with and without bf16 c_fc and c_attn gradients (both with bf16 values), one step: the
 * loss and every gradient bitwise equal but those linears' biases' (the GEMMs take the same
 * rounded values), and each of those within the rounding of its terms: |db - db32| <= 2^-8 *
 * sum |dout| plus the f32 sums' own rounding (B * T terms, 2^-24 each, bounded by 2^-20 *
 * sum |dout|). */
static void check_grads(const dt_kernel_table *be, const int32_t *ids, int B) {
    dt_kernel_table on = *be, off = *be;
    on.linear_bf16_values = off.linear_bf16_values = yes;
    on.linear_forward_bf16io = NULL; /* not the GELU plan: check_gelu_plan */
    off.linear_backward_bf16_grad = NULL;
    const char *spec = GPT_SPEC;
    dt_model *a, *b;
    float la = 0, lb = 0;
    gpt_step_pair(&on, &off, ids, B, &a, &b, &la, &lb);
    if (!a) return;
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
        const float *g32 = b->nodes[i].grad; /* the f32 gradient the other plan keeps */
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
    CHECK_MSG(other == 0, "gpt: %zu gradients besides the c_fc and c_attn biases differ with bf16 gradients", other);
    printf("%s: bf16 c_fc and c_attn gradients: %d of the %d biases' gradients differ, worst %.3f of the rounding "
           "bound; the other %zu equal bitwise\n",
           spec, diff, nbias, worst, np - (size_t)nbias);
    free(bias);
    dt_model_destroy(a), dt_model_destroy(b);
}

/* The GPT with and without the GELU plan (c_fc's values and the GELU's gradient bf16), one step:
 * the GELU then reads x and dout rounded to bf16 (relative error 2^-9 each), so the loss and
 * every gradient tensor differ by rounding only: measured on an AMX Xeon |dloss| / loss 4e-6
 * and max |dg| / max |g| 1e-2 (ln_2.bias, a sum with cancellation), most tensors 1e-3; the
 * bounds, 2^-10 and 2^-4, leave room for other CPUs' rounding and are far below what a wrong
 * value gives (an unwidened input, a value left out: order 1). */
static void check_gelu_plan(const dt_kernel_table *be, const int32_t *ids, int B) {
    dt_kernel_table on = *be, off = *be;
    on.linear_bf16_values = off.linear_bf16_values = yes;
    off.linear_forward_bf16io = NULL;
    dt_model *a, *b;
    float la = 0, lb = 0;
    gpt_step_pair(&on, &off, ids, B, &a, &b, &la, &lb);
    if (!a) return;
    int planned = 0, keep = 0;
    for (int i = 0; i < a->n; i++) {
        const dt_node *g = &a->nodes[i];
        planned += g->a.kind == DT_LAYER_GELU && g->grad_bf16;
        keep += g->a.kind == DT_LAYER_GELU && g->saved != NULL; /* their derivative (op_activation.c) */
    }
    CHECK_MSG(planned == 2, "gpt: %d GELUs with bf16 values and gradients around them (want 2)", planned);
    CHECK_MSG(keep == (on.gelu_forward_bf16io_grad ? 2 : 0), "gpt: %d GELUs keep their derivative", keep);
    const double dl = fabs((double)la - lb) / fabs((double)lb);
    CHECK_MSG(dl <= 0x1p-10, "gpt with the GELU plan: loss %.9g, without %.9g", la, lb);
    double worst = 0;
    const char *at = "";
    const float *ga = dt_model_grads(a), *gb = dt_model_grads(b);
    for (int t = 0; t < a->ntensors; t++) {
        const dt_param_info *p = &a->tensors[t];
        if (p->is_buffer) continue;
        double d = 0, mx = 0;
        for (size_t i = p->offset; i < p->offset + p->numel; i++) {
            d = fmax(d, fabs((double)ga[i] - gb[i]));
            mx = fmax(mx, fabs((double)gb[i]));
        }
        if (mx > 0 && d / mx > worst) worst = d / mx, at = p->name;
        CHECK_MSG(d <= 0x1p-4 * mx, "gpt with the GELU plan: %s's gradients differ by %.3g of their largest %.3g",
                  p->name, d / mx, mx);
    }
    printf("%s with the GELU plan: loss %.9g vs %.9g (%.2g relative), gradients within %.2g of each tensor's "
           "largest (%s)\n",
           GPT_SPEC, la, lb, dl, worst, at);
    dt_model_destroy(a), dt_model_destroy(b);
}

/* The model of spec with every bf16 plan of table `be` on (linears take bf16 values), on device d
 * (the cpu device, or checked): 3 steps of SGD through the device; *loss gets the last loss, g
 * (host, num_params floats) the last gradients, p the parameters after. NULL-safe: false when it
 * cannot be built. */
static bool device_steps(const dt_kernel_table *be, dt_dev *d, const char *spec, int C, int H, int W, const dt_feed *f,
                         float *loss, float *g, float *p) {
    static dt_kernel_table on;
    on = *be, on.linear_bf16_values = yes;
    dt_model *m = build(spec, C, H, W, &on);
    if (!m) return false;
    m->be_cpu = &on;
    dt_status s = dt_model_set_device(m, d);
    CHECK_OK(s);
    int nbf = 0;
    for (int i = 0; i < m->n; i++) nbf += m->nodes[i].bf16 + m->nodes[i].grad_bf16;
    CHECK_MSG(nbf > 0, "%s: no bf16 values planned", spec);
    const size_t np = dt_model_num_params(m);
    const dt_step_args a = {.lr = 0.05f};
    for (int step = 0; s == DT_OK && step < 3; step++) {
        dt_model_zero_grad(m);
        CHECK_OK(s = dt_model_run(m, f, true, (uint64_t)step, loss));
        if (s == DT_OK) CHECK_OK(s = dt_model_backward_loss(m, 1.0f, NULL, NULL));
        if (s == DT_OK) d->ops->download(d, g, dt_model_grads(m), np * sizeof(float));
        if (s == DT_OK) d->ops->sgd_step(d, &a, dt_model_params(m), dt_model_grads(m), NULL, np);
    }
    d->ops->download(d, p, dt_model_params(m), np * sizeof(float));
    dt_model_destroy(m);
    return s == DT_OK;
}

/* device_steps on the checked device and on the cpu device: the same bytes. */
static void check_device(const dt_kernel_table *be, const char *spec, int C, int H, int W, const void *x, int B) {
    dt_model *probe = NULL;
    CHECK_OK(dt_model_build(&probe, spec, C, H, W));
    if (!probe) return;
    const size_t np = dt_model_num_params(probe);
    const int T = C ? 1 : probe->nodes[probe->output].shape[0], V = dt_model_classes(probe);
    dt_model_destroy(probe);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)B * T);
    float *buf = malloc(4 * np * sizeof(float));
    dt_dev *chk = NULL;
    CHECK_OK(dt_device_create(&chk, "checked:arena=64M"));
    if (y && buf && chk) {
        for (int i = 0; i < B * T; i++) y[i] = (int32_t)((i * 7 + 3) % V);
        const dt_feed f = {.x = x, .y = y, .n = B};
        float la = NAN, lb = NAN;
        bool ok = device_steps(be, dt_device_cpu(), spec, C, H, W, &f, &la, buf, buf + np) &&
                  device_steps(be, chk, spec, C, H, W, &f, &lb, buf + 2 * np, buf + 3 * np);
        CHECK_MSG(ok && !memcmp(&la, &lb, sizeof la) && !memcmp(buf, buf + 2 * np, 2 * np * sizeof(float)),
                  "%s with bf16 values: loss %.9g on cpu, %.9g on checked; gradients %s, parameters %s", spec, la, lb,
                  memcmp(buf, buf + 2 * np, np * sizeof(float)) ? "differ" : "equal",
                  memcmp(buf + np, buf + 3 * np, np * sizeof(float)) ? "differ" : "equal");
        printf("%s with bf16 values: 3 steps on the checked device equal the cpu device's bitwise: %s\n", spec,
               ok && la == lb ? "yes" : "no");
    }
    dt_device_destroy(chk);
    free(y), free(buf);
}

int main(void) {
    const dt_kernel_table *be = NULL;
    if (dt_kernels_select("onednn", "bf16") != DT_OK || dt_backend_find("onednn", DT_BF16, &be) != DT_OK) {
        printf("graph_bf16_test: skipped (built without oneDNN)\n");
        return dt_test_summary("graph_bf16_test");
    }
    printf("linears take bf16 values natively here: %s\n", be->linear_bf16_values() ? "yes" : "no");
    check_plans(be);
    enum { B = 5 };
    int32_t ids[B * 8];
    for (int i = 0; i < B * 8; i++) ids[i] = (int32_t)((i * 13 + 1) % 64);
    check_same(be, GPT_SPEC, 0, 0, 0, ids, B);
    check_grads(be, ids, B);
    check_gelu_plan(be, ids, B);
    check_device(be, GPT_SPEC, 0, 0, 0, ids, B);
    float *x = malloc(sizeof(float) * B * 784);
    if (x) {
        dt_rng_fill_uniform(x, B * 784, 0, 1, 5, 0);
        check_same(be, "mlp", 1, 28, 28, x, B);
        check_same(be, "cnn", 1, 28, 28, x, B);
        check_device(be, "mlp", 1, 28, 28, x, B);
    }
    free(x);
    /* the blas bf16 table has no bf16 linears: nothing is planned */
    CHECK_OK(dt_kernels_select("blas", "bf16"));
    dt_model *m = NULL;
    CHECK_OK(dt_model_build(&m, "gpt:L=1,H=2,C=32,T=8,V=64", 0, 0, 0));
    for (int i = 0; m && i < m->n; i++) CHECK(!m->nodes[i].bf16);
    dt_model_destroy(m);
    CHECK_OK(dt_kernels_select("blas", "fp32"));
    return dt_test_summary("graph_bf16_test");
}
