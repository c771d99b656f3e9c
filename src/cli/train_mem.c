/* dtrain train: the memory flags. --mem-limit BYTES is enforced per rank by the library's
 * allocation accounting (core/mem.c: every dt_alloc block, less the pages ZeRO gives back, plus
 * the pages a stage-3 gather takes again) from the moment the trainer holds its sharded state;
 * a later allocation or gather beyond it fails with an error naming the limit. --dry-run prints
 * the memory plan (dtrain/memplan.h) of every rank and exits. */
#include "cli/train_mem.h"
#include "cli/train_uneven.h"

#include "dtrain/dtrain.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dt_cli_mem_limit_parse(const char *text, size_t *bytes) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1024.0, end++;
    else if (*end == 'm' || *end == 'M') mul = 1048576.0, end++;
    else if (*end == 'g' || *end == 'G') mul = 1073741824.0, end++;
    if (errno || end == text || *end || !(v > 0) || v * mul > 1e18)
        return dt_cli_usage("e.g. --mem-limit 2G, --mem-limit 500M or --mem-limit 1000000000",
                            "--mem-limit %s: not a size in bytes (K, M, G suffixes allowed)", text);
    *bytes = (size_t)(v * mul);
    return 0;
}

int dt_cli_mem_limit_apply(size_t bytes, int rank) {
    if (!bytes || dt_mem_set_limit(bytes) == DT_OK) return 0;
    dt_cli_fail("the plan of each rank: dtrain train --dry-run with the same flags", "rank %d: %s", rank,
                dt_last_error());
    return 78;
}

static void row(const char *what, double b) { printf("  %-12s %14.0f bytes  %10.2f MB\n", what, b, b / 1048576.0); }

/* The layout of the run's strategy (dp x tp x pp, the pipeline's micro-batches); 0 or the exit status. */
static int plan_layout(const dt_train_config *c, int ranks, int zero, double bucket_mb, dt_mem_layout *l) {
    int tp = 1, pp = 1, M = 1;
    const char *schedule = NULL;
    if (c->strategy && dt_strategy_spec_mesh(c->strategy, &tp, &pp, &M, &schedule) != DT_OK)
        return dt_cli_usage(NULL, "%s", dt_last_error());
    if (ranks % (tp * pp) != 0)
        return dt_cli_usage("use --workers a multiple of tp x pp (the rest is data parallel)",
                            "--dry-run: --tp %d x --pp %d = %d ranks per model copy do not divide the %d ranks", tp, pp,
                            tp * pp, ranks);
    const int accum = c->grad_accum > 1 ? c->grad_accum : 1, dp = ranks / (tp * pp);
    /* a pipeline cuts the rank-batch into M micro-batches; --grad-accum runs micro-batches of --batch */
    *l = (dt_mem_layout){.dp = dp,
                         .tp = tp,
                         .pp = pp,
                         .zero = dp > 1 ? zero : 0,
                         .microbatches = pp > 1 ? M : accum,
                         .schedule = schedule,
                         .batch = pp > 1 ? (c->batch + M - 1) / M : c->batch,
                         .bucket_mb = bucket_mb,
                         .device = c->device && strcmp(c->device, "cpu") != 0};
    return 0;
}

int dt_cli_dry_run(const dt_train_config *c, int ranks, int zero, double bucket_mb, size_t mem_limit) {
    if (dt_cli_is_ps(c))
        return dt_cli_usage("run it with --mem-limit to see what each rank holds",
                            "--dry-run plans ddp, ZeRO, tp and pp layouts, not --strategy ps (its servers hold a "
                            "shard of the parameters and the optimizer state each, its workers a replica without "
                            "optimizer state)");
    dt_mem_layout l;
    int r = plan_layout(c, ranks, zero, bucket_mb, &l);
    if (r) return r;
    dt_model *m;
    dt_status s = dt_train_plan_model(c, &m);
    if (s != DT_OK) {
        dt_cli_fail("check --model and --data", "%s", dt_last_error());
        return dt_cli_setup_status(s);
    }
    /* each rank's loader reads a shuffled feature set from a private huge-page copy (charged) */
    size_t copy = 0;
    if ((s = dt_train_plan_loader(c, &copy)) != DT_OK) {
        dt_model_destroy(m);
        dt_cli_fail("check --data and --val-split", "%s", dt_last_error());
        return dt_cli_setup_status(s);
    }
    const size_t P = dt_model_num_params(m);
    /* whether the run reads the whole model: checkpoints; evaluation (image data has a test set,
     * text data a validation part unless --val-fraction 0) only where ZeRO-3 shards the data-parallel
     * axis, else tp and pp evaluate on their shards */
    const bool text = c->data && (!strncmp(c->data, "text:", 5) || !strcmp(c->data, "kjv"));
    const bool evals = (!text || c->val_fraction > 0) && l.zero >= 3 && l.dp > 1;
    const bool syncs = evals || c->save || c->save_weights || c->checkpoint_every > 0;
    printf("dtrain: dry run: model %s, %zu parameters, %d rank%s (dp %d x pp %d x tp %d; rank = (dp_i*%d + stage)*%d "
           "+ tp_i), ZeRO stage %d, batch %d x %d micro-batch%s%s%s, %s\n",
           dt_model_spec(m), P, ranks, ranks > 1 ? "s" : "", l.dp, l.pp, l.tp, l.pp, l.tp, l.zero, l.batch,
           l.microbatches, l.microbatches > 1 ? "es" : "", l.schedule ? ", schedule " : "",
           l.schedule ? l.schedule : "", dt_optim_name(c->optim.kind));
    int over = 0;
    char over_ranks[160] = "";
    for (int k = 0; k < ranks; k++) {
        dt_mem_plan p;
        if (dt_mem_plan_rank(m, &c->optim, &l, k, &p) != DT_OK) {
            dt_model_destroy(m);
            return dt_cli_usage(NULL, "%s", dt_last_error());
        }
        printf("rank %d (dp %d, stage %d, tp %d):\n", k, p.dp_rank, p.stage, p.tp_rank);
        row("parameters", p.params), row("gradients", p.grads), row("optimizer", p.optim);
        if (p.gathered > 0) row("gathered", p.gathered);
        if (p.staging > 0) row("host staging", p.staging);
        row("activations", p.activations);
        if (copy) row("loader copy", (double)copy);
        row("total", p.total + (double)copy);
        if (p.sync > 0) row(syncs ? "at eval/ckpt" : "(eval/ckpt)", p.total + (double)copy + p.sync);
        if (mem_limit && p.total + (double)copy + (syncs ? p.sync : 0) > (double)mem_limit) {
            size_t n = strlen(over_ranks);
            if (n + 16 < sizeof over_ranks)
                snprintf(over_ranks + n, sizeof over_ranks - n, "%s%d", over ? ", " : "", k);
            else if (!strstr(over_ranks, "...")) snprintf(over_ranks + n, sizeof over_ranks - n, ", ...");
            over++;
        }
    }
    if (syncs && l.tp * l.pp > 1 && !(l.tp > 1 && l.pp > 1))
        printf("dtrain: checkpoints (and evaluation under --zero 3) gather the whole model on each rank (the 'at "
               "eval/ckpt' rows); without --save, --save-weights and checkpoints they do not\n");
    if (copy)
        printf("dtrain: 'loader copy': each rank reads its shuffled samples from a private copy of the training set "
               "on huge pages (where madvise allows them)\n");
    if (mem_limit && !over) printf("dtrain: --mem-limit %zu bytes: every rank fits\n", mem_limit);
    else if (mem_limit)
        dt_cli_fail("raise --mem-limit, or spread the model further (--zero 3, --tp, --pp, more --workers)",
                    "--mem-limit %zu bytes: %d of %d rank%s would exceed it (rank%s %s)", mem_limit, over, ranks,
                    ranks == 1 ? "" : "s", over == 1 ? "" : "s", over_ranks);
    dt_model_destroy(m);
    return over ? 78 : 0; /* as the run itself would stop */
}
