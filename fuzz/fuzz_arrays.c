/* libFuzzer target: NumPy .npy files (header dict, versions, dtypes, shapes; the same bytes as
 * features and as labels) and token files (tokens:FILE: raw uint16 or an llm.c shard header),
 * opened and one sample or window of each built. */
#include "fuzz/fuzz_common.h"
#include "dtrain/data.h"

#include <string.h>

/* Builds sample 0 of a feature set when it is small enough. */
static void touch_features(const dt_dataset *ds) {
    int C, H, W;
    dt_dataset_shape(ds, &C, &H, &W);
    float x[4096];
    int32_t y[1];
    uint32_t i = 0;
    if ((size_t)C * H * W <= 4096 && dt_dataset_len(ds) > 0) (void)dt_dataset_batch(ds, &i, 1, x, y);
}

/* Builds the last window of a token set (T <= 64). */
static void touch_tokens(const dt_dataset *ds) {
    int32_t tok[64], tgt[64];
    uint32_t i = (uint32_t)dt_dataset_len(ds) - 1;
    (void)dt_dataset_batch_tokens(ds, &i, 1, tok, tgt);
    (void)dt_dataset_set_classes((dt_dataset *)ds, 300);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], spec[80];
    int fd = dt_fuzz_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    dt_dataset *ds = NULL, *val = NULL;
    if (dt_dataset_open_npy(&ds, path, path) == DT_OK) touch_features(ds);
    dt_dataset_destroy(ds);
    snprintf(spec, sizeof spec, "tokens:%s", path);
    const int T = size > 0 ? 1 + data[0] % 64 : 4;
    if (dt_dataset_open_text(&ds, &val, spec, T, 0.1) == DT_OK) {
        touch_tokens(ds);
        if (val) touch_tokens(val);
        dt_dataset_destroy(ds);
        dt_dataset_destroy(val);
    }
    close(fd);
    return 0;
}
