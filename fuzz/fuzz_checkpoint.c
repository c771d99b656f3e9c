/* libFuzzer target: safetensors files and checkpoint restore. Opens the input as a safetensors
 * file (header, offsets, CRCs), reads the checkpoint metadata, and when it names a small model,
 * builds it and restores the tensors and optimizer state into it. */
#include "fuzz/fuzz_common.h"
#include "dtrain/dtrain.h"
#include "dtrain/safetensors.h"
#include "run/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = dt_fuzz_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    dt_st_file *f = NULL;
    if (dt_st_open(&f, path) == DT_OK) {
        dt_st_tensor t;
        (void)dt_st_find(f, "1.weight", &t);
        dt_st_destroy(f);
    }
    dt_ckpt_info info;
    dt_model *m = NULL;
    if (dt_checkpoint_read_info(path, &info) == DT_OK && info.C * (int64_t)info.H * info.W <= 4096 &&
        dt_model_create_from_spec(&m, info.spec, info.C, info.H, info.W) == DT_OK && dt_model_num_params(m) <= 100000) {
        dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
        dt_optim *o = NULL;
        if (dt_optim_create(&o, &oc, dt_model_num_params(m)) == DT_OK) {
            (void)dt_checkpoint_restore(path, m, o, &info);
            dt_optim_destroy(o);
        }
    }
    dt_model_destroy(m);
    close(fd);
    return 0;
}
