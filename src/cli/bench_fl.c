/* dtrain bench fl: federated learning on Fashion-MNIST with the MLP, each configuration a real
 * `dtrain fl-sim` (or `dtrain train`) child process of this executable, in one run:
 *  - centralized SGD (the reference accuracy), FedAvg (10 clients, Dirichlet 0.5, E local
 *    epochs) and FedSGD (one full-batch gradient per client per round): the rounds each needs to
 *    come within 3 points of centralized test accuracy;
 *  - 100 clients, 10 per round: the server's CPU time per round (its overhead: the clients are
 *    other threads), plain and with secure aggregation, and bytes per client update (ratio);
 *    (rounds_to_target 0 in the JSON line: not reached within the run's rounds);
 *  - DP-FedAvg (100 clients, 10 per round): the noise multiplier that gives epsilon 1, 4, 8 at
 *    delta 1e-5 after the run's rounds (from the same RDP accountant), and the accuracy reached.
 * Prints a table and one JSON line. */
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "fl/fl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs `exe ARGS` and copies its last stdout line that starts with '{' into line. */
static int run_json(const char *exe, const char *args, char *line, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>/dev/null", exe, args);
    FILE *p = popen(cmd, "r");
    if (!p) return dt_cli_fail(NULL, "cannot run %s", cmd);
    char buf[4096];
    line[0] = '\0';
    while (fgets(buf, sizeof buf, p))
        if (buf[0] == '{') snprintf(line, cap, "%s", buf);
    int rc = pclose(p);
    if (rc != 0 || !line[0]) return dt_cli_fail(NULL, "'%s' failed (status %d)", cmd, rc);
    return 0;
}

/* The number after "key": in a JSON line (with or without a space after the colon), or -1. */
static double field(const char *line, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* The noise multiplier whose epsilon after `rounds` rounds at rate q is `eps` (bisection). */
static double sigma_for(double eps, double q, int rounds, double delta) {
    double lo = 0.3, hi = 100;
    for (int i = 0; i < 60; i++) {
        double mid = 0.5 * (lo + hi);
        if (dt_fl_dp_epsilon(q, mid, rounds, delta, NULL) > eps) lo = mid;
        else hi = mid;
    }
    return hi;
}

/* The server's CPU ms per round (ms) and the bytes per client update (bytes) of 100 clients, 10 per
 * round, plain [0] and with secure aggregation [1]; printed. Nonzero on a failed run. */
static int overhead_rows(const char *exe, const char *lim, double ms[2], double bytes[2]) {
    char args[2048], line[4096];
    for (int sec = 0; sec < 2; sec++) {
        snprintf(args, sizeof args,
                 "fl-sim --clients 100 --clients-per-round 10 --partition iid --rounds 10 --quiet "
                 "--eval-every 100 --local-epochs 1 --lr 0.05%s%s",
                 sec ? " --secure-agg" : "", lim);
        if (run_json(exe, args, line, sizeof line)) return 1;
        ms[sec] = field(line, "server_cpu_ms_per_round");
        bytes[sec] = field(line, "bytes_in_per_update");
        printf("%-44s %10d %10.4f %14s %12.2f\n",
               sec ? "100 clients, 10/round, secure aggregation" : "100 clients, 10/round, plain", 10,
               field(line, "final_acc"), "-", ms[sec]);
    }
    printf("# secure aggregation: %.0f bytes per client update vs %.0f plain (%.3fx); server CPU %.2fx\n", bytes[1],
           bytes[0], bytes[1] / bytes[0], ms[1] / ms[0]);
    return 0;
}

/* DP-FedAvg at epsilon 1, 4, 8 (dacc: the accuracies) and the same run without DP (*nodp); printed.
 * Nonzero on a failed run. */
static int dp_rows(const char *exe, const char *lim, int dp_rounds, double dacc[3], double *nodp) {
    char args[2048], line[4096];
    double eps[3] = {1, 4, 8}, sig[3];
    for (int i = 0; i < 3; i++) {
        sig[i] = sigma_for(eps[i], 0.1, dp_rounds, 1e-5);
        snprintf(args, sizeof args,
                 "fl-sim --clients 100 --clients-per-round 10 --partition iid --rounds %d --quiet "
                 "--eval-every 100 --local-epochs 1 --lr 0.05 --dp-clip 0.5 --dp-noise %.4f%s",
                 dp_rounds, sig[i], lim);
        if (run_json(exe, args, line, sizeof line)) return 1;
        dacc[i] = field(line, "final_acc");
        printf("%-44s %10d %10.4f %14s %12s   (sigma %.3f, eps %.3f)\n",
               eps[i] == 1   ? "DP-FedAvg eps 1 (clip 0.5)"
               : eps[i] == 4 ? "DP-FedAvg eps 4"
                             : "DP-FedAvg eps 8",
               dp_rounds, dacc[i], "-", "-", sig[i], field(line, "epsilon"));
    }
    snprintf(args, sizeof args,
             "fl-sim --clients 100 --clients-per-round 10 --partition iid --rounds %d --quiet "
             "--eval-every 100 --local-epochs 1 --lr 0.05%s",
             dp_rounds, lim);
    if (run_json(exe, args, line, sizeof line)) return 1;
    *nodp = field(line, "final_acc");
    printf("%-44s %10d %10.4f\n", "same without DP", dp_rounds, *nodp);
    return 0;
}

int dt_bench_fl(int argc, char **argv) {
    int rounds = 30, sgd_rounds = 150, epochs = 1, limit = 0, dp_rounds = 30;
    const dt_flag flags[] = {
        {"rounds", DT_FLAG_INT, &rounds, "N", "FedAvg rounds"},
        {"fedsgd-rounds", DT_FLAG_INT, &sgd_rounds, "N", "FedSGD rounds"},
        {"local-epochs", DT_FLAG_INT, &epochs, "E",
         "FedAvg local epochs (centralized SGD runs E * rounds epochs: the same passes over the data)"},
        {"train-limit", DT_FLAG_INT, &limit, "N", "training samples used (0 = all 60000)"},
        {"dp-rounds", DT_FLAG_INT, &dp_rounds, "N", "rounds of each DP run"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, 5, "Usage: dtrain bench fl [FLAGS]", NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    char exe[4096], line[4096], args[2048], metrics[] = "/tmp/dtrain-bench-fl-XXXXXX";
    if (dt_bench_self(exe, sizeof exe)) return 1;
    int mfd = mkstemp(metrics);
    if (mfd < 0) return dt_cli_fail(NULL, "cannot create a temp file");
    close(mfd);
    dt_bench_print_machine();
    char lim[64] = "";
    if (limit) snprintf(lim, sizeof lim, " --train-limit %d", limit);
    /* centralized reference */
    int cep = epochs * rounds; /* equal passes over the data: every FedAvg round trains all 10 clients E epochs */
    snprintf(args, sizeof args, "--data fashion-mnist --model mlp --epochs %d --batch 32 --optimizer sgd --lr 0.05",
             cep);
    unlink(metrics);
    if (dt_bench_train_run(args, metrics, line, sizeof line)) return 1;
    double central = dt_bench_json_field(line, "test_acc"); /* dtrain train writes "key": value */
    double target = central - 0.03;
    printf("%-44s %10s %10s %14s %12s\n", "run", "rounds", "test acc", "rounds to tgt", "server ms/r");
    printf("%-44s %10d %10.4f %14s %12s\n", "centralized SGD (rounds = epochs; all 60k)", cep, central, "-", "-");
    /* FedAvg and FedSGD, 10 clients, Dirichlet 0.5 */
    const char *base = "fl-sim --clients 10 --clients-per-round 10 --partition dirichlet:0.5 --quiet --eval-every 1";
    snprintf(args, sizeof args, "%s --rounds %d --local-epochs %d --batch 32 --lr 0.05 --target-acc %.4f%s", base,
             rounds, epochs, target, lim);
    if (run_json(exe, args, line, sizeof line)) return 1;
    double fa = field(line, "best_acc"), fr = field(line, "rounds_to_target");
    char frs[32], srs[32];
    snprintf(frs, sizeof frs, fr > 0 ? "%.0f" : "not in %.0f", fr > 0 ? fr : (double)rounds);
    printf("%-44s %10d %10.4f %14s %12.2f\n", "FedAvg E=1 B=32 (10 clients, dir 0.5)", rounds, fa, frs,
           field(line, "server_cpu_ms_per_round"));
    snprintf(args, sizeof args, "%s --rounds %d --local-epochs 0 --lr 0.5 --target-acc %.4f --eval-every 5%s", base,
             sgd_rounds, target, lim);
    if (run_json(exe, args, line, sizeof line)) return 1;
    double sa = field(line, "best_acc"), sr = field(line, "rounds_to_target");
    snprintf(srs, sizeof srs, sr > 0 ? "%.0f" : "not in %.0f", sr > 0 ? sr : (double)sgd_rounds);
    printf("%-44s %10d %10.4f %14s %12.2f\n", "FedSGD lr 0.5 (10 clients, dir 0.5)", sgd_rounds, sa, srs,
           field(line, "server_cpu_ms_per_round"));
    double ms[2], bytes[2], dacc[3], nodp;
    if (overhead_rows(exe, lim, ms, bytes) || dp_rows(exe, lim, dp_rounds, dacc, &nodp)) return 1;
    printf("{\"bench\":\"fl\",\"central_acc\":%.4f,\"target_acc\":%.4f,\"fedavg_acc\":%.4f,\"fedavg_rounds_to_target\":"
           "%.0f,"
           "\"fedsgd_acc\":%.4f,\"fedsgd_rounds_to_target\":%.0f,\"server_ms_per_round\":%.3f,\"server_ms_per_round_"
           "secure\":%.3f,"
           "\"bytes_per_update\":%.0f,\"bytes_per_update_secure\":%.0f,\"secure_bytes_ratio\":%.4f,"
           "\"dp_acc_eps1\":%.4f,\"dp_acc_eps4\":%.4f,\"dp_acc_eps8\":%.4f,\"nodp_acc\":%.4f,\"dp_delta\":1e-5}\n",
           central, target, fa, fr, sa, sr, ms[0], ms[1], bytes[0], bytes[1], bytes[1] / bytes[0], dacc[0], dacc[1],
           dacc[2], nodp);
    unlink(metrics);
    return 0;
}
