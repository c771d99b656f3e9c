/* The strategy registry: every entry, spec parsing (defaults, spaces, each strategy's options,
 * the canonical form), every error message of the parser and of each entry's set/check, adding a
 * flag's option to a spec, the data part through the registry, the factory's rank rules, and
 * that a spec option reaches the strategy: ddp(bucket_mb=...) changes the buckets of a step,
 * localsgd(sync_every=...) when it averages, ps(shards=...) whether the servers hand out batches;
 * the parts of a memory plan that ddp's, tp's and pp's entries fill. */
#include "core/test.h"
#include "parallel/parallel_testlib.h"
#include "parallel/strategy.h"
#include "dtrain/dtrain.h"

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_entries(void) {
    int n;
    const dt_strategy_entry *const *e = dt_strategy_entries(&n);
    CHECK(n == 6);
    const char *names[] = {"single", "ddp", "localsgd", "ps", "tp", "pp"};
    for (int i = 0; i < n && i < 6; i++) {
        CHECK(!strcmp(e[i]->name, names[i]));
        CHECK(dt_strategy_find(names[i]) == e[i]);
        CHECK_MSG(e[i]->opts_size <= sizeof(dt_strategy_opts), "%s: %zu bytes", e[i]->name, e[i]->opts_size);
        CHECK(e[i]->create && e[i]->help && e[i]->help[0] && e[i]->options && e[i]->keys &&
              (e[i]->keys[0] == 0 || e[i]->set));
        CHECK(e[i]->needs_comm == (i > 0));
    }
    CHECK(dt_strategy_find("psx") == NULL && dt_strategy_find(NULL) == NULL);
    CHECK(strstr(dt_strategy_spec_help(), "ps(servers=S,staleness=S|inf,shards=dynamic|fixed,overlap=0|1)\n") != NULL);
    CHECK(strstr(dt_strategy_spec_help(), "single\n") != NULL);
    /* registering: refused without help, with a key its options do not show, or under a taken name
     * (tests/toy/ registers a strategy that trains) */
    dt_strategy_entry bad = *dt_strategy_find("localsgd");
    bad.name = "nohelp", bad.help = "";
    CHECK(dt_strategy_register(&bad) == DT_EINVAL && strstr(dt_last_error(), "nohelp"));
    bad.help = "h", bad.options = "sync_every=H";
    CHECK(dt_strategy_register(&bad) == DT_EINVAL && strstr(dt_last_error(), "compress"));
    bad.name = "ddp", bad.options = "sync_every=H,compress=C,balance=static|dynamic";
    CHECK(dt_strategy_register(&bad) == DT_EINVAL && strstr(dt_last_error(), "registered already"));
    dt_error_clear();
    CHECK(dt_strategy_entries(&n) && n == 6);
}

/* spec's canonical form is want. */
static void canon(const char *spec, const char *want) {
    char out[256];
    dt_status s = dt_strategy_spec_canonical(spec, out, sizeof out);
    CHECK_MSG(s == DT_OK && !strcmp(out, want), "%s: got '%s' (%s), want '%s'", spec, s == DT_OK ? out : "",
              s == DT_OK ? "ok" : dt_last_error(), want);
}

static void test_parse(void) {
    canon("single", "single");
    canon("ddp", "ddp(bucket_mb=1)"); /* the defaults */
    canon("localsgd", "localsgd(sync_every=8)");
    canon("ps", "ps(servers=1,staleness=inf,shards=dynamic,overlap=0)");
    canon("ps()", "ps(servers=1,staleness=inf,shards=dynamic,overlap=0)");
    canon("ps(servers=2,staleness=4)", "ps(servers=2,staleness=4,shards=dynamic,overlap=0)");
    canon("ps(staleness=inf,overlap=1)", "ps(servers=1,staleness=inf,shards=dynamic,overlap=1)");
    canon("ps(staleness=async,overlap=true)", "ps(servers=1,staleness=inf,shards=dynamic,overlap=1)");
    canon("ps(shards=fixed)", "ps(servers=1,staleness=inf,shards=fixed,overlap=0)");
    canon(" ps ( servers = 3 , staleness=0 ) ", "ps(servers=3,staleness=0,shards=dynamic,overlap=0)");
    canon("localsgd(sync_every=2)", "localsgd(sync_every=2)");
    canon("ddp(bucket_mb=0.5)", "ddp(bucket_mb=0.5)");
    canon("ddp(balance=static)", "ddp(bucket_mb=1)"); /* the default, left out */
    canon("ddp(balance=dynamic)", "ddp(bucket_mb=1,balance=dynamic)");
    canon("localsgd(balance=dynamic,sync_every=2)", "localsgd(sync_every=2,balance=dynamic)");
    dt_strategy_opts o; /* the trainer reads balance=dynamic through the entry */
    const dt_strategy_entry *e = NULL;
    CHECK_OK(dt_strategy_parse("localsgd(balance=dynamic)", &e, &o));
    CHECK(e && e->balanced && e->balanced(&o));
    CHECK_OK(dt_strategy_parse("ddp(balance=static)", &e, &o));
    CHECK(e && e->balanced && !e->balanced(&o));
    CHECK_OK(dt_strategy_parse("ps", &e, &o));
    CHECK(e && !e->balanced);
    char name[16];
    int servers = -1;
    CHECK_OK(dt_strategy_spec_info("ps(servers=2,staleness=4)", name, sizeof name, &servers));
    CHECK(!strcmp(name, "ps") && servers == 2);
    CHECK_OK(dt_strategy_spec_info("localsgd(sync_every=3)", name, sizeof name, &servers));
    CHECK(!strcmp(name, "localsgd") && servers == 0);
}

/* spec fails with exactly message want. */
static void fails(const char *spec, const char *want) {
    dt_strategy_opts o;
    const dt_strategy_entry *e = (const dt_strategy_entry *)&o;
    dt_status s = dt_strategy_parse(spec, &e, &o);
    CHECK_MSG(s == DT_EINVAL && e == NULL && !strcmp(dt_last_error(), want), "%s: got %s '%s', want '%s'",
              spec ? spec : "(null)", dt_status_str(s), dt_last_error(), want);
}

static void test_errors(void) {
    fails(NULL, "`strategy`: no strategy given (choose single, ddp, localsgd, ps, tp or pp)");
    fails("psx", "`strategy` psx: unknown strategy (choose single, ddp, localsgd, ps, tp or pp)");
    fails("psx(servers=2)", "`strategy` psx: unknown strategy (choose single, ddp, localsgd, ps, tp or pp)");
    fails(
        "ddp(staleness=2)",
        "`strategy` ddp: unknown option 'staleness' (ddp takes bucket_mb, compress, allreduce, zero, update, balance)");
    fails("single(x=1)", "`strategy` single: unknown option 'x' (single takes no options)");
    fails("localsgd(servers=1)",
          "`strategy` localsgd: unknown option 'servers' (localsgd takes sync_every, compress, balance)");
    fails("ps(bucket_mb=1)",
          "`strategy` ps: unknown option 'bucket_mb' (ps takes servers, staleness, shards, overlap)");
    const char *form = "; write NAME or NAME(KEY=VALUE,...), e.g. ps(servers=2,staleness=4)";
    char want[256];
    snprintf(want, sizeof want, "`strategy` 'ps(servers=2': no closing ')'%s", form);
    fails("ps(servers=2", want);
    snprintf(want, sizeof want, "`strategy` '(servers=2)': no strategy name%s", form);
    fails("(servers=2)", want);
    snprintf(want, sizeof want, "`strategy` '': no strategy name%s", form);
    fails("", want);
    snprintf(want, sizeof want, "`strategy` 'ps(servers=(2))': unbalanced parentheses%s", form);
    fails("ps(servers=(2))", want);
    fails("ps(servers)", "`strategy` ps: option 'servers' is not KEY=VALUE");
    fails("ps(servers=)", "`strategy` ps: option 'servers=' is not KEY=VALUE");
    fails("ps(servers=1,)", "`strategy` ps: option '' is not KEY=VALUE");
    fails("ps(servers=1,servers=2)", "`strategy` ps: option 'servers' is given twice");
    /* each option's values */
    fails("ddp(bucket_mb=0)", "`strategy` ddp: bucket_mb=0: need a size in MB above 0, e.g. bucket_mb=0.5");
    fails("ddp(bucket_mb=big)", "`strategy` ddp: bucket_mb=big: need a size in MB above 0, e.g. bucket_mb=0.5");
    fails("ddp(balance=maybe)", "`strategy` ddp: balance=maybe: choose static (every rank its equal share of each "
                                "global batch) or dynamic (each global batch cut by the ranks' measured speed)");
    fails("localsgd(sync_every=x)", "`strategy` localsgd: sync_every=x: not a whole number of steps");
    fails("localsgd(sync_every=0)", "`strategy` localsgd: sync_every=0: need at least 1 (e.g. localsgd(sync_every=8))");
    fails("ps(servers=two)", "`strategy` ps: servers=two: not a whole number of ranks");
    fails("ps(servers=0)", "`strategy` ps: servers=0: need at least 1 (e.g. ps(servers=1))");
    fails("ps(staleness=soon)", "`strategy` ps: staleness=soon: not a whole number of batches (use staleness=S, 0 = "
                                "synchronous, or staleness=inf)");
    fails("ps(staleness=-1)", "`strategy` ps: staleness=-1: not a whole number of batches (use staleness=S, 0 = "
                              "synchronous, or staleness=inf)");
    fails("ps(shards=half)", "`strategy` ps: shards=half: use shards=dynamic (server 0 hands out the batches, the "
                             "default) or shards=fixed (each worker owns 1/N of every epoch)");
    fails("ps(overlap=yes)", "`strategy` ps: overlap=yes: use overlap=1 or overlap=0");
    /* the rules between options (check) */
    fails("ps(staleness=2,overlap=1)", "`strategy` ps: overlap=1 needs shards=dynamic and staleness=inf (it adds a "
                                       "step of staleness that a bound does not count): use staleness=inf, or drop "
                                       "overlap");
    fails("ps(shards=fixed,overlap=1)", "`strategy` ps: overlap=1 needs shards=dynamic and staleness=inf (it adds a "
                                        "step of staleness that a bound does not count): use shards=dynamic, or drop "
                                        "overlap");
}

/* spec + key=value gives want (NULL: an error with message err). */
static void adds(const char *spec, const char *key, const char *value, const char *want, const char *err) {
    char out[256];
    dt_status s = dt_strategy_spec_add_option(spec, key, value, out, sizeof out);
    if (want)
        CHECK_MSG(s == DT_OK && !strcmp(out, want), "%s + %s=%s: got '%s' (%s)", spec, key, value,
                  s == DT_OK ? out : "", s == DT_OK ? "ok" : dt_last_error());
    else
        CHECK_MSG(s == DT_EINVAL && !strcmp(dt_last_error(), err), "%s + %s=%s: got '%s'", spec, key, value,
                  dt_last_error());
}

static void test_add(void) {
    adds("ps", "servers", "2", "ps(servers=2)", NULL);
    adds("ps(servers=2)", "staleness", "4", "ps(servers=2,staleness=4)", NULL);
    adds(" ps ( servers = 2 ) ", "servers", "2", "ps(servers=2)", NULL);        /* the same value: kept */
    adds("ps(staleness=inf)", "staleness", "async", "ps(staleness=inf)", NULL); /* the same as parsed */
    adds("ddp", "bucket_mb", "0.5", "ddp(bucket_mb=0.5)", NULL);
    adds("ps(servers=2)", "servers", "3", NULL, "`strategy` ps(servers=2) sets servers=2");
    adds("ps(staleness=3)", "staleness", "inf", NULL, "`strategy` ps(staleness=3) sets staleness=3");
    adds(
        "ddp", "staleness", "4", NULL,
        "`strategy` ddp: unknown option 'staleness' (ddp takes bucket_mb, compress, allreduce, zero, update, balance)");
    adds("ps(servers=x)", "servers", "3", NULL, "`strategy` ps: servers=x: not a whole number of ranks");
}

static void test_data_part(void) {
    dt_strategy_opts o;
    const dt_strategy_entry *e;
    int dr, dw;
    CHECK_OK(dt_strategy_parse("ps(servers=2)", &e, &o));
    const int want[5][2] = {{0, 3}, {0, 3}, {0, 3}, {1, 3}, {2, 3}}; /* servers get data rank 0 */
    for (int r = 0; r < 5; r++) {
        CHECK_OK(dt_strategy_data_part(e, &o, r, 5, &dr, &dw));
        CHECK_MSG(dr == want[r][0] && dw == want[r][1], "ps rank %d: %d of %d", r, dr, dw);
    }
    CHECK(dt_strategy_data_part(e, &o, 0, 2, &dr, &dw) == DT_EINVAL);
    CHECK_MSG(!strcmp(dt_last_error(), "`strategy` ps with 2 servers needs more than 2 ranks (servers plus at least "
                                       "one worker); this job has 2"),
              "%s", dt_last_error());
    CHECK_OK(dt_strategy_parse("ddp", &e, &o));
    CHECK_OK(dt_strategy_data_part(e, &o, 3, 5, &dr, &dw));
    CHECK(dr == 3 && dw == 5);
    CHECK_OK(dt_strategy_parse("localsgd(sync_every=2)", &e, &o));
    CHECK_OK(dt_strategy_data_part(e, &o, 1, 2, &dr, &dw));
    CHECK(dr == 1 && dw == 2);
    /* a tp x pp mesh (either strategy's spelling, TP innermost) splits the data over dp only; a
     * world it does not divide keeps (rank, size) */
    const char *mesh[][2] = {{"tp(tp=2,pp=2)", "tp(tp=2)"}, {"pp(stages=2,tp=2)", "pp(stages=3)"}};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(dt_strategy_parse(mesh[k][0], &e, &o));
        int bad = 0;
        for (int r = 0; r < 8; r++) {
            CHECK_OK(dt_strategy_data_part(e, &o, r, 8, &dr, &dw));
            bad += dr != r / 4 || dw != 2;
        }
        CHECK_OK(dt_strategy_data_part(e, &o, 5, 6, &dr, &dw));
        CHECK_MSG(bad == 0 && dr == 5 && dw == 6, "%s: %d ranks off; rank 5 of 6 -> %d of %d", mesh[k][0], bad, dr, dw);
        CHECK_OK(dt_strategy_parse(mesh[k][1], &e, &o));
        CHECK_OK(dt_strategy_data_part(e, &o, 5, 6, &dr, &dw));
        CHECK_MSG(dr == (k ? 1 : 2) && dw == (k ? 2 : 3), "%s: rank 5 of 6 -> %d of %d", mesh[k][1], dr, dw);
    }
}

/* A 2-layer model on 12 features and one step of 4 samples; returns the step's buckets (-1: error). */
static int one_step(const char *spec, dt_comm *c, int steps) {
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_strategy *s = NULL;
    int buckets = -1;
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_SGD);
    float x[4 * 12];
    int32_t y[4] = {0, 1, 2, 3};
    for (int i = 0; i < 4 * 12; i++) x[i] = (float)(i % 7) * 0.1f;
    dt_status st = dt_model_create_from_spec(&m, "linear(8) relu linear(4)", 12, 1, 1);
    if (st == DT_OK) dt_model_init(m, 1), st = dt_optim_create(&o, &oc, dt_model_num_params(m));
    if (st == DT_OK) st = dt_strategy_create(&s, spec, c, m, o, NULL);
    if (st == DT_OK) st = s->ops->init(s);
    for (int k = 0; k < steps && st == DT_OK; k++) {
        dt_step_batch b = {.feed = {.x = x, .y = y, .n = 4}, .n_global = 4, .world = 1, .step = k, .lr = 0.1f};
        dt_step_result r;
        if ((st = dt_strategy_train_step(s, &b, &r)) == DT_OK) buckets = r.st.buckets;
    }
    if (st != DT_OK) fprintf(stderr, "%s: %s\n", spec, dt_last_error());
    dt_strategy_destroy(s);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return st == DT_OK ? buckets : -1;
}

static void test_options_reach(void) {
    char job[64];
    snprintf(job, sizeof job, "strat1r%d", (int)getpid());
    dt_comm *c = dt_test_rank_comm(0, 1, job); /* one rank: ddp's allreduce is a copy */
    int b1 = one_step("ddp", c, 1), b2 = one_step("ddp(bucket_mb=0.00001)", c, 1);
    printf("ddp buckets of a 2-layer model: default %d, bucket_mb=0.00001 %d\n", b1, b2);
    CHECK(b1 == 1 && b2 == 2);
    /* localsgd averages (one bucket) at step sync_every */
    CHECK(one_step("localsgd(sync_every=2)", c, 1) == 0);
    CHECK(one_step("localsgd(sync_every=2)", c, 2) == 1);
    CHECK(one_step("localsgd(sync_every=1)", c, 1) == 1);
    /* the factory's rank rules */
    dt_strategy *s = NULL;
    CHECK(dt_strategy_create(&s, "single", c, NULL, NULL, NULL) == DT_EINVAL && !s);
    CHECK_MSG(strstr(dt_last_error(), "`strategy` single trains one process; with 1 ranks"), "%s", dt_last_error());
    CHECK(dt_strategy_create(&s, "ddp", NULL, NULL, NULL, NULL) == DT_EINVAL && !s);
    CHECK_MSG(
        !strcmp(dt_last_error(), "`strategy` ddp needs more than one rank (`workers` N, dtrain launch or mpirun)"),
        "%s", dt_last_error());
    CHECK(dt_strategy_create(&s, "ps", c, NULL, NULL, NULL) == DT_EINVAL && !s);
    CHECK_MSG(strstr(dt_last_error(), "needs more than 1 ranks"), "%s", dt_last_error());
    CHECK(one_step("single", NULL, 1) == 0);
    dt_comm_destroy(c);
}

/* ps over 2 ranks (created, not connected): shards= decides whether the servers hand out batches. */
static void test_ps_modes(void) {
    char job[64];
    snprintf(job, sizeof job, "strat2r%d", (int)getpid());
    for (int r = 0; r < 2; r++)
        if (fork() == 0) {
            dt_comm *c = dt_test_rank_comm(r, 2, job);
            dt_model *m = NULL;
            int bad = dt_model_create_from_spec(&m, "linear(4)", 3, 1, 1) != DT_OK;
            const char *specs[] = {"ps", "ps(shards=fixed)", "ps(overlap=1)"};
            for (int k = 0; k < 3 && !bad; k++) {
                dt_strategy *s = NULL;
                if (dt_strategy_create(&s, specs[k], c, m, NULL, NULL) != DT_OK) {
                    fprintf(stderr, "rank %d %s: %s\n", r, specs[k], dt_last_error());
                    bad = 1;
                    break;
                }
                bad |= dt_strategy_hands_out_batches(s) != (k != 1);
                bad |= s->role != (r == 0 ? DT_ROLE_SERVER : DT_ROLE_WORKER) || s->data_world != 1 ||
                       s->data_rank != 0 || s->job_rank0 != 1 || !s->local_mean;
                dt_strategy_destroy(s);
            }
            dt_model_destroy(m);
            dt_comm_destroy(c);
            _exit(bad);
        }
    int failed = 0, st;
    while (wait(&st) > 0) failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_MSG(failed == 0, "%d rank(s) saw the wrong ps mode", failed);
}

/* The memory plan's parts from the entries (dt_strategy_entry.mem_plan) on linear(8) relu linear(4)
 * over 12 features (140 values: 96 + 8, 32 + 4): each leaves a layout without its axis alone; ZeRO's
 * chunks of 3 ranks cover the slab once; tp=2 halves every tensor but the row-parallel bias (72);
 * pp=2's stages hold the two layers (104, 36). */
static void test_mem_plan(void) {
    dt_model *m = NULL;
    CHECK_OK(dt_model_build_unplaced(&m, "linear(8) relu linear(4)", 1, 1, 12));
    if (!m) return;
    const double P = (double)dt_model_num_params(m);
    int n;
    const dt_strategy_entry *const *e = dt_strategy_entries(&n);
    int with = 0;
    for (int i = 0; i < n; i++) {
        if (!e[i]->mem_plan) continue;
        dt_mem_share sh = {.dp = 1, .tp = 1, .pp = 1, .zero = 3, .mine = -1, .bucket_mb = 1};
        CHECK_OK(e[i]->mem_plan(m, &sh));
        CHECK_MSG(sh.mine == -1 && sh.zero_own == 0 && sh.inflight == 0, "%s fills a plan of one rank", e[i]->name);
        with++;
    }
    CHECK_MSG(with == 3, "%d entries plan memory (ddp, tp, pp)", with);
    if (!dt_strategy_ddp_entry.mem_plan || !dt_strategy_tp_entry.mem_plan || !dt_strategy_pp_entry.mem_plan) {
        dt_model_destroy(m);
        return;
    }
    double own = 0;
    for (int r = 0; r < 3; r++) {
        dt_mem_share sh = {.dp = 3, .tp = 1, .pp = 1, .zero = 2, .dp_rank = r, .bucket_mb = 0.00001};
        CHECK_OK(dt_strategy_ddp_entry.mem_plan(m, &sh));
        own += sh.zero_own;
        CHECK(sh.inflight == 2 && sh.big[0] > 0 && sh.big[0] < sh.big[1] && sh.big[2] <= P);
    }
    CHECK_MSG(P == 140 && own == P, "ZeRO's chunks of 3 ranks own %.0f of %.0f values", own, P);
    dt_mem_share t = {.dp = 1, .tp = 2, .pp = 1};
    CHECK_OK(dt_strategy_tp_entry.mem_plan(m, &t));
    CHECK_MSG(t.mine == 72, "tp=2 holds %.0f values", t.mine);
    double stage[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        dt_mem_share sh = {.dp = 1, .tp = 1, .pp = 2, .stage = k};
        CHECK_OK(dt_strategy_pp_entry.mem_plan(m, &sh));
        stage[k] = sh.mine;
    }
    CHECK_MSG(stage[0] == 104 && stage[1] == 36, "pp=2's stages hold %.0f and %.0f values", stage[0], stage[1]);
    dt_model_destroy(m);
}

int main(void) {
    test_entries();
    test_parse();
    test_errors();
    test_add();
    test_data_part();
    test_options_reach();
    test_ps_modes();
    test_mem_plan();
    return dt_test_summary("strategy_test");
}
