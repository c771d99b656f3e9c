/* Trainer output: the JSON-Lines metrics records (an epoch's; a --log-every step's and an
 * --eval-every evaluation's, "kind": "step" / "eval") and the gathered Chrome trace. */
#include "run/trainer_internal.h"
#include "dtrain/kernels.h"

#include "run/writable.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static dt_status metrics_error(const dt_trainer *t, const char *what) {
    return dt_error(DT_EIO, "`metrics` %s: %s failed: %s; check the disk (free space, permissions)", t->cfg.metrics,
                    what, strerror(errno));
}

/* Step of a metrics line ("step": N), or -1. */
static long long line_step(const char *line) {
    const char *p = strstr(line, "\"step\": ");
    return p ? strtoll(p + 8, NULL, 10) : -1;
}

/* Rewrites path without the records of steps after `step` (those of a run resumed from there). */
static dt_status drop_records_after(dt_trainer *t, int64_t step) {
    char path[4096]; /* the file, or the one a symbolic link leads to */
    if (dt_output_path("`metrics`", t->cfg.metrics, path, sizeof path) != DT_OK)
        return dt_error_clear(), DT_OK; /* a stream or descriptor (/dev/stdout): appended to, as it is */
    FILE *in = fopen(path, "r");
    if (!in) return DT_OK; /* nothing written yet */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *out = fopen(tmp, "w");
    if (!out) {
        fclose(in);
        return metrics_error(t, "creating a temporary file beside it");
    }
    char *line = NULL;
    size_t cap = 0;
    int dropped = 0;
    while (getline(&line, &cap, in) > 0) {
        if (line_step(line) > step) dropped++;
        else fputs(line, out);
    }
    free(line);
    bool rd = ferror(in) != 0;
    fclose(in);
    bool ok = fflush(out) == 0 && fsync(fileno(out)) == 0;
    ok = fclose(out) == 0 && ok && !rd;
    if (!ok || (dropped > 0 && rename(tmp, path) != 0)) {
        dt_status s = metrics_error(t, rd ? "reading" : "rewriting");
        unlink(tmp);
        return s;
    }
    if (dropped == 0) unlink(tmp);
    else
        dt_trainer_note(t,
                        "`metrics` %s: dropped %d record%s after step %lld (written again from the resumed "
                        "checkpoint)",
                        path, dropped, dropped == 1 ? "" : "s", (long long)step);
    return DT_OK;
}

dt_status dt_trainer_open_metrics(dt_trainer *t, FILE **out) {
    *out = NULL;
    if (!t->cfg.metrics || t->rank != 0) return DT_OK;
    if (t->cfg.resume) DT_TRY(drop_records_after(t, t->step));
    const int fd = dt_path_descriptor(t->cfg.metrics); /* --metrics /dev/stdout: into that very stream */
    const int mine = fd >= 0 ? dup(fd) : -1;
    *out = fd >= 0 ? (mine >= 0 ? fdopen(mine, "a") : NULL) : fopen(t->cfg.metrics, t->cfg.resume ? "a" : "w");
    if (!*out && mine >= 0) close(mine);
    if (!*out) return metrics_error(t, "opening for writing");
    return DT_OK;
}

dt_status dt_trainer_close_metrics(dt_trainer *t, FILE *f, dt_status s) {
    if (!f) return s;
    bool ok = fflush(f) == 0 && !ferror(f);
    int e = errno;
    /* a pipe or a terminal (--metrics /dev/stdout) cannot be synced; a full disk can fail here */
    if (ok && fsync(fileno(f)) != 0 && errno != EINVAL && errno != ENOTSUP && errno != EROFS) ok = false, e = errno;
    if (fclose(f) != 0 && ok) ok = false, e = errno;
    if (ok || s != DT_OK) return s;
    errno = e;
    return metrics_error(t, "writing");
}

static void json_num(char *buf, size_t cap, double v) {
    if (isnan(v)) snprintf(buf, cap, "null");
    else snprintf(buf, cap, "%.6g", v);
}

dt_status dt_trainer_write_metrics(FILE *f, const dt_epoch_info *e, const dt_trainer *t) {
    char tl[32], ta[32];
    json_num(tl, sizeof tl, e->test_loss);
    json_num(ta, sizeof ta, e->test_acc);
    double per = e->steps > 0 ? 1e3 / (double)e->steps : 0;
    fprintf(f,
            "{\"epoch\": %d, \"step\": %lld, \"train_loss\": %.6g, \"test_loss\": %s, \"test_acc\": %s, "
            "\"samples_per_s\": %.1f, \"epoch_s\": %.3f, \"wall_s\": %.3f, \"data_wait_s\": %.4f, \"lr\": %.6g, "
            "\"batch\": %d, \"world_size\": %d, \"global_batch\": %d, \"strategy\": \"%s\", \"backend\": \"%s\", "
            "\"step_ms\": {\"compute\": %.4f, \"comm_wait\": %.4f, \"data_wait\": %.4f}, \"model\": \"%s\"",
            e->epoch, (long long)e->global_step, e->train_loss, tl, ta, e->samples_per_s, e->epoch_s, e->wall_s,
            e->data_wait_s, e->lr, t->cfg.batch, e->world_size, e->global_batch, t->strategy->ops->name,
            t->world > 1 ? dt_comm_backend_name(t->cfg.comm) : "self", e->compute_s * per, e->comm_wait_s * per,
            e->data_wait_s * per, dt_model_spec(t->model));
    if (e->steps_per_epoch > 0) /* a partial epoch (--max-steps) or a loss over part of it (resumed) */
        fprintf(f, ", \"epoch_steps\": %lld, \"steps_per_epoch\": %lld, \"loss_steps\": %lld",
                (long long)e->epoch_steps, (long long)e->steps_per_epoch, (long long)e->steps);
    if (t->world > 1)
        fprintf(f, ", \"comm_bytes\": {\"tp\": %llu, \"pp\": %llu, \"dp\": %llu}", (unsigned long long)e->comm_bytes[0],
                (unsigned long long)e->comm_bytes[1], (unsigned long long)e->comm_bytes[2]);
    if (t->val) { /* --val-split */
        char vl[32], va[32];
        json_num(vl, sizeof vl, e->val_loss), json_num(va, sizeof va, e->val_acc);
        fprintf(f, ", \"val_loss\": %s, \"val_acc\": %s, \"best_epoch\": %d", vl, va, e->best_epoch);
    }
    if (t->cfg.eval_batches > 0) /* a bounded evaluation: the samples it covered */
        fprintf(f, ", \"eval_samples\": %lld", (long long)e->eval_samples);
    fprintf(f, ", \"kernels\": \"%s\"", dt_kernels_describe());
    const dt_loss_scaler *ls = dt_optim_loss_scaler(t->optim);
    if (ls) fprintf(f, ", \"loss_scale\": %.6g, \"skipped_steps\": %lld", ls->scale, (long long)ls->skipped);
    if (e->sync_raw_bytes > 0 && e->steps > 0) /* gradient sync: bytes per step of rank 0, --compress */
        fprintf(f,
                ", \"sync\": {\"bytes_per_step\": %.0f, \"raw_bytes_per_step\": %.0f, \"compression_ratio\": %.4g, "
                "\"ef_norm\": %.6g}",
                e->sync_bytes / (double)e->steps, e->sync_raw_bytes / (double)e->steps,
                e->sync_bytes > 0 ? e->sync_raw_bytes / e->sync_bytes : 0.0, e->ef_norm);
    if (t->cfg.predicted_step_s > 0 && e->steps > 0) { /* --strategy auto: the plan beside what it measured */
        const double step = e->epoch_s / (double)e->steps;
        fprintf(f,
                ", \"plan\": {\"layout\": \"%s\", \"predicted_step_s\": %.6g, \"measured_step_s\": %.6g, "
                "\"error\": %.4f}",
                t->cfg.plan_layout ? t->cfg.plan_layout : "", t->cfg.predicted_step_s, step,
                step / t->cfg.predicted_step_s - 1);
    }
    dt_balance_write_json(f, e);  /* per-worker figures, ps staleness */
    fputs(t->strategy_report, f); /* the strategy's own figures (pp: bubble, bytes), or nothing */
    fputs("}\n", f);
    if (fflush(f) != 0 || ferror(f)) return metrics_error(t, "writing the record of an epoch");
    return DT_OK;
}

dt_status dt_trainer_write_step(FILE *f, const dt_step_info *s, const dt_trainer *t) {
    char a[32], b[32];
    json_num(a, sizeof a, s->lr);
    fprintf(f, "{\"kind\": \"%s\", \"epoch\": %.6g, \"step\": %lld, \"lr\": %s, \"wall_s\": %.3f",
            s->kind == DT_STEP_TRAIN ? "step" : "eval", s->epoch, (long long)s->step, a, s->wall_s);
    if (s->kind == DT_STEP_TRAIN) {
        json_num(a, sizeof a, s->train_loss), json_num(b, sizeof b, s->grad_norm);
        fprintf(f, ", \"train_loss\": %s, \"samples_per_s\": %.1f, \"grad_norm\": %s, \"steps\": %lld", a,
                s->samples_per_s, b, (long long)s->steps);
    } else {
        json_num(a, sizeof a, s->test_loss), json_num(b, sizeof b, s->test_acc);
        fprintf(f, ", \"test_loss\": %s, \"test_acc\": %s", a, b);
        if (t->val) {
            json_num(a, sizeof a, s->val_loss), json_num(b, sizeof b, s->val_acc);
            fprintf(f, ", \"val_loss\": %s, \"val_acc\": %s", a, b);
        }
        fprintf(f, ", \"eval_samples\": %lld, \"eval_s\": %.3f", (long long)s->eval_samples, s->eval_s);
    }
    fputs("}\n", f);
    if (fflush(f) != 0 || ferror(f)) return metrics_error(t, "writing a step record");
    return DT_OK;
}

/* Ranks on one host (the shm transport, or a layout of one host) read the same monotonic clock:
 * their events move to the earliest rank's time zero, so one instant is one place on every lane
 * (the arrival skew at a collective can be read off; each rank's zero is its own start otherwise). */
static dt_status align_clocks(dt_trainer *t, dt_comm *c) {
    if (strcmp(dt_comm_backend_name(c), "shm") && dt_comm_hosts(c) != 1) return DT_OK;
    double zero;
    DT_TRY(dt_comm_allreduce(c, &t->trace.zero, &zero, 1, DT_F64, DT_OP_MIN));
    for (size_t i = 0; i < t->trace.n; i++) t->trace.ev[i].ts += t->trace.zero - zero;
    t->trace.zero = zero;
    return DT_OK;
}

/* Writes the Chrome trace to --timeline (or the file a symbolic link there leads to). */
static dt_status write_trace(const dt_trainer *t, const dt_trace_event *ev, size_t n) {
    char path[4096];
    DT_TRY(dt_output_path("`timeline`", t->cfg.timeline, path, sizeof path));
    return dt_trace_write_json(path, ev, n);
}

/* Gathers every rank's timeline events on rank 0 and writes the Chrome trace there. */
dt_status dt_trainer_write_timeline(dt_trainer *t) {
    if (t->trace.dropped)
        dt_trainer_note(t, "`timeline`: rank %d recorded only its first %zu events (%zu more dropped)", t->rank,
                        t->trace.n, t->trace.dropped);
    dt_comm *c = t->world > 1 ? t->cfg.comm : NULL;
    const size_t esz = sizeof(dt_trace_event);
    if (!c) return write_trace(t, t->trace.ev, t->trace.n);
    DT_TRY(align_clocks(t, c));
    int W = t->world;
    int64_t mine = (int64_t)t->trace.n;
    int64_t *counts = calloc((size_t)W, sizeof *counts);
    size_t *bytes = calloc((size_t)W, sizeof *bytes);
    if (!counts || !bytes) {
        free(counts), free(bytes);
        return dt_error(DT_ENOMEM, "timeline: out of memory");
    }
    dt_status s = dt_comm_allgather(c, &mine, counts, 1, DT_I64);
    size_t total = 0;
    for (int r = 0; r < W; r++) bytes[r] = (size_t)counts[r] * esz, total += (size_t)counts[r];
    dt_trace_event *all = s == DT_OK ? calloc(total ? total : 1, esz) : NULL;
    if (s == DT_OK && !all) s = dt_error(DT_ENOMEM, "timeline: out of memory for %zu events", total);
    if (s == DT_OK) s = dt_comm_allgatherv(c, t->trace.ev, all, bytes, NULL, DT_U8);
    if (s == DT_OK && t->rank == 0) s = write_trace(t, all, total);
    free(all), free(counts), free(bytes);
    return s;
}
