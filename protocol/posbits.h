/*
 * posbits.h: a set of source positions kept as runs (posset.h) and, where
 * runs crowd, as bitmaps of 4096 positions (blocks). What a rank of a named
 * job holds past the job's fold is of this kind: its peers got the records
 * between its own, so it holds one run a record, 24 bytes, where a bit
 * does (docs/fault-tolerance.md, "Iterator checkpoints", version 6).
 *
 * A block holds every position of its range that the set has: no run of
 * the set reaches into a block. Runs go into blocks as they crowd (a block
 * replaces at least SL_POSBITS_DENSE runs, about what it costs in memory),
 * and a full block goes back to being a run. The bound, max_units, counts
 * a run as one and a block as SL_POSBITS_BLOCK_UNITS, its memory in runs.
 *
 * Not thread-safe.
 */
#ifndef SL_POSBITS_H
#define SL_POSBITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "posset.h"

#define SL_POSBITS_BLOCK_BITS 12 /* a block is a version 3 bitmap: SL_POSSET_BITMAP_SPAN positions */
#define SL_POSBITS_BLOCK ((uint64_t)1 << SL_POSBITS_BLOCK_BITS) /* positions a block covers */
#define SL_POSBITS_WORDS (SL_POSBITS_BLOCK / 64)
#define SL_POSBITS_BLOCK_UNITS 22 /* a block's 528 bytes, in runs of 24 */
#define SL_POSBITS_DENSE 24       /* the runs in a block range that make it a block */
#define SL_POSBITS_WIRE_RUNS 176  /* the runs that make a block a bitmap on the wire: 528 bytes, ~3 a run */

/* The bytes a set of n units may take on the wire, as a reader that keeps
 * posbits takes it: a bitmap's 528 bytes for its 22 units, 24 a unit; as
 * version 2 runs, that many bytes hold 8 runs a unit at a shuffle's 3 bytes
 * a run (a set of more runs than units, which the reader's bitmaps hold). */
#define SL_POSBITS_MAX_BYTES(n) (24 + 24 * (size_t)(n))

/* Positions [no * SL_POSBITS_BLOCK, (no + 1) * SL_POSBITS_BLOCK) of (epoch, file). */
typedef struct sl_posblock {
    uint32_t epoch, file;
    uint64_t no;
    uint64_t w[SL_POSBITS_WORDS]; /* bit i of word k: position no * BLOCK + 64 k + i */
} sl_posblock_t;

typedef struct sl_posbits {
    sl_posset_t runs;      /* the positions that lie in no block */
    sl_posblock_t *blocks; /* sorted by (epoch, file, no), none empty */
    size_t nblocks, cap;
    size_t max_units;  /* runs.num + nblocks * SL_POSBITS_BLOCK_UNITS at most */
    size_t compact_at; /* runs.num at which an add looks for crowded blocks next */
    sl_posrun_t *scratch; /* an add's parts outside blocks */
    size_t scratch_cap;
    struct sl_posbits_piece *inside; /* an add's parts inside blocks */
    size_t inside_cap;
} sl_posbits_t;

/** An empty set of at most max_units units (nothing allocated yet). */
void sl_posbits_init(sl_posbits_t *b, size_t max_units);

/** Frees what the set holds; it is empty then (max_units kept). */
void sl_posbits_clear(sl_posbits_t *b);

/** @return the units the set holds: its runs, and SL_POSBITS_BLOCK_UNITS a block */
size_t sl_posbits_units(const sl_posbits_t *b);

/**
 * Adds n runs (laid out as sl_posrun_t; sl_provenance_run_t has that
 * layout), in any order, as sl_posset_add_many() does; runs that crowd a
 * block's range go into a bitmap.
 * @return 0, -ENOSPC (over max_units), -ENOMEM, -EOVERFLOW (a run's end is
 *   past 2^64); on error the set is unchanged
 */
int sl_posbits_add_many(sl_posbits_t *b, const void *runs, size_t n);

/**
 * Adds the positions of a bitmap: bit i of w is position no * SL_POSBITS_BLOCK + i of (epoch, file).
 * @return 0, -ENOSPC, -ENOMEM, -EOVERFLOW (no past the last block of 2^64
 *   positions); on error the set is unchanged
 */
int sl_posbits_add_block(sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t no,
                         const uint64_t w[SL_POSBITS_WORDS]);

/** Adds every position of src of epochs from `from` on (its runs, then
 *  its blocks). @return as sl_posbits_add_many() */
int sl_posbits_add_set(sl_posbits_t *b, const sl_posbits_t *src, uint64_t from);

/**
 * Adds src's positions inside [begin, end) of (epoch, file): its runs cut
 * to the range, and its blocks as bitmaps (no run of them made).
 * @return as sl_posbits_add_many(); on error b may hold some of them
 */
int sl_posbits_add_within(sl_posbits_t *b, const sl_posbits_t *src, uint32_t epoch, uint32_t file, uint64_t begin,
                          uint64_t end);

/** Removes every position before (epoch, file, pos) in the order of places. */
void sl_posbits_drop_before(sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t pos);

/** @return how many positions of [begin, end) of (epoch, file) are in the set */
uint64_t sl_posbits_count(const sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end);

/**
 * The set's positions inside [begin, end) of (epoch, file) as runs,
 * coalesced, in order: what a split of that range must skip.
 * @return how many runs there are; at most max of them are written to out
 */
size_t sl_posbits_within(const sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end,
                         sl_posrun_t *out, size_t max);

/**
 * @return the first position of (epoch, file) at pos or after that is not
 * in the set (pos when pos is not in it), across runs and blocks alike
 */
uint64_t sl_posbits_covered_to(const sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t pos);

/** @return the number of positions in the set */
uint64_t sl_posbits_size(const sl_posbits_t *b);

/** @return the runs of set bits in a block (what it would take as runs, alone) */
size_t sl_posbits_block_runs(const sl_posblock_t *blk);

/**
 * The set as runs, coalesced, in order, leaving out the blocks of at least
 * keep_runs runs (0: none left out), which the caller writes as bitmaps.
 * @param[out] out the runs, malloc'd (NULL when none)
 * @return 0 or -ENOMEM
 */
int sl_posbits_runs(const sl_posbits_t *b, size_t keep_runs, sl_posrun_t **out, size_t *n);

/**
 * The set's blocks of at least keep_runs runs (1: every one) as bitmaps
 * into out (NULL: counted only); their words stay b's.
 * @return how many
 */
size_t sl_posbits_bitmaps(const sl_posbits_t *b, size_t keep_runs, sl_posset_bitmap_t *out);

/**
 * The set as position set bytes (posset.h): version 3, its blocks of at
 * least keep_runs runs as bitmaps and the rest as runs.
 * @param[out] out the bytes, malloc'd
 * @return 0 or -ENOMEM
 */
int sl_posbits_encode(const sl_posbits_t *b, size_t keep_runs, uint8_t **out, size_t *len);

/**
 * The set as position set bytes a reader of max_units runs takes: version
 * 2 when its runs (blocks as runs) are at most max_units, which readers
 * before version 3 read, else version 3 with its blocks of at least
 * SL_POSBITS_WIRE_RUNS runs as bitmaps.
 * @param[out] out the bytes, malloc'd
 * @return 0 or -ENOMEM
 */
int sl_posbits_bytes(const sl_posbits_t *b, uint8_t **out, size_t *len);

/**
 * Adds the positions of a position set's bytes (posset.h, any version) to
 * b, within b's bound as it goes (crowded runs become bitmaps).
 * @return 0, SL_EDATA with what was wrong in err, -ENOSPC (past max_units),
 *   -ENOMEM, -EOVERFLOW
 */
int sl_posbits_decode(sl_posbits_t *b, const uint8_t *buf, size_t len, char *err, size_t errlen);

/**
 * sl_posbits_decode() of what lies in ranges (nranges runs, sorted and
 * apart: a report's lost splits; none: nothing kept), so that what b
 * holds follows the ranges, not what the bytes say; the rest is checked
 * and dropped.
 * @return as sl_posbits_decode()
 */
int sl_posbits_decode_within(sl_posbits_t *b, const uint8_t *buf, size_t len, const sl_posrun_t *ranges,
                             size_t nranges, char *err, size_t errlen);

/**
 * Adds the set's positions of epochs from `from` on to set, as runs.
 * @return 0, or what sl_posset_add_many() returns
 */
int sl_posbits_to_posset(const sl_posbits_t *b, uint64_t from, sl_posset_t *set);

#endif
