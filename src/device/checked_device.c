/* The checked device (--device checked): the CPU kernels on an arena that host code cannot touch.
 * The arena is one PROT_NONE mapping; each entry point opens it (read/write) for its duration and
 * closes it after, under a reference count and a lock, since the comm and loader threads call the
 * device too. A host dereference of device memory anywhere above device/ then faults at once
 * (SIGSEGV) instead of working by accident, which is how code meant for a GPU is kept honest on a
 * machine without one. While one thread is inside an entry point the arena is open to all, so a
 * stray access from another thread at that moment goes unseen: the check is per call, not per
 * thread.
 *
 * Blocks are carved first-fit from the arena, 64-byte aligned, and coalesced when freed; their
 * bookkeeping lives on the host heap (the arena itself is closed). Every block is charged against
 * --mem-limit like a dt_alloc block. Options: arena=BYTES (K/M/G suffixes; default 1G of address
 * space, reserved without backing until written). */
#include "device/device.h"
#include "device/kernel_slots.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { ALIGN = 64 };

typedef struct span {
    size_t off, len;
    bool used;
    struct span *next; /* in address order */
} span;

typedef struct {
    dt_dev base;
    char *arena;
    size_t size;
    span *spans;
    pthread_mutex_t lock; /* guards spans, opens and the protection changes */
    int opens;            /* entry points running now */
} checked_dev;

static checked_dev *cd(dt_dev *d) { return (checked_dev *)d; }

/* Opens the arena for an entry point (the first one in makes it read/write). */
static void enter(dt_dev *d) {
    checked_dev *c = cd(d);
    pthread_mutex_lock(&c->lock);
    if (c->opens++ == 0 && mprotect(c->arena, c->size, PROT_READ | PROT_WRITE) != 0) {
        perror("checked device: mprotect (open)");
        abort(); /* the device cannot run a kernel: a programmer error (arena gone) */
    }
    pthread_mutex_unlock(&c->lock);
}

/* Closes it again when the last entry point leaves. */
static void leave(dt_dev *d) {
    checked_dev *c = cd(d);
    pthread_mutex_lock(&c->lock);
    if (--c->opens == 0 && mprotect(c->arena, c->size, PROT_NONE) != 0) {
        perror("checked device: mprotect (close)");
        abort();
    }
    pthread_mutex_unlock(&c->lock);
}

bool dt_checked_arena_open(const dt_dev *d) {
    checked_dev *c = (checked_dev *)d;
    pthread_mutex_lock(&c->lock);
    const bool open = c->opens > 0;
    pthread_mutex_unlock(&c->lock);
    return open;
}

static void *checked_alloc(dt_dev *d, size_t bytes) {
    checked_dev *c = cd(d);
    const size_t len = bytes ? (bytes + ALIGN - 1) / ALIGN * ALIGN : ALIGN;
    if (dt_mem_charge(len, "checked device block") != DT_OK) return NULL;
    pthread_mutex_lock(&c->lock);
    span *s = c->spans;
    while (s && (s->used || s->len < len)) s = s->next;
    span *rest = s && s->len > len ? malloc(sizeof *rest) : NULL;
    if (s && s->len > len && !rest) s = NULL; /* no host memory for the bookkeeping */
    if (s && rest) {
        *rest = (span){.off = s->off + len, .len = s->len - len, .used = false, .next = s->next};
        s->len = len, s->next = rest;
    }
    if (s) s->used = true;
    pthread_mutex_unlock(&c->lock);
    if (!s) {
        dt_mem_uncharge(len);
        dt_error(DT_ENOMEM,
                 "checked device: no room for %zu bytes in its %zu-byte arena: give a larger one "
                 "(`device` checked:arena=BYTES)",
                 bytes, c->size);
        return NULL;
    }
    return c->arena + s->off;
}

static void checked_free(dt_dev *d, void *p) {
    if (!p) return;
    checked_dev *c = cd(d);
    const size_t off = (size_t)((char *)p - c->arena);
    pthread_mutex_lock(&c->lock);
    span *prev = NULL, *s = c->spans;
    while (s && s->off != off) prev = s, s = s->next;
    if (!s || !s->used || (char *)p < c->arena || off >= c->size) {
        pthread_mutex_unlock(&c->lock);
        fprintf(stderr, "checked device: free of %p, which is not a live block of this device\n", p);
        abort(); /* a double free or a foreign pointer: a programmer error */
    }
    const size_t len = s->len;
    s->used = false;
    if (s->next && !s->next->used) { /* merge with the next free span */
        span *n = s->next;
        s->len += n->len, s->next = n->next;
        free(n);
    }
    if (prev && !prev->used) { /* and with the previous one */
        prev->len += s->len, prev->next = s->next;
        free(s);
    }
    pthread_mutex_unlock(&c->lock);
    dt_mem_uncharge(len);
}

static void checked_synchronize(dt_dev *d) { (void)d; }

/* Every other entry point: the CPU kernel between enter and leave. */
#define CK(name, params, args)          \
    static void checked_##name params { \
        enter(d);                       \
        dt_cpu_step_ops.name args;      \
        leave(d);                       \
    }
CK(upload, (dt_dev * d, void *dst, const void *src, size_t bytes), (d, dst, src, bytes))
CK(download, (dt_dev * d, void *dst, const void *src, size_t bytes), (d, dst, src, bytes))
CK(copy, (dt_dev * d, void *dst, const void *src, size_t bytes), (d, dst, src, bytes))
CK(fill_f32, (dt_dev * d, float *x, float v, size_t n), (d, x, v, n))
CK(accumulate, (dt_dev * d, float *y, const float *x, size_t n), (d, y, x, n))
CK(scale, (dt_dev * d, float *x, float s, size_t n), (d, x, s, n))
CK(unscale, (dt_dev * d, float *x, float inv, size_t n, int32_t *flag), (d, x, inv, n, flag))
CK(sqnorm, (dt_dev * d, double *out, const float *x, size_t n), (d, out, x, n))
CK(cast_f32_bf16, (dt_dev * d, uint16_t *out, const float *x, size_t n), (d, out, x, n))
CK(cast_bf16_f32, (dt_dev * d, float *out, const uint16_t *x, size_t n), (d, out, x, n))
CK(cast_f32_f16, (dt_dev * d, uint16_t *out, const float *x, size_t n), (d, out, x, n))
CK(cast_f16_f32, (dt_dev * d, float *out, const uint16_t *x, size_t n), (d, out, x, n))
CK(sgd_step, (dt_dev * d, const dt_step_args *a, float *p, const float *g, float *buf, size_t n), (d, a, p, g, buf, n))
CK(adam_step, (dt_dev * d, const dt_step_args *a, float *p, const float *g, float *m, float *v, size_t n),
   (d, a, p, g, m, v, n))
CK(xent_shard, (dt_dev * d, dt_xent_phase phase, const dt_xent_shard_args *a), (d, phase, a))
#undef CK

/* ---- the kernel table: every slot of a CPU table between enter and leave ----
 * A kernel slot takes no device argument, so each wrapped table is one of KBIND bindings (a
 * checked device and the CPU table it wraps), each with its own set of wrapper functions
 * generated from DT_KERNEL_SLOTS. */
enum { KBIND = 4 };
typedef struct {
    dt_dev *dev;                  /* NULL: free */
    const dt_kernel_table *inner; /* the CPU table it runs */
    dt_kernel_table table;        /* the wrapped one the graph calls */
} kbinding;
static kbinding g_kb[KBIND];
static pthread_mutex_t g_kb_lock = PTHREAD_MUTEX_INITIALIZER;

#define KW_V(I, name, params, args)     \
    static void ck##I##_##name params { \
        enter(g_kb[I].dev);             \
        g_kb[I].inner->name args;       \
        leave(g_kb[I].dev);             \
    }
#define KW_R(I, type, name, params, args)        \
    static type ck##I##_##name params {          \
        enter(g_kb[I].dev);                      \
        const type r = g_kb[I].inner->name args; \
        leave(g_kb[I].dev);                      \
        return r;                                \
    }
#define KF_V(I, name, params, args) t->name = in->name ? ck##I##_##name : NULL;
#define KF_R(I, type, name, params, args) t->name = in->name ? ck##I##_##name : NULL;
#define KBINDING(I)                   \
    DT_KERNEL_SLOTS(KW_V##I, KW_R##I) \
    static void fill##I(dt_kernel_table *t, const dt_kernel_table *in) { DT_KERNEL_SLOTS(KF_V##I, KF_R##I) }
#define KW_V0(n, p, a) KW_V(0, n, p, a)
#define KW_R0(t, n, p, a) KW_R(0, t, n, p, a)
#define KF_V0(n, p, a) KF_V(0, n, p, a)
#define KF_R0(t, n, p, a) KF_R(0, t, n, p, a)
#define KW_V1(n, p, a) KW_V(1, n, p, a)
#define KW_R1(t, n, p, a) KW_R(1, t, n, p, a)
#define KF_V1(n, p, a) KF_V(1, n, p, a)
#define KF_R1(t, n, p, a) KF_R(1, t, n, p, a)
#define KW_V2(n, p, a) KW_V(2, n, p, a)
#define KW_R2(t, n, p, a) KW_R(2, t, n, p, a)
#define KF_V2(n, p, a) KF_V(2, n, p, a)
#define KF_R2(t, n, p, a) KF_R(2, t, n, p, a)
#define KW_V3(n, p, a) KW_V(3, n, p, a)
#define KW_R3(t, n, p, a) KW_R(3, t, n, p, a)
#define KF_V3(n, p, a) KF_V(3, n, p, a)
#define KF_R3(t, n, p, a) KF_R(3, t, n, p, a)
KBINDING(0)
KBINDING(1)
KBINDING(2)
KBINDING(3)
static void (*const g_fill[KBIND])(dt_kernel_table *, const dt_kernel_table *) = {fill0, fill1, fill2, fill3};

/* The wrapped table of CPU table `cpu` on device d: its binding, or a new one. */
static const dt_kernel_table *checked_kernels(dt_dev *d, const dt_kernel_table *cpu) {
    pthread_mutex_lock(&g_kb_lock);
    int i = 0, free_i = -1;
    for (; i < KBIND && !(g_kb[i].dev == d && g_kb[i].inner == cpu); i++)
        if (!g_kb[i].dev && free_i < 0) free_i = i;
    if (i == KBIND && free_i >= 0) {
        i = free_i;
        g_kb[i].table = *cpu; /* its name, dtype and precision */
        g_fill[i](&g_kb[i].table, cpu);
        g_kb[i].dev = d, g_kb[i].inner = cpu;
    }
    pthread_mutex_unlock(&g_kb_lock);
    if (i == KBIND) {
        dt_error(DT_ENOTSUP, "checked device: more than %d kernel tables (devices x `kernels`/`precision`) at once",
                 KBIND);
        return NULL;
    }
    return &g_kb[i].table;
}

/* Frees the bindings of device d (it is being destroyed). */
static void release_kernels(dt_dev *d) {
    pthread_mutex_lock(&g_kb_lock);
    for (int i = 0; i < KBIND; i++)
        if (g_kb[i].dev == d) g_kb[i].dev = NULL, g_kb[i].inner = NULL;
    pthread_mutex_unlock(&g_kb_lock);
}

static const dt_device_ops checked_ops = {
    .alloc = checked_alloc,
    .free = checked_free,
    .upload = checked_upload,
    .download = checked_download,
    .copy = checked_copy,
    .fill_f32 = checked_fill_f32,
    .synchronize = checked_synchronize,
    .accumulate = checked_accumulate,
    .scale = checked_scale,
    .unscale = checked_unscale,
    .sqnorm = checked_sqnorm,
    .cast_f32_bf16 = checked_cast_f32_bf16,
    .cast_bf16_f32 = checked_cast_bf16_f32,
    .cast_f32_f16 = checked_cast_f32_f16,
    .cast_f16_f32 = checked_cast_f16_f32,
    .sgd_step = checked_sgd_step,
    .adam_step = checked_adam_step,
    .xent_shard = checked_xent_shard,
    .kernels = checked_kernels,
    .plan_layouts = dt_cpu_plan_layouts, /* the CPU kernels, the CPU plan (no memory touched) */
};

/* "arena=BYTES" with K/M/G suffixes into *size. */
static dt_status parse_options(const char *opt, size_t *size) {
    *size = (size_t)1 << 30;
    if (!opt || !*opt) return DT_OK;
    if (strncmp(opt, "arena=", 6))
        return dt_error(DT_EINVAL,
                        "device checked: unknown option '%s' (it takes arena=BYTES, e.g. checked:arena=512M)", opt);
    char *end;
    errno = 0;
    const double v = strtod(opt + 6, &end);
    const double mul = *end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1.0;
    if (mul > 1) end++;
    if (errno || end == opt + 6 || *end || !(v * mul >= 4096) || v * mul > 1099511627776.0)
        return dt_error(DT_EINVAL, "device checked: arena=%s: give a size from 4K to 1T (K, M, G suffixes)", opt + 6);
    *size = ((size_t)(v * mul) + 4095) / 4096 * 4096;
    return DT_OK;
}

static dt_status checked_create(dt_dev **out, const char *options) {
    size_t size;
    DT_TRY(parse_options(options, &size));
    checked_dev *c = calloc(1, sizeof *c);
    span *all = malloc(sizeof *all);
    void *arena = c && all ? mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                           : MAP_FAILED;
    if (arena == MAP_FAILED) {
        free(c), free(all);
        return dt_error(DT_ENOMEM,
                        "device checked: cannot reserve a %zu-byte arena (%s): give a smaller one "
                        "(`device` checked:arena=BYTES)",
                        size, strerror(errno));
    }
    *all = (span){.off = 0, .len = size, .used = false, .next = NULL};
    c->arena = arena, c->size = size, c->spans = all;
    pthread_mutex_init(&c->lock, NULL);
    c->base.ops = &checked_ops;
    *out = &c->base;
    return DT_OK;
}

static void checked_destroy(dt_dev *d) {
    checked_dev *c = cd(d);
    release_kernels(d);
    for (span *s = c->spans, *n; s; s = n) {
        n = s->next;
        if (s->used) dt_mem_uncharge(s->len); /* a leak of the caller's, still not counted forever */
        free(s);
    }
    munmap(c->arena, c->size);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

const dt_device_kind dt_device_kind_checked = {
    .name = "checked",
    .help =
        "the CPU kernels on memory the host cannot touch (PROT_NONE outside device calls): proves code device-neutral",
    .options = "arena=BYTES",
    .create = checked_create,
    .destroy = checked_destroy,
};
