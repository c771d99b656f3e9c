/* dtrain: the command-line face of libdtrain. Dispatches to one subcommand per verb. */
#include "cli/cli.h"
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

int dt_cmd_train(int argc, char **argv);
int dt_cmd_eval(int argc, char **argv);
int dt_cmd_launch(int argc, char **argv);
int dt_cmd_bench(int argc, char **argv);
int dt_cmd_sample(int argc, char **argv);
int dt_cmd_cache(int argc, char **argv);
int dt_cmd_export(int argc, char **argv);
int dt_cmd_predict(int argc, char **argv);
int dt_cmd_plot(int argc, char **argv);
int dt_cmd_man(int argc, char **argv);
int dt_cmd_ckpt(int argc, char **argv);
int dt_cmd_fl_server(int argc, char **argv);
int dt_cmd_fl_client(int argc, char **argv);
int dt_cmd_fl_sim(int argc, char **argv);
int dt_cmd_plan(int argc, char **argv);

static const dt_command g_commands[] = {
    {"train", dt_cmd_train, "train a model (one process, --workers N, or one rank of a launch/mpirun job)"},
    {"eval", dt_cmd_eval, "evaluate a checkpoint on a data set"},
    {"sample", dt_cmd_sample, "generate text with a GPT checkpoint"},
    {"export", dt_cmd_export, "write a checkpoint's model as ONNX (onnxruntime, other tools)"},
    {"predict", dt_cmd_predict, "write a model's predictions on a data set (CSV or JSON Lines)"},
    {"plan", dt_cmd_plan,
     "choose the parallel layout: predicted step time, memory per rank, the flags, why not the others"},
    {"launch", dt_cmd_launch, "run N local ranks of a program (rank env, prefixed output)"},
    {"bench", dt_cmd_bench,
     "benchmarks: train, ddp, comm, async, fault, fl, tp, parallel, zero, plan (tables + a JSON line)"},
    {"plot", dt_cmd_plot, "draw loss, accuracy and throughput of --metrics files (PNG/SVG through gnuplot)"},
    {"man", dt_cmd_man, "write the manual page dtrain(1), made from the flag tables of --help"},
    {"ckpt", dt_cmd_ckpt, "checkpoint tools: consolidate a sharded checkpoint into one PyTorch-loadable file"},
    {"cache", dt_cmd_cache, "the shared decoded data-set cache: ls (list your files), clear (remove them)"},
    {"fl-server", dt_cmd_fl_server, "federated learning server: rounds over TCP (FedAvg/FedProx, secure agg, DP)"},
    {"fl-client", dt_cmd_fl_client, "federated learning client: trains on its own data, sends updates"},
    {"fl-sim", dt_cmd_fl_sim, "federated learning simulation: server + K client threads over loopback"},
    {NULL, NULL, NULL},
};

static void usage(void) {
    printf("dtrain %s: distributed deep-learning training in C\n\n"
           "Usage: dtrain COMMAND [FLAGS]\n\nCommands:\n",
           DTRAIN_VERSION);
    for (const dt_command *c = g_commands; c->name; c++) printf("  %-10s %s\n", c->name, c->summary);
    printf("\nRun 'dtrain COMMAND --help' for the flags of a command.\n\n"
           "Environment:\n"
           "  DTRAIN_TIMEOUT=S        deadline of any wait for another rank (default 300 s)\n"
           "  DTRAIN_LOG=LEVEL        library log level: error, warn (default), info, debug\n"
           "  DTRAIN_DATA_CACHE=0|DIR shared decoded data-set cache: off, or its directory (default /dev/shm;\n"
           "                          see 'dtrain cache --help')\n"
           "  DTRAIN_DATA_CACHE_MAX=N most cache entries kept per user (default 8)\n"
           "  OPENBLAS_CORETYPE=CORE  OpenBLAS kernel set; unset, dtrain picks SkylakeX or Haswell itself\n"
           "                          when OpenBLAS does not know the CPU (bench prints the choice;\n"
           "                          DTRAIN_BLAS_REEXEC=0 keeps OpenBLAS's own choice)\n"
           "  DTRAIN_COMM_ALGO=NAME   force a collective algorithm: ring, rd, rhd, tree, direct, native\n"
           "  DTRAIN_BIND=core|none   dtrain launch / --workers: each rank on a slice of the CPUs of its\n"
           "                          own when the ranks are at least 2 and no more than the CPUs\n"
           "                          (core, the default), or where the OS puts it (none)\n"
           "  DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_JOB_ID   set by dtrain launch / --workers; mpirun\n"
           "                          and srun ranks are found from their own variables\n\n%s\n",
           dt_cli_exit_help);
}

const dt_command *dt_cli_commands(void) { return g_commands; }
void dt_cli_main_usage(void) { usage(); }

/* OpenBLAS fell back to its generic kernels on a CPU it does not know: run again with the kernel
 * set the CPU supports (OPENBLAS_CORETYPE is read only when the library loads). Workers and
 * children inherit it. */
static void pick_blas_kernels(char **argv) {
    if (getenv("DTRAIN_BLAS_REEXEC")) return; /* done already, or turned off (=0) */
    const char *core = dt_blas_better_coretype();
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (!core || n <= 0) return;
    self[n] = '\0';
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("DTRAIN_BLAS_REEXEC", core, 1);
    execv(self, argv); /* returns only on failure: go on with the generic kernels */
    unsetenv("OPENBLAS_CORETYPE");
}

int main(int argc, char **argv) {
    pick_blas_kernels(argv);
    dt_cli_flag_terms_install(); /* the library's log lines name flags, not its terms */
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dtrain %s\n", dt_version()); /* the library's version, as linked */
        return 0;
    }
    for (const dt_command *c = g_commands; c->name; c++)
        if (!strcmp(argv[1], c->name)) return c->run(argc - 1, argv + 1);
    const char *names[sizeof g_commands / sizeof *g_commands];
    int n = 0;
    for (const dt_command *c = g_commands; c->name; c++) names[n++] = c->name;
    const char *g = dt_cli_suggest(argv[1], strlen(argv[1]), names, n);
    char hint[128];
    snprintf(hint, sizeof hint, "did you mean 'dtrain %s'? (run 'dtrain --help' for the list of commands)", g ? g : "");
    return dt_cli_usage(g ? hint : "run 'dtrain --help' for the list of commands", "unknown command '%s'", argv[1]);
}
