/* The write probe of a run's outputs (run/writable.h): it succeeds in a directory that takes a
 * file and leaves nothing there; it reports the errno of a missing directory, of one that takes no
 * file (/proc, even for root) and of a name too long; a path's directory is the text before its
 * last '/'. dt_trainer_create refuses an output it cannot write with the probe's directory.
 * dt_output_path names the file a rename must replace: the path, or where its links lead (relative
 * ones from their own directory, dangling ones too); devices, descriptors and link loops are
 * refused naming the flag. */
#include "core/test.h"
#include "dtrain/train.h"
#include "run/writable.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    CHECK_MSG(s == DT_EIO && t == NULL, "`save` into a missing directory: %s", dt_status_str(s));
    CHECK_MSG(strstr(dt_last_error(), "`save` ") && strstr(dt_last_error(), "cannot write into directory") &&
                  strstr(dt_last_error(), "/no:"),
              "%s", dt_last_error());
    c.save = NULL;
    c.metrics = "/proc/m.jsonl"; /* exists, takes no file (root included) */
    s = dt_trainer_create(&t, &c);
    CHECK_MSG(s == DT_EIO && strstr(dt_last_error(), "`metrics` /proc/m.jsonl: cannot write into directory /proc:"),
              "%s: %s", dt_status_str(s), dt_last_error());
}

static void test_output_path(const char *tmp) {
    char p[PATH_MAX], q[PATH_MAX], out[PATH_MAX], want[PATH_MAX];
    snprintf(p, sizeof p, "%s/plain.st", tmp); /* missing, then a regular file: itself */
    CHECK(dt_output_path("`save`", p, out, sizeof out) == DT_OK && !strcmp(out, p));
    FILE *f = fopen(p, "w");
    CHECK(f && fclose(f) == 0);
    CHECK(dt_output_path("`save`", p, out, sizeof out) == DT_OK && !strcmp(out, p));
    CHECK(mkdir(strcat(strcpy(q, tmp), "/sub"), 0755) == 0); /* sub/l1 -> ../l2 -> plain.st */
    snprintf(q, sizeof q, "%s/l2", tmp);
    CHECK(symlink("plain.st", q) == 0);
    snprintf(q, sizeof q, "%s/sub/l1", tmp);
    CHECK(symlink("../l2", q) == 0);
    CHECK(dt_output_path("`save`", q, out, sizeof out) == DT_OK);
    snprintf(want, sizeof want, "%s/sub/../plain.st", tmp);
    CHECK_MSG(!strcmp(out, want) || !strcmp(out, p), "a chain of relative links: %s", out);
    snprintf(q, sizeof q, "%s/dangling", tmp); /* -> new.st, not there yet: the file to create */
    CHECK(symlink("new.st", q) == 0);
    snprintf(want, sizeof want, "%s/new.st", tmp);
    CHECK_MSG(dt_output_path("-o", q, out, sizeof out) == DT_OK && !strcmp(out, want), "a dangling link: %s", out);
    snprintf(q, sizeof q, "%s/loop", tmp);
    CHECK(symlink("loop", q) == 0);
    CHECK(dt_output_path("-o", q, out, sizeof out) == DT_EINVAL && strstr(dt_last_error(), "too many levels"));
    const char *refused[] = {"/dev/null", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/2", tmp};
    for (int i = 0; i < 5; i++)
        CHECK_MSG(dt_output_path("`timeline`", refused[i], out, sizeof out) == DT_EINVAL &&
                      strstr(dt_last_error(), "`timeline` ") && strstr(dt_last_error(), "not a regular file"),
                  "%s: %s", refused[i], dt_last_error());
    CHECK(dt_output_path("", p, out, 4) == DT_EINVAL && strstr(dt_last_error(), "too long"));
    CHECK(dt_path_descriptor("/dev/stdout") == 1 && dt_path_descriptor("/dev/stderr") == 2);
    CHECK(dt_path_descriptor("/dev/fd/7") == 7 && dt_path_descriptor("/proc/self/fd/3") == 3);
    CHECK(dt_path_descriptor("/dev/fd/") == -1 && dt_path_descriptor("/dev/fd/1x") == -1 &&
          dt_path_descriptor(p) == -1);
    const char *made[] = {"sub/l1", "l2", "dangling", "loop", "plain.st"};
    for (int i = 0; i < 5; i++) snprintf(q, sizeof q, "%s/%s", tmp, made[i]), unlink(q);
    snprintf(q, sizeof q, "%s/sub", tmp);
    rmdir(q);
    CHECK(entries(tmp) == 0);
}

int main(void) {
    char tmp[] = "/tmp/dtrain-writable-XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    test_probe(tmp);
    test_trainer(tmp);
    test_output_path(tmp);
    rmdir(tmp);
    return dt_test_summary("writable_test");
}
