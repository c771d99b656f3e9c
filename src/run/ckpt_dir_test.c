/* Checkpoint-directory hygiene: the temp files of writers that died (a whole checkpoint's, and a
 * ZeRO rank's shard "ckpt-N.safetensors.rR-of-K.tmp.<pid>", issue 37) are removed by a prune and
 * by the --save path's clean-up, while those of live writers and unrelated files stay. */
#include "core/test.h"
#include "run/ckpt_dir.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[64];

static void touch(const char *name, long pid) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    if (pid) snprintf(p + strlen(p), sizeof p - strlen(p), ".tmp.%ld", pid);
    FILE *f = fopen(p, "w");
    if (f) fputs("x", f), fclose(f);
}

static bool here(const char *name, long pid) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    if (pid) snprintf(p + strlen(p), sizeof p - strlen(p), ".tmp.%ld", pid);
    return access(p, F_OK) == 0;
}

/* The pid of a process that has exited (and been reaped): a killed writer's. */
static long dead_pid(void) {
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return (long)p;
}

int main(void) {
    if (dt_test_mkdtemp(g_dir, sizeof g_dir, "/tmp/dt_ckdir_test.XXXXXX") != 0) return 2;
    const long dead = dead_pid(), live = (long)getpid();
    const char *c4 = "ckpt-0000000004.safetensors", *c8 = "ckpt-0000000008.safetensors";
    touch(c4, 0), touch("ckpt-0000000004.safetensors.r0-of-2", 0), touch("ckpt-0000000004.safetensors.r1-of-2", 0);
    touch(c8, 0);
    touch("ckpt-0000000008.safetensors.r1-of-2", dead); /* a rank killed writing its shard */
    touch("ckpt-0000000008.safetensors.r0-of-2", live); /* a rank writing its shard now */
    touch("ckpt-0000000012.safetensors", dead);         /* a whole checkpoint's */
    touch("ckpt-0000000004.safetensors.r0-of-2", dead); /* beside an old checkpoint that is pruned */
    touch("notes.r1-of-2", dead);                       /* not a checkpoint's */
    CHECK_OK(dt_ckpt_dir_prune(g_dir, 0));
    CHECK_MSG(!here("ckpt-0000000008.safetensors.r1-of-2", dead), "a dead rank's shard temp file survived the prune");
    CHECK_MSG(!here("ckpt-0000000012.safetensors", dead), "a dead writer's temp file survived the prune");
    CHECK_MSG(here("ckpt-0000000008.safetensors.r0-of-2", live), "a live rank's shard temp file was removed");
    CHECK(here("notes.r1-of-2", dead) && here(c4, 0) && here(c8, 0));
    CHECK(here("ckpt-0000000004.safetensors.r1-of-2", 0));
    /* --keep 1: the old checkpoint goes with its shards and its shards' dead temp files */
    CHECK_OK(dt_ckpt_dir_prune(g_dir, 1));
    CHECK(!here(c4, 0) && !here("ckpt-0000000004.safetensors.r1-of-2", 0));
    CHECK_MSG(!here("ckpt-0000000004.safetensors.r0-of-2", dead), "a pruned checkpoint's shard temp file survived");
    CHECK(here(c8, 0) && here("ckpt-0000000008.safetensors.r0-of-2", live));
    /* a --save path: its own and its shards' temp files of dead writers, not another file's */
    touch("run.st", dead), touch("run.st.r1-of-4", dead), touch("run.st.r1-of-4", live), touch("run.stx", dead);
    char save[128];
    snprintf(save, sizeof save, "%s/run.st", g_dir);
    dt_ckpt_remove_stale_temps(save);
    CHECK(!here("run.st", dead) && !here("run.st.r1-of-4", dead));
    CHECK(here("run.st.r1-of-4", live) && here("run.stx", dead));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    return dt_test_summary("ckpt_dir_test");
}
