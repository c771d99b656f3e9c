/* dtrain fl-server and dtrain fl-client: federated learning over TCP (issue 17). The server runs
 * the rounds; each client trains on its own data (a file, or its share of one under a partition)
 * and sends updates. Built alone by `make client` (no MPI) with DT_FL_CLIENT_MAIN. */
#include "cli/cmd_fl.h"
#include "device/device.h"
#include "dtrain/dtrain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dt_fl_opts_defaults(dt_fl_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = "mlp", o->data = "fashion-mnist", o->listen = "127.0.0.1:7070";
    o->rounds = 20, o->cpr = 10, o->epochs = 1, o->batch = 32, o->lr = 0.05f, o->seed = 1;
    o->round_timeout = 60, o->wait_timeout = 300, o->retries = 3, o->eval_every = 1;
    o->hello_timeout = (float)DT_FL_HELLO_TIMEOUT, o->max_clients = DT_FL_MAX_CLIENTS,
    o->max_pending = DT_FL_MAX_PENDING;
    o->dp_delta = 1e-5f, o->sa_range = 1.0f;
}

int dt_fl_opts_check(dt_fl_opts *o) {
    if (o->rounds < 1) return dt_cli_usage(NULL, "--rounds %d: need at least 1", o->rounds);
    if (o->cpr < 1 || o->cpr > DT_FL_MAX_CLIENTS)
        return dt_cli_usage(NULL, "--clients-per-round %d: need 1..%d", o->cpr, DT_FL_MAX_CLIENTS);
    if (o->epochs < 0 || o->epochs > 1000) return dt_cli_usage(NULL, "--local-epochs %d: need 0..1000", o->epochs);
    if (o->batch < 0) return dt_cli_usage(NULL, "--batch %d: need >= 0", o->batch);
    if (!(o->lr > 0)) return dt_cli_usage(NULL, "--lr %g: need > 0", o->lr);
    if (!(o->mu >= 0)) return dt_cli_usage(NULL, "--mu %g: need >= 0", o->mu);
    if (!(o->round_timeout > 0) || !(o->wait_timeout > 0))
        return dt_cli_usage(NULL, "--round-timeout and --wait-timeout must be > 0 seconds");
    if (o->retries < 0) return dt_cli_usage(NULL, "--retries %d: need >= 0", o->retries);
    if (!(o->hello_timeout > 0)) return dt_cli_usage(NULL, "--hello-timeout %g: need > 0 seconds", o->hello_timeout);
    if (o->max_clients < 1 || o->max_clients > DT_FL_MAX_CLIENTS)
        return dt_cli_usage(NULL, "--max-clients %d: need 1..%d", o->max_clients, DT_FL_MAX_CLIENTS);
    if (o->max_clients < o->cpr || o->max_clients < o->min_clients)
        return dt_cli_usage("raise --max-clients or lower --clients-per-round/--min-clients",
                            "--max-clients %d is below --clients-per-round %d or --min-clients %d", o->max_clients,
                            o->cpr, o->min_clients);
    if (o->max_pending < 1 || o->max_pending > DT_FL_MAX_PENDING_LIMIT)
        return dt_cli_usage(NULL, "--max-pending %d: need 1..%d", o->max_pending, DT_FL_MAX_PENDING_LIMIT);
    if (!(o->dp_clip >= 0) || !(o->dp_noise >= 0)) return dt_cli_usage(NULL, "--dp-clip and --dp-noise must be >= 0");
    if (o->dp_noise > 0 && o->dp_clip == 0)
        return dt_cli_usage("noise is scaled by the clip norm: add --dp-clip C", "--dp-noise %g without --dp-clip",
                            o->dp_noise);
    if (o->dp_clip > 0 && !(o->dp_delta > 0 && o->dp_delta < 1))
        return dt_cli_usage(NULL, "--dp-delta %g: need 0 < delta < 1", o->dp_delta);
    if (o->secure && (o->cpr < 2 || o->cpr > 255))
        return dt_cli_usage("secure aggregation needs at least 2 clients per round",
                            "--secure-agg with --clients-per-round %d (need 2..255)", o->cpr);
    if (o->sa_threshold < 0 || o->sa_threshold > o->cpr)
        return dt_cli_usage(NULL, "--sa-threshold %d: need 0..--clients-per-round (%d)", o->sa_threshold, o->cpr);
    if (!(o->sa_range > 0)) return dt_cli_usage(NULL, "--sa-range %g: need > 0", o->sa_range);
    if (o->resume && !o->checkpoint) return dt_cli_usage("add --checkpoint FILE", "--resume needs --checkpoint");
    dt_fl_server_config *c = &o->sc;
    *c = (dt_fl_server_config){.listen = o->listen,
                               .rounds = o->rounds,
                               .clients_per_round = o->cpr,
                               .min_clients = o->min_clients,
                               .round_timeout = o->round_timeout,
                               .wait_timeout = o->wait_timeout,
                               .hello_timeout = o->hello_timeout,
                               .max_clients = o->max_clients,
                               .max_pending = o->max_pending,
                               .retries = o->retries,
                               .epochs = (uint32_t)o->epochs,
                               .batch = (uint32_t)o->batch,
                               .lr = o->lr,
                               .mu = o->mu,
                               .seed = (uint64_t)o->seed,
                               .dp_clip = o->dp_clip,
                               .dp_noise = o->dp_noise,
                               .dp_delta = o->dp_delta,
                               .secure = o->secure,
                               .sa_threshold = o->sa_threshold,
                               .sa_range = o->sa_range,
                               .checkpoint = o->checkpoint,
                               .resume = o->resume,
                               .metrics = o->metrics,
                               .eval_every = o->eval_every,
                               .quiet = o->quiet};
    return 0;
}

int dt_fl_open(const dt_fl_opts *o, dt_dataset **train, dt_dataset **test, dt_model **m) {
    *m = NULL;
    /* one BLAS thread per caller: fl-sim's client threads would otherwise contend for OpenBLAS's
     * pool (docs/why.md, "fl-sim: one BLAS thread per client") */
    dt_set_threads(1);
    dt_status s = dt_dataset_open(train, test, o->data);
    if (s != DT_OK)
        return dt_cli_fail("--data takes fashion-mnist, an IDX directory or a CSV file", "--data %s: %s", o->data,
                           dt_last_error()),
               dt_cli_setup_status(s);
    int C, H, W;
    dt_dataset_shape(*train, &C, &H, &W);
    if ((s = dt_model_create_from_spec(m, o->model, C, H, W)) != DT_OK) {
        dt_cli_fail(NULL, "--model %s: %s", o->model, dt_last_error());
        dt_dataset_destroy(*train), dt_dataset_destroy(*test);
        return dt_cli_setup_status(s);
    }
    dt_model_init(*m, (uint64_t)o->seed);
    int r = dt_fl_model_device(m, o->device);
    if (r) dt_dataset_destroy(*train), dt_dataset_destroy(*test);
    return r;
}

int dt_fl_model_device(dt_model **m, const char *device) {
    if (!device || !strcmp(device, "cpu")) return 0;
    dt_dev *d = NULL;
    dt_status s = dt_device_create(&d, device);
    if (s == DT_OK && (s = dt_model_adopt_device(*m, d)) != DT_OK) dt_device_destroy(d);
    if (s == DT_OK) return 0;
    dt_model_destroy(*m);
    *m = NULL;
    dt_cli_fail(NULL, "--device %s: %s", device, dt_last_error());
    return dt_cli_setup_status(s);
}

dt_status dt_fl_subset(const dt_dataset *ds, const uint32_t *idx, size_t n, dt_dataset **out) {
    int C, H, W;
    dt_dataset_shape(ds, &C, &H, &W);
    size_t per = (size_t)C * H * W;
    bool u8 = dt_dataset_dtype(ds) == DT_U8;
    float *x = malloc(n * per * sizeof(float));
    int32_t *y = malloc(n * sizeof *y);
    dt_status s = x && y ? DT_OK : dt_error(DT_ENOMEM, "fl: out of memory for a client's %zu samples", n);
    for (size_t b = 0; b < n && s == DT_OK; b += 1024) {
        int cnt = (int)(n - b < 1024 ? n - b : 1024);
        s = dt_dataset_batch(ds, idx + b, cnt, x + b * per, y + b);
    }
    if (s == DT_OK && u8) { /* back to the stored bytes (batches are scaled by 1/255) */
        uint8_t *q = (uint8_t *)x;
        for (size_t i = 0; i < n * per; i++) q[i] = (uint8_t)lrintf(x[i] * 255.0f);
    }
    if (s == DT_OK) s = dt_dataset_create(out, u8 ? DT_U8 : DT_F32, x, y, n, C, H, W, dt_dataset_classes(ds));
    free(x), free(y);
    return s;
}

int dt_fl_client_share(const dt_dataset *ds, const char *partition, int k, int idx, uint64_t seed, dt_dataset **out) {
    size_t n = dt_dataset_len(ds);
    int32_t *lab = malloc(n * sizeof *lab);
    int *owner = malloc(n * sizeof *owner);
    uint32_t *all = malloc(n * sizeof *all), *mine = malloc(n * sizeof *mine);
    int rc = 0;
    if (!lab || !owner || !all || !mine) rc = dt_cli_fail(NULL, "out of memory partitioning %zu samples", n);
    for (size_t i = 0; i < n && !rc; i++) all[i] = (uint32_t)i;
    dt_status s = DT_OK;
    for (size_t b = 0; b < n && !rc && s == DT_OK; b += 4096)
        s = dt_dataset_batch(ds, all + b, (int)(n - b < 4096 ? n - b : 4096), NULL, lab + b);
    if (!rc && s == DT_OK) s = dt_fl_partition(partition, lab, n, dt_dataset_classes(ds), k, seed, owner);
    size_t cnt = 0;
    for (size_t i = 0; i < n && !rc && s == DT_OK; i++)
        if (owner[i] == idx) mine[cnt++] = (uint32_t)i;
    if (!rc && s == DT_OK && cnt == 0)
        s = dt_error(DT_EINVAL, "--partition %s gives client %d no samples", partition, idx);
    if (!rc && s == DT_OK) s = dt_fl_subset(ds, mine, cnt, out);
    if (!rc && s != DT_OK) rc = dt_cli_fail(NULL, "%s", dt_last_error()), rc = dt_cli_setup_status(s);
    free(lab), free(owner), free(all), free(mine);
    return rc;
}

static const char SERVER_USAGE[] =
    "Usage: dtrain fl-server --listen ADDR:PORT [FLAGS]\n\n"
    "Federated learning server: each round samples --clients-per-round of the connected fl-client\n"
    "processes, sends them the global model, waits up to --round-timeout for their updates and\n"
    "aggregates them (FedAvg weighted by sample count; FedProx with --mu; DP-FedAvg with --dp-clip and\n"
    "--dp-noise, reporting epsilon from a Renyi-DP accountant; --secure-agg so that only the sum is\n"
    "seen). It evaluates on the test split of --data, checkpoints, and logs the reason whenever a\n"
    "client is dropped (malformed message, lost connection, no update by the deadline: a client that\n"
    "misses a round's deadline is dropped, counted as late in --metrics, and may reconnect). A new\n"
    "connection must say HELLO within --hello-timeout and may send nothing larger first; at most\n"
    "--max-pending wait for theirs (the oldest makes way) and --max-clients are registered.";

int dt_cmd_fl_server(int argc, char **argv) {
    dt_fl_opts o;
    dt_fl_opts_defaults(&o);
    const dt_flag flags[] = {
        {"listen", DT_FLAG_STR, &o.listen, "ADDR:PORT", "address to listen on"},
        DT_FL_SERVER_FLAGS(&o),
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof flags[0]), SERVER_USAGE, NULL, 0, NULL,
                           NULL);
    if (r) return r < 0 ? 2 : 0;
    if ((r = dt_fl_opts_check(&o))) return r;
    dt_dataset *train, *test;
    dt_model *m;
    if ((r = dt_fl_open(&o, &train, &test, &m))) return r;
    dt_fl_server *s;
    dt_status st = dt_fl_server_create(&s, &o.sc, m, test);
    if (st == DT_OK) {
        printf("fl-server: listening on %s (port %d), model %s (%zu parameters), %d rounds of %d clients%s\n", o.listen,
               dt_fl_server_port(s), dt_model_spec(m), dt_model_num_params(m), o.rounds, o.cpr,
               o.secure ? ", secure aggregation" : "");
        fflush(stdout);
        st = dt_fl_server_run(s, NULL, NULL);
        dt_fl_server_destroy(s);
    }
    dt_model_destroy(m), dt_dataset_destroy(train), dt_dataset_destroy(test);
    if (st != DT_OK) return dt_cli_fail(NULL, "%s", dt_last_error()), dt_cli_setup_status(st);
    printf("fl-server: done\n");
    return 0;
}

static const char CLIENT_USAGE[] =
    "Usage: dtrain fl-client --server ADDR:PORT --data PATH [FLAGS]\n\n"
    "Federated learning client: trains each model the server sends on its own data and returns the\n"
    "update; while the server is away or turns it away it retries after 0.1 s doubling to 2 s\n"
    "(jittered), giving up after --connect-timeout of failures in a row. --partition\n"
    "with --clients and --client-index takes one client's share of a shared data set (experiments).";

int dt_cmd_fl_client(int argc, char **argv) {
    const char *server = NULL, *data = "fashion-mnist", *model = "mlp", *partition = NULL, *fault = "none",
               *device = NULL;
    int k = 1, idx = 0, quiet = 0;
    int64_t id = -1, seed = 1;
    float connect_timeout = 60, idle_timeout = 600;
    const dt_flag flags[] = {
        {"server", DT_FLAG_STR, &server, "ADDR:PORT", "the fl-server"},
        {"data", DT_FLAG_STR, &data, "PATH", "this client's data (its training split)"},
        {"model", DT_FLAG_STR, &model, "SPEC", "model spec: the server's"},
        {"partition", DT_FLAG_STR, &partition, "SPEC", "take a share of --data: iid, shards:S, dirichlet:A"},
        {"clients", DT_FLAG_INT, &k, "K", "with --partition: the number of shares"},
        {"client-index", DT_FLAG_INT, &idx, "I", "with --partition: which share (0..K-1)"},
        {"client-id", DT_FLAG_I64, &id, "ID", "identity announced to the server (default: --client-index)"},
        {"seed", DT_FLAG_I64, &seed, "S", "partition seed (the server's --seed)"},
        {"connect-timeout", DT_FLAG_FLOAT, &connect_timeout, "S",
         "give up after failing to reach (or be served by) the server this long"},
        {"idle-timeout", DT_FLAG_FLOAT, &idle_timeout, "S", "give up when the server sends nothing this long"},
        {"fault", DT_FLAG_STR, &fault, "KIND", "test hook: none, die, silent, garbage, drop-after-mask"},
        {"quiet", DT_FLAG_BOOL, &quiet, NULL, "no closing line"},
        {"device", DT_FLAG_STR, &device, "DEV", DT_FL_DEVICE_HELP},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof flags[0]), CLIENT_USAGE, NULL, 0, NULL,
                           NULL);
    if (r) return r < 0 ? 2 : 0;
    if (!server) return dt_cli_usage("e.g. --server 127.0.0.1:7070", "fl-client needs --server ADDR:PORT");
    if (partition && (k < 1 || idx < 0 || idx >= k))
        return dt_cli_usage(NULL, "--client-index %d: need 0..--clients-1 (%d)", idx, k - 1);
    if (!(connect_timeout > 0) || !(idle_timeout > 0)) return dt_cli_usage(NULL, "timeouts must be > 0 seconds");
    static const char *faults[] = {"none", "die", "silent", "garbage", "drop-after-mask"};
    int fk = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(fault, faults[i])) fk = i;
    if (fk < 0) return dt_cli_usage(NULL, "--fault %s: expected none, die, silent, garbage or drop-after-mask", fault);
    dt_fl_opts o;
    dt_fl_opts_defaults(&o);
    o.data = data, o.model = model, o.seed = seed, o.device = device;
    dt_dataset *train, *test, *mine = NULL;
    dt_model *m;
    if ((r = dt_fl_open(&o, &train, &test, &m))) return r;
    if (partition) r = dt_fl_client_share(train, partition, k, idx, (uint64_t)seed, &mine);
    dt_fl_client_config cc = {.server = server,
                              .client_id = id >= 0 ? (uint64_t)id : (uint64_t)idx,
                              .connect_timeout = connect_timeout,
                              .idle_timeout = idle_timeout,
                              .fault = (dt_fl_fault)fk,
                              .quiet = quiet};
    int rounds = 0;
    dt_status st = r ? DT_OK : dt_fl_client_run(&cc, m, mine ? mine : train, &rounds);
    dt_model_destroy(m), dt_dataset_destroy(mine), dt_dataset_destroy(train), dt_dataset_destroy(test);
    if (r) return r;
    if (st == DT_EINTR && fk) return dt_cli_fail(NULL, "%s", dt_last_error());
    if (st != DT_OK) return dt_cli_fail(NULL, "%s", dt_last_error()), dt_cli_setup_status(st);
    if (!quiet) printf("fl-client %llu: done, %d updates sent\n", (unsigned long long)cc.client_id, rounds);
    return 0;
}

#ifdef DT_FL_CLIENT_MAIN
/* `make client`: a stand-alone fl-client for an edge box (no MPI). */
int main(int argc, char **argv) {
    dt_cli_flag_terms_install();
    return dt_cmd_fl_client(argc, argv);
}
#endif
