/* Tests for the "kjv" reference corpus as Debian's bible-kjv generates it: size (~4.4 MB) and
 * distinct bytes (73), the cache file written once and reused (atomically, by 4 processes that
 * start together), a damaged (empty) cache file rebuilt, DTRAIN_DATA_CACHE=0 generating into
 * memory with the same bytes, and the validation split. Skips (exit 77) when `bible` is not
 * installed. A bible stopped by SIGTERM is reported as stopped, not as a missing package.
 * Everything lives in a mkdtemp directory, removed at the end. */
#include "core/test.h"
#include "dtrain/data.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum { T = 64 };

static char g_dir[256], g_cache[300];

static bool have_bible(void) {
    const char *path = getenv("PATH");
    char buf[4096], prog[4200];
    snprintf(buf, sizeof buf, "%s", path ? path : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(prog, sizeof prog, "%s/bible", d);
        if (access(prog, X_OK) == 0) return true;
    }
    return false;
}

static int count_entries(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    int k = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, part)) k++;
    if (d) closedir(d);
    return k;
}

/* Reads a whole file; *n its size. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    *n = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    if (b) *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

/* Distinct byte values among all inputs and targets of every window of ds. */
static int distinct_tokens(const dt_dataset *ds) {
    size_t n = dt_dataset_len(ds);
    uint32_t *idx = malloc(n * sizeof *idx);
    int32_t *tok = malloc(n * T * sizeof *tok), *tgt = malloc(n * T * sizeof *tgt);
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    int seen[256] = {0}, k = 0;
    if (dt_dataset_batch_tokens(ds, idx, (int)n, tok, tgt) == DT_OK)
        for (size_t i = 0; i < n * T; i++) seen[tok[i] & 255] = seen[tgt[i] & 255] = 1;
    for (int b = 0; b < 256; b++) k += seen[b];
    free(idx), free(tok), free(tgt);
    return k;
}

int main(void) {
    if (!have_bible()) {
        printf("skip: the `bible` program is not installed (apt-get install bible-kjv, or scripts/install-deps)\n");
        return 77;
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/dtrain-kjv-test-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_dir);
    setenv("DTRAIN_DATASETS", g_dir, 1); /* no kjv.txt there: generate it */
    setenv("DTRAIN_DATA_CACHE", g_cache, 1);

    /* 4 processes that start together: each gets the text, one file remains, no temp file */
    for (int p = 0; p < 4; p++)
        if (fork() == 0) {
            dt_dataset *tr;
            dt_status s = dt_dataset_open_text(&tr, NULL, "kjv", T, 0);
            if (s != DT_OK) fprintf(stderr, "process %d: %s\n", p, dt_last_error());
            _exit(s == DT_OK && dt_dataset_len(tr) > 60000 ? 0 : 1);
        }
    int st, failed = 0;
    while (wait(&st) > 0) failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_MSG(failed == 0, "%d of 4 processes could not open kjv", failed);
    CHECK(count_entries(g_cache, "dtrain-kjv-") == 1 && count_entries(g_cache, ".tmp.") == 0);

    dt_dataset *tr, *va;
    CHECK_OK(dt_dataset_open_text(&tr, &va, "kjv", T, 0.1));
    if (!tr || !va) return dt_test_summary("kjv_test");
    const char *file = dt_dataset_cache_file(tr);
    CHECK(file[0] && !strcmp(file, dt_dataset_source(tr)) && !strncmp(file, g_cache, strlen(g_cache)));
    char path[600];
    snprintf(path, sizeof path, "%s", file);
    size_t len;
    unsigned char *text = slurp(path, &len);
    int seen[256] = {0}, distinct = 0;
    for (size_t i = 0; i < len; i++) seen[text[i]] = 1;
    for (int b = 0; b < 256; b++) distinct += seen[b];
    printf("kjv: %zu bytes, %d distinct (`bible -f Gen1:1-Rev22:21`), %zu train + %zu validation windows of %d+1\n",
           len, distinct, dt_dataset_len(tr), dt_dataset_len(va), T);
    CHECK_MSG(len > 4300000 && len < 4500000, "%zu bytes, expected ~4.4 MB", len);
    CHECK_MSG(distinct == 73, "%d distinct bytes, expected 73", distinct);
    CHECK(len >= 60 && !memcmp(text, "Ge1:1 In the beginning God created the heaven and the earth.", 60));
    size_t vlen = (size_t)(len * 0.1), tlen = len - vlen;
    CHECK(dt_dataset_len(tr) == (tlen - 1) / T && dt_dataset_len(va) == (vlen - 1) / T);
    int dt = distinct_tokens(tr);
    CHECK_MSG(dt >= 70 && dt <= 73, "%d distinct train tokens", dt); /* a rare byte may sit only in the last 10% */
    dt_dataset_destroy(tr);
    dt_dataset_destroy(va);

    /* reused: same inode, not rewritten */
    struct stat a, b;
    CHECK(stat(path, &a) == 0);
    CHECK_OK(dt_dataset_open_text(&tr, NULL, "kjv", T, 0));
    dt_dataset_destroy(tr);
    CHECK(stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
          a.st_mtime == b.st_mtime);

    /* a damaged (empty) cache file is replaced */
    FILE *f = fopen(path, "wb");
    if (f) fclose(f);
    CHECK_OK(dt_dataset_open_text(&tr, NULL, "kjv", T, 0));
    if (tr) CHECK(dt_dataset_len(tr) == (len - 1) / T);
    dt_dataset_destroy(tr);
    CHECK(stat(path, &b) == 0 && (size_t)b.st_size == len);

    /* no cache: generated in memory, the same bytes */
    setenv("DTRAIN_DATA_CACHE", "0", 1);
    CHECK_OK(dt_dataset_open_text(&tr, NULL, "kjv", 1, 0));
    if (tr) {
        CHECK(dt_dataset_len(tr) == len - 1 && !strcmp(dt_dataset_cache_file(tr), "") &&
              strstr(dt_dataset_source(tr), "in memory"));
        uint32_t idx[3] = {0, (uint32_t)(len / 2), (uint32_t)(len - 2)};
        int32_t tok[3], tgt[3];
        CHECK_OK(dt_dataset_batch_tokens(tr, idx, 3, tok, tgt));
        for (int i = 0; i < 3; i++) CHECK(tok[i] == text[idx[i]] && tgt[i] == text[idx[i] + 1]);
    }
    dt_dataset_destroy(tr);
    /* an unusable cache directory (its parent is a file): in memory too */
    char bad[400];
    snprintf(bad, sizeof bad, "%s/plainfile", g_dir);
    FILE *nf = fopen(bad, "w");
    if (nf) fclose(nf);
    snprintf(bad, sizeof bad, "%s/plainfile/cache", g_dir);
    setenv("DTRAIN_DATA_CACHE", bad, 1);
    CHECK_OK(dt_dataset_open_text(&tr, NULL, "kjv", 1, 0));
    if (tr) CHECK(dt_dataset_len(tr) == len - 1 && strstr(dt_dataset_source(tr), "in memory"));
    dt_dataset_destroy(tr);
    free(text);

    /* a bible stopped by a signal (a job stopping this rank) is not blamed on the packages */
    char bin[400], fake[420], newpath[8192];
    snprintf(bin, sizeof bin, "%s/bin", g_dir);
    snprintf(fake, sizeof fake, "%s/bible", bin);
    FILE *fb = mkdir(bin, 0700) == 0 ? fopen(fake, "w") : NULL;
    if (fb) {
        fputs("#!/bin/sh\nkill -TERM $$\n", fb);
        fclose(fb);
        chmod(fake, 0700);
    }
    const char *old_path = getenv("PATH");
    snprintf(newpath, sizeof newpath, "%s:%s", bin, old_path ? old_path : "/usr/bin:/bin");
    setenv("PATH", newpath, 1);
    snprintf(bad, sizeof bad, "%s/cache-stopped", g_dir);
    setenv("DTRAIN_DATA_CACHE", bad, 1);
    CHECK(dt_dataset_open_text(&tr, NULL, "kjv", T, 0) == DT_EIO);
    CHECK_MSG(strstr(dt_last_error(), "was stopped by signal 15") && !strstr(dt_last_error(), "installed"), "%s",
              dt_last_error());
    setenv("PATH", old_path ? old_path : "/usr/bin:/bin", 1);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
    return dt_test_summary("kjv_test");
}
