/* Tests for the sampler and the prefetching loader: permutations are deterministic, uniform and
 * complete; shards are disjoint and cover the epoch; the loader hands out exactly the batches
 * dt_dataset_batch builds over the sampler order, with or without prefetch, under any thread
 * timing, and from any skip_batches position, also from the loader's copy of a larger set on
 * huge pages (and of a --val-split view of it). */
#include "core/test.h"
#include "dtrain/core.h"
#include "dtrain/data.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

static bool is_permutation(const uint32_t *o, size_t n) {
    char *seen = calloc(n ? n : 1, 1);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        if (o[i] >= n || seen[o[i]]) ok = false;
        else seen[o[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_order(void) {
    enum { N = 1000 };
    uint32_t a[N], b[N];
    dt_sampler_order(a, N, 7, 3, false);
    bool ident = true;
    for (int i = 0; i < N; i++) ident &= a[i] == (uint32_t)i;
    CHECK(ident);
    dt_sampler_order(a, N, 7, 3, true);
    dt_sampler_order(b, N, 7, 3, true);
    CHECK(is_permutation(a, N) && memcmp(a, b, sizeof a) == 0);
    int fixed = 0;
    for (int i = 0; i < N; i++) fixed += a[i] == (uint32_t)i;
    CHECK_MSG(fixed < 10, "%d fixed points: not shuffled", fixed);
    dt_sampler_order(b, N, 7, 4, true);
    CHECK(is_permutation(b, N) && memcmp(a, b, sizeof a) != 0);
    dt_sampler_order(b, N, 8, 3, true);
    CHECK(memcmp(a, b, sizeof a) != 0);
    /* a known order pins the algorithm: a change would silently change every run's data order */
    uint32_t s[8];
    static const uint32_t pinned[8] = {7, 2, 6, 1, 3, 4, 0, 5}; /* also derived independently in Python */
    dt_sampler_order(s, 8, 42, 0, true);
    CHECK(memcmp(s, pinned, sizeof s) == 0);
    dt_sampler_order(b, 1, 1, 1, true);
    CHECK(b[0] == 0);
    dt_sampler_order(b, 0, 1, 1, true);
    /* uniformity: all 24 orders of 4 items appear about equally often over 24000 epochs */
    int counts[24] = {0};
    for (uint64_t e = 0; e < 24000; e++) {
        uint32_t p[4];
        dt_sampler_order(p, 4, 99, e, true);
        int code = 0, used = 0;
        for (int i = 0; i < 4; i++) { /* Lehmer code */
            int r = 0;
            for (uint32_t v = 0; v < p[i]; v++) r += !(used >> v & 1);
            used |= 1 << p[i];
            code = code * (4 - i) + r;
        }
        counts[code]++;
    }
    double chi2 = 0;
    for (int i = 0; i < 24; i++) chi2 += (counts[i] - 1000.0) * (counts[i] - 1000.0) / 1000.0;
    CHECK_MSG(chi2 < 60, "chi2 %.1f over 23 degrees of freedom: order is biased", chi2); /* p < 1e-4 */
    /* the first position is uniform over a large range too (unbiased bounded draws) */
    enum { M = 100 };
    int first[M] = {0};
    uint32_t q[M];
    for (uint64_t e = 0; e < 20000; e++) {
        dt_sampler_order(q, M, 5, e, true);
        first[q[0]]++;
    }
    chi2 = 0;
    for (int i = 0; i < M; i++) chi2 += (first[i] - 200.0) * (first[i] - 200.0) / 200.0;
    CHECK_MSG(chi2 < 170, "chi2 %.1f over 99 degrees of freedom", chi2);
}

static void test_shards(void) {
    static const size_t ns[] = {1, 7, 64, 100, 101, 1000};
    static const int batches[] = {1, 3, 8, 32};
    static const int worlds[] = {1, 2, 3, 4, 7};
    uint32_t order[1000], part[1000];
    int cnt[1000];
    for (size_t ni = 0; ni < 6; ni++)
        for (int bi = 0; bi < 4; bi++)
            for (int wi = 0; wi < 5; wi++)
                for (int drop = 0; drop < 2; drop++) {
                    size_t n = ns[ni];
                    int B = batches[bi], W = worlds[wi];
                    dt_sampler_order(order, n, 1, 2, true);
                    memset(cnt, 0, sizeof cnt);
                    size_t nb = dt_sampler_batches(n, B, W, drop);
                    size_t total = 0;
                    bool ranges_ok = true;
                    for (int r = 0; r < W; r++) {
                        size_t k = dt_sampler_shard(part, order, n, B, r, W, drop);
                        total += k;
                        for (size_t i = 0; i < k; i++) cnt[part[i]]++;
                        size_t pos = 0;
                        for (size_t b = 0; b < nb; b++) { /* the shard is its batches in order */
                            size_t s, c;
                            dt_sampler_batch_range(n, B, r, W, b, &s, &c);
                            ranges_ok &= c <= (size_t)B && s + c <= n && (drop ? c == (size_t)B : true);
                            ranges_ok &= pos + c <= k &&
                                         (c == 0 || memcmp(part + pos, order + s, c * sizeof *order) == 0);
                            pos += c;
                        }
                        ranges_ok &= pos == k;
                    }
                    int twice = 0, missing = 0;
                    for (size_t i = 0; i < n; i++) twice += cnt[i] > 1, missing += cnt[i] == 0;
                    size_t G = (size_t)B * W;
                    CHECK_MSG(twice == 0 && ranges_ok, "n=%zu B=%d W=%d drop=%d: %d duplicates", n, B, W, drop, twice);
                    if (drop)
                        CHECK_MSG(nb == n / G && total == nb * G, "n=%zu B=%d W=%d: %zu batches, %zu samples", n, B, W,
                                  nb, total);
                    else
                        CHECK_MSG(missing == 0 && total == n && nb == (n + G - 1) / G, "n=%zu B=%d W=%d: %d missing", n,
                                  B, W, missing);
                }
    /* world 1 is plain batching: the shard is the order itself */
    dt_sampler_order(order, 100, 3, 0, true);
    CHECK(dt_sampler_shard(part, order, 100, 32, 0, 1, false) == 100 && memcmp(part, order, 100 * sizeof *order) == 0);
    /* rank r takes block r of each global batch */
    size_t s, c;
    dt_sampler_batch_range(100, 8, 2, 4, 1, &s, &c);
    CHECK(s == 32 + 16 && c == 8);
    dt_sampler_batch_range(101, 8, 3, 4, 3, &s, &c); /* last: 5 samples over 4 ranks -> 2,1,1,1 */
    CHECK(s == 96 + 4 && c == 1);
    dt_sampler_batch_range(101, 8, 0, 4, 3, &s, &c);
    CHECK(s == 96 && c == 2);
}

/* A small u8 data set: 203 samples of 2x3x5, pixel values and labels derived from the index. */
static dt_dataset *make_ds(void) {
    enum { N = 203, D = 30 };
    uint8_t *x = malloc(N * D);
    int32_t y[N];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < D; j++) x[i * D + j] = (uint8_t)(i * 7 + j * 13);
        y[i] = i % 10;
    }
    dt_dataset *ds = NULL;
    CHECK_OK(dt_dataset_create(&ds, DT_U8, x, y, N, 2, 3, 5, 10));
    free(x);
    return ds;
}

/* Reads a whole epoch from l and compares each batch with dt_dataset_batch over the sampler
 * order; sleeps a little every few batches when jitter is set so the worker runs ahead or
 * behind. Returns the number of batches read. */
static size_t check_epoch(dt_loader *l, const dt_dataset *ds, const dt_loader_config *cfg, uint64_t epoch, size_t skip,
                          int jitter) {
    int C, H, W;
    dt_dataset_shape(ds, &C, &H, &W);
    size_t n = dt_dataset_len(ds), D = (size_t)C * H * W;
    uint32_t *order = malloc(n * sizeof *order);
    dt_sampler_order(order, n, cfg->seed, epoch, cfg->shuffle);
    float *want = malloc((size_t)cfg->batch * D * sizeof(float));
    int32_t *wy = malloc((size_t)cfg->batch * sizeof(int32_t));
    CHECK_OK(dt_loader_start_epoch(l, epoch, skip));
    dt_batch b;
    size_t got = 0, bad = 0;
    dt_status st;
    while ((st = dt_loader_next(l, &b)) == DT_OK) {
        size_t s, c;
        dt_sampler_batch_range(n, cfg->batch, cfg->rank, cfg->world, skip + got, &s, &c);
        CHECK_OK(dt_dataset_batch(ds, order + s, (int)c, want, wy));
        if (b.index != skip + got || b.epoch != epoch || (size_t)b.n != c || memcmp(b.x, want, c * D * sizeof(float)) ||
            memcmp(b.y, wy, c * sizeof(int32_t)))
            bad++;
        got++;
        if (jitter && got % (size_t)jitter == 0) nanosleep(&(struct timespec){0, 200000}, NULL);
    }
    CHECK_MSG(st == DT_ENOENT, "end of epoch: %s", dt_status_str(st));
    CHECK_MSG(bad == 0, "%zu of %zu batches differ (prefetch %d, rank %d/%d, skip %zu)", bad, got, cfg->prefetch,
              cfg->rank, cfg->world, skip);
    CHECK(dt_loader_next(l, &b) == DT_ENOENT); /* stays at the end */
    free(order);
    free(want);
    free(wy);
    return got;
}

static void test_loader(dt_dataset *ds) {
    static const int prefetch[] = {0, 1, 3, -1};
    for (int pi = 0; pi < 4; pi++)
        for (int w = 1; w <= 3; w += 2)
            for (int drop = 0; drop < 2; drop++) {
                dt_loader_config cfg = {.batch = 16,
                                        .shuffle = true,
                                        .drop_last = drop,
                                        .seed = 11,
                                        .rank = w - 1,
                                        .world = w,
                                        .prefetch = prefetch[pi]};
                dt_loader *l;
                CHECK_OK(dt_loader_create(&l, ds, &cfg));
                size_t nb = dt_loader_batches(l);
                CHECK(nb == dt_sampler_batches(203, 16, w, drop));
                for (uint64_t e = 0; e < 3; e++) CHECK(check_epoch(l, ds, &cfg, e, 0, (int)e * 2) == nb);
                /* a resumed run: start mid-epoch, and at the very end */
                CHECK(check_epoch(l, ds, &cfg, 5, 3, 0) == nb - 3);
                CHECK(check_epoch(l, ds, &cfg, 5, nb, 0) == 0);
                CHECK(dt_loader_start_epoch(l, 5, nb + 1) == DT_EINVAL);
                /* abandoning an epoch half way, then starting another, gives the new epoch's batches */
                CHECK_OK(dt_loader_start_epoch(l, 6, 0));
                dt_batch b;
                CHECK_OK(dt_loader_next(l, &b));
                CHECK_OK(dt_loader_next(l, &b));
                CHECK(check_epoch(l, ds, &cfg, 7, 1, 1) == nb - 1);
                double ws = dt_loader_wait_seconds(l);
                CHECK(ws >= 0 && ws < 10);
                dt_loader_destroy(l);
            }
    /* the same bytes without shuffling, and batch larger than the data set without drop_last */
    dt_loader_config cfg = {.batch = 300, .prefetch = 2};
    dt_loader *l;
    CHECK_OK(dt_loader_create(&l, ds, &cfg));
    CHECK(dt_loader_batches(l) == 1 && check_epoch(l, ds, &cfg, 0, 0, 0) == 1);
    dt_loader_destroy(l);
    dt_loader_destroy(NULL);
    /* bad configs */
    cfg = (dt_loader_config){.batch = 0};
    CHECK(dt_loader_create(&l, ds, &cfg) == DT_EINVAL && l == NULL);
    cfg = (dt_loader_config){.batch = 4, .rank = 2, .world = 2};
    CHECK(dt_loader_create(&l, ds, &cfg) == DT_EINVAL && strstr(dt_last_error(), "rank 2"));
    cfg = (dt_loader_config){.batch = 300, .drop_last = true};
    CHECK(dt_loader_create(&l, ds, &cfg) == DT_EINVAL && strstr(dt_last_error(), "203 samples"));
    cfg = (dt_loader_config){.batch = 4};
    CHECK_OK(dt_loader_create(&l, ds, &cfg));
    dt_batch b;
    CHECK(dt_loader_next(l, &b) == DT_EINVAL && strstr(dt_last_error(), "start_epoch"));
    dt_loader_destroy(l);
    /* freeing a loader whose worker is mid-epoch (ring full) does not hang */
    cfg = (dt_loader_config){.batch = 4, .prefetch = 4, .shuffle = true};
    CHECK_OK(dt_loader_create(&l, ds, &cfg));
    CHECK_OK(dt_loader_start_epoch(l, 0, 0));
    CHECK_OK(dt_loader_next(l, &b));
    dt_loader_destroy(l);
}

/* n random u8 samples of 1 x h x w, labels i % 7. */
static dt_dataset *random_set(int n, int h, int w) {
    uint8_t *x = malloc((size_t)n * h * w);
    int32_t *y = malloc(n * sizeof *y);
    uint32_t r = 12345;
    for (size_t i = 0; i < (size_t)n * h * w; i++) x[i] = (uint8_t)((r = r * 1664525u + 1013904223u) >> 24);
    for (int i = 0; i < n; i++) y[i] = i % 7;
    dt_dataset *ds = NULL;
    CHECK_OK(dt_dataset_create(&ds, DT_U8, x, y, (size_t)n, 1, h, w, 7));
    free(x), free(y);
    return ds;
}

/* A feature set of 4-256 MiB is read from the loader's copy on huge pages (loader.c's hot_copy):
 * its batches are still exactly dt_dataset_batch's over the original, at two ranks and the end
 * of the epoch included. */
static void test_hot_copy(void) {
    enum { N = 5003, H = 25, W = 40 }; /* 5 MB of u8 samples */
    dt_dataset *ds = random_set(N, H, W);
    /* the copy's size as --dry-run plans it: the samples rounded up to 2 MiB pages */
    const size_t want = ds ? dt_loader_copy_bytes(ds) : 0;
    CHECK_MSG(want == 6u << 20, "dt_loader_copy_bytes %zu, want 3 pages of 2 MiB for %d bytes", want, N * H * W);
    const bool thp = access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0; /* madvise takes it */
    for (int rank = 0; rank < 2 && ds; rank++) {
        dt_loader_config cfg = {.batch = 64, .shuffle = true, .seed = 5, .rank = rank, .world = 2, .prefetch = 2};
        dt_loader *l;
        CHECK_OK(dt_loader_create(&l, ds, &cfg));
        if (thp) CHECK_MSG(dt_loader_copy_held(l) == want, "rank %d holds %zu", rank, dt_loader_copy_held(l));
        CHECK(check_epoch(l, ds, &cfg, 1, 0, 0) == dt_loader_batches(l));
        dt_loader_destroy(l);
    }
    /* no copy for a loader that reads in order (evaluation); the copy is charged to the memory
     * accounting while the loader holds it, and not made where it does not fit a limit */
    dt_loader_config seq = {.batch = 64, .shuffle = false, .prefetch = 2}, shuf = seq;
    shuf.shuffle = true;
    dt_loader *l = NULL;
    const size_t used = dt_mem_used();
    size_t own = 0; /* the loader's own buffers */
    if (ds && dt_loader_create(&l, ds, &seq) == DT_OK) {
        CHECK_MSG(dt_loader_copy_held(l) == 0, "an in-order loader copied %zu bytes", dt_loader_copy_held(l));
        own = dt_mem_used() - used;
        CHECK(check_epoch(l, ds, &seq, 1, 0, 0) == dt_loader_batches(l));
        dt_loader_destroy(l);
    }
    if (thp && ds && dt_loader_create(&l, ds, &shuf) == DT_OK) {
        CHECK_MSG(dt_loader_copy_held(l) == want && dt_mem_used() == used + own + want, "held %zu, charged %zu of %zu",
                  dt_loader_copy_held(l), dt_mem_used() - used - own, want);
        dt_loader_destroy(l);
        CHECK_MSG(dt_mem_used() == used, "%zu bytes still charged after the loader's free", dt_mem_used() - used);
    }
    CHECK_OK(dt_mem_set_limit(used + own + want - 1));
    CHECK_MSG(!ds || dt_loader_create(&l, ds, &shuf) == DT_OK, "under a limit the copy does not fit: %s",
              dt_last_error());
    if (ds && l) {
        CHECK_MSG(dt_loader_copy_held(l) == 0 && dt_mem_used() == used + own, "a copy beyond --mem-limit: held %zu",
                  dt_loader_copy_held(l));
        CHECK(check_epoch(l, ds, &shuf, 1, 0, 0) == dt_loader_batches(l)); /* from the shared pages */
        dt_loader_destroy(l);
    }
    CHECK_OK(dt_mem_set_limit(0));
    /* --val-split's training part, a view: the copy gathers its samples and their labels (after
     * them: 6288 samples of 1000 bytes fill 3 pages but for their labels, so 4 are planned), and
     * hands out the view's own batches */
    dt_dataset *big = random_set(6500, H, W), *tr = NULL, *va = NULL;
    if (big && dt_dataset_split(big, 0.0326, 3, &tr, &va) == DT_OK) {
        const size_t n = dt_dataset_len(tr), vwant = dt_loader_copy_bytes(tr);
        CHECK_MSG(n == 6288 && vwant == 8u << 20, "%zu samples, dt_loader_copy_bytes %zu", n, vwant);
        for (int rank = 0; rank < 2; rank++) {
            dt_loader_config cfg = {.batch = 64, .shuffle = true, .seed = 5, .rank = rank, .world = 2, .prefetch = 2};
            CHECK_OK(dt_loader_create(&l, tr, &cfg));
            if (thp)
                CHECK_MSG(dt_loader_copy_held(l) == vwant, "a view's copy: rank %d holds %zu", rank,
                          dt_loader_copy_held(l));
            CHECK(check_epoch(l, tr, &cfg, 2, 0, 0) == dt_loader_batches(l));
            dt_loader_destroy(l);
        }
        CHECK_MSG(dt_mem_used() == used, "%zu bytes still charged", dt_mem_used() - used);
    }
    dt_dataset_destroy(tr), dt_dataset_destroy(va), dt_dataset_destroy(big);
    /* none for a set under 4 MiB */
    dt_dataset *small = NULL;
    uint8_t xs[64 * 10] = {0};
    int32_t ys[64] = {0};
    CHECK_OK(dt_dataset_create(&small, DT_U8, xs, ys, 64, 1, 1, 10, 2));
    CHECK(small && dt_loader_copy_bytes(small) == 0);
    dt_dataset_destroy(small);
    dt_dataset_destroy(ds);
}

/* Several ranks' loaders together hand out every sample exactly once per epoch. */
static void test_loader_ranks(dt_dataset *ds) {
    enum { W = 3 };
    dt_loader *l[W];
    int cnt[203] = {0};
    int32_t label_of[203];
    for (int r = 0; r < W; r++) {
        dt_loader_config cfg = {.batch = 10, .shuffle = true, .seed = 4, .rank = r, .world = W, .prefetch = 2};
        CHECK_OK(dt_loader_create(&l[r], ds, &cfg));
        CHECK_OK(dt_loader_start_epoch(l[r], 2, 0));
    }
    /* identify samples by their first pixel value and label: pixel 0 of sample i is i*7 mod 256 */
    for (int i = 0; i < 203; i++) label_of[i] = i % 10;
    size_t steps = dt_loader_batches(l[0]);
    for (size_t s = 0; s < steps; s++)
        for (int r = 0; r < W; r++) {
            dt_batch b;
            CHECK_OK(dt_loader_next(l[r], &b));
            for (int k = 0; k < b.n; k++) {
                int v = (int)lroundf(b.x[k * 30] * 255), id = -1;
                for (int i = 0; i < 203; i++)
                    if ((i * 7) % 256 == v && label_of[i] == b.y[k]) id = i;
                if (id >= 0) cnt[id]++;
            }
        }
    int ok = 1;
    for (int i = 0; i < 203; i++) ok &= cnt[i] == 1;
    CHECK_MSG(ok, "samples not seen exactly once across ranks");
    for (int r = 0; r < W; r++) {
        dt_batch b;
        CHECK(dt_loader_next(l[r], &b) == DT_ENOENT);
        dt_loader_destroy(l[r]);
    }
}

/* Where the ranks (times their threads) take every CPU, batches are built on the rank's thread. */
static void test_prefetch_for(void) {
    CHECK(dt_loader_prefetch_for(2, 1, 2) == 0);
    CHECK(dt_loader_prefetch_for(8, 1, 2) == 0);
    CHECK(dt_loader_prefetch_for(2, 2, 4) == 0);
    CHECK(dt_loader_prefetch_for(1, 1, 2) == -1); /* a core to spare: the thread stays */
    CHECK(dt_loader_prefetch_for(2, 1, 4) == -1);
    CHECK(dt_loader_prefetch_for(2, 1, 0) == -1); /* the transport cannot tell */
    CHECK(dt_loader_prefetch_for(0, 1, 2) == -1);
}

int main(void) {
    test_prefetch_for();
    test_order();
    test_shards();
    dt_dataset *ds = make_ds();
    if (ds) {
        test_loader(ds);
        test_loader_ranks(ds);
    }
    test_hot_copy();
    dt_dataset_destroy(ds);
    return dt_test_summary("loader_test");
}
