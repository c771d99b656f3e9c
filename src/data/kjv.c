/* The reference corpus "kjv": the King James Bible as one text file. It is taken from
 * $DTRAIN_DATASETS/kjv.txt when present; otherwise Debian's bible-kjv generates it
 * (`bible -f Gen1:1-Rev22:21`, ~4.4 MB, 0.15 s) once into the data cache directory, written
 * atomically (temp file, fsync, rename) so that workers starting together each either find the
 * finished file or publish an identical one. Without a usable cache directory the text is
 * generated into an anonymous memory file on every open. See data.h. */
#include "data/data_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KJV_RANGE "Gen1:1-Rev22:21"
#define KJV_DATA "/usr/lib/bible.data" /* bible-kjv-text's data: a newer one rebuilds the cache */
#define KJV_STALE_TMP_S 600            /* temp files older than this were left by a dead writer */

extern char **environ;

/* Finds an executable `name` on $PATH into out. */
static bool find_program(const char *name, char *out, size_t cap) {
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    for (const char *p = path;; p++) {
        const char *e = strchr(p, ':');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int k = snprintf(out, cap, "%.*s/%s", (int)len, len ? p : ".", name);
        struct stat st;
        if (k > 0 && (size_t)k < cap && stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
            return true;
        if (!e) return false;
        p = e;
    }
}

/* Runs `bible -f Gen1:1-Rev22:21` with its output into fd; DT_EIO when it fails or prints
 * nothing. */
static dt_status run_bible(const char *prog, int fd, const char *where) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 1);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    char *argv[] = {(char *)"bible", (char *)"-f", (char *)KJV_RANGE, NULL};
    /* the trainer's threads block SIGTERM/SIGINT (they are taken on a thread of their own); the
     * child must not inherit that, or a stop would not end it */
    posix_spawnattr_t at;
    sigset_t none, stop;
    sigemptyset(&none);
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &stop);
    pid_t pid;
    int rc = posix_spawn(&pid, prog, &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0)
        return dt_error(DT_EIO, "`data` kjv: cannot run %s (%s): reinstall bible-kjv (scripts/install-deps)", prog,
                        strerror(rc));
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        if (errno != EINTR) return dt_error(DT_EIO, "`data` kjv: waiting for %s: %s", prog, strerror(errno));
    struct stat st;
    if (WIFSIGNALED(ws) && (WTERMSIG(ws) == SIGTERM || WTERMSIG(ws) == SIGINT || WTERMSIG(ws) == SIGHUP))
        return dt_error(DT_EIO,
                        "`data` kjv: `%s -f " KJV_RANGE "` was stopped by signal %d (%s) before it finished "
                        "writing %s; nothing is wrong with it: run again",
                        prog, WTERMSIG(ws), strsignal(WTERMSIG(ws)), where);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        return dt_error(DT_EIO,
                        "`data` kjv: `%s -f " KJV_RANGE "` failed (%s %d) writing %s: check that bible-kjv and "
                        "bible-kjv-text are installed (scripts/install-deps)",
                        prog, WIFEXITED(ws) ? "exit status" : "signal", WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws),
                        where);
    if (fstat(fd, &st) != 0 || st.st_size == 0)
        return dt_error(DT_EIO,
                        "`data` kjv: `%s -f " KJV_RANGE
                        "` printed nothing into %s: check that bible-kjv-text is installed "
                        "(scripts/install-deps)",
                        prog, where);
    return DT_OK;
}

/* The cached file is ours, a plain file, not empty and newer than the installed bible. */
static bool cache_valid(int fd, const char *prog) {
    struct stat st, src;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_size == 0) return false;
    const char *deps[2] = {prog, KJV_DATA};
    for (int i = 0; i < 2; i++) /* ctime: a package install sets it, whatever mtime it ships */
        if (stat(deps[i], &src) == 0 &&
            (src.st_ctim.tv_sec > st.st_mtim.tv_sec ||
             (src.st_ctim.tv_sec == st.st_mtim.tv_sec && src.st_ctim.tv_nsec > st.st_mtim.tv_nsec)))
            return false;
    return true;
}

/* Removes temp files of dead writers (name.tmp.*, older than KJV_STALE_TMP_S). */
static void remove_stale(const char *dir, const char *name) {
    DIR *d = opendir(dir);
    if (!d) return;
    char pre[300], path[PATH_MAX];
    int np = snprintf(pre, sizeof pre, "%s.tmp.", name);
    struct dirent *e;
    struct stat st;
    time_t now = time(NULL);
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, pre, (size_t)np) &&
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path && lstat(path, &st) == 0 &&
            S_ISREG(st.st_mode) && st.st_uid == geteuid() && now - st.st_mtime > KJV_STALE_TMP_S)
            unlink(path);
    closedir(d);
}

/* Generates the cache file dir/name. DT_OK with *fd >= 0 on success, DT_OK with *fd = -1 when
 * the cache cannot take it (logged), an error when bible itself fails. */
static dt_status build_cache(int *fd, const char *prog, const char *dir, const char *name, const char *file) {
    *fd = -1;
    remove_stale(dir, name);
    char tmp[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", file);
    int t = mkostemp(tmp, O_CLOEXEC); /* mode 0600 */
    if (t < 0) {
        dt_log(DT_LOG_INFO, "data cache: cannot create %s (%s): generating the KJV text in memory", tmp,
               strerror(errno));
        return DT_OK;
    }
    dt_status st = run_bible(prog, t, tmp);
    if (st != DT_OK) {
        close(t);
        unlink(tmp);
        return st;
    }
    if (fsync(t) != 0 || rename(tmp, file) != 0) {
        dt_log(DT_LOG_INFO, "data cache: cannot publish %s (%s): generating the KJV text in memory", file,
               strerror(errno));
        close(t);
        unlink(tmp);
        return DT_OK;
    }
    *fd = t;
    return DT_OK;
}

dt_status dt_kjv_open(int *fd, char *path, size_t path_cap, char *cache, size_t cache_cap) {
    *fd = -1;
    cache[0] = '\0';
    const char *root = getenv("DTRAIN_DATASETS");
    snprintf(path, path_cap, "%s/kjv.txt", root && *root ? root : "/usr/share/datasets");
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f >= 0) return *fd = f, DT_OK;
    if (errno != ENOENT)
        return dt_error(DT_EIO, "`data` kjv: cannot open %s (%s): check its permissions", path, strerror(errno));
    char prog[PATH_MAX];
    if (!find_program("bible", prog, sizeof prog))
        return dt_error(
            DT_ENOENT,
            "`data` kjv: the King James text is not installed (no %s, and no `bible` program on PATH): install "
            "bible-kjv (scripts/install-deps), or put the text at %s",
            path, path);
    char dir[PATH_MAX - 64], name[64], file[PATH_MAX];
    if (dt_cache_dir(dir, sizeof dir)) {
        snprintf(name, sizeof name, "dtrain-kjv-%u.txt", (unsigned)geteuid());
        snprintf(file, sizeof file, "%s/%s", dir, name);
        f = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (f >= 0 && !cache_valid(f, prog)) close(f), f = -1;
        if (f < 0) DT_TRY(build_cache(&f, prog, dir, name, file));
        if (f >= 0) {
            snprintf(path, path_cap, "%s", file);
            snprintf(cache, cache_cap, "%s", file);
            return *fd = f, DT_OK;
        }
    }
    /* no cache: generate into private memory */
    if ((f = memfd_create("dtrain-kjv", MFD_CLOEXEC)) < 0)
        return dt_error(DT_EIO,
                        "`data` kjv: cannot create a memory file (%s): set DTRAIN_DATA_CACHE to a writable directory",
                        strerror(errno));
    dt_status st = run_bible(prog, f, "memory");
    if (st != DT_OK) {
        close(f);
        return st;
    }
    snprintf(path, path_cap, "kjv (`bible -f " KJV_RANGE "`, in memory)");
    return *fd = f, DT_OK;
}
