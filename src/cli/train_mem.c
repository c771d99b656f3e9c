/* dtrain train: the memory flags. --mem-limit BYTES is enforced per rank by the library's
 * allocation accounting (core/mem.c: every dt_alloc block, less the pages ZeRO gives back, plus
 * the pages a stage-3 gather takes again) from the moment the trainer holds its sharded state;
 * a later allocation or gather beyond it fails with an error naming the limit. --dry-run prints
 * the memory plan (dtrain/memplan.h) of every rank and exits. */
#include "cli/train_mem.h"

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

/* The value of option key ("stages=") in a canonical strategy spec, or dflt. */
static int spec_int(const char *canon, const char *key, int dflt) {
    const char *at = strstr(canon, key);
    return at ? atoi(at + strlen(key)) : dflt;
}

/* The tensor and pipeline axes of --strategy (tp(tp=K,pp=P) or pp(stages=K,...)); 1 and 1 else. */
static void model_axes(const dt_train_config *c, dt_mem_layout *l) {
    char canon[512];
    if (!c->strategy || dt_strategy_spec_canonical(c->strategy, canon, sizeof canon) != DT_OK) return;
    if (!strncmp(canon, "tp(", 3)) l->tp = spec_int(canon, "(tp=", 1), l->pp = spec_int(canon, ",pp=", 1);
    if (!strncmp(canon, "pp(", 3)) {
        l->pp = spec_int(canon, "(stages=", 1), l->microbatches = spec_int(canon, ",microbatches=", l->pp);
        l->schedule = strstr(canon, "schedule=gpipe") ? "gpipe" : "1f1b";
        l->batch = l->batch / l->microbatches > 0 ? l->batch / l->microbatches : 1;  /* one micro-batch */
    }
    if (l->tp * l->pp > 0 && l->dp % (l->tp * l->pp) == 0) l->dp /= l->tp * l->pp;
    else l->tp = l->pp = 1;  /* the strategy refuses the job: plan it data parallel */
}

static void row(const char *what, double b) { printf("  %-12s %14.0f bytes  %10.2f MB\n", what, b, b / 1048576.0); }

int dt_cli_dry_run(const dt_train_config *c, int ranks, int zero, double bucket_mb, size_t mem_limit) {
    dt_model *m;
    dt_status s = dt_train_plan_model(c, &m);
    if (s != DT_OK) {
        dt_cli_fail("check --model and --data", "%s", dt_last_error());
        return dt_cli_setup_status(s);
    }
    const int accum = c->grad_accum > 1 ? c->grad_accum : 1;
    dt_mem_layout l = {.dp = ranks, .tp = 1, .pp = 1, .zero = ranks > 1 ? zero : 0, .microbatches = accum,
                       .batch = c->batch, .bucket_mb = bucket_mb};
    model_axes(c, &l);
    const size_t P = dt_model_num_params(m);
    if (l.tp * l.pp > 1) printf("dtrain: dry run: tp %d x pp %d x dp %d\n", l.tp, l.pp, l.dp);
    printf("dtrain: dry run: model %s, %zu parameters, %d rank%s, ZeRO stage %d, batch %d x %d micro-batch%s, %s\n",
           dt_model_spec(m), P, ranks, ranks > 1 ? "s" : "", l.zero, c->batch, accum, accum > 1 ? "es" : "",
           dt_optim_name(c->optim.kind));
    int over = 0;
    for (int r = 0; r < ranks; r++) {
        dt_mem_plan p;
        if (dt_mem_plan_rank(m, &c->optim, &l, r, &p) != DT_OK) {
            dt_model_free(m);
            return dt_cli_usage(NULL, "%s", dt_last_error());
        }
        printf("rank %d:\n", r);
        row("parameters", p.params), row("gradients", p.grads), row("optimizer", p.optim);
        if (p.gathered > 0) row("gathered", p.gathered);
        row("activations", p.activations), row("total", p.total);
        if (mem_limit && p.total > (double)mem_limit) over++;
    }
    if (mem_limit)
        printf("dtrain: --mem-limit %zu bytes: %s\n", mem_limit,
               over ? "some ranks would exceed it" : "every rank fits");
    dt_model_free(m);
    return 0;
}
