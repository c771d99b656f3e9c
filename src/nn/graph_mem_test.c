/* dt_model_activation_bytes (the activations of --dry-run's memory plan and bench zero) against
 * what the graph really allocates: the bytes core/mem.c counts for the dt_alloc blocks
 * dt_model_prepare takes for a batch, at odd batches (blocks not a multiple of 64 bytes), for
 * models with aliases, fused and blocked convs, residual scratch and saved state, and for a CNN
 * whose blocked values and gradients are stored bf16. That plan needs convs that take bf16
 * values, which only CPUs with AVX512-BF16 have; on any CPU it is made with a copy of the onednn
 * bf16 table whose convs over 16 or more channels take them (as blocked_bf16_test does), and a
 * training step then runs in the memory counted. */
#include "backend/backend.h"
#include "core/test.h"
#include "dtrain/core.h"
#include "backend/layers.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "nn/graph_internal.h"

#include <stdlib.h>

/* Prepares m for each batch in turn: the bytes it then holds above `base` are the plan's. */
static void check_batches(dt_model *m, const char *what, size_t base) {
    static const int batches[] = {1, 3, 7};
    for (int k = 0; k < 3; k++) {
        const int B = batches[k];
        CHECK_OK(dt_model_prepare(m, B, true, 0));
        const size_t held = dt_mem_used() - base, plan = dt_model_activation_bytes(m, B);
        CHECK_MSG(held == plan, "%s at batch %d: the graph holds %zu bytes of activations, the plan says %zu", what, B,
                  held, plan);
    }
}

/* One forward and backward at batch B (the last prepared) allocates nothing more. */
static void check_step(dt_model *m, const char *what, const float *x, const int32_t *y, int B) {
    const size_t before = dt_mem_used();
    dt_feed f = {.x = x, .y = y, .n = B};
    float loss;
    CHECK_OK(dt_model_run(m, &f, true, 0, &loss));
    CHECK_OK(dt_model_backward_loss(m, 1.0f, NULL, NULL));
    CHECK_MSG(loss == loss && dt_mem_used() == before, "%s: loss %g, %zu bytes held before the step, %zu after", what,
              loss, before, dt_mem_used());
}

static void check_spec(const char *kernels, const char *prec, const char *spec, int C, int H, int W) {
    if (dt_kernels_select(kernels, prec) != DT_OK) {
        printf("%s at %s %s: skipped (%s)\n", spec, kernels, prec, dt_last_error());
        return;
    }
    dt_model *m = NULL;
    CHECK_OK(dt_model_build(&m, spec, C, H, W));
    if (m) {
        char what[160];
        snprintf(what, sizeof what, "%s at %s %s", spec, kernels, prec);
        check_batches(m, what, dt_mem_used());
        printf("%s: plan %zu bytes of activations at batch 7\n", what, dt_model_activation_bytes(m, 7));
    }
    dt_model_destroy(m);
}

static bool sixteen_or_more(int C) { return C >= 16; }

/* The CNN with bf16 values and gradients (nodes 3 and 4, blocked_bf16_test's plan). */
static void check_bf16_cnn(void) {
    const dt_kernel_table *be = NULL;
    if (dt_kernels_select("onednn", "bf16") != DT_OK || dt_backend_find("onednn", DT_BF16, &be) != DT_OK) {
        printf("cnn at bf16: skipped (built without oneDNN)\n");
        return;
    }
    dt_kernel_table t = *be;
    t.conv2d_bf16_values = sixteen_or_more;
    t.linear_bf16_values = NULL; /* the conv chain's plan alone (the GPT below has the linears') */
    dt_model *m = NULL;
    CHECK_OK(dt_model_build(&m, "cnn", 1, 28, 28));
    if (!m) return;
    dt_model_init(m, 3);
    m->be = &t;
    dt_graph_plan_bf16(m);
    int nbf = 0, ngbf = 0;
    for (int i = 0; i < m->n; i++) nbf += m->nodes[i].bf16, ngbf += m->nodes[i].grad_bf16;
    CHECK_MSG(nbf == 2 && ngbf == 1, "cnn at bf16: %d nodes with bf16 values, %d with a bf16 gradient (want 2, 1)", nbf,
              ngbf);
    check_batches(m, "cnn at bf16 (bf16 blocked values)", dt_mem_used());
    enum { B = 7 };
    float *x = malloc(sizeof(float) * B * 784);
    int32_t y[B] = {1, 2, 3, 4, 5, 6, 7};
    if (x) {
        dt_rng_fill_uniform(x, B * 784, 0, 1, 5, 0);
        check_step(m, "cnn at bf16 (bf16 blocked values)", x, y, B);
    }
    printf("cnn at bf16 with %d bf16 values, %d bf16 gradients: plan %zu bytes of activations at batch %d\n", nbf, ngbf,
           dt_model_activation_bytes(m, B), B);
    free(x);
    dt_model_destroy(m);
}

static bool yes(void) { return true; }

/* A GPT whose layernorms, attention outputs, GELUs and c_fc outputs are stored bf16
 * (graph_bf16_test's plans): their pieces' workspace is counted. */
static void check_bf16_gpt(void) {
    const dt_kernel_table *be = NULL;
    if (dt_kernels_select("onednn", "bf16") != DT_OK || dt_backend_find("onednn", DT_BF16, &be) != DT_OK) return;
    dt_kernel_table t = *be;
    t.linear_bf16_values = yes;
    dt_model *m = NULL;
    CHECK_OK(dt_model_build(&m, "gpt:L=2,H=2,C=32,T=8", 0, 0, 0));
    if (!m) return;
    m->be = &t;
    dt_graph_plan_bf16(m);
    int nbf = 0;
    for (int i = 0; i < m->n; i++) nbf += m->nodes[i].bf16;
    CHECK_MSG(nbf == 11, "gpt at bf16: %d nodes with bf16 values (want 11)", nbf);
    check_batches(m, "gpt at bf16 (bf16 values into linears)", dt_mem_used());
    dt_model_destroy(m);
}

int main(void) {
    check_bf16_cnn();
    check_bf16_gpt();
    check_spec("onednn", "fp32", "cnn", 1, 28, 28); /* fused conv -> maxpool, blocked values, aliases */
    check_spec("onednn", "bf16", "cnn", 1, 28, 28); /* this CPU's own bf16 plan */
    check_spec("blas", "fp32", "cnn", 1, 28, 28);
    check_spec("blas", "fp32", "mlp", 1, 28, 28);
    check_spec("blas", "fp32", "gpt:L=2,H=2,C=32,T=8", 0, 0, 0); /* residual scratch, attention state */
    CHECK_OK(dt_kernels_select("blas", "fp32"));
    return dt_test_summary("graph_mem_test");
}
