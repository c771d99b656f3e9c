/* The device layer (DESIGN.md "Memory is first-class"; ggml's buffer types and backends, llm.c's
 * kernels): a device owns model memory (parameters, gradients, optimizer state, activations) and
 * runs every kernel that touches it. Upper layers hold device pointers they never dereference; they
 * move bytes in and out with upload/download and ask the device for the training-step arithmetic.
 *
 * A device is a table of functions (dt_device_ops) reached from a registry of kinds
 * (dt_device_kind: name, option parser, help). Two kinds ship:
 *   cpu      host memory (dt_alloc) and the CPU kernels;
 *   checked  the CPU kernels on an arena the host cannot touch: it is PROT_NONE except while a
 *            device entry point runs, so a host dereference of device memory crashes at once.
 * Adding a device is one file with its table plus one line in device.c's registry.
 *
 * Contracts shared by every entry point: pointers named dev_* are device pointers of this device
 * (from alloc); host_* are host memory; counts are elements unless named bytes. Kernels never
 * allocate and never abort. Scalars that the training loop needs on the host (a non-finite flag,
 * norm partial sums) are written into device buffers: the host downloads one small buffer when it
 * needs a number, so a device with queues does not synchronise per kernel. */
#ifndef DT_DEVICE_H
#define DT_DEVICE_H

#include "backend/backend.h"
#include "dtrain/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dt_dev dt_dev;

/* The hyper-parameters of one optimizer step (the caller's dt_optim config and step count). */
typedef struct {
    float lr, weight_decay;
    float momentum;  /* sgd: 0 = none */
    bool nesterov;   /* sgd */
    bool first_step; /* sgd: the momentum buffer starts as the first gradient (torch) */
    float beta1, beta2, eps;
    bool decoupled; /* adamw: decay applied to the weights, not the gradient */
    int64_t t;      /* adam: steps taken before this one (bias corrections use t + 1) */
} dt_step_args;

/* The phases of xent_shard, between which the caller reduces rows across the vocabulary's shards. */
typedef enum {
    DT_XENT_MAX = 0, /* rows[i] = the largest logit of row i in the slice (then: max over the shards) */
    DT_XENT_SUMS,    /* dlogits = exp(logits - rows[i]); rows[N + 2i] = their sum, rows[N + 2i + 1] = the
                      * target's logit where the target is in the slice, else 0 (then: sum over the shards) */
    DT_XENT_GRAD,    /* dlogits = scale / counted x (softmax - one-hot of the target, where it is in the
                      * slice), 0 on a row whose target is `ignore`; *loss = the mean over the counted
                      * rows of log(sum) + max - target logit (0 when none), *counted their number */
} dt_xent_phase;

/* The operands of xent_shard (device pointers but for the scalars): logits and dlogits (N, Vl) hold
 * vocabulary ids [lo, lo + Vl) of V; targets (N) are global ids in [0, V) or `ignore`. */
typedef struct {
    const float *logits;
    const int32_t *targets;
    int N, Vl, lo, ignore;
    float scale;
    float *dlogits;
    float *rows;  /* 3N floats: the row maxima, then (sum of exponentials, target logit) per row */
    double *loss; /* DT_XENT_GRAD's outputs */
    int32_t *counted;
} dt_xent_shard_args;

/* A graph as the plan step sees it (dt_device_ops plan_layouts): per node what it is, what it
 * reads and its shape, nothing of nn/'s structs. */
typedef enum {
    DT_PLAN_OTHER = 0,
    DT_PLAN_CONV,    /* conv2d */
    DT_PLAN_MAXPOOL, /* max pooling (a relu before it may be fused into it: that relu is an alias) */
    DT_PLAN_RELU,
} dt_plan_op;

typedef struct {
    dt_plan_op op;
    int in[3], nin; /* the nodes it reads */
    bool alias;     /* its values are its first input's memory (flatten, reshape, a fused relu) */
    bool input;     /* a graph input (fed memory) */
    bool output;    /* the graph's output */
    int ndim;       /* per-sample dims: 3 for (C, H, W) values */
    int channels;   /* C where ndim is 3 */
} dt_plan_node;

/* What a plan decides: per node, whether its values and gradient are in the device's blocked
 * layout (the kernel table's *_blocked slots and dt_layout), and whether those chains are NHWC. */
typedef struct {
    bool *blocked; /* [n], written */
    bool nhwc;
} dt_plan_layouts;

typedef struct dt_device_ops {
    /* ---- memory ---- */
    /* A block of `bytes` device memory (64-byte aligned), charged against --mem-limit; NULL with
     * the error set (DT_ENOMEM naming the size and what to do) when it does not fit. */
    void *(*alloc)(dt_dev *d, size_t bytes);
    /* Frees a block from alloc (NULL is a no-op). */
    void (*free)(dt_dev *d, void *dev_p);
    void (*upload)(dt_dev *d, void *dev_dst, const void *host_src, size_t bytes);
    void (*download)(dt_dev *d, void *host_dst, const void *dev_src, size_t bytes);
    /* dev_dst and dev_src may not overlap. */
    void (*copy)(dt_dev *d, void *dev_dst, const void *dev_src, size_t bytes);
    void (*fill_f32)(dt_dev *d, float *dev_x, float value, size_t n);
    /* Waits until every call made so far has taken effect (a no-op on a synchronous device). */
    void (*synchronize)(dt_dev *d);

    /* ---- training-step primitives (f32 unless named) ---- */
    /* y += x (gradient accumulation where branches meet, micro-batches). */
    void (*accumulate)(dt_dev *d, float *dev_y, const float *dev_x, size_t n);
    /* x *= s. */
    void (*scale)(dt_dev *d, float *dev_x, float s, size_t n);
    /* Where every x is finite: x *= inv and *dev_nonfinite = 0; else x is untouched and
     * *dev_nonfinite = 1 (fp16 loss scaling: the step is then skipped). */
    void (*unscale)(dt_dev *d, float *dev_x, float inv, size_t n, int32_t *dev_nonfinite);
    /* *dev_out = the sum of x[i]^2 in double (one partial of a gradient norm). */
    void (*sqnorm)(dt_dev *d, double *dev_out, const float *dev_x, size_t n);
    /* bf16 (uint16_t) and f16 casts, round to nearest even; NaN stays NaN. */
    void (*cast_f32_bf16)(dt_dev *d, uint16_t *dev_out, const float *dev_x, size_t n);
    void (*cast_bf16_f32)(dt_dev *d, float *dev_out, const uint16_t *dev_x, size_t n);
    void (*cast_f32_f16)(dt_dev *d, uint16_t *dev_out, const float *dev_x, size_t n);
    void (*cast_f16_f32)(dt_dev *d, float *dev_out, const uint16_t *dev_x, size_t n);
    /* One SGD step on n f32 master weights p with gradients g (momentum buffer buf, NULL when
     * a->momentum is 0): torch.optim.SGD's arithmetic. */
    void (*sgd_step)(dt_dev *d, const dt_step_args *a, float *dev_p, const float *dev_g, float *dev_buf, size_t n);
    /* One Adam (a->decoupled: AdamW) step on n f32 master weights with moments m and v:
     * torch.optim.Adam/AdamW's arithmetic; subnormal moments are flushed to zero. */
    void (*adam_step)(dt_dev *d, const dt_step_args *a, float *dev_p, const float *dev_g, float *dev_m, float *dev_v,
                      size_t n);
    /* Softmax cross-entropy over a vocabulary split in slices across ranks (Megatron-LM's
     * vocabulary-parallel loss; one slice of the whole vocabulary is the plain loss), phase by
     * phase (dt_xent_phase): the caller reduces a->rows over the slices' ranks between them, so
     * the (N, V) logits never leave their device. */
    void (*xent_shard)(dt_dev *d, dt_xent_phase phase, const dt_xent_shard_args *a);

    /* ---- kernels ---- */
    /* The kernel table this device runs the graph's ops with, for the CPU table `cpu` (the kernel
     * library and GEMM precision --kernels and --precision chose): every slot takes device
     * pointers of this device. NULL with the error set when the device cannot run it. */
    const dt_kernel_table *(*kernels)(dt_dev *d, const dt_kernel_table *cpu);
    /* ---- plan ---- */
    /* The layouts of a graph's values for kernel table kt (this device's, from kernels): which
     * values stay in the table's blocked layout between the ops that take it, and whether NHWC.
     * The graph (nn/graph_layout.c) applies it and knows no library's layout. NULL: every value
     * plain (NCHW). */
    void (*plan_layouts)(dt_dev *d, const dt_kernel_table *kt, const dt_plan_node *nodes, int n, dt_plan_layouts *out);
} dt_device_ops;

/* A registry entry: a kind of device. create parses its options ("" for none: e.g. checked's
 * "arena=512M") and returns a device; DT_EINVAL naming the option on a bad one. */
typedef struct dt_device_kind {
    const char *name;
    const char *help;    /* one line for --help and the man page */
    const char *options; /* its option syntax for the help, "" when it has none */
    dt_status (*create)(dt_dev **out, const char *options);
    void (*destroy)(dt_dev *d);
} dt_device_kind;

/* Every device: its kind and ops; each kind's own struct begins with this. */
struct dt_dev {
    const dt_device_kind *kind;
    const dt_device_ops *ops;
    /* Its memory is host memory (the cpu device): code above may keep the host's fast paths
     * (a batch fed in place, ZeRO's page placement) where it would otherwise upload or copy, and
     * the communicator's collectives take its buffers in place. Where false, a collective over
     * model memory is staged through a host buffer (download, collective, upload) unless the
     * transport takes this kind's memory natively (dt_comm_device_native; parallel/'s
     * dt_strategy_stage_device asks both). */
    bool host_memory;
};

/* The registry, in order ("cpu" first); n gets its length. */
const dt_device_kind *const *dt_device_kinds(int *n);
/* The kind named `name` (before any ':'), or NULL with the error set, listing the names. */
const dt_device_kind *dt_device_find(const char *name);
/* Creates a device from a spec "NAME[:OPTIONS]" (e.g. "checked:arena=256M"). */
dt_status dt_device_create(dt_dev **out, const char *spec);
/* Destroys a device made by dt_device_create (NULL: no-op); every block must be freed first. */
void dt_device_destroy(dt_dev *d);
/* The process's CPU device (host memory): never destroyed. */
dt_dev *dt_device_cpu(void);

/* The CPU kernels of the training-step primitives, on host pointers: the CPU device's entries
 * and what the checked device runs inside its arena. */
extern const dt_device_ops dt_cpu_step_ops;
/* Its plan_layouts (cpu_plan.c): oneDNN's blocked chains. */
void dt_cpu_plan_layouts(dt_dev *d, const dt_kernel_table *kt, const dt_plan_node *nodes, int n, dt_plan_layouts *out);
/* Its xent_shard (cpu_xent.c). */
void dt_cpu_xent_shard(dt_dev *d, dt_xent_phase phase, const dt_xent_shard_args *a);

/* checked device: whether host code could touch its arena now (true only inside an entry point);
 * for tests. */
bool dt_checked_arena_open(const dt_dev *d);

#endif
