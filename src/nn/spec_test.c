/* Tests for model specs and model layout: presets, canonical formatting, errors that quote the
 * bad token and position, parameter counts and names, shape inference, the gradient-ready hook. */
#include "core/test.h"
#include "dtrain/nn.h"

#include <string.h>
#include <unistd.h>

static void expect_bad(const char *spec, const char *needle) {
    dt_layer_spec l[DT_MAX_LAYERS];
    int n;
    dt_status s = dt_spec_parse(spec, l, DT_MAX_LAYERS, &n);
    CHECK_MSG(s == DT_EINVAL && strstr(dt_last_error(), needle), "spec '%s' -> %s [%s], wanted '%s'", spec,
              dt_status_str(s), dt_last_error(), needle);
}

static void test_parse(void) {
    dt_layer_spec l[DT_MAX_LAYERS];
    int n;
    CHECK_OK(dt_spec_parse("cnn", l, DT_MAX_LAYERS, &n));
    CHECK(n == 10 && l[0].kind == DT_LAYER_CONV2D && l[0].out == 32 && l[0].k == 3 && l[0].pad == 1 &&
          l[0].stride == 1 && l[2].kind == DT_LAYER_MAXPOOL2D && l[2].stride == 2);
    char buf[512];
    dt_spec_format(buf, sizeof buf, l, n);
    dt_layer_spec l2[DT_MAX_LAYERS];
    int n2;
    CHECK_OK(dt_spec_parse(buf, l2, DT_MAX_LAYERS, &n2));
    CHECK(n2 == n);
    for (int i = 0; i < n && i < n2; i++)
        CHECK_MSG(l[i].kind == l2[i].kind && l[i].out == l2[i].out && l[i].k == l2[i].k &&
                      l[i].stride == l2[i].stride && l[i].pad == l2[i].pad && l[i].bias == l2[i].bias &&
                      l[i].p == l2[i].p && l[i].eps == l2[i].eps && l[i].momentum == l2[i].momentum,
                  "layer %d differs after format/parse of '%s'", i, buf);
    CHECK_OK(
        dt_spec_parse("  Linear(64, bias=0)  gelu dropout(0.25) ln batchnorm(momentum=0.2) ", l, DT_MAX_LAYERS, &n));
    CHECK(n == 5 && !l[0].bias && l[2].p == 0.25f && l[3].kind == DT_LAYER_LAYERNORM && l[4].momentum == 0.2f);
    CHECK_OK(dt_spec_parse("dropout", l, DT_MAX_LAYERS, &n));
    CHECK(l[0].p == 0.5f);

    expect_bad("conv(32,3,pad=1) relu maxpol(2)", "'maxpol(2)' at position 23");
    expect_bad("conv(32,3,pda=1)", "unknown argument 'pda'");
    expect_bad("linear(128", "unbalanced");
    expect_bad("linear", "linear needs 1 argument");
    expect_bad("conv(32)", "conv needs 2 arguments");
    expect_bad("linear(abc)", "'abc' is not an integer");
    expect_bad("linear(0)", "out of range");
    expect_bad("linear(10,20)", "too many arguments");
    expect_bad("dropout(1.5)", "dropout p must be in [0,1)");
    expect_bad("", "no layers");
    /* an empty or non-word argument name: these spun forever in word_in */
    expect_bad("conv(=0)", "no name before it");
    expect_bad("linear( =1)", "no name before it");
    expect_bad("conv(16,3,=1)", "no name before it");
    expect_bad("conv(16,3,|=1)", "unknown argument '|'");
    expect_bad("conv(16,3,pad stride=1)", "unknown argument 'pad stride'");
    expect_bad("linear(10) softmax", "already applies softmax");
    CHECK_OK(dt_spec_parse("dense(8) conv2d(4,3) maxpool2d(2) avgpool2d(2) ln batchnorm2d", l, DT_MAX_LAYERS, &n));
    CHECK(n == 6 && l[0].kind == DT_LAYER_LINEAR && l[1].kind == DT_LAYER_CONV2D && l[5].kind == DT_LAYER_BATCHNORM2D);
}

/* The layers' usage text and the known names of an error come from the op registry (each op's
 * dt_op_syntax): they read as the texts written by hand before it, wrapped at 104 columns. */
static void test_help(void) {
    const char *want =
        "layers: linear(out[,bias=0]) conv(out,k[,stride=,pad=,bias=]) maxpool(k[,stride=]) avgpool(k[,stride=])\n"
        "        relu gelu tanh sigmoid dropout(p) flatten layernorm([eps=]) batchnorm([eps=,momentum=])\n"
        "aliases: dense = linear, conv2d = conv, maxpool2d, avgpool2d, ln = layernorm, batchnorm2d = batchnorm.\n";
    CHECK_MSG(!strcmp(dt_spec_help(), want), "dt_spec_help gave\n%s", dt_spec_help());
    expect_bad("softmx", "unknown layer 'softmx' (known: linear conv maxpool avgpool relu gelu tanh sigmoid dropout "
                         "flatten layernorm batchnorm; aliases dense conv2d maxpool2d avgpool2d ln batchnorm2d)");
    expect_bad("attention", "unknown layer 'attention'"); /* graph builders' ops are not spec layers */
    CHECK(dt_layer_find("dense") == DT_LAYER_LINEAR && dt_layer_find("attention") == DT_LAYER_ATTENTION &&
          dt_layer_find("softmx") == -1);
}

static int g_hook_calls;
static size_t g_hook_last_off;
static void hook(void *ctx, size_t off, size_t n) {
    size_t *total = ctx;
    *total += n;
    /* layers complete from last to first: offsets decrease */
    CHECK(g_hook_calls == 0 || off < g_hook_last_off);
    g_hook_last_off = off;
    g_hook_calls++;
}

static void test_model(void) {
    dt_model *m;
    CHECK_OK(dt_model_create_from_spec(&m, "mlp", 1, 28, 28));
    CHECK(dt_model_num_params(m) == 784 * 128 + 128 + 128 * 10 + 10);
    CHECK(dt_model_out_size(m) == 10 && dt_model_in_size(m) == 784);
    CHECK(dt_model_num_tensors(m) == 4 && !strcmp(dt_model_tensor(m, 0)->name, "1.weight") &&
          dt_model_tensor(m, 0)->shape[0] == 128 && dt_model_tensor(m, 0)->shape[1] == 784 &&
          !strcmp(dt_model_tensor(m, 3)->name, "3.bias"));
    dt_model_init(m, 1);
    float *p = dt_model_params(m);
    float bound = 1.0f / sqrtf(784.0f), mx = 0;
    for (size_t i = 0; i < 784 * 128; i++) mx = fabsf(p[i]) > mx ? fabsf(p[i]) : mx;
    CHECK_MSG(mx <= bound && mx > 0.9f * bound, "init max %g bound %g", mx, bound);

    enum { B = 4 };
    float x[B * 784];
    for (int i = 0; i < B * 784; i++) x[i] = (float)(i % 17) / 17.0f;
    const float *out;
    CHECK_OK(dt_model_forward(m, x, B, true, 0, &out));
    float dout[B * 10];
    for (int i = 0; i < B * 10; i++) dout[i] = 0.01f * (float)(i % 7);
    dt_model_zero_grad(m);
    size_t total = 0;
    g_hook_calls = 0;
    CHECK_OK(dt_model_backward(m, dout, hook, &total));
    CHECK(g_hook_calls == 2 && total == dt_model_num_params(m));
    /* identical seeds give identical models */
    dt_model *m2;
    CHECK_OK(dt_model_create_from_spec(&m2, "mlp", 1, 28, 28));
    dt_model_init(m2, 1);
    CHECK(memcmp(dt_model_params(m), dt_model_params(m2), dt_model_num_params(m) * 4) == 0);
    dt_model_init(m2, 2);
    CHECK(memcmp(dt_model_params(m), dt_model_params(m2), dt_model_num_params(m) * 4) != 0);
    dt_model_destroy(m2);
    dt_model_destroy(m);

    CHECK_OK(dt_model_create_from_spec(&m, "cnn", 1, 28, 28));
    CHECK(dt_model_num_params(m) == 32 * 9 + 32 + 64 * 32 * 9 + 64 + 3136 * 128 + 128 + 1280 + 10);
    CHECK(!strcmp(dt_model_tensor(m, 4)->name, "7.weight") && dt_model_tensor(m, 4)->shape[1] == 3136);
    dt_model_destroy(m);
    CHECK(dt_model_create_from_spec(&m, "conv(8,5) maxpool(4) conv(8,5)", 1, 8, 8) == DT_EINVAL &&
          strstr(dt_last_error(), "larger than"));
    CHECK_OK(dt_model_create_from_spec(&m, "conv(4,3) batchnorm relu flatten linear(3)", 2, 5, 5));
    CHECK(dt_model_num_buffers(m) == 8 && dt_model_buffers(m)[4] == 1.0f);
    dt_model_destroy(m);
    dt_model_destroy(NULL);
}

int main(void) {
    alarm(60); /* a parser that spins (it did, on "conv(=0)") fails here instead of at the suite's limit */
    test_parse();
    test_help();
    test_model();
    return dt_test_summary("spec_test");
}
