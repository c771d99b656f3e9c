/* dtrain ckpt: checkpoint tools. `consolidate DIR|FILE -o OUT` reads a checkpoint (the newest
 * valid one of a --checkpoint-dir, or a file: one-file or the index of a sharded checkpoint)
 * and writes it as one safetensors file that PyTorch's safetensors loader reads (the model's
 * tensors; with --optimizer-state also the optimizer moments, resumable by dtrain train). */
#include "cli/cli.h"
#include "cli/train_outputs.h"
#include "dtrain/dtrain.h"
#include "run/checkpoint.h"
#include "run/ckpt_dir.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char USAGE[] =
    "Usage: dtrain ckpt consolidate DIR|FILE -o OUT.safetensors [--optimizer-state]\n\n"
    "Writes a checkpoint (the newest valid one of a --checkpoint-dir DIR, or FILE: a one-file\n"
    "checkpoint or the index of a sharded one, whose shards FILE.rR-of-N lie beside it) as one\n"
    "safetensors file for PyTorch (safetensors.torch.load_file); --optimizer-state keeps the\n"
    "optimizer moments (then `dtrain train --resume OUT` continues from it).";

/* Whether writing out would replace the checkpoint at path or one of its shards (path.rR-of-N). */
static bool reads_from(const char *path, const char *out) {
    struct stat a, b;
    if (stat(out, &b) != 0) return false; /* a new file replaces nothing */
    if (stat(path, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return true;
    char rp[PATH_MAX], ro[PATH_MAX];
    if (!realpath(path, rp) || !realpath(out, ro)) return false;
    const size_t n = strlen(rp);
    return !strncmp(ro, rp, n) && !strncmp(ro + n, ".r", 2) && strstr(ro + n, "-of-");
}

static int consolidate(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    bool optim = false;
    const dt_flag flags[] = {
        {"out", DT_FLAG_STR, &out, "OUT", "the file to write (also -o OUT)"},
        {"optimizer-state", DT_FLAG_BOOL, &optim, NULL, "keep the optimizer moments (to --resume from OUT)"},
    };
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-o")) argv[i] = (char *)"--out"; /* the short form of --out */
    const char *pos[2];
    int npos = 0;
    int r = dt_flags_parse(argc, argv, 1, flags, 2, USAGE, pos, 2, &npos, NULL);
    if (r) return r < 0 ? 2 : 0;
    if (npos > 1)
        return dt_cli_usage(USAGE, "ckpt consolidate: one checkpoint at a time ('%s' and '%s')", pos[0], pos[1]);
    in = npos ? pos[0] : NULL;
    if (!in || !out) return dt_cli_usage(USAGE, "ckpt consolidate: need a checkpoint (DIR or FILE) and -o OUT");
    if ((r = dt_cli_check_output_file("-o", out)) >= 0) return r; /* before the checkpoint is read */
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
    if (reads_from(path, out)) {
        dt_cli_fail("write the consolidated file elsewhere (e.g. -o model.safetensors), then move it if you want",
                    "ckpt consolidate: -o %s is the checkpoint it reads (or one of its shards): writing it would "
                    "destroy the checkpoint",
                    out);
        return 2;
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
    if (help) return consolidate(2, (char *[]){"consolidate", "--help", NULL}); /* its flag table */
    return dt_cli_usage("run 'dtrain ckpt consolidate DIR|FILE -o OUT'",
                        "ckpt: expected the subcommand consolidate%s%s", argc >= 2 ? ", got " : "",
                        argc >= 2 ? argv[1] : "");
}
