/* Elastic supervisor: launch, watch, restart from the newest checkpoint with replacements. */
#include "run/elastic.h"

#include "run/ckpt_dir.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void say(const dt_elastic_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const dt_elastic_config *c, const char *fmt, ...) {
    if (!c->notify) return;
    char msg[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->notify(c->ctx, msg);
}

int dt_elastic_job_workers(int flag_workers) {
    const char *e = getenv(DT_ELASTIC_WORKERS_ENV);
    char *end;
    long v = e ? strtol(e, &end, 10) : 0;
    return e && *e && !*end && v >= 1 && v <= 1 << 20 ? (int)v : flag_workers;
}

dt_status dt_elastic_run(const dt_elastic_config *c, dt_launch_result *res) {
    if (c->min_workers < 1 || c->max_workers < c->min_workers || c->workers < c->min_workers ||
        c->workers > c->max_workers)
        return dt_error(DT_EINVAL, "`elastic` %d:%d must satisfy 1 <= MIN <= `workers` %d <= MAX", c->min_workers,
                        c->max_workers, c->workers);
    if (c->max_workers > DT_LAUNCH_MAX_RANKS)
        return dt_error(DT_EINVAL,
                        "`elastic` %d:%d: at most %d local ranks on one host (more: run across hosts with "
                        "mpirun or srun)",
                        c->min_workers, c->max_workers, DT_LAUNCH_MAX_RANKS);
    char **argv = calloc((size_t)c->argc + 3, sizeof *argv);
    if (!argv) return dt_error(DT_ENOMEM, "elastic: out of memory");
    memcpy(argv, c->argv, (size_t)c->argc * sizeof *argv);
    int n = c->workers, last_failed = -1;
    dt_status s = DT_OK;
    char size_env[64];
    const char *env[2] = {size_env, NULL};
    for (int restart = 0;; restart++) {
        /* the ranks' command still says --workers <first size>: tell them the job's size now */
        snprintf(size_env, sizeof size_env, "%s=%d", DT_ELASTIC_WORKERS_ENV, n);
        dt_launch_config lc = {.nranks = n, .notify = c->notify, .notify_ctx = c->ctx, .extra_env = env};
        double t0 = dt_now();
        s = dt_launch_run(&lc, argv, res);
        if (s == DT_OK || s == DT_EINTR) break;
        char ckpt[4096] = "none";
        bool found = false;
        if (c->checkpoint_dir) {
            dt_ckpt_dir_prune(c->checkpoint_dir, 0); /* a rank killed mid-write left its temp file */
            dt_ckpt_dir_latest(c->checkpoint_dir, ckpt, sizeof ckpt, &found, NULL, NULL);
        }
        if (res->failed_rank < 0 && res->exit_code == 127) break;        /* cannot start at all: no point retrying */
        if (res->failed_rank >= 0 && dt_exit_is_setup(res->exit_code)) { /* the same flags would fail again */
            say(c, "rank %d failed in set-up (exit %d: %s); not restarting: fix the command and run it again",
                res->failed_rank, res->exit_code,
                res->exit_code == DT_EXIT_USAGE ? "bad flags" : "bad data, checkpoint or model");
            break;
        }
        if (restart >= c->max_restarts) {
            say(c, "rank %d failed after %.1f s; giving up after %d restart%s (`max_restarts` %d)", res->failed_rank,
                dt_now() - t0, restart, restart == 1 ? "" : "s", c->max_restarts);
            break;
        }
        /* a replacement is spawned for the dead rank; but a rank slot that fails twice in a row is
         * taken as unavailable and the job shrinks by one (not below MIN): the checkpoint does not
         * depend on the number of workers */
        if (res->failed_rank == last_failed && n > c->min_workers) {
            n--;
            say(c, "rank %d failed twice in a row: continuing without it", res->failed_rank);
        }
        last_failed = res->failed_rank;
        say(c, "rank %d failed after %.1f s (exit %d); restart %d of %d with %d worker%s from %s", res->failed_rank,
            dt_now() - t0, res->exit_code, restart + 1, c->max_restarts, n, n == 1 ? "" : "s",
            found ? ckpt : "scratch (no checkpoint yet)");
        argv[c->argc] = "--resume";
        argv[c->argc + 1] = "auto";
        argv[c->argc + 2] = NULL;
    }
    free(argv);
    return s;
}
