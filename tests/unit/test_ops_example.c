/*
 * test_ops_example.c: parse_example (pipeline/ops_example.c) and what batch
 * and padded_batch (pipeline/ops_batch.c) make of its components: bytes
 * batches with rebased offsets, varlen features as ragged batches, padding.
 * Records come from the fixtures of tests/data/tfrecord.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline_util.h"

static sl_confine_t *roots;

static void setup(void)
{
    roots = roots_at(FIXTURES);
}

static void teardown(void)
{
    sl_confine_destroy(roots);
}

TestSuite(parse_example, .init = setup, .fini = teardown);

#define VARLEN_SRC "{\"type\":\"tfrecord\",\"files\":[\"" FIXTURES "/varlen-00000-of-00001.tfrecord\"]}"
#define BASIC_SRC "{\"type\":\"tfrecord\",\"files\":[\"" FIXTURES "/basic-00000-of-00004.tfrecord\"]}"
#define TOKENS "{\"op\":\"parse_example\",\"features\":{\"id\":{\"dtype\":\"int64\"},\"tokens\":{\"dtype\":\"int64\",\"varlen\":true}}}"

static json_t *token_lengths(json_t **m)
{
    *m = manifest_load();
    json_t *l = json_object_get(manifest_file(*m, "varlen-00000-of-00001.tfrecord"), "token_lengths");
    cr_assert_eq(json_array_size(l), 100);
    return l;
}

Test(parse_example, varlen_tokens_make_ragged_batches)
{
    json_t *m, *lengths = token_lengths(&m);
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec("{\"source\":" VARLEN_SRC ",\"ops\":[" TOKENS ",{\"op\":\"batch\",\"batch_size\":8}]}", &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 13);
    int64_t id = 0;
    for (size_t k = 0; k < bs.n; k++) {
        const sl_wire_batch_t *b = bs.b[k];
        const sl_component_t *ids = comp_of(b, "id"), *t = comp_of(b, "tokens");
        uint64_t rows = b->num_elements;
        cr_assert_eq(rows, k < 12 ? 8u : 4u);
        cr_assert(t->ragged);
        cr_assert_eq(t->rank, 2);
        cr_assert_eq(t->shape[0], (int64_t)rows);
        cr_assert_eq(t->shape[1], -1);
        cr_assert_eq(t->dtype, SL_DTYPE_INT64);
        cr_assert_not(ids->ragged);
        for (uint64_t r = 0; r < rows; r++, id++) {
            cr_assert_eq(i64_at(b, ids, r), id);
            int64_t lo = split_at(b, t, r), hi = split_at(b, t, r + 1);
            cr_assert_eq(hi - lo, json_integer_value(json_array_get(lengths, (size_t)id)), "record %" PRId64, id);
            for (int64_t j = lo; j < hi; j++)
                cr_assert_eq(i64_at(b, t, (uint64_t)j), id * 100 + (j - lo));
        }
    }
    cr_assert_eq(id, 100);
    batches_free(&bs);

    /* Unbatched, a varlen feature is a vector of its record's length. */
    bs = run_spec("{\"source\":" VARLEN_SRC ",\"ops\":[" TOKENS ",{\"op\":\"take\",\"count\":3}]}", &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    for (size_t k = 0; k < 3; k++) {
        const sl_component_t *t = comp_of(bs.b[k], "tokens");
        cr_assert_not(t->ragged);
        cr_assert_eq(t->rank, 1);
        cr_assert_eq(t->shape[0], json_integer_value(json_array_get(lengths, k)));
    }
    batches_free(&bs);
    json_decref(m);
}

Test(parse_example, ragged_bytes_and_a_second_batch_is_refused)
{
    /* "name" holds one string per record; as varlen it is a ragged batch of
     * strings, one per row. */
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"parse_example\",\"features\":{"
                            "\"name\":{\"dtype\":\"bytes\",\"varlen\":true}}},{\"op\":\"skip\",\"count\":10},"
                            "{\"op\":\"batch\",\"batch_size\":3}]}",
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 80);
    const sl_wire_batch_t *b = bs.b[0];
    const sl_component_t *c = comp_of(b, "name");
    cr_assert(c->ragged);
    cr_assert_eq(c->dtype, SL_DTYPE_BYTES);
    for (uint64_t r = 0; r < 3; r++) {
        cr_assert_eq(split_at(b, c, r), (int64_t)r);
        size_t len;
        const uint8_t *p = str_at(b, c, r, &len);
        char want[16];
        snprintf(want, sizeof want, "rec-%05" PRIu64, 10 + r);
        cr_assert(len == strlen(want) && memcmp(p, want, len) == 0);
    }
    batches_free(&bs);

    bs = run_spec("{\"source\":" VARLEN_SRC ",\"ops\":[" TOKENS ",{\"op\":\"batch\",\"batch_size\":4},"
                  "{\"op\":\"batch\",\"batch_size\":2}]}",
                  &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_str_eq(bs.errmsg,
                     "ops[2] (batch): component \"tokens\" is already a ragged batch; it cannot be batched again");
    batches_free(&bs);
}

Test(parse_example, bytes_batches_rebase_offsets)
{
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"parse_example\",\"key\":\"record\","
                            "\"features\":{\"name\":{\"dtype\":\"bytes\"},\"pair\":{\"dtype\":\"bytes\",\"shape\":[2],"
                            "\"default\":[\"left\",\"\"]}}},{\"op\":\"batch\",\"batch_size\":100,"
                            "\"drop_remainder\":true}]}",
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 2, "250 records, the remainder dropped");
    for (size_t k = 0; k < bs.n; k++) {
        const sl_wire_batch_t *b = bs.b[k];
        const sl_component_t *name = comp_of(b, "name"), *pair = comp_of(b, "pair");
        cr_assert_eq(name->rank, 1);
        cr_assert_eq(pair->rank, 2);
        cr_assert_eq(pair->shape[1], 2);
        for (uint64_t i = 0; i < 100; i++) {
            size_t len;
            const uint8_t *p = str_at(b, name, i, &len);
            char want[16];
            snprintf(want, sizeof want, "rec-%05" PRIu64, k * 100 + i);
            cr_assert(len == 9 && memcmp(p, want, 9) == 0);
            p = str_at(b, pair, 2 * i, &len);
            cr_assert(len == 4 && memcmp(p, "left", 4) == 0, "the default fills a missing feature");
            str_at(b, pair, 2 * i + 1, &len);
            cr_assert_eq(len, 0);
        }
    }
    batches_free(&bs);
}

Test(parse_example, defaults_and_missing_features)
{
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"parse_example\",\"features\":{"
                            "\"id\":{\"dtype\":\"int64\"},\"w\":{\"dtype\":\"float32\",\"shape\":[2,2],\"default\":0.5},"
                            "\"k\":{\"dtype\":\"int64\",\"shape\":[3],\"default\":[1,2,3]}}},{\"op\":\"take\",\"count\":2},"
                            "{\"op\":\"batch\",\"batch_size\":2}]}",
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    const sl_wire_batch_t *b = bs.b[0];
    const sl_component_t *w = comp_of(b, "w"), *k = comp_of(b, "k");
    cr_assert_eq(w->rank, 3);
    cr_assert(w->shape[0] == 2 && w->shape[1] == 2 && w->shape[2] == 2);
    for (uint64_t i = 0; i < 8; i++)
        cr_assert_eq(f32_at(b, w, i), 0.5f);
    for (uint64_t i = 0; i < 6; i++)
        cr_assert_eq(i64_at(b, k, i), (int64_t)(i % 3) + 1);
    /* Components in name order: id, k, w. */
    cr_assert_str_eq(b->components[0].name, "id");
    cr_assert_str_eq(b->components[1].name, "k");
    cr_assert_str_eq(b->components[2].name, "w");
    batches_free(&bs);

    bs = run_spec("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"parse_example\",\"features\":{"
                  "\"id\":{\"dtype\":\"int64\"},\"nope\":{\"dtype\":\"int64\"}}}]}",
                  &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_eq(bs.n, 0);
    cr_assert_str_eq(bs.errmsg, "ops[0] (parse_example): feature \"nope\": required but missing");
    batches_free(&bs);

    bs = run_spec("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"parse_example\",\"features\":{"
                  "\"x\":{\"dtype\":\"float32\",\"shape\":[3]}}}]}",
                  &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_str_eq(bs.errmsg, "ops[0] (parse_example): feature \"x\": 4 values, shape [3] needs 3");
    batches_free(&bs);
}

Test(parse_example, refused_when_built)
{
    sl_pipeline_opts_t o = {.roots = roots};
    sl_pipeline_t *p;
    char err[1024];
    int rc = pipeline_try("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"parse_example\",\"key\":\"rec\","
                          "\"features\":{\"id\":{\"dtype\":\"int64\"}}}]}",
                          &o, &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[0] (parse_example): component \"rec\" is not in its input (record)");

    rc = pipeline_try("{\"source\":{\"type\":\"range\",\"stop\":3},\"ops\":[{\"op\":\"parse_example\","
                      "\"features\":{\"id\":{\"dtype\":\"int64\"}}}]}",
                      &o, &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[0] (parse_example): component \"value\" is int64; parse_example takes serialized "
                          "tf.train.Example records (bytes)");

    /* A batched record is not one record. */
    batches_t bs = run_spec("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"batch\",\"batch_size\":2},"
                            "{\"op\":\"parse_example\",\"features\":{\"id\":{\"dtype\":\"int64\"}}}]}",
                            &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_str_eq(bs.errmsg, "ops[1] (parse_example): component \"record\" has shape [2]; parse_example takes one "
                                "serialized record per element (put it before batch)");
    batches_free(&bs);
}

/* ---- padded_batch ---- */

Test(parse_example, padded_batch_pads_to_the_longest)
{
    json_t *m, *lengths = token_lengths(&m);
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec("{\"source\":" VARLEN_SRC ",\"ops\":[" TOKENS ",{\"op\":\"padded_batch\",\"batch_size\":8,"
                            "\"padding_values\":{\"tokens\":-1}}]}",
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 13);
    int64_t id = 0;
    for (size_t k = 0; k < bs.n; k++) {
        const sl_wire_batch_t *b = bs.b[k];
        const sl_component_t *t = comp_of(b, "tokens"), *ids = comp_of(b, "id");
        uint64_t rows = b->num_elements;
        int64_t longest = 0;
        for (uint64_t r = 0; r < rows; r++) {
            int64_t len = json_integer_value(json_array_get(lengths, (size_t)(id + (int64_t)r)));
            longest = len > longest ? len : longest;
        }
        cr_assert_not(t->ragged);
        cr_assert_eq(t->rank, 2);
        cr_assert_eq(t->shape[0], (int64_t)rows);
        cr_assert_eq(t->shape[1], longest, "batch %zu: width %" PRId64 ", want %" PRId64, k, t->shape[1], longest);
        cr_assert_eq(ids->rank, 1, "a scalar has nothing to pad");
        for (uint64_t r = 0; r < rows; r++, id++) {
            int64_t len = json_integer_value(json_array_get(lengths, (size_t)id));
            for (int64_t j = 0; j < longest; j++)
                cr_assert_eq(i64_at(b, t, r * (uint64_t)longest + (uint64_t)j), j < len ? id * 100 + j : -1);
        }
    }
    batches_free(&bs);

    /* A fixed padded shape. */
    bs = run_spec("{\"source\":" VARLEN_SRC ",\"ops\":[" TOKENS ",{\"op\":\"padded_batch\",\"batch_size\":50,"
                  "\"padded_shapes\":{\"tokens\":[24]}}]}",
                  &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 2);
    const sl_component_t *t = comp_of(bs.b[0], "tokens");
    cr_assert_eq(t->shape[1], 24);
    int64_t len0 = json_integer_value(json_array_get(lengths, 0));
    cr_assert_eq(i64_at(bs.b[0], t, (uint64_t)len0), 0, "padded with 0 by default");
    batches_free(&bs);

    /* Too small a padded shape. */
    bs = run_spec("{\"source\":" VARLEN_SRC ",\"ops\":[" TOKENS ",{\"op\":\"padded_batch\",\"batch_size\":4,"
                  "\"padded_shapes\":{\"tokens\":[12]}}]}",
                  &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_str_eq(bs.errmsg, "ops[1] (padded_batch): component \"tokens\" has shape [20] in element 3 of the batch, "
                                "larger than its padded shape [12]");
    batches_free(&bs);
    json_decref(m);
}

Test(parse_example, padded_batch_of_strings_and_images_of_two_sizes)
{
    sl_pipeline_opts_t o = {.roots = roots};
    /* Strings pad with "". */
    batches_t bs = run_spec("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"parse_example\",\"features\":{"
                            "\"name\":{\"dtype\":\"bytes\",\"varlen\":true}}},{\"op\":\"padded_batch\",\"batch_size\":2,"
                            "\"padded_shapes\":{\"name\":[3]}},{\"op\":\"take\",\"count\":1}]}",
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    const sl_component_t *c = comp_of(bs.b[0], "name");
    cr_assert_eq(c->rank, 2);
    cr_assert(c->shape[0] == 2 && c->shape[1] == 3);
    const char *want[] = {"rec-00000", "", "", "rec-00001", "", ""};
    for (uint64_t i = 0; i < 6; i++) {
        size_t len;
        const uint8_t *p = str_at(bs.b[0], c, i, &len);
        cr_assert(len == strlen(want[i]) && memcmp(p, want[i], len) == 0, "string %" PRIu64, i);
    }
    batches_free(&bs);

    /* Two dimensions padded at once: decoded images of different sizes. */
    bs = run_spec("{\"source\":{\"type\":\"tfrecord\",\"files\":\"" FIXTURES "/images-00000-of-00002.tfrecord\"},"
                  "\"ops\":[{\"op\":\"parse_example\",\"features\":{\"image/encoded\":{\"dtype\":\"bytes\"}}},"
                  "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"},{\"op\":\"take\",\"count\":3},"
                  "{\"op\":\"padded_batch\",\"batch_size\":3,\"padding_values\":{\"image/encoded\":7}}]}",
                  &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    c = comp_of(bs.b[0], "image/encoded");
    cr_assert_eq(c->dtype, SL_DTYPE_UINT8);
    /* The first three images are 51x81, 44x108 and 43x44. */
    cr_assert(c->rank == 4 && c->shape[0] == 3 && c->shape[1] == 51 && c->shape[2] == 108 && c->shape[3] == 3,
              "shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]", c->shape[0], c->shape[1], c->shape[2],
              c->shape[3]);
    const uint8_t *px = bs.b[0]->data + c->offset;
    size_t row = 108 * 3, img = 51 * row;
    cr_assert_eq(px[0 * img + 50 * row + 81 * 3], 7, "right of image 0");
    cr_assert_eq(px[1 * img + 44 * row], 7, "below image 1");
    cr_assert_eq(px[2 * img + 43 * row + 44 * 3 - 1], 7, "right of image 2's last row");
    batches_free(&bs);

    sl_pipeline_t *p;
    char err[1024];
    int rc = pipeline_try("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"parse_example\",\"features\":{"
                          "\"id\":{\"dtype\":\"int64\"}}},{\"op\":\"padded_batch\",\"batch_size\":2,"
                          "\"padded_shapes\":{\"ids\":[]}}]}",
                          &o, &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[1] (padded_batch): padded_shapes names \"ids\", which is not in its input (id)");
    rc = pipeline_try("{\"source\":" BASIC_SRC ",\"ops\":[{\"op\":\"parse_example\",\"features\":{"
                      "\"id\":{\"dtype\":\"int64\"}}},{\"op\":\"padded_batch\",\"batch_size\":2,"
                      "\"padding_values\":{\"id\":0.5}}]}",
                      &o, &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[1] (padded_batch): padding_values: component \"id\" is of dtype int64, which takes an "
                          "integer padding value, not 0.5");
    rc = pipeline_try("{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[{\"op\":\"cast\",\"key\":\"value\","
                      "\"dtype\":\"uint8\"},{\"op\":\"padded_batch\",\"batch_size\":2,\"padding_values\":{\"value\":256}}]}",
                      &o, &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[1] (padded_batch): padding_values: component \"value\" is of dtype uint8, which cannot "
                          "hold the padding value 256");
}

Test(parse_example, padded_batch_of_scalars_is_batch)
{
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t a = run_spec("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"padded_batch\","
                           "\"batch_size\":4}]}",
                           &o);
    batches_t b = run_spec("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":4}]}",
                           &o);
    cr_assert_eq(a.rc, 1);
    cr_assert_eq(a.n, b.n);
    for (size_t k = 0; k < a.n; k++) {
        cr_assert_eq(a.b[k]->size, b.b[k]->size);
        cr_assert_eq(memcmp(a.b[k]->data, b.b[k]->data, a.b[k]->size), 0);
    }
    batches_free(&a);
    batches_free(&b);
}
