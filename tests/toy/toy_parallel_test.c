/* The registries open from outside the library (issue 38): a toy compressor (toy_compressor.c,
 * "sign") and a toy strategy (toy_strategy.c, "allreduce"), each one file, registered here with one
 * line each, then trained through the ordinary trainer over forked shared-memory ranks:
 * - both show in the registries' listings (the --help text is made from them) and parse;
 * - allreduce: 2 workers at batch 8 end where 1 process (single) at batch 16 ends (to 2e-5), the
 *   replicas bitwise equal, and the loss falls;
 * - ddp(compress=sign): the loss falls; its error-feedback state is in the checkpoint
 *   ("compress.sign.state") and round-trips: 24 steps straight end bitwise where 11 steps, a
 *   checkpoint and a resume to 24 end; a sync given back the state of another ends the next step
 *   bitwise as that one, and a sync with zero state does not (the state matters). */
#include "core/test.h"
#include "parallel/grad_sync.h"
#include "parallel/parallel_testlib.h"
#include "parallel/strategy.h"
#include "dtrain/dtrain.h"

#include <string.h>
#include <unistd.h>

extern const dt_compressor toy_compress_sign;
extern const dt_strategy_entry toy_strategy_allreduce_entry;

enum { CAP = 4096, EPOCHS = 3 };
#define MODEL "linear(16) relu linear(4)"
static char g_dir[64], g_csv[128];

/* The first and the last epoch's training loss, seen on rank 0. */
typedef struct {
    float first, last;
} losses;

static void on_epoch(void *ctx, const dt_epoch_info *e) {
    losses *l = ctx;
    if (e->epoch == 1) l->first = e->train_loss;
    l->last = e->train_loss;
}

typedef struct {
    const char *strategy; /* NULL: one process */
    int batch;
    int64_t steps;
    const char *save, *resume;
} run_cfg;

/* Trains rc with comm; the parameters into out, the losses into *l. */
static dt_status train(const run_cfg *rc, dt_comm *comm, float *out, size_t *n, losses *l) {
    dt_train_config cfg = dt_train_defaults();
    cfg.data = g_csv, cfg.model = MODEL, cfg.epochs = EPOCHS, cfg.batch = rc->batch, cfg.max_steps = rc->steps;
    cfg.seed = 7, cfg.optim = dt_optim_defaults(DT_OPTIM_SGD), cfg.optim.momentum = 0.9f, cfg.lr.base_lr = 0.05f;
    cfg.comm = comm, cfg.strategy = rc->strategy, cfg.save = rc->save, cfg.resume = rc->resume;
    cfg.on_epoch = on_epoch, cfg.cb_ctx = l;
    return dt_test_train_params(&cfg, out, CAP, n);
}

/* Runs rc on 2 forked ranks; rank 0 writes [first loss, last loss, parameters...] to path. Each
 * rank checks that the replicas are bitwise equal. The number of failed ranks. */
static int run_2(const run_cfg *rc, const char *path, const char *job) {
    for (int r = 0; r < 2; r++) {
        if (fork() != 0) continue;
        dt_comm *c = dt_test_rank_comm(r, 2, job);
        static float p[CAP + 2];
        size_t n = 0;
        losses l = {0};
        if (train(rc, c, p + 2, &n, &l) != DT_OK) {
            fprintf(stderr, "rank %d: %s\n", r, dt_last_error());
            _exit(3);
        }
        float other[CAP];
        if (dt_comm_allreduce(c, p + 2, other, n, DT_F32, DT_OP_MAX) != DT_OK || memcmp(other, p + 2, n * 4) != 0) {
            fprintf(stderr, "rank %d: the replicas differ after training\n", r);
            _exit(4);
        }
        p[0] = l.first, p[1] = l.last;
        if (r == 0 && dt_test_write_floats(path, p, n + 2) != 0) _exit(5);
        dt_comm_destroy(c);
        _exit(0);
    }
    return dt_test_wait_children();
}

/* run_2 into out ([first, last, params...]); the number of floats read. */
static size_t run_2_read(const run_cfg *rc, const char *tag, float *out) {
    char path[160], job[64];
    snprintf(path, sizeof path, "%s/%s", g_dir, tag);
    snprintf(job, sizeof job, "toy%d%s", (int)getpid(), tag);
    CHECK_MSG(run_2(rc, path, job) == 0, "%s: a rank failed", tag);
    return dt_test_read_floats(path, out, CAP + 2);
}

static void test_registered(void) {
    CHECK_OK(dt_compress_register(&toy_compress_sign));
    CHECK_OK(dt_strategy_register(&toy_strategy_allreduce_entry));
    CHECK(dt_strategy_register(&toy_strategy_allreduce_entry) == DT_EINVAL); /* once */
    bool listed[2] = {false, false};
    dt_registry_entry e;
    for (int i = 0; dt_registry_entry_at(DT_REGISTRY_COMPRESSOR, i, &e); i++) listed[0] |= !strcmp(e.name, "sign");
    for (int i = 0; dt_registry_entry_at(DT_REGISTRY_STRATEGY, i, &e); i++) listed[1] |= !strcmp(e.name, "allreduce");
    CHECK_MSG(listed[0] && listed[1], "listed: sign %d, allreduce %d", listed[0], listed[1]);
    CHECK(strstr(dt_strategy_spec_help(), "allreduce(chunk_mb=MB)\n") != NULL);
    char out[256];
    CHECK_OK(dt_strategy_spec_canonical("ddp(compress=sign:block=8)", out, sizeof out));
    CHECK_MSG(!strcmp(out, "ddp(bucket_mb=1,compress=sign:block=8)"), "canonical: %s", out);
    CHECK_OK(dt_strategy_spec_canonical("allreduce", out, sizeof out));
    CHECK_MSG(!strcmp(out, "allreduce(chunk_mb=1)"), "canonical: %s", out);
    dt_compress_spec s;
    CHECK(dt_compress_parse("sign:block=0", &s) == DT_EINVAL && strstr(dt_last_error(), "sign:block=N"));
    dt_error_clear();
}

/* allreduce: 2 workers x 8 == 1 process x 16, and the loss falls. */
static void test_strategy(void) {
    static float one[CAP], two[CAP + 2];
    size_t n = 0;
    losses l = {0};
    const run_cfg single = {.strategy = NULL, .batch = 16, .steps = 30};
    CHECK_OK(train(&single, NULL, one, &n, &l));
    const run_cfg ar = {.strategy = "allreduce(chunk_mb=0.0002)", .batch = 8, .steps = 30}; /* 52-float chunks */
    size_t m = run_2_read(&ar, "ar", two);
    CHECK_MSG(m == n + 2 && n > 0, "%zu floats read, want %zu", m, n + 2);
    const double d = dt_test_maxdiff(one, two + 2, n);
    printf("allreduce(chunk_mb=0.0002), 2 workers x 8 vs single x 16, 30 steps: max |diff| %.3g; loss %.4f -> %.4f\n",
           d, two[0], two[1]);
    CHECK_MSG(d < 2e-5, "2 workers differ from 1 process at the same global batch by %g", d);
    CHECK_MSG(two[1] < 0.8f * two[0], "the loss did not fall: %g -> %g", two[0], two[1]);
}

/* ddp(compress=sign): the loss falls, and a resume from a checkpoint at step 11 ends bitwise
 * where the straight run ends (the error-feedback state travels in the checkpoint). */
static void test_compressor_training(void) {
    static float a[CAP + 2], b[CAP + 2];
    char st_a[160], st_b[160], st_c[160];
    snprintf(st_a, sizeof st_a, "%s/a.safetensors", g_dir);
    snprintf(st_b, sizeof st_b, "%s/b.safetensors", g_dir);
    snprintf(st_c, sizeof st_c, "%s/c.safetensors", g_dir);
    const char *spec = "ddp(bucket_mb=0.0005,compress=sign:block=16)";
    const run_cfg straight = {.strategy = spec, .batch = 8, .steps = 24, .save = st_a};
    size_t na = run_2_read(&straight, "sa", a);
    printf("%s, 2 workers x 8, 24 steps: loss %.4f -> %.4f\n", spec, a[0], a[1]);
    CHECK_MSG(na > 2 && a[1] < 0.8f * a[0], "the loss did not fall: %g -> %g", a[0], a[1]);
    const run_cfg first = {.strategy = spec, .batch = 8, .steps = 11, .save = st_b};
    const run_cfg rest = {.strategy = spec, .batch = 8, .steps = 24, .save = st_c, .resume = st_b};
    run_2_read(&first, "sb", b);
    size_t nc = run_2_read(&rest, "sc", b);
    CHECK_MSG(nc == na && !memcmp(a + 2, b + 2, (na - 2) * sizeof(float)),
              "11 steps + resume to 24 differ from 24 straight");
    /* the checkpoint holds the state (safetensors' header is JSON text) */
    FILE *f = fopen(st_b, "rb");
    char head[8192] = "";
    size_t got = f ? fread(head, 1, sizeof head - 1, f) : 0;
    if (f) fclose(f);
    head[got] = 0;
    CHECK_MSG(memmem(head, got, "compress.sign.state", 19) != NULL, "no compress.sign.state in %s", st_b);
}

/* Copies each piece into / out of a buffer (a checkpoint in memory). */
typedef struct {
    float *buf;
    bool restore;
} state_copy;

static dt_status copy_piece(void *ctx, const dt_state_piece *p) {
    state_copy *c = ctx;
    if (c->restore) memcpy(p->buf.data, c->buf, p->numel * sizeof(float));
    else memcpy(c->buf, p->buf.data, p->numel * sizeof(float));
    return DT_OK;
}

/* One step of sync g on gradients keyed by step into x. */
static void sync_step(dt_grad_sync *g, float *x, size_t n, int step) {
    dt_rng_fill_normal(x, n, 0.0f, 1.0f, 5, (uint64_t)step);
    dt_grad_sync_begin_step(g, step);
    dt_grad_sync_start(g, 0, x);
    CHECK_OK(dt_grad_sync_finish(g, 0));
}

/* The state given to a new sync carries on bitwise; a zero state does not. */
static void test_state_round_trip(void) {
    dt_comm *c;
    dt_model *m;
    dt_comm_config cc = dt_comm_config_default();
    CHECK_OK(dt_comm_create(&c, &cc));
    CHECK_OK(dt_model_create_from_spec(&m, MODEL, 1, 1, 12));
    const size_t n = dt_model_num_params(m);
    size_t lo = 0, hi = n;
    dt_grad_sync_config gc = {.comm = c, .model = m, .n = n, .lo = &lo, .hi = &hi, .nb = 1};
    dt_compress_spec cs;
    CHECK_OK(dt_compress_parse("sign:block=8", &cs));
    dt_grad_sync *a, *b, *z;
    CHECK_OK(dt_grad_sync_create(&a, &cs, &gc));
    CHECK_OK(dt_grad_sync_create(&b, &cs, &gc));
    CHECK_OK(dt_grad_sync_create(&z, &cs, &gc));
    static float xa[CAP], xb[CAP], xz[CAP], saved[CAP];
    for (int t = 0; t < 3; t++) sync_step(a, xa, n, t);
    state_copy out = {saved, false}, in = {saved, true};
    CHECK_OK(dt_grad_sync_gather_state(a));
    CHECK_OK(dt_grad_sync_visit_state(a, copy_piece, &out));
    CHECK_OK(dt_grad_sync_visit_state(b, copy_piece, &in));
    sync_step(a, xa, n, 3), sync_step(b, xb, n, 3), sync_step(z, xz, n, 3);
    CHECK_MSG(!memcmp(xa, xb, n * sizeof(float)), "the sync given the saved state sends other values");
    const double d = dt_test_maxdiff(xa, xz, n);
    CHECK_MSG(d > 1e-3, "a sync without the state sends the same values (max |diff| %g): the state is unused", d);
    printf("sign:block=8 error feedback: restored state resends bitwise; without it max |diff| %.3g\n", d);
    dt_grad_sync_destroy(a), dt_grad_sync_destroy(b), dt_grad_sync_destroy(z);
    dt_model_destroy(m);
    dt_comm_destroy(c);
}

int main(void) {
    dt_test_write_toy_csv(g_dir, g_csv, "/tmp/dtrain-toy-XXXXXX", 3);
    test_registered();
    test_strategy();
    test_compressor_training();
    test_state_round_trip();
    dt_test_remove_dir(g_dir);
    return dt_test_summary("toy_parallel_test");
}
