/* What `dtrain train` prints on rank 0 while it trains (train_progress.h). */
#include "cli/train_progress.h"
#include "cli/cli.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void fmt_duration(char *buf, size_t cap, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%d:%02d", t / 60, t % 60);
}

/* Seconds of a monotonic clock (plain progress lines are rate-limited by it). */
static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A bar of WIDTH cells, done of total filled. */
enum { WIDTH = 28 };
static void fill_bar(char bar[WIDTH + 1], int64_t done, int64_t total) {
    int fill = total > 0 ? (int)(WIDTH * (done < total ? done : total) / total) : 0;
    for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = '\0';
}

/* An evaluation's progress: a bar of its batches (tty), else a line at most every 5 s. */
static void print_eval_progress(dt_train_progress *pc, const dt_progress_info *p) {
    if (pc->tty) {
        char bar[WIDTH + 1];
        fill_bar(bar, p->eval_batch, p->eval_batches);
        fprintf(stderr, "\r\033[Kevaluating (%s set) after step %lld [%s] %lld/%lld batches", p->eval_set,
                (long long)p->global_step, bar, (long long)p->eval_batch, (long long)p->eval_batches);
        fflush(stderr);
        pc->bar_shown = true;
        return;
    }
    const double now = mono_s();
    if (p->eval_batch == 0 || p->eval_batch >= p->eval_batches || now - pc->last_line < 5.0) return;
    pc->last_line = now;
    fprintf(stderr, "evaluating (%s set) after step %lld: batch %lld/%lld\n", p->eval_set, (long long)p->global_step,
            (long long)p->eval_batch, (long long)p->eval_batches);
}

void dt_train_print_progress(void *ctx, const dt_progress_info *p) {
    dt_train_progress *pc = ctx;
    if (pc->quiet) return;
    if (p->eval_set) {
        print_eval_progress(pc, p);
        return;
    }
    /* the bar ends where this epoch's training does: its last step, or --max-steps inside it */
    const int64_t end = p->epoch_steps > 0 ? p->epoch_steps : p->steps_per_epoch;
    char eta[32], run[64] = "";
    fmt_duration(eta, sizeof eta, p->eta_s);
    if (p->total_steps > 0 && p->total_steps - p->global_step > end - p->step_in_epoch) { /* epochs follow */
        char reta[32];
        fmt_duration(reta, sizeof reta, p->run_eta_s);
        snprintf(run, sizeof run, " (run: step %lld/%lld, ETA %s)", (long long)p->global_step,
                 (long long)p->total_steps, reta);
    }
    if (pc->tty) {
        char bar[WIDTH + 1];
        fill_bar(bar, p->step_in_epoch, end);
        fprintf(stderr, "\r\033[Kepoch %d/%d [%s] %lld/%lld loss %.4f %.0f samples/s ETA %s%s", p->epoch + 1, p->epochs,
                bar, (long long)p->step_in_epoch, (long long)end, p->loss, p->samples_per_s, eta, run);
        fflush(stderr);
        pc->bar_shown = true;
        return;
    }
    /* plain lines for logs: at most one every few seconds */
    const double now = mono_s();
    if (p->step_in_epoch >= end || now - pc->last_line < 5.0) return;
    pc->last_line = now;
    fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f %.0f samples/s ETA %s%s\n", p->epoch + 1, p->epochs,
            (long long)p->step_in_epoch, (long long)end, p->loss, p->samples_per_s, eta, run);
}

/* Clears the bar (tty) before a line goes to stdout. */
static void clear_bar(dt_train_progress *pc) {
    if (!pc->tty || pc->quiet || !pc->bar_shown) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    pc->bar_shown = false;
}

void dt_train_print_step(void *ctx, const dt_step_info *s) {
    dt_train_progress *pc = ctx;
    if (pc->tb) dt_tb_writer_step(pc->tb, s); /* an error is kept and reported at the end */
    /* an epoch's end on an --eval-every step: the epoch's line just said it */
    const bool said = s->kind == DT_STEP_EVAL && pc->last.epoch > 0 && pc->last.global_step == s->step;
    if (pc->quiet || said) return;
    clear_bar(pc);
    if (s->kind == DT_STEP_TRAIN) {
        char gn[32] = "";
        if (!isnan(s->grad_norm)) snprintf(gn, sizeof gn, " grad_norm %.4g", s->grad_norm);
        printf("step %lld (epoch %.4g): train_loss %.4f lr %.4g%s %.0f samples/s\n", (long long)s->step, s->epoch,
               s->train_loss, s->lr, gn, s->samples_per_s);
    } else {
        char test[64] = "", val[64] = "";
        if (!isnan(s->test_loss))
            snprintf(test, sizeof test, " test_loss %.4f test_acc %.4f", s->test_loss, s->test_acc);
        if (!isnan(s->val_loss)) snprintf(val, sizeof val, " val_loss %.4f val_acc %.4f", s->val_loss, s->val_acc);
        printf("step %lld (epoch %.4g): eval%s%s (%lld samples, %.1fs)\n", (long long)s->step, s->epoch, test, val,
               (long long)s->eval_samples, s->eval_s);
    }
    fflush(stdout);
}

void dt_train_print_epoch(void *ctx, const dt_epoch_info *e) {
    dt_train_progress *pc = ctx;
    pc->last = *e;
    clear_bar(pc);
    /* say so when the epoch was cut short (--max-steps) or its loss covers only part of it (resumed) */
    char part[64] = "", over[96] = "";
    if (e->steps_per_epoch > 0 && e->epoch_steps < e->steps_per_epoch)
        snprintf(part, sizeof part, " (%lld of %lld steps)", (long long)e->epoch_steps, (long long)e->steps_per_epoch);
    if (e->steps_per_epoch > 0 && e->steps < e->epoch_steps)
        snprintf(over, sizeof over, " (over its last %lld steps, since the resume)", (long long)e->steps);
    char val[96] = "";
    if (!isnan(e->val_loss) && e->best_epoch > 0) /* --val-split */
        snprintf(val, sizeof val, " val_loss %.4f val_acc %.4f%s", e->val_loss, e->val_acc,
                 e->best_epoch == e->epoch ? " (best)" : "");
    char test[64] = " (no test set)"; /* not "nan": there is nothing to evaluate */
    if (!isnan(e->test_loss)) snprintf(test, sizeof test, " test_loss %.4f test_acc %.4f", e->test_loss, e->test_acc);
    char bounded[64] = ""; /* --eval-batches */
    if (e->eval_samples > 0 && pc->eval_batches > 0)
        snprintf(bounded, sizeof bounded, " (evaluated on %lld samples)", (long long)e->eval_samples);
    printf("epoch %d/%d%s: train_loss %.4f%s%s%s%s %.0f samples/s (%.1fs)\n", e->epoch, pc->epochs, part, e->train_loss,
           over, val, test, bounded, e->samples_per_s, e->epoch_s);
    fflush(stdout);
    if (pc->tb) dt_tb_writer_epoch(pc->tb, e); /* an error is kept and reported at the end */
    const double step = e->steps > 0 ? e->epoch_s / (double)e->steps : 0, p = pc->predicted_step_s;
    if (p > 0 && step > 0)
        printf("dtrain: step time %.3f ms against the planner's %.3f ms (%+.0f%%)%s\n", step * 1e3, p * 1e3,
               100 * (step / p - 1),
               fabs(step / p - 1) > 0.25 ? ": more than 25% off the prediction; the cluster's "
                                           "figures may be stale (dtrain plan --probe) or the machine busy"
                                         : "");
}

void dt_train_print_note(void *ctx, const char *msg) {
    (void)ctx;
    char out[4096];
    dt_cli_flag_terms(msg, out, sizeof out);
    printf("dtrain: %s\n", out);
    fflush(stdout);
}
