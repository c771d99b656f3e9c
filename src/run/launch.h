/* Local launcher/supervisor: starts N rank processes of one program on this machine with the
 * rank environment, relays their output line by line with a "[rank] " prefix, forwards
 * SIGINT/SIGTERM/SIGHUP, stops the whole job when one rank fails (unless the job marked that rank
 * expendable), and removes the job's leftover
 * shared memory. Used by `dtrain launch` and (later) by `dtrain train --workers N`.
 *
 * Each rank runs in its own process group (signals reach its children too), with /dev/null as
 * stdin and PR_SET_PDEATHSIG=SIGTERM so ranks do not outlive a killed launcher.
 *
 * Rank environment (read by the comm layer): DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK,
 * DTRAIN_LOCAL_WORLD_SIZE, DTRAIN_JOB_ID, DTRAIN_LAUNCHER_PID.
 *
 * Under mpirun or srun this launcher is not needed: the comm layer takes the rank and world size
 * from OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE or SLURM_PROCID/NTASKS. Rank processes started
 * here get those variables removed so a launcher nested inside mpirun/srun forms its own job. */
#ifndef DT_RUN_LAUNCH_H
#define DT_RUN_LAUNCH_H

#include "dtrain/comm.h"
#include "dtrain/core.h"

/* Size of a job id buffer: the longest valid id (dt_comm_job_id_valid) plus NUL. */
#define DT_JOB_ID_MAX (DT_COMM_JOB_ID_MAX + 1)

/* The exit statuses of dtrain (documented in `dtrain --help` and the README), which the launcher
 * and the elastic supervisor understand: 0 success; 1 a failure at run time (I/O, memory, a
 * diverged run); DT_EXIT_USAGE a wrong command line (unknown flag, bad value, flags that do not
 * go together: the same command fails again); DT_EXIT_PEER the rank stopped because another rank
 * failed or stalled (the launcher blames the other one); DT_EXIT_CONFIG (sysexits EX_CONFIG) a
 * data set, checkpoint or model that cannot be used; DT_EXIT_OUTPUT (sysexits EX_CANTCREAT) an
 * output file or directory a flag names that cannot be written (found before the run). None of
 * DT_EXIT_USAGE, DT_EXIT_CONFIG and DT_EXIT_OUTPUT is restarted by --elastic. The launcher adds
 * 124 (its --timeout) and 128+N (killed by signal N). docs/exit-codes.md is the table. */
#define DT_EXIT_USAGE 2
#define DT_EXIT_OUTPUT 73
#define DT_EXIT_PEER 75
#define DT_EXIT_CONFIG 78
/* True for the statuses of a set-up that would fail the same way again (usage, config, output). */
static inline bool dt_exit_is_setup(int code) {
    return code == DT_EXIT_USAGE || code == DT_EXIT_CONFIG || code == DT_EXIT_OUTPUT;
}

/* The most local ranks one launch starts (--workers, dtrain launch -n): the shm transport maps
 * n x n channels into every rank, so more ranks than this on one host are no job to run (more
 * go across hosts: mpirun/srun). */
#define DT_LAUNCH_MAX_RANKS 256

typedef struct {
    int nranks;                   /* number of local ranks, 1..DT_LAUNCH_MAX_RANKS */
    double timeout_s;             /* whole-job deadline in seconds; 0 = none */
    double grace_s;               /* SIGTERM -> SIGKILL grace when stopping ranks; 0 = 5 s */
    bool no_prefix;               /* relay whole lines without the "[rank] " prefix */
    int out_fd, err_fd;           /* where rank stdout/stderr go; 0 = 1 and 2 */
    const char *job_id;           /* NULL = generate a unique one; else dt_comm_job_id_valid */
    const char *const *extra_env; /* NULL-terminated "K=V" strings added for every rank, or NULL */
    /* Called (from the launching thread) with one-line job events such as "rank 2 exited with
     * status 3; stopping 3 other ranks". The library never prints; the CLI prints these. */
    void (*notify)(void *ctx, const char *msg);
    void *notify_ctx;
    /* [nranks] or NULL: ranks the job can lose (ps workers). When one of them fails, the
     * launcher reports it ("rank 3 was killed by signal 9 (SIGKILL); the job goes on without
     * it") and keeps the others running; the job's result depends on the other ranks alone. */
    const bool *expendable;
    /* Instead of exec'ing argv (then NULL): each rank is a fork of this process that runs
     * child_main(child_ctx) with its rank environment and exits with what it returns
     * (dt_launch_workers in dtrain/launch.h). */
    int (*child_main)(void *ctx);
    void *child_ctx;
} dt_launch_config;

typedef struct {
    int exit_code;              /* exit status for the launcher: 0, the failing rank's status,
                                   128+signal for a rank killed by (or a launcher stopped by) a
                                   signal, 124 on timeout, 127 when the program cannot start */
    int failed_rank;            /* first rank that failed, -1 if none; a rank that exited
                                   DT_EXIT_PEER only if no other rank failed within 0.5 s */
    int lost;                   /* expendable ranks that failed (the job went on without them) */
    int shm_removed;            /* leftover /dev/shm/dtrain-<jobid>[.*] entries removed */
    bool all_exited_0;          /* every rank exited with status 0 (e.g. after a forwarded
                                   SIGTERM that the ranks handled by checkpointing) */
    char job_id[DT_JOB_ID_MAX]; /* the job id the ranks got */
} dt_launch_result;

/* Runs argv (argv[0] looked up in PATH) as cfg->nranks ranks and waits for all of them.
 * Returns DT_OK when every rank exited 0; DT_EPEER when a rank failed (the others were stopped);
 * DT_EINTR when the launcher got SIGINT/SIGTERM/SIGHUP; DT_ETIMEDOUT when the job deadline
 * passed; DT_ENOENT/DT_EIO when a rank could not be started. res (required) is always filled.
 * Installs its own SIGCHLD/SIGINT/SIGTERM/SIGHUP/SIGPIPE handlers for the duration and restores
 * the previous ones; only one call may run at a time in a process. */
dt_status dt_launch_run(const dt_launch_config *cfg, char *const argv[], dt_launch_result *res);

/* Writes a fresh unique job id (16 hex digits from pid, time and randomness) into out[cap]. */
void dt_launch_job_id(char *out, size_t cap);

/* Removes every /dev/shm entry named "dtrain-<job_id>" or "dtrain-<job_id>.*" (the comm layer's
 * segments of that job and of its splits); *removed (may be NULL) gets the count. DT_EINVAL on
 * a job id that dt_comm_job_id_valid rejects. */
dt_status dt_launch_cleanup_shm(const char *job_id, int *removed);

#endif
