/* Uneven workers in the step loop (see balance.h): the --slow sleep, the speed-proportional cut
 * of the global batch (--balance dynamic) and the per-worker epoch figures. */
#include "run/balance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define FIRST_CUT 3 /* steps before the first re-cut (the first step warms caches up) */
#define DEFAULT_INTERVAL 8
#define QUANTUM_LEVELS 16 /* a rank's share moves in steps of about batch / 16 samples */
#define MIN_GAIN 0.05     /* a re-cut must shorten the predicted step by more than this */
#define MIN_WINDOW_S 0.05 /* re-cuts at least this far apart (predicted), so short steps amortise them */
#define MAX_INTERVAL 4096

struct dt_balance {
    dt_balance_config cfg;
    int *cut;        /* [world] */
    double *gather;  /* [world] allgather buffer */
    int64_t steps;   /* steps seen */
    int64_t due;     /* the step count of the next re-cut (the same on every rank) */
    double win_time; /* compute (+ sleep) since the last re-cut, excluding step 1 */
    int64_t win_n;
    double tps;         /* smoothed seconds per sample; 0 = unknown */
    int64_t ep_samples; /* since the last dt_balance_epoch */
    double ep_busy;
    double nap_debt; /* slow rank: seconds slept beyond the naps asked for, not yet paid off */
};

dt_status dt_balance_create(dt_balance **out, const dt_balance_config *cfg) {
    *out = NULL;
    if (cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world || cfg->batch < 1)
        return dt_error(DT_EINVAL, "balance: rank %d of %d with batch %d", cfg->rank, cfg->world, cfg->batch);
    dt_balance *b = calloc(1, sizeof *b);
    if (!b) return dt_error(DT_ENOMEM, "balance: out of memory");
    b->cfg = *cfg;
    if (b->cfg.interval <= 0) b->cfg.interval = DEFAULT_INTERVAL;
    b->cut = malloc((size_t)cfg->world * sizeof *b->cut);
    b->gather = malloc((size_t)cfg->world * sizeof *b->gather);
    if (!b->cut || !b->gather) {
        dt_balance_destroy(b);
        return dt_error(DT_ENOMEM, "balance: out of memory");
    }
    for (int r = 0; r < cfg->world; r++) b->cut[r] = cfg->batch;
    b->due = FIRST_CUT;
    /* the straggler's naps are short (a few times the compute of one step): no 50 us timer slack */
    if (cfg->slow > 1) prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    *out = b;
    return DT_OK;
}

void dt_balance_destroy(dt_balance *b) {
    if (!b) return;
    free(b->cut);
    free(b->gather);
    free(b);
}

/* The default nap: nanosleep, timed (its wake-up latency counts). */
static double sleep_s(void *ctx, double s) {
    (void)ctx;
    if (!(s > 0)) return 0;
    const double t0 = dt_now();
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {}
    return dt_now() - t0;
}

double dt_balance_compute_done(dt_balance *b, int n, double compute_s) {
    double nap = 0;
    if (b->cfg.slow > 1) {
        const double want = (b->cfg.slow - 1) * compute_s, ask = want - b->nap_debt;
        nap = ask > 0 ? (b->cfg.nap ? b->cfg.nap(b->cfg.nap_ctx, ask) : sleep_s(NULL, ask)) : 0;
        b->nap_debt += nap - want; /* negative: the nap fell short (rare): the next one is longer */
    }
    b->steps++;
    b->ep_samples += n;
    b->ep_busy += compute_s + nap;
    if (b->steps > 1) b->win_time += compute_s + nap, b->win_n += n;
    return nap;
}

void dt_balance_cut_by_speed(int *counts, const double *speeds, int world, int G) {
    double total = 0;
    for (int r = 0; r < world; r++) total += speeds[r];
    int sum = 0;
    const int floor_min = G >= world ? 1 : 0;
    for (int r = 0; r < world; r++) {
        double ideal = total > 0 ? G * speeds[r] / total : (double)G / world;
        counts[r] = (int)floor(ideal);
        if (counts[r] < floor_min) counts[r] = floor_min;
        sum += counts[r];
    }
    /* largest remainder: add to the ranks furthest below their ideal, take from those above */
    while (sum != G) {
        int best = -1;
        double gap = 0;
        for (int r = 0; r < world; r++) {
            double ideal = total > 0 ? G * speeds[r] / total : (double)G / world;
            double d = sum < G ? ideal - counts[r] : counts[r] - ideal;
            if (sum > G && counts[r] <= floor_min) continue;
            if (best < 0 || d > gap) best = r, gap = d;
        }
        counts[best] += sum < G ? 1 : -1;
        sum += sum < G ? 1 : -1;
    }
}

int dt_balance_quantum(int batch) {
    int q = batch / QUANTUM_LEVELS;
    while (q > 1 && batch % q != 0) q--;
    return q > 1 ? q : 1;
}

/* The step time a cut predicts from seconds per sample tps[] (the slowest rank's). */
static double predicted_step(const int *cut, const double *tps, int world) {
    double t = 0;
    for (int r = 0; r < world; r++) t = cut[r] * tps[r] > t ? cut[r] * tps[r] : t;
    return t;
}

void dt_balance_cut_quantised(int *counts, const double *speeds, int world, int G, int q) {
    const int Q = G / q, floor_min = Q >= world ? 1 : 0;
    double total = 0;
    for (int r = 0; r < world; r++) total += speeds[r];
    int sum = 0;
    for (int r = 0; r < world; r++) {
        counts[r] = (int)floor(total > 0 ? Q * speeds[r] / total : (double)Q / world);
        if (counts[r] < floor_min) counts[r] = floor_min;
        sum += counts[r];
    }
    /* minimax: each quantum left goes where it lengthens that rank's step least; a surplus (from
     * the one-quantum floors) comes off the rank whose step is longest */
    while (sum != Q) {
        int best = -1;
        double key = 0;
        for (int r = 0; r < world; r++) {
            if (sum > Q && counts[r] <= floor_min) continue;
            double t = (counts[r] + (sum < Q ? 1 : 0)) / speeds[r];
            if (best < 0 || (sum < Q ? t < key : t > key)) best = r, key = t;
        }
        counts[best] += sum < Q ? 1 : -1;
        sum += sum < Q ? 1 : -1;
    }
    for (int r = 0; r < world; r++) counts[r] *= q;
}

/* Steps to the next re-cut: the configured interval, or more where the predicted step (from the
 * gathered times, the same on every rank) is so short that the interval would last less than
 * MIN_WINDOW_S: a tiny model's steps then amortise the allgather and measure a longer window. */
static int64_t next_interval(const dt_balance *b) {
    const double step = predicted_step(b->cut, b->gather, b->cfg.world);
    double n = step > 0 ? ceil(MIN_WINDOW_S / step) : b->cfg.interval;
    if (n < b->cfg.interval) n = b->cfg.interval;
    return n > MAX_INTERVAL ? MAX_INTERVAL : (int64_t)n;
}

dt_status dt_balance_step_end(dt_balance *b, dt_comm *comm, dt_loader *l) {
    const int W = b->cfg.world;
    if (!b->cfg.dynamic || !comm || W < 2 || b->steps < b->due) return DT_OK;
    if (b->win_n > 0) {
        double now = b->win_time / (double)b->win_n;
        b->tps = b->tps > 0 ? 0.5 * b->tps + 0.5 * now : now;
    }
    b->win_time = 0, b->win_n = 0;
    b->due = b->steps + b->cfg.interval;
    double mine = b->tps;
    DT_TRY(dt_comm_allgather(comm, &mine, b->gather, 1, DT_F64));
    /* a rank that has not measured yet (no samples) keeps its share */
    for (int r = 0; r < W; r++)
        if (!(b->gather[r] > 0)) return DT_OK;
    int *next = malloc((size_t)W * sizeof *next);
    double *speed = malloc((size_t)W * sizeof *speed);
    if (!next || !speed) {
        free(next), free(speed);
        return dt_error(DT_ENOMEM, "balance: out of memory");
    }
    for (int r = 0; r < W; r++) speed[r] = 1.0 / b->gather[r];
    dt_balance_cut_quantised(next, speed, W, b->cfg.batch * W, dt_balance_quantum(b->cfg.batch));
    /* re-cut only where it pays: the predicted step time falls by more than MIN_GAIN. A re-cut
     * makes the loader rebuild the batches it prefetched, and a batch size not seen before
     * creates the kernels' primitives for it (the CNN's first step at a new size: 2-5 steps'
     * time); the quanta keep the sizes few, so that they recur */
    dt_status s = DT_OK;
    if (predicted_step(next, b->gather, W) < (1.0 - MIN_GAIN) * predicted_step(b->cut, b->gather, W)) {
        memcpy(b->cut, next, (size_t)W * sizeof *next);
        s = dt_loader_set_cut(l, b->cut);
    }
    b->due = b->steps + next_interval(b);
    free(next), free(speed);
    return s;
}

const int *dt_balance_cut(const dt_balance *b) { return b->cut; }

dt_status dt_balance_epoch(dt_balance *b, dt_comm *comm, double epoch_s, dt_worker_info *out) {
    const int W = comm ? b->cfg.world : 1;
    double mine[3] = {(double)b->ep_samples, b->ep_busy, (double)b->cut[b->cfg.rank]};
    double *all = malloc(sizeof mine * (size_t)W);
    if (!all) return dt_error(DT_ENOMEM, "balance: out of memory");
    dt_status s = comm ? dt_comm_allgather(comm, mine, all, 3, DT_F64) : DT_OK;
    if (!comm) memcpy(all, mine, sizeof mine);
    if (s == DT_OK) {
        double total = 0;
        for (int r = 0; r < W; r++) total += all[3 * r];
        for (int r = 0; r < W; r++)
            out[r] = (dt_worker_info){.rank = b->cfg.job_rank0 + (comm ? r : b->cfg.rank),
                                      .samples = (int64_t)all[3 * r],
                                      .share = total > 0 ? all[3 * r] / total : 0,
                                      .samples_per_s = epoch_s > 0 ? all[3 * r] / epoch_s : 0,
                                      .busy_s = all[3 * r + 1],
                                      .batch = (int)all[3 * r + 2],
                                      .alive = true};
    }
    free(all);
    b->ep_samples = 0, b->ep_busy = 0;
    return s;
}

void dt_balance_write_json(FILE *f, const dt_epoch_info *e) {
    if (e->nworkers <= 0 || !e->workers) return;
    fprintf(f, ", \"workers\": [");
    for (int i = 0; i < e->nworkers; i++) {
        const dt_worker_info *w = &e->workers[i];
        fprintf(f,
                "%s{\"rank\": %d, \"samples\": %lld, \"share\": %.4f, \"samples_per_s\": %.1f, \"busy_s\": %.3f, "
                "\"batch\": %d, \"alive\": %s}",
                i ? ", " : "", w->rank, (long long)w->samples, w->share, w->samples_per_s, w->busy_s, w->batch,
                w->alive ? "true" : "false");
    }
    fprintf(f, "]");
    if (!e->staleness) return;
    int64_t n = 0, top = 0;
    double sum = 0;
    fprintf(f, ", \"staleness\": {\"hist\": [");
    for (int k = 0; k < DT_STALENESS_BINS; k++) {
        fprintf(f, "%s%lld", k ? ", " : "", (long long)e->staleness[k]);
        n += e->staleness[k];
        sum += (double)k * (double)e->staleness[k];
        if (e->staleness[k]) top = k;
    }
    fprintf(f, "], \"mean\": %.3f, \"max\": %lld%s}, \"max_clock_gap\": %d", n ? sum / (double)n : 0.0, (long long)top,
            top == DT_STALENESS_BINS - 1 ? ", \"max_is_lower_bound\": true" : "", e->max_clock_gap);
}
