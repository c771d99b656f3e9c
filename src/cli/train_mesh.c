/* dtrain train's model-parallel flags: --tp K makes the strategy tp(tp=K), and with --pp P (whose
 * flags made pp(stages=P,...)) pp(stages=P,...,tp=K): pipeline stages of tensor-parallel shards
 * (the mesh: TP innermost, then PP, then DP; rank = (dp_i*PP + pp_i)*TP + tp_i). */
#include "cli/train_mesh.h"
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static char g_spec[512];

int dt_cli_mesh_parse(int tp, int zero, dt_train_config *cfg) {
    if (tp == 0) return 0;
    if (tp < 1 || tp > 4096) return dt_cli_usage("e.g. --tp 2 --workers 4", "--tp %d: need 1 to 4096 ranks", tp);
    char name[64] = "", num[16];
    if (cfg->strategy && dt_strategy_spec_info(cfg->strategy, name, sizeof name, NULL) != DT_OK)
        return dt_cli_usage(NULL, "%s", dt_last_error());
    const bool pp = !strcmp(name, "pp");  /* --tp a --pp b: pipeline stages of tensor-parallel shards */
    if (cfg->strategy && !pp && strcmp(name, "tp") != 0)
        return dt_cli_usage("drop --strategy (or use --strategy tp(...)): --tp is the tp strategy",
                            "--tp %d with --strategy %s: tensor parallelism is its own strategy (its other ranks are "
                            "data parallel)", tp, cfg->strategy);
    snprintf(num, sizeof num, "%d", tp);
    if (dt_strategy_spec_add_option(cfg->strategy ? cfg->strategy : "tp", "tp", num, g_spec, sizeof g_spec) != DT_OK)
        return dt_cli_usage(pp ? "give the value once: as --tp or inside --strategy pp(tp=K)"
                               : "give the value once: as --tp or inside --strategy tp(tp=K)",
                            "--tp %d: %s", tp, dt_last_error());
    cfg->strategy = g_spec;
    if (zero < 0) return 0;
    if (pp)
        return dt_cli_usage("use --zero 1, 2 or 3 with --tp alone (dp x tp), --zero with plain ddp, or drop --zero",
                            "--zero %d with --tp %d --pp: ZeRO does not shard a pipeline's stages yet", zero, tp);
    char with_zero[sizeof g_spec];
    snprintf(num, sizeof num, "%d", zero);
    if (dt_strategy_spec_add_option(g_spec, "zero", num, with_zero, sizeof with_zero) != DT_OK)
        return dt_cli_usage("give the value once: as --zero or inside --strategy tp(zero=N)", "--zero %d: %s", zero,
                            dt_last_error());
    memcpy(g_spec, with_zero, sizeof g_spec);
    return 0;
}
