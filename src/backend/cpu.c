/* The CPU f32 backend table: the kernels of src/backend/cpu_*.c. */
#include "backend/backend.h"
#include "backend/blocked.h"
#include "backend/gelu.h"

/* The losses of layers.h with their value (and the xent's count of targets that counted) written
 * where the table's contract says. */
static void xent_forward(float *loss, float *probs, const float *logits, const int32_t *labels, int N, int V,
                         int ignore, int32_t *counted) {
    int cnt = 0;
    *loss = dt_softmax_xent_ignore_forward(probs, logits, labels, N, V, ignore, &cnt);
    *counted = cnt;
}

static void xent_backward(float *dlogits, const float *probs, const int32_t *labels, int N, int V, int ignore,
                          const int32_t *counted, float scale) {
    dt_softmax_xent_ignore_backward(dlogits, probs, labels, N, V, ignore, *counted, scale);
}

static void mse_forward(float *loss, const float *pred, const float *target, size_t n) {
    *loss = dt_mse_forward(pred, target, n);
}

static void count_correct(int64_t *correct, const float *logits, const int32_t *labels, int64_t rows, int V) {
    int64_t n = 0;
    for (int64_t i = 0; i < rows; i++) {
        const float *row = logits + (size_t)i * V;
        int best = 0;
        for (int k = 1; k < V; k++)
            if (row[k] > row[best]) best = k;
        n += best == labels[i];
    }
    *correct = n;
}

/* The f32 GEMMs need no workspace. */
static void linear_forward(float *out, const float *in, const float *w, const float *b, float *work, int B, int C,
                           int OC) {
    (void)work;
    dt_linear_forward(out, in, w, b, B, C, OC);
}

static void linear_backward(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                            float *work, int B, int C, int OC) {
    (void)work;
    dt_linear_backward(din, dw, db, dout, in, w, B, C, OC);
}

static const dt_kernel_table cpu = {
    .name = "blas",
    .device = DT_DEVICE_CPU,
    .dtype = DT_F32,
    .precision = DT_F32,
    .linear_forward = linear_forward,
    .linear_backward = linear_backward,
    .conv2d_workspace = dt_conv2d_workspace,
    .conv2d_forward = dt_conv2d_forward,
    .conv2d_backward = dt_conv2d_backward,
    .maxpool2d_forward = dt_maxpool2d_forward,
    .maxpool2d_backward = dt_maxpool2d_backward,
    .maxpool2d_forward_blocked = dt_maxpool2d_forward_blocked,
    .maxpool2d_backward_blocked = dt_maxpool2d_backward_blocked,
    .avgpool2d_forward = dt_avgpool2d_forward,
    .avgpool2d_backward = dt_avgpool2d_backward,
    .relu_forward = dt_relu_forward,
    .relu_backward = dt_relu_backward,
    .gelu_forward = dt_gelu_forward,
    .gelu_backward = dt_gelu_backward,
    .gelu_forward_bf16 = dt_gelu_forward_bf16,
    .gelu_backward_bf16 = dt_gelu_backward_bf16,
    .gelu_forward_bf16io = dt_gelu_forward_bf16io,
    .gelu_backward_bf16io = dt_gelu_backward_bf16io,
    .gelu_forward_bf16io_grad = dt_gelu_forward_bf16io_grad,
    .gelu_backward_bf16io_from_grad = dt_gelu_backward_bf16io_from_grad,
    .tanh_forward = dt_tanh_forward,
    .tanh_backward = dt_tanh_backward,
    .sigmoid_forward = dt_sigmoid_forward,
    .sigmoid_backward = dt_sigmoid_backward,
    .dropout_forward = dt_dropout_forward,
    .dropout_backward = dt_dropout_backward,
    .layernorm_forward = dt_layernorm_forward,
    .layernorm_backward = dt_layernorm_backward,
    .batchnorm2d_forward_train = dt_batchnorm2d_forward_train,
    .batchnorm2d_forward_eval = dt_batchnorm2d_forward_eval,
    .batchnorm2d_backward = dt_batchnorm2d_backward,
    .embedding_forward = dt_embedding_forward,
    .embedding_backward = dt_embedding_backward,
    .pos_embedding_forward = dt_pos_embedding_forward,
    .pos_embedding_backward = dt_pos_embedding_backward,
    .add_forward = dt_add_forward,
    .attention_forward = dt_attention_forward,
    .attention_workspace = dt_attention_workspace,
    .attention_backward = dt_attention_backward,
    .xent_forward = xent_forward,
    .xent_backward = xent_backward,
    .mse_forward = mse_forward,
    .mse_backward = dt_mse_backward,
    .count_correct = count_correct,
};

const dt_kernel_table *dt_backend_cpu(void) { return &cpu; }
