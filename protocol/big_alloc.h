/*
 * big_alloc.h: malloc for large, short-lived buffers that are written
 * whole right after they are allocated (batch blocks).
 *
 * A block of tens of MiB comes from a fresh mmap each time (it is over
 * glibc's mmap threshold), and filling it faults in one 4 KiB page at a
 * time: on a virtual machine that costs more than the copy itself. Asking
 * for transparent huge pages on the block's 2 MiB-aligned interior turns
 * ~9,000 faults per 38 MiB into ~20. The memory is plain malloc memory:
 * free() frees it, and where huge pages are not to be had (THP "never", not
 * Linux) the advice is ignored and nothing else changes.
 */
#ifndef SL_BIG_ALLOC_H
#define SL_BIG_ALLOC_H

#include <stddef.h>

/**
 * Sets the process's malloc up for batch blocks, once, before threads start:
 * large allocations come from malloc's heaps instead of a fresh mmap each
 * (M_MMAP_MAX 0; glibc still maps one that no heap can hold), and freed
 * memory is kept for the next block up to max_batch_bytes at the top of a
 * heap (M_TRIM_THRESHOLD) instead of being unmapped. A block then reuses
 * the pages of the one freed before it: no faults, no zeroing by the
 * kernel. Not glibc: does nothing.
 * @param[in] max_batch_bytes the largest batch a pipeline may build
 */
void sl__big_alloc_setup(size_t max_batch_bytes);

/** malloc(size), with huge pages requested when size is at least 4 MiB. */
void *sl__big_alloc(size_t size);

#endif
