/* `dtrain launch -n N [--timeout S] [--] PROGRAM ARGS...`: runs N local ranks of a program with
 * the rank environment and prefixed output (the work is in src/run/launch.c). */
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "run/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *USAGE =
    "Usage: dtrain launch -n N [--timeout S] [--grace S] [--no-prefix] [--] PROGRAM ARGS...\n\n"
    "Starts N ranks of PROGRAM on this machine. Each rank gets DTRAIN_RANK, DTRAIN_WORLD_SIZE,\n"
    "DTRAIN_LOCAL_RANK, DTRAIN_LOCAL_WORLD_SIZE, DTRAIN_JOB_ID and DTRAIN_LAUNCHER_PID; its output\n"
    "lines are prefixed with \"[RANK] \". When one rank fails the others are stopped (SIGTERM, then\n"
    "SIGKILL after the grace period) and launch exits with that rank's status (128+signal when it\n"
    "was killed). SIGINT/SIGTERM are forwarded to every rank. Exit 124 on --timeout.\n\n"
    "Under mpirun or srun, do not use dtrain launch: start PROGRAM directly and the comm layer\n"
    "takes the rank from OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID.";

static void print_event(void *ctx, const char *msg) {
    (void)ctx;
    char out[4096];
    dt_cli_flag_terms(msg, out, sizeof out);
    fprintf(stderr, "dtrain launch: %s\n", out);
    fflush(stderr);
}

int dt_cmd_launch(int argc, char **argv) {
    int n = 0;
    float timeout = 0, grace = 5;
    bool no_prefix = false;
    const char *job_id = NULL;
    const dt_flag flags[] = {
        {"n", DT_FLAG_INT, &n, "N", "number of ranks to start (also -n N)"},
        {"timeout", DT_FLAG_FLOAT, &timeout, "S", "stop every rank and exit 124 after S seconds (0 = no limit)"},
        {"grace", DT_FLAG_FLOAT, &grace, "S", "seconds between SIGTERM and SIGKILL when stopping ranks"},
        {"no-prefix", DT_FLAG_BOOL, &no_prefix, NULL, "relay output lines without the \"[RANK] \" prefix"},
        {"job-id", DT_FLAG_STR, &job_id, "ID",
         "job id for DTRAIN_JOB_ID, letters/digits/_/. (default: generated, unique)"},
    };
    const int nflags = (int)(sizeof flags / sizeof flags[0]);

    /* The program starts at "--" or at the first argument that is not a flag or a flag's value,
     * so "dtrain launch -n 2 prog --its-flag" passes --its-flag to prog. */
    char **fargv = calloc((size_t)argc + 1, sizeof *fargv);
    if (!fargv) return dt_cli_fail(NULL, "out of memory");
    int fargc = 0, prog = argc;
    fargv[fargc++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            prog = i + 1;
            break;
        }
        if (a[0] != '-') {
            prog = i;
            break;
        }
        fargv[fargc++] = !strcmp(a, "-n") ? "--n" : argv[i];
        if (a[1] == '-' && !strchr(a, '=') && i + 1 < argc)
            for (int k = 0; k < nflags; k++)
                if (!strcmp(a + 2, flags[k].name) && flags[k].type != DT_FLAG_BOOL) fargv[fargc++] = argv[++i];
        if (!strcmp(a, "-n") && i + 1 < argc) fargv[fargc++] = argv[++i];
    }
    int rc = dt_flags_parse(fargc, fargv, 1, flags, nflags, USAGE, NULL, 0, NULL, NULL);
    free(fargv);
    if (rc > 0) return 0;
    if (rc < 0) return 2;
    bool n_given = false; /* -n 0 is a bad value, not a missing flag */
    for (int i = 1; i < prog && i < argc; i++)
        n_given |= !strcmp(argv[i], "-n") || !strcmp(argv[i], "--n") || !strncmp(argv[i], "--n=", 4);
    if (n < 1)
        return dt_cli_usage("e.g. dtrain launch -n 4 -- ./my_worker --flag",
                            n_given ? "-n %d: need at least 1 rank" : "missing -n N (number of ranks)", n);
    if (n > DT_LAUNCH_MAX_RANKS)
        return dt_cli_usage("more ranks run across hosts: mpirun or srun", "-n %d: at most %d local ranks", n,
                            DT_LAUNCH_MAX_RANKS);
    if (prog >= argc)
        return dt_cli_usage("e.g. dtrain launch -n 4 -- ./my_worker --flag", "missing the program to launch");
    if (timeout < 0 || grace < 0) return dt_cli_usage(NULL, "--timeout and --grace must be >= 0");

    if (dt_comm_env_is_rank())
        fprintf(stderr,
                "dtrain launch: note: started by mpirun/srun; these %d ranks form their own local job "
                "(to use MPI, run PROGRAM under mpirun/srun directly)\n",
                n);
    dt_launch_config cfg = {.nranks = n,
                            .timeout_s = timeout,
                            .grace_s = grace > 0 ? grace : 0.01,
                            .no_prefix = no_prefix,
                            .job_id = job_id,
                            .notify = print_event};
    dt_launch_result res;
    dt_status s = dt_launch_run(&cfg, argv + prog, &res);
    if (s == DT_ENOENT || (s != DT_OK && s != DT_EPEER && s != DT_EINTR && s != DT_ETIMEDOUT)) {
        dt_cli_fail(s == DT_ENOENT ? "check the program name and PATH, or give a path like ./prog" : NULL, "%s",
                    dt_last_error());
        return res.exit_code ? res.exit_code : 1;
    }
    return res.exit_code;
}
