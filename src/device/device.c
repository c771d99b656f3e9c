/* The device registry (device.h) and the CPU device: host memory from dt_alloc (charged against
 * --mem-limit by core/mem.c) and the CPU kernels of cpu_step.c. A new device is a file with its
 * dt_device_kind and one line in KINDS below. */
#include "device/device.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const dt_device_kind dt_device_kind_cpu, dt_device_kind_checked, dt_device_kind_cuda;

static const dt_device_kind *const KINDS[] = {&dt_device_kind_cpu, &dt_device_kind_checked, &dt_device_kind_cuda};
enum { NKINDS = sizeof KINDS / sizeof *KINDS };

const dt_device_kind *const *dt_device_kinds(int *n) {
    if (n) *n = NKINDS;
    return KINDS;
}

const dt_device_kind *dt_device_find(const char *name) {
    const size_t len = name ? strcspn(name, ":") : 0;
    for (int i = 0; i < NKINDS; i++)
        if (len && strlen(KINDS[i]->name) == len && !strncmp(KINDS[i]->name, name, len)) return KINDS[i];
    char names[256] = "";
    for (int i = 0; i < NKINDS; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", KINDS[i]->name);
    dt_error(DT_EINVAL, "device '%.*s': unknown (devices: %s)", (int)(len ? len : 7), len ? name : "(empty)", names);
    return NULL;
}

dt_status dt_device_create(dt_dev **out, const char *spec) {
    *out = NULL;
    const dt_device_kind *k = dt_device_find(spec);
    if (!k) return DT_EINVAL;
    const char *colon = strchr(spec, ':');
    DT_TRY(k->create(out, colon ? colon + 1 : ""));
    (*out)->kind = k;
    return DT_OK;
}

void dt_device_destroy(dt_dev *d) {
    if (d && d->kind->destroy) d->kind->destroy(d);
}

/* ---- the CPU device ---- */

static void *cpu_alloc(dt_dev *d, size_t bytes) {
    (void)d;
    void *p = dt_alloc(bytes);
    if (!p && dt_last_error()[0] == '\0')
        dt_error(DT_ENOMEM, "cpu device: cannot allocate %zu bytes: use a smaller model or batch", bytes);
    return p;
}

static void cpu_free(dt_dev *d, void *p) {
    (void)d;
    dt_free(p);
}

static void cpu_synchronize(dt_dev *d) { (void)d; }

static const dt_kernel_table *cpu_kernels(dt_dev *d, const dt_kernel_table *cpu) {
    (void)d;
    return cpu;
}

static dt_device_ops cpu_ops;
static dt_dev cpu_dev;

static void cpu_ops_init(void) {
    cpu_ops = dt_cpu_step_ops;
    cpu_ops.alloc = cpu_alloc;
    cpu_ops.free = cpu_free;
    cpu_ops.synchronize = cpu_synchronize;
    cpu_ops.kernels = cpu_kernels;
    cpu_dev.ops = &cpu_ops;
    cpu_dev.host_memory = true;
}

dt_dev *dt_device_cpu(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cpu_ops_init);
    cpu_dev.kind = &dt_device_kind_cpu;
    return &cpu_dev;
}

static dt_status cpu_create(dt_dev **out, const char *options) {
    if (options && *options) return dt_error(DT_EINVAL, "device cpu: takes no options (got '%s')", options);
    *out = dt_device_cpu();
    return DT_OK;
}

const dt_device_kind dt_device_kind_cpu = {
    .name = "cpu",
    .help = "host memory and the CPU kernels (oneDNN or OpenBLAS: --kernels)",
    .options = "",
    .create = cpu_create,
    .destroy = NULL, /* the process's one CPU device lives as long as the process */
};

#ifndef DT_HAVE_CUDA
/* ---- cuda in a build without it (make CUDA=0, or no nvcc): the kind says how to get it ---- */

static dt_status cuda_absent(dt_dev **out, const char *options) {
    (void)out, (void)options;
    return dt_error(DT_ENOTSUP, "device cuda: this dtrain was built without CUDA: rebuild with `make CUDA=1` and "
                                "the CUDA toolkit (nvcc on PATH or in /usr/local/cuda); use `device` cpu");
}

const dt_device_kind dt_device_kind_cuda = {
    .name = "cuda",
    .help = "an NVIDIA GPU (cuda:N): not in this build (make CUDA=1 with the CUDA toolkit)",
    .options = "N",
    .create = cuda_absent,
    .destroy = NULL,
};
#endif
