/* Cross-module test: the C API as an embedder meets it: an in-memory data set passed to the trainer trains exactly
 * as the same data read from CSV files; dt_launch_workers runs a function on N forked workers,
 * returns the first failing worker's error and names dt_trainer_evaluate's collective contract
 * when one rank calls it alone; dt_evaluate_checkpoint without a data set takes the one the
 * checkpoint records; a spec that ends in mse trains on float targets (regression), and a loss that
 * does not fit the data is refused naming the fix. */
#include "core/test.h"
#include "dtrain/launch.h"
#include "dtrain/train.h"
#include "dtrain/train_options.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NS 96 /* samples */
#define NF 6  /* features */

static float g_x[NS * NF];
static int32_t g_y[NS];
static char g_dir[64];

/* Deterministic points of 3 classes; written as train.csv / test.csv too (exact %.9g floats). */
static void make_data(void) {
    for (int i = 0; i < NS; i++) {
        g_y[i] = i % 3;
        for (int k = 0; k < NF; k++)
            g_x[i * NF + k] = (float)((i * 7 + k * 13) % 17) / 17.0f + (k == g_y[i] ? 0.5f : 0);
    }
    const char *names[2] = {"train", "test"};
    for (int f = 0; f < 2; f++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s.csv", g_dir, names[f]);
        FILE *o = fopen(path, "w");
        for (int i = 0; i < NS; i++) {
            fprintf(o, "%d", g_y[i]);
            for (int k = 0; k < NF; k++) fprintf(o, ",%.9g", g_x[i * NF + k]);
            fputc('\n', o);
        }
        fclose(o);
    }
}

static dt_train_config small_config(void) {
    dt_train_config c;
    CHECK_OK(dt_train_config_init(&c)); /* as an embedder starts */
    c.model = "linear(16) relu linear(3)";
    c.epochs = 2;
    c.batch = 8;
    return c;
}

/* Trains on `c`; copies the final parameters into p (cap floats) and returns how many. */
static size_t train_params(dt_train_config *c, float *p, size_t cap, float *loss) {
    dt_trainer *t = NULL;
    float acc;
    CHECK_OK(dt_trainer_create(&t, c));
    if (!t) return 0;
    CHECK_OK(dt_trainer_run(t));
    CHECK_OK(dt_trainer_evaluate(t, loss, &acc));
    size_t n = dt_model_num_params(dt_trainer_model(t));
    if (n <= cap) memcpy(p, dt_model_params(dt_trainer_model(t)), n * sizeof *p);
    dt_trainer_destroy(t);
    return n;
}

static void test_memory_equals_csv(void) {
    static float a[4096], b[4096];
    float la = 0, lb = 0;
    char path[128];
    snprintf(path, sizeof path, "%s/train.csv", g_dir);
    dt_train_config c = small_config();
    c.data = path;
    size_t na = train_params(&c, a, 4096, &la);
    dt_dataset *tr = NULL, *te = NULL;
    CHECK_OK(dt_dataset_create(&tr, DT_F32, g_x, g_y, NS, 1, 1, NF, 0));
    CHECK_OK(dt_dataset_create(&te, DT_F32, g_x, g_y, NS, 1, 1, NF, 0));
    c = small_config();
    c.train_set = tr, c.test_set = te;
    size_t nb = train_params(&c, b, 4096, &lb);
    CHECK(na > 0 && na == nb && na <= 4096);
    CHECK_MSG(na == nb && memcmp(a, b, na * sizeof *a) == 0, "in-memory training differs from the CSV run");
    CHECK_MSG(la == lb && la > 0, "test loss %g (csv) vs %g (memory)", la, lb);
    CHECK(dt_dataset_len(tr) == NS); /* borrowed: still alive after the trainer was freed */
    /* a model whose outputs do not fit the labels names the in-memory data set */
    c.model = "linear(2)";
    dt_trainer *t = NULL;
    CHECK(dt_trainer_create(&t, &c) != DT_OK && t == NULL);
    CHECK_MSG(strstr(dt_last_error(), "in-memory") || strstr(dt_last_error(), "memory"), "%s", dt_last_error());
    dt_dataset_destroy(tr);
    dt_dataset_destroy(te);
}

/* dt_evaluate_checkpoint(data NULL) evaluates on the data set the checkpoint trained on (as
 * dtrain eval without --data); one trained on in-memory data records "(in-memory data set)": an error naming it, not a
 * guess */
static void test_evaluate_recorded_data(void) {
    char data[128], ckpt[128];
    snprintf(data, sizeof data, "%s/train.csv", g_dir);
    snprintf(ckpt, sizeof ckpt, "%s/eval.safetensors", g_dir);
    dt_train_config c = small_config();
    c.data = data, c.save = ckpt, c.epochs = 1;
    float p[4096], trained;
    train_params(&c, p, 4096, &trained);
    float la = 0, aa = 0, lb = 1, ab = 1;
    int64_t na = 0, nb = 0;
    const char *sa = "", *sb = "";
    CHECK_OK(dt_evaluate_checkpoint(ckpt, data, 16, &la, &aa, &na, &sa));
    CHECK_OK(dt_evaluate_checkpoint(ckpt, NULL, 16, &lb, &ab, &nb, &sb));
    CHECK_MSG(la == lb && aa == ab && na == NS && nb == NS && !strcmp(sa, "test") && !strcmp(sb, "test"),
              "recorded data: loss %g acc %g n %lld %s; given: loss %g acc %g n %lld %s", lb, ab, (long long)nb, sb, la,
              aa, (long long)na, sa);
    CHECK_MSG(la == trained, "evaluate %g vs the trainer's %g", la, trained);
    dt_dataset *tr = NULL;
    CHECK_OK(dt_dataset_create(&tr, DT_F32, g_x, g_y, NS, 1, 1, NF, 0));
    c = small_config();
    c.train_set = tr, c.save = ckpt, c.epochs = 1;
    dt_trainer *t = NULL;
    CHECK_OK(dt_trainer_create(&t, &c));
    if (t) CHECK_OK(dt_trainer_run(t));
    dt_trainer_destroy(t);
    CHECK_MSG(dt_evaluate_checkpoint(ckpt, NULL, 16, &lb, &ab, &nb, &sb) != DT_OK &&
                  strstr(dt_last_error(), "in-memory"),
              "%s", dt_last_error());
    dt_dataset_destroy(tr);
}

/* An IDX file (big-endian) of f32 values with dims[0..ndim). */
static void write_idx_f32(const char *path, int ndim, const uint32_t *dims, const float *v) {
    FILE *f = fopen(path, "wb");
    unsigned char h[4] = {0, 0, 0x0D, (unsigned char)ndim};
    fwrite(h, 1, 4, f);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        unsigned char d[4] = {dims[i] >> 24, dims[i] >> 16 & 255, dims[i] >> 8 & 255, dims[i] & 255};
        fwrite(d, 1, 4, f);
        count *= dims[i];
    }
    for (size_t i = 0; i < count; i++) {
        uint32_t b;
        memcpy(&b, &v[i], 4);
        unsigned char e[4] = {b >> 24, b >> 16 & 255, b >> 8 & 255, b & 255};
        fwrite(e, 1, 4, f);
    }
    fclose(f);
}

/* Regression: y = 2 x0 - x1 + 0.5 learnt by "... linear(1) mse" from an IDX directory with float
 * targets; accuracy is NaN; cross-entropy on targets, mse on labels and a 2-output mse model are
 * refused with what to do. */
static void test_regression(void) {
    char dir[128], path[160];
    snprintf(dir, sizeof dir, "%s/reg", g_dir);
    mkdir(dir, 0700);
    float tg[NS];
    for (int i = 0; i < NS; i++) tg[i] = 2 * g_x[i * NF] - g_x[i * NF + 1] + 0.5f;
    uint32_t dx[2] = {NS, NF}, dy[1] = {NS};
    const char *split[2] = {"train", "t10k"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s-images-idx2-float", dir, split[k]);
        write_idx_f32(path, 2, dx, g_x);
        snprintf(path, sizeof path, "%s/%s-labels-idx1-float", dir, split[k]);
        write_idx_f32(path, 1, dy, tg);
    }
    dt_train_config c = small_config();
    c.data = dir, c.model = "linear(16) relu linear(1) mse", c.epochs = 40, c.lr.base_lr = 0.01f;
    dt_trainer *t = NULL;
    float before = NAN, after = NAN, acc = 0;
    CHECK_OK(dt_trainer_create(&t, &c));
    if (t) {
        CHECK_OK(dt_trainer_evaluate(t, &before, &acc));
        CHECK_OK(dt_trainer_run(t));
        CHECK_OK(dt_trainer_evaluate(t, &after, &acc));
        CHECK(!strcmp(dt_model_spec(dt_trainer_model(t)), "linear(16) relu linear(1) mse"));
    }
    dt_trainer_destroy(t);
    CHECK_MSG(after < before / 20 && after < 0.05f && isnan(acc), "mse %g -> %g, acc %g", before, after, acc);
    static const struct {
        const char *model, *data, *needle;
    } bad[] = {
        {"linear(1)", "reg", "end its spec with linear(1) mse"},
        {"linear(1) mse", "train.csv", "holds class labels"},
        {"linear(2) mse", "reg", "ends in linear(1) mse"},
        {"mse", "reg", "the loss after the layers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, bad[i].data);
        c = small_config();
        c.data = path, c.model = bad[i].model;
        t = NULL;
        CHECK_MSG(dt_trainer_create(&t, &c) == DT_EINVAL && !t && strstr(dt_last_error(), bad[i].needle),
                  "%s on %s: %s", bad[i].model, bad[i].data, dt_last_error());
    }
}

static dt_status fail_on_rank1(dt_comm *comm, void *ctx) {
    (void)ctx;
    if (dt_comm_rank(comm) == 1) return dt_error(DT_EINVAL, "boom on rank %d", dt_comm_rank(comm));
    return DT_OK;
}

/* rank 0 alone evaluates after training with the others; rank 1 returns without evaluating */
static dt_status evaluate_alone(dt_comm *comm, void *ctx) {
    (void)ctx;
    char path[128];
    snprintf(path, sizeof path, "%s/train.csv", g_dir);
    dt_train_config c = small_config();
    c.data = path, c.epochs = 1, c.comm = comm;
    dt_trainer *t = NULL;
    DT_TRY(dt_trainer_create(&t, &c));
    dt_status s = dt_trainer_run(t);
    float loss, acc;
    if (s == DT_OK && dt_comm_rank(comm) == 0) s = dt_trainer_evaluate(t, &loss, &acc);
    dt_trainer_destroy(t);
    return s;
}

static dt_status sum_ranks(dt_comm *comm, void *ctx) {
    int v = dt_comm_rank(comm) + 1, sum = 0;
    DT_TRY(dt_comm_allreduce(comm, &v, &sum, 1, DT_I32, DT_OP_SUM));
    const int n = dt_comm_size(comm);
    if (sum != n * (n + 1) / 2) return dt_error(DT_EMISMATCH, "sum %d, expected %d", sum, n * (n + 1) / 2);
    (void)ctx;
    return DT_OK;
}

static void test_launch_workers(void) {
    CHECK_OK(dt_launch_workers(3, sum_ranks, NULL, 120));
    dt_status s = dt_launch_workers(2, fail_on_rank1, NULL, 120);
    CHECK_MSG(s == DT_EINVAL, "got %s: %s", dt_status_str(s), dt_last_error());
    CHECK_MSG(strstr(dt_last_error(), "worker 1: boom on rank 1"), "%s", dt_last_error());
    s = dt_launch_workers(2, evaluate_alone, NULL, 120);
    CHECK_MSG(s != DT_OK && strstr(dt_last_error(), "worker 0") &&
                  strstr(dt_last_error(), "dt_trainer_evaluate is collective: every rank"),
              "%s", dt_last_error());
    CHECK(dt_launch_workers(0, sum_ranks, NULL, 1) == DT_EINVAL);
}

/* options by flag name: numbers, strings (owned copies), the optimizer's defaults, errors */
static void test_options(void) {
    dt_train_options *o = NULL;
    CHECK_OK(dt_train_options_create(&o));
    char model[32] = "linear(10)";
    CHECK_OK(dt_train_options_set(o, "model", model));
    model[0] = 'X'; /* the options hold their own copy */
    CHECK_OK(dt_train_options_set(o, "--max_steps", "17"));
    CHECK_OK(dt_train_options_set(o, "optimizer", "sgd"));
    CHECK_OK(dt_train_options_set(o, "momentum", "0.5"));
    CHECK_OK(dt_train_options_set(o, "normalize", "true"));
    CHECK_OK(dt_train_options_set(o, "lr", "0.25"));
    CHECK_OK(dt_train_options_set(o, "schedule", "cosine"));
    const dt_train_config *c = dt_train_options_config(o);
    CHECK(!strcmp(c->model, "linear(10)") && c->max_steps == 17 && c->normalize && c->lr.base_lr == 0.25f);
    CHECK(c->optim.kind == DT_OPTIM_SGD && c->optim.momentum == 0.5f && c->lr.kind == DT_LR_COSINE);
    CHECK(c->epochs == 1 && c->batch == 32); /* the rest keeps dt_train_defaults */
    CHECK(dt_train_options_set(o, "epochz", "1") == DT_EINVAL && strstr(dt_last_error(), "'epochz'") &&
          strstr(dt_last_error(), "max-steps"));
    CHECK(dt_train_options_set(o, "batch", "3x") == DT_EINVAL && strstr(dt_last_error(), "`batch` 3x"));
    CHECK(dt_train_options_set(o, "seed", "-1") == DT_EINVAL);
    CHECK(dt_train_options_set(o, "optimizer", "rmsprop") == DT_EINVAL && strstr(dt_last_error(), "rmsprop"));
    CHECK(dt_train_local(c, 0, 1) == DT_EINVAL);
    dt_train_options_destroy(o);
    dt_train_options_destroy(NULL);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-embed-test.%d", (int)getpid());
    mkdir(g_dir, 0700);
    make_data();
    test_memory_equals_csv();
    test_evaluate_recorded_data();
    test_regression();
    test_launch_workers();
    test_options();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return dt_test_summary("embed");
}
