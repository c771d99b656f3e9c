/* dtrain predict: a model (--checkpoint, or --weights with --model) over the test (or training)
 * split of a data set, one line per sample with its label, predicted class, that class's
 * softmax probability and, with --logits, every logit (a regression model, one that ends in mse:
 * its target and the prediction); CSV or JSON Lines by the file's suffix.
 * Written to a temp file in the same directory and renamed: no half-written file. */
#include "cli/cli.h"
#include "cli/train_outputs.h"
#include "cli/train_usage.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"
#include "run/writable.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* One line of output for sample `index` (label y) with logits row[0..K). */
static void write_row(FILE *f, bool json, bool logits, int64_t index, int y, const float *row, int K) {
    int best = 0;
    for (int k = 1; k < K; k++)
        if (row[k] > row[best]) best = k;
    double z = 0;
    for (int k = 0; k < K; k++) z += exp((double)row[k] - row[best]);
    const double p = 1.0 / z;
    if (json)
        fprintf(f, "{\"index\":%lld,\"label\":%d,\"prediction\":%d,\"probability\":%.6f", (long long)index, y, best, p);
    else fprintf(f, "%lld,%d,%d,%.6f", (long long)index, y, best, p);
    if (logits) {
        fputs(json ? ",\"logits\":[" : "", f);
        for (int k = 0; k < K; k++) fprintf(f, json ? "%s%.9g" : "%s%.9g", json && !k ? "" : ",", row[k]);
        fputs(json ? "]" : "", f);
    }
    fputs(json ? "}\n" : "\n", f);
}

/* One line for sample `index` of a regression set: its target (the f32 bits in the label slot) and
 * the model's one output. */
static void write_target_row(FILE *f, bool json, int64_t index, int32_t bits, float pred) {
    float target;
    memcpy(&target, &bits, sizeof target);
    fprintf(f, json ? "{\"index\":%lld,\"target\":%.9g,\"prediction\":%.9g}\n" : "%lld,%.9g,%.9g\n", (long long)index,
            target, pred);
}

typedef struct {
    const char *out, *data, *split;
    int64_t limit;
    bool logits;
} predict_opts;

/* A GPT's window: its input ids, the argmax next byte at each position and (--logits) the (T, V)
 * logits, as one JSON line (a CSV row holds the predictions only, separated by spaces). */
static void write_window(FILE *f, bool json, bool logits, int64_t index, const int32_t *ids, const float *lg, int T,
                         int V) {
    fprintf(f, json ? "{\"index\":%lld,\"ids\":[" : "%lld,", (long long)index);
    for (int t = 0; json && t < T; t++) fprintf(f, "%s%d", t ? "," : "", ids[t]);
    fputs(json ? "],\"prediction\":[" : "", f);
    for (int t = 0; t < T; t++) {
        int best = 0;
        for (int k = 1; k < V; k++)
            if (lg[(size_t)t * V + k] > lg[(size_t)t * V + best]) best = k;
        fprintf(f, "%s%d", t ? (json ? "," : " ") : "", best);
    }
    if (json && logits) {
        fputs("],\"logits\":[", f);
        for (size_t k = 0; k < (size_t)T * V; k++) fprintf(f, "%s%.9g", k ? "," : "", lg[k]);
    }
    fputs(json ? "]}\n" : "\n", f);
}

/* Runs m over ds (n samples) chunk by chunk and writes the rows to f. */
static dt_status predict_rows(dt_model *m, const dt_dataset *ds, int64_t n, const predict_opts *o, FILE *f) {
    enum { CHUNK = 64 };
    const int in = dt_model_in_size(m), K = dt_model_out_size(m), V = dt_model_classes(m);
    const bool text = dt_dataset_is_text(ds), targets = dt_dataset_has_targets(ds);
    float *x = malloc((size_t)CHUNK * in * sizeof(float)), *lg = malloc((size_t)CHUNK * K * sizeof(float));
    int32_t *y = malloc(CHUNK * sizeof(int32_t));
    uint32_t *idx = malloc(CHUNK * sizeof(uint32_t));
    dt_status s = x && lg && y && idx ? DT_OK : dt_error(DT_ENOMEM, "predict: out of memory");
    const bool json = has_suffix(o->out, ".jsonl") || has_suffix(o->out, ".json");
    if (s == DT_OK && !json && text) fputs("index,prediction\n", f);
    else if (s == DT_OK && !json && targets) fputs("index,target,prediction\n", f);
    else if (s == DT_OK && !json) {
        fputs("index,label,prediction,probability", f);
        for (int k = 0; o->logits && k < K; k++) fprintf(f, ",logit_%d", k);
        fputc('\n', f);
    }
    for (int64_t i = 0; s == DT_OK && i < n; i += CHUNK) {
        const int b = (int)(n - i < CHUNK ? n - i : CHUNK);
        for (int j = 0; j < b; j++) idx[j] = (uint32_t)(i + j);
        int32_t *tok = (int32_t *)x;
        if ((s = text ? dt_dataset_batch_tokens(ds, idx, b, tok, NULL) : dt_dataset_batch(ds, idx, b, x, y)) != DT_OK)
            break;
        if ((s = dt_model_predict(m, x, b, lg)) != DT_OK) break;
        for (int j = 0; j < b; j++)
            if (text) write_window(f, json, o->logits, i + j, tok + (size_t)j * in, lg + (size_t)j * K, in, V);
            else if (targets) write_target_row(f, json, i + j, y[j], lg[(size_t)j * K]);
            else write_row(f, json, o->logits, i + j, y[j], lg + (size_t)j * K, K);
    }
    free(x), free(lg), free(y), free(idx);
    return s;
}

/* Opens the data, runs the model and writes o->out atomically. */
static int run_predict(dt_model *m, const dt_input_norm *norm, dt_dataset *train, dt_dataset *test,
                       const predict_opts *o) {
    dt_dataset *ds = !strcmp(o->split, "train") || !test ? train : test;
    if (!strcmp(o->split, "test") && !test)
        fprintf(stderr, "dtrain predict: --data %s has no test split; predicting its training split\n", o->data);
    if (norm->on && dt_dataset_set_normalize(ds, norm->mean, norm->std) != DT_OK)
        return dt_cli_fail(NULL, "%s", dt_last_error());
    int64_t n = (int64_t)dt_dataset_len(ds);
    if (o->limit > 0 && o->limit < n) n = o->limit;
    char dest[4096], tmp[4200]; /* -o, or the file a symbolic link -o names leads to */
    if (dt_output_path("-o", o->out, dest, sizeof dest) != DT_OK) return dt_cli_usage(NULL, "%s", dt_last_error());
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dest, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return dt_cli_fail("check that the directory exists and is writable", "-o %s: %s", o->out, strerror(errno));
    dt_status s = predict_rows(m, ds, n, o, f);
    if (fflush(f) != 0 || ferror(f)) s = s != DT_OK ? s : dt_error(DT_EIO, "-o %s: %s", o->out, strerror(errno));
    if (fclose(f) != 0 && s == DT_OK) s = dt_error(DT_EIO, "-o %s: %s", o->out, strerror(errno));
    if (s == DT_OK && rename(tmp, dest) != 0) s = dt_error(DT_EIO, "-o %s: %s", o->out, strerror(errno));
    if (s != DT_OK) {
        unlink(tmp);
        dt_cli_fail(NULL, "%s", dt_last_error());
        return dt_cli_setup_status(s);
    }
    printf("predict: %lld samples of --data %s (%s split) -> %s\n", (long long)n, o->data,
           ds == test ? "test" : "training", o->out);
    return 0;
}

static const char PREDICT_USAGE[] =
    "Usage: dtrain predict --checkpoint FILE [--data DIR] -o preds.csv|preds.jsonl\n"
    "       dtrain predict --weights FILE --model SPEC [--data DIR] -o preds.csv|preds.jsonl\n\n"
    "Writes one line per sample of the test split (--split train: the training split): index,\n"
    "label, predicted class and its softmax probability; --logits adds every logit. A name ending\n"
    "in .jsonl (or .json) gives JSON Lines, anything else CSV with a header line. For a GPT and\n"
    "text data (the part the run held out, or --split train) each line is a window: its ids, the most likely\n"
    "next byte at every position and, with --logits, the (T, V) logits.";

int dt_cmd_predict(int argc, char **argv) {
    const char *ckpt = NULL, *weights = NULL, *model = NULL, *device = NULL;
    predict_opts o = {.data = NULL, .split = "test"};
    int threads = 1;
    const dt_flag flags[] = {
        {"checkpoint", DT_FLAG_STR, &ckpt, "FILE",
         "checkpoint of the model (dtrain train --save), or a --checkpoint-dir directory"},
        {"weights", DT_FLAG_STR, &weights, "FILE", "or a plain safetensors weights file (with --model)"},
        {"model", DT_FLAG_STR, &model, "SPEC", "with --weights: the model the weights belong to"},
        {"data", DT_FLAG_STR, &o.data, "DIR",
         "IDX directory, fashion-mnist, mnist, a .csv, or text:FILE / kjv for a GPT; default: the checkpoint's, else "
         "fashion-mnist"},
        {"split", DT_FLAG_STR, &o.split, "NAME", "test (default) or train"},
        {"limit", DT_FLAG_I64, &o.limit, "N", "only the first N samples (0 = all)"},
        {"logits", DT_FLAG_BOOL, &o.logits, NULL, "write every logit too"},
        {"threads", DT_FLAG_INT, &threads, "N", "BLAS threads"},
        {"device", DT_FLAG_STR, &device, "DEV", dt_cli_device_help()},
        {"output", DT_FLAG_STR, &o.out, "FILE", "where to write (also -o FILE; required)"},
    };
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) return dt_cli_fail(NULL, "out of memory");
    for (int i = 0; i < argc; i++) args[i] = !strcmp(argv[i], "-o") ? "--output" : argv[i];
    int r = dt_flags_parse(argc, args, 1, flags, (int)(sizeof flags / sizeof *flags), PREDICT_USAGE, NULL, 0, NULL,
                           NULL);
    free(args);
    if (r) return r < 0 ? 2 : 0;
    if (!o.out) return dt_cli_usage("e.g. -o preds.csv or -o preds.jsonl", "no -o FILE given");
    if (strcmp(o.split, "test") && strcmp(o.split, "train"))
        return dt_cli_usage(NULL, "--split %s: use test or train", o.split);
    if (o.limit < 0) return dt_cli_usage(NULL, "--limit %lld: must not be negative", (long long)o.limit);
    if (threads < 1) return dt_cli_usage(NULL, "--threads %d: need at least 1", threads);
    if ((r = dt_cli_check_output_file("-o", o.out)) >= 0) return r;
    char file[4096];
    if (ckpt && (r = dt_cli_checkpoint("checkpoint", ckpt, file, sizeof file)) != 0) return r;
    if (ckpt) ckpt = file;
    dt_cli_trained_on trained;
    dt_cli_checkpoint_trained_on(ckpt, &trained);
    if (!o.data) o.data = trained.data;
    dt_set_threads(threads);
    dt_model_source src = {.checkpoint = ckpt, .weights = weights, .model = model, .device = device};
    char spec[1024];
    dt_status s = dt_model_source_spec(&src, spec, sizeof spec);
    if (s == DT_EINVAL) return dt_cli_usage(NULL, "%s", dt_last_error());
    if (s != DT_OK) return dt_cli_fail(NULL, "%s", dt_last_error()), dt_cli_setup_status(s);
    dt_dataset *train = NULL, *test = NULL;
    const bool gpt = dt_model_spec_is_gpt(spec);
    dt_gpt_config g;
    if (gpt != dt_data_is_text(o.data))
        return dt_cli_usage(gpt ? "pass --data text:FILE or --data kjv" : "pass an image or CSV --data",
                            "--data %s does not fit model %s", o.data, spec);
    if (gpt && (s = dt_gpt_parse(spec, &g)) == DT_OK)
        s = dt_dataset_open_text(&train, &test, o.data, g.T, trained.val_fraction);
    else if (!gpt) s = dt_dataset_open(&train, &test, o.data);
    if (s != DT_OK) {
        dt_cli_fail("check --data (fashion-mnist, mnist, an IDX directory, a .csv file, text:FILE or kjv)", "%s",
                    dt_last_error());
        return dt_cli_setup_status(s);
    }
    int C, H, W;
    dt_dataset_shape(train, &C, &H, &W);
    dt_model *m = NULL;
    dt_input_norm norm;
    if ((s = dt_model_open(&m, &src, C, H, W, &norm)) != DT_OK) {
        dt_cli_fail(NULL, "%s", dt_last_error());
        r = dt_cli_setup_status(s);
    } else r = run_predict(m, &norm, train, test, &o);
    dt_model_destroy(m);
    dt_dataset_destroy(train);
    dt_dataset_destroy(test);
    return r;
}
