/* Finite-difference gradient checks of the graph (include/dtrain/nn.h): every new op as a small
 * graph (embedding, position embedding, add, causal attention, matmul_t, reshape, linear over the
 * last dim, cross-entropy with ignored targets, mse), a residual graph (x -> linear -> gelu ->
 * add(x, .)), a weight used twice (embedding tied to the output head: its gradient is the sum of
 * both uses, checked against finite differences and against the untied graph), one node feeding
 * three consumers (gradients accumulate where the branches meet), and a whole small GPT.
 *
 * As gradcheck_test.c: the analytic gradients of one backward must match central differences of
 * the forward on L = sum(dout * out) with a fixed random dout (or L = the loss of a loss graph):
 * |num - ana| <= atol * max(1, max|ana|) + rtol * |ana| for every element, with (eps 0.5, rtol
 * 1e-4, atol 1e-5) where L is linear in the perturbed value and (eps 1e-2, rtol 2e-3, atol 5e-4)
 * where it is not. Differences are taken on the float32 values actually perturbed. */
#include "core/test.h"
#include "dtrain/core.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "nn/graph_testlib.h"

#include <stdint.h>
#include <string.h>

/* ---- generic machinery -------------------------------------------------------------------- */

typedef struct {
    dt_model *m;
    dt_feed f;
    const float *dout; /* (B, out_size), or NULL: L = the loss */
} gg;

#define LIN 0.5f, 1e-4, 1e-5 /* eps, rtol, atol where L is linear in the value */
#define NONLIN 1e-2f, 2e-3, 5e-4

static uint64_t g_seed = 4321;

static float *rnd(size_t n, float lo, float hi) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    dt_rng_fill_uniform(x, n, lo, hi, g_seed, dt_rng_key(DT_RNG_USER, g_seed));
    g_seed++;
    return x;
}

static int32_t *rnd_ids(size_t n, int lo, int hi) {
    int32_t *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = lo + (int32_t)(dt_rng_u64(g_seed, dt_rng_key(DT_RNG_USER, g_seed), i) % (uint64_t)(hi - lo));
    g_seed++;
    return p;
}

static size_t out_n(const gg *g) { return (size_t)g->f.n * dt_model_out_size(g->m); }

static double gg_loss(gg *g) {
    float loss = NAN;
    dt_status s = dt_model_run(g->m, &g->f, true, 0, g->dout ? NULL : &loss);
    if (s != DT_OK) return NAN;
    if (!g->dout) return loss;
    const float *y = dt_model_output(g->m);
    double acc = 0;
    for (size_t i = 0, n = out_n(g); i < n; i++) acc += (double)g->dout[i] * y[i];
    return acc;
}

/* One forward + backward from a zeroed gradient slab; returns 0 or -1 (a failed check). */
static int gg_backward(gg *g) {
    dt_status s = dt_model_run(g->m, &g->f, true, 0, NULL);
    CHECK_MSG(s == DT_OK, "forward: %s", dt_last_error());
    if (s != DT_OK) return -1;
    dt_model_zero_grad(g->m);
    s = g->dout ? dt_model_backward(g->m, g->dout, NULL, NULL) : dt_model_backward_loss(g->m, 1.0f, NULL, NULL);
    CHECK_MSG(s == DT_OK, "backward: %s", dt_last_error());
    return s == DT_OK ? 0 : -1;
}

/* Compares the analytic gradient ana of x (n values, perturbed in place) with central
 * differences. ana must not point into the model (a forward may overwrite it): pass a copy. */
static void gg_check(const char *what, gg *g, float *x, const float *ana, size_t n, float eps, double rtol,
                     double atol) {
    if (!x || !ana) {
        CHECK_MSG(0, "%s: nothing to check", what);
        return;
    }
    double scale = 1, worst = 0, worst_err = 0;
    for (size_t j = 0; j < n; j++) scale = fmax(scale, fabs(ana[j]));
    for (size_t j = 0; j < n; j++) {
        float save = x[j];
        x[j] = save + eps;
        double hp = x[j], lp = gg_loss(g);
        x[j] = save - eps;
        double hm = x[j], lm = gg_loss(g);
        x[j] = save;
        double num = (lp - lm) / (hp - hm), err = fabs(num - ana[j]);
        double ratio = err / (atol * scale + rtol * fabs(ana[j]));
        if (ratio > worst || ratio != ratio) worst = ratio != ratio ? INFINITY : ratio, worst_err = err;
    }
    printf("  %-40s n=%-4zu max err %.2e (%.2f of tolerance)\n", what, n, worst_err, worst);
    CHECK_MSG(worst <= 1.0, "%s: gradient mismatch, max err %g is %.2f x tolerance", what, worst_err, worst);
}

/* Copies of a tensor's gradient and an input node's gradient after gg_backward. */
static float *grad_of(dt_model *m, const char *name) {
    int i = gt_tensor(m, name, 0);
    return i < 0 ? NULL : gt_copy(dt_model_grads(m) + dt_model_tensor(m, i)->offset, dt_model_tensor(m, i)->numel);
}
static size_t numel_of(dt_model *m, const char *name) {
    int i = gt_tensor(m, name, 0);
    return i < 0 ? 0 : dt_model_tensor(m, i)->numel;
}

static void fill_param(dt_model *m, const char *name, float lo, float hi) {
    size_t n = numel_of(m, name);
    float *v = rnd(n, lo, hi), *p = gt_param(m, name, n);
    if (p) memcpy(p, v, n * sizeof *p);
    free(v);
}

static bool finish(dt_model *m, int out, int loss, const char *name) {
    dt_status s = dt_graph_finish(m, out, loss, name);
    CHECK_MSG(s == DT_OK, "%s: dt_graph_finish: %s", name, dt_last_error());
    return s == DT_OK;
}

/* Checks one parameter tensor by name. */
static void check_param(const char *what, gg *g, const char *name, float eps, double rtol, double atol) {
    float *ana = grad_of(g->m, name);
    gg_check(what, g, gt_param(g->m, name, 0), ana, numel_of(g->m, name), eps, rtol, atol);
    free(ana);
}

/* ---- single ops ----------------------------------------------------------------------------- */

static void test_embedding(bool pos) {
    const int B = 2, T = 5, num = pos ? 6 : 7, D = 4;
    printf("embedding%s B=%d T=%d num=%d out=%d\n", pos ? " (positions)" : "", B, T, num, D);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_EMBEDDING);
    s.num = num, s.out = D, s.pos = pos;
    int e = gt_node(m, "emb", &s, gt_input(m, "ids", DT_I32, T, 0, 0), -1, -1);
    int32_t *ids = rnd_ids((size_t)B * T, 0, pos ? 1000 : num); /* positions ignore the ids' values */
    if (!pos) ids[3] = ids[7] = ids[9] = ids[0];                /* repeated ids accumulate */
    float *dout = rnd((size_t)B * T * D, -1, 1);
    if (finish(m, e, -1, "embedding")) {
        fill_param(m, "emb.weight", -1, 1);
        gg g = {m, {ids, NULL, B}, dout};
        if (gg_backward(&g) == 0) {
            check_param(pos ? "posembed dweight" : "embedding dweight", &g, "emb.weight", LIN);
            if (pos) { /* rows past T get nothing */
                const float *gw = gt_grad(m, "emb.weight", 0);
                int nz = 0;
                for (int i = T * D; gw && i < num * D; i++) nz += gw[i] != 0;
                CHECK_MSG(nz == 0, "posembed: rows >= T have %d nonzero gradients", nz);
            }
        }
    }
    free(ids), free(dout);
    dt_model_destroy(m);
}

/* The ops below take their f32 inputs from gt_leaf nodes (embeddings of ids 0..B*T-1 whose
 * tables hold the values): the input's gradient is the table's, perturbed as a parameter. */

static void test_add(void) {
    const int B = 2, T = 3, D = 4;
    printf("add B=%d (%d,%d)\n", B, T, D);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_ADD);
    int ids = gt_input(m, "ids", DT_I32, T, 0, 0);
    int add = gt_node(m, "add", &s, gt_leaf(m, ids, "a", B, T, D), gt_leaf(m, ids, "b", B, T, D), -1);
    float *dout = rnd((size_t)B * T * D, -1, 1);
    if (finish(m, add, -1, "add")) {
        fill_param(m, "a.weight", -1, 1);
        fill_param(m, "b.weight", -1, 1);
        gg g = {m, {gt_ids(B * T), NULL, B}, dout};
        if (gg_backward(&g) == 0) {
            check_param("add da", &g, "a.weight", LIN);
            check_param("add db", &g, "b.weight", LIN);
        }
    }
    free(dout);
    dt_model_destroy(m);
}

static void test_attention(int B, int T, int C, int H) {
    printf("attention B=%d T=%d C=%d heads=%d\n", B, T, C, H);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_ATTENTION);
    s.heads = H;
    int att = gt_node(m, "attn", &s, gt_leaf(m, gt_input(m, "ids", DT_I32, T, 0, 0), "qkv", B, T, 3 * C), -1, -1);
    float *dout = rnd((size_t)B * T * C, -1, 1);
    if (finish(m, att, -1, "attention")) {
        fill_param(m, "qkv.weight", -1.5f, 1.5f);
        gg g = {m, {gt_ids(B * T), NULL, B}, dout};
        if (gg_backward(&g) == 0) check_param("attention dqkv", &g, "qkv.weight", NONLIN);
    }
    free(dout);
    dt_model_destroy(m);
}

/* matmul_t (w (O,C)) or linear over the last dim: (T,C) -> (T,O) */
static void test_matmul(dt_layer_kind kind, bool bias) {
    const int B = 2, T = 3, C = 5, O = 4;
    printf("%s over the last dim B=%d (%d,%d) -> (%d,%d) bias=%d\n", dt_layer_name(kind), B, T, C, T, O, bias);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(kind);
    s.out = O, s.flatten = false, s.bias = bias;
    int mm = gt_node(m, "mm", &s, gt_leaf(m, gt_input(m, "ids", DT_I32, T, 0, 0), "x", B, T, C), -1, -1);
    float *dout = rnd((size_t)B * T * O, -1, 1);
    if (finish(m, mm, -1, "matmul")) {
        fill_param(m, "x.weight", -1, 1);
        fill_param(m, "mm.weight", -1, 1);
        if (bias) fill_param(m, "mm.bias", -1, 1);
        gg g = {m, {gt_ids(B * T), NULL, B}, dout};
        char what[64];
        if (gg_backward(&g) == 0) {
            snprintf(what, sizeof what, "%s dx", dt_layer_name(kind)), check_param(what, &g, "x.weight", LIN);
            snprintf(what, sizeof what, "%s dweight", dt_layer_name(kind)), check_param(what, &g, "mm.weight", LIN);
            if (bias)
                snprintf(what, sizeof what, "%s dbias", dt_layer_name(kind)), check_param(what, &g, "mm.bias", LIN);
        }
    }
    free(dout);
    dt_model_destroy(m);
}

static void test_reshape(void) {
    const int B = 2, n = B * 12;
    printf("reshape B=%d (2,6) -> (4,3)\n", B);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_RESHAPE);
    s.ndim = 2, s.shape[0] = 4, s.shape[1] = 3;
    int r = gt_node(m, "view", &s, gt_leaf(m, gt_input(m, "ids", DT_I32, 2, 0, 0), "x", B, 2, 6), -1, -1);
    float *dout = rnd(n, -1, 1);
    if (finish(m, r, -1, "reshape")) {
        fill_param(m, "x.weight", -1, 1);
        gg g = {m, {gt_ids(B * 2), NULL, B}, dout};
        if (gg_backward(&g) == 0) {
            CHECK_MSG(!memcmp(dt_model_output(m), gt_param(m, "x.weight", n), n * sizeof(float)),
                      "reshape must keep the values in order");
            check_param("reshape dx", &g, "x.weight", LIN);
        }
    }
    free(dout);
    dt_model_destroy(m);
}

static void test_xent(int ign) {
    const int B = 2, T = 4, V = 6;
    printf("cross-entropy B=%d T=%d V=%d ignore_index=%d\n", B, T, V, ign);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_XENT);
    s.ignore_index = ign;
    int ids = gt_input(m, "ids", DT_I32, T, 0, 0), tg = gt_input(m, "targets", DT_I32, T, 0, 0);
    int lg = gt_leaf(m, ids, "logits", B, T, V);
    int loss = gt_node(m, "loss", &s, lg, tg, -1);
    int32_t *t = rnd_ids((size_t)B * T, 0, V);
    const int ignored[3] = {1, 4, 7};
    for (int i = 0; i < 3; i++) t[ignored[i]] = ign;
    if (ign >= 0) t[0] = (ign + 1) % V; /* keep at least one of each kind */
    if (finish(m, lg, loss, "xent")) {
        fill_param(m, "logits.weight", -3, 3);
        gg g = {m, {gt_ids(B * T), t, B}, NULL};
        if (gg_backward(&g) == 0) {
            const float *gl = gt_node_grad(m, lg);
            int nz = 0;
            for (int i = 0; gl && i < 3; i++)
                for (int v = 0; v < V; v++) nz += gl[(size_t)ignored[i] * V + v] != 0;
            CHECK_MSG(nz == 0, "xent: ignored targets got %d nonzero logit gradients", nz);
            check_param("xent dlogits", &g, "logits.weight", NONLIN);
        }
    }
    free(t);
    dt_model_destroy(m);
}

static void test_mse(void) {
    const int B = 2, T = 3, D = 4;
    printf("mse B=%d (%d,%d)\n", B, T, D);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec s = dt_layer_default(DT_LAYER_MSE);
    int ids = gt_input(m, "ids", DT_I32, T, 0, 0), tg = gt_input(m, "target", DT_F32, T, D, 0);
    int in = gt_leaf(m, ids, "pred", B, T, D);
    int loss = gt_node(m, "loss", &s, in, tg, -1);
    float *y = rnd((size_t)B * T * D, -2, 2);
    if (finish(m, in, loss, "mse")) {
        fill_param(m, "pred.weight", -2, 2);
        gg g = {m, {gt_ids(B * T), y, B}, NULL};
        if (gg_backward(&g) == 0) check_param("mse dpred", &g, "pred.weight", NONLIN);
    }
    free(y);
    dt_model_destroy(m);
}

/* ---- graphs ------------------------------------------------------------------------------- */

/* x -> linear -> gelu -> add(x, .): x's gradient comes both ways (x is a leaf: its table's
 * gradient is x's). */
static void test_residual(void) {
    const int B = 2, T = 3, C = 6;
    printf("residual: x -> linear -> gelu -> add(x, .), B=%d (%d,%d)\n", B, T, C);
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec lin = dt_layer_default(DT_LAYER_LINEAR), ge = dt_layer_default(DT_LAYER_GELU),
                  ad = dt_layer_default(DT_LAYER_ADD);
    lin.out = C, lin.flatten = false;
    int x = gt_leaf(m, gt_input(m, "ids", DT_I32, T, 0, 0), "x", B, T, C);
    int l = gt_node(m, "fc", &lin, x, -1, -1);
    int gl = gt_node(m, "gelu", &ge, l, -1, -1);
    int r = gt_node(m, "res", &ad, x, gl, -1);
    float *dout = rnd((size_t)B * T * C, -1, 1);
    if (finish(m, r, -1, "residual")) {
        fill_param(m, "x.weight", -1.5f, 1.5f);
        fill_param(m, "fc.weight", -0.8f, 0.8f);
        fill_param(m, "fc.bias", -0.5f, 0.5f);
        gg g = {m, {gt_ids(B * T), NULL, B}, dout};
        if (gg_backward(&g) == 0) {
            check_param("residual dx (both paths)", &g, "x.weight", NONLIN);
            check_param("residual dweight", &g, "fc.weight", NONLIN);
            check_param("residual dbias", &g, "fc.bias", NONLIN);
        }
    }
    free(dout);
    dt_model_destroy(m);
}

/* ids -> embedding "wte" -> layernorm -> matmul_t head -> xent; tied: the head uses wte.weight. */
static dt_model *tied_graph(bool tied, int T, int V, int C) {
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    if (!m) return NULL;
    dt_layer_spec e = dt_layer_default(DT_LAYER_EMBEDDING), ln = dt_layer_default(DT_LAYER_LAYERNORM),
                  h = dt_layer_default(DT_LAYER_MATMUL_T), x = dt_layer_default(DT_LAYER_XENT);
    e.num = V, e.out = C;
    h.out = V;
    if (tied) h.tie = "wte.weight";
    int ids = gt_input(m, "ids", DT_I32, T, 0, 0), tg = gt_input(m, "targets", DT_I32, T, 0, 0);
    int emb = gt_node(m, "wte", &e, ids, -1, -1);
    int norm = gt_node(m, "ln", &ln, emb, -1, -1);
    int head = gt_node(m, "head", &h, norm, -1, -1);
    int loss = gt_node(m, "loss", &x, head, tg, -1);
    if (!finish(m, head, loss, tied ? "tied" : "untied")) {
        dt_model_destroy(m);
        return NULL;
    }
    return m;
}

static void test_tied(void) {
    const int B = 2, T = 4, V = 7, C = 5;
    printf("tied weight: embedding wte (%d,%d) is also the output head, B=%d T=%d\n", V, C, B, T);
    dt_model *m = tied_graph(true, T, V, C), *u = tied_graph(false, T, V, C);
    int32_t *ids = rnd_ids((size_t)B * T, 0, V), *tg = rnd_ids((size_t)B * T, 0, V);
    if (m && u) {
        CHECK_MSG(dt_model_num_params(m) == (size_t)V * C + 2 * C, "tied: %zu params, want one (V,C) table + ln",
                  dt_model_num_params(m));
        CHECK_MSG(dt_model_find_tensor(m, "head.weight") < 0, "tied: the head must not own a weight");
        fill_param(m, "wte.weight", -1, 1);
        fill_param(m, "ln.weight", 0.5f, 1.5f);
        fill_param(m, "ln.bias", -0.3f, 0.3f);
        size_t nw = (size_t)V * C;
        gt_load(u, "wte.weight", gt_param(m, "wte.weight", nw), nw);
        gt_load(u, "head.weight", gt_param(m, "wte.weight", nw), nw);
        gt_load(u, "ln.weight", gt_param(m, "ln.weight", C), C);
        gt_load(u, "ln.bias", gt_param(m, "ln.bias", C), C);
        gg g = {m, {ids, tg, B}, NULL}, gu = {u, {ids, tg, B}, NULL};
        if (gg_backward(&g) == 0 && gg_backward(&gu) == 0) {
            float *sum = grad_of(u, "wte.weight"), *gh = gt_grad(u, "head.weight", nw),
                  *gt = gt_grad(m, "wte.weight", nw);
            for (size_t i = 0; sum && gh && i < nw; i++) sum[i] += gh[i];
            double la = gg_loss(&g), lb = gg_loss(&gu);
            CHECK_MSG(la == lb, "tied and untied losses differ: %.9g vs %.9g", la, lb);
            gt_cmp("tied grad = embedding + head grads (untied)", gt, sum, nw, 1e-6);
            /* the tied tensor is final only after its first user in node order (the embedding) */
            gt_ready r;
            gt_ready_init(&r, m);
            CHECK_OK(dt_model_run(m, &g.f, true, 0, NULL));
            dt_model_zero_grad(m);
            CHECK_OK(dt_model_backward_loss(m, 1.0f, gt_ready_hook, &r));
            gt_ready_check("tied grad-ready hook", &r);
            double d = gh && gt ? dt_test_maxdiff(gt, gh, nw) : 0;
            CHECK_MSG(d > 1e-3, "tied grad equals the head's use alone (max diff %g): the embedding's use is lost", d);
            free(sum);
            check_param("tied dwte (finite differences)", &g, "wte.weight", NONLIN);
            check_param("tied dln.weight", &g, "ln.weight", NONLIN);
        }
    }
    free(ids), free(tg);
    dt_model_destroy(m), dt_model_destroy(u);
}

/* One node feeding three consumers: h = embedding(ids); a = linear(h), b = gelu(h),
 * c = matmul_t(h); out = (a + b) + c. h's gradient is the sum of three; it reaches the table. */
static void test_fanout(void) {
    const int B = 2, T = 3, V = 5, C = 4;
    printf("fan-out: h = embedding(ids) feeds linear, gelu and matmul_t; out = (a + b) + c\n");
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    dt_layer_spec e = dt_layer_default(DT_LAYER_EMBEDDING), lin = dt_layer_default(DT_LAYER_LINEAR),
                  ge = dt_layer_default(DT_LAYER_GELU), mt = dt_layer_default(DT_LAYER_MATMUL_T),
                  ad = dt_layer_default(DT_LAYER_ADD);
    e.num = V, e.out = C;
    lin.out = C, lin.flatten = false;
    mt.out = C;
    int ids = gt_input(m, "ids", DT_I32, T, 0, 0);
    int h = gt_node(m, "h", &e, ids, -1, -1);
    int a = gt_node(m, "a", &lin, h, -1, -1), b = gt_node(m, "b", &ge, h, -1, -1), c = gt_node(m, "c", &mt, h, -1, -1);
    int s1 = gt_node(m, "s1", &ad, a, b, -1);
    int s2 = gt_node(m, "s2", &ad, s1, c, -1);
    int32_t *iv = rnd_ids((size_t)B * T, 0, V);
    iv[4] = iv[0];
    float *dout = rnd((size_t)B * T * C, -1, 1);
    if (finish(m, s2, -1, "fanout")) {
        fill_param(m, "h.weight", -1.5f, 1.5f);
        fill_param(m, "a.weight", -1, 1);
        fill_param(m, "a.bias", -1, 1);
        fill_param(m, "c.weight", -1, 1);
        gg g = {m, {iv, NULL, B}, dout};
        if (gg_backward(&g) == 0) {
            check_param("fan-out dh.weight (three paths)", &g, "h.weight", NONLIN);
            check_param("fan-out da.weight", &g, "a.weight", LIN);
            check_param("fan-out dc.weight", &g, "c.weight", LIN);
            /* parameter gradients accumulate over micro-batches (no zero_grad in between) */
            float *g1 = gt_copy(dt_model_grads(m), dt_model_num_params(m));
            CHECK_OK(dt_model_run(m, &g.f, true, 0, NULL));
            CHECK_OK(dt_model_backward(m, dout, NULL, NULL));
            int bad = 0;
            for (size_t i = 0; i < dt_model_num_params(m); i++)
                bad += fabsf(dt_model_grads(m)[i] - 2 * g1[i]) > 1e-5f * fabsf(g1[i]) + 1e-6f;
            CHECK_MSG(bad == 0, "fan-out: a second backward must add the same gradient again (%d values differ)", bad);
            free(g1);
        }
    }
    free(iv), free(dout);
    dt_model_destroy(m);
}

/* A whole small GPT (every op, tied head, residuals, position embedding) against finite
 * differences of its loss, every parameter, at weights of order one. */
static void test_gpt(void) {
    dt_gpt_config cfg = {.L = 1, .H = 2, .C = 8, .T = 4, .V = 11};
    const int B = 2;
    printf("gpt L=%d H=%d C=%d T=%d V=%d, B=%d: every parameter\n", cfg.L, cfg.H, cfg.C, cfg.T, cfg.V, B);
    dt_model *m = NULL;
    CHECK_OK(dt_gpt_create(&m, &cfg));
    if (!m) return;
    float *p = dt_model_params(m);
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        bool ln = strstr(t->name, "ln_") != NULL, w = strstr(t->name, ".weight") != NULL;
        float *v = rnd(t->numel, ln && w ? 0.7f : -0.5f, ln && w ? 1.3f : 0.5f);
        if (!t->is_buffer) memcpy(p + t->offset, v, t->numel * sizeof *v);
        free(v);
    }
    int32_t *ids = rnd_ids((size_t)B * cfg.T, 0, cfg.V), *tg = rnd_ids((size_t)B * cfg.T, 0, cfg.V);
    gg g = {m, {ids, tg, B}, NULL};
    if (gg_backward(&g) == 0)
        for (int i = 0; i < dt_model_num_tensors(m); i++) {
            const dt_param_info *t = dt_model_tensor(m, i);
            if (t->is_buffer) continue;
            char what[96];
            snprintf(what, sizeof what, "gpt %s", t->name);
            check_param(what, &g, t->name, NONLIN);
        }
    free(ids), free(tg);
    dt_model_destroy(m);
}

int main(void) {
    dt_set_threads(1);
    test_embedding(false);
    test_embedding(true);
    test_add();
    test_attention(2, 5, 8, 2);
    test_attention(1, 6, 6, 3);
    test_matmul(DT_LAYER_MATMUL_T, false);
    test_matmul(DT_LAYER_LINEAR, true);
    test_matmul(DT_LAYER_LINEAR, false);
    test_reshape();
    test_xent(-100);
    test_xent(2);
    test_mse();
    test_residual();
    test_tied();
    test_fanout();
    test_gpt();
    return dt_test_summary("graph_gradcheck_test");
}
