/* dtrain train: the pipeline-parallel flags. --pp K (stages), --microbatches M, --pp-schedule
 * gpipe|1f1b and --pp-split N1:N2:... become the options of --strategy pp(...); a flag that
 * repeats an option the spec already sets must agree with it. */
#include "cli/train_pp.h"

#include <stdio.h>
#include <string.h>

/* Adds key=value (from flag) to o->spec; 0 or the exit status. */
static int add(dt_cli_pp *o, const char *key, const char *value, const char *flag) {
    char out[sizeof o->spec];
    if (dt_strategy_spec_add_option(o->spec, key, value, out, sizeof out) != DT_OK)
        return dt_cli_usage("give the value once: as the flag or inside --strategy pp(KEY=VALUE,...)", "%s: %s", flag,
                            dt_last_error());
    memcpy(o->spec, out, sizeof out);
    return 0;
}

int dt_cli_pp_parse(dt_cli_pp *o, dt_train_config *cfg, int workers) {
    char name[64] = "";
    if (cfg->strategy && dt_strategy_spec_info(cfg->strategy, name, sizeof name, NULL) != DT_OK) name[0] = 0;
    const bool any = o->pp || o->microbatches || o->schedule || o->split;
    if (!any) return 0;
    if (cfg->strategy && !dt_strategy_spec_takes(name, "stages"))
        return dt_cli_usage(
            dt_strategy_spec_takes(name, "tp")
                ? "for stages of tensor-parallel shards use --tp K --pp P (or --strategy "
                  "pp(stages=P,tp=K)) with the pipeline flags"
                : "drop --strategy, or use --strategy pp",
            "--pp, --microbatches, --pp-schedule and --pp-split set pipeline parallelism; --strategy %s "
            "is another strategy",
            cfg->strategy);
    if (!cfg->strategy && !o->pp)
        return dt_cli_usage("e.g. --pp 2 --workers 2 --microbatches 4", "--microbatches, --pp-schedule and --pp-split "
                                                                        "need --pp K (the pipeline stages)");
    if (o->pp < 0 || (o->pp == 0 && !cfg->strategy))
        return dt_cli_usage("e.g. --pp 2 --workers 2", "--pp %d: need at least 1 stage", o->pp);
    if (o->microbatches < 0)
        return dt_cli_usage("e.g. --microbatches 8", "--microbatches %d: need at least 1", o->microbatches);
    if (o->pp > 0 && !dt_comm_env_is_rank() && workers % o->pp != 0)
        return dt_cli_usage("use --workers a multiple of --pp (the rest is data parallel: --workers 4 --pp 2 is "
                            "dp2 x pp2)",
                            "--pp %d with --workers %d: the ranks do not divide into pipelines of %d stages", o->pp,
                            workers, o->pp);
    snprintf(o->spec, sizeof o->spec, "%s", cfg->strategy ? cfg->strategy : "pp");
    char num[32], flag[200];
    int r = 0;
    if (o->pp > 0) {
        snprintf(num, sizeof num, "%d", o->pp), snprintf(flag, sizeof flag, "--pp %d", o->pp);
        r = add(o, "stages", num, flag);
    }
    if (!r && o->microbatches > 0) {
        snprintf(num, sizeof num, "%d", o->microbatches);
        snprintf(flag, sizeof flag, "--microbatches %d", o->microbatches);
        r = add(o, "microbatches", num, flag);
    }
    if (!r && o->schedule) {
        snprintf(flag, sizeof flag, "--pp-schedule %.100s", o->schedule);
        r = add(o, "schedule", o->schedule, flag);
    }
    if (!r && o->split) {
        snprintf(flag, sizeof flag, "--pp-split %.100s", o->split);
        r = add(o, "split", o->split, flag);
    }
    if (!r) cfg->strategy = o->spec;
    return r;
}

int dt_cli_pp_check_batch(const dt_train_config *cfg) {
    int tp = 1, pp = 1, M = 1;
    const char *schedule = NULL;
    if (!cfg->strategy || dt_strategy_spec_mesh(cfg->strategy, &tp, &pp, &M, &schedule) != DT_OK || pp < 2) return 0;
    const int per_step = cfg->batch * (cfg->grad_accum > 1 ? cfg->grad_accum : 1);
    if (M > per_step)
        return dt_cli_usage("use --microbatches at most the samples of a step, or a larger --batch",
                            "--microbatches %d with --batch %d%s: the pipeline cuts each step's %d samples into "
                            "micro-batches of at least one sample",
                            M, cfg->batch, cfg->grad_accum > 1 ? " x --grad-accum" : "", per_step);
    return 0;
}
