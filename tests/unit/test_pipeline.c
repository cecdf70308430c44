/*
 * test_pipeline.c: the worker's pipeline (pipeline/pipeline.c and its
 * iterators) run from specs, under OFF and DYNAMIC sharding, and the checks
 * of finished batches (protocol/batch.c).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch.h"
#include "big_alloc.h"
#include "arena_util.h"
#include "iter.h"
#include "pipeline.h"
#include "posbits.h"
#include "rng.h"
#include "spec.h"

/* What a pipeline produced: every value in order, and each batch's size. */
struct run {
    int64_t *values;
    size_t n, cap;
    uint64_t sizes[256];
    size_t batches;
    int rc; /* the last sl_pipeline_next() result: 1, or an error */
    char errmsg[512];
};

static void run_free(struct run *r)
{
    free(r->values);
}

static void push(struct run *r, int64_t v)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->values = realloc(r->values, r->cap * sizeof *r->values);
        cr_assert_not_null(r->values);
    }
    r->values[r->n++] = v;
}

/* Checks a batch of the single int64 component "name" and records it. */
static void take_batch(struct run *r, sl_wire_batch_t *b, const char *name)
{
    char err[256] = "";
    cr_assert_eq(sl_wire_batch_validate(b, err, sizeof err), 0, "invalid batch: %s", err);
    cr_assert_eq(b->num_components, 1);
    const sl_component_t *c = &b->components[0];
    cr_assert_str_eq(c->name, name);
    cr_assert_eq(c->dtype, SL_DTYPE_INT64);
    cr_assert_not(c->ragged);
    uint64_t count;
    if (c->rank == 0) {
        cr_assert_eq(b->num_elements, 1);
        count = 1;
    } else {
        cr_assert_eq(c->rank, 1);
        cr_assert_eq((uint64_t)c->shape[0], b->num_elements);
        count = b->num_elements;
    }
    cr_assert_eq(c->length, count * 8);
    for (uint64_t i = 0; i < count; i++) {
        int64_t v;
        memcpy(&v, b->data + c->offset + 8 * i, 8);
        push(r, v);
    }
    if (r->batches < sizeof r->sizes / sizeof r->sizes[0])
        r->sizes[r->batches] = b->num_elements;
    r->batches++;
}

static sl_pipeline_t *make(const char *json, const sl_pipeline_opts_t *opts)
{
    sl_spec_t *spec = NULL;
    sl_pipeline_t *p = NULL;
    char err[256] = "";
    cr_assert_eq(sl_spec_parse(json, strlen(json), &spec, err, sizeof err), 0, "%s: %s", json, err);
    cr_assert_eq(sl_pipeline_create(spec, opts, &p, err, sizeof err), 0, "%s", err);
    sl_spec_free(spec); /* the pipeline does not keep it */
    return p;
}

/* Runs a pipeline to its end or its first error, at most limit batches. */
static struct run run_pipeline(sl_pipeline_t *p, size_t limit)
{
    struct run r = {0};
    sl_wire_batch_t *b;
    for (size_t i = 0; i < limit; i++) {
        r.rc = sl_pipeline_next(p, &b);
        if (r.rc != 0) {
            cr_assert_null(b);
            snprintf(r.errmsg, sizeof r.errmsg, "%s", sl_pipeline_errmsg(p));
            /* The end and errors stick. */
            cr_assert_eq(sl_pipeline_next(p, &b), r.rc);
            break;
        }
        take_batch(&r, b, "value");
        sl_wire_batch_free(b);
    }
    return r;
}

static struct run run_spec(const char *json, const sl_pipeline_opts_t *opts)
{
    sl_pipeline_t *p = make(json, opts);
    struct run r = run_pipeline(p, SIZE_MAX);
    sl_pipeline_destroy(p);
    return r;
}

static void assert_values(const struct run *r, const int64_t *want, size_t n)
{
    cr_assert_eq(r->n, n, "got %zu values, want %zu", r->n, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(r->values[i], want[i], "value %zu is %" PRId64 ", want %" PRId64, i, r->values[i], want[i]);
}

#define ASSERT_VALUES(r, ...)                                                                                          \
    do {                                                                                                               \
        const int64_t want_[] = {__VA_ARGS__};                                                                         \
        assert_values(&(r), want_, sizeof want_ / sizeof want_[0]);                                                    \
    } while (0)

static void assert_sizes(const struct run *r, const uint64_t *want, size_t n)
{
    cr_assert_eq(r->batches, n, "got %zu batches, want %zu", r->batches, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(r->sizes[i], want[i], "batch %zu has %" PRIu64 " elements, want %" PRIu64, i, r->sizes[i],
                     want[i]);
}

#define ASSERT_SIZES(r, ...)                                                                                           \
    do {                                                                                                               \
        const uint64_t want_[] = {__VA_ARGS__};                                                                        \
        assert_sizes(&(r), want_, sizeof want_ / sizeof want_[0]);                                                     \
    } while (0)

/* Asserts that values holds each of [0, n) exactly times times. */
static void assert_each(const struct run *r, int64_t n, int times)
{
    int *seen = calloc((size_t)n, sizeof *seen);
    for (size_t i = 0; i < r->n; i++) {
        cr_assert(r->values[i] >= 0 && r->values[i] < n, "value %" PRId64 " out of range", r->values[i]);
        seen[r->values[i]]++;
    }
    for (int64_t v = 0; v < n; v++)
        cr_assert_eq(seen[v], times, "%" PRId64 " seen %d times, want %d", v, seen[v], times);
    cr_assert_eq(r->n, (size_t)(n * times));
    free(seen);
}

/* ---- OFF ---- */

Test(pipeline, range_unbatched)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"start\":3,\"stop\":-4,\"step\":-2}}", NULL);
    cr_assert_eq(r.rc, 1);
    ASSERT_VALUES(r, 3, 1, -1, -3);
    ASSERT_SIZES(r, 1, 1, 1, 1);
    run_free(&r);
}

Test(pipeline, range_empty)
{
    struct run r =
        run_spec("{\"source\":{\"type\":\"range\",\"stop\":0},\"ops\":[{\"op\":\"batch\",\"batch_size\":3}]}", NULL);
    cr_assert_eq(r.rc, 1);
    cr_assert_eq(r.n, 0);
    cr_assert_eq(r.batches, 0);
    run_free(&r);
}

Test(pipeline, range_extremes_do_not_overflow)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"start\":-9223372036854775808,"
                            "\"stop\":9223372036854775807,\"step\":9223372036854775807}}",
                            NULL);
    cr_assert_eq(r.rc, 1);
    ASSERT_VALUES(r, INT64_MIN, -1, INT64_MAX - 1);
    run_free(&r);
}

Test(pipeline, batch_keeps_remainder)
{
    struct run r =
        run_spec("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":4}]}", NULL);
    cr_assert_eq(r.rc, 1);
    ASSERT_VALUES(r, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
    ASSERT_SIZES(r, 4, 4, 2);
    run_free(&r);
}

Test(pipeline, batch_drops_remainder)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\","
                            "\"batch_size\":4,\"drop_remainder\":true}]}",
                            NULL);
    cr_assert_eq(r.rc, 1);
    ASSERT_VALUES(r, 0, 1, 2, 3, 4, 5, 6, 7);
    ASSERT_SIZES(r, 4, 4);
    run_free(&r);
}

Test(pipeline, batch_exact_multiple_and_batch_of_one)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":6},\"ops\":[{\"op\":\"batch\",\"batch_size\":3,"
                            "\"drop_remainder\":true}]}",
                            NULL);
    ASSERT_VALUES(r, 0, 1, 2, 3, 4, 5);
    ASSERT_SIZES(r, 3, 3);
    run_free(&r);
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":2},\"ops\":[{\"op\":\"batch\",\"batch_size\":1}]}", NULL);
    ASSERT_VALUES(r, 0, 1);
    ASSERT_SIZES(r, 1, 1);
    run_free(&r);
}

Test(pipeline, batch_of_batches_has_two_dimensions)
{
    sl_pipeline_t *p = make("{\"source\":{\"type\":\"range\",\"stop\":7,\"name\":\"x\"},\"ops\":["
                            "{\"op\":\"batch\",\"batch_size\":2},{\"op\":\"batch\",\"batch_size\":2,"
                            "\"drop_remainder\":true}]}",
                            NULL);
    sl_wire_batch_t *b;
    for (int64_t k = 0; k < 1; k++) {
        cr_assert_eq(sl_pipeline_next(p, &b), 0, "%s", sl_pipeline_errmsg(p));
        char err[256];
        cr_assert_eq(sl_wire_batch_validate(b, err, sizeof err), 0, "%s", err);
        const sl_component_t *c = &b->components[0];
        cr_assert_str_eq(c->name, "x");
        cr_assert_eq(b->num_elements, 2);
        cr_assert_eq(c->rank, 2);
        cr_assert_eq(c->shape[0], 2);
        cr_assert_eq(c->shape[1], 2);
        int64_t v[4];
        memcpy(v, b->data + c->offset, sizeof v);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(v[i], i);
        sl_wire_batch_free(b);
    }
    /* [4, 5] and [6] do not make a full outer batch of equal shapes. */
    cr_assert_eq(sl_pipeline_next(p, &b), SL_EDATA);
    cr_assert_str_eq(sl_pipeline_errmsg(p), "ops[1] (batch): component \"x\" has shape [1] in element 1 of the "
                                            "batch but [2] in element 0; batch needs equal shapes (padded_batch "
                                            "pads them)");
    sl_pipeline_destroy(p);
}

Test(pipeline, take_skip_repeat_sequences)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":5},\"ops\":[{\"op\":\"skip\",\"count\":2},"
                            "{\"op\":\"take\",\"count\":2},{\"op\":\"repeat\",\"count\":3}]}",
                            NULL);
    cr_assert_eq(r.rc, 1);
    ASSERT_VALUES(r, 2, 3, 2, 3, 2, 3);
    run_free(&r);

    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":3},\"ops\":[{\"op\":\"repeat\"},"
                 "{\"op\":\"take\",\"count\":7}]}",
                 NULL);
    cr_assert_eq(r.rc, 1);
    ASSERT_VALUES(r, 0, 1, 2, 0, 1, 2, 0);
    run_free(&r);

    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":3},\"ops\":[{\"op\":\"repeat\",\"count\":2},"
                 "{\"op\":\"skip\",\"count\":4}]}",
                 NULL);
    ASSERT_VALUES(r, 1, 2);
    run_free(&r);

    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":5},\"ops\":[{\"op\":\"repeat\",\"count\":2},"
                 "{\"op\":\"batch\",\"batch_size\":4}]}",
                 NULL);
    ASSERT_VALUES(r, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4);
    ASSERT_SIZES(r, 4, 4, 2);
    run_free(&r);

    /* Nested repeats multiply. */
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":2},\"ops\":[{\"op\":\"repeat\",\"count\":2},"
                 "{\"op\":\"take\",\"count\":3},{\"op\":\"repeat\",\"count\":2}]}",
                 NULL);
    ASSERT_VALUES(r, 0, 1, 0, 0, 1, 0);
    run_free(&r);
}

Test(pipeline, take_skip_repeat_edge_counts)
{
    const char *empty[] = {
        "{\"source\":{\"type\":\"range\",\"stop\":5},\"ops\":[{\"op\":\"take\",\"count\":0}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":5},\"ops\":[{\"op\":\"skip\",\"count\":-1}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":5},\"ops\":[{\"op\":\"skip\",\"count\":5}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":5},\"ops\":[{\"op\":\"repeat\",\"count\":0}]}",
        /* A repeat whose input is empty ends instead of spinning. */
        "{\"source\":{\"type\":\"range\",\"stop\":0},\"ops\":[{\"op\":\"repeat\"}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":5},\"ops\":[{\"op\":\"skip\",\"count\":-1},{\"op\":\"repeat\"}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":5},\"ops\":[{\"op\":\"take\",\"count\":0},"
        "{\"op\":\"repeat\",\"count\":4611686018427387904}]}",
    };
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        struct run r = run_spec(empty[i], NULL);
        cr_assert_eq(r.rc, 1, "%s", empty[i]);
        cr_assert_eq(r.n, 0, "%s yields %zu", empty[i], r.n);
        run_free(&r);
    }
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":3},\"ops\":[{\"op\":\"take\",\"count\":-1},"
                            "{\"op\":\"skip\",\"count\":0},{\"op\":\"repeat\",\"count\":1}]}",
                            NULL);
    ASSERT_VALUES(r, 0, 1, 2);
    run_free(&r);
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":3},\"ops\":[{\"op\":\"take\",\"count\":10}]}", NULL);
    ASSERT_VALUES(r, 0, 1, 2);
    run_free(&r);
}

static bool is_identity(const struct run *r)
{
    for (size_t i = 0; i < r->n; i++) {
        if (r->values[i] != (int64_t)i)
            return false;
    }
    return true;
}

Test(pipeline, shuffle_is_a_deterministic_permutation)
{
    const char *json = "{\"source\":{\"type\":\"range\",\"stop\":1000},\"ops\":[{\"op\":\"shuffle\","
                       "\"buffer_size\":100,\"seed\":7}]}";
    struct run a = run_spec(json, NULL);
    struct run b = run_spec(json, NULL);
    cr_assert_eq(a.rc, 1);
    assert_each(&a, 1000, 1);
    cr_assert_not(is_identity(&a));
    assert_values(&b, a.values, a.n);

    struct run c = run_spec("{\"source\":{\"type\":\"range\",\"stop\":1000},\"ops\":[{\"op\":\"shuffle\","
                            "\"buffer_size\":100,\"seed\":8}]}",
                            NULL);
    assert_each(&c, 1000, 1);
    cr_assert(memcmp(a.values, c.values, 1000 * sizeof *a.values) != 0, "seeds 7 and 8 gave the same order");

    /* A buffer of 100 only moves an element ahead by less than 100 places. */
    for (size_t i = 0; i < a.n; i++)
        cr_assert(a.values[i] < (int64_t)i + 100, "%" PRId64 " at %zu", a.values[i], i);
    run_free(&a);
    run_free(&b);
    run_free(&c);
}

/* The shuffle's order is the buffer algorithm's, draw for draw, at user
 * sizes: fill the buffer, output a slot drawn with sl_rng_below() over the
 * elements held and move the last into it; at the input's end, drain it
 * the same way; each epoch from sl__epoch_seed(). Whatever the shuffle
 * does to go faster (its draws made ahead), a trainer that sets a seed gets
 * the order it got before. Seeded: SLUICE_TEST_SEED repeats a run. */
static void shuffle_model(uint64_t n, uint64_t buffer, uint64_t seed, uint64_t epochs, int64_t *want)
{
    int64_t *buf = malloc((buffer < n ? buffer : n) * sizeof *buf + 1);
    cr_assert_not_null(buf);
    size_t out = 0;
    for (uint64_t e = 0; e < epochs; e++) {
        sl_rng_t rng;
        sl_rng_seed(&rng, sl__epoch_seed(seed, e));
        uint64_t next = 0, held = 0;
        for (;;) {
            while (next < n && held < buffer)
                buf[held++] = (int64_t)next++;
            if (held == 0)
                break;
            uint64_t i = sl_rng_below(&rng, held);
            want[out++] = buf[i];
            buf[i] = buf[--held];
        }
    }
    free(buf);
}

Test(pipeline, shuffle_order_is_the_buffer_algorithms_at_user_sizes, .timeout = 600)
{
    const char *env = getenv("SLUICE_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    fprintf(stderr, "pipeline.shuffle_order_is_the_buffer_algorithms_at_user_sizes: seed %u (SLUICE_TEST_SEED=%u "
                    "repeats it)\n", seed, seed);
    sl_rng_t draw;
    sl_rng_seed(&draw, seed);
    /* Round 0: a million elements through a shuffle(100000) over two
     * epochs; then sizes drawn, buffers from 1 to past the input. */
    for (int round = 0; round < 8; round++) {
        uint64_t n = round == 0 ? 1000000 : 1 + sl_rng_below(&draw, 300000);
        uint64_t buffer = round == 0 ? 100000 : 1 + sl_rng_below(&draw, round % 3 == 0 ? 2 * n : 200000);
        uint64_t epochs = round == 0 ? 2 : 1 + sl_rng_below(&draw, 3);
        uint64_t s = sl_rng_next(&draw) >> 1;
        char json[512];
        snprintf(json, sizeof json,
                 "{\"source\":{\"type\":\"range\",\"stop\":%" PRIu64 "},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":%"
                 PRIu64 ",\"seed\":%" PRIu64 "},{\"op\":\"repeat\",\"count\":%" PRIu64
                 "},{\"op\":\"batch\",\"batch_size\":1024}]}",
                 n, buffer, s, epochs);
        struct run r = run_spec(json, NULL);
        cr_assert_eq(r.rc, 1, "round %d: %s", round, r.errmsg);
        cr_assert_eq(r.n, n * epochs, "round %d: %zu elements of %" PRIu64, round, r.n, n * epochs);
        int64_t *want = malloc(n * epochs * sizeof *want);
        cr_assert_not_null(want);
        shuffle_model(n, buffer, s, epochs, want);
        for (size_t i = 0; i < r.n; i++)
            if (r.values[i] != want[i])
                cr_assert_fail("round %d (range %" PRIu64 ", buffer %" PRIu64 ", %" PRIu64
                               " epochs): element %zu is %" PRId64 ", the buffer algorithm gives %" PRId64,
                               round, n, buffer, epochs, i, r.values[i], want[i]);
        free(want);
        run_free(&r);
    }
}

Test(pipeline, shuffle_buffer_larger_than_data_and_of_one)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":50},\"ops\":[{\"op\":\"shuffle\","
                            "\"buffer_size\":16777216,\"seed\":1}]}",
                            NULL);
    assert_each(&r, 50, 1);
    cr_assert_not(is_identity(&r));
    run_free(&r);
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":50},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":1}]}",
                 NULL);
    cr_assert(is_identity(&r) && r.n == 50);
    run_free(&r);
}

Test(pipeline, shuffle_without_seed_is_a_permutation)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":300},\"ops\":[{\"op\":\"shuffle\","
                            "\"buffer_size\":300}]}",
                            NULL);
    cr_assert_eq(r.rc, 1);
    assert_each(&r, 300, 1);
    run_free(&r);
}

Test(pipeline, reshuffle_each_iteration)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":64},\"ops\":[{\"op\":\"shuffle\","
                            "\"buffer_size\":64,\"seed\":3},{\"op\":\"repeat\",\"count\":2}]}",
                            NULL);
    assert_each(&r, 64, 2);
    cr_assert(memcmp(r.values, r.values + 64, 64 * sizeof *r.values) != 0, "both epochs in the same order");
    struct run again = run_spec("{\"source\":{\"type\":\"range\",\"stop\":64},\"ops\":[{\"op\":\"shuffle\","
                                "\"buffer_size\":64,\"seed\":3},{\"op\":\"repeat\",\"count\":2}]}",
                                NULL);
    assert_values(&again, r.values, r.n);
    run_free(&again);

    struct run same = run_spec("{\"source\":{\"type\":\"range\",\"stop\":64},\"ops\":[{\"op\":\"shuffle\","
                               "\"buffer_size\":64,\"seed\":3,\"reshuffle_each_iteration\":false},"
                               "{\"op\":\"repeat\",\"count\":2}]}",
                               NULL);
    assert_each(&same, 64, 2);
    cr_assert(memcmp(same.values, same.values + 64, 64 * sizeof *same.values) == 0, "epochs differ");
    /* Epoch 0 does not depend on reshuffling. */
    cr_assert(memcmp(same.values, r.values, 64 * sizeof *r.values) == 0);
    run_free(&same);
    run_free(&r);
}

Test(pipeline, shuffled_batches)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":40},\"ops\":[{\"op\":\"batch\","
                            "\"batch_size\":4},{\"op\":\"shuffle\",\"buffer_size\":10,\"seed\":5}]}",
                            NULL);
    assert_each(&r, 40, 1);
    cr_assert_eq(r.batches, 10);
    for (size_t i = 0; i < r.n; i += 4) {
        cr_assert_eq(r.values[i] % 4, 0, "batches stay whole");
        for (size_t k = 1; k < 4; k++)
            cr_assert_eq(r.values[i + k], r.values[i] + (int64_t)k);
    }
    run_free(&r);
}

Test(pipeline, shard_keeps_every_nth_element)
{
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"shard\","
                            "\"num_shards\":3,\"index\":1}]}",
                            NULL);
    cr_assert_eq(r.rc, 1);
    ASSERT_VALUES(r, 1, 4, 7);
    run_free(&r);

    /* Each iteration of a repeat counts from 0 again; batch after shard. */
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":7},\"ops\":[{\"op\":\"shard\",\"num_shards\":2,"
                 "\"index\":0},{\"op\":\"repeat\",\"count\":2},{\"op\":\"batch\",\"batch_size\":3}]}",
                 NULL);
    cr_assert_eq(r.rc, 1);
    ASSERT_VALUES(r, 0, 2, 4, 6, 0, 2, 4, 6);
    ASSERT_SIZES(r, 3, 3, 2);
    run_free(&r);

    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":5},\"ops\":[{\"op\":\"shard\",\"num_shards\":1,"
                 "\"index\":0}]}",
                 NULL);
    ASSERT_VALUES(r, 0, 1, 2, 3, 4);
    run_free(&r);

    /* Every shard together holds every element once. */
    int64_t seen[50] = {0};
    for (int i = 0; i < 4; i++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"source\":{\"type\":\"range\",\"stop\":50},\"ops\":[{\"op\":\"shard\",\"num_shards\":4,"
                 "\"index\":%d}]}",
                 i);
        r = run_spec(json, NULL);
        for (size_t k = 0; k < r.n; k++)
            seen[r.values[k]]++;
        run_free(&r);
    }
    for (int v = 0; v < 50; v++)
        cr_assert_eq(seen[v], 1);
}

/* ---- limits and options ---- */

Test(pipeline, max_batch_bytes)
{
    sl_pipeline_opts_t o = {.sharding = SL_SHARDING_OFF, .max_batch_bytes = 79};
    struct run r =
        run_spec("{\"source\":{\"type\":\"range\",\"stop\":100},\"ops\":[{\"op\":\"batch\",\"batch_size\":10}]}", &o);
    cr_assert_eq(r.rc, SL_ETOOBIG);
    cr_assert_eq(r.n, 0);
    cr_assert_str_eq(r.errmsg, "ops[0] (batch): batch of 10 elements of 8 bytes each exceeds max_batch_bytes 79");
    run_free(&r);

    o.max_batch_bytes = 80;
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":100},\"ops\":[{\"op\":\"batch\",\"batch_size\":10}]}", &o);
    cr_assert_eq(r.rc, 1);
    cr_assert_eq(r.batches, 10);
    run_free(&r);

    o.max_batch_bytes = 7;
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":100},\"ops\":[{\"op\":\"take\",\"count\":3}]}", &o);
    cr_assert_eq(r.rc, SL_ETOOBIG);
    cr_assert_str_eq(r.errmsg, "ops[0] (take): an element of 8 bytes exceeds max_batch_bytes 7");
    run_free(&r);

    /* The largest batch_size and the default limit: refused before any
     * memory is taken for it. */
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":100},\"ops\":[{\"op\":\"batch\",\"batch_size\":100},"
                 "{\"op\":\"batch\",\"batch_size\":1048576}]}",
                 NULL);
    cr_assert_eq(r.rc, SL_ETOOBIG);
    cr_assert_str_eq(r.errmsg, "ops[1] (batch): batch of 1048576 elements of 800 bytes each exceeds "
                               "max_batch_bytes 268435456");
    run_free(&r);
}

Test(pipeline, refused_options)
{
    sl_spec_t *spec = NULL;
    sl_pipeline_t *p = (sl_pipeline_t *)1;
    char err[256];
    const char *json = "{\"source\":{\"type\":\"range\",\"stop\":5}}";
    cr_assert_eq(sl_spec_parse(json, strlen(json), &spec, err, sizeof err), 0);

    sl_pipeline_opts_t o = {.sharding = SL_SHARDING_FILE_OR_DATA, .num_workers = 2};
    cr_assert_eq(sl_pipeline_create(spec, &o, &p, err, sizeof err), SL_EINVAL);
    cr_assert_null(p);
    cr_assert_str_eq(err, "pipeline: sharding policy file_or_data is resolved by the dispatcher, not run");

    o = (sl_pipeline_opts_t){.sharding = SL_SHARDING_DATA, .worker_index = 2, .num_workers = 2};
    cr_assert_eq(sl_pipeline_create(spec, &o, &p, err, sizeof err), SL_EINVAL);
    cr_assert_str_eq(err, "pipeline: worker index 2 is not below the 2 workers of data sharding");

    o = (sl_pipeline_opts_t){.sharding = SL_SHARDING_DYNAMIC};
    cr_assert_eq(sl_pipeline_create(spec, &o, &p, err, sizeof err), SL_EINVAL);
    cr_assert_str_eq(err, "pipeline: DYNAMIC sharding needs a split source");
    sl_spec_free(spec);
}

/* ---- DYNAMIC ---- */

/* A dispatcher stand-in: for each epoch hands out [0, chunk), [chunk,
 * 2 chunk), ... up to card, then says the epoch is over. */
struct splits {
    uint64_t card, chunk;
    uint64_t next[16]; /* next begin, per epoch */
    int calls;
    int fail_at; /* the call that fails (1-based), 0: none */
    int fail_code;
    uint64_t epochs_seen; /* bit e: epoch e was asked for */
    uint64_t skip_epoch;  /* an epoch whose splits "other workers" took, or UINT64_MAX */
    bool bad_split;       /* hand out a split past the end */
    uint32_t file_index;  /* of every split: a range has only file 0 */
    uint64_t finished_from; /* splits_finished(): none of any epoch once this one was asked for (0: never) */
};

static int next_split(void *arg, uint64_t epoch, sl_split_t *split)
{
    struct splits *s = arg;
    uint64_t *begin = &split->begin, *end = &split->end;
    split->file_index = s->file_index;
    s->calls++;
    cr_assert_lt(epoch, 16);
    s->epochs_seen |= UINT64_C(1) << epoch;
    if (s->fail_at && s->calls == s->fail_at)
        return s->fail_code;
    if (s->bad_split) {
        *begin = s->card - 1;
        *end = s->card + 1;
        return 0;
    }
    if (epoch == s->skip_epoch || s->next[epoch] >= s->card)
        return 1;
    *begin = s->next[epoch];
    *end = s->next[epoch] + s->chunk < s->card ? s->next[epoch] + s->chunk : s->card;
    s->next[epoch] = *end;
    return 0;
}

static sl_pipeline_opts_t dynamic(struct splits *s)
{
    return (sl_pipeline_opts_t){.sharding = SL_SHARDING_DYNAMIC, .splits = {next_split, s}};
}

Test(pipeline, dynamic_single_epoch)
{
    struct splits s = {.card = 35, .chunk = 10, .skip_epoch = UINT64_MAX};
    sl_pipeline_opts_t o = dynamic(&s);
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"start\":100,\"stop\":135}}", &o);
    cr_assert_eq(r.rc, 1, "%s", r.errmsg);
    cr_assert_eq(r.n, 35);
    for (size_t i = 0; i < r.n; i++)
        cr_assert_eq(r.values[i], 100 + (int64_t)i);
    cr_assert_eq(s.epochs_seen, 1);
    cr_assert_eq(s.calls, 5); /* 4 splits and the end of the epoch */
    run_free(&r);
}

Test(pipeline, dynamic_repeat_reads_each_element_once_per_epoch)
{
    struct splits s = {.card = 35, .chunk = 10, .skip_epoch = UINT64_MAX};
    sl_pipeline_opts_t o = dynamic(&s);
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":35},\"ops\":[{\"op\":\"repeat\",\"count\":3},"
                            "{\"op\":\"batch\",\"batch_size\":8}]}",
                            &o);
    cr_assert_eq(r.rc, 1, "%s", r.errmsg);
    assert_each(&r, 35, 3);
    cr_assert_eq(s.epochs_seen, 7, "epochs 0, 1 and 2, and no other");
    /* Each epoch reads its splits in order. */
    for (size_t i = 0; i < r.n; i++)
        cr_assert_eq(r.values[i], (int64_t)(i % 35));
    run_free(&r);
}

Test(pipeline, dynamic_reads_only_its_splits)
{
    /* Other workers took [0, 20): this one is handed [20, 30) and [30, 35). */
    struct splits s = {.card = 35, .chunk = 10, .skip_epoch = UINT64_MAX, .next = {20}};
    sl_pipeline_opts_t o = dynamic(&s);
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":35}}", &o);
    cr_assert_eq(r.rc, 1);
    cr_assert_eq(r.n, 15);
    for (size_t i = 0; i < r.n; i++)
        cr_assert_eq(r.values[i], 20 + (int64_t)i);
    run_free(&r);
}

Test(pipeline, dynamic_forever_repeat_survives_an_epoch_without_splits)
{
    struct splits s = {.card = 4, .chunk = 4, .skip_epoch = 1};
    sl_pipeline_opts_t o = dynamic(&s);
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[{\"op\":\"repeat\"},"
                            "{\"op\":\"take\",\"count\":8}]}",
                            &o);
    cr_assert_eq(r.rc, 1, "%s", r.errmsg);
    ASSERT_VALUES(r, 0, 1, 2, 3, 0, 1, 2, 3);
    cr_assert_eq(s.epochs_seen, 7, "epoch 1 gave nothing, epoch 2 did");
    run_free(&r);
}

/* The split source's finished(): no split of any epoch will come once
 * epoch finished_from was asked for (a drained task). */
static bool splits_finished(void *arg)
{
    const struct splits *s = arg;
    return s->finished_from > 0 && (s->epochs_seen >> s->finished_from) != 0;
}

/* A drained task's forever repeat: epochs 0 and 1 have splits, then the
 * source says none of any epoch will come, and the repeat ends at the first
 * empty iteration; it used to go on through empty epochs without end (here
 * next_split's assertion stops it at epoch 16). */
Test(pipeline, dynamic_forever_repeat_ends_once_no_split_will_come)
{
    struct splits s = {.card = 4, .chunk = 4, .skip_epoch = UINT64_MAX, .finished_from = 2};
    for (int e = 2; e < 16; e++)
        s.next[e] = s.card;
    sl_pipeline_opts_t o = dynamic(&s);
    o.splits.finished = splits_finished;
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[{\"op\":\"repeat\"}]}", &o);
    cr_assert_eq(r.rc, 1, "%s", r.errmsg);
    ASSERT_VALUES(r, 0, 1, 2, 3, 0, 1, 2, 3);
    cr_assert_eq(s.epochs_seen, 7, "epochs 0 to 2 asked for, and no later one");
    run_free(&r);
}

Test(pipeline, dynamic_empty_source_ends_a_forever_repeat)
{
    struct splits s = {.card = 0, .chunk = 4, .skip_epoch = UINT64_MAX};
    sl_pipeline_opts_t o = dynamic(&s);
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":0},\"ops\":[{\"op\":\"repeat\"}]}", &o);
    cr_assert_eq(r.rc, 1);
    cr_assert_eq(r.n, 0);
    cr_assert_eq(s.calls, 0);
    run_free(&r);
}

/* Every epoch's splits to this worker: the whole range of card records in
 * one split, then the end of the epoch. */
struct every_epoch {
    uint64_t card, next_epoch, splits;
    uint64_t every; /* 0: every split holds the range; else only those of epochs every apart */
};

static int whole_epoch_split(void *arg, uint64_t epoch, sl_split_t *split)
{
    struct every_epoch *s = arg;
    if (epoch < s->next_epoch)
        return 1;
    s->next_epoch = epoch + 1;
    s->splits++;
    bool empty = s->every && epoch % s->every != 0;
    *split = (sl_split_t){.epoch = epoch, .begin = 0, .end = empty ? 0 : s->card};
    return 0;
}

/* A forever repeat over ops that drop every element takes epoch after
 * epoch of splits: it used to run without end (each epoch a hand-out of the
 * dispatcher's); SL_REPEAT_EMPTY_MAX empty iterations in a row fail it.
 * One element in an iteration starts the count again. */
Test(pipeline, dynamic_forever_repeat_of_nothing_fails_after_its_bound, .timeout = 120)
{
    struct every_epoch s = {.card = 10};
    sl_pipeline_opts_t o = {.sharding = SL_SHARDING_DYNAMIC, .splits = {whole_epoch_split, &s}};
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"skip\",\"count\":100},"
                            "{\"op\":\"repeat\"}]}",
                            &o);
    cr_assert_eq(r.rc, SL_EDATA, "%d %s", r.rc, r.errmsg);
    cr_assert_eq(r.n, 0);
    cr_assert_eq(s.splits, SL_REPEAT_EMPTY_MAX, "%" PRIu64, s.splits);
    cr_assert(strstr(r.errmsg, "ops[1] (repeat): 1048576 iterations in a row took splits and yielded nothing: the ops "
                               "before it drop every element, or the data holds none") != NULL,
              "%s", r.errmsg);
    run_free(&r);

    /* Records in every SL_REPEAT_EMPTY_MAX-th epoch only: each run of empty
     * iterations stays one below the bound, and the take ends the repeat. */
    struct every_epoch t = {.card = 1, .every = SL_REPEAT_EMPTY_MAX};
    o.splits.arg = &t;
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":1},\"ops\":[{\"op\":\"repeat\"},"
                 "{\"op\":\"take\",\"count\":3}]}",
                 &o);
    cr_assert_eq(r.rc, 1, "%d %s", r.rc, r.errmsg);
    ASSERT_VALUES(r, 0, 0, 0);
    cr_assert_eq(t.splits, 2 * SL_REPEAT_EMPTY_MAX + 1, "%" PRIu64, t.splits);
    run_free(&r);
}

Test(pipeline, dynamic_split_error_propagates)
{
    struct splits s = {.card = 35, .chunk = 10, .skip_epoch = UINT64_MAX, .fail_at = 3, .fail_code = -ECONNRESET};
    sl_pipeline_opts_t o = dynamic(&s);
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":35},\"ops\":[{\"op\":\"batch\","
                            "\"batch_size\":5}]}",
                            &o);
    cr_assert_eq(r.rc, -ECONNRESET);
    ASSERT_VALUES(r, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19);
    char want[256];
    snprintf(want, sizeof want, "source (range): next_split for epoch 0 failed: %s", strerror(ECONNRESET));
    cr_assert_str_eq(r.errmsg, want);
    run_free(&r);

    /* A project error code passes through as it is, also mid-batch. */
    s = (struct splits){.card = 35, .chunk = 10, .skip_epoch = UINT64_MAX, .fail_at = 2, .fail_code = SL_ECANCELLED};
    o = dynamic(&s);
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":35},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":4},"
                 "{\"op\":\"batch\",\"batch_size\":3}]}",
                 &o);
    cr_assert_eq(r.rc, SL_ECANCELLED);
    cr_assert_str_eq(r.errmsg, "source (range): next_split for epoch 0 failed: job cancelled");
    run_free(&r);
}

Test(pipeline, dynamic_split_outside_the_source)
{
    struct splits s = {.card = 10, .chunk = 10, .skip_epoch = UINT64_MAX, .bad_split = true};
    sl_pipeline_opts_t o = dynamic(&s);
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":10}}", &o);
    cr_assert_eq(r.rc, SL_EPROTO);
    cr_assert_str_eq(r.errmsg, "source (range): split [9, 11) of epoch 0 is not inside the source's 10 elements");
    run_free(&r);

    s = (struct splits){.card = 10, .chunk = 10, .skip_epoch = UINT64_MAX, .file_index = 1};
    o = dynamic(&s);
    r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":10}}", &o);
    cr_assert_eq(r.rc, SL_EPROTO);
    cr_assert_str_eq(r.errmsg, "source (range): split of epoch 0 names file 1; a range has no files");
    run_free(&r);
}

Test(pipeline, destroy_mid_stream_frees_everything)
{
    /* Run under ASan: elements held in shuffle and batch are freed. */
    sl_pipeline_t *p = make("{\"source\":{\"type\":\"range\",\"stop\":100000},\"ops\":[{\"op\":\"shuffle\","
                            "\"buffer_size\":1000},{\"op\":\"batch\",\"batch_size\":7},{\"op\":\"shuffle\","
                            "\"buffer_size\":5},{\"op\":\"repeat\"}]}",
                            NULL);
    struct run r = run_pipeline(p, 20);
    cr_assert_eq(r.batches, 20);
    cr_assert_eq(r.n, 140);
    sl_pipeline_destroy(p);
    run_free(&r);
}

/* ---- the bulk path ----
 *
 * range offers batch its rows in bulk (take, skip and repeat pass that on),
 * and batch then fills its block with no element in between. These tests
 * pin that path to the element-by-element one: each spec runs as it is, and
 * again with a shuffle of buffer 1 just before the batch (it yields its
 * input in order, element by element, and offers no bulk path). Both runs
 * must agree on every value, every batch size, the end or the error and its
 * message, and the splits asked for; and both must give what the ops mean,
 * computed here from the range. */

struct seq {
    int64_t *v;
    size_t n;
};

static struct seq seq_range(int64_t start, int64_t step, uint64_t count)
{
    struct seq s = {calloc(count ? count : 1, sizeof(int64_t)), count};
    cr_assert_not_null(s.v);
    for (uint64_t i = 0; i < count; i++)
        s.v[i] = (int64_t)((uint64_t)start + i * (uint64_t)step);
    return s;
}

/* skip and take as the ops mean them: k < 0 is "all". */
static void seq_skip(struct seq *s, int64_t k)
{
    size_t drop = k < 0 || (uint64_t)k > s->n ? s->n : (size_t)k;
    memmove(s->v, s->v + drop, (s->n - drop) * sizeof *s->v);
    s->n -= drop;
}

static void seq_take(struct seq *s, int64_t k)
{
    if (k >= 0 && (uint64_t)k < s->n)
        s->n = (size_t)k;
}

static void seq_repeat(struct seq *s, int times)
{
    int64_t *v = calloc(s->n * (size_t)times + 1, sizeof *v);
    cr_assert_not_null(v);
    for (int t = 0; t < times; t++)
        memcpy(v + s->n * (size_t)t, s->v, s->n * sizeof *v);
    free(s->v);
    s->v = v;
    s->n *= (size_t)times;
}

/* Asserts that r is want in batches of size (the last one short unless
 * drop). */
static void assert_batched(const struct run *r, const struct seq *want, uint64_t size, bool drop)
{
    size_t n = drop ? want->n / size * size : want->n;
    assert_values(r, want->v, n);
    size_t batches = (n + size - 1) / size;
    cr_assert_eq(r->batches, batches, "got %zu batches, want %zu", r->batches, batches);
    for (size_t i = 0; i < batches && i < sizeof r->sizes / sizeof r->sizes[0]; i++) {
        uint64_t w = i + 1 < batches || n % size == 0 ? size : n % size;
        cr_assert_eq(r->sizes[i], w, "batch %zu has %" PRIu64 " elements, want %" PRIu64, i, r->sizes[i], w);
    }
}

/* Runs {"source": source, "ops": [ops..., batch]} on the bulk path and on
 * the element path (see above), under DYNAMIC with a fresh copy of *dyn
 * when dyn is set, asserts they agree and returns the bulk run. */
static struct run run_both(const char *source, const char *ops, const char *batch, const struct splits *dyn)
{
    char bulk_json[1024], elem_json[1024];
    const char *sep = ops[0] ? "," : "";
    int len = snprintf(bulk_json, sizeof bulk_json, "{\"source\":%s,\"ops\":[%s%s%s]}", source, ops, sep, batch);
    cr_assert_lt((size_t)len, sizeof bulk_json);
    len = snprintf(elem_json, sizeof elem_json,
                   "{\"source\":%s,\"ops\":[%s%s{\"op\":\"shuffle\",\"buffer_size\":1},%s]}", source, ops, sep,
                   batch);
    cr_assert_lt((size_t)len, sizeof elem_json);

    struct splits s_bulk = {0}, s_elem = {0};
    sl_pipeline_opts_t o_bulk, o_elem;
    if (dyn) {
        s_bulk = *dyn;
        s_elem = *dyn;
        o_bulk = dynamic(&s_bulk);
        o_elem = dynamic(&s_elem);
    }
    struct run a = run_spec(bulk_json, dyn ? &o_bulk : NULL);
    struct run b = run_spec(elem_json, dyn ? &o_elem : NULL);
    cr_assert_eq(a.rc, b.rc, "%s: ends with %d in bulk, %d element by element (%s | %s)", bulk_json, a.rc, b.rc,
                 a.errmsg, b.errmsg);
    cr_assert_str_eq(a.errmsg, b.errmsg, "%s", bulk_json);
    cr_assert_leq(b.batches, sizeof b.sizes / sizeof b.sizes[0], "%s: too many batches to compare", bulk_json);
    assert_values(&a, b.values, b.n);
    assert_sizes(&a, b.sizes, b.batches);
    if (dyn) {
        cr_assert_eq(s_bulk.calls, s_elem.calls, "%s: %d split requests in bulk, %d element by element", bulk_json,
                     s_bulk.calls, s_elem.calls);
        cr_assert_eq(s_bulk.epochs_seen, s_elem.epochs_seen, "%s", bulk_json);
    }
    run_free(&b);
    return a;
}

static const char *batch_op(uint64_t size, bool drop, char *buf, size_t len)
{
    snprintf(buf, len, "{\"op\":\"batch\",\"batch_size\":%" PRIu64 ",\"drop_remainder\":%s}", size,
             drop ? "true" : "false");
    return buf;
}

Test(pipeline, bulk_off_matches_elements)
{
    static const struct {
        const char *source;
        int64_t start, step;
        uint64_t count, batch;
    } cases[] = {
        {"{\"type\":\"range\",\"stop\":1000}", 0, 1, 1000, 64},
        {"{\"type\":\"range\",\"stop\":200}", 0, 1, 200, 1},
        {"{\"type\":\"range\",\"stop\":1000}", 0, 1, 1000, 1000},
        {"{\"type\":\"range\",\"stop\":1000}", 0, 1, 1000, 5000},
        {"{\"type\":\"range\",\"start\":5,\"stop\":-1000,\"step\":-7}", 5, -7, 144, 10},
        {"{\"type\":\"range\",\"start\":5,\"stop\":-1000,\"step\":-7}", 5, -7, 144, 3},
        {"{\"type\":\"range\",\"start\":-9223372036854775808,\"stop\":9223372036854775807,"
         "\"step\":9223372036854775807}",
         INT64_MIN, INT64_MAX, 3, 2},
        {"{\"type\":\"range\",\"stop\":0}", 0, 1, 0, 4},
    };
    char b[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int drop = 0; drop < 2; drop++) {
            struct seq want = seq_range(cases[i].start, cases[i].step, cases[i].count);
            struct run r = run_both(cases[i].source, "", batch_op(cases[i].batch, drop, b, sizeof b), NULL);
            cr_assert_eq(r.rc, 1, "%s", r.errmsg);
            assert_batched(&r, &want, cases[i].batch, drop);
            run_free(&r);
            free(want.v);
        }
    }
}

Test(pipeline, bulk_dynamic_batches_span_splits)
{
    static const struct {
        const char *source;
        int64_t start, step;
        uint64_t count, chunk, batch;
    } cases[] = {
        {"{\"type\":\"range\",\"stop\":1000}", 0, 1, 1000, 7, 64},
        {"{\"type\":\"range\",\"stop\":1000}", 0, 1, 1000, 7, 7},
        {"{\"type\":\"range\",\"stop\":2500}", 0, 1, 2500, 1000, 300},
        {"{\"type\":\"range\",\"stop\":2500}", 0, 1, 2500, 1000, 1000},
        {"{\"type\":\"range\",\"stop\":50}", 0, 1, 50, 1, 3},
        {"{\"type\":\"range\",\"stop\":50}", 0, 1, 50, 1000, 64},
        {"{\"type\":\"range\",\"start\":5,\"stop\":-1000,\"step\":-7}", 5, -7, 144, 7, 10},
        {"{\"type\":\"range\",\"start\":5,\"stop\":-1000,\"step\":-7}", 5, -7, 144, 1000, 64},
    };
    char b[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int drop = 0; drop < 2; drop++) {
            struct splits s = {.card = cases[i].count, .chunk = cases[i].chunk, .skip_epoch = UINT64_MAX};
            struct seq want = seq_range(cases[i].start, cases[i].step, cases[i].count);
            struct run r = run_both(cases[i].source, "", batch_op(cases[i].batch, drop, b, sizeof b), &s);
            cr_assert_eq(r.rc, 1, "%s", r.errmsg);
            assert_batched(&r, &want, cases[i].batch, drop);
            run_free(&r);
            free(want.v);
        }
    }
}

Test(pipeline, bulk_take_skip_between_range_and_batch)
{
    static const struct {
        const char *ops;
        int64_t skip1, take1, skip2, take2; /* applied in that order; INT64_MIN: not there */
    } cases[] = {
        {"{\"op\":\"skip\",\"count\":13},{\"op\":\"take\",\"count\":500}", 13, 500, INT64_MIN, INT64_MIN},
        {"{\"op\":\"take\",\"count\":500},{\"op\":\"skip\",\"count\":13}", INT64_MIN, 500, 13, INT64_MIN},
        {"{\"op\":\"skip\",\"count\":3},{\"op\":\"skip\",\"count\":4},{\"op\":\"take\",\"count\":100},"
         "{\"op\":\"take\",\"count\":50}",
         7, 100, INT64_MIN, 50},
        {"{\"op\":\"skip\",\"count\":-1}", -1, INT64_MIN, INT64_MIN, INT64_MIN},
        {"{\"op\":\"take\",\"count\":0}", INT64_MIN, 0, INT64_MIN, INT64_MIN},
        {"{\"op\":\"skip\",\"count\":2000}", 2000, INT64_MIN, INT64_MIN, INT64_MIN},
        {"{\"op\":\"skip\",\"count\":999}", 999, INT64_MIN, INT64_MIN, INT64_MIN},
        {"{\"op\":\"take\",\"count\":5000},{\"op\":\"skip\",\"count\":0}", INT64_MIN, 5000, 0, INT64_MIN},
        {"{\"op\":\"take\",\"count\":-1},{\"op\":\"skip\",\"count\":64}", INT64_MIN, -1, 64, INT64_MIN},
    };
    static const uint64_t sizes[] = {64, 7, 1};
    char b[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            for (int mode = 0; mode < 4; mode++) {
                bool drop = mode & 1, dyn = mode & 2;
                struct splits s = {.card = 1000, .chunk = 7, .skip_epoch = UINT64_MAX};
                struct seq want = seq_range(0, 1, 1000);
                if (cases[i].skip1 != INT64_MIN)
                    seq_skip(&want, cases[i].skip1);
                if (cases[i].take1 != INT64_MIN)
                    seq_take(&want, cases[i].take1);
                if (cases[i].skip2 != INT64_MIN)
                    seq_skip(&want, cases[i].skip2);
                if (cases[i].take2 != INT64_MIN)
                    seq_take(&want, cases[i].take2);
                /* Batches of 1 over up to 1000 elements would pass the 256
                 * sizes a run records. */
                if (sizes[k] == 1 && want.n > 256) {
                    free(want.v);
                    continue;
                }
                struct run r = run_both("{\"type\":\"range\",\"stop\":1000}", cases[i].ops,
                                        batch_op(sizes[k], drop, b, sizeof b), dyn ? &s : NULL);
                cr_assert_eq(r.rc, 1, "%s", r.errmsg);
                assert_batched(&r, &want, sizes[k], drop);
                run_free(&r);
                free(want.v);
            }
        }
    }
}

Test(pipeline, bulk_repeat_under_dynamic)
{
    static const struct {
        const char *ops;
        int64_t skip_before, take_before, skip_after, take_after; /* around the repeat of 3; -2: not there */
    } cases[] = {
        {"{\"op\":\"repeat\",\"count\":3}", -2, -2, -2, -2},
        {"{\"op\":\"repeat\",\"count\":3},{\"op\":\"skip\",\"count\":5},{\"op\":\"take\",\"count\":250}", -2, -2, 5,
         250},
        {"{\"op\":\"skip\",\"count\":5},{\"op\":\"take\",\"count\":50},{\"op\":\"repeat\",\"count\":3}", 5, 50, -2, -2},
        /* After each reset, skip's first pull is a bulk one, and under
         * DYNAMIC it skips over two splits. */
        {"{\"op\":\"skip\",\"count\":13},{\"op\":\"take\",\"count\":30},{\"op\":\"repeat\",\"count\":3}", 13, 30, -2,
         -2},
    };
    static const uint64_t sizes[] = {64, 7, 100};
    char b[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            for (int mode = 0; mode < 4; mode++) {
                bool drop = mode & 1, dyn = mode & 2;
                struct splits s = {.card = 100, .chunk = 7, .skip_epoch = UINT64_MAX};
                struct seq want = seq_range(0, 1, 100);
                if (cases[i].skip_before != -2)
                    seq_skip(&want, cases[i].skip_before);
                if (cases[i].take_before != -2)
                    seq_take(&want, cases[i].take_before);
                seq_repeat(&want, 3);
                if (cases[i].skip_after != -2)
                    seq_skip(&want, cases[i].skip_after);
                if (cases[i].take_after != -2)
                    seq_take(&want, cases[i].take_after);
                struct run r = run_both("{\"type\":\"range\",\"stop\":100}", cases[i].ops,
                                        batch_op(sizes[k], drop, b, sizeof b), dyn ? &s : NULL);
                cr_assert_eq(r.rc, 1, "%s", r.errmsg);
                assert_batched(&r, &want, sizes[k], drop);
                run_free(&r);
                free(want.v);
            }
        }
    }
}

Test(pipeline, bulk_split_error_mid_batch)
{
    /* Splits of 7: request n (1-based) hands out [7 (n - 1), 7 n), so a
     * failure at request f leaves 7 (f - 1) elements, of which only the
     * whole batches arrive: the batch being filled is lost with the error. */
    static const int fail_at[] = {1, 2, 5, 10};
    static const uint64_t sizes[] = {10, 7, 64};
    char b[128];
    for (size_t i = 0; i < sizeof fail_at / sizeof fail_at[0]; i++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            for (int drop = 0; drop < 2; drop++) {
                struct splits s = {.card = 1000,
                                   .chunk = 7,
                                   .skip_epoch = UINT64_MAX,
                                   .fail_at = fail_at[i],
                                   .fail_code = -ECONNRESET};
                struct seq want = seq_range(0, 1, 7 * (uint64_t)(fail_at[i] - 1));
                struct run r = run_both("{\"type\":\"range\",\"stop\":1000}", "", batch_op(sizes[k], drop, b, sizeof b),
                                        &s);
                cr_assert_eq(r.rc, -ECONNRESET);
                char msg[256];
                snprintf(msg, sizeof msg, "source (range): next_split for epoch 0 failed: %s", strerror(ECONNRESET));
                cr_assert_str_eq(r.errmsg, msg);
                assert_batched(&r, &want, sizes[k], true);
                run_free(&r);
                free(want.v);
            }
        }
    }

    /* In the second epoch of a repeat, behind a skip and a take: epoch 0
     * asks 3 splits and the end (4 requests), so request 6 fails after
     * [0, 7) of epoch 1. */
    struct splits s = {.card = 20, .chunk = 7, .skip_epoch = UINT64_MAX, .fail_at = 6, .fail_code = SL_ECANCELLED};
    struct run r = run_both("{\"type\":\"range\",\"stop\":20}",
                            "{\"op\":\"repeat\",\"count\":3},{\"op\":\"skip\",\"count\":2},"
                            "{\"op\":\"take\",\"count\":50}",
                            batch_op(8, false, b, sizeof b), &s);
    cr_assert_eq(r.rc, SL_ECANCELLED);
    cr_assert_str_eq(r.errmsg, "source (range): next_split for epoch 1 failed: job cancelled");
    /* 2..19 of epoch 0 and 0..6 of epoch 1: 25 elements, 3 whole batches. */
    ASSERT_VALUES(r, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 0, 1, 2, 3, 4, 5);
    ASSERT_SIZES(r, 8, 8, 8);
    run_free(&r);
}

/* ---- sl_wire_batch_validate ---- */

static sl_wire_batch_t *dense_batch(void)
{
    sl_wire_batch_t *b = calloc(1, sizeof *b);
    b->size = 32;
    b->data = calloc(1, b->size);
    b->num_elements = 2;
    b->num_components = 2;
    sl_component_t *c = &b->components[0];
    snprintf(c->name, sizeof c->name, "a");
    c->dtype = SL_DTYPE_INT32;
    c->rank = 2;
    c->shape[0] = 2;
    c->shape[1] = 2;
    c->offset = 0;
    c->length = 16;
    c = &b->components[1];
    snprintf(c->name, sizeof c->name, "b");
    c->dtype = SL_DTYPE_FLOAT64;
    c->rank = 1;
    c->shape[0] = 2;
    c->offset = 16;
    c->length = 16;
    return b;
}

static void expect_invalid(const sl_wire_batch_t *b, const char *want)
{
    char err[256] = "";
    cr_assert_eq(sl_wire_batch_validate(b, err, sizeof err), SL_EPROTO, "accepted, want %s", want);
    cr_assert_str_eq(err, want);
}

Test(batch, validate_dense)
{
    sl_wire_batch_t *b = dense_batch();
    char err[256];
    cr_assert_eq(sl_wire_batch_validate(b, err, sizeof err), 0, "%s", err);

    b->components[1].offset = 17;
    expect_invalid(b, "component 1 (\"b\"): bytes [17, +16) outside the 32 bytes of the batch");
    b->components[1].offset = UINT64_MAX;
    expect_invalid(b, "component 1 (\"b\"): bytes [18446744073709551615, +16) outside the 32 bytes of the batch");
    b->components[1].offset = 12;
    expect_invalid(b, "component 1 (\"b\"): offset 12 is not aligned to 8 bytes");
    b->components[1].offset = 16;
    b->components[1].length = 8;
    expect_invalid(b, "component 1 (\"b\"): 8 bytes for 2 values of float64");
    b->components[1].length = 16;
    b->components[0].shape[0] = INT64_MAX;
    b->components[0].shape[1] = INT64_MAX;
    expect_invalid(b, "component 0 (\"a\"): shape overflows");
    b->components[0].shape[0] = 2;
    b->components[0].shape[1] = -1;
    expect_invalid(b, "component 0 (\"a\"): dimension 1 is -1");
    b->components[0].shape[1] = 2;
    b->components[0].dtype = SL_DTYPE_COUNT_;
    expect_invalid(b, "component 0 (\"a\"): invalid dtype 15");
    b->components[0].dtype = SL_DTYPE_INT32;
    b->components[0].rank = SL_MAX_RANK + 1;
    expect_invalid(b, "component 0 (\"a\"): rank 9 out of [0, 8]");
    b->components[0].rank = 2;
    snprintf(b->components[1].name, SL_MAX_NAME, "a");
    expect_invalid(b, "component 1 (\"a\"): name also used by component 0");
    memset(b->components[1].name, 'x', SL_MAX_NAME);
    expect_invalid(b, "component 1: name empty or not terminated");
    snprintf(b->components[1].name, SL_MAX_NAME, "b");
    b->num_components = SL_MAX_COMPONENTS + 1;
    expect_invalid(b, "batch: 33 components, at most 32 allowed");
    b->num_components = 2;
    cr_assert_eq(sl_wire_batch_validate(b, NULL, 0), 0);
    sl_wire_batch_free(b);
    sl_wire_batch_free(NULL);
}

static void put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

Test(batch, validate_bytes_and_ragged)
{
    /* Two strings "ab" and "c": offsets 0, 2, 3 then the bytes. */
    sl_wire_batch_t *b = calloc(1, sizeof *b);
    b->size = 3 * 8 + 3 + 5 + 3 * 8;
    b->data = calloc(1, b->size);
    b->num_components = 2;
    sl_component_t *c = &b->components[0];
    snprintf(c->name, sizeof c->name, "s");
    c->dtype = SL_DTYPE_BYTES;
    c->rank = 1;
    c->shape[0] = 2;
    c->length = 27;
    put64(b->data, 0);
    put64(b->data + 8, 2);
    put64(b->data + 16, 3);
    memcpy(b->data + 24, "abc", 3);
    /* Ragged int8 rows [1, 2], [], [3]: values at 27, splits 0, 2, 2, 3 at 32. */
    c = &b->components[1];
    snprintf(c->name, sizeof c->name, "r");
    c->dtype = SL_DTYPE_INT8;
    c->rank = 2;
    c->shape[0] = 3;
    c->shape[1] = -1;
    c->offset = 27;
    c->length = 3;
    c->ragged = true;
    c->splits_offset = 32;
    c->splits_length = 32;
    b->size = 64;
    b->data = realloc(b->data, b->size);
    put64(b->data + 32, 0);
    put64(b->data + 40, 2);
    put64(b->data + 48, 2);
    put64(b->data + 56, 3);
    char err[256];
    cr_assert_eq(sl_wire_batch_validate(b, err, sizeof err), 0, "%s", err);

    put64(b->data + 8, 4);
    expect_invalid(b, "component 0 (\"s\"): string offset 2 is 3, after 4");
    put64(b->data + 8, 2);
    put64(b->data + 16, 2);
    expect_invalid(b, "component 0 (\"s\"): string offsets end at 2, the values hold 3 bytes");
    put64(b->data + 16, 3);
    put64(b->data, 1);
    expect_invalid(b, "component 0 (\"s\"): string offset 0 is 1, after 0");
    put64(b->data, 0);
    b->components[0].shape[0] = 4;
    expect_invalid(b, "component 0 (\"s\"): 27 bytes cannot hold the offsets of 4 strings");
    b->components[0].shape[0] = 2;

    put64(b->data + 48, 1);
    expect_invalid(b, "component 1 (\"r\"): row split 2 is 1, after 2");
    put64(b->data + 48, 2);
    put64(b->data + 56, 4);
    expect_invalid(b, "component 1 (\"r\"): 3 bytes for 4 values of int8");
    put64(b->data + 56, 3);
    b->components[1].splits_offset = 28;
    expect_invalid(b, "component 1 (\"r\"): row splits offset 28 is not aligned to 8 bytes");
    b->components[1].splits_offset = 32;
    b->components[1].splits_length = 24;
    expect_invalid(b, "component 1 (\"r\"): 24 bytes of row splits for 3 rows");
    b->components[1].splits_length = 32;
    b->components[1].splits_offset = 40;
    expect_invalid(b, "component 1 (\"r\"): row splits [40, +32) outside the 64 bytes of the batch");
    b->components[1].splits_offset = 32;
    cr_assert_eq(sl_wire_batch_validate(b, err, sizeof err), 0, "%s", err);
    sl_wire_batch_free(b);
}

/* GET /v1/tasks shows these: one stage per iterator, source first, each
 * counting the elements it yielded, with the time of its calls. */
Test(pipeline, op_stats_per_stage)
{
    sl_pipeline_t *p = make("{\"source\": {\"type\": \"range\", \"stop\": 1000},"
                            " \"ops\": [{\"op\": \"shuffle\", \"buffer_size\": 64, \"seed\": 1},"
                            "           {\"op\": \"take\", \"count\": 900},"
                            "           {\"op\": \"batch\", \"batch_size\": 10}]}",
                            NULL);
    sl_pipeline_op_stats_t st[8];
    cr_assert_eq(sl_pipeline_op_stats(p, st, 8), 4);
    cr_assert_eq(st[0].calls, 0);
    struct run r = run_pipeline(p, SIZE_MAX);
    cr_assert_eq(r.n, 900);
    cr_assert_eq(sl_pipeline_op_stats(p, st, 8), 4);
    cr_assert_eq(sl_pipeline_op_stats(p, st, 2), 2, "max bounds what is written");
    cr_assert_str_eq(st[0].label, "source (range)");
    cr_assert_str_eq(st[1].label, "ops[0] (shuffle)");
    cr_assert_str_eq(st[2].label, "ops[1] (take)");
    cr_assert_str_eq(st[3].label, "ops[2] (batch)");
    /* take stops after 900: shuffle yields 900 of its 1000 (it fills its
     * buffer of 64 first), batch 90 batches and then the end. */
    cr_assert_geq(st[0].elements, 900 + 63);
    cr_assert_eq(st[1].elements, 900);
    cr_assert_eq(st[2].elements, 900);
    cr_assert_eq(st[3].elements, 90);
    cr_assert_eq(st[3].calls, 91);
    for (int i = 0; i < 4; i++) {
        cr_assert_geq(st[i].calls, st[i].elements, "stage %d", i);
        cr_assert_gt(st[i].seconds, 0, "stage %d was timed", i);
        cr_assert_geq(st[i].self_seconds, 0);
        cr_assert_leq(st[i].self_seconds, st[i].seconds);
    }
    run_free(&r);
    sl_pipeline_destroy(p);
}

/* ---- static sharding ---- */

Test(pipeline, data_sharding_keeps_element_k_of_index_k_mod_n_before_the_ops)
{
    /* The shuffle comes after the DATA shard: worker 1 of 3 gets exactly
     * the values 1, 4, 7, ... whatever the shuffle does with them. */
    sl_pipeline_opts_t o = {.sharding = SL_SHARDING_DATA, .worker_index = 1, .num_workers = 3};
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":10},"
                            "\"ops\":[{\"op\":\"skip\",\"count\":1}]}", &o);
    cr_assert_eq(r.rc, 1, "%s", r.errmsg);
    ASSERT_VALUES(r, 4, 7); /* 1, 4, 7 then skip(1) */
    run_free(&r);
}

Test(pipeline, data_sharding_drops_restored_positions_held_as_runs_and_bitmaps)
{
    /* A static policy's restored job: the worker keeps the checkpoint's
     * positions as the dispatcher sends them, runs and bitmaps (a shuffle's
     * scattered holes crowd blocks of 4096). Every excluded element is
     * dropped before the DATA shard, and worker 1 of 3 gets every third of
     * the rest. */
    enum { N = 200000 };
    sl_posbits_t ex;
    sl_posbits_init(&ex, 100000);
    bool *gone = calloc(N, 1);
    cr_assert_not_null(gone);
    uint64_t rng = 17;
    for (uint64_t v = 0; v < N; v++) {
        gone[v] = v < 120000 ? sl_splitmix64(&rng) % 5 < 3 : v >= 150000 && v < 160000;
        if (gone[v])
            cr_assert_eq(sl_posbits_add_many(&ex, &(sl_posrun_t){0, 0, v, 1}, 1), 0);
    }
    cr_assert_gt(ex.nblocks, 20, "the test needs bitmaps: %zu", ex.nblocks);
    sl_pipeline_opts_t o = {.sharding = SL_SHARDING_DATA, .worker_index = 1, .num_workers = 3, .exclude = &ex};
    struct run r = run_spec("{\"source\":{\"type\":\"range\",\"stop\":200000},"
                            "\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}", &o);
    cr_assert_eq(r.rc, 1, "%s", r.errmsg);
    size_t k = 0, kept = 0;
    for (uint64_t v = 0; v < N; v++) {
        if (gone[v])
            continue;
        if (kept++ % 3 == 1) {
            cr_assert_lt(k, r.n);
            cr_assert_eq(r.values[k], (int64_t)v, "value %zu is %" PRId64 ", want %" PRIu64, k, r.values[k], v);
            k++;
        }
    }
    cr_assert_eq(k, r.n);
    run_free(&r);
    free(gone);
    sl_posbits_clear(&ex);
}

Test(pipeline, hint_binds_the_shard_op_and_other_policies_refuse_it)
{
    const char *json = "{\"source\":{\"type\":\"range\",\"stop\":10},"
                       "\"ops\":[{\"op\":\"shard\",\"num_shards\":\"hint\",\"index\":\"hint\"}]}";
    sl_pipeline_opts_t o = {.sharding = SL_SHARDING_HINT, .worker_index = 2, .num_workers = 4};
    struct run r = run_spec(json, &o);
    cr_assert_eq(r.rc, 1, "%s", r.errmsg);
    ASSERT_VALUES(r, 2, 6);
    run_free(&r);

    sl_spec_t *spec = NULL;
    sl_pipeline_t *p = NULL;
    char err[256];
    cr_assert_eq(sl_spec_parse(json, strlen(json), &spec, err, sizeof err), 0);
    o = (sl_pipeline_opts_t){.sharding = SL_SHARDING_OFF};
    cr_assert_eq(sl_pipeline_create(spec, &o, &p, err, sizeof err), SL_EINVAL);
    cr_assert_str_eq(err, "ops[0] (shard): num_shards \"hint\" is bound only by HINT sharding; this job's is off");
    sl_spec_free(spec);
}

/* ---- where the last batch makes its blocks (sl_pipeline_opts_t.block_alloc) ---- */

/* Runs json with its blocks offered to the arena; @return blocks it made. */
static unsigned arena_run(const char *json, int64_t n, int times, bool refuse)
{
    sl_pipeline_opts_t o = arena_open(refuse);
    struct run r = run_spec(json, &o);
    cr_assert_eq(r.rc, 1, "%s", r.errmsg);
    assert_each(&r, n, times);
    run_free(&r);
    return arena_close(json);
}

/* Only the pipeline's last batch (ops after it that pass elements on
 * unread: prefetch, take, skip, repeat, shard) asks for its block, and only
 * for one of SL_PIPELINE_LEND_MIN bytes or more; every block it got is
 * freed back to its arena; a block refused comes from malloc. */
Test(pipeline, the_last_batch_makes_large_blocks_where_it_is_told)
{
    /* 10 batches of 8,192 int64: 64 KiB each, the least asked for. */
#define TEN_BATCHES "{\"source\":{\"type\":\"range\",\"stop\":81920},\"ops\":[{\"op\":\"batch\",\"batch_size\":8192}"
    cr_assert_eq(arena_run(TEN_BATCHES "]}", 81920, 1, false), 10);
    cr_assert_eq(arena_run("{\"source\":{\"type\":\"range\",\"stop\":81910},"
                           "\"ops\":[{\"op\":\"batch\",\"batch_size\":8191}]}",
                           81910, 1, false),
                 0, "a block below 64 KiB");
    cr_assert_eq(arena_run(TEN_BATCHES ",{\"op\":\"skip\",\"count\":0},{\"op\":\"repeat\",\"count\":2},"
                                       "{\"op\":\"shard\",\"num_shards\":1,\"index\":0},{\"op\":\"take\",\"count\":20},"
                                       "{\"op\":\"prefetch\",\"buffer_size\":2}]}",
                           81920, 2, false),
                 20);
    cr_assert_eq(arena_run(TEN_BATCHES ",{\"op\":\"shuffle\",\"buffer_size\":4,\"seed\":1}]}", 81920, 1, false), 0,
                 "a shuffle holds its blocks");
    cr_assert_eq(arena_run(TEN_BATCHES "]}", 81920, 1, true), 0);
#undef TEN_BATCHES
}

/* The index each block is asked for with is its batch's place among the
 * pipeline's outputs (a worker gives the k-th batch of a coordinated read
 * to consumer k mod n, and makes its block in that consumer's region):
 * across a repeat after the batch, a take, a prefetch, and a short last
 * batch dropped each epoch (whose index the next epoch's first batch asks
 * for again). After a skip or a shard the place is not known. */
Test(pipeline, the_last_batch_asks_for_each_block_with_its_place_among_the_outputs)
{
    static const struct {
        const char *json;
        unsigned outputs;
        bool ordered;
    } cases[] = {
        {"{\"source\":{\"type\":\"range\",\"stop\":81920},\"ops\":[{\"op\":\"batch\",\"batch_size\":8192},"
         "{\"op\":\"repeat\",\"count\":2},{\"op\":\"take\",\"count\":15},{\"op\":\"prefetch\",\"buffer_size\":2}]}",
         15, true},
        {"{\"source\":{\"type\":\"range\",\"stop\":90000},\"ops\":[{\"op\":\"batch\",\"batch_size\":8192,"
         "\"drop_remainder\":true},{\"op\":\"repeat\",\"count\":3}]}",
         30, true},
        {"{\"source\":{\"type\":\"range\",\"stop\":81920},\"ops\":[{\"op\":\"batch\",\"batch_size\":8192},"
         "{\"op\":\"skip\",\"count\":1}]}",
         9, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sl_pipeline_opts_t o = arena_open(false);
        sl_pipeline_t *p = make(cases[c].json, &o);
        unsigned k = 0;
        sl_wire_batch_t *b;
        int rc;
        while ((rc = sl_pipeline_next(p, &b)) == 0) {
            uint64_t want = cases[c].ordered ? k : SL_PIPELINE_UNORDERED;
            cr_assert_eq(arena_index_of(b->data), want, "%s: output %u asked for with %lu", cases[c].json, k,
                         (unsigned long)arena_index_of(b->data));
            sl_wire_batch_free(b);
            k++;
        }
        cr_assert_eq(rc, 1, "%s", sl_pipeline_errmsg(p));
        cr_assert_eq(k, cases[c].outputs, "%s", cases[c].json);
        sl_pipeline_destroy(p);
        arena_close(cases[c].json);
    }
}
