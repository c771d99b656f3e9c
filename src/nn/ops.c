/* The op registry: every op's table (each in its own src/nn/op_*.c), found by kind or by name,
 * and the ops registered at run time from outside src/nn/ (dt_op_register: a test's toy op).
 * Adding an op is its op_*.c file and one X(name) at the end of DT_OPS. */
#include "nn/graph_internal.h"

#include <stdio.h>
#include <string.h>

/* In dt_layer_kind's order: an op's kind is its position. The first DT_LAYER_KIND_COUNT are the
 * public enum's; ops added after them have no enum value and are found by name (dt_op_find,
 * specs). Each X(name) is the table dt_op_<name>. */
#define DT_OPS(X)                                                                                             \
    X(linear)                                                                                                 \
    X(conv2d) X(maxpool2d) X(avgpool2d) X(relu) X(gelu) X(tanh) X(sigmoid) X(dropout) X(flatten) X(layernorm) \
        X(batchnorm2d) X(input) X(embedding) X(add) X(attention) X(matmul_t) X(reshape) X(xent) X(mse)

#define DT_OP_DECL(n) extern const dt_op dt_op_##n;
#define DT_OP_REF(n) &dt_op_##n,
DT_OPS(DT_OP_DECL)
static const dt_op *const g_ops[] = {DT_OPS(DT_OP_REF)};
enum { N_BUILTIN = sizeof g_ops / sizeof *g_ops, N_ADDED_MAX = 16 };
_Static_assert((int)N_BUILTIN >= (int)DT_LAYER_KIND_COUNT, "DT_OPS lists every kind of dt_layer_kind, in its order");

static const dt_op *g_added[N_ADDED_MAX]; /* dt_op_register's, kinds N_BUILTIN + i */
static int g_nadded;

int dt_op_count(void) { return N_BUILTIN + g_nadded; }

const dt_op *dt_op_of(dt_layer_kind kind) {
    const unsigned k = (unsigned)kind;
    return k < N_BUILTIN ? g_ops[k] : k < (unsigned)dt_op_count() ? g_added[k - N_BUILTIN] : NULL;
}

const dt_op *dt_op_find(const char *name, dt_layer_kind *kind) {
    for (int k = 0; name && k < dt_op_count(); k++) {
        const dt_op *op = dt_op_of((dt_layer_kind)k);
        if (!strcmp(op->name, name) || (op->syntax && op->syntax->alias && !strcmp(op->syntax->alias, name))) {
            if (kind) *kind = (dt_layer_kind)k;
            return op;
        }
    }
    return NULL;
}

int dt_op_register(const dt_op *op) {
    const char *what = !op || !op->name || !*op->name    ? "it has no name"
                       : !op->help || !*op->help         ? "it has no help line"
                       : !op->infer                      ? "it has no infer"
                       : op->syntax && !op->syntax->args ? "its syntax has no args (\"|\" for none)"
                       : dt_op_find(op->name, NULL)      ? "its name is taken"
                       : op->syntax && op->syntax->alias && dt_op_find(op->syntax->alias, NULL) ? "its alias is taken"
                       : g_nadded == N_ADDED_MAX ? "the table of registered ops is full"
                                                 : NULL;
    if (what)
        return dt_error(DT_EINVAL, "op registry: cannot register op '%s': %s", op && op->name ? op->name : "?", what),
               -1;
    g_added[g_nadded++] = op;
    return N_BUILTIN + g_nadded - 1;
}

const char *dt_layer_name(dt_layer_kind kind) {
    const dt_op *op = dt_op_of(kind);
    return op ? op->name : "?";
}

int dt_layer_find(const char *name) {
    dt_layer_kind k;
    return dt_op_find(name, &k) ? (int)k : -1;
}
