/*
 * test_ops_prefetch.c: prefetch (pipeline/ops_prefetch.c): the same elements
 * in the same order as without it, over batches and repeats; a failure
 * arrives after the elements made before it, with its own message; DYNAMIC
 * split requests counted for repeat; destroyed mid-stream with a full
 * queue; the spec's refusals.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline_util.h"
#include "thread_util.h"

TestSuite(prefetch);

static void check_range(const batches_t *bs, int64_t n, int epochs)
{
    size_t got;
    int64_t *v = all_i64(bs, "value", &got);
    cr_assert_eq(got, (size_t)(n * epochs));
    for (size_t i = 0; i < got; i++)
        cr_assert_eq(v[i], (int64_t)i % n, "element %zu", i);
    free(v);
}

Test(prefetch, keeps_order_of_elements_and_batches)
{
    for (int size = 1; size <= 64; size *= 8) {
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"range\",\"stop\":1000},\"ops\":[{\"op\":\"prefetch\","
                                      "\"buffer_size\":%d}]}",
                                      size),
                                NULL);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        check_range(&bs, 1000, 1);
        batches_free(&bs);
        bs = run_spec(specf("{\"source\":{\"type\":\"range\",\"stop\":1000},\"ops\":[{\"op\":\"batch\",\"batch_size\":"
                            "7},{\"op\":\"prefetch\",\"buffer_size\":%d},{\"op\":\"prefetch\",\"buffer_size\":2}]}",
                            size),
                      NULL);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(bs.n, 143);
        check_range(&bs, 1000, 1);
        batches_free(&bs);
    }
}

Test(prefetch, repeat_above_and_below_resets_the_thread)
{
    batches_t bs = run_spec("{\"source\":{\"type\":\"range\",\"stop\":50},\"ops\":[{\"op\":\"prefetch\","
                            "\"buffer_size\":4},{\"op\":\"repeat\",\"count\":3},{\"op\":\"prefetch\",\"buffer_size\":3},"
                            "{\"op\":\"take\",\"count\":120},{\"op\":\"repeat\",\"count\":2}]}",
                            NULL);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    size_t n;
    int64_t *v = all_i64(&bs, "value", &n);
    cr_assert_eq(n, 240);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(v[i], (int64_t)(i % 120) % 50, "element %zu", i);
    free(v);
    batches_free(&bs);
}

Test(prefetch, an_error_comes_after_the_elements_before_it)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/corrupt-datacrc.tfrecord\"]},"
                                  "\"ops\":[{\"op\":\"prefetch\",\"buffer_size\":16}]}",
                                  FIXTURES),
                            &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_eq(bs.n, 7, "the 7 records before the corrupt one arrive, got %zu", bs.n);
    cr_assert(strstr(bs.errmsg, "source (tfrecord): tfrecord: data crc mismatch in ") &&
                  strstr(bs.errmsg, "(record 7)"),
              "%s", bs.errmsg);
    batches_free(&bs);
    sl_confine_destroy(roots);
}

Test(prefetch, counts_skipped_records_and_files_from_its_thread)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    sl_pipeline_opts_t o = {.roots = roots};
    sl_pipeline_t *p = pipeline_make(specf("{\"source\":{\"type\":\"tfrecord\",\"on_corrupt\":\"skip\",\"files\":"
                                           "[\"%s/corrupt-datacrc.tfrecord\"]},\"ops\":[{\"op\":\"prefetch\","
                                           "\"buffer_size\":2},{\"op\":\"repeat\",\"count\":2}]}",
                                           FIXTURES),
                                     &o);
    batches_t bs = run_pipeline(p);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 38);
    cr_assert_eq(bs.skipped, 2);
    cr_assert_eq(sl_pipeline_files_opened(p), 2);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    sl_confine_destroy(roots);
}

/* Epoch 0: [0, 10) in two splits; epoch 1: [10, 20); epoch 2: none. */
static int epoch_splits(void *arg, uint64_t epoch, sl_split_t *out)
{
    int *calls = arg;
    int k = (*calls)++;
    (void)k;
    static const sl_split_t e0[] = {{.file_index = 0, .begin = 0, .end = 4}, {.file_index = 0, .begin = 4, .end = 10}};
    static int served[3];
    if (k == 0)
        memset(served, 0, sizeof served);
    if (epoch == 0 && served[0] < 2) {
        *out = e0[served[0]++];
        return 0;
    }
    if (epoch == 1 && served[1] < 1) {
        served[1]++;
        *out = (sl_split_t){.begin = 10, .end = 20};
        return 0;
    }
    return 1;
}

Test(prefetch, dynamic_splits_are_asked_for_on_its_thread)
{
    int calls = 0;
    sl_pipeline_opts_t o = {.sharding = SL_SHARDING_DYNAMIC, .splits = {epoch_splits, &calls}};
    /* The requests are made on the prefetch thread, epoch by epoch. */
    sl_pipeline_t *p = pipeline_make("{\"source\":{\"type\":\"range\",\"stop\":100},\"ops\":[{\"op\":"
                                     "\"prefetch\",\"buffer_size\":3},{\"op\":\"repeat\",\"count\":3}]}",
                                     &o);
    batches_t bs = run_pipeline(p);
    sl_pipeline_destroy(p);
    cr_assert_eq(calls, 6, "3 + 2 + 1 requests, got %d", calls);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    size_t n;
    int64_t *v = all_i64(&bs, "value", &n);
    cr_assert_eq(n, 20);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(v[i], (int64_t)i);
    free(v);
    batches_free(&bs);
}

Test(prefetch, destroyed_mid_stream_with_a_full_queue)
{
    sl_pipeline_t *p = pipeline_make("{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":[{\"op\":\"batch\","
                                     "\"batch_size\":10},{\"op\":\"prefetch\",\"buffer_size\":8}]}",
                                     NULL);
    batches_t bs = run_pipeline_n(p, 3);
    cr_assert_eq(bs.n, 3);
    batches_free(&bs);
    cr_assert_eq(threads_named("sl-prefetch"), 1, "its thread says what it is (top -H, perf, gdb)");
    sl_pipeline_destroy(p);
    cr_assert_eq(threads_settle_to("sl-prefetch", 0), 0);
    /* Never started: nothing to stop. */
    p = pipeline_make("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"prefetch\",\"buffer_size\":8}]}",
                      NULL);
    sl_pipeline_destroy(p);
}

Test(prefetch, spec_refusals_name_the_field)
{
    const char *bad[][2] = {
        {"{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[{\"op\":\"prefetch\"}]}",
         "$.ops[0].buffer_size: required field missing"},
        {"{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[{\"op\":\"prefetch\",\"buffer_size\":0}]}",
         "$.ops[0].buffer_size: must be an integer >= 1, got 0"},
        {"{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[{\"op\":\"prefetch\",\"buffer_size\":4,\"x\":1}]}",
         "$.ops[0].x: unknown field"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_spec_t *spec = NULL;
        char err[512] = "";
        cr_assert_eq(sl_spec_parse(bad[i][0], strlen(bad[i][0]), &spec, err, sizeof err), SL_ESPEC);
        cr_assert(strncmp(err, bad[i][1], strlen(bad[i][1])) == 0, "got %s, want %s", err, bad[i][1]);
    }
}

Test(prefetch, over_a_parallel_stage_and_a_file_source)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    sl_pipeline_opts_t o = {.roots = roots, .threads = 3};
    for (int limit = 0; limit < 2; limit++) {
        sl_pipeline_t *p = pipeline_make(
            specf("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/basic-*.tfrecord\"]},\"ops\":[{\"op\":"
                  "\"parse_example\",\"features\":{\"id\":{\"dtype\":\"int64\"}},\"num_parallel_calls\":3},"
                  "{\"op\":\"prefetch\",\"buffer_size\":8},{\"op\":\"batch\",\"batch_size\":100}]}",
                  FIXTURES),
            &o);
        batches_t bs = run_pipeline_n(p, limit ? 2 : SIZE_MAX);
        if (!limit) {
            cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
            size_t n;
            int64_t *ids = all_i64(&bs, "id", &n);
            cr_assert_eq(n, 1000);
            for (size_t i = 0; i < n; i++)
                cr_assert_eq(ids[i], (int64_t)i);
            free(ids);
            cr_assert_eq(sl_pipeline_files_opened(p), 4);
        }
        batches_free(&bs);
        sl_pipeline_destroy(p);
    }
    sl_confine_destroy(roots);
}
