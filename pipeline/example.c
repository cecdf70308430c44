/*
 * example.c: decodes tf.train.Example records with nanopb (see example.h).
 *
 * Nothing in an Example is statically bounded, so every variable-size field
 * is a nanopb callback (pipeline/tf/feature.options), bounded here by the
 * feature list and the decoder's max_bytes instead:
 *
 *   Features.feature       entry_cb: one map entry. It reads the entry's key
 *                          and, unless the key names a wanted feature, skips
 *                          the rest without copying it; else it decodes the
 *                          entry's value, a Feature, with pb_decode().
 *   Feature.cb_kind        kind_cb: runs before each kind's list (a oneof
 *                          member) and points that list at the callback for
 *                          the feature's dtype; other kinds are skipped.
 *   Int64List.value ...    int64_cb, float_cb, bytes_cb: the values.
 *
 * nanopb hands a callback one value of an unpacked list, or the whole run
 * of a packed one, as a stream of exactly those bytes; the value callbacks
 * read until the stream is empty, so both encodings decode alike.
 *
 * A bytes feature is decoded in two passes over its entry: one counts the
 * values and their bytes, the other copies them to their place in wire
 * layout (offsets first), so each value is copied once and the buffer is
 * sized, and checked against max_bytes, before anything is copied.
 */
#include "example.h"

#include <errno.h>
#include <inttypes.h>
#include <pb_decode.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "le.h"
#include "tf/example.pb.h"

/* A Feature's kind: the tag of the oneof member that holds its list. */
enum {
    KIND_NONE = 0,
    KIND_BYTES = tensorflow_Feature_bytes_list_tag,
    KIND_FLOAT = tensorflow_Feature_float_list_tag,
    KIND_INT64 = tensorflow_Feature_int64_list_tag,
};

typedef struct feat {
    char name[SL_MAX_NAME];
    size_t name_len;
    sl_dtype_t dtype;
    int kind; /* the list kind the dtype reads */
    bool varlen;
    int rank;
    int64_t shape[SL_MAX_RANK];
    uint64_t expect; /* fixed: the number of values, the shape's product */
    uint8_t *def;    /* fixed: the default in wire layout; NULL when required (owned) */
    size_t def_size;
    uint8_t *buf; /* this record's values in wire layout, reused across records (owned) */
    size_t cap;
    /* Per record. */
    bool present;
    uint64_t count;   /* values seen; a fixed feature stores at most expect of them */
    size_t size;      /* bytes of buf in use, counted in the decoder's total */
    uint64_t payload; /* bytes, counting pass: the stored values' total length */
} feat_t;

struct sl_example_decoder {
    int n;
    size_t max_bytes;
    size_t total; /* bytes in use over all features of the record */
    /* The call in progress: the first failure a callback met, and where to
     * tell it. */
    int rc;
    char *err;
    size_t errlen;
    feat_t f[];
};

/* What the callbacks of one pass over a wanted map entry share. */
typedef struct pass {
    sl_example_decoder_t *dec;
    feat_t *f;
    bool copy;          /* bytes: false counts the values, true copies them */
    int kind;           /* the kind of the last list seen */
    unsigned run;       /* lists seen so far */
    unsigned first_run; /* the first list of the last kind: earlier ones do not count */
    uint64_t index;     /* bytes, copying: values copied */
    uint64_t pos;       /* bytes, copying: payload bytes copied */
} pass_t;

/* A map entry's key, as far as it can name a feature. */
typedef struct entry_key {
    char s[SL_MAX_NAME];
    size_t len;
    bool too_long; /* longer than any feature name */
} entry_key_t;

/* The data of an absent varlen feature, or of an empty one: no values (and
 * for bytes the single offset 0). */
static const uint8_t zeros[8];

__attribute__((format(printf, 3, 4))) static bool fail(sl_example_decoder_t *dec, int rc, const char *fmt, ...)
{
    if (dec->rc == 0) {
        dec->rc = rc;
        if (dec->err != NULL && dec->errlen > 0) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(dec->err, dec->errlen, fmt, ap);
            va_end(ap);
        }
    }
    return false;
}

/* The kind's name with its article, for messages. */
static const char *kind_name(int kind)
{
    switch (kind) {
    case KIND_BYTES: return "a bytes_list";
    case KIND_FLOAT: return "a float_list";
    case KIND_INT64: return "an int64_list";
    default: return "no list";
    }
}

/* Writes "[2, 3]" for a fixed shape. */
static void format_shape(const feat_t *f, char *s, size_t len)
{
    size_t at = 0;
    at += (size_t)snprintf(s, len, "[");
    for (int i = 0; i < f->rank && at < len; i++)
        at += (size_t)snprintf(s + at, len - at, "%s%" PRId64, i ? ", " : "", f->shape[i]);
    if (at < len)
        snprintf(s + at, len - at, "]");
}

static bool count_error(sl_example_decoder_t *dec, const feat_t *f)
{
    char shape[8 * 24];
    format_shape(f, shape, sizeof shape);
    return fail(dec, SL_EDATA, "feature \"%s\": %" PRIu64 " values, shape %s needs %" PRIu64, f->name, f->count,
                shape, f->expect);
}

/*
 * Makes f hold size bytes of this record. The record's total is checked
 * against max_bytes before the buffer grows; the buffer keeps its size for
 * the next records, so in the steady state nothing is allocated.
 */
static bool feat_resize(sl_example_decoder_t *dec, feat_t *f, uint64_t size)
{
    uint64_t total = (uint64_t)dec->total - f->size + size;
    if (total > dec->max_bytes)
        return fail(dec, SL_ETOOBIG, "feature \"%s\": the record decodes to more than %zu bytes (the limit)",
                    f->name, dec->max_bytes);
    if (size > f->cap) {
        size_t cap = f->cap < 64 ? 64 : f->cap;
        while (cap < size)
            cap = cap > dec->max_bytes / 2 ? dec->max_bytes : cap * 2;
        uint8_t *buf = realloc(f->buf, cap);
        if (buf == NULL)
            return fail(dec, -ENOMEM, "feature \"%s\": out of memory for %zu bytes", f->name, cap);
        f->buf = buf;
        f->cap = cap;
    }
    dec->total = (size_t)total;
    f->size = (size_t)size;
    return true;
}

/* Forgets what f holds of this record. */
static void feat_clear(sl_example_decoder_t *dec, feat_t *f)
{
    dec->total -= f->size;
    f->size = 0;
    f->count = 0;
    f->payload = 0;
    f->present = false;
}

/* Whether the next value of f is kept: all of a varlen feature's values,
 * the first expect values of a fixed one (the rest are only counted, for
 * the error message). */
static bool feat_keeps(const feat_t *f)
{
    return f->varlen || f->count < f->expect;
}

static bool int64_cb(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
    pass_t *p = *arg;
    feat_t *f = p->f;
    (void)field;
    while (stream->bytes_left > 0) {
        uint64_t v;
        if (!pb_decode_varint(stream, &v))
            return false;
        if (feat_keeps(f)) {
            if (!feat_resize(p->dec, f, (f->count + 1) * 8))
                return false;
            sl_put_le64(f->buf + f->count * 8, v);
        }
        f->count++;
    }
    return true;
}

static bool float_cb(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
    pass_t *p = *arg;
    feat_t *f = p->f;
    (void)field;
    size_t len = stream->bytes_left;
    if (len % 4 != 0)
        return fail(p->dec, SL_EDATA, "feature \"%s\": a float_list of %zu bytes, not a multiple of 4", f->name,
                    len);
    /* A run of floats is already little-endian IEEE 754 on the wire, as in
     * wire layout: it is copied as a whole. */
    uint64_t n = len / 4, keep = 0;
    if (f->varlen)
        keep = n;
    else if (f->count < f->expect)
        keep = n < f->expect - f->count ? n : f->expect - f->count;
    if (keep > 0) {
        if (!feat_resize(p->dec, f, (f->count + keep) * 4))
            return false;
        if (!pb_read(stream, f->buf + f->count * 4, (size_t)keep * 4))
            return false;
    }
    f->count += n;
    return pb_read(stream, NULL, (size_t)(n - keep) * 4);
}

static bool bytes_cb(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
    pass_t *p = *arg;
    feat_t *f = p->f;
    (void)field;
    size_t len = stream->bytes_left;
    if (!p->copy) {
        if (feat_keeps(f))
            f->payload += len;
        f->count++;
        return pb_read(stream, NULL, len);
    }
    /* The counting pass sized the buffer for exactly these values. */
    uint64_t head = (f->count + 1) * 8;
    if (p->index >= f->count || p->pos + len > f->payload)
        return fail(p->dec, SL_EINTERNAL, "feature \"%s\": values changed between passes", f->name);
    sl_put_le64(f->buf + p->index * 8, p->pos);
    if (!pb_read(stream, f->buf + head + p->pos, len))
        return false;
    p->index++;
    p->pos += len;
    return true;
}

/*
 * Called before each list of a Feature is decoded. Protobuf merges lists of
 * one kind given one after the other and keeps only the last kind when they
 * differ; so does this. The copying pass of a bytes feature knows from the
 * counting pass where the lists that count begin, and skips those before.
 * Lists of another kind than the feature's are skipped by nanopb; the entry
 * is refused after if such a list is the last.
 */
static bool kind_cb(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
    pass_t *p = *arg;
    feat_t *f = p->f;
    (void)stream;
    unsigned run = p->run++;
    if (!p->copy && field->tag != p->kind) {
        p->kind = field->tag;
        p->first_run = run;
        feat_clear(p->dec, f);
    }
    if (field->tag != f->kind || (p->copy && run < p->first_run))
        return true;
    switch (f->kind) {
    case KIND_INT64: {
        tensorflow_Int64List *l = field->pData;
        l->value.funcs.decode = int64_cb;
        l->value.arg = p;
        break;
    }
    case KIND_FLOAT: {
        tensorflow_FloatList *l = field->pData;
        l->value.funcs.decode = float_cb;
        l->value.arg = p;
        break;
    }
    case KIND_BYTES: {
        tensorflow_BytesList *l = field->pData;
        l->value.funcs.decode = bytes_cb;
        l->value.arg = p;
        break;
    }
    }
    return true;
}

/* Decodes one Feature message into p. */
static bool decode_feature(pb_istream_t *stream, pass_t *p)
{
    tensorflow_Feature feature = tensorflow_Feature_init_zero;
    feature.cb_kind.funcs.decode = kind_cb;
    feature.cb_kind.arg = p;
    return pb_decode(stream, tensorflow_Feature_fields, &feature);
}

static bool read_key(pb_istream_t *stream, entry_key_t *k)
{
    size_t len = stream->bytes_left;
    k->too_long = len >= sizeof k->s;
    k->len = k->too_long ? 0 : len;
    return k->too_long ? pb_read(stream, NULL, len) : pb_read(stream, (pb_byte_t *)k->s, len);
}

/*
 * Walks one map entry (FeatureEntry: key = 1, value = 2) field by field:
 * reads the key into key when given, decodes each value into p when given,
 * skips the rest. pb_decode() would do the same through the message
 * descriptor; for a message of two fields that costs several times more,
 * and this runs for every feature of every record. Protobuf allows the
 * fields in any order and repeated (the last key wins, values merge).
 */
static bool entry_walk(pb_istream_t *stream, entry_key_t *key, pass_t *p)
{
    while (stream->bytes_left > 0) {
        pb_wire_type_t wt;
        uint32_t tag;
        bool eof;
        if (!pb_decode_tag(stream, &wt, &tag, &eof))
            return false;
        bool is_key = tag == tensorflow_Features_FeatureEntry_key_tag && key != NULL;
        bool is_value = tag == tensorflow_Features_FeatureEntry_value_tag && p != NULL;
        if (!is_key && !is_value) {
            if (!pb_skip_field(stream, wt))
                return false;
            continue;
        }
        if (wt != PB_WT_STRING)
            PB_RETURN_ERROR(stream, "wrong wire type");
        pb_istream_t sub;
        if (!pb_make_string_substream(stream, &sub))
            return false;
        bool ok = is_key ? read_key(&sub, key) : decode_feature(&sub, p);
        if (!ok) {
            PB_SET_ERROR(stream, sub.errmsg);
            return false;
        }
        if (!pb_close_string_substream(stream, &sub))
            return false;
    }
    return true;
}

/* One pass over a wanted entry, from its own cursor; the key is skipped. */
static bool entry_pass(pb_istream_t stream, pass_t *p)
{
    if (entry_walk(&stream, NULL, p))
        return true;
    return fail(p->dec, SL_EDATA, "feature \"%s\": malformed value: %s", p->f->name, PB_GET_ERROR(&stream));
}

static feat_t *lookup(sl_example_decoder_t *dec, const entry_key_t *k)
{
    if (k->too_long)
        return NULL;
    for (int i = 0; i < dec->n; i++)
        if (dec->f[i].name_len == k->len && memcmp(dec->f[i].name, k->s, k->len) == 0)
            return &dec->f[i];
    return NULL;
}

/* One entry of the features map. */
static bool entry_cb(pb_istream_t *stream, const pb_field_t *field, void **arg)
{
    sl_example_decoder_t *dec = *arg;
    (void)field;
    /* The passes over a wanted entry read it again from copies of this
     * cursor, which stay valid while this call runs; the key goes first, as
     * the writer may have put the value before it. */
    pb_istream_t start = *stream;
    entry_key_t key = {.len = 0};
    if (!entry_walk(stream, &key, NULL))
        return false;
    feat_t *f = lookup(dec, &key);
    if (f == NULL)
        return true;

    /* A name given twice keeps its last entry, as protobuf maps do. */
    feat_clear(dec, f);
    pass_t p = {.dec = dec, .f = f};
    if (!entry_pass(start, &p))
        return false;
    if (p.kind == KIND_NONE)
        return true; /* no kind set: the feature counts as missing */
    if (p.kind != f->kind)
        return fail(dec, SL_EDATA, "feature \"%s\": holds %s, %s needs %s", f->name, kind_name(p.kind),
                    sl_dtype_name(f->dtype), kind_name(f->kind));
    if (!f->varlen && f->count != f->expect)
        return count_error(dec, f);
    if (f->dtype == SL_DTYPE_BYTES) {
        if (!feat_resize(dec, f, (f->count + 1) * 8 + f->payload))
            return false;
        pass_t c = {.dec = dec, .f = f, .copy = true, .first_run = p.first_run};
        if (!entry_pass(start, &c))
            return false;
        if (c.index != f->count || c.pos != f->payload)
            return fail(dec, SL_EINTERNAL, "feature \"%s\": values changed between passes", f->name);
        sl_put_le64(f->buf + f->count * 8, f->payload);
    }
    f->present = true;
    return true;
}

int sl_example_decode(sl_example_decoder_t *dec, const uint8_t *rec, size_t len, sl_example_value_t *out,
                      char *err, size_t errlen)
{
    int rc = 0;
    dec->rc = 0;
    dec->err = err;
    dec->errlen = errlen;
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    for (int i = 0; i < dec->n; i++)
        feat_clear(dec, &dec->f[i]);

    pb_istream_t stream = pb_istream_from_buffer(rec, len);
    tensorflow_Example ex = tensorflow_Example_init_zero;
    ex.features.feature.funcs.decode = entry_cb;
    ex.features.feature.arg = dec;
    if (!pb_decode(&stream, tensorflow_Example_fields, &ex)) {
        fail(dec, SL_EDATA, "example: malformed record of %zu bytes: %s", len, PB_GET_ERROR(&stream));
        rc = dec->rc;
        goto done;
    }

    for (int i = 0; i < dec->n; i++) {
        feat_t *f = &dec->f[i];
        sl_example_value_t *v = &out[i];
        v->dtype = f->dtype;
        v->is_default = false;
        if (f->present) {
            v->count = f->varlen ? f->count : f->expect;
            v->data = f->buf != NULL ? f->buf : zeros;
            v->size = f->size;
        } else if (f->varlen) {
            v->count = 0;
            v->data = zeros;
            v->size = f->dtype == SL_DTYPE_BYTES ? 8 : 0;
        } else if (f->def != NULL) {
            v->count = f->expect;
            v->data = f->def;
            v->size = f->def_size;
            v->is_default = true;
        } else {
            fail(dec, SL_EDATA, "feature \"%s\": required but missing", f->name);
            rc = dec->rc;
            goto done;
        }
    }
done:
    dec->err = NULL;
    dec->errlen = 0;
    return rc;
}

/* Builds f's default in wire layout from the caller's values. */
static int make_default(feat_t *f, const sl_example_feature_t *in, size_t max_bytes, char *err, size_t errlen)
{
    if (in->default_count != 1 && in->default_count != f->expect) {
        snprintf(err, errlen, "feature \"%s\": a default of %zu values, the shape needs 1 or %" PRIu64, f->name,
                 in->default_count, f->expect);
        return SL_EINVAL;
    }
    uint64_t size, payload = 0;
    if (f->dtype == SL_DTYPE_BYTES) {
        const sl_example_bytes_t *b = in->default_values;
        for (size_t i = 0; i < in->default_count; i++) {
            if ((b[i].len > 0 && b[i].data == NULL) || __builtin_add_overflow(payload, b[i].len, &payload)) {
                snprintf(err, errlen, "feature \"%s\": default value %zu is invalid", f->name, i);
                return SL_EINVAL;
            }
        }
        if ((in->default_count == 1 && __builtin_mul_overflow(payload, f->expect, &payload)) ||
            __builtin_add_overflow((f->expect + 1) * 8, payload, &size))
            size = UINT64_MAX; /* refused below */
    } else {
        size = f->expect * sl_dtype_size(f->dtype);
    }
    if (size > max_bytes) {
        snprintf(err, errlen, "feature \"%s\": a default of %" PRIu64 " bytes, more than the limit %zu", f->name,
                 size, max_bytes);
        return SL_EINVAL;
    }
    /* At least one byte, so that a default of no values is not taken for
     * "required". */
    f->def = malloc(size > 0 ? (size_t)size : 1);
    if (f->def == NULL)
        return -ENOMEM;
    f->def_size = (size_t)size;

    uint64_t pos = 0, head = (f->expect + 1) * 8;
    for (uint64_t i = 0; i < f->expect; i++) {
        size_t j = in->default_count == 1 ? 0 : (size_t)i;
        switch (f->dtype) {
        case SL_DTYPE_INT64:
            sl_put_le64(f->def + i * 8, (uint64_t)((const int64_t *)in->default_values)[j]);
            break;
        case SL_DTYPE_FLOAT32: {
            uint32_t bits;
            memcpy(&bits, &((const float *)in->default_values)[j], 4);
            sl_put_le32(f->def + i * 4, bits);
            break;
        }
        default: {
            const sl_example_bytes_t *b = &((const sl_example_bytes_t *)in->default_values)[j];
            sl_put_le64(f->def + i * 8, pos);
            if (b->len > 0)
                memcpy(f->def + head + pos, b->data, b->len);
            pos += b->len;
            break;
        }
        }
    }
    if (f->dtype == SL_DTYPE_BYTES)
        sl_put_le64(f->def + f->expect * 8, pos);
    return 0;
}

/* Checks one feature of the caller's list and copies it into f. */
static int feat_init(feat_t *f, const sl_example_feature_t *in, size_t max_bytes, char *err, size_t errlen)
{
    size_t len = in->name != NULL ? strlen(in->name) : 0;
    if (len == 0 || len >= SL_MAX_NAME) {
        snprintf(err, errlen, "feature name \"%.80s\": must have 1 to %d characters", in->name ? in->name : "",
                 SL_MAX_NAME - 1);
        return SL_EINVAL;
    }
    memcpy(f->name, in->name, len + 1);
    f->name_len = len;
    f->dtype = in->dtype;
    switch (in->dtype) {
    case SL_DTYPE_INT64: f->kind = KIND_INT64; break;
    case SL_DTYPE_FLOAT32: f->kind = KIND_FLOAT; break;
    case SL_DTYPE_BYTES: f->kind = KIND_BYTES; break;
    default:
        snprintf(err, errlen, "feature \"%s\": dtype %s, not int64, float32 or bytes", f->name,
                 sl_dtype_name(in->dtype));
        return SL_EINVAL;
    }
    f->varlen = in->varlen;
    if (f->varlen)
        return 0;

    if (in->rank < 0 || in->rank > SL_MAX_RANK) {
        snprintf(err, errlen, "feature \"%s\": rank %d, not 0 to %d", f->name, in->rank, SL_MAX_RANK);
        return SL_EINVAL;
    }
    f->rank = in->rank;
    /* A fixed feature's values (and for bytes their offsets) must fit the
     * limit, which also keeps every size computed from expect in range. */
    uint64_t expect = 1, per_value = in->dtype == SL_DTYPE_BYTES ? 8 : sl_dtype_size(in->dtype), bytes;
    bool overflow = false;
    for (int i = 0; i < in->rank; i++) {
        if (in->shape[i] < 0) {
            snprintf(err, errlen, "feature \"%s\": dimension %d of the shape is %" PRId64, f->name, i,
                     in->shape[i]);
            return SL_EINVAL;
        }
        overflow |= __builtin_mul_overflow(expect, (uint64_t)in->shape[i], &expect);
        f->shape[i] = in->shape[i];
    }
    if (overflow) {
        /* A zero dimension means no values, however large the others. */
        for (int i = 0; i < in->rank; i++)
            if (in->shape[i] == 0) {
                overflow = false;
                expect = 0;
            }
    }
    /* The least such a feature takes: its values, or its offsets. */
    if (overflow || __builtin_mul_overflow(expect, per_value, &bytes) ||
        (in->dtype == SL_DTYPE_BYTES && __builtin_add_overflow(bytes, 8, &bytes)) || bytes > max_bytes) {
        snprintf(err, errlen, "feature \"%s\": its shape holds more than the limit of %zu bytes", f->name,
                 max_bytes);
        return SL_EINVAL;
    }
    f->expect = expect;
    if (in->default_values == NULL)
        return 0;
    return make_default(f, in, max_bytes, err, errlen);
}

int sl_example_decoder_new(const sl_example_feature_t *features, int n, size_t max_bytes,
                           sl_example_decoder_t **out, char *err, size_t errlen)
{
    char scratch[1];
    int rc;
    if (err == NULL || errlen == 0) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = '\0';
    *out = NULL;
    if (features == NULL || n < 1 || n > SL_MAX_COMPONENTS) {
        snprintf(err, errlen, "example: %d features, not 1 to %d", n, SL_MAX_COMPONENTS);
        return SL_EINVAL;
    }
    if (max_bytes == 0)
        max_bytes = SL_EXAMPLE_DEFAULT_MAX_BYTES;

    sl_example_decoder_t *dec = calloc(1, sizeof *dec + (size_t)n * sizeof(feat_t));
    if (dec == NULL)
        return -ENOMEM;
    dec->n = n;
    dec->max_bytes = max_bytes;
    for (int i = 0; i < n; i++) {
        if ((rc = feat_init(&dec->f[i], &features[i], max_bytes, err, errlen)) != 0)
            goto fail;
        for (int j = 0; j < i; j++) {
            if (strcmp(dec->f[j].name, dec->f[i].name) == 0) {
                snprintf(err, errlen, "feature \"%s\": named twice", dec->f[i].name);
                rc = SL_EINVAL;
                goto fail;
            }
        }
    }
    *out = dec;
    return 0;

fail:
    if (rc == -ENOMEM)
        snprintf(err, errlen, "example: out of memory");
    sl_example_decoder_free(dec);
    return rc;
}

int sl_example_decoder_num_features(const sl_example_decoder_t *dec)
{
    return dec->n;
}

void sl_example_decoder_free(sl_example_decoder_t *dec)
{
    if (dec == NULL)
        return;
    for (int i = 0; i < dec->n; i++) {
        free(dec->f[i].def);
        free(dec->f[i].buf);
    }
    free(dec);
}
