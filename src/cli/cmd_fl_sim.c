/* dtrain fl-sim: a federated run in one process on the real code paths. The server listens on
 * loopback; each of --clients clients is a thread with its own model and its own share of the
 * data (--partition iid | shards:S | dirichlet:A) talking TCP to it. --faults makes the first
 * clients misbehave. Prints one line per round and a closing JSON line for benchmarks. */
#include "cli/cmd_fl.h"
#include "dtrain/dtrain.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_fl_client_config cc;
    char server[64];
    dt_dataset *ds;
    dt_model *m;
    dt_status st;
    int rounds;
    pthread_t th;
    int started;
} sim_client;

typedef struct {
    float target;
    int reached, rounds;
    double best, last, cpu_sum, eps;
    uint64_t bytes_in, bytes_out;
    int updates;
} sim_stats;

static void *client_main(void *arg) {
    sim_client *c = arg;
    c->st = dt_fl_client_run(&c->cc, c->m, c->ds, &c->rounds);
    return NULL;
}

/* Client idx's model (the server model m's spec, on a device of its own) and its thread; 0, or
 * the exit status after saying why. */
static int start_client(sim_client *c, int idx, const dt_model *m, const dt_dataset *train, const char *device) {
    int C, H, W;
    dt_dataset_shape(train, &C, &H, &W);
    if (dt_model_create_from_spec(&c->m, dt_model_spec(m), C, H, W) != DT_OK)
        return dt_cli_fail(NULL, "cannot start simulated client %d: %s", idx, dt_last_error());
    int r = dt_fl_model_device(&c->m, device);
    if (r) return r;
    if (pthread_create(&c->th, NULL, client_main, c) != 0)
        return dt_cli_fail(NULL, "cannot start simulated client %d: %s", idx, dt_last_error());
    c->started = 1;
    return 0;
}

static void on_round(void *ctx, const dt_fl_round_stats *st) {
    sim_stats *s = ctx;
    s->rounds = st->round, s->last = st->acc, s->eps = st->eps;
    if (st->acc > s->best) s->best = st->acc;
    if (!s->reached && s->target > 0 && st->acc >= s->target) s->reached = st->round;
    s->cpu_sum += st->server_cpu_s;
    s->bytes_in += st->bytes_in, s->bytes_out += st->bytes_out;
    s->updates += st->updates;
}

/* "die:1,silent:1,garbage:1,drop-after-mask:1" -> fault kinds of the first clients. */
static int parse_faults(const char *spec, dt_fl_fault *kinds, int k) {
    static const char *names[] = {"none", "die", "silent", "garbage", "drop-after-mask"};
    int next = 0;
    for (const char *p = spec; p && *p;) {
        const char *colon = strchr(p, ':'), *comma = strchr(p, ',');
        if (!comma) comma = p + strlen(p);
        int kind = -1;
        for (int i = 1; i < 5 && colon && colon < comma; i++)
            if ((size_t)(colon - p) == strlen(names[i]) && !strncmp(p, names[i], (size_t)(colon - p))) kind = i;
        int n = colon && colon < comma ? atoi(colon + 1) : 0;
        if (kind < 0 || n < 1 || next + n > k)
            return dt_cli_usage("e.g. --faults die:1,silent:1,garbage:1", "--faults '%s': bad entry at '%s'", spec, p);
        for (int i = 0; i < n; i++) kinds[next++] = (dt_fl_fault)kind;
        p = *comma ? comma + 1 : comma;
    }
    return 0;
}

/* Gives each client its share of train (limit: only the first `limit` samples; 0 = all). */
static int make_shares(dt_dataset *train, const char *partition, int k, uint64_t seed, size_t limit, sim_client *cl) {
    size_t n = dt_dataset_len(train);
    if (limit && limit < n) n = limit;
    int32_t *lab = malloc(n * sizeof *lab);
    int *owner = malloc(n * sizeof *owner);
    uint32_t *idx = malloc(n * sizeof *idx), *mine = malloc(n * sizeof *mine);
    dt_status s = lab && owner && idx && mine ? DT_OK : dt_error(DT_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    for (size_t b = 0; b < n && s == DT_OK; b += 4096)
        s = dt_dataset_batch(train, idx + b, (int)(n - b < 4096 ? n - b : 4096), NULL, lab + b);
    if (s == DT_OK) s = dt_fl_partition(partition, lab, n, dt_dataset_classes(train), k, seed, owner);
    for (int c = 0; c < k && s == DT_OK; c++) {
        size_t cnt = 0;
        for (size_t i = 0; i < n; i++)
            if (owner[i] == c) mine[cnt++] = (uint32_t)i;
        if (cnt) s = dt_fl_subset(train, mine, cnt, &cl[c].ds);
    }
    free(lab), free(owner), free(idx), free(mine);
    if (s != DT_OK) return dt_cli_fail(NULL, "%s", dt_last_error()), dt_cli_setup_status(s);
    return 0;
}

static const char SIM_USAGE[] =
    "Usage: dtrain fl-sim --clients K [--partition iid|shards:S|dirichlet:A] [FLAGS]\n\n"
    "Simulates federated learning in one process over loopback TCP: fl-server's code in the main\n"
    "thread, K fl-client threads, each with its own share of --data. Takes every fl-server flag.\n"
    "Ends with a JSON line: rounds, final and best test accuracy, the round --target-acc was reached,\n"
    "the server's mean CPU time per round (its overhead, client training excluded: they are other\n"
    "threads) and bytes per client update.";

int dt_cmd_fl_sim(int argc, char **argv) {
    dt_fl_opts o;
    dt_fl_opts_defaults(&o);
    o.listen = "127.0.0.1:0", o.round_timeout = 120;
    int k = 10, limit = 0;
    const char *partition = "iid", *faults = NULL;
    float target = 0;
    const dt_flag flags[] = {
        {"clients", DT_FLAG_INT, &k, "K", "simulated clients"},
        {"partition", DT_FLAG_STR, &partition, "SPEC", "iid, shards:S (S label shards each) or dirichlet:A"},
        {"train-limit", DT_FLAG_INT, &limit, "N", "use only the first N training samples (0 = all)"},
        {"target-acc", DT_FLAG_FLOAT, &target, "A", "report the first round whose test accuracy reaches A"},
        {"faults", DT_FLAG_STR, &faults, "LIST",
         "misbehaving first clients: die:N,silent:N,garbage:N,drop-after-mask:N"},
        DT_FL_SERVER_FLAGS(&o),
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof flags[0]), SIM_USAGE, NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    if (k < 1 || k > DT_FL_MAX_CLIENTS) return dt_cli_usage(NULL, "--clients %d: need 1..%d", k, DT_FL_MAX_CLIENTS);
    if (o.cpr > k) return dt_cli_usage(NULL, "--clients-per-round %d exceeds --clients %d", o.cpr, k);
    if (limit < 0) return dt_cli_usage(NULL, "--train-limit %d: need >= 0", limit);
    if ((r = dt_fl_opts_check(&o))) return r;
    sim_client *cl = calloc((size_t)k, sizeof *cl);
    dt_fl_fault kinds[DT_FL_MAX_CLIENTS] = {0};
    if (!cl) return dt_cli_fail(NULL, "out of memory");
    if ((r = parse_faults(faults, kinds, k))) return free(cl), r;
    dt_dataset *train, *test;
    dt_model *m;
    if ((r = dt_fl_open(&o, &train, &test, &m))) return free(cl), r;
    r = make_shares(train, partition, k, (uint64_t)o.seed, (size_t)limit, cl);
    int with_data = 0;
    for (int c = 0; c < k; c++) with_data += cl[c].ds != NULL;
    o.sc.start_clients = with_data; /* every client is in before round 1: a reproducible sample */
    dt_fl_server *s = NULL;
    dt_status st = r ? DT_OK : dt_fl_server_create(&s, &o.sc, m, test);
    if (!r && st != DT_OK) r = dt_cli_fail(NULL, "%s", dt_last_error()), r = dt_cli_setup_status(st);
    for (int c = 0; c < k && !r; c++) {
        if (!cl[c].ds) continue;
        snprintf(cl[c].server, sizeof cl[c].server, "127.0.0.1:%d", dt_fl_server_port(s));
        cl[c].cc = (dt_fl_client_config){.server = cl[c].server,
                                         .client_id = (uint64_t)c,
                                         .connect_timeout = 30,
                                         .idle_timeout = o.round_timeout * 8 + o.wait_timeout,
                                         .fault = kinds[c],
                                         .quiet = 1};
        r = start_client(&cl[c], c, m, train, o.device);
    }
    sim_stats ss = {.target = target, .best = 0, .eps = -1};
    if (!r) {
        printf("fl-sim: %d clients (%d with data), partition %s, %d per round, model %s (%zu parameters)%s%s\n", k,
               with_data, partition, o.cpr, dt_model_spec(m), dt_model_num_params(m),
               o.secure ? ", secure aggregation" : "", o.dp_clip > 0 ? ", DP-FedAvg" : "");
        fflush(stdout);
        st = dt_fl_server_run(s, on_round, &ss);
        if (st != DT_OK) r = dt_cli_fail(NULL, "%s", dt_last_error()), r = dt_cli_setup_status(st);
    }
    dt_fl_server_destroy(s); /* closes every connection: clients still waiting end */
    for (int c = 0; c < k; c++) {
        if (cl[c].started) pthread_join(cl[c].th, NULL);
        dt_model_destroy(cl[c].m), dt_dataset_destroy(cl[c].ds);
    }
    if (!r) {
        double upd = ss.updates ? (double)ss.bytes_in / ss.updates : 0;
        printf("{\"bench\":\"fl-sim\",\"clients\":%d,\"per_round\":%d,\"partition\":\"%s\",\"local_epochs\":%d,"
               "\"secure\":%s,\"rounds\":%d,\"final_acc\":%.4f,\"best_acc\":%.4f,\"target_acc\":%.4f,"
               "\"rounds_to_target\":%d,\"server_cpu_ms_per_round\":%.3f,\"bytes_in_per_update\":%.0f,"
               "\"bytes_out_per_round\":%.0f,\"epsilon\":%.4g,\"delta\":%g}\n",
               k, o.cpr, partition, o.epochs, o.secure ? "true" : "false", ss.rounds, ss.last, ss.best, target,
               ss.reached, ss.rounds ? 1e3 * ss.cpu_sum / ss.rounds : 0, upd,
               ss.rounds ? (double)ss.bytes_out / ss.rounds : 0, ss.eps, ss.eps >= 0 ? o.dp_delta : 0);
    }
    dt_model_destroy(m), dt_dataset_destroy(train), dt_dataset_destroy(test);
    free(cl);
    return r;
}
