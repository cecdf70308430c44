/*
 * example.h: decodes tf.train.Example records (pipeline/tf/example.proto),
 * the usual payload of a TFRecord, into typed values, as parse_example does.
 *
 * A decoder is made once per pipeline from a list of features to extract,
 * each with a name, a dtype (int64, float32 or bytes) and either a fixed
 * shape (with an optional default for records that lack the feature) or
 * "varlen" (any number of values, a ragged row). It then decodes records
 * one after the other into buffers it reuses, so that in the steady state
 * decoding allocates nothing. Features of a record that are not in the list
 * are skipped without being copied.
 *
 * What a record may make the decoder hold is bounded by max_bytes (the
 * values of all features in wire layout): a record that needs more is
 * refused before any buffer grows past it.
 *
 * The decoder follows protobuf semantics where writers differ: repeated
 * scalars may be packed or not, map entries may put the value before the
 * key, a name given twice keeps its last entry. A feature present with no
 * kind set (an empty Feature message) counts as missing.
 *
 * A decoder is not thread-safe; use one per pipeline instance.
 */
#ifndef SL_EXAMPLE_H
#define SL_EXAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "sluice.h"

#define SL_EXAMPLE_DEFAULT_MAX_BYTES ((size_t)64 << 20)

/** One bytes value of a default (not owned). */
typedef struct sl_example_bytes {
    const void *data;
    size_t len;
} sl_example_bytes_t;

/**
 * A feature to extract. The decoder copies all of it (name and default
 * included) at sl_example_decoder_new(), so it need not outlive that call.
 */
typedef struct sl_example_feature {
    const char *name;           /* shorter than SL_MAX_NAME, unique in the list */
    sl_dtype_t dtype;           /* SL_DTYPE_INT64, SL_DTYPE_FLOAT32 or SL_DTYPE_BYTES */
    bool varlen;                /* true: any number of values; rank, shape, default unused */
    int rank;                   /* fixed: 0 .. SL_MAX_RANK */
    int64_t shape[SL_MAX_RANK]; /* fixed: each >= 0; their product is the number of values */
    /* Fixed only: the value of a record that lacks the feature, NULL if the
     * feature is required. default_count values of the dtype: int64_t,
     * float or sl_example_bytes_t; either 1 (repeated to fill the shape) or
     * the shape's product. */
    const void *default_values;
    size_t default_count;
} sl_example_feature_t;

/**
 * One decoded feature, in wire layout (protocol/batch.h): count values of
 * int64 or float32, little-endian; for bytes count + 1 little-endian uint64
 * offsets, relative to the end of the offsets, then the concatenated values.
 */
typedef struct sl_example_value {
    sl_dtype_t dtype;
    uint64_t count;      /* the shape's product (fixed) or any (varlen) */
    const uint8_t *data; /* owned by the decoder; never NULL */
    size_t size;         /* bytes at data */
    bool is_default;     /* the record lacked the feature; data is the default */
} sl_example_value_t;

typedef struct sl_example_decoder sl_example_decoder_t;

/**
 * Makes a decoder for a list of features.
 * @param[in] features n features; copied, the caller keeps ownership
 * @param[in] n 1 .. SL_MAX_COMPONENTS
 * @param[in] max_bytes the most bytes one record may decode to, all
 *            features together in wire layout; 0 for SL_EXAMPLE_DEFAULT_MAX_BYTES
 * @param[out] out the decoder, freed by sl_example_decoder_free(); NULL on failure
 * @param[out] err on failure a NUL-terminated message naming the feature
 * @return 0; SL_EINVAL for an invalid list (bad name, duplicate name, other
 *         dtype, bad rank or shape, default of the wrong count, a fixed shape
 *         or default larger than max_bytes); -ENOMEM
 */
int sl_example_decoder_new(const sl_example_feature_t *features, int n, size_t max_bytes,
                           sl_example_decoder_t **out, char *err, size_t errlen);

/**
 * Decodes one serialized Example.
 * @param[in] rec len bytes of the record; only read during the call
 * @param[out] out one value per feature, in the order of the list given to
 *             sl_example_decoder_new(); their data is valid until the next
 *             sl_example_decode() or sl_example_decoder_free()
 * @param[out] err on failure a NUL-terminated message naming the feature
 *             and what is wrong, e.g. "feature \"label\": 3 values, shape []
 *             needs 1"
 * @return 0; SL_EDATA for a malformed record, a required feature that is
 *         missing, a list of another kind than the dtype asks for, or a
 *         number of values that does not fill a fixed shape; SL_ETOOBIG when
 *         the record decodes to more than max_bytes; -ENOMEM. After a
 *         failure out is unspecified.
 */
int sl_example_decode(sl_example_decoder_t *dec, const uint8_t *rec, size_t len, sl_example_value_t *out,
                      char *err, size_t errlen);

/** @return the number of features the decoder extracts */
int sl_example_decoder_num_features(const sl_example_decoder_t *dec);

/** Frees the decoder and every buffer it handed out; NULL is ignored. */
void sl_example_decoder_free(sl_example_decoder_t *dec);

#endif
