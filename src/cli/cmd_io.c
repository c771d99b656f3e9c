/* dtrain eval / dtrain export / dtrain predict: a model from
 * --checkpoint FILE, or --weights FILE with --model SPEC, written as ONNX or run over a data
 * set with its predictions written as CSV or JSON Lines (atomically: temp file, then rename). */
#include "cli/cli.h"
#include "cli/train_outputs.h"
#include "cli/train_usage.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* dtrain eval of --checkpoint/--weights/--model; returns the exit status. */
static int eval_source(const dt_model_source *src, const char *data, int batch, int threads) {
    const char *ckpt = src->checkpoint, *weights = src->weights, *model = src->model;
    if (model && !weights && !ckpt)
        return dt_cli_usage("pass --weights FILE with --model SPEC", "--model %s needs --weights FILE", model);
    if (batch < 1) return dt_cli_usage(NULL, "--batch %d: need at least 1", batch);
    if (threads < 1) return dt_cli_usage(NULL, "--threads %d: need at least 1", threads);
    dt_set_threads(threads);
    float loss, acc;
    int64_t n = 0;
    const char *split = "test";
    dt_status s = dt_evaluate_source(src, data, batch, &loss, &acc, &n, &split);
    if (s != DT_OK) {
        if (s == DT_EINVAL) return dt_cli_usage(NULL, "%s", dt_last_error());
        dt_cli_fail(NULL, "%s", dt_last_error());
        return dt_cli_setup_status(s);
    }
    printf("eval: %lld samples, loss %.6f, accuracy %.4f%s\n", (long long)n, loss, acc,
           strcmp(split, "test") ? " (training split: the data set has no test split)" : "");
    return 0;
}

/* argv with "-o" spelt "--output" (the flag parser knows long flags only); free the result. */
static char **long_output_flag(int argc, char **argv) {
    char **v = calloc((size_t)argc + 1, sizeof *v);
    for (int i = 0; v && i < argc; i++) v[i] = !strcmp(argv[i], "-o") ? "--output" : argv[i];
    return v;
}

/* The model of --checkpoint / --weights (+ --model): spec, input shape (the file's, else
 * --input-shape) and the model itself. Returns 0, else the exit status (after saying why). */
static int open_model(const dt_model_source *src, const char *input_shape, dt_model **m, dt_input_norm *norm, int *C,
                      int *H, int *W) {
    char spec[1024];
    dt_status s = dt_model_source_spec(src, spec, sizeof spec);
    if (s == DT_EINVAL) return dt_cli_usage(NULL, "%s", dt_last_error());
    if (s != DT_OK) return dt_cli_fail(NULL, "%s", dt_last_error()), dt_cli_setup_status(s);
    char file_spec[1024], tail;
    *C = 1, *H = 28, *W = 28;
    const char *file = src->checkpoint ? src->checkpoint : src->weights;
    if (input_shape) {
        if (sscanf(input_shape, "%d,%d,%d%c", C, H, W, &tail) != 3 || *C < 1 || *H < 1 || *W < 1)
            return dt_cli_usage("e.g. --input-shape 1,28,28", "--input-shape '%s' is not C,H,W", input_shape);
    } else if (dt_weights_spec(file, file_spec, sizeof file_spec, C, H, W) != DT_OK)
        dt_error_clear(); /* a foreign file: the default shape (Fashion-MNIST's 1,28,28) */
    if ((s = dt_model_open(m, src, *C, *H, *W, norm)) != DT_OK) {
        dt_cli_fail(s == DT_EMISMATCH ? "leave out --input-shape, or give the shape the model was trained on" : NULL,
                    "%s", dt_last_error());
        return dt_cli_setup_status(s);
    }
    return 0;
}

static const char EXPORT_USAGE[] =
    "Usage: dtrain export --checkpoint FILE -o model.onnx\n"
    "       dtrain export --weights FILE --model SPEC [--input-shape C,H,W] -o model.onnx\n\n"
    "Writes the model as ONNX (IR 8, opset 17): input \"input\" (N,C,H,W) float, or \"ids\" (N,T) int32\n"
    "for a GPT; output \"logits\". A checkpoint's --normalize statistics become Sub/Div nodes.\n"
    "Run it with onnxruntime (e.g. npm onnxruntime-node) or check it with python3 -m onnx.checker.";

int dt_cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *weights = NULL, *model = NULL, *out = NULL, *shape = NULL, *device = NULL;
    const dt_flag flags[] = {
        {"checkpoint", DT_FLAG_STR, &ckpt, "FILE",
         "checkpoint to export (dtrain train --save), or a --checkpoint-dir directory"},
        {"weights", DT_FLAG_STR, &weights, "FILE", "or a plain safetensors weights file (with --model)"},
        {"model", DT_FLAG_STR, &model, "SPEC", "with --weights: the model the weights belong to"},
        {"input-shape", DT_FLAG_STR, &shape, "C,H,W",
         "with a foreign --weights file: the input shape (default 1,28,28)"},
        {"output", DT_FLAG_STR, &out, "FILE", "the ONNX file to write (also -o FILE; required)"},
        {"device", DT_FLAG_STR, &device, "DEV", dt_cli_device_help()},
    };
    char **args = long_output_flag(argc, argv);
    if (!args) return dt_cli_fail(NULL, "out of memory");
    int r = dt_flags_parse(argc, args, 1, flags, (int)(sizeof flags / sizeof *flags), EXPORT_USAGE, NULL, 0, NULL,
                           NULL);
    free(args);
    if (r) return r < 0 ? 2 : 0;
    if (!out) return dt_cli_usage("e.g. dtrain export --checkpoint mlp.safetensors -o mlp.onnx", "no -o FILE given");
    if ((r = dt_cli_check_output_file("-o", out)) >= 0) return r;
    char file[4096];
    if (ckpt && (r = dt_cli_checkpoint("checkpoint", ckpt, file, sizeof file)) != 0) return r;
    if (ckpt) ckpt = file;
    dt_model_source src = {.checkpoint = ckpt, .weights = weights, .model = model, .device = device};
    dt_model *m = NULL;
    dt_input_norm norm;
    int C, H, W;
    if ((r = open_model(&src, shape, &m, &norm, &C, &H, &W)) != 0) return r;
    dt_status s = dt_onnx_export(m, out, &norm, C, H, W);
    if (s == DT_OK)
        printf("export: %s (%s, %zu parameters) -> %s\n", ckpt ? ckpt : weights, dt_model_spec(m),
               dt_model_num_params(m), out);
    dt_model_destroy(m);
    if (s != DT_OK) {
        dt_cli_fail(s == DT_ENOTSUP ? "export a model made of the ops listed in 'dtrain train --help'" : NULL, "%s",
                    dt_last_error());
        return dt_cli_setup_status(s);
    }
    return 0;
}

static const char EVAL_USAGE[] =
    "Usage: dtrain eval --checkpoint FILE|DIR | --weights FILE --model SPEC [--data DIR] [--batch N]\n\n"
    "Evaluates a checkpoint written by 'dtrain train --save' (or the newest usable one of a\n"
    "--checkpoint-dir directory) on the test split of a data set, or a plain safetensors weights\n"
    "file (PyTorch's save_file(model.state_dict())) by PyTorch names.";

int dt_cmd_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *weights = NULL, *model = NULL, *device = NULL;
    int batch = 256, threads = 1;
    const dt_flag flags[] = {
        {"checkpoint", DT_FLAG_STR, &ckpt, "FILE",
         "checkpoint to evaluate, or a --checkpoint-dir directory (its newest usable one)"},
        {"data", DT_FLAG_STR, &data, "DIR",
         "IDX directory, fashion-mnist, mnist, a .csv, or text:FILE / kjv for a GPT (the part the run held out, "
         "--val-fraction); default: the checkpoint's, else fashion-mnist"},
        {"batch", DT_FLAG_INT, &batch, "N", "evaluation batch size"},
        {"threads", DT_FLAG_INT, &threads, "N", "BLAS threads"},
        {"weights", DT_FLAG_STR, &weights, "FILE",
         "a plain safetensors weights file (PyTorch state_dict names) instead of --checkpoint"},
        {"model", DT_FLAG_STR, &model, "SPEC",
         "with --weights: the model the weights belong to (mlp, cnn, a spec, gpt:...)"},
        {"device", DT_FLAG_STR, &device, "DEV", dt_cli_device_help()},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof *flags), EVAL_USAGE, NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    char file[4096];
    if (ckpt && (r = dt_cli_checkpoint("checkpoint", ckpt, file, sizeof file)) != 0) return r;
    if (ckpt) ckpt = file;
    dt_cli_trained_on trained;
    if (!data) dt_cli_checkpoint_trained_on(ckpt, &trained), data = trained.data;
    const dt_model_source src = {.checkpoint = ckpt, .weights = weights, .model = model, .device = device};
    if (weights || model) return eval_source(&src, data, batch, threads);
    if (!ckpt) return dt_cli_usage("pass --checkpoint FILE (written by dtrain train --save)", "no --checkpoint given");
    if (batch < 1) return dt_cli_usage(NULL, "--batch %d: need at least 1", batch);
    if (threads < 1) return dt_cli_usage(NULL, "--threads %d: need at least 1", threads);
    dt_set_threads(threads);
    float loss, acc;
    int64_t n;
    const char *split = "test";
    dt_status s = dt_evaluate_checkpoint_on(ckpt, data, device, batch, &loss, &acc, &n, &split);
    if (s != DT_OK) {
        dt_cli_fail(NULL, "%s", dt_last_error());
        return dt_cli_setup_status(s);
    }
    printf("eval: %lld samples, loss %.4f, accuracy %.4f%s\n", (long long)n, loss, acc,
           strcmp(split, "test") ? " (training split: the data set has no test split)" : "");
    return 0;
}
