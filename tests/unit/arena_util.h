/*
 * arena_util.h: an arena of someone else's, as a worker's shared-memory
 * region is, for the tests of where a pipeline's last batch makes its
 * blocks (sl_pipeline_opts_t.block_alloc): blocks handed out in turn, each
 * with the index it was asked for, given back through sl__big_free().
 */
#ifndef SL_TEST_ARENA_UTIL_H
#define SL_TEST_ARENA_UTIL_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "big_alloc.h"
#include "pipeline.h"

#define ARENA_BYTES ((size_t)64 << 20)
#define ARENA_BLOCKS 256
static struct arena {
    uint8_t *base;
    size_t used;
    unsigned made, freed;
    bool refuse;
    uint8_t *block[ARENA_BLOCKS]; /* the first blocks made, and the index each was asked for with */
    uint64_t index[ARENA_BLOCKS];
} arena;

static inline void *arena_alloc(void *arg, size_t size, uint64_t index)
{
    struct arena *a = arg;
    if (a->refuse || a->used + size > ARENA_BYTES)
        return NULL;
    uint8_t *p = a->base + a->used;
    a->used += (size + 63) / 64 * 64;
    if (a->made < ARENA_BLOCKS) {
        a->block[a->made] = p;
        a->index[a->made] = index;
    }
    a->made++;
    return p;
}

static inline void arena_free(void *arg, void *p)
{
    struct arena *a = arg;
    cr_assert((uint8_t *)p >= a->base && (uint8_t *)p < a->base + a->used, "a block the arena did not make");
    a->freed++;
}

/* A fresh arena (refusing every block when refuse), and options that offer it. */
static inline sl_pipeline_opts_t arena_open(bool refuse)
{
    arena = (struct arena){.base = malloc(ARENA_BYTES), .refuse = refuse};
    cr_assert_not_null(arena.base);
    cr_assert_eq(sl__big_foreign_add(arena.base, ARENA_BYTES, arena_free, &arena), 0);
    return (sl_pipeline_opts_t){.block_alloc = arena_alloc, .block_arg = &arena};
}

/* Checks every block came back (what names the run), and frees the arena.
 * @return the blocks it made */
static inline unsigned arena_close(const char *what)
{
    cr_assert_eq(arena.freed, arena.made, "%s: %u blocks made in the arena, %u given back", what, arena.made,
                 arena.freed);
    sl__big_foreign_remove(arena.base);
    free(arena.base);
    return arena.made;
}

/* The index the arena's block at p was asked for with. */
static inline uint64_t arena_index_of(const uint8_t *p)
{
    for (unsigned i = 0; i < arena.made && i < ARENA_BLOCKS; i++)
        if (arena.block[i] == p)
            return arena.index[i];
    cr_assert_fail("a block the arena did not make");
    return 0;
}

#endif
