/* Elastic supervisor tests with a scripted rank program: a rank that fails once is replaced
 * (same size), a rank slot that fails twice in a row is dropped (down to MIN), set-up failures
 * (exit 78) are not retried, and restarts stop at --max-restarts. The ranks write what they ran
 * as ("rank R of N" lines, run counters) to files the checks read. */
#include "core/test.h"
#include "run/elastic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_log[8192];
static void collect(void *ctx, const char *msg) {
    (void)ctx;
    strncat(g_log, msg, sizeof g_log - strlen(g_log) - 2);
    strcat(g_log, "\n");
}

/* The contents of dir/name ("" when absent), in buf. */
static const char *slurp(const char *dir, const char *name, char *buf, size_t cap) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return buf;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Runs `sh -c SCRIPT` as an elastic job of `workers` ranks; returns the status. */
static dt_status run(const char *script, int workers, int min, int max, int restarts, dt_launch_result *res) {
    char *argv[] = {"sh", "-c", (char *)script, "job", NULL};
    g_log[0] = '\0';
    dt_elastic_config c = {.workers = workers, .min_workers = min, .max_workers = max, .max_restarts = restarts,
                           .argv = argv, .argc = 4, .notify = collect};
    return dt_elastic_run(&c, res);
}

int main(void) {
    char dir[] = "/tmp/dtrain-elastic-XXXXXX", script[512];
    if (!mkdtemp(dir)) return 1;
    dt_launch_result res;

    char seen[1024], runs[16];
    /* rank 1 fails on the first run only: it runs twice (the original, then its replacement), and
     * the replacement finishes in a job of the same size, 2 */
    snprintf(script, sizeof script,
             "n=$(cat %s/a 2>/dev/null || echo 0); [ \"$DTRAIN_RANK\" = 1 ] && echo $((n+1)) > %s/a && "
             "[ $n -eq 0 ] && exit 3; echo \"rank $DTRAIN_RANK of $DTRAIN_WORLD_SIZE\" >> %s/sizes; exit 0",
             dir, dir, dir);
    CHECK_OK(run(script, 2, 1, 2, 3, &res));
    CHECK_MSG(!strcmp(slurp(dir, "a", runs, sizeof runs), "2\n"), "rank 1 ran '%s' times, not 2", runs);
    slurp(dir, "sizes", seen, sizeof seen);
    CHECK_MSG(strstr(seen, "rank 1 of 2\n") && !strstr(seen, "of 1\n"), "ranks finished as: %s", seen);

    /* rank 1 always fails: after two failures in a row its slot is dropped and 1 rank finishes */
    snprintf(script, sizeof script,
             "[ \"$DTRAIN_RANK\" = 1 ] && [ \"$DTRAIN_WORLD_SIZE\" = 2 ] && exit 3; "
             "echo \"rank $DTRAIN_RANK of $DTRAIN_WORLD_SIZE\" >> %s/dropped; exit 0", dir);
    CHECK_OK(run(script, 2, 1, 2, 3, &res));
    slurp(dir, "dropped", seen, sizeof seen);
    CHECK_MSG(strstr(seen, "rank 0 of 1\n") && !strstr(seen, "rank 1 of"), "ranks finished as: %s", seen);
    CHECK_MSG(strstr(g_log, "rank 1 failed twice in a row: continuing without it") != NULL, "log: %s", g_log);

    /* never below MIN: with MIN 2 it gives up after --max-restarts */
    CHECK(run("[ \"$DTRAIN_RANK\" = 1 ] && exit 3; exit 0", 2, 2, 2, 2, &res) != DT_OK);
    CHECK_MSG(strstr(g_log, "giving up after 2 restarts") != NULL && !strstr(g_log, "continuing without"),
              "log: %s", g_log);

    /* a set-up failure (exit 78) is not retried */
    CHECK(run("exit 78", 2, 1, 2, 3, &res) != DT_OK);
    CHECK_MSG(strstr(g_log, "not restarting") != NULL && !strstr(g_log, "restart 1"), "log: %s", g_log);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
    return dt_test_summary("elastic_test");
}
