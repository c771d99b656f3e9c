/* Plain weights files: F16/BF16/F32 tensors load by name (batchnorm's num_batches_tracked and
 * dtrain checkpoints' optim.* ignored), each missing, extra or mis-shaped tensor is named with
 * the expected shape and leaves the model unchanged; --save-weights folds the input
 * normalisation exactly into a first linear, unpadded conv or batchnorm (the folded model on raw
 * inputs gives the normalised model's logits) and refuses the layers that cannot take it; and
 * dt_model_predict over more than one chunk equals a plain forward. */
#include "core/test.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char g_dir[64];

static char *tpath(const char *name) {
    static char buf[16][128];
    static int k;
    snprintf(buf[k & 15], sizeof buf[0], "%s/%s", g_dir, name);
    return buf[k++ & 15];
}

static dt_model *build(const char *spec, int C, int H, int W, uint64_t seed) {
    dt_model *m = NULL;
    dt_status s = dt_model_create_from_spec(&m, spec, C, H, W);
    CHECK_MSG(s == DT_OK, "%s: %s", spec, dt_last_error());
    if (m) dt_model_init(m, seed);
    return m;
}

/* Writes m's tensors converted to dtype (plus extra/omitted ones) as a plain safetensors file. */
static void write_plain(const char *path, dt_model *m, dt_dtype dtype, const char *skip, const char *extra) {
    dt_st_writer *w;
    CHECK_OK(dt_st_writer_create(&w));
    static uint16_t half[16][4096]; /* the writer references each until the write */
    static const int64_t nbt = 7, one = 1;
    static const float junk[1] = {1};
    int k = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *p = dt_model_tensor(m, i);
        const float *v = (p->is_buffer ? dt_model_buffers(m) : dt_model_params(m)) + p->offset;
        if (skip && !strcmp(p->name, skip)) continue;
        const void *data = v;
        if (dtype != DT_F32) {
            uint16_t *h = half[k++ & 15];
            for (size_t j = 0; j < p->numel; j++) h[j] = dtype == DT_F16 ? dt_f32_to_f16(v[j]) : dt_f32_to_bf16(v[j]);
            data = h;
        }
        CHECK_OK(dt_st_writer_add(w, p->name, dtype, p->ndim, p->shape, data));
        if (strstr(p->name, "running_var")) {
            char name[64];
            snprintf(name, sizeof name, "%.*s.num_batches_tracked", (int)(strlen(p->name) - 12), p->name);
            CHECK_OK(dt_st_writer_add(w, name, DT_I64, 0, NULL, &nbt));
        }
    }
    if (extra) CHECK_OK(dt_st_writer_add(w, extra, DT_F32, 1, &one, junk));
    CHECK_OK(dt_st_writer_write(w, path));
    dt_st_writer_destroy(w);
}

static void test_load_dtypes(void) {
    const char *spec = "conv(3,3) batchnorm relu maxpool(2) flatten linear(5)";
    dt_model *src = build(spec, 2, 8, 8, 1), *dst = build(spec, 2, 8, 8, 2);
    float *bufs = dt_model_buffers(src);
    for (size_t i = 0; i < dt_model_num_buffers(src); i++) bufs[i] = 0.5f + 0.01f * (float)i; /* non-trivial stats */
    const dt_dtype types[3] = {DT_F32, DT_F16, DT_BF16};
    for (int t = 0; t < 3; t++) {
        write_plain(tpath("w.st"), src, types[t], NULL, NULL);
        CHECK_OK(dt_weights_load(dst, tpath("w.st")));
        int bad = 0;
        for (int i = 0; i < dt_model_num_tensors(src); i++) {
            const dt_param_info *p = dt_model_tensor(src, i);
            const float *a = (p->is_buffer ? dt_model_buffers(src) : dt_model_params(src)) + p->offset;
            const float *b = (p->is_buffer ? dt_model_buffers(dst) : dt_model_params(dst)) + p->offset;
            for (size_t j = 0; j < p->numel; j++) {
                float want = types[t] == DT_F32   ? a[j]
                             : types[t] == DT_F16 ? dt_f16_to_f32(dt_f32_to_f16(a[j]))
                                                  : dt_bf16_to_f32(dt_f32_to_bf16(a[j]));
                bad += b[j] != want;
            }
        }
        CHECK_MSG(bad == 0, "%s: %d values differ from the file's", dt_dtype_name(types[t]), bad);
    }
    dt_model_destroy(src), dt_model_destroy(dst);
}

/* A load that must fail with each needle in the message and leave m untouched. */
static void expect_refused(dt_model *m, const char *path, const char *n1, const char *n2) {
    size_t np = dt_model_num_params(m);
    float *before = malloc(np * sizeof(float));
    memcpy(before, dt_model_params(m), np * sizeof(float));
    dt_status s = dt_weights_load(m, path);
    CHECK(s == DT_EFORMAT);
    CHECK_MSG(strstr(dt_last_error(), n1) && (!n2 || strstr(dt_last_error(), n2)), "want '%s' / '%s' in: %s", n1,
              n2 ? n2 : "", dt_last_error());
    CHECK(memcmp(before, dt_model_params(m), np * sizeof(float)) == 0);
    free(before);
}

static void test_refusals(void) {
    dt_model *m = build("flatten linear(4) relu linear(3)", 1, 2, 3, 1),
             *other = build("flatten linear(5) relu linear(3)", 1, 2, 3, 1);
    write_plain(tpath("skip.st"), m, DT_F32, "3.bias", NULL);
    expect_refused(m, tpath("skip.st"), "'3.bias' (expected shape [3]) is missing", NULL);
    write_plain(tpath("extra.st"), m, DT_F32, NULL, "9.weight");
    expect_refused(m, tpath("extra.st"), "'9.weight' is not a tensor of the model", NULL);
    write_plain(tpath("shape.st"), other, DT_F32, NULL, NULL);
    expect_refused(m, tpath("shape.st"), "'1.weight' has shape [5, 6], the model expects [4, 6]",
                   "'3.weight' has shape [3, 5], the model expects [3, 4]");
    dt_st_writer *w;
    CHECK_OK(dt_st_writer_create(&w));
    static int32_t ints[64];
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_param_info *p = dt_model_tensor(m, i);
        CHECK_OK(dt_st_writer_add(w, p->name, i == 0 ? DT_I32 : DT_F32, p->ndim, p->shape,
                                  i == 0 ? (void *)ints : dt_model_params(m) + p->offset));
    }
    CHECK_OK(dt_st_writer_write(w, tpath("int.st")));
    dt_st_writer_destroy(w);
    expect_refused(m, tpath("int.st"), "'1.weight' is I32", "F32, F16 or BF16");
    CHECK(dt_weights_load(m, tpath("absent.st")) == DT_ENOENT);
    dt_model_destroy(m), dt_model_destroy(other);
}

/* The logits of spec on raw inputs after --save-weights folded norm, against the original model
 * on normalised inputs (evaluation mode). */
static void check_fold(const char *spec, int C, int H, int W) {
    dt_model *m = build(spec, C, H, W, 3), *f = build(spec, C, H, W, 4);
    float *bufs = dt_model_buffers(m);
    for (size_t i = 0; i < dt_model_num_buffers(m); i++) bufs[i] = i % 2 ? 0.7f + 0.1f * (float)i : 0.05f * (float)i;
    const dt_input_norm norm = {.on = true, .mean = 0.2860f, .std = 0.3530f};
    CHECK_OK(dt_weights_save(m, tpath("fold.st"), &norm, C, H, W));
    CHECK_OK(dt_weights_load(f, tpath("fold.st")));
    enum { B = 5 };
    const int D = C * H * W, K = dt_model_out_size(m);
    float *x = malloc(sizeof(float) * B * D), *xn = malloc(sizeof(float) * B * D);
    float *a = malloc(sizeof(float) * B * K), *b = malloc(sizeof(float) * B * K);
    dt_rng_fill_uniform(x, (size_t)B * D, 0, 1, 9, 1);
    for (int i = 0; i < B * D; i++) xn[i] = (x[i] - norm.mean) / norm.std;
    CHECK_OK(dt_model_predict(m, xn, B, a));
    CHECK_OK(dt_model_predict(f, x, B, b));
    double d = dt_test_maxdiff(a, b, (size_t)B * K);
    CHECK_MSG(d < 2e-5, "%s: folded logits differ by %g", spec, d);
    free(x), free(xn), free(a), free(b);
    dt_model_destroy(m), dt_model_destroy(f);
}

static void test_fold(void) {
    check_fold("flatten linear(6) relu linear(3)", 1, 4, 4);
    check_fold("maxpool(2) conv(3,2,stride=1) relu flatten linear(3)", 2, 6, 6);
    check_fold("batchnorm conv(2,3,pad=1) flatten linear(3)", 2, 5, 5);
    const dt_input_norm norm = {.on = true, .mean = 0.5f, .std = 2};
    const char *refused[3][2] = {{"conv(2,3,pad=1) flatten linear(3)", "padded conv"},
                                 {"layernorm flatten linear(3)", "cannot be folded exactly"},
                                 {"flatten linear(3,bias=0)", "cannot be folded exactly"}};
    for (int i = 0; i < 3; i++) {
        dt_model *m = build(refused[i][0], 1, 5, 5, 1);
        CHECK(dt_weights_check_fold(m, &norm) == DT_EINVAL);
        CHECK_MSG(strstr(dt_last_error(), refused[i][1]), "%s: %s", refused[i][0], dt_last_error());
        CHECK(dt_weights_save(m, tpath("no.st"), &norm, 1, 5, 5) == DT_EINVAL);
        CHECK(access(tpath("no.st"), F_OK) != 0); /* nothing half-written */
        dt_model_destroy(m);
    }
}

static void test_predict(void) {
    dt_model *m = build("flatten linear(7) gelu linear(4)", 1, 3, 3, 5);
    enum { N = 300 };
    float *x = malloc(sizeof(float) * N * 9), *out = malloc(sizeof(float) * N * 4);
    dt_rng_fill_uniform(x, N * 9, -1, 1, 2, 2);
    CHECK_OK(dt_model_predict(m, x, N, out));
    /* predict runs batches of 256: the forward of the same batches, bitwise (not one forward of
     * all 300: oneDNN's AVX2 GEMM (gemm:jit) sums some rows in another order at another M, e.g.
     * rows 174-175 and 254-255 of 300 against 256, by an ulp) */
    enum { PREDICT_BATCH = 256 }; /* dt_model_predict's */
    float *ref = malloc(sizeof(float) * N * 4);
    for (int i = 0; i < N; i += PREDICT_BATCH) {
        const int b = N - i < PREDICT_BATCH ? N - i : PREDICT_BATCH;
        const float *y;
        CHECK_OK(dt_model_forward(m, x + (size_t)i * 9, b, false, 0, &y));
        memcpy(ref + (size_t)i * 4, y, sizeof(float) * (size_t)b * 4);
    }
    CHECK(dt_test_maxdiff(out, ref, N * 4) == 0);
    free(x), free(out), free(ref);
    dt_model_destroy(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dt-weights-XXXXXX");
    if (!mkdtemp(g_dir)) return 2;
    test_load_dtypes();
    test_refusals();
    test_fold();
    test_predict();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return dt_test_summary("weights_test");
}
