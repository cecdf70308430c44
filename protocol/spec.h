/*
 * spec.h: the dataset spec (docs/dataset-spec.md). A spec is JSON text: a
 * source and a list of ops. sl_spec_parse() validates it strictly and gives
 * a parsed spec that says how to build the pipeline, plus its canonical form
 * and fingerprint, which identify the dataset.
 *
 * The parsed source and ops are plain read-only descriptors (like LMDB's
 * MDB_stat): the worker's pipeline builds its iterators from them, the
 * dispatcher reads the source's cardinality to cut splits.
 */
#ifndef SL_SPEC_H
#define SL_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#define SL_SPEC_MAX_BYTES (1u << 20) /* longest spec text accepted */
#define SL_SPEC_MAX_OPS 64           /* most ops in one spec */

typedef struct sl_spec sl_spec_t;

/** Source kinds a parsed spec can hold (those the service supports now). */
typedef enum sl_source_kind {
    SL_SOURCE_RANGE = 1,
    SL_SOURCE_TFRECORD,
    SL_SOURCE_TEXT_LINES,
    SL_SOURCE_FIXED_LENGTH_RECORDS,
} sl_source_kind_t;

/** Compression of a file source. */
typedef enum sl_compression { SL_COMPRESSION_NONE = 0, SL_COMPRESSION_GZIP = 1 } sl_compression_t;

/** Op kinds a parsed spec can hold (those the service supports now). */
typedef enum sl_op_kind {
    SL_OP_BATCH = 1,
    SL_OP_SHUFFLE,
    SL_OP_TAKE,
    SL_OP_SKIP,
    SL_OP_REPEAT,
    SL_OP_COUNT_
} sl_op_kind_t;

/** The parsed source, defaults filled in. */
typedef struct sl_spec_source {
    sl_source_kind_t kind;
    char name[SL_MAX_NAME]; /* name of the component the source yields */
    union {
        struct {
            int64_t start, stop, step; /* step != 0 */
        } range;
        /* tfrecord, text_lines, fixed_length_records; the file patterns
         * are read with sl_spec_source_pattern(). */
        struct {
            sl_compression_t compression;
            bool skip_corrupt;          /* tfrecord: on_corrupt "skip" */
            int64_t record_bytes;       /* fixed_length_records */
            int64_t header_bytes, footer_bytes;
        } files;
    } u;
} sl_spec_source_t;

/** One parsed op, defaults filled in. The union member is named after the op. */
typedef struct sl_spec_op {
    sl_op_kind_t kind;
    union {
        struct {
            int64_t batch_size; /* 1 .. 1<<20 */
            bool drop_remainder;
        } batch;
        struct {
            int64_t buffer_size; /* 1 .. 1<<24 */
            bool has_seed;       /* false: a random seed per pipeline instance */
            int64_t seed;        /* >= 0, when has_seed */
            bool reshuffle_each_iteration;
        } shuffle;
        struct {
            int64_t count; /* -1: all */
        } take;
        struct {
            int64_t count; /* -1: all */
        } skip;
        struct {
            int64_t count; /* -1: forever */
        } repeat;
    } u;
} sl_spec_op_t;

/**
 * Parses and validates a spec.
 * @param[in] json the spec text, len bytes (need not be NUL-terminated)
 * @param[out] out the parsed spec, freed by sl_spec_free(); NULL on failure
 * @param[out] err on failure a NUL-terminated message that starts with the
 *             JSON path of the offending field, e.g.
 *             "$.ops[1].batch_size: must be an integer >= 1, got \"x\""
 * @return 0; SL_ESPEC for invalid JSON or an invalid spec (also text longer
 *         than SL_SPEC_MAX_BYTES and more than SL_SPEC_MAX_OPS ops); -ENOMEM
 */
int sl_spec_parse(const char *json, size_t len, sl_spec_t **out, char *err, size_t errlen);

/** Frees a parsed spec; NULL is ignored. */
void sl_spec_free(sl_spec_t *spec);

/**
 * @return the canonical text: compact JSON, keys sorted, defaults filled in.
 *         Parsing it again gives the same text. Valid until sl_spec_free().
 */
const char *sl_spec_canonical(const sl_spec_t *spec);

/** @return 16 lowercase hex digits, FNV-1a 64 of the canonical text; valid until sl_spec_free() */
const char *sl_spec_fingerprint(const sl_spec_t *spec);

/** @return the number of elements the source yields, or -1 when unknown */
int64_t sl_spec_source_cardinality(const sl_spec_t *spec);

/** @return the number of file patterns of a file source (paths or glob
 *  patterns, in spec order), 0 for other sources */
int sl_spec_source_num_patterns(const sl_spec_t *spec);

/** @return file pattern i, valid until sl_spec_free(); NULL when out of range */
const char *sl_spec_source_pattern(const sl_spec_t *spec, int i);

/** @return the source, valid until sl_spec_free() */
const sl_spec_source_t *sl_spec_source(const sl_spec_t *spec);

/** @return the number of ops */
int sl_spec_num_ops(const sl_spec_t *spec);

/** @return op i (0-based), valid until sl_spec_free(); NULL when out of range */
const sl_spec_op_t *sl_spec_op(const sl_spec_t *spec, int i);

/** @return the op's name in the spec ("batch"), or "invalid" */
const char *sl_spec_op_name(sl_op_kind_t kind);

/** @return the source's name in the spec ("range"), or "invalid" */
const char *sl_spec_source_name(sl_source_kind_t kind);

#endif
