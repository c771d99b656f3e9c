/* dtrain sample: generates text with a trained GPT checkpoint (byte tokens): the prompt, then
 * --tokens more bytes drawn with --temperature and --top-k, printed as they come.
 * Exit status: 0; 1 at run time; 2 a wrong flag or a prompt outside the vocabulary; 78 a checkpoint
 * that cannot be read, or a model that is not a GPT. */
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"
#include "run/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SAMPLE_USAGE[] =
    "Usage: dtrain sample --checkpoint FILE|DIR | --weights FILE [--model SPEC] [--prompt TEXT] [--tokens N]\n"
    "                     [--temperature T] [--top-k K] [--seed S]\n\n"
    "Generates text with a GPT trained on bytes (dtrain train --model gpt --data kjv --save FILE;\n"
    "a --checkpoint-dir directory gives its newest usable checkpoint), or from plain weights\n"
    "(--save-weights, or a nanoGPT-named PyTorch state_dict) with their --model. The prompt is fed as bytes;\n"
    "the model continues it for --tokens bytes. --temperature 0 is greedy; --top-k 0 samples from\n"
    "every byte. The same seed gives the same text.\n\n"
    "Example: dtrain sample --checkpoint kjv.safetensors --prompt \"In the beginning\" --tokens 200";

static void put_token(void *ctx, int32_t tok) {
    (void)ctx;
    putchar(tok & 0xff);
    fflush(stdout);
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
    if (!(temperature >= 0) || temperature > 100) return dt_cli_usage(NULL, "--temperature %g: need 0..100", temperature);
    if (top_k < 0) return dt_cli_usage(NULL, "--top-k %d: must not be negative (0 = all)", top_k);
    if (threads < 1) return dt_cli_usage(NULL, "--threads %d: need at least 1", threads);
    if (!prompt[0]) return dt_cli_usage("give --prompt at least one character (the default is a newline)", "--prompt is empty");
    return 0;
}

/* The GPT of src (a checkpoint, or weights with their spec), able to take the prompt's bytes; 0,
 * or the exit status: 78 for a file or model that cannot be used, 2 for a prompt outside its
 * vocabulary or a missing spec. */
static int open_gpt(const dt_model_source *src, const char *prompt, dt_model **m) {
    const char *flag = src->checkpoint ? "--checkpoint" : "--weights";
    const char *file = src->checkpoint ? src->checkpoint : src->weights;
    char spec[1024];
    dt_status s = dt_model_source_spec(src, spec, sizeof spec);
    if (s == DT_EINVAL) return dt_cli_usage(NULL, "%s", dt_last_error());
    /* a checkpoint knows its input shape; weights of a GPT take none (1x1x1 is ignored) */
    if (s == DT_OK) s = src->checkpoint ? dt_model_load(m, src->checkpoint) : dt_model_open(m, src, 1, 1, 1, NULL);
    if (s != DT_OK) return dt_cli_fail(NULL, "%s", dt_last_error()), dt_cli_setup_status(s == DT_EINVAL ? DT_EFORMAT : s);
    if (dt_model_in_dtype(*m) != DT_I32)
        return dt_cli_fail("sample from a GPT trained on text (dtrain train --model gpt --data kjv --save FILE)",
                           "%s %s: model '%s' is not a language model (it takes no token ids)", flag, file,
                           dt_model_spec(*m)), DT_EXIT_CONFIG;
    const int V = dt_model_classes(*m);
    for (size_t i = 0; prompt[i]; i++)
        if ((unsigned char)prompt[i] >= V)
            return dt_cli_usage("give a prompt of the bytes the model was trained on",
                                "--prompt: byte %u at position %zu is outside the model's vocabulary [0, %d)",
                                (unsigned char)prompt[i], i, V);
    return 0;
}

int dt_cmd_sample(int argc, char **argv) {
    const char *ckpt = NULL, *weights = NULL, *model = NULL, *prompt = "\n";
    int ntok = 200, top_k = 40, threads = 1;
    float temperature = 0.8f;
    int64_t seed = 1;
    const dt_flag flags[] = {
        {"checkpoint", DT_FLAG_STR, &ckpt, "FILE", "GPT checkpoint, or a --checkpoint-dir directory (its newest usable one)"},
        {"weights", DT_FLAG_STR, &weights, "FILE", "or a plain safetensors weights file (--save-weights, a PyTorch state_dict)"},
        {"model", DT_FLAG_STR, &model, "SPEC", "with --weights: the GPT the weights belong to (gpt:L=..,H=..,C=..,T=..; default: the file's)"},
        {"prompt", DT_FLAG_STR, &prompt, "TEXT", "text to continue (default a newline)"},
        {"tokens", DT_FLAG_INT, &ntok, "N", "bytes to generate"},
        {"temperature", DT_FLAG_FLOAT, &temperature, "T", "softmax temperature (0 = greedy)"},
        {"top-k", DT_FLAG_INT, &top_k, "K", "sample among the K most likely bytes (0 = all)"},
        {"seed", DT_FLAG_I64, &seed, "S", "seed of the draws"},
        {"threads", DT_FLAG_INT, &threads, "N", "BLAS threads"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof *flags), SAMPLE_USAGE, NULL, 0, NULL, NULL);
    if (r) return r < 0 ? DT_EXIT_USAGE : 0;
    if (seed < 0) return dt_cli_usage("e.g. --seed 1", "--seed %lld: need an integer >= 0", (long long)seed);
    if ((r = check_flags(ckpt, weights, prompt, ntok, temperature, top_k, threads)) != 0) return r;
    char file[4096];
    if (ckpt && (r = dt_cli_checkpoint("checkpoint", ckpt, file, sizeof file)) != 0) return r;
    dt_set_threads(threads);
    dt_model *m = NULL;
    const dt_model_source src = {.checkpoint = ckpt ? file : NULL, .weights = weights, .model = model};
    if ((r = open_gpt(&src, prompt, &m)) != 0) {
        dt_model_free(m);
        return r;
    }
    const size_t np = strlen(prompt);
    int32_t *ids = malloc(np * sizeof *ids);
    if (!ids) {
        dt_model_free(m);
        return dt_cli_fail(NULL, "out of memory");
    }
    for (size_t i = 0; i < np; i++) ids[i] = (unsigned char)prompt[i];
    fputs(prompt, stdout);
    dt_sample_config sc = {.temperature = temperature, .top_k = top_k, .seed = (uint64_t)seed};
    dt_status s = dt_gpt_generate(m, ids, (int)np, ntok, &sc, put_token, NULL);
    putchar('\n');
    free(ids);
    dt_model_free(m);
    if (s != DT_OK)  /* at run time: 1 */
        return dt_cli_fail(NULL, "%s %s: %s", ckpt ? "--checkpoint" : "--weights", ckpt ? file : weights, dt_last_error());
    return 0;
}
