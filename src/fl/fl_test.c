/* Tests of federated training's arithmetic: FedAvg with one client, E=1 and one full-batch step
 * equals centralized SGD; FedAvg of full-batch steps over a split equals the centralized step on
 * the union (weights by sample count); FedProx pulls towards the global model; partitions cover
 * every sample; E=1 local training is minibatch SGD in the shuffled order; the RDP accountant matches the Gaussian
 * mechanism's closed form at q = 1 and the published DP-SGD figure (Abadi et al. setting, TF-privacy tutorial). */
#include "core/test.h"
#include "dtrain/optim.h"
#include "fl/fl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NS 48
#define FEAT 12

static dt_dataset *make_data(size_t lo, size_t hi, float *xall, int32_t *yall) {
    dt_dataset *ds;
    CHECK_OK(dt_dataset_create(&ds, DT_F32, xall + lo * FEAT, yall + lo, hi - lo, 1, 1, FEAT, 4));
    return ds;
}

static void test_fedavg_equals_sgd(void) {
    float x[NS * FEAT];
    int32_t y[NS];
    dt_rng_fill_normal(x, NS * FEAT, 0, 1, 5, 1);
    for (int i = 0; i < NS; i++) y[i] = (int32_t)(dt_rng_u64(5, 2, (uint64_t)i) % 4);
    dt_dataset *all = make_data(0, NS, x, y), *a = make_data(0, 20, x, y), *b = make_data(20, NS, x, y);
    dt_model *m, *c;
    CHECK_OK(dt_model_create_from_spec(&m, "linear(16) tanh linear(4)", 1, 1, FEAT));
    CHECK_OK(dt_model_create_from_spec(&c, "linear(16) tanh linear(4)", 1, 1, FEAT));
    dt_model_init(m, 3);
    dt_model_init(c, 3);
    size_t np = dt_model_num_params(m);
    float *global = malloc(np * 4), *delta = malloc(np * 4), *delta2 = malloc(np * 4);
    memcpy(global, dt_model_params(m), np * 4);

    /* centralized: one SGD step on the whole batch */
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_SGD);
    dt_optim *o;
    CHECK_OK(dt_optim_create(&o, &oc, np));
    uint32_t idx[NS];
    float xb[NS * FEAT];
    int32_t yb[NS];
    for (int i = 0; i < NS; i++) idx[i] = (uint32_t)i;
    CHECK_OK(dt_dataset_batch(all, idx, NS, xb, yb));
    dt_feed f = {xb, yb, NS};
    dt_model_zero_grad(c);
    CHECK_OK(dt_model_run(c, &f, true, 0, NULL));
    CHECK_OK(dt_model_backward_loss(c, 1.0f, NULL, NULL));
    dt_optim_step(o, dt_model_params(c), dt_model_grads(c), 0.5f);

    /* FedAvg, 1 client, E = 1, full batch */
    dt_fl_model_msg cfg = {.round = 0, .epochs = 1, .batch = 0, .lr = 0.5f, .mu = 0, .seed = 1, .n = (uint32_t)np};
    float loss;
    CHECK_OK(dt_fl_local_train(m, all, global, &cfg, delta, &loss));
    double *acc = calloc(np, sizeof *acc);
    dt_fl_accumulate(acc, delta, np, 1.0);
    float *fed = malloc(np * 4);
    for (size_t i = 0; i < np; i++) fed[i] = (float)(global[i] + acc[i]);
    double d1 = dt_test_maxdiff(fed, dt_model_params(c), np);
    CHECK_MSG(d1 < 1e-6, "1 client FedAvg vs SGD: max diff %g", d1);

    /* FedSGD / FedAvg E=1 full batch over 2 clients (20 + 28 samples), weighted by samples */
    memset(acc, 0, np * sizeof *acc);
    CHECK_OK(dt_fl_local_train(m, a, global, &cfg, delta, &loss));
    dt_fl_accumulate(acc, delta, np, 20.0 / NS);
    CHECK_OK(dt_fl_local_train(m, b, global, &cfg, delta2, &loss));
    dt_fl_accumulate(acc, delta2, np, 28.0 / NS);
    for (size_t i = 0; i < np; i++) fed[i] = (float)(global[i] + acc[i]);
    double d2 = dt_test_maxdiff(fed, dt_model_params(c), np);
    CHECK_MSG(d2 < 1e-5, "2 clients weighted FedAvg vs SGD: max diff %g", d2);

    /* E = 1 with batch 47 of 48 samples (a last batch of one) is minibatch SGD in the shuffled order */
    cfg.batch = 47, cfg.round = 2;
    CHECK_OK(dt_fl_local_train(m, all, global, &cfg, delta, &loss));
    memcpy(dt_model_params(c), global, np * 4);
    uint32_t order[NS];
    dt_sampler_order(order, NS, cfg.seed ^ ((uint64_t)cfg.round << 20), 0, true);
    for (int b0 = 0; b0 < NS; b0 += 47) {
        int cnt = NS - b0 < 47 ? NS - b0 : 47;
        CHECK_OK(dt_dataset_batch(all, order + b0, cnt, xb, yb));
        dt_feed fb = {xb, yb, cnt};
        dt_model_zero_grad(c);
        CHECK_OK(dt_model_run(c, &fb, true, 0, NULL));
        CHECK_OK(dt_model_backward_loss(c, 1.0f, NULL, NULL));
        dt_optim_step(o, dt_model_params(c), dt_model_grads(c), 0.5f);
    }
    for (size_t i = 0; i < np; i++) fed[i] = global[i] + delta[i];
    double d3 = dt_test_maxdiff(fed, dt_model_params(c), np);
    CHECK_MSG(d3 < 1e-5, "E=1 B=47 local training vs minibatch SGD: max diff %g", d3);
    cfg.round = 0;

    /* FedProx: with E=3 and mu > 0 the update is smaller than FedAvg's */
    cfg.epochs = 3, cfg.batch = 8;
    CHECK_OK(dt_fl_local_train(m, all, global, &cfg, delta, &loss));
    cfg.mu = 1.0f; /* lr * mu < 2, or the proximal step itself diverges */
    CHECK_OK(dt_fl_local_train(m, all, global, &cfg, delta2, &loss));
    double n1 = dt_fl_clip(delta, np, 0), n2 = dt_fl_clip(delta2, np, 0);
    CHECK_MSG(n2 < n1 && n2 > 0, "FedProx |delta| %g vs FedAvg %g", n2, n1);
    /* clipping */
    CHECK(fabs(dt_fl_clip(delta, np, 0.01) - n1) < 1e-9 * n1 + 1e-6);
    CHECK(fabs(dt_fl_clip(delta, np, 0) - 0.01) < 1e-6);

    free(global), free(delta), free(delta2), free(acc), free(fed);
    dt_optim_destroy(o);
    dt_model_destroy(m), dt_model_destroy(c);
    dt_dataset_destroy(all), dt_dataset_destroy(a), dt_dataset_destroy(b);
}

static void test_partition(void) {
    enum { N = 2000, K = 10, CL = 10 };
    static int32_t lab[N];
    static int owner[N];
    for (int i = 0; i < N; i++) lab[i] = i % CL;
    const char *specs[] = {"iid", "shards:2", "dirichlet:0.5"};
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < N; i++) owner[i] = -1;
        CHECK_OK(dt_fl_partition(specs[s], lab, N, CL, K, 7, owner));
        int cnt[K] = {0}, classes_of0[CL] = {0}, ok = 1;
        for (int i = 0; i < N; i++) {
            if (owner[i] < 0 || owner[i] >= K) ok = 0;
            else cnt[owner[i]]++;
            if (owner[i] == 0) classes_of0[lab[i]] = 1;
        }
        CHECK_MSG(ok, "%s: every sample has a client", specs[s]);
        int nc = 0;
        for (int c = 0; c < CL; c++) nc += classes_of0[c];
        if (s == 0) CHECK(cnt[0] == N / K && nc == CL);
        if (s == 1) CHECK_MSG(nc <= 2, "shards:2 gives client 0 %d classes", nc);
        if (s == 2) CHECK_MSG(nc < CL || cnt[0] != N / K, "dirichlet:0.5 looks iid");
    }
    CHECK(dt_fl_partition("dirichlet:x", lab, N, CL, K, 7, owner) == DT_EINVAL);
    CHECK(dt_fl_partition("zipf", lab, N, CL, K, 7, owner) == DT_EINVAL && strstr(dt_last_error(), "zipf"));
}

static void test_accountant(void) {
    /* q = 1: the Gaussian mechanism, RDP = alpha / (2 sigma^2) */
    CHECK(fabs(dt_fl_rdp_step(1.0, 2.0, 8) - 1.0) < 1e-12);
    /* subsampling amplifies: much smaller than the full-batch value, and monotone in q */
    CHECK(dt_fl_rdp_step(0.01, 1.0, 8) < 0.01 * dt_fl_rdp_step(1.0, 1.0, 8));
    CHECK(dt_fl_rdp_step(0.01, 1.0, 8) < dt_fl_rdp_step(0.02, 1.0, 8));
    /* the TF-privacy tutorial: N 60000, batch 256, sigma 1.1, 60 epochs, delta 1e-5 -> eps 2.92
     * with fractional orders too; integer orders alone give a slightly larger epsilon */
    double q = 256.0 / 60000.0;
    int64_t steps = (int64_t)(60 * 60000 / 256);
    int alpha;
    double eps = dt_fl_dp_epsilon(q, 1.1, steps, 1e-5, &alpha);
    CHECK_MSG(eps > 2.92 && eps < 3.3, "eps %g at alpha %d", eps, alpha);
    CHECK(dt_fl_dp_epsilon(q, 1.1, 2 * steps, 1e-5, NULL) > eps);
}

int main(void) {
    test_fedavg_equals_sgd();
    test_partition();
    test_accountant();
    return dt_test_summary("fl_test");
}
