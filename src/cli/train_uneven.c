/* dtrain train: the uneven-worker flags (--strategy ps/localsgd, --servers, --staleness,
 * --sync-every, --balance, --slow, --ps-overlap): parsing into the train config, and the launcher layout of a
 * ps job (servers first, workers expendable). */
#include "cli/train_uneven.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int dt_cli_uneven_parse(const dt_cli_uneven *u, dt_train_config *cfg) {
    if (u->staleness && !dt_cli_is_ps(cfg))
        return dt_cli_usage("add --strategy ps, or drop --staleness",
                           "--staleness bounds how far ps workers run ahead: it needs --strategy ps");
    if (u->servers_given && !dt_cli_is_ps(cfg))
        return dt_cli_usage("add --strategy ps, or drop --servers", "--servers %d: only --strategy ps has servers",
                           cfg->servers);
    if (u->sync_every_given && !(cfg->strategy && !strcmp(cfg->strategy, "localsgd")))
        return dt_cli_usage("add --strategy localsgd, or drop --sync-every",
                           "--sync-every %d: only --strategy localsgd averages models periodically", cfg->sync_every);
    if (u->staleness) {
        if (!strcmp(u->staleness, "inf") || !strcmp(u->staleness, "async")) cfg->staleness = -1;
        else {
            char *end;
            errno = 0;
            long v = strtol(u->staleness, &end, 10);
            if (errno || *end || end == u->staleness || v < 0 || v > 1000000)
                return dt_cli_usage("use --staleness S (global batches, 0 = synchronous) or --staleness inf",
                                   "--staleness %s: not a whole number of batches", u->staleness);
            cfg->staleness = (int)v;
        }
    }
    if (u->balance) {
        bool dynamic = !strcmp(u->balance, "dynamic");
        if (!dynamic && strcmp(u->balance, "static") != 0 && strcmp(u->balance, "off") != 0)
            return dt_cli_usage("use --balance static or --balance dynamic", "--balance %s: unknown mode", u->balance);
        /* ps balances by handing out batches (the default); static: fixed shards */
        if (dt_cli_is_ps(cfg)) cfg->ps_fixed_shards = !dynamic;
        else cfg->balance = dynamic;
    }
    if (u->slow) {
        char *end;
        errno = 0;
        long r = strtol(u->slow, &end, 10);
        double f = *end == ':' ? strtod(end + 1, &end) : NAN;
        if (errno || *end || r < 0 || r > 1 << 20 || !(f >= 1) || !isfinite(f))
            return dt_cli_usage("use --slow RANK:FACTOR, e.g. --slow 3:3 makes rank 3 three times slower",
                               "--slow %s: expected RANK:FACTOR with FACTOR >= 1", u->slow);
        cfg->slow_rank = (int)r;
        cfg->slow_factor = (float)f;
    }
    if (cfg->ps_overlap && !dt_cli_is_ps(cfg))
        return dt_cli_usage("add --strategy ps (--staleness inf is its default), or drop --ps-overlap",
                           "--ps-overlap overlaps the push/pull of a ps worker: it needs --strategy ps");
    if (cfg->ps_overlap && cfg->ps_fixed_shards)
        return dt_cli_usage("drop --balance static (the workers must take batches from server 0), or drop --ps-overlap",
                           "--ps-overlap needs dynamic assignment: server 0 hands each worker one batch ahead");
    if (cfg->ps_overlap && cfg->staleness >= 0)
        return dt_cli_usage("use --staleness inf, or drop --ps-overlap",
                           "--ps-overlap with --staleness %d: overlap adds one step of staleness that the bound does "
                           "not count, so it runs only fully asynchronous", cfg->staleness);
    if (cfg->servers < 1)
        return dt_cli_usage("e.g. --strategy ps --servers 1 --workers 4", "--servers %d: need at least 1", cfg->servers);
    if (cfg->sync_every < 1)
        return dt_cli_usage("e.g. --strategy localsgd --sync-every 8", "--sync-every %d: need at least 1", cfg->sync_every);
    const char *st = cfg->strategy;
    if (st && strcmp(st, "ddp") && strcmp(st, "localsgd") && strcmp(st, "ps") && strcmp(st, "single"))
        return dt_cli_usage("use --strategy ddp, localsgd or ps", "--strategy %s: unknown strategy", st);
    if (dt_cli_is_ps(cfg) && (cfg->timeline || cfg->checkpoint_dir))
        return dt_cli_usage(cfg->timeline ? "drop --timeline, or use --strategy ddp/localsgd for a trace"
                                         : "use --save FILE (written after every epoch and on SIGTERM) and --resume FILE",
                           "--strategy ps does not support --%s yet", cfg->timeline ? "timeline" : "checkpoint-dir");
    return 0;
}

bool dt_cli_is_ps(const dt_train_config *cfg) { return cfg->strategy && !strcmp(cfg->strategy, "ps"); }

int dt_cli_job_ranks(const dt_train_config *cfg, int workers) {
    return dt_cli_is_ps(cfg) ? workers + cfg->servers : workers;
}

bool *dt_cli_expendable(const dt_train_config *cfg, int nranks) {
    if (!dt_cli_is_ps(cfg)) return NULL;
    bool *e = calloc((size_t)nranks, sizeof *e);
    for (int r = cfg->servers; e && r < nranks; r++) e[r] = true;
    return e;
}

