/* A toy op added from outside the library (issue 38: adding an op is one file plus one registry
 * line): RMSNorm, y = x / sqrt(mean(x^2) + eps) * w over the last dim, with its weight w. The
 * whole op is this file: its shape inference, forward and backward as plain loops on host memory
 * (no kernel table entry), its spec syntax and help line, and its ONNX nodes; main registers it
 * with one line (dt_op_register) and then checks that
 *  - the registry knows it (by name, kind, in the spec usage text) and refuses a second one of the
 *    same name and an entry without a help line;
 *  - its gradients (input and weight, through a linear before it) match central differences;
 *  - a model spec names it ("flatten linear(16) rmsnorm relu linear(4)"), formats it back, and
 *    the library's trainer trains with it (40 steps on a separable 4-class set: the test loss
 *    falls below half of its start) and saves a checkpoint that dt_model_load rebuilds;
 *  - dt_onnx_export writes its nodes (ReduceMean, Sqrt) and its weight.
 * Built by tests/toy/toy_op.mk into build/tests/toy_op. */
#include "core/test.h"
#include "dtrain/dtrain.h"
#include "nn/graph_internal.h"
#include "nn/interchange.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- the op ------------------------------------------------------------------------------- */

static int width(const dt_node *n) { return dt_shape_last(n); }

static dt_status rms_infer(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    if (in->dtype != DT_F32) return dt_graph_fail(m, n, "takes f32 values");
    n->dtype = DT_F32, n->ndim = in->ndim, n->out_n = in->out_n;
    for (int i = 0; i < in->ndim; i++) n->shape[i] = in->shape[i];
    const int64_t shp[1] = {width(n)};
    return dt_graph_declare(m, n, "weight", false, 1, shp) < 0 ? DT_EINVAL : DT_OK;
}

static size_t rms_saved(const dt_model *m, const dt_node *n, int B) { /* 1 / rms of every row */
    (void)m;
    return (size_t)B * (n->out_n / (size_t)width(n)) * sizeof(float);
}

static void rms_init(dt_model *m, dt_node *n, float *p, uint64_t seed) {
    (void)seed;
    float *w = p + dt_node_tensor_off(m, n, 0);
    for (int j = 0; j < width(n); j++) w[j] = 1.0f;
}

static dt_status rms_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    if (!c->dev->host_memory) return dt_error(DT_ENOTSUP, "node '%s': the toy rmsnorm runs on host memory", n->name);
    const int C = width(n), rows = c->B * (int)(n->out_n / (size_t)C);
    const float *x = dt_node_in(m, n, 0), *w = c->params + dt_node_tensor_off(m, n, 0);
    float *rstd = n->saved;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        double ss = 0;
        for (int j = 0; j < C; j++) ss += (double)xr[j] * xr[j];
        rstd[r] = (float)(1.0 / sqrt(ss / C + n->a.eps));
        for (int j = 0; j < C; j++) n->out[(size_t)r * C + j] = xr[j] * rstd[r] * w[j];
    }
    return DT_OK;
}

/* dw_j += sum_r dy_j x_j s; dx_j = s (w_j dy_j - x_j s^2 mean_k(w_k dy_k x_k)), s = 1 / rms. */
static void rms_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    const int C = width(n), rows = c->B * (int)(n->out_n / (size_t)C);
    const float *x = dt_node_in(m, n, 0), *w = c->params + dt_node_tensor_off(m, n, 0), *rstd = n->saved;
    float *dw = c->grads + dt_node_tensor_off(m, n, 0);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C, *dy = n->grad + (size_t)r * C;
        const double s = rstd[r];
        double dot = 0;
        for (int j = 0; j < C; j++) {
            dot += (double)w[j] * dy[j] * xr[j];
            dw[j] += (float)(dy[j] * xr[j] * s);
        }
        for (int j = 0; din[0] && j < C; j++)
            din[0][(size_t)r * C + j] = (float)(s * (w[j] * dy[j] - xr[j] * s * s * dot / C));
    }
}

/* x / sqrt(ReduceMean(x * x) + eps) * w over the last axis (opset 17: axes an attribute). */
static dt_status rms_onnx(dt_onnx *o, const dt_model *m, const dt_node *n, const char *const *in, const char **out) {
    const int64_t axes[1] = {-1};
    const char *x = in[0], *sq = dt_onnx_node2(o, "Mul", x, x);
    dt_onnx_node *mean = dt_onnx_op(o, "ReduceMean", &sq, 1);
    o->attr_ints(o, mean, "axes", axes, 1);
    o->attr_i(o, mean, "keepdims", 1);
    const char *eps = dt_onnx_scalar(o, n->a.eps);
    const char *rms = dt_onnx_node1(o, "Sqrt", dt_onnx_node2(o, "Add", dt_onnx_out(o, mean), eps));
    const char *w = o->param(o, m, n, 0, NULL, 0);
    *out = dt_onnx_node2(o, "Mul", dt_onnx_node2(o, "Div", x, rms), w);
    return DT_OK;
}

static void rms_format(char *buf, size_t cap, const dt_layer_spec *l) { snprintf(buf, cap, "(eps=%g)", l->eps); }

static const dt_op_syntax rms_syntax = {.args = "| eps", .usage = "rmsnorm([eps=])", .format = rms_format};

static const dt_op toy_rmsnorm = {.name = "rmsnorm",
                                  .help = "RMS normalisation over the last dim (a test's toy op)",
                                  .syntax = &rms_syntax,
                                  .min_in = 1,
                                  .max_in = 1,
                                  .infer = rms_infer,
                                  .saved_bytes = rms_saved,
                                  .init = rms_init,
                                  .forward = rms_forward,
                                  .backward = rms_backward,
                                  .onnx = rms_onnx};

/* ---- the checks --------------------------------------------------------------------------- */

static void check_registry(int kind) {
    CHECK_MSG(kind >= DT_LAYER_KIND_COUNT, "dt_op_register gave kind %d: %s", kind, dt_last_error());
    CHECK(dt_layer_find("rmsnorm") == kind && dt_layer_find("nonesuch") == -1);
    CHECK(!strcmp(dt_layer_name((dt_layer_kind)kind), "rmsnorm"));
    CHECK_MSG(strstr(dt_spec_help(), " rmsnorm([eps=])\n") != NULL, "usage text: %s", dt_spec_help());
    CHECK(dt_op_register(&toy_rmsnorm) == -1 && strstr(dt_last_error(), "name is taken"));
    dt_op nohelp = toy_rmsnorm;
    nohelp.name = "rmsnorm2", nohelp.help = NULL;
    CHECK(dt_op_register(&nohelp) == -1 && strstr(dt_last_error(), "no help"));
    dt_layer_spec l[4];
    int n;
    CHECK(dt_spec_parse("rmsnorm(2)", l, 4, &n) == DT_EINVAL &&
          strstr(dt_last_error(), "too many arguments for rmsnorm"));
    CHECK(dt_spec_parse("foo", l, 4, &n) == DT_EINVAL && strstr(dt_last_error(), " sigmoid dropout flatten layernorm "
                                                                                 "batchnorm rmsnorm; aliases "));
}

/* L = sum(dout * y) of model m (output (B, out)) on x. */
static double loss_of(dt_model *m, const float *x, int B, const float *dout) {
    const float *y;
    if (dt_model_forward(m, x, B, true, 0, &y) != DT_OK) return NAN;
    double L = 0;
    for (size_t i = 0; i < (size_t)B * dt_model_out_size(m); i++) L += (double)dout[i] * y[i];
    return L;
}

/* Every parameter's gradient of x(3,5) -> linear(6) -> rmsnorm -> L against central differences. */
static void check_gradients(int kind) {
    enum { B = 2, ROWS = 3, IN = 5, OUT = 6 };
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    const int shape[2] = {ROWS, IN};
    int x = dt_graph_input(m, "x", DT_F32, 2, shape);
    dt_layer_spec lin = dt_layer_default(DT_LAYER_LINEAR), rms = dt_layer_default((dt_layer_kind)kind);
    lin.out = OUT;
    int h = dt_graph_node(m, "lin", &lin, -1, &x, 1), y = dt_graph_node(m, "rms", &rms, -1, &h, 1);
    CHECK_OK(dt_graph_finish(m, y, -1, "toy"));
    dt_model_init(m, 7);
    float xs[B * ROWS * IN], dout[B * ROWS * OUT], *p = dt_model_params(m), *g = dt_model_grads(m);
    dt_rng_fill_uniform(xs, B * ROWS * IN, -1, 1, 1, dt_rng_key(DT_RNG_USER, 1));
    dt_rng_fill_uniform(dout, B * ROWS * OUT, -1, 1, 2, dt_rng_key(DT_RNG_USER, 2));
    float *w = p + dt_model_tensor(m, dt_model_find_tensor(m, "rms.weight"))->offset;
    dt_rng_fill_uniform(w, OUT, 0.5f, 1.5f, 3, dt_rng_key(DT_RNG_USER, 3)); /* not all ones: dw and dx see w */
    dt_model_zero_grad(m);
    (void)loss_of(m, xs, B, dout);
    CHECK_OK(dt_model_backward(m, dout, NULL, NULL));
    const size_t np = dt_model_num_params(m);
    double worst = 0;
    for (size_t i = 0; i < np; i++) {
        const float keep = p[i], eps = 1e-2f;
        p[i] = keep + eps;
        const double up = loss_of(m, xs, B, dout);
        p[i] = keep - eps;
        const double down = loss_of(m, xs, B, dout);
        p[i] = keep;
        const double num = (up - down) / (2.0 * eps), err = fabs(num - g[i]) / (5e-4 + 2e-3 * fabs(g[i]));
        if (err > worst) worst = err;
        CHECK_MSG(err <= 1, "parameter %zu: numeric %.6g analytic %.6g", i, num, (double)g[i]);
    }
    printf("  gradients of %zu parameters (linear's through rmsnorm's dx, rmsnorm's w): worst error %.3f of the "
           "tolerance\n",
           np, worst);
    dt_model_destroy(m);
}

/* 4 classes of 16 features: class c's mean is +3 at features 4c..4c+3, plus uniform noise. */
static dt_dataset *toy_data(size_t n, uint64_t seed) {
    static float x[512 * 16];
    static int32_t y[512];
    dt_rng_fill_uniform(x, n * 16, -1, 1, seed, dt_rng_key(DT_RNG_USER, seed));
    for (size_t i = 0; i < n; i++) {
        y[i] = (int32_t)(i % 4);
        for (int j = 0; j < 4; j++) x[i * 16 + 4 * (size_t)y[i] + j] += 3;
    }
    dt_dataset *ds = NULL;
    CHECK_OK(dt_dataset_create(&ds, DT_F32, x, y, n, 1, 1, 16, 4));
    return ds;
}

/* The trainer on a spec naming the toy op: 40 steps, its loss falls; the checkpoint loads back. */
static void check_training(const char *dir) {
    dt_dataset *tr = toy_data(512, 11), *te = toy_data(256, 12);
    char save[512];
    snprintf(save, sizeof save, "%s/toy.safetensors", dir);
    dt_train_config cfg = dt_train_defaults();
    cfg.model = "flatten linear(16) rmsnorm relu linear(4)";
    cfg.train_set = tr, cfg.test_set = te, cfg.max_steps = 40, cfg.save = save, cfg.lr.base_lr = 1e-2f;
    dt_trainer *t = NULL;
    float before = NAN, after = NAN, acc0, acc = 0;
    CHECK_OK(dt_trainer_create(&t, &cfg));
    if (t) {
        CHECK_OK(dt_trainer_evaluate(t, &before, &acc0));
        CHECK_OK(dt_trainer_run(t));
        CHECK_OK(dt_trainer_evaluate(t, &after, &acc));
        CHECK_MSG(!strcmp(dt_model_spec(dt_trainer_model(t)), "flatten linear(16) rmsnorm(eps=1e-05) relu linear(4)"),
                  "spec %s", dt_model_spec(dt_trainer_model(t)));
    }
    printf("  trained %s: test loss %.4f -> %.4f, accuracy %.3f\n", cfg.model, before, after, acc);
    CHECK_MSG(after < 0.5f * before, "the test loss went from %g to %g in 40 steps", before, after);
    dt_model *m = NULL;
    CHECK_OK(dt_model_load(&m, save));
    CHECK(m && dt_model_find_tensor(m, "2.weight") >= 0); /* the rmsnorm is layer 2 */
    dt_model_destroy(m);
    dt_trainer_destroy(t);
    dt_dataset_destroy(tr), dt_dataset_destroy(te);
}

/* dt_onnx_export asks the op for its nodes: they and its weight are in the file. */
static void check_onnx(const char *dir) {
    dt_model *m = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/toy.onnx", dir);
    CHECK_OK(dt_model_build(&m, "flatten linear(8) rmsnorm linear(4)", 1, 1, 16));
    dt_status s = m ? dt_onnx_export(m, path, NULL, 1, 1, 16) : DT_EINVAL;
    if (s == DT_ENOTSUP) printf("  ONNX: %s (not checked)\n", dt_last_error());
    else {
        CHECK_OK(s);
        static char buf[1 << 16];
        FILE *f = fopen(path, "rb");
        size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        const bool rm = memmem(buf, len, "ReduceMean", 10), sq = memmem(buf, len, "Sqrt", 4),
                   w = memmem(buf, len, "2.weight", 8);
        CHECK_MSG(rm && sq && w, "%s (%zu bytes): ReduceMean %d Sqrt %d 2.weight %d", path, len, rm, sq, w);
        printf("  ONNX: %zu bytes with the op's ReduceMean, Sqrt and 2.weight\n", len);
    }
    dt_model_destroy(m);
}

int main(void) {
    const int kind = dt_op_register(&toy_rmsnorm); /* the one registry line */
    char dir[64];
    if (dt_test_mkdtemp(dir, sizeof dir, "/tmp/toy_op-XXXXXX")) return 1;
    check_registry(kind);
    check_gradients(kind);
    check_training(dir);
    check_onnx(dir);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return dt_test_summary("toy_op");
}
