/*
 * fuzz_example.c: libFuzzer target for the tf.Example decoder
 * (pipeline/example.c), which reads every record of a TFRecord file a
 * parse_example op is given: files are data from anywhere.
 *
 * The input: one byte that picks the decoder's max_bytes (bit 0: 256 or
 * 64 KiB), then a serialized Example. The decoder extracts a fixed list of
 * features of every kind (one required, others with defaults, fixed shapes, varlen,
 * int64, float32, bytes), named as in tests/data/tfrecord.
 *
 * Beyond "no crash, no leak": only the documented results and a message on
 * failure; on success values in wire layout that agree with their dtype and
 * shape (bytes offsets from 0, never decreasing, ending at the values'
 * size), within max_bytes all together, the same again when the record is
 * decoded a second time (the decoder reuses its buffers), and an Example
 * encoded here from the values decodes to the same values.
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_example).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example.h"
#include "le.h"

#include "fuzz_check.h"

#define NF 7

static const int64_t label_default = 7;
static const float x_default = 0.5f;
static const sl_example_bytes_t name_default = {"none", 4};
static const sl_example_bytes_t pair_default = {"ab", 2};

static sl_example_decoder_t *decoders[2];

static void make_decoders(void)
{
    sl_example_feature_t f[NF] = {
        {.name = "id", .dtype = SL_DTYPE_INT64, .rank = 0},
        {.name = "label", .dtype = SL_DTYPE_INT64, .rank = 0, .default_values = &label_default, .default_count = 1},
        {.name = "name", .dtype = SL_DTYPE_BYTES, .rank = 0, .default_values = &name_default, .default_count = 1},
        {.name = "x", .dtype = SL_DTYPE_FLOAT32, .rank = 1, .shape = {4}, .default_values = &x_default,
         .default_count = 1},
        {.name = "tokens", .dtype = SL_DTYPE_INT64, .varlen = true},
        {.name = "image/encoded", .dtype = SL_DTYPE_BYTES, .varlen = true},
        {.name = "pair", .dtype = SL_DTYPE_BYTES, .rank = 1, .shape = {2}, .default_values = &pair_default,
         .default_count = 1},
    };
    static const size_t max[2] = {256, 64 << 10};
    char err[256];
    for (int i = 0; i < 2; i++)
        CHECK(sl_example_decoder_new(f, NF, max[i], &decoders[i], err, sizeof err) == 0);
}

static const char *const names[NF] = {"id", "label", "name", "x", "tokens", "image/encoded", "pair"};
static const uint64_t fixed_count[NF] = {1, 1, 1, 4, 0, 0, 2}; /* 0: varlen */

/* ---- a small protobuf writer for the round trip ---- */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} buf_t;

static void put(buf_t *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        CHECK(b->p != NULL);
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void varint(buf_t *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;
    do {
        t[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            t[n] |= 0x80;
        n++;
    } while (v);
    put(b, t, n);
}

static void field_len(buf_t *b, unsigned field, const void *p, size_t n)
{
    varint(b, (uint64_t)field << 3 | 2);
    varint(b, n);
    put(b, p, n);
}

/* Feature { int64_list = 3 | float_list = 2 | bytes_list = 1 { value = 1 } } */
static void encode_feature(buf_t *out, const sl_example_value_t *v)
{
    buf_t list = {0}, feat = {0};
    if (v->dtype == SL_DTYPE_INT64) {
        buf_t packed = {0};
        for (uint64_t i = 0; i < v->count; i++)
            varint(&packed, sl_get_le64(v->data + 8 * i));
        field_len(&list, 1, packed.p, packed.len);
        free(packed.p);
        field_len(&feat, 3, list.p, list.len);
    } else if (v->dtype == SL_DTYPE_FLOAT32) {
        field_len(&list, 1, v->data, v->count * 4);
        field_len(&feat, 2, list.p, list.len);
    } else {
        const uint8_t *vals = v->data + (v->count + 1) * 8;
        for (uint64_t i = 0; i < v->count; i++) {
            uint64_t a = sl_get_le64(v->data + 8 * i), z = sl_get_le64(v->data + 8 * (i + 1));
            field_len(&list, 1, vals + a, z - a);
        }
        field_len(&feat, 1, list.p, list.len);
    }
    put(out, feat.p, feat.len);
    free(list.p);
    free(feat.p);
}

/* An Example holding the values that were not defaults (nor empty). */
static buf_t encode_example(const sl_example_value_t *v)
{
    buf_t features = {0};
    for (int i = 0; i < NF; i++) {
        /* A varlen feature without values reads as one that is absent. */
        if (v[i].is_default || (fixed_count[i] == 0 && v[i].count == 0))
            continue;
        buf_t entry = {0}, feat = {0};
        field_len(&entry, 1, names[i], strlen(names[i]));
        encode_feature(&feat, &v[i]);
        field_len(&entry, 2, feat.p, feat.len);
        field_len(&features, 1, entry.p, entry.len);
        free(entry.p);
        free(feat.p);
    }
    buf_t ex = {0};
    field_len(&ex, 1, features.p, features.len);
    free(features.p);
    return ex;
}

/* ---- checks ---- */

typedef struct {
    sl_example_value_t v;
    uint8_t *copy;
} saved_t;

static void save(saved_t *s, const sl_example_value_t *v)
{
    for (int i = 0; i < NF; i++) {
        s[i].v = v[i];
        s[i].copy = malloc(v[i].size ? v[i].size : 1);
        CHECK(s[i].copy != NULL);
        memcpy(s[i].copy, v[i].data, v[i].size);
    }
}

static void same(const saved_t *s, const sl_example_value_t *v, bool defaults_too)
{
    for (int i = 0; i < NF; i++) {
        CHECK(v[i].dtype == s[i].v.dtype && v[i].count == s[i].v.count && v[i].size == s[i].v.size);
        CHECK(memcmp(v[i].data, s[i].copy, v[i].size) == 0);
        if (defaults_too)
            CHECK(v[i].is_default == s[i].v.is_default);
    }
}

static void unsave(saved_t *s)
{
    for (int i = 0; i < NF; i++)
        free(s[i].copy);
}

static void check_values(const sl_example_value_t *v, size_t max_bytes)
{
    size_t total = 0;
    for (int i = 0; i < NF; i++) {
        CHECK(v[i].data != NULL);
        if (fixed_count[i])
            CHECK(v[i].count == fixed_count[i]);
        if (v[i].dtype == SL_DTYPE_INT64) {
            CHECK(v[i].size == v[i].count * 8);
        } else if (v[i].dtype == SL_DTYPE_FLOAT32) {
            CHECK(v[i].size == v[i].count * 4);
        } else {
            CHECK(v[i].dtype == SL_DTYPE_BYTES);
            CHECK(v[i].size >= (v[i].count + 1) * 8);
            uint64_t prev = 0;
            for (uint64_t k = 0; k <= v[i].count; k++) {
                uint64_t o = sl_get_le64(v[i].data + 8 * k);
                CHECK(k > 0 || o == 0);
                CHECK(o >= prev);
                prev = o;
            }
            CHECK(prev == v[i].size - (v[i].count + 1) * 8);
        }
        /* Defaults, and the single offset of a bytes feature without
         * values, are not the record's: the decoder holds them anyway. */
        if (!v[i].is_default && !(v[i].dtype == SL_DTYPE_BYTES && v[i].count == 0))
            total += v[i].size;
    }
    if (total > max_bytes)
        for (int i = 0; i < NF; i++)
            fprintf(stderr, "fuzz_example: %s: %llu values, %zu bytes%s\n", names[i], (unsigned long long)v[i].count,
                    v[i].size, v[i].is_default ? " (default)" : "");
    CHECK(total <= max_bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!decoders[0])
        make_decoders();
    if (size < 1)
        return 0;
    int which = data[0] & 1;
    size_t max_bytes = which ? 64 << 10 : 256;
    sl_example_decoder_t *dec = decoders[which];
    const uint8_t *rec = data + 1;
    size_t len = size - 1;

    sl_example_value_t out[NF];
    char err[512];
    int rc = sl_example_decode(dec, rec, len, out, err, sizeof err);
    CHECK(rc == 0 || rc == SL_EDATA || rc == SL_ETOOBIG || rc == -ENOMEM);
    if (rc < 0) {
        CHECK(err[0] != '\0');
        /* The same failure again: nothing of the first call is left over. */
        char err2[512];
        CHECK(sl_example_decode(dec, rec, len, out, err2, sizeof err2) == rc);
        CHECK(strcmp(err, err2) == 0);
        return 0;
    }
    CHECK(err[0] == '\0');
    check_values(out, max_bytes);
    saved_t first[NF];
    save(first, out);

    /* Decoded again into the buffers of the first decode. */
    CHECK(sl_example_decode(dec, rec, len, out, err, sizeof err) == 0);
    same(first, out, true);

    /* Written as an Example of its own and read back. */
    buf_t ex = encode_example(out);
    rc = sl_example_decode(dec, ex.p, ex.len, out, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "fuzz_example: the re-encoded record failed: %s\n", err);
    CHECK(rc == 0);
    same(first, out, true);
    free(ex.p);
    unsave(first);
    return 0;
}
