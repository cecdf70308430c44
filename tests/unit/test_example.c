/*
 * test_example.c: tf.train.Example decoding (pipeline/example.c). Records
 * are built here byte by byte, so each test chooses the encoding (packed or
 * not, field order, duplicates); the fixtures in tests/data/tfrecord, made
 * by an independent writer, check the decoder against real files.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "example.h"

/* ---- A protobuf writer, enough for Examples ---- */

typedef struct buf {
    uint8_t *d;
    size_t n, cap;
} buf_t;

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

static void b_put(buf_t *b, const void *p, size_t len)
{
    if (b->n + len > b->cap) {
        b->cap = (b->n + len) * 2 + 16;
        b->d = realloc(b->d, b->cap);
        cr_assert_not_null(b->d);
    }
    if (len > 0)
        memcpy(b->d + b->n, p, len);
    b->n += len;
}

static void b_varint(buf_t *b, uint64_t v)
{
    uint8_t x[10];
    size_t n = 0;
    do {
        x[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            x[n] |= 0x80;
        n++;
    } while (v);
    b_put(b, x, n);
}

static void b_tag(buf_t *b, unsigned field, unsigned wt)
{
    b_varint(b, (uint64_t)field << 3 | wt);
}

static void b_len(buf_t *b, unsigned field, const void *p, size_t len)
{
    b_tag(b, field, WT_LEN);
    b_varint(b, len);
    b_put(b, p, len);
}

/* Appends sub as a length-delimited field and frees it. */
static void b_msg(buf_t *b, unsigned field, buf_t *sub)
{
    b_len(b, field, sub->d, sub->n);
    free(sub->d);
    *sub = (buf_t){0};
}

static void b_float(buf_t *b, float f)
{
    uint8_t x[4];
    memcpy(x, &f, 4); /* the tests run on little-endian hosts */
    b_put(b, x, 4);
}

/* A Feature holding an int64_list, packed or one field per value. */
static buf_t feat_int64(const int64_t *v, size_t n, bool packed)
{
    buf_t list = {0}, feat = {0};
    if (packed) {
        buf_t run = {0};
        for (size_t i = 0; i < n; i++)
            b_varint(&run, (uint64_t)v[i]);
        b_msg(&list, 1, &run);
    } else {
        for (size_t i = 0; i < n; i++) {
            b_tag(&list, 1, WT_VARINT);
            b_varint(&list, (uint64_t)v[i]);
        }
    }
    b_msg(&feat, 3, &list);
    return feat;
}

static buf_t feat_float(const float *v, size_t n, bool packed)
{
    buf_t list = {0}, feat = {0};
    if (packed) {
        buf_t run = {0};
        for (size_t i = 0; i < n; i++)
            b_float(&run, v[i]);
        b_msg(&list, 1, &run);
    } else {
        for (size_t i = 0; i < n; i++) {
            b_tag(&list, 1, WT_I32);
            b_float(&list, v[i]);
        }
    }
    b_msg(&feat, 2, &list);
    return feat;
}

static buf_t feat_bytes(const char *const *v, size_t n)
{
    buf_t list = {0}, feat = {0};
    for (size_t i = 0; i < n; i++)
        b_len(&list, 1, v[i], strlen(v[i]));
    b_msg(&feat, 1, &list);
    return feat;
}

/* Adds one map entry, key first, to a Features message; frees feat. */
static void add(buf_t *features, const char *key, buf_t feat)
{
    buf_t entry = {0};
    b_len(&entry, 1, key, strlen(key));
    b_msg(&entry, 2, &feat);
    b_msg(features, 1, &entry);
}

/* Wraps a Features message into an Example; frees features. */
static buf_t example(buf_t *features)
{
    buf_t ex = {0};
    b_msg(&ex, 1, features);
    return ex;
}

/* ---- Decoder helpers ---- */

static sl_example_feature_t fixed(const char *name, sl_dtype_t dtype, int rank, ...)
{
    sl_example_feature_t f = {.name = name, .dtype = dtype, .rank = rank};
    va_list ap;
    va_start(ap, rank);
    for (int i = 0; i < rank; i++)
        f.shape[i] = va_arg(ap, int64_t);
    va_end(ap);
    return f;
}

static sl_example_feature_t varlen(const char *name, sl_dtype_t dtype)
{
    return (sl_example_feature_t){.name = name, .dtype = dtype, .varlen = true};
}

static sl_example_decoder_t *make(const sl_example_feature_t *f, int n, size_t max_bytes)
{
    sl_example_decoder_t *dec = NULL;
    char err[256] = "";
    int rc = sl_example_decoder_new(f, n, max_bytes, &dec, err, sizeof err);
    cr_assert_eq(rc, 0, "decoder_new: %d %s", rc, err);
    cr_assert_not_null(dec);
    return dec;
}

static void decode_ok(sl_example_decoder_t *dec, const buf_t *rec, sl_example_value_t *out)
{
    char err[256] = "";
    int rc = sl_example_decode(dec, rec->d, rec->n, out, err, sizeof err);
    cr_assert_eq(rc, 0, "decode: %d %s", rc, err);
}

static void decode_fails(sl_example_decoder_t *dec, const buf_t *rec, int want_rc, const char *want_msg)
{
    sl_example_value_t out[SL_MAX_COMPONENTS];
    char err[256] = "";
    int rc = sl_example_decode(dec, rec->d, rec->n, out, err, sizeof err);
    cr_assert_eq(rc, want_rc, "decode: want %d, got %d (%s)", want_rc, rc, err);
    if (want_msg != NULL)
        cr_assert_str_eq(err, want_msg);
}

static int64_t i64_at(const sl_example_value_t *v, uint64_t i)
{
    cr_assert_eq(v->dtype, SL_DTYPE_INT64);
    cr_assert_lt(i, v->count);
    int64_t x;
    memcpy(&x, v->data + i * 8, 8);
    return x;
}

static float f32_at(const sl_example_value_t *v, uint64_t i)
{
    cr_assert_eq(v->dtype, SL_DTYPE_FLOAT32);
    cr_assert_lt(i, v->count);
    float x;
    memcpy(&x, v->data + i * 4, 4);
    return x;
}

/* Checks a bytes value's wire layout and returns its i-th string's length
 * and bytes. */
static const uint8_t *bytes_at(const sl_example_value_t *v, uint64_t i, size_t *len)
{
    cr_assert_eq(v->dtype, SL_DTYPE_BYTES);
    cr_assert_lt(i, v->count);
    uint64_t head = (v->count + 1) * 8, lo, hi, end;
    cr_assert_geq(v->size, head);
    memcpy(&lo, v->data + i * 8, 8);
    memcpy(&hi, v->data + (i + 1) * 8, 8);
    memcpy(&end, v->data + v->count * 8, 8);
    cr_assert_eq(head + end, v->size, "the last offset ends the value");
    cr_assert(lo <= hi && hi <= end);
    *len = (size_t)(hi - lo);
    return v->data + head + lo;
}

static void assert_bytes(const sl_example_value_t *v, uint64_t i, const char *want)
{
    size_t len;
    const uint8_t *p = bytes_at(v, i, &len);
    cr_assert_eq(len, strlen(want), "value %" PRIu64 ": length %zu, want %zu", i, len, strlen(want));
    cr_assert(memcmp(p, want, len) == 0, "value %" PRIu64 " differs from \"%s\"", i, want);
}

/* ---- Encodings ---- */

Test(example, int64_packed_and_unpacked)
{
    const int64_t a[] = {1, -2, 3000000000000LL};
    const int64_t ids[] = {5, 6, INT64_MIN, INT64_MAX};
    sl_example_feature_t spec[] = {fixed("a", SL_DTYPE_INT64, 1, (int64_t)3), varlen("ids", SL_DTYPE_INT64),
                                   varlen("ids_packed", SL_DTYPE_INT64)};
    sl_example_decoder_t *dec = make(spec, 3, 0);
    buf_t fs = {0};
    add(&fs, "a", feat_int64(a, 3, true));
    add(&fs, "ids", feat_int64(ids, 4, false));
    add(&fs, "ids_packed", feat_int64(ids, 4, true));
    buf_t rec = example(&fs);

    sl_example_value_t out[3];
    decode_ok(dec, &rec, out);
    cr_assert_eq(out[0].count, 3);
    cr_assert_eq(out[0].size, 24);
    cr_assert_not(out[0].is_default);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(i64_at(&out[0], i), a[i]);
    for (int k = 1; k <= 2; k++) {
        cr_assert_eq(out[k].count, 4);
        cr_assert_eq(out[k].size, 32);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(i64_at(&out[k], i), ids[i]);
    }
    free(rec.d);
    sl_example_decoder_free(dec);
}

Test(example, floats_packed_and_unpacked)
{
    const float x[] = {0.5f, -1.25f, 3.0e38f, 1.0e-7f};
    sl_example_feature_t spec[] = {fixed("m", SL_DTYPE_FLOAT32, 2, (int64_t)2, (int64_t)2),
                                   varlen("v", SL_DTYPE_FLOAT32)};
    sl_example_decoder_t *dec = make(spec, 2, 0);
    for (int packed = 0; packed < 2; packed++) {
        buf_t fs = {0};
        add(&fs, "v", feat_float(x, 3, !packed));
        add(&fs, "m", feat_float(x, 4, packed));
        buf_t rec = example(&fs);
        sl_example_value_t out[2];
        decode_ok(dec, &rec, out);
        cr_assert_eq(out[0].count, 4);
        cr_assert_eq(out[0].size, 16);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(f32_at(&out[0], i), x[i]);
        cr_assert_eq(out[1].count, 3);
        cr_assert_eq(out[1].size, 12);
        for (int i = 0; i < 3; i++)
            cr_assert_eq(f32_at(&out[1], i), x[i]);
        free(rec.d);
    }
    sl_example_decoder_free(dec);
}

Test(example, bytes_wire_layout)
{
    const char *words[] = {"ab", "", "xyz"};
    const char *one[] = {"hello"};
    sl_example_feature_t spec[] = {varlen("w", SL_DTYPE_BYTES), fixed("s", SL_DTYPE_BYTES, 0)};
    sl_example_decoder_t *dec = make(spec, 2, 0);
    buf_t fs = {0};
    add(&fs, "w", feat_bytes(words, 3));
    add(&fs, "s", feat_bytes(one, 1));
    buf_t rec = example(&fs);
    sl_example_value_t out[2];
    decode_ok(dec, &rec, out);

    /* Offsets 0, 2, 2, 5 relative to the end of the offsets, then "abxyz". */
    cr_assert_eq(out[0].count, 3);
    cr_assert_eq(out[0].size, 4 * 8 + 5);
    const uint64_t want_offsets[] = {0, 2, 2, 5};
    cr_assert(memcmp(out[0].data, want_offsets, sizeof want_offsets) == 0);
    cr_assert(memcmp(out[0].data + 32, "abxyz", 5) == 0);
    for (int i = 0; i < 3; i++)
        assert_bytes(&out[0], i, words[i]);
    cr_assert_eq(out[1].count, 1);
    cr_assert_eq(out[1].size, 16 + 5);
    assert_bytes(&out[1], 0, "hello");
    free(rec.d);
    sl_example_decoder_free(dec);
}

/* ---- Missing features ---- */

Test(example, missing_features_take_their_defaults)
{
    const int64_t seven = 7;
    const float fdef[] = {1.5f, -2.5f};
    const sl_example_bytes_t bdef[] = {{"cat", 3}};
    sl_example_feature_t spec[] = {
        fixed("i", SL_DTYPE_INT64, 1, (int64_t)2),   fixed("f", SL_DTYPE_FLOAT32, 1, (int64_t)2),
        fixed("b", SL_DTYPE_BYTES, 1, (int64_t)2),   varlen("v", SL_DTYPE_INT64),
        varlen("vb", SL_DTYPE_BYTES),                fixed("present", SL_DTYPE_INT64, 0),
    };
    spec[0].default_values = &seven;
    spec[0].default_count = 1; /* repeated to fill the shape */
    spec[1].default_values = fdef;
    spec[1].default_count = 2;
    spec[2].default_values = bdef;
    spec[2].default_count = 1;
    sl_example_decoder_t *dec = make(spec, 6, 0);

    const int64_t one = 1;
    buf_t fs = {0};
    add(&fs, "present", feat_int64(&one, 1, true));
    buf_t rec = example(&fs);
    sl_example_value_t out[6];
    decode_ok(dec, &rec, out);
    cr_assert(out[0].is_default && out[1].is_default && out[2].is_default);
    cr_assert_eq(out[0].count, 2);
    cr_assert_eq(i64_at(&out[0], 0), 7);
    cr_assert_eq(i64_at(&out[0], 1), 7);
    cr_assert_eq(f32_at(&out[1], 0), 1.5f);
    cr_assert_eq(f32_at(&out[1], 1), -2.5f);
    cr_assert_eq(out[2].count, 2);
    assert_bytes(&out[2], 0, "cat");
    assert_bytes(&out[2], 1, "cat");
    /* A missing varlen feature is empty; bytes keep their single offset. */
    cr_assert_eq(out[3].count, 0);
    cr_assert_eq(out[3].size, 0);
    cr_assert_not_null(out[3].data);
    cr_assert_eq(out[4].count, 0);
    cr_assert_eq(out[4].size, 8);
    cr_assert_not(out[5].is_default);
    cr_assert_eq(i64_at(&out[5], 0), 1);
    free(rec.d);
    sl_example_decoder_free(dec);
}

Test(example, missing_required_feature)
{
    sl_example_feature_t spec[] = {fixed("id", SL_DTYPE_INT64, 0), fixed("label", SL_DTYPE_INT64, 0)};
    sl_example_decoder_t *dec = make(spec, 2, 0);
    const int64_t one = 1;
    buf_t fs = {0};
    add(&fs, "id", feat_int64(&one, 1, true));
    buf_t rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"label\": required but missing");
    /* An empty record lacks everything. */
    buf_t empty = {0};
    decode_fails(dec, &empty, SL_EDATA, "feature \"id\": required but missing");
    free(rec.d);
    sl_example_decoder_free(dec);
}

Test(example, feature_without_kind_counts_as_missing)
{
    const int64_t def = -1;
    sl_example_feature_t spec[] = {fixed("label", SL_DTYPE_INT64, 0), fixed("req", SL_DTYPE_INT64, 0)};
    spec[0].default_values = &def;
    spec[0].default_count = 1;
    sl_example_decoder_t *dec = make(spec, 2, 0);
    buf_t fs = {0};
    add(&fs, "label", (buf_t){0}); /* Feature {} */
    add(&fs, "req", (buf_t){0});
    buf_t rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"req\": required but missing");
    free(rec.d);

    const int64_t three = 3;
    fs = (buf_t){0};
    add(&fs, "label", (buf_t){0});
    add(&fs, "req", feat_int64(&three, 1, false));
    rec = example(&fs);
    sl_example_value_t out[2];
    decode_ok(dec, &rec, out);
    cr_assert(out[0].is_default);
    cr_assert_eq(i64_at(&out[0], 0), -1);
    cr_assert_eq(i64_at(&out[1], 0), 3);
    free(rec.d);
    sl_example_decoder_free(dec);
}

/* ---- Refusals ---- */

Test(example, wrong_kind)
{
    sl_example_feature_t spec[] = {fixed("x", SL_DTYPE_FLOAT32, 0), varlen("name", SL_DTYPE_BYTES)};
    sl_example_decoder_t *dec = make(spec, 2, 0);
    const int64_t one = 1;
    const float f = 1;
    buf_t fs = {0};
    add(&fs, "x", feat_int64(&one, 1, true));
    buf_t rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"x\": holds an int64_list, float32 needs a float_list");
    free(rec.d);

    fs = (buf_t){0};
    add(&fs, "x", feat_float(&f, 1, true));
    add(&fs, "name", feat_float(&f, 1, true));
    rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"name\": holds a float_list, bytes needs a bytes_list");
    free(rec.d);
    sl_example_decoder_free(dec);
}

Test(example, wrong_count)
{
    const int64_t three[] = {1, 2, 3};
    const char *two[] = {"a", "b"};
    sl_example_feature_t spec[] = {fixed("label", SL_DTYPE_INT64, 0),
                                   fixed("m", SL_DTYPE_FLOAT32, 2, (int64_t)2, (int64_t)2),
                                   fixed("s", SL_DTYPE_BYTES, 1, (int64_t)3)};
    sl_example_decoder_t *dec = make(spec, 3, 0);
    buf_t fs = {0};
    add(&fs, "label", feat_int64(three, 3, true));
    buf_t rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"label\": 3 values, shape [] needs 1");
    free(rec.d);

    const float f[] = {1, 2, 3, 4, 5};
    const int64_t one = 1;
    fs = (buf_t){0};
    add(&fs, "label", feat_int64(&one, 1, false));
    add(&fs, "m", feat_float(f, 5, false));
    rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"m\": 5 values, shape [2, 2] needs 4");
    free(rec.d);

    fs = (buf_t){0};
    add(&fs, "label", feat_int64(&one, 1, false));
    add(&fs, "m", feat_float(f, 3, true));
    rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"m\": 3 values, shape [2, 2] needs 4");
    free(rec.d);

    fs = (buf_t){0};
    add(&fs, "label", feat_int64(&one, 1, false));
    add(&fs, "m", feat_float(f, 4, true));
    add(&fs, "s", feat_bytes(two, 2));
    rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"s\": 2 values, shape [3] needs 3");
    free(rec.d);

    /* An empty list does not fill a shape that needs values. */
    fs = (buf_t){0};
    add(&fs, "label", feat_int64(NULL, 0, true));
    rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"label\": 0 values, shape [] needs 1");
    free(rec.d);
    sl_example_decoder_free(dec);
}

Test(example, unknown_features_are_skipped)
{
    const int64_t id = 42;
    const float f[] = {1, 2, 3};
    const char *big[] = {NULL};
    char *blob = malloc(5000);
    memset(blob, 'z', 4999);
    blob[4999] = '\0';
    big[0] = blob;

    /* A limit far below the unknown feature's size: skipped values are
     * neither copied nor counted. */
    sl_example_feature_t spec[] = {fixed("id", SL_DTYPE_INT64, 0)};
    sl_example_decoder_t *dec = make(spec, 1, 64);
    buf_t fs = {0};
    add(&fs, "image", feat_bytes(big, 1));
    add(&fs, "idx", feat_float(f, 3, true)); /* a prefix of a name, another kind */
    add(&fs, "id", feat_int64(&id, 1, true));
    add(&fs, "i", feat_int64(&id, 1, true));
    char longname[200];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    add(&fs, longname, feat_float(f, 3, false));
    buf_t rec = example(&fs);
    sl_example_value_t out[1];
    decode_ok(dec, &rec, out);
    cr_assert_eq(out[0].count, 1);
    cr_assert_eq(i64_at(&out[0], 0), 42);
    free(rec.d);
    free(blob);
    sl_example_decoder_free(dec);
}

Test(example, empty_lists)
{
    sl_example_feature_t spec[] = {varlen("i", SL_DTYPE_INT64), varlen("f", SL_DTYPE_FLOAT32),
                                   varlen("b", SL_DTYPE_BYTES), fixed("none", SL_DTYPE_INT64, 1, (int64_t)0)};
    sl_example_decoder_t *dec = make(spec, 4, 0);
    const char *empty_string[] = {""};
    for (int round = 0; round < 2; round++) {
        buf_t fs = {0};
        add(&fs, "i", feat_int64(NULL, 0, round == 0));
        add(&fs, "f", feat_float(NULL, 0, round == 0));
        add(&fs, "b", feat_bytes(empty_string, round)); /* no value, then one empty value */
        add(&fs, "none", feat_int64(NULL, 0, true));
        buf_t rec = example(&fs);
        sl_example_value_t out[4];
        decode_ok(dec, &rec, out);
        cr_assert_eq(out[0].count, 0);
        cr_assert_eq(out[0].size, 0);
        cr_assert_not_null(out[0].data);
        cr_assert_eq(out[1].count, 0);
        cr_assert_eq(out[2].count, (uint64_t)round);
        cr_assert_eq(out[2].size, 8 * (size_t)(round + 1));
        if (round == 1)
            assert_bytes(&out[2], 0, "");
        cr_assert_eq(out[3].count, 0);
        cr_assert_not(out[3].is_default);
        free(rec.d);
    }
    sl_example_decoder_free(dec);
}

/* ---- Protobuf semantics writers may rely on ---- */

Test(example, value_before_key_and_last_entry_wins)
{
    sl_example_feature_t spec[] = {varlen("t", SL_DTYPE_INT64), varlen("w", SL_DTYPE_BYTES)};
    sl_example_decoder_t *dec = make(spec, 2, 0);
    const int64_t first[] = {1, 2, 3}, last[] = {9};
    const char *w1[] = {"old", "older"}, *w2[] = {"new"};
    buf_t fs = {0};
    add(&fs, "t", feat_int64(first, 3, true));
    add(&fs, "w", feat_bytes(w1, 2));
    /* An entry with the value before the key. */
    buf_t entry = {0}, feat = feat_int64(last, 1, false);
    b_msg(&entry, 2, &feat);
    b_len(&entry, 1, "t", 1);
    b_msg(&fs, 1, &entry);
    add(&fs, "w", feat_bytes(w2, 1));
    buf_t rec = example(&fs);
    sl_example_value_t out[2];
    decode_ok(dec, &rec, out);
    cr_assert_eq(out[0].count, 1);
    cr_assert_eq(i64_at(&out[0], 0), 9);
    cr_assert_eq(out[1].count, 1);
    assert_bytes(&out[1], 0, "new");
    free(rec.d);
    sl_example_decoder_free(dec);
}

Test(example, lists_merge_and_the_last_kind_wins)
{
    sl_example_feature_t spec[] = {varlen("t", SL_DTYPE_INT64), varlen("w", SL_DTYPE_BYTES),
                                   varlen("x", SL_DTYPE_FLOAT32)};
    sl_example_decoder_t *dec = make(spec, 3, 0);
    const int64_t a[] = {1, 2}, b[] = {3};
    const char *w1[] = {"a", "bb", "ccc"}, *w2[] = {"dd"};
    const float f = 2;

    /* t: two int64_lists in one Feature merge into 1, 2, 3. */
    buf_t t1 = feat_int64(a, 2, true), t2 = feat_int64(b, 1, false), t = {0};
    b_put(&t, t1.d, t1.n);
    b_put(&t, t2.d, t2.n);
    free(t1.d);
    free(t2.d);
    /* w: bytes, then a float_list, then bytes again: only the last bytes
     * list counts. */
    buf_t p1 = feat_bytes(w1, 3), p2 = feat_float(&f, 1, true), p3 = feat_bytes(w2, 1), w = {0};
    b_put(&w, p1.d, p1.n);
    b_put(&w, p2.d, p2.n);
    b_put(&w, p3.d, p3.n);
    free(p1.d);
    free(p2.d);
    free(p3.d);
    /* x: a float_list then an int64_list: an int64_list in the end. */
    buf_t x1 = feat_float(&f, 1, true), x2 = feat_int64(a, 2, true), x = {0};
    b_put(&x, x1.d, x1.n);
    b_put(&x, x2.d, x2.n);
    free(x1.d);
    free(x2.d);

    buf_t fs = {0};
    add(&fs, "t", t);
    add(&fs, "w", w);
    buf_t rec = example(&fs);
    sl_example_value_t out[3];
    decode_ok(dec, &rec, out);
    cr_assert_eq(out[0].count, 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(i64_at(&out[0], i), i + 1);
    cr_assert_eq(out[1].count, 1);
    assert_bytes(&out[1], 0, "dd");
    free(rec.d);

    fs = (buf_t){0};
    add(&fs, "x", x);
    rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"x\": holds an int64_list, float32 needs a float_list");
    free(rec.d);
    sl_example_decoder_free(dec);
}

/* ---- Malformed records and limits ---- */

Test(example, truncated_records_are_refused)
{
    const int64_t ids[] = {1, 300, -5};
    const float f[] = {1, 2};
    const char *w[] = {"abc", "de"};
    sl_example_feature_t spec[] = {fixed("ids", SL_DTYPE_INT64, 1, (int64_t)3),
                                   fixed("f", SL_DTYPE_FLOAT32, 1, (int64_t)2),
                                   fixed("w", SL_DTYPE_BYTES, 1, (int64_t)2)};
    sl_example_decoder_t *dec = make(spec, 3, 0);
    buf_t fs = {0};
    add(&fs, "ids", feat_int64(ids, 3, true));
    add(&fs, "f", feat_float(f, 2, true));
    add(&fs, "w", feat_bytes(w, 2));
    buf_t rec = example(&fs);
    sl_example_value_t out[3];
    decode_ok(dec, &rec, out);
    /* Every proper prefix is malformed or lacks a required feature. */
    for (size_t len = 0; len < rec.n; len++) {
        char err[256] = "";
        int rc = sl_example_decode(dec, rec.d, len, out, err, sizeof err);
        cr_assert_eq(rc, SL_EDATA, "prefix of %zu bytes: rc %d (%s)", len, rc, err);
        cr_assert_neq(err[0], '\0');
    }
    /* The decoder is still good after failures. */
    decode_ok(dec, &rec, out);
    cr_assert_eq(i64_at(&out[0], 1), 300);
    free(rec.d);
    sl_example_decoder_free(dec);
}

Test(example, garbage_is_refused)
{
    sl_example_feature_t spec[] = {fixed("id", SL_DTYPE_INT64, 0), varlen("w", SL_DTYPE_BYTES),
                                   varlen("f", SL_DTYPE_FLOAT32)};
    sl_example_decoder_t *dec = make(spec, 3, 1 << 20);
    sl_example_value_t out[3];
    char err[256];
    static const uint8_t bad[][12] = {
        {0xff, 0xff, 0xff},                  /* a tag that never ends */
        {0x0a, 0x05, 0x0a},                  /* features longer than the record */
        {0x0a, 0x03, 0x0a, 0x01},            /* an entry longer than features */
        {0x0f},                              /* wire type 7 */
        {0x0a, 0x02, 0x0a, 0x00, 0x0a},      /* a dangling byte */
    };
    static const size_t bad_len[] = {3, 3, 4, 1, 5};
    for (size_t i = 0; i < sizeof bad_len / sizeof bad_len[0]; i++) {
        err[0] = '\0';
        int rc = sl_example_decode(dec, bad[i], bad_len[i], out, err, sizeof err);
        cr_assert_eq(rc, SL_EDATA, "case %zu: rc %d (%s)", i, rc, err);
        cr_assert(strncmp(err, "example: malformed record", 25) == 0, "case %zu: %s", i, err);
    }
    /* A float_list whose packed run is not whole floats. */
    buf_t list = {0}, feat = {0}, fs = {0};
    b_len(&list, 1, "\x01\x02\x03\x04\x05", 5);
    b_msg(&feat, 2, &list);
    add(&fs, "f", feat);
    buf_t rec = example(&fs);
    decode_fails(dec, &rec, SL_EDATA, "feature \"f\": a float_list of 5 bytes, not a multiple of 4");
    free(rec.d);

    /* Random bytes, and random bytes behind a valid start, never crash and
     * never pass (the required "id" is never there). */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    uint8_t junk[512];
    for (int round = 0; round < 2000; round++) {
        size_t len = (size_t)(round % 97) * 5 + 1;
        for (size_t j = 0; j < len; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            junk[j] = (uint8_t)(s >> 56);
        }
        if (round % 2) {
            junk[0] = 0x0a; /* Example.features, with a length */
            junk[1] = (uint8_t)(len > 2 ? (len - 2) & 0x7f : 0);
        }
        int rc = sl_example_decode(dec, junk, len, out, err, sizeof err);
        cr_assert(rc == SL_EDATA, "round %d: rc %d (%s)", round, rc, err);
    }
    sl_example_decoder_free(dec);
}

Test(example, mutated_records_decode_or_fail_cleanly)
{
    /* Every feature varlen, so that many mutants still decode: then their
     * values must be well formed. Wire types that do not fit a field
     * (a float_list value as a varint, ...) come out of the mutations too. */
    sl_example_feature_t spec[] = {varlen("i", SL_DTYPE_INT64), varlen("j", SL_DTYPE_INT64),
                                   varlen("f", SL_DTYPE_FLOAT32), varlen("g", SL_DTYPE_FLOAT32),
                                   varlen("b", SL_DTYPE_BYTES)};
    sl_example_decoder_t *dec = make(spec, 5, 4096);
    const int64_t iv[] = {1, -1, 1 << 20};
    const float fv[] = {1, 2, 3};
    const char *bv[] = {"abc", "", "defgh"};
    buf_t fs = {0};
    add(&fs, "i", feat_int64(iv, 3, true));
    add(&fs, "j", feat_int64(iv, 3, false));
    add(&fs, "f", feat_float(fv, 3, true));
    add(&fs, "g", feat_float(fv, 3, false));
    add(&fs, "b", feat_bytes(bv, 3));
    buf_t rec = example(&fs);
    uint8_t *m = malloc(rec.n);
    uint64_t s = 12345;
    int decoded = 0;
    for (int round = 0; round < 20000; round++) {
        memcpy(m, rec.d, rec.n);
        for (int k = 0; k < 1 + round % 3; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            m[(s >> 33) % rec.n] = (uint8_t)(s >> 20);
        }
        sl_example_value_t out[5];
        char err[256] = "";
        int rc = sl_example_decode(dec, m, rec.n, out, err, sizeof err);
        cr_assert(rc == 0 || rc == SL_EDATA || rc == SL_ETOOBIG, "round %d: rc %d (%s)", round, rc, err);
        if (rc != 0) {
            cr_assert_neq(err[0], '\0');
            continue;
        }
        decoded++;
        for (int c = 0; c < 4; c++)
            cr_assert_eq(out[c].size, out[c].count * (c < 2 ? 8 : 4));
        for (uint64_t v = 0; v < out[4].count; v++) {
            size_t len;
            bytes_at(&out[4], v, &len);
        }
    }
    cr_assert_gt(decoded, 0);
    free(m);
    free(rec.d);
    sl_example_decoder_free(dec);
}

Test(example, limit_is_checked_before_buffers_grow)
{
    sl_example_feature_t spec[] = {varlen("t", SL_DTYPE_INT64), varlen("w", SL_DTYPE_BYTES)};
    sl_example_decoder_t *dec = make(spec, 2, 1024);
    int64_t many[200];
    for (int i = 0; i < 200; i++)
        many[i] = i;
    /* 128 int64 fill the limit exactly; one more does not fit. */
    buf_t fs = {0};
    add(&fs, "t", feat_int64(many, 128, true));
    buf_t rec = example(&fs);
    sl_example_value_t out[2];
    decode_ok(dec, &rec, out);
    cr_assert_eq(out[0].count, 128);
    free(rec.d);

    fs = (buf_t){0};
    add(&fs, "t", feat_int64(many, 129, false));
    rec = example(&fs);
    decode_fails(dec, &rec, SL_ETOOBIG, "feature \"t\": the record decodes to more than 1024 bytes (the limit)");
    free(rec.d);

    /* The limit holds for all features together. */
    char *blob = malloc(601);
    memset(blob, 'b', 600);
    blob[600] = '\0';
    const char *w[] = {blob};
    fs = (buf_t){0};
    add(&fs, "t", feat_int64(many, 60, true)); /* 480 bytes */
    add(&fs, "w", feat_bytes(w, 1));           /* 616 bytes */
    rec = example(&fs);
    decode_fails(dec, &rec, SL_ETOOBIG, "feature \"w\": the record decodes to more than 1024 bytes (the limit)");
    free(rec.d);

    /* A name given twice does not count twice. */
    fs = (buf_t){0};
    add(&fs, "t", feat_int64(many, 100, true));
    add(&fs, "t", feat_int64(many, 100, true));
    rec = example(&fs);
    decode_ok(dec, &rec, out);
    cr_assert_eq(out[0].count, 100);
    free(rec.d);
    free(blob);
    sl_example_decoder_free(dec);
}

Test(example, buffers_are_reused_across_records)
{
    sl_example_feature_t spec[] = {varlen("t", SL_DTYPE_INT64), varlen("w", SL_DTYPE_BYTES)};
    sl_example_decoder_t *dec = make(spec, 2, 0);
    int64_t v[50];
    for (int i = 0; i < 50; i++)
        v[i] = i;
    const char *w[] = {"some", "words", "here"};
    const uint8_t *seen_t = NULL, *seen_w = NULL;
    for (int round = 0; round < 20; round++) {
        buf_t fs = {0};
        add(&fs, "t", feat_int64(v, (size_t)(50 - round), round % 2));
        add(&fs, "w", feat_bytes(w, (size_t)(3 - round % 3)));
        buf_t rec = example(&fs);
        sl_example_value_t out[2];
        decode_ok(dec, &rec, out);
        cr_assert_eq(out[0].count, (uint64_t)(50 - round));
        cr_assert_eq(i64_at(&out[0], out[0].count - 1), 49 - round);
        cr_assert_eq(out[1].count, (uint64_t)(3 - round % 3));
        if (round > 0) {
            cr_assert_eq(out[0].data, seen_t, "round %d: the int64 buffer moved", round);
            cr_assert_eq(out[1].data, seen_w, "round %d: the bytes buffer moved", round);
        }
        seen_t = out[0].data;
        seen_w = out[1].data;
        free(rec.d);
    }
    sl_example_decoder_free(dec);
}

Test(example, invalid_feature_lists)
{
    sl_example_decoder_t *dec = (sl_example_decoder_t *)1;
    char err[256];
    const int64_t two[] = {1, 2};
    struct {
        sl_example_feature_t f[2];
        int n;
        const char *want;
    } cases[] = {
        {{fixed("a", SL_DTYPE_INT64, 0), fixed("a", SL_DTYPE_FLOAT32, 0)}, 2, "feature \"a\": named twice"},
        {{fixed("a", SL_DTYPE_FLOAT64, 0)}, 1, "feature \"a\": dtype float64, not int64, float32 or bytes"},
        {{fixed("", SL_DTYPE_INT64, 0)}, 1, "feature name \"\": must have 1 to 63 characters"},
        {{fixed("a", SL_DTYPE_INT64, 1, (int64_t)-1)}, 1, "feature \"a\": dimension 0 of the shape is -1"},
        {{fixed("a", SL_DTYPE_INT64, 1, (int64_t)3)},
         1,
         "feature \"a\": a default of 2 values, the shape needs 1 or 3"},
        {{fixed("a", SL_DTYPE_INT64, 2, (int64_t)1 << 40, (int64_t)1 << 40)},
         1,
         "feature \"a\": its shape holds more than the limit of 67108864 bytes"},
        {{fixed("a", SL_DTYPE_INT64, 0)}, 0, "example: 0 features, not 1 to 32"},
    };
    cases[4].f[0].default_values = two;
    cases[4].f[0].default_count = 2;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        int rc = sl_example_decoder_new(cases[i].f, cases[i].n, 0, &dec, err, sizeof err);
        cr_assert_eq(rc, SL_EINVAL, "case %zu: rc %d (%s)", i, rc, err);
        cr_assert_null(dec);
        cr_assert_str_eq(err, cases[i].want);
    }
    sl_example_feature_t rank = fixed("a", SL_DTYPE_INT64, 0);
    rank.rank = SL_MAX_RANK + 1;
    cr_assert_eq(sl_example_decoder_new(&rank, 1, 0, &dec, err, sizeof err), SL_EINVAL);
    sl_example_decoder_free(NULL);
}

/* ---- The fixtures ---- */

/* Reads every record of a TFRecord file (gzip or not) into one buffer; the
 * CRCs are skipped, storage/ checks them. rec[i] and len[i] point into it. */
typedef struct records {
    uint8_t *data;
    size_t n;
    const uint8_t *rec[1100];
    size_t len[1100];
} records_t;

static records_t *read_records(const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tfrecord/%s", SL_TEST_DATA, file);
    gzFile gz = gzopen(path, "rb");
    cr_assert_not_null(gz, "open %s", path);
    size_t cap = 1 << 16, size = 0;
    uint8_t *data = malloc(cap);
    int got;
    while ((got = gzread(gz, data + size, (unsigned)(cap - size))) > 0) {
        size += (size_t)got;
        if (size == cap)
            data = realloc(data, cap *= 2);
    }
    cr_assert_eq(got, 0, "read %s", path);
    gzclose(gz);

    records_t *r = calloc(1, sizeof *r);
    r->data = data;
    for (size_t at = 0; at < size;) {
        uint64_t len;
        cr_assert_leq(at + 12, size, "%s: a header cut at %zu", file, at);
        memcpy(&len, data + at, 8);
        cr_assert_leq(at + 12 + len + 4, size, "%s: a record cut at %zu", file, at);
        cr_assert_lt(r->n, sizeof r->rec / sizeof r->rec[0]);
        r->rec[r->n] = data + at + 12;
        r->len[r->n] = (size_t)len;
        r->n++;
        at += 12 + (size_t)len + 4;
    }
    return r;
}

static void free_records(records_t *r)
{
    free(r->data);
    free(r);
}

static void decode_fixture(sl_example_decoder_t *dec, const records_t *r, size_t i, sl_example_value_t *out)
{
    char err[256] = "";
    int rc = sl_example_decode(dec, r->rec[i], r->len[i], out, err, sizeof err);
    cr_assert_eq(rc, 0, "record %zu: %d %s", i, rc, err);
}

static json_t *manifest_file(json_t *manifest, const char *file)
{
    json_t *f = json_object_get(json_object_get(manifest, "files"), file);
    cr_assert_not_null(f, "MANIFEST.json lists no %s", file);
    return f;
}

static json_t *load_manifest(void)
{
    char path[512];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/tfrecord/MANIFEST.json", SL_TEST_DATA);
    json_t *m = json_load_file(path, 0, &jerr);
    cr_assert_not_null(m, "%s: %s", path, jerr.text);
    return m;
}

/* basic-*: id int64, label int64 (id % 10), name bytes ("rec-%05d" of id),
 * x float32 [4] (id/2, id/4, -id, id/1000). */
static void check_basic(json_t *manifest, const char *file)
{
    json_t *mf = manifest_file(manifest, file);
    int64_t first_id = json_integer_value(json_object_get(mf, "first_id"));
    int64_t last_id = json_integer_value(json_object_get(mf, "last_id"));
    sl_example_feature_t spec[] = {fixed("id", SL_DTYPE_INT64, 0), fixed("label", SL_DTYPE_INT64, 0),
                                   fixed("name", SL_DTYPE_BYTES, 0), fixed("x", SL_DTYPE_FLOAT32, 1, (int64_t)4)};
    sl_example_decoder_t *dec = make(spec, 4, 0);
    records_t *r = read_records(file);
    cr_assert_eq((int64_t)r->n, json_integer_value(json_object_get(mf, "records")));
    cr_assert_eq((int64_t)r->n, last_id - first_id + 1, "%s: %zu records", file, r->n);
    for (size_t i = 0; i < r->n; i++) {
        sl_example_value_t out[4];
        decode_fixture(dec, r, i, out);
        int64_t id = first_id + (int64_t)i;
        cr_assert_eq(i64_at(&out[0], 0), id, "%s record %zu", file, i);
        cr_assert_eq(i64_at(&out[1], 0), id % 10);
        char name[16];
        snprintf(name, sizeof name, "rec-%05" PRId64, id);
        assert_bytes(&out[2], 0, name);
        cr_assert_eq(out[3].count, 4);
        cr_assert_eq(f32_at(&out[3], 0), (float)((double)id * 0.5));
        cr_assert_eq(f32_at(&out[3], 1), (float)((double)id * 0.25));
        cr_assert_eq(f32_at(&out[3], 2), (float)-id);
        cr_assert_eq(f32_at(&out[3], 3), (float)((double)id * 0.001));
    }
    free_records(r);
    sl_example_decoder_free(dec);
}

Test(example, fixtures_basic)
{
    json_t *m = load_manifest();
    check_basic(m, "basic-00000-of-00004.tfrecord");
    check_basic(m, "basic-00001-of-00004.tfrecord");
    check_basic(m, "basic-00002-of-00004.tfrecord");
    check_basic(m, "basic-00003-of-00004.tfrecord");
    check_basic(m, "basic-gzip-00000-of-00001.tfrecord.gz");
    json_decref(m);
}

/* varlen: id int64, tokens int64 ragged (id * 100 + k for k < length). */
Test(example, fixtures_varlen)
{
    json_t *m = load_manifest();
    const char *file = "varlen-00000-of-00001.tfrecord";
    json_t *lengths = json_object_get(manifest_file(m, file), "token_lengths");
    sl_example_feature_t spec[] = {varlen("tokens", SL_DTYPE_INT64), fixed("id", SL_DTYPE_INT64, 0)};
    sl_example_decoder_t *dec = make(spec, 2, 0);
    records_t *r = read_records(file);
    cr_assert_eq(r->n, json_array_size(lengths));
    for (size_t i = 0; i < r->n; i++) {
        sl_example_value_t out[2];
        decode_fixture(dec, r, i, out);
        int64_t id = i64_at(&out[1], 0);
        cr_assert_eq(id, (int64_t)i);
        cr_assert_eq((int64_t)out[0].count, json_integer_value(json_array_get(lengths, i)), "record %zu", i);
        for (uint64_t k = 0; k < out[0].count; k++)
            cr_assert_eq(i64_at(&out[0], k), id * 100 + (int64_t)k, "record %zu token %" PRIu64, i, k);
    }
    free_records(r);
    sl_example_decoder_free(dec);
    json_decref(m);
}

/* images-*: id int64, image/encoded bytes (JPEG), image/format bytes
 * ("jpeg"), image/height int64, image/width int64, label int64. */
static void check_images(json_t *manifest, const char *file, int64_t first_id)
{
    json_t *images = json_object_get(manifest_file(manifest, file), "images");
    sl_example_feature_t spec[] = {
        fixed("image/encoded", SL_DTYPE_BYTES, 0), fixed("label", SL_DTYPE_INT64, 0),
        fixed("image/height", SL_DTYPE_INT64, 0),  fixed("image/width", SL_DTYPE_INT64, 0),
        fixed("image/format", SL_DTYPE_BYTES, 0),  fixed("id", SL_DTYPE_INT64, 0),
    };
    sl_example_decoder_t *dec = make(spec, 6, 0);
    records_t *r = read_records(file);
    cr_assert_eq(r->n, json_array_size(images));
    for (size_t i = 0; i < r->n; i++) {
        json_t *im = json_array_get(images, i);
        sl_example_value_t out[6];
        decode_fixture(dec, r, i, out);
        size_t len;
        const uint8_t *jpeg = bytes_at(&out[0], 0, &len);
        cr_assert_gt(len, 100);
        cr_assert(jpeg[0] == 0xff && jpeg[1] == 0xd8, "%s record %zu: no JPEG SOI marker", file, i);
        cr_assert(jpeg[len - 2] == 0xff && jpeg[len - 1] == 0xd9, "%s record %zu: no JPEG EOI marker", file, i);
        cr_assert_eq(i64_at(&out[1], 0), json_integer_value(json_object_get(im, "label")));
        cr_assert_eq(i64_at(&out[2], 0), json_integer_value(json_object_get(im, "height")));
        cr_assert_eq(i64_at(&out[3], 0), json_integer_value(json_object_get(im, "width")));
        assert_bytes(&out[4], 0, "jpeg");
        cr_assert_eq(i64_at(&out[5], 0), first_id + (int64_t)i);
    }
    free_records(r);
    sl_example_decoder_free(dec);
}

Test(example, fixtures_images)
{
    json_t *m = load_manifest();
    check_images(m, "images-00000-of-00002.tfrecord", 0);
    check_images(m, "images-00001-of-00002.tfrecord", 16);
    json_decref(m);
}
