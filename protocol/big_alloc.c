/*
 * big_alloc.c: large buffers with transparent huge pages (big_alloc.h).
 */
#include "big_alloc.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#ifdef __linux__
#include <sys/mman.h>
#endif

#define HUGE_PAGE ((uintptr_t)2 << 20)

void sl__big_alloc_setup(size_t max_batch_bytes)
{
#ifdef __GLIBC__
    (void)mallopt(M_MMAP_MAX, 0);
    (void)mallopt(M_TRIM_THRESHOLD, max_batch_bytes > INT_MAX ? INT_MAX : (int)max_batch_bytes);
#else
    (void)max_batch_bytes;
#endif
}

void *sl__big_alloc(size_t size)
{
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
