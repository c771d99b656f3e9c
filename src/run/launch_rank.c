/* One rank of the local launcher: its environment, its start (fork, then exec or a forked
 * worker's main) and the relay of its stdout/stderr as whole lines prefixed with the rank. */
#include "run/launch_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

extern char **environ;

/* Environment of one rank: the parent's minus DTRAIN_* rank variables and MPI/Slurm rank
 * variables, plus extra_env and the rank variables. */
char **dt_launch_rank_env(const dt_launch_config *cfg, int rank, const char *job_id) {
    static const char *drop[] = {
        "DTRAIN_RANK=",   "DTRAIN_WORLD_SIZE=",   "DTRAIN_LOCAL_RANK=", "DTRAIN_LOCAL_WORLD_SIZE=",
        "DTRAIN_JOB_ID=", "DTRAIN_LAUNCHER_PID=", "OMPI_COMM_WORLD_",   "PMI_RANK=",
        "PMI_SIZE=",      "PMIX_RANK=",           "SLURM_PROCID=",      "SLURM_LOCALID=",
        "SLURM_NTASKS="};
    size_t ne = 0, nx = 0;
    while (environ[ne]) ne++;
    while (cfg->extra_env && cfg->extra_env[nx]) nx++;
    char **env = calloc(ne + nx + 8, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < ne; i++) {
        bool keep = true;
        for (size_t d = 0; d < sizeof drop / sizeof *drop; d++)
            if (!strncmp(environ[i], drop[d], strlen(drop[d]))) keep = false;
        if (keep) env[k++] = strdup(environ[i]);
    }
    for (size_t i = 0; i < nx; i++) env[k++] = strdup(cfg->extra_env[i]);
    char v[6][DT_JOB_ID_MAX + 32];
    snprintf(v[0], sizeof v[0], "DTRAIN_RANK=%d", rank);
    snprintf(v[1], sizeof v[1], "DTRAIN_WORLD_SIZE=%d", cfg->nranks);
    snprintf(v[2], sizeof v[2], "DTRAIN_LOCAL_RANK=%d", rank);
    snprintf(v[3], sizeof v[3], "DTRAIN_LOCAL_WORLD_SIZE=%d", cfg->nranks);
    snprintf(v[4], sizeof v[4], "DTRAIN_JOB_ID=%s", job_id);
    snprintf(v[5], sizeof v[5], "DTRAIN_LAUNCHER_PID=%ld", (long)getpid());
    for (int i = 0; i < 6; i++) env[k++] = strdup(v[i]);
    for (size_t i = 0; i < k; i++)
        if (!env[i]) return env; /* caller frees; treated as ENOMEM */
    return env;
}

dt_status dt_launch_bind(job *j) {
    const char *b = getenv("DTRAIN_BIND");
    if (b && *b && strcmp(b, "core") && strcmp(b, "none"))
        return dt_error(DT_EINVAL,
                        "DTRAIN_BIND=%s: use core (each local rank on a slice of the CPUs of its own when "
                        "they are at least as many as the ranks; the default) or none (the OS places them)",
                        b);
    cpu_set_t all;
    if ((b && !strcmp(b, "none")) || j->n < 2 || sched_getaffinity(0, sizeof all, &all)) return DT_OK;
    int cpu[CPU_SETSIZE], nc = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) cpu[nc++] = c;
    if (nc < j->n) return DT_OK; /* more ranks than CPUs: the OS balances them */
    for (int i = 0; i < j->n; i++) {
        rank *r = &j->r[i];
        CPU_ZERO(&r->cpus);
        for (int k = nc * i / j->n; k < nc * (i + 1) / j->n; k++) CPU_SET(cpu[k], &r->cpus);
        r->bound = true;
    }
    return DT_OK;
}

void dt_launch_free_env(char **env) {
    if (!env) return;
    for (char **p = env; *p; p++) free(*p);
    free(env);
}

/* Writes all of buf to fd, retrying on EINTR; output errors (closed stdout) are dropped. */
static void write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        buf += w;
        n -= (size_t)w;
    }
}

/* Whether the line piece (n bytes, no newline) rank rk wrote to stderr repeats an error line
 * another rank already relayed, or is the HINT that follows such a one: it is then counted, not
 * relayed. Errors that name a rank or a file of their own differ and are all relayed. */
static bool repeated_error(job *j, int rk, stream *s, const char *line, size_t n) {
    static const char err[] = "dtrain: error: ", hint[] = "HINT: ";
    if (s != &j->r[rk].s[1]) return false;
    if (n >= sizeof hint - 1 && !memcmp(line, hint, sizeof hint - 1)) return s->hide_hint;
    s->hide_hint = false;
    if (n < sizeof err - 1 || memcmp(line, err, sizeof err - 1) || n >= LAUNCH_ERR_CAP) return false;
    for (int k = 0; k < j->nerrs; k++) {
        relayed_error *e = &j->errs[k];
        if (strlen(e->text) == n && !memcmp(e->text, line, n)) {
            if (e->rank == rk) return false; /* a rank repeating itself is relayed as it is */
            e->repeats++;
            return s->hide_hint = true;
        }
    }
    if (j->nerrs < LAUNCH_ERRS) {
        relayed_error *e = &j->errs[j->nerrs++];
        memcpy(e->text, line, n);
        e->text[n] = 0;
        e->rank = rk, e->repeats = 0;
    }
    return false;
}

void dt_launch_note_repeats(const job *j, void (*say)(void *ctx, const char *msg), void *ctx) {
    for (int k = 0; say && k < j->nerrs; k++) {
        const relayed_error *e = &j->errs[k];
        if (e->repeats == 0) continue;
        char msg[128];
        snprintf(msg, sizeof msg, "%d other rank%s printed the same error (shown once, from rank %d)", e->repeats,
                 e->repeats == 1 ? "" : "s", e->rank);
        say(ctx, msg);
    }
}

/* Before a line that does not redraw ('\r') goes out while a bar is open on the terminal (a
 * piece relayed without a newline, on this stream or the other one): what was gathered for
 * s->out goes first, then the bar's line is cleared, so the line does not land glued to it. */
static void close_bar(job *j, stream *s, char *out, size_t *outn) {
    write_all(s->out, out, *outn);
    *outn = 0;
    write_all(j->bar_fd, "\r\033[K", 4);
    j->bar_fd = -1;
}

/* Relays the complete lines of s (all of it when flush), each prefixed, in one write. A piece
 * that a '\r' follows, or that starts with one and ends what was read, is relayed as it is,
 * without a newline: a progress bar that redraws its line ("\r\033[K...") reaches the terminal
 * as it is drawn; another rank's or
 * stream's line clears it first (close_bar). A last piece that only clears ("\r\033[K") gets no
 * newline. */
static void relay(job *j, int rk, stream *s, bool flush) {
    size_t start = 0, outn = 0;
    char pre[24];
    int pl = j->cfg->no_prefix ? 0 : snprintf(pre, sizeof pre, "[%d] ", rk);
    size_t lines = 1;
    for (size_t i = 0; i < s->len; i++) lines += s->buf[i] == '\n' || s->buf[i] == '\r'; /* a piece each */
    char *out = malloc(s->len + lines * ((size_t)pl + 1));
    if (!out) return;
    for (size_t i = 0; i < s->len; i++) {
        bool last = flush && i + 1 == s->len;
        /* followed by a redraw, or a redraw itself that has all arrived (a bar is written at once) */
        bool redraw = s->buf[i] != '\n' &&
                      ((i + 1 < s->len && s->buf[i + 1] == '\r') || (i + 1 == s->len && s->buf[start] == '\r'));
        if (s->buf[i] != '\n' && !last && !redraw && !(i - start + 1 >= LINE_CAP)) continue;
        const size_t n = i + 1 - start - (s->buf[i] == '\n');
        if (repeated_error(j, rk, s, s->buf + start, n)) {
            start = i + 1;
            continue;
        }
        const bool redraws = s->buf[start] == '\r', clears = n == 4 && !memcmp(s->buf + start, "\r\033[K", 4);
        if (j->bar_fd >= 0 && !redraws) close_bar(j, s, out, &outn);
        memcpy(out + outn, pre, (size_t)pl);
        outn += (size_t)pl;
        memcpy(out + outn, s->buf + start, i + 1 - start);
        outn += i + 1 - start;
        const bool open = s->buf[i] != '\n' && (redraw || clears); /* no newline after it */
        if (s->buf[i] != '\n' && !open) out[outn++] = '\n';
        j->bar_fd = open && !clears ? s->out : -1;
        start = i + 1;
    }
    write_all(s->out, out, outn);
    free(out);
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

void dt_launch_close_stream(job *j, int rk, stream *s) {
    if (s->fd < 0) return;
    relay(j, rk, s, true);
    close(s->fd);
    s->fd = -1;
    j->open_fds--;
}

void dt_launch_read_stream(job *j, int rk, stream *s) {
    for (;;) {
        ssize_t got = read(s->fd, s->buf + s->len, LINE_CAP - s->len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && errno == EAGAIN) return;
        if (got <= 0) {
            dt_launch_close_stream(j, rk, s);
            return;
        }
        s->len += (size_t)got;
        relay(j, rk, s, false);
        if (s->len < LINE_CAP) return;
    }
}

/* Starts rank rk; exec failure is reported through a close-on-exec pipe as an errno. */
dt_status dt_launch_spawn(job *j, int rk, char *const argv[]) {
    rank *r = &j->r[rk];
    int out[2] = {-1, -1}, err[2] = {-1, -1}, ex[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(ex, O_CLOEXEC)) {
        int e = errno;
        for (int i = 0; i < 2; i++) {
            if (out[i] >= 0) close(out[i]);
            if (err[i] >= 0) close(err[i]);
            if (ex[i] >= 0) close(ex[i]);
        }
        return dt_error(DT_EIO, "cannot create pipes for rank %d: %s", rk, strerror(e));
    }
    pid_t parent = getpid();
    if (j->cfg->child_main) fflush(NULL); /* no buffered output is written twice */
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(out[0]);
        close(out[1]);
        close(err[0]);
        close(err[1]);
        close(ex[0]);
        close(ex[1]);
        return dt_error(DT_EIO, "cannot fork rank %d: %s", rk, strerror(e));
    }
    if (pid == 0) { /* child: only async-signal-safe calls until exec */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(126);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) {
            dup2(nul, 0);
            if (nul > 2) close(nul);
        }
        dup2(out[1], 1);
        dup2(err[1], 2);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGCHLD, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (r->bound) sched_setaffinity(0, sizeof r->cpus, &r->cpus); /* its threads inherit it */
        if (j->cfg->child_main) { /* a forked worker: no exec, so close what exec would */
            close(ex[1]);
            close(out[0]);
            close(err[0]);
            environ = r->env;
            int rc = j->cfg->child_main(j->cfg->child_ctx);
            fflush(NULL);
            _exit(rc);
        }
        execvpe(argv[0], argv, r->env);
        int e = errno;
        if (write(ex[1], &e, sizeof e) < 0) { /* parent sees EOF and reports status 127 */
        }
        _exit(127);
    }
    setpgid(pid, pid);
    close(out[1]);
    close(err[1]);
    close(ex[1]);
    r->pid = r->pgid = pid;
    r->s[0] = (stream){.fd = out[0], .out = j->cfg->out_fd ? j->cfg->out_fd : 1, .buf = r->s[0].buf};
    r->s[1] = (stream){.fd = err[0], .out = j->cfg->err_fd ? j->cfg->err_fd : 2, .buf = r->s[1].buf};
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    j->live++;
    j->open_fds += 2;
    int e = 0;
    ssize_t got;
    do got = read(ex[0], &e, sizeof e);
    while (got < 0 && errno == EINTR);
    close(ex[0]);
    if (got == (ssize_t)sizeof e)
        return dt_error(e == ENOENT ? DT_ENOENT : DT_EIO, "cannot run '%s' (rank %d): %s", argv[0], rk, strerror(e));
    return DT_OK;
}
