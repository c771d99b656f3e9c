/* dtrain bench train: single-worker training throughput (samples/s, achieved GFLOP/s) of the
 * reference models at the reference batch sizes, next to OpenBLAS sgemm's single-core rate,
 * as a table and one JSON line: one row per model, kernel library and precision (--kernels,
 * --precision, --vs-blas), each with its ratio to the first row of its case, and optionally
 * PyTorch's rate on the same shapes (--vs-torch: bench/train_torch.py, one thread). Prints the
 * CPU, OpenBLAS's core, the implementations oneDNN chose and what a row's precision runs as
 * where that is not its own kernels (dt_kernels_note: bf16 without AVX512-BF16, fp16, blas).
 * Data is real and the same for both sides: 64 batches of Fashion-MNIST images (MLP, CNN, --spec)
 * or of King James Bible windows (GPT), drawn once per case and held in memory, so the figure is
 * the compute path alone (forward, loss, backward, update), and PyTorch trains on the very same
 * bytes (a temporary file handed to bench/train_torch.py). Both sides run pinned to one CPU. */
#include "cli/bench_profile.h"
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "dtrain/models.h"

#include <cblas.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *name, *spec;
    int batch;
    double min_s;
} bench_case;

/* sgemm GFLOP/s on square n x n matrices (best of a few runs). */
static double sgemm_gflops(int n, double min_s) {
    float *a = dt_alloc((size_t)n * n * 4), *b = dt_alloc((size_t)n * n * 4), *c = dt_alloc((size_t)n * n * 4);
    if (!a || !b || !c) return 0;
    dt_rng_fill_uniform(a, (size_t)n * n, -1, 1, 1, 1);
    dt_rng_fill_uniform(b, (size_t)n * n, -1, 1, 1, 2);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    int iters = 0;
    double t0 = dt_now(), t;
    do {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        iters++;
    } while ((t = dt_now() - t0) < min_s);
    dt_free(a), dt_free(b), dt_free(c);
    return 2.0 * n * n * (double)n * iters / t / 1e9;
}

/* CPU seconds this process has used (all its threads): less sensitive to a loaded machine than
 * wall time, since time spent waiting for a core is not counted. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One case's training data in memory: NB batches of real samples (x: f32 features or int32 token
 * ids, DT_FEED_VALUE_BYTES each; y: int32 labels or next tokens), and where it came from. */
enum { BENCH_NB = 64 };
typedef struct {
    void *x;
    int32_t *y;
    size_t x_vals, y_vals; /* per sample */
    char source[160];
} bench_data;

static void bench_data_free(bench_data *d) {
    dt_free(d->x), dt_free(d->y);
    d->x = NULL, d->y = NULL;
}

/* Fills d with BENCH_NB batches of B samples of the data set the model reads: Fashion-MNIST for
 * f32 1x28x28 inputs, the King James Bible (windows of T + 1 bytes) for a GPT. Samples are drawn
 * by a fixed counter-based RNG (seed 7), the same on every run. */
static dt_status bench_data_load(bench_data *d, const dt_model *m, int B) {
    const bool tokens = dt_model_in_dtype(m) == DT_I32;
    dt_dataset *train = NULL, *test = NULL;
    const int T = tokens ? dt_model_input_values(m, 0) : 0;
    DT_TRY(tokens ? dt_dataset_open_text(&train, &test, "kjv", T, 0.1)
                  : dt_dataset_open(&train, &test, "fashion-mnist"));
    dt_status s = DT_OK;
    const size_t n = (size_t)BENCH_NB * B, len = dt_dataset_len(train);
    d->x_vals = (size_t)dt_model_input_values(m, 0), d->y_vals = (size_t)dt_model_input_values(m, 1);
    d->x = dt_alloc(n * d->x_vals * DT_FEED_VALUE_BYTES), d->y = dt_alloc(n * d->y_vals * sizeof(int32_t));
    uint32_t *idx = dt_alloc((size_t)B * sizeof(uint32_t));
    if (!d->x || !d->y || !idx) s = dt_error(DT_ENOMEM, "bench: out of memory for %zu samples", n);
    if (s == DT_OK && !tokens && (size_t)dt_model_in_size(m) != d->x_vals)
        s = dt_error(DT_EINVAL, "bench: the model reads %zu values per sample; Fashion-MNIST has 784", d->x_vals);
    for (int b = 0; s == DT_OK && b < BENCH_NB; b++) {
        for (int i = 0; i < B; i++) idx[i] = (uint32_t)(dt_rng_u64(7, 3, (uint64_t)b * B + i) % len);
        const size_t o = (size_t)b * B;
        s = tokens ? dt_dataset_batch_tokens(train, idx, B, (int32_t *)d->x + o * d->x_vals, d->y + o * d->y_vals)
                   : dt_dataset_batch(train, idx, B, (float *)d->x + o * d->x_vals, d->y + o * d->y_vals);
    }
    if (s == DT_OK)
        snprintf(d->source, sizeof d->source, "%s, %d batches of %d drawn from %zu %s",
                 tokens ? "kjv" : "fashion-mnist", BENCH_NB, B, len, tokens ? "windows" : "images");
    dt_free(idx);
    dt_dataset_destroy(train), dt_dataset_destroy(test);
    if (s != DT_OK) bench_data_free(d);
    return s;
}

/* Writes d's batches to a new temporary file for bench/train_torch.py (x then y, raw
 * little-endian); path gets its name. */
static dt_status bench_data_write(const bench_data *d, int B, char *path, size_t cap) {
    snprintf(path, cap, "%s/dtrain-bench-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    const int fd = mkstemp(path);
    if (fd < 0)
        return dt_error(DT_EIO, "bench: cannot create a temporary file %s for PyTorch's data: set TMPDIR", path);
    const size_t n = (size_t)BENCH_NB * B, xb = n * d->x_vals * DT_FEED_VALUE_BYTES,
                 yb = n * d->y_vals * sizeof(int32_t);
    FILE *f = fdopen(fd, "wb");
    const bool ok = f && fwrite(d->x, 1, xb, f) == xb && fwrite(d->y, 1, yb, f) == yb;
    if (f ? fclose(f) != 0 || !ok : (close(fd), true)) {
        unlink(path);
        return dt_error(DT_EIO, "bench: cannot write %s for PyTorch's data (disk full?)", path);
    }
    return DT_OK;
}

/* The first CPU this process may run on (-1: unknown), to pin both sides of the comparison. */
static int first_cpu(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) return c;
    return -1;
}

/* Trains `spec` on the case's data d (BENCH_NB batches, cycled) for at least min_s seconds;
 * returns samples/s, samples per CPU second and GFLOP/s. */
static dt_status bench_model(const bench_case *bc, const bench_data *d, bool profile, double *sps, double *cps,
                             double *gflops) {
    dt_model *m = NULL;
    dt_optim *o = NULL;
    DT_TRY(dt_model_build(&m, bc->spec, 1, 28, 28));
    dt_model_init(m, 1);
    const bool tokens = dt_model_in_dtype(m) == DT_I32;
    dt_optim_config oc = dt_optim_defaults(tokens ? DT_OPTIM_ADAMW : DT_OPTIM_ADAM);
    dt_status s = dt_optim_create(&o, &oc, dt_model_num_params(m));
    dt_bench_profile *prof = profile && s == DT_OK ? dt_bench_profile_attach(m) : NULL;
    if (profile && s == DT_OK && !prof) s = dt_error(DT_ENOMEM, "bench: out of memory");
    const int B = bc->batch;
    /* 3 untimed warm-up steps, then whole groups of 8 steps until min_s has passed */
    int64_t steps = 0;
    double t0 = 0, t = 0, c0 = 0;
    for (int64_t i = 0; s == DT_OK; i++) {
        if (i == 3) t0 = dt_now(), c0 = cpu_now();
        if (prof) dt_bench_profile_enable(prof, i >= 3);
        const size_t at = (size_t)(i % BENCH_NB) * B;
        dt_feed f = {
            .x = (const char *)d->x + at * d->x_vals * DT_FEED_VALUE_BYTES, .y = d->y + at * d->y_vals, .n = B};
        float loss;
        if ((s = dt_model_run(m, &f, true, (uint64_t)i, &loss)) != DT_OK) break;
        dt_model_zero_grad(m);
        if ((s = dt_model_backward_loss(m, 1.0f, NULL, NULL)) != DT_OK) break;
        if (prof) dt_bench_profile_optim(prof, true);
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 1e-3f);
        if (prof) dt_bench_profile_optim(prof, false);
        if (i >= 3 && (i - 3) % 8 == 7 && (t = dt_now() - t0) >= bc->min_s) {
            steps = i - 2;
            break;
        }
    }
    if (s == DT_OK) {
        *sps = (double)steps * B / t;
        *cps = (double)steps * B / (cpu_now() - c0);
        *gflops = dt_model_train_flops(m, B) * (double)steps / t / 1e9;
    }
    if (prof) dt_bench_profile_print(prof, m, steps, s == DT_OK ? B / *cps : 0);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    return s;
}

static const char USAGE[] =
    "Usage: dtrain bench train [--seconds S] [--threads N] [--model NAME] [--batch N] [--spec SPEC]\n"
    "                          [--kernels onednn,blas] [--precision fp32,bf16,fp16] [--vs-blas] [--vs-torch]\n"
    "                          [--repeat N] [--profile]\n\n"
    "Single-worker training throughput of the reference models on real data: MLP at batch 32 and\n"
    "128, CNN at batch 128 (Adam, Fashion-MNIST), GPT L4 H4 C128 T64 at batch 12 (AdamW, the King James\n"
    "Bible; tokens/s = samples/s x 64), each case on 64 batches drawn once and held in memory; plus\n"
    "OpenBLAS sgemm GFLOP/s for scale. With --threads 1 (the default) the process runs pinned to one\n"
    "CPU (--cpu). One row per kernel\n"
    "library and precision in the lists (default: the default kernels, fp32; --vs-blas adds blas);\n"
    "the ratio column compares each row with the first row of its case; \"per cpu-s\" divides by the\n"
    "process's CPU time instead of wall time (steadier on a loaded machine). --vs-torch adds PyTorch's\n"
    "samples/s on the same model, batch and bytes of data (bench/train_torch.py, /usr/bin/python3, one\n"
    "thread, its OpenBLAS too, pinned to the same CPU with taskset), and its samples per CPU-second\n"
    "beside dtrain's (\"vs (cpu)\": per cpu-s / "
    "torch's). --profile prints, before each row, the CPU milliseconds per step of each\n"
    "node's forward and backward and of the optimizer (oneDNN's primitives: ONEDNN_VERBOSE=profile).\n"
    "The end prints the implementations oneDNN chose and a note for rows whose precision runs on\n"
    "other kernels (bf16 on a CPU without AVX512-BF16/AMX, fp16, blas: inputs rounded, f32 GEMMs),\n"
    "also in the JSON line (\"notes\").";

/* The next comma-separated word of *list into w (cap bytes); false at the end. */
static bool next_word(const char **list, char *w, size_t cap) {
    const char *p = *list;
    if (!p || !*p) return false;
    size_t n = strcspn(p, ",");
    snprintf(w, cap, "%.*s", (int)n, p);
    *list = p[n] ? p + n + 1 : p + n;
    return true;
}

/* PyTorch's samples/s of a case (bench/train_torch.py on the data file `data`, pinned to CPU
 * cpu with taskset where cpu >= 0), or 0 when it cannot run. */
typedef struct {
    double wall, cpu; /* samples per second of wall time and of the process's CPU time (0: unknown) */
} torch_rates;

static torch_rates torch_rate(const bench_case *bc, const char *data, int cpu) {
    const char *root = getenv("DTRAIN_ROOT");
    char cmd[1536], line[512], pin[32] = "";
    if (cpu >= 0) snprintf(pin, sizeof pin, "taskset -c %d ", cpu);
    snprintf(
        cmd, sizeof cmd,
        "%s/usr/bin/python3 %s%sbench/train_torch.py --model %s --batch %d --seconds %g --data %s --nb %d 2>/dev/null",
        pin, root ? root : "", root ? "/" : "", bc->name, bc->batch, bc->min_s, data, BENCH_NB);
    FILE *f = popen(cmd, "r");
    torch_rates r = {0, 0};
    while (f && fgets(line, sizeof line, f)) {
        const char *k = strstr(line, "\"samples_per_s\":"), *c = strstr(line, "\"samples_per_cpu_s\":");
        if (k) r.wall = atof(k + 16);
        if (c) r.cpu = atof(c + 20);
    }
    if (f) pclose(f);
    return r;
}

/* The notes of the kernel choices the rows ran (dt_kernels_note: static texts, each kept once),
 * with the "kernels precision" of the rows that had it ("blas bf16, blas fp16"). */
typedef struct {
    const char *text[8];
    char rows[8][128];
    int n;
} bench_notes;

static void notes_add(bench_notes *nt, const char *kernels, const char *precision) {
    const char *t = dt_kernels_note();
    int i = 0;
    while (i < nt->n && nt->text[i] != t) i++;
    if (!t || i == 8) return;
    if (i == nt->n) nt->text[nt->n++] = t;
    char *r = nt->rows[i];
    const size_t len = strlen(r);
    char row[80];
    snprintf(row, sizeof row, "%.31s %.31s", kernels, precision);
    if (!strstr(r, row)) snprintf(r + len, sizeof nt->rows[0] - len, "%s%s", len ? ", " : "", row);
}

/* The rows of one case: every kernel library x precision, each with its ratio to the first row
 * (and to PyTorch's rate tr when vs_torch); appends each row's JSON object to json. */
static dt_status bench_rows(const bench_case *bc, const bench_data *d, const char *kernels, const char *precisions,
                            double sg, bool vs_torch, bool profile, torch_rates trs, bench_notes *notes, char *json,
                            size_t cap, int *jn, int *done) {
    const double tr = trs.wall;
    char w[32], v[32];
    double first = 0;
    for (const char *l = kernels; next_word(&l, w, sizeof w);)
        for (const char *q = precisions; next_word(&q, v, sizeof v);) {
            double sps = 0, cps = 0, gf = 0;
            DT_TRY(dt_kernels_select(w, v));
            notes_add(notes, w, v);
            dt_status s = bench_model(bc, d, profile, &sps, &cps, &gf);
            if (s != DT_OK) return dt_error_wrap(s, "%s %s", w, v);
            if (first == 0) first = sps;
            const int T = dt_model_spec_is_gpt(bc->spec) ? 64 : 1;
            printf("%-6s %6d %-8s %-5s %14.0f %12.0f %12.0f %10.1f %9.0f%% %7.2fx", bc->name, bc->batch, w, v, sps, cps,
                   sps * T, gf, 100 * gf / sg, sps / first);
            if (vs_torch && tr > 0) printf(" %10.0f %8.2fx", tr, sps / tr);
            else if (vs_torch) printf(" %10s %9s", "-", "-");
            if (vs_torch && trs.cpu > 0) printf(" %12.0f %8.2fx", trs.cpu, cps / trs.cpu);
            else if (vs_torch) printf(" %12s %9s", "-", "-");
            printf("\n");
            fflush(stdout);
            if (*jn < (int)cap - 300)
                *jn += snprintf(
                    json + *jn, cap - (size_t)*jn,
                    "%s{\"model\": \"%s\", \"batch\": %d, \"kernels\": \"%s\", \"precision\": \"%s\", "
                    "\"samples_per_s\": %.1f, \"samples_per_cpu_s\": %.1f, \"tokens_per_s\": %.1f, \"gflops\": %.2f, "
                    "\"torch_samples_per_s\": %.1f, \"torch_samples_per_cpu_s\": %.1f}",
                    (*done)++ ? ", " : "", bc->name, bc->batch, w, v, sps, cps, sps * T, gf, tr, trs.cpu);
        }
    return DT_OK;
}

/* --cpu: pins this process (and so the PyTorch side it starts with taskset) to CPU cpu, or not
 * for -1; -1 when done, else the exit status of a bad value. */
static int pin_to_cpu(int cpu) {
    if (cpu == -1) return -1;
    if (cpu < -1) return dt_cli_usage(NULL, "--cpu %d: give a CPU number, or -1 for no pinning", cpu);
    if (cpu >= CPU_SETSIZE) return dt_cli_usage(NULL, "--cpu %d: give a CPU number below %d", cpu, CPU_SETSIZE);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
        return dt_cli_usage("see `taskset -p $$` for the CPUs you may use", "--cpu %d: cannot pin to it (%s)", cpu,
                            strerror(errno));
    return -1;
}

/* One case: its data loaded once (and written for PyTorch when vs_torch), PyTorch's rate, then
 * `repeat` interleaved passes over its rows. */
static dt_status bench_case_run(const bench_case *bc, const char *kernels, const char *precisions, double sg,
                                bool vs_torch, bool profile, int repeat, int cpu, bench_notes *notes, char *json,
                                size_t cap, int *jn, int *done) {
    dt_model *m = NULL;
    DT_TRY(dt_model_build(&m, bc->spec, 1, 28, 28));
    bench_data d = {0};
    dt_status s = bench_data_load(&d, m, bc->batch);
    dt_model_destroy(m);
    DT_TRY(s);
    printf("# %s b%d data: %s\n", bc->name, bc->batch, d.source);
    torch_rates tr = {0, 0};
    char path[512];
    if (vs_torch && (s = bench_data_write(&d, bc->batch, path, sizeof path)) == DT_OK) {
        tr = torch_rate(bc, path, cpu);
        unlink(path);
    }
    for (int rep = 0; s == DT_OK && rep < repeat; rep++)
        s = bench_rows(bc, &d, kernels, precisions, sg, vs_torch, profile, tr, notes, json, cap, jn, done);
    bench_data_free(&d);
    return s;
}

/* Checks and applies bench train's settings: the kernel libraries (default: deflib's, the build's
 * first) and precisions, --seconds, --threads, --repeat, the CPU pinning (-2: the default). -1 when
 * they are good, else the exit code. */
static int train_settings(const char **kernels, char deflib[16], bool vs_blas, const char *precisions, float seconds,
                          int threads, int repeat, int *cpu) {
    sscanf(dt_kernels_describe(), "%15s", deflib);
    if (!*kernels) *kernels = vs_blas ? (dt_kernels_onednn_built() ? "onednn,blas" : "blas") : deflib;
    else if (vs_blas && !strstr(*kernels, "blas"))
        return dt_cli_usage(NULL, "--vs-blas with --kernels %s: add blas to the list", *kernels);
    char w[32], v[32];
    for (const char *l = *kernels; next_word(&l, w, sizeof w);) /* check every name before running */
        for (const char *q = precisions; next_word(&q, v, sizeof v);)
            if (dt_kernels_select(w, v) != DT_OK) return dt_cli_usage(NULL, "%s", dt_last_error());
    if (!(seconds >= 0) || seconds > 3600)
        return dt_cli_usage("e.g. --seconds 1 (0: 8 timed steps per case)", "--seconds %g: give 0 to 3600", seconds);
    if (threads < 1) return dt_cli_usage(NULL, "--threads %d: need at least 1", threads);
    if (*cpu == -2) *cpu = threads == 1 ? first_cpu() : -1;
    int r = pin_to_cpu(*cpu);
    if (r >= 0) return r;
    dt_set_threads(threads);
    if (repeat < 1) return dt_cli_usage(NULL, "--repeat %d: give 1 or more", repeat);
    return -1;
}

/* Prints the header lines and the table's heading; starts the JSON line in json (its length). */
static int train_header(int threads, int cpu, double sg, bool vs_torch, char *json, size_t cap) {
    printf("# dtrain bench train: %d thread%s, real data (Fashion-MNIST, KJV), ", threads, threads > 1 ? "s" : "");
    if (cpu >= 0) printf("both sides pinned to CPU %d\n", cpu);
    else printf("not pinned\n");
    dt_bench_print_machine();
    printf("# sgemm 1024^3: %.1f GFLOP/s\n", sg);
    printf("%-6s %6s %-8s %-5s %14s %12s %12s %10s %10s %8s%s\n", "model", "batch", "kernels", "prec", "samples/s",
           "per cpu-s", "tokens/s", "GFLOP/s", "of sgemm", "ratio",
           vs_torch ? "    torch/s  vs torch  torch/cpu-s  vs (cpu)" : "");
    return snprintf(json, cap,
                    "{\"bench\": \"train\", \"threads\": %d, \"cpu\": %d, \"data\": \"real\", \"sgemm_gflops\": %.2f, "
                    "\"openblas_core\": \"%s\", \"cases\": [",
                    threads, cpu, sg, dt_blas_corename());
}

/* Prints oneDNN's choices and the notes, then the JSON line (json: its first jn characters). */
static void train_footer(const bench_notes *notes, char *json, size_t cap, int jn) {
    char impls[1536];
    dt_kernels_impls(impls, sizeof impls);
    printf("# onednn chose: %s\n", impls[0] ? impls : "(not run)");
    char note[8][512]; /* the library's terms as flags */
    for (int i = 0; i < notes->n; i++) dt_cli_flag_terms(notes->text[i], note[i], sizeof note[i]);
    for (int i = 0; i < notes->n; i++) printf("# note (%s rows): %s\n", notes->rows[i], note[i]);
    if (jn < (int)cap - 64) jn += snprintf(json + jn, cap - (size_t)jn, "], \"notes\": [");
    for (int i = 0; i < notes->n && jn < (int)cap - 400; i++)
        jn += snprintf(json + jn, cap - (size_t)jn, "%s{\"rows\": \"%s\", \"note\": \"%s\"}", i ? ", " : "",
                       notes->rows[i], note[i]);
    printf("%s], \"onednn_impls\": \"%s\"}\n", json, impls);
}

int dt_bench_train(int argc, char **argv) {
    float seconds = 3;
    int threads = 1, only_batch = 0, repeat = 1, cpu = -2;
    bool vs_blas = false, vs_torch = false, profile = false;
    const char *only_model = NULL, *kernels = NULL, *precisions = "fp32", *spec = NULL;
    const dt_flag flags[] = {
        {"seconds", DT_FLAG_FLOAT, &seconds, "S", "time per case"},
        {"threads", DT_FLAG_INT, &threads, "N", "BLAS threads"},
        {"model", DT_FLAG_STR, &only_model, "NAME", "run only the cases of this model (mlp, cnn or gpt)"},
        {"batch", DT_FLAG_INT, &only_batch, "N", "run only the cases with this batch"},
        {"kernels", DT_FLAG_STR, &kernels, "LIST", "kernel libraries, comma-separated: onednn, blas"},
        {"precision", DT_FLAG_STR, &precisions, "LIST", "GEMM precisions, comma-separated: fp32, bf16, fp16"},
        {"vs-blas", DT_FLAG_BOOL, &vs_blas, NULL, "add rows of the blas kernels"},
        {"vs-torch", DT_FLAG_BOOL, &vs_torch, NULL, "add PyTorch's samples/s (python3-torch, one thread)"},
        {"spec", DT_FLAG_STR, &spec, "SPEC", "run only this model spec (1x28x28 inputs) at --batch (default 128)"},
        {"repeat", DT_FLAG_INT, &repeat, "N", "run the rows of each case N times, interleaved (A/B timing)"},
        {"profile", DT_FLAG_BOOL, &profile, NULL, "print each node's forward and backward ms per step"},
        {"cpu", DT_FLAG_INT, &cpu, "N",
         "pin both sides to CPU N (default with --threads 1: the first allowed CPU; -1: no pinning)"},
    };
    int r = dt_flags_parse(argc, argv, 1, flags, sizeof flags / sizeof *flags, USAGE, NULL, 0, NULL, NULL);
    if (r) return r < 0 ? 2 : 0;
    char deflib[16] = "";
    if ((r = train_settings(&kernels, deflib, vs_blas, precisions, seconds, threads, repeat, &cpu)) >= 0) return r;
    const bench_case presets[] = {
        {"mlp", "mlp", 32, seconds},
        {"mlp", "mlp", 128, seconds},
        {"cnn", "cnn", 128, seconds},
        {"gpt", "gpt:L=4,H=4,C=128,T=64", 12, seconds},
    };
    const bench_case custom[] = {{"spec", spec, only_batch ? only_batch : 128, seconds}};
    const bench_case *cases = spec ? custom : presets;
    const size_t ncases = spec ? 1 : sizeof presets / sizeof *presets;
    int matches = 0; /* refused before anything is measured or printed */
    for (size_t i = 0; i < ncases; i++)
        matches += spec || ((!only_model || !strcmp(only_model, cases[i].name)) &&
                            (!only_batch || only_batch == cases[i].batch));
    if (!matches) {
        char batch[32] = "";
        if (only_batch) snprintf(batch, sizeof batch, " --batch %d", only_batch);
        return dt_cli_usage("models: mlp (batch 32, 128), cnn (batch 128), gpt (batch 12); or --spec SPEC --batch N",
                            "no benchmark case matches%s%s%s", only_model ? " --model " : "",
                            only_model ? only_model : "", batch);
    }
    double sg = sgemm_gflops(1024, seconds < 1 ? seconds : 1);
    char json[16384];
    int jn = train_header(threads, cpu, sg, vs_torch, json, sizeof json);
    int done = 0;
    bench_notes notes = {.n = 0};
    for (size_t i = 0; i < ncases; i++) {
        if (!spec &&
            ((only_model && strcmp(only_model, cases[i].name)) || (only_batch && only_batch != cases[i].batch)))
            continue;
        if (bench_case_run(&cases[i], kernels, precisions, sg, vs_torch && !spec, profile, repeat, cpu, &notes, json,
                           sizeof json, &jn, &done) != DT_OK)
            return dt_cli_fail("--data fashion-mnist and kjv must work (scripts/install-deps installs both)",
                               "bench %s: %s", cases[i].name, dt_last_error());
    }
    if (!done)
        return dt_cli_usage("models: mlp (batch 32, 128), cnn (batch 128), gpt (batch 12)",
                            "no benchmark case matches");
    train_footer(&notes, json, sizeof json, jn);
    return 0;
}
