/* dtrain train: the outputs (--save, --save-weights, --checkpoint-dir) are probed before the run;
 * dtrain predict and export probe their -o FILE the same way. */
#include "cli/train_outputs.h"

#include "cli/cli.h"
#include "run/launch.h"
#include "run/writable.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int dt_cli_check_output_file(const char *flag, const char *path) {
    struct stat st;
    if (!path) return -1;
    if (!*path) return dt_cli_fail("give a file name", "%s '': empty path", flag), DT_EXIT_OUTPUT;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return dt_cli_fail("give a file name, e.g. DIR/model.safetensors", "%s %s: is a directory", flag, path),
               DT_EXIT_OUTPUT;
    char file[PATH_MAX], dir[PATH_MAX]; /* file: path, or where a symbolic link there leads */
    if (dt_output_path(flag, path, file, sizeof file) != DT_OK) return dt_cli_usage(NULL, "%s", dt_last_error());
    int e = dt_path_probe_write(file, dir, sizeof dir);
    if (e == 0) return -1;
    dt_cli_fail("give a path in a directory that exists and that you can write", "%s %s: cannot write into %s (%s)",
                flag, path, dir, strerror(e));
    return DT_EXIT_OUTPUT;
}

static int check_dir(const char *flag, const char *dir) {
    struct stat st;
    if (!dir) return -1;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return dt_cli_fail("give a directory", "--%s %s: is a file, not a directory", flag, dir), DT_EXIT_OUTPUT;
    /* a directory that does not exist yet is made by the run: its parent must take it */
    char parent[PATH_MAX];
    int e;
    if (stat(dir, &st) == 0) {
        snprintf(parent, sizeof parent, "%s", dir);
        e = dt_dir_probe_write(parent);
    } else {
        e = dt_path_probe_write(dir, parent, sizeof parent);
    }
    if (e == 0) return -1;
    dt_cli_fail("give a directory you can write (it is made if its parent exists)",
                "--%s %s: cannot write into %s (%s)", flag, dir, parent, strerror(e));
    return DT_EXIT_OUTPUT;
}

/* A file the run appends to (--metrics): an existing one that is not a regular file (/dev/stdout,
 * a pipe) is written as it is; else its directory must take a new file. */
static int check_appended(const char *flag, const char *path) {
    struct stat st;
    if (!path || (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))) return -1;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return dt_cli_fail("give a file name, e.g. DIR/metrics.jsonl", "%s %s: is a directory", flag, path),
               DT_EXIT_OUTPUT;
    char dir[PATH_MAX];
    int e = dt_path_probe_write(path, dir, sizeof dir);
    if (e == 0) return -1;
    dt_cli_fail("give a path in a directory that exists and that you can write", "%s %s: cannot write into %s (%s)",
                flag, path, dir, strerror(e));
    return DT_EXIT_OUTPUT;
}

int dt_cli_check_outputs(const dt_train_config *c) {
    int r;
    if ((r = dt_cli_check_output_file("--save", c->save)) >= 0) return r;
    if ((r = dt_cli_check_output_file("--save-weights", c->save_weights)) >= 0) return r;
    if ((r = dt_cli_check_output_file("--timeline", c->timeline)) >= 0) return r;
    if ((r = check_appended("--metrics", c->metrics)) >= 0) return r;
    return check_dir("checkpoint-dir", c->checkpoint_dir);
}
