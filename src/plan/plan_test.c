/* The planner against hand-worked cases: a ring allreduce's time from bandwidth and latency, the
 * 1F1B bubble, ZeRO's bytes per stage, the tp bytes `dtrain bench tp` counts, which link an axis
 * crosses; the data-parallel sync as ddp and ZeRO 1-3 run it (what is hidden, what blocks, the
 * waits, MPI's reduce-scatter); a pipeline's step (its recomputed forwards, the fill and drain, 1F1B's
 * round trips); the search on planted clusters whose answer is known (a slow inter-host link makes tp
 * across hosts lose; a tight memory limit forces ZeRO 3 or pp, and counts what evaluation and
 * checkpoints gather); cluster files whose bad field is
 * named; per-node times measured here. */
#include "core/test.h"
#include "parallel/pp.h"
#include "plan/plan.h"

#include <string.h>

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(b) > 1 ? fabs(b) : 1); }

static void test_formulas(void) {
    const dt_plan_link l = {.bw = 10e9, .lat = 10e-6};
    /* 100 MB over 4 ranks: 2 x 3/4 x 1e8 / 1e10 = 15 ms on the wire, 2 x 3 hops x 10 us */
    CHECK(near(dt_plan_ring_allreduce_s(100e6, 4, l), 0.015 + 60e-6));
    CHECK(near(dt_plan_ring_half_s(100e6, 4, l), 0.0075 + 30e-6));
    CHECK(dt_plan_ring_allreduce_s(100e6, 1, l) == 0);
    /* 1F1B with 4 stages and 8 micro-batches: 3 of 11 slots idle */
    CHECK(near(dt_plan_bubble_fraction(4, 8), 3.0 / 11));
    CHECK(dt_plan_bubble_fraction(1, 8) == 0);
    /* ZeRO over 4 ranks, 1 MB of gradients: stages 0-2 one allreduce's 1.5 MB, stage 3 2.25 MB */
    for (int z = 0; z <= 2; z++) CHECK(near(dt_plan_zero_bytes(z, 4, 1e6), 1.5e6));
    CHECK(near(dt_plan_zero_bytes(3, 4, 1e6), 2.25e6));
    CHECK(dt_plan_zero_bytes(3, 1, 1e6) == 0);
    /* the default GPT (L=4, C=128, T=64) at b=12 over tp 2 (ring factor 1): b T C x 4 bytes =
     * 393216; 4 per block x 4 blocks + 2 (embedding, head) = 18 of them, plus 3 b T x 4 = 9216 */
    const dt_gpt_config g = {.L = 4, .H = 4, .C = 128, .T = 64, .V = 256};
    CHECK(near(dt_plan_tp_bytes(&g, 12, 2), 18 * 393216.0 + 9216));
    CHECK(near(dt_plan_tp_bytes(&g, 12, 4), 1.5 * (18 * 393216.0 + 9216)));
    CHECK(dt_plan_tp_bytes(&g, 12, 1) == 0);
    /* 2 hosts x 4 ranks: tp 4 stays in a host, tp 8 crosses; dp over 2 copies of 4 crosses */
    dt_plan_cluster c = {.hosts = 2, .ranks_per_host = 4};
    CHECK(dt_plan_axis_level(&c, 1, 4) == DT_PLAN_INTRA);
    CHECK(dt_plan_axis_level(&c, 1, 8) == DT_PLAN_INTER);
    CHECK(dt_plan_axis_level(&c, 4, 2) == DT_PLAN_INTER);
    CHECK(dt_plan_axis_level(&c, 2, 2) == DT_PLAN_INTRA);
}

/* A cluster of fast devices: hosts x rph, inter-host link Gbit/s. */
static dt_plan_cluster planted(int hosts, int rph, double inter_gbit) {
    dt_plan_cluster c = {.hosts = hosts,
                         .ranks_per_host = rph,
                         .efficiency = 0.5,
                         .mem_bw = 1e12,
                         .mem_bytes = 80e9,
                         .overlap = 0.9,
                         .link = {{300e9, 3e-6}, {inter_gbit * 1e9 / 8, 5e-6}}};
    c.peak[DT_PLAN_FP32] = 20e12;
    snprintf(c.name, sizeof c.name, "planted");
    return c;
}

static const dt_plan_entry *best_of(const dt_plan_result *r, bool (*pick)(const dt_plan_layout *)) {
    for (int i = 0; i < r->n; i++)
        if (r->e[i].c.fits && pick(&r->e[i].l)) return &r->e[i];
    return NULL;
}
static bool tp4(const dt_plan_layout *l) { return l->tp == 4 && l->pp == 1; }
static bool ddp(const dt_plan_layout *l) { return l->tp == 1 && l->pp == 1 && l->zero == 0; }

/* 2 hosts x 2 ranks joined by 0.1 Gbit/s: tp 4 would run its allreduces across the slow link. */
static void test_slow_link(void) {
    dt_model *m;
    dt_plan_model pm;
    CHECK_OK(dt_model_build_unplaced(&m, "gpt:L=2,H=4,C=256,T=32", 1, 1, 1));
    CHECK_OK(dt_plan_model_init(&pm, m));
    const dt_optim_config o = dt_optim_defaults(DT_OPTIM_ADAM);
    dt_plan_cluster c = planted(2, 2, 0.1);
    const dt_plan_request r = {.G = 16, .ranks = 4, .precs = 1, .fix_tp = -1, .fix_pp = -1, .fix_zero = -1};
    dt_plan_result res;
    CHECK_OK(dt_plan_search(m, &pm, &o, &c, &r, &res));
    CHECK(res.n > 100 && res.e[0].c.fits);
    CHECK_MSG(res.e[0].l.tp < 4, "best tp %d", res.e[0].l.tp);
    const dt_plan_entry *t = best_of(&res, tp4);
    CHECK(t && t->c.tp_level == DT_PLAN_INTER && t->c.comm_tp > res.e[0].c.total);
    if (t) {
        char why[512];
        dt_plan_why(t, &res.e[0], &c, c.mem_bytes, why, sizeof why);
        CHECK_MSG(strstr(why, "tp 4 would send") && strstr(why, "0.1 Gbit/s inter-node"), "%s", why);
    }
    const double slow_tp = t ? t->c.comm_tp : 0;
    dt_plan_result_free(&res);
    /* the same hosts on a fast link: tp 4 now costs far less than it did */
    c = planted(2, 2, 1600);
    CHECK_OK(dt_plan_search(m, &pm, &o, &c, &r, &res));
    const dt_plan_entry *t2 = best_of(&res, tp4);
    CHECK(t2 && t2->c.comm_tp * 100 < slow_tp);
    dt_plan_result_free(&res);
    /* tp inside a 2-stage pipeline: each stage's tp ranks carry only its block (L=2: one each) */
    int first[3];
    CHECK_OK(dt_pp_cut(m, 2, "", NULL, first));
    const dt_plan_layout tpp = {.dp = 1, .tp = 2, .pp = 2, .micro = 4, .bucket_mb = 1};
    dt_plan_cost cost;
    dt_plan_predict(&pm, &c, &tpp, 16, 2, first, &cost);
    dt_gpt_config one = pm.g;
    one.L = 1;
    CHECK_MSG(near(cost.tp_bytes, 4 * dt_plan_tp_bytes(&one, 4, 2)), "%g", cost.tp_bytes);
    dt_plan_model_free(&pm);
    dt_model_destroy(m);
}

/* An MLP whose Adam state does not fit 4 replicas under the limit: only ZeRO 3 or pp does. */
static void test_tight_memory(void) {
    dt_model *m;
    dt_plan_model pm;
    CHECK_OK(dt_model_build_unplaced(&m, "linear(2048) relu linear(2048) relu linear(10)", 1, 28, 28));
    CHECK_OK(dt_plan_model_init(&pm, m));
    const dt_optim_config o = dt_optim_defaults(DT_OPTIM_ADAM);
    dt_plan_cluster c = planted(1, 4, 100);
    dt_plan_request r = {.G = 64, .ranks = 4, .precs = 1, .fix_tp = -1, .fix_pp = -1, .fix_zero = -1, .want = 1000000};
    dt_plan_result res;
    CHECK_OK(dt_plan_search(m, &pm, &o, &c, &r, &res));
    double ddp_mem = 1e30, small = 1e30; /* ddp's least memory, and the least of ZeRO 1-2 */
    int dp_pp = 0, dp_pp_buckets = 0;    /* train refuses --bucket-mb with --pp: a stage syncs in one allreduce */
    for (int i = 0; i < res.n; i++) {
        const dt_plan_layout *l = &res.e[i].l;
        char flags[256];
        dt_plan_flags(l, r.G, flags, sizeof flags);
        dp_pp += l->dp > 1 && l->pp > 1, dp_pp_buckets += l->pp > 1 && strstr(flags, "--bucket-mb") != NULL;
        if (ddp(l) && res.e[i].c.mem < ddp_mem) ddp_mem = res.e[i].c.mem;
        if (l->tp == 1 && l->pp == 1 && (l->zero == 1 || l->zero == 2) && res.e[i].c.mem < small)
            small = res.e[i].c.mem;
    }
    dt_plan_result_free(&res);
    CHECK_MSG(dp_pp > 0 && dp_pp_buckets == 0, "%d dp x pp layouts, %d of them with --bucket-mb", dp_pp, dp_pp_buckets);
    const double P = pm.total_params;
    CHECK_MSG(ddp_mem >= 16 * P && ddp_mem < 17 * P, "ddp %.0f bytes for %.0f parameters", ddp_mem, P);
    r.mem_limit = 0.9 * (small < ddp_mem ? small : ddp_mem); /* below ZeRO 1-2 and ddp */
    CHECK_OK(dt_plan_search(m, &pm, &o, &c, &r, &res));
    CHECK(res.e[0].c.fits && res.e[0].c.mem <= r.mem_limit);
    CHECK_MSG(res.e[0].l.zero == 3 || res.e[0].l.pp > 1, "best zero %d pp %d", res.e[0].l.zero, res.e[0].l.pp);
    for (int i = 0; i < res.n; i++)
        if (ddp(&res.e[i].l)) CHECK(!res.e[i].c.fits);
    dt_plan_result_free(&res);
    dt_plan_model_free(&pm);
    dt_model_destroy(m);
}

static void expect_error(const char *json, const char *field) {
    dt_plan_cluster c;
    const dt_status s = dt_plan_cluster_parse(json, "t.json", &c);
    CHECK_MSG(s == DT_EINVAL && strstr(dt_last_error(), field) && strstr(dt_last_error(), "t.json"), "%s: %s", field,
              dt_last_error());
}

static void test_cluster_files(void) {
#define DEV \
    "\"device\": {\"peak_tflops\": {\"fp32\": 19.5, \"bf16\": 312}, \"mem_bandwidth_GB_s\": 2039, \"mem_GB\": 80}"
#define LINKS                                                                  \
    "\"links\": {\"intra\": {\"bandwidth_Gbit_s\": 2400, \"latency_us\": 3}, " \
    "\"inter\": {\"bandwidth_Gbit_s\": 200, \"latency_us\": 5}}"
    dt_plan_cluster c;
    CHECK_OK(dt_plan_cluster_parse("{\"hosts\": 2, \"ranks_per_host\": 8, " DEV ", " LINKS "}", "t.json", &c));
    CHECK(c.hosts == 2 && c.ranks_per_host == 8 && near(c.peak[DT_PLAN_BF16], 312e12) && c.peak[DT_PLAN_FP16] == 0);
    CHECK(near(c.link[DT_PLAN_INTER].bw, 25e9) && near(c.link[DT_PLAN_INTRA].lat, 3e-6) && near(c.mem_bytes, 80e9));
    expect_error("{\"ranks_per_host\": 8, " LINKS "}", "device");
    expect_error("{\"ranks_per_host\": 8, \"device\": {\"peak_tflops\": {\"fp32\": 1}, \"mem_GB\": 80}, " LINKS "}",
                 "device.mem_bandwidth_GB_s");
    expect_error("{\"ranks_per_host\": 8, \"device\": {\"peak_tflops\": {\"fp33\": 1}}, " LINKS "}",
                 "device.peak_tflops.fp33");
    expect_error("{\"hosts\": 2, \"ranks_per_host\": 8, " DEV ", \"links\": {\"intra\": {\"bandwidth_Gbit_s\": 1, "
                 "\"latency_us\": 1}}}",
                 "links.inter");
    expect_error("{\"ranks_per_host\": 8, " DEV ", \"links\": {\"intra\": {\"bandwidth_Gbit_s\": \"fast\", "
                 "\"latency_us\": 1}}}",
                 "links.intra.bandwidth_Gbit_s");
    expect_error("{\"ranks_per_host\": -8, " DEV ", " LINKS "}", "ranks_per_host");
    expect_error("{\"ranks_per_host\": 8, " DEV ", " LINKS ", \"nodes\": 3}", "nodes");
    expect_error("{\"ranks_per_host\": 8, " DEV ", ", "not valid JSON");
    CHECK(dt_plan_cluster_load("/nonexistent/c.json", &c) == DT_EIO && strstr(dt_last_error(), "/nonexistent/c.json"));
#undef DEV
#undef LINKS
}

/* The layouts that change the algorithm, by hand: top-k's allgather of (index, value) pairs,
 * PowerSGD's P and Q, a ps worker's push and pull, and ranks sharing cores with other tasks. */
static void test_algo_formulas(void) {
    const dt_plan_link l = {.bw = 1e9, .lat = 1e-5};
    dt_plan_model pm = {.mat_params = 1e6, .mat_dims = 2000, .vec_params = 0}; /* one 1000 x 1000 matrix */
    double bytes;
    /* top-k 1% of 1e6 over 4 ranks: k = 10000 pairs of 8 bytes; the allgather of 4 k pairs sends 3 k
     * of them: 240000 bytes in 240 us, 3 hops x 10 us */
    CHECK(near(dt_plan_sync_s(&pm, 1e6, 4, DT_PLAN_TOPK, 0.01, l, &bytes), 240e-6 + 30e-6) && near(bytes, 240000));
    /* PowerSGD rank 4: 4 x (1000 + 1000) values = 32000 bytes, allreduced (48 us + 6 x 10 us) and a
     * second allreduce's latency */
    CHECK(near(dt_plan_sync_s(&pm, 1e6, 4, DT_PLAN_POWERSGD, 4, l, &bytes), 48e-6 + 120e-6) && near(bytes, 48000));
    /* bf16: 2 bytes a value, one allreduce */
    CHECK(near(dt_plan_sync_s(&pm, 1e6, 4, DT_PLAN_BF16, 0, l, &bytes), 3e-3 + 60e-6) && near(bytes, 3e6));
    CHECK(dt_plan_sync_s(&pm, 1e6, 1, DT_PLAN_TOPK, 0.01, l, &bytes) == 0 && bytes == 0);
    /* ps, 3 workers and 1 server, 1e6 values: a worker moves 8 MB (8 ms), the server's link 12 MB
     * each way (12 ms): the server bounds it */
    CHECK(near(dt_plan_ps_s(1e6, 3, 1, l), 12e-3 + 20e-6));
    CHECK(near(dt_plan_ps_s(1e6, 1, 1, l), 8e-3 + 20e-6));
    /* 2 ranks on 2 idle cores run as fast as the one that measured; 4 take turns; beside 6 other
     * runnable tasks 2 ranks get 2 of 8 shares where the measuring process had 2 of 7 */
    CHECK(near(dt_plan_oversub(2, 2, 0), 1) && near(dt_plan_oversub(4, 2, 0), 2));
    CHECK(near(dt_plan_oversub(2, 2, 6), 8.0 / 7) && near(dt_plan_oversub(1, 1, 0), 1));
}

/* The data-parallel sync as ddp.c and zero.c run it, by hand: one node of 1e6 parameters (4 MB),
 * 3 ms of forward + backward (backward 2 ms), 2 ranks on a 1 GB/s link without latency, overlap
 * 0.5 (1 ms hidden), 1 MB buckets (4 of them: never less than one exposed), a collective wait of
 * 1 ms. A half (reduce-scatter or all-gather) of 4 MB over 2 ranks: 2 ms. */
static void test_dp_sync(void) {
    double flops = 1, bytes = 1, params = 1e6, outb = 4, fix = 3e-3, per = 0;
    bool split = false;
    const dt_plan_model pm = {.nodes = 1,
                              .flops = &flops,
                              .bytes = &bytes,
                              .params = &params,
                              .out_bytes = &outb,
                              .split = &split,
                              .t_fix = &fix,
                              .t_per = &per,
                              .total_params = 1e6};
    dt_plan_cluster c = {.hosts = 1,
                         .ranks_per_host = 2,
                         .efficiency = 1,
                         .mem_bw = 1e10,
                         .mem_bytes = 1e9,
                         .overlap = 0.5,
                         .coll_wait = 1e-3,
                         .link = {{1e9, 0, 1}, {1e9, 0, 1}}};
    c.peak[DT_PLAN_FP32] = 1e12;
    const int first[2] = {0, 1};
    dt_plan_layout l = {.dp = 2, .tp = 1, .pp = 1, .micro = 1, .bucket_mb = 1};
    dt_plan_cost o;
    /* ddp: the allreduce (4 ms) less the 1 ms hidden, one wait (its last bucket runs blocking) */
    dt_plan_predict(&pm, &c, &l, 2, 2, first, &o);
    CHECK_MSG(near(o.comm_dp, 3e-3 + 1e-3), "ddp %g", o.comm_dp);
    /* ZeRO-1 and ZeRO-2: the reduce-scatter less 1 ms hidden, then the all-gather after the update,
     * exposed; both start their last bucket in the hook (no wait) */
    for (int z = 1; z <= 2; z++) {
        l.zero = z;
        dt_plan_predict(&pm, &c, &l, 2, 2, first, &o);
        CHECK_MSG(near(o.comm_dp, 1e-3 + 2e-3), "ZeRO-%d %g", z, o.comm_dp);
    }
    /* ZeRO-3: no all-gather after the update; the one node's bucket, gathered before the forward
     * (2 ms), is still there for the backward (zero_params.c frees the others): 2 ms hidden behind
     * half of the 3 ms, never less than one of 4 buckets: 0.5 ms; no wait */
    l.zero = 3;
    dt_plan_predict(&pm, &c, &l, 2, 2, first, &o);
    CHECK_MSG(near(o.comm_dp, 1e-3 + 0.5e-3) && near(o.dp_bytes, 4e6), "ZeRO-3 %g (%g bytes)", o.comm_dp, o.dp_bytes);
    /* two nodes of 1e6 parameters (8 MB, a half 4 ms), 1.5 ms each: the last node's bucket stays
     * gathered, the first node's is gathered again before its backward: 6 ms of gathers less 1.5 ms
     * hidden; the reduce-scatter (4 ms) less half of the backward's 2 ms: 3 ms */
    double params2[2] = {1e6, 1e6}, fix2[2] = {1.5e-3, 1.5e-3}, zero2[2] = {0, 0}, one2[2] = {1, 1}, outb2[2] = {4, 4};
    bool split2[2] = {false, false};
    const dt_plan_model pm3 = {.nodes = 2,
                               .flops = one2,
                               .bytes = one2,
                               .params = params2,
                               .out_bytes = outb2,
                               .split = split2,
                               .t_fix = fix2,
                               .t_per = zero2,
                               .total_params = 2e6};
    const int first2[2] = {0, 2};
    dt_plan_predict(&pm3, &c, &l, 2, 2, first2, &o);
    CHECK_MSG(near(o.comm_dp, 3e-3 + 4.5e-3) && near(o.dp_bytes, 10e6), "ZeRO-3, 2 nodes %g (%g bytes)", o.comm_dp,
              o.dp_bytes);
    /* ddp with bf16 gradients: the allreduce of half the bytes (2 ms) less the 1 ms hidden; its last
     * bucket starts on the progress thread: no wait */
    l.zero = 0, l.compress = DT_PLAN_BF16;
    dt_plan_predict(&pm, &c, &l, 2, 2, first, &o);
    CHECK_MSG(near(o.comm_dp, 1e-3), "ddp bf16 %g", o.comm_dp);
    l.compress = DT_PLAN_FP32;
    /* over MPI between hosts the reduce-scatter costs twice the ring's: ZeRO-1 1.5x ddp's bytes */
    c.link[DT_PLAN_INTRA].rs_factor = 2, c.coll_wait = 0, l.zero = 1;
    dt_plan_predict(&pm, &c, &l, 2, 2, first, &o);
    CHECK_MSG(near(o.comm_dp, 3e-3 + 2e-3), "ZeRO-1 over MPI %g", o.comm_dp);
    l.zero = 0;
    dt_plan_predict(&pm, &c, &l, 2, 2, first, &o);
    CHECK_MSG(near(o.comm_dp, 3e-3), "ddp over MPI %g", o.comm_dp);
    /* the optimizer shares the cores: Adam on ZeRO-1's half, 7 x 4 bytes a value at 10 GB/s, x 2 */
    l.zero = 1, c.oversub = 2;
    dt_plan_predict(&pm, &c, &l, 2, 2, first, &o);
    CHECK_MSG(near(o.optim, 2 * 0.5e6 * 28 / 1e10) && near(o.compute, 6e-3), "optim %g compute %g", o.optim, o.compute);
    /* the update timed here (a small model's state in the caches): 2 ns a value, not 28 bytes over
     * the memory bandwidth (2.8 ns) */
    dt_plan_model pmo = pm;
    pmo.opt_per = 2e-9;
    dt_plan_predict(&pmo, &c, &l, 2, 2, first, &o);
    CHECK_MSG(near(o.optim, 2 * 0.5e6 * 2e-9), "measured optim %g", o.optim);
    /* the step's other work (data, loss) per sample: the stages of a pipeline share it */
    dt_plan_model pm2 = pm;
    pm2.ovh_per = 1e-4;
    const int cut2[3] = {0, 1, 1};
    const dt_plan_layout pp2 = {.dp = 1, .tp = 1, .pp = 2, .micro = 2, .bucket_mb = 1};
    c.oversub = 1;
    dt_plan_predict(&pm2, &c, &pp2, 64, 2, cut2, &o);
    CHECK_MSG(near(o.overhead, 1e-4 * 64 / 2), "pp2 other %g", o.overhead);
    CHECK(dt_plan_dp_waits(0, DT_PLAN_FP32, 1) == 0 && dt_plan_dp_waits(3, DT_PLAN_FP32, 4) == 0);
}

/* A pipeline as pp_step.c runs it, by hand: two stages of 3 and 1 ms forward + backward per
 * micro-batch (a forward a third of it), 4 micro-batches, sends of latency only. Stage 0 is the
 * busiest: 4 x 3 ms and, holding one micro-batch's activations, 4 recomputed forwards of 1 ms under
 * 1F1B (GPipe: 3 on every stage). */
static void test_pipeline(void) {
    double flops[2] = {1, 1}, bytes[2] = {1, 1}, params[2] = {0, 0}, outb[2] = {0, 0}, fix[2] = {3e-3, 1e-3},
           per[2] = {0, 0};
    bool split[2] = {false, false};
    const dt_plan_model pm = {.nodes = 2,
                              .flops = flops,
                              .bytes = bytes,
                              .params = params,
                              .out_bytes = outb,
                              .split = split,
                              .t_fix = fix,
                              .t_per = per};
    dt_plan_cluster c = {.hosts = 1,
                         .ranks_per_host = 2,
                         .efficiency = 1,
                         .mem_bw = 1e10,
                         .mem_bytes = 1e9,
                         .overlap = 0.5,
                         .link = {{1e9, 0.1e-3, 1}, {1e9, 0.1e-3, 1}}};
    c.peak[DT_PLAN_FP32] = 1e12;
    const int first[3] = {0, 1, 2};
    dt_plan_layout l = {.dp = 1, .tp = 1, .pp = 2, .micro = 4, .bucket_mb = 1};
    dt_plan_cost o;
    /* compute-bound: stage 0 busy 16 ms, the fill and drain through stage 1 1 ms, two sends of
     * 0.1 ms; the other sends overlap the stages' work (was: 12 ms compute, a 3.2 ms bubble of the
     * busiest stage's time and 0.8 ms of sends, 16 ms) */
    dt_plan_predict(&pm, &c, &l, 8, 2, first, &o);
    CHECK_MSG(near(o.compute, 16e-3) && near(o.bubble, 1e-3) && near(o.comm_pp, 0.2e-3) && near(o.total, 17.2e-3),
              "1f1b compute %g bubble %g sends %g total %g", o.compute, o.bubble, o.comm_pp, o.total);
    /* latency-bound (5 ms a send): 1F1B's 2 in-flight micro-batches wait for a round trip (4 ms of
     * work, 10 of sends) twice: 28 ms; GPipe streams its sends: 15 + 1 + 10 = 26 ms (was: 65) */
    c.link[DT_PLAN_INTRA].lat = 5e-3;
    dt_plan_predict(&pm, &c, &l, 8, 2, first, &o);
    CHECK_MSG(near(o.total, 28e-3) && near(o.comm_pp, 11e-3), "1f1b latency-bound %g (sends %g)", o.total, o.comm_pp);
    l.gpipe = 1;
    dt_plan_predict(&pm, &c, &l, 8, 2, first, &o);
    CHECK_MSG(near(o.compute, 15e-3) && near(o.total, 26e-3), "gpipe compute %g total %g", o.compute, o.total);
    /* a balanced pipeline without latency: (M + pp - 1) stage times, 1F1B and GPipe alike */
    CHECK(near(dt_plan_pipeline_s(4, 8, 0, 8e-3, 1e-3, 4e-3, 0, 0), 11e-3));
    CHECK(near(dt_plan_pipeline_s(4, 8, 1, 8e-3, 1e-3, 4e-3, 0, 0), 11e-3));
    CHECK(near(dt_plan_pipeline_s(1, 8, 0, 8e-3, 1e-3, 1e-3, 1, 1), 8e-3));
    /* bandwidth-bound: 10 ms on the wire a send (5 MB a sample, 2 samples, 1 GB/s), no latency: the
     * link carries 4 sends each way, 40 ms, plus stage 1's 1 ms and the first and last sends, 20 ms
     * (1F1B: 61 ms; GPipe sends its forwards, then its gradients: 80 + 1 + 20) */
    outb[0] = 5e6, c.link[DT_PLAN_INTRA].lat = 0;
    dt_plan_predict(&pm, &c, &l, 8, 2, first, &o);
    CHECK_MSG(near(o.total, 101e-3), "gpipe bandwidth-bound %g", o.total);
    l.gpipe = 0;
    dt_plan_predict(&pm, &c, &l, 8, 2, first, &o);
    CHECK_MSG(near(o.total, 61e-3) && near(o.pp_bytes, 4 * 2 * 1e7), "1f1b bandwidth-bound %g", o.total);
}

static bool z3_dp4(const dt_plan_layout *l) { return l->dp == 4 && l->zero == 3 && l->micro == 1 && l->bucket_mb == 1; }

/* ZeRO-3's evaluation gathers the whole parameters (zero_state.c): a rank then holds 4 P bytes of
 * them beside its gradients, optimizer state and activations (--dry-run's 'at eval/ckpt'). Under a
 * limit between its training total and that, a run that evaluates must not get ZeRO-3. */
static void test_eval_memory(void) {
    dt_model *m;
    dt_plan_model pm;
    CHECK_OK(dt_model_build_unplaced(&m,
                                     "linear(1024) relu linear(1024) relu linear(1024) relu linear(1024) relu "
                                     "linear(4)",
                                     1, 1, 12));
    CHECK_OK(dt_plan_model_init(&pm, m));
    const dt_optim_config o = dt_optim_defaults(DT_OPTIM_ADAM);
    const double P = pm.total_params;
    const dt_mem_layout ml = {.dp = 4, .tp = 1, .pp = 1, .zero = 3, .microbatches = 1, .batch = 8, .bucket_mb = 1};
    dt_mem_plan mp;
    CHECK_OK(dt_mem_plan_rank(m, &o, &ml, 0, &mp));
    CHECK_MSG(mp.sync > 1e6 && near(mp.total + mp.sync, 4 * P + mp.grads + mp.optim + mp.activations), "%g + %g",
              mp.total, mp.sync);
    dt_plan_cluster c = planted(1, 4, 100);
    dt_plan_request r = {.G = 32,
                         .ranks = 4,
                         .precs = 1,
                         .fix_tp = 1,
                         .fix_pp = 1,
                         .fix_zero = 3,
                         .want = 1000000,
                         .mem_limit = mp.total + mp.sync / 2};
    dt_plan_result res;
    CHECK_OK(dt_plan_search(m, &pm, &o, &c, &r, &res));
    const dt_plan_entry *e = best_of(&res, z3_dp4);
    CHECK_MSG(e && e->c.fits && !e->c.sync_counts, "trains only: fits %d", e ? e->c.fits : -1);
    dt_plan_result_free(&res);
    r.evals = true;
    CHECK_OK(dt_plan_search(m, &pm, &o, &c, &r, &res));
    CHECK(!best_of(&res, z3_dp4));
    e = NULL;
    for (int i = 0; i < res.n && !e; i++)
        if (z3_dp4(&res.e[i].l) && res.e[i].c.mem >= 0) e = &res.e[i];
    CHECK_MSG(e && !e->c.fits && e->c.sync_counts && near(e->c.mem_sync, mp.sync), "evaluates: fits %d",
              e ? e->c.fits : -1);
    char why[512] = "";
    if (e) dt_plan_why(e, &res.e[0], &c, r.mem_limit, why, sizeof why);
    CHECK_MSG(strstr(why, "does not fit") && strstr(why, "while evaluation or a checkpoint gathers"), "%s", why);
    dt_plan_result_free(&res);
    dt_plan_model_free(&pm);
    dt_model_destroy(m);
}

static bool changes_algo(const dt_plan_layout *l) { return l->algo != DT_PLAN_SYNC || l->compress >= DT_PLAN_TOPK; }

/* 2 hosts x 1 rank joined by 0.01 Gbit/s, an MLP: with --consider all, a layout that sends less
 * (top-k, PowerSGD, localsgd) wins over every exact one, and the flags run it; without, none of
 * them is scored. */
static void test_algorithms(void) {
    dt_model *m;
    dt_plan_model pm;
    CHECK_OK(dt_model_build_unplaced(&m, "linear(256) relu linear(10)", 1, 28, 28));
    CHECK_OK(dt_plan_model_init(&pm, m));
    CHECK(near(pm.mat_params + pm.vec_params, pm.total_params) && pm.vec_params == 266);
    const dt_optim_config o = dt_optim_defaults(DT_OPTIM_ADAM);
    dt_plan_cluster c = planted(2, 1, 0.01);
    dt_plan_request r = {.G = 64, .ranks = 2, .precs = 1, .fix_tp = -1, .fix_pp = -1, .fix_zero = -1};
    dt_plan_result res;
    CHECK_OK(dt_plan_search(m, &pm, &o, &c, &r, &res));
    CHECK(res.n > 0 && !best_of(&res, changes_algo));
    dt_plan_result_free(&res);
    r.algos = DT_PLAN_ALGO_TOPK | DT_PLAN_ALGO_POWERSGD | DT_PLAN_ALGO_LOCALSGD | DT_PLAN_ALGO_PS;
    CHECK_OK(dt_plan_search(m, &pm, &o, &c, &r, &res));
    CHECK(res.n > 0 && res.e[0].c.fits && changes_algo(&res.e[0].l));
    bool ps = false, localsgd = false;
    for (int i = 0; i < res.n; i++) {
        char flags[256];
        dt_plan_flags(&res.e[i].l, r.G, flags, sizeof flags);
        if (res.e[i].l.algo == DT_PLAN_PS) ps = !strcmp(flags, "--workers 1 --batch 64 --strategy ps --servers 1");
        if (res.e[i].l.algo == DT_PLAN_LOCALSGD && res.e[i].l.sync_every == 8)
            localsgd = !strcmp(flags, "--workers 2 --batch 32 --strategy localsgd --sync-every 8");
    }
    CHECK_MSG(ps && localsgd, "ps %d localsgd %d", ps, localsgd);
    dt_plan_result_free(&res);
    dt_plan_model_free(&pm);
    dt_model_destroy(m);
}

/* The probe's per-node times: positive, and the fit grows with the batch; the optimizer's update
 * timed. */
static void test_measure(void) {
    dt_model *m;
    dt_plan_model pm;
    CHECK_OK(dt_model_build(&m, "linear(64) relu linear(10)", 1, 8, 8));
    dt_model_init(m, 1);
    CHECK_OK(dt_plan_model_init(&pm, m));
    CHECK_OK(dt_plan_model_measure(&pm, m, 4, 64, 2));
    double fix = 0, per = 0;
    for (int i = 0; i < pm.nodes; i++) fix += pm.t_fix[i], per += pm.t_per[i];
    CHECK(per > 0 && fix >= 0 && fix + per * 64 > 0);
    CHECK(dt_plan_model_measure(&pm, m, 8, 8, 1) == DT_EINVAL);
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
    CHECK_OK(dt_plan_model_measure_optim(&pm, &oc, 3));
    CHECK(pm.opt_per > 0);
    /* the calibrated overhead from the same steps' totals: 16 steps in 40 ms, 30 of them forward,
     * backward and the optimizer, 2 waiting for a prefetch thread the ranks do not have */
    CHECK(near(dt_plan_other_s(40e-3, 30e-3, 2e-3, 16), 8e-3 / 16) &&
          near(dt_plan_other_s(40e-3, 30e-3, 0, 16), 10e-3 / 16));
    CHECK(dt_plan_other_s(40e-3, 45e-3, 0, 16) == 0 && dt_plan_other_s(1, 0, 0, 0) == 0);
    dt_plan_model_free(&pm);
    dt_model_destroy(m);
}

int main(void) {
    test_formulas();
    test_algo_formulas();
    test_dp_sync();
    test_pipeline();
    test_algorithms();
    test_slow_link();
    test_tight_memory();
    test_eval_memory();
    test_cluster_files();
    test_measure();
    return dt_test_summary("plan_test");
}
