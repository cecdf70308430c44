/*
 * tally.h: per DYNAMIC split, how many of its records the caller was given
 * so far, for the splits whose split-done notice has not come yet
 * (ledger.c). Filled from the batches' tallies (GetElementResponse.
 * tallies_offset): a few rows a batch, not one a record, so that the ledger
 * learns a split is whole without decoding its provenance.
 *
 * An open-addressing hash table keyed by (epoch, file, the split's begin),
 * with linear probing and deletion by shifting back; at most max keys.
 * Not thread-safe.
 */
#ifndef SL_CLIENT_TALLY_H
#define SL_CLIENT_TALLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sl_tally_slot {
    uint64_t hi; /* epoch << 32 | file */
    uint64_t begin;
    uint64_t count; /* 0: the slot is empty */
} sl_tally_slot_t;

typedef struct sl_tally {
    sl_tally_slot_t *slot;
    size_t cap, num, max; /* cap a power of two (0: nothing allocated) */
} sl_tally_t;

/** An empty table of at most max keys (nothing allocated yet). */
void sl__tally_init(sl_tally_t *t, size_t max);

/** Frees the table; it is empty then. */
void sl__tally_free(sl_tally_t *t);

/** Adds count records to the split (epoch, file, begin); count 0 adds
 *  nothing.
 *  @return 0, -ENOSPC (max keys), -ENOMEM; on error the table is unchanged */
int sl__tally_add(sl_tally_t *t, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t count);

/** @return whether the split has a key; its count in *count */
bool sl__tally_get(const sl_tally_t *t, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t *count);

/** Removes the split's key (none: nothing happens). */
void sl__tally_remove(sl_tally_t *t, uint32_t epoch, uint32_t file, uint64_t begin);

/** Removes the keys of epochs below `below`. */
void sl__tally_drop_below(sl_tally_t *t, uint64_t below);

/** Removes the keys of splits that begin before (epoch, file, begin) in
 *  the order DYNAMIC hands records out: earlier epochs, earlier files,
 *  lower begins. */
void sl__tally_drop_before(sl_tally_t *t, uint32_t epoch, uint32_t file, uint64_t begin);

/** Removes every key (the memory is kept). */
void sl__tally_clear(sl_tally_t *t);

#endif
