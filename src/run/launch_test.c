/* Unit test of the launcher library (dt_launch_run): relayed output into a file, the rank
 * environment plus extra_env, the result of a failing rank and the notify message, a program
 * that cannot start, job ids and shm cleanup. The CLI side is tested by tests/launch.sh. */
#include "core/test.h"
#include "run/launch.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

static char g_msg[512], g_first_msg[512]; /* the last and the first message since g_nmsg = 0 */
static int g_nmsg;
static void on_msg(void *ctx, const char *m) {
    (void)ctx;
    snprintf(g_msg, sizeof g_msg, "%s", m);
    if (g_nmsg++ == 0) snprintf(g_first_msg, sizeof g_first_msg, "%s", m);
}

static size_t slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
    return n;
}

int main(void) {
    alarm(120); /* a supervisor that waits forever (it did, for a stopped ps server) fails here */
    char out_path[] = "/tmp/dt_launch_test_XXXXXX";
    int fd = mkstemp(out_path);
    CHECK(fd >= 0);
    if (fd < 0) return dt_test_summary("launch_test");

    /* 1. two ranks, output relayed with prefixes into out_fd/err_fd, extra_env visible */
    const char *extra[] = {"DT_LAUNCH_TEST_X=hello", NULL};
    dt_launch_config cfg = {
        .nranks = 2, .out_fd = fd, .err_fd = fd, .extra_env = extra, .job_id = "unit_test_1", .notify = on_msg};
    char *argv[] = {"sh", "-c",
                    "printf 'a%s %s %s %s\\n' $DTRAIN_RANK $DTRAIN_WORLD_SIZE $DT_LAUNCH_TEST_X "
                    "$DTRAIN_JOB_ID; printf 'part'",
                    NULL};
    dt_launch_result res;
    CHECK_OK(dt_launch_run(&cfg, argv, &res));
    CHECK(res.exit_code == 0 && res.failed_rank == -1);
    CHECK(!strcmp(res.job_id, "unit_test_1"));
    char buf[4096];
    slurp(out_path, buf, sizeof buf);
    CHECK_MSG(strstr(buf, "[0] a0 2 hello unit_test_1\n") != NULL, "%s", buf);
    CHECK_MSG(strstr(buf, "[1] a1 2 hello unit_test_1\n") != NULL, "%s", buf);
    CHECK_MSG(strstr(buf, "[0] part\n") && strstr(buf, "[1] part\n"), "%s", buf);
    CHECK(g_nmsg == 0);

    /* 1b. a progress bar redrawn with '\r' is relayed piece by piece, with no newlines added */
    CHECK(ftruncate(fd, 0) == 0);
    lseek(fd, 0, SEEK_SET);
    dt_launch_config one = cfg;
    one.nranks = 1;
    char *argv_bar[] = {"sh", "-c", "printf 'x\\rbar1\\rbar2\\n'", NULL};
    CHECK_OK(dt_launch_run(&one, argv_bar, &res));
    slurp(out_path, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "[0] x[0] \rbar1[0] \rbar2\n"), "'%s'", buf);

    /* 1b'. a bar on stderr, then a line on stdout (a sleep orders them): the bar's line is cleared
     * before the line, not glued to it; a last piece that only clears gets no newline */
    CHECK(ftruncate(fd, 0) == 0);
    lseek(fd, 0, SEEK_SET);
    char *argv_glued[] = {"sh", "-c",
                          "printf '\\r\\033[Kbar 5/9' >&2; sleep 0.3; echo epoch 1; sleep 0.3; "
                          "printf '\\r\\033[Kbar 9/9\\r\\033[K' >&2",
                          NULL};
    CHECK_OK(dt_launch_run(&one, argv_glued, &res));
    slurp(out_path, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "[0] \r\033[Kbar 5/9\r\033[K[0] epoch 1\n[0] \r\033[Kbar 9/9[0] \r\033[K"), "'%s'", buf);

    /* 1c. a set-up error every rank meets is relayed once with its hint, and counted once the
     * job is over; an error of one rank's own is relayed as it is */
    CHECK(ftruncate(fd, 0) == 0);
    lseek(fd, 0, SEEK_SET);
    g_nmsg = 0;
    dt_launch_config three = cfg;
    three.nranks = 3;
    char *argv_err[] = {"sh", "-c",
                        "if [ $DTRAIN_RANK = 2 ]; then echo 'dtrain: error: rank 2: its own' >&2; exit 0; fi; "
                        "printf 'dtrain: error: the same\\nHINT: do this\\nother\\n' >&2",
                        NULL};
    CHECK_OK(dt_launch_run(&three, argv_err, &res));
    slurp(out_path, buf, sizeof buf);
    const char *first = strstr(buf, "] dtrain: error: the same\n");
    CHECK_MSG(first && !strstr(first + 1, "] dtrain: error: the same"), "'%s'", buf);
    const char *h = strstr(buf, "] HINT: do this\n");
    CHECK_MSG(h && !strstr(h + 1, "] HINT: do this"), "'%s'", buf);
    CHECK_MSG(strstr(buf, "[0] other\n") && strstr(buf, "[1] other\n"), "'%s'",
              buf); /* only the error's own hint hides */
    CHECK_MSG(strstr(buf, "[2] dtrain: error: rank 2: its own\n"), "'%s'", buf);
    CHECK_MSG(g_nmsg == 1 && strstr(g_msg, "1 other rank printed the same error (shown once, from rank "), "%d '%s'",
              g_nmsg, g_msg);

    /* 2. rank 1 fails: DT_EPEER, its status, others stopped, one notify line */
    CHECK(ftruncate(fd, 0) == 0);
    lseek(fd, 0, SEEK_SET);
    cfg.job_id = NULL;
    cfg.no_prefix = true;
    g_nmsg = 0;
    char *argv2[] = {"sh", "-c", "if [ $DTRAIN_RANK = 1 ]; then echo bye; exit 7; fi; exec sleep 20", NULL};
    double t0 = dt_now();
    dt_status s = dt_launch_run(&cfg, argv2, &res);
    CHECK(s == DT_EPEER);
    CHECK(res.exit_code == 7 && res.failed_rank == 1);
    CHECK_MSG(strstr(dt_last_error(), "rank 1 exited with status 7") != NULL, "%s", dt_last_error());
    CHECK(g_nmsg == 1);
    CHECK_MSG(!strcmp(g_msg, "rank 1 exited with status 7; stopping 1 other rank"), "'%s'", g_msg);
    CHECK(dt_now() - t0 < 15.0); /* the others sleep 20 s: they were stopped */
    CHECK(strlen(res.job_id) == 16);
    slurp(out_path, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "bye\n"), "'%s'", buf);

    /* 2b. rank 1 stops because rank 0 failed (exit DT_EXIT_PEER) just before rank 0 is killed:
     * the launcher waits for and blames rank 0, the real culprit */
    g_nmsg = 0;
    char *argv_peer[] = {"sh", "-c",
                         "if [ $DTRAIN_RANK = 1 ]; then sleep 0.2; exit 75; fi; "
                         "if [ $DTRAIN_RANK = 0 ]; then sleep 0.35; kill -9 $$; fi; exec sleep 20",
                         NULL};
    dt_launch_config pc = cfg;
    pc.nranks = 3;
    t0 = dt_now();
    s = dt_launch_run(&pc, argv_peer, &res);
    CHECK(s == DT_EPEER);
    CHECK_MSG(res.failed_rank == 0 && res.exit_code == 137, "failed_rank %d exit %d", res.failed_rank, res.exit_code);
    CHECK_MSG(strstr(g_msg, "rank 0 was killed by signal 9") != NULL, "'%s'", g_msg);
    CHECK(dt_now() - t0 < 15.0); /* the others sleep 20 s: they were stopped */
    /* ... and is blamed itself only when no other rank fails within the wait */
    g_nmsg = 0;
    char *argv_peer2[] = {"sh", "-c", "if [ $DTRAIN_RANK = 1 ]; then sleep 0.1; exit 75; fi; exec sleep 20", NULL};
    t0 = dt_now();
    s = dt_launch_run(&pc, argv_peer2, &res);
    double waited = dt_now() - t0;
    CHECK(s == DT_EPEER && res.failed_rank == 1 && res.exit_code == DT_EXIT_PEER);
    CHECK_MSG(!strcmp(g_msg, "rank 1 exited with status 75 (it gave up on another rank; see its message); stopping 2 "
                             "other ranks"),
              "'%s'", g_msg);
    CHECK_MSG(waited > 0.55 && waited < 15.0, "%.2f s", waited);
    /* ... and when another rank is stopped (kill -STOP: it takes part in nothing), that one is the
     * culprit: rank 1 gave up waiting for it */
    g_nmsg = 0;
    char *argv_stop[] = {"sh", "-c",
                         "if [ $DTRAIN_RANK = 2 ]; then kill -STOP $$; fi; "
                         "if [ $DTRAIN_RANK = 1 ]; then sleep 0.3; exit 75; fi; exec sleep 20",
                         NULL};
    pc.grace_s = 0.2; /* the stopped rank ends by SIGKILL */
    s = dt_launch_run(&pc, argv_stop, &res);
    pc.grace_s = cfg.grace_s;
    CHECK_MSG(s == DT_EPEER && res.failed_rank == 2 && res.exit_code == DT_EXIT_PEER, "failed_rank %d exit %d",
              res.failed_rank, res.exit_code);
    CHECK_MSG(strstr(g_first_msg, "rank 2 is stopped (SIGSTOP) and took no part: rank 1 gave up waiting for it"),
              "'%s'", g_first_msg);

    /* 2c. expendable ranks (ps workers) that give up on a stopped rank (their server) are not
     * "lost": the stopped one is the culprit and the job ends (it waited for it forever) */
    g_nmsg = 0;
    const bool exp3[3] = {false, true, true};
    dt_launch_config ec = pc;
    ec.expendable = exp3;
    ec.grace_s = 0.2;
    char *argv_srv[] = {"sh", "-c", "if [ $DTRAIN_RANK = 0 ]; then kill -STOP $$; fi; sleep 0.3; exit 75", NULL};
    s = dt_launch_run(&ec, argv_srv, &res);
    CHECK_MSG(s == DT_EPEER && res.failed_rank == 0 && res.lost == 0, "failed_rank %d lost %d: %s", res.failed_rank,
              res.lost, dt_last_error());
    CHECK_MSG(strstr(g_first_msg, "rank 0 is stopped (SIGSTOP)"), "'%s'", g_first_msg);

    /* 2d. a stopped rank that nobody waits for (the others finished): an expendable one is
     * dropped and the job succeeds; any other is the failure. The launcher waited forever. */
    g_nmsg = 0;
    char *argv_left[] = {"sh", "-c", "if [ $DTRAIN_RANK = 1 ]; then kill -STOP $$; fi; sleep 0.2; exit 0", NULL};
    s = dt_launch_run(&ec, argv_left, &res);
    CHECK_MSG(s == DT_OK && res.lost == 1 && res.exit_code == 0, "%s: lost %d exit %d (%s)", dt_status_str(s), res.lost,
              res.exit_code, dt_last_error());
    CHECK_MSG(strstr(g_first_msg, "rank 1 is stopped (SIGSTOP) and every other rank has finished"), "'%s'",
              g_first_msg);
    g_nmsg = 0;
    dt_launch_config two = cfg;
    two.nranks = 2;
    two.grace_s = 0.2;
    s = dt_launch_run(&two, argv_left, &res);
    CHECK_MSG(s == DT_EPEER && res.failed_rank == 1 && res.exit_code == 128 + SIGSTOP, "%s: failed %d exit %d",
              dt_status_str(s), res.failed_rank, res.exit_code);

    /* 3. a program that does not exist */
    char *argv3[] = {"/nonexistent/dt-prog", NULL};
    s = dt_launch_run(&cfg, argv3, &res);
    CHECK(s == DT_ENOENT && res.exit_code == 127);
    CHECK_MSG(strstr(dt_last_error(), "/nonexistent/dt-prog") != NULL, "%s", dt_last_error());

    /* 4. bad arguments */
    dt_launch_config bad = {.nranks = 0};
    CHECK(dt_launch_run(&bad, argv, &res) == DT_EINVAL);
    bad.nranks = 1;
    bad.job_id = "has-dash";
    CHECK(dt_launch_run(&bad, argv, &res) == DT_EINVAL);

    /* 5. job ids are unique; shm cleanup removes only the job's entries */
    char a[DT_JOB_ID_MAX], b[DT_JOB_ID_MAX];
    dt_launch_job_id(a, sizeof a);
    dt_launch_job_id(b, sizeof b);
    CHECK(strlen(a) == 16 && strcmp(a, b) != 0);
    char p1[256], p2[256], p3[256], p4[256];
    snprintf(p1, sizeof p1, "/dev/shm/dtrain-%s", a);
    snprintf(p2, sizeof p2, "/dev/shm/dtrain-%s-x", a); /* no one creates this: kept */
    snprintf(p3, sizeof p3, "/dev/shm/dtrain-%sz", a);
    snprintf(p4, sizeof p4, "/dev/shm/dtrain-%s.7.1", a);
    int removed = -1;
    if (access("/dev/shm", W_OK) == 0) {
        close(open(p1, O_CREAT | O_WRONLY, 0600));
        close(open(p2, O_CREAT | O_WRONLY, 0600));
        close(open(p3, O_CREAT | O_WRONLY, 0600));
        close(open(p4, O_CREAT | O_WRONLY, 0600));
        CHECK_OK(dt_launch_cleanup_shm(a, &removed));
        CHECK(removed == 2);
        CHECK(access(p1, F_OK) != 0 && access(p4, F_OK) != 0 && access(p2, F_OK) == 0 && access(p3, F_OK) == 0);
        unlink(p2);
        unlink(p3);
        /* job id "data" must not touch the data-set cache (src/data/cache.c: dtrain-data-<key>.v1) */
        char cache[256];
        snprintf(cache, sizeof cache, "/dev/shm/dtrain-data-%s.v1", a);
        close(open(cache, O_CREAT | O_WRONLY, 0600));
        CHECK_OK(dt_launch_cleanup_shm("data", &removed));
        CHECK(access(cache, F_OK) == 0);
        unlink(cache);
    }
    CHECK(dt_launch_cleanup_shm("../etc", &removed) == DT_EINVAL);
    CHECK(dt_launch_cleanup_shm("data-x", &removed) == DT_EINVAL);
    CHECK_OK(dt_launch_cleanup_shm("a.b", &removed));

    close(fd);
    unlink(out_path);
    return dt_test_summary("launch_test");
}
