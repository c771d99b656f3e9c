/* Cross-module test: a reference comparison with PyTorch 1.13: runs every layer kernel, three models (the "mlp" and
 * "cnn" presets and a mixed stack, through dt_model_*) and the optimizers on the inputs stored in
 * tests/ref/{layers,models,optim}.dtref (written by tests/ref/gen_ref.py, computed by torch autograd in float64) and
 * compares outputs and gradients. Prints the max difference of every case. */
#include "core/test.h"
#include "dtrain/core.h"
#include "backend/layers.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "nn/fixture.h"
#include "backend/backend.h"

#include <stdarg.h>
#include <string.h>
#include <unistd.h>

static dt_fx g_fx;

DT_FX_DEFINE_ENTRY(g_fx, "ref_test")

/* Max |got - ref| relative to max(max|ref|, floor) (1 if both are 0); must be <= tol. The floor
 * is for tensors whose true value is ~0 (e.g. the bias gradient of a conv before batchnorm). */
static void cmp_floor(const char *what, const float *got, const float *ref, size_t n, double tol, double floor) {
    double scale = floor, diff = dt_test_maxdiff(got, ref, n);
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    if (scale == 0) scale = 1;
    printf("  %-40s n=%-6zu max|diff| %.3e  rel %.2e\n", what, n, diff, diff / scale);
    CHECK_MSG(diff / scale <= tol, "%s: max diff %g (scale %g) exceeds rel tolerance %g", what, diff, scale, tol);
}

static void cmp(const char *what, const float *got, const float *ref, size_t n, double tol) {
    cmp_floor(what, got, ref, n, tol, 0);
}

static void cmp1(const char *what, float got, float ref, double tol) { cmp(what, &got, &ref, 1, tol); }

static float *copy(const float *src, size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    memcpy(p, src, n * sizeof *p);
    return p;
}

static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* The backend under test and its tolerance (relative to max|ref| of each tensor). fp32: 1e-5.
 * bf16/fp16: the GEMM inputs are rounded to 8 / 11 significant bits (unit roundoff u = 2^-9 /
 * 2^-12) and products are summed in f32, so an output carries about u times the size of its
 * terms; through a model's 2-4 GEMMs (forward and backward) that grows a few-fold. The bound is
 * 16u: 3e-2 for bf16 and 4e-3 for fp16 (measured worst cases are printed per case). A model's
 * parameter gradients are then measured against its largest gradient (f32: at least 1e-3 of it):
 * batchnorm's backward subtracts means, and that cancellation magnifies the rounding in the early
 * layers' gradients relative to their own size (cnn, bf16: 0.1 of conv 3's own largest value). */
static const dt_kernel_table *g_be;
static double g_tol = 1e-5;
#define TOL g_tol

/* ---- layers ------------------------------------------------------------------------------- */

static void ref_linear(void) {
    const dt_fx_entry *x = entry("linear.x"), *w = entry("linear.w");
    if (!x || !w) return;
    int B = (int)x->dims[0], C = (int)x->dims[1], OC = (int)w->dims[0];
    float *y = zeros((size_t)B * OC), *dx = zeros((size_t)B * C), *dw = zeros((size_t)OC * C), *db = zeros(OC);
    printf("linear %dx%d -> %d\n", B, C, OC);
    float *lw = malloc(dt_linear_workspace_of(g_be, B, C, OC) * sizeof(float) + 4);
    g_be->linear_forward(y, x->data, w->data, FX("linear.b"), lw, B, C, OC);
    g_be->linear_backward(dx, dw, db, FX("linear.dy"), x->data, w->data, lw, B, C, OC);
    free(lw);
    cmp("linear out", y, FX("linear.y"), (size_t)B * OC, TOL);
    cmp("linear din", dx, FX("linear.dx"), (size_t)B * C, TOL);
    cmp("linear dw", dw, FX("linear.dw"), (size_t)OC * C, TOL);
    cmp("linear db", db, FX("linear.db"), OC, TOL);
    free(y), free(dx), free(dw), free(db);
}

static void ref_conv(const char *name) {
    const int32_t *d = FXI("%s.dims", name);
    int B = d[0], C = d[1], H = d[2], W = d[3], OC = d[4], K = d[5], S = d[6], P = d[7];
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    size_t nin = (size_t)B * C * H * W, nout = (size_t)B * OC * OH * OW, nw = (size_t)OC * C * K * K;
    size_t ws = g_be->conv2d_workspace(B, C, H, W, OC, K, S, P);
    float *work = ws ? malloc(ws * sizeof(float)) : NULL;
    float *y = zeros(nout), *dx = zeros(nin), *dw = zeros(nw), *db = zeros(OC);
    printf("%s: B=%d C=%d %dx%d -> OC=%d K=%d stride=%d pad=%d\n", name, B, C, H, W, OC, K, S, P);
    const float *x = FX("%s.x", name), *w = FX("%s.w", name);
    g_be->conv2d_forward(y, x, w, FX("%s.b", name), work, B, C, H, W, OC, K, S, P);
    g_be->conv2d_backward(dx, dw, db, FX("%s.dy", name), x, w, work, B, C, H, W, OC, K, S, P);
    char what[64];
    snprintf(what, sizeof what, "%s out", name), cmp(what, y, FX("%s.y", name), nout, TOL);
    snprintf(what, sizeof what, "%s din", name), cmp(what, dx, FX("%s.dx", name), nin, TOL);
    snprintf(what, sizeof what, "%s dw", name), cmp(what, dw, FX("%s.dw", name), nw, TOL);
    snprintf(what, sizeof what, "%s db", name), cmp(what, db, FX("%s.db", name), OC, TOL);
    free(work), free(y), free(dx), free(dw), free(db);
}

static void ref_pool(const char *name, int is_max) {
    const int32_t *d = FXI("%s.dims", name);
    int B = d[0], C = d[1], H = d[2], W = d[3], K = d[4], S = d[5];
    int OH = (H - K) / S + 1, OW = (W - K) / S + 1;
    size_t nin = (size_t)B * C * H * W, nout = (size_t)B * C * OH * OW;
    float *y = zeros(nout), *dx = zeros(nin);
    int32_t *am = calloc(nout, sizeof *am);
    printf("%s: B=%d C=%d %dx%d K=%d S=%d\n", name, B, C, H, W, K, S);
    const float *x = FX("%s.x", name), *dy = FX("%s.dy", name);
    if (is_max) {
        g_be->maxpool2d_forward(y, am, x, B, C, H, W, K, S);
        g_be->maxpool2d_backward(dx, dy, am, B, C, H, W, K, S);
        /* torch's indices are per (H,W) plane; ours are flat over the whole input */
        const int32_t *idx = FXI("%s.idx", name);
        size_t bad = 0;
        for (size_t i = 0; i < nout; i++) bad += am[i] != (int32_t)((i / ((size_t)OH * OW)) * H * W) + idx[i];
        printf("  %-40s %zu of %zu differ\n", "maxpool argmax vs torch indices", bad, nout);
        CHECK_MSG(bad == 0, "%s: %zu argmax indices differ from torch's", name, bad);
    } else {
        g_be->avgpool2d_forward(y, x, B, C, H, W, K, S);
        g_be->avgpool2d_backward(dx, dy, B, C, H, W, K, S);
    }
    char what[64];
    snprintf(what, sizeof what, "%s out", name), cmp(what, y, FX("%s.y", name), nout, TOL);
    snprintf(what, sizeof what, "%s din", name), cmp(what, dx, FX("%s.dx", name), nin, TOL);
    free(y), free(dx), free(am);
}

static void ref_activation(const char *name) {
    const dt_fx_entry *xe = entry("%s.x", name);
    if (!xe) return;
    size_t n = xe->n;
    const float *x = xe->data, *dy = FX("%s.dy", name);
    float *y = zeros(n), *dx = zeros(n);
    printf("%s n=%zu\n", name, n);
    if (!strcmp(name, "relu")) g_be->relu_forward(y, x, n), g_be->relu_backward(dx, dy, x, n);
    if (!strcmp(name, "gelu")) g_be->gelu_forward(y, x, n), g_be->gelu_backward(dx, dy, x, n);
    if (!strcmp(name, "tanh")) g_be->tanh_forward(y, x, n), g_be->tanh_backward(dx, dy, y, n);
    if (!strcmp(name, "sigmoid")) g_be->sigmoid_forward(y, x, n), g_be->sigmoid_backward(dx, dy, y, n);
    char what[64];
    snprintf(what, sizeof what, "%s out", name), cmp(what, y, FX("%s.y", name), n, TOL);
    snprintf(what, sizeof what, "%s din", name), cmp(what, dx, FX("%s.dx", name), n, TOL);
    free(y), free(dx);
}

static void ref_layernorm(void) {
    const dt_fx_entry *xe = entry("layernorm.x");
    if (!xe) return;
    int N = (int)xe->dims[0], C = (int)xe->dims[1];
    size_t n = (size_t)N * C;
    float *y = zeros(n), *dx = zeros(n), *dw = zeros(C), *db = zeros(C), *mean = zeros(N), *rstd = zeros(N);
    const float *x = xe->data, *w = FX("layernorm.w");
    printf("layernorm %dx%d\n", N, C);
    g_be->layernorm_forward(y, mean, rstd, x, w, FX("layernorm.b"), N, C, 1e-5f);
    g_be->layernorm_backward(dx, dw, db, FX("layernorm.dy"), x, w, mean, rstd, N, C);
    cmp("layernorm out", y, FX("layernorm.y"), n, TOL);
    cmp("layernorm din", dx, FX("layernorm.dx"), n, TOL);
    cmp("layernorm dw", dw, FX("layernorm.dw"), C, TOL);
    cmp("layernorm db", db, FX("layernorm.db"), C, TOL);
    free(y), free(dx), free(dw), free(db), free(mean), free(rstd);
}

static void ref_batchnorm(void) {
    const int32_t *d = FXI("batchnorm.dims");
    int B = d[0], C = d[1], HW = d[2];
    size_t n = (size_t)B * C * HW;
    float *y = zeros(n), *dx = zeros(n), *dw = zeros(C), *db = zeros(C), *mean = zeros(C), *rstd = zeros(C);
    float *rm = copy(FX("batchnorm.rm0"), C), *rv = copy(FX("batchnorm.rv0"), C);
    const float *x = FX("batchnorm.x"), *w = FX("batchnorm.w"), *b = FX("batchnorm.b");
    printf("batchnorm2d B=%d C=%d HW=%d (train, then eval)\n", B, C, HW);
    g_be->batchnorm2d_forward_train(y, mean, rstd, rm, rv, x, w, b, B, C, HW, 0.1f, 1e-5f);
    g_be->batchnorm2d_backward(dx, dw, db, FX("batchnorm.dy"), x, w, mean, rstd, B, C, HW);
    cmp("batchnorm out", y, FX("batchnorm.y"), n, TOL);
    cmp("batchnorm din", dx, FX("batchnorm.dx"), n, TOL);
    cmp("batchnorm dw", dw, FX("batchnorm.dw"), C, TOL);
    cmp("batchnorm db", db, FX("batchnorm.db"), C, TOL);
    cmp("batchnorm running_mean", rm, FX("batchnorm.rm"), C, TOL);
    cmp("batchnorm running_var", rv, FX("batchnorm.rv"), C, TOL);
    g_be->batchnorm2d_forward_eval(y, x, w, b, rm, rv, B, C, HW, 1e-5f);
    cmp("batchnorm eval out", y, FX("batchnorm.y_eval"), n, TOL);
    free(y), free(dx), free(dw), free(db), free(mean), free(rstd), free(rm), free(rv);
}

static void ref_losses(void) {
    const dt_fx_entry *le = entry("xent.logits");
    if (!le) return;
    int B = (int)le->dims[0], V = (int)le->dims[1];
    float *probs = zeros((size_t)B * V), *dl = zeros((size_t)B * V);
    printf("softmax cross-entropy %dx%d\n", B, V);
    float loss = dt_softmax_xent_forward(probs, le->data, FXI("xent.labels"), B, V);
    dt_softmax_xent_backward(dl, probs, FXI("xent.labels"), B, V, 1.0f);
    cmp1("xent loss", loss, FX("xent.loss")[0], TOL);
    cmp("xent probs", probs, FX("xent.probs"), (size_t)B * V, TOL);
    cmp("xent dlogits", dl, FX("xent.dlogits"), (size_t)B * V, TOL);
    free(probs), free(dl);

    size_t n = FXN("mse.pred");
    float *dp = zeros(n);
    printf("mse n=%zu\n", n);
    float mse;
    g_be->mse_forward(&mse, FX("mse.pred"), FX("mse.target"), n);
    cmp1("mse loss", mse, FX("mse.loss")[0], TOL);
    g_be->mse_backward(dp, FX("mse.pred"), FX("mse.target"), n, 1.0f);
    cmp("mse dpred", dp, FX("mse.dpred"), n, TOL);
    free(dp);
}

/* ---- models ------------------------------------------------------------------------------- */

typedef struct {
    size_t n;
    unsigned char *seen;
    int calls, bad;
} hook_ctx;

static void grad_hook(void *p, size_t off, size_t n) {
    hook_ctx *h = p;
    h->calls++;
    if (off + n > h->n) {
        h->bad++;
        return;
    }
    for (size_t i = off; i < off + n; i++) h->bad += h->seen[i]++ != 0;
}

static void ref_model(const char *name) {
    const dt_fx_entry *se = entry("%s.spec", name);
    const int32_t *d = FXI("%s.dims", name);
    if (!se || !d) return;
    char spec[512] = "";
    for (size_t i = 0; i < se->n && i + 1 < sizeof spec; i++) spec[i] = (char)((const int32_t *)se->data)[i];
    int C = d[0], H = d[1], W = d[2], B = d[3];
    printf("model %s: \"%s\" on (%d,%d,%d), batch %d\n", name, spec, C, H, W, B);
    dt_model *m = NULL;
    CHECK_OK(dt_model_create_from_spec(&m, spec, C, H, W));
    if (!m) return;
    /* load torch's state dict by tensor name; every fixture tensor must have a home */
    int loaded = 0, expected = 0;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.init.", name);
    for (int i = 0; i < g_fx.count; i++) expected += !strncmp(g_fx.e[i].name, prefix, strlen(prefix));
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        const dt_fx_entry *e = entry("%s.init.%s", name, t->name);
        if (!e) continue;
        CHECK_MSG(e->n == t->numel, "%s: tensor %s has %zu values, torch has %zu", name, t->name, t->numel, e->n);
        if (e->n != t->numel) continue;
        float *dst = (t->is_buffer ? dt_model_buffers(m) : dt_model_params(m)) + t->offset;
        memcpy(dst, e->data, t->numel * sizeof(float));
        loaded++;
    }
    CHECK_MSG(loaded == expected, "%s: loaded %d tensors, torch's state dict has %d", name, loaded, expected);
    CHECK(dt_model_in_size(m) == C * H * W);
    const float *x = FX("%s.x", name), *logits = NULL;
    const int32_t *labels = FXI("%s.labels", name);
    const int V = dt_model_out_size(m);
    CHECK_OK(dt_model_forward(m, x, B, true, 0, &logits));
    if (!logits) {
        dt_model_destroy(m);
        return;
    }
    char what[96];
    snprintf(what, sizeof what, "%s logits (train)", name),
        cmp(what, logits, FX("%s.logits", name), (size_t)B * V, TOL);
    float *probs = zeros((size_t)B * V), *dl = zeros((size_t)B * V);
    float loss = dt_softmax_xent_forward(probs, logits, labels, B, V);
    snprintf(what, sizeof what, "%s loss", name), cmp1(what, loss, FX("%s.loss", name)[0], TOL);
    dt_softmax_xent_backward(dl, probs, labels, B, V, 1.0f);
    dt_model_zero_grad(m);
    hook_ctx h = {dt_model_num_params(m), calloc(dt_model_num_params(m) + 1, 1), 0, 0};
    CHECK_OK(dt_model_backward(m, dl, grad_hook, &h));
    size_t covered = 0;
    for (size_t i = 0; i < h.n; i++) covered += h.seen[i];
    CHECK_MSG(h.bad == 0 && covered == h.n, "%s: grad hook ranges must cover the %zu params once (%zu covered, %d bad)",
              name, h.n, covered, h.bad);
    free(h.seen);
    /* gradients are compared relative to the largest gradient of the whole model, at least */
    double gscale = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        const dt_fx_entry *e = t->is_buffer ? NULL : entry("%s.grad.%s", name, t->name);
        for (size_t j = 0; e && j < e->n; j++) gscale = fmax(gscale, fabs(((const float *)e->data)[j]));
    }
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *t = dt_model_tensor(m, i);
        snprintf(what, sizeof what, "%s %s %s", name, t->is_buffer ? "buffer" : "grad", t->name);
        const dt_fx_entry *e = t->is_buffer ? entry("%s.after.%s", name, t->name) : entry("%s.grad.%s", name, t->name);
        if (e && e->n == t->numel)
            cmp_floor(what, (t->is_buffer ? dt_model_buffers(m) : dt_model_grads(m)) + t->offset, e->data, t->numel,
                      TOL, t->is_buffer ? 0 : (g_be->precision == DT_F32 ? 1e-3 : 1.0) * gscale);
    }
    CHECK_OK(dt_model_forward(m, x, B, false, 0, &logits));
    snprintf(what, sizeof what, "%s logits (eval)", name);
    if (logits) cmp(what, logits, FX("%s.logits_eval", name), (size_t)B * V, TOL);
    free(probs), free(dl);
    dt_model_destroy(m);
}

/* ---- optimizers --------------------------------------------------------------------------- */

static void ref_optim(const char *name) {
    const int32_t *d = FXI("optim.dims");
    const float *cfgv = FX("optim.%s.cfg", name), *traj = FX("optim.%s.traj", name);
    const int n = d[0], T = d[1];
    dt_optim_config cfg = dt_optim_defaults((dt_optim_kind)(int)cfgv[0]);
    const float lr = cfgv[1];
    cfg.momentum = cfgv[2], cfg.nesterov = cfgv[3] != 0, cfg.weight_decay = cfgv[4];
    if (cfg.kind != DT_OPTIM_SGD) cfg.beta1 = cfgv[5], cfg.beta2 = cfgv[6], cfg.eps = cfgv[7];
    printf("optimizer %s: lr %g momentum %g nesterov %d weight_decay %g betas (%g, %g) eps %g, %d steps\n", name, lr,
           cfg.momentum, cfg.nesterov, cfg.weight_decay, cfg.beta1, cfg.beta2, cfg.eps, T);
    dt_optim *o = NULL;
    CHECK_OK(dt_optim_create(&o, &cfg, (size_t)n));
    if (!o) return;
    float *p = copy(FX("optim.p0"), n);
    const float *g = FX("optim.grads");
    double worst = 0, scale = 0;
    int worst_t = -1;
    for (int t = 0; t < T; t++) {
        dt_optim_step(o, p, g + (size_t)t * n, lr);
        double dd = dt_test_maxdiff(p, traj + (size_t)t * n, n);
        if (dd > worst) worst = dd, worst_t = t;
        for (int i = 0; i < n; i++) scale = fmax(scale, fabs(traj[(size_t)t * n + i]));
    }
    CHECK(dt_optim_steps(o) == T);
    printf("  %-40s n=%-6d max|diff| %.3e  rel %.2e (worst at step %d)\n", "params over all steps", n * T, worst,
           worst / scale, worst_t + 1);
    CHECK_MSG(worst / scale <= TOL, "optimizer %s: params differ from torch.optim by %g at step %d", name, worst,
              worst_t + 1);
    free(p);
    dt_optim_destroy(o);
}

static void ref_clip(const char *name) {
    size_t n = FXN("optim.%s.g", name);
    float *g = copy(FX("optim.%s.g", name), n);
    printf("clip_grad_norm %s: max_norm %g\n", name, FX("optim.%s.max_norm", name)[0]);
    float norm = dt_clip_grad_norm(g, n, FX("optim.%s.max_norm", name)[0]);
    cmp1("returned norm", norm, FX("optim.%s.norm", name)[0], TOL);
    cmp("clipped gradient", g, FX("optim.%s.clipped", name), n, TOL);
    free(g);
}

static int load(const char *file) { return dt_fx_reload(&g_fx, file); }

/* The loader refuses damaged files with a message naming the file and the fix. */
static void test_loader_errors(void) {
    char src[512], path[64], err[768];
    const char *root = getenv("DTRAIN_ROOT");
    snprintf(src, sizeof src, "%s/tests/ref/optim.dtref", root && *root ? root : ".");
    FILE *in = fopen(src, "rb");
    CHECK_MSG(in != NULL, "cannot open %s", src);
    if (!in) return;
    static unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, in);
    fclose(in);
    snprintf(path, sizeof path, "/tmp/dtrain_fx_%d.dtref", (int)getpid());
    struct {
        size_t len;
        int flip;
        const char *want;
    } cases[] = {
        {n / 2, -1, "truncated"},
        {n, 0, "bad magic"},
        {n, 8, "version"},
        {n - 1, -1, "truncated"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        FILE *out = fopen(path, "wb");
        if (!out) break;
        unsigned char save = cases[c].flip >= 0 ? buf[cases[c].flip] : 0;
        if (cases[c].flip >= 0) buf[cases[c].flip] ^= 0x5a;
        fwrite(buf, 1, cases[c].len, out);
        fclose(out);
        if (cases[c].flip >= 0) buf[cases[c].flip] = save;
        dt_fx f;
        int r = dt_fx_load_path(&f, path, err, sizeof err);
        CHECK_MSG(r != 0 && strstr(err, cases[c].want) && strstr(err, "make fixtures") && strstr(err, path),
                  "damaged fixture case %zu: r=%d err '%s'", c, r, r ? err : "");
    }
    remove(path);
}

/* The layer kernels and the models through one backend at its precision. */
static void ref_backend(const char *kernels, dt_dtype prec) {
    if (dt_backend_find(kernels, prec, &g_be) != DT_OK) {
        printf("== %s %s: not built (%s)\n", kernels, dt_dtype_name(prec), dt_last_error());
        return;
    }
    CHECK_OK(dt_kernels_select(kernels, prec == DT_F32 ? "fp32" : prec == DT_BF16 ? "bf16" : "fp16"));
    g_tol = prec == DT_F32 ? 1e-5 : prec == DT_BF16 ? 16 * 0x1p-9 : 16 * 0x1p-12;
    printf("== backend %s %s, tolerance %.1e\n", kernels, dt_dtype_name(prec), g_tol);
    if (load("layers.dtref") == 0) {
        ref_linear();
        const char *convs[] = {"conv_same", "conv_s2p1", "conv_valid", "conv_k1", "conv_k5s2p2", "conv_ref2"};
        for (size_t i = 0; i < sizeof convs / sizeof *convs; i++) ref_conv(convs[i]);
        const char *maxp[] = {"maxpool_k2", "maxpool_k3s2", "maxpool_odd", "maxpool_ties", "maxpool_ties_k3s2"};
        for (size_t i = 0; i < sizeof maxp / sizeof *maxp; i++) ref_pool(maxp[i], 1);
        ref_pool("avgpool_k2", 0);
        ref_pool("avgpool_k3s2", 0);
        const char *acts[] = {"relu", "gelu", "tanh", "sigmoid"};
        for (size_t i = 0; i < 4; i++) ref_activation(acts[i]);
        ref_layernorm();
        ref_batchnorm();
        ref_losses();
    }
    if (load("models.dtref") == 0) {
        ref_model("mlp");
        ref_model("cnn");
        ref_model("mixed");
    }
}

int main(void) {
    dt_set_threads(1);
    static const dt_dtype precs[3] = {DT_F32, DT_BF16, DT_F16};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) ref_backend(k ? "onednn" : "blas", precs[i]);
    g_tol = 1e-5;
    if (load("optim.dtref") == 0) {
        const char *opts[] = {"sgd",  "sgd_wd",  "sgd_momentum", "sgd_momentum_wd", "sgd_nesterov",
                              "adam", "adam_wd", "adam_betas",   "adamw",           "adamw_wd"};
        for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) ref_optim(opts[i]);
        ref_clip("clip");
        ref_clip("noclip");
    }
    dt_fx_free(&g_fx);
    test_loader_errors();
    return dt_test_summary("ref_test");
}
