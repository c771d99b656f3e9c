/* libFuzzer target: CSV data sets, raw or gzip'd: quoting, headers, ragged rows, numbers,
 * labels (a label of INT32_MAX once overflowed). */
#include "fuzz/fuzz_common.h"
#include "dtrain/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = dt_fuzz_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    dt_dataset *ds = NULL;
    if (dt_dataset_open_csv(&ds, path, NULL) == DT_OK) {
        uint32_t i = 0;
        int C, H, W;
        dt_dataset_shape(ds, &C, &H, &W);
        float x[4096];
        if ((size_t)C * H * W <= 4096 && dt_dataset_len(ds) > 0) (void)dt_dataset_batch(ds, &i, 1, x, NULL);
        dt_dataset_destroy(ds);
    }
    close(fd);
    return 0;
}
