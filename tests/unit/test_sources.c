/*
 * test_sources.c: the file sources of the pipeline (pipeline/sources_files.c)
 * run from specs: tfrecord on the fixtures of tests/data/tfrecord (as
 * MANIFEST.json describes them) with both io engines, gzip, the corrupt
 * files failing or skipping, confinement to the data roots, DYNAMIC splits
 * of (file, record range); text_lines and fixed_length_records on files made
 * here in a temp dir under /tmp, removed by each test.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "pipeline_util.h"

static const sl_io_engine_t engines[] = {SL_IO_URING, SL_IO_PREAD};

static char dir[PATH_MAX]; /* resolved */
static char fixtures[PATH_MAX]; /* FIXTURES, resolved: how messages name the files */

static void setup(void)
{
    char tmpl[64];
    snprintf(tmpl, sizeof tmpl, "/tmp/sl-test-sources-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpl));
    cr_assert_not_null(realpath(tmpl, dir));
    cr_assert_not_null(realpath(FIXTURES, fixtures));
}

static void teardown(void)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(sources, .init = setup, .fini = teardown);

static void write_file(const char *name, const void *data, size_t len)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "%s", p);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void write_gzip(const char *name, const void *data, size_t len)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    gzFile f = gzopen(p, "wb");
    cr_assert_not_null(f, "%s", p);
    cr_assert_eq(gzwrite(f, data, (unsigned)len), (int)len);
    gzclose(f);
}

#define BASIC_FEATURES                                                                                               \
    "{\"op\":\"parse_example\",\"features\":{\"id\":{\"dtype\":\"int64\"},\"label\":{\"dtype\":\"int64\"},"          \
    "\"name\":{\"dtype\":\"bytes\"},\"x\":{\"dtype\":\"float32\",\"shape\":[4]}}}"

/* Checks batches of the basic features: ids first_id, first_id + 1, ...,
 * n of them, every value as test_example.c's check_basic says. */
static void check_basic(const batches_t *bs, int64_t first_id, size_t n, size_t batch)
{
    size_t seen = 0;
    for (size_t k = 0; k < bs->n; k++) {
        const sl_wire_batch_t *b = bs->b[k];
        cr_assert_eq(b->num_components, 4, "parse_example yields the features only");
        const sl_component_t *id = comp_of(b, "id"), *label = comp_of(b, "label"), *name = comp_of(b, "name"),
                             *x = comp_of(b, "x");
        uint64_t rows = b->num_elements;
        cr_assert(rows == batch || (k == bs->n - 1 && rows < batch), "batch %zu has %" PRIu64 " elements", k, rows);
        cr_assert_eq(id->rank, 1);
        cr_assert_eq(id->shape[0], (int64_t)rows);
        cr_assert_eq(name->rank, 1);
        cr_assert_eq(name->dtype, SL_DTYPE_BYTES);
        cr_assert_eq(x->rank, 2);
        cr_assert_eq(x->shape[1], 4);
        for (uint64_t i = 0; i < rows; i++, seen++) {
            int64_t want = first_id + (int64_t)seen;
            cr_assert_eq(i64_at(b, id, i), want, "batch %zu row %" PRIu64, k, i);
            cr_assert_eq(i64_at(b, label, i), want % 10);
            char s[16];
            snprintf(s, sizeof s, "rec-%05" PRId64, want);
            size_t len;
            const uint8_t *p = str_at(b, name, i, &len);
            cr_assert(len == strlen(s) && memcmp(p, s, len) == 0, "name of %" PRId64 " is \"%.*s\"", want, (int)len,
                      (const char *)p);
            cr_assert_eq(f32_at(b, x, 4 * i + 0), (float)((double)want * 0.5));
            cr_assert_eq(f32_at(b, x, 4 * i + 1), (float)((double)want * 0.25));
            cr_assert_eq(f32_at(b, x, 4 * i + 2), (float)-want);
            cr_assert_eq(f32_at(b, x, 4 * i + 3), (float)((double)want * 0.001));
        }
    }
    cr_assert_eq(seen, n, "%zu records, want %zu", seen, n);
}

Test(sources, tfrecord_basic_files_decode_as_the_manifest_says)
{
    json_t *m = manifest_load();
    int64_t total = 0;
    for (int f = 0; f < 4; f++) {
        char name[64];
        snprintf(name, sizeof name, "basic-%05d-of-00004.tfrecord", f);
        json_t *mf = manifest_file(m, name);
        cr_assert_eq(json_integer_value(json_object_get(mf, "first_id")), total);
        total += json_integer_value(json_object_get(mf, "records"));
    }
    json_decref(m);
    cr_assert_eq(total, 1000);

    sl_confine_t *roots = roots_at(FIXTURES);
    for (size_t e = 0; e < 2; e++) {
        sl_pipeline_opts_t o = {.roots = roots, .io_engine = engines[e]};
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/basic-0000*-of-00004.tfrecord\"},"
                                      "\"ops\":[" BASIC_FEATURES ",{\"op\":\"batch\",\"batch_size\":64}]}",
                                      FIXTURES),
                                &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(bs.n, 16);
        check_basic(&bs, 0, 1000, 64);
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
}

Test(sources, tfrecord_patterns_in_spec_order)
{
    /* A list of patterns: each one's matches sorted, the patterns in order. */
    sl_confine_t *roots = roots_at(FIXTURES);
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/basic-00003-of-00004.tfrecord\","
                                  "\"%s/basic-0000[01]-of-*\"]},\"ops\":[" BASIC_FEATURES "]}",
                                  FIXTURES, FIXTURES),
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    size_t n;
    int64_t *ids = all_i64(&bs, "id", &n);
    cr_assert_eq(n, 750);
    for (size_t i = 0; i < n; i++) {
        int64_t want = i < 250 ? 750 + (int64_t)i : (int64_t)i - 250;
        cr_assert_eq(ids[i], want, "record %zu", i);
    }
    /* Unbatched: one element per batch, num_elements 1, scalars. */
    cr_assert_eq(bs.b[0]->num_elements, 1);
    cr_assert_eq(comp_of(bs.b[0], "id")->rank, 0);
    cr_assert_eq(comp_of(bs.b[0], "x")->rank, 1);
    free(ids);
    batches_free(&bs);
    sl_confine_destroy(roots);
}

Test(sources, tfrecord_gzip_holds_the_first_basic_file)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    for (size_t e = 0; e < 2; e++) {
        sl_pipeline_opts_t o = {.roots = roots, .io_engine = engines[e]};
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"compression\":\"gzip\","
                                      "\"files\":[\"%s/basic-gzip-00000-of-00001.tfrecord.gz\"]},"
                                      "\"ops\":[" BASIC_FEATURES ",{\"op\":\"batch\",\"batch_size\":100}]}",
                                      FIXTURES),
                                &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        check_basic(&bs, 0, 250, 100);
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
}

Test(sources, tfrecord_raw_records_and_source_name)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"name\":\"serialized\","
                                  "\"files\":[\"%s/varlen-00000-of-00001.tfrecord\"]},"
                                  "\"ops\":[{\"op\":\"batch\",\"batch_size\":30}]}",
                                  FIXTURES),
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 4);
    const sl_component_t *c = comp_of(bs.b[3], "serialized");
    cr_assert_eq(c->dtype, SL_DTYPE_BYTES);
    cr_assert_eq(c->rank, 1);
    cr_assert_eq(c->shape[0], 10);
    size_t len;
    const uint8_t *p = str_at(bs.b[3], c, 9, &len);
    cr_assert_gt(len, 10);
    cr_assert_eq(p[0], 0x0a, "an Example starts with its features field");
    batches_free(&bs);
    sl_confine_destroy(roots);
}

Test(sources, tfrecord_corrupt_files_fail_where_the_manifest_says)
{
    json_t *m = manifest_load();
    json_t *mf = manifest_file(m, "corrupt-datacrc.tfrecord");
    int64_t rec = json_integer_value(json_object_get(mf, "corrupt_record"));
    int64_t off = json_integer_value(json_object_get(mf, "corrupt_offset"));
    cr_assert_eq(rec, 7);
    cr_assert_eq(off, 679);
    sl_confine_t *roots = roots_at(FIXTURES);
    for (size_t e = 0; e < 2; e++) {
        sl_pipeline_opts_t o = {.roots = roots, .io_engine = engines[e]};
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/corrupt-datacrc.tfrecord\"]}}",
                                      FIXTURES),
                                &o);
        cr_assert_eq(bs.rc, SL_EDATA);
        cr_assert_eq(bs.n, (size_t)rec, "the records before the corrupt one arrive");
        char want[PATH_MAX + 256];
        snprintf(want, sizeof want,
                 "source (tfrecord): tfrecord: data crc mismatch in %s/corrupt-datacrc.tfrecord at offset %" PRId64
                 " (record %" PRId64 ")",
                 fixtures, off, rec);
        cr_assert_str_eq(bs.errmsg, want);
        batches_free(&bs);

        bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/corrupt-truncated.tfrecord\"]}}",
                            FIXTURES),
                      &o);
        cr_assert_eq(bs.rc, SL_EDATA);
        cr_assert_eq(bs.n, 19);
        cr_assert(strstr(bs.errmsg, "truncated record in ") && strstr(bs.errmsg, "corrupt-truncated.tfrecord") &&
                      strstr(bs.errmsg, "(record 19)"),
                  "%s", bs.errmsg);
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
    json_decref(m);
}

Test(sources, tfrecord_on_corrupt_skip_counts)
{
    json_t *m = manifest_load();
    int64_t records = json_integer_value(json_object_get(manifest_file(m, "corrupt-datacrc.tfrecord"), "records"));
    int64_t complete =
        json_integer_value(json_object_get(manifest_file(m, "corrupt-truncated.tfrecord"), "complete_records"));
    json_decref(m);
    sl_confine_t *roots = roots_at(FIXTURES);
    for (size_t e = 0; e < 2; e++) {
        sl_pipeline_opts_t o = {.roots = roots, .io_engine = engines[e]};
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"on_corrupt\":\"skip\","
                                      "\"files\":[\"%s/corrupt-datacrc.tfrecord\"]},"
                                      "\"ops\":[{\"op\":\"batch\",\"batch_size\":5}]}",
                                      FIXTURES),
                                &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(bs.skipped, 1);
        uint64_t n = 0;
        for (size_t k = 0; k < bs.n; k++)
            n += bs.b[k]->num_elements;
        cr_assert_eq(n, (uint64_t)records - 1);
        batches_free(&bs);

        /* Both files: a record skipped in each, the rest delivered. */
        bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"on_corrupt\":\"skip\","
                            "\"files\":\"%s/corrupt-*.tfrecord\"}}",
                            FIXTURES),
                      &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(bs.n, (size_t)(records - 1 + complete));
        cr_assert_eq(bs.skipped, 2);
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
}

Test(sources, files_outside_the_roots_are_refused)
{
    char err[1024];
    sl_pipeline_t *p;
    /* Roots elsewhere. */
    sl_confine_t *roots = roots_at(dir);
    sl_pipeline_opts_t o = {.roots = roots};
    int rc = pipeline_try(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/basic-00000-of-00004.tfrecord\"]}}",
                                FIXTURES),
                          &o, &p, err, sizeof err);
    /* Outside the roots is answered as no match: the answer does not tell
     * whether the path exists (docs/security.md, "Ownership"). */
    cr_assert_eq(rc, -ENOENT, "%d %s", rc, err);
    cr_assert_null(p);
    cr_assert(strstr(err, "source (tfrecord): ") == err, "%s", err);
    cr_assert(strstr(err, "basic-00000-of-00004.tfrecord matches no file, or a file outside every --data-root") &&
                  strstr(err, dir),
              "%s", err);

    rc = pipeline_try("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/etc/passwd\"]}}", &o, &p, err, sizeof err);
    cr_assert_eq(rc, -ENOENT);
    cr_assert(strstr(err, "/etc/passwd matches no file, or a file outside every --data-root"), "%s", err);
    char other[1024];
    rc = pipeline_try("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/etc/no-such-passwd\"]}}", &o, &p, other,
                      sizeof other);
    cr_assert_eq(rc, -ENOENT);
    cr_assert_str_eq(strstr(err, " matches"), strstr(other, " matches"));

    /* A symlink inside the root that leads out of it. */
    char link[PATH_MAX], target[PATH_MAX];
    snprintf(link, sizeof link, "%s/escape.tfrecord", dir);
    snprintf(target, sizeof target, "%s/basic-00000-of-00004.tfrecord", fixtures);
    cr_assert_eq(symlink(target, link), 0);
    rc = pipeline_try(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/*.tfrecord\"}}", dir), &o, &p, err,
                      sizeof err);
    cr_assert_eq(rc, -ENOENT);
    cr_assert(strstr(err, "*.tfrecord matches no file, or a file outside every --data-root"), "%s", err);

    /* A pattern that matches nothing. */
    rc = pipeline_try(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/none-*.tfrecord\"}}", dir), &o, &p, err,
                      sizeof err);
    cr_assert_eq(rc, -ENOENT);
    cr_assert(strstr(err, "none-*.tfrecord matches no file, or a file outside"), "%s", err);

    /* No roots at all. */
    o.roots = NULL;
    rc = pipeline_try(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/*.tfrecord\"}}", FIXTURES), &o, &p, err,
                      sizeof err);
    cr_assert_eq(rc, -EACCES);
    cr_assert_str_eq(err, "source (tfrecord): file sources need --data-root, and this worker has none");
    sl_confine_destroy(roots);
}

/* ---- DYNAMIC ---- */

Test(sources, dynamic_reads_exactly_its_splits)
{
    /* Files 0..3 hold ids 0..249, 250..499, 500..749, 750..999. The splits
     * jump between files, go back inside one (it is opened again) and
     * forward (records skipped). */
    static const sl_split_t splits[] = {
        {.file_index = 2, .begin = 10, .end = 20}, {.file_index = 0, .begin = 0, .end = 5}, {.file_index = 0, .begin = 100, .end = 103}, {.file_index = 0, .begin = 3, .end = 4}, {.file_index = 3, .begin = 249, .end = 250}, {.file_index = 1, .begin = 0, .end = 0}, {.file_index = 1, .begin = 248, .end = 250}, {.file_index = 1, .begin = 0, .end = 2},
    };
    static const int64_t want[] = {510, 511, 512, 513, 514, 515, 516, 517, 518, 519, 0,   1,   2,  3,
                                   4,   100, 101, 102, 3,   999, 498, 499, 250, 251};
    sl_confine_t *roots = roots_at(FIXTURES);
    for (size_t e = 0; e < 2; e++) {
        split_list_t l = {splits, sizeof splits / sizeof splits[0], 0, 0};
        sl_pipeline_opts_t o = dynamic_opts(&l, roots, engines[e]);
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/basic-*-of-00004.tfrecord\"},"
                                      "\"ops\":[" BASIC_FEATURES ",{\"op\":\"batch\",\"batch_size\":7}]}",
                                      FIXTURES),
                                &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        size_t n;
        int64_t *ids = all_i64(&bs, "id", &n);
        cr_assert_eq(n, sizeof want / sizeof want[0]);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(ids[i], want[i], "element %zu is %" PRId64 ", want %" PRId64, i, ids[i], want[i]);
        cr_assert_eq(l.calls, (int)(sizeof splits / sizeof splits[0]) + 1, "every split and the end of the epoch");
        free(ids);
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
}

Test(sources, dynamic_gzip_splits)
{
    static const sl_split_t splits[] = {{.file_index = 0, .begin = 200, .end = 203}, {.file_index = 0, .begin = 249, .end = 250}, {.file_index = 0, .begin = 5, .end = 6}};
    sl_confine_t *roots = roots_at(FIXTURES);
    split_list_t l = {splits, 3, 0, 0};
    sl_pipeline_opts_t o = dynamic_opts(&l, roots, SL_IO_AUTO);
    batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"compression\":\"gzip\","
                                  "\"files\":\"%s/basic-gzip-*.gz\"},\"ops\":[" BASIC_FEATURES "]}",
                                  FIXTURES),
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    size_t n;
    int64_t *ids = all_i64(&bs, "id", &n);
    cr_assert_eq(n, 5);
    const int64_t want[] = {200, 201, 202, 249, 5};
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i]);
    free(ids);
    batches_free(&bs);
    sl_confine_destroy(roots);
}

Test(sources, dynamic_splits_the_worker_cannot_have)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    const char *spec = specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/basic-0000[01]-of-00004.tfrecord\"}}",
                             FIXTURES);
    char json[1024];
    snprintf(json, sizeof json, "%s", spec);

    static const sl_split_t beyond_files[] = {{.file_index = 2, .begin = 0, .end = 10}};
    split_list_t l = {beyond_files, 1, 0, 0};
    sl_pipeline_opts_t o = dynamic_opts(&l, roots, SL_IO_AUTO);
    batches_t bs = run_spec(json, &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_str_eq(bs.errmsg, "source (tfrecord): split [0, 10) of file 2 of epoch 0: this worker's patterns match "
                                "2 files; the dispatcher and this worker see different files");
    batches_free(&bs);

    /* Past the end of a file: found when skipping, and when reading. */
    static const sl_split_t past_skip[] = {{.file_index = 1, .begin = 251, .end = 260}};
    l = (split_list_t){past_skip, 1, 0, 0};
    bs = run_spec(json, &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert(strstr(bs.errmsg, "has only 250 records; the dispatcher and this worker see different files"), "%s",
              bs.errmsg);
    batches_free(&bs);

    static const sl_split_t past_read[] = {{.file_index = 0, .begin = 245, .end = 255}};
    l = (split_list_t){past_read, 1, 0, 0};
    bs = run_spec(json, &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_eq(bs.n, 5, "the records the file has arrive");
    cr_assert(strstr(bs.errmsg, "basic-00000-of-00004.tfrecord ends after record 250; the dispatcher and this "
                                "worker see different files"),
              "%s", bs.errmsg);
    batches_free(&bs);
    sl_confine_destroy(roots);
}

Test(sources, dynamic_skips_corrupt_records_inside_its_splits)
{
    /* Record 7 of corrupt-datacrc is corrupt: the split [5, 8) gives 5 and
     * 6 and skips it; [8, 20) the rest. Each record is the same as when
     * the file is read whole. */
    sl_confine_t *roots = roots_at(FIXTURES);
    const char *spec = specf("{\"source\":{\"type\":\"tfrecord\",\"on_corrupt\":\"skip\","
                             "\"files\":\"%s/corrupt-datacrc.tfrecord\"}}",
                             FIXTURES);
    char json[1024];
    snprintf(json, sizeof json, "%s", spec);
    sl_pipeline_opts_t off = {.roots = roots};
    batches_t whole = run_spec(json, &off);
    cr_assert_eq(whole.rc, 1, "%s", whole.errmsg);
    cr_assert_eq(whole.n, 19);

    static const sl_split_t splits[] = {{.file_index = 0, .begin = 5, .end = 8}, {.file_index = 0, .begin = 8, .end = 20}, {.file_index = 0, .begin = 0, .end = 5}, {.file_index = 0, .begin = 6, .end = 7}};
    split_list_t l = {splits, 4, 0, 0};
    sl_pipeline_opts_t o = dynamic_opts(&l, roots, SL_IO_PREAD);
    batches_t bs = run_spec(json, &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    /* Records 5, 6, 8..19, 0..4, 6: whole holds 0..6 at 0..6 and 8..19 at 7..18. */
    static const int order[] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 0, 1, 2, 3, 4, 6};
    cr_assert_eq(bs.n, sizeof order / sizeof order[0]);
    for (size_t i = 0; i < bs.n; i++) {
        const sl_wire_batch_t *a = bs.b[i], *b = whole.b[order[i]];
        cr_assert(a->size == b->size && memcmp(a->data, b->data, a->size) == 0, "element %zu", i);
    }
    cr_assert_eq(bs.skipped, 1);

    /* A split that ends on the corrupt record, and the last record
     * corrupt: [0, 8) of a file whose record 7 is bad ends cleanly. */
    static const sl_split_t ends_bad[] = {{.file_index = 0, .begin = 0, .end = 8}};
    l = (split_list_t){ends_bad, 1, 0, 0};
    batches_t b2 = run_spec(json, &o);
    cr_assert_eq(b2.rc, 1, "%s", b2.errmsg);
    cr_assert_eq(b2.n, 7);
    batches_free(&b2);
    batches_free(&bs);
    batches_free(&whole);
    sl_confine_destroy(roots);
}

Test(sources, dynamic_repeat_asks_for_each_epoch)
{
    /* The split list has splits in epoch 0 only: a repeat reads them once
     * and finds epochs 1 and 2 empty. */
    static const sl_split_t splits[] = {{.file_index = 1, .begin = 0, .end = 3}};
    sl_confine_t *roots = roots_at(FIXTURES);
    split_list_t l = {splits, 1, 0, 0};
    sl_pipeline_opts_t o = dynamic_opts(&l, roots, SL_IO_AUTO);
    batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/basic-*-of-00004.tfrecord\"},"
                                  "\"ops\":[" BASIC_FEATURES ",{\"op\":\"repeat\",\"count\":3},"
                                  "{\"op\":\"batch\",\"batch_size\":2}]}",
                                  FIXTURES),
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    size_t n;
    int64_t *ids = all_i64(&bs, "id", &n);
    cr_assert_eq(n, 3);
    cr_assert(ids[0] == 250 && ids[1] == 251 && ids[2] == 252);
    free(ids);
    batches_free(&bs);
    sl_confine_destroy(roots);
}

/* ---- text_lines, fixed_length_records ---- */

static void check_strings(const batches_t *bs, const char *name, const char *const *want, size_t n)
{
    size_t seen = 0;
    for (size_t k = 0; k < bs->n; k++) {
        const sl_component_t *c = comp_of(bs->b[k], name);
        uint64_t m = count_of(bs->b[k], c);
        for (uint64_t i = 0; i < m; i++, seen++) {
            cr_assert_lt(seen, n, "more strings than the %zu expected", n);
            size_t len;
            const uint8_t *p = str_at(bs->b[k], c, i, &len);
            cr_assert(len == strlen(want[seen]) && memcmp(p, want[seen], len) == 0, "string %zu is \"%.*s\", want \"%s\"",
                      seen, (int)len, (const char *)p, want[seen]);
        }
    }
    cr_assert_eq(seen, n);
}

Test(sources, text_lines_plain_and_gzip)
{
    const char a[] = "first\nsecond\r\n\nlast without newline";
    const char b[] = "b0\nb1\n";
    write_file("a.txt", a, strlen(a));
    write_file("b.txt", b, strlen(b));
    write_file("c.txt", "", 0);
    write_gzip("a.txt.gz", a, strlen(a));
    /* A long line crosses the reader's views. */
    size_t big = 600000;
    char *long_line = malloc(big + 2);
    memset(long_line, 'x', big);
    long_line[big] = '\n';
    long_line[big + 1] = '\0';
    write_file("d.txt", long_line, big + 1);

    sl_confine_t *roots = roots_at(dir);
    for (size_t e = 0; e < 2; e++) {
        sl_pipeline_opts_t o = {.roots = roots, .io_engine = engines[e]};
        const char *want[] = {"first", "second", "", "last without newline", "b0", "b1"};
        batches_t bs = run_spec(specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/[abc].txt\"]},"
                                      "\"ops\":[{\"op\":\"batch\",\"batch_size\":4}]}",
                                      dir),
                                &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(bs.n, 2);
        check_strings(&bs, "line", want, 6);
        batches_free(&bs);

        bs = run_spec(specf("{\"source\":{\"type\":\"text_lines\",\"compression\":\"gzip\",\"name\":\"text\","
                            "\"files\":[\"%s/a.txt.gz\"]}}",
                            dir),
                      &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        check_strings(&bs, "text", want, 4);
        batches_free(&bs);

        bs = run_spec(specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/d.txt\"]}}", dir), &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(bs.n, 1);
        size_t len;
        str_at(bs.b[0], comp_of(bs.b[0], "line"), 0, &len);
        cr_assert_eq(len, big);
        batches_free(&bs);

        /* DYNAMIC: lines are records. */
        static const sl_split_t splits[] = {{.file_index = 0, .begin = 1, .end = 3}, {.file_index = 1, .begin = 1, .end = 2}, {.file_index = 0, .begin = 3, .end = 4}, {.file_index = 0, .begin = 0, .end = 1}};
        split_list_t l = {splits, 4, 0, 0};
        o = dynamic_opts(&l, roots, engines[e]);
        const char *want_dyn[] = {"second", "", "b1", "last without newline", "first"};
        bs = run_spec(specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/a.txt\",\"%s/b.txt\"]}}", dir, dir),
                      &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        check_strings(&bs, "line", want_dyn, 5);
        batches_free(&bs);

        l = (split_list_t){splits, 4, 0, 0};
        bs = run_spec(specf("{\"source\":{\"type\":\"text_lines\",\"compression\":\"gzip\",\"files\":[\"%s/a.txt.gz\","
                            "\"%s/a.txt.gz\"]}}",
                            dir, dir),
                      &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        const char *want_gz[] = {"second", "", "second", "last without newline", "first"};
        check_strings(&bs, "line", want_gz, 5);
        batches_free(&bs);
    }
    free(long_line);
    sl_confine_destroy(roots);
}

Test(sources, fixed_length_records)
{
    /* A header of 3 bytes, 5 records of 4, a footer of 2. */
    const char f1[] = "HHHaaaabbbbccccddddeeeeFF";
    const char f2[] = "HHHzzzzFF";
    write_file("f1.bin", f1, strlen(f1));
    write_file("f2.bin", f2, strlen(f2));
    write_file("bad.bin", f1, strlen(f1) - 1);
    sl_confine_t *roots = roots_at(dir);
    const char *json = specf("{\"source\":{\"type\":\"fixed_length_records\",\"record_bytes\":4,\"header_bytes\":3,"
                             "\"footer_bytes\":2,\"files\":\"%s/f?.bin\"},\"ops\":[{\"op\":\"batch\",\"batch_size\":4}]}",
                             dir);
    char spec[1024];
    snprintf(spec, sizeof spec, "%s", json);
    for (size_t e = 0; e < 2; e++) {
        sl_pipeline_opts_t o = {.roots = roots, .io_engine = engines[e]};
        batches_t bs = run_spec(spec, &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        const char *want[] = {"aaaa", "bbbb", "cccc", "dddd", "eeee", "zzzz"};
        check_strings(&bs, "record", want, 6);
        batches_free(&bs);

        static const sl_split_t splits[] = {{.file_index = 0, .begin = 3, .end = 5}, {.file_index = 1, .begin = 0, .end = 1}, {.file_index = 0, .begin = 1, .end = 2}, {.file_index = 0, .begin = 4, .end = 5}};
        split_list_t l = {splits, 4, 0, 0};
        o = dynamic_opts(&l, roots, engines[e]);
        bs = run_spec(spec, &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        const char *want_dyn[] = {"dddd", "eeee", "zzzz", "bbbb", "eeee"};
        check_strings(&bs, "record", want_dyn, 5);
        batches_free(&bs);
    }
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec(specf("{\"source\":{\"type\":\"fixed_length_records\",\"record_bytes\":4,\"header_bytes\":3,"
                                  "\"footer_bytes\":2,\"files\":\"%s/bad.bin\"}}",
                                  dir),
                            &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    char want[PATH_MAX + 200];
    snprintf(want, sizeof want,
             "source (fixed_length_records): fixed_length_records: %s/bad.bin holds 24 bytes, not a header of 3, "
             "records of 4 and a footer of 2",
             dir);
    cr_assert_str_eq(bs.errmsg, want);
    batches_free(&bs);
    sl_confine_destroy(roots);
}
