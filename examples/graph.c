/* A custom model built through the graph API, trained on an in-memory data set: a residual MLP
 * (x -> linear -> tanh -> linear -> + x-branch -> tanh -> linear(3), softmax cross-entropy) on
 * three interleaved spirals of 2-d points made here with dt_dataset_create. It trains with a
 * loader and an optimizer directly and prints the loss and the training accuracy.
 * Build: cc graph.c $(pkg-config --cflags --libs dtrain) -lm */
#include <dtrain/dtrain.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define N 600 /* points, 200 per spiral */
#define HID 32

static int build(dt_model **out) {
    dt_model *m = NULL;
    DT_TRY(dt_graph_create(&m));
    const int two = 2;
    int x = dt_graph_input(m, "x", DT_F32, 1, &two);
    int y = dt_graph_input(m, "y", DT_I32, 0, NULL);
    dt_layer_spec lin = dt_layer_default(DT_LAYER_LINEAR), act = dt_layer_default(DT_LAYER_TANH);
    lin.out = HID;
    int h1 = dt_graph_node(m, "in", &lin, -1, &x, 1);
    h1 = dt_graph_node(m, "act1", &act, -1, &h1, 1);
    int h2 = dt_graph_node(m, "hidden", &lin, -1, &h1, 1);
    dt_layer_spec add = dt_layer_default(DT_LAYER_ADD);
    int res[2] = {h1, h2};
    int h = dt_graph_node(m, "residual", &add, -1, res, 2); /* h1 feeds two nodes */
    h = dt_graph_node(m, "act2", &act, -1, &h, 1);
    lin.out = 3;
    int logits = dt_graph_node(m, "head", &lin, -1, &h, 1);
    dt_layer_spec xe = dt_layer_default(DT_LAYER_XENT);
    int in2[2] = {logits, y};
    int loss = dt_graph_node(m, "loss", &xe, -1, in2, 2);
    dt_status s = dt_graph_finish(m, logits, loss, "residual-mlp");
    if (s != DT_OK) {
        dt_model_destroy(m);
        return s;
    }
    *out = m;
    return DT_OK;
}

int main(void) {
    static float x[N * 2];
    static int32_t y[N];
    for (int i = 0; i < N; i++) { /* spiral k: radius r, angle 4r + 2 pi k / 3 */
        int k = i % 3;
        float r = (float)(i / 3) / (N / 3), a = 4.0f * r + 2.0944f * k;
        x[2 * i] = r * cosf(a), x[2 * i + 1] = r * sinf(a), y[i] = k;
    }
    dt_dataset *ds = NULL;
    dt_model *m = NULL;
    dt_loader *l = NULL;
    dt_optim *o = NULL;
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
    dt_loader_config lc = {.batch = 30, .shuffle = true, .seed = 1, .world = 1};
    if (dt_dataset_create(&ds, DT_F32, x, y, N, 1, 1, 2, 3) || build(&m) || dt_loader_create(&l, ds, &lc) ||
        dt_optim_create(&o, &oc, dt_model_num_params(m))) {
        fprintf(stderr, "graph: %s\n", dt_last_error());
        return 1;
    }
    dt_model_init(m, 7);
    printf("model %s: %zu parameters in %d tensors\n", dt_model_spec(m), dt_model_num_params(m),
           dt_model_num_tensors(m));
    uint64_t step = 0;
    float loss = NAN;
    for (int epoch = 0; epoch < 60; epoch++) {
        dt_batch b;
        double sum = 0;
        int nb = 0;
        dt_loader_start_epoch(l, (uint64_t)epoch, 0);
        while (dt_loader_next(l, &b) == DT_OK) {
            dt_feed f = {.x = b.x, .y = b.y, .n = b.n};
            dt_model_zero_grad(m);
            if (dt_model_run(m, &f, true, step++, &loss) || dt_model_backward_loss(m, 1.0f, NULL, NULL)) return 1;
            dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 0.01f);
            sum += loss, nb++;
        }
        if ((epoch + 1) % 20 == 0) printf("epoch %d: loss %.4f\n", epoch + 1, sum / nb);
    }
    int correct = 0; /* training accuracy, one forward of all points */
    const float *out;
    if (dt_model_forward(m, x, N, false, 0, &out)) return 1;
    for (int i = 0; i < N; i++) {
        int best = 0;
        for (int k = 1; k < 3; k++) best = out[i * 3 + k] > out[i * 3 + best] ? k : best;
        correct += best == y[i];
    }
    printf("train_acc=%.4f\n", (double)correct / N);
    dt_optim_destroy(o);
    dt_loader_destroy(l);
    dt_model_destroy(m);
    dt_dataset_destroy(ds);
    return 0;
}
