/*
 * test_big_alloc.c: the kept blocks of common/big_alloc.c: a freed block
 * comes back for the next allocation of about its size, and what is kept
 * stays within SL_BIG_CACHE_BLOCKS and SL_BIG_CACHE_BYTES and a memory
 * budget; a freed wire batch (protocol/batch.c) keeps its block.
 */
#include <criterion/criterion.h>

#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

#include "batch.h"
#include "big_alloc.h"
#include "fork_util.h"
#include "membudget.h"

static void drain(void)
{
    sl__big_cache_drain();
}

TestSuite(big_alloc, .init = drain, .fini = drain);

Test(big_alloc, a_freed_block_comes_back_for_about_its_size)
{
    size_t size = 512u << 10;
    uint8_t *a = sl__big_alloc(size);
    cr_assert_not_null(a);
    memset(a, 1, size);
    sl__big_free(a);
    uint8_t *b = sl__big_alloc(size - 100); /* a little smaller: the same block */
    cr_assert_eq(b, a, "the kept block was not reused");
    sl__big_free(b);
    uint8_t *c = sl__big_alloc(size / 4); /* far smaller: a block of its own */
    cr_assert_neq(c, a, "a block four times too large was handed out");
    uint8_t *d = sl__big_alloc(size * 2); /* larger: a block of its own */
    cr_assert_neq(d, a);
    cr_assert_geq(malloc_usable_size(d), size * 2);
    memset(d, 2, size * 2); /* all of it is there */
    free(c); /* plain free() of a block from sl__big_alloc() is fine */
    sl__big_free(d);
    uint8_t *e = sl__big_alloc(size);
    cr_assert_eq(e, a, "the best fit is the smallest block large enough");
    sl__big_free(e);
}

static unsigned kept_blocks(void)
{
    unsigned n;
    sl__big_cache_kept(&n);
    return n;
}

/* A freed block of `below` bytes is not kept, and one of `floor` is. */
static void assert_kept_from(size_t below, size_t floor)
{
    void *a = sl__big_alloc(below);
    cr_assert_not_null(a);
    sl__big_free(a);
    cr_assert_eq(kept_blocks(), 0, "a block of %zu bytes was kept (the least kept: %zu)", below, floor);
    void *b = sl__big_alloc(floor);
    cr_assert_not_null(b);
    sl__big_free(b);
    cr_assert_eq(kept_blocks(), 1, "a block of %zu bytes was not kept", floor);
}

Test(big_alloc, small_blocks_are_not_kept)
{
    assert_kept_from(1024, SL_BIG_CACHE_MIN);
    sl__big_cache_drain();
    unsigned n;
    cr_assert_eq(sl__big_cache_kept(&n), 0);
    cr_assert_eq(n, 0);
}

Test(big_alloc, what_is_kept_is_bounded)
{
    enum { N = SL_BIG_CACHE_BLOCKS + 4 };
    void *blocks[N];
    size_t size = 128u << 10;
    for (int i = 0; i < N; i++)
        blocks[i] = sl__big_alloc(size);
    for (int i = 0; i < N; i++)
        sl__big_free(blocks[i]);
    unsigned n;
    size_t bytes = sl__big_cache_kept(&n);
    cr_assert_eq(n, SL_BIG_CACHE_BLOCKS, "%u blocks kept", n);
    cr_assert_leq(bytes, SL_BIG_CACHE_BYTES);
    cr_assert_geq(bytes, SL_BIG_CACHE_BLOCKS * size);
    /* Blocks of 8 MiB: the byte bound stops them first. */
    sl__big_cache_drain();
    enum { M = SL_BIG_CACHE_BYTES / (8u << 20) + 2 };
    void *big[M];
    for (int i = 0; i < M; i++)
        big[i] = sl__big_alloc(8u << 20);
    for (int i = 0; i < M; i++)
        sl__big_free(big[i]);
    bytes = sl__big_cache_kept(&n);
    cr_assert_leq(bytes, SL_BIG_CACHE_BYTES);
    cr_assert_lt(n, M, "every 8 MiB block was kept: %u", n);
    /* A block over the byte bound is never kept. */
    sl__big_cache_drain();
    void *huge = sl__big_alloc(SL_BIG_CACHE_BYTES + 1);
    cr_assert_not_null(huge);
    sl__big_free(huge);
    cr_assert_eq(kept_blocks(), 0);
}

/* A worker's kept blocks are charged to its --max-memory-mb budget: kept
 * only when it has room, given back (freed) before an owner's charge would
 * be refused, so that keeping blocks never fails a pipeline. */
Test(big_alloc, kept_blocks_are_charged_to_the_budget_and_give_way_to_its_owners)
{
    sl_membudget_t budget;
    sl_membudget_init(&budget, 8u << 20, "--max-memory-mb");
    budget.reclaim = sl__big_cache_drain;
    sl__big_cache_set_budget(&budget);

    size_t size = 1u << 20;
    void *a = sl__big_alloc(size);
    cr_assert_not_null(a);
    size_t usable = malloc_usable_size(a);
    sl__big_free(a);
    cr_assert_eq(kept_blocks(), 1);
    cr_assert_eq(sl_membudget_used(&budget), usable, "the kept block is not charged: %zu",
                 sl_membudget_used(&budget));

    /* An owner's charge that fits only without the kept block: the block
     * goes, the charge is made, and nothing is refused. */
    size_t owner = (8u << 20) - (512u << 10);
    cr_assert(sl_membudget_charge(&budget, owner), "the kept block made an owner's charge fail");
    cr_assert_eq(kept_blocks(), 0, "the kept block was not freed for the owner");
    cr_assert_eq(sl_membudget_used(&budget), owner);
    cr_assert_eq(budget.refusals, 0);

    /* No room: a freed block is freed, not kept. */
    void *b = sl__big_alloc(size);
    cr_assert_not_null(b);
    sl__big_free(b);
    cr_assert_eq(kept_blocks(), 0, "a block was kept past the budget");
    cr_assert_eq(sl_membudget_used(&budget), owner);

    /* A charge that does not fit even with nothing kept is refused, once. */
    cr_assert_not(sl_membudget_charge(&budget, 1u << 20));
    cr_assert_eq(budget.refusals, 1);

    /* Taking a kept block back gives its charge back. */
    sl_membudget_release(&budget, owner);
    void *c = sl__big_alloc(size);
    sl__big_free(c);
    cr_assert_eq(sl_membudget_used(&budget), malloc_usable_size(c));
    void *d = sl__big_alloc(size);
    cr_assert_eq(d, c);
    cr_assert_eq(sl_membudget_used(&budget), 0, "a block handed out is still charged as kept");
    sl__big_free(d);

    /* Without the budget, what it was charged is given back. */
    sl__big_cache_set_budget(NULL);
    cr_assert_eq(sl_membudget_used(&budget), 0);
    cr_assert_eq(kept_blocks(), 0);
}

/* A worker's sent batch: its block is kept for the pipeline's next batch
 * (freed, it would go back to the kernel with its thread's heap). */
Test(big_alloc, a_freed_wire_batch_keeps_its_block)
{
    size_t size = 38u << 20; /* 64 images of 224 x 224 x 3 float32 */
    sl_wire_batch_t *b = calloc(1, sizeof *b);
    cr_assert_not_null(b);
    b->data = sl__big_alloc(size);
    b->size = size;
    cr_assert_not_null(b->data);
    memset(b->data, 3, size);
    uint8_t *data = b->data;
    sl_wire_batch_free(b);
    cr_assert_eq(kept_blocks(), 1, "the sent batch's block was not kept");
    uint8_t *next = sl__big_alloc(size);
    cr_assert_eq(next, data, "the next batch did not get the kept block");
    sl__big_free(next);
}

static void use_cache(void)
{
    void *p = sl__big_alloc(8u << 10);
    if (p)
        memset(p, 1, 8u << 10);
    sl__big_free(p);
}

static void fill_cache(void)
{
    void *b[4];
    for (int i = 0; i < 4; i++)
        cr_assert_not_null(b[i] = sl__big_alloc(8u << 10));
    for (int i = 0; i < 4; i++)
        sl__big_free(b[i]);
    cr_assert_geq(kept_blocks(), 4);
}

/* A trainer may fork its data loaders while a thread streams: the child
 * finds the cache unlocked (checked by mutation: without the fork handlers
 * a child waits on the cache's mutex and its alarm fails the test). */
Test(big_alloc, a_child_forked_while_a_thread_uses_the_cache_can_use_it)
{
    fork_while_used(use_cache, fill_cache, 300);
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
/* Under ASan a kept block is poisoned: a use after sl__big_free() is still
 * caught, though the memory is not freed. */
Test(big_alloc, a_kept_block_is_poisoned_until_handed_out)
{
    size_t size = 512u << 10;
    uint8_t *a = sl__big_alloc(size);
    cr_assert_not_null(a);
    cr_assert_null(__asan_region_is_poisoned(a, size), "a new block is poisoned");
    sl__big_free(a);
    cr_assert_eq(kept_blocks(), 1);
    cr_assert_eq(__asan_region_is_poisoned(a, size), a, "a kept block can be read");
    uint8_t *b = sl__big_alloc(size);
    cr_assert_eq(b, a);
    cr_assert_null(__asan_region_is_poisoned(b, size), "a block handed out again is still poisoned");
    sl__big_free(b);
}
#endif

/* Batches of 8 KiB (1,024 int64) read over TCP by a trainer whose malloc
 * was not set up: freed together, they made a free top of the heap past
 * glibc's trim threshold (128 KiB), which went back to the kernel and was
 * faulted in again, page by page, for the next window of batches: about 3.7
 * faults a batch, and a remote trainer read 24 million elements a second
 * instead of 109. Kept, they come back faulted in. Counts page faults, not
 * time: a window of 40 such blocks, allocated and freed 500 times. */
Test(big_alloc, a_window_of_small_batches_freed_and_made_again_faults_nothing_in)
{
    enum { WINDOW = 40, ROUNDS = 500, SIZE = 8192 + 64 };
    cr_assert_leq(WINDOW, SL_BIG_CACHE_BLOCKS);
    cr_assert_geq(SIZE, SL_BIG_CACHE_MIN);
    void *blocks[WINDOW];
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < WINDOW; i++) {
            blocks[i] = sl__big_alloc(SIZE);
            cr_assert_not_null(blocks[i]);
            memset(blocks[i], r, SIZE); /* written whole, as a batch is */
        }
        for (int i = 0; i < WINDOW; i++)
            sl__big_free(blocks[i]);
    }
    getrusage(RUSAGE_SELF, &after);
    long faults = after.ru_minflt - before.ru_minflt;
    cr_assert_lt(faults, ROUNDS, "%ld page faults in %d rounds of %d blocks of %d bytes", faults, ROUNDS, WINDOW,
                 SIZE);
}

/* A worker sets its malloc up (sl__big_alloc_setup(): its trim threshold
 * keeps small blocks in the heap) and charges kept blocks to its memory
 * budget: it keeps blocks of SL_BIG_CACHE_MIN_SETUP or more only, as
 * before small blocks were kept, so that its budget's charges go back to
 * what its jobs hold. */
Test(big_alloc, a_process_that_set_malloc_up_keeps_no_small_blocks)
{
    sl__big_alloc_setup(64u << 20);
    assert_kept_from(8192, SL_BIG_CACHE_MIN_SETUP);
}

static unsigned freed_in[2];

static void count_free(void *arg, void *p)
{
    (void)p;
    freed_in[(uintptr_t)arg]++;
}

/* A block inside a foreign range goes to that range's free function (a
 * batch made in a worker's shared memory), anything else as before; a
 * removed range takes no more. */
Test(big_alloc, a_block_of_a_foreign_range_goes_back_to_it)
{
    static uint8_t one[8192], two[8192];
    cr_assert_eq(sl__big_foreign_add(one, sizeof one, count_free, (void *)0), 0);
    cr_assert_eq(sl__big_foreign_add(two, sizeof two, count_free, (void *)1), 0);
    cr_assert(sl__big_is_foreign(one) && sl__big_is_foreign(two + sizeof two - 1));
    uint8_t elsewhere;
    cr_assert(!sl__big_is_foreign(&elsewhere));
    sl__big_free(one + 4096);
    sl__big_free(two);
    sl__big_free(two + sizeof two - 1);
    cr_assert_eq(freed_in[0], 1);
    cr_assert_eq(freed_in[1], 2);
    void *mine = sl__big_alloc(512u << 10);
    sl__big_free(mine); /* kept: not a foreign block */
    cr_assert_eq(kept_blocks(), 1);
    sl__big_foreign_remove(one);
    sl__big_free(two + 100);
    cr_assert_eq(freed_in[1], 3);
    sl__big_foreign_remove(two);
    cr_assert_eq(freed_in[0], 1);
    cr_assert(!sl__big_is_foreign(one) && !sl__big_is_foreign(two) && !sl__big_is_foreign(NULL));
}
