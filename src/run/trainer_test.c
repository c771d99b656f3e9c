/* The trainer API (dtrain/train.h) on a tiny model: create, run, step count, evaluate, save and
 * load back, a second run that does nothing; the errors of a bad config (each names what is wrong,
 * and no trainer is left behind), and of a config of another layout (size, version). Data: two
 * classes of points separable by their first feature, in memory (dt_dataset_create). */
#include "core/test.h"
#include "dtrain/train.h"
#include "dtrain/train_options.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define NS 64 /* samples */
#define NF 4  /* features */

static float g_x[NS * NF];
static int32_t g_y[NS];
static float g_loss[8];
static int g_epochs;

static void on_epoch(void *ctx, const dt_epoch_info *e) {
    (void)ctx;
    if (g_epochs < 8) g_loss[g_epochs] = e->train_loss;
    g_epochs++;
}

static dt_train_config tiny(dt_dataset *train, dt_dataset *test) {
    dt_train_config c = dt_train_defaults();
    c.model = "linear(8) relu linear(2)";
    c.epochs = 4;
    c.batch = 8;
    c.optim = dt_optim_defaults(DT_OPTIM_SGD);
    c.lr.base_lr = 0.2f;
    c.train_set = train, c.test_set = test;
    c.on_epoch = on_epoch;
    return c;
}

/* A config that dt_trainer_create refuses: the status, *t NULL and a message holding `word`. */
static void refused(const dt_train_config *c, dt_status want, const char *word, const char *what) {
    dt_trainer *t = (dt_trainer *)c; /* not NULL before the call */
    const dt_status st = dt_trainer_create(&t, c);
    CHECK_MSG(st == want && !t, "%s: %s (t %p), want %s", what, dt_status_str(st), (void *)t, dt_status_str(want));
    CHECK_MSG(strstr(dt_last_error(), word) != NULL, "%s: the message '%s' does not name %s", what, dt_last_error(),
              word);
    if (st == DT_OK) dt_trainer_destroy(t);
}

/* A config of another layout (a caller built against another dtrain/train.h) is refused, naming
 * both layouts; one never set up says how to set it up; dt_train_config_init gives the defaults
 * and writes nothing for another layout. */
static void test_layout(dt_dataset *train, dt_dataset *test) {
    dt_train_config c = tiny(train, test);
    c.size += 8;
    refused(&c, DT_EINVAL, "compiled against another dtrain/train.h", "a bigger config");
    c = tiny(train, test);
    c.version = DT_TRAIN_CONFIG_VERSION + 1;
    refused(&c, DT_EINVAL, "compiled against another dtrain/train.h", "another version");
    c = tiny(train, test);
    c.size = 0, c.version = 0;
    refused(&c, DT_EINVAL, "dt_train_config_init", "a config never set up");
    c.size = 1;
    CHECK(dt_train_local(&c, 1, 0) == DT_EINVAL && strstr(dt_last_error(), "dt_train_local"));

    dt_train_config a, b = dt_train_defaults();
    memset(&a, 0xff, sizeof a);
    CHECK_OK(dt_train_config_init(&a));
    CHECK(a.size == sizeof a && a.version == DT_TRAIN_CONFIG_VERSION && a.batch == b.batch && a.epochs == b.epochs &&
          !strcmp(a.model, b.model) && a.seed == b.seed && !a.aids && !a.train_set);
    memset(&a, 0xab, sizeof a);
    CHECK(dt_train_config_init_sized(&a, sizeof a - 8, DT_TRAIN_CONFIG_VERSION) == DT_EINVAL &&
          a.batch == (int)0xabababab);
    CHECK(dt_train_config_init_sized(&a, sizeof a, DT_TRAIN_CONFIG_VERSION - 1) == DT_EINVAL);
}

static void test_errors(dt_dataset *train, dt_dataset *test) {
    dt_train_config c = tiny(train, test);
    c.batch = 0;
    refused(&c, DT_EINVAL, "batch", "batch 0");
    c = tiny(train, test);
    c.epochs = -1;
    refused(&c, DT_EINVAL, "epochs", "epochs -1");
    c = tiny(train, test);
    c.model = "linear(8) nosuchlayer linear(2)";
    refused(&c, DT_EINVAL, "nosuchlayer", "an unknown layer");
    c = tiny(train, test);
    c.strategy = "nosuchstrategy";
    refused(&c, DT_EINVAL, "nosuchstrategy", "an unknown strategy");
    c = tiny(train, test);
    c.resume = "/nonexistent/dir/ckpt.safetensors";
    refused(&c, DT_ENOENT, "/nonexistent/dir/ckpt.safetensors", "resume of a missing file");
}

int main(void) {
    for (int i = 0; i < NS; i++) {
        g_y[i] = i % 2;
        for (int k = 0; k < NF; k++)
            g_x[i * NF + k] = (float)((i * 5 + k * 3) % 7) / 7.0f + (k == 0 ? 2.0f * g_y[i] : 0);
    }
    dt_dataset *train = NULL, *test = NULL;
    CHECK_OK(dt_dataset_create(&train, DT_F32, g_x, g_y, NS, NF, 1, 1, 2));
    CHECK_OK(dt_dataset_create(&test, DT_F32, g_x, g_y, NS, NF, 1, 1, 2));
    if (!train || !test) return dt_test_summary("trainer_test");

    dt_train_config c = tiny(train, test);
    char save[] = "/tmp/dtrain-trainer-test-XXXXXX";
    int fd = mkstemp(save);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    c.save = save;
    dt_trainer *t = NULL;
    CHECK_OK(dt_trainer_create(&t, &c));
    if (!t) return dt_test_summary("trainer_test");
    CHECK(dt_trainer_step(t) == 0);
    CHECK_OK(dt_trainer_run(t));
    CHECK_MSG(dt_trainer_step(t) == 4 * NS / 8, "steps %lld, want %d", (long long)dt_trainer_step(t), 4 * NS / 8);
    CHECK_MSG(g_epochs == 4 && g_loss[3] < 0.5f * g_loss[0], "%d epochs, loss %g -> %g", g_epochs, g_loss[0],
              g_loss[g_epochs > 0 && g_epochs <= 8 ? g_epochs - 1 : 0]);
    float loss = NAN, acc = NAN;
    CHECK_OK(dt_trainer_evaluate(t, &loss, &acc));
    CHECK_MSG(acc > 0.95f && loss < g_loss[0], "test accuracy %g, loss %g", acc, loss);
    CHECK_OK(dt_trainer_run(t)); /* at its end: nothing more */
    CHECK(dt_trainer_step(t) == 4 * NS / 8 && g_epochs == 4);
    CHECK_MSG(!strcmp(dt_trainer_last_checkpoint(t), save), "last checkpoint '%s'", dt_trainer_last_checkpoint(t));

    dt_model *back = NULL; /* the checkpoint holds the trained weights */
    CHECK_OK(dt_model_load(&back, save));
    dt_model *m = dt_trainer_model(t);
    CHECK(back && dt_model_num_params(back) == dt_model_num_params(m) &&
          !memcmp(dt_model_params(back), dt_model_params(m), dt_model_num_params(m) * sizeof(float)));
    dt_model_destroy(back);
    dt_trainer_destroy(t);
    unlink(save);

    test_errors(train, test);
    test_layout(train, test);
    dt_dataset_destroy(train);
    dt_dataset_destroy(test);
    return dt_test_summary("trainer_test");
}
