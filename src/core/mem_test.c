/* The allocator's accounting (core/mem.c): large blocks are page-aligned and counted, released
 * pages read as zeros and stop counting, --mem-limit refuses an allocation or a re-acquire
 * beyond it with a message naming the limit, and freeing gives the bytes back. */
#include "core/test.h"
#include "dtrain/core.h"

#include <stdint.h>
#include <string.h>

static void test_blocks(void) {
    const size_t used0 = dt_mem_used();
    float *a = dt_alloc(3 << 20); /* 3 MiB: a mapping */
    char *b = dt_alloc(100);      /* the C heap */
    CHECK(a && b);
    CHECK(((uintptr_t)a & 4095) == 0);
    CHECK(((uintptr_t)b & 63) == 0);
    CHECK_MSG(dt_mem_used() == used0 + (3 << 20) + 128, "used %zu, want %zu", dt_mem_used(), used0 + (3 << 20) + 128);
    for (size_t i = 0; i < (3u << 20) / 4; i++) a[i] = 1.0f;
    /* release [1000, 600000) floats: whole pages inside only */
    size_t got = dt_mem_release(a + 1000, (600000 - 1000) * sizeof(float));
    size_t lo = (1000 * 4 + 4095) / 4096 * 4096, hi = 600000 * 4 / 4096 * 4096;
    CHECK_MSG(got == hi - lo, "released %zu, want %zu", got, hi - lo);
    CHECK(a[lo / 4 - 1] == 1.0f && a[lo / 4] == 0.0f && a[hi / 4 - 1] == 0.0f && a[hi / 4] == 1.0f);
    CHECK(dt_mem_used() == used0 + (3 << 20) + 128 - got);
    CHECK_OK(dt_mem_reacquire(got));
    CHECK(dt_mem_used() == used0 + (3 << 20) + 128);
    CHECK(dt_mem_peak() >= dt_mem_used());
    dt_free(a), dt_free(b);
    CHECK(dt_mem_used() == used0);
    dt_free(NULL);
}

static void test_limit(void) {
    const size_t used0 = dt_mem_used();
    CHECK_OK(dt_mem_set_limit(used0 + (1 << 20)));
    void *ok = dt_alloc(512 << 10);
    CHECK(ok != NULL && !dt_mem_limit_hit());
    void *no = dt_alloc(1 << 20);
    CHECK(no == NULL && dt_mem_limit_hit());
    CHECK_MSG(strstr(dt_last_error(), "`mem_limit`") != NULL, "message: %s", dt_last_error());
    dt_slab s;
    CHECK(dt_slab_init(&s, 1 << 20) == DT_ENOMEM);
    CHECK_MSG(strstr(dt_last_error(), "cannot allocate a slab") && strstr(dt_last_error(), "`mem_limit`"), "%s",
              dt_last_error());
    CHECK(dt_mem_reacquire(1 << 20) == DT_ENOMEM);
    CHECK(dt_mem_set_limit(used0 + 1) == DT_ENOMEM); /* already above */
    CHECK(strstr(dt_last_error(), "already holds") != NULL);
    CHECK_OK(dt_mem_set_limit(0));
    dt_free(ok);
    CHECK(dt_mem_used() == used0);
    CHECK(dt_mem_os_peak() > 0);
}

/* A reserved slab is charged only for what is placed; narrowing gives the other pages back (they
 * read as zeros) and stops charging them; widening beyond the limit fails and changes nothing. */
static void test_placement(void) {
    const size_t used0 = dt_mem_used(), n = 1 << 20; /* 4 MiB of floats */
    dt_slab s;
    CHECK_OK(dt_slab_reserve(&s, n));
    CHECK(dt_mem_used() == used0);
    const dt_range two[2] = {{0, 4096}, {n - 4096, n}};
    CHECK_OK(dt_slab_place(&s, two, 2, "a test"));
    CHECK(dt_mem_used() == used0 + 2 * 4096 * sizeof(float));
    CHECK_OK(dt_slab_place(&s, NULL, 0, "a test")); /* widen: all of it */
    CHECK(dt_mem_used() == used0 + n * sizeof(float));
    for (size_t i = 0; i < n; i++) s.data[i] = 1.0f;
    CHECK_OK(dt_slab_place(&s, two, 2, "a test")); /* narrow: the middle goes back */
    CHECK(dt_mem_used() == used0 + 2 * 4096 * sizeof(float));
    CHECK(s.data[0] == 1.0f && s.data[4095] == 1.0f && s.data[n - 1] == 1.0f && s.data[n - 4096] == 1.0f);
    CHECK(s.data[8192] == 0.0f && s.data[n / 2] == 0.0f && s.data[n - 8192] == 0.0f);
    CHECK_OK(dt_mem_set_limit(dt_mem_used() + 4096));
    CHECK(dt_slab_place(&s, NULL, 0, "a test") == DT_ENOMEM && dt_mem_limit_hit());
    CHECK_MSG(strstr(dt_last_error(), "a test") && strstr(dt_last_error(), "`mem_limit`"), "%s", dt_last_error());
    CHECK(dt_mem_used() == used0 + 2 * 4096 * sizeof(float) && s.data[0] == 1.0f);
    CHECK_OK(dt_mem_set_limit(0));
    dt_slab_free(&s);
    CHECK(dt_mem_used() == used0);
}

int main(void) {
    test_blocks();
    test_limit();
    test_placement();
    return dt_test_summary("mem_test");
}
