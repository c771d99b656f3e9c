/* dtrain train: the strategy spec and the flags that set its options (--servers, --staleness,
 * --sync-every, --balance for ps, --ps-overlap, --bucket-mb), the uneven-worker flags (--balance,
 * --slow), and the launcher layout of a ps job (servers first, workers expendable). */
#include "cli/train_uneven.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The strategy's name of a spec ("" when NULL or bad). */
static void spec_name(const char *spec, char *name, size_t cap) {
    name[0] = 0;
    if (spec && dt_strategy_spec_info(spec, name, cap, NULL) != DT_OK) name[0] = 0;
}

/* The hint of a bad spec: every strategy's syntax on one line. */
static const char *spec_hint(void) {
    static char hint[1024];
    size_t k = (size_t)snprintf(hint, sizeof hint, "--strategy NAME or NAME(KEY=VALUE,...): ");
    for (const char *h = dt_strategy_spec_help(); *h && k + 3 < sizeof hint; h++)
        if (*h != '\n') hint[k++] = *h;
        else if (h[1]) hint[k++] = ',', hint[k++] = ' ';
    hint[k] = 0;
    return hint;
}

/* Adds key=value of flag (as "--flag text") to u->spec (from base); 0 or the exit status. */
static int add_option(dt_cli_uneven *u, const char *base, const char *key, const char *value, const char *flag) {
    char out[sizeof u->spec];
    if (dt_strategy_spec_add_option(base, key, value, out, sizeof out) != DT_OK)
        return dt_cli_usage("give the value once: as the flag or inside --strategy NAME(KEY=VALUE,...)", "%s: %s", flag,
                            dt_last_error());
    memcpy(u->spec, out, sizeof out);
    return 0;
}

/* Whether the strategy named takes option key ("" = none named yet: the flag makes it ddp). */
static bool takes(const char *name, const char *key) { return !name[0] || dt_strategy_spec_takes(name, key); }

static bool is_class(const char *name, dt_strategy_class c) {
    dt_strategy_class k;
    const bool ok = name[0] && dt_strategy_spec_class(name, &k) == DT_OK;
    dt_error_clear();
    return ok && k == c;
}

/* The options that only ps (a strategy with servers) or localsgd takes: flag-named messages. */
static int check_server_flags(const dt_cli_uneven *u, const char *name) {
    char who[128];
    const bool named = name[0] != 0;
    if (u->staleness && (!named || !dt_strategy_spec_takes(name, "staleness")))
        return dt_cli_usage("add --strategy ps, or drop --staleness",
                            "--staleness bounds how far ps workers run ahead: it needs --strategy %s",
                            dt_strategy_takers("staleness", "or", who, sizeof who));
    if (u->servers_given && (!named || !dt_strategy_spec_takes(name, "servers")))
        return dt_cli_usage("add --strategy ps, or drop --servers", "--servers %d: only --strategy %s has servers",
                            u->servers, dt_strategy_takers("servers", "or", who, sizeof who));
    if (u->sync_every_given && (!named || !dt_strategy_spec_takes(name, "sync_every")))
        return dt_cli_usage("add --strategy localsgd, or drop --sync-every",
                            "--sync-every %d: only --strategy %s averages models periodically", u->sync_every,
                            dt_strategy_takers("sync_every", "or", who, sizeof who));
    if (u->overlap && (!named || !dt_strategy_spec_takes(name, "overlap")))
        return dt_cli_usage("add --strategy ps (--staleness inf is its default), or drop --ps-overlap",
                            "--ps-overlap overlaps the push/pull of a ps worker: it needs --strategy %s",
                            dt_strategy_takers("overlap", "or", who, sizeof who));
    return 0;
}

/* Checks the strategy flags against the strategy named (flag-named messages); what each strategy
 * takes comes from its registry entry. */
static int check_flags(const dt_cli_uneven *u, const char *name) {
    char who[128];
    int r = check_server_flags(u, name);
    if (r) return r;
    if (u->bucket_mb < 0)
        return dt_cli_usage(NULL, "--bucket-mb %g: must not be negative (0 = default 1)", u->bucket_mb);
    /* tensor and pipeline parallelism: the hint is to drop the flag, not to switch strategy */
    const bool mp = is_class(name, DT_STRATEGY_MODEL_PARALLEL);
    if (u->bucket_mb > 0 && !takes(name, "bucket_mb"))
        return dt_cli_usage(mp ? "drop --bucket-mb (a pipeline averages each stage's gradients in one allreduce)"
                               : "add --strategy ddp, or drop --bucket-mb",
                            "--bucket-mb %g: only %s have gradient buckets (tp: over its data-parallel axis)",
                            u->bucket_mb, dt_strategy_takers("bucket_mb", "and", who, sizeof who));
    if (u->compress && !takes(name, "compress"))
        return dt_cli_usage(mp ? "drop --compress (tensor and pipeline parallelism send activations and partial sums, "
                                 "which are not compressed)"
                               : "add --strategy ddp or --strategy localsgd, or drop --compress",
                            "--compress %s: only %s compress what they send", u->compress,
                            dt_strategy_takers("compress", "and", who, sizeof who));
    if (u->allreduce && !takes(name, "allreduce"))
        return dt_cli_usage(mp ? "drop --allreduce (tensor and pipeline parallelism run their own collectives)"
                               : "add --strategy ddp, or drop --allreduce",
                            "--allreduce %s: only %s allreduces gradients", u->allreduce,
                            dt_strategy_takers("allreduce", "and", who, sizeof who));
    if (u->zero_given && (u->zero < 0 || u->zero > 3))
        return dt_cli_usage("e.g. --zero 2", "--zero %d: the ZeRO stage is 0, 1, 2 or 3", u->zero);
    if (u->zero_given && !takes(name, "zero"))
        return dt_cli_usage("use --strategy ddp, --tp K (ZeRO 1-3 over the mesh's dp axis) or --pp K (ZeRO 1-3), or "
                            "drop --zero",
                            "--zero %d: only --strategy %s shard with ZeRO (tp and pp over their dp "
                            "axis); --strategy %s does not",
                            u->zero, dt_strategy_takers("zero", "and", who, sizeof who), name);
    if (u->overlap && u->balance && strcmp(u->balance, "dynamic") != 0)
        return dt_cli_usage("drop --balance static (the workers must take batches from server 0), or drop --ps-overlap",
                            "--ps-overlap needs dynamic assignment: server 0 hands each worker one batch ahead");
    if (u->servers_given && u->servers < 1)
        return dt_cli_usage("e.g. --strategy ps --servers 1 --workers 4", "--servers %d: need at least 1", u->servers);
    if (u->sync_every_given && u->sync_every < 1)
        return dt_cli_usage("e.g. --strategy localsgd --sync-every 8", "--sync-every %d: need at least 1",
                            u->sync_every);
    return 0;
}

/* --staleness S|inf: "inf" or the number (*bound: -1 for inf); 0 or the exit status. */
static int parse_staleness(const char *text, int *bound) {
    *bound = -1;
    if (!strcmp(text, "inf") || !strcmp(text, "async")) return 0;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < 0 || v > 1000000)
        return dt_cli_usage("use --staleness S (global batches, 0 = synchronous) or --staleness inf",
                            "--staleness %s: not a whole number of batches", text);
    *bound = (int)v;
    return 0;
}

/* add_option for a flag given as "FLAG VALUE" on the command line (messages name it so). */
static int add_flag(dt_cli_uneven *u, const char *key, const char *value, const char *flag) {
    char given[128];
    snprintf(given, sizeof given, "%s %.60s", flag, value);
    return add_option(u, u->spec, key, value, given);
}

static int add_int_flag(dt_cli_uneven *u, const char *key, int value, const char *flag) {
    char num[16];
    snprintf(num, sizeof num, "%d", value);
    return add_flag(u, key, num, flag);
}

/* The strategy flags into the spec u->spec (from cfg->strategy); 0 or the exit status. */
static int compose_spec(dt_cli_uneven *u, dt_train_config *cfg, const char *name) {
    const bool shards = name[0] && dt_strategy_spec_takes(name, "shards"); /* ps: --balance sets its shards */
    char num[64];
    int r = 0;
    u->implicit_ddp = !cfg->strategy &&
                      (u->bucket_mb > 0 || u->compress || u->allreduce || u->zero_given || u->balance);
    snprintf(u->spec, sizeof u->spec, "%s",
             cfg->strategy     ? cfg->strategy
             : u->implicit_ddp ? dt_strategy_spec_default(2)
                               : "");
    if (u->servers_given && !r) r = add_int_flag(u, "servers", u->servers, "--servers");
    if (u->staleness && !r) r = add_flag(u, "staleness", u->staleness, "--staleness");
    /* ps balances by handing out batches (its shards=; static: fixed shards), ddp and localsgd by
     * cutting each global batch (their balance=) */
    if (shards && u->balance && !r)
        r = add_option(u, u->spec, "shards", strcmp(u->balance, "dynamic") ? "fixed" : "dynamic", "--balance");
    else if (u->balance && !r)
        r = add_flag(u, "balance", strcmp(u->balance, "dynamic") ? "static" : "dynamic", "--balance");
    if (u->overlap && !r) r = add_option(u, u->spec, "overlap", "1", "--ps-overlap");
    if (u->sync_every_given && !r) r = add_int_flag(u, "sync_every", u->sync_every, "--sync-every");
    if (u->bucket_mb > 0 && !r) {
        snprintf(num, sizeof num, "%g", u->bucket_mb);
        r = add_flag(u, "bucket_mb", num, "--bucket-mb");
    }
    if (u->compress && !r) r = add_flag(u, "compress", u->compress, "--compress");
    if (u->allreduce && !r) r = add_flag(u, "allreduce", u->allreduce, "--allreduce");
    if (u->zero_given && !r) r = add_int_flag(u, "zero", u->zero, "--zero");
    if (!r && u->spec[0]) cfg->strategy = u->spec;
    return r;
}

int dt_cli_uneven_parse(dt_cli_uneven *u, dt_train_config *cfg) {
    char name[64] = "";
    if (cfg->strategy && dt_strategy_spec_info(cfg->strategy, name, sizeof name, NULL) != DT_OK)
        return dt_cli_usage(spec_hint(), "%s", dt_last_error());
    int r = check_flags(u, name);
    if (r) return r;
    int bound = -1;
    if (u->staleness && (r = parse_staleness(u->staleness, &bound)) != 0) return r;
    if (u->overlap && bound >= 0)
        return dt_cli_usage("use --staleness inf, or drop --ps-overlap",
                            "--ps-overlap with --staleness %d: overlap adds one step of staleness that the bound does "
                            "not count, so it runs only fully asynchronous",
                            bound);
    if (u->balance) {
        bool dynamic = !strcmp(u->balance, "dynamic");
        if (!dynamic && strcmp(u->balance, "static") != 0 && strcmp(u->balance, "off") != 0)
            return dt_cli_usage("use --balance static or --balance dynamic", "--balance %s: unknown mode", u->balance);
        (void)dynamic; /* compose_spec puts it in the spec: ps's shards=, ddp's and localsgd's balance= */
    }
    if (u->slow) {
        char *end;
        errno = 0;
        long rk = strtol(u->slow, &end, 10);
        double f = *end == ':' ? strtod(end + 1, &end) : NAN;
        if (errno || *end || rk < 0 || rk > 1 << 20 || !(f >= 1) || !isfinite(f))
            return dt_cli_usage("use --slow RANK:FACTOR, e.g. --slow 3:3 makes rank 3 three times slower",
                                "--slow %s: expected RANK:FACTOR with FACTOR >= 1", u->slow);
        u->aids = (dt_train_aids){.slow_rank = (int)rk, .slow_factor = (float)f};
        cfg->aids = &u->aids;
    }
    if (u->compress) { /* a bad compressor: its own message and hint, not the strategy grammar */
        char probe[160];
        if (strpbrk(u->compress, "(),") || strlen(u->compress) > 120)
            return dt_cli_usage("e.g. --compress topk:0.01, --compress powersgd:2 or --compress fp16",
                                "--compress %.120s: not a compressor (NAME or NAME:ARGS, with no '(', ')' or ',')",
                                u->compress);
        snprintf(probe, sizeof probe, "ddp(compress=%s)", u->compress);
        if (dt_strategy_spec_info(probe, NULL, 0, NULL) != DT_OK)
            return dt_cli_usage("e.g. --compress topk:0.01, --compress powersgd:2 or --compress fp16", "%s",
                                dt_last_error());
    }
    if ((r = compose_spec(u, cfg, name)) != 0) return r;
    if (cfg->strategy && dt_strategy_spec_info(cfg->strategy, NULL, 0, NULL) != DT_OK) /* the rules between options */
        return dt_cli_usage(spec_hint(), "%s", dt_last_error());
    if (dt_cli_is_ps(cfg) && (cfg->timeline || cfg->checkpoint_dir))
        return dt_cli_usage(cfg->timeline
                                ? "drop --timeline, or use --strategy ddp/localsgd for a trace"
                                : "use --save FILE (written after every epoch and on SIGTERM) and --resume FILE",
                            "--strategy ps does not support --%s yet", cfg->timeline ? "timeline" : "checkpoint-dir");
    return 0;
}

bool dt_cli_is_ps(const dt_train_config *cfg) {
    char name[64];
    spec_name(cfg->strategy, name, sizeof name);
    return is_class(name, DT_STRATEGY_SERVERS);
}

int dt_cli_servers(const dt_train_config *cfg) {
    int servers = 0;
    if (cfg->strategy && dt_strategy_spec_info(cfg->strategy, NULL, 0, &servers) != DT_OK) servers = 0;
    return servers;
}

int dt_cli_job_ranks(const dt_train_config *cfg, int workers) { return workers + dt_cli_servers(cfg); }

bool *dt_cli_expendable(const dt_train_config *cfg, int nranks) {
    if (!dt_cli_is_ps(cfg)) return NULL;
    bool *e = calloc((size_t)nranks, sizeof *e);
    for (int r = dt_cli_servers(cfg); e && r < nranks; r++) e[r] = true;
    return e;
}
