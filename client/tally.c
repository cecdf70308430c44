/* tally.c: see tally.h. */
#include "tally.h"

#include <errno.h>
#include <stdlib.h>

static size_t hash(uint64_t hi, uint64_t begin, size_t cap)
{
    uint64_t h = (hi * UINT64_C(0x9e3779b97f4a7c15)) ^ (begin * UINT64_C(0xc2b2ae3d27d4eb4f));
    return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

void sl__tally_init(sl_tally_t *t, size_t max)
{
    *t = (sl_tally_t){.max = max};
}

void sl__tally_free(sl_tally_t *t)
{
    free(t->slot);
    t->slot = NULL;
    t->cap = t->num = 0;
}

void sl__tally_clear(sl_tally_t *t)
{
    for (size_t i = 0; i < t->cap; i++)
        t->slot[i].count = 0;
    t->num = 0;
}

/* The slot of the key, or of the empty slot where it would go. */
static size_t find(const sl_tally_t *t, uint64_t hi, uint64_t begin)
{
    size_t i = hash(hi, begin, t->cap);
    while (t->slot[i].count != 0 && (t->slot[i].hi != hi || t->slot[i].begin != begin))
        i = (i + 1) & (t->cap - 1);
    return i;
}

/* Doubles the table (at most half full after). 0 or -ENOMEM */
static int grow(sl_tally_t *t)
{
    size_t cap = t->cap ? t->cap * 2 : 64;
    sl_tally_slot_t *s = malloc(cap * sizeof *s);
    if (!s)
        return -ENOMEM;
    for (size_t i = 0; i < cap; i++)
        s[i].count = 0;
    sl_tally_t n = {.slot = s, .cap = cap, .num = t->num, .max = t->max};
    for (size_t i = 0; i < t->cap; i++)
        if (t->slot[i].count != 0)
            n.slot[find(&n, t->slot[i].hi, t->slot[i].begin)] = t->slot[i];
    free(t->slot);
    *t = n;
    return 0;
}

int sl__tally_add(sl_tally_t *t, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t count)
{
    uint64_t hi = (uint64_t)epoch << 32 | file;
    if (count == 0)
        return 0;
    if (t->cap > 0) {
        size_t i = find(t, hi, begin);
        if (t->slot[i].count != 0) {
            t->slot[i].count += count;
            return 0;
        }
    }
    if (t->num >= t->max)
        return -ENOSPC;
    if ((t->num + 1) * 2 > t->cap && grow(t) < 0)
        return -ENOMEM;
    t->slot[find(t, hi, begin)] = (sl_tally_slot_t){hi, begin, count};
    t->num++;
    return 0;
}

bool sl__tally_get(const sl_tally_t *t, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t *count)
{
    if (t->num == 0)
        return false;
    size_t i = find(t, (uint64_t)epoch << 32 | file, begin);
    if (t->slot[i].count == 0)
        return false;
    *count = t->slot[i].count;
    return true;
}

/* Empties slot i and moves back the keys after it that probed past it. */
static void remove_at(sl_tally_t *t, size_t i)
{
    size_t mask = t->cap - 1;
    for (size_t j = (i + 1) & mask; t->slot[j].count != 0; j = (j + 1) & mask) {
        size_t home = hash(t->slot[j].hi, t->slot[j].begin, t->cap);
        /* j's key may fill i when i lies on its probe path: from home to j. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->slot[i] = t->slot[j];
            i = j;
        }
    }
    t->slot[i].count = 0;
    t->num--;
}

void sl__tally_remove(sl_tally_t *t, uint32_t epoch, uint32_t file, uint64_t begin)
{
    if (t->num == 0)
        return;
    size_t i = find(t, (uint64_t)epoch << 32 | file, begin);
    if (t->slot[i].count != 0)
        remove_at(t, i);
}

/* Whether slot k's split comes before (hi, begin) in the order of places. */
static bool before(const sl_tally_slot_t *k, uint64_t hi, uint64_t begin)
{
    return k->hi != hi ? k->hi < hi : k->begin < begin;
}

void sl__tally_drop_before(sl_tally_t *t, uint32_t epoch, uint32_t file, uint64_t begin)
{
    uint64_t hi = (uint64_t)epoch << 32 | file;
    /* A removal moves back only keys after i along their cluster, into
     * slots from i on: those are looked at again, the rest were. */
    for (size_t i = 0; i < t->cap; i++)
        while (t->slot[i].count != 0 && before(&t->slot[i], hi, begin))
            remove_at(t, i);
}

void sl__tally_drop_below(sl_tally_t *t, uint64_t below)
{
    if (below > UINT32_MAX) {
        sl__tally_clear(t); /* every epoch a key can name */
        return;
    }
    sl__tally_drop_before(t, (uint32_t)below, 0, 0);
}
