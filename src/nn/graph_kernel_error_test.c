/* A kernel that cannot run fails the step naming its node (backend.h: dt_kernel_fail; issue 33:
 * no kernel aborts). Kernel slots return void, so a kernel that cannot get its scratch (oneDNN's,
 * out of memory: kernel_alloc_test makes one fail for real) records why and returns; the graph
 * takes that after each op, forward and backward (nn/graph_run.c). This test registers an op
 * whose kernel reports such a failure when armed, and checks that dt_model_forward and
 * dt_model_backward return DT_ENOMEM naming the node and the reason, and that the next step,
 * unarmed, runs (the error does not stay). */
#include "core/test.h"
#include "dtrain/dtrain.h"
#include "nn/graph_internal.h"

#include <string.h>

static int armed; /* 1: forward's kernel fails; 2: backward's */

static dt_status kf_infer(dt_model *m, dt_node *n) {
    const dt_node *in = dt_node_input(m, n, 0);
    n->dtype = DT_F32, n->ndim = in->ndim, n->out_n = in->out_n;
    for (int i = 0; i < in->ndim; i++) n->shape[i] = in->shape[i];
    return DT_OK;
}

/* y = 2x; its "kernel" reports that it could not run when armed, as the oneDNN kernels do */
static dt_status kf_forward(dt_model *m, dt_node *n, const dt_run_ctx *c) {
    if (armed == 1) return dt_kernel_fail("scratch: out of memory for %d bytes", 4096), DT_OK;
    const float *x = dt_node_in(m, n, 0);
    for (size_t i = 0; i < (size_t)c->B * n->out_n; i++) n->out[i] = 2 * x[i];
    return DT_OK;
}

static void kf_backward(dt_model *m, dt_node *n, const dt_run_ctx *c, float *const *din) {
    (void)m;
    if (armed == 2) return dt_kernel_fail("scratch: out of memory for %d bytes", 8192);
    for (size_t i = 0; din[0] && i < (size_t)c->B * n->out_n; i++) din[0][i] = 2 * n->grad[i];
}

static const dt_op kfail = {.name = "kfail",
                            .help = "y = 2x, whose kernel fails when armed (a test's op)",
                            .min_in = 1,
                            .max_in = 1,
                            .infer = kf_infer,
                            .forward = kf_forward,
                            .backward = kf_backward};

int main(void) {
    const int kind = dt_op_register(&kfail);
    CHECK_MSG(kind >= 0, "dt_op_register: %s", dt_last_error());
    enum { B = 2, IN = 4, OUT = 3 };
    dt_model *m = NULL;
    CHECK_OK(dt_graph_create(&m));
    const int shape[1] = {IN};
    int x = dt_graph_input(m, "x", DT_F32, 1, shape);
    dt_layer_spec lin = dt_layer_default(DT_LAYER_LINEAR), kf = dt_layer_default((dt_layer_kind)kind);
    lin.out = OUT;
    int h = dt_graph_node(m, "lin", &lin, -1, &x, 1), y = dt_graph_node(m, "doubler", &kf, -1, &h, 1);
    CHECK_OK(dt_graph_finish(m, y, -1, "kfail"));
    dt_model_init(m, 7);
    const float xs[B * IN] = {1, 2, 3, 4, -1, -2, -3, -4}, dout[B * OUT] = {1, 1, 1, 1, 1, 1};
    const float *out;
    armed = 1;
    CHECK(dt_model_forward(m, xs, B, true, 0, &out) == DT_ENOMEM);
    CHECK_MSG(strstr(dt_last_error(), "node 'doubler'") && strstr(dt_last_error(), "out of memory for 4096 bytes"),
              "forward: %s", dt_last_error());
    armed = 0;
    CHECK_OK(dt_model_forward(m, xs, B, true, 0, &out));
    armed = 2;
    dt_model_zero_grad(m);
    CHECK(dt_model_backward(m, dout, NULL, NULL) == DT_ENOMEM);
    CHECK_MSG(strstr(dt_last_error(), "node 'doubler'") && strstr(dt_last_error(), "out of memory for 8192 bytes"),
              "backward: %s", dt_last_error());
    armed = 0;
    CHECK_OK(dt_model_forward(m, xs, B, true, 0, &out));
    dt_model_zero_grad(m);
    CHECK_OK(dt_model_backward(m, dout, NULL, NULL));
    dt_model_destroy(m);
    return dt_test_summary("graph_kernel_error_test");
}
