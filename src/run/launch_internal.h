/* The launcher's internals shared by its supervision loop (launch.c) and the start and output
 * relay of one rank (launch_rank.c). */
#ifndef DTRAIN_RUN_LAUNCH_INTERNAL_H
#define DTRAIN_RUN_LAUNCH_INTERNAL_H
#include "run/launch.h"

#include <poll.h>
#include <sched.h>
#include <stdbool.h>
#include <sys/types.h>

#define LINE_CAP (64 * 1024) /* a longer line is relayed in pieces of this size */
#define PEER_WAIT_S 0.5      /* after a DT_EXIT_PEER exit, how long to wait for the real culprit */
#define ALL_STOPPED_S 1.0    /* every live rank stopped this long: they cannot finish */

typedef struct {
    int fd;    /* read end of the rank's pipe, -1 once closed */
    int out;   /* where its lines go */
    char *buf; /* pending partial line */
    size_t len;
    bool hide_hint; /* the last line was a repeated error: its HINT line is not relayed either */
} stream;

/* An error line ("dtrain: error: ...") a rank relayed: the same text from another rank (a
 * set-up error every rank meets) is counted here instead of printed again. */
#define LAUNCH_ERRS 4
#define LAUNCH_ERR_CAP 512
typedef struct {
    char text[LAUNCH_ERR_CAP];
    int rank, repeats;
} relayed_error;

typedef struct {
    pid_t pid;      /* 0 once reaped */
    pid_t pgid;     /* its process group (= first pid), kept after reaping */
    int status;     /* wait status once reaped */
    int stop_sig;   /* the signal that stopped it (SIGSTOP ...) while it is stopped, else 0 */
    bool abandoned; /* an expendable rank left stopped when the others were done: killed, not "lost" twice */
    char **env;
    stream s[2]; /* stdout, stderr */
    bool bound;  /* runs on `cpus` only (its slice of the launcher's CPUs) */
    cpu_set_t cpus;
} rank;

typedef struct {
    const dt_launch_config *cfg;
    dt_launch_result *res;
    rank *r;
    int n, live, open_fds;
    int lost; /* expendable ranks that failed */
    struct pollfd *pfd;
    int *pidx; /* [2n+1] which rank stream each pfd entry is (-1: the signal pipe) */
    /* supervision state */
    dt_status st;
    bool stopping;
    int failed, peer, got_sig;
    double grace, job_deadline, kill_deadline, drain_deadline;
    double peer_deadline;     /* a rank exited DT_EXIT_PEER: until then, wait for the culprit */
    double all_stopped_since; /* every live rank is stopped (since then): they cannot finish */
    relayed_error errs[LAUNCH_ERRS];
    int nerrs;
    int bar_fd; /* where a piece without a newline (a progress bar) was relayed last; -1: none open */
} job;

/* Gives each of the job's ranks an equal slice of the launcher's allowed CPUs (rank r the r-th)
 * when there are at least two ranks and no more ranks than CPUs, unless DTRAIN_BIND=none; two
 * ranks of a synchronous job then never share a core, and a rank's threads (loader, comm) stay
 * beside it. DT_EINVAL for another DTRAIN_BIND value. */
dt_status dt_launch_bind(job *j);

/* The environment of rank `rank` (the parent's minus rank variables, plus the job's), freed
 * with dt_launch_free_env; NULL or a NULL entry when out of memory. */
char **dt_launch_rank_env(const dt_launch_config *cfg, int rank, const char *job_id);
void dt_launch_free_env(char **env);
/* Forks (and unless cfg->child_main, execs) rank rk with its pipes; counts it live. */
dt_status dt_launch_spawn(job *j, int rk, char *const argv[]);
/* Reads what rank rk wrote to s and relays its whole lines, prefixed; closes s at EOF. */
void dt_launch_read_stream(job *j, int rk, stream *s);
/* The notify lines for errors that more than one rank printed ("2 other ranks printed the same
 * error (shown once, from rank 0)"), one per error, once the job is over. */
void dt_launch_note_repeats(const job *j, void (*say)(void *ctx, const char *msg), void *ctx);
/* Relays what is left of s (a last partial line too) and closes it. */
void dt_launch_close_stream(job *j, int rk, stream *s);
#endif
