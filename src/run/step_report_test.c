/* Step-based reporting of the trainer (step_report.c): the progress callback's run total, epoch
 * end and ETAs honour max_steps; a DT_STEP_TRAIN record every log_every steps with the loss,
 * learning rate and the gradient norm (equal to the norm of the step's gradient slab); an
 * evaluation every eval_every steps over eval_batches batches, with its progress; the --metrics
 * file holds those records beside the epochs'; and the flag errors. In-memory data, one process. */
#include "core/test.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NS 96 /* training samples: 12 steps of 8 an epoch */
#define NT 40 /* test samples: 5 batches of 8 */
#define NF 6

static float g_x[NS * NF];
static int32_t g_y[NS];

typedef struct {
    dt_progress_info prog[256];
    int nprog;
    dt_step_info rec[64];
    int nrec;
    int eval_calls, eval_last, eval_total; /* evaluation progress */
    bool eval_in_order;
} seen;

static void on_progress(void *ctx, const dt_progress_info *p) {
    seen *s = ctx;
    if (p->eval_set) {
        s->eval_in_order &= !strcmp(p->eval_set, "test") && p->eval_batch == (s->eval_last + 1) % (p->eval_batches + 1);
        s->eval_calls++, s->eval_last = (int)p->eval_batch, s->eval_total = (int)p->eval_batches;
        return;
    }
    if (s->nprog < 256) s->prog[s->nprog++] = *p;
}

static void on_step(void *ctx, const dt_step_info *r) {
    seen *s = ctx;
    if (s->nrec < 64) s->rec[s->nrec++] = *r;
}

static dt_train_config config(dt_dataset *tr, dt_dataset *te, seen *s) {
    dt_train_config c = dt_train_defaults();
    c.model = "linear(16) relu linear(3)";
    c.epochs = 3, c.batch = 8, c.max_steps = 30; /* 36 steps in 3 epochs, cut at 30 */
    c.train_set = tr, c.test_set = te;
    c.on_progress = on_progress, c.on_step = on_step, c.cb_ctx = s, c.progress_interval_s = 0;
    return c;
}

/* The bar's end and the run's total under max_steps, and the ETAs' arithmetic. */
static void check_progress(const seen *s) {
    CHECK_MSG(s->nprog == 30, "%d progress calls, want one per step", s->nprog);
    int bad = 0;
    for (int i = 0; i < s->nprog; i++) {
        const dt_progress_info *p = &s->prog[i];
        const int64_t want_end = p->epoch < 2 ? 12 : 6; /* the third epoch ends at step 30 */
        bad += p->total_steps != 30 || p->epoch_steps != want_end || p->steps_per_epoch != 12;
        bad += p->global_step != i + 1 || p->step_in_epoch != i % 12 + 1;
        /* both ETAs at one pace: the run's over its steps left, the epoch's over the epoch's */
        const double per = p->step_in_epoch > 0 ? p->elapsed_s / (double)p->step_in_epoch : 0;
        bad += fabs(p->eta_s - per * (double)(want_end - p->step_in_epoch)) > 1e-9 + 1e-6 * p->eta_s;
        bad += fabs(p->run_eta_s - per * (double)(30 - p->global_step)) > 1e-9 + 1e-6 * p->run_eta_s;
    }
    CHECK_MSG(bad == 0, "%d wrong progress fields (total 30, epoch ends 12, 12, 6)", bad);
    const dt_progress_info *last = &s->prog[s->nprog - 1];
    CHECK_MSG(last->step_in_epoch == last->epoch_steps && last->run_eta_s == 0 && last->eta_s == 0,
              "the last step: %lld of %lld, eta %g, run eta %g", (long long)last->step_in_epoch,
              (long long)last->epoch_steps, last->eta_s, last->run_eta_s);
}

/* log_every 5, eval_every 10, eval_batches 2: train records at 5..30, evaluations at 10, 20 and
 * (the run's end, the epoch's evaluation) 30, each over 16 samples. */
static void check_records(const seen *s) {
    int train = 0, eval = 0, bad = 0;
    for (int i = 0; i < s->nrec; i++) {
        const dt_step_info *r = &s->rec[i];
        if (r->kind == DT_STEP_TRAIN) {
            train++;
            bad += r->step != 5 * train || r->steps != 5 || !(r->train_loss > 0) || !(r->grad_norm > 0);
            bad += fabsf(r->lr - 1e-3f) > 1e-9f || !(r->samples_per_s > 0) || !isnan(r->test_loss);
            bad += fabs(r->epoch - (double)r->step / 12.0) > 1e-9;
        } else {
            eval++;
            bad += r->step != 10 * eval || r->eval_samples != 16 || !(r->test_loss > 0) || !(r->test_acc >= 0);
            bad += !isnan(r->train_loss) || !isnan(r->val_loss);
        }
    }
    CHECK_MSG(train == 6 && eval == 3 && bad == 0, "%d train records, %d evaluations, %d wrong fields", train, eval,
              bad);
}

/* The metrics file: 6 "step" and 3 "eval" lines beside the 3 epochs' records (the last cut short). */
static void check_metrics(const char *path) {
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[4096];
    int steps = 0, evals = 0, epochs = 0, bounded = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "{\"kind\": \"step\"")) steps += strstr(line, "\"grad_norm\": ") != NULL;
        else if (strstr(line, "{\"kind\": \"eval\"")) evals += strstr(line, "\"eval_samples\": 16,") != NULL;
        else epochs++, bounded += strstr(line, "\"eval_samples\": 16,") != NULL;
    }
    fclose(f);
    CHECK_MSG(steps == 6 && evals == 3 && epochs == 3 && bounded == 3,
              "%s: %d step, %d eval, %d epoch lines (%d bounded)", path, steps, evals, epochs, bounded);
}

static void test_step_reports(dt_dataset *tr, dt_dataset *te) {
    static seen s;
    memset(&s, 0, sizeof s);
    s.eval_in_order = true, s.eval_last = -1; /* 0, 1, 2, 0, 1, 2, ... */
    char metrics[] = "/tmp/dt_step_report_test_XXXXXX";
    int fd = mkstemp(metrics);
    CHECK(fd >= 0);
    close(fd);
    dt_train_config c = config(tr, te, &s);
    c.log_every = 5, c.eval_every = 10, c.eval_batches = 2, c.metrics = metrics;
    dt_trainer *t = NULL;
    CHECK_OK(dt_trainer_create(&t, &c));
    if (!t) return;
    CHECK_OK(dt_trainer_run(t));
    dt_trainer_destroy(t);
    check_progress(&s);
    check_records(&s);
    check_metrics(metrics);
    /* 5 evaluations of 2 batches (steps 10 and 20; the epochs' ends 12, 24 and 30): each reports
     * 0, 1 and 2 batches done */
    CHECK_MSG(s.eval_calls == 15 && s.eval_total == 2 && s.eval_last == 2 && s.eval_in_order,
              "%d evaluation progress calls (of %d batches, last %d)", s.eval_calls, s.eval_total, s.eval_last);
    unlink(metrics);
}

/* A logged step's gradient norm is the L2 norm of that step's gradient (the slab after a run of
 * one step, which the single strategy leaves in place), and logging does not clip: the same
 * parameters as a run without it. */
static void test_grad_norm(dt_dataset *tr, dt_dataset *te) {
    static seen s, s0;
    memset(&s, 0, sizeof s), memset(&s0, 0, sizeof s0);
    dt_train_config c = config(tr, te, &s), c0 = config(tr, te, &s0);
    c.max_steps = c0.max_steps = 1, c.log_every = 1;
    c.lr.base_lr = c0.lr.base_lr = 0.5f; /* large steps: a clip would show */
    dt_trainer *t = NULL, *t0 = NULL;
    CHECK_OK(dt_trainer_create(&t, &c));
    CHECK_OK(dt_trainer_create(&t0, &c0));
    if (!t || !t0) return;
    CHECK_OK(dt_trainer_run(t));
    CHECK_OK(dt_trainer_run(t0));
    dt_model *m = dt_trainer_model(t);
    const float *g = dt_model_grads(m);
    double ss = 0;
    for (size_t i = 0; i < dt_model_num_params(m); i++) ss += (double)g[i] * g[i];
    CHECK_MSG(s.nrec == 1 && s.rec[0].kind == DT_STEP_TRAIN && fabs(s.rec[0].grad_norm - sqrt(ss)) <= 1e-5 * sqrt(ss),
              "grad_norm %g, the slab's norm %g", s.nrec ? s.rec[0].grad_norm : -1.0, sqrt(ss));
    CHECK_MSG(s0.nrec == 0, "%d records without log_every", s0.nrec);
    CHECK(memcmp(dt_model_params(m), dt_model_params(dt_trainer_model(t0)), dt_model_num_params(m) * sizeof(float)) ==
          0);
    dt_trainer_destroy(t);
    dt_trainer_destroy(t0);
}

static void test_errors(dt_dataset *tr) {
    static seen s;
    dt_train_config c = config(tr, NULL, &s);
    c.eval_every = 10;
    dt_trainer *t = NULL;
    CHECK(dt_trainer_create(&t, &c) == DT_EINVAL && !t);
    CHECK_MSG(strstr(dt_last_error(), "`eval_every` 10: nothing to evaluate on") &&
                  strstr(dt_last_error(), "`val_split`"),
              "%s", dt_last_error());
    c.eval_every = 0, c.log_every = -1;
    CHECK(dt_trainer_create(&t, &c) == DT_EINVAL && !t);
    CHECK_MSG(strstr(dt_last_error(), "`log_every` -1") && strstr(dt_last_error(), "negative"), "%s", dt_last_error());
}

int main(void) {
    for (int i = 0; i < NS; i++) {
        g_y[i] = i % 3;
        for (int k = 0; k < NF; k++)
            g_x[i * NF + k] = (float)((i * 7 + k * 13) % 17) / 17.0f + (k == g_y[i] ? 0.5f : 0);
    }
    dt_dataset *tr = NULL, *te = NULL;
    CHECK_OK(dt_dataset_create(&tr, DT_F32, g_x, g_y, NS, 1, 1, NF, 0));
    CHECK_OK(dt_dataset_create(&te, DT_F32, g_x, g_y, NT, 1, 1, NF, 0));
    test_step_reports(tr, te);
    test_grad_norm(tr, te);
    test_errors(tr);
    dt_dataset_destroy(tr);
    dt_dataset_destroy(te);
    return dt_test_summary("step_report_test");
}
