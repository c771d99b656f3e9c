/* The allocator of the library's large buffers and its accounting: dt_alloc blocks (small ones
 * from the C heap, large ones as page-aligned anonymous mappings that stay non-resident until
 * written), reserved blocks whose owner charges only the part it places (dt_slab_place), the
 * bytes held against a per-process limit (--mem-limit), page release for memory a rank does not
 * own, and the OS's own peak resident set (VmHWM). */
#include "dtrain/core.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { HDR = 64, PAGE = 4096, BIG = 256 * 1024 };
#define MEM_MAGIC 0x64746d656d626c6bULL /* "dtmemblk" */

typedef struct {
    uint64_t magic;
    size_t bytes; /* counted bytes of the block */
    size_t map;   /* mapping length (0: C heap) */
    void *base;
} blk;

#if defined(__SANITIZE_ADDRESS__)
enum { USE_MMAP = 0 }; /* under ASan large blocks stay on its heap, so overflows are still caught */
#else
enum { USE_MMAP = 1 };
#endif

static _Atomic size_t g_used, g_peak, g_limit;
static _Thread_local bool g_hit;

static void note_peak(size_t now) {
    size_t p = atomic_load(&g_peak);
    while (now > p && !atomic_compare_exchange_weak(&g_peak, &p, now)) {}
}

/* The machine's physical memory in bytes (0: unknown). */
static size_t phys_bytes(void) {
    static size_t cached;
    if (!cached) {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        cached = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : SIZE_MAX;
    }
    return cached == SIZE_MAX ? 0 : cached;
}

/* Counts bytes against the limit (or, without one, the machine's memory); false (with the error
 * set) when they do not fit. */
static bool charge(size_t bytes, const char *what) {
    size_t lim = atomic_load(&g_limit);
    size_t now = atomic_fetch_add(&g_used, bytes) + bytes;
    /* reserved blocks are address space only (MAP_NORESERVE): without a --mem-limit, what is placed
     * must still fit the machine, or the kernel would kill the rank on a page fault instead */
    const size_t phys = lim ? 0 : phys_bytes();
    if (phys && now > phys) {
        atomic_fetch_sub(&g_used, bytes);
        g_hit = true; /* the machine's memory acts as the limit */
        dt_error(DT_ENOMEM,
                 "%s of %zu bytes would hold %zu bytes on this rank, more than this machine's %zu bytes of "
                 "memory; use more ranks (`zero` 3, `pp` K, `tp` K) or a smaller model or batch ("
                 "`dry_run` prints each rank's plan), or set `mem_limit` BYTES yourself to count on swap",
                 what, bytes, now, phys);
        return false;
    }
    if (lim && now > lim) {
        atomic_fetch_sub(&g_used, bytes);
        g_hit = true;
        dt_error(DT_ENOMEM,
                 "`mem_limit` %zu bytes: %s of %zu bytes would hold %zu bytes on this rank; raise "
                 "`mem_limit`, more ranks (`zero` 3, `pp` K, `tp` K), or a smaller model or batch",
                 lim, what, bytes, now);
        return false;
    }
    note_peak(now);
    return true;
}

/* A block of bytes (rounded to 64) counted as `counted` of them (rounded, or 0 for a reserved one). */
static void *alloc_block(size_t rounded, size_t counted) {
    char *p;
    blk *h;
    if (rounded >= BIG && !USE_MMAP) { /* page-aligned on the heap, zeroed */
        char *base = aligned_alloc(PAGE, PAGE + ((rounded + PAGE - 1) & ~(size_t)(PAGE - 1)));
        if (!base) return NULL;
        p = base + PAGE;
        memset(p, 0, rounded);
        h = (blk *)(p - HDR);
        *h = (blk){.magic = MEM_MAGIC, .bytes = counted, .map = 0, .base = base};
        return p;
    }
    if (rounded >= BIG) {
        size_t map = PAGE + ((rounded + PAGE - 1) & ~(size_t)(PAGE - 1));
        /* a reserved block (counted 0: its pages are charged as they are placed) is address space
         * only: MAP_NORESERVE, or the kernel's overcommit check refuses a model larger than memory
         * that ZeRO-3, tp or pp would place a part of */
        const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (counted ? 0 : MAP_NORESERVE);
        void *base = mmap(NULL, map, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (base == MAP_FAILED) return NULL;
        p = (char *)base + PAGE; /* mapped pages are zero */
        h = (blk *)(p - HDR);
        *h = (blk){.magic = MEM_MAGIC, .bytes = counted, .map = map, .base = base};
        return p;
    }
    char *base = aligned_alloc(64, HDR + rounded);
    if (!base) return NULL;
    p = base + HDR;
    memset(p, 0, rounded);
    h = (blk *)base;
    *h = (blk){.magic = MEM_MAGIC, .bytes = counted, .map = 0, .base = base};
    return p;
}

static size_t round64(size_t bytes) {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    return rounded ? rounded : 64;
}

size_t dt_alloc_size(size_t bytes) { return round64(bytes); }

void *dt_alloc(size_t bytes) {
    const size_t rounded = round64(bytes);
    g_hit = false;
    if (!charge(rounded, "an allocation")) return NULL;
    void *p = alloc_block(rounded, rounded);
    if (!p) atomic_fetch_sub(&g_used, rounded);
    return p;
}

void *dt_alloc_reserved(size_t bytes) { return alloc_block(round64(bytes), 0); }

void dt_free(void *p) {
    if (!p) return;
    blk *h = (blk *)((char *)p - HDR);
    if (h->magic != MEM_MAGIC) abort(); /* not a dt_alloc block: a programmer error */
    h->magic = 0;
    atomic_fetch_sub(&g_used, h->bytes);
    if (h->map) munmap(h->base, h->map);
    else free(h->base);
}

dt_status dt_mem_set_limit(size_t bytes) {
    atomic_store(&g_limit, bytes);
    size_t now = atomic_load(&g_used);
    if (bytes && now > bytes)
        return dt_error(DT_ENOMEM,
                        "`mem_limit` %zu bytes: this rank already holds %zu bytes (parameters, gradients "
                        "and optimizer state); raise `mem_limit` or use more ranks with `zero` 3, `pp` K or `tp` K",
                        bytes, now);
    return DT_OK;
}

size_t dt_mem_limit(void) { return atomic_load(&g_limit); }
size_t dt_mem_used(void) { return atomic_load(&g_used); }
size_t dt_mem_peak(void) { return atomic_load(&g_peak); }
bool dt_mem_limit_hit(void) { return g_hit; }

/* The whole pages inside [p, p + bytes) given back; their bytes, 0 when none (or madvise failed). */
static size_t give_back(void *p, size_t bytes) {
    uintptr_t a = ((uintptr_t)p + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    uintptr_t b = ((uintptr_t)p + bytes) & ~(uintptr_t)(PAGE - 1);
    if (b <= a) return 0;
    if (madvise((void *)a, b - a, MADV_DONTNEED) != 0) return 0;
    return b - a;
}

size_t dt_mem_release(void *p, size_t bytes) {
    const size_t n = give_back(p, bytes);
    atomic_fetch_sub(&g_used, n);
    return n;
}

void dt_mem_discard(void *p, size_t bytes) { give_back(p, bytes); }

dt_status dt_mem_charge(size_t bytes, const char *what) {
    g_hit = false;
    return charge(bytes, what) ? DT_OK : DT_ENOMEM;
}

void dt_mem_uncharge(size_t bytes) { atomic_fetch_sub(&g_used, bytes); }

void dt_mem_populate(void *p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    uintptr_t a = ((uintptr_t)p + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    uintptr_t b = ((uintptr_t)p + bytes) & ~(uintptr_t)(PAGE - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE); /* EINVAL before Linux 5.14: faults as before */
#else
    (void)p, (void)bytes;
#endif
}

dt_status dt_mem_reacquire(size_t bytes) {
    g_hit = false;
    return charge(bytes, "gathering released memory") ? DT_OK : DT_ENOMEM;
}

size_t dt_mem_os_peak(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}
