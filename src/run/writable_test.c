/* The write probe of a run's outputs (run/writable.h): it succeeds in a directory that takes a
 * file and leaves nothing there; it reports the errno of a missing directory, of one that takes no
 * file (/proc, even for root) and of a name too long; a path's directory is the text before its
 * last '/'. dt_trainer_create refuses an output it cannot write with the probe's directory. */
#include "core/test.h"
#include "dtrain/train.h"
#include "run/writable.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void test_probe(const char *tmp) {
    CHECK(dt_dir_probe_write(tmp) == 0);
    CHECK_MSG(entries(tmp) == 0, "the probe left %d file(s) in %s", entries(tmp), tmp);
    char p[256], dir[256];
    snprintf(p, sizeof p, "%s/no/such", tmp);
    CHECK(dt_dir_probe_write(p) == ENOENT);
    CHECK(dt_dir_probe_write("/proc") != 0);
    char *longname = malloc(PATH_MAX + 8);
    memset(longname, 'a', PATH_MAX + 7);
    longname[PATH_MAX + 7] = '\0';
    CHECK(dt_dir_probe_write(longname) == ENAMETOOLONG);
    free(longname);
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    CHECK(dt_path_probe_write(p, dir, sizeof dir) == 0 && !strcmp(dir, tmp));
    snprintf(p, sizeof p, "%s/no/w.st", tmp);
    CHECK(dt_path_probe_write(p, dir, sizeof dir) == ENOENT && !strcmp(dir + strlen(tmp), "/no"));
    CHECK(dt_path_probe_write("/proc/x.st", dir, sizeof dir) != 0 && !strcmp(dir, "/proc"));
    CHECK(dt_path_probe_write("/x.st", dir, sizeof dir) >= 0 && !strcmp(dir, "/"));
    char cwd[PATH_MAX];
    CHECK(getcwd(cwd, sizeof cwd) && chdir(tmp) == 0);
    CHECK(dt_path_probe_write("bare.st", dir, sizeof dir) == 0 && !strcmp(dir, "."));
    CHECK(chdir(cwd) == 0);
    CHECK(entries(tmp) == 0);
}

static void test_trainer(const char *tmp) {
    dt_train_config c = dt_train_defaults();
    char p[256];
    snprintf(p, sizeof p, "%s/no/model.st", tmp);
    c.save = p;
    dt_trainer *t = NULL;
    dt_status s = dt_trainer_create(&t, &c);
    CHECK_MSG(s == DT_EIO && t == NULL, "--save into a missing directory: %s", dt_status_str(s));
    CHECK_MSG(strstr(dt_last_error(), "--save ") && strstr(dt_last_error(), "cannot write into directory") &&
              strstr(dt_last_error(), "/no:"), "%s", dt_last_error());
    c.save = NULL;
    c.metrics = "/proc/m.jsonl";  /* exists, takes no file (root included) */
    s = dt_trainer_create(&t, &c);
    CHECK_MSG(s == DT_EIO && strstr(dt_last_error(), "--metrics /proc/m.jsonl: cannot write into directory /proc:"),
              "%s: %s", dt_status_str(s), dt_last_error());
}

int main(void) {
    char tmp[] = "/tmp/dtrain-writable-XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    test_probe(tmp);
    test_trainer(tmp);
    rmdir(tmp);
    return dt_test_summary("writable_test");
}
