/* Process-level helpers of sys.c that the library shares internally but does not publish (the
 * public ones, threads, clock and logging, are in dtrain/core.h). */
#ifndef DT_CORE_SYS_H
#define DT_CORE_SYS_H

#include <stddef.h>

/* The directory a file of `path` goes into, written to out (cap bytes, NUL-terminated and
 * truncated like snprintf; out may be NULL when cap is 0, and may not alias path): the text before the last '/', "/"
 * when that slash is the first character, "." when path has none. A trailing slash is not stripped
 * ("a/b/" -> "a/b"), nor are "." and ".." resolved. Returns the length of the whole result (as
 * snprintf: >= cap means it was cut). */
size_t dt_path_dir(char *out, size_t cap, const char *path);

#endif
