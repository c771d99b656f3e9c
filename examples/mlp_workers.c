/* The reference MLP on N local workers through the library: dt_launch_workers forks N worker
 * processes with a shared-memory communicator each; every worker creates the trainer with it,
 * trains (data parallel, gradients averaged) and evaluates (a collective: all workers call it).
 * --batch is per worker, so N workers x batch 32/N train like one worker with batch 32.
 * Usage: mlp_workers [N [DATA]]; DTRAIN_EXAMPLE_STEPS=N stops after N steps.
 * Build: cc mlp_workers.c $(pkg-config --cflags --libs dtrain) */
#include <dtrain/dtrain.h>
#include <dtrain/launch.h>

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    int workers;
    const char *data;
} job;

static dt_status worker(dt_comm *comm, void *ctx) {
    const job *j = ctx;
    dt_train_config cfg;
    DT_TRY(dt_train_config_init(&cfg)); /* the defaults, with this header's layout */
    cfg.data = j->data;
    cfg.epochs = 2;
    cfg.batch = 32 / j->workers; /* global batch 32 */
    cfg.comm = comm;
    const char *steps = getenv("DTRAIN_EXAMPLE_STEPS");
    if (steps) cfg.max_steps = atoll(steps);
    dt_trainer *t = NULL;
    float loss, acc;
    DT_TRY(dt_trainer_create(&t, &cfg));
    dt_status s = dt_trainer_run(t);
    if (s == DT_OK) s = dt_trainer_evaluate(t, &loss, &acc); /* every rank calls it */
    if (s == DT_OK && dt_comm_rank(comm) == 0)
        printf("workers=%d test_loss=%.6f test_acc=%.4f steps=%lld\n", dt_comm_size(comm), loss, acc,
               (long long)dt_trainer_step(t));
    dt_trainer_destroy(t);
    return s;
}

int main(int argc, char **argv) {
    job j = {.workers = argc > 1 ? atoi(argv[1]) : 2, .data = argc > 2 ? argv[2] : "fashion-mnist"};
    if (j.workers < 1 || 32 % j.workers) {
        fprintf(stderr, "mlp_workers: N must divide the global batch 32 (1, 2, 4, 8, 16 or 32)\n");
        return 2;
    }
    if (dt_launch_workers(j.workers, worker, &j, 600) != DT_OK) {
        fprintf(stderr, "mlp_workers: %s\n", dt_last_error());
        return 1;
    }
    return 0;
}
