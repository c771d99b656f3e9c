/* dtrain ckpt: checkpoint tools. `consolidate DIR|FILE -o OUT` reads a checkpoint (the newest
 * valid one of a --checkpoint-dir, or a file: one-file or the index of a sharded checkpoint)
 * and writes it as one safetensors file that PyTorch's safetensors loader reads (the model's
 * tensors; with --optimizer-state also the optimizer moments, resumable by dtrain train). */
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "run/checkpoint.h"
#include "run/ckpt_dir.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char USAGE[] =
    "Usage: dtrain ckpt consolidate DIR|FILE -o OUT.safetensors [--optimizer-state]\n\n"
    "Writes a checkpoint (the newest valid one of a --checkpoint-dir DIR, or FILE: a one-file\n"
    "checkpoint or the index of a sharded one, whose shards FILE.rR-of-N lie beside it) as one\n"
    "safetensors file for PyTorch (safetensors.torch.load_file); --optimizer-state keeps the\n"
    "optimizer moments (then `dtrain train --resume OUT` continues from it).";

static int consolidate(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    bool optim = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--out")) {
            if (i + 1 == argc) return dt_cli_usage("e.g. -o model.safetensors", "%s needs a file name", argv[i]);
            out = argv[++i];
        } else if (!strcmp(argv[i], "--optimizer-state")) optim = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return puts(USAGE), 0;
        else if (argv[i][0] == '-') return dt_cli_usage(USAGE, "ckpt consolidate: unknown flag '%s'", argv[i]);
        else if (in) return dt_cli_usage(USAGE, "ckpt consolidate: one checkpoint at a time ('%s' and '%s')", in, argv[i]);
        else in = argv[i];
    }
    if (!in || !out) return dt_cli_usage(USAGE, "ckpt consolidate: need a checkpoint (DIR or FILE) and -o OUT");
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s", in);
    if (stat(in, &st) == 0 && S_ISDIR(st.st_mode)) {
        bool found = false;
        if (dt_ckpt_dir_latest(in, path, sizeof path, &found, NULL, NULL) != DT_OK || !found) {
            dt_cli_fail("pass the --checkpoint-dir of a run that wrote checkpoints, or a checkpoint file",
                        "ckpt consolidate: %s holds no valid checkpoint", in);
            return 78;
        }
    }
    dt_status s = dt_checkpoint_consolidate(path, out, optim);
    if (s != DT_OK) {
        dt_cli_fail(NULL, "ckpt consolidate %s: %s", path, dt_last_error());
        return dt_cli_setup_status(s);
    }
    printf("dtrain ckpt: %s -> %s\n", path, out);
    return 0;
}

int dt_cmd_ckpt(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "consolidate")) return consolidate(argc - 1, argv + 1);
    bool help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    fprintf(help ? stdout : stderr, "%s\n", USAGE);
    return help ? 0 : 2;
}
