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

#include <stdbool.h>
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

/**
 * malloc(size), with huge pages requested when size is at least 4 MiB, or a
 * block sl__big_free() kept of between size and twice size bytes.
 */
void *sl__big_alloc(size_t size);

/*
 * Freed blocks kept for reuse. A process that is not ours (libsluice in a
 * trainer) cannot set malloc up as sl__big_alloc_setup() does, and there
 * glibc hands a freed batch block of a few hundred KiB back to the kernel
 * and faults the next one in again, page by page: 25 faults per 512 KiB
 * batch cost a Python consumer more than reading the batch. A block given
 * to sl__big_free() is kept instead, already faulted in, for the next
 * sl__big_alloc() of about its size: at most SL_BIG_CACHE_BLOCKS blocks of
 * at least SL_BIG_CACHE_MIN bytes and SL_BIG_CACHE_BYTES bytes in all per
 * process, freed at exit, and within a memory budget when one is set
 * (sl__big_cache_set_budget()). Not glibc: sl__big_free() is free().
 * Small blocks too: a window of 8 KiB batches freed together left a free
 * heap top past glibc's trim threshold, given back and faulted in again for
 * the next window (3.7 faults a batch; a trainer over TCP read 4.5 times
 * slower). 64 blocks hold a request window of 32 and what the caller holds.
 * A process whose malloc sl__big_alloc_setup() set up (a worker) keeps
 * blocks of SL_BIG_CACHE_MIN_SETUP or more only: its trim threshold keeps
 * the smaller ones in the heap already, and kept blocks are charged to its
 * memory budget. fork() takes the cache's mutex first and lets it go on
 * both sides, so that a child forked while another thread held it can use
 * the cache.
 */
#define SL_BIG_CACHE_BLOCKS 64
#define SL_BIG_CACHE_MIN (4u << 10)
#define SL_BIG_CACHE_MIN_SETUP (64u << 10)
#define SL_BIG_CACHE_BYTES (64u << 20)

struct sl_membudget;

/**
 * Charges what is kept from now on to budget (a worker's --max-memory-mb):
 * a block is kept only when the budget has room for it, and the budget's
 * reclaim frees every kept block before it refuses an owner's charge.
 * NULL: kept blocks are bounded only by SL_BIG_CACHE_BYTES. Frees what was
 * kept before (charged to the budget set before). Call before threads that
 * allocate blocks start, and with NULL before budget goes away.
 */
void sl__big_cache_set_budget(struct sl_membudget *budget);

/** Frees a block of sl__big_alloc() (or malloc), or keeps it for reuse; a
 *  block inside a range of sl__big_foreign_add() goes to that range's free
 *  function instead. */
void sl__big_free(void *p);

/*
 * Memory of someone else's that blocks may come from: a worker places a
 * batch's block in a client's shared-memory region (workerd/shm.h) and the
 * batch is freed like any other, through sl__big_free(), wherever its last
 * reference goes. A block inside [base, base + size) then goes to
 * free_fn(arg, p), on the thread that frees it. At most
 * SL_BIG_FOREIGN_MAX ranges; a process without any pays one atomic load a
 * free. The range must stay added while blocks inside it may be freed.
 */
#define SL_BIG_FOREIGN_MAX 4096
typedef void (*sl_big_foreign_free_fn)(void *arg, void *p);
/** @return 0, or -ENOSPC with SL_BIG_FOREIGN_MAX ranges added */
int sl__big_foreign_add(void *base, size_t size, sl_big_foreign_free_fn free_fn, void *arg);
/** Removes the range that starts at base (added before). */
void sl__big_foreign_remove(void *base);
/** @return whether p lies in a range added with sl__big_foreign_add() */
bool sl__big_is_foreign(const void *p);

/** Frees every kept block (also done at exit). */
void sl__big_cache_drain(void);

/** @return the bytes kept now (usable sizes), with the count of blocks in blocks */
size_t sl__big_cache_kept(unsigned *blocks);

#endif
