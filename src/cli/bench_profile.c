/* Per-node timing of `dtrain bench train --profile` (bench_profile.h): node hooks read the clock
 * (this thread's CPU time) before and after each forward and backward; the table sums them per
 * step. */
#include "cli/bench_profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct dt_bench_profile {
    int n;
    bool on;
    double t0, optim;
    double *fwd, *bwd; /* seconds summed per node */
};

/* CPU seconds of this thread (the kernels run on it at --threads 1): steadier than wall time on a
 * loaded machine. */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void before(void *ctx, int node) {
    (void)node;
    ((dt_bench_profile *)ctx)->t0 = now();
}

static void after_fwd(void *ctx, int node) {
    dt_bench_profile *p = ctx;
    if (p->on) p->fwd[node] += now() - p->t0;
}

static void after_bwd(void *ctx, int node) {
    dt_bench_profile *p = ctx;
    if (p->on) p->bwd[node] += now() - p->t0;
}

dt_bench_profile *dt_bench_profile_attach(dt_model *m) {
    dt_bench_profile *p = calloc(1, sizeof *p);
    const int n = dt_model_num_nodes(m);
    if (!p || !(p->fwd = calloc((size_t)n, sizeof(double))) || !(p->bwd = calloc((size_t)n, sizeof(double)))) {
        if (p) free(p->fwd), free(p);
        return NULL;
    }
    p->n = n;
    dt_model_set_node_hooks(m, before, after_bwd, p);
    dt_model_set_after_forward_hook(m, after_fwd, p);
    dt_model_set_backward_hook(m, before);
    return p;
}

void dt_bench_profile_enable(dt_bench_profile *p, bool on) { p->on = on; }

void dt_bench_profile_optim(dt_bench_profile *p, bool start) {
    if (start) p->t0 = now();
    else if (p->on) p->optim += now() - p->t0;
}

void dt_bench_profile_print(dt_bench_profile *p, dt_model *m, int64_t steps, double step_s) {
    /* step_s: CPU seconds per step */
    const double k = 1e3 / (double)(steps > 0 ? steps : 1), step_ms = step_s * 1e3;
    double sum = p->optim * k;
    printf("#   %-28s %9s %9s %7s\n", "node (cpu ms per step)", "forward", "backward", "share");
    for (int i = 0; i < p->n; i++) {
        const double f = p->fwd[i] * k, b = p->bwd[i] * k;
        if (f + b < 1e-3) continue;
        sum += f + b;
        char name[48];
        snprintf(name, sizeof name, "%s %s", dt_model_node_name(m, i), dt_layer_name(dt_model_node_kind(m, i)));
        printf("#   %-28.28s %9.3f %9.3f %6.1f%%\n", name, f, b, 100 * (f + b) / step_ms);
    }
    printf("#   %-28s %9.3f %9s %6.1f%%\n", "optimizer", p->optim * k, "", 100 * p->optim * k / step_ms);
    printf("#   %-28s %9.3f of %.3f ms per step (the rest: loss scaling, zeroing, the loop)\n", "sum", sum, step_ms);
    dt_model_set_node_hooks(m, NULL, NULL, NULL);
    dt_model_set_after_forward_hook(m, NULL, NULL);
    dt_model_set_backward_hook(m, NULL);
    free(p->fwd), free(p->bwd), free(p);
}
