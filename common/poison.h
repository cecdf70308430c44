/*
 * poison.h: under AddressSanitizer, marks memory an allocator keeps for
 * reuse (big_alloc.c's block cache, recycle.c's stocks) as not to be
 * touched until it is handed out again, so that a use after it was given
 * back is still reported. Without ASan: nothing.
 */
#ifndef SL_POISON_H
#define SL_POISON_H

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define KEPT_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define KEPT_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define KEPT_POISON(p, n) ((void)(p), (void)(n))
#define KEPT_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#endif
