/* Reference tests of the graph's ops against PyTorch 1.13 (tests/ref/gen_gpt_ref.py, computed by
 * torch autograd in float64, stored as float32), with every kernel table and precision:
 *   - graph_ops.dtref: every new op (embedding, position embedding, add, causal attention,
 *     matmul_t, linear over the last dim, layernorm and gelu on (T,C) samples, reshape,
 *     cross-entropy with ignored targets, mse), each built as a one-node graph with
 *     dt_graph_create/input/node/finish, run with dt_model_run and backpropagated with
 *     dt_model_backward (or dt_model_backward_loss for the losses): forward values, input
 *     gradients and parameter gradients. Graph inputs get no gradient (only nodes with parameters
 *     upstream do), so an op's f32 inputs come from gt_leaf nodes whose tables hold the values;
 *     the input gradient is the leaf's dt_model_node_grad. Plus a causal check of attention.
 * The GPT built of them (gpt.dtref) is models/gpt_ref_test.c.
 * Tolerance: max|diff| <= 1e-5 x max|ref| of each tensor (gt_each_kernels: more at bf16/fp16).
 * Prints every max difference. */
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

/* Tolerance of the kernels under test (gt_each_kernels). */
static double g_tol = 1e-5;
#define TOL g_tol

static dt_fx g_fx;

DT_FX_DEFINE_ENTRY(g_fx, "graph_ref_test")

static void cmpf(const char *fmt_case, const char *what, const float *got, const float *ref, size_t n) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s %s", fmt_case, what);
    gt_cmp(buf, got, ref, n, TOL);
}

static dt_status finish(dt_model *m, int out, int loss, const char *name) {
    dt_status s = dt_graph_finish(m, out, loss, name);
    CHECK_MSG(s == DT_OK, "%s: dt_graph_finish: %s", name, dt_last_error());
    return s;
}

/* Runs the forward on f and compares the output; then backward of dy. */
static int run_and_backward(const char *name, dt_model *m, const dt_feed *f, const float *y, const float *dy) {
    CHECK_OK(dt_model_run(m, f, true, 0, NULL));
    size_t nout = (size_t)f->n * dt_model_out_size(m);
    cmpf(name, "out", dt_model_output(m), y, nout);
    dt_model_zero_grad(m);
    dt_status s = dt_model_backward(m, dy, NULL, NULL);
    CHECK_MSG(s == DT_OK, "%s backward: %s", name, dt_last_error());
    return s == DT_OK ? 0 : -1;
}

/* ---- ops ---------------------------------------------------------------------------------- */

static void ref_embedding(const char *name, bool pos) {
    const int32_t *cfg = FXI("%s.cfg", name);
    int B = cfg[0], T = cfg[1], num = cfg[2], D = cfg[3];
    printf("%s: B=%d T=%d num=%d out=%d\n", name, B, T, num, D);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_EMBEDDING);
    s.num = num, s.out = D, s.pos = pos;
    int ids = gt_input(m, "ids", DT_I32, T, 0, 0);
    int e = gt_node(m, "emb", &s, ids, -1, -1);
    if (finish(m, e, -1, name) == DT_OK && gt_load(m, "emb.weight", FX("%s.w", name), (size_t)num * D) == 0) {
        CHECK(dt_model_in_dtype(m) == DT_I32 && dt_model_in_size(m) == T && dt_model_out_size(m) == T * D);
        CHECK(dt_model_num_params(m) == (size_t)num * D);
        dt_feed f = {FXI("%s.ids", name), NULL, B};
        if (run_and_backward(name, m, &f, FX("%s.y", name), FX("%s.dy", name)) == 0)
            cmpf(name, "dweight", gt_grad(m, "emb.weight", 0), FX("%s.dw", name), (size_t)num * D);
    }
    dt_model_destroy(m);
}

/* The ops below take their f32 inputs from gt_leaf nodes (embeddings of ids 0..B*T-1 whose
 * tables hold the fixture's input values): an input's gradient is the leaf's node gradient. */

static void ref_add(void) {
    const dt_fx_entry *a = entry("add.a");
    int B = (int)a->dims[0], T = (int)a->dims[1], D = (int)a->dims[2];
    size_t n = a->n;
    printf("add: B=%d (%d,%d)\n", B, T, D);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_ADD);
    int ids = gt_input(m, "ids", DT_I32, T, 0, 0);
    int ia = gt_leaf(m, ids, "a", B, T, D), ib = gt_leaf(m, ids, "b", B, T, D);
    int add = gt_node(m, "add", &s, ia, ib, -1);
    if (finish(m, add, -1, "add") == DT_OK && gt_load(m, "a.weight", a->data, n) == 0 &&
        gt_load(m, "b.weight", FX("add.b"), n) == 0) {
        dt_feed f = {gt_ids(B * T), NULL, B};
        if (run_and_backward("add", m, &f, FX("add.y"), FX("add.dy")) == 0) {
            cmpf("add", "da", gt_node_grad(m, ia), FX("add.da"), n);
            cmpf("add", "db", gt_node_grad(m, ib), FX("add.db"), n);
        }
    }
    dt_model_destroy(m);
}

/* The output at position t of a sample depends on that sample's positions <= t only. x is the
 * leaf table holding the (B, T, 3C) input; it is perturbed in place and restored. */
static void causal_check(dt_model *m, float *x, int B, int T, int C) {
    size_t nin = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *y0 = gt_copy(dt_model_output(m), nout), *x0 = gt_copy(x, nin);
    int bad_prefix = 0, unchanged = 0, cross = 0;
    dt_feed f = {gt_ids(B * T), NULL, B};
    for (int s = 1; s < T; s++) {
        /* perturb sample 0's positions >= s (all of q, k and v) */
        memcpy(x, x0, nin * sizeof *x);
        for (int t = s; t < T; t++)
            for (int j = 0; j < 3 * C; j++) x[(size_t)t * 3 * C + j] += 0.5f + 0.01f * j;
        CHECK_OK(dt_model_run(m, &f, true, 0, NULL));
        const float *y = dt_model_output(m);
        bad_prefix += memcmp(y, y0, (size_t)s * C * sizeof *y) != 0;
        unchanged += memcmp(y + (size_t)s * C, y0 + (size_t)s * C, (size_t)(T - s) * C * sizeof *y) == 0;
        if (B > 1) cross += memcmp(y + (size_t)T * C, y0 + (size_t)T * C, (nout - (size_t)T * C) * sizeof *y) != 0;
    }
    memcpy(x, x0, nin * sizeof *x);
    printf("  %-46s %d prefixes changed, %d suffixes unchanged, %d other samples changed (of %d)\n",
           "causal: perturb positions >= s", bad_prefix, unchanged, cross, T - 1);
    CHECK_MSG(bad_prefix == 0, "attention: outputs before s changed when positions >= s did (%d of %d)", bad_prefix,
              T - 1);
    CHECK_MSG(unchanged == 0, "attention: outputs at positions >= s did not change (%d of %d)", unchanged, T - 1);
    CHECK_MSG(cross == 0, "attention: perturbing sample 0 changed another sample (%d of %d)", cross, T - 1);
    free(y0), free(x0);
}

static void ref_attention(const char *name) {
    const int32_t *cfg = FXI("%s.cfg", name);
    int B = cfg[0], T = cfg[1], C = cfg[2], H = cfg[3];
    size_t nin = (size_t)B * T * 3 * C;
    printf("%s: B=%d T=%d C=%d heads=%d\n", name, B, T, C, H);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_ATTENTION);
    s.heads = H;
    int in = gt_leaf(m, gt_input(m, "ids", DT_I32, T, 0, 0), "qkv", B, T, 3 * C);
    int att = gt_node(m, "attn", &s, in, -1, -1);
    if (finish(m, att, -1, name) == DT_OK && gt_load(m, "qkv.weight", FX("%s.x", name), nin) == 0) {
        CHECK(dt_model_num_params(m) == nin && dt_model_out_size(m) == T * C);
        dt_feed f = {gt_ids(B * T), NULL, B};
        if (run_and_backward(name, m, &f, FX("%s.y", name), FX("%s.dy", name)) == 0)
            cmpf(name, "dqkv", gt_node_grad(m, in), FX("%s.dx", name), nin);
        causal_check(m, gt_param(m, "qkv.weight", nin), B, T, C);
    }
    dt_model_destroy(m);
}

/* matmul_t (w (O,C), no bias) or linear over the last dim (flatten=false), (T,C) -> (T,O). */
static void ref_matmul(const char *name, dt_layer_kind kind) {
    const int32_t *cfg = FXI("%s.cfg", name);
    int B = cfg[0], T = cfg[1], C = cfg[2], O = cfg[3];
    bool bias = kind == DT_LAYER_LINEAR && cfg[4];
    size_t nin = (size_t)B * T * C;
    printf("%s: B=%d (%d,%d) -> (%d,%d)%s\n", name, B, T, C, T, O, bias ? " + bias" : "");
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(kind);
    s.out = O, s.flatten = false, s.bias = bias;
    int in = gt_leaf(m, gt_input(m, "ids", DT_I32, T, 0, 0), "x", B, T, C);
    int mm = gt_node(m, "mm", &s, in, -1, -1);
    if (finish(m, mm, -1, name) == DT_OK && gt_load(m, "x.weight", FX("%s.x", name), nin) == 0 &&
        gt_load(m, "mm.weight", FX("%s.w", name), (size_t)O * C) == 0 &&
        (!bias || gt_load(m, "mm.bias", FX("%s.bias", name), O) == 0)) {
        CHECK_MSG(dt_model_num_params(m) == nin + (size_t)O * C + (bias ? O : 0), "%s: %zu params", name,
                  dt_model_num_params(m));
        CHECK_MSG(bias || dt_model_find_tensor(m, "mm.bias") < 0, "%s: a bias tensor without bias", name);
        CHECK(dt_model_out_size(m) == T * O && dt_model_classes(m) == O);
        dt_feed f = {gt_ids(B * T), NULL, B};
        if (run_and_backward(name, m, &f, FX("%s.y", name), FX("%s.dy", name)) == 0) {
            cmpf(name, "dx", gt_node_grad(m, in), FX("%s.dx", name), nin);
            cmpf(name, "dweight", gt_grad(m, "mm.weight", 0), FX("%s.dw", name), (size_t)O * C);
            if (bias) cmpf(name, "dbias", gt_grad(m, "mm.bias", 0), FX("%s.dbias", name), O);
        }
    }
    dt_model_destroy(m);
}

/* layernorm (eps 1e-5) and gelu over the last dim of (T, C) samples */
static void ref_norm_gelu(const char *name, dt_layer_kind kind) {
    const int32_t *cfg = FXI("%s.cfg", name);
    int B = cfg[0], T = cfg[1], C = cfg[2];
    size_t n = (size_t)B * T * C;
    printf("%s: B=%d (%d,%d)\n", name, B, T, C);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(kind);
    int in = gt_leaf(m, gt_input(m, "ids", DT_I32, T, 0, 0), "x", B, T, C);
    int node = gt_node(m, "op", &s, in, -1, -1);
    bool ln = kind == DT_LAYER_LAYERNORM;
    if (finish(m, node, -1, name) == DT_OK && gt_load(m, "x.weight", FX("%s.x", name), n) == 0 &&
        (!ln ||
         (gt_load(m, "op.weight", FX("%s.w", name), C) == 0 && gt_load(m, "op.bias", FX("%s.bias", name), C) == 0))) {
        dt_feed f = {gt_ids(B * T), NULL, B};
        if (run_and_backward(name, m, &f, FX("%s.y", name), FX("%s.dy", name)) == 0) {
            cmpf(name, "dx", gt_node_grad(m, in), FX("%s.dx", name), n);
            if (ln) {
                cmpf(name, "dweight", gt_grad(m, "op.weight", 0), FX("%s.dw", name), C);
                cmpf(name, "dbias", gt_grad(m, "op.bias", 0), FX("%s.dbias", name), C);
            }
        }
    }
    dt_model_destroy(m);
}

static void ref_reshape(void) {
    const int32_t *cfg = FXI("reshape.cfg");
    int B = cfg[0], T = cfg[1], D = cfg[2];
    size_t n = FXN("reshape.x");
    printf("reshape: B=%d (%d,%d) -> (%d,%d)\n", B, T, D, cfg[3], cfg[4]);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_RESHAPE);
    s.ndim = 2, s.shape[0] = cfg[3], s.shape[1] = cfg[4];
    int in = gt_leaf(m, gt_input(m, "ids", DT_I32, T, 0, 0), "x", B, T, D);
    int r = gt_node(m, "view", &s, in, -1, -1);
    if (finish(m, r, -1, "reshape") == DT_OK && gt_load(m, "x.weight", FX("reshape.x"), n) == 0) {
        CHECK(dt_model_out_size(m) == cfg[3] * cfg[4] && dt_model_classes(m) == cfg[4]);
        dt_feed f = {gt_ids(B * T), NULL, B};
        if (run_and_backward("reshape", m, &f, FX("reshape.y"), FX("reshape.dy")) == 0)
            cmpf("reshape", "dx", gt_node_grad(m, in), FX("reshape.dx"), n);
    }
    dt_model_destroy(m);
}

/* Loss graphs: ids and targets are the inputs; the logits / predictions are a leaf, the output
 * node; the loss node is fed the targets as the second input. */
static void ref_xent(const char *name) {
    const int32_t *cfg = FXI("%s.cfg", name);
    int B = cfg[0], T = cfg[1], V = cfg[2], ign = cfg[3], counted = cfg[4];
    size_t n = (size_t)B * T * V;
    printf("%s: B=%d T=%d V=%d ignore_index=%d (%d of %d targets count)\n", name, B, T, V, ign, counted, B * T);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_XENT);
    CHECK_MSG(s.ignore_index == -100, "xent default ignore_index %d, torch's is -100", s.ignore_index);
    s.ignore_index = ign;
    int ids = gt_input(m, "ids", DT_I32, T, 0, 0), tg = gt_input(m, "targets", DT_I32, T, 0, 0);
    int lg = gt_leaf(m, ids, "logits", B, T, V);
    int loss = gt_node(m, "loss", &s, lg, tg, -1);
    if (finish(m, lg, loss, name) == DT_OK && gt_load(m, "logits.weight", FX("%s.logits", name), n) == 0) {
        CHECK(dt_model_loss_node(m) == loss && dt_model_output_node(m) == lg && dt_model_classes(m) == V);
        dt_feed f = {gt_ids(B * T), FXI("%s.targets", name), B};
        float l = NAN;
        CHECK_OK(dt_model_run(m, &f, true, 0, &l));
        cmpf(name, "loss", &l, FX("%s.loss", name), 1);
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward_loss(m, 1.0f, NULL, NULL));
        cmpf(name, "dlogits", gt_node_grad(m, lg), FX("%s.dlogits", name), n);
        /* d loss = scale multiplies the gradient */
        CHECK_OK(dt_model_run(m, &f, true, 0, &l));
        CHECK_OK(dt_model_backward_loss(m, 4.0f, NULL, NULL));
        float *want = gt_copy(FX("%s.dlogits", name), n);
        for (size_t i = 0; i < n; i++) want[i] *= 4;
        cmpf(name, "dlogits (scale 4)", gt_node_grad(m, lg), want, n);
        free(want);
    }
    dt_model_destroy(m);
}

static void ref_mse(void) {
    const dt_fx_entry *p = entry("mse.pred");
    int B = (int)p->dims[0], T = (int)p->dims[1], D = (int)p->dims[2];
    printf("mse: B=%d (%d,%d)\n", B, T, D);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_MSE);
    int ids = gt_input(m, "ids", DT_I32, T, 0, 0), tg = gt_input(m, "target", DT_F32, T, D, 0);
    int in = gt_leaf(m, ids, "pred", B, T, D);
    int loss = gt_node(m, "loss", &s, in, tg, -1);
    if (finish(m, in, loss, "mse") == DT_OK && gt_load(m, "pred.weight", p->data, p->n) == 0) {
        dt_feed f = {gt_ids(B * T), FX("mse.target"), B};
        float l = NAN;
        CHECK_OK(dt_model_run(m, &f, true, 0, &l));
        cmpf("mse", "loss", &l, FX("mse.loss"), 1);
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_backward_loss(m, 1.0f, NULL, NULL));
        cmpf("mse", "dpred", gt_node_grad(m, in), FX("mse.dpred"), p->n);
    }
    dt_model_destroy(m);
}

static int load(const char *file) { return dt_fx_reload(&g_fx, file); }

static void ref_all(double tol) {
    g_tol = tol;
    if (load("graph_ops.dtref") == 0) {
        ref_embedding("embedding", false);
        ref_embedding("posembed", true);
        ref_add();
        ref_attention("attention");
        ref_attention("attention_h3");
        ref_attention("attention_h1");
        ref_matmul("matmul_t", DT_LAYER_MATMUL_T);
        ref_matmul("linear3d", DT_LAYER_LINEAR);
        ref_matmul("linear3d_nobias", DT_LAYER_LINEAR);
        ref_norm_gelu("layernorm3d", DT_LAYER_LAYERNORM);
        ref_norm_gelu("gelu3d", DT_LAYER_GELU);
        ref_reshape();
        ref_xent("xent");
        ref_xent("xent_ign3");
        ref_mse();
    }
}

int main(void) {
    dt_set_threads(1);
    gt_each_kernels(ref_all);
    dt_fx_free(&g_fx);
    return dt_test_summary("graph_ref_test");
}
