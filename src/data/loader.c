/* The prefetching batch loader: a background thread assembles this rank's batches of the epoch
 * (feature or text data, over the first epoch_len samples of the order), in order, into a ring
 * of buffers while the training loop consumes them. Batch b always goes to
 * slot b % nslots and is built from the same (seed, epoch) order, so the bytes handed out never
 * depend on thread timing or on whether prefetching is on. Waits block on condvars. */
#include "data/data_internal.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT_LOADER_MAX_PREFETCH 64

struct dt_loader {
    const dt_dataset *ds; /* the data set, or &hot */
    dt_dataset hot;       /* a feature set whose samples were copied onto huge pages (hot_copy) */
    void *hot_map;        /* that copy's mapping, or NULL */
    size_t hot_len;
    dt_loader_config cfg;
    size_t nbatches, D;
    size_t n;        /* samples per epoch: the first n of the order (epoch_len, or all) */
    int T;           /* text window (tokbuf, T targets per sample), or 0 for features */
    int ylen;        /* values of y per sample: T, or 1 */
    uint32_t *order; /* the epoch's global order (ds->n) */
    int nslots;      /* prefetch + 1 (the slot the consumer holds) */
    float *xbuf;     /* features: nslots * batch * D; NULL for text */
    int32_t *tokbuf; /* text: nslots * batch * T input tokens; NULL for features */
    int32_t *ybuf;   /* nslots * batch * ylen */
    int *slot_n;     /* samples in the batch held by each slot */
    int cap;         /* room per slot in samples (max_batch) */
    int *cut;        /* uneven cut: samples per rank of a global batch (world), or NULL */

    pthread_t thread;
    bool has_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;  /* worker waits: room in the ring, a new epoch, quit */
    pthread_cond_t cv_ready; /* consumer waits: a batch is ready, the worker went idle */
    bool quit, active, busy, held;
    uint64_t epoch, gen;
    size_t next_fill; /* batch the worker fills next (all below it are ready) */
    size_t next_take; /* batch the consumer takes next */
    dt_status err;    /* a failure of the worker, reported by dt_loader_next */
    char errmsg[1024];
    double wait_s;
    bool take_valid; /* order holds take_epoch's order (dt_loader_take) */
    uint64_t take_epoch;
};

/* Samples of a feature set are read at random places (the shuffle); on 4 KiB pages each one is a
 * TLB miss with a page walk, and the shared cache's tmpfs mapping (data/cache.c) gets no
 * transparent huge pages. So a set of 4-256 MiB is copied once into private memory on huge pages
 * (madvise: where the kernel allows them; docs/why.md, "A private copy of the data set on huge
 * pages"). It costs a
 * private copy per process (47 MB for Fashion-MNIST) beside the shared one: charged to the memory
 * accounting (--mem-limit) and in --dry-run's plan (dt_loader_copy_bytes). Skipped where the charge
 * does not fit a limit already set (the loader then reads the shared pages), for a loader that does
 * not shuffle (evaluation reads in order: a copy would cost what it saves) and where madvise
 * refuses huge pages. */
enum { HOT_MIN = 4 << 20, HOT_MAX = 256 << 20, HUGE = 2 << 20 };

static size_t hot_bytes(const dt_dataset *ds) {
    const size_t bytes = ds->T ? 0 : ds->n * ds->D * dt_dtype_size(ds->dtype);
    return bytes < HOT_MIN || bytes > HOT_MAX ? 0 : bytes;
}

/* A view (--val-split's training part) is gathered into the copy, its labels after the samples. */
static size_t hot_labels_at(const dt_dataset *ds) { return (hot_bytes(ds) + 63) / 64 * 64; }
static size_t hot_total(const dt_dataset *ds) {
    const size_t bytes = hot_bytes(ds);
    return bytes && ds->rows ? hot_labels_at(ds) + ds->n * sizeof(int32_t) : bytes;
}

size_t dt_loader_copy_bytes(const dt_dataset *ds) { return (hot_total(ds) + HUGE - 1) / HUGE * HUGE; }

/* the mapping has one huge page more, to align the copy; that page is never written */
size_t dt_loader_copy_held(const dt_loader *l) { return l->hot_map ? l->hot_len - HUGE : 0; }

static void hot_copy(dt_loader *l, bool shuffle) {
    const dt_dataset *ds = l->ds;
    const size_t bytes = hot_bytes(ds);
    if (!bytes || !shuffle || dt_mem_charge(dt_loader_copy_bytes(ds), "the loader's huge-page copy") != DT_OK) return;
    const size_t len = dt_loader_copy_bytes(ds) + HUGE; /* room to align to a huge page */
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *a = m == MAP_FAILED ? NULL : (char *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
    if (!a || madvise(a, len - (size_t)(a - m), MADV_HUGEPAGE) != 0) {
        if (a) munmap(m, len);
        dt_mem_uncharge(dt_loader_copy_bytes(ds));
        return;
    }
    l->hot = *ds;
    l->hot.x = a;
    l->hot.map = NULL, l->hot.map_len = 0;
    if (ds->rows) { /* a view: its samples and labels in its order, read as a set of its own */
        const size_t row = ds->D * dt_dtype_size(ds->dtype);
        int32_t *y = (int32_t *)(void *)(a + hot_labels_at(ds));
        for (size_t i = 0; i < ds->n; i++) {
            memcpy(a + i * row, (const char *)ds->x + (size_t)ds->rows[i] * row, row);
            y[i] = ds->y[ds->rows[i]];
        }
        l->hot.y = y, l->hot.rows = NULL, l->hot.base = NULL;
    } else memcpy(a, ds->x, bytes);
    l->hot_map = m, l->hot_len = len;
    l->ds = &l->hot;
}

/* Builds samples order[start, start+count) into slot `slot` (room for cap samples). */
static dt_status build_slot(dt_loader *l, int slot, size_t start, size_t count) {
    size_t base = (size_t)slot * (size_t)l->cap;
    if (l->T)
        return dt_dataset_batch_tokens(l->ds, l->order + start, (int)count, l->tokbuf + base * (size_t)l->T,
                                       l->ybuf + base * (size_t)l->T);
    return dt_dataset_batch(l->ds, l->order + start, (int)count, l->xbuf + base * l->D, l->ybuf + base);
}

/* Points *out at slot `slot` holding n samples. */
static void slot_batch(const dt_loader *l, int slot, int n, size_t index, uint64_t epoch, dt_batch *out) {
    size_t base = (size_t)slot * (size_t)l->cap;
    *out = (dt_batch){.x = l->xbuf ? l->xbuf + base * l->D : NULL,
                      .tok = l->tokbuf ? l->tokbuf + base * (size_t)l->T : NULL,
                      .y = l->ybuf + base * (size_t)l->ylen,
                      .n = n,
                      .T = l->ylen,
                      .index = index,
                      .epoch = epoch};
}

/* Builds batch b of the current epoch into its ring slot. Reads only immutable state. */
static dt_status assemble(dt_loader *l, size_t b) {
    size_t start, count;
    int slot = (int)(b % (size_t)l->nslots);
    if (l->cut) dt_sampler_cut_range(l->n, l->cut, l->cfg.rank, l->cfg.world, b, &start, &count);
    else dt_sampler_batch_range(l->n, l->cfg.batch, l->cfg.rank, l->cfg.world, b, &start, &count);
    l->slot_n[slot] = (int)count;
    return build_slot(l, slot, start, count);
}

/* The oldest batch whose slot is still in use (held by the consumer or ready). */
static size_t oldest_in_use(const dt_loader *l) { return l->held ? l->next_take - 1 : l->next_take; }

static void *worker_main(void *arg) {
    dt_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->quit) {
        if (l->active && l->err == DT_OK && l->next_fill < l->nbatches &&
            l->next_fill - oldest_in_use(l) < (size_t)l->nslots) {
            size_t b = l->next_fill;
            uint64_t gen = l->gen;
            l->busy = true;
            pthread_mutex_unlock(&l->mu);
            dt_status st = assemble(l, b);
            pthread_mutex_lock(&l->mu);
            l->busy = false;
            if (gen == l->gen) {
                if (st == DT_OK) {
                    l->next_fill++;
                } else {
                    l->err = st;
                    snprintf(l->errmsg, sizeof l->errmsg, "%s", dt_last_error());
                }
            }
            pthread_mutex_unlock(&l->mu); /* a woken consumer finds the lock free */
            pthread_cond_broadcast(&l->cv_ready);
            pthread_mutex_lock(&l->mu);
        } else {
            pthread_cond_wait(&l->cv_work, &l->mu);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Without a core of its own a loader thread runs by preempting its rank, which the peers then wait
 * for at the next collective: each rank's loader costs the step in turn, where the ranks' own
 * threads build their batches at the same time. Measured (MLP 784-128-10 b128, 2 ranks on a
 * 2-core AMX Xeon VM, shm; dtrain train --workers 2 --epochs 3, epochs 2-3 of 4 pairs of runs
 * interleaved with the build that kept the thread): 491.8 -> 507.9 k samples/s. */
int dt_loader_prefetch_for(int ranks, int threads, int cpus) {
    return cpus > 0 && (long)ranks * (threads > 0 ? threads : 1) >= cpus ? 0 : -1;
}

dt_status dt_loader_create(dt_loader **out, const dt_dataset *ds, const dt_loader_config *cfg) {
    *out = NULL;
    dt_loader_config c = *cfg;
    if (c.world <= 0) c.world = 1;
    if (c.prefetch < 0) c.prefetch = DT_LOADER_DEFAULT_PREFETCH;
    if (c.batch <= 0) return dt_error(DT_EINVAL, "loader: batch size must be positive, got %d", c.batch);
    if (c.max_batch < c.batch) c.max_batch = c.batch;
    if (c.rank < 0 || c.rank >= c.world)
        return dt_error(DT_EINVAL, "loader: rank %d is outside [0, %d)", c.rank, c.world);
    if (c.prefetch > DT_LOADER_MAX_PREFETCH)
        return dt_error(DT_EINVAL, "loader: prefetch %d is more than %d batches", c.prefetch, DT_LOADER_MAX_PREFETCH);
    const char *src = ds->source[0] ? ds->source : "(memory)";
    const char *what = ds->T ? "windows" : "samples";
    if (c.epoch_len > ds->n)
        return dt_error(DT_EINVAL,
                        "loader: `epoch_windows` %zu is more than the %zu %s of data set %s: lower it (0 = all)",
                        c.epoch_len, ds->n, what, src);
    size_t n = c.epoch_len ? c.epoch_len : ds->n;
    size_t nb = dt_sampler_batches(n, c.batch, c.world, c.drop_last);
    if (nb == 0)
        return dt_error(
            DT_EINVAL,
            "loader: an epoch of data set %s has %zu %s%s, fewer than one global batch of %d x %d ranks: lower the "
            "batch size",
            src, n, what, c.epoch_len ? " (`epoch_windows`)" : "", c.batch, c.world);
    dt_loader *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ENOMEM, "loader: out of memory");
    l->ds = ds;
    l->cfg = c;
    l->nbatches = nb;
    l->n = n;
    l->D = ds->D;
    l->T = dt_dataset_window(ds);
    l->ylen = l->T ? l->T : 1;
    l->nslots = c.prefetch + 1;
    l->cap = c.max_batch;
    size_t B = (size_t)c.max_batch;
    l->order = malloc(ds->n * sizeof *l->order);
    if (l->T) l->tokbuf = dt_alloc((size_t)l->nslots * B * (size_t)l->T * sizeof(int32_t));
    else l->xbuf = dt_alloc((size_t)l->nslots * B * l->D * sizeof(float));
    l->ybuf = dt_alloc((size_t)l->nslots * B * (size_t)l->ylen * sizeof(int32_t));
    l->slot_n = calloc((size_t)l->nslots, sizeof(int));
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    if (!l->order || !(l->xbuf || l->tokbuf) || !l->ybuf || !l->slot_n) {
        const int nslots = l->nslots;
        dt_loader_destroy(l);
        return dt_error(DT_ENOMEM, "loader: out of memory for %d buffers of %d samples", nslots, c.max_batch);
    }
    hot_copy(l, c.shuffle); /* after the buffers: the copy is what a --mem-limit leaves out */
    if (c.prefetch > 0) {
        /* the worker blocks every signal, so SIGINT/SIGTERM reach the training thread */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int rc = pthread_create(&l->thread, NULL, worker_main, l);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0) {
            dt_loader_destroy(l);
            return dt_error(DT_ENOMEM, "loader: cannot start the prefetch thread (error %d): use prefetch 0", rc);
        }
        l->has_thread = true;
        pthread_setname_np(l->thread, "dt-loader");
    }
    *out = l;
    return DT_OK;
}

dt_status dt_loader_start_epoch(dt_loader *l, uint64_t epoch, size_t skip_batches) {
    if (skip_batches > l->nbatches)
        return dt_error(DT_EINVAL, "loader: cannot skip %zu batches, an epoch has %zu", skip_batches, l->nbatches);
    pthread_mutex_lock(&l->mu);
    l->gen++;          /* anything the worker is building now is discarded */
    l->active = false; /* and it claims nothing new */
    while (l->busy) pthread_cond_wait(&l->cv_ready, &l->mu);
    pthread_mutex_unlock(&l->mu);
    dt_sampler_order(l->order, l->ds->n, l->cfg.seed, epoch, l->cfg.shuffle);
    pthread_mutex_lock(&l->mu);
    l->epoch = epoch;
    l->take_valid = false;
    l->next_fill = l->next_take = skip_batches;
    l->held = false;
    l->err = DT_OK;
    l->active = true;
    pthread_cond_signal(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    return DT_OK;
}

dt_status dt_loader_next(dt_loader *l, dt_batch *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&l->mu);
    /* the previous batch's slot is free again: the worker is woken after the unlock, so that,
     * where it shares a core and preempts this thread, it does not find the lock held, sleep on
     * it and cost two more switches (2 ranks, MLP b128: 3.8 -> 2.9 context switches per rank-step) */
    const bool freed = l->active && l->held;
    if (freed) l->held = false;
    pthread_mutex_unlock(&l->mu);
    if (freed) pthread_cond_signal(&l->cv_work);
    pthread_mutex_lock(&l->mu);
    if (!l->active) {
        pthread_mutex_unlock(&l->mu);
        return dt_error(DT_EINVAL, "loader: call dt_loader_start_epoch before dt_loader_next");
    }
    if (l->next_take >= l->nbatches) {
        pthread_mutex_unlock(&l->mu);
        return DT_ENOENT;
    }
    size_t b = l->next_take;
    if (!l->has_thread) {
        pthread_mutex_unlock(&l->mu);
        double t0 = dt_now();
        dt_status st = assemble(l, b);
        if (st != DT_OK) return st;
        pthread_mutex_lock(&l->mu);
        l->wait_s += dt_now() - t0; /* without prefetch, building the batch is the wait */
        l->next_fill = b + 1;
    } else if (l->next_fill <= b && l->err == DT_OK) {
        double t0 = dt_now();
        while (l->next_fill <= b && l->err == DT_OK) pthread_cond_wait(&l->cv_ready, &l->mu);
        l->wait_s += dt_now() - t0;
    }
    if (l->next_fill <= b) { /* the worker failed on this batch */
        dt_status st = l->err;
        pthread_mutex_unlock(&l->mu);
        return dt_error(st, "%s", l->errmsg);
    }
    l->next_take = b + 1;
    l->held = true;
    pthread_mutex_unlock(&l->mu);
    int slot = (int)(b % (size_t)l->nslots);
    slot_batch(l, slot, l->slot_n[slot], b, l->epoch, out);
    return DT_OK;
}

dt_status dt_loader_set_cut(dt_loader *l, const int *counts) {
    const int W = l->cfg.world;
    if (counts) {
        int64_t sum = 0;
        for (int r = 0; r < W; r++) {
            if (counts[r] < 0 || counts[r] > l->cap)
                return dt_error(DT_EINVAL, "loader: cut gives rank %d %d samples; allowed are 0..%d (max_batch)", r,
                                counts[r], l->cap);
            sum += counts[r];
        }
        if (sum != (int64_t)l->cfg.batch * W)
            return dt_error(DT_EINVAL, "loader: cut sums to %lld samples but a global batch has %d x %d",
                            (long long)sum, l->cfg.batch, W);
    }
    int *cut = NULL;
    if (counts && !(cut = malloc((size_t)W * sizeof *cut))) return dt_error(DT_ENOMEM, "loader: out of memory");
    if (cut) memcpy(cut, counts, (size_t)W * sizeof *cut);
    pthread_mutex_lock(&l->mu);
    l->gen++; /* prefetched batches of the old cut are discarded and rebuilt */
    bool was_active = l->active;
    l->active = false;
    while (l->busy) pthread_cond_wait(&l->cv_ready, &l->mu);
    free(l->cut);
    l->cut = cut;
    if (l->next_fill > l->next_take) l->next_fill = l->next_take;
    l->err = DT_OK;
    l->active = was_active;
    pthread_cond_signal(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    return DT_OK;
}

dt_status dt_loader_take(dt_loader *l, uint64_t epoch, size_t unit, dt_batch *out) {
    memset(out, 0, sizeof *out);
    const size_t n = l->n, B = (size_t)l->cfg.batch;
    if (unit >= (n + B - 1) / B)
        return dt_error(DT_EINVAL, "loader: batch %zu of %zu samples is past the epoch (%zu samples)", unit, B, n);
    pthread_mutex_lock(&l->mu);
    l->gen++;
    l->active = false; /* the prefetch thread claims nothing while batches are taken */
    while (l->busy) pthread_cond_wait(&l->cv_ready, &l->mu);
    l->held = false;
    pthread_mutex_unlock(&l->mu);
    if (!l->take_valid || l->take_epoch != epoch) {
        dt_sampler_order(l->order, l->ds->n, l->cfg.seed, epoch, l->cfg.shuffle);
        l->take_valid = true, l->take_epoch = epoch;
    }
    size_t start = unit * B, count = start + B <= n ? B : n - start;
    double t0 = dt_now();
    DT_TRY(build_slot(l, 0, start, count));
    pthread_mutex_lock(&l->mu);
    l->wait_s += dt_now() - t0;
    pthread_mutex_unlock(&l->mu);
    slot_batch(l, 0, (int)count, unit, epoch, out);
    return DT_OK;
}

size_t dt_loader_batches(const dt_loader *l) { return l->nbatches; }

double dt_loader_wait_seconds(const dt_loader *l) {
    dt_loader *m = (dt_loader *)l;
    pthread_mutex_lock(&m->mu);
    double s = m->wait_s;
    pthread_mutex_unlock(&m->mu);
    return s;
}

void dt_loader_destroy(dt_loader *l) {
    if (!l) return;
    if (l->has_thread) {
        pthread_mutex_lock(&l->mu);
        l->quit = true;
        pthread_cond_signal(&l->cv_work);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_ready);
    pthread_mutex_destroy(&l->mu);
    free(l->order);
    dt_free(l->xbuf);
    dt_free(l->tokbuf);
    dt_free(l->ybuf);
    free(l->slot_n);
    free(l->cut);
    if (l->hot_map) munmap(l->hot_map, l->hot_len), dt_mem_uncharge(l->hot_len - HUGE);
    free(l);
}
