/* dtrain plan: chooses the parallel layout of a training run, predicts its step time and memory per
 * rank, and says why. The cluster is a --cluster FILE (examples/clusters/) or this host: its per-op
 * times measured at the shapes in question each time, its collective bandwidth and latency and its
 * memory bandwidth measured by --probe and cached (plan_probe.c), the links measured again at the
 * model's size by each plan of a probed host; --hosts H --inter-gbit X splits this host's ranks
 * into emulated hosts (scripts/netns-hosts). --consider adds the layouts that change the algorithm
 * (top-k, PowerSGD, localsgd, ps). The table, the alternatives' one-line reasons and --json come
 * from the planner (src/plan/). `--strategy auto` for train uses dt_cli_plan_choose. */
#include "cli/cli.h"
#include "cli/cmd_plan.h"
#include "cli/train_mem.h"
#include "dtrain/dtrain.h"
#include "plan/plan.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char PLAN_USAGE[] =
    "Usage: dtrain plan [--model SPEC] [--data DIR] --batch G [--workers N | --cluster FILE [--hosts H]\n"
    "                   [--ranks-per-host R]] [--optimizer NAME] [--precision P[,P]] [--mem-limit BYTES]\n"
    "                   [--tp K] [--pp K] [--zero N] [--consider LIST] [--top K] [--json] [--probe]\n\n"
    "Scores every layout dtrain can run for the model at global batch G (samples per optimizer step)\n"
    "on the cluster: DP x TP x PP degrees, ZeRO stage, pipeline micro-batches and schedule, gradient\n"
    "accumulation, ddp compression, precision and bucket size (with --consider: top-k and PowerSGD\n"
    "compression, localsgd and ps, which change the training algorithm). Layouts whose fullest rank would hold\n"
    "more than --mem-limit (default: the cluster's memory per rank) are pruned, by the memory model of\n"
    "dtrain train --dry-run. Prints the fastest as a table (step time split into compute, exposed\n"
    "communication, pipeline bubble and optimizer; memory per rank; the flags that run it) and why the\n"
    "common alternatives lose. --tp/--pp/--zero fix an axis.\n\n"
    "Without --cluster the cluster is this host with --workers N ranks: each node's time is measured\n"
    "here at the batch sizes the layouts run; --probe also measures the collectives' bandwidth and\n"
    "latency between N local ranks and the memory bandwidth, and caches them (DTRAIN_PLAN_CACHE, default\n"
    "~/.cache/dtrain) for later plans and --strategy auto, with the per-op times at this plan's shapes\n"
    "(a later plan of the same model, data, batch, ranks, precision and CPU uses them; --measure-ops\n"
    "measures again).\n\n"
    "Example: dtrain plan --model gpt --data kjv --batch 48 --cluster examples/clusters/dgx-a100.json --hosts 2";

typedef struct {
    const char *model, *data, *cluster, *optimizer, *precision, *mem_limit_text, *consider;
    int batch, workers, hosts, rph, tp, pp, zero, top, threads;
    float momentum, val_fraction, inter_gbit, inter_lat_us;
    bool json, probe, no_calibrate, measure_ops, saves;
} plan_args;

/* --consider LIST: topk, powersgd, localsgd, ps or all into the request's mask. */
static int algo_mask(const char *text, int *mask) {
    static const char *const names[] = {"topk", "powersgd", "localsgd", "ps"};
    char buf[128];
    snprintf(buf, sizeof buf, "%s", text ? text : "");
    *mask = 0;
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < 4 && strcmp(t, names[k])) k++;
        if (!strcmp(t, "all")) *mask |= 15;
        else if (k == 4)
            return dt_cli_usage("e.g. --consider topk,localsgd or --consider all",
                                "--consider %s: not "
                                "topk, powersgd, localsgd, ps or all",
                                t);
        else *mask |= 1 << k;
    }
    return 0;
}

static int prec_mask(const char *text, int *mask) {
    static const char *const names[] = {"fp32", "bf16", "fp16"};
    char buf[64];
    snprintf(buf, sizeof buf, "%s", text);
    *mask = 0;
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < 3 && strcmp(t, names[k])) k++;
        if (k == 3)
            return dt_cli_usage("e.g. --precision fp32 or --precision fp32,bf16",
                                "--precision %s: not fp32, "
                                "bf16 or fp16",
                                t);
        *mask |= 1 << k;
    }
    return *mask ? 0 : dt_cli_usage("e.g. --precision fp32", "--precision '%s': empty", text);
}

/* The cluster of the plan: the file, or this host with measured figures (cached probe) or defaults. */
static int load_cluster(const plan_args *a, dt_plan_cluster *c, char *source, size_t cap, bool *probed) {
    *probed = false;
    if (a->cluster) {
        if (dt_plan_cluster_load(a->cluster, c) != DT_OK)
            return dt_cli_fail("fix the field named, or start from a file in examples/clusters/", "%s",
                               dt_last_error());
        if (a->hosts > 0) c->hosts = a->hosts;
        if (a->rph > 0) c->ranks_per_host = a->rph;
        if (c->hosts > 1 && c->link[DT_PLAN_INTER].bw <= 0)
            return dt_cli_usage("add links.inter to the cluster file",
                                "--hosts %d: cluster file %s has no "
                                "links.inter",
                                c->hosts, a->cluster);
        snprintf(source, cap, "%s (%s)", c->name, a->cluster);
        return 0;
    }
    int r = a->probe ? dt_cli_plan_probe(a->workers, c) : 0;
    if (r) return r;
    const bool cached = dt_cli_plan_host_cluster(a->workers, c);
    *probed = cached;
    int n = snprintf(source, cap, "this host, %d rank%s (%s)", a->workers, a->workers > 1 ? "s" : "",
                     cached ? "measured by dtrain plan --probe; links at the model's size now"
                            : "defaults; dtrain plan --probe measures them");
    if (a->hosts > 1) { /* emulated hosts on this machine (scripts/netns-hosts): the declared link between them */
        c->hosts = a->hosts, c->ranks_per_host = a->workers / a->hosts;
        /* MPI over TCP between them (netns-hosts): its reduce-scatter is not a ring; it is costed at 2x a
         * ring's (docs/plan.md) */
        c->link[DT_PLAN_INTER] = (dt_plan_link){a->inter_gbit * 1e9 / 8, a->inter_lat_us * 1e-6, 2};
        snprintf(source + n, cap - (size_t)n, ", as %d emulated hosts linked at %g Gbit/s, %g us", a->hosts,
                 a->inter_gbit, a->inter_lat_us);
    }
    return 0;
}

enum { CAL_STEPS = 16, CAL_WARM = 3 };

typedef struct {
    double epoch_s, compute_s, data_wait_s; /* the epoch's training time, its forward + backward +
                                             * optimizer time, its waits for the prefetch thread */
    int64_t steps;
} step_parts;

static void on_epoch(void *ctx, const dt_epoch_info *e) {
    step_parts *w = ctx;
    w->epoch_s += e->epoch_s, w->compute_s += e->compute_s, w->data_wait_s += e->data_wait_s, w->steps += e->steps;
}

/* steps training steps at batch b on one process over data set ds (no test set: nothing is
 * evaluated), their totals into *w. */
static dt_status train_parts(const dt_train_config *tc, dt_dataset *ds, int b, int steps, step_parts *w) {
    dt_train_config c = *tc;
    *w = (step_parts){0};
    c.batch = b, c.epochs = 1000000, c.max_steps = steps, c.cb_ctx = w, c.threads = 1;
    c.on_epoch = on_epoch, c.train_set = ds, c.test_set = NULL, c.val_split = 0;
    dt_trainer *t;
    DT_TRY(dt_trainer_create(&t, &c));
    const dt_status st = dt_trainer_run(t);
    dt_trainer_destroy(t);
    return st != DT_OK ? st : w->steps ? DT_OK : dt_error(DT_EINVAL, "plan: calibration at batch %d ran no steps", b);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median seconds of building a batch of b samples of ds on the caller's thread (a loader
 * without prefetch, shuffling, as a rank whose ranks take every core builds them:
 * dt_loader_prefetch_for), over CAL_STEPS batches after CAL_WARM. */
static dt_status inline_batch_seconds(const dt_dataset *ds, int b, double *s) {
    const dt_loader_config lc = {.batch = b, .shuffle = true, .seed = 1, .rank = 0, .world = 1, .prefetch = 0};
    dt_loader *l;
    DT_TRY(dt_loader_create(&l, ds, &lc));
    dt_status st = dt_loader_start_epoch(l, 0, 0);
    double t[CAL_STEPS];
    for (int i = -CAL_WARM; i < CAL_STEPS && st == DT_OK; i++) {
        dt_batch batch;
        const double a = dt_now();
        st = dt_loader_next(l, &batch);
        if (st == DT_ENOENT) st = dt_loader_start_epoch(l, (uint64_t)i + CAL_WARM + 1, 0), i--; /* a new epoch */
        else if (i >= 0) t[i] = dt_now() - a;
    }
    dt_loader_destroy(l);
    if (st != DT_OK) return st;
    qsort(t, CAL_STEPS, sizeof *t, cmp_double);
    *s = 0.5 * (t[CAL_STEPS / 2 - 1] + t[CAL_STEPS / 2]);
    return DT_OK;
}

/* The seconds per step beyond forward, backward and the optimizer at batch b on one process: where
 * the ranks take every core (`inline_batches`) they build their batches on their own thread, and
 * that is what they do beyond the nodes (the loss is one) and the optimizer: it is timed
 * (inline_batch_seconds). Otherwise CAL_STEPS training steps, measured in those same steps
 * (dt_plan_other_s), so that the load of the moment is in both: a run of CAL_WARM + CAL_STEPS
 * steps less one of CAL_WARM (the start of a run and its first steps, not a step's cost, cancel).
 * A one-process run under load measured mostly its waits for the prefetch thread and the wake-ups
 * after them (docs/plan.md), which ranks that build their batches inline do not have. */
static dt_status other_seconds(const dt_train_config *tc, dt_dataset *ds, int b, bool inline_batches, double *s) {
    if (inline_batches) return inline_batch_seconds(ds, b, s);
    step_parts warm, all;
    DT_TRY(train_parts(tc, ds, b, CAL_WARM, &warm));
    DT_TRY(train_parts(tc, ds, b, CAL_WARM + CAL_STEPS, &all));
    *s = dt_plan_other_s(all.epoch_s - warm.epoch_s, all.compute_s - warm.compute_s, 0, all.steps - warm.steps);
    return DT_OK;
}

/* The step overhead the node timings and the optimizer miss (data, bookkeeping): measured in real
 * one-process steps at batches b1 and b2 (other_seconds), fitted as ovh_fix + ovh_per x batch. */
static dt_status calibrate(const dt_train_config *tc, dt_plan_model *pm, int b1, int b2, bool inline_batches) {
    const int bs[2] = {b1, b2};
    double o[2];
    pm->ovh_fix = pm->ovh_per = 0;
    dt_dataset *train = NULL, *test = NULL;
    const char *spec = tc->model ? tc->model : "mlp";
    dt_status st = DT_OK;
    if (dt_data_is_text(tc->data)) {
        dt_gpt_config g;
        st = dt_gpt_parse(spec, &g);
        if (st == DT_OK) st = dt_dataset_open_text(&train, NULL, tc->data, g.T, tc->val_fraction);
    } else {
        st = dt_dataset_open(&train, &test, tc->data);
    }
    dt_dataset_destroy(test);
    for (int i = 0; i < 2 && st == DT_OK; i++) st = other_seconds(tc, train, bs[i], inline_batches, &o[i]);
    dt_dataset_destroy(train);
    if (st != DT_OK) return st;
    pm->ovh_per = (o[1] - o[0]) / (b2 - b1);
    if (pm->ovh_per < 0) pm->ovh_per = 0;
    pm->ovh_fix = o[0] - pm->ovh_per * b1;
    if (pm->ovh_fix < 0) pm->ovh_fix = 0;
    return DT_OK;
}

/* Cached per-op times measured beside busy_then other runnable tasks, scaled to the load now: one
 * process's share of the cores, max(1, (busy + 1) / cores), then against now. */
static void scale_to_load(dt_plan_model *pm, double busy_then) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    const double cores = n > 0 ? (double)n : 1, now = (dt_cli_plan_busy() + 1) / cores, then = (busy_then + 1) / cores;
    const double f = (now > 1 ? now : 1) / (then > 1 ? then : 1);
    for (int i = 0; i < pm->nodes; i++) pm->t_fix[i] *= f, pm->t_per[i] *= f;
    pm->ovh_fix *= f, pm->ovh_per *= f, pm->opt_per *= f;
}

/* Builds the model (unplaced) of a, its summary and, on this host, its per-node times and the step
 * overhead they miss: measured now, or those --probe cached under the same key (*cached). */
static int load_model(const plan_args *a, const dt_train_config *tc, bool measure, dt_model **m, dt_plan_model *pm,
                      bool *cached) {
    *cached = false;
    dt_status s = dt_train_plan_model(tc, m);
    if (s != DT_OK) {
        dt_cli_fail("check --model and --data", "%s", dt_last_error());
        return dt_cli_setup_status(s);
    }
    if (dt_plan_model_init(pm, *m) != DT_OK) return dt_cli_fail(NULL, "%s", dt_last_error());
    if (!measure) return 0;
    /* the micro-batches the layouts run lie between G / (ranks x 8) and G */
    int b1 = a->batch / (a->workers * 8), b2 = a->batch;
    if (b1 < 1) b1 = 1;
    if (b2 <= b1) b2 = b1 + 1;
    char key[1024];
    dt_cli_plan_ops_key(dt_model_spec(*m), tc->data, b1, b2, a->workers, a->precision, !a->no_calibrate, key,
                        sizeof key);
    double busy_then = 0;
    if (!a->probe && !a->measure_ops && dt_cli_plan_ops_load(key, pm, &busy_then)) {
        scale_to_load(pm, busy_then);
        return *cached = true, 0;
    }
    const double busy = a->probe ? dt_cli_plan_busy() : 0;
    dt_model_destroy(*m);
    *m = NULL;
    s = dt_train_plan_model(tc, m);
    if (s == DT_OK) s = dt_model_place(*m, NULL, 0);
    if (s == DT_OK) dt_model_init(*m, 1);
    if (s == DT_OK) s = dt_plan_model_measure(pm, *m, b1, b2, DT_PLAN_MEASURE_REPS);
    if (s == DT_OK) s = dt_plan_model_measure_optim(pm, &tc->optim, 15);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (s == DT_OK && !a->no_calibrate) s = calibrate(tc, pm, b1, b2, cores > 0 && a->workers >= cores);
    if (s != DT_OK) return dt_cli_fail("check --model, --data and --batch", "measuring the model: %s", dt_last_error());
    return a->probe ? dt_cli_plan_ops_save(key, pm, busy) : 0;
}

static void print_table(const dt_plan_result *res, int G, int top) {
    printf("%-4s %-30s %9s %9s %9s %9s %9s %9s %10s  %s\n", "#", "layout", "step ms", "compute", "comm", "bubble",
           "optim", "other", "MB/rank", "dtrain train flags");
    for (int i = 0, shown = 0; i < res->n && shown < top; i++) {
        const dt_plan_entry *e = &res->e[i];
        if (!e->c.fits) break;
        char name[96], flags[256];
        dt_plan_name(&e->l, name, sizeof name);
        dt_plan_flags(&e->l, G, flags, sizeof flags);
        printf("%-4d %-30s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %10.1f  %s\n", ++shown, name, e->c.total * 1e3,
               e->c.compute * 1e3, e->c.comm * 1e3, e->c.bubble * 1e3, e->c.optim * 1e3, e->c.overhead * 1e3,
               e->c.mem / 1048576.0, flags);
    }
}

/* The best layout of each family other than the winner's, in rank order; n of them into out. */
static int alternatives(const dt_plan_result *res, const dt_plan_entry **out, int cap) {
    int n = 0, seen[64], ns = 0;
    seen[ns++] = dt_plan_family(&res->e[0].l);
    for (int i = 1; i < res->n && n < cap && ns < 64; i++) {
        const int f = dt_plan_family(&res->e[i].l);
        bool dup = false;
        for (int k = 0; k < ns && !dup; k++) dup = seen[k] == f;
        if (dup) continue;
        seen[ns++] = f;
        out[n++] = &res->e[i];
    }
    return n;
}

static void add_entry(cJSON *arr, const dt_plan_entry *e, int G) {
    char name[96], flags[256];
    dt_plan_name(&e->l, name, sizeof name);
    dt_plan_flags(&e->l, G, flags, sizeof flags);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "layout", name);
    cJSON_AddStringToObject(o, "flags", flags);
    cJSON_AddNumberToObject(o, "dp", e->l.dp), cJSON_AddNumberToObject(o, "tp", e->l.tp);
    cJSON_AddNumberToObject(o, "pp", e->l.pp), cJSON_AddNumberToObject(o, "zero", e->l.zero);
    cJSON_AddNumberToObject(o, "micro", e->l.micro), cJSON_AddNumberToObject(o, "bucket_mb", e->l.bucket_mb);
    cJSON_AddNumberToObject(o, "algo", e->l.algo), cJSON_AddNumberToObject(o, "compress", e->l.compress);
    cJSON_AddNumberToObject(o, "step_s", e->c.total), cJSON_AddNumberToObject(o, "compute_s", e->c.compute);
    cJSON_AddNumberToObject(o, "comm_s", e->c.comm), cJSON_AddNumberToObject(o, "bubble_s", e->c.bubble);
    cJSON_AddNumberToObject(o, "optim_s", e->c.optim), cJSON_AddNumberToObject(o, "overhead_s", e->c.overhead);
    cJSON_AddNumberToObject(o, "comm_tp_s", e->c.comm_tp), cJSON_AddNumberToObject(o, "comm_pp_s", e->c.comm_pp);
    cJSON_AddNumberToObject(o, "comm_dp_s", e->c.comm_dp), cJSON_AddNumberToObject(o, "tp_bytes", e->c.tp_bytes);
    cJSON_AddNumberToObject(o, "dp_bytes", e->c.dp_bytes), cJSON_AddNumberToObject(o, "mem_bytes", e->c.mem);
    cJSON_AddNumberToObject(o, "mem_at_eval_ckpt_bytes", e->c.mem + e->c.mem_sync);
    cJSON_AddBoolToObject(o, "eval_ckpt_counted", e->c.sync_counts);
    cJSON_AddBoolToObject(o, "fits", e->c.fits);
    cJSON_AddItemToArray(arr, o);
}

static void print_json(const dt_plan_result *res, const dt_plan_cluster *c, const char *source, const char *model,
                       int G, double limit, int top) {
    cJSON *root = cJSON_CreateObject(), *lay = cJSON_CreateArray(), *why = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddNumberToObject(root, "global_batch", G);
    cJSON_AddStringToObject(root, "cluster", source);
    cJSON_AddNumberToObject(root, "ranks", c->hosts * c->ranks_per_host);
    cJSON_AddNumberToObject(root, "mem_limit_bytes", limit);
    cJSON_AddNumberToObject(root, "scored", res->scored);
    cJSON_AddNumberToObject(root, "search_s", res->search_s);
    cJSON_AddNumberToObject(root, "cost_s", res->cost_s);
    cJSON_AddNumberToObject(root, "memory_planned", res->planned);
    double least = -1; /* the least memory per rank among the layouts planned */
    for (int i = 0; i < res->n; i++)
        if (res->e[i].c.mem >= 0 && (least < 0 || res->e[i].c.mem < least)) least = res->e[i].c.mem;
    cJSON_AddNumberToObject(root, "least_mem_bytes", least);
    for (int i = 0, k = 0; i < res->n && k < top && res->e[i].c.fits; i++, k++) add_entry(lay, &res->e[i], G);
    cJSON_AddItemToObject(root, "layouts", lay);
    const dt_plan_entry *alt[16];
    const int na = res->e[0].c.fits ? alternatives(res, alt, 16) : 0;
    for (int i = 0; i < na; i++) {
        char line[512];
        dt_plan_why(alt[i], &res->e[0], c, limit, line, sizeof line);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "why", line);
        add_entry(lay, alt[i], G); /* keep the layouts array about the top ones: move it */
        cJSON_AddItemToObject(o, "layout", cJSON_DetachItemFromArray(lay, cJSON_GetArraySize(lay) - 1));
        cJSON_AddItemToArray(why, o);
    }
    cJSON_AddItemToObject(root, "alternatives", why);
    char *text = cJSON_PrintUnformatted(root);
    if (text) printf("%s\n", text);
    free(text);
    cJSON_Delete(root);
}

static int parse_args(int argc, char **argv, plan_args *a) {
    *a = (plan_args){.optimizer = "adam",
                     .precision = "fp32",
                     .workers = 1,
                     .top = 5,
                     .tp = -1,
                     .pp = -1,
                     .zero = -1,
                     .threads = 1,
                     .val_fraction = 0.1f,
                     .inter_lat_us = 100};
    const dt_flag flags[] = {
        {"model", DT_FLAG_STR, &a->model, "SPEC", "model spec or preset mlp, cnn, gpt[:L=..,H=..,C=..,T=..,V=..]"},
        {"data", DT_FLAG_STR, &a->data, "DIR", "the data set (its shapes: as dtrain train --data)"},
        {"batch", DT_FLAG_INT, &a->batch, "G", "global batch: samples per optimizer step over all ranks"},
        {"workers", DT_FLAG_INT, &a->workers, "N", "ranks on this host (without --cluster)"},
        {"cluster", DT_FLAG_STR, &a->cluster, "FILE", "cluster JSON (examples/clusters/): device speeds and links"},
        {"hosts", DT_FLAG_INT, &a->hosts, "H",
         "with --cluster: hosts (overrides the file's); without: this host's "
         "--workers as H emulated hosts (scripts/netns-hosts) joined by --inter-gbit"},
        {"inter-gbit", DT_FLAG_FLOAT, &a->inter_gbit, "X", "emulated hosts: the link's Gbit/s (tc's rate)"},
        {"inter-lat-us", DT_FLAG_FLOAT, &a->inter_lat_us, "US", "emulated hosts: one message's latency (default 100)"},
        {"ranks-per-host", DT_FLAG_INT, &a->rph, "R", "with --cluster: ranks per host (overrides the file's)"},
        {"optimizer", DT_FLAG_STR, &a->optimizer, "NAME", "sgd, adam or adamw (its state is in the memory per rank)"},
        {"momentum", DT_FLAG_FLOAT, &a->momentum, "X", "sgd momentum (one more state tensor when > 0)"},
        {"precision", DT_FLAG_STR, &a->precision, "P", "precisions to consider: fp32, bf16, fp16, comma-separated"},
        {"mem-limit", DT_FLAG_STR, &a->mem_limit_text, "BYTES", "memory per rank (default: the cluster's; K, M, G)"},
        {"tp", DT_FLAG_INT, &a->tp, "K", "consider only tensor-parallel degree K"},
        {"pp", DT_FLAG_INT, &a->pp, "K", "consider only K pipeline stages"},
        {"zero", DT_FLAG_INT, &a->zero, "N", "consider only ZeRO stage N"},
        {"consider", DT_FLAG_STR, &a->consider, "LIST",
         "also search layouts that change the training algorithm: "
         "topk, powersgd (lossy gradient compression), localsgd, ps (asynchronous), or all"},
        {"top", DT_FLAG_INT, &a->top, "K", "layouts in the table"},
        {"val-fraction", DT_FLAG_FLOAT, &a->val_fraction, "F", "text data: as dtrain train"},
        {"json", DT_FLAG_BOOL, &a->json, NULL, "one JSON object instead of the table"},
        {"probe", DT_FLAG_BOOL, &a->probe, NULL, "measure this host's collectives and memory bandwidth, cache them"},
        {"saves", DT_FLAG_BOOL, &a->saves, NULL,
         "the run saves checkpoints or weights: a layout must fit while "
         "they gather the model (--dry-run's 'at eval/ckpt' row; ZeRO-3's evaluation always counts)"},
        {"measure-ops", DT_FLAG_BOOL, &a->measure_ops, NULL,
         "this host: measure the per-op times now, even where "
         "--probe cached them (dtrain bench plan does: the load of the moment)"},
        {"no-calibrate", DT_FLAG_BOOL, &a->no_calibrate, NULL,
         "this host: skip the few real training steps that measure the step's overhead beyond its nodes"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, (int)(sizeof flags / sizeof *flags), PLAN_USAGE, NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    if (a->batch < 1) return dt_cli_usage("e.g. --batch 256", "--batch %d: give the global batch (>= 1)", a->batch);
    if (a->workers < 1 || a->workers > 4096) return dt_cli_usage(NULL, "--workers %d: need 1..4096", a->workers);
    if (a->rph && !a->cluster)
        return dt_cli_usage("add --cluster FILE (examples/clusters/)",
                            "--ranks-per-host describes a --cluster "
                            "file's hosts; for this host use --workers N [--hosts H --inter-gbit X]");
    if (!a->cluster && a->hosts > 1 && (a->workers % a->hosts || a->inter_gbit <= 0 || a->inter_lat_us < 0))
        return dt_cli_usage("e.g. --workers 2 --hosts 2 --inter-gbit 1",
                            "--hosts %d without --cluster: emulated "
                            "hosts need --workers a multiple of them (%d) and --inter-gbit > 0",
                            a->hosts, a->workers);
    if (!a->cluster && a->hosts > 1 && a->probe)
        return dt_cli_usage("probe with --workers N alone, then plan with --hosts",
                            "--probe measures one host's "
                            "ranks; the emulated hosts' link is the declared --inter-gbit");
    if (a->hosts < 0 || a->rph < 0 || a->top < 1) return dt_cli_usage(NULL, "--hosts, --ranks-per-host, --top: >= 1");
    if (a->probe && a->cluster) return dt_cli_usage(NULL, "--probe measures this host; leave out --cluster");
    return -1;
}

int dt_cmd_plan(int argc, char **argv) { return dt_cli_plan_run(argc, argv, NULL); }

int dt_cli_plan_run(int argc, char **argv, dt_plan_entry *best) {
    plan_args a;
    int r = parse_args(argc, argv, &a);
    if (r >= 0) return r;
    int precs, algos;
    size_t limit = 0;
    if ((r = prec_mask(a.precision, &precs)) || (r = algo_mask(a.consider, &algos))) return r;
    if (a.mem_limit_text && (r = dt_cli_mem_limit_parse(a.mem_limit_text, &limit))) return r;
    dt_train_config tc = dt_train_defaults();
    tc.model = a.model, tc.data = a.data ? a.data : tc.data, tc.val_fraction = a.val_fraction;
    if (dt_optim_parse(a.optimizer, &tc.optim.kind) != DT_OK)
        return dt_cli_usage("use --optimizer sgd, adam or adamw", "%s", dt_last_error());
    tc.optim = dt_optim_defaults(tc.optim.kind), tc.optim.momentum = a.momentum;
    dt_plan_cluster c;
    char source[400];
    bool probed;
    if ((r = load_cluster(&a, &c, source, sizeof source, &probed))) return r;
    dt_set_threads(a.threads);
    dt_model *m = NULL;
    dt_plan_model pm = {0};
    bool ops_cached = false;
    if ((r = load_model(&a, &tc, !a.cluster, &m, &pm, &ops_cached))) {
        dt_model_destroy(m), dt_plan_model_free(&pm);
        return r;
    }
    if (ops_cached) {
        const size_t n = strlen(source);
        snprintf(source + n, sizeof source - n, "; per-op times cached by --probe, scaled to the load now");
    }
    /* a probed host: its links again now at the model's gradient size (the load moves them); the
     * emulated hosts' declared link stays */
    const dt_plan_link declared = c.link[DT_PLAN_INTER];
    if (probed && !a.probe && (r = dt_cli_plan_links_now(a.workers, pm.total_params, &c))) {
        dt_model_destroy(m), dt_plan_model_free(&pm);
        return r;
    }
    if (!a.cluster && a.hosts > 1) c.link[DT_PLAN_INTER] = declared;
    size_t copy = 0;
    if (dt_train_plan_loader(&tc, &copy) != DT_OK) copy = 0;
    /* as --dry-run: image data has a test set, text data a validation part unless --val-fraction 0 */
    const bool text = tc.data && (!strncmp(tc.data, "text:", 5) || !strcmp(tc.data, "kjv"));
    const dt_plan_request req = {.G = a.batch,
                                 .ranks = c.hosts * c.ranks_per_host,
                                 .precs = precs,
                                 .fix_tp = a.tp,
                                 .fix_pp = a.pp,
                                 .fix_zero = a.zero,
                                 .mem_limit = (double)limit,
                                 .extra = (double)copy,
                                 .want = a.top,
                                 .algos = algos,
                                 .evals = !text || a.val_fraction > 0,
                                 .saves = a.saves};
    dt_plan_result res;
    dt_status s = dt_plan_search(m, &pm, &tc.optim, &c, &req, &res);
    const double lim = limit ? (double)limit : c.mem_bytes;
    if (s != DT_OK) {
        dt_model_destroy(m), dt_plan_model_free(&pm);
        return dt_cli_usage("change --batch, --workers or the fixed axes", "%s", dt_last_error());
    }
    char spec[256];
    snprintf(spec, sizeof spec, "%s", dt_model_spec(m));
    if (a.json) print_json(&res, &c, source, spec, a.batch, lim, a.top);
    else dt_cli_plan_print(&res, &c, source, spec, a.batch, lim, a.top);
    const bool fits = res.e[0].c.fits;
    if (best) *best = res.e[0];
    dt_plan_result_free(&res), dt_model_destroy(m), dt_plan_model_free(&pm);
    if (!fits && !a.json)
        return dt_cli_fail("raise --mem-limit, add ranks (--workers, --hosts) or lower --batch",
                           "no layout fits %.2f GB per rank", lim / 1e9);
    return fits ? 0 : 78;
}

void dt_cli_plan_print(const dt_plan_result *res, const dt_plan_cluster *c, const char *source, const char *model,
                       int G, double limit, int top) {
    printf("dtrain plan: model %s, global batch %d, %d rank%s: %s\n", model, G, c->hosts * c->ranks_per_host,
           c->hosts * c->ranks_per_host > 1 ? "s" : "", source);
    printf("dtrain plan: scored %d layouts in %.3f s (step times %.3f s; memory of the %d fastest %.3f s), %.2f GB "
           "per rank\n",
           res->scored, res->search_s, res->cost_s, res->planned, res->mem_s, limit / 1e9);
    if (!res->e[0].c.fits) {
        char why[512];
        int small = 0;
        for (int i = 1; i < res->n; i++)
            if (res->e[i].c.mem < res->e[small].c.mem) small = i;
        dt_plan_why(&res->e[small], &res->e[0], c, limit, why, sizeof why);
        printf("dtrain plan: nothing fits; the smallest: %s\n", why);
        return;
    }
    print_table(res, G, top);
    const dt_plan_entry *alt[16];
    const int na = alternatives(res, alt, 16);
    if (na) printf("why not:\n");
    for (int i = 0; i < na; i++) {
        char line[512];
        dt_plan_why(alt[i], &res->e[0], c, limit, line, sizeof line);
        printf("  %s\n", line);
    }
}
