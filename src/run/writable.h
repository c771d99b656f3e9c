/* Whether a run can write its outputs where it was told to: a probe that makes and removes an
 * empty file, shared by the trainer's config check and `dtrain train`'s check before launch. */
#ifndef DT_RUN_WRITABLE_H
#define DT_RUN_WRITABLE_H

#include <stddef.h>

/* Makes and removes an empty file "dir/.dtrain-probe-XXXXXX" (mkstemp): 0 when this process can
 * create files in the existing directory dir, else the errno of the failure (ENAMETOOLONG when
 * the probe's name does not fit PATH_MAX). Leaves nothing behind. */
int dt_dir_probe_write(const char *dir);

/* The same probe for a file to be created at path: its directory (dt_path_dir: the text before
 * the last '/', "/" for a file in the root, "." for a bare name) into dir (cap bytes), then
 * dt_dir_probe_write of it. 0 or the errno of the failure (ENAMETOOLONG when dir did not fit). */
int dt_path_probe_write(const char *path, char *dir, size_t cap);

#endif
