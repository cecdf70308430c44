/*
 * spec.h: the dataset spec (docs/dataset-spec.md). A spec is JSON text: a
 * source and a list of ops. sl_spec_parse() validates it strictly and gives
 * a parsed spec that says how to build the pipeline, plus its canonical form
 * and fingerprint, which identify the dataset.
 *
 * The parsed source and ops are plain read-only descriptors (like LMDB's
 * MDB_stat): the worker's pipeline builds its iterators from them, the
 * dispatcher reads the source's cardinality (or its file patterns) to cut
 * splits. Lists inside them (file patterns, features, padded shapes) are
 * owned by the spec and valid until sl_spec_free().
 */
#ifndef SL_SPEC_H
#define SL_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#define SL_SPEC_MAX_BYTES (1u << 20) /* longest spec text accepted */
#define SL_SPEC_MAX_OPS 64           /* most ops in one spec */
#define SL_SPEC_SHARD_HINT (-1)       /* shard num_shards and index given as "hint" */
#define SL_SPEC_MAX_PATTERNS 4096    /* most file patterns of a file source */
#define SL_SPEC_MAX_FEATURES 32      /* most features of parse_example (SL_MAX_COMPONENTS) */

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

/** What a tfrecord source does with a corrupt or truncated record. */
typedef enum sl_on_corrupt { SL_ON_CORRUPT_FAIL = 0, SL_ON_CORRUPT_SKIP = 1 } sl_on_corrupt_t;

/** Op kinds a parsed spec can hold (those the service supports now). A new
 *  op goes before SL_OP_COUNT_. */
typedef enum sl_op_kind {
    SL_OP_BATCH = 1,
    SL_OP_SHUFFLE,
    SL_OP_TAKE,
    SL_OP_SKIP,
    SL_OP_REPEAT,
    SL_OP_PARSE_EXAMPLE,
    SL_OP_DECODE_JPEG,
    SL_OP_RESIZE,
    SL_OP_RANDOM_CROP,
    SL_OP_CENTER_CROP,
    SL_OP_RANDOM_FLIP,
    SL_OP_NORMALIZE,
    SL_OP_CAST,
    SL_OP_SHARD,
    SL_OP_PADDED_BATCH,
    SL_OP_MAP,
    SL_OP_FILTER,
    SL_OP_INTERLEAVE,
    SL_OP_PREFETCH,
    SL_OP_CACHE,
    SL_OP_RANDOM_RESIZED_CROP,
    SL_OP_COLOR_JITTER,
    SL_OP_RANDOM_GRAYSCALE,
    SL_OP_GAUSSIAN_BLUR,
    SL_OP_RANDOM_SOLARIZE,
    SL_OP_COUNT_
} sl_op_kind_t;

#define SL_SPEC_MAX_FLOATS 4 /* most values of a list of numbers (mean, std) */

/** Where a cache op keeps what it caches. */
typedef enum sl_cache_storage { SL_CACHE_MEMORY = 0, SL_CACHE_DISK = 1 } sl_cache_storage_t;

/** A list of integers (a size, a shape). */
typedef struct sl_spec_ints {
    int n;
    int64_t v[SL_MAX_RANK];
} sl_spec_ints_t;

/** A list of numbers (a mean, a std). */
typedef struct sl_spec_floats {
    int n;
    double v[SL_SPEC_MAX_FLOATS];
} sl_spec_floats_t;

/** A list of strings (file patterns); the strings are owned by the spec. */
typedef struct sl_spec_strings {
    int n;
    char **v;
} sl_spec_strings_t;

/** One bytes value of a default; data is owned by the spec, not NUL-terminated. */
typedef struct sl_spec_bytes {
    const void *data;
    size_t len;
} sl_spec_bytes_t;

/** One feature of parse_example. */
typedef struct sl_spec_feature {
    char name[SL_MAX_NAME];
    sl_dtype_t dtype; /* SL_DTYPE_INT64, SL_DTYPE_FLOAT32 or SL_DTYPE_BYTES */
    bool varlen;      /* any number of values: a ragged component; no shape, no default */
    int rank;
    int64_t shape[SL_MAX_RANK];
    /* The value of a record without the feature; 0 values: it is required.
     * 1 value (repeated over the shape) or as many as the shape holds:
     * int64_t (int64), double (float32) or sl_spec_bytes_t (bytes). */
    size_t default_count;
    const void *default_values;
} sl_spec_feature_t;

/** padded_batch: the shape one component is padded to; -1 pads a dimension
 *  to the longest in the batch. */
typedef struct sl_spec_padded_shape {
    char name[SL_MAX_NAME];
    sl_spec_ints_t dims;
} sl_spec_padded_shape_t;

/** padded_batch: the value padding is filled with for one component. */
typedef struct sl_spec_padding_value {
    char name[SL_MAX_NAME];
    bool is_int; /* given as a JSON integer: i; else d */
    int64_t i;
    double d;
} sl_spec_padding_value_t;

/** map: one component the plugin function makes. */
typedef struct sl_spec_map_output {
    char name[SL_MAX_NAME];
    sl_dtype_t dtype; /* any dtype, bytes included */
} sl_spec_map_output_t;

/** filter: one value a comparison compares with. */
typedef struct sl_spec_filter_value {
    bool is_int; /* given as a JSON integer: i; else d */
    int64_t i;
    double d;
} sl_spec_filter_value_t;

/** filter: the built-in comparisons. */
typedef enum sl_filter_cmp {
    SL_FILTER_EQ = 0,
    SL_FILTER_NE,
    SL_FILTER_LT,
    SL_FILTER_LE,
    SL_FILTER_GT,
    SL_FILTER_GE,
    SL_FILTER_IN,
} sl_filter_cmp_t;

#define SL_SPEC_PLUGIN_NAME 256     /* longest plugin file name, with its NUL */
#define SL_SPEC_FUNCTION_NAME 128   /* longest plugin function name, with its NUL */
#define SL_SPEC_MAX_FILTER_VALUES 256 /* most values of filter's "in" */
#define SL_SPEC_MAX_PARALLEL 256    /* largest num_parallel_calls */
#define SL_SPEC_AUTOTUNE 0          /* num_parallel_calls "autotune": chosen by the worker, within its
                                       --threads (pipeline/autotune.h; interleave: --threads) */

/** The parsed source, defaults filled in. */
typedef struct sl_spec_source {
    sl_source_kind_t kind;
    char name[SL_MAX_NAME]; /* name of the component the source yields */
    union {
        struct {
            int64_t start, stop, step; /* step != 0 */
        } range;
        /* tfrecord, text_lines, fixed_length_records; the file patterns
         * are also read with sl_spec_source_pattern(). */
        struct {
            sl_spec_strings_t files;     /* absolute paths or glob patterns, >= 1 */
            sl_compression_t compression; /* tfrecord, text_lines */
            sl_on_corrupt_t on_corrupt;  /* tfrecord */
            int64_t record_bytes;        /* fixed_length_records, >= 1 */
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
        struct {
            char key[SL_MAX_NAME]; /* the serialized records; default the source's component */
            bool has_key;          /* always true once parsed */
            int num_features;      /* 1 .. SL_MAX_COMPONENTS, sorted by name */
            const sl_spec_feature_t *features; /* owned by the spec */
        } parse_example;
        struct {
            char key[SL_MAX_NAME];
            int64_t channels; /* 0 (as in the file), 1 or 3 */
        } decode_jpeg;
        struct {
            char key[SL_MAX_NAME];
            bool has_size;        /* exactly one of size and shorter_side is given */
            sl_spec_ints_t size;  /* [height, width] */
            bool has_shorter_side;
            int64_t shorter_side; /* the shorter side's length, the aspect ratio kept (torchvision's Resize(int)) */
            sl_dtype_t dtype;     /* SL_DTYPE_UINT8 or SL_DTYPE_FLOAT32 */
        } resize;
        struct {
            char key[SL_MAX_NAME];
            sl_spec_ints_t size; /* [height, width] */
            bool has_seed;
            int64_t seed;
        } random_crop;
        struct {
            char key[SL_MAX_NAME];
            sl_spec_ints_t size; /* [height, width] */
        } center_crop;
        struct {
            char key[SL_MAX_NAME];
            sl_spec_ints_t size;    /* [height, width] of the output */
            sl_spec_floats_t scale; /* [lo, hi] of the window's share of the area: 0 < lo <= hi <= 1 */
            sl_spec_floats_t ratio; /* [lo, hi] of its width / height: 0 < lo <= hi */
            sl_dtype_t dtype;       /* SL_DTYPE_UINT8 or SL_DTYPE_FLOAT32 */
            bool has_seed;
            int64_t seed;
        } random_resized_crop;
        struct {
            char key[SL_MAX_NAME];
            /* Each given: [lo, hi] the factor is drawn from (brightness,
             * contrast, saturation: 0 <= lo <= hi; hue: -0.5 <= lo <= hi <= 0.5). */
            bool has_brightness, has_contrast, has_saturation, has_hue;
            sl_spec_floats_t brightness, contrast, saturation, hue;
            double p; /* the probability it applies to an image (torchvision's RandomApply), 0 .. 1 */
            bool has_seed;
            int64_t seed;
        } color_jitter;
        struct {
            char key[SL_MAX_NAME];
            double p; /* the probability an image becomes gray, 0 .. 1 */
            bool has_seed;
            int64_t seed;
        } random_grayscale;
        struct {
            char key[SL_MAX_NAME];
            sl_spec_ints_t kernel_size; /* [height, width], odd, 1 .. 255 */
            sl_spec_floats_t sigma;     /* [lo, hi] sigma is drawn from, 0 < lo <= hi <= 1000 */
            double p;                   /* the probability it applies to an image, 0 .. 1 */
            bool has_seed;
            int64_t seed;
        } gaussian_blur;
        struct {
            char key[SL_MAX_NAME];
            double threshold; /* values at or above it are inverted (255 - v), 0 .. 255 */
            double p;         /* the probability it applies to an image, 0 .. 1 */
            bool has_seed;
            int64_t seed;
        } random_solarize;
        struct {
            char key[SL_MAX_NAME];
            int direction; /* 0 left_right, 1 up_down (sl_image_flip_dir_t) */
            bool has_seed;
            int64_t seed;
        } random_flip;
        struct {
            char key[SL_MAX_NAME];
            sl_spec_floats_t mean, std; /* as many values each; every std > 0 */
            bool scale;                 /* divide by 255 first */
        } normalize;
        struct {
            char key[SL_MAX_NAME];
            sl_dtype_t dtype; /* any dtype but bytes */
        } cast;
        struct {
            int64_t num_shards; /* >= 1, or SL_SPEC_SHARD_HINT */
            int64_t index;      /* 0 .. num_shards - 1, or SL_SPEC_SHARD_HINT (both or neither) */
        } shard;
        struct {
            int64_t batch_size; /* 1 .. 1<<20 */
            bool drop_remainder;
            int num_padded_shapes;
            const sl_spec_padded_shape_t *padded_shapes; /* owned by the spec */
            int num_padding_values;
            const sl_spec_padding_value_t *padding_values; /* owned by the spec */
        } padded_batch;
        struct {
            char plugin[SL_SPEC_PLUGIN_NAME];     /* a file name in a --plugin-dir, no '/' */
            char function[SL_SPEC_FUNCTION_NAME]; /* a function of the plugin's table */
            int num_outputs;                      /* 1 .. SL_MAX_COMPONENTS, sorted by name */
            const sl_spec_map_output_t *outputs;  /* owned by the spec */
            bool keep_input;                      /* pass the input's other components on */
        } map;
        struct {
            bool has_plugin; /* a plugin predicate (plugin, function); else a comparison */
            char plugin[SL_SPEC_PLUGIN_NAME];
            char function[SL_SPEC_FUNCTION_NAME];
            bool has_key, has_cmp, has_value; /* a comparison has all three */
            char key[SL_MAX_NAME]; /* comparison: a scalar numeric component */
            sl_filter_cmp_t cmp;
            int num_values; /* 1, or 1 .. SL_SPEC_MAX_FILTER_VALUES for "in" */
            const sl_spec_filter_value_t *values; /* owned by the spec */
        } filter;
        struct {
            int64_t cycle_length;       /* 1 .. 1024 */
            int64_t block_length;       /* 1 .. 1<<20 */
            int64_t num_parallel_calls; /* 1 .. 256, or 0: "autotune" (the worker's --threads) */
        } interleave;
        struct {
            int64_t buffer_size; /* 1 .. 1<<16 elements */
        } prefetch;
        struct {
            sl_cache_storage_t storage; /* memory (default) or disk */
        } cache;
    } u;
    /* Element-wise ops (parse_example, decode_jpeg, resize, random_crop,
     * center_crop, random_resized_crop, color_jitter, random_grayscale, gaussian_blur, random_solarize,
     * random_flip, normalize, cast, map, filter) may run on
     * several threads: num_parallel_calls, when given, is 1 ..
     * SL_SPEC_MAX_PARALLEL or SL_SPEC_AUTOTUNE; deterministic (default
     * true) keeps the order. Other ops never have them. */
    bool has_num_parallel_calls;
    int64_t num_parallel_calls;
    bool has_deterministic;
    bool deterministic;
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

/**
 * What the spec's elements hold (names, dtypes, shapes), as far as the spec
 * says (docs/dataset-spec.md, "Element spec").
 * @param[out] out filled; out->known is 0 (and 0 components) when the ops
 *             do not fit their input (the pipeline fails when a worker
 *             builds it)
 * @return 0, or -1 when not known
 */
int sl_spec_element_spec(const sl_spec_t *spec, sl_elemspec_t *out);

/** @return the op's name in the spec ("batch"), or "invalid" */
const char *sl_spec_op_name(sl_op_kind_t kind);

/**
 * Whether an op of kind makes each element it yields of one element of its
 * input, one at a time: parse_example, the image ops, cast, map, filter
 * (which may yield none).
 */
bool sl_spec_op_elementwise(sl_op_kind_t kind);

/**
 * Whether the image op or cast of kind takes a component of dtype dt
 * (decode_jpeg bytes; resize, random_resized_crop, color_jitter,
 * random_grayscale, gaussian_blur and random_solarize uint8; normalize
 * uint8 or float32;
 * cast and the other image ops any number).
 * @param[out] what what it takes, for a message when it does not
 */
bool sl_spec_op_takes(sl_op_kind_t kind, sl_dtype_t dt, const char **what);

/** @return the source's name in the spec ("range"), or "invalid" */
const char *sl_spec_source_name(sl_source_kind_t kind);

#endif
