/* dtrain sample: generates text with a trained GPT checkpoint (byte tokens): the prompt, then
 * --tokens more bytes drawn with --temperature and --top-k, printed as they come. */
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SAMPLE_USAGE[] =
    "Usage: dtrain sample --checkpoint FILE [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]\n\n"
    "Generates text with a GPT trained on bytes (dtrain train --model gpt --data kjv --save FILE).\n"
    "The prompt is fed as bytes; the model continues it for --tokens bytes. --temperature 0 is\n"
    "greedy; --top-k 0 samples from every byte. The same seed gives the same text.\n\n"
    "Example: dtrain sample --checkpoint kjv.safetensors --prompt \"In the beginning\" --tokens 200";

static void put_token(void *ctx, int32_t tok) {
    (void)ctx;
    putchar(tok & 0xff);
    fflush(stdout);
}

int dt_cmd_sample(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = "\n";
    int ntok = 200, top_k = 40, threads = 1;
    float temperature = 0.8f;
    int64_t seed = 1;
    const dt_flag flags[] = {
        {"checkpoint", DT_FLAG_STR, &ckpt, "FILE", "GPT checkpoint (required)"},
        {"prompt", DT_FLAG_STR, &prompt, "TEXT", "text to continue (default a newline)"},
        {"tokens", DT_FLAG_INT, &ntok, "N", "bytes to generate"},
        {"temperature", DT_FLAG_FLOAT, &temperature, "T", "softmax temperature (0 = greedy)"},
        {"top-k", DT_FLAG_INT, &top_k, "K", "sample among the K most likely bytes (0 = all)"},
        {"seed", DT_FLAG_I64, &seed, "S", "seed of the draws"},
        {"threads", DT_FLAG_INT, &threads, "N", "BLAS threads"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof *flags), SAMPLE_USAGE, NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    if (!ckpt) return dt_cli_fail("pass --checkpoint FILE (written by dtrain train --model gpt --save FILE)",
                                  "no --checkpoint given");
    if (ntok < 0 || ntok > 1000000) return dt_cli_fail(NULL, "--tokens %d: need 0..1000000", ntok);
    if (!(temperature >= 0) || temperature > 100) return dt_cli_fail(NULL, "--temperature %g: need 0..100", temperature);
    if (top_k < 0) return dt_cli_fail(NULL, "--top-k %d: must not be negative (0 = all)", top_k);
    if (threads < 1) return dt_cli_fail(NULL, "--threads %d: need at least 1", threads);
    size_t np = strlen(prompt);
    if (np == 0) return dt_cli_usage("give --prompt at least one character (the default is a newline)", "--prompt is empty");
    dt_set_threads(threads);
    dt_model *m;
    if (dt_model_load(&m, ckpt) != DT_OK) return dt_cli_fail(NULL, "%s", dt_last_error());
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
    if (s != DT_OK) return dt_cli_fail(NULL, "--checkpoint %s: %s", ckpt, dt_last_error());
    return 0;
}
