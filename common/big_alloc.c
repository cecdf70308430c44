/*
 * big_alloc.c: large buffers with transparent huge pages (big_alloc.h).
 */
#include "big_alloc.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#ifdef __linux__
#include <sys/mman.h>
#endif

#include "membudget.h"
/* Under ASan a kept block is poisoned until it is handed out again, so a
 * use after sl__big_free() is still caught (as a use after poison). */
#include "poison.h"

#define HUGE_PAGE ((uintptr_t)2 << 20)

#ifdef __GLIBC__
/* The least block kept: SL_BIG_CACHE_MIN, or SL_BIG_CACHE_MIN_SETUP once
 * sl__big_alloc_setup() raised the trim threshold (written before threads
 * start, only read after). */
static size_t cache_min = SL_BIG_CACHE_MIN;
#endif

void sl__big_alloc_setup(size_t max_batch_bytes)
{
#ifdef __GLIBC__
    (void)mallopt(M_MMAP_MAX, 0);
    (void)mallopt(M_TRIM_THRESHOLD, max_batch_bytes > INT_MAX ? INT_MAX : (int)max_batch_bytes);
    cache_min = SL_BIG_CACHE_MIN_SETUP;
#else
    (void)max_batch_bytes;
#endif
}

#ifdef __GLIBC__
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    size_t size; /* malloc_usable_size() */
} cache[SL_BIG_CACHE_BLOCKS];
static unsigned cache_n;
static size_t cache_bytes;
static sl_membudget_t *cache_budget; /* what kept blocks are charged to, or NULL */

/* fork() takes the cache's mutex first and lets it go on both sides, so
 * that a child forked while another thread held it (a trainer forking its
 * data loaders while a thread streams) finds the cache whole and unlocked. */
static void cache_fork_lock(void)
{
    pthread_mutex_lock(&cache_mu);
}

static void cache_fork_unlock(void)
{
    pthread_mutex_unlock(&cache_mu);
}

__attribute__((constructor)) static void cache_fork_safe(void)
{
    (void)pthread_atfork(cache_fork_lock, cache_fork_unlock, cache_fork_unlock);
}

/* The smallest kept block of size to 2 * size bytes, taken out; or NULL. */
static void *cache_take(size_t size)
{
    if (size < cache_min || size > SL_BIG_CACHE_BYTES)
        return NULL;
    void *p = NULL;
    pthread_mutex_lock(&cache_mu);
    unsigned best = cache_n;
    for (unsigned i = 0; i < cache_n; i++)
        if (cache[i].size >= size && cache[i].size / 2 <= size && (best == cache_n || cache[i].size < cache[best].size))
            best = i;
    if (best < cache_n) {
        p = cache[best].p;
        KEPT_UNPOISON(p, cache[best].size);
        cache_bytes -= cache[best].size;
        sl_membudget_release(cache_budget, cache[best].size);
        cache[best] = cache[--cache_n];
    }
    pthread_mutex_unlock(&cache_mu);
    return p;
}
#endif

/* Foreign ranges (big_alloc.h), in the order added; foreign_n is also
 * read without the mutex, so that a process without any takes no lock. */
static pthread_mutex_t foreign_mu = PTHREAD_MUTEX_INITIALIZER;
static struct foreign {
    uintptr_t base, end;
    sl_big_foreign_free_fn free_fn;
    void *arg;
} *foreign;
static unsigned foreign_cap;
static _Atomic unsigned foreign_n;

int sl__big_foreign_add(void *base, size_t size, sl_big_foreign_free_fn free_fn, void *arg)
{
    int rc = 0;
    pthread_mutex_lock(&foreign_mu);
    unsigned n = atomic_load_explicit(&foreign_n, memory_order_relaxed);
    if (n == foreign_cap) {
        unsigned cap = foreign_cap ? foreign_cap * 2 : 16;
        struct foreign *f = cap <= SL_BIG_FOREIGN_MAX ? realloc(foreign, cap * sizeof *f) : NULL;
        if (!f)
            rc = -ENOSPC;
        else {
            foreign = f;
            foreign_cap = cap;
        }
    }
    if (rc == 0) {
        foreign[n] = (struct foreign){(uintptr_t)base, (uintptr_t)base + size, free_fn, arg};
        atomic_store_explicit(&foreign_n, n + 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&foreign_mu);
    return rc;
}

void sl__big_foreign_remove(void *base)
{
    pthread_mutex_lock(&foreign_mu);
    unsigned n = atomic_load_explicit(&foreign_n, memory_order_relaxed);
    for (unsigned i = 0; i < n; i++)
        if (foreign[i].base == (uintptr_t)base) {
            foreign[i] = foreign[n - 1];
            atomic_store_explicit(&foreign_n, n - 1, memory_order_relaxed);
            break;
        }
    if (n == 1 && atomic_load_explicit(&foreign_n, memory_order_relaxed) == 0) {
        free(foreign);
        foreign = NULL;
        foreign_cap = 0;
    }
    pthread_mutex_unlock(&foreign_mu);
}

/* The foreign range p lies in, into *found. @return false when none */
static bool foreign_find(const void *p, struct foreign *found)
{
    /* A block of a range is allocated (by another thread, under that
     * range's own lock) before it can be freed, and the range added before
     * that: a thread freeing one sees foreign_n > 0. */
    if (atomic_load_explicit(&foreign_n, memory_order_relaxed) == 0)
        return false;
    *found = (struct foreign){0};
    pthread_mutex_lock(&foreign_mu);
    unsigned n = atomic_load_explicit(&foreign_n, memory_order_relaxed);
    for (unsigned i = 0; i < n; i++)
        if ((uintptr_t)p >= foreign[i].base && (uintptr_t)p < foreign[i].end) {
            *found = foreign[i];
            break;
        }
    pthread_mutex_unlock(&foreign_mu);
    return found->free_fn != NULL;
}

bool sl__big_is_foreign(const void *p)
{
    struct foreign found;
    return p && foreign_find(p, &found);
}

/* Gives p to the free function of the foreign range it lies in.
 * @return false when it lies in none */
static bool foreign_free(void *p)
{
    struct foreign found;
    if (!foreign_find(p, &found))
        return false;
    found.free_fn(found.arg, p);
    return true;
}

void sl__big_free(void *p)
{
    if (!p || foreign_free(p))
        return;
#ifdef __GLIBC__
    size_t size = malloc_usable_size(p);
    if (size >= cache_min && size <= SL_BIG_CACHE_BYTES) {
        pthread_mutex_lock(&cache_mu);
        bool kept = cache_n < SL_BIG_CACHE_BLOCKS && cache_bytes + size <= SL_BIG_CACHE_BYTES &&
                    sl_membudget_charge_spare(cache_budget, size);
        if (kept) {
            KEPT_POISON(p, size);
            cache[cache_n].p = p;
            cache[cache_n].size = size;
            cache_n++;
            cache_bytes += size;
        }
        pthread_mutex_unlock(&cache_mu);
        if (kept)
            return;
    }
#endif
    free(p);
}

#ifdef __GLIBC__
/* Frees every kept block and gives its charge back; cache_mu held. */
static void drain_locked(void)
{
    for (unsigned i = 0; i < cache_n; i++) {
        KEPT_UNPOISON(cache[i].p, cache[i].size);
        free(cache[i].p);
    }
    sl_membudget_release(cache_budget, cache_bytes);
    cache_n = 0;
    cache_bytes = 0;
}
#endif

void sl__big_cache_drain(void)
{
#ifdef __GLIBC__
    pthread_mutex_lock(&cache_mu);
    drain_locked();
    pthread_mutex_unlock(&cache_mu);
#endif
}

void sl__big_cache_set_budget(sl_membudget_t *budget)
{
#ifdef __GLIBC__
    pthread_mutex_lock(&cache_mu);
    drain_locked();
    cache_budget = budget;
    pthread_mutex_unlock(&cache_mu);
#else
    (void)budget;
#endif
}

size_t sl__big_cache_kept(unsigned *blocks)
{
    *blocks = 0;
    size_t bytes = 0;
#ifdef __GLIBC__
    pthread_mutex_lock(&cache_mu);
    *blocks = cache_n;
    bytes = cache_bytes;
    pthread_mutex_unlock(&cache_mu);
#endif
    return bytes;
}

__attribute__((destructor)) static void cache_at_exit(void)
{
    sl__big_cache_drain();
}

void *sl__big_alloc(size_t size)
{
#ifdef __GLIBC__
    void *kept = cache_take(size);
    if (kept)
        return kept;
#endif
    void *p = malloc(size ? size : 1);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p && size >= 2 * HUGE_PAGE) {
        uintptr_t start = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        uintptr_t end = ((uintptr_t)p + size) & ~(HUGE_PAGE - 1);
        if (end > start)
            (void)madvise((void *)start, end - start, MADV_HUGEPAGE); /* advice: failure changes nothing */
    }
#endif
    return p;
}
