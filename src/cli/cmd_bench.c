/* dtrain bench: dispatches to the benchmark programs (each prints a table and a JSON line). */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

int dt_bench_train(int argc, char **argv);
int dt_bench_ddp(int argc, char **argv);
int dt_bench_fault(int argc, char **argv);
int dt_bench_fl(int argc, char **argv);
int dt_bench_comm(int argc, char **argv);
int dt_bench_async(int argc, char **argv);
int dt_bench_tp(int argc, char **argv);
int dt_bench_parallel(int argc, char **argv);
int dt_bench_zero(int argc, char **argv);
int dt_bench_plan(int argc, char **argv);

static const dt_command g_benches[] = {
    {"train", dt_bench_train, "single-worker training throughput (MLP b32/b128, CNN b128, GPT b12) and GFLOP/s"},
    {"fault", dt_bench_fault, "recovery time after a killed worker, checkpoint overhead"},
    {"fl", dt_bench_fl, "federated learning: FedAvg vs FedSGD vs centralized, server overhead, secure agg bytes, DP"},
    {"ddp", dt_bench_ddp, "data-parallel throughput for 1, 2, 4 workers with the compute/comm/data split"},
    {"comm", dt_bench_comm, "collective bandwidth and latency per transport (nccl-tests style, -n ranks)"},
    {"async", dt_bench_async, "uneven workers (one slow): ddp, balanced ddp, localsgd, ps with SSP and async"},
    {"tp", dt_bench_tp,
     "tensor parallel (tp2, tp4, dp2 x tp2) vs ddp vs 1 worker on a GPT: tokens/s, peak RSS per rank, bytes per axis"},
    {"parallel", dt_bench_parallel,
     "model-parallel layouts of a GPT: dp, pp (GPipe, 1F1B), dp x pp: tokens/s, bubble, memory"},
    {"zero", dt_bench_zero, "peak RSS per rank and throughput of ddp and ZeRO 1-3 on a GPT, next to the formula"},
    {"plan", dt_bench_plan,
     "the planner's predicted step time against the measured one over its layouts (MAE, worst, chosen vs fastest)"},
    {NULL, NULL, NULL},
};

const dt_command *dt_bench_commands(void) { return g_benches; }

int dt_cmd_bench(int argc, char **argv) {
    if (argc >= 2)
        for (const dt_command *b = g_benches; b->name; b++)
            if (!strcmp(argv[1], b->name)) return b->run(argc - 1, argv + 1);
    bool help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    FILE *out = help ? stdout : stderr;
    if (argc >= 2 && !help) {
        const char *names[sizeof g_benches / sizeof *g_benches];
        int n = 0;
        for (const dt_command *b = g_benches; b->name; b++) names[n++] = b->name;
        const char *g = dt_cli_suggest(argv[1], strlen(argv[1]), names, n);
        fprintf(stderr, "dtrain: error: unknown benchmark '%s'\n", argv[1]);
        if (g) fprintf(stderr, "HINT: did you mean 'dtrain bench %s'?\n", g);
    }
    fprintf(out, "Usage: dtrain bench NAME [FLAGS]\n\nBenchmarks:\n");
    for (const dt_command *b = g_benches; b->name; b++) fprintf(out, "  %-8s %s\n", b->name, b->summary);
    return help ? 0 : 2;
}
