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

#include <stddef.h>
#include <stdint.h>

#include "provspan.h"
#include "sluice.h"

/**
 * Encodes n runs (n >= 1).
 * @param[out] out the bytes, malloc'd; the caller frees them
 * @param[out] len how many
 * @return 0 or -ENOMEM
 */
int sl_provwire_encode(const sl_provenance_run_t *runs, uint64_t n, uint8_t **out, size_t *len);

/** The most bytes sl_provwire_encode_one() writes. */
#define SL_PROVWIRE_ONE_MAX 60 /* six varints of at most 10 bytes */

/**
 * The runs form of one run (what sl_provwire_encode() gives for n = 1) into
 * room, which holds SL_PROVWIRE_ONE_MAX bytes.
 * @return the bytes written
 */
size_t sl_provwire_encode_one(const sl_provenance_run_t *run, uint8_t *room);

/**
 * sl_provwire_encode() into room, room_len bytes, when the encoding's bound
 * fits there (2 * SL_VARINT_MAX, 2 * SL_VARINT_MAX a pair, 3 * SL_VARINT_MAX
 * a run: 70 bytes for one run): *out is room then, else malloc'd.
 */
int sl_provwire_encode_in(const sl_provenance_run_t *runs, uint64_t n, uint8_t *room, size_t room_len, uint8_t **out,
                          size_t *len);

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
