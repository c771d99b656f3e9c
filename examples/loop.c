/* A custom training loop, for people who want their own (like tf.GradientTape): on N local
 * workers, each step is forward (dt_model_run), backward (dt_model_backward_loss), sync (an
 * allreduce averaging the gradient slab) and step (dt_optim_step). Each worker's loader takes its
 * block of the shared (seed, epoch) shuffle, so N workers x batch 64/N equal 1 worker x batch
 * 64: the program prints a checksum of the final parameters that matches across N (to rounding).
 * Usage: loop [N [STEPS [DATA]]].  Build: cc loop.c $(pkg-config --cflags --libs dtrain) */
#include <dtrain/dtrain.h>
#include <dtrain/launch.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int workers, steps;
    const char *data;
} job;

/* The steps: forward, backward, sync, step; prints a checksum of the final parameters. */
static dt_status run_steps(const job *j, dt_comm *comm, dt_model *m, dt_loader *l, dt_optim *o) {
    const int rank = dt_comm_rank(comm);
    float *p = dt_model_params(m), *g = dt_model_grads(m), loss = 0, mean = 0;
    const size_t n = dt_model_num_params(m);
    for (int step = 0; step < j->steps; step++) {
        dt_batch b;
        DT_TRY(dt_loader_next(l, &b));
        dt_feed f = {b.x, b.y, b.n};
        dt_model_zero_grad(m);
        DT_TRY(dt_model_run(m, &f, true, (uint64_t)step, &loss));            /* forward */
        DT_TRY(dt_model_backward_loss(m, 1.0f, NULL, NULL));                 /* backward */
        DT_TRY(dt_comm_allreduce(comm, g, g, n, DT_F32, DT_OP_AVG));         /* sync */
        dt_optim_step(o, p, g, 0.05f);                                       /* step */
        DT_TRY(dt_comm_allreduce(comm, &loss, &mean, 1, DT_F32, DT_OP_AVG)); /* the global batch's loss */
        if (rank == 0 && (step + 1) % 10 == 0) printf("step %d: loss %.4f\n", step + 1, mean);
    }
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) sum += p[i], sq += (double)p[i] * p[i];
    if (rank == 0) printf("workers=%d steps=%d param_sum=%.6f param_sq=%.6f\n", dt_comm_size(comm), j->steps, sum, sq);
    return DT_OK;
}

/* One worker: its data, the model (initialised alike on every rank: keyed by seed, not rank),
 * an SGD optimizer and a loader over its block of each global batch of 64. */
static dt_status train(dt_comm *comm, void *ctx) {
    const job *j = (const job *)ctx;
    dt_dataset *tr = NULL, *te = NULL;
    dt_model *m = NULL;
    dt_loader *l = NULL;
    dt_optim *o = NULL;
    int C, H, W;
    DT_TRY(dt_dataset_open(&tr, &te, j->data));
    dt_dataset_shape(tr, &C, &H, &W);
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_SGD);
    oc.momentum = 0.9f;
    dt_loader_config lc;
    memset(&lc, 0, sizeof lc);
    lc.batch = 64 / dt_comm_size(comm), lc.shuffle = true, lc.seed = 42;
    lc.rank = dt_comm_rank(comm), lc.world = dt_comm_size(comm);
    dt_status s = dt_model_create_from_spec(&m, "mlp", C, H, W);
    if (s == DT_OK) s = dt_loader_create(&l, tr, &lc);
    if (s == DT_OK) s = dt_optim_create(&o, &oc, dt_model_num_params(m));
    if (s == DT_OK) s = dt_loader_start_epoch(l, 0, 0);
    if (s == DT_OK) {
        dt_model_init(m, 42);
        s = run_steps(j, comm, m, l, o);
    }
    dt_optim_destroy(o);
    dt_loader_destroy(l);
    dt_model_destroy(m);
    dt_dataset_destroy(tr);
    dt_dataset_destroy(te);
    return s;
}

int main(int argc, char **argv) {
    job j = {argc > 1 ? atoi(argv[1]) : 2, argc > 2 ? atoi(argv[2]) : 50, argc > 3 ? argv[3] : "fashion-mnist"};
    if (j.workers < 1 || 64 % j.workers || j.steps < 1) {
        fprintf(stderr, "usage: loop [N [STEPS [DATA]]] with N dividing 64 and STEPS >= 1\n");
        return 2;
    }
    if (dt_launch_workers(j.workers, train, &j, 600) != DT_OK) {
        fprintf(stderr, "loop: %s\n", dt_last_error());
        return 1;
    }
    return 0;
}
