/* Whether a run can write its outputs where it was told to: a probe that makes and removes an
 * empty file, shared by the trainer's config check and `dtrain train`'s check before launch. */
#ifndef DT_RUN_WRITABLE_H
#define DT_RUN_WRITABLE_H

#include <stddef.h>

#include "dtrain/core.h"

/* Makes and removes an empty file "dir/.dtrain-probe-XXXXXX" (mkstemp): 0 when this process can
 * create files in the existing directory dir, else the errno of the failure (ENAMETOOLONG when
 * the probe's name does not fit PATH_MAX). Leaves nothing behind. */
int dt_dir_probe_write(const char *dir);

/* The same probe for a file to be created at path: its directory (dt_path_dir: the text before
 * the last '/', "/" for a file in the root, "." for a bare name) into dir (cap bytes), then
 * dt_dir_probe_write of it. 0 or the errno of the failure (ENAMETOOLONG when dir did not fit). */
int dt_path_probe_write(const char *path, char *dir, size_t cap);

/* The file an output written to `path` (a temp file beside it, then a rename) must replace, into
 * out (cap bytes): path itself when it does not exist or is a regular file; for a symbolic link,
 * the file it leads to (followed to the end, relative links from their own directory), so the
 * rename replaces that file and keeps the link. DT_EINVAL naming `what` (the flag, e.g. "-o", or
 * "") for an existing path that is not a regular file (a device such as /dev/null, a FIFO, a
 * directory) and for a process's descriptors (/dev/stdout, /dev/fd/N, /proc/.../fd/N: a rename
 * would replace the file behind them, e.g. a shell's redirect): a rename would put a file in its
 * place. DT_EINVAL too for a link loop or a result longer than cap. */
dt_status dt_output_path(const char *what, const char *path, char *out, size_t cap);

/* The descriptor of this process that path names (/dev/stdout 1, /dev/stderr 2, /dev/fd/N and
 * /proc/self/fd/N: N), else -1. A stream written to one goes through that descriptor (fdopen of a
 * dup): opening the path anew would truncate, or write past, the file a shell redirect opened. */
int dt_path_descriptor(const char *path);

#endif
