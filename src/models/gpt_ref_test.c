/* Reference test of the GPT against PyTorch 1.13 (tests/ref/gen_gpt_ref.py: nanoGPT's model,
 * torch autograd in float64, stored as float32 in gpt.dtref), with every kernel table and
 * precision: dt_gpt_create's tensors are exactly nanoGPT's names and shapes; logits, loss and
 * every parameter gradient of one backward (and the grad-ready hook of every tensor); token ids
 * and targets out of range refused naming the value; 5 AdamW steps (dt_optim_*): losses and the
 * final parameters. Tolerance: max|diff| <= 1e-5 x max|ref| of each tensor (gt_each_kernels:
 * more at bf16/fp16; parameter gradients: at least 1e-3 of the largest gradient of the model, as
 * ref_test.c). The ops it is built of are nn/graph_ref_test.c. */
#include "core/test.h"
#include "dtrain/core.h"
#include "backend/layers.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "nn/fixture.h"
#include "nn/graph_testlib.h"

#include <stdarg.h>
#include <string.h>

static double g_tol = 1e-5; /* of the kernels under test (gt_each_kernels) */
#define TOL g_tol

static dt_fx g_fx;

DT_FX_DEFINE_ENTRY(g_fx, "gpt_ref_test")

/* ---- the GPT ------------------------------------------------------------------------------ */

/* Every parameter of the model is a gpt.param.<name> of the fixture with the same shape, and
 * the other way round; loads them. Returns 0 when the sets are equal. */
static int gpt_load(dt_model *m) {
    int fx_params = 0, loaded = 0, params = 0;
    size_t total = 0;
    for (int i = 0; i < g_fx.count; i++) fx_params += !strncmp(g_fx.e[i].name, "gpt.param.", 10);
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        if (t->is_buffer) continue;
        params++;
        char name[128];
        snprintf(name, sizeof name, "gpt.param.%s", t->name);
        const dt_fx_entry *e = dt_fx_find(&g_fx, name);
        CHECK_MSG(e != NULL, "gpt: dtrain tensor '%s' is not a parameter of the nanoGPT model", t->name);
        if (!e) continue;
        bool same = (int)e->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == (int64_t)e->dims[d];
        CHECK_MSG(same && e->n == t->numel, "gpt: %s has a different shape from torch's (ndim %d vs %u)", t->name,
                  t->ndim, e->ndim);
        if (!same || e->n != t->numel) continue;
        memcpy(dt_model_params(m) + t->offset, e->data, t->numel * sizeof(float));
        total += t->numel;
        loaded++;
    }
    printf("  loaded %d of the %d nanoGPT parameters (%zu values; the model has %d tensors, %zu params)\n", loaded,
           fx_params, total, params, dt_model_num_params(m));
    CHECK_MSG(loaded == fx_params && params == fx_params,
              "gpt: tensor names differ from nanoGPT's: %d loaded, %d "
              "dtrain parameters, %d in torch's named_parameters()",
              loaded, params, fx_params);
    CHECK_MSG(total == dt_model_num_params(m), "gpt: the tensors cover %zu of %zu params", total,
              dt_model_num_params(m));
    CHECK_MSG(dt_model_find_tensor(m, "lm_head.weight") < 0 ||
                  dt_model_tensor(m, dt_model_find_tensor(m, "lm_head.weight"))->offset ==
                      dt_model_tensor(m, dt_model_find_tensor(m, "transformer.wte.weight"))->offset,
              "gpt: lm_head.weight must be transformer.wte.weight (tied)");
    return loaded == fx_params && params == fx_params && total == dt_model_num_params(m) ? 0 : -1;
}

/* Largest |gradient| over every gpt.grad.* of the fixture. */
static double gpt_grad_scale(void) {
    double s = 0;
    for (int i = 0; i < g_fx.count; i++)
        if (!strncmp(g_fx.e[i].name, "gpt.grad.", 9))
            for (size_t j = 0; j < g_fx.e[i].n; j++) s = fmax(s, fabs(((const float *)g_fx.e[i].data)[j]));
    return s;
}

static void gpt_compare_grads(dt_model *m) {
    double gscale = gpt_grad_scale(), worst = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        if (t->is_buffer) continue;
        char what[96];
        snprintf(what, sizeof what, "gpt grad %s", t->name);
        const dt_fx_entry *e = entry("gpt.grad.%s", t->name);
        if (e->n == t->numel)
            worst = fmax(worst,
                         gt_cmp_floor(what, dt_model_grads(m) + t->offset, e->data, t->numel, TOL, 1e-3 * gscale));
    }
    printf("  worst gradient rel error %.2e\n", worst);
}

/* 5 AdamW steps (one group, weight decay on every parameter): the loss before each step and
 * after the last, and the final parameters. Coordinates whose true gradient is 0 at every step
 * (the key slice of c_attn.bias, listed by the fixture) get float32 noise for a gradient, which
 * Adam turns into steps of up to lr: there only |p - ref| <= 2 * steps * lr is checked. */
static void gpt_adamw(dt_model *m, const dt_feed *f) {
    const float *acfg = FX("gpt.adamw.cfg"), *losses = FX("gpt.adamw.losses");
    const float lr = acfg[0];
    const int steps = (int)acfg[2];
    dt_optim_config cfg = dt_optim_defaults(DT_OPTIM_ADAMW);
    cfg.weight_decay = acfg[1];
    printf("gpt AdamW: lr %g weight_decay %g betas (%g, %g) eps %g, %d steps\n", lr, cfg.weight_decay, cfg.beta1,
           cfg.beta2, cfg.eps, steps);
    CHECK(cfg.beta1 == 0.9f && cfg.beta2 == 0.999f && cfg.eps == 1e-8f);
    dt_optim *o = NULL;
    CHECK_OK(dt_optim_create(&o, &cfg, dt_model_num_params(m)));
    if (!o) return;
    float got[16];
    for (int s = 0; s <= steps && s < 16; s++) {
        CHECK_OK(dt_model_run(m, f, true, (uint64_t)s, &got[s]));
        if (s == steps) break;
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward_loss(m, 1.0f, NULL, NULL));
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), lr);
    }
    gt_cmp("gpt AdamW losses (before each step, after the last)", got, losses, (size_t)steps + 1, TOL);
    double worst = 0;
    int loose = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        if (t->is_buffer) continue;
        const dt_fx_entry *e = entry("gpt.final.%s", t->name);
        if (e->n != t->numel) continue;
        float *p = gt_copy(dt_model_params(m) + t->offset, t->numel);
        char name[128];
        snprintf(name, sizeof name, "gpt.adamw.zero_grad.%s", t->name);
        const dt_fx_entry *z = dt_fx_find(&g_fx, name);
        for (size_t j = 0; z && j < z->n; j++) {
            size_t k = (size_t)((const int32_t *)z->data)[j];
            float ref = ((const float *)e->data)[k];
            CHECK_MSG(fabsf(p[k] - ref) <= 2.0f * steps * lr,
                      "gpt AdamW: %s[%zu] (zero gradient) moved to %g, torch %g", t->name, k, p[k], ref);
            p[k] = ref, loose++;
        }
        char what[96];
        snprintf(what, sizeof what, "gpt final %s", t->name);
        /* bf16/fp16: Adam turns the rounding noise of any near-zero gradient into steps of up to
         * lr, so there the bound is also 2 * steps * lr absolute */
        double scale = 0, tol = TOL;
        for (size_t j = 0; j < t->numel; j++) scale = fmax(scale, fabs(((const float *)e->data)[j]));
        if (TOL > 1e-5 && scale > 0) tol = fmax(tol, 2.0 * steps * lr / scale);
        worst = fmax(worst, gt_cmp(what, p, e->data, t->numel, tol));
        free(p);
    }
    printf("  worst final-parameter rel error %.2e (%d zero-gradient coordinates bounded only)\n", worst, loose);
    CHECK(dt_optim_steps(o) == steps);
    dt_optim_destroy(o);
}

/* A token id or a target out of [0, V) (other than the ignore index) is DT_EINVAL naming it, not a
 * crash or a NaN loss. */
static void gpt_bad_ids(dt_model *m, const dt_feed *f, int B, int T, int V) {
    const size_t n = (size_t)B * T;
    int32_t *ids = malloc(n * sizeof *ids), *tg = malloc(n * sizeof *tg);
    const int bad[3] = {V, -2, V + 1000}; /* -1 is the GPT's ignore index (nanoGPT's) */
    for (int k = 0; k < 3; k++)
        for (int which = 0; which < 2; which++) {
            memcpy(ids, f->x, n * sizeof *ids), memcpy(tg, f->y, n * sizeof *tg);
            (which ? tg : ids)[n - 2] = bad[k];
            dt_feed g = {ids, tg, B};
            float loss = 0;
            dt_status s = dt_model_run(m, &g, true, 0, &loss);
            char num[16];
            snprintf(num, sizeof num, "%d", bad[k]);
            CHECK_MSG(s == DT_EINVAL && strstr(dt_last_error(), num), "gpt: %s %d: status %d, message '%s', loss %g",
                      which ? "target" : "token id", bad[k], (int)s, dt_last_error(), loss);
        }
    printf("  %-46s DT_EINVAL naming the value (last: '%s')\n", "token ids / targets out of range", dt_last_error());
    free(ids), free(tg);
}

static void ref_gpt(void) {
    const int32_t *c = FXI("gpt.cfg");
    dt_gpt_config cfg = {.L = c[0], .H = c[1], .C = c[2], .T = c[3], .V = c[4]};
    const int B = c[5], T = cfg.T, V = cfg.V;
    char spec[128];
    dt_gpt_format(spec, sizeof spec, &cfg);
    printf("gpt: %s, batch %d\n", spec, B);
    dt_gpt_config parsed;
    CHECK_OK(dt_gpt_parse(spec, &parsed));
    CHECK(!memcmp(&parsed, &cfg, sizeof cfg));
    dt_model *m = NULL;
    CHECK_OK(dt_gpt_create(&m, &cfg));
    if (!m) return;
    CHECK(dt_model_in_dtype(m) == DT_I32 && dt_model_in_size(m) == T);
    CHECK(dt_model_out_size(m) == T * V && dt_model_classes(m) == V);
    if (gpt_load(m) != 0) {
        dt_model_destroy(m);
        return;
    }
    /* one sample first: activations grow for the batch after; samples are independent */
    dt_feed f1 = {FXI("gpt.ids"), FXI("gpt.targets"), 1};
    CHECK_OK(dt_model_run(m, &f1, true, 0, NULL));
    gt_cmp("gpt logits of sample 0 run alone", dt_model_output(m), FX("gpt.logits"), (size_t)T * V, TOL);
    dt_feed f = {FXI("gpt.ids"), FXI("gpt.targets"), B};
    float loss = NAN;
    CHECK_OK(dt_model_run(m, &f, false, 0, &loss));
    gt_cmp("gpt logits (eval)", dt_model_output(m), FX("gpt.logits"), (size_t)B * T * V, TOL);
    gt_cmp("gpt loss (eval)", &loss, FX("gpt.loss"), 1, TOL);
    CHECK_OK(dt_model_run(m, &f, true, 0, &loss));
    gt_cmp("gpt logits", dt_model_output(m), FX("gpt.logits"), (size_t)B * T * V, TOL);
    gt_cmp("gpt loss", &loss, FX("gpt.loss"), 1, TOL);
    dt_model_zero_grad(m);
    gt_ready r;
    gt_ready_init(&r, m);
    CHECK_OK(dt_model_backward_loss(m, 1.0f, gt_ready_hook, &r));
    gt_ready_check("gpt grad-ready hook", &r);
    gpt_compare_grads(m);
    gpt_bad_ids(m, &f, B, T, V);
    gpt_adamw(m, &f);
    dt_model_destroy(m);
}

static void ref_all(double tol) {
    g_tol = tol;
    if (dt_fx_reload(&g_fx, "gpt.dtref") == 0) ref_gpt();
}

int main(void) {
    dt_set_threads(1);
    gt_each_kernels(ref_all);
    dt_fx_free(&g_fx);
    return dt_test_summary("gpt_ref_test");
}
