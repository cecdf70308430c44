/*
 * test_ops_interleave.c: interleave (pipeline/ops_interleave.c) against
 * orders computed by hand from tf.data's interleave algorithm, on
 * text_lines files written here (a temp dir under /tmp, removed by each
 * test) and on the tfrecord fixtures; sequential and read ahead on threads
 * give the same order; DYNAMIC splits; failures in order; the spec's
 * refusals with their JSON paths.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipeline_util.h"
#include "thread_util.h"

static char dir[PATH_MAX];

static void setup(void)
{
    char tmpl[64];
    snprintf(tmpl, sizeof tmpl, "/tmp/sl-test-interleave-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpl));
    cr_assert_not_null(realpath(tmpl, dir));
}

static void teardown(void)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(interleave, .init = setup, .fini = teardown);

/* Writes file name with lines name0, name1, ... (n of them). */
static void write_lines(const char *name, int n)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%d\n", name, i);
    fclose(f);
}

/* a: 5 lines, b: 2, c: 4, d: 1 (the files sort in this order). */
static void write_abcd(void)
{
    write_lines("a", 5);
    write_lines("b", 2);
    write_lines("c", 4);
    write_lines("d", 1);
}

/* The lines the batches hold, space-separated. */
static void lines_of(const batches_t *bs, char *buf, size_t buflen)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < bs->n; k++) {
        const sl_component_t *c = comp_of(bs->b[k], "line");
        uint64_t n = count_of(bs->b[k], c);
        for (uint64_t i = 0; i < n; i++) {
            size_t len;
            const uint8_t *s = str_at(bs->b[k], c, i, &len);
            o += (size_t)snprintf(buf + o, buflen - o, "%s%.*s", o ? " " : "", (int)len, (const char *)s);
        }
    }
}

static void check_order(const char *ops, const sl_pipeline_opts_t *o, const char *want)
{
    char got[4096];
    batches_t bs = run_spec(specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/*\"]},\"ops\":[%s]}", dir, ops), o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    lines_of(&bs, got, sizeof got);
    cr_assert_str_eq(got, want, "ops %s", ops);
    batches_free(&bs);
}

Test(interleave, cycle_2_block_2_matches_tf_data)
{
    write_abcd();
    sl_confine_t *roots = roots_at(dir);
    sl_pipeline_opts_t o = {.roots = roots};
    const char *want = "a0 a1 b0 b1 a2 a3 a4 c0 c1 d0 c2 c3";
    check_order("{\"op\":\"interleave\",\"cycle_length\":2,\"block_length\":2}", &o, want);
    check_order("{\"op\":\"interleave\",\"cycle_length\":2,\"block_length\":2,\"num_parallel_calls\":2}", &o, want);
    check_order("{\"op\":\"interleave\",\"cycle_length\":2,\"block_length\":2,\"num_parallel_calls\":\"autotune\"}",
                &o, want);
    sl_confine_destroy(roots);
}

Test(interleave, cycle_3_block_1_matches_tf_data)
{
    write_abcd();
    sl_confine_t *roots = roots_at(dir);
    sl_pipeline_opts_t o = {.roots = roots, .threads = 3};
    const char *want = "a0 b0 c0 a1 b1 c1 a2 c2 a3 d0 c3 a4";
    check_order("{\"op\":\"interleave\",\"cycle_length\":3}", &o, want);
    check_order("{\"op\":\"interleave\",\"cycle_length\":3,\"num_parallel_calls\":3}", &o, want);
    check_order("{\"op\":\"interleave\",\"cycle_length\":3,\"num_parallel_calls\":\"autotune\"}", &o, want);
    /* Two threads for three slots: thread 0 reads slots 0 and 2. */
    check_order("{\"op\":\"interleave\",\"cycle_length\":3,\"num_parallel_calls\":2}", &o, want);
    sl_confine_destroy(roots);
}

Test(interleave, cycle_1_is_the_files_in_order_and_a_long_cycle_reads_all_at_once)
{
    write_abcd();
    sl_confine_t *roots = roots_at(dir);
    sl_pipeline_opts_t o = {.roots = roots};
    check_order("{\"op\":\"interleave\",\"cycle_length\":1,\"block_length\":3}", &o,
                "a0 a1 a2 a3 a4 b0 b1 c0 c1 c2 c3 d0");
    /* cycle 8 > 4 files, block 1: round robin over all four. */
    check_order("{\"op\":\"interleave\",\"cycle_length\":8,\"num_parallel_calls\":8}", &o,
                "a0 b0 c0 d0 a1 b1 c1 a2 c2 a3 c3 a4");
    sl_confine_destroy(roots);
}

Test(interleave, batches_and_repeat_and_counts_files_opened)
{
    write_abcd();
    sl_confine_t *roots = roots_at(dir);
    sl_pipeline_opts_t o = {.roots = roots};
    sl_pipeline_t *p = pipeline_make(
        specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/*\"]},\"ops\":[{\"op\":\"interleave\","
              "\"cycle_length\":2,\"block_length\":2,\"num_parallel_calls\":2},{\"op\":\"repeat\",\"count\":2},"
              "{\"op\":\"batch\",\"batch_size\":5}]}",
              dir),
        &o);
    batches_t bs = run_pipeline(p);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    char got[4096];
    lines_of(&bs, got, sizeof got);
    cr_assert_str_eq(got, "a0 a1 b0 b1 a2 a3 a4 c0 c1 d0 c2 c3 a0 a1 b0 b1 a2 a3 a4 c0 c1 d0 c2 c3");
    cr_assert_eq(bs.n, 5);
    cr_assert_eq(sl_pipeline_files_opened(p), 8, "4 files in each of 2 epochs");
    batches_free(&bs);
    sl_pipeline_destroy(p);
    sl_confine_destroy(roots);
}

Test(interleave, tfrecord_fixtures_round_robin_on_threads)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    for (int threads = 1; threads <= 4; threads += 3) {
        sl_pipeline_opts_t o = {.roots = roots};
        batches_t bs = run_spec(
            specf("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/basic-*.tfrecord\"]},\"ops\":[{\"op\":"
                  "\"interleave\",\"cycle_length\":4,\"num_parallel_calls\":%d},{\"op\":\"parse_example\","
                  "\"features\":{\"id\":{\"dtype\":\"int64\"}}},{\"op\":\"batch\",\"batch_size\":64}]}",
                  FIXTURES, threads),
            &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        size_t n;
        int64_t *ids = all_i64(&bs, "id", &n);
        cr_assert_eq(n, 1000);
        /* Element k is record k / 4 of file k % 4, whose ids start at 250 * file. */
        for (size_t k = 0; k < n; k++)
            cr_assert_eq(ids[k], (int64_t)(250 * (k % 4) + k / 4), "element %zu with %d threads", k, threads);
        free(ids);
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
}

Test(interleave, dynamic_splits_each_record_once)
{
    write_abcd();
    sl_confine_t *roots = roots_at(dir);
    /* Files: 0 a, 1 b, 2 c, 3 d. An empty split is skipped. */
    const sl_split_t splits[] = {{.file_index = 0, .begin = 0, .end = 3}, {.file_index = 1, .begin = 0, .end = 2}, {.file_index = 3, .begin = 0, .end = 0}, {.file_index = 0, .begin = 3, .end = 5}, {.file_index = 2, .begin = 1, .end = 4}};
    for (int threads = 1; threads <= 2; threads++) {
        split_list_t l = {splits, 5, 0, 0};
        sl_pipeline_opts_t o = dynamic_opts(&l, roots, SL_IO_AUTO);
        char ops[256];
        snprintf(ops, sizeof ops, "{\"op\":\"interleave\",\"cycle_length\":2,\"num_parallel_calls\":%d}", threads);
        check_order(ops, &o, "a0 b0 a1 b1 a2 a3 c1 a4 c2 c3");
        cr_assert_eq(l.next, 5);
    }
    sl_confine_destroy(roots);
}

Test(interleave, dynamic_split_past_the_file_fails_naming_it)
{
    write_abcd();
    sl_confine_t *roots = roots_at(dir);
    const sl_split_t splits[] = {{.file_index = 1, .begin = 0, .end = 2}, {.file_index = 1, .begin = 5, .end = 9}};
    for (int threads = 1; threads <= 2; threads++) {
        split_list_t l = {splits, 2, 0, 0};
        sl_pipeline_opts_t o = dynamic_opts(&l, roots, SL_IO_AUTO);
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/*\"]},\"ops\":[{\"op\":"
                                      "\"interleave\",\"cycle_length\":2,\"num_parallel_calls\":%d}]}",
                                      dir, threads),
                                &o);
        cr_assert_eq(bs.rc, SL_EDATA);
        cr_assert(strstr(bs.errmsg, "split [5, 9) of file 1") && strstr(bs.errmsg, "has only 2 records"), "%s",
                  bs.errmsg);
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
}

Test(interleave, a_corrupt_record_fails_after_the_records_before_it)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    for (int threads = 1; threads <= 2; threads++) {
        sl_pipeline_opts_t o = {.roots = roots};
        /* cycle 2 over one corrupt file (record 7 is bad) and a good one. */
        batches_t bs = run_spec(
            specf("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/corrupt-datacrc.tfrecord\","
                  "\"%s/basic-00000-of-00004.tfrecord\"]},\"ops\":[{\"op\":\"interleave\",\"cycle_length\":2,"
                  "\"num_parallel_calls\":%d}]}",
                  FIXTURES, FIXTURES, threads),
            &o);
        cr_assert_eq(bs.rc, SL_EDATA);
        /* 7 good records of the corrupt file alternate with 7 of the other. */
        cr_assert_eq(bs.n, 14, "%zu records before the failure", bs.n);
        cr_assert(strstr(bs.errmsg, "source (tfrecord): tfrecord: data crc mismatch in ") &&
                      strstr(bs.errmsg, "corrupt-datacrc.tfrecord at offset 679 (record 7)"),
                  "%s", bs.errmsg);
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
}

Test(interleave, destroyed_mid_stream_with_threads)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    sl_pipeline_opts_t o = {.roots = roots};
    sl_pipeline_t *p = pipeline_make(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/basic-*.tfrecord\"]},"
                                           "\"ops\":[{\"op\":\"interleave\",\"cycle_length\":4,"
                                           "\"num_parallel_calls\":4}]}",
                                           FIXTURES),
                                     &o);
    batches_t bs = run_pipeline_n(p, 10);
    cr_assert_eq(bs.n, 10);
    batches_free(&bs);
    cr_assert_gt(threads_named("sl-interleave"), 1, "its threads say what they are (top -H, perf, gdb)");
    sl_pipeline_destroy(p);
    cr_assert_eq(threads_settle_to("sl-interleave", 0), 0);
    sl_confine_destroy(roots);
}

static void expect_spec_error(const char *json, const char *want)
{
    sl_spec_t *spec = NULL;
    char err[512] = "";
    cr_assert_eq(sl_spec_parse(json, strlen(json), &spec, err, sizeof err), SL_ESPEC, "%s", json);
    cr_assert_null(spec);
    cr_assert_str_eq(err, want);
}

Test(interleave, spec_refusals_name_the_field)
{
    expect_spec_error("{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[{\"op\":\"interleave\",\"cycle_length\":2}]}",
                      "$.ops[0]: interleave must come directly after a file source (tfrecord, text_lines, "
                      "fixed_length_records); the source is a range, which has no files to interleave");
    expect_spec_error("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/x\"]},\"ops\":[{\"op\":\"take\",\"count\":1},"
                      "{\"op\":\"interleave\",\"cycle_length\":2}]}",
                      "$.ops[1]: interleave must come directly after a file source (tfrecord, text_lines, "
                      "fixed_length_records), as the first op; here it follows ops[0] (take)");
    expect_spec_error("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/x\"]},\"ops\":[{\"op\":\"interleave\","
                      "\"cycle_length\":0}]}",
                      "$.ops[0].cycle_length: must be an integer >= 1, got 0");
    expect_spec_error("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/x\"]},\"ops\":[{\"op\":\"interleave\"}]}",
                      "$.ops[0].cycle_length: required field missing");
    expect_spec_error("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/x\"]},\"ops\":[{\"op\":\"interleave\","
                      "\"cycle_length\":2,\"num_parallel_calls\":\"fast\"}]}",
                      "$.ops[0].num_parallel_calls: must be an integer in [1, 256] or \"autotune\", got \"fast\"");
    expect_spec_error("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/x\"]},\"ops\":[{\"op\":\"interleave\","
                      "\"cycle_length\":2,\"num_parallel_calls\":0}]}",
                      "$.ops[0].num_parallel_calls: must be an integer >= 1, got 0");
}

Test(interleave, canonical_form_fills_defaults)
{
    const char *json = "{\"source\":{\"type\":\"text_lines\",\"files\":[\"/x\"]},\"ops\":[{\"op\":\"interleave\","
                       "\"cycle_length\":2},{\"op\":\"interleave\",\"cycle_length\":2}]}";
    sl_spec_t *spec = NULL;
    char err[512] = "";
    /* The second one is not first. */
    cr_assert_eq(sl_spec_parse(json, strlen(json), &spec, err, sizeof err), SL_ESPEC);
    json = "{\"source\":{\"type\":\"text_lines\",\"files\":[\"/x\"]},\"ops\":[{\"op\":\"interleave\","
           "\"cycle_length\":2,\"num_parallel_calls\":\"autotune\"}]}";
    cr_assert_eq(sl_spec_parse(json, strlen(json), &spec, err, sizeof err), 0, "%s", err);
    cr_assert(strstr(sl_spec_canonical(spec),
                     "{\"block_length\":1,\"cycle_length\":2,\"num_parallel_calls\":\"autotune\",\"op\":\"interleave\"}"),
              "%s", sl_spec_canonical(spec));
    sl_spec_free(spec);
}

Test(interleave, long_files_fill_and_drain_the_read_ahead_buffers)
{
    /* 2000 records per file: the read-ahead buffers fill (256 records),
     * drain to half and refill in bursts. */
    write_lines("x", 2000);
    write_lines("y", 2000);
    write_lines("z", 2000);
    sl_confine_t *roots = roots_at(dir);
    sl_pipeline_opts_t o = {.roots = roots};
    size_t cap = 3 * 2000 * 8, at = 0;
    char *want = malloc(cap);
    for (int i = 0; i < 2000; i++)
        at += (size_t)snprintf(want + at, cap - at, "%sx%d y%d", i ? " " : "", i, i);
    for (int i = 0; i < 2000; i++)
        at += (size_t)snprintf(want + at, cap - at, " z%d", i);
    for (int threads = 1; threads <= 2; threads++) {
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/*\"]},\"ops\":[{\"op\":"
                                      "\"interleave\",\"cycle_length\":2,\"num_parallel_calls\":%d},{\"op\":\"batch\","
                                      "\"batch_size\":100}]}",
                                      dir, threads),
                                &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        char *got = malloc(cap);
        lines_of(&bs, got, cap);
        cr_assert(strcmp(got, want) == 0, "threads %d", threads);
        free(got);
        batches_free(&bs);
    }
    free(want);
    /* Stopped while the buffers are full. */
    sl_pipeline_t *p = pipeline_make(specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/*\"]},\"ops\":[{\"op\":"
                                           "\"interleave\",\"cycle_length\":3,\"num_parallel_calls\":3}]}",
                                           dir),
                                     &o);
    batches_t bs = run_pipeline_n(p, 5);
    cr_assert_eq(bs.n, 5);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    sl_confine_destroy(roots);
}

Test(interleave, fixed_length_records_with_header_and_footer)
{
    const char *files[][2] = {{"r0", "HHa0a1a2F"}, {"r1", "HHb0b1F"}};
    for (int i = 0; i < 2; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, files[i][0]);
        FILE *f = fopen(p, "w");
        cr_assert_not_null(f);
        fputs(files[i][1], f);
        fclose(f);
    }
    sl_confine_t *roots = roots_at(dir);
    sl_pipeline_opts_t o = {.roots = roots};
    for (int threads = 1; threads <= 2; threads++) {
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"fixed_length_records\",\"files\":[\"%s/r*\"],"
                                      "\"record_bytes\":2,\"header_bytes\":2,\"footer_bytes\":1},\"ops\":[{\"op\":"
                                      "\"interleave\",\"cycle_length\":2,\"num_parallel_calls\":%d}]}",
                                      dir, threads),
                                &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        char got[64] = "";
        for (size_t k = 0; k < bs.n; k++) {
            size_t len;
            const uint8_t *s = str_at(bs.b[k], comp_of(bs.b[k], "record"), 0, &len);
            strncat(got, (const char *)s, len);
            strcat(got, " ");
        }
        cr_assert_str_eq(got, "a0 b0 a1 b1 a2 ");
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
}

Test(interleave, file_sharding_reads_this_workers_files_and_data_sharding_is_refused)
{
    write_abcd();
    sl_confine_t *roots = roots_at(dir);
    /* Worker 1 of 2: files 1 (b) and 3 (d). */
    sl_pipeline_opts_t o = {.sharding = SL_SHARDING_FILE, .worker_index = 1, .num_workers = 2, .roots = roots};
    check_order("{\"op\":\"interleave\",\"cycle_length\":2,\"num_parallel_calls\":2}", &o, "b0 d0 b1");
    o.worker_index = 0;
    check_order("{\"op\":\"interleave\",\"cycle_length\":2}", &o, "a0 c0 a1 c1 a2 c2 a3 c3 a4");
    o.sharding = SL_SHARDING_DATA;
    sl_pipeline_t *p = NULL;
    char err[1024];
    cr_assert_eq(pipeline_try(specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/*\"]},\"ops\":[{\"op\":"
                                    "\"interleave\",\"cycle_length\":2}]}",
                                    dir),
                              &o, &p, err, sizeof err),
                 SL_EINVAL);
    cr_assert(strstr(err, "ops[0] (interleave): interleave is not supported under DATA sharding"), "%s", err);
    sl_confine_destroy(roots);
}
