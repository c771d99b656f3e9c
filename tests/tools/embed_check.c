/* An embedder's program for tests/library.sh: includes only <dtrain/dtrain.h> (it must declare
 * everything used here, dt_model_build included, in C and in C++), and checks the contracts an
 * embedder relies on: dt_model_build gives a model initialised as dt_model_init(DT_MODEL_BUILD_SEED)
 * would (not all zeros), and dt_trainer_evaluate without a test set is an error that says so,
 * while with one it gives finite figures; dt_version() is the headers' DTRAIN_VERSION. Prints one
 * "ok: ..." or "FAIL: ..." line per check. */
#include <dtrain/dtrain.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static int fails;
static void check(int cond, const char *what) {
    printf("%s: %s%s%s\n", cond ? "ok" : "FAIL", what, cond ? "" : ": ", cond ? "" : dt_last_error());
    fails += !cond;
}

/* dt_model_build's model equals a bare model initialised with DT_MODEL_BUILD_SEED. */
static void check_build(const char *spec, int C, int H, int W) {
    dt_model *m = NULL, *bare = NULL;
    char what[160];
    snprintf(what, sizeof what, "dt_model_build(\"%s\") succeeds", spec);
    check(dt_model_build(&m, spec, C, H, W) == DT_OK, what);
    check(dt_model_build_unplaced(&bare, spec, C, H, W) == DT_OK && dt_model_place(bare, NULL, 0) == DT_OK,
          "an unplaced build placed whole");
    if (!m || !bare) return;
    const float *p = dt_model_params(m), *q = dt_model_params(bare);
    const size_t n = dt_model_num_params(m);
    size_t nonzero = 0, zero_bare = 0;
    for (size_t i = 0; i < n; i++) nonzero += p[i] != 0, zero_bare += q[i] == 0;
    snprintf(what, sizeof what, "dt_model_build(\"%s\") initialises: %zu of %zu parameters non-zero", spec, nonzero, n);
    check(nonzero > n / 2, what);
    check(zero_bare == n, "dt_model_build_unplaced leaves them zero (documented: initialise with dt_model_init)");
    dt_model_init(bare, DT_MODEL_BUILD_SEED);
    snprintf(what, sizeof what, "dt_model_build(\"%s\") = dt_model_init(DT_MODEL_BUILD_SEED)", spec);
    check(memcmp(p, q, n * sizeof *p) == 0, what);
    dt_model_destroy(m);
    dt_model_destroy(bare);
}

/* A trainer on an in-memory set (test set or not), one step, then dt_trainer_evaluate. */
static dt_status train_eval(dt_dataset *tr, dt_dataset *te, float *loss, float *acc) {
    dt_train_config cfg;
    DT_TRY(dt_train_config_init(&cfg));
    cfg.train_set = tr, cfg.test_set = te, cfg.model = "linear(2)", cfg.batch = 8, cfg.max_steps = 1;
    dt_trainer *t = NULL;
    dt_status s = dt_trainer_create(&t, &cfg);
    if (s == DT_OK) s = dt_trainer_run(t);
    if (s == DT_OK) s = dt_trainer_evaluate(t, loss, acc);
    dt_trainer_destroy(t);
    return s;
}

int main(void) {
    check(strcmp(dt_version(), DTRAIN_VERSION) == 0, "dt_version() is the headers' DTRAIN_VERSION");
    check_build("mlp", 1, 28, 28);
    check_build("gpt:L=1,H=2,C=16,T=8,V=32", 0, 0, 0);
    float x[64 * 4];
    int32_t y[64];
    for (int i = 0; i < 64; i++) {
        for (int j = 0; j < 4; j++) x[i * 4 + j] = (float)((i * 7 + j * 3) % 11) / 11.0f;
        y[i] = x[i * 4] > 0.5f;
    }
    dt_dataset *tr = NULL, *te = NULL;
    check(dt_dataset_create(&tr, DT_F32, x, y, 64, 1, 1, 4, 2) == DT_OK, "in-memory train set");
    check(dt_dataset_create(&te, DT_F32, x, y, 16, 1, 1, 4, 2) == DT_OK, "in-memory test set");
    float loss = 0, acc = 0;
    dt_status s = train_eval(tr, NULL, &loss, &acc);
    check(s == DT_EINVAL && strstr(dt_last_error(), "has no test set") && isnan(loss) && isnan(acc),
          "dt_trainer_evaluate without a test set is DT_EINVAL saying there is none");
    check(train_eval(tr, te, &loss, &acc) == DT_OK && isfinite(loss) && acc >= 0 && acc <= 1,
          "dt_trainer_evaluate with a test set gives finite figures");
    dt_dataset_destroy(te);
    dt_dataset_destroy(tr);
    return fails ? 1 : 0;
}
