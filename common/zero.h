/*
 * zero.h: zeroing a struct but for one stretch of it that its users fill
 * up to a count and never read past: a batch's component slots, 5.6 KB of
 * the 6 KB structs made per batch, where calloc() zeroed them all (about
 * 500 instructions each, and a slower path in the allocator).
 */
#ifndef SL_ZERO_H
#define SL_ZERO_H

#include <stddef.h>
#include <string.h>

/** Zeroes the size bytes at p but [hole, hole + hole_len). */
static inline void sl_zero_except(void *p, size_t size, size_t hole, size_t hole_len)
{
    memset(p, 0, hole);
    memset((char *)p + hole + hole_len, 0, size - hole - hole_len);
}

#endif
