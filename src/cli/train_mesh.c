/* dtrain train's model-parallel flags: --tp K makes the strategy tp(tp=K), and with --pp P (whose
 * flags made pp(stages=P,...)) pp(stages=P,...,tp=K): pipeline stages of tensor-parallel shards
 * (the mesh: TP innermost, then PP, then DP; rank = (dp_i*PP + pp_i)*TP + tp_i). --zero N goes
 * into either spec. */
#include "cli/train_mesh.h"
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static char g_spec[512];

/* Adds key=value (flag "--flag value") to g_spec; 0 or the exit status. */
static int add_tp_option(const char *key, const char *value, const char *flag) {
    char out[sizeof g_spec];
    if (dt_strategy_spec_add_option(g_spec, key, value, out, sizeof out) != DT_OK)
        return dt_cli_usage("give the value once: as the flag or inside --strategy tp(KEY=VALUE,...)", "%s %s: %s",
                            flag, value, dt_last_error());
    memcpy(g_spec, out, sizeof g_spec);
    return 0;
}

int dt_cli_mesh_parse(const dt_cli_mesh_flags *f, dt_train_config *cfg) {
    const int tp = f->tp, zero = f->zero;
    if (tp == 0) return 0;
    if (tp < 1 || tp > 4096) return dt_cli_usage("e.g. --tp 2 --workers 4", "--tp %d: need 1 to 4096 ranks", tp);
    char name[64] = "", num[16];
    if (cfg->strategy && dt_strategy_spec_info(cfg->strategy, name, sizeof name, NULL) != DT_OK)
        return dt_cli_usage(NULL, "%s", dt_last_error());
    const bool pp = name[0] && dt_strategy_spec_takes(
                                   name, "stages"); /* --tp a --pp b: pipeline stages of tensor-parallel shards */
    if (f->implicit_ddp)
        return dt_cli_usage("drop --compress and --allreduce (only --zero and --bucket-mb apply to tp's "
                            "data-parallel axis)",
                            "--tp %d with --compress or --allreduce: those shape ddp's gradient allreduce; tensor "
                            "parallelism runs its own collectives",
                            tp);
    if (cfg->strategy && !dt_strategy_spec_takes(name, "tp"))
        return dt_cli_usage("drop --strategy (or use --strategy tp(...)): --tp is the tp strategy",
                            "--tp %d with --strategy %s: tensor parallelism is its own strategy (its other ranks are "
                            "data parallel)",
                            tp, cfg->strategy);
    snprintf(num, sizeof num, "%d", tp);
    if (dt_strategy_spec_add_option(cfg->strategy ? cfg->strategy : "tp", "tp", num, g_spec, sizeof g_spec) != DT_OK)
        return dt_cli_usage(pp ? "give the value once: as --tp or inside --strategy pp(tp=K)"
                               : "give the value once: as --tp or inside --strategy tp(tp=K)",
                            "--tp %d: %s", tp, dt_last_error());
    cfg->strategy = g_spec;
    if (pp && f->bucket_mb > 0)
        return dt_cli_usage("drop --bucket-mb (a pipeline averages each stage's gradients in one allreduce)",
                            "--bucket-mb %g with --tp %d --pp: the pipeline has no gradient buckets", f->bucket_mb, tp);
    int r = 0;
    if (zero >= 0) {
        snprintf(num, sizeof num, "%d", zero);
        r = add_tp_option("zero", num, "--zero");
        /* the pipeline's own check of the stage before any rank starts */
        if (!r && pp && dt_strategy_spec_info(g_spec, NULL, 0, NULL) != DT_OK)
            return dt_cli_usage(NULL, "%s", dt_last_error());
    }
    if (!r && f->bucket_mb > 0) {
        char mb[32];
        snprintf(mb, sizeof mb, "%g", f->bucket_mb);
        r = add_tp_option("bucket_mb", mb, "--bucket-mb");
    }
    return r;
}
