/*
 * provwire.h: a batch's provenance runs on the wire, compact: a table of
 * the batch's distinct (epoch, file) pairs, then per run its pair's index
 * (left out when there is one pair), the distance of its begin from the
 * end of the pair's previous run (zig-zag) and its count, all as varints.
 * A shuffled batch, one run per element, takes about 3 bytes per element
 * instead of the 24 of sl_provenance_run_t. A client that asks for it
 * (GetElementRequest.dense_provenance) may get such a batch in the dense
 * form instead: a fixed-width offset per record (and its pair's index when
 * there are several), smaller and far cheaper to check. docs/protocol.md has the layouts and what the
 * decoder refuses.
 *
 * Split-done notices (DYNAMIC) travel in the same frames, after the
 * provenance, in a compact form of their own (sl_provwire_encode_done()).
 */
#ifndef SL_PROVWIRE_H
#define SL_PROVWIRE_H

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
 * Encodes n runs (n >= 1).
 * @param[out] out the bytes, malloc'd; the caller frees them
 * @param[out] len how many
 * @return 0 or -ENOMEM
 */
int sl_provwire_encode(const sl_provenance_run_t *runs, uint64_t n, uint8_t **out, size_t *len);

/**
 * sl_provwire_encode() into room, room_len bytes, when the encoding's bound
 * fits there (2 * SL_VARINT_MAX, 2 * SL_VARINT_MAX a pair, 3 * SL_VARINT_MAX
 * a run: 70 bytes for one run): *out is room then, else malloc'd.
 */
int sl_provwire_encode_in(const sl_provenance_run_t *runs, uint64_t n, uint8_t *room, size_t room_len, uint8_t **out,
                          size_t *len);

/**
 * What the dense form needs to know of a batch's runs before it writes a
 * record, found by sl_prov_span() in a pass of its own (provspan.c). The
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

/**
 * Encodes n runs of num_records records (their counts' sum) in the dense
 * form, when it applies: runs of at most 256 (epoch, file) pairs, mostly
 * of one record (n * 2 > num_records: a shuffled batch), each pair's
 * records within 2^32 of its least. Then each record is its pair's index
 * (a byte, when there are two pairs or more) and a fixed-width offset from
 * its pair's least record, 1 to 4 bytes, which the worker writes and the
 * client checks without a branch per record (docs/protocol.md,
 * "Provenance").
 * @param[out] out the bytes, malloc'd; the caller frees them
 * @param[out] len how many
 * @return 0, 1 when the form does not apply (nothing allocated), -ENOMEM
 */
int sl_provwire_encode_dense(const sl_provenance_run_t *runs, uint64_t n, uint64_t num_records, uint8_t **out,
                             size_t *len);

/** sl_provwire_encode_dense() of runs whose sl_prov_span() is span, which
 *  it then need not find: the same bytes, one pass fewer. */
int sl_provwire_encode_dense_span(const sl_provenance_run_t *runs, uint64_t n, uint64_t num_records,
                                  const sl_prov_span_t *span, uint8_t **out, size_t *len);

/** @return the most runs len bytes at p can decode to for a batch of
 *  num_records records: what a reader allocates before sl_provwire_read() */
uint64_t sl_provwire_max_runs(const uint8_t *p, size_t len, uint64_t num_records);

/**
 * Checks the provenance of a batch whose elements came from num_elements
 * source records (GetElementResponse.num_records: more than its elements
 * when batches nest), len bytes at p
 * (0: the batch has none), as sl_provwire_decode() does, and decodes it into
 * out when out is not NULL: a first call without out gives the number of
 * runs, a second writes them. The dense form is checked without reading
 * its offsets (in constant time with one (epoch, file) pair, reading each
 * record's pair byte with more) and decodes to one run per record, in
 * element order. Nothing is allocated unless the batch has
 * more than 64 (epoch, file) pairs.
 * @param[out] out room for the runs, or NULL
 * @param[out] num_runs how many runs there are
 * @return 0, SL_EPROTO with what was wrong and where in err, -ENOMEM
 */
int sl_provwire_read(const uint8_t *p, size_t len, uint64_t num_elements, sl_provenance_run_t *out,
                     uint64_t *num_runs, char *err, size_t errlen);

/**
 * sl_provwire_read() that writes only the first cap runs into out (none
 * when out is NULL), checking all of them: with room for one, a batch of
 * one run (most unshuffled batches) is checked and decoded in one pass.
 */
int sl_provwire_read_some(const uint8_t *p, size_t len, uint64_t num_elements, sl_provenance_run_t *out, uint64_t cap,
                          uint64_t *num_runs, char *err, size_t errlen);

/** sl_provwire_read_some() without its path for a batch of one run: the
 *  reference that path is tested against. */
int sl_provwire_read_general(const uint8_t *p, size_t len, uint64_t num_elements, sl_provenance_run_t *out,
                             uint64_t cap, uint64_t *num_runs, char *err, size_t errlen);

/**
 * Decodes and checks the provenance of a batch of num_elements elements:
 * len bytes at p (0: the batch has none). Everything is bounded before it
 * is allocated: at most num_elements runs and no more than the bytes can
 * hold, at most as many pairs as runs, each count >= 1, the counts summing
 * to num_elements, no run ending past 2^64, no byte left over.
 * @param[out] runs the runs, malloc'd (the caller frees them), NULL for none
 * @param[out] num_runs how many
 * @return 0, SL_EPROTO with what was wrong and where in err, -ENOMEM
 */
int sl_provwire_decode(const uint8_t *p, size_t len, uint64_t num_elements, sl_provenance_run_t **runs,
                       uint64_t *num_runs, char *err, size_t errlen);

/**
 * Encodes n (>= 1) split-done notices: their count, then per notice the
 * zig-zag distance of its split id from the previous one's, its epoch,
 * file index, begin, length and delivered count, all as varints.
 * @param[out] out the bytes, malloc'd; the caller frees them
 * @param[out] len how many
 * @return 0 or -ENOMEM
 */
int sl_provwire_encode_done(const sl_split_done_t *d, size_t n, uint8_t **out, size_t *len);

/**
 * sl_provwire_encode_done() into room, room_len bytes, when the encoding's
 * bound fits there (SL_VARINT_MAX, and 6 * SL_VARINT_MAX a notice: 70
 * bytes for one): *out is room then, else malloc'd.
 */
int sl_provwire_encode_done_in(const sl_split_done_t *d, size_t n, uint8_t *room, size_t room_len, uint8_t **out,
                               size_t *len);

/**
 * Checks split-done notices, len bytes at p (0: none), and decodes them
 * into out, which has room for cap of them, when there are no more than
 * that: a call with more (or out NULL, cap 0) gives their number, which is
 * at most len / 6, and a second with room for them writes them. Refuses an
 * epoch or file index past 32 bits, a split that ends past 2^64, more
 * delivered records than the split has, and bytes left over.
 * @param[out] num how many notices there are
 * @return 0, or SL_EPROTO with what was wrong and where in err
 */
int sl_provwire_read_done(const uint8_t *p, size_t len, sl_split_done_t *out, size_t cap, uint64_t *num, char *err,
                          size_t errlen);

#endif
