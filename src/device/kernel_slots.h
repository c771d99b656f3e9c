/* Every function slot of the kernel table (backend/backend.h dt_kernel_table) as an X-macro, for a
 * device that wraps each kernel (the checked device opens its arena around every call):
 *   SLOT_V(name, (parameters), (arguments))          a slot returning void
 *   SLOT_R(type, name, (parameters), (arguments))    a slot returning a value
 * A new slot of dt_kernel_table is one line here (device_test checks that every slot is listed). */
#ifndef DT_DEVICE_KERNEL_SLOTS_H
#define DT_DEVICE_KERNEL_SLOTS_H

#define DT_KERNEL_SLOTS(SLOT_V, SLOT_R)                                                                                \
    SLOT_R(size_t, linear_workspace, (int B, int C, int OC), (B, C, OC))                                               \
    SLOT_V(linear_forward,                                                                                             \
           (float *out, const float *in, const float *w, const float *b, float *work, int B, int C, int OC),           \
           (out, in, w, b, work, B, C, OC))                                                                            \
    SLOT_V(linear_backward,                                                                                            \
           (float *din, float *dw, float *db, const float *dout, const float *in, const float *w, float *work, int B,  \
            int C, int OC),                                                                                            \
           (din, dw, db, dout, in, w, work, B, C, OC))                                                                 \
    SLOT_R(bool, linear_bf16_values, (void), ())                                                                       \
    SLOT_V(linear_forward_bf16,                                                                                        \
           (float *out, const uint16_t *in, const float *w, const float *b, int B, int C, int OC),                     \
           (out, in, w, b, B, C, OC))                                                                                  \
    SLOT_V(linear_backward_bf16,                                                                                       \
           (float *din, float *dw, float *db, const float *dout, const uint16_t *in, const float *w, int B, int C,     \
            int OC),                                                                                                   \
           (din, dw, db, dout, in, w, B, C, OC))                                                                       \
    SLOT_V(                                                                                                            \
        linear_backward_bf16_grad,                                                                                     \
        (float *din, float *dw, float *db, uint16_t *dout, const uint16_t *in, const float *w, int B, int C, int OC),  \
        (din, dw, db, dout, in, w, B, C, OC))                                                                          \
    SLOT_V(linear_forward_bf16io,                                                                                      \
           (uint16_t * out, const uint16_t *in, const float *w, const float *b, int B, int C, int OC),                 \
           (out, in, w, b, B, C, OC))                                                                                  \
    SLOT_V(linear_backward_bf16_din,                                                                                   \
           (uint16_t * din, float *dw, float *db, const float *dout, const uint16_t *in, const float *w, int B, int C, \
            int OC),                                                                                                   \
           (din, dw, db, dout, in, w, B, C, OC))                                                                       \
    SLOT_R(size_t, conv2d_workspace, (int B, int C, int H, int W, int OC, int K, int stride, int pad),                 \
           (B, C, H, W, OC, K, stride, pad))                                                                           \
    SLOT_V(conv2d_forward,                                                                                             \
           (float *out, const float *in, const float *w, const float *b, float *work, int B, int C, int H, int W,      \
            int OC, int K, int stride, int pad),                                                                       \
           (out, in, w, b, work, B, C, H, W, OC, K, stride, pad))                                                      \
    SLOT_V(conv2d_backward,                                                                                            \
           (float *din, float *dw, float *db, const float *dout, const float *in, const float *w, float *work, int B,  \
            int C, int H, int W, int OC, int K, int stride, int pad),                                                  \
           (din, dw, db, dout, in, w, work, B, C, H, W, OC, K, stride, pad))                                           \
    SLOT_V(maxpool2d_forward,                                                                                          \
           (float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K, int S),                   \
           (out, argmax, in, B, C, H, W, K, S))                                                                        \
    SLOT_V(maxpool2d_backward,                                                                                         \
           (float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W, int K, int S),           \
           (din, dout, argmax, B, C, H, W, K, S))                                                                      \
    SLOT_V(conv2d_forward_blocked,                                                                                     \
           (float *out, const float *in, const float *w, const float *b, int B, int C, int H, int W, int OC, int K,    \
            int stride, int pad, dt_layout in_l, dt_layout out_l),                                                     \
           (out, in, w, b, B, C, H, W, OC, K, stride, pad, in_l, out_l))                                               \
    SLOT_V(conv2d_backward_blocked,                                                                                    \
           (float *din, float *dw, float *db, const float *dout, const float *in, const float *w, int B, int C, int H, \
            int W, int OC, int K, int stride, int pad, dt_layout in_l, dt_layout out_l),                               \
           (din, dw, db, dout, in, w, B, C, H, W, OC, K, stride, pad, in_l, out_l))                                    \
    SLOT_R(bool, conv2d_bf16_values, (int C), (C))                                                                     \
    SLOT_R(bool, conv2d_bf16_nhwc, (void), ())                                                                         \
    SLOT_V(maxpool2d_forward_blocked,                                                                                  \
           (float *out, int32_t *argmax, const float *in, int B, int C, int H, int W, int K, int S, bool out_bl,       \
            bool nhwc, bool relu),                                                                                     \
           (out, argmax, in, B, C, H, W, K, S, out_bl, nhwc, relu))                                                    \
    SLOT_V(maxpool2d_backward_blocked,                                                                                 \
           (float *din, const float *dout, const int32_t *argmax, int B, int C, int H, int W, int K, int S,            \
            bool out_bl, bool nhwc),                                                                                   \
           (din, dout, argmax, B, C, H, W, K, S, out_bl, nhwc))                                                        \
    SLOT_V(maxpool2d_forward_blocked_bf16,                                                                             \
           (void *out, int32_t *argmax, const uint16_t *in, int B, int C, int H, int W, int K, int S, bool out_bl,     \
            bool nhwc, bool relu, bool out_bf16),                                                                      \
           (out, argmax, in, B, C, H, W, K, S, out_bl, nhwc, relu, out_bf16))                                          \
    SLOT_R(size_t, maxpool2d_blocked_bf16_workspace, (int B, int C, int H, int W, int K, int S, bool dout_bf16),       \
           (B, C, H, W, K, S, dout_bf16))                                                                              \
    SLOT_V(maxpool2d_backward_blocked_bf16,                                                                            \
           (uint16_t * din, const void *dout, const int32_t *argmax, int B, int C, int H, int W, int K, int S,         \
            bool out_bl, bool nhwc, bool dout_bf16, float *work),                                                      \
           (din, dout, argmax, B, C, H, W, K, S, out_bl, nhwc, dout_bf16, work))                                       \
    SLOT_R(size_t, conv_pool_workspace, (const dt_conv_pool_shape *s), (s))                                            \
    SLOT_V(conv_pool_forward,                                                                                          \
           (const dt_conv_pool_shape *s, float *out, uint8_t *win, const float *in, const float *w, const float *b,    \
            void *ws),                                                                                                 \
           (s, out, win, in, w, b, ws))                                                                                \
    SLOT_V(conv_pool_backward,                                                                                         \
           (const dt_conv_pool_shape *s, float *dw, float *db, const float *dout, const uint8_t *win, const float *in, \
            void *ws),                                                                                                 \
           (s, dw, db, dout, win, in, ws))                                                                             \
    SLOT_V(avgpool2d_forward, (float *out, const float *in, int B, int C, int H, int W, int K, int S),                 \
           (out, in, B, C, H, W, K, S))                                                                                \
    SLOT_V(avgpool2d_backward, (float *din, const float *dout, int B, int C, int H, int W, int K, int S),              \
           (din, dout, B, C, H, W, K, S))                                                                              \
    SLOT_V(relu_forward, (float *out, const float *in, size_t n), (out, in, n))                                        \
    SLOT_V(relu_backward, (float *din, const float *dout, const float *x, size_t n), (din, dout, x, n))                \
    SLOT_V(gelu_forward, (float *out, const float *in, size_t n), (out, in, n))                                        \
    SLOT_V(gelu_backward, (float *din, const float *dout, const float *x, size_t n), (din, dout, x, n))                \
    SLOT_V(gelu_forward_bf16, (uint16_t * out, const float *in, size_t n), (out, in, n))                               \
    SLOT_V(gelu_backward_bf16, (uint16_t * din, const float *dout, const float *x, size_t n), (din, dout, x, n))       \
    SLOT_V(gelu_forward_bf16io, (uint16_t * out, const uint16_t *in, size_t n), (out, in, n))                          \
    SLOT_V(gelu_backward_bf16io, (uint16_t * din, const uint16_t *dout, const uint16_t *x, size_t n),                  \
           (din, dout, x, n))                                                                                          \
    SLOT_V(gelu_forward_bf16io_grad, (uint16_t * out, uint16_t * dydx, const uint16_t *in, size_t n),                  \
           (out, dydx, in, n))                                                                                         \
    SLOT_V(gelu_backward_bf16io_from_grad, (uint16_t * din, const uint16_t *dout, const uint16_t *dydx, size_t n),     \
           (din, dout, dydx, n))                                                                                       \
    SLOT_V(tanh_forward, (float *out, const float *in, size_t n), (out, in, n))                                        \
    SLOT_V(tanh_backward, (float *din, const float *dout, const float *y, size_t n), (din, dout, y, n))                \
    SLOT_V(sigmoid_forward, (float *out, const float *in, size_t n), (out, in, n))                                     \
    SLOT_V(sigmoid_backward, (float *din, const float *dout, const float *y, size_t n), (din, dout, y, n))             \
    SLOT_V(dropout_forward,                                                                                            \
           (float *out, uint8_t *mask, const float *in, size_t n, float p, uint64_t seed, uint64_t key),               \
           (out, mask, in, n, p, seed, key))                                                                           \
    SLOT_V(dropout_backward, (float *din, const float *dout, const uint8_t *mask, size_t n, float p),                  \
           (din, dout, mask, n, p))                                                                                    \
    SLOT_V(layernorm_forward,                                                                                          \
           (float *out, float *mean, float *rstd, const float *in, const float *w, const float *b, int N, int C,       \
            float eps),                                                                                                \
           (out, mean, rstd, in, w, b, N, C, eps))                                                                     \
    SLOT_V(layernorm_backward,                                                                                         \
           (float *din, float *dw, float *db, const float *dout, const float *in, const float *w, const float *mean,   \
            const float *rstd, int N, int C),                                                                          \
           (din, dw, db, dout, in, w, mean, rstd, N, C))                                                               \
    SLOT_V(batchnorm2d_forward_train,                                                                                  \
           (float *out, float *mean, float *rstd, float *running_mean, float *running_var, const float *in,            \
            const float *w, const float *b, int B, int C, int HW, float momentum, float eps),                          \
           (out, mean, rstd, running_mean, running_var, in, w, b, B, C, HW, momentum, eps))                            \
    SLOT_V(batchnorm2d_forward_eval,                                                                                   \
           (float *out, const float *in, const float *w, const float *b, const float *running_mean,                    \
            const float *running_var, int B, int C, int HW, float eps),                                                \
           (out, in, w, b, running_mean, running_var, B, C, HW, eps))                                                  \
    SLOT_V(batchnorm2d_backward,                                                                                       \
           (float *din, float *dw, float *db, const float *dout, const float *in, const float *w, const float *mean,   \
            const float *rstd, int B, int C, int HW),                                                                  \
           (din, dw, db, dout, in, w, mean, rstd, B, C, HW))                                                           \
    SLOT_V(embedding_forward, (float *out, const int32_t *ids, const float *w, int N, int C), (out, ids, w, N, C))     \
    SLOT_V(embedding_backward, (float *dw, const float *dout, const int32_t *ids, int N, int C),                       \
           (dw, dout, ids, N, C))                                                                                      \
    SLOT_V(pos_embedding_forward, (float *out, const float *w, int B, int T, int C), (out, w, B, T, C))                \
    SLOT_V(pos_embedding_backward, (float *dw, const float *dout, int B, int T, int C), (dw, dout, B, T, C))           \
    SLOT_V(add_forward, (float *out, const float *a, const float *b, size_t n), (out, a, b, n))                        \
    SLOT_V(attention_forward, (float *out, float *att, float *work, const float *qkv, int B, int T, int C, int NH),    \
           (out, att, work, qkv, B, T, C, NH))                                                                         \
    SLOT_R(size_t, attention_workspace, (int T, int C, int NH), (T, C, NH))                                            \
    SLOT_V(attention_backward,                                                                                         \
           (float *dqkv, float *work, const float *dout, const float *qkv, const float *att, int B, int T, int C,      \
            int NH),                                                                                                   \
           (dqkv, work, dout, qkv, att, B, T, C, NH))                                                                  \
    SLOT_V(xent_forward,                                                                                               \
           (float *loss, float *probs, const float *logits, const int32_t *labels, int N, int V, int ignore,           \
            int32_t *counted),                                                                                         \
           (loss, probs, logits, labels, N, V, ignore, counted))                                                       \
    SLOT_V(xent_backward,                                                                                              \
           (float *dlogits, const float *probs, const int32_t *labels, int N, int V, int ignore,                       \
            const int32_t *counted, float scale),                                                                      \
           (dlogits, probs, labels, N, V, ignore, counted, scale))                                                     \
    SLOT_V(mse_forward, (float *loss, const float *pred, const float *target, size_t n), (loss, pred, target, n))      \
    SLOT_V(mse_backward, (float *dpred, const float *pred, const float *target, size_t n, float scale),                \
           (dpred, pred, target, n, scale))                                                                            \
    SLOT_V(count_correct, (int64_t * correct, const float *logits, const int32_t *labels, int64_t rows, int V),        \
           (correct, logits, labels, rows, V))

#endif
