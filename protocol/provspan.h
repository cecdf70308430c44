/*
 * provspan.h: what a pass over a batch's provenance runs finds (provspan.c):
 * their span (the pair of the first, whether all are of it, the least and
 * greatest record, the records in all), and the records below a bound.
 * A run at a time, or four at a time where the CPU has AVX2. The wire
 * forms that use them are provwire.h's.
 */
#ifndef SL_PROVSPAN_H
#define SL_PROVSPAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sluice.h"

_Static_assert(offsetof(sl_provenance_run_t, epoch) == 0 && offsetof(sl_provenance_run_t, file_index) == 4,
               "a run starts with its epoch and file_index");

/** @return run r's (epoch, file_index), the two u32 that start it, as one
 *  word: equal for two runs exactly when their pairs are */
static inline uint64_t sl_prov_run_pair(const sl_provenance_run_t *r)
{
    uint64_t v;
    memcpy(&v, r, sizeof v);
    return v;
}

/**
 * What the dense form (provwire.h) needs to know of a batch's runs before
 * it writes a record, found by sl_prov_span() in a pass of its own. The
 * worker finds it before it tallies a batch: a batch whose records all lie
 * in one split is tallied from the span alone (split_track.c).
 */
typedef struct sl_prov_span {
    uint64_t pair;      /* the first run's sl_prov_run_pair() */
    bool one_pair;      /* every run is of that pair */
    bool wraps;         /* a run ends at or past 2^64: begin + count < begin */
    bool empty;         /* a run has no records */
    uint64_t records;   /* the counts' sum (mod 2^64) */
    uint64_t lo, hi;    /* the least begin; the greatest begin + count - 1 (mod 2^64) */
} sl_prov_span_t;

/** Starts a span at the batch's first run (which sl_prov_span_add() adds too). */
static inline void sl_prov_span_start(sl_prov_span_t *s, const sl_provenance_run_t *first)
{
    *s = (sl_prov_span_t){.pair = sl_prov_run_pair(first), .one_pair = true, .lo = UINT64_MAX};
}

/** Adds run r to span s. */
static inline void sl_prov_span_add(sl_prov_span_t *s, const sl_provenance_run_t *r)
{
    uint64_t begin = r->begin, count = r->count, last = begin + count - 1;
    s->one_pair &= sl_prov_run_pair(r) == s->pair;
    s->wraps |= begin + count < begin;
    s->empty |= count == 0;
    s->records += count;
    s->lo = begin < s->lo ? begin : s->lo;
    s->hi = last > s->hi ? last : s->hi;
}

/** @return whether sl_prov_span() takes the vector path (of
 *  SL_PROV_SPAN_WIDE runs or more) on this CPU: AVX2 */
bool sl_prov_span_vector(void);

/** The span of n >= 1 runs four at a time where the CPU has AVX2, else one
 *  at a time (provspan.c). */
void sl_prov_span_wide(const sl_provenance_run_t *runs, uint64_t n, sl_prov_span_t *s);

/** The span of n >= 1 runs, a run at a time: the reference the vector path
 *  is tested against. */
static inline void sl_prov_span_scalar(const sl_provenance_run_t *runs, uint64_t n, sl_prov_span_t *s)
{
    sl_prov_span_start(s, &runs[0]);
    for (uint64_t i = 0; i < n; i++)
        sl_prov_span_add(s, &runs[i]);
}

/* Runs below which the vector path's setup and reduction cost more than it
 * saves (a plain batch is one run: no call). */
#define SL_PROV_SPAN_WIDE 16

/** The span of n >= 1 runs. */
static inline void sl_prov_span(const sl_provenance_run_t *runs, uint64_t n, sl_prov_span_t *s)
{
    if (n == 1) {
        /* A plain batch: what start and add give for one run, in one store. */
        uint64_t begin = runs[0].begin, count = runs[0].count;
        *s = (sl_prov_span_t){.pair = sl_prov_run_pair(&runs[0]),
                              .one_pair = true,
                              .wraps = begin + count < begin,
                              .empty = count == 0,
                              .records = count,
                              .lo = begin,
                              .hi = begin + count - 1};
    } else if (n >= SL_PROV_SPAN_WIDE)
        sl_prov_span_wide(runs, n, s);
    else
        sl_prov_span_scalar(runs, n, s);
}

/** How many of run r's records lie below bound. */
static inline uint64_t sl_prov_run_below(const sl_provenance_run_t *r, uint64_t bound)
{
    if (r->begin >= bound)
        return 0;
    return bound - r->begin < r->count ? bound - r->begin : r->count;
}

/**
 * How many of the records of n runs lie below bound: the sum of
 * sl_prov_run_below() over them. For runs that do not wrap past 2^64
 * (sl_prov_span_t.wraps false): the part of a batch that falls in the
 * first of two adjacent splits (split_track.c). Four runs at a time where
 * the CPU has AVX2 (from SL_PROV_SPAN_WIDE runs), else one at a time.
 */
uint64_t sl_prov_records_below(const sl_provenance_run_t *runs, uint64_t n, uint64_t bound);

/** sl_prov_records_below() a run at a time: the reference the vector path
 *  is tested against. */
static inline uint64_t sl_prov_records_below_scalar(const sl_provenance_run_t *runs, uint64_t n, uint64_t bound)
{
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++)
        k += sl_prov_run_below(&runs[i], bound);
    return k;
}

#endif
