/* Models from files for evaluation and inference: a dtrain checkpoint, or a plain weights file
 * (PyTorch's state_dict as safetensors) with a --model spec, built for the data's input shape;
 * and `dtrain eval` of either. */
#include "run/trainer_internal.h"

#include "device/device.h"
#include "dtrain/dtrain.h"
#include "dtrain/io.h"
#include "dtrain/models.h"
#include "dtrain/safetensors.h"
#include "run/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char dt_onnx_producer_version[] = DTRAIN_VERSION;

static dt_status check_source(const dt_model_source *src) {
    if (!src->checkpoint == !src->weights)
        return dt_error(DT_EINVAL, src->checkpoint ? "`checkpoint` and `weights` both given: pass one of them"
                                                   : "no model given: pass `checkpoint` FILE, or `weights` FILE with "
                                                     "`model` SPEC");
    return DT_OK;
}

dt_status dt_model_source_spec(const dt_model_source *src, char *spec, size_t cap) {
    DT_TRY(check_source(src));
    if (src->checkpoint) {
        dt_ckpt_info info;
        DT_TRY(dt_checkpoint_read_info(src->checkpoint, &info));
        if (src->model && strcmp(src->model, info.spec) != 0) {
            /* the same model spelt another way ("mlp") is fine: compare canonical forms */
            dt_model *m = NULL;
            dt_status s = dt_model_build(&m, src->model, info.C, info.H, info.W);
            bool same = s == DT_OK && !strcmp(dt_model_spec(m), info.spec);
            dt_model_destroy(m);
            if (s != DT_OK) return s;
            if (!same)
                return dt_error(DT_EINVAL, "`model` %s: the checkpoint %s holds model '%s'; leave out `model`",
                                src->model, src->checkpoint, info.spec);
        }
        snprintf(spec, cap, "%s", info.spec);
        return DT_OK;
    }
    if (src->model) {
        snprintf(spec, cap, "%s", src->model);
        return DT_OK;
    }
    int C, H, W;
    dt_status s = dt_weights_spec(src->weights, spec, cap, &C, &H, &W);
    if (s == DT_ENOENT)
        return dt_error(DT_EINVAL,
                        "`weights` %s: a plain weights file needs `model` SPEC (the model it was saved from, "
                        "e.g. mlp or \"flatten linear(128) relu linear(10)\")",
                        src->weights);
    return s;
}

/* The --normalize statistics a file records (a checkpoint's), else off. */
static dt_status file_norm(const char *path, dt_input_norm *norm) {
    *norm = (dt_input_norm){.on = false, .mean = 0, .std = 1};
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, path));
    const char *mean = dt_st_meta(f, "dtrain.norm_mean"), *sd = dt_st_meta(f, "dtrain.norm_std");
    char *e1 = NULL, *e2 = NULL;
    if (mean && sd) *norm = (dt_input_norm){.on = true, .mean = strtof(mean, &e1), .std = strtof(sd, &e2)};
    dt_status s = DT_OK;
    if (norm->on && (*e1 || *e2 || !(norm->std > 0)))
        s = dt_error(DT_EFORMAT, "%s: bad dtrain.norm_mean/norm_std '%.20s'/'%.20s'", path, mean, sd);
    dt_st_destroy(f);
    return s;
}

dt_status dt_model_to_device(dt_model **m, const char *device) {
    if (!device || !strcmp(device, "cpu")) return DT_OK;
    dt_dev *d = NULL;
    dt_status s = dt_device_create(&d, device);
    if (s == DT_OK && (s = dt_model_adopt_device(*m, d)) != DT_OK) dt_device_destroy(d);
    if (s == DT_OK) return DT_OK;
    dt_model_destroy(*m);
    *m = NULL;
    return dt_error_wrap(s, "`device` %s", device);
}

dt_status dt_model_open(dt_model **m, const dt_model_source *src, int C, int H, int W, dt_input_norm *norm) {
    *m = NULL;
    char spec[1024];
    dt_input_norm nm = {.on = false, .mean = 0, .std = 1};
    DT_TRY(dt_model_source_spec(src, spec, sizeof spec));
    const bool gpt = dt_model_spec_is_gpt(spec);
    dt_status s;
    if (src->checkpoint) {
        dt_ckpt_info info;
        DT_TRY(dt_checkpoint_read_info(src->checkpoint, &info));
        if (!gpt && (C != info.C || H != info.H || W != info.W))
            return dt_error(DT_EMISMATCH, "%s: model expects inputs %dx%dx%d but the data has %dx%dx%d",
                            src->checkpoint, info.C, info.H, info.W, C, H, W);
        s = dt_model_build(m, spec, info.C, info.H, info.W);
        if (s != DT_OK) return dt_error_wrap(DT_EFORMAT, "%s: its dtrain.model_spec", src->checkpoint);
        DT_TRY(dt_model_to_device(m, src->device));
        DT_TRY_GOTO(s = dt_checkpoint_restore(src->checkpoint, *m, NULL, &info), fail);
        if (info.has_norm) nm = (dt_input_norm){.on = true, .mean = info.norm_mean, .std = info.norm_std};
    } else {
        DT_TRY(dt_model_build(m, spec, C, H, W));
        DT_TRY(dt_model_to_device(m, src->device));
        DT_TRY_GOTO(s = dt_weights_load(*m, src->weights), fail);
        DT_TRY_GOTO(s = file_norm(src->weights, &nm), fail);
    }
    if (norm) *norm = nm;
    return DT_OK;
fail:
    dt_model_destroy(*m);
    *m = NULL;
    return s;
}

dt_status dt_evaluate_source(const dt_model_source *src, const char *data, int batch, float *loss, float *acc,
                             int64_t *samples, const char **split) {
    char spec[1024];
    DT_TRY(dt_model_source_spec(src, spec, sizeof spec));
    dt_dataset *train = NULL, *test = NULL;
    dt_model *m = NULL;
    DT_TRY(dt_trainer_open_data(data, spec, 0.1, &train, &test));
    dt_dataset *ds = test ? test : train;
    *split = test ? "test" : "train";
    int C, H, W;
    dt_input_norm norm;
    dt_dataset_shape(ds, &C, &H, &W);
    dt_status s = dt_model_open(&m, src, C, H, W, &norm);
    /* a label the model has no output for would make the loss NaN (and the accuracy a lie) */
    if (s == DT_OK && (s = dt_dataset_set_classes(ds, dt_model_classes(m))) != DT_OK)
        s = dt_error_wrap(s, "`data` %s does not fit the model (%d outputs)", data, dt_model_classes(m));
    if (s == DT_OK && norm.on) s = dt_dataset_set_normalize(ds, norm.mean, norm.std);
    if (s == DT_OK) s = dt_evaluate_dataset(m, ds, batch, loss, acc);
    *samples = (int64_t)dt_dataset_len(ds);
    dt_model_destroy(m);
    dt_dataset_destroy(train);
    dt_dataset_destroy(test);
    return s;
}
