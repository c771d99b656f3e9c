/* dtrain bench zero: per-rank peak resident memory, as the OS counts it (VmHWM), of a GPT
 * trained with plain ddp and ZeRO stages 1-3 at 1, 2 and 4 local ranks, next to the ZeRO paper's
 * formula (f32 Adam: 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N) plus the activations the graph allocates
 * (dt_model_activation_bytes: what it allocates for the batch) and, at stage 3, the gathered layers in
 * flight as the rank measured them (the most gathered parameter bytes not owned held at once: added
 * where a gather starts, taken off where its pages go back), and the step throughput of stages 1-3
 * against ddp at the same rank count, measured in the same run. The row is the rank furthest above
 * its own formula. Each case forks its ranks (shared-memory
 * transport); the peak is reset (/proc/self/clear_refs) once the strategy holds its sharded
 * state, so it covers the training steps; the set-up peak is printed beside it (stages 0-2 hold
 * the whole parameters; stage 3 places the rank's shards before initialising them, as the trainer). */
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"
#include "dtrain/memplan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    dt_mem_probe p;
    int ok;
} zcase;

/* One rank of a case: 0 and *out filled, or 1. */
static int rank_main(const char *spec, int stage, int N, int r, const char *job, int B, int steps, zcase *out) {
    dt_comm *c = NULL;
    dt_comm_config cc = dt_comm_config_default();
    cc.rank = r, cc.size = N, cc.job_id = job, cc.timeout_s = 600;
    if (dt_comm_create(&c, &cc) != DT_OK) return 1;
    char strat[64];
    snprintf(strat, sizeof strat, stage ? "ddp(zero=%d)" : N > 1 ? "ddp" : "single", stage);
    dt_status s = dt_mem_probe_gpt(spec, strat, stage || N > 1 ? c : NULL, B, steps, &out->p);
    if (s != DT_OK) fprintf(stderr, "bench zero: rank %d: %s\n", r, dt_cli_last_error());
    dt_comm_destroy(c);
    out->ok = s == DT_OK;
    return s != DT_OK;
}

/* Runs a case on N forked ranks; res[0..N) get each rank's figures. */
static int run_case(const char *spec, int stage, int N, int B, int steps, zcase *res) {
    zcase *shared = malloc(sizeof *shared * (size_t)N);
    char dir[] = "/tmp/dtrain-bzero-XXXXXX", job[64];
    if (!shared || !mkdtemp(dir)) return 1;
    snprintf(job, sizeof job, "bzero%d_%d_%d", (int)getpid(), stage, N);
    for (int r = 0; r < N; r++) {
        fflush(stdout);
        if (fork() == 0) {
            zcase z = {0};
            int rc = rank_main(spec, stage, N, r, job, B, steps, &z);
            char p[128];
            snprintf(p, sizeof p, "%s/r%d", dir, r);
            FILE *f = fopen(p, "wb");
            if (f) fwrite(&z, sizeof z, 1, f), fclose(f);
            _exit(rc);
        }
    }
    int failed = 0, st;
    while (wait(&st) > 0) failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int r = 0; r < N; r++) {
        char p[128];
        snprintf(p, sizeof p, "%s/r%d", dir, r);
        FILE *f = fopen(p, "rb");
        memset(&res[r], 0, sizeof res[r]);
        if (f && fread(&res[r], sizeof res[r], 1, f) != 1) res[r].ok = 0;
        if (f) fclose(f);
        unlink(p);
    }
    rmdir(dir);
    free(shared);
    return failed;
}

/* The paper's bytes per rank of stage k at N ranks for P parameters (f32 Adam). */
static double formula(int stage, int N, double P) {
    switch (stage) {
    case 0: return 16 * P;
    case 1: return 8 * P + 8 * P / N;
    case 2: return 4 * P + 12 * P / N;
    default: return 16 * P / N;
    }
}

static const char USAGE[] =
    "Usage: dtrain bench zero [--model gpt:L=8,H=12,C=768,T=64] [--batch B] [--steps S] [--ranks LIST]\n"
    "                         [--stages LIST]\n\n"
    "Peak resident memory per rank (VmHWM, after set-up) and step time of ddp and ZeRO 1-3 on a GPT,\n"
    "next to the ZeRO formula plus the activations; throughput of each stage relative to ddp.";

static int parse_list(const char *s, int *v, int cap) {
    int n = 0;
    for (const char *p = s; p && *p && n < cap; p = strchr(p, ','), p = p ? p + 1 : NULL) v[n++] = atoi(p);
    return n;
}

/* Prints the header lines and the table's heading. */
static void zero_header(const char *spec, double P, int B, int T) {
    printf("# dtrain bench zero: %s, %.1fM parameters, batch %d x T %d per rank, adam f32, shm transport\n", spec,
           P / 1e6, B, T);
    dt_bench_print_machine();
    printf("# the machine is shared (other jobs load its cores): step times are noisy, compare ratios\n");
    printf("# cpu_s: CPU seconds of a step (user + system, all threads; the mean over the ranks): the load-robust\n"
           "# figure; faults: minor page faults of a step (pages given back and touched again); plan: --dry-run's\n"
           "# bytes for the rank against the peak; shm_MB: the transport's shared slots in the peak\n");
    printf("# formula_MB: the paper's bytes + act_MB (the activations) + gath_MB (stage 3: gathered layers in flight, "
           "measured)\n");
    printf("%5s %5s %10s %10s %8s %8s %9s %7s %7s %7s %8s %8s %8s %7s %9s\n", "stage", "ranks", "peak_MB", "formula_MB",
           "act_MB", "gath_MB", "setup_MB", "shm_MB", "ratio", "plan", "step_s", "vs_ddp", "cpu_s", "cpu_vs", "faults");
}

/* Prints the row of stage on N ranks (res: each rank's probe) and appends it to the JSON (json, its
 * length jn; returns the new length); the ddp row (stage 0) sets *ddp_step and *ddp_cpu. */
static int zero_row(dt_model *probe, double P, int B, int stage, int N, const zcase *res, double *ddp_step,
                    double *ddp_cpu, char *json, size_t cap, int jn, int *done) {
    double setup = 0, step = 0, cpu = 0, faults = 0, worst = 0;
    int w = 0; /* the rank furthest above its formula */
    for (int r = 0; r < N; r++) {
        const dt_mem_probe *q = &res[r].p;
        const double ratio = (q->peak - q->base) / (formula(stage, N, P) + q->activations + q->gathered);
        if (ratio > worst) worst = ratio, w = r;
        if (q->setup_peak - q->base > setup) setup = q->setup_peak - q->base;
        if (q->step_s > step) step = q->step_s;
        cpu += q->cpu_s / N, faults += q->faults / N;
    }
    const dt_mem_probe *q = &res[w].p;
    const double peak = q->peak - q->base, want = formula(stage, N, P) + q->activations + q->gathered;
    dt_mem_layout lay = {.dp = N, .tp = 1, .pp = 1, .zero = stage, .microbatches = 1, .batch = B};
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
    dt_mem_plan plan = {0};
    if (dt_mem_plan_rank(probe, &oc, &lay, w, &plan) != DT_OK) plan.total = 0;
    if (stage == 0) *ddp_step = step, *ddp_cpu = cpu;
    double vs = *ddp_step > 0 ? *ddp_step / step : 0, cvs = *ddp_cpu > 0 ? *ddp_cpu / cpu : 0;
    printf("%5d %5d %10.1f %10.1f %8.1f %8.1f %9.1f %7.1f %7.3f %7.3f %8.3f %7.2fx %8.3f %6.2fx %9.0f\n", stage, N,
           peak / 1048576, want / 1048576, q->activations / 1048576, q->gathered / 1048576, setup / 1048576,
           q->shmem / 1048576, peak / want, plan.total > 0 ? peak / plan.total : 0, step, vs, cpu, cvs, faults);
    fflush(stdout);
    if (jn < (int)cap - 256)
        jn += snprintf(
            json + jn, cap - (size_t)jn,
            "%s{\"stage\": %d, \"ranks\": %d, \"peak_bytes\": %.0f, \"formula_bytes\": %.0f, "
            "\"activation_bytes\": %.0f, \"gathered_bytes\": %.0f, \"setup_peak_bytes\": %.0f, \"step_s\": %.4f, "
            "\"throughput_vs_ddp\": %.3f, \"plan_bytes\": %.0f, \"cpu_s\": %.4f, "
            "\"cpu_vs_ddp\": %.3f, \"faults\": %.0f}",
            (*done)++ ? ", " : "", stage, N, peak, want, q->activations, q->gathered, setup, step, vs, plan.total, cpu,
            cvs, faults);
    return jn;
}

int dt_bench_zero(int argc, char **argv) {
    const char *spec = "gpt:L=8,H=12,C=768,T=64", *ranks_s = "1,2,4", *stages_s = "0,1,2,3";
    int B = 2, steps = 2;
    const dt_flag flags[] = {
        {"model", DT_FLAG_STR, &spec, "SPEC", "the GPT (at least 50M parameters for the paper's regime)"},
        {"batch", DT_FLAG_INT, &B, "B", "sequences per rank per step"},
        {"steps", DT_FLAG_INT, &steps, "S", "timed steps after one warm-up step"},
        {"ranks", DT_FLAG_STR, &ranks_s, "LIST", "rank counts"},
        {"stages", DT_FLAG_STR, &stages_s, "LIST", "ZeRO stages (0 = plain ddp)"},
    };
    int rc = dt_flags_parse(argc, argv, 1, flags, 5, USAGE, NULL, 0, NULL, NULL);
    if (rc) return rc < 0 ? 2 : 0;
    dt_gpt_config g;
    dt_model *probe;
    if (dt_gpt_parse(spec, &g) != DT_OK || dt_gpt_create(&probe, &g) != DT_OK)
        return dt_cli_usage("e.g. --model gpt:L=8,H=12,C=768,T=64", "%s", dt_last_error());
    const double P = (double)dt_model_num_params(probe);
    if (B < 1 || steps < 1) {
        dt_model_destroy(probe);
        return dt_cli_usage(NULL, "--batch and --steps need at least 1");
    }
    int ranks[4], stages[4];
    int nr = parse_list(ranks_s, ranks, 4), ns = parse_list(stages_s, stages, 4);
    zero_header(spec, P, B, g.T);
    char json[16384];
    int jn = snprintf(json, sizeof json, "{\"bench\": \"zero\", \"model\": \"%s\", \"params\": %.0f, \"cases\": [",
                      spec, P);
    int done = 0;
    for (int i = 0; i < nr; i++) {
        const int N = ranks[i];
        double ddp_step = 0, ddp_cpu = 0;
        for (int k = 0; k < ns; k++) {
            zcase res[8];
            if (N < 1 || N > 8 || run_case(spec, stages[k], N, B, steps, res) != 0) {
                printf("%5d %5d  failed\n", stages[k], N);
                continue;
            }
            jn = zero_row(probe, P, B, stages[k], N, res, &ddp_step, &ddp_cpu, json, sizeof json, jn, &done);
        }
    }
    snprintf(json + jn, sizeof json - (size_t)jn, "]}");
    dt_model_destroy(probe);
    printf("%s\n", json);
    return 0;
}
