/* Local launcher/supervisor (see launch.h): fork+exec of N ranks in their own process groups,
 * a poll() loop relaying each rank's stdout/stderr as whole prefixed lines, signal forwarding,
 * stop-on-first-failure with a SIGTERM -> SIGKILL grace period, and shared-memory cleanup. */
#include "run/launch_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_sigpipe[2] = {-1, -1};
static volatile sig_atomic_t g_active;

static void on_signal(int sig) {
    int e = errno;
    unsigned char b = (unsigned char)sig;
    if (write(g_sigpipe[1], &b, 1) < 0) { /* pipe full: a wakeup is already pending */
    }
    errno = e;
}

static void notify(const job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void notify(const job *j, const char *fmt, ...) {
    if (!j->cfg->notify) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    j->cfg->notify(j->cfg->notify_ctx, msg);
}

void dt_launch_job_id(char *out, size_t cap) {
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) rnd = (uint32_t)clock();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint32_t t = (uint32_t)ts.tv_sec * 1000003u ^ (uint32_t)ts.tv_nsec;
    uint64_t hi = ((uint64_t)(uint32_t)getpid() << 16) ^ (t >> 8) ^ ((uint64_t)t << 40);
    snprintf(out, cap, "%08x%08x", (uint32_t)(hi ^ (hi >> 32)), rnd ^ t);
}

dt_status dt_launch_cleanup_shm(const char *job_id, int *removed) {
    if (removed) *removed = 0;
    if (!dt_comm_job_id_valid(job_id))
        return dt_error(DT_EINVAL, "job id '%.40s' must be 1-%d characters of letters, digits, '_' and '.'",
                        job_id ? job_id : "(null)", DT_COMM_JOB_ID_MAX);
    char pre[DT_JOB_ID_MAX + 16];
    size_t pl = (size_t)snprintf(pre, sizeof pre, "dtrain-%s", job_id);
    DIR *d = opendir("/dev/shm");
    if (!d) return DT_OK; /* no POSIX shm on this system: nothing to remove */
    struct dirent *e;
    while ((e = readdir(d))) {
        /* the comm layer's names: "dtrain-<job>" and split segments "dtrain-<job>.<id>.<color>";
         * job ids have no '-', so "dtrain-data-*" (the data-set cache) never matches */
        if (strncmp(e->d_name, pre, pl) != 0 || (e->d_name[pl] && e->d_name[pl] != '.')) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0 && removed) (*removed)++;
    }
    closedir(d);
    return DT_OK;
}

/* Signals the process group of every rank (children of a rank included). After a rank was
 * reaped its group may live on in its children; a pgid is not reused while the group exists. */
static void signal_ranks(job *j, int sig) {
    for (int i = 0; i < j->n; i++)
        if (j->r[i].pgid > 0) kill(-j->r[i].pgid, sig);
}

static int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

static void describe(int status, char *out, size_t cap) {
    if (WIFSIGNALED(status)) {
        const char *abbr = sigabbrev_np(WTERMSIG(status));
        snprintf(out, cap, "was killed by signal %d (SIG%s)", WTERMSIG(status), abbr ? abbr : "?");
    } else {
        snprintf(out, cap, "exited with status %d", exit_code_of(status));
    }
}

/* Reaps every rank that has exited and notes the ones stopped (SIGSTOP, SIGTSTP) or continued.
 * The first failed rank goes to j->failed, except that a rank that exited DT_EXIT_PEER (it
 * stopped because another rank failed or stalled) goes to j->peer instead. */
static void reap(job *j) {
    for (int i = 0; i < j->n; i++) {
        rank *r = &j->r[i];
        if (r->pid <= 0) continue;
        int st;
        pid_t p = waitpid(r->pid, &st, WNOHANG | WUNTRACED | WCONTINUED);
        if (p != r->pid) continue;
        if (WIFSTOPPED(st) || WIFCONTINUED(st)) {
            r->stop_sig = WIFSTOPPED(st) ? WSTOPSIG(st) : 0;
            continue;
        }
        r->status = st;
        r->pid = 0;
        r->stop_sig = 0;
        j->live--;
        if (r->abandoned) continue; /* already reported (check_all_stopped) */
        /* an expendable rank may die, but not fail its set-up (bad flags fail every rank alike), nor
         * give up on a peer (DT_EXIT_PEER: a ps worker whose server stalled or died; going on
         * without the workers would wait for that server forever) */
        const int code = exit_code_of(st);
        if (!j->stopping && code != 0 && !dt_exit_is_setup(code) && code != DT_EXIT_PEER && j->cfg->expendable &&
            j->cfg->expendable[i]) {
            char how[96];
            describe(st, how, sizeof how);
            notify(j, "rank %d %s; the job goes on without it", i, how);
            j->lost++;
            continue;
        }
        if (j->stopping || exit_code_of(st) == 0) continue;
        if (WIFEXITED(st) && WEXITSTATUS(st) == DT_EXIT_PEER) {
            if (j->peer < 0) j->peer = i;
        } else if (j->failed < 0) {
            j->failed = i;
        }
    }
}

/* Stops the job: sig to every rank, SIGKILL after the grace period. */
static void stop_job(job *j, int sig, double now) {
    j->stopping = true;
    signal_ranks(j, sig);
    j->kill_deadline = now + j->grace;
}

/* A rank that is stopped (kill -STOP) takes part in nothing: when the only failure is a rank
 * that gave up on a peer (DT_EXIT_PEER), the stopped rank is the culprit, not the one that
 * noticed. Returns it, or -1. */
static int stalled_rank(const job *j) {
    for (int i = 0; i < j->n; i++)
        if (j->r[i].pid > 0 && j->r[i].stop_sig) return i;
    return -1;
}

/* Every rank still running is stopped (kill -STOP) for a second: nothing will ever wake them,
 * and nobody waits for them with a deadline (the others have exited: a ps job whose server and
 * other workers are done). Expendable ones are killed and the job goes on without them; any
 * other is the job's failure. Without this the launcher waited forever. */
static void check_all_stopped(job *j, double now) {
    if (j->stopping || j->live == 0) {
        j->all_stopped_since = 0;
        return;
    }
    for (int i = 0; i < j->n; i++)
        if (j->r[i].pid > 0 && !j->r[i].stop_sig) {
            j->all_stopped_since = 0;
            return;
        }
    if (j->all_stopped_since == 0) {
        j->all_stopped_since = now;
        return;
    }
    if (now - j->all_stopped_since < ALL_STOPPED_S) return;
    j->all_stopped_since = 0;
    for (int i = 0; i < j->n; i++) {
        rank *r = &j->r[i];
        if (r->pid <= 0) continue;
        const char *abbr = sigabbrev_np(r->stop_sig);
        if (j->cfg->expendable && j->cfg->expendable[i]) {
            notify(j, "rank %d is stopped (SIG%s) and every other rank has finished: the job goes on without it", i,
                   abbr ? abbr : "?");
            r->abandoned = true;
            j->lost++;
            kill(-r->pgid, SIGKILL);
            kill(-r->pgid, SIGCONT);
        } else if (j->res->failed_rank < 0) {
            char how[160];
            snprintf(how, sizeof how, "is stopped (SIG%s) and every other rank has exited: it cannot finish",
                     abbr ? abbr : "?");
            notify(j, "rank %d %s; stopping it", i, how);
            j->res->failed_rank = i;
            j->res->exit_code = 128 + r->stop_sig;
            j->st = dt_error(DT_EPEER, "rank %d %s", i, how);
            stop_job(j, SIGKILL, now);
            signal_ranks(j, SIGCONT);
        }
    }
}

/* Blames the failed rank (once its culprit is known) and stops the others. */
static void check_failures(job *j, double now) {
    reap(j);
    check_all_stopped(j, now);
    if (j->stopping) return;
    char how[160];
    if (j->failed < 0 && j->peer >= 0) {
        if (j->peer_deadline == 0) j->peer_deadline = now + PEER_WAIT_S;
        if (now < j->peer_deadline && j->live > 0) return; /* the real culprit may still fail */
        int stalled = stalled_rank(j);
        if (stalled >= 0) {
            const char *abbr = sigabbrev_np(j->r[stalled].stop_sig);
            snprintf(how, sizeof how, "is stopped (SIG%s) and took no part: rank %d gave up waiting for it (exit %d)",
                     abbr ? abbr : "?", j->peer, DT_EXIT_PEER);
            j->failed = stalled;
            j->res->failed_rank = stalled;
            j->res->exit_code = DT_EXIT_PEER;
        } else {
            describe(j->r[j->peer].status, how, sizeof how);
            snprintf(how + strlen(how), sizeof how - strlen(how), " (it gave up on another rank; see its message)");
            j->failed = j->peer;
        }
    } else if (j->failed >= 0) {
        describe(j->r[j->failed].status, how, sizeof how);
    } else {
        return;
    }
    if (j->res->failed_rank < 0) {
        j->res->failed_rank = j->failed;
        j->res->exit_code = exit_code_of(j->r[j->failed].status);
    }
    int others = j->live - (j->r[j->failed].pid > 0);
    if (others > 0) notify(j, "rank %d %s; stopping %d other rank%s", j->failed, how, others, others == 1 ? "" : "s");
    else notify(j, "rank %d %s", j->failed, how);
    j->st = dt_error(DT_EPEER, "rank %d %s", j->failed, how);
    stop_job(j, SIGTERM, now);
}

/* The job's deadline, the SIGKILL after the grace period, and the drain of leftover pipes.
 * Returns false when the supervision loop is over. */
static bool check_deadlines(job *j, double now) {
    if (!j->stopping && j->job_deadline > 0 && now >= j->job_deadline) {
        notify(j, "timeout after %g s; stopping %d rank%s", j->cfg->timeout_s, j->live, j->live == 1 ? "" : "s");
        j->res->exit_code = 124;
        j->st = dt_error(DT_ETIMEDOUT, "job did not finish within %g s (`timeout`)", j->cfg->timeout_s);
        stop_job(j, SIGTERM, now);
    }
    if (j->stopping && j->live > 0 && j->kill_deadline > 0 && now >= j->kill_deadline) {
        notify(j, "%d rank%s still running after %g s; sending SIGKILL", j->live, j->live == 1 ? "" : "s", j->grace);
        signal_ranks(j, SIGKILL);
        j->kill_deadline = 0;
    }
    if (j->live == 0 && j->drain_deadline == 0) j->drain_deadline = now + 2.0;
    if (j->live == 0 && now >= j->drain_deadline) { /* a leftover child holds a pipe open */
        for (int i = 0; i < j->n; i++)
            for (int k = 0; k < 2; k++) dt_launch_close_stream(j, i, &j->r[i].s[k]);
        return false;
    }
    return true;
}

/* Signals that reached the launcher: the first is forwarded (the job stops), a second kills. */
static void handle_signals(job *j) {
    unsigned char b[64];
    ssize_t got;
    while ((got = read(g_sigpipe[0], b, sizeof b)) > 0)
        for (ssize_t i = 0; i < got; i++) {
            int sig = b[i];
            if (sig == SIGCHLD) continue;
            if (!j->got_sig && !j->stopping) {
                j->got_sig = sig;
                notify(j, "got SIG%s; stopping %d rank%s", sigabbrev_np(sig), j->live, j->live == 1 ? "" : "s");
                j->res->exit_code = 128 + sig;
                j->st = dt_error(DT_EINTR, "launcher interrupted by SIG%s", sigabbrev_np(sig));
                stop_job(j, sig, dt_now());
            } else if (j->live > 0) { /* a second signal: no more grace */
                signal_ranks(j, SIGKILL);
                j->kill_deadline = 0;
            }
        }
}

static double deadline_ms(double deadline, double now) {
    if (deadline <= 0) return -1;
    double ms = (deadline - now) * 1000.0;
    return ms < 0 ? 0 : ms;
}

/* Waits for the next event (a line, a signal, a deadline) and handles it. */
static void poll_once(job *j, double now) {
    int np = 0;
    j->pfd[np] = (struct pollfd){g_sigpipe[0], POLLIN, 0};
    j->pidx[np++] = -1;
    for (int i = 0; i < j->n; i++)
        for (int k = 0; k < 2; k++)
            if (j->r[i].s[k].fd >= 0) {
                j->pfd[np] = (struct pollfd){j->r[i].s[k].fd, POLLIN, 0};
                j->pidx[np++] = 2 * i + k;
            }
    double ms = -1;
    double dls[5] = {j->stopping ? 0 : j->job_deadline, j->stopping ? j->kill_deadline : 0,
                     j->live == 0 ? j->drain_deadline : 0, j->stopping ? 0 : j->peer_deadline,
                     j->all_stopped_since > 0 ? j->all_stopped_since + ALL_STOPPED_S : 0};
    for (int d = 0; d < 5; d++) {
        double m = deadline_ms(dls[d], now);
        if (m >= 0 && (ms < 0 || m < ms)) ms = m;
    }
    int pr = poll(j->pfd, (nfds_t)np, ms < 0 ? -1 : (int)(ms + 1));
    if (pr < 0 && errno != EINTR) {
        j->st = dt_error(DT_EIO, "poll failed in the launcher: %s", strerror(errno));
        signal_ranks(j, SIGKILL);
        j->stopping = true;
    }
    if (pr <= 0) return;
    if (j->pfd[0].revents) handle_signals(j);
    for (int p = 1; p < np; p++)
        if (j->pfd[p].revents) dt_launch_read_stream(j, j->pidx[p] / 2, &j->r[j->pidx[p] / 2].s[j->pidx[p] % 2]);
}

/* Allocates the job's ranks (environment, line buffers) and poll arrays. */
static dt_status job_prepare(job *j) {
    j->r = calloc((size_t)j->n, sizeof *j->r);
    j->pfd = calloc((size_t)(2 * j->n + 1), sizeof *j->pfd);
    j->pidx = calloc((size_t)(2 * j->n + 1), sizeof *j->pidx);
    if (!j->r || !j->pfd || !j->pidx) return dt_error(DT_ENOMEM, "out of memory starting %d ranks", j->n);
    for (int i = 0; i < j->n; i++) {
        j->r[i].s[0].fd = j->r[i].s[1].fd = -1;
        j->r[i].env = dt_launch_rank_env(j->cfg, i, j->res->job_id);
        j->r[i].s[0].buf = malloc(LINE_CAP);
        j->r[i].s[1].buf = malloc(LINE_CAP);
        if (!j->r[i].env || !j->r[i].s[0].buf || !j->r[i].s[1].buf)
            return dt_error(DT_ENOMEM, "out of memory preparing rank %d", i);
    }
    return DT_OK;
}

static void job_free(job *j) {
    for (int i = 0; j->r && i < j->n; i++) {
        dt_launch_free_env(j->r[i].env);
        free(j->r[i].s[0].buf);
        free(j->r[i].s[1].buf);
    }
    free(j->r);
    free(j->pfd);
    free(j->pidx);
}

static const int g_sigs[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE};
#define N_SIGS ((int)(sizeof g_sigs / sizeof *g_sigs))

/* Starts the ranks and supervises them until all have exited and their output is relayed. */
static void supervise(job *j, char *const argv[]) {
    const dt_launch_config *cfg = j->cfg;
    double t0 = dt_now();
    j->grace = cfg->grace_s > 0 ? cfg->grace_s : 5.0;
    j->job_deadline = cfg->timeout_s > 0 ? t0 + cfg->timeout_s : 0;
    j->failed = j->peer = -1;
    for (int i = 0; i < j->n; i++) {
        j->st = dt_launch_spawn(j, i, argv);
        if (j->st != DT_OK) {
            j->res->exit_code = 127;
            stop_job(j, SIGTERM, dt_now());
            break;
        }
    }
    while (j->live > 0 || j->open_fds > 0) {
        double now = dt_now();
        check_failures(j, now);
        if (!check_deadlines(j, now)) break;
        poll_once(j, now);
    }
    if (j->stopping) signal_ranks(j, SIGKILL); /* leftovers of stopped ranks' process groups */
}

dt_status dt_launch_run(const dt_launch_config *cfg, char *const argv[], dt_launch_result *res) {
    memset(res, 0, sizeof *res);
    res->failed_rank = -1;
    res->exit_code = 1;
    if (!cfg || cfg->nranks < 1 || (!cfg->child_main && (!argv || !argv[0])))
        return dt_error(DT_EINVAL, "launch needs nranks >= 1 and a program to run");
    if (cfg->nranks > DT_LAUNCH_MAX_RANKS)
        return dt_error(DT_EINVAL,
                        "%d local ranks: at most %d on one host (more: run across hosts with mpirun or "
                        "srun)",
                        cfg->nranks, DT_LAUNCH_MAX_RANKS);
    if (cfg->job_id && !dt_comm_job_id_valid(cfg->job_id))
        return dt_error(DT_EINVAL, "job id '%.40s' must be 1-%d characters of letters, digits, '_' and '.'",
                        cfg->job_id, DT_COMM_JOB_ID_MAX);
    if (g_active) return dt_error(DT_EINVAL, "dt_launch_run is already running in this process");
    if (cfg->job_id) snprintf(res->job_id, sizeof res->job_id, "%s", cfg->job_id);
    else dt_launch_job_id(res->job_id, sizeof res->job_id);

    job j = {.cfg = cfg, .res = res, .n = cfg->nranks, .bar_fd = -1};
    dt_status st = job_prepare(&j);
    if (st == DT_OK) st = dt_launch_bind(&j);
    if (st == DT_OK && pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK))
        st = dt_error(DT_EIO, "cannot create the launcher's signal pipe: %s", strerror(errno));
    if (st != DT_OK) {
        job_free(&j);
        return st;
    }
    g_active = 1;
    struct sigaction old[N_SIGS], sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int i = 0; i < N_SIGS; i++) {
        sa.sa_handler = g_sigs[i] == SIGPIPE ? SIG_IGN : on_signal;
        sigaction(g_sigs[i], &sa, &old[i]);
    }
    supervise(&j, argv);
    dt_launch_note_repeats(&j, cfg->notify, cfg->notify_ctx);
    st = j.st;
    if (st == DT_OK) res->exit_code = 0;
    res->lost = j.lost;
    res->all_exited_0 = true;
    for (int i = 0; i < j.n; i++)
        if (!WIFEXITED(j.r[i].status) || WEXITSTATUS(j.r[i].status) != 0) res->all_exited_0 = false;
    for (int i = 0; i < N_SIGS; i++) sigaction(g_sigs[i], &old[i], NULL);
    close(g_sigpipe[0]);
    close(g_sigpipe[1]);
    g_sigpipe[0] = g_sigpipe[1] = -1;
    g_active = 0;
    dt_launch_cleanup_shm(res->job_id, &res->shm_removed);
    job_free(&j);
    return st;
}
