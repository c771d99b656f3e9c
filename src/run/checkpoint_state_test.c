/* Checkpoints through the strategy's state visitor: a strategy that reports every tensor in two
 * slices (as a sharded one does) writes the byte-identical file of the replicated write, and
 * restores each slice from it; a rank holding only part of a tensor is refused with its name. */
#include "core/test.h"
#include "parallel/strategy.h"
#include "run/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_skip_last; /* drop the second slice of the last tensor (a rank that holds part) */

/* the pieces of dt_state_visit_model, each cut in two halves */
typedef struct {
    dt_state_visit_fn fn;
    void *ctx;
    int count;
} halves;

static dt_status halve(void *ctx, const dt_state_piece *p) {
    halves *h = ctx;
    size_t a = p->numel / 2;
    dt_state_piece q = *p;
    q.buf.count = a;
    if (a) DT_TRY(h->fn(h->ctx, &q));
    q.offset = a, q.buf.count = p->numel - a, q.buf.data = (float *)p->buf.data + a;
    h->count++;
    if (g_skip_last && h->count == g_skip_last) return DT_OK;
    return h->fn(h->ctx, &q);
}

static dt_status sharded_visit(dt_strategy *s, dt_state_visit_fn fn, void *ctx) {
    halves h = {fn, ctx, 0};
    return dt_state_visit_model(s->model, s->optim, halve, &h);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n);
    if (b && fread(b, 1, *n, f) != *n) free(b), b = NULL;
    fclose(f);
    return b;
}

int main(void) {
    dt_model *m;
    CHECK_OK(dt_model_create_from_spec(&m, "conv(4,3) batchnorm relu flatten linear(5)", 1, 6, 6));
    dt_model_init(m, 4);
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
    dt_optim *o;
    CHECK_OK(dt_optim_create(&o, &oc, dt_model_num_params(m)));
    for (int k = 0; k < dt_optim_num_states(o); k++) {
        const char *nm;
        float *st = dt_optim_state(o, k, &nm);
        for (size_t i = 0; i < dt_model_num_params(m); i++) st[i] = (float)(k + 1) * 1e-3f * (float)i;
    }
    dt_optim_set_steps(o, 7);
    dt_strategy_ops ops = {.name = "halves", .visit_state = sharded_visit};
    dt_strategy st = {.ops = &ops, .model = m, .optim = o};
    dt_ckpt_info info = {
        .C = 1, .H = 6, .W = 6, .step = 7, .batch = 4, .world_size = 1, .optimizer = "adam", .lr = 1e-3f};
    snprintf(info.spec, sizeof info.spec, "%s", dt_model_spec(m));
    char a[64], b[64];
    snprintf(a, sizeof a, "/tmp/dtrain-state-%d-a.st", (int)getpid());
    snprintf(b, sizeof b, "/tmp/dtrain-state-%d-b.st", (int)getpid());
    CHECK_OK(dt_checkpoint_write(a, m, o, &info));
    CHECK_OK(dt_checkpoint_write_strategy(b, &st, &info));
    size_t na = 0, nb = 0;
    char *fa = slurp(a, &na), *fb = slurp(b, &nb);
    CHECK_MSG(fa && fb && na == nb && !memcmp(fa, fb, na), "sliced write differs from the whole-tensor write");
    free(fa), free(fb);
    /* restore through the slices into a fresh model and optimizer */
    dt_model *m2;
    dt_optim *o2;
    CHECK_OK(dt_model_create_from_spec(&m2, "conv(4,3) batchnorm relu flatten linear(5)", 1, 6, 6));
    CHECK_OK(dt_optim_create(&o2, &oc, dt_model_num_params(m2)));
    dt_strategy st2 = {.ops = &ops, .model = m2, .optim = o2};
    dt_ckpt_info got;
    CHECK_OK(dt_checkpoint_restore_strategy(b, &st2, &got));
    CHECK(!memcmp(dt_model_params(m), dt_model_params(m2), dt_model_num_params(m) * sizeof(float)));
    CHECK(!memcmp(dt_model_buffers(m), dt_model_buffers(m2), dt_model_num_buffers(m) * sizeof(float)));
    for (int k = 0; k < dt_optim_num_states(o); k++) {
        const char *nm;
        CHECK(!memcmp(dt_optim_state(o, k, &nm), dt_optim_state(o2, k, &nm), dt_model_num_params(m) * sizeof(float)));
    }
    CHECK(dt_optim_steps(o2) == 7 && got.step == 7);
    /* a rank holding only half of a tensor cannot write it alone */
    g_skip_last = 3;
    dt_status s = dt_checkpoint_write_strategy(b, &st, &info);
    CHECK_MSG(s != DT_OK && strstr(dt_last_error(), "cover"), "%s", dt_last_error());
    unlink(a), unlink(b);
    dt_optim_destroy(o), dt_optim_destroy(o2);
    dt_model_destroy(m), dt_model_destroy(m2);
    return dt_test_summary("checkpoint_state_test");
}
