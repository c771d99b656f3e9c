/* The device layer: the registry (names, options, errors that list the devices); every memory and
 * training-step primitive on the checked device gives the CPU device's bytes, bit for bit; a host
 * dereference of checked memory faults (SIGSEGV in a forked child), outside any entry
 * point and after threads that used the device have left; blocks are charged against the memory
 * limit and freed blocks are reused; the step kernels follow torch.optim's arithmetic (a
 * hand-worked SGD-momentum and Adam step); the xent kernel keeps its count of targets in device memory. */
#include "core/test.h"
#include "device/device.h"
#include "device/kernel_slots.h"

#include <stddef.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 1000 };

static void fill_host(float *x, size_t n, uint64_t seed) { dt_rng_fill_uniform(x, n, -2, 2, seed, 1); }

static void test_registry(void) {
    int n = 0;
    const dt_device_kind *const *k = dt_device_kinds(&n);
    CHECK(n >= 2 && !strcmp(k[0]->name, "cpu"));
    for (int i = 0; i < n; i++) CHECK_MSG(k[i]->help && *k[i]->help && k[i]->options && k[i]->create, "%s", k[i]->name);
    CHECK(dt_device_find("checked:arena=1M") == k[1]);
    CHECK(dt_device_find("cuda9") == NULL && strstr(dt_last_error(), "devices: cpu, checked"));
    dt_dev *d = NULL;
    CHECK(dt_device_create(&d, "checked:arena=lots") == DT_EINVAL && strstr(dt_last_error(), "arena=lots"));
    CHECK(dt_device_create(&d, "checked:speed=2") == DT_EINVAL && strstr(dt_last_error(), "speed=2"));
    CHECK(dt_device_create(&d, "cpu:x") == DT_EINVAL);
    CHECK_OK(dt_device_create(&d, "cpu"));
    CHECK(d == dt_device_cpu());
    dt_device_destroy(d); /* the CPU device outlives it: a no-op */
}

/* Runs every primitive on device d from the same host inputs; *out (host) gets every result. */
static void run_primitives(dt_dev *d, float *out /* 9 N */, int32_t *flags, double *norm) {
    const dt_device_ops *o = d->ops;
    float h[N], g[N];
    fill_host(h, N, 3), fill_host(g, N, 4);
    float *p = o->alloc(d, N * 4), *gr = o->alloc(d, N * 4), *m = o->alloc(d, N * 4), *v = o->alloc(d, N * 4);
    float *q = o->alloc(d, N * 4);
    uint16_t *b = o->alloc(d, N * 2);
    int32_t *flag = o->alloc(d, 2 * sizeof *flag);
    double *ss = o->alloc(d, sizeof *ss);
    CHECK(p && gr && m && v && q && b && flag && ss);
    o->upload(d, p, h, sizeof h), o->upload(d, gr, g, sizeof g);
    o->fill_f32(d, m, 0, N), o->fill_f32(d, v, 0, N);
    dt_step_args a = {
        .lr = 1e-2f, .weight_decay = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .decoupled = true};
    for (int t = 0; t < 3; t++) a.t = t, o->adam_step(d, &a, p, gr, m, v, N);
    o->download(d, out, p, N * 4), o->download(d, out + N, m, N * 4), o->download(d, out + 2 * N, v, N * 4);
    dt_step_args s = {.lr = 0.1f, .momentum = 0.9f, .nesterov = true, .weight_decay = 1e-3f, .first_step = true};
    o->copy(d, q, p, N * 4);
    o->fill_f32(d, m, 0, N);
    for (int t = 0; t < 3; t++) s.first_step = t == 0, o->sgd_step(d, &s, q, gr, m, N);
    o->download(d, out + 3 * N, q, N * 4);
    o->accumulate(d, q, gr, N), o->scale(d, q, 0.5f, N);
    o->download(d, out + 4 * N, q, N * 4);
    o->cast_f32_bf16(d, b, q, N), o->cast_bf16_f32(d, m, b, N);
    o->download(d, out + 5 * N, m, N * 4);
    o->cast_f32_f16(d, b, q, N), o->cast_f16_f32(d, m, b, N);
    o->download(d, out + 6 * N, m, N * 4);
    o->unscale(d, q, 0.25f, N, flag);
    o->download(d, out + 7 * N, q, N * 4);
    const float inf = INFINITY;
    o->upload(d, q + 17, &inf, 4);
    o->unscale(d, q, 0.25f, N, flag + 1); /* not applied: q keeps its values */
    o->download(d, out + 8 * N, q, N * 4);
    o->download(d, flags, flag, 2 * sizeof *flag);
    o->sqnorm(d, ss, gr, N);
    o->download(d, norm, ss, sizeof *ss);
    o->synchronize(d);
    o->free(d, p), o->free(d, gr), o->free(d, m), o->free(d, v), o->free(d, q), o->free(d, b), o->free(d, flag),
        o->free(d, ss);
}

static void test_checked_equals_cpu(void) {
    dt_dev *c = NULL;
    CHECK_OK(dt_device_create(&c, "checked:arena=1M"));
    if (!c) return;
    static float a[9 * N], b[9 * N];
    int32_t fa[2] = {7, 7}, fb[2] = {7, 7};
    double na = 0, nb = 0;
    run_primitives(dt_device_cpu(), a, fa, &na);
    run_primitives(c, b, fb, &nb);
    CHECK_MSG(!memcmp(a, b, sizeof a), "checked device results differ from the cpu device's");
    CHECK(fa[0] == 0 && fa[1] == 1 && fb[0] == 0 && fb[1] == 1);
    CHECK(na == nb && na > 0);
    CHECK(!memcmp(a + 7 * N, a + 8 * N, 17 * 4) && isinf(a[8 * N + 17])); /* a skipped unscale changes nothing else */
    CHECK(!dt_checked_arena_open(c));
    dt_device_destroy(c);
    printf("checked device: every primitive bitwise equal to the cpu device's\n");
}

/* Forks a child that writes (write) or reads the first float of a fresh checked block from the
 * host; returns the signal that ended it (0 when it exited). */
static int host_touch_signal(bool write, bool after_threads);

static void *hammer(void *arg) {
    dt_dev *d = arg;
    float x[64], *p = d->ops->alloc(d, sizeof x);
    for (int i = 0; i < 200 && p; i++) {
        for (int j = 0; j < 64; j++) x[j] = (float)(i + j);
        d->ops->upload(d, p, x, sizeof x);
        d->ops->scale(d, p, 2.0f, 64);
        d->ops->download(d, x, p, sizeof x);
        if (x[63] != 2.0f * (float)(i + 63)) return (void *)1;
    }
    d->ops->free(d, p);
    return NULL;
}

/* The child's fault handler: exits with 100 + the signal, so the fault is seen the same way where
 * a sanitizer would catch SIGSEGV itself and exit with its own report. */
static void on_fault(int sig) { _exit(100 + sig); }

static int host_touch_signal(bool write, bool after_threads) {
    fflush(stdout), fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa = {.sa_handler = on_fault};
        sigaction(SIGSEGV, &sa, NULL);
        dt_dev *d = NULL;
        if (dt_device_create(&d, "checked:arena=1M") != DT_OK) _exit(3);
        float *p = d->ops->alloc(d, 64 * sizeof *p);
        const float one = 1.0f;
        d->ops->upload(d, p, &one, sizeof one);
        if (after_threads) {
            pthread_t t[4];
            for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, hammer, d);
            for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
        }
        volatile float *vp = p;
        if (write) vp[0] = 2.0f; /* the host dereference the device forbids */
        else if (vp[0] == 12345.0f) _exit(4);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) > 100) return WEXITSTATUS(st) - 100;
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static void test_host_dereference_faults(void) {
    CHECK_MSG(host_touch_signal(true, false) == SIGSEGV, "a host write to checked memory did not fault");
    CHECK_MSG(host_touch_signal(false, false) == SIGSEGV, "a host read of checked memory did not fault");
    CHECK_MSG(host_touch_signal(true, true) == SIGSEGV, "after 4 threads used the device, a host write did not fault");
    dt_dev *d = NULL;
    CHECK_OK(dt_device_create(&d, "checked:arena=1M"));
    pthread_t t[4];
    void *r[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, hammer, d);
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], &r[i]);
        CHECK_MSG(r[i] == NULL, "thread %d got wrong values", i);
    }
    CHECK(!dt_checked_arena_open(d));
    dt_device_destroy(d);
    printf("checked device: host reads and writes fault, also after 4 threads shared it\n");
}

static void test_arena_accounting(void) {
    dt_dev *d = NULL;
    CHECK_OK(dt_device_create(&d, "checked:arena=64K"));
    if (!d) return;
    const size_t used0 = dt_mem_used();
    void *a = d->ops->alloc(d, 30000), *b = d->ops->alloc(d, 30000);
    CHECK(a && b && dt_mem_used() - used0 == 2 * 30016);
    CHECK(d->ops->alloc(d, 30000) == NULL && strstr(dt_last_error(), "checked:arena="));
    d->ops->free(d, a);
    void *c = d->ops->alloc(d, 20000); /* first fit: the freed block's place */
    CHECK(c == a);
    d->ops->free(d, b), d->ops->free(d, c);
    void *big = d->ops->alloc(d, 65536); /* everything coalesced back into one span */
    CHECK(big != NULL);
    d->ops->free(d, big);
    CHECK(dt_mem_used() == used0);
    dt_device_destroy(d);
}

/* The checked device's kernel table: every slot of the CPU table is wrapped (a slot missing from
 * DT_KERNEL_SLOTS would run unwrapped: the count and each pointer say so), NULL slots stay NULL,
 * and a wrapped kernel gives the CPU kernel's values on checked memory with the arena closed after. */
#define COUNT_V(name, p, a) +1
#define COUNT_R(t, name, p, a) +1
#define SAME_V(name, p, a) CHECK_MSG(!cpu->name == !k->name && (!cpu->name || cpu->name != k->name), "slot %s", #name);
#define SAME_R(t, name, p, a) SAME_V(name, p, a)
static void test_checked_kernels(void) {
    const size_t slots = 0 DT_KERNEL_SLOTS(COUNT_V, COUNT_R);
    CHECK_MSG(slots * sizeof(void (*)(void)) == sizeof(dt_kernel_table) - offsetof(dt_kernel_table, linear_workspace),
              "DT_KERNEL_SLOTS lists %zu slots; dt_kernel_table has others: add them to device/kernel_slots.h", slots);
    dt_dev *d = NULL;
    CHECK_OK(dt_device_create(&d, "checked:arena=1M"));
    if (!d) return;
    const dt_kernel_table *cpu = dt_backend_cpu(), *k = d->ops->kernels(d, cpu);
    CHECK(k && k != cpu && !strcmp(k->name, cpu->name) && k->precision == cpu->precision);
    if (k) {
        DT_KERNEL_SLOTS(SAME_V, SAME_R)
        float x[N], want[N], got[N];
        fill_host(x, N, 7);
        float *dx = d->ops->alloc(d, sizeof x), *dy = d->ops->alloc(d, sizeof x);
        cpu->gelu_forward(want, x, N);
        d->ops->upload(d, dx, x, sizeof x);
        k->gelu_forward(dy, dx, N);
        d->ops->download(d, got, dy, sizeof got);
        CHECK_MSG(!memcmp(want, got, sizeof got), "gelu on the checked device differs from the cpu kernel's");
        CHECK(!dt_checked_arena_open(d) && d->ops->kernels(d, cpu) == k); /* one binding per table */
        d->ops->free(d, dx), d->ops->free(d, dy);
    }
    dt_device_destroy(d);
    printf("checked device: all %zu kernel slots wrapped, a wrapped kernel bitwise the cpu one's\n", slots);
}

/* The xent kernel on the checked device writes its loss and its count of the targets that counted
 * into device memory (an ignored target not counted) and its backward reads the count there, and
 * the accuracy count lands in device memory: the same bytes as the cpu kernels on host memory. */
static void test_xent_count_on_device(void) {
    enum { R = 6, V = 5 };
    dt_dev *d = NULL;
    CHECK_OK(dt_device_create(&d, "checked:arena=1M"));
    if (!d) return;
    const dt_kernel_table *cpu = dt_backend_cpu(), *k = d->ops->kernels(d, cpu);
    float lg[R * V], probs[R * V], dl[R * V], got[R * V], loss, dloss;
    const int32_t y[R] = {1, -100, 4, 0, -100, 2};
    int32_t cnt = -1, dcnt = -1;
    fill_host(lg, R * V, 11);
    cpu->xent_forward(&loss, probs, lg, y, R, V, -100, &cnt);
    cpu->xent_backward(dl, probs, y, R, V, -100, &cnt, 0.5f);
    float *dlg = d->ops->alloc(d, sizeof lg), *dp = d->ops->alloc(d, sizeof lg), *dd = d->ops->alloc(d, sizeof lg);
    float *dls = d->ops->alloc(d, 64);
    int32_t *dy = d->ops->alloc(d, sizeof y), *dc = d->ops->alloc(d, sizeof dcnt);
    CHECK(k && dlg && dp && dd && dls && dy && dc);
    if (k && dlg && dp && dd && dls && dy && dc) {
        d->ops->upload(d, dlg, lg, sizeof lg), d->ops->upload(d, dy, y, sizeof y);
        k->xent_forward(dls, dp, dlg, dy, R, V, -100, dc);
        k->xent_backward(dd, dp, dy, R, V, -100, dc, 0.5f);
        d->ops->download(d, &dcnt, dc, sizeof dcnt), d->ops->download(d, &dloss, dls, sizeof dloss);
        d->ops->download(d, got, dd, sizeof got);
        CHECK_MSG(cnt == 4 && dcnt == 4, "xent counted %d on cpu, %d on checked; want 4 (two targets ignored)", cnt,
                  dcnt);
        CHECK(!memcmp(&loss, &dloss, sizeof loss) && !memcmp(dl, got, sizeof got));
        int64_t want = -1, right = -1; /* the accuracy count, written into device memory too */
        cpu->count_correct(&want, lg, y, R, V);
        k->count_correct((int64_t *)dls, dlg, dy, R, V);
        d->ops->download(d, &right, dls, sizeof right);
        CHECK_MSG(want >= 0 && want <= 4 && right == want, "count_correct: %lld on cpu, %lld on checked",
                  (long long)want, (long long)right);
    }
    d->ops->free(d, dlg), d->ops->free(d, dp), d->ops->free(d, dd), d->ops->free(d, dls);
    d->ops->free(d, dy), d->ops->free(d, dc);
    dt_device_destroy(d);
}

/* torch.optim by hand: SGD momentum 0.9 (lr 0.1) on g = 1 from p = 1: p1 = 0.9 (buf 1), p2 = 0.71
 * (buf 1.9); Adam (lr 0.1) first step moves p by lr * sign(g) (m/(1-b1) = g, sqrt(v/(1-b2)) = |g|). */
static void test_step_arithmetic(void) {
    dt_dev *d = dt_device_cpu();
    float p[1] = {1}, g[1] = {1}, buf[1] = {0}, m[1] = {0}, v[1] = {0};
    dt_step_args s = {.lr = 0.1f, .momentum = 0.9f, .first_step = true};
    d->ops->sgd_step(d, &s, p, g, buf, 1);
    CHECK(fabsf(p[0] - 0.9f) < 1e-7f && buf[0] == 1.0f);
    s.first_step = false;
    d->ops->sgd_step(d, &s, p, g, buf, 1);
    CHECK(fabsf(p[0] - 0.71f) < 1e-6f && fabsf(buf[0] - 1.9f) < 1e-6f);
    p[0] = 1, g[0] = -3;
    dt_step_args a = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .t = 0};
    d->ops->adam_step(d, &a, p, g, m, v, 1);
    CHECK_MSG(fabsf(p[0] - 1.1f) < 1e-6f, "adam's first step: p = %.8f, want 1.1", p[0]);
}

/* The vocabulary-sharded cross-entropy on device d over XV ids in K slices (K 1 or 2), the rows
 * reduced on the host between the phases as tensor parallelism's allreduces do: *loss and the
 * (XN, XV) gradient (host, slices side by side). */
enum { XN = 6, XV = 10 };
static void run_xent(dt_dev *d, int K, const float *z, const int32_t *y, double *loss, float *dz) {
    const dt_device_ops *o = d->ops;
    const int Vl = XV / K;
    float *lg[2], *dl[2], *rows[2], hr[2][3 * XN];
    double *ls = o->alloc(d, sizeof *ls);
    int32_t *cnt = o->alloc(d, sizeof *cnt), *ty = o->alloc(d, sizeof(int32_t) * XN);
    o->upload(d, ty, y, sizeof(int32_t) * XN);
    dt_xent_shard_args a[2];
    for (int k = 0; k < K; k++) {
        float part[XN * XV];
        for (int i = 0; i < XN; i++) memcpy(part + i * Vl, z + i * XV + k * Vl, sizeof(float) * (size_t)Vl);
        lg[k] = o->alloc(d, sizeof part), dl[k] = o->alloc(d, sizeof part), rows[k] = o->alloc(d, sizeof hr[0]);
        o->upload(d, lg[k], part, sizeof(float) * XN * (size_t)Vl);
        a[k] = (dt_xent_shard_args){.logits = lg[k],
                                    .targets = ty,
                                    .N = XN,
                                    .Vl = Vl,
                                    .lo = k * Vl,
                                    .ignore = -1,
                                    .scale = 0.5f,
                                    .dlogits = dl[k],
                                    .rows = rows[k],
                                    .loss = ls,
                                    .counted = cnt};
    }
    for (int ph = DT_XENT_MAX; ph <= DT_XENT_GRAD; ph++) {
        for (int k = 0; k < K; k++) o->xent_shard(d, (dt_xent_phase)ph, &a[k]);
        if (ph == DT_XENT_GRAD) break;
        for (int k = 0; k < K; k++) o->download(d, hr[k], rows[k], sizeof hr[0]);
        for (int i = ph == DT_XENT_MAX ? 0 : XN; K == 2 && i < (ph == DT_XENT_MAX ? XN : 3 * XN); i++)
            hr[0][i] = ph == DT_XENT_MAX ? (hr[0][i] > hr[1][i] ? hr[0][i] : hr[1][i]) : hr[0][i] + hr[1][i];
        for (int k = 0; k < K; k++) o->upload(d, rows[k], hr[0], sizeof hr[0]);
    }
    o->download(d, loss, ls, sizeof *loss);
    for (int k = 0; k < K; k++) {
        float part[XN * XV];
        o->download(d, part, dl[k], sizeof(float) * XN * (size_t)Vl);
        for (int i = 0; i < XN; i++) memcpy(dz + i * XV + k * Vl, part + i * Vl, sizeof(float) * (size_t)Vl);
        o->free(d, lg[k]), o->free(d, dl[k]), o->free(d, rows[k]);
    }
    o->free(d, ls), o->free(d, cnt), o->free(d, ty);
}

static void test_xent_shard(void) {
    dt_dev *c = NULL;
    CHECK_OK(dt_device_create(&c, "checked:arena=1M"));
    if (!c) return;
    float z[XN * XV], dz[4][XN * XV];
    fill_host(z, XN * XV, 9);
    const int32_t y[XN] = {3, 9, -1, 0, 5, 4}; /* one ignored row; targets in both slices */
    double l[4];
    run_xent(dt_device_cpu(), 1, z, y, &l[0], dz[0]);
    run_xent(c, 1, z, y, &l[1], dz[1]);
    run_xent(dt_device_cpu(), 2, z, y, &l[2], dz[2]);
    run_xent(c, 2, z, y, &l[3], dz[3]);
    CHECK_MSG(l[0] == l[1] && l[2] == l[3] && !memcmp(dz[0], dz[1], sizeof dz[0]) &&
                  !memcmp(dz[2], dz[3], sizeof dz[0]),
              "xent_shard: the checked device differs from the cpu device");
    double ref = 0; /* the mean over the 5 counted rows of logsumexp - target logit, in double */
    for (int i = 0; i < XN; i++) {
        if (y[i] < 0) continue;
        double s = 0;
        for (int v = 0; v < XV; v++) s += exp((double)z[i * XV + v]);
        ref += log(s) - z[i * XV + y[i]];
        for (int v = 0; v < XV; v++) { /* d(0.5 x mean)/dz = 0.5 / 5 x (softmax - onehot) */
            const double want = 0.1 * (exp((double)z[i * XV + v]) / s - (v == y[i]));
            CHECK_MSG(fabs(dz[0][i * XV + v] - want) < 1e-6 && fabs(dz[2][i * XV + v] - want) < 1e-6,
                      "xent_shard gradient row %d id %d: %g and %g, want %g", i, v, dz[0][i * XV + v],
                      dz[2][i * XV + v], want);
        }
    }
    for (int v = 0; v < XV; v++) CHECK(dz[0][2 * XV + v] == 0 && dz[2][2 * XV + v] == 0); /* the ignored row */
    CHECK_MSG(fabs(l[0] - ref / 5) < 1e-5 && fabs(l[2] - ref / 5) < 1e-5,
              "xent_shard loss %g (1 slice), %g (2), want %g", l[0], l[2], ref / 5);
    CHECK(!dt_checked_arena_open(c));
    dt_device_destroy(c);
    printf("xent_shard: 1 and 2 vocabulary slices match the loss and gradient; checked bitwise cpu\n");
}

int main(void) {
    test_registry();
    test_checked_kernels();
    test_xent_count_on_device();
    test_checked_equals_cpu();
    test_host_dereference_faults();
    test_arena_accounting();
    test_step_arithmetic();
    test_xent_shard();
    return dt_test_summary("device_test");
}
