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
 */
#include "spec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* Counts (range length, take, skip, repeat) stay below 2^62 so that sums
 * and differences of them never overflow an int64. */
#define MAX_COUNT (INT64_C(1) << 62)
#define MAX_BATCH_SIZE (INT64_C(1) << 20)
#define MAX_SHUFFLE_BUFFER (INT64_C(1) << 24)

struct sl_spec {
    sl_spec_source_t source;
    int num_ops;
    sl_spec_op_t ops[SL_SPEC_MAX_OPS];
    int64_t cardinality;
    char *canonical; /* from json_dumps(), freed with free() */
    char **patterns; /* file sources: num_patterns strings, malloc'd */
    int num_patterns;
    char fingerprint[17];
};

enum field_type { F_INT, F_BOOL, F_NAME };

enum field_need {
    F_REQUIRED, /* absent is an error */
    F_DEFAULT,  /* absent takes def / def_name; the canonical form shows the value */
    F_OPTIONAL, /* absent stays absent, also in the canonical form */
};

/* One field of a source or op. off locates the value (int64_t, bool or
 * char[SL_MAX_NAME]) inside the descriptor (sl_spec_source_t or
 * sl_spec_op_t); an F_OPTIONAL field also has a bool at has_off that says
 * whether it was given. */
struct field {
    const char *name;
    enum field_type type;
    enum field_need need;
    int64_t min, max;
    int64_t def;
    const char *def_name;
    size_t off;
    size_t has_off;
};

/* A source or op kind. id 0 marks a name that is planned but not supported
 * yet. check, when set, validates what one field alone cannot. */
struct kind {
    const char *name;
    int id;
    const struct field *fields;
    int (*check)(sl_spec_t *spec, void *desc, const char *path, char *err, size_t errlen);
};

#define INT_FIELD(n, need, lo, hi, d, type, member) \
    {n, F_INT, need, lo, hi, d, NULL, offsetof(type, member), 0}
#define BOOL_FIELD(n, d, type, member) \
    {n, F_BOOL, F_DEFAULT, 0, 0, d, NULL, offsetof(type, member), 0}

static const struct field range_fields[] = {
    INT_FIELD("start", F_DEFAULT, INT64_MIN, INT64_MAX, 0, sl_spec_source_t, u.range.start),
    INT_FIELD("stop", F_REQUIRED, INT64_MIN, INT64_MAX, 0, sl_spec_source_t, u.range.stop),
    INT_FIELD("step", F_DEFAULT, INT64_MIN, INT64_MAX, 1, sl_spec_source_t, u.range.step),
    {"name", F_NAME, F_DEFAULT, 0, 0, 0, "value", offsetof(sl_spec_source_t, name), 0},
    {NULL, 0, 0, 0, 0, 0, NULL, 0, 0},
};

static const struct field batch_fields[] = {
    INT_FIELD("batch_size", F_REQUIRED, 1, MAX_BATCH_SIZE, 0, sl_spec_op_t, u.batch.batch_size),
    BOOL_FIELD("drop_remainder", 0, sl_spec_op_t, u.batch.drop_remainder),
    {NULL, 0, 0, 0, 0, 0, NULL, 0, 0},
};

static const struct field shuffle_fields[] = {
    INT_FIELD("buffer_size", F_REQUIRED, 1, MAX_SHUFFLE_BUFFER, 0, sl_spec_op_t, u.shuffle.buffer_size),
    {"seed", F_INT, F_OPTIONAL, 0, INT64_MAX, 0, NULL, offsetof(sl_spec_op_t, u.shuffle.seed),
     offsetof(sl_spec_op_t, u.shuffle.has_seed)},
    BOOL_FIELD("reshuffle_each_iteration", 1, sl_spec_op_t, u.shuffle.reshuffle_each_iteration),
    {NULL, 0, 0, 0, 0, 0, NULL, 0, 0},
};

static const struct field take_fields[] = {
    INT_FIELD("count", F_REQUIRED, -1, MAX_COUNT, 0, sl_spec_op_t, u.take.count),
    {NULL, 0, 0, 0, 0, 0, NULL, 0, 0},
};

static const struct field skip_fields[] = {
    INT_FIELD("count", F_REQUIRED, -1, MAX_COUNT, 0, sl_spec_op_t, u.skip.count),
    {NULL, 0, 0, 0, 0, 0, NULL, 0, 0},
};

static const struct field repeat_fields[] = {
    INT_FIELD("count", F_DEFAULT, -1, MAX_COUNT, -1, sl_spec_op_t, u.repeat.count),
    {NULL, 0, 0, 0, 0, 0, NULL, 0, 0},
};

static int range_check(sl_spec_t *spec, void *desc, const char *path, char *err, size_t errlen);

static const struct kind sources[] = {
    {"range", SL_SOURCE_RANGE, range_fields, range_check},
    {"tfrecord", 0, NULL, NULL},
    {"text_lines", 0, NULL, NULL},
    {"fixed_length_records", 0, NULL, NULL},
};

static const struct kind ops[] = {
    {"batch", SL_OP_BATCH, batch_fields, NULL},
    {"shuffle", SL_OP_SHUFFLE, shuffle_fields, NULL},
    {"take", SL_OP_TAKE, take_fields, NULL},
    {"skip", SL_OP_SKIP, skip_fields, NULL},
    {"repeat", SL_OP_REPEAT, repeat_fields, NULL},
    {"parse_example", 0, NULL, NULL},
    {"map", 0, NULL, NULL},
    {"filter", 0, NULL, NULL},
    {"decode_jpeg", 0, NULL, NULL},
    {"resize", 0, NULL, NULL},
    {"random_crop", 0, NULL, NULL},
    {"random_flip", 0, NULL, NULL},
    {"normalize", 0, NULL, NULL},
    {"cast", 0, NULL, NULL},
    {"shard", 0, NULL, NULL},
    {"interleave", 0, NULL, NULL},
    {"padded_batch", 0, NULL, NULL},
    {"prefetch", 0, NULL, NULL},
    {"cache", 0, NULL, NULL},
};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return SL_ESPEC;
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

/* Says which integers a field takes, for its error message. */
static void int_bounds(const struct field *f, int64_t got, bool have_got, char *buf, size_t buflen)
{
    if (have_got && got > f->max)
        snprintf(buf, buflen, "an integer <= %" PRId64, f->max);
    else if (f->min == INT64_MIN)
        snprintf(buf, buflen, "an integer");
    else
        snprintf(buf, buflen, "an integer >= %" PRId64, f->min);
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

/* Parses one field of obj into desc, or fills in its default. */
static int parse_field(const struct field *f, json_t *obj, void *desc, const char *path, char *err, size_t errlen)
{
    char *base = desc;
    json_t *v = json_object_get(obj, f->name);
    char got[128];

    if (!v) {
        switch (f->need) {
        case F_REQUIRED: return fail(err, errlen, "%s.%s: required field missing", path, f->name);
        case F_OPTIONAL: *(bool *)(base + f->has_off) = false; return 0;
        case F_DEFAULT: break;
        }
        switch (f->type) {
        case F_INT: memcpy(base + f->off, &f->def, sizeof(int64_t)); break;
        case F_BOOL: *(bool *)(base + f->off) = f->def != 0; break;
        case F_NAME: snprintf(base + f->off, SL_MAX_NAME, "%s", f->def_name); break;
        }
        return 0;
    }

    describe(v, got, sizeof got);
    switch (f->type) {
    case F_INT: {
        char want[64];
        if (!json_is_integer(v)) {
            int_bounds(f, 0, false, want, sizeof want);
            return fail(err, errlen, "%s.%s: must be %s, got %s", path, f->name, want, got);
        }
        int64_t x = json_integer_value(v);
        if (x < f->min || x > f->max) {
            int_bounds(f, x, true, want, sizeof want);
            return fail(err, errlen, "%s.%s: must be %s, got %s", path, f->name, want, got);
        }
        memcpy(base + f->off, &x, sizeof x);
        break;
    }
    case F_BOOL:
        if (!json_is_boolean(v))
            return fail(err, errlen, "%s.%s: must be true or false, got %s", path, f->name, got);
        *(bool *)(base + f->off) = json_is_true(v);
        break;
    case F_NAME:
        if (!json_is_string(v) || !name_ok(json_string_value(v), json_string_length(v)))
            return fail(err, errlen,
                        "%s.%s: must be a string of 1 to %d characters from [A-Za-z0-9_./-], got %s", path,
                        f->name, SL_MAX_NAME - 1, got);
        snprintf(base + f->off, SL_MAX_NAME, "%s", json_string_value(v));
        break;
    }
    if (f->need == F_OPTIONAL)
        *(bool *)(base + f->has_off) = true;
    return 0;
}

/* Parses a source or op object: every key must be tag_key or a field of k. */
static int parse_fields(sl_spec_t *spec, const struct kind *k, const char *tag_key, json_t *obj, void *desc,
                        const char *path, char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        bool known = strcmp(key, tag_key) == 0;
        for (const struct field *f = k->fields; !known && f->name; f++)
            known = strcmp(key, f->name) == 0;
        if (!known) {
            char kbuf[160];
            escape(key, strlen(key), 64, kbuf, sizeof kbuf);
            return fail(err, errlen, "%s.%s: unknown field", path, kbuf);
        }
    }
    for (const struct field *f = k->fields; f->name; f++) {
        int rc = parse_field(f, obj, desc, path, err, errlen);
        if (rc < 0)
            return rc;
    }
    return k->check ? k->check(spec, desc, path, err, errlen) : 0;
}

/* Finds the kind named by obj[tag_key] in table; what says "source" or "op"
 * for messages. */
static int find_kind(const struct kind *table, size_t n, const char *what, const char *tag_key, json_t *obj,
                     const char *path, const struct kind **out, char *err, size_t errlen)
{
    json_t *tag = json_object_get(obj, tag_key);
    char got[128];
    if (!tag)
        return fail(err, errlen, "%s.%s: required field missing", path, tag_key);
    if (!json_is_string(tag)) {
        describe(tag, got, sizeof got);
        return fail(err, errlen, "%s.%s: must be a string, got %s", path, tag_key, got);
    }
    const char *name = json_string_value(tag);
    for (size_t i = 0; i < n; i++) {
        /* Compare lengths too: a JSON string may hold "\u0000". */
        if (strlen(table[i].name) == json_string_length(tag) && strcmp(table[i].name, name) == 0) {
            if (table[i].id == 0)
                return fail(err, errlen, "%s.%s: %s \"%s\" is not supported yet", path, tag_key, what, name);
            *out = &table[i];
            return 0;
        }
    }
    describe(tag, got, sizeof got);
    return fail(err, errlen, "%s.%s: unknown %s %s", path, tag_key, what, got);
}

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

static int range_check(sl_spec_t *spec, void *desc, const char *path, char *err, size_t errlen)
{
    sl_spec_source_t *src = desc;
    if (src->u.range.step == 0)
        return fail(err, errlen, "%s.step: must be a nonzero integer, got 0", path);
    uint64_t n = range_count(src->u.range.start, src->u.range.stop, src->u.range.step);
    if (n > (uint64_t)MAX_COUNT)
        return fail(err, errlen, "%s.stop: the range yields %" PRIu64 " elements, at most %" PRId64 " (2^62) allowed",
                    path, n, MAX_COUNT);
    spec->cardinality = (int64_t)n;
    return 0;
}

/* Builds {tag_key: name, field: value...} from a parsed descriptor. */
static json_t *canonical_object(const struct kind *k, const char *tag_key, const void *desc)
{
    const char *base = desc;
    json_t *o = json_object();
    if (!o || json_object_set_new(o, tag_key, json_string(k->name)) < 0)
        goto fail;
    for (const struct field *f = k->fields; f->name; f++) {
        json_t *v = NULL;
        if (f->need == F_OPTIONAL && !*(const bool *)(base + f->has_off))
            continue;
        switch (f->type) {
        case F_INT: {
            int64_t x;
            memcpy(&x, base + f->off, sizeof x);
            v = json_integer(x);
            break;
        }
        case F_BOOL: v = json_boolean(*(const bool *)(base + f->off)); break;
        case F_NAME: v = json_string(base + f->off); break;
        }
        if (json_object_set_new(o, f->name, v) < 0)
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
    spec->canonical = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
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
        return fail(err, errlen, "$: the spec is %zu bytes, at most %u allowed", len, SL_SPEC_MAX_BYTES);
    if (!json && len > 0)
        return fail(err, errlen, "$: no spec text");

    root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!root)
        return fail(err, errlen, "$: invalid JSON at line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
    spec = calloc(1, sizeof *spec);
    if (!spec) {
        rc = -ENOMEM;
        fail(err, errlen, "$: out of memory");
        goto fail;
    }
    spec->cardinality = -1;

    if (!json_is_object(root)) {
        describe(root, got, sizeof got);
        rc = fail(err, errlen, "$: must be an object, got %s", got);
        goto fail;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "source") != 0 && strcmp(key, "ops") != 0) {
            char kbuf[160];
            escape(key, strlen(key), 64, kbuf, sizeof kbuf);
            rc = fail(err, errlen, "$.%s: unknown field", kbuf);
            goto fail;
        }
    }

    json_t *src = json_object_get(root, "source");
    if (!src) {
        rc = fail(err, errlen, "$.source: required field missing");
        goto fail;
    }
    if (!json_is_object(src)) {
        describe(src, got, sizeof got);
        rc = fail(err, errlen, "$.source: must be an object, got %s", got);
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
        rc = fail(err, errlen, "$.ops: must be an array, got %s", got);
        goto fail;
    }
    if (arr && json_array_size(arr) > SL_SPEC_MAX_OPS) {
        rc = fail(err, errlen, "$.ops: at most %d ops allowed, got %zu", SL_SPEC_MAX_OPS, json_array_size(arr));
        goto fail;
    }
    size_t i;
    json_array_foreach(arr, i, v) {
        snprintf(path, sizeof path, "$.ops[%zu]", i);
        if (!json_is_object(v)) {
            describe(v, got, sizeof got);
            rc = fail(err, errlen, "%s: must be an object, got %s", path, got);
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
        fail(err, errlen, "$: out of memory");
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
    for (int i = 0; i < spec->num_patterns; i++)
        free(spec->patterns[i]);
    free(spec->patterns);
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

const char *sl_spec_source_name(sl_source_kind_t kind)
{
    for (size_t i = 0; i < COUNT_OF(sources); i++) {
        if (sources[i].id != 0 && sources[i].id == (int)kind)
            return sources[i].name;
    }
    return "invalid";
}
