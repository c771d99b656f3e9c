/* A complete custom training loop in one process, the library's pieces used directly: open a data
 * set (train and test parts), build a model from its spec (dt_model_build returns it initialised),
 * make an optimizer and a shuffling loader, then per step: zero the gradients, forward with the
 * loss, backward, optimizer step; at the end evaluate on the test set with a loop of its own.
 * docs/library.md shows this file whole; tests/examples.sh runs it and checks that it learns.
 * Usage: custom_loop [STEPS [DATA [SPEC]]]  (defaults: 300, fashion-mnist, "linear(128) relu linear(10)")
 * Build: cc custom_loop.c $(pkg-config --cflags --libs dtrain) */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>

/* Test loss and accuracy of m on ds: forward passes without training, batches in order. */
static dt_status evaluate(dt_model *m, const dt_dataset *ds, float *loss, float *acc) {
    dt_loader *l = NULL;
    dt_loader_config lc = {.batch = 500, .world = 1}; /* no shuffle; every sample once */
    DT_TRY(dt_loader_create(&l, ds, &lc));
    dt_status s = dt_loader_start_epoch(l, 0, 0);
    double sum = 0;
    int64_t correct = 0, n = 0;
    dt_batch b;
    while (s == DT_OK && (s = dt_loader_next(l, &b)) == DT_OK) {
        dt_feed f = {b.x, b.y, b.n};
        float bl;
        if ((s = dt_model_run(m, &f, false, 0, &bl)) != DT_OK) break;
        sum += (double)bl * b.n;
        correct += dt_model_count_correct(m, b.y, b.n);
        n += b.n;
    }
    dt_loader_destroy(l);
    if (s != DT_ENOENT) return s; /* DT_ENOENT: the epoch ended */
    *loss = (float)(sum / (double)n), *acc = (float)correct / (float)n;
    return DT_OK;
}

/* steps of batch 64: zero grads, forward + loss, backward, Adam step; the loss every 100 steps. */
static dt_status train(dt_model *m, dt_optim *o, dt_loader *l, int steps) {
    float *p = dt_model_params(m), *g = dt_model_grads(m), loss = 0;
    uint64_t epoch = 0;
    DT_TRY(dt_loader_start_epoch(l, epoch, 0));
    for (int step = 0; step < steps; step++) {
        dt_batch b;
        dt_status s = dt_loader_next(l, &b);
        if (s == DT_ENOENT) { /* the epoch is over: start the next one (a new shuffle) */
            DT_TRY(dt_loader_start_epoch(l, ++epoch, 0));
            s = dt_loader_next(l, &b);
        }
        DT_TRY(s);
        dt_feed f = {b.x, b.y, b.n};
        dt_model_zero_grad(m);
        DT_TRY(dt_model_run(m, &f, true, (uint64_t)step, &loss)); /* forward, loss */
        DT_TRY(dt_model_backward_loss(m, 1.0f, NULL, NULL));      /* backward: grads accumulate */
        dt_optim_step(o, p, g, 1e-3f);                            /* update */
        if ((step + 1) % 100 == 0) printf("step %d: loss %.4f\n", step + 1, loss);
    }
    return DT_OK;
}

int main(int argc, char **argv) {
    const int steps = argc > 1 ? atoi(argv[1]) : 300;
    const char *data = argc > 2 ? argv[2] : "fashion-mnist", *spec = argc > 3 ? argv[3] : "linear(128) relu linear(10)";
    dt_dataset *tr = NULL, *te = NULL;
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_loader *l = NULL;
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
    dt_loader_config lc = {.batch = 64, .shuffle = true, .seed = 42, .world = 1};
    int C, H, W;
    float loss = 0, acc = 0;
    dt_status s = steps > 0 ? dt_dataset_open(&tr, &te, data) : dt_error(DT_EINVAL, "STEPS must be positive");
    if (s == DT_OK && !te) s = dt_error(DT_EINVAL, "--data %s has no test set to evaluate on", data);
    if (s == DT_OK) {
        dt_dataset_shape(tr, &C, &H, &W);
        s = dt_model_build(&m, spec, C, H, W); /* initialised (seed DT_MODEL_BUILD_SEED) */
    }
    if (s == DT_OK) s = dt_optim_create(&o, &oc, dt_model_num_params(m));
    if (s == DT_OK) s = dt_loader_create(&l, tr, &lc);
    if (s == DT_OK) s = train(m, o, l, steps);
    if (s == DT_OK) s = evaluate(m, te, &loss, &acc);
    if (s == DT_OK) printf("model %s: steps=%d test_loss=%.4f test_acc=%.4f\n", dt_model_spec(m), steps, loss, acc);
    else fprintf(stderr, "custom_loop: %s\n", dt_last_error());
    dt_loader_destroy(l);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    dt_dataset_destroy(te);
    dt_dataset_destroy(tr);
    return s == DT_OK ? 0 : 1;
}
