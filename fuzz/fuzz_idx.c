/* libFuzzer target: IDX files, raw or gzip'd (the reader gunzips input that starts with 1f 8b:
 * members, trailers, trailing garbage), header dims and sizes, every element type. */
#include "fuzz/fuzz_common.h"
#include "dtrain/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = dt_fuzz_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    dt_idx x;
    if (dt_idx_read(path, &x) == DT_OK) dt_idx_free(&x);
    close(fd);
    return 0;
}
