/*
 * posset.h: a set of source positions, (epoch, file, record), kept as
 * sorted, disjoint, coalesced runs. What a client consumed (its iterator
 * checkpoint), and what the dispatcher tells a worker to skip of a split,
 * are such sets (docs/fault-tolerance.md).
 *
 * Positions mostly arrive in order, so adding a run after the last one is
 * O(1); anywhere else it is a binary search and a move (sl_posset_add_many()
 * takes many at once, sorted and merged in one pass). The number of runs
 * is bounded by max_runs: an add that would need more fails with -ENOSPC
 * and changes nothing.
 */
#ifndef SL_POSSET_H
#define SL_POSSET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most runs a position set may have on the wire: what a client
 * checkpoints and reports, what a dispatcher keeps of a restored iterator
 * and sends its workers (docs/protocol.md, "Limits"). */
#define SL_POSSET_MAX_RUNS (1u << 21)

/* The bytes a set of n runs may take on the wire: its header and 6 a run
 * (a shuffle's holes take about 3; runs far apart or over many files
 * more). */
#define SL_POSSET_MAX_BYTES(n) (16 + 6 * (size_t)(n))

/* Whether (e1, f1, p1) comes before (e2, f2, p2) in the order of places
 * (epoch, then file, then record): the order of a set's runs, and the
 * order DYNAMIC hands records out in. */
static inline bool sl_place_before(uint64_t e1, uint32_t f1, uint64_t p1, uint64_t e2, uint32_t f2, uint64_t p2)
{
    return e1 != e2 ? e1 < e2 : f1 != f2 ? f1 < f2 : p1 < p2;
}

/* The same layout as sl_provenance_run_t (sluice.h). */
typedef struct sl_posrun {
    uint32_t epoch;
    uint32_t file;
    uint64_t begin;
    uint64_t count;
} sl_posrun_t;

/* Whether run a starts before run b (their count unused). */
static inline bool sl_posrun_before(sl_posrun_t a, sl_posrun_t b)
{
    return sl_place_before(a.epoch, a.file, a.begin, b.epoch, b.file, b.begin);
}

typedef struct sl_posset {
    sl_posrun_t *runs;
    size_t num, cap, max_runs;
    /* sl_posset_add_many()'s working memory, kept for the next call:
     * scratch_cap bytes (at most twice a batch's runs, the runs of the set
     * it reaches, and a bitmap of about a word per run). */
    void *scratch;
    size_t scratch_cap;
} sl_posset_t;

/** An empty set of at most max_runs runs (nothing allocated yet). */
void sl_posset_init(sl_posset_t *s, size_t max_runs);

/** Frees what the set holds; it is empty then (max_runs kept). */
void sl_posset_clear(sl_posset_t *s);

/**
 * Adds [begin, begin + count) of (epoch, file).
 * @param[out] overlap if not NULL, how many of them were in the set already
 * @return 0, -ENOSPC (over max_runs), -ENOMEM; on error the set is unchanged
 */
int sl_posset_add(sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t count,
                  uint64_t *overlap);

/**
 * Adds n runs at once, in any order, overlapping or touching each other and
 * the set or not: the set becomes what n sl_posset_add() calls would make
 * it. The runs are sorted and coalesced, then merged with the part of the
 * set they reach in one pass, and the runs after that part are moved once;
 * so a batch of shuffled elements costs one sort, not a search and a move
 * per element.
 * @param[in] runs n runs laid out as sl_posrun_t (sl_provenance_run_t has
 *   that layout: they are read with memcpy, so either may be passed);
 *   runs of count 0 are ignored
 * @return 0, -ENOSPC (over max_runs), -ENOMEM, -EOVERFLOW (a run's end is
 *   past 2^64); on error the set is unchanged
 */
int sl_posset_add_many(sl_posset_t *s, const void *runs, size_t n);

/** Removes every position before (epoch, file, pos) in the set's order:
 *  earlier epochs, earlier files of epoch, records of file below pos. */
void sl_posset_drop_before(sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t pos);

/** @return how many positions of [begin, end) of (epoch, file) are in the set */
uint64_t sl_posset_count(const sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end);

/**
 * The set's runs inside [begin, end) of (epoch, file), clipped to it, in
 * order: what a split of that range must skip.
 * @return how many there are; at most max of them are written to out
 */
size_t sl_posset_within(const sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end,
                        sl_posrun_t *out, size_t max);

/**
 * @return the first position of (epoch, file) at pos or after that is not
 * in the set: pos when pos is not in it, else the end of the run that holds
 * it (runs are coalesced). O(log runs), whatever the run's length.
 */
uint64_t sl_posset_covered_to(const sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t pos);

/** @return the number of positions in the set */
uint64_t sl_posset_size(const sl_posset_t *s);

/**
 * The set as bytes: "SLPS", a u32 version (2), a u64 run count (all
 * little-endian), then the runs as varints, each against the one before
 * it: about 3 bytes a run where a shuffle left holes (posset.c,
 * docs/protocol.md).
 * @return the bytes needed; written only when cap is at least that
 */
size_t sl_posset_encode(const sl_posset_t *s, uint8_t *buf, size_t cap);

/* The positions a version 3 bitmap covers. */
#define SL_POSSET_BITMAP_SPAN 4096u

/**
 * Calls fn(ctx, off, count) for each run of set bits of a bitmap of
 * SL_POSSET_BITMAP_SPAN bits (w: its words, bit i of w[k] bit 64 k + i),
 * in order; stops at fn's first negative return and returns it. Inline, so
 * that a caller's fn is inlined into its loop.
 */
static inline int sl_bitmap_runs(const uint64_t *w, int (*fn)(void *ctx, uint64_t off, uint64_t count), void *ctx)
{
    uint64_t start = 0;
    int in = 0;
    for (unsigned i = 0; i < SL_POSSET_BITMAP_SPAN / 64; i++) {
        uint64_t x = w[i];
        if (x == (in ? ~(uint64_t)0 : 0))
            continue;
        unsigned bit = 0;
        while (bit < 64) {
            uint64_t rest = (in ? ~x : x) >> bit;
            if (rest == 0)
                break;
            bit += (unsigned)__builtin_ctzll(rest);
            uint64_t at = (uint64_t)i * 64 + bit;
            if (in) {
                int rc = fn(ctx, start, at - start);
                if (rc < 0)
                    return rc;
            }
            start = at;
            in = !in;
        }
    }
    return in ? fn(ctx, start, SL_POSSET_BITMAP_SPAN - start) : 0;
}

/* A bitmap of a version 3 set: positions [no, no + 1) * SL_POSSET_BITMAP_SPAN
 * of (epoch, file), bit i of w[k] position 64 k + i of them. */
typedef struct sl_posset_bitmap {
    uint32_t epoch, file;
    uint64_t no;
    const uint64_t *w; /* SL_POSSET_BITMAP_SPAN / 64 words */
} sl_posset_bitmap_t;

/* The bytes of a bitmap on the wire: u32 epoch, u32 file, u64 no, then
 * its words, little-endian (a version 3 set's, a version 6 checkpoint's). */
#define SL_POSSET_BITMAP_BYTES (16 + 8 * (SL_POSSET_BITMAP_SPAN / 64))

/** Writes nb bitmaps at p, SL_POSSET_BITMAP_BYTES each. */
void sl_posset_put_bitmaps(const sl_posset_bitmap_t *bitmaps, size_t nb, uint8_t *p);

/**
 * Reads nb bitmaps at p (SL_POSSET_BITMAP_BYTES each, there: the caller
 * checked), each checked to be after the one before, not empty and below
 * position 2^64, and calls fn(ctx, bitmap) with its words in host order.
 * @return 0, SL_EDATA with "bitmap I of N is ..." in err, or fn's value
 *   below 0 (which stops it)
 */
int sl_posset_get_bitmaps(const uint8_t *p, uint64_t nb, int (*fn)(void *ctx, const sl_posset_bitmap_t *b), void *ctx,
                          char *err, size_t errlen);

/**
 * A set as version 3 bytes: "SLPS", u32 3, u64 n, u64 nb, the nb bitmaps
 * (each u32 epoch, u32 file, u64 no, then its words; in order, none
 * empty), then the n runs (in order, apart) as version 2 has them; what
 * posbits.h writes for a scattered set (docs/protocol.md).
 * @return the bytes needed; written only when cap is at least that
 */
size_t sl_posset_encode_v3(const sl_posrun_t *runs, size_t n, const sl_posset_bitmap_t *bitmaps, size_t nb,
                           uint8_t *buf, size_t cap);

/**
 * Replaces s's contents by the decoded bytes (version 2; version 1: every
 * run in full, 24 bytes; version 3: bitmaps of 4096 positions, then runs
 * as version 2, posbits.h's form of a scattered set); checks the header,
 * that runs are sorted, disjoint, not touching and not empty, that none
 * passes 2^64, that bitmaps are in order and none empty, that no byte is
 * left over, and that version 1 and 2 runs fit max_runs before anything
 * is allocated (a version 2 run takes 3 bytes at least; a version 3 set's
 * runs, its bitmaps' with them, are gathered up to max_runs).
 * @return 0, SL_EDATA with what was wrong in err, -ENOSPC, -ENOMEM
 */
int sl_posset_decode(sl_posset_t *s, const uint8_t *buf, size_t len, char *err, size_t errlen);

/**
 * Reads a set's bytes (any version) without holding them: fn(ctx, runs, n)
 * gets its runs a chunk of at most 1024 at a time, in order within each
 * part (a version 3 set's bitmaps as runs, then its runs), checked as
 * sl_posset_decode() checks them. What the caller keeps bounds memory
 * (posbits.h's sl_posbits_decode()).
 * @return 0, SL_EDATA with what was wrong in err, -ENOMEM, or what fn
 *   returned below 0 (which stops it)
 */
int sl_posset_read(const uint8_t *buf, size_t len, int (*fn)(void *ctx, const sl_posrun_t *runs, size_t n), void *ctx,
                   char *err, size_t errlen);

/**
 * sl_posset_read() of what lies in ranges (nranges runs, sorted and apart:
 * a report's lost splits; NULL: every run): fn gets those pieces of the
 * runs, so that what the caller keeps follows the ranges, not what the
 * bytes say; the rest is checked and dropped.
 * @return as sl_posset_read()
 */
int sl_posset_read_within(const uint8_t *buf, size_t len, const sl_posrun_t *ranges, size_t nranges,
                          int (*fn)(void *ctx, const sl_posrun_t *runs, size_t n), void *ctx, char *err, size_t errlen);

#endif
