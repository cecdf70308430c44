/*
 * test_spec.c: the dataset spec parser (spec/spec.c): valid specs,
 * canonical form and fingerprint, and every refusal with its JSON path.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec.h"

static sl_spec_t *parse_ok(const char *json)
{
    sl_spec_t *spec = NULL;
    char err[256] = "";
    int rc = sl_spec_parse(json, strlen(json), &spec, err, sizeof err);
    cr_assert_eq(rc, 0, "parse of %s failed: %d %s", json, rc, err);
    cr_assert_not_null(spec);
    return spec;
}

static void expect_error(const char *json, const char *want)
{
    sl_spec_t *spec = (sl_spec_t *)1;
    char err[512] = "";
    int rc = sl_spec_parse(json, strlen(json), &spec, err, sizeof err);
    cr_assert_eq(rc, SL_ESPEC, "%s: want SL_ESPEC, got %d (%s)", json, rc, err);
    cr_assert_null(spec, "%s: out must be NULL on failure", json);
    cr_assert_str_eq(err, want, "%s:\n  got  %s\n  want %s", json, err, want);
}

static void expect_error_prefix(const char *json, const char *prefix)
{
    sl_spec_t *spec = NULL;
    char err[512] = "";
    int rc = sl_spec_parse(json, strlen(json), &spec, err, sizeof err);
    cr_assert_eq(rc, SL_ESPEC, "%s: want SL_ESPEC, got %d (%s)", json, rc, err);
    cr_assert_null(spec);
    cr_assert(strncmp(err, prefix, strlen(prefix)) == 0, "%s:\n  got  %s\n  want %s...", json, err, prefix);
}

static char *fingerprint_of(const char *json)
{
    sl_spec_t *spec = parse_ok(json);
    char *fp = strdup(sl_spec_fingerprint(spec));
    sl_spec_free(spec);
    return fp;
}

Test(spec, minimal_range_defaults)
{
    sl_spec_t *spec = parse_ok("{\"source\": {\"type\": \"range\", \"stop\": 10}}");
    cr_assert_str_eq(
        sl_spec_canonical(spec),
        "{\"ops\":[],\"source\":{\"name\":\"value\",\"start\":0,\"step\":1,\"stop\":10,\"type\":\"range\"}}");
    const sl_spec_source_t *src = sl_spec_source(spec);
    cr_assert_eq(src->kind, SL_SOURCE_RANGE);
    cr_assert_str_eq(src->name, "value");
    cr_assert_eq(src->u.range.start, 0);
    cr_assert_eq(src->u.range.stop, 10);
    cr_assert_eq(src->u.range.step, 1);
    cr_assert_eq(sl_spec_source_cardinality(spec), 10);
    cr_assert_eq(sl_spec_num_ops(spec), 0);
    cr_assert_null(sl_spec_op(spec, 0));
    cr_assert_str_eq(sl_spec_source_name(src->kind), "range");
    sl_spec_free(spec);
}

Test(spec, every_op_parsed_with_defaults)
{
    sl_spec_t *spec = parse_ok("{\"source\": {\"type\": \"range\", \"start\": 5, \"stop\": -5, \"step\": -3, "
                               "\"name\": \"idx\"},"
                               " \"ops\": [{\"op\": \"shuffle\", \"buffer_size\": 100},"
                               "          {\"op\": \"shuffle\", \"buffer_size\": 7, \"seed\": 42,"
                               "           \"reshuffle_each_iteration\": false},"
                               "          {\"op\": \"batch\", \"batch_size\": 3},"
                               "          {\"op\": \"take\", \"count\": -1},"
                               "          {\"op\": \"skip\", \"count\": 2},"
                               "          {\"op\": \"repeat\"},"
                               "          {\"op\": \"repeat\", \"count\": 4},"
                               "          {\"op\": \"batch\", \"batch_size\": 2, \"drop_remainder\": true}]}");
    cr_assert_str_eq(sl_spec_source(spec)->name, "idx");
    cr_assert_eq(sl_spec_source_cardinality(spec), 4); /* 5, 2, -1, -4 */
    cr_assert_eq(sl_spec_num_ops(spec), 8);

    const sl_spec_op_t *op = sl_spec_op(spec, 0);
    cr_assert_eq(op->kind, SL_OP_SHUFFLE);
    cr_assert_eq(op->u.shuffle.buffer_size, 100);
    cr_assert_not(op->u.shuffle.has_seed);
    cr_assert(op->u.shuffle.reshuffle_each_iteration);
    op = sl_spec_op(spec, 1);
    cr_assert(op->u.shuffle.has_seed);
    cr_assert_eq(op->u.shuffle.seed, 42);
    cr_assert_not(op->u.shuffle.reshuffle_each_iteration);
    op = sl_spec_op(spec, 2);
    cr_assert_eq(op->kind, SL_OP_BATCH);
    cr_assert_eq(op->u.batch.batch_size, 3);
    cr_assert_not(op->u.batch.drop_remainder);
    cr_assert_eq(sl_spec_op(spec, 3)->kind, SL_OP_TAKE);
    cr_assert_eq(sl_spec_op(spec, 3)->u.take.count, -1);
    cr_assert_eq(sl_spec_op(spec, 4)->kind, SL_OP_SKIP);
    cr_assert_eq(sl_spec_op(spec, 4)->u.skip.count, 2);
    cr_assert_eq(sl_spec_op(spec, 5)->kind, SL_OP_REPEAT);
    cr_assert_eq(sl_spec_op(spec, 5)->u.repeat.count, -1);
    cr_assert_eq(sl_spec_op(spec, 6)->u.repeat.count, 4);
    cr_assert(sl_spec_op(spec, 7)->u.batch.drop_remainder);
    cr_assert_null(sl_spec_op(spec, 8));
    cr_assert_null(sl_spec_op(spec, -1));
    cr_assert_str_eq(sl_spec_op_name(SL_OP_REPEAT), "repeat");
    cr_assert_str_eq(sl_spec_op_name((sl_op_kind_t)0), "invalid");

    cr_assert_str_eq(sl_spec_canonical(spec),
                     "{\"ops\":["
                     "{\"buffer_size\":100,\"op\":\"shuffle\",\"reshuffle_each_iteration\":true},"
                     "{\"buffer_size\":7,\"op\":\"shuffle\",\"reshuffle_each_iteration\":false,\"seed\":42},"
                     "{\"batch_size\":3,\"drop_remainder\":false,\"op\":\"batch\"},"
                     "{\"count\":-1,\"op\":\"take\"},"
                     "{\"count\":2,\"op\":\"skip\"},"
                     "{\"count\":-1,\"op\":\"repeat\"},"
                     "{\"count\":4,\"op\":\"repeat\"},"
                     "{\"batch_size\":2,\"drop_remainder\":true,\"op\":\"batch\"}],"
                     "\"source\":{\"name\":\"idx\",\"start\":5,\"step\":-3,\"stop\":-5,\"type\":\"range\"}}");
    sl_spec_free(spec);
}

Test(spec, canonical_parses_to_itself)
{
    const char *json = "{ \"ops\" : [ {\"seed\": 3, \"op\": \"shuffle\", \"buffer_size\": 9},"
                       " {\"op\": \"batch\", \"batch_size\": 8}, {\"op\":\"repeat\",\"count\":2} ],"
                       "  \"source\" : {\"stop\": 100, \"type\": \"range\"} }";
    sl_spec_t *a = parse_ok(json);
    sl_spec_t *b = parse_ok(sl_spec_canonical(a));
    cr_assert_str_eq(sl_spec_canonical(a), sl_spec_canonical(b));
    cr_assert_str_eq(sl_spec_fingerprint(a), sl_spec_fingerprint(b));
    sl_spec_free(a);
    sl_spec_free(b);
}

Test(spec, fingerprint_is_fnv1a_of_canonical)
{
    sl_spec_t *spec = parse_ok("{\"source\": {\"type\": \"range\", \"stop\": 3}}");
    const char *canon = sl_spec_canonical(spec);
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (const char *p = canon; *p; p++) {
        h ^= (unsigned char)*p;
        h *= UINT64_C(0x100000001b3);
    }
    char want[17];
    snprintf(want, sizeof want, "%016" PRIx64, h);
    cr_assert_str_eq(sl_spec_fingerprint(spec), want);
    cr_assert_eq(strlen(sl_spec_fingerprint(spec)), 16);
    for (const char *p = sl_spec_fingerprint(spec); *p; p++)
        cr_assert((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'));
    sl_spec_free(spec);
}

Test(spec, key_order_whitespace_and_defaults_do_not_change_fingerprint)
{
    const char *same[] = {
        "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":2}]}",
        "{\"ops\":[{\"batch_size\":2,\"op\":\"batch\"}],\"source\":{\"stop\":10,\"type\":\"range\"}}",
        "\n{ \"source\" :\t{ \"stop\" : 10 , \"type\" : \"range\" } ,\r\n \"ops\" : [ { \"op\" : \"batch\" , "
        "\"batch_size\" : 2 } ] }\n",
        "{\"source\":{\"type\":\"range\",\"start\":0,\"stop\":10,\"step\":1,\"name\":\"value\"},"
        "\"ops\":[{\"op\":\"batch\",\"batch_size\":2,\"drop_remainder\":false}]}",
    };
    char *fp0 = fingerprint_of(same[0]);
    for (size_t i = 1; i < sizeof same / sizeof same[0]; i++) {
        char *fp = fingerprint_of(same[i]);
        cr_assert_str_eq(fp, fp0, "spec %zu", i);
        free(fp);
    }
    free(fp0);
}

Test(spec, differing_values_change_fingerprint)
{
    const char *specs[] = {
        "{\"source\":{\"type\":\"range\",\"stop\":10}}",
        "{\"source\":{\"type\":\"range\",\"stop\":11}}",
        "{\"source\":{\"type\":\"range\",\"stop\":10,\"name\":\"x\"}}",
        "{\"source\":{\"type\":\"range\",\"stop\":10,\"step\":2}}",
        "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":2}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":3}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":2,"
        "\"drop_remainder\":true}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":4}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":4,\"seed\":0}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"take\",\"count\":1},"
        "{\"op\":\"skip\",\"count\":1}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"skip\",\"count\":1},"
        "{\"op\":\"take\",\"count\":1}]}",
    };
    size_t n = sizeof specs / sizeof specs[0];
    char *fps[sizeof specs / sizeof specs[0]];
    for (size_t i = 0; i < n; i++)
        fps[i] = fingerprint_of(specs[i]);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = i + 1; j < n; j++)
            cr_assert_str_neq(fps[i], fps[j], "specs %zu and %zu", i, j);
    }
    for (size_t i = 0; i < n; i++)
        free(fps[i]);
}

Test(spec, cardinality_of_ranges)
{
    struct {
        const char *json;
        int64_t want;
    } cases[] = {
        {"{\"source\":{\"type\":\"range\",\"stop\":0}}", 0},
        {"{\"source\":{\"type\":\"range\",\"start\":5,\"stop\":1}}", 0},
        {"{\"source\":{\"type\":\"range\",\"start\":1,\"stop\":5,\"step\":-1}}", 0},
        {"{\"source\":{\"type\":\"range\",\"start\":0,\"stop\":10,\"step\":3}}", 4},
        {"{\"source\":{\"type\":\"range\",\"start\":10,\"stop\":0,\"step\":-5}}", 2},
        {"{\"source\":{\"type\":\"range\",\"start\":-9223372036854775808,\"stop\":9223372036854775807,"
         "\"step\":9223372036854775807}}",
         3},
        {"{\"source\":{\"type\":\"range\",\"start\":0,\"stop\":4611686018427387904}}", INT64_C(1) << 62},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sl_spec_t *spec = parse_ok(cases[i].json);
        cr_assert_eq(sl_spec_source_cardinality(spec), cases[i].want, "%s: got %" PRId64, cases[i].json,
                     sl_spec_source_cardinality(spec));
        sl_spec_free(spec);
    }
}

Test(spec, bounds_accepted_at_their_limits)
{
    sl_spec_t *spec = parse_ok("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":["
                               "{\"op\":\"batch\",\"batch_size\":1048576},"
                               "{\"op\":\"shuffle\",\"buffer_size\":16777216,\"seed\":9223372036854775807},"
                               "{\"op\":\"take\",\"count\":4611686018427387904},"
                               "{\"op\":\"skip\",\"count\":-1},"
                               "{\"op\":\"repeat\",\"count\":0},"
                               "{\"op\":\"batch\",\"batch_size\":1}]}");
    cr_assert_eq(sl_spec_num_ops(spec), 6);
    cr_assert_eq(sl_spec_op(spec, 1)->u.shuffle.seed, INT64_MAX);
    sl_spec_free(spec);

    char name[SL_MAX_NAME];
    memset(name, 'a', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    char json[256];
    snprintf(json, sizeof json, "{\"source\":{\"type\":\"range\",\"stop\":1,\"name\":\"%s\"}}", name);
    spec = parse_ok(json);
    cr_assert_str_eq(sl_spec_source(spec)->name, name);
    sl_spec_free(spec);
    spec = parse_ok("{\"source\":{\"type\":\"range\",\"stop\":1,\"name\":\"image/encoded-v1.0_x\"}}");
    cr_assert_str_eq(sl_spec_source(spec)->name, "image/encoded-v1.0_x");
    sl_spec_free(spec);
}

Test(spec, top_level_errors)
{
    expect_error("[]", "$: must be an object, got an array");
    expect_error("5", "$: must be an object, got 5");
    expect_error("\"x\"", "$: must be an object, got \"x\"");
    expect_error("{}", "$.source: required field missing");
    expect_error_prefix("{\"source\":{\"type\":\"range\",\"stop\":1},\"bogus\":1}", "$.bogus: unknown field");
    expect_error("{\"source\":[]}", "$.source: must be an object, got an array");
    expect_error("{\"source\":\"range\"}", "$.source: must be an object, got \"range\"");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":{}}", "$.ops: must be an array, got an object");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":null}", "$.ops: must be an array, got null");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":[{\"op\":\"take\",\"count\":1},7]}",
                 "$.ops[1]: must be an object, got 7");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":[[]]}",
                 "$.ops[0]: must be an object, got an array");
}

Test(spec, source_errors)
{
    expect_error("{\"source\":{}}", "$.source.type: required field missing");
    expect_error("{\"source\":{\"type\":3}}", "$.source.type: must be a string, got 3");
    expect_error("{\"source\":{\"type\":\"foo\"}}", "$.source.type: unknown source \"foo\"");
    expect_error("{\"source\":{\"type\":\"range\"}}", "$.source.stop: required field missing");
    expect_error_prefix("{\"source\":{\"type\":\"range\",\"stop\":1,\"bogus\":2}}", "$.source.bogus: unknown field");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":\"10\"}}", "$.source.stop: must be an integer, got \"10\"");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1.5}}", "$.source.stop: must be an integer, got 1.5");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":10,\"start\":null}}",
                 "$.source.start: must be an integer, got null");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":10,\"step\":0}}",
                 "$.source.step: must be a nonzero integer, got 0");
    expect_error("{\"source\":{\"type\":\"range\",\"start\":-1,\"stop\":4611686018427387904}}",
                 "$.source.stop: the range yields 4611686018427387905 elements, at most 4611686018427387904 (2^62) "
                 "allowed");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":10,\"name\":\"\"}}",
                 "$.source.name: must be a string of 1 to 63 characters from [A-Za-z0-9_./-], got \"\"");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":10,\"name\":\"a b\"}}",
                 "$.source.name: must be a string of 1 to 63 characters from [A-Za-z0-9_./-], got \"a b\"");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":10,\"name\":7}}",
                 "$.source.name: must be a string of 1 to 63 characters from [A-Za-z0-9_./-], got 7");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":10,"
                 "\"name\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}}",
                 "$.source.name: must be a string of 1 to 63 characters from [A-Za-z0-9_./-], got "
                 "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...\"");
}

Test(spec, op_errors)
{
#define SRC "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"take\",\"count\":1},"
    expect_error(SRC "{}]}", "$.ops[1].op: required field missing");
    expect_error(SRC "{\"op\":null}]}", "$.ops[1].op: must be a string, got null");
    expect_error(SRC "{\"op\":\"bogus\"}]}", "$.ops[1].op: unknown op \"bogus\"");
    expect_error(SRC "{\"op\":\"batch\"}]}", "$.ops[1].batch_size: required field missing");
    expect_error(SRC "{\"op\":\"batch\",\"batch_size\":\"x\"}]}",
                 "$.ops[1].batch_size: must be an integer >= 1, got \"x\"");
    expect_error(SRC "{\"op\":\"batch\",\"batch_size\":0}]}", "$.ops[1].batch_size: must be an integer >= 1, got 0");
    expect_error(SRC "{\"op\":\"batch\",\"batch_size\":1048577}]}",
                 "$.ops[1].batch_size: must be an integer <= 1048576, got 1048577");
    expect_error(SRC "{\"op\":\"batch\",\"batch_size\":4,\"drop_remainder\":1}]}",
                 "$.ops[1].drop_remainder: must be true or false, got 1");
    expect_error_prefix(SRC "{\"op\":\"batch\",\"batch_size\":4,\"bogus\":1}]}", "$.ops[1].bogus: unknown field");
    expect_error(SRC "{\"op\":\"shuffle\"}]}", "$.ops[1].buffer_size: required field missing");
    expect_error(SRC "{\"op\":\"shuffle\",\"buffer_size\":16777217}]}",
                 "$.ops[1].buffer_size: must be an integer <= 16777216, got 16777217");
    expect_error(SRC "{\"op\":\"shuffle\",\"buffer_size\":-3}]}",
                 "$.ops[1].buffer_size: must be an integer >= 1, got -3");
    expect_error(SRC "{\"op\":\"shuffle\",\"buffer_size\":3,\"seed\":-1}]}",
                 "$.ops[1].seed: must be an integer >= 0, got -1");
    expect_error(SRC "{\"op\":\"shuffle\",\"buffer_size\":3,\"seed\":null}]}",
                 "$.ops[1].seed: must be an integer >= 0, got null");
    expect_error(SRC "{\"op\":\"shuffle\",\"buffer_size\":3,\"reshuffle_each_iteration\":\"yes\"}]}",
                 "$.ops[1].reshuffle_each_iteration: must be true or false, got \"yes\"");
    expect_error(SRC "{\"op\":\"take\"}]}", "$.ops[1].count: required field missing");
    expect_error(SRC "{\"op\":\"take\",\"count\":-2}]}", "$.ops[1].count: must be an integer >= -1, got -2");
    expect_error(SRC "{\"op\":\"take\",\"count\":4611686018427387905}]}",
                 "$.ops[1].count: must be an integer <= 4611686018427387904, got 4611686018427387905");
    expect_error(SRC "{\"op\":\"skip\"}]}", "$.ops[1].count: required field missing");
    expect_error(SRC "{\"op\":\"skip\",\"count\":true}]}", "$.ops[1].count: must be an integer >= -1, got true");
    expect_error(SRC "{\"op\":\"repeat\",\"count\":-2}]}", "$.ops[1].count: must be an integer >= -1, got -2");
    expect_error_prefix(SRC "{\"op\":\"repeat\",\"times\":2}]}", "$.ops[1].times: unknown field");
    expect_error_prefix(SRC "{\"op\":\"take\",\"count\":1,\"op2\":1}]}", "$.ops[1].op2: unknown field");
#undef SRC
}

Test(spec, too_many_ops)
{
    size_t cap = 64 + 40 * (SL_SPEC_MAX_OPS + 1);
    char *json = malloc(cap);
    size_t o = (size_t)snprintf(json, cap, "{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":[");
    for (int i = 0; i <= SL_SPEC_MAX_OPS; i++)
        o += (size_t)snprintf(json + o, cap - o, "%s{\"op\":\"take\",\"count\":1}", i ? "," : "");
    snprintf(json + o, cap - o, "]}");
    expect_error(json, "$.ops: at most 64 ops allowed, got 65");

    /* Exactly the limit is fine. */
    char *last = strrchr(json, '{');
    strcpy(last - 1, "]}");
    sl_spec_t *spec = parse_ok(json);
    cr_assert_eq(sl_spec_num_ops(spec), SL_SPEC_MAX_OPS);
    sl_spec_free(spec);
    free(json);
}

Test(spec, too_big)
{
    size_t len = SL_SPEC_MAX_BYTES + 1;
    char *json = malloc(len + 1);
    const char *head = "{\"source\":{\"type\":\"range\",\"stop\":1}";
    memset(json, ' ', len);
    memcpy(json, head, strlen(head));
    json[len - 1] = '}';
    json[len] = '\0';
    expect_error(json, "$: the spec is 1048577 bytes, at most 1048576 allowed");
    /* One byte less is accepted: the limit is on bytes, not content. */
    json[len - 1] = ' ';
    json[len - 2] = '}';
    sl_spec_t *spec = NULL;
    char err[256];
    cr_assert_eq(sl_spec_parse(json, len - 1, &spec, err, sizeof err), 0, "%s", err);
    sl_spec_free(spec);
    free(json);
}

Test(spec, invalid_json)
{
    expect_error_prefix("", "$: invalid JSON at line ");
    expect_error_prefix("{", "$: invalid JSON at line 1, column ");
    expect_error_prefix("{\"source\": {\"type\": \"range\", \"stop\": 10}", "$: invalid JSON at line 1, column ");
    expect_error_prefix("{\"source\": {\"type\": \"ra", "$: invalid JSON at line 1, column ");
    expect_error_prefix("garbage", "$: invalid JSON at line 1, column ");
    expect_error_prefix("{\"source\": {\"type\": \"range\", \"stop\": 10}}}", "$: invalid JSON at line 1, column ");
    expect_error_prefix("\n\n{\"source\": 'x'}", "$: invalid JSON at line 3, column ");
    expect_error_prefix("{\"source\":{\"type\":\"range\",\"stop\":1,\"stop\":2}}", "$: invalid JSON at line 1");
    expect_error_prefix("{\"source\":{\"type\":\"range\",\"stop\":99999999999999999999}}", "$: invalid JSON at line 1");
    expect_error_prefix("\xff\xfe", "$: invalid JSON at line 1");

    /* Binary garbage with NUL bytes, given by length. */
    const char bin[] = {'{', '\0', '"', 's', '"', ':', '\x01', '}'};
    sl_spec_t *spec = NULL;
    char err[256] = "";
    cr_assert_eq(sl_spec_parse(bin, sizeof bin, &spec, err, sizeof err), SL_ESPEC);
    cr_assert_null(spec);
    cr_assert(strncmp(err, "$: invalid JSON", 15) == 0, "%s", err);
}

Test(spec, text_is_taken_by_length)
{
    /* The valid spec is followed by bytes that are not part of it. */
    const char *text = "{\"source\":{\"type\":\"range\",\"stop\":4}}GARBAGE";
    sl_spec_t *spec = NULL;
    char err[256] = "";
    cr_assert_eq(sl_spec_parse(text, strlen(text) - 7, &spec, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_spec_source_cardinality(spec), 4);
    sl_spec_free(spec);
}

Test(spec, strange_keys_and_values_are_escaped_in_messages)
{
    expect_error_prefix("{\"source\":{\"type\":\"range\",\"stop\":1,\"a\\\"b\\n\":1}}",
                 "$.source.a\\\"b\\u000a: unknown field");
    expect_error("{\"source\":{\"type\":\"r\\u00e9\\tx\"}}", "$.source.type: unknown source \"r\u00e9\\u0009x\"");
    /* jansson refuses NUL in strings, so no name can hide one. */
    expect_error_prefix("{\"source\":{\"type\":\"ran\\u0000ge\"}}", "$: invalid JSON at line 1");
}

Test(spec, small_error_buffer_is_cut_safely)
{
    sl_spec_t *spec = NULL;
    char err[8];
    memset(err, 'x', sizeof err);
    cr_assert_eq(sl_spec_parse("{}", 2, &spec, err, sizeof err), SL_ESPEC);
    cr_assert_str_eq(err, "$.sourc");
    cr_assert_eq(sl_spec_parse("{}", 2, &spec, NULL, 0), SL_ESPEC);
    cr_assert_null(spec);
}

/* ---- file sources ---- */

Test(spec, file_sources_with_defaults)
{
    sl_spec_t *spec = parse_ok("{\"source\":{\"type\":\"tfrecord\",\"files\":\"/data/train-*.tfrecord\"}}");
    cr_assert_str_eq(sl_spec_canonical(spec),
                     "{\"ops\":[],\"source\":{\"compression\":\"none\",\"files\":[\"/data/train-*.tfrecord\"],"
                     "\"name\":\"record\",\"on_corrupt\":\"fail\",\"type\":\"tfrecord\"}}");
    const sl_spec_source_t *src = sl_spec_source(spec);
    cr_assert_eq(src->kind, SL_SOURCE_TFRECORD);
    cr_assert_str_eq(src->name, "record");
    cr_assert_eq(src->u.files.compression, SL_COMPRESSION_NONE);
    cr_assert_eq(src->u.files.on_corrupt, SL_ON_CORRUPT_FAIL);
    cr_assert_eq(src->u.files.files.n, 1);
    cr_assert_eq(sl_spec_source_cardinality(spec), -1, "the dispatcher counts the records");
    cr_assert_eq(sl_spec_source_num_patterns(spec), 1);
    cr_assert_str_eq(sl_spec_source_pattern(spec, 0), "/data/train-*.tfrecord");
    cr_assert_null(sl_spec_source_pattern(spec, 1));
    cr_assert_str_eq(sl_spec_source_name(src->kind), "tfrecord");
    sl_spec_free(spec);

    spec = parse_ok("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"/a/x.gz\",\"/b/*.gz\"],\"compression\":\"gzip\","
                    "\"on_corrupt\":\"skip\",\"name\":\"rec\"}}");
    src = sl_spec_source(spec);
    cr_assert_eq(src->u.files.compression, SL_COMPRESSION_GZIP);
    cr_assert_eq(src->u.files.on_corrupt, SL_ON_CORRUPT_SKIP);
    cr_assert_eq(sl_spec_source_num_patterns(spec), 2);
    cr_assert_str_eq(sl_spec_source_pattern(spec, 1), "/b/*.gz");
    sl_spec_free(spec);

    spec = parse_ok("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/t/a.txt\"]}}");
    cr_assert_str_eq(sl_spec_canonical(spec), "{\"ops\":[],\"source\":{\"compression\":\"none\",\"files\":[\"/t/a.txt\"],"
                                              "\"name\":\"line\",\"type\":\"text_lines\"}}");
    sl_spec_free(spec);

    spec = parse_ok("{\"source\":{\"type\":\"fixed_length_records\",\"files\":\"/f/*.bin\",\"record_bytes\":3072,"
                    "\"header_bytes\":16}}");
    cr_assert_str_eq(sl_spec_canonical(spec),
                     "{\"ops\":[],\"source\":{\"files\":[\"/f/*.bin\"],\"footer_bytes\":0,\"header_bytes\":16,"
                     "\"name\":\"record\",\"record_bytes\":3072,\"type\":\"fixed_length_records\"}}");
    src = sl_spec_source(spec);
    cr_assert_eq(src->u.files.record_bytes, 3072);
    cr_assert_eq(src->u.files.header_bytes, 16);
    cr_assert_eq(src->u.files.footer_bytes, 0);
    sl_spec_free(spec);

    /* A string and a list of one string are one spec. */
    char *a = fingerprint_of("{\"source\":{\"type\":\"tfrecord\",\"files\":\"/d/x\"}}");
    char *b = fingerprint_of("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"/d/x\"],\"compression\":\"none\"}}");
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
}

Test(spec, file_source_errors)
{
    expect_error("{\"source\":{\"type\":\"tfrecord\"}}", "$.source.files: required field missing");
    expect_error("{\"source\":{\"type\":\"tfrecord\",\"files\":[]}}",
                 "$.source.files: must be a string or a list of 1 to 4096 strings, got a list of 0");
    expect_error("{\"source\":{\"type\":\"tfrecord\",\"files\":7}}",
                 "$.source.files: must be a string or a list of 1 to 4096 strings, got 7");
    expect_error("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"/a\",3]}}", "$.source.files[1]: must be a string, got 3");
    expect_error("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"/a\",\"data/*.tfrecord\"]}}",
                 "$.source.files[1]: must be an absolute path or glob pattern, got \"data/*.tfrecord\"");
    expect_error("{\"source\":{\"type\":\"tfrecord\",\"files\":\"\"}}",
                 "$.source.files: must be an absolute path or glob pattern, got \"\"");
    expect_error("{\"source\":{\"type\":\"tfrecord\",\"files\":\"/a\",\"compression\":\"zlib\"}}",
                 "$.source.compression: must be \"none\" or \"gzip\", got \"zlib\"");
    expect_error("{\"source\":{\"type\":\"tfrecord\",\"files\":\"/a\",\"compression\":null}}",
                 "$.source.compression: must be \"none\" or \"gzip\", got null");
    expect_error("{\"source\":{\"type\":\"tfrecord\",\"files\":\"/a\",\"on_corrupt\":\"ignore\"}}",
                 "$.source.on_corrupt: must be \"fail\" or \"skip\", got \"ignore\"");
    expect_error_prefix("{\"source\":{\"type\":\"text_lines\",\"files\":\"/a\",\"on_corrupt\":\"skip\"}}",
                 "$.source.on_corrupt: unknown field");
    expect_error("{\"source\":{\"type\":\"fixed_length_records\",\"files\":\"/a\"}}",
                 "$.source.record_bytes: required field missing");
    expect_error("{\"source\":{\"type\":\"fixed_length_records\",\"files\":\"/a\",\"record_bytes\":0}}",
                 "$.source.record_bytes: must be an integer >= 1, got 0");
    expect_error("{\"source\":{\"type\":\"fixed_length_records\",\"files\":\"/a\",\"record_bytes\":4,"
                 "\"footer_bytes\":-1}}",
                 "$.source.footer_bytes: must be an integer >= 0, got -1");
    expect_error_prefix("{\"source\":{\"type\":\"fixed_length_records\",\"files\":\"/a\",\"record_bytes\":4,"
                 "\"compression\":\"gzip\"}}",
                 "$.source.compression: unknown field");
    char *json = malloc(6000);
    char *p = json + sprintf(json, "{\"source\":{\"type\":\"tfrecord\",\"files\":\"/");
    memset(p, 'x', 4096);
    strcpy(p + 4096, "\"}}");
    expect_error(json, "$.source.files: must be shorter than 4096 bytes, got 4097");
    free(json);
}

/* ---- the ops of records and images ---- */

#define OPS(...) "{\"source\":{\"type\":\"tfrecord\",\"files\":\"/d/*\"},\"ops\":[" __VA_ARGS__ "]}"

Test(spec, parse_example_features)
{
    sl_spec_t *spec = parse_ok(OPS("{\"op\":\"parse_example\",\"features\":{"
                                   "\"label\":{\"dtype\":\"int64\",\"default\":[7]},"
                                   "\"x\":{\"dtype\":\"float32\",\"shape\":[2],\"default\":[0.5,2]},"
                                   "\"tok\":{\"dtype\":\"int64\",\"varlen\":true},"
                                   "\"image/encoded\":{\"dtype\":\"bytes\"},"
                                   "\"s\":{\"dtype\":\"bytes\",\"shape\":[2,1],\"default\":\"ab\"}}}"));
    cr_assert_str_eq(sl_spec_canonical(spec),
                     "{\"ops\":[{\"features\":{"
                     "\"image/encoded\":{\"dtype\":\"bytes\",\"shape\":[],\"varlen\":false},"
                     "\"label\":{\"default\":7,\"dtype\":\"int64\",\"shape\":[],\"varlen\":false},"
                     "\"s\":{\"default\":\"ab\",\"dtype\":\"bytes\",\"shape\":[2,1],\"varlen\":false},"
                     "\"tok\":{\"dtype\":\"int64\",\"varlen\":true},"
                     "\"x\":{\"default\":[0.5,2.0],\"dtype\":\"float32\",\"shape\":[2],\"varlen\":false}},"
                     "\"key\":\"record\",\"op\":\"parse_example\"}],"
                     "\"source\":{\"compression\":\"none\",\"files\":[\"/d/*\"],\"name\":\"record\",\"on_corrupt\":"
                     "\"fail\",\"type\":\"tfrecord\"}}");
    const sl_spec_op_t *op = sl_spec_op(spec, 0);
    cr_assert_eq(op->kind, SL_OP_PARSE_EXAMPLE);
    cr_assert_str_eq(op->u.parse_example.key, "record", "the source's component by default");
    cr_assert_eq(op->u.parse_example.num_features, 5);
    const sl_spec_feature_t *f = op->u.parse_example.features;
    /* Sorted by name. */
    cr_assert_str_eq(f[0].name, "image/encoded");
    cr_assert_eq(f[0].dtype, SL_DTYPE_BYTES);
    cr_assert_eq(f[0].rank, 0);
    cr_assert_eq(f[0].default_count, 0, "required");
    cr_assert_str_eq(f[1].name, "label");
    cr_assert_eq(f[1].default_count, 1);
    cr_assert_eq(((const int64_t *)f[1].default_values)[0], 7);
    cr_assert_str_eq(f[2].name, "s");
    cr_assert_eq(f[2].rank, 2);
    cr_assert(f[2].shape[0] == 2 && f[2].shape[1] == 1);
    const sl_spec_bytes_t *sb = f[2].default_values;
    cr_assert(sb[0].len == 2 && memcmp(sb[0].data, "ab", 2) == 0);
    cr_assert_str_eq(f[3].name, "tok");
    cr_assert(f[3].varlen);
    cr_assert_str_eq(f[4].name, "x");
    cr_assert_eq(f[4].default_count, 2);
    cr_assert_eq(((const double *)f[4].default_values)[0], 0.5);
    cr_assert_str_eq(sl_spec_op_name(SL_OP_PARSE_EXAMPLE), "parse_example");

    sl_spec_t *again = parse_ok(sl_spec_canonical(spec));
    cr_assert_str_eq(sl_spec_canonical(again), sl_spec_canonical(spec));
    sl_spec_free(again);
    sl_spec_free(spec);

    /* One default value written as a value or a list, the key given or
     * not, shape [] given or not: one spec. */
    char *a = fingerprint_of(OPS("{\"op\":\"parse_example\",\"features\":{\"l\":{\"dtype\":\"int64\",\"default\":3}}}"));
    char *b = fingerprint_of(OPS("{\"op\":\"parse_example\",\"key\":\"record\",\"features\":{\"l\":{\"dtype\":"
                                 "\"int64\",\"shape\":[],\"varlen\":false,\"default\":[3]}}}"));
    cr_assert_str_eq(a, b);
    free(a);
    free(b);

    /* The key defaults to the source's component, whatever its name. */
    spec = parse_ok("{\"source\":{\"type\":\"text_lines\",\"files\":\"/t\"},\"ops\":[{\"op\":\"parse_example\","
                    "\"features\":{\"a\":{\"dtype\":\"bytes\"}}}]}");
    cr_assert_str_eq(sl_spec_op(spec, 0)->u.parse_example.key, "line");
    sl_spec_free(spec);
}

Test(spec, parse_example_errors)
{
#define PE(f) OPS("{\"op\":\"parse_example\",\"features\":" f "}")
    expect_error(OPS("{\"op\":\"parse_example\"}"), "$.ops[0].features: required field missing");
    expect_error(PE("{}"), "$.ops[0].features: must be an object of 1 to 32 features, got 0 features");
    expect_error(PE("[]"), "$.ops[0].features: must be an object of 1 to 32 features, got an array");
    expect_error(PE("{\"a\":\"int64\"}"), "$.ops[0].features.a: must be an object, got \"int64\"");
    expect_error(PE("{\"a b\":{\"dtype\":\"int64\"}}"),
                 "$.ops[0].features.a b: a feature name must have 1 to 63 characters from [A-Za-z0-9_./-]");
    expect_error(PE("{\"a\":{}}"), "$.ops[0].features.a.dtype: required field missing");
    expect_error(PE("{\"a\":{\"dtype\":\"int32\"}}"),
                 "$.ops[0].features.a.dtype: must be \"int64\", \"float32\" or \"bytes\", got \"int32\"");
    expect_error_prefix(PE("{\"a\":{\"dtype\":\"int64\",\"bogus\":1}}"), "$.ops[0].features.a.bogus: unknown field");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"shape\":[2,-1]}}"),
                 "$.ops[0].features.a.shape[1]: must be an integer >= 0, got -1");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"shape\":3}}"),
                 "$.ops[0].features.a.shape: must be a list of at most 8 integers, got 3");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"shape\":[1,1,1,1,1,1,1,1,1]}}"),
                 "$.ops[0].features.a.shape: must be a list of at most 8 integers, got a list of 9");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"shape\":[65536,65536]}}"),
                 "$.ops[0].features.a.shape: holds more than 16777216 values");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"varlen\":\"yes\"}}"),
                 "$.ops[0].features.a.varlen: must be true or false, got \"yes\"");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"varlen\":true,\"shape\":[]}}"),
                 "$.ops[0].features.a.shape: a varlen feature has no shape");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"varlen\":true,\"default\":1}}"),
                 "$.ops[0].features.a.default: a varlen feature has no default");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"shape\":[3],\"default\":[1,2]}}"),
                 "$.ops[0].features.a.default: 2 values, the shape needs 1 or 3");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"default\":[]}}"),
                 "$.ops[0].features.a.default: 0 values, the shape needs 1 or 1");
    expect_error(PE("{\"a\":{\"dtype\":\"int64\",\"default\":1.5}}"),
                 "$.ops[0].features.a.default: must be an integer, got 1.5");
    expect_error(PE("{\"a\":{\"dtype\":\"float32\",\"shape\":[2],\"default\":[1,\"x\"]}}"),
                 "$.ops[0].features.a.default[1]: must be a number, got \"x\"");
    expect_error(PE("{\"a\":{\"dtype\":\"bytes\",\"default\":7}}"), "$.ops[0].features.a.default: must be a string, got 7");
    expect_error(OPS("{\"op\":\"parse_example\",\"key\":\"\",\"features\":{\"a\":{\"dtype\":\"int64\"}}}"),
                 "$.ops[0].key: must be a string of 1 to 63 characters from [A-Za-z0-9_./-], got \"\"");
#undef PE
}

/* random_resized_crop: torchvision's scale and ratio when absent, shown in
 * the canonical form (so that a spec that writes them out has the same
 * fingerprint), and bounds on both. */
Test(spec, random_resized_crop)
{
    sl_spec_t *a = parse_ok(OPS("{\"op\":\"random_resized_crop\",\"key\":\"img\",\"size\":[224,224]}"));
    cr_assert_str_eq(sl_spec_canonical(a),
                     "{\"ops\":[{\"dtype\":\"float32\",\"key\":\"img\",\"op\":\"random_resized_crop\",\"ratio\":"
                     "[0.75,1.33333333333333],\"scale\":[0.08,1.0],\"size\":[224,224]}],"
                     "\"source\":{\"compression\":\"none\",\"files\":[\"/d/*\"],\"name\":\"record\",\"on_corrupt\":"
                     "\"fail\",\"type\":\"tfrecord\"}}");
    const sl_spec_op_t *op = sl_spec_op(a, 0);
    cr_assert_eq(op->kind, SL_OP_RANDOM_RESIZED_CROP);
    cr_assert(op->u.random_resized_crop.scale.n == 2 && op->u.random_resized_crop.scale.v[0] == 0.08 &&
              op->u.random_resized_crop.scale.v[1] == 1.0);
    cr_assert(op->u.random_resized_crop.ratio.n == 2 && op->u.random_resized_crop.ratio.v[0] == 0.75 &&
              op->u.random_resized_crop.ratio.v[1] == 4.0 / 3.0);
    cr_assert_not(op->u.random_resized_crop.has_seed);
    cr_assert(sl_spec_op_elementwise(SL_OP_RANDOM_RESIZED_CROP));
    sl_spec_t *b = parse_ok(OPS("{\"op\":\"random_resized_crop\",\"key\":\"img\",\"size\":[224,224],"
                                "\"scale\":[0.08,1],\"ratio\":[0.75,1.3333333333333333],\"dtype\":\"float32\"}"));
    cr_assert_str_eq(sl_spec_fingerprint(a), sl_spec_fingerprint(b));
    sl_spec_free(a);
    sl_spec_free(b);

    expect_error(OPS("{\"op\":\"random_resized_crop\",\"key\":\"i\",\"size\":[2,2],\"scale\":[0,1]}"),
                 "$.ops[0].scale: must be [lo, hi] with 0 < lo <= hi <= 1, got [0, 1]");
    expect_error(OPS("{\"op\":\"random_resized_crop\",\"key\":\"i\",\"size\":[2,2],\"scale\":[0.5,1.5]}"),
                 "$.ops[0].scale: must be [lo, hi] with 0 < lo <= hi <= 1, got [0.5, 1.5]");
    expect_error(OPS("{\"op\":\"random_resized_crop\",\"key\":\"i\",\"size\":[2,2],\"scale\":[0.9,0.5]}"),
                 "$.ops[0].scale: must be [lo, hi] with 0 < lo <= hi <= 1, got [0.9, 0.5]");
    expect_error(OPS("{\"op\":\"random_resized_crop\",\"key\":\"i\",\"size\":[2,2],\"scale\":[0.5]}"),
                 "$.ops[0].scale: must be a list of 2 numbers, got a list of 1");
    expect_error(OPS("{\"op\":\"random_resized_crop\",\"key\":\"i\",\"size\":[2,2],\"ratio\":[2,1]}"),
                 "$.ops[0].ratio: must be [lo, hi] with 0.001 <= lo <= hi <= 1000 (width / height), got [2, 1]");
    expect_error(OPS("{\"op\":\"random_resized_crop\",\"key\":\"i\",\"size\":[2,2],\"ratio\":[0,1]}"),
                 "$.ops[0].ratio: must be [lo, hi] with 0.001 <= lo <= hi <= 1000 (width / height), got [0, 1]");
    expect_error(OPS("{\"op\":\"random_resized_crop\",\"key\":\"i\",\"size\":[2,2],\"dtype\":\"int8\"}"),
                 "$.ops[0].dtype: must be \"uint8\" or \"float32\", got \"int8\"");
    expect_error(OPS("{\"op\":\"random_resized_crop\",\"key\":\"i\"}"), "$.ops[0].size: required field missing");
}

/* color_jitter: ranges as pairs, at least one adjustment, bounds. */
Test(spec, color_jitter)
{
    sl_spec_t *a = parse_ok(OPS("{\"op\":\"color_jitter\",\"key\":\"img\",\"brightness\":[0.6,1.4],\"hue\":[-0.1,0.1],"
                                "\"seed\":2}"));
    cr_assert(strstr(sl_spec_canonical(a), "{\"brightness\":[0.6,1.4],\"hue\":[-0.1,0.1],\"key\":\"img\",\"op\":"
                                           "\"color_jitter\",\"p\":1.0,\"seed\":2}"),
              "%s", sl_spec_canonical(a));
    const sl_spec_op_t *op = sl_spec_op(a, 0);
    cr_assert_eq(op->kind, SL_OP_COLOR_JITTER);
    cr_assert(op->u.color_jitter.has_brightness && op->u.color_jitter.has_hue && !op->u.color_jitter.has_contrast &&
              !op->u.color_jitter.has_saturation);
    cr_assert(sl_spec_op_elementwise(SL_OP_COLOR_JITTER));
    sl_spec_free(a);
    expect_error(OPS("{\"op\":\"color_jitter\",\"key\":\"i\"}"),
                 "$.ops[0]: color_jitter needs brightness, contrast, saturation or hue");
    expect_error(OPS("{\"op\":\"color_jitter\",\"key\":\"i\",\"contrast\":[-0.1,1]}"),
                 "$.ops[0].contrast: must be [lo, hi] with 0 <= lo <= hi <= 100, got [-0.1, 1]");
    expect_error(OPS("{\"op\":\"color_jitter\",\"key\":\"i\",\"saturation\":[2,1]}"),
                 "$.ops[0].saturation: must be [lo, hi] with 0 <= lo <= hi <= 100, got [2, 1]");
    expect_error(OPS("{\"op\":\"color_jitter\",\"key\":\"i\",\"hue\":[-0.6,0]}"),
                 "$.ops[0].hue: must be [lo, hi] with -0.5 <= lo <= hi <= 0.5, got [-0.6, 0]");
    expect_error(OPS("{\"op\":\"color_jitter\",\"key\":\"i\",\"brightness\":0.4}"),
                 "$.ops[0].brightness: must be a list of 2 numbers, got 0.4");

    /* random_grayscale: torchvision's p of 0.1 when absent, 0 .. 1. */
    sl_spec_t *g = parse_ok(OPS("{\"op\":\"random_grayscale\",\"key\":\"img\"}"));
    cr_assert(strstr(sl_spec_canonical(g), "{\"key\":\"img\",\"op\":\"random_grayscale\",\"p\":0.1}"), "%s",
              sl_spec_canonical(g));
    cr_assert_eq(sl_spec_op(g, 0)->u.random_grayscale.p, 0.1);
    sl_spec_free(g);
    expect_error(OPS("{\"op\":\"random_grayscale\",\"key\":\"i\",\"p\":1.5}"),
                 "$.ops[0].p: must be a number from 0 to 1, got 1.5");
    expect_error(OPS("{\"op\":\"random_grayscale\",\"key\":\"i\",\"p\":\"x\"}"),
                 "$.ops[0].p: must be a number, got \"x\"");

    /* gaussian_blur: odd kernel sides, torchvision's sigma range when absent. */
    sl_spec_t *b = parse_ok(OPS("{\"op\":\"gaussian_blur\",\"key\":\"img\",\"kernel_size\":[23,23]}"));
    cr_assert(strstr(sl_spec_canonical(b), "{\"kernel_size\":[23,23],\"key\":\"img\",\"op\":\"gaussian_blur\","
                                           "\"p\":1.0,\"sigma\":[0.1,2.0]}"),
              "%s", sl_spec_canonical(b));
    sl_spec_free(b);
    expect_error(OPS("{\"op\":\"gaussian_blur\",\"key\":\"i\",\"kernel_size\":[3,4]}"),
                 "$.ops[0].kernel_size[1]: must be odd, got 4");
    expect_error(OPS("{\"op\":\"gaussian_blur\",\"key\":\"i\",\"kernel_size\":[3,257]}"),
                 "$.ops[0].kernel_size[1]: must be an integer <= 255, got 257");
    expect_error(OPS("{\"op\":\"gaussian_blur\",\"key\":\"i\",\"kernel_size\":[3,3],\"sigma\":[0,1]}"),
                 "$.ops[0].sigma: must be [lo, hi] with 0 < lo <= hi <= 1000, got [0, 1]");
    expect_error(OPS("{\"op\":\"gaussian_blur\",\"key\":\"i\"}"), "$.ops[0].kernel_size: required field missing");
    expect_error(OPS("{\"op\":\"gaussian_blur\",\"key\":\"i\",\"kernel_size\":[3,3],\"p\":-0.5}"),
                 "$.ops[0].p: must be a number from 0 to 1, got -0.5");
    expect_error(OPS("{\"op\":\"color_jitter\",\"key\":\"i\",\"hue\":[0,0.1],\"p\":2}"),
                 "$.ops[0].p: must be a number from 0 to 1, got 2");

    /* random_solarize: a threshold from 0 to 255 (required), torchvision's
     * p of 0.5 when absent. */
    sl_spec_t *z = parse_ok(OPS("{\"op\":\"random_solarize\",\"key\":\"img\",\"threshold\":128}"));
    cr_assert(strstr(sl_spec_canonical(z), "{\"key\":\"img\",\"op\":\"random_solarize\",\"p\":0.5,"
                                           "\"threshold\":128.0}"),
              "%s", sl_spec_canonical(z));
    cr_assert_eq(sl_spec_op(z, 0)->u.random_solarize.threshold, 128.0);
    sl_spec_free(z);
    expect_error(OPS("{\"op\":\"random_solarize\",\"key\":\"i\"}"), "$.ops[0].threshold: required field missing");
    expect_error(OPS("{\"op\":\"random_solarize\",\"key\":\"i\",\"threshold\":255.5}"),
                 "$.ops[0].threshold: must be a number from 0 to 255, got 255.5");
    expect_error(OPS("{\"op\":\"random_solarize\",\"key\":\"i\",\"threshold\":[1]}"),
                 "$.ops[0].threshold: must be a number, got an array");
    expect_error(OPS("{\"op\":\"random_solarize\",\"key\":\"i\",\"threshold\":1,\"p\":-1}"),
                 "$.ops[0].p: must be a number from 0 to 1, got -1");
}

Test(spec, image_ops_with_defaults)
{
    sl_spec_t *spec = parse_ok(OPS("{\"op\":\"decode_jpeg\",\"key\":\"img\"},"
                                   "{\"op\":\"random_crop\",\"key\":\"img\",\"size\":[36,40]},"
                                   "{\"op\":\"center_crop\",\"key\":\"img\",\"size\":[30,30]},"
                                   "{\"op\":\"random_flip\",\"key\":\"img\",\"seed\":4},"
                                   "{\"op\":\"resize\",\"key\":\"img\",\"size\":[32,32]},"
                                   "{\"op\":\"normalize\",\"key\":\"img\",\"mean\":[0,0.5,1],\"std\":[1,2,3]},"
                                   "{\"op\":\"cast\",\"key\":\"img\",\"dtype\":\"float16\"}"));
    cr_assert_str_eq(sl_spec_canonical(spec),
                     "{\"ops\":[{\"channels\":3,\"key\":\"img\",\"op\":\"decode_jpeg\"},"
                     "{\"key\":\"img\",\"op\":\"random_crop\",\"size\":[36,40]},"
                     "{\"key\":\"img\",\"op\":\"center_crop\",\"size\":[30,30]},"
                     "{\"direction\":\"left_right\",\"key\":\"img\",\"op\":\"random_flip\",\"seed\":4},"
                     "{\"dtype\":\"float32\",\"key\":\"img\",\"op\":\"resize\",\"size\":[32,32]},"
                     "{\"key\":\"img\",\"mean\":[0.0,0.5,1.0],\"op\":\"normalize\",\"scale\":false,\"std\":[1.0,2.0,3.0]},"
                     "{\"dtype\":\"float16\",\"key\":\"img\",\"op\":\"cast\"}],"
                     "\"source\":{\"compression\":\"none\",\"files\":[\"/d/*\"],\"name\":\"record\",\"on_corrupt\":"
                     "\"fail\",\"type\":\"tfrecord\"}}");
    const sl_spec_op_t *op = sl_spec_op(spec, 0);
    cr_assert_eq(op->kind, SL_OP_DECODE_JPEG);
    cr_assert_str_eq(op->u.decode_jpeg.key, "img");
    cr_assert_eq(op->u.decode_jpeg.channels, 3);
    op = sl_spec_op(spec, 1);
    cr_assert_eq(op->kind, SL_OP_RANDOM_CROP);
    cr_assert(op->u.random_crop.size.n == 2 && op->u.random_crop.size.v[0] == 36 && op->u.random_crop.size.v[1] == 40);
    cr_assert_not(op->u.random_crop.has_seed);
    op = sl_spec_op(spec, 3);
    cr_assert_eq(op->u.random_flip.direction, 0);
    cr_assert(op->u.random_flip.has_seed && op->u.random_flip.seed == 4);
    op = sl_spec_op(spec, 4);
    cr_assert_eq(op->u.resize.dtype, SL_DTYPE_FLOAT32);
    op = sl_spec_op(spec, 5);
    cr_assert_eq(op->u.normalize.mean.n, 3);
    cr_assert_eq(op->u.normalize.mean.v[1], 0.5);
    cr_assert_eq(op->u.normalize.std.v[2], 3.0);
    cr_assert_not(op->u.normalize.scale);
    cr_assert_eq(sl_spec_op(spec, 6)->u.cast.dtype, SL_DTYPE_FLOAT16);
    sl_spec_t *again = parse_ok(sl_spec_canonical(spec));
    cr_assert_str_eq(sl_spec_canonical(again), sl_spec_canonical(spec));
    sl_spec_free(again);
    sl_spec_free(spec);

    spec = parse_ok(OPS("{\"op\":\"decode_jpeg\",\"key\":\"img\",\"channels\":0},"
                        "{\"op\":\"random_flip\",\"key\":\"img\",\"direction\":\"up_down\"},"
                        "{\"op\":\"resize\",\"key\":\"img\",\"size\":[1,65536],\"dtype\":\"uint8\"},"
                        "{\"op\":\"normalize\",\"key\":\"img\",\"mean\":[0.5],\"std\":[0.25],\"scale\":true}"));
    /* Reals keep 15 significant digits: 0.485 stays 0.485. */
    sl_spec_t *reals = parse_ok(OPS("{\"op\":\"normalize\",\"key\":\"i\",\"mean\":[0.485,1e-7,0.1234567890123456789],"
                                    "\"std\":[0.229,3,2.5]}"));
    cr_assert(strstr(sl_spec_canonical(reals), "\"mean\":[0.485,1e-7,0.123456789012346]") &&
                  strstr(sl_spec_canonical(reals), "\"std\":[0.229,3.0,2.5]"),
              "%s", sl_spec_canonical(reals));
    sl_spec_t *again2 = parse_ok(sl_spec_canonical(reals));
    cr_assert_str_eq(sl_spec_canonical(again2), sl_spec_canonical(reals));
    sl_spec_free(again2);
    sl_spec_free(reals);
    cr_assert_eq(sl_spec_op(spec, 0)->u.decode_jpeg.channels, 0);
    cr_assert_eq(sl_spec_op(spec, 1)->u.random_flip.direction, 1);
    cr_assert_eq(sl_spec_op(spec, 2)->u.resize.dtype, SL_DTYPE_UINT8);
    cr_assert(sl_spec_op(spec, 3)->u.normalize.scale);
    sl_spec_free(spec);
}

Test(spec, image_op_errors)
{
    expect_error(OPS("{\"op\":\"decode_jpeg\"}"), "$.ops[0].key: required field missing");
    expect_error(OPS("{\"op\":\"decode_jpeg\",\"key\":\"i\",\"channels\":2}"),
                 "$.ops[0].channels: must be 0, 1 or 3, got 2");
    expect_error(OPS("{\"op\":\"decode_jpeg\",\"key\":\"i\",\"channels\":4}"),
                 "$.ops[0].channels: must be an integer <= 3, got 4");
    expect_error(OPS("{\"op\":\"resize\",\"key\":\"i\"}"),
                 "$.ops[0].size: required field missing (or shorter_side, to keep the aspect ratio)");
    expect_error(OPS("{\"op\":\"resize\",\"key\":\"i\",\"size\":[2,2],\"shorter_side\":2}"),
                 "$.ops[0]: give size or shorter_side, not both");
    expect_error(OPS("{\"op\":\"resize\",\"key\":\"i\",\"shorter_side\":0}"),
                 "$.ops[0].shorter_side: must be an integer >= 1, got 0");
    expect_error(OPS("{\"op\":\"resize\",\"key\":\"i\",\"shorter_side\":65537}"),
                 "$.ops[0].shorter_side: must be an integer <= 65536, got 65537");
    {
        /* shorter_side alone: the canonical form shows it and no size. */
        sl_spec_t *ss = parse_ok(OPS("{\"op\":\"resize\",\"key\":\"i\",\"shorter_side\":256}"));
        cr_assert(strstr(sl_spec_canonical(ss), "{\"dtype\":\"float32\",\"key\":\"i\",\"op\":\"resize\","
                                                "\"shorter_side\":256}"),
                  "%s", sl_spec_canonical(ss));
        cr_assert(sl_spec_op(ss, 0)->u.resize.has_shorter_side && !sl_spec_op(ss, 0)->u.resize.has_size);
        sl_spec_free(ss);
    }
    expect_error(OPS("{\"op\":\"resize\",\"key\":\"i\",\"size\":32}"),
                 "$.ops[0].size: must be a list of 2 integers, got 32");
    expect_error(OPS("{\"op\":\"resize\",\"key\":\"i\",\"size\":[32]}"),
                 "$.ops[0].size: must be a list of 2 integers, got a list of 1");
    expect_error(OPS("{\"op\":\"take\",\"count\":1},{\"op\":\"resize\",\"key\":\"i\",\"size\":[32,0]}"),
                 "$.ops[1].size[1]: must be an integer >= 1, got 0");
    expect_error(OPS("{\"op\":\"resize\",\"key\":\"i\",\"size\":[65537,2]}"),
                 "$.ops[0].size[0]: must be an integer <= 65536, got 65537");
    expect_error(OPS("{\"op\":\"resize\",\"key\":\"i\",\"size\":[2,\"2\"]}"),
                 "$.ops[0].size[1]: must be an integer >= 1, got \"2\"");
    expect_error(OPS("{\"op\":\"resize\",\"key\":\"i\",\"size\":[2,2],\"dtype\":\"int8\"}"),
                 "$.ops[0].dtype: must be \"uint8\" or \"float32\", got \"int8\"");
    expect_error_prefix(OPS("{\"op\":\"resize\",\"key\":\"i\",\"size\":[2,2],\"method\":\"bilinear\"}"),
                 "$.ops[0].method: unknown field");
    expect_error(OPS("{\"op\":\"random_crop\",\"key\":\"i\",\"size\":[2,2],\"seed\":-1}"),
                 "$.ops[0].seed: must be an integer >= 0, got -1");
    expect_error_prefix(OPS("{\"op\":\"center_crop\",\"key\":\"i\",\"size\":[2,2],\"seed\":1}"), "$.ops[0].seed: unknown field");
    expect_error(OPS("{\"op\":\"random_flip\",\"key\":\"i\",\"direction\":\"diagonal\"}"),
                 "$.ops[0].direction: must be \"left_right\" or \"up_down\", got \"diagonal\"");
    expect_error(OPS("{\"op\":\"normalize\",\"key\":\"i\",\"mean\":[0],\"std\":[]}"),
                 "$.ops[0].std: must be a list of 1 to 3 numbers, got a list of 0");
    expect_error(OPS("{\"op\":\"normalize\",\"key\":\"i\",\"mean\":[0,0],\"std\":[1]}"),
                 "$.ops[0].std: must have as many values as mean (2), got 1");
    expect_error(OPS("{\"op\":\"normalize\",\"key\":\"i\",\"mean\":[0,null],\"std\":[1,1]}"),
                 "$.ops[0].mean[1]: must be a number, got null");
    expect_error(OPS("{\"op\":\"normalize\",\"key\":\"i\",\"mean\":[0,0],\"std\":[1,-2]}"),
                 "$.ops[0].std[1]: must be a number > 0, got -2");
    expect_error(OPS("{\"op\":\"cast\",\"key\":\"i\"}"), "$.ops[0].dtype: required field missing");
    expect_error_prefix(OPS("{\"op\":\"cast\",\"key\":\"i\",\"dtype\":\"bytes\"}"),
                        "$.ops[0].dtype: must be \"bool\", \"int8\", ");
}

Test(spec, shard_and_padded_batch)
{
    sl_spec_t *spec =
        parse_ok(OPS("{\"op\":\"shard\",\"num_shards\":4,\"index\":3},"
                     "{\"op\":\"padded_batch\",\"batch_size\":8},"
                     "{\"op\":\"padded_batch\",\"batch_size\":2,\"drop_remainder\":true,"
                     "\"padded_shapes\":{\"tok\":[-1],\"img\":[32,-1,3]},\"padding_values\":{\"tok\":-1,\"img\":0.5}}"));
    cr_assert_str_eq(sl_spec_canonical(spec),
                     "{\"ops\":[{\"index\":3,\"num_shards\":4,\"op\":\"shard\"},"
                     "{\"batch_size\":8,\"drop_remainder\":false,\"op\":\"padded_batch\",\"padded_shapes\":{},"
                     "\"padding_values\":{}},"
                     "{\"batch_size\":2,\"drop_remainder\":true,\"op\":\"padded_batch\",\"padded_shapes\":{\"img\":"
                     "[32,-1,3],\"tok\":[-1]},\"padding_values\":{\"img\":0.5,\"tok\":-1}}],"
                     "\"source\":{\"compression\":\"none\",\"files\":[\"/d/*\"],\"name\":\"record\",\"on_corrupt\":"
                     "\"fail\",\"type\":\"tfrecord\"}}");
    const sl_spec_op_t *op = sl_spec_op(spec, 0);
    cr_assert_eq(op->kind, SL_OP_SHARD);
    cr_assert_eq(op->u.shard.num_shards, 4);
    cr_assert_eq(op->u.shard.index, 3);
    op = sl_spec_op(spec, 1);
    cr_assert_eq(op->u.padded_batch.num_padded_shapes, 0);
    cr_assert_eq(op->u.padded_batch.num_padding_values, 0);
    op = sl_spec_op(spec, 2);
    cr_assert_eq(op->u.padded_batch.num_padded_shapes, 2);
    cr_assert_str_eq(op->u.padded_batch.padded_shapes[0].name, "img");
    cr_assert_eq(op->u.padded_batch.padded_shapes[0].dims.n, 3);
    cr_assert_eq(op->u.padded_batch.padded_shapes[0].dims.v[1], -1);
    cr_assert_str_eq(op->u.padded_batch.padding_values[1].name, "tok");
    cr_assert(op->u.padded_batch.padding_values[1].is_int);
    cr_assert_eq(op->u.padded_batch.padding_values[1].i, -1);
    cr_assert_not(op->u.padded_batch.padding_values[0].is_int);
    cr_assert_eq(op->u.padded_batch.padding_values[0].d, 0.5);
    sl_spec_t *again = parse_ok(sl_spec_canonical(spec));
    cr_assert_str_eq(sl_spec_canonical(again), sl_spec_canonical(spec));
    sl_spec_free(again);
    sl_spec_free(spec);

    char *a = fingerprint_of(OPS("{\"op\":\"padded_batch\",\"batch_size\":8}"));
    char *b = fingerprint_of(OPS("{\"op\":\"padded_batch\",\"batch_size\":8,\"padded_shapes\":{},\"padding_values\":{}}"));
    cr_assert_str_eq(a, b);
    free(a);
    free(b);

    expect_error(OPS("{\"op\":\"shard\",\"index\":0}"), "$.ops[0].num_shards: required field missing");
    expect_error(OPS("{\"op\":\"shard\",\"num_shards\":\"hint\",\"index\":0}"),
                 "$.ops[0].index: \"hint\" must be given for both num_shards and index, or for neither");
    expect_error(OPS("{\"op\":\"shard\",\"num_shards\":2,\"index\":\"hint\"}"),
                 "$.ops[0].num_shards: \"hint\" must be given for both num_shards and index, or for neither");
    expect_error(OPS("{\"op\":\"shard\",\"num_shards\":\"all\",\"index\":0}"),
                 "$.ops[0].num_shards: must be an integer >= 1 or \"hint\", got \"all\"");
    expect_error(OPS("{\"op\":\"shard\",\"num_shards\":0,\"index\":0}"),
                 "$.ops[0].num_shards: must be an integer >= 1, got 0");
    expect_error(OPS("{\"op\":\"shard\",\"num_shards\":2}"), "$.ops[0].index: required field missing");
    expect_error(OPS("{\"op\":\"shard\",\"num_shards\":2,\"index\":2}"),
                 "$.ops[0].index: must be an integer < num_shards (2), got 2");
    expect_error(OPS("{\"op\":\"shard\",\"num_shards\":2,\"index\":-1}"), "$.ops[0].index: must be an integer >= 0, got -1");
    expect_error(OPS("{\"op\":\"padded_batch\"}"), "$.ops[0].batch_size: required field missing");
    expect_error(OPS("{\"op\":\"padded_batch\",\"batch_size\":2,\"padded_shapes\":[]}"),
                 "$.ops[0].padded_shapes: must be an object of at most 32 component names and shapes, got an array");
    expect_error(OPS("{\"op\":\"padded_batch\",\"batch_size\":2,\"padded_shapes\":{\"a\":[-2]}}"),
                 "$.ops[0].padded_shapes.a[0]: must be an integer >= -1, got -2");
    expect_error(OPS("{\"op\":\"padded_batch\",\"batch_size\":2,\"padded_shapes\":{\"a\":4}}"),
                 "$.ops[0].padded_shapes.a: must be a list of at most 7 integers, got 4");
    expect_error(OPS("{\"op\":\"padded_batch\",\"batch_size\":2,\"padded_shapes\":{\"a b\":[]}}"),
                 "$.ops[0].padded_shapes.a b: a component name must have 1 to 63 characters from [A-Za-z0-9_./-]");
    expect_error(OPS("{\"op\":\"padded_batch\",\"batch_size\":2,\"padding_values\":{\"a\":\"0\"}}"),
                 "$.ops[0].padding_values.a: must be a number, got \"0\"");
}

Test(spec, shard_hint_round_trips)
{
    sl_spec_t *spec = parse_ok(OPS("{\"op\":\"shard\",\"num_shards\":\"hint\",\"index\":\"hint\"}"));
    cr_assert_eq(sl_spec_op(spec, 0)->u.shard.num_shards, SL_SPEC_SHARD_HINT);
    cr_assert_eq(sl_spec_op(spec, 0)->u.shard.index, SL_SPEC_SHARD_HINT);
    cr_assert_not_null(strstr(sl_spec_canonical(spec), "{\"index\":\"hint\",\"num_shards\":\"hint\",\"op\":\"shard\"}"),
                       "%s", sl_spec_canonical(spec));
    sl_spec_free(spec);
}

Test(spec, unknown_names_get_the_closest_known_one)
{
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"op\":[]}", "$.op: unknown field; did you mean \"ops\"?");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"bogus\":1}",
                 "$.bogus: unknown field; a spec has \"source\" and \"ops\"");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":[{\"op\":\"batch\",\"batchsize\":4}]}",
                 "$.ops[0].batchsize: unknown field; did you mean \"batch_size\"?");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":[{\"op\":\"batch\",\"batch_size\":4,"
                 "\"drop_reminder\":true}]}",
                 "$.ops[0].drop_reminder: unknown field; did you mean \"drop_remainder\"?");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":[{\"op\":\"batch\",\"batch_size\":4,\"bogus\":1}]}",
                 "$.ops[0].bogus: unknown field; known fields: op, batch_size, drop_remainder");
    expect_error("{\"source\":{\"type\":\"range\",\"stpo\":1}}", "$.source.stpo: unknown field; did you mean \"stop\"?");
    expect_error("{\"source\":{\"type\":\"tfrecords\"}}",
                 "$.source.type: unknown source \"tfrecords\"; did you mean \"tfrecord\"?");
    expect_error("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":[{\"op\":\"shufle\"}]}",
                 "$.ops[0].op: unknown op \"shufle\"; did you mean \"shuffle\"?");
}
