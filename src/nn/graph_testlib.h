/* Helpers shared by the graph tests (graph_ref_test.c, graph_gradcheck_test.c, gpt_ref_test.c),
 * test-only and header-only: graph building shorthands, a tensor's parameter or gradient view by
 * name, array comparisons that print the max difference of every case, and a run over every
 * kernel table and precision. */
#ifndef DT_NN_GRAPH_TESTLIB_H
#define DT_NN_GRAPH_TESTLIB_H

#include "core/test.h"
#include "dtrain/core.h"
#include "backend/layers.h"
#include "dtrain/nn.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* A graph input of per-sample shape (d0[, d1[, d2]]); pass 0 for the unused trailing dims. */
static inline int gt_input(dt_model *m, const char *name, dt_dtype dtype, int d0, int d1, int d2) {
    int shape[3] = {d0, d1, d2}, ndim = d2 ? 3 : d1 ? 2 : 1;
    return dt_graph_input(m, name, dtype, ndim, shape);
}

/* A node on one, two or three inputs (b, c < 0: absent). */
static inline int gt_node(dt_model *m, const char *name, const dt_layer_spec *s, int a, int b, int c) {
    int in[3] = {a, b, c}, n = c >= 0 ? 3 : b >= 0 ? 2 : 1;
    return dt_graph_node(m, name, s, -1, in, n);
}

/* Index of tensor `name`, CHECKed to exist with numel values (numel 0: any). */
static inline int gt_tensor(const dt_model *m, const char *name, size_t numel) {
    int i = dt_model_find_tensor(m, name);
    CHECK_MSG(i >= 0, "the model has no tensor '%s'", name);
    if (i < 0) return -1;
    const dt_param_info *t = dt_model_tensor(m, i);
    CHECK_MSG(numel == 0 || t->numel == numel, "tensor %s has %zu values, want %zu", name, t->numel, numel);
    return numel == 0 || t->numel == numel ? i : -1;
}

/* The parameter (or gradient) values of tensor `name`, or NULL (a failed check). */
static inline float *gt_param(dt_model *m, const char *name, size_t numel) {
    int i = gt_tensor(m, name, numel);
    return i < 0 ? NULL : dt_model_params(m) + dt_model_tensor(m, i)->offset;
}
static inline float *gt_grad(dt_model *m, const char *name, size_t numel) {
    int i = gt_tensor(m, name, numel);
    return i < 0 ? NULL : dt_model_grads(m) + dt_model_tensor(m, i)->offset;
}

/* Copies n values into tensor `name`; returns 0 or -1 (a failed check). */
static inline int gt_load(dt_model *m, const char *name, const float *src, size_t n) {
    float *p = gt_param(m, name, n);
    if (p) memcpy(p, src, n * sizeof *p);
    return p ? 0 : -1;
}

/* The gradient a backward left on node `node` (an input's gradient, say), CHECKed non-NULL. */
static inline const float *gt_node_grad(const dt_model *m, int node) {
    const float *g = dt_model_node_grad(m, node);
    CHECK_MSG(g != NULL, "no gradient on node %d (%s) after backward", node, dt_model_node_name(m, node));
    return g;
}

/* Max |got - ref| relative to max(max|ref|, floor) (1 if both are 0); must be <= tol. Returns
 * the relative error. got == NULL is a failure already reported. */
static inline double gt_cmp_floor(const char *what, const float *got, const float *ref, size_t n, double tol,
                                  double floor) {
    if (!got) {
        CHECK_MSG(0, "%s: nothing to compare", what);
        return INFINITY;
    }
    double scale = floor, diff = dt_test_maxdiff(got, ref, n);
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    if (scale == 0) scale = 1;
    printf("  %-46s n=%-6zu max|diff| %.3e  rel %.2e\n", what, n, diff, diff / scale);
    CHECK_MSG(diff / scale <= tol, "%s: max diff %g (scale %g) exceeds rel tolerance %g", what, diff, scale, tol);
    return diff / scale;
}
static inline double gt_cmp(const char *what, const float *got, const float *ref, size_t n, double tol) {
    return gt_cmp_floor(what, got, ref, n, tol, 0);
}

/* An op's f32 input as a "leaf" of the graph: an embedding of the ids 0..B*T-1 (fed by gt_ids,
 * per sample (T), from the int32 input `ids`), so sample b's (T, D) values are rows b*T.. of the
 * (B*T, D) table "<name>.weight" and the gradient the op writes for that input is the table's
 * gradient. (Graph inputs get no gradient: only nodes with parameters upstream do.) */
static inline int gt_leaf(dt_model *m, int ids, const char *name, int B, int T, int D) {
    dt_layer_spec s = dt_layer_default(DT_LAYER_EMBEDDING);
    s.num = B * T, s.out = D;
    return gt_node(m, name, &s, ids, -1, -1);
}
/* 0, 1, ..., n-1: the ids feeding gt_leaf nodes (n <= 1024). */
static inline const int32_t *gt_ids(int n) {
    static int32_t ids[1024];
    for (int i = 0; i < n && i < 1024; i++) ids[i] = i;
    return ids;
}

/* A grad-ready hook (dt_grad_ready_fn) that checks its contract: the ranges cover the slab once
 * and a range is final when reported (snap keeps its values then; gt_ready_check compares them
 * with the gradients after backward). */
typedef struct {
    const float *grads;
    size_t n;
    unsigned char *seen;
    float *snap;
    int bad;
    size_t last_off; /* ranges complete from the end of the slab towards its start */
    int unordered;
} gt_ready;

static inline void gt_ready_init(gt_ready *r, dt_model *m) {
    r->grads = dt_model_grads(m), r->n = dt_model_num_params(m), r->bad = 0;
    r->last_off = r->n, r->unordered = 0;
    r->seen = calloc(r->n + 1, 1), r->snap = calloc(r->n + 1, sizeof(float));
}

static inline void gt_ready_hook(void *p, size_t off, size_t n) {
    gt_ready *r = p;
    if (off + n > r->n) {
        r->bad++;
        return;
    }
    for (size_t i = off; i < off + n; i++) r->bad += r->seen[i]++ != 0;
    r->unordered += off + n > r->last_off;
    r->last_off = off;
    memcpy(r->snap + off, r->grads + off, n * sizeof(float));
}

/* CHECKs the ranges covered every parameter once and none changed after it was reported. */
static inline void gt_ready_check(const char *what, gt_ready *r) {
    size_t covered = 0, changed = 0, first = 0;
    for (size_t i = 0; i < r->n; i++) {
        covered += r->seen[i] != 0;
        if (r->seen[i] && memcmp(&r->snap[i], &r->grads[i], sizeof(float)) && !changed++) first = i;
    }
    printf("  %-46s %zu of %zu params reported, %zu changed after\n", what, covered, r->n, changed);
    CHECK_MSG(r->bad == 0 && covered == r->n,
              "%s: grad-ready ranges must cover the %zu params once (%zu covered, "
              "%d overlaps or overruns)",
              what, r->n, covered, r->bad);
    CHECK_MSG(r->unordered == 0,
              "%s: %d grad-ready ranges came after a range below them (they must complete "
              "from the end of the slab towards its start)",
              what, r->unordered);
    CHECK_MSG(changed == 0,
              "%s: %zu gradients changed after the grad-ready hook reported them final (first: "
              "param %zu)",
              what, changed, first);
    free(r->seen), free(r->snap);
    r->seen = NULL, r->snap = NULL;
}

static inline float *gt_copy(const float *src, size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (src) memcpy(p, src, n * sizeof *p);
    return p;
}

/* Runs fn once per kernel table and precision this build has (blas, then onednn; fp32, bf16,
 * fp16), each selected first (dt_kernels_select); a table not built is said and skipped. tol is
 * the precision's tolerance: fp32 1e-5; bf16/fp16 16 unit roundoffs of the rounded GEMM inputs
 * (2^-9 / 2^-12: 3e-2 / 4e-3), as ref_test.c argues. */
static inline void gt_each_kernels(void (*fn)(double tol)) {
    static const char *const precs[3] = {"fp32", "bf16", "fp16"};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) {
            const char *lib = k ? "onednn" : "blas";
            if (dt_kernels_select(lib, precs[i]) != DT_OK) {
                printf("== %s %s: not built (%s)\n", lib, precs[i], dt_last_error());
                continue;
            }
            const double tol = i == 0 ? 1e-5 : i == 1 ? 16 * 0x1p-9 : 16 * 0x1p-12;
            printf("== kernels %s, tolerance %.1e\n", dt_kernels_describe(), tol);
            fn(tol);
        }
}

#endif
