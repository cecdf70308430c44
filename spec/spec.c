/*
 * spec.c: parsing, validation and canonical form of the dataset spec.
 *
 * Every source and op is described by a table of fields (name, type,
 * whether it is required, its bounds and default, where it is stored), so
 * one generic routine validates any of them, reports the JSON path of the
 * offending field, and writes the canonical form back from the parsed
 * values. A new op is a new row in ops[] and a field table; names the
 * design promises but this build does not implement yet have rows without
 * fields, and are refused as "not supported yet" rather than "unknown".
 *
 * Field types: integers, booleans, component names, strings from a fixed
 * set (stored as the value of the chosen entry), lists of integers, of
 * numbers and of strings, and custom fields with a parser and an emitter of
 * their own (parse_example's features, padded_batch's maps). What one field
 * cannot check alone (a range's length, a mean and a std of equal length)
 * is checked by the kind's check function once all its fields are parsed.
 * Memory a parsed spec needs beyond its fixed descriptors (file patterns,
 * features, defaults) is taken with spec_alloc() and freed with the spec.
 *
 * Past 900 lines: the tables of every source and op (about half the file)
 * sit beside the routines that read them. The tables and their custom
 * parsers could be a file of their own; the generic routine is the rest.
 */
#include "spec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "errbuf.h"

_Static_assert(SL_SPEC_MAX_FEATURES == SL_MAX_COMPONENTS, "parse_example yields at most one element's components");
/* Enum fields are stored through an int. */
_Static_assert(sizeof(sl_dtype_t) == sizeof(int) && sizeof(sl_compression_t) == sizeof(int) &&
                   sizeof(sl_on_corrupt_t) == sizeof(int),
               "enums are int-sized");

/* Counts (range length, take, skip, repeat) stay below 2^62 so that sums
 * and differences of them never overflow an int64. */
#define MAX_COUNT (INT64_C(1) << 62)
#define MAX_BATCH_SIZE (INT64_C(1) << 20)
#define MAX_SHUFFLE_BUFFER (INT64_C(1) << 24)
#define MAX_IMAGE_SIDE (INT64_C(1) << 16)
#define MAX_RECORD_BYTES (INT64_C(1) << 30)
#define MAX_FEATURE_VALUES (INT64_C(1) << 24)
#define PATH_BYTES 4096 /* PATH_MAX on Linux: the longest file pattern, with its NUL */

struct sl_spec {
    sl_spec_source_t source;
    int num_ops;
    sl_spec_op_t ops[SL_SPEC_MAX_OPS];
    int64_t cardinality;
    char *canonical; /* from json_dumps(), freed with free() */
    char **patterns; /* file sources: the source's files.v (in allocs) */
    int num_patterns;
    void **allocs; /* everything spec_alloc() gave out */
    int num_allocs, cap_allocs;
    char fingerprint[17];
};

enum field_type {
    F_INT,     /* int64_t, within [min, max] */
    F_BOOL,    /* bool */
    F_NAME,    /* char[SL_MAX_NAME], a component name */
    F_STRING,  /* one of choices[], stored as its value in an int-sized enum */
    F_INTS,    /* sl_spec_ints_t: min_count .. max_count integers, each within [min, max] */
    F_FLOATS,  /* sl_spec_floats_t: min_count .. max_count numbers */
    F_STRINGS, /* sl_spec_strings_t: a string, or a list of min_count .. max_count strings */
    F_CUSTOM,  /* custom->parse and custom->emit do everything */
    F_LATER,   /* only known here; the kind's check reads it from the JSON object */
};

enum field_need {
    F_REQUIRED, /* absent is an error */
    F_DEFAULT,  /* absent takes def / def_name; the canonical form shows the value */
    F_OPTIONAL, /* absent stays absent, also in the canonical form */
};

struct choice {
    const char *name;
    int value;
};

/* A custom field. parse gets the field's JSON value (NULL when absent and
 * the field has a default) and the whole descriptor; emit gives the
 * canonical JSON value, or NULL without memory. */
struct custom {
    int (*parse)(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
    json_t *(*emit)(const void *desc);
};

/* One field of a source or op. off locates the value inside the descriptor
 * (sl_spec_source_t, sl_spec_op_t, or a private one); an F_OPTIONAL field
 * also has a bool at has_off that says whether it was given. */
struct field {
    const char *name;
    enum field_type type;
    enum field_need need;
    int64_t min, max; /* F_INT, and each value of F_INTS */
    int64_t def;      /* F_INT, F_BOOL, F_STRING (a choice's value) */
    const char *def_name; /* F_NAME */
    size_t off;
    size_t has_off;
    const struct choice *choices; /* F_STRING: ends with a NULL name */
    int min_count, max_count;     /* F_INTS, F_FLOATS, F_STRINGS */
    const struct custom *custom;  /* F_CUSTOM */
};

/* A source or op kind. id 0 marks a name that is planned but not supported
 * yet. check, when set, validates what one field alone cannot, with the
 * JSON object at hand for F_LATER fields. */
struct kind {
    const char *name;
    int id;
    const struct field *fields;
    int (*check)(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
};

#define INT_FIELD(n, nd, lo, hi, d, T, member)                                                                    \
    {.name = n, .type = F_INT, .need = nd, .min = lo, .max = hi, .def = d, .off = offsetof(T, member)}
#define OPT_INT_FIELD(n, lo, hi, T, member, has)                                                                  \
    {.name = n, .type = F_INT, .need = F_OPTIONAL, .min = lo, .max = hi, .off = offsetof(T, member),            \
     .has_off = offsetof(T, has)}
#define BOOL_FIELD(n, d, T, member) {.name = n, .type = F_BOOL, .need = F_DEFAULT, .def = d, .off = offsetof(T, member)}
#define NAME_FIELD(n, nd, d, T, member) {.name = n, .type = F_NAME, .need = nd, .def_name = d, .off = offsetof(T, member)}
#define STRING_FIELD(n, nd, d, ch, T, member)                                                                     \
    {.name = n, .type = F_STRING, .need = nd, .def = d, .choices = ch, .off = offsetof(T, member)}
#define SIZE_FIELD(T, member)                                                                                     \
    {.name = "size", .type = F_INTS, .need = F_REQUIRED, .min = 1, .max = MAX_IMAGE_SIDE, .min_count = 2,          \
     .max_count = 2, .off = offsetof(T, member)}
#define END_FIELDS {.name = NULL}

static int parse_parallel(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_parallel(const void *desc);
static const struct custom parallel_custom = {parse_parallel, emit_parallel};
/* An optional custom field is left out of the canonical form while the
 * bool at has_off is false (its parser sets it). */
#define PARALLEL_FIELDS                                                                                              \
    {.name = "num_parallel_calls", .type = F_CUSTOM, .need = F_OPTIONAL, .custom = &parallel_custom,               \
     .has_off = offsetof(sl_spec_op_t, has_num_parallel_calls)},                                                   \
    {.name = "deterministic", .type = F_BOOL, .need = F_OPTIONAL, .off = offsetof(sl_spec_op_t, deterministic),    \
     .has_off = offsetof(sl_spec_op_t, has_deterministic)}

/* ---- the tables ---- */

static const struct choice compressions[] = {{"none", SL_COMPRESSION_NONE}, {"gzip", SL_COMPRESSION_GZIP}, {NULL, 0}};
static const struct choice on_corrupts[] = {{"fail", SL_ON_CORRUPT_FAIL}, {"skip", SL_ON_CORRUPT_SKIP}, {NULL, 0}};
static const struct choice feature_dtypes[] = {
    {"int64", SL_DTYPE_INT64}, {"float32", SL_DTYPE_FLOAT32}, {"bytes", SL_DTYPE_BYTES}, {NULL, 0}};
static const struct choice resize_dtypes[] = {{"uint8", SL_DTYPE_UINT8}, {"float32", SL_DTYPE_FLOAT32}, {NULL, 0}};
static const struct choice numeric_dtypes[] = {
    {"bool", SL_DTYPE_BOOL},       {"int8", SL_DTYPE_INT8},       {"int16", SL_DTYPE_INT16},
    {"int32", SL_DTYPE_INT32},     {"int64", SL_DTYPE_INT64},     {"uint8", SL_DTYPE_UINT8},
    {"uint16", SL_DTYPE_UINT16},   {"uint32", SL_DTYPE_UINT32},   {"uint64", SL_DTYPE_UINT64},
    {"float16", SL_DTYPE_FLOAT16}, {"bfloat16", SL_DTYPE_BFLOAT16}, {"float32", SL_DTYPE_FLOAT32},
    {"float64", SL_DTYPE_FLOAT64}, {NULL, 0}};
static const struct choice directions[] = {{"left_right", 0}, {"up_down", 1}, {NULL, 0}};

static int parse_num_shards(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_num_shards(const void *desc);
static int parse_shard_index(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_shard_index(const void *desc);
static int parse_features(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_features(const void *desc);
static int parse_padded_shapes(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_padded_shapes(const void *desc);
static int parse_padding_values(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_padding_values(const void *desc);

static const struct custom num_shards_custom = {parse_num_shards, emit_num_shards};
static const struct custom shard_index_custom = {parse_shard_index, emit_shard_index};
static const struct custom features_custom = {parse_features, emit_features};
static const struct custom padded_shapes_custom = {parse_padded_shapes, emit_padded_shapes};
static const struct custom padding_values_custom = {parse_padding_values, emit_padding_values};

static const struct field range_fields[] = {
    INT_FIELD("start", F_DEFAULT, INT64_MIN, INT64_MAX, 0, sl_spec_source_t, u.range.start),
    INT_FIELD("stop", F_REQUIRED, INT64_MIN, INT64_MAX, 0, sl_spec_source_t, u.range.stop),
    INT_FIELD("step", F_DEFAULT, INT64_MIN, INT64_MAX, 1, sl_spec_source_t, u.range.step),
    NAME_FIELD("name", F_DEFAULT, "value", sl_spec_source_t, name),
    END_FIELDS,
};

#define FILES_FIELD                                                                                                  \
    {.name = "files", .type = F_STRINGS, .need = F_REQUIRED, .min_count = 1, .max_count = SL_SPEC_MAX_PATTERNS,    \
     .off = offsetof(sl_spec_source_t, u.files.files)}

static const struct field tfrecord_fields[] = {
    FILES_FIELD,
    STRING_FIELD("compression", F_DEFAULT, SL_COMPRESSION_NONE, compressions, sl_spec_source_t, u.files.compression),
    STRING_FIELD("on_corrupt", F_DEFAULT, SL_ON_CORRUPT_FAIL, on_corrupts, sl_spec_source_t, u.files.on_corrupt),
    NAME_FIELD("name", F_DEFAULT, "record", sl_spec_source_t, name),
    END_FIELDS,
};

static const struct field text_lines_fields[] = {
    FILES_FIELD,
    STRING_FIELD("compression", F_DEFAULT, SL_COMPRESSION_NONE, compressions, sl_spec_source_t, u.files.compression),
    NAME_FIELD("name", F_DEFAULT, "line", sl_spec_source_t, name),
    END_FIELDS,
};

static const struct field fixed_length_fields[] = {
    FILES_FIELD,
    INT_FIELD("record_bytes", F_REQUIRED, 1, MAX_RECORD_BYTES, 0, sl_spec_source_t, u.files.record_bytes),
    INT_FIELD("header_bytes", F_DEFAULT, 0, MAX_COUNT, 0, sl_spec_source_t, u.files.header_bytes),
    INT_FIELD("footer_bytes", F_DEFAULT, 0, MAX_COUNT, 0, sl_spec_source_t, u.files.footer_bytes),
    NAME_FIELD("name", F_DEFAULT, "record", sl_spec_source_t, name),
    END_FIELDS,
};

static const struct field batch_fields[] = {
    INT_FIELD("batch_size", F_REQUIRED, 1, MAX_BATCH_SIZE, 0, sl_spec_op_t, u.batch.batch_size),
    BOOL_FIELD("drop_remainder", 0, sl_spec_op_t, u.batch.drop_remainder),
    END_FIELDS,
};

static const struct field shuffle_fields[] = {
    INT_FIELD("buffer_size", F_REQUIRED, 1, MAX_SHUFFLE_BUFFER, 0, sl_spec_op_t, u.shuffle.buffer_size),
    OPT_INT_FIELD("seed", 0, INT64_MAX, sl_spec_op_t, u.shuffle.seed, u.shuffle.has_seed),
    BOOL_FIELD("reshuffle_each_iteration", 1, sl_spec_op_t, u.shuffle.reshuffle_each_iteration),
    END_FIELDS,
};

static const struct field take_fields[] = {
    INT_FIELD("count", F_REQUIRED, -1, MAX_COUNT, 0, sl_spec_op_t, u.take.count),
    END_FIELDS,
};

static const struct field skip_fields[] = {
    INT_FIELD("count", F_REQUIRED, -1, MAX_COUNT, 0, sl_spec_op_t, u.skip.count),
    END_FIELDS,
};

static const struct field repeat_fields[] = {
    INT_FIELD("count", F_DEFAULT, -1, MAX_COUNT, -1, sl_spec_op_t, u.repeat.count),
    END_FIELDS,
};

static const struct field parse_example_fields[] = {
    {.name = "features", .type = F_CUSTOM, .need = F_REQUIRED, .custom = &features_custom},
    {.name = "key", .type = F_NAME, .need = F_OPTIONAL, .off = offsetof(sl_spec_op_t, u.parse_example.key),
     .has_off = offsetof(sl_spec_op_t, u.parse_example.has_key)},
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field decode_jpeg_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.decode_jpeg.key),
    INT_FIELD("channels", F_DEFAULT, 0, 3, 3, sl_spec_op_t, u.decode_jpeg.channels),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field resize_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.resize.key),
    {.name = "size", .type = F_INTS, .need = F_OPTIONAL, .min = 1, .max = MAX_IMAGE_SIDE, .min_count = 2,
     .max_count = 2, .off = offsetof(sl_spec_op_t, u.resize.size),
     .has_off = offsetof(sl_spec_op_t, u.resize.has_size)},
    OPT_INT_FIELD("shorter_side", 1, MAX_IMAGE_SIDE, sl_spec_op_t, u.resize.shorter_side, u.resize.has_shorter_side),
    STRING_FIELD("dtype", F_DEFAULT, SL_DTYPE_FLOAT32, resize_dtypes, sl_spec_op_t, u.resize.dtype),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field random_crop_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.random_crop.key),
    SIZE_FIELD(sl_spec_op_t, u.random_crop.size),
    OPT_INT_FIELD("seed", 0, INT64_MAX, sl_spec_op_t, u.random_crop.seed, u.random_crop.has_seed),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field center_crop_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.center_crop.key),
    SIZE_FIELD(sl_spec_op_t, u.center_crop.size),
    PARALLEL_FIELDS,
    END_FIELDS,
};

/* scale and ratio: absent, torchvision's defaults (random_resized_crop_check). */
static const struct field random_resized_crop_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.random_resized_crop.key),
    SIZE_FIELD(sl_spec_op_t, u.random_resized_crop.size),
    {.name = "scale", .type = F_FLOATS, .need = F_DEFAULT, .min_count = 2, .max_count = 2,
     .off = offsetof(sl_spec_op_t, u.random_resized_crop.scale)},
    {.name = "ratio", .type = F_FLOATS, .need = F_DEFAULT, .min_count = 2, .max_count = 2,
     .off = offsetof(sl_spec_op_t, u.random_resized_crop.ratio)},
    STRING_FIELD("dtype", F_DEFAULT, SL_DTYPE_FLOAT32, resize_dtypes, sl_spec_op_t, u.random_resized_crop.dtype),
    OPT_INT_FIELD("seed", 0, INT64_MAX, sl_spec_op_t, u.random_resized_crop.seed, u.random_resized_crop.has_seed),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static int parse_apply_p(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_apply_p(const void *desc);
static const struct custom apply_p_custom = {parse_apply_p, emit_apply_p};
#define APPLY_P_FIELD {.name = "p", .type = F_CUSTOM, .need = F_DEFAULT, .custom = &apply_p_custom}

#define JITTER_FIELD(n, member)                                                                                   \
    {.name = n, .type = F_FLOATS, .need = F_OPTIONAL, .min_count = 2, .max_count = 2,                              \
     .off = offsetof(sl_spec_op_t, u.color_jitter.member),                                                        \
     .has_off = offsetof(sl_spec_op_t, u.color_jitter.has_##member)}

static const struct field color_jitter_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.color_jitter.key),
    JITTER_FIELD("brightness", brightness),
    JITTER_FIELD("contrast", contrast),
    JITTER_FIELD("saturation", saturation),
    JITTER_FIELD("hue", hue),
    APPLY_P_FIELD,
    OPT_INT_FIELD("seed", 0, INT64_MAX, sl_spec_op_t, u.color_jitter.seed, u.color_jitter.has_seed),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field random_grayscale_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.random_grayscale.key),
    APPLY_P_FIELD,
    OPT_INT_FIELD("seed", 0, INT64_MAX, sl_spec_op_t, u.random_grayscale.seed, u.random_grayscale.has_seed),
    PARALLEL_FIELDS,
    END_FIELDS,
};

/* sigma absent: torchvision's GaussianBlur default (gaussian_blur_check). */
static const struct field gaussian_blur_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.gaussian_blur.key),
    {.name = "kernel_size", .type = F_INTS, .need = F_REQUIRED, .min = 1, .max = 255, .min_count = 2, .max_count = 2,
     .off = offsetof(sl_spec_op_t, u.gaussian_blur.kernel_size)},
    {.name = "sigma", .type = F_FLOATS, .need = F_DEFAULT, .min_count = 2, .max_count = 2,
     .off = offsetof(sl_spec_op_t, u.gaussian_blur.sigma)},
    APPLY_P_FIELD,
    OPT_INT_FIELD("seed", 0, INT64_MAX, sl_spec_op_t, u.gaussian_blur.seed, u.gaussian_blur.has_seed),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static int parse_threshold(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_threshold(const void *desc);
static const struct custom threshold_custom = {parse_threshold, emit_threshold};

static const struct field random_solarize_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.random_solarize.key),
    {.name = "threshold", .type = F_CUSTOM, .need = F_REQUIRED, .custom = &threshold_custom},
    APPLY_P_FIELD,
    OPT_INT_FIELD("seed", 0, INT64_MAX, sl_spec_op_t, u.random_solarize.seed, u.random_solarize.has_seed),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field random_flip_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.random_flip.key),
    {.name = "direction", .type = F_STRING, .need = F_DEFAULT, .def = 0, .choices = directions,
     .off = offsetof(sl_spec_op_t, u.random_flip.direction)},
    OPT_INT_FIELD("seed", 0, INT64_MAX, sl_spec_op_t, u.random_flip.seed, u.random_flip.has_seed),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field normalize_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.normalize.key),
    {.name = "mean", .type = F_FLOATS, .need = F_REQUIRED, .min_count = 1, .max_count = 3,
     .off = offsetof(sl_spec_op_t, u.normalize.mean)},
    {.name = "std", .type = F_FLOATS, .need = F_REQUIRED, .min_count = 1, .max_count = 3,
     .off = offsetof(sl_spec_op_t, u.normalize.std)},
    BOOL_FIELD("scale", 0, sl_spec_op_t, u.normalize.scale),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field cast_fields[] = {
    NAME_FIELD("key", F_REQUIRED, NULL, sl_spec_op_t, u.cast.key),
    STRING_FIELD("dtype", F_REQUIRED, 0, numeric_dtypes, sl_spec_op_t, u.cast.dtype),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field shard_fields[] = {
    {.name = "num_shards", .type = F_CUSTOM, .need = F_REQUIRED, .custom = &num_shards_custom},
    {.name = "index", .type = F_CUSTOM, .need = F_REQUIRED, .custom = &shard_index_custom},
    END_FIELDS,
};

static const struct field padded_batch_fields[] = {
    INT_FIELD("batch_size", F_REQUIRED, 1, MAX_BATCH_SIZE, 0, sl_spec_op_t, u.padded_batch.batch_size),
    BOOL_FIELD("drop_remainder", 0, sl_spec_op_t, u.padded_batch.drop_remainder),
    {.name = "padded_shapes", .type = F_CUSTOM, .need = F_DEFAULT, .custom = &padded_shapes_custom},
    {.name = "padding_values", .type = F_CUSTOM, .need = F_DEFAULT, .custom = &padding_values_custom},
    END_FIELDS,
};

#define MAX_CYCLE_LENGTH 1024
#define MAX_PARALLEL_CALLS 256
#define MAX_PREFETCH (INT64_C(1) << 16)

static int parse_parallel_calls(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_parallel_calls(const void *desc);
static const struct custom parallel_calls_custom = {parse_parallel_calls, emit_parallel_calls};
static const struct choice cache_storages[] = {{"memory", SL_CACHE_MEMORY}, {"disk", SL_CACHE_DISK}, {NULL, 0}};

static const struct field interleave_fields[] = {
    INT_FIELD("cycle_length", F_REQUIRED, 1, MAX_CYCLE_LENGTH, 0, sl_spec_op_t, u.interleave.cycle_length),
    INT_FIELD("block_length", F_DEFAULT, 1, MAX_BATCH_SIZE, 1, sl_spec_op_t, u.interleave.block_length),
    {.name = "num_parallel_calls", .type = F_CUSTOM, .need = F_DEFAULT, .custom = &parallel_calls_custom},
    END_FIELDS,
};

static const struct field prefetch_fields[] = {
    INT_FIELD("buffer_size", F_REQUIRED, 1, MAX_PREFETCH, 0, sl_spec_op_t, u.prefetch.buffer_size),
    END_FIELDS,
};

static const struct field cache_fields[] = {
    STRING_FIELD("storage", F_DEFAULT, SL_CACHE_MEMORY, cache_storages, sl_spec_op_t, u.cache.storage),
    END_FIELDS,
};

/* A feature of parse_example while it is parsed: default is read by
 * feature_check once dtype and shape are known. */
struct feature_desc {
    sl_spec_feature_t f;
    sl_spec_ints_t shape;
    bool has_shape;
};

static const struct field feature_fields[] = {
    STRING_FIELD("dtype", F_REQUIRED, 0, feature_dtypes, struct feature_desc, f.dtype),
    BOOL_FIELD("varlen", 0, struct feature_desc, f.varlen),
    {.name = "shape", .type = F_INTS, .need = F_OPTIONAL, .min = 0, .max = INT64_MAX, .min_count = 0,
     .max_count = SL_MAX_RANK, .off = offsetof(struct feature_desc, shape),
     .has_off = offsetof(struct feature_desc, has_shape)},
    {.name = "default", .type = F_LATER, .need = F_OPTIONAL},
    END_FIELDS,
};

/* ---- map, filter and the parallel fields of element-wise ops ---- */

static int parse_plugin(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_plugin(const void *desc);
static int parse_function(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_function(const void *desc);
static int parse_outputs(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_outputs(const void *desc);
static int parse_filter_value(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen);
static json_t *emit_filter_value(const void *desc);
static int filter_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);

static const struct custom plugin_custom = {parse_plugin, emit_plugin};
static const struct custom function_custom = {parse_function, emit_function};
static const struct custom outputs_custom = {parse_outputs, emit_outputs};
static const struct custom filter_value_custom = {parse_filter_value, emit_filter_value};

static const struct choice output_dtypes[] = {
    {"bool", SL_DTYPE_BOOL},       {"int8", SL_DTYPE_INT8},       {"int16", SL_DTYPE_INT16},
    {"int32", SL_DTYPE_INT32},     {"int64", SL_DTYPE_INT64},     {"uint8", SL_DTYPE_UINT8},
    {"uint16", SL_DTYPE_UINT16},   {"uint32", SL_DTYPE_UINT32},   {"uint64", SL_DTYPE_UINT64},
    {"float16", SL_DTYPE_FLOAT16}, {"bfloat16", SL_DTYPE_BFLOAT16}, {"float32", SL_DTYPE_FLOAT32},
    {"float64", SL_DTYPE_FLOAT64}, {"bytes", SL_DTYPE_BYTES},     {NULL, 0}};
static const struct choice filter_cmps[] = {{"eq", SL_FILTER_EQ}, {"ne", SL_FILTER_NE}, {"lt", SL_FILTER_LT},
                                            {"le", SL_FILTER_LE}, {"gt", SL_FILTER_GT}, {"ge", SL_FILTER_GE},
                                            {"in", SL_FILTER_IN}, {NULL, 0}};

static const struct field map_fields[] = {
    {.name = "plugin", .type = F_CUSTOM, .need = F_REQUIRED, .custom = &plugin_custom},
    {.name = "function", .type = F_CUSTOM, .need = F_REQUIRED, .custom = &function_custom},
    {.name = "output", .type = F_CUSTOM, .need = F_REQUIRED, .custom = &outputs_custom},
    BOOL_FIELD("keep_input", 1, sl_spec_op_t, u.map.keep_input),
    PARALLEL_FIELDS,
    END_FIELDS,
};

static const struct field filter_fields[] = {
    {.name = "plugin", .type = F_CUSTOM, .need = F_OPTIONAL, .custom = &plugin_custom,
     .has_off = offsetof(sl_spec_op_t, u.filter.has_plugin)},
    {.name = "function", .type = F_CUSTOM, .need = F_OPTIONAL, .custom = &function_custom,
     .has_off = offsetof(sl_spec_op_t, u.filter.has_plugin)},
    {.name = "key", .type = F_NAME, .need = F_OPTIONAL, .off = offsetof(sl_spec_op_t, u.filter.key),
     .has_off = offsetof(sl_spec_op_t, u.filter.has_key)},
    {.name = "cmp", .type = F_STRING, .need = F_OPTIONAL, .choices = filter_cmps,
     .off = offsetof(sl_spec_op_t, u.filter.cmp), .has_off = offsetof(sl_spec_op_t, u.filter.has_cmp)},
    {.name = "value", .type = F_CUSTOM, .need = F_OPTIONAL, .custom = &filter_value_custom,
     .has_off = offsetof(sl_spec_op_t, u.filter.has_value)},
    PARALLEL_FIELDS,
    END_FIELDS,
};

static int range_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
static int files_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
static int parse_example_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err,
                               size_t errlen);
static int decode_jpeg_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
static int normalize_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
static int random_resized_crop_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err,
                                     size_t errlen);
static int resize_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
static int color_jitter_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
static int gaussian_blur_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
static int shard_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
static int feature_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);
static int interleave_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen);

static const struct kind sources[] = {
    {"range", SL_SOURCE_RANGE, range_fields, range_check},
    {"tfrecord", SL_SOURCE_TFRECORD, tfrecord_fields, files_check},
    {"text_lines", SL_SOURCE_TEXT_LINES, text_lines_fields, files_check},
    {"fixed_length_records", SL_SOURCE_FIXED_LENGTH_RECORDS, fixed_length_fields, files_check},
};

static const struct kind ops[] = {
    {"batch", SL_OP_BATCH, batch_fields, NULL},
    {"shuffle", SL_OP_SHUFFLE, shuffle_fields, NULL},
    {"take", SL_OP_TAKE, take_fields, NULL},
    {"skip", SL_OP_SKIP, skip_fields, NULL},
    {"repeat", SL_OP_REPEAT, repeat_fields, NULL},
    {"parse_example", SL_OP_PARSE_EXAMPLE, parse_example_fields, parse_example_check},
    {"decode_jpeg", SL_OP_DECODE_JPEG, decode_jpeg_fields, decode_jpeg_check},
    {"resize", SL_OP_RESIZE, resize_fields, resize_check},
    {"random_crop", SL_OP_RANDOM_CROP, random_crop_fields, NULL},
    {"center_crop", SL_OP_CENTER_CROP, center_crop_fields, NULL},
    {"random_flip", SL_OP_RANDOM_FLIP, random_flip_fields, NULL},
    {"normalize", SL_OP_NORMALIZE, normalize_fields, normalize_check},
    {"cast", SL_OP_CAST, cast_fields, NULL},
    {"shard", SL_OP_SHARD, shard_fields, shard_check},
    {"padded_batch", SL_OP_PADDED_BATCH, padded_batch_fields, NULL},
    {"map", SL_OP_MAP, map_fields, NULL},
    {"filter", SL_OP_FILTER, filter_fields, filter_check},
    {"interleave", SL_OP_INTERLEAVE, interleave_fields, interleave_check},
    {"prefetch", SL_OP_PREFETCH, prefetch_fields, NULL},
    {"cache", SL_OP_CACHE, cache_fields, NULL},
    {"random_resized_crop", SL_OP_RANDOM_RESIZED_CROP, random_resized_crop_fields, random_resized_crop_check},
    {"color_jitter", SL_OP_COLOR_JITTER, color_jitter_fields, color_jitter_check},
    {"random_grayscale", SL_OP_RANDOM_GRAYSCALE, random_grayscale_fields, NULL},
    {"gaussian_blur", SL_OP_GAUSSIAN_BLUR, gaussian_blur_fields, gaussian_blur_check},
    {"random_solarize", SL_OP_RANDOM_SOLARIZE, random_solarize_fields, NULL},
};

static const struct kind feature_kind = {"feature", 1, feature_fields, feature_check};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ---- */

/* Memory that lives as long as the spec, zeroed. */
static void *spec_alloc(sl_spec_t *spec, size_t n)
{
    if (spec->num_allocs == spec->cap_allocs) {
        int cap = spec->cap_allocs ? spec->cap_allocs * 2 : 8;
        void **p = realloc(spec->allocs, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        spec->allocs = p;
        spec->cap_allocs = cap;
    }
    void *m = calloc(1, n ? n : 1);
    if (m)
        spec->allocs[spec->num_allocs++] = m;
    return m;
}

static int nomem(char *err, size_t errlen, const char *path)
{
    if (err && errlen > 0)
        snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
}

/* Writes s (n bytes) JSON-escaped into buf, at most about max input bytes,
 * ending with "..." when cut; cuts only at a UTF-8 character boundary so the
 * message stays valid text. */
static void escape(const char *s, size_t n, size_t max, char *buf, size_t buflen)
{
    size_t o = 0;
    bool cut = n > max;
    if (cut) {
        n = max;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    }
    for (size_t i = 0; i < n && o + 8 < buflen; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            o += (size_t)snprintf(buf + o, buflen - o, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(buf + o, buflen - o, "\\u%04x", c);
        else
            buf[o++] = (char)c;
    }
    if (cut && o + 4 < buflen) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    if (buflen > 0)
        buf[o < buflen ? o : buflen - 1] = '\0';
}

/* Describes a JSON value for a "got ..." message. */
static void describe(const json_t *v, char *buf, size_t buflen)
{
    char tmp[160];
    switch (json_typeof(v)) {
    case JSON_OBJECT: snprintf(buf, buflen, "an object"); break;
    case JSON_ARRAY: snprintf(buf, buflen, "an array"); break;
    case JSON_STRING:
        escape(json_string_value(v), json_string_length(v), 40, tmp, sizeof tmp);
        snprintf(buf, buflen, "\"%s\"", tmp);
        break;
    case JSON_INTEGER: snprintf(buf, buflen, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: snprintf(buf, buflen, "%.15g", json_real_value(v)); break;
    case JSON_TRUE: snprintf(buf, buflen, "true"); break;
    case JSON_FALSE: snprintf(buf, buflen, "false"); break;
    case JSON_NULL: snprintf(buf, buflen, "null"); break;
    }
}

/* Says which integers [min, max] takes, for an error message about got. */
static void int_bounds(int64_t min, int64_t max, int64_t got, bool have_got, char *buf, size_t buflen)
{
    if (have_got && got > max)
        snprintf(buf, buflen, "an integer <= %" PRId64, max);
    else if (min == INT64_MIN)
        snprintf(buf, buflen, "an integer");
    else
        snprintf(buf, buflen, "an integer >= %" PRId64, min);
}

/* "a list of 2 integers", "a list of 1 to 3 numbers", "a list of at most 8 integers" */
static void list_phrase(int min_count, int max_count, const char *what, char *buf, size_t buflen)
{
    if (min_count == max_count)
        snprintf(buf, buflen, "a list of %d %s", min_count, what);
    else if (min_count == 0)
        snprintf(buf, buflen, "a list of at most %d %s", max_count, what);
    else
        snprintf(buf, buflen, "a list of %d to %d %s", min_count, max_count, what);
}

/* '"a" or "b"', '"a", "b" or "c"' */
static void choices_phrase(const struct choice *ch, char *buf, size_t buflen)
{
    size_t o = 0, n = 0;
    while (ch[n].name)
        n++;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < buflen; i++)
        o += (size_t)snprintf(buf + o, buflen - o, "%s\"%s\"", i == 0 ? "" : i + 1 == n ? " or " : ", ", ch[i].name);
}

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n >= SL_MAX_NAME)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                  c == '.' || c == '/' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

static int bad_name(const char *path, const json_t *v, char *err, size_t errlen)
{
    char got[128];
    describe(v, got, sizeof got);
    return sl_errf(err, errlen, SL_ESPEC, "%s: must be a string of 1 to %d characters from [A-Za-z0-9_./-], got %s", path,
                SL_MAX_NAME - 1, got);
}

/* The path of a key inside the object at path, the key escaped. */
static void key_path(const char *path, const char *key, char *buf, size_t buflen)
{
    char kbuf[160];
    escape(key, strlen(key), 64, kbuf, sizeof kbuf);
    snprintf(buf, buflen, "%s.%s", path, kbuf);
}

static int parse_int(const json_t *v, int64_t min, int64_t max, const char *path, int64_t *out, char *err,
                     size_t errlen)
{
    char got[128], want[64];
    if (!json_is_integer(v)) {
        describe(v, got, sizeof got);
        int_bounds(min, max, 0, false, want, sizeof want);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be %s, got %s", path, want, got);
    }
    int64_t x = json_integer_value(v);
    if (x < min || x > max) {
        describe(v, got, sizeof got);
        int_bounds(min, max, x, true, want, sizeof want);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be %s, got %s", path, want, got);
    }
    *out = x;
    return 0;
}

static int parse_ints(const json_t *v, int64_t min, int64_t max, int min_count, int max_count, const char *path,
                      sl_spec_ints_t *out, char *err, size_t errlen)
{
    char got[128], want[64], ipath[160];
    if (!json_is_array(v) || json_array_size(v) < (size_t)min_count || json_array_size(v) > (size_t)max_count) {
        if (json_is_array(v))
            snprintf(got, sizeof got, "%zu", json_array_size(v));
        else
            describe(v, got, sizeof got);
        list_phrase(min_count, max_count, "integers", want, sizeof want);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be %s, got %s%s", path, want, json_is_array(v) ? "a list of " : "", got);
    }
    out->n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        int rc = parse_int(e, min, max, ipath, &out->v[i], err, errlen);
        if (rc < 0)
            return rc;
        out->n++;
    }
    return 0;
}

static int parse_number(const json_t *v, const char *path, double *out, char *err, size_t errlen)
{
    if (!json_is_number(v)) {
        char got[128];
        describe(v, got, sizeof got);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be a number, got %s", path, got);
    }
    *out = json_number_value(v);
    return 0;
}

static int parse_floats(const json_t *v, int min_count, int max_count, const char *path, sl_spec_floats_t *out,
                        char *err, size_t errlen)
{
    char got[128], want[64], ipath[160];
    if (!json_is_array(v) || json_array_size(v) < (size_t)min_count || json_array_size(v) > (size_t)max_count) {
        if (json_is_array(v))
            snprintf(got, sizeof got, "%zu", json_array_size(v));
        else
            describe(v, got, sizeof got);
        list_phrase(min_count, max_count, "numbers", want, sizeof want);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be %s, got %s%s", path, want, json_is_array(v) ? "a list of " : "", got);
    }
    out->n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        int rc = parse_number(e, ipath, &out->v[i], err, errlen);
        if (rc < 0)
            return rc;
        out->n++;
    }
    return 0;
}

/* A string, or a list of strings; copies go in the spec's memory. */
static int parse_strings(sl_spec_t *spec, const json_t *v, int min_count, int max_count, const char *path,
                         sl_spec_strings_t *out, char *err, size_t errlen)
{
    char got[128], ipath[160];
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if ((!json_is_string(v) && !json_is_array(v)) || n < (size_t)min_count || n > (size_t)max_count) {
        if (json_is_array(v))
            snprintf(got, sizeof got, "a list of %zu", n);
        else
            describe(v, got, sizeof got);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be a string or a list of %d to %d strings, got %s", path, min_count,
                    max_count, got);
    }
    out->v = spec_alloc(spec, n * sizeof *out->v);
    if (!out->v)
        return nomem(err, errlen, path);
    out->n = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_string(v) ? v : json_array_get(v, i);
        if (json_is_string(v))
            snprintf(ipath, sizeof ipath, "%s", path);
        else
            snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (!json_is_string(e)) {
            describe(e, got, sizeof got);
            return sl_errf(err, errlen, SL_ESPEC, "%s: must be a string, got %s", ipath, got);
        }
        char *s = spec_alloc(spec, json_string_length(e) + 1);
        if (!s)
            return nomem(err, errlen, path);
        memcpy(s, json_string_value(e), json_string_length(e));
        out->v[out->n++] = s;
    }
    return 0;
}

/* ---- fields ---- */

static void set_default(const struct field *f, char *base)
{
    switch (f->type) {
    case F_INT: memcpy(base + f->off, &f->def, sizeof(int64_t)); break;
    case F_BOOL: *(bool *)(base + f->off) = f->def != 0; break;
    case F_NAME: snprintf(base + f->off, SL_MAX_NAME, "%s", f->def_name); break;
    case F_STRING: {
        int x = (int)f->def;
        memcpy(base + f->off, &x, sizeof x);
        break;
    }
    case F_INTS: memset(base + f->off, 0, sizeof(sl_spec_ints_t)); break;
    case F_FLOATS: memset(base + f->off, 0, sizeof(sl_spec_floats_t)); break;
    case F_STRINGS: memset(base + f->off, 0, sizeof(sl_spec_strings_t)); break;
    case F_CUSTOM:
    case F_LATER: break;
    }
}

/* Parses one field of obj into desc, or fills in its default. */
static int parse_field(sl_spec_t *spec, const struct field *f, json_t *obj, void *desc, const char *path, char *err,
                       size_t errlen)
{
    char *base = desc;
    json_t *v = json_object_get(obj, f->name);
    char got[128], fpath[192];
    int rc = 0;

    snprintf(fpath, sizeof fpath, "%s.%s", path, f->name);
    if (f->type == F_LATER)
        return 0;
    if (!v) {
        switch (f->need) {
        case F_REQUIRED: return sl_errf(err, errlen, SL_ESPEC, "%s: required field missing", fpath);
        case F_OPTIONAL:
            if (f->type != F_CUSTOM)
                *(bool *)(base + f->has_off) = false;
            return 0;
        case F_DEFAULT: break;
        }
        if (f->type == F_CUSTOM)
            return f->custom->parse(spec, NULL, desc, fpath, err, errlen);
        set_default(f, base);
        return 0;
    }

    describe(v, got, sizeof got);
    switch (f->type) {
    case F_INT: {
        int64_t x;
        rc = parse_int(v, f->min, f->max, fpath, &x, err, errlen);
        if (rc == 0)
            memcpy(base + f->off, &x, sizeof x);
        break;
    }
    case F_BOOL:
        if (!json_is_boolean(v))
            return sl_errf(err, errlen, SL_ESPEC, "%s: must be true or false, got %s", fpath, got);
        *(bool *)(base + f->off) = json_is_true(v);
        break;
    case F_NAME:
        if (!json_is_string(v) || !name_ok(json_string_value(v), json_string_length(v)))
            return bad_name(fpath, v, err, errlen);
        snprintf(base + f->off, SL_MAX_NAME, "%s", json_string_value(v));
        break;
    case F_STRING: {
        const struct choice *c = f->choices;
        if (json_is_string(v)) {
            while (c->name && (strlen(c->name) != json_string_length(v) || strcmp(c->name, json_string_value(v)) != 0))
                c++;
        } else {
            while (c->name)
                c++;
        }
        if (!c->name) {
            char want[256];
            choices_phrase(f->choices, want, sizeof want);
            return sl_errf(err, errlen, SL_ESPEC, "%s: must be %s, got %s", fpath, want, got);
        }
        memcpy(base + f->off, &c->value, sizeof c->value);
        break;
    }
    case F_INTS:
        rc = parse_ints(v, f->min, f->max, f->min_count, f->max_count, fpath, (sl_spec_ints_t *)(base + f->off), err,
                        errlen);
        break;
    case F_FLOATS:
        rc = parse_floats(v, f->min_count, f->max_count, fpath, (sl_spec_floats_t *)(base + f->off), err, errlen);
        break;
    case F_STRINGS:
        rc = parse_strings(spec, v, f->min_count, f->max_count, fpath, (sl_spec_strings_t *)(base + f->off), err,
                           errlen);
        break;
    case F_CUSTOM: return f->custom->parse(spec, v, desc, fpath, err, errlen);
    case F_LATER: break;
    }
    if (rc < 0)
        return rc;
    if (f->need == F_OPTIONAL)
        *(bool *)(base + f->has_off) = true;
    return 0;
}

/* The edit distance (insertions, deletions, substitutions, and swaps of
 * two neighbours) between a and b, or SIZE_MAX when either is longer than
 * 63 bytes: names here are short. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return SIZE_MAX;
    size_t d[64][64];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

/* The name among names[0..n) (NULL entries skipped) closest to what, when
 * close enough to be a slip (a third of its letters, at least 2), else NULL. */
static const char *closest(const char *what, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (!names[i])
            continue;
        size_t d = edit_distance(what, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    size_t len = strlen(what), limit = len / 3 > 2 ? len / 3 : 2;
    return best && best_d <= limit ? best : NULL;
}

/* "; did you mean \"batch_size\"?" or "; known: a, b, c" for an unknown key
 * of kind k (tag_key, if any, is known too), into out. */
static void suggest_field(const struct kind *k, const char *tag_key, const char *key, char *out, size_t outlen)
{
    const char *names[64];
    size_t n = 0;
    if (tag_key)
        names[n++] = tag_key;
    for (const struct field *f = k->fields; f->name && n < 64; f++)
        names[n++] = f->name;
    const char *near = closest(key, names, n);
    if (near) {
        snprintf(out, outlen, "; did you mean \"%s\"?", near);
        return;
    }
    size_t used = (size_t)snprintf(out, outlen, "; known fields: ");
    for (size_t i = 0; i < n && used < outlen; i++)
        used += (size_t)snprintf(out + used, outlen - used, "%s%s", i ? ", " : "", names[i]);
}

/* Parses a source, op or feature object: every key must be tag_key (if
 * any) or a field of k. */
static int parse_fields(sl_spec_t *spec, const struct kind *k, const char *tag_key, json_t *obj, void *desc,
                        const char *path, char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        bool known = tag_key && strcmp(key, tag_key) == 0;
        for (const struct field *f = k->fields; !known && f->name; f++)
            known = strcmp(key, f->name) == 0;
        if (!known) {
            char kpath[256], hint[512];
            key_path(path, key, kpath, sizeof kpath);
            suggest_field(k, tag_key, key, hint, sizeof hint);
            return sl_errf(err, errlen, SL_ESPEC, "%s: unknown field%s", kpath, hint);
        }
    }
    for (const struct field *f = k->fields; f->name; f++) {
        int rc = parse_field(spec, f, obj, desc, path, err, errlen);
        if (rc < 0)
            return rc;
    }
    return k->check ? k->check(spec, obj, desc, path, err, errlen) : 0;
}

/* Finds the kind named by obj[tag_key] in table; what says "source" or "op"
 * for messages. */
static int find_kind(const struct kind *table, size_t n, const char *what, const char *tag_key, json_t *obj,
                     const char *path, const struct kind **out, char *err, size_t errlen)
{
    json_t *tag = json_object_get(obj, tag_key);
    char got[128];
    if (!tag)
        return sl_errf(err, errlen, SL_ESPEC, "%s.%s: required field missing", path, tag_key);
    if (!json_is_string(tag)) {
        describe(tag, got, sizeof got);
        return sl_errf(err, errlen, SL_ESPEC, "%s.%s: must be a string, got %s", path, tag_key, got);
    }
    const char *name = json_string_value(tag);
    for (size_t i = 0; i < n; i++) {
        /* Compare lengths too: a JSON string may hold "\u0000". */
        if (strlen(table[i].name) == json_string_length(tag) && strcmp(table[i].name, name) == 0) {
            if (table[i].id == 0)
                return sl_errf(err, errlen, SL_ESPEC, "%s.%s: %s \"%s\" is not supported yet", path, tag_key, what, name);
            *out = &table[i];
            return 0;
        }
    }
    describe(tag, got, sizeof got);
    const char *names[64];
    for (size_t i = 0; i < n && i < 64; i++)
        names[i] = table[i].id ? table[i].name : NULL;
    const char *near = closest(name, names, n < 64 ? n : 64);
    if (near)
        return sl_errf(err, errlen, SL_ESPEC, "%s.%s: unknown %s %s; did you mean \"%s\"?", path, tag_key, what,
                       got, near);
    return sl_errf(err, errlen, SL_ESPEC, "%s.%s: unknown %s %s", path, tag_key, what, got);
}

/* ---- checks of whole sources and ops ---- */

/* Number of elements of range(start, stop, step), in unsigned arithmetic so
 * that no intermediate overflows. */
static uint64_t range_count(int64_t start, int64_t stop, int64_t step)
{
    uint64_t span, stride;
    if (step > 0) {
        if (stop <= start)
            return 0;
        span = (uint64_t)stop - (uint64_t)start;
        stride = (uint64_t)step;
    } else {
        if (stop >= start)
            return 0;
        span = (uint64_t)start - (uint64_t)stop;
        stride = -(uint64_t)step;
    }
    return span / stride + (span % stride != 0);
}

static int range_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_source_t *src = desc;
    (void)obj;
    if (src->u.range.step == 0)
        return sl_errf(err, errlen, SL_ESPEC, "%s.step: must be a nonzero integer, got 0", path);
    uint64_t n = range_count(src->u.range.start, src->u.range.stop, src->u.range.step);
    if (n > (uint64_t)MAX_COUNT)
        return sl_errf(err, errlen, SL_ESPEC, "%s.stop: the range yields %" PRIu64 " elements, at most %" PRId64 " (2^62) allowed",
                    path, n, MAX_COUNT);
    spec->cardinality = (int64_t)n;
    return 0;
}

/* File sources: every pattern is an absolute path. Whether it lies inside a
 * data root is for the dispatcher and the workers, which know their roots.
 * Their cardinality stays unknown here: the dispatcher counts the records. */
static int files_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_source_t *src = desc;
    const sl_spec_strings_t *files = &src->u.files.files;
    for (int i = 0; i < files->n; i++) {
        const char *p = files->v[i];
        char got[160], ipath[160];
        if (json_is_string(json_object_get(obj, "files")))
            snprintf(ipath, sizeof ipath, "%s.files", path);
        else
            snprintf(ipath, sizeof ipath, "%s.files[%d]", path, i);
        escape(p, strlen(p), 40, got, sizeof got);
        if (p[0] != '/')
            return sl_errf(err, errlen, SL_ESPEC, "%s: must be an absolute path or glob pattern, got \"%s\"", ipath, got);
        if (strlen(p) >= PATH_BYTES)
            return sl_errf(err, errlen, SL_ESPEC, "%s: must be shorter than %d bytes, got %zu", ipath, PATH_BYTES, strlen(p));
    }
    spec->patterns = files->v;
    spec->num_patterns = files->n;
    return 0;
}

static int parse_example_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err,
                               size_t errlen)
{
    sl_spec_op_t *op = desc;
    (void)obj;
    (void)path;
    (void)err;
    (void)errlen;
    /* The records are the source's one component unless said otherwise;
     * the canonical form names it. */
    if (!op->u.parse_example.has_key) {
        memcpy(op->u.parse_example.key, spec->source.name, SL_MAX_NAME);
        op->u.parse_example.has_key = true;
    }
    return 0;
}

static int decode_jpeg_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    (void)spec;
    (void)obj;
    if (op->u.decode_jpeg.channels == 2)
        return sl_errf(err, errlen, SL_ESPEC, "%s.channels: must be 0, 1 or 3, got 2", path);
    return 0;
}

static int normalize_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    (void)spec;
    (void)obj;
    const sl_spec_floats_t *mean = &op->u.normalize.mean, *std = &op->u.normalize.std;
    if (mean->n != std->n)
        return sl_errf(err, errlen, SL_ESPEC, "%s.std: must have as many values as mean (%d), got %d", path, mean->n, std->n);
    for (int i = 0; i < std->n; i++) {
        if (!(std->v[i] > 0))
            return sl_errf(err, errlen, SL_ESPEC, "%s.std[%d]: must be a number > 0, got %.15g", path, i, std->v[i]);
    }
    return 0;
}

static int resize_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    const sl_spec_op_t *op = desc;
    (void)spec;
    (void)obj;
    if (!op->u.resize.has_size && !op->u.resize.has_shorter_side)
        return sl_errf(err, errlen, SL_ESPEC,
                       "%s.size: required field missing (or shorter_side, to keep the aspect ratio)", path);
    if (op->u.resize.has_size && op->u.resize.has_shorter_side)
        return sl_errf(err, errlen, SL_ESPEC, "%s: give size or shorter_side, not both", path);
    return 0;
}

/* The largest sigma of a blur: far wider than any kernel it may have. */
#define MAX_BLUR_SIGMA 1000.0

static int gaussian_blur_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    (void)spec;
    (void)obj;
    for (int i = 0; i < 2; i++)
        if (op->u.gaussian_blur.kernel_size.v[i] % 2 == 0)
            return sl_errf(err, errlen, SL_ESPEC, "%s.kernel_size[%d]: must be odd, got %" PRId64, path, i,
                           op->u.gaussian_blur.kernel_size.v[i]);
    sl_spec_floats_t *sigma = &op->u.gaussian_blur.sigma;
    if (sigma->n == 0)
        *sigma = (sl_spec_floats_t){2, {0.1, 2.0}};
    if (!(sigma->v[0] > 0) || !(sigma->v[1] <= MAX_BLUR_SIGMA) || sigma->v[0] > sigma->v[1])
        return sl_errf(err, errlen, SL_ESPEC, "%s.sigma: must be [lo, hi] with 0 < lo <= hi <= %g, got [%.15g, %.15g]",
                       path, MAX_BLUR_SIGMA, sigma->v[0], sigma->v[1]);
    return 0;
}

/* The largest brightness, contrast or saturation factor. */
#define MAX_JITTER_FACTOR 100.0

static int color_jitter_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    const sl_spec_op_t *op = desc;
    (void)spec;
    (void)obj;
    const char *names[4] = {"brightness", "contrast", "saturation", "hue"};
    const bool has[4] = {op->u.color_jitter.has_brightness, op->u.color_jitter.has_contrast,
                         op->u.color_jitter.has_saturation, op->u.color_jitter.has_hue};
    const sl_spec_floats_t *r[4] = {&op->u.color_jitter.brightness, &op->u.color_jitter.contrast,
                                    &op->u.color_jitter.saturation, &op->u.color_jitter.hue};
    if (!has[0] && !has[1] && !has[2] && !has[3])
        return sl_errf(err, errlen, SL_ESPEC, "%s: color_jitter needs brightness, contrast, saturation or hue", path);
    for (int i = 0; i < 4; i++) {
        if (!has[i])
            continue;
        double lo = r[i]->v[0], hi = r[i]->v[1], min = i == 3 ? -0.5 : 0, max = i == 3 ? 0.5 : MAX_JITTER_FACTOR;
        if (!(lo >= min) || !(hi <= max) || lo > hi)
            return sl_errf(err, errlen, SL_ESPEC,
                           "%s.%s: must be [lo, hi] with %g <= lo <= hi <= %g, got [%.15g, %.15g]", path, names[i],
                           min, max, lo, hi);
    }
    return 0;
}

/* The largest ratio bound: a window 1,000 times wider than high (or the
 * reverse) is already a line. */
#define MAX_CROP_RATIO 1000.0

static int random_resized_crop_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err,
                                     size_t errlen)
{
    sl_spec_op_t *op = desc;
    (void)spec;
    (void)obj;
    sl_spec_floats_t *scale = &op->u.random_resized_crop.scale, *ratio = &op->u.random_resized_crop.ratio;
    /* Absent: torchvision's RandomResizedCrop defaults, shown in the canonical form. */
    if (scale->n == 0)
        *scale = (sl_spec_floats_t){2, {0.08, 1.0}};
    if (ratio->n == 0)
        *ratio = (sl_spec_floats_t){2, {3.0 / 4.0, 4.0 / 3.0}};
    if (!(scale->v[0] > 0) || !(scale->v[1] <= 1) || scale->v[0] > scale->v[1])
        return sl_errf(err, errlen, SL_ESPEC, "%s.scale: must be [lo, hi] with 0 < lo <= hi <= 1, got [%.15g, %.15g]",
                       path, scale->v[0], scale->v[1]);
    if (!(ratio->v[0] >= 1 / MAX_CROP_RATIO) || !(ratio->v[1] <= MAX_CROP_RATIO) || ratio->v[0] > ratio->v[1])
        return sl_errf(err, errlen, SL_ESPEC,
                       "%s.ratio: must be [lo, hi] with %g <= lo <= hi <= %g (width / height), got [%.15g, %.15g]",
                       path, 1 / MAX_CROP_RATIO, MAX_CROP_RATIO, ratio->v[0], ratio->v[1]);
    return 0;
}

static int shard_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    (void)spec;
    (void)obj;
    bool hint_n = op->u.shard.num_shards == SL_SPEC_SHARD_HINT, hint_i = op->u.shard.index == SL_SPEC_SHARD_HINT;
    if (hint_n != hint_i)
        return sl_errf(err, errlen, SL_ESPEC, "%s.%s: \"hint\" must be given for both num_shards and index, or for neither",
                    path, hint_n ? "index" : "num_shards");
    if (!hint_n && op->u.shard.index >= op->u.shard.num_shards)
        return sl_errf(err, errlen, SL_ESPEC, "%s.index: must be an integer < num_shards (%" PRId64 "), got %" PRId64, path,
                    op->u.shard.num_shards, op->u.shard.index);
    return 0;
}

/* interleave reads the files of a file source cycle_length at a time, so
 * it must be the first op of such a source: the pipeline hands it the
 * source's file list (or, under DYNAMIC, the source's splits). */
static int interleave_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    const sl_spec_op_t *op = desc;
    (void)obj;
    ptrdiff_t i = op - spec->ops;
    if (spec->source.kind == SL_SOURCE_RANGE)
        return sl_errf(err, errlen, SL_ESPEC,
                    "%s: interleave must come directly after a file source (tfrecord, text_lines, "
                    "fixed_length_records); the source is a range, which has no files to interleave",
                    path);
    if (i != 0)
        return sl_errf(err, errlen, SL_ESPEC,
                    "%s: interleave must come directly after a file source (tfrecord, text_lines, "
                    "fixed_length_records), as the first op; here it follows ops[%td] (%s)",
                    path, i - 1, sl_spec_op_name(spec->ops[i - 1].kind));
    return 0;
}

/* ---- custom fields ---- */

static int parse_parallel_calls(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    (void)spec;
    if (!v) {
        op->u.interleave.num_parallel_calls = 1;
        return 0;
    }
    if (json_is_string(v) && strcmp(json_string_value(v), "autotune") == 0) {
        op->u.interleave.num_parallel_calls = 0;
        return 0;
    }
    if (!json_is_integer(v)) {
        char got[128];
        describe(v, got, sizeof got);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be an integer in [1, %d] or \"autotune\", got %s", path,
                    MAX_PARALLEL_CALLS, got);
    }
    return parse_int(v, 1, MAX_PARALLEL_CALLS, path, &op->u.interleave.num_parallel_calls, err, errlen);
}

static json_t *emit_parallel_calls(const void *desc)
{
    const sl_spec_op_t *op = desc;
    if (op->u.interleave.num_parallel_calls == 0)
        return json_string("autotune");
    return json_integer(op->u.interleave.num_parallel_calls);
}

/* A shard field: an integer in [min, INT64_MAX], or "hint", which HINT
 * sharding binds to (number of workers, worker index) when the worker
 * builds the pipeline. */
static int parse_int_or_hint(json_t *v, int64_t min, const char *path, int64_t *out, char *err, size_t errlen)
{
    if (json_is_string(v) && strcmp(json_string_value(v), "hint") == 0) {
        *out = SL_SPEC_SHARD_HINT;
        return 0;
    }
    if (json_is_string(v))
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be an integer >= %" PRId64 " or \"hint\", got \"%s\"", path, min,
                    json_string_value(v));
    return parse_int(v, min, INT64_MAX, path, out, err, errlen);
}

static json_t *emit_int_or_hint(int64_t v)
{
    return v == SL_SPEC_SHARD_HINT ? json_string("hint") : json_integer(v);
}

/* p of the ops that apply to an image by chance: where it goes, and its
 * default (torchvision's: random_grayscale 0.1, random_solarize 0.5; the
 * others always apply). */
static double *apply_p_of(sl_spec_op_t *op, double *def)
{
    *def = 1.0;
    switch (op->kind) {
    case SL_OP_RANDOM_GRAYSCALE: *def = 0.1; return &op->u.random_grayscale.p;
    case SL_OP_RANDOM_SOLARIZE: *def = 0.5; return &op->u.random_solarize.p;
    case SL_OP_COLOR_JITTER: return &op->u.color_jitter.p;
    default: return &op->u.gaussian_blur.p; /* SL_OP_GAUSSIAN_BLUR: only these four have the field */
    }
}

/* A number from lo to hi, both included. */
static int parse_number_within(const json_t *v, const char *path, double lo, double hi, double *out, char *err,
                               size_t errlen)
{
    int rc = parse_number(v, path, out, err, errlen);
    if (rc < 0)
        return rc;
    if (!(*out >= lo && *out <= hi))
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be a number from %g to %g, got %.15g", path, lo, hi, *out);
    return 0;
}

/* random_solarize's threshold: a number from 0 to 255, as torchvision
 * takes it for a uint8 image. */
static int parse_threshold(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    (void)spec;
    return parse_number_within(v, path, 0, 255, &((sl_spec_op_t *)desc)->u.random_solarize.threshold, err, errlen);
}

static json_t *emit_threshold(const void *desc)
{
    return json_real(((const sl_spec_op_t *)desc)->u.random_solarize.threshold);
}

static int parse_apply_p(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    (void)spec;
    double def, *p = apply_p_of(desc, &def);
    if (!v) {
        *p = def;
        return 0;
    }
    return parse_number_within(v, path, 0, 1, p, err, errlen);
}

static json_t *emit_apply_p(const void *desc)
{
    double def;
    return json_real(*apply_p_of((sl_spec_op_t *)desc, &def));
}

static int parse_num_shards(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    (void)spec;
    return parse_int_or_hint(v, 1, path, &((sl_spec_op_t *)desc)->u.shard.num_shards, err, errlen);
}

static json_t *emit_num_shards(const void *desc)
{
    return emit_int_or_hint(((const sl_spec_op_t *)desc)->u.shard.num_shards);
}

static int parse_shard_index(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    (void)spec;
    return parse_int_or_hint(v, 0, path, &((sl_spec_op_t *)desc)->u.shard.index, err, errlen);
}

static json_t *emit_shard_index(const void *desc)
{
    return emit_int_or_hint(((const sl_spec_op_t *)desc)->u.shard.index);
}

static int cmp_keys(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The keys of an object, sorted, so that what is made from them has one
 * order whatever the order of the text. keys has room for max. */
static size_t sorted_keys(json_t *obj, const char **keys, size_t max)
{
    size_t n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (n < max)
            keys[n++] = key;
    }
    qsort(keys, n, sizeof *keys, cmp_keys);
    return n;
}

static int feature_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    struct feature_desc *fd = desc;
    sl_spec_feature_t *f = &fd->f;
    json_t *def = json_object_get(obj, "default");
    char got[128], ipath[256];
    if (f->varlen) {
        if (fd->has_shape)
            return sl_errf(err, errlen, SL_ESPEC, "%s.shape: a varlen feature has no shape", path);
        if (def)
            return sl_errf(err, errlen, SL_ESPEC, "%s.default: a varlen feature has no default", path);
        return 0;
    }
    f->rank = fd->shape.n;
    uint64_t count = 1;
    for (int d = 0; d < f->rank; d++) {
        f->shape[d] = fd->shape.v[d];
        if (__builtin_mul_overflow(count, (uint64_t)f->shape[d], &count) || count > (uint64_t)MAX_FEATURE_VALUES)
            return sl_errf(err, errlen, SL_ESPEC, "%s.shape: holds more than %" PRId64 " values", path, MAX_FEATURE_VALUES);
    }
    fd->has_shape = true; /* the canonical form shows the default [] */
    if (!def)
        return 0;

    char dpath[256];
    snprintf(dpath, sizeof dpath, "%s.default", path);
    size_t n = json_is_array(def) ? json_array_size(def) : 1;
    if (n != 1 && n != count)
        return sl_errf(err, errlen, SL_ESPEC, "%s: %zu values, the shape needs 1 or %" PRIu64, dpath, n, count);
    size_t each = f->dtype == SL_DTYPE_INT64 ? sizeof(int64_t) : f->dtype == SL_DTYPE_FLOAT32 ? sizeof(double)
                                                                                               : sizeof(sl_spec_bytes_t);
    uint8_t *vals = spec_alloc(spec, n * each);
    if (!vals)
        return nomem(err, errlen, dpath);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(def) ? json_array_get(def, i) : def;
        if (json_is_array(def))
            snprintf(ipath, sizeof ipath, "%s[%zu]", dpath, i);
        else
            snprintf(ipath, sizeof ipath, "%s", dpath);
        int rc = 0;
        switch (f->dtype) {
        case SL_DTYPE_INT64: {
            int64_t x = 0;
            rc = parse_int(e, INT64_MIN, INT64_MAX, ipath, &x, err, errlen);
            memcpy(vals + i * each, &x, sizeof x);
            break;
        }
        case SL_DTYPE_FLOAT32: {
            double x = 0;
            rc = parse_number(e, ipath, &x, err, errlen);
            memcpy(vals + i * each, &x, sizeof x);
            break;
        }
        default: {
            if (!json_is_string(e)) {
                describe(e, got, sizeof got);
                return sl_errf(err, errlen, SL_ESPEC, "%s: must be a string, got %s", ipath, got);
            }
            size_t len = json_string_length(e);
            char *s = spec_alloc(spec, len);
            if (!s)
                return nomem(err, errlen, ipath);
            memcpy(s, json_string_value(e), len);
            sl_spec_bytes_t b = {s, len};
            memcpy(vals + i * each, &b, sizeof b);
            break;
        }
        }
        if (rc < 0)
            return rc;
    }
    f->default_values = vals;
    f->default_count = n;
    return 0;
}

/* An object keyed by component (or feature) names, as parse_example's
 * features, padded_batch's maps and map's outputs are: checks that v is an
 * object of min (0 or 1) to max entries and puts its keys, sorted, in keys
 * (room for max). what says what the object holds, entries what a count of
 * them is called, in messages. @return the number of keys, or SL_ESPEC */
static int named_object(json_t *v, const char *path, size_t min, size_t max, const char *what, const char *entries,
                        const char **keys, char *err, size_t errlen)
{
    char got[128];
    if (!json_is_object(v) || json_object_size(v) < min || json_object_size(v) > max) {
        if (json_is_object(v))
            snprintf(got, sizeof got, "%zu %s", json_object_size(v), entries);
        else
            describe(v, got, sizeof got);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be an object of %s%zu %s, got %s", path,
                       min ? "1 to " : "at most ", max, what, got);
    }
    return (int)sorted_keys(v, keys, max);
}

/* The error of a key of such an object that is not a name (noun: "component"
 * or "feature"), at kpath. @return SL_ESPEC, or 0 when it is a name */
static int check_name(const char *key, const char *kpath, const char *noun, char *err, size_t errlen)
{
    if (name_ok(key, strlen(key)))
        return 0;
    return sl_errf(err, errlen, SL_ESPEC, "%s: a %s name must have 1 to %d characters from [A-Za-z0-9_./-]", kpath,
                   noun, SL_MAX_NAME - 1);
}

static int parse_features(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    char got[128], fpath[256];
    const char *keys[SL_SPEC_MAX_FEATURES];
    int n = named_object(v, path, 1, SL_SPEC_MAX_FEATURES, "features", "features", keys, err, errlen);
    if (n < 0)
        return n;
    sl_spec_feature_t *features = spec_alloc(spec, (size_t)n * sizeof *features);
    if (!features)
        return nomem(err, errlen, path);
    for (int i = 0; i < n; i++) {
        json_t *fv = json_object_get(v, keys[i]);
        key_path(path, keys[i], fpath, sizeof fpath);
        int rc = check_name(keys[i], fpath, "feature", err, errlen);
        if (rc < 0)
            return rc;
        if (!json_is_object(fv)) {
            describe(fv, got, sizeof got);
            return sl_errf(err, errlen, SL_ESPEC, "%s: must be an object, got %s", fpath, got);
        }
        struct feature_desc fd;
        memset(&fd, 0, sizeof fd);
        rc = parse_fields(spec, &feature_kind, NULL, fv, &fd, fpath, err, errlen);
        if (rc < 0)
            return rc;
        snprintf(fd.f.name, sizeof fd.f.name, "%s", keys[i]);
        features[i] = fd.f;
    }
    op->u.parse_example.features = features;
    op->u.parse_example.num_features = n;
    return 0;
}

static json_t *emit_default(const sl_spec_feature_t *f)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    for (size_t i = 0; i < f->default_count; i++) {
        json_t *e;
        switch (f->dtype) {
        case SL_DTYPE_INT64: e = json_integer(((const int64_t *)f->default_values)[i]); break;
        case SL_DTYPE_FLOAT32: e = json_real(((const double *)f->default_values)[i]); break;
        default: {
            const sl_spec_bytes_t *b = &((const sl_spec_bytes_t *)f->default_values)[i];
            e = json_stringn(b->data, b->len);
            break;
        }
        }
        if (json_array_append_new(arr, e) < 0) {
            json_decref(arr);
            return NULL;
        }
    }
    /* One value is written as a value, so [7] and 7 are one spec. */
    if (f->default_count == 1) {
        json_t *one = json_incref(json_array_get(arr, 0));
        json_decref(arr);
        return one;
    }
    return arr;
}

static json_t *emit_features(const void *desc)
{
    const sl_spec_op_t *op = desc;
    json_t *o = json_object();
    if (!o)
        return NULL;
    for (int i = 0; i < op->u.parse_example.num_features; i++) {
        const sl_spec_feature_t *f = &op->u.parse_example.features[i];
        const char *dtype = sl_dtype_name(f->dtype);
        json_t *fo = json_pack("{s:s,s:b}", "dtype", dtype, "varlen", f->varlen);
        if (!fo || json_object_set_new(o, f->name, fo) < 0)
            goto fail;
        if (f->varlen)
            continue;
        json_t *shape = json_array();
        if (json_object_set_new(fo, "shape", shape) < 0)
            goto fail;
        for (int d = 0; d < f->rank; d++) {
            if (json_array_append_new(shape, json_integer(f->shape[d])) < 0)
                goto fail;
        }
        if (f->default_count > 0 && json_object_set_new(fo, "default", emit_default(f)) < 0)
            goto fail;
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

static int parse_padded_shapes(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    char kpath[256];
    op->u.padded_batch.num_padded_shapes = 0;
    op->u.padded_batch.padded_shapes = NULL;
    if (!v)
        return 0;
    const char *keys[SL_MAX_COMPONENTS];
    int n = named_object(v, path, 0, SL_MAX_COMPONENTS, "component names and shapes", "entries", keys, err, errlen);
    if (n < 0)
        return n;
    sl_spec_padded_shape_t *shapes = spec_alloc(spec, (size_t)n * sizeof *shapes);
    if (!shapes)
        return nomem(err, errlen, path);
    for (int i = 0; i < n; i++) {
        key_path(path, keys[i], kpath, sizeof kpath);
        int rc = check_name(keys[i], kpath, "component", err, errlen);
        if (rc < 0)
            return rc;
        rc = parse_ints(json_object_get(v, keys[i]), -1, INT64_MAX, 0, SL_MAX_RANK - 1, kpath, &shapes[i].dims, err,
                        errlen);
        if (rc < 0)
            return rc;
        snprintf(shapes[i].name, sizeof shapes[i].name, "%s", keys[i]);
    }
    op->u.padded_batch.padded_shapes = shapes;
    op->u.padded_batch.num_padded_shapes = n;
    return 0;
}

static json_t *emit_padded_shapes(const void *desc)
{
    const sl_spec_op_t *op = desc;
    json_t *o = json_object();
    for (int i = 0; o && i < op->u.padded_batch.num_padded_shapes; i++) {
        const sl_spec_padded_shape_t *s = &op->u.padded_batch.padded_shapes[i];
        json_t *dims = json_array();
        if (json_object_set_new(o, s->name, dims) < 0)
            goto fail;
        for (int d = 0; d < s->dims.n; d++) {
            if (json_array_append_new(dims, json_integer(s->dims.v[d])) < 0)
                goto fail;
        }
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

static int parse_padding_values(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    char kpath[256];
    op->u.padded_batch.num_padding_values = 0;
    op->u.padded_batch.padding_values = NULL;
    if (!v)
        return 0;
    const char *keys[SL_MAX_COMPONENTS];
    int n = named_object(v, path, 0, SL_MAX_COMPONENTS, "component names and numbers", "entries", keys, err, errlen);
    if (n < 0)
        return n;
    sl_spec_padding_value_t *vals = spec_alloc(spec, (size_t)n * sizeof *vals);
    if (!vals)
        return nomem(err, errlen, path);
    for (int i = 0; i < n; i++) {
        json_t *e = json_object_get(v, keys[i]);
        key_path(path, keys[i], kpath, sizeof kpath);
        int rc = check_name(keys[i], kpath, "component", err, errlen);
        if (rc < 0)
            return rc;
        rc = parse_number(e, kpath, &vals[i].d, err, errlen);
        if (rc < 0)
            return rc;
        vals[i].is_int = json_is_integer(e);
        vals[i].i = vals[i].is_int ? json_integer_value(e) : 0;
        snprintf(vals[i].name, sizeof vals[i].name, "%s", keys[i]);
    }
    op->u.padded_batch.padding_values = vals;
    op->u.padded_batch.num_padding_values = n;
    return 0;
}

static json_t *emit_padding_values(const void *desc)
{
    const sl_spec_op_t *op = desc;
    json_t *o = json_object();
    for (int i = 0; o && i < op->u.padded_batch.num_padding_values; i++) {
        const sl_spec_padding_value_t *p = &op->u.padded_batch.padding_values[i];
        if (json_object_set_new(o, p->name, p->is_int ? json_integer(p->i) : json_real(p->d)) < 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

/* ---- map, filter, num_parallel_calls ---- */

static int parse_parallel(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    (void)spec;
    sl_spec_op_t *op = desc;
    if (json_is_string(v) && strcmp(json_string_value(v), "autotune") == 0 &&
        json_string_length(v) == strlen("autotune")) {
        op->num_parallel_calls = SL_SPEC_AUTOTUNE;
    } else if (json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= SL_SPEC_MAX_PARALLEL) {
        op->num_parallel_calls = json_integer_value(v);
    } else {
        char got[128];
        describe(v, got, sizeof got);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be an integer from 1 to %d or \"autotune\", got %s", path,
                    SL_SPEC_MAX_PARALLEL, got);
    }
    op->has_num_parallel_calls = true;
    return 0;
}

static json_t *emit_parallel(const void *desc)
{
    const sl_spec_op_t *op = desc;
    return op->num_parallel_calls == SL_SPEC_AUTOTUNE ? json_string("autotune") : json_integer(op->num_parallel_calls);
}

/* A plugin is named by its file name alone: it is looked up in the
 * worker's --plugin-dir directories, never anywhere else. */
static int parse_plugin(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    (void)spec;
    sl_spec_op_t *op = desc;
    char got[128];
    describe(v, got, sizeof got);
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= SL_SPEC_PLUGIN_NAME)
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be a file name of 1 to %d characters, got %s", path,
                    SL_SPEC_PLUGIN_NAME - 1, got);
    const char *name = json_string_value(v);
    size_t n = json_string_length(v);
    if (strlen(name) != n || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
        strstr(name, ".."))
        return sl_errf(err, errlen, SL_ESPEC,
                    "%s: must be a file name in the worker's --plugin-dir (no '/', no \"..\"), got %s", path, got);
    char *dst = op->kind == SL_OP_MAP ? op->u.map.plugin : op->u.filter.plugin;
    snprintf(dst, SL_SPEC_PLUGIN_NAME, "%s", name);
    if (op->kind == SL_OP_FILTER)
        op->u.filter.has_plugin = true;
    return 0;
}

static json_t *emit_plugin(const void *desc)
{
    const sl_spec_op_t *op = desc;
    return json_string(op->kind == SL_OP_MAP ? op->u.map.plugin : op->u.filter.plugin);
}

/* A C identifier, as the plugin's table names its functions. */
static int parse_function(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    (void)spec;
    sl_spec_op_t *op = desc;
    bool ok = json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) < SL_SPEC_FUNCTION_NAME &&
              strlen(json_string_value(v)) == json_string_length(v);
    for (const char *c = ok ? json_string_value(v) : ""; ok && *c; c++)
        ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_' ||
             (c != json_string_value(v) && *c >= '0' && *c <= '9');
    if (!ok) {
        char got[128];
        describe(v, got, sizeof got);
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be a function name (a C identifier of 1 to %d characters), got %s", path,
                    SL_SPEC_FUNCTION_NAME - 1, got);
    }
    char *dst = op->kind == SL_OP_MAP ? op->u.map.function : op->u.filter.function;
    snprintf(dst, SL_SPEC_FUNCTION_NAME, "%s", json_string_value(v));
    return 0;
}

static json_t *emit_function(const void *desc)
{
    const sl_spec_op_t *op = desc;
    return json_string(op->kind == SL_OP_MAP ? op->u.map.function : op->u.filter.function);
}

/* map's output: {"name": "dtype", ...}, kept sorted by name. */
static int parse_outputs(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    char got[128], kpath[256], want[512];
    const char *keys[SL_MAX_COMPONENTS];
    int n = named_object(v, path, 1, SL_MAX_COMPONENTS, "component names and dtypes", "entries", keys, err, errlen);
    if (n < 0)
        return n;
    sl_spec_map_output_t *outs = spec_alloc(spec, (size_t)n * sizeof *outs);
    if (!outs)
        return nomem(err, errlen, path);
    for (int i = 0; i < n; i++) {
        json_t *e = json_object_get(v, keys[i]);
        key_path(path, keys[i], kpath, sizeof kpath);
        int rc = check_name(keys[i], kpath, "component", err, errlen);
        if (rc < 0)
            return rc;
        const struct choice *c = output_dtypes;
        while (c->name && !(json_is_string(e) && strcmp(c->name, json_string_value(e)) == 0 &&
                            strlen(c->name) == json_string_length(e)))
            c++;
        if (!c->name) {
            describe(e, got, sizeof got);
            choices_phrase(output_dtypes, want, sizeof want);
            return sl_errf(err, errlen, SL_ESPEC, "%s: must be %s, got %s", kpath, want, got);
        }
        snprintf(outs[i].name, sizeof outs[i].name, "%s", keys[i]);
        outs[i].dtype = (sl_dtype_t)c->value;
    }
    op->u.map.outputs = outs;
    op->u.map.num_outputs = n;
    return 0;
}

static json_t *emit_outputs(const void *desc)
{
    const sl_spec_op_t *op = desc;
    json_t *o = json_object();
    for (int i = 0; o && i < op->u.map.num_outputs; i++) {
        const struct choice *c = output_dtypes;
        while (c->name && c->value != (int)op->u.map.outputs[i].dtype)
            c++;
        if (json_object_set_new(o, op->u.map.outputs[i].name, json_string(c->name ? c->name : "invalid")) < 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

/* filter's value: a number, or for "in" a list of numbers. */
static int parse_filter_value(sl_spec_t *spec, json_t *v, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_op_t *op = desc;
    char ipath[192];
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (json_is_array(v) && (n < 1 || n > SL_SPEC_MAX_FILTER_VALUES))
        return sl_errf(err, errlen, SL_ESPEC, "%s: must be a number or a list of 1 to %d numbers, got a list of %zu", path,
                    SL_SPEC_MAX_FILTER_VALUES, n);
    sl_spec_filter_value_t *vals = spec_alloc(spec, n * sizeof *vals);
    if (!vals)
        return nomem(err, errlen, path);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (json_is_array(v))
            snprintf(ipath, sizeof ipath, "%s[%zu]", path, i);
        else
            snprintf(ipath, sizeof ipath, "%s", path);
        int rc = parse_number(e, ipath, &vals[i].d, err, errlen);
        if (rc < 0)
            return rc;
        vals[i].is_int = json_is_integer(e);
        vals[i].i = vals[i].is_int ? json_integer_value(e) : 0;
    }
    op->u.filter.values = vals;
    op->u.filter.num_values = (int)n;
    op->u.filter.has_value = true;
    /* A list is kept a list in the canonical form, even of one value. */
    op->u.filter.cmp = op->u.filter.has_cmp ? op->u.filter.cmp : SL_FILTER_EQ;
    if (json_is_array(v) && !op->u.filter.has_cmp)
        op->u.filter.cmp = SL_FILTER_IN;
    return 0;
}

static json_t *emit_filter_value(const void *desc)
{
    const sl_spec_op_t *op = desc;
    json_t *a = op->u.filter.cmp == SL_FILTER_IN ? json_array() : NULL;
    for (int i = 0; i < op->u.filter.num_values; i++) {
        const sl_spec_filter_value_t *x = &op->u.filter.values[i];
        json_t *e = x->is_int ? json_integer(x->i) : json_real(x->d);
        if (!a)
            return e;
        if (json_array_append_new(a, e) < 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* A filter is either a plugin predicate (plugin and function) or a
 * comparison (key, cmp and value), never both. */
static int filter_check(sl_spec_t *spec, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    (void)spec;
    sl_spec_op_t *op = desc;
    bool plugin = json_object_get(obj, "plugin") != NULL, function = json_object_get(obj, "function") != NULL;
    bool key = op->u.filter.has_key, cmp = op->u.filter.has_cmp, value = op->u.filter.has_value;
    if (plugin || function) {
        if (!plugin)
            return sl_errf(err, errlen, SL_ESPEC, "%s.plugin: required field missing (a filter with a function needs its plugin)",
                        path);
        if (!function)
            return sl_errf(err, errlen, SL_ESPEC, "%s.function: required field missing (a filter with a plugin needs a function)",
                        path);
        if (key || cmp || value)
            return sl_errf(err, errlen, SL_ESPEC, "%s.%s: a filter takes a plugin predicate or a comparison, not both", path,
                        key ? "key" : cmp ? "cmp" : "value");
        return 0;
    }
    if (!key)
        return sl_errf(err, errlen, SL_ESPEC, "%s.key: required field missing (or give plugin and function)", path);
    if (!cmp)
        return sl_errf(err, errlen, SL_ESPEC, "%s.cmp: required field missing", path);
    if (!value)
        return sl_errf(err, errlen, SL_ESPEC, "%s.value: required field missing", path);
    bool list = json_is_array(json_object_get(obj, "value"));
    if (op->u.filter.cmp == SL_FILTER_IN && !list)
        return sl_errf(err, errlen, SL_ESPEC, "%s.value: must be a list of numbers for cmp \"in\"", path);
    if (op->u.filter.cmp != SL_FILTER_IN && list)
        return sl_errf(err, errlen, SL_ESPEC, "%s.value: must be a number (a list goes with cmp \"in\")", path);
    return 0;
}

/* ---- canonical form ---- */

static json_t *emit_field(const struct field *f, const char *base)
{
    switch (f->type) {
    case F_INT: {
        int64_t x;
        memcpy(&x, base + f->off, sizeof x);
        return json_integer(x);
    }
    case F_BOOL: return json_boolean(*(const bool *)(base + f->off));
    case F_NAME: return json_string(base + f->off);
    case F_STRING: {
        int x;
        memcpy(&x, base + f->off, sizeof x);
        for (const struct choice *c = f->choices; c->name; c++) {
            if (c->value == x)
                return json_string(c->name);
        }
        return NULL;
    }
    case F_INTS: {
        const sl_spec_ints_t *l = (const sl_spec_ints_t *)(base + f->off);
        json_t *a = json_array();
        for (int i = 0; a && i < l->n; i++) {
            if (json_array_append_new(a, json_integer(l->v[i])) < 0) {
                json_decref(a);
                return NULL;
            }
        }
        return a;
    }
    case F_FLOATS: {
        const sl_spec_floats_t *l = (const sl_spec_floats_t *)(base + f->off);
        json_t *a = json_array();
        for (int i = 0; a && i < l->n; i++) {
            if (json_array_append_new(a, json_real(l->v[i])) < 0) {
                json_decref(a);
                return NULL;
            }
        }
        return a;
    }
    case F_STRINGS: {
        const sl_spec_strings_t *l = (const sl_spec_strings_t *)(base + f->off);
        json_t *a = json_array();
        for (int i = 0; a && i < l->n; i++) {
            if (json_array_append_new(a, json_string(l->v[i])) < 0) {
                json_decref(a);
                return NULL;
            }
        }
        return a;
    }
    case F_CUSTOM: return f->custom->emit(base);
    case F_LATER: break;
    }
    return NULL;
}

/* Builds {tag_key: name, field: value...} from a parsed descriptor. */
static json_t *canonical_object(const struct kind *k, const char *tag_key, const void *desc)
{
    const char *base = desc;
    json_t *o = json_object();
    if (!o || json_object_set_new(o, tag_key, json_string(k->name)) < 0)
        goto fail;
    for (const struct field *f = k->fields; f->name; f++) {
        if (f->need == F_OPTIONAL && f->type != F_CUSTOM && !*(const bool *)(base + f->has_off))
            continue;
        if (f->need == F_OPTIONAL && f->type == F_CUSTOM && f->has_off && !*(const bool *)(base + f->has_off))
            continue;
        /* json_object_set_new() refuses a NULL value: out of memory. */
        if (json_object_set_new(o, f->name, emit_field(f, base)) < 0)
            goto fail;
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

static int make_canonical(sl_spec_t *spec, const struct kind *src_kind, const struct kind **op_kinds)
{
    json_t *root = json_object();
    json_t *arr = json_array();
    json_t *src = NULL;
    int rc = -ENOMEM;
    if (!root || !arr)
        goto fail;
    for (int i = 0; i < spec->num_ops; i++) {
        if (json_array_append_new(arr, canonical_object(op_kinds[i], "op", &spec->ops[i])) < 0)
            goto fail;
    }
    src = canonical_object(src_kind, "type", &spec->source);
    /* json_object_set_new() takes the value even when it fails. */
    if (json_object_set_new(root, "source", src) < 0)
        goto fail;
    if (json_object_set_new(root, "ops", arr) < 0) {
        arr = NULL;
        goto fail;
    }
    arr = NULL;
    /* Numbers with 15 significant digits (DBL_DIG): 0.1 stays "0.1", and
     * text printed so parses to a double that prints as the same text. */
    spec->canonical = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    if (!spec->canonical)
        goto fail;

    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (const unsigned char *p = (const unsigned char *)spec->canonical; *p; p++) {
        h ^= *p;
        h *= UINT64_C(0x100000001b3);
    }
    snprintf(spec->fingerprint, sizeof spec->fingerprint, "%016" PRIx64, h);
    rc = 0;
fail:
    json_decref(arr);
    json_decref(root);
    return rc;
}

/* ---- the document ---- */

int sl_spec_parse(const char *json, size_t len, sl_spec_t **out, char *err, size_t errlen)
{
    sl_spec_t *spec = NULL;
    json_t *root = NULL;
    json_error_t jerr;
    const struct kind *src_kind = NULL;
    const struct kind *op_kinds[SL_SPEC_MAX_OPS];
    char got[128], path[32];
    int rc;

    *out = NULL;
    if (err && errlen > 0)
        err[0] = '\0';
    if (len > SL_SPEC_MAX_BYTES)
        return sl_errf(err, errlen, SL_ESPEC, "$: the spec is %zu bytes, at most %u allowed", len, SL_SPEC_MAX_BYTES);
    if (!json && len > 0)
        return sl_errf(err, errlen, SL_ESPEC, "$: no spec text");

    root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root)
        return sl_errf(err, errlen, SL_ESPEC, "$: invalid JSON at line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
    spec = calloc(1, sizeof *spec);
    if (!spec) {
        rc = -ENOMEM;
        sl_errf(err, errlen, SL_ESPEC, "$: out of memory");
        goto fail;
    }
    spec->cardinality = -1;

    if (!json_is_object(root)) {
        describe(root, got, sizeof got);
        rc = sl_errf(err, errlen, SL_ESPEC, "$: must be an object, got %s", got);
        goto fail;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "source") != 0 && strcmp(key, "ops") != 0) {
            char kpath[256];
            key_path("$", key, kpath, sizeof kpath);
            const char *names[] = {"source", "ops"};
            const char *near = closest(key, names, 2);
            rc = sl_errf(err, errlen, SL_ESPEC, "%s: unknown field; %s%s%s", kpath, near ? "did you mean \"" : "a spec has "
                         "\"source\" and \"ops\"", near ? near : "", near ? "\"?" : "");
            goto fail;
        }
    }

    json_t *src = json_object_get(root, "source");
    if (!src) {
        rc = sl_errf(err, errlen, SL_ESPEC, "$.source: required field missing");
        goto fail;
    }
    if (!json_is_object(src)) {
        describe(src, got, sizeof got);
        rc = sl_errf(err, errlen, SL_ESPEC, "$.source: must be an object, got %s", got);
        goto fail;
    }
    rc = find_kind(sources, COUNT_OF(sources), "source", "type", src, "$.source", &src_kind, err, errlen);
    if (rc < 0)
        goto fail;
    spec->source.kind = (sl_source_kind_t)src_kind->id;
    rc = parse_fields(spec, src_kind, "type", src, &spec->source, "$.source", err, errlen);
    if (rc < 0)
        goto fail;

    json_t *arr = json_object_get(root, "ops");
    if (arr && !json_is_array(arr)) {
        describe(arr, got, sizeof got);
        rc = sl_errf(err, errlen, SL_ESPEC, "$.ops: must be an array, got %s", got);
        goto fail;
    }
    if (arr && json_array_size(arr) > SL_SPEC_MAX_OPS) {
        rc = sl_errf(err, errlen, SL_ESPEC, "$.ops: at most %d ops allowed, got %zu", SL_SPEC_MAX_OPS, json_array_size(arr));
        goto fail;
    }
    size_t i;
    json_array_foreach(arr, i, v) {
        snprintf(path, sizeof path, "$.ops[%zu]", i);
        if (!json_is_object(v)) {
            describe(v, got, sizeof got);
            rc = sl_errf(err, errlen, SL_ESPEC, "%s: must be an object, got %s", path, got);
            goto fail;
        }
        rc = find_kind(ops, COUNT_OF(ops), "op", "op", v, path, &op_kinds[i], err, errlen);
        if (rc < 0)
            goto fail;
        spec->ops[i].kind = (sl_op_kind_t)op_kinds[i]->id;
        rc = parse_fields(spec, op_kinds[i], "op", v, &spec->ops[i], path, err, errlen);
        if (rc < 0)
            goto fail;
        spec->num_ops = (int)i + 1;
    }

    rc = make_canonical(spec, src_kind, op_kinds);
    if (rc < 0) {
        sl_errf(err, errlen, SL_ESPEC, "$: out of memory");
        goto fail;
    }
    json_decref(root);
    *out = spec;
    return 0;
fail:
    json_decref(root);
    sl_spec_free(spec);
    return rc;
}

void sl_spec_free(sl_spec_t *spec)
{
    if (!spec)
        return;
    free(spec->canonical);
    for (int i = 0; i < spec->num_allocs; i++)
        free(spec->allocs[i]);
    free(spec->allocs);
    free(spec);
}

const char *sl_spec_canonical(const sl_spec_t *spec)
{
    return spec->canonical;
}

const char *sl_spec_fingerprint(const sl_spec_t *spec)
{
    return spec->fingerprint;
}

int64_t sl_spec_source_cardinality(const sl_spec_t *spec)
{
    return spec->cardinality;
}

int sl_spec_source_num_patterns(const sl_spec_t *spec)
{
    return spec->num_patterns;
}

const char *sl_spec_source_pattern(const sl_spec_t *spec, int i)
{
    return i >= 0 && i < spec->num_patterns ? spec->patterns[i] : NULL;
}

const sl_spec_source_t *sl_spec_source(const sl_spec_t *spec)
{
    return &spec->source;
}

int sl_spec_num_ops(const sl_spec_t *spec)
{
    return spec->num_ops;
}

const sl_spec_op_t *sl_spec_op(const sl_spec_t *spec, int i)
{
    return i >= 0 && i < spec->num_ops ? &spec->ops[i] : NULL;
}

const char *sl_spec_op_name(sl_op_kind_t kind)
{
    for (size_t i = 0; i < COUNT_OF(ops); i++) {
        if (ops[i].id != 0 && ops[i].id == (int)kind)
            return ops[i].name;
    }
    return "invalid";
}

bool sl_spec_op_elementwise(sl_op_kind_t kind)
{
    switch (kind) {
    case SL_OP_PARSE_EXAMPLE:
    case SL_OP_DECODE_JPEG:
    case SL_OP_RESIZE:
    case SL_OP_RANDOM_CROP:
    case SL_OP_CENTER_CROP:
    case SL_OP_RANDOM_RESIZED_CROP:
    case SL_OP_COLOR_JITTER:
    case SL_OP_RANDOM_GRAYSCALE:
    case SL_OP_GAUSSIAN_BLUR:
    case SL_OP_RANDOM_SOLARIZE:
    case SL_OP_RANDOM_FLIP:
    case SL_OP_NORMALIZE:
    case SL_OP_CAST:
    case SL_OP_MAP:
    case SL_OP_FILTER: return true;
    default: return false;
    }
}

bool sl_spec_op_takes(sl_op_kind_t kind, sl_dtype_t dt, const char **what)
{
    switch (kind) {
    case SL_OP_DECODE_JPEG: *what = "encoded images (bytes)"; return dt == SL_DTYPE_BYTES;
    case SL_OP_RESIZE:
    case SL_OP_RANDOM_RESIZED_CROP:
    case SL_OP_COLOR_JITTER:
    case SL_OP_RANDOM_GRAYSCALE:
    case SL_OP_GAUSSIAN_BLUR:
    case SL_OP_RANDOM_SOLARIZE: *what = "uint8 images (decode_jpeg makes them)"; return dt == SL_DTYPE_UINT8;
    case SL_OP_NORMALIZE:
        *what = "uint8 or float32 images";
        return dt == SL_DTYPE_UINT8 || dt == SL_DTYPE_FLOAT32;
    case SL_OP_CAST: *what = "numbers"; return dt != SL_DTYPE_BYTES;
    default: *what = "images of numbers (decode_jpeg makes them)"; return dt != SL_DTYPE_BYTES;
    }
}

const char *sl_spec_source_name(sl_source_kind_t kind)
{
    for (size_t i = 0; i < COUNT_OF(sources); i++) {
        if (sources[i].id != 0 && sources[i].id == (int)kind)
            return sources[i].name;
    }
    return "invalid";
}
