/* What `dtrain train` prints on rank 0 while it trains (train_progress.h). */
#include "cli/train_progress.h"

#include <math.h>
#include <stdio.h>
#include <string.h>


static void fmt_duration(char *buf, size_t cap, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%d:%02d", t / 60, t % 60);
}

void dt_train_print_progress(void *ctx, const dt_progress_info *p) {
    dt_train_progress *pc = ctx;
    if (pc->quiet) return;
    char eta[32];
    fmt_duration(eta, sizeof eta, p->eta_s);
    if (pc->tty) {
        enum { WIDTH = 28 };
        int fill = p->steps_per_epoch ? (int)(WIDTH * p->step_in_epoch / p->steps_per_epoch) : 0;
        char bar[WIDTH + 1];
        for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(stderr, "\r\033[Kepoch %d/%d [%s] %lld/%lld loss %.4f %.0f samples/s ETA %s", p->epoch + 1,
                p->epochs, bar, (long long)p->step_in_epoch, (long long)p->steps_per_epoch, p->loss,
                p->samples_per_s, eta);
        fflush(stderr);
    } else if (p->step_in_epoch < p->steps_per_epoch) {
        /* plain lines for logs: at most one every few seconds */
        static double last;
        if (p->elapsed_s - last < 5.0 && last <= p->elapsed_s) return;
        last = p->elapsed_s;
        fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f %.0f samples/s ETA %s\n", p->epoch + 1, p->epochs,
                (long long)p->step_in_epoch, (long long)p->steps_per_epoch, p->loss, p->samples_per_s, eta);
    }
}

void dt_train_print_epoch(void *ctx, const dt_epoch_info *e) {
    dt_train_progress *pc = ctx;
    pc->last = *e;
    if (pc->tty && !pc->quiet) fprintf(stderr, "\r\033[K");
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
    char test[64] = " (no test set)";  /* not "nan": there is nothing to evaluate */
    if (!isnan(e->test_loss)) snprintf(test, sizeof test, " test_loss %.4f test_acc %.4f", e->test_loss, e->test_acc);
    printf("epoch %d/%d%s: train_loss %.4f%s%s%s %.0f samples/s (%.1fs)\n", e->epoch, pc->epochs, part,
           e->train_loss, over, val, test, e->samples_per_s, e->epoch_s);
    fflush(stdout);
    if (pc->tb) dt_tb_writer_epoch(pc->tb, e);  /* an error is kept and reported at the end */
    const double step = e->steps > 0 ? e->epoch_s / (double)e->steps : 0, p = pc->predicted_step_s;
    if (p > 0 && step > 0)
        printf("dtrain: step time %.3f ms against the planner's %.3f ms (%+.0f%%)%s\n", step * 1e3, p * 1e3,
               100 * (step / p - 1), fabs(step / p - 1) > 0.25 ? ": more than 25% off the prediction; the cluster's "
               "figures may be stale (dtrain plan --probe) or the machine busy" : "");
}

void dt_train_print_note(void *ctx, const char *msg) {
    (void)ctx;
    printf("dtrain: %s\n", msg);
    fflush(stdout);
}

