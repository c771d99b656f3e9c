/* The reference example through the library: an MLP 784-128-10 trained with Adam (lr 1e-3,
 * batch 32) for 2 epochs on Fashion-MNIST, then evaluated on the test set. The same run as
 * `dtrain train --data fashion-mnist --model mlp --epochs 2 --batch 32 --optimizer adam --lr 0.001`.
 * DTRAIN_EXAMPLE_STEPS=N stops after N steps (make test uses it to stay fast).
 * Build: cc mlp.c $(pkg-config --cflags --libs dtrain) */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>

static void on_epoch(void *ctx, const dt_epoch_info *e) {
    (void)ctx;
    printf("epoch %d: train loss %.4f, test loss %.4f, test acc %.4f\n", e->epoch, e->train_loss, e->test_loss,
           e->test_acc);
}

int main(int argc, char **argv) {
    dt_train_config cfg; /* the defaults: mlp, adam 1e-3, batch 32, seed 42; this header's layout */
    if (dt_train_config_init(&cfg) != DT_OK) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    cfg.data = argc > 1 ? argv[1] : "fashion-mnist";
    cfg.epochs = 2;
    const char *steps = getenv("DTRAIN_EXAMPLE_STEPS");
    if (steps) cfg.max_steps = atoll(steps);
    cfg.on_epoch = on_epoch;

    dt_trainer *t = NULL;
    float loss, acc;
    if (dt_trainer_create(&t, &cfg) != DT_OK || dt_trainer_run(t) != DT_OK ||
        dt_trainer_evaluate(t, &loss, &acc) != DT_OK) {
        fprintf(stderr, "mlp: %s\n", dt_last_error());
        dt_trainer_destroy(t);
        return 1;
    }
    printf("test_loss=%.6f test_acc=%.4f steps=%lld\n", loss, acc, (long long)dt_trainer_step(t));
    dt_trainer_destroy(t);
    return 0;
}
