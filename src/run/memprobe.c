/* Measured memory of a training rank (dtrain/memplan.h): a GPT, Adam and a strategy trained on
 * synthetic tokens, with the OS's own resident-set accounting read around it (VmRSS, VmHWM;
 * the peak is reset through /proc/self/clear_refs once the strategy holds its sharded state). */
#include "dtrain/memplan.h"
#include "dtrain/models.h"
#include "parallel/strategy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double status_bytes(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0, n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && sscanf(line + n, ": %zu", &kb) == 1) break;
    if (f) fclose(f);
    return (double)kb * 1024;
}

static void reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) fputs("5", f), fclose(f);
}

static double cpu_seconds(const struct rusage *u) {
    return (double)u->ru_utime.tv_sec + u->ru_utime.tv_usec * 1e-6 + (double)u->ru_stime.tv_sec +
           u->ru_stime.tv_usec * 1e-6;
}

/* The steps on synthetic ids (each rank its own, from the counter-based generator). */
static dt_status train_steps(dt_strategy *s, const dt_gpt_config *g, int B, int steps, int world, dt_mem_probe *out) {
    const int r = s->comm ? dt_comm_rank(s->comm) : 0;
    int32_t *x = malloc(sizeof(int32_t) * (size_t)B * g->T * 2);
    if (!x) return dt_error(DT_ENOMEM, "memory probe: out of memory");
    int32_t *y = x + (size_t)B * g->T;
    for (int i = 0; i < B * g->T; i++) {
        x[i] = (int32_t)(dt_rng_u64(3, (uint64_t)r, (uint64_t)i) % (uint64_t)g->V);
        y[i] = (x[i] + 1) % g->V;
    }
    reset_peak();
    double t0 = dt_now();
    struct rusage u0 = {0}, u1;
    dt_status st = DT_OK;
    for (int k = 0; k <= steps && st == DT_OK; k++) {
        if (k == 1) t0 = dt_now(), getrusage(RUSAGE_SELF, &u0);
        dt_step_batch b = {.feed = {.x = x, .y = y, .n = B},
                           .n_global = B * world,
                           .world = world,
                           .accum = 1,
                           .step = k,
                           .lr = 1e-4f};
        dt_step_result res;
        st = dt_strategy_train_step(s, &b, &res);
        if (st == DT_OK && res.st.gathered_peak_bytes > out->gathered) out->gathered = res.st.gathered_peak_bytes;
    }
    out->step_s = (dt_now() - t0) / steps;
    getrusage(RUSAGE_SELF, &u1);
    out->cpu_s = (cpu_seconds(&u1) - cpu_seconds(&u0)) / steps;
    out->faults = (double)(u1.ru_minflt - u0.ru_minflt) / steps;
    out->peak = status_bytes("VmHWM");
    free(x);
    return st;
}

/* The model placed and initialised as the strategy's entry says (ZeRO-3: this rank's shards), and
 * the optimizer (a placing strategy's holds nothing until the strategy shards it). */
static dt_status place(const dt_strategy_entry *e, const dt_strategy_opts *so, dt_model *m, dt_comm *comm,
                       const dt_optim_config *oc, dt_optim **o) {
    static const dt_range none = {0, 0};
    dt_range *own = NULL;
    int nown = 0;
    bool whole = true;
    DT_TRY(dt_strategy_placement(e, so, m, comm ? dt_comm_rank(comm) : 0, comm ? dt_comm_size(comm) : 1, &own, &nown,
                                 &whole));
    dt_status st = dt_model_place(m, whole ? NULL : own ? own : &none, nown);
    if (st == DT_OK) dt_model_init(m, 1);
    if (st == DT_OK) st = dt_optim_create_placed(o, oc, dt_model_num_params(m), whole ? NULL : &none, 0);
    free(own);
    return st;
}

dt_status dt_mem_probe_gpt(const char *gpt_spec, const char *strategy, dt_comm *comm, int batch, int steps,
                           dt_mem_probe *out) {
    memset(out, 0, sizeof *out);
    if (batch < 1 || steps < 1)
        return dt_error(DT_EINVAL, "memory probe: batch %d, steps %d: need 1 or more", batch, steps);
    out->base = status_bytes("VmRSS");
    const double shm0 = status_bytes("RssShmem");
    dt_gpt_config g;
    DT_TRY(dt_gpt_parse(gpt_spec, &g));
    dt_model *m = NULL;
    dt_optim *o = NULL;
    dt_strategy *s = NULL;
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_ADAM);
    const dt_strategy_entry *e = NULL;
    dt_strategy_opts so;
    dt_status st = dt_strategy_parse(strategy ? strategy : dt_strategy_default_name(1), &e, &so);
    if (st == DT_OK) st = dt_model_build_unplaced(&m, gpt_spec, 0, 0, 0);
    if (st == DT_OK) st = place(e, &so, m, comm, &oc, &o); /* as the trainer: the strategy's part only */
    if (st == DT_OK) st = dt_strategy_create_with(&s, e, &so, comm, m, o, NULL);
    if (st == DT_OK) st = s->ops->init(s);
    if (st == DT_OK) {
        out->setup_peak = status_bytes("VmHWM");
        out->activations = (double)dt_model_activation_bytes(m, batch);
        st = train_steps(s, &g, batch, steps, comm ? dt_comm_size(comm) : 1, out);
        out->shmem = status_bytes("RssShmem") - shm0;
    }
    dt_strategy_destroy(s);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return st;
}
