/* Benchmark helpers: run the real dtrain command and read its metrics. */
#include "cli/bench_util.h"

#include "cli/cli.h"
#include "dtrain/kernels.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int dt_bench_self(char *out, size_t cap) {
    ssize_t len = readlink("/proc/self/exe", out, cap - 1);
    if (len <= 0) return dt_cli_fail(NULL, "bench: cannot find this program (/proc/self/exe)");
    out[len] = '\0';
    return 0;
}

int dt_bench_train_run(const char *args, const char *metrics, char *line, size_t cap) {
    char exe[PATH_MAX], cmd[8192];
    if (dt_bench_self(exe, sizeof exe)) return 1;
    snprintf(cmd, sizeof cmd, "'%s' train %s --quiet --metrics '%s' > /dev/null", exe, args, metrics);
    unlink(metrics);
    if (system(cmd) != 0) return dt_cli_fail(NULL, "bench: '%s' failed", cmd);
    FILE *f = fopen(metrics, "r");
    if (!f) return dt_cli_fail(NULL, "bench: no metrics in %s", metrics);
    line[0] = '\0';
    char buf[4096];
    while (fgets(buf, sizeof buf, f)) snprintf(line, cap, "%s", buf);
    fclose(f);
    unlink(metrics);
    return line[0] ? 0 : dt_cli_fail(NULL, "bench: empty metrics file %s", metrics);
}

double dt_bench_json_field(const char *line, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    return p ? strtod(p + strlen(pat), NULL) : -1;
}

void dt_bench_print_machine(void) {
    char model[256] = "unknown", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            const char *colon = strchr(line, ':');
            if (colon) snprintf(model, sizeof model, "%s", colon + 2);
            model[strcspn(model, "\n")] = '\0';
            break;
        }
    if (f) fclose(f);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double load = -1;
    if ((f = fopen("/proc/loadavg", "r")) && fscanf(f, "%lf", &load) != 1) load = -1;
    if (f) fclose(f);
    printf("# cpu: %s (%ld cores online; load average %.2f)\n", model, cores, load);
    if (cores > 0 && load > 0.5 * (double)cores)
        printf("# warning: the machine is loaded (load average %.2f on %ld cores): figures are lower and noisier\n",
               load, cores);
    /* dtrain's re-exec sets both variables to the same core; anything else is the user's. */
    const char *env = getenv("OPENBLAS_CORETYPE"), *reexec = getenv("DTRAIN_BLAS_REEXEC");
    const char *by = env && reexec && !strcmp(env, reexec)
                         ? " (OPENBLAS_CORETYPE set by dtrain: OpenBLAS did not know this CPU)"
                     : env && *env ? " (OPENBLAS_CORETYPE set)"
                                   : "";
    printf("# openblas: %s kernels%s\n", dt_blas_corename(), by);
    if (dt_blas_avx512_unused())
        printf("# note: this CPU has AVX-512 but OpenBLAS runs its %s kernels: %s for the AVX-512 ones "
               "(they drive the sgemm and blas rows)\n",
               dt_blas_corename(),
               env && *env ? "unset OPENBLAS_CORETYPE or set it to SkylakeX" : "set OPENBLAS_CORETYPE=SkylakeX");
}

void dt_bench_warn_cores(int ranks) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && ranks > cores)
        printf("# warning: %d ranks on %ld cores: they share cores, so speed-ups are bounded by %ld\n", ranks, cores,
               cores);
}
