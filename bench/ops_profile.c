/* Where a training step's time goes, node by node: the thread CPU time of each node's forward and
 * backward (the graph's node hooks, so the library pays nothing when no profiler is attached),
 * zero_grad and the optimizer step, averaged over the steps after 3 warm-up ones, for a model
 * spec (default "cnn") on 1x28x28 synthetic inputs at a batch (default 128), Adam, the default
 * kernels (oneDNN where built). CPU time, not wall time, so waiting for a core on a loaded machine
 * is not counted (memory stalls and a busy sibling core still are: compare runs made together).
 *   make && cc -O2 -Iinclude bench/ops_profile.c build/libdtrain.a $(LDLIBS) -o build/ops_profile
 *   build/ops_profile [spec] [steps] [batch] */
#define _POSIX_C_SOURCE 199309L
#include "dtrain/dtrain.h"
#include "dtrain/models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_NODES = 256 };

static double fwd[MAX_NODES], bwd[MAX_NODES], t0f[MAX_NODES], t0b[MAX_NODES];

static double thread_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void before_fwd(void *c, int i) { (void)c, t0f[i] = thread_s(); }
static void after_fwd(void *c, int i) { (void)c, fwd[i] += thread_s() - t0f[i]; }
static void before_bwd(void *c, int i) { (void)c, t0b[i] = thread_s(); }
static void after_bwd(void *c, int i) { (void)c, bwd[i] += thread_s() - t0b[i]; }

int main(int argc, char **argv) {
    const char *spec = argc > 1 ? argv[1] : "cnn";
    const int steps = argc > 2 ? atoi(argv[2]) : 30, B = argc > 3 ? atoi(argv[3]) : 128;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    if (steps <= 0 || B <= 0 || dt_model_build(&m, spec, 1, 28, 28) != DT_OK || dt_model_num_nodes(m) > MAX_NODES) {
        fprintf(stderr, "ops_profile: %s\n", m ? "too many nodes" : dt_last_error());
        return 1;
    }
    dt_model_init(m, 1);
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
    const int in = dt_model_in_size(m), V = dt_model_classes(m);
    float *x = malloc((size_t)B * in * sizeof(float));
    int32_t *y = malloc((size_t)B * sizeof(int32_t));
    if (!x || !y || dt_optim_create(&o, &oc, dt_model_num_params(m)) != DT_OK) return 1;
    dt_rng_fill_uniform(x, (size_t)B * in, 0, 1, 7, 1);
    for (int i = 0; i < B; i++) y[i] = i % V;
    dt_model_set_node_hooks(m, before_fwd, after_bwd, NULL);
    dt_model_set_after_forward_hook(m, after_fwd, NULL);
    dt_model_set_backward_hook(m, before_bwd);
    double zero = 0, opt = 0, total = 0;
    for (int it = 0; it < steps + 3; it++) {
        if (it == 3) memset(fwd, 0, sizeof fwd), memset(bwd, 0, sizeof bwd), zero = opt = 0, total = thread_s();
        dt_feed f = {.x = x, .y = y, .n = B};
        float loss;
        if (dt_model_run(m, &f, true, (uint64_t)it, &loss) != DT_OK) return fprintf(stderr, "%s\n", dt_last_error()), 1;
        double t = thread_s();
        dt_model_zero_grad(m);
        zero += thread_s() - t;
        if (dt_model_backward_loss(m, 1.0f, NULL, NULL) != DT_OK) return fprintf(stderr, "%s\n", dt_last_error()), 1;
        t = thread_s();
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 1e-3f);
        opt += thread_s() - t;
    }
    total = thread_s() - total;
    printf("%-4s %-10s %-10s %10s %10s\n", "node", "name", "kind", "fwd ms", "bwd ms");
    for (int i = 0; i < dt_model_num_nodes(m); i++)
        if (fwd[i] + bwd[i] > 0.5e-6 * steps)
            printf("%-4d %-10.10s %-10.10s %10.3f %10.3f%s\n", i, dt_model_node_name(m, i),
                   dt_layer_name(dt_model_node_kind(m, i)), 1e3 * fwd[i] / steps,
                   1e3 * bwd[i] / steps, dt_model_node_fused(m, i) ? "  (with the maxpool after it)" : "");
    printf("zero_grad %.3f ms, optimizer %.3f ms; step %.3f ms: %.0f samples per CPU-second\n", 1e3 * zero / steps,
           1e3 * opt / steps, 1e3 * total / steps, (double)B * steps / total);
    dt_optim_free(o);
    dt_model_free(m);
    free(x), free(y);
    return 0;
}
