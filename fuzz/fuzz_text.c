/* libFuzzer target: text data sets ("text:FILE", bytes as tokens). The first input byte picks the
 * window T and the validation share; the rest is the file. Every window of both sets is then read
 * back (dt_dataset_batch_tokens), and an index past the end must be refused, not read. */
#include "fuzz/fuzz_common.h"
#include "dtrain/data.h"

#include <stdlib.h>

static void read_all(const dt_dataset *ds, int T) {
    if (!ds) return;
    size_t n = dt_dataset_len(ds);
    int32_t *tok = malloc((size_t)T * sizeof *tok), *tgt = malloc((size_t)T * sizeof *tgt);
    for (size_t i = 0; i < n && tok && tgt; i++) {
        uint32_t idx = (uint32_t)i;
        if (dt_dataset_batch_tokens(ds, &idx, 1, tok, tgt) != DT_OK) abort(); /* every window is readable */
        for (int t = 0; t < T; t++)
            if (tok[t] < 0 || tok[t] > 255 || tgt[t] < 0 || tgt[t] > 255) abort();
    }
    uint32_t past = (uint32_t)n;
    if (tok && tgt && dt_dataset_batch_tokens(ds, &past, 1, tok, tgt) == DT_OK) abort(); /* past the end: refused */
    free(tok);
    free(tgt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int T = 1 + data[0] % 64;
    double val = (data[0] >> 6) * 0.125; /* 0, 0.125, 0.25, 0.375 */
    char path[64], spec[80];
    int fd = dt_fuzz_file(data + 1, size - 1, path, sizeof path);
    if (fd < 0) return 0;
    snprintf(spec, sizeof spec, "text:%s", path);
    dt_dataset *tr = NULL, *va = NULL;
    if (dt_dataset_open_text(&tr, &va, spec, T, val) == DT_OK) {
        read_all(tr, T);
        read_all(va, T);
    }
    dt_dataset_destroy(tr);
    dt_dataset_destroy(va);
    close(fd);
    return 0;
}
