/* dtrain sample: generates text with a trained GPT checkpoint (byte tokens): the prompt, then
 * --tokens more bytes drawn with --temperature and --top-k, printed as they come. With --ids (a
 * model of token files, tokens:DIR) the prompt and the output are token ids instead of bytes.
 * Exit status: 0; 1 at run time; 2 a wrong flag or a prompt outside the vocabulary; 78 a checkpoint
 * that cannot be read, or a model that is not a GPT. */
#include "cli/cli.h"
#include "cli/train_usage.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"
#include "run/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SAMPLE_USAGE[] =
    "Usage: dtrain sample --checkpoint FILE|DIR | --weights FILE [--model SPEC] [--prompt TEXT] [--tokens N]\n"
    "                     [--temperature T] [--top-k K] [--seed S] [--device DEV]\n\n"
    "Generates text with a GPT trained on bytes (dtrain train --model gpt --data kjv --save FILE;\n"
    "a --checkpoint-dir directory gives its newest usable checkpoint), or from plain weights\n"
    "(--save-weights, or a nanoGPT-named PyTorch state_dict) with their --model. The prompt is fed as bytes;\n"
    "the model continues it for --tokens bytes. --temperature 0 is greedy; --top-k 0 samples from\n"
    "every byte. The same seed gives the same text. A model of token files (--data tokens:DIR) reads and\n"
    "writes token ids: pass --ids and --prompt \"464 3290 318\" and decode the output with your tokenizer.\n\n"
    "Example: dtrain sample --checkpoint kjv.safetensors --prompt \"In the beginning\" --tokens 200";

static void put_token(void *ctx, int32_t tok) {
    if (*(const bool *)ctx) printf(" %d", (int)tok); /* --ids */
    else putchar(tok & 0xff);
    fflush(stdout);
}

/* --ids: the prompt's token ids ("1 2 3" or "1,2,3") into ids (room for strlen(prompt) / 2 + 1);
 * their count, or -1 after saying which one is wrong (exit 2). */
static int parse_ids(const char *prompt, int V, int32_t *ids) {
    int n = 0;
    for (const char *p = prompt;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && !strchr(" ,\t\n", *end)) || v < 0 || v >= V)
            return dt_cli_usage(
                       "with --ids, --prompt is token ids of the model's vocabulary, e.g. --prompt \"464 3290\"",
                       "--prompt: token %d ('%.*s') is not an id in [0, %d)", n + 1, (int)strcspn(p, " ,\t\n"), p, V),
                   -1;
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!n) return dt_cli_usage(NULL, "--ids: --prompt holds no token id"), -1;
    return n;
}

/* The flags' values; 0, or the exit status (2) after saying which is wrong. */
static int check_flags(const char *ckpt, const char *weights, const char *prompt, int ntok, float temperature,
                       int top_k, int threads) {
    if (!ckpt && !weights)
        return dt_cli_usage("pass --checkpoint FILE (dtrain train --model gpt --save FILE), or --weights FILE "
                            "(--save-weights, or a PyTorch state_dict) with --model gpt:...",
                            "no --checkpoint or --weights given");
    if (ckpt && weights) return dt_cli_usage(NULL, "--checkpoint and --weights: give one of them");
    if (ntok < 0 || ntok > 1000000) return dt_cli_usage(NULL, "--tokens %d: need 0..1000000", ntok);
    if (!(temperature >= 0) || temperature > 100)
        return dt_cli_usage(NULL, "--temperature %g: need 0..100", temperature);
    if (top_k < 0) return dt_cli_usage(NULL, "--top-k %d: must not be negative (0 = all)", top_k);
    if (threads < 1) return dt_cli_usage(NULL, "--threads %d: need at least 1", threads);
    if (!prompt[0])
        return dt_cli_usage("give --prompt at least one character (the default is a newline)", "--prompt is empty");
    return 0;
}

/* The GPT of src (a checkpoint, or weights with their spec), able to take the prompt's bytes; 0,
 * or the exit status: 78 for a file or model that cannot be used, 2 for a prompt outside its
 * vocabulary or a missing spec. */
static int open_gpt(const dt_model_source *src, const char *prompt, bool ids, dt_model **m) {
    const char *flag = src->checkpoint ? "--checkpoint" : "--weights";
    const char *file = src->checkpoint ? src->checkpoint : src->weights;
    char spec[1024];
    dt_status s = dt_model_source_spec(src, spec, sizeof spec);
    if (s == DT_EINVAL) return dt_cli_usage(NULL, "%s", dt_last_error());
    /* a checkpoint knows its input shape; weights of a GPT take none (1x1x1 is ignored) */
    /* a checkpoint of another model is loaded as it is, for the message below */
    if (s == DT_OK)
        s = src->checkpoint && !dt_model_spec_is_gpt(spec) ? dt_model_load(m, src->checkpoint)
                                                           : dt_model_open(m, src, 1, 1, 1, NULL);
    if (s != DT_OK)
        return dt_cli_fail(NULL, "%s", dt_last_error()), dt_cli_setup_status(s == DT_EINVAL ? DT_EFORMAT : s);
    if (dt_model_in_dtype(*m) != DT_I32)
        return dt_cli_fail("sample from a GPT trained on text (dtrain train --model gpt --data kjv --save FILE)",
                           "%s %s: model '%s' is not a language model (it takes no token ids)", flag, file,
                           dt_model_spec(*m)),
               DT_EXIT_CONFIG;
    const int V = dt_model_classes(*m);
    if (ids) return 0; /* checked as they are parsed */
    if (V > 256)
        return dt_cli_usage(
            "decode and encode with the tokenizer of its data; pass --ids --prompt \"ID ID ...\"",
            "%s %s: model '%s' has V=%d tokens (it was trained on token files), not bytes: its prompt and "
            "output are token ids",
            flag, file, dt_model_spec(*m), V);
    for (size_t i = 0; prompt[i]; i++)
        if ((unsigned char)prompt[i] >= V)
            return dt_cli_usage("give a prompt of the bytes the model was trained on",
                                "--prompt: byte %u at position %zu is outside the model's vocabulary [0, %d)",
                                (unsigned char)prompt[i], i, V);
    return 0;
}

int dt_cmd_sample(int argc, char **argv) {
    const char *ckpt = NULL, *weights = NULL, *model = NULL, *prompt = "\n", *device = NULL;
    int ntok = 200, top_k = 40, threads = 1;
    bool tok_ids = false;
    float temperature = 0.8f;
    int64_t seed = 1;
    const dt_flag flags[] = {
        {"checkpoint", DT_FLAG_STR, &ckpt, "FILE",
         "GPT checkpoint, or a --checkpoint-dir directory (its newest usable one)"},
        {"weights", DT_FLAG_STR, &weights, "FILE",
         "or a plain safetensors weights file (--save-weights, a PyTorch state_dict)"},
        {"model", DT_FLAG_STR, &model, "SPEC",
         "with --weights: the GPT the weights belong to (gpt:L=..,H=..,C=..,T=..; default: the file's)"},
        {"prompt", DT_FLAG_STR, &prompt, "TEXT", "text to continue (default a newline)"},
        {"tokens", DT_FLAG_INT, &ntok, "N", "bytes to generate"},
        {"temperature", DT_FLAG_FLOAT, &temperature, "T", "softmax temperature (0 = greedy)"},
        {"top-k", DT_FLAG_INT, &top_k, "K", "sample among the K most likely bytes (0 = all)"},
        {"seed", DT_FLAG_I64, &seed, "S", "seed of the draws"},
        {"threads", DT_FLAG_INT, &threads, "N", "BLAS threads"},
        {"ids", DT_FLAG_BOOL, &tok_ids, NULL, "the prompt and the output are token ids (a model of --data tokens:DIR)"},
        {"device", DT_FLAG_STR, &device, "DEV", dt_cli_device_help()},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof *flags), SAMPLE_USAGE, NULL, 0, NULL,
                           NULL);
    if (r) return r < 0 ? DT_EXIT_USAGE : 0;
    if (seed < 0) return dt_cli_usage("e.g. --seed 1", "--seed %lld: need an integer >= 0", (long long)seed);
    if ((r = check_flags(ckpt, weights, prompt, ntok, temperature, top_k, threads)) != 0) return r;
    char file[4096];
    if (ckpt && (r = dt_cli_checkpoint("checkpoint", ckpt, file, sizeof file)) != 0) return r;
    dt_set_threads(threads);
    dt_model *m = NULL;
    const dt_model_source src = {
        .checkpoint = ckpt ? file : NULL, .weights = weights, .model = model, .device = device};
    if ((r = open_gpt(&src, prompt, tok_ids, &m)) != 0) {
        dt_model_destroy(m);
        return r;
    }
    size_t np = strlen(prompt);
    int32_t *ids = malloc((np + 1) * sizeof *ids);
    if (!ids) {
        dt_model_destroy(m);
        return dt_cli_fail(NULL, "out of memory");
    }
    if (tok_ids) {
        int n = parse_ids(prompt, dt_model_classes(m), ids);
        if (n < 0) {
            free(ids);
            dt_model_destroy(m);
            return DT_EXIT_USAGE;
        }
        np = (size_t)n;
        for (size_t i = 0; i < np; i++) printf("%s%d", i ? " " : "", (int)ids[i]);
    } else {
        for (size_t i = 0; i < np; i++) ids[i] = (unsigned char)prompt[i];
        fputs(prompt, stdout);
    }
    dt_sample_config sc = {.temperature = temperature, .top_k = top_k, .seed = (uint64_t)seed};
    dt_status s = dt_gpt_generate(m, ids, (int)np, ntok, &sc, put_token, &tok_ids);
    putchar('\n');
    free(ids);
    dt_model_destroy(m);
    if (s != DT_OK) /* at run time: 1 */
        return dt_cli_fail(NULL, "%s %s: %s", ckpt ? "--checkpoint" : "--weights", ckpt ? file : weights,
                           dt_last_error());
    return 0;
}
