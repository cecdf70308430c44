/*
 * test_provenance.c: element provenance (pipeline/provenance.c) through
 * every kind of op, batch's merging of runs, the cache's replay, skip runs
 * on DYNAMIC splits, and the split-done accounting of split_track.c, run
 * on real pipelines.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cachedb.h"
#include "element.h"
#include "pipeline_util.h"
#include "provenance.h"
#include "provwire.h"
#include "split_track.h"

#define RANGE(start, stop) "{\"type\":\"range\",\"start\":" #start ",\"stop\":" #stop "}"
#define ID_FEATURE "{\"op\":\"parse_example\",\"features\":{\"id\":{\"dtype\":\"int64\",\"shape\":[]}}}"

/* The positions a batch's runs name, in order; *n of them (== its elements). */
static uint64_t *positions(const sl_wire_batch_t *b, size_t *n)
{
    const sl_provenance_run_t *r = sl_wire_batch_prov(b);
    uint64_t total = 0;
    cr_assert_gt(b->prov_n, 0, "a batch without provenance");
    cr_assert_leq(b->prov_n, b->num_elements, "%lu runs for %lu elements", (unsigned long)b->prov_n,
                  (unsigned long)b->num_elements);
    for (uint64_t i = 0; i < b->prov_n; i++)
        total += r[i].count;
    cr_assert_eq(total, b->num_elements);
    uint64_t *p = malloc(total * sizeof *p + 1);
    size_t k = 0;
    for (uint64_t i = 0; i < b->prov_n; i++)
        for (uint64_t j = 0; j < r[i].count; j++)
            p[k++] = r[i].begin + j;
    *n = k;
    return p;
}

/* Checks that every batch's provenance matches its "value" (start + position)
 * and that runs are in epoch epoch; returns how many elements. */
static size_t check_range(const batches_t *bs, int64_t start, uint32_t epoch_of_first, bool one_epoch)
{
    size_t total = 0;
    for (size_t i = 0; i < bs->n; i++) {
        const sl_wire_batch_t *b = bs->b[i];
        const sl_component_t *c = comp_of(b, "value");
        size_t n;
        uint64_t *p = positions(b, &n);
        for (size_t k = 0; k < n; k++)
            cr_assert_eq(i64_at(b, c, k), start + (int64_t)p[k], "batch %zu element %zu", i, k);
        for (uint64_t r = 0; r < b->prov_n; r++) {
            cr_assert_eq(sl_wire_batch_prov(b)[r].file_index, 0);
            if (one_epoch)
                cr_assert_eq(sl_wire_batch_prov(b)[r].epoch, epoch_of_first);
        }
        total += n;
        free(p);
    }
    return total;
}

Test(provenance, source_element_is_one_inline_run)
{
    batches_t bs = run_spec("{\"source\":" RANGE(10, 13) "}", NULL);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 3);
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(bs.b[i]->prov_n, 1);
        cr_assert_null(bs.b[i]->prov_heap, "one run needs no allocation");
        sl_provenance_run_t want = {0, 0, i, 1};
        cr_assert_eq(memcmp(&bs.b[i]->prov_one, &want, sizeof want), 0);
    }
    batches_free(&bs);
}

Test(provenance, unshuffled_batch_is_one_run_bulk_and_element_paths)
{
    /* range -> batch takes the bulk path; a cast in between forces the
     * element path. Either way a batch of 1024 is one run. */
    const char *specs[] = {
        "{\"source\":" RANGE(0, 3000) ",\"ops\":[{\"op\":\"batch\",\"batch_size\":1024}]}",
        "{\"source\":" RANGE(0, 3000) ",\"ops\":[{\"op\":\"cast\",\"key\":\"value\",\"dtype\":\"int64\"},"
        "{\"op\":\"batch\",\"batch_size\":1024}]}",
    };
    for (int s = 0; s < 2; s++) {
        batches_t bs = run_spec(specs[s], NULL);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(bs.n, 3);
        for (size_t i = 0; i < bs.n; i++) {
            cr_assert_eq(bs.b[i]->prov_n, 1, "spec %d batch %zu: %lu runs", s, i, (unsigned long)bs.b[i]->prov_n);
            cr_assert_eq(sl_wire_batch_prov(bs.b[i])->begin, i * 1024);
        }
        cr_assert_eq(check_range(&bs, 0, 0, true), 3000);
        batches_free(&bs);
    }
}

Test(provenance, shuffle_filter_map_batch_keep_each_elements_own)
{
    /* shuffle moves provenance with the element, filter drops elements
     * with theirs, cast (1 -> 1) keeps it, batch concatenates in order. */
    batches_t bs = run_spec("{\"source\":" RANGE(0, 500) ",\"ops\":["
                            "{\"op\":\"shuffle\",\"buffer_size\":64,\"seed\":5},"
                            "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"ne\",\"value\":77},"
                            "{\"op\":\"cast\",\"key\":\"value\",\"dtype\":\"int64\"},"
                            "{\"op\":\"batch\",\"batch_size\":10}]}",
                            NULL);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(check_range(&bs, 0, 0, true), 499);
    batches_free(&bs);
}

Test(provenance, parallel_stage_and_prefetch_move_it_with_the_element)
{
    batches_t bs = run_spec("{\"source\":" RANGE(100, 900) ",\"ops\":["
                            "{\"op\":\"shuffle\",\"buffer_size\":32,\"seed\":1},"
                            "{\"op\":\"cast\",\"key\":\"value\",\"dtype\":\"int64\",\"num_parallel_calls\":3,"
                            "\"deterministic\":false},"
                            "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"lt\",\"value\":800,\"num_parallel_calls\":2},"
                            "{\"op\":\"prefetch\",\"buffer_size\":4},"
                            "{\"op\":\"batch\",\"batch_size\":7}]}",
                            &(sl_pipeline_opts_t){.threads = 4});
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(check_range(&bs, 100, 0, true), 700);
    batches_free(&bs);
}

Test(provenance, take_skip_shard_pass_it_through_on_both_paths)
{
    const char *specs[] = {
        "{\"source\":" RANGE(0, 100) ",\"ops\":[{\"op\":\"skip\",\"count\":5},{\"op\":\"take\",\"count\":40},"
        "{\"op\":\"batch\",\"batch_size\":16}]}",
        "{\"source\":" RANGE(0, 100) ",\"ops\":[{\"op\":\"shard\",\"num_shards\":3,\"index\":1},"
        "{\"op\":\"skip\",\"count\":5},{\"op\":\"take\",\"count\":10},{\"op\":\"batch\",\"batch_size\":4}]}",
    };
    const size_t want[] = {40, 10};
    for (int s = 0; s < 2; s++) {
        batches_t bs = run_spec(specs[s], NULL);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(check_range(&bs, 0, 0, true), want[s]);
        if (s == 0) {
            cr_assert_eq(bs.b[0]->prov_n, 1);
            cr_assert_eq(sl_wire_batch_prov(bs.b[0])->begin, 5);
        } else {
            /* Every third element: no two are contiguous. */
            cr_assert_eq(bs.b[0]->prov_n, 4);
        }
        batches_free(&bs);
    }
}

Test(provenance, repeat_numbers_the_epochs)
{
    batches_t bs = run_spec("{\"source\":" RANGE(0, 6) ",\"ops\":[{\"op\":\"repeat\",\"count\":3},"
                            "{\"op\":\"batch\",\"batch_size\":4}]}",
                            NULL);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    /* 18 elements in batches of 4: runs never merge across epochs. */
    cr_assert_eq(check_range(&bs, 0, 0, false), 18);
    const sl_provenance_run_t *r = sl_wire_batch_prov(bs.b[1]); /* elements 4..7: epoch 0 [4,6), epoch 1 [0,2) */
    cr_assert_eq(bs.b[1]->prov_n, 2);
    cr_assert_eq(r[0].epoch, 0);
    cr_assert_eq(r[0].begin, 4);
    cr_assert_eq(r[0].count, 2);
    cr_assert_eq(r[1].epoch, 1);
    cr_assert_eq(r[1].begin, 0);
    cr_assert_eq(r[1].count, 2);
    batches_free(&bs);
}

Test(provenance, padded_batch_gathers_it)
{
    batches_t bs = run_spec("{\"source\":" RANGE(0, 9) ",\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":4,\"seed\":2},"
                            "{\"op\":\"padded_batch\",\"batch_size\":4}]}",
                            NULL);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(check_range(&bs, 0, 0, true), 9);
    batches_free(&bs);
}

Test(provenance, file_source_records_and_files)
{
    /* basic-0000k-of-00004 hold ids 250k .. 250k + 249 in record order. */
    sl_confine_t *roots = roots_at(FIXTURES);
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/basic-*-of-00004.tfrecord\"},"
                                  "\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":100,\"seed\":9}," ID_FEATURE ","
                                  "{\"op\":\"batch\",\"batch_size\":33}]}",
                                  FIXTURES),
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    size_t total = 0;
    for (size_t i = 0; i < bs.n; i++) {
        const sl_wire_batch_t *b = bs.b[i];
        const sl_component_t *c = comp_of(b, "id");
        const sl_provenance_run_t *r = sl_wire_batch_prov(b);
        uint64_t k = 0;
        for (uint64_t j = 0; j < b->prov_n; j++)
            for (uint64_t x = 0; x < r[j].count; x++, k++)
                cr_assert_eq(i64_at(b, c, k), (int64_t)(250 * r[j].file_index + r[j].begin + x));
        total += k;
    }
    cr_assert_eq(total, 1000);
    batches_free(&bs);
    sl_confine_destroy(roots);
}

Test(provenance, memory_cache_replays_it_in_the_replaying_epoch)
{
    batches_t bs = run_spec("{\"source\":" RANGE(0, 10) ",\"ops\":[{\"op\":\"cache\"},{\"op\":\"repeat\",\"count\":2},"
                            "{\"op\":\"batch\",\"batch_size\":10}]}",
                            NULL);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 2);
    for (size_t i = 0; i < 2; i++) {
        cr_assert_eq(bs.b[i]->prov_n, 1);
        sl_provenance_run_t want = {(uint32_t)i, 0, 0, 10};
        cr_assert_eq(memcmp(sl_wire_batch_prov(bs.b[i]), &want, sizeof want), 0, "epoch %zu", i);
    }
    cr_assert_eq(check_range(&bs, 0, 0, false), 20);
    batches_free(&bs);
}

Test(provenance, disk_cache_replays_it_in_a_new_pipeline)
{
    char dir[] = "/tmp/sl-prov-cache-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    sl_cache_env_t env = {.mem_limit = 1 << 20};
    char err[512];
    cr_assert_eq(sl_cachedb_open(dir, (size_t)16 << 20, &env.db, err, sizeof err), 0, "%s", err);
    sl_pipeline_opts_t o = {.cache = &env};
    const char *spec = "{\"source\":" RANGE(5, 45) ",\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":8},"
                       "{\"op\":\"cache\",\"storage\":\"disk\"},{\"op\":\"batch\",\"batch_size\":40}]}";
    /* The first pipeline writes the entry, the second reads it from its
     * first epoch: the unseeded shuffle's order, frozen in the cache, and
     * the same provenance, epoch 0 both times. */
    batches_t a = run_spec(spec, &o), b = run_spec(spec, &o);
    cr_assert_eq(a.rc, 1, "%s", a.errmsg);
    cr_assert_eq(b.rc, 1, "%s", b.errmsg);
    cr_assert_eq(a.n, 1);
    cr_assert_eq(b.n, 1);
    cr_assert_eq(check_range(&a, 5, 0, true), 40);
    cr_assert_eq(check_range(&b, 5, 0, true), 40);
    cr_assert_eq(a.b[0]->prov_n, b.b[0]->prov_n);
    cr_assert_eq(memcmp(sl_wire_batch_prov(a.b[0]), sl_wire_batch_prov(b.b[0]), a.b[0]->prov_n * SL_PROV_RUN_BYTES), 0);
    cr_assert_eq(memcmp(a.b[0]->data, b.b[0]->data, a.b[0]->size), 0);
    batches_free(&a);
    batches_free(&b);
    sl_cachedb_close(env.db);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* ---- DYNAMIC: skip runs and settling ---- */

/* A split source that hands out fixed splits (with skip runs) in epoch 0
 * and keeps the books as the task does, through a split_track. */
struct books {
    const sl_split_t *splits;
    size_t n, next;
    sl_split_track_t *track;
    uint64_t dropped; /* records dropped, all told */
    uint64_t read;    /* records the sources said they read */
    unsigned reads;   /* split_read calls */
};

static int books_next(void *arg, uint64_t epoch, sl_split_t *out)
{
    struct books *k = arg;
    if (epoch != 0 || k->next == k->n)
        return 1;
    *out = k->splits[k->next++];
    if (k->track) {
        sl_skip_run_t *copy = NULL;
        if (out->num_skips) {
            copy = malloc(out->num_skips * sizeof *copy);
            memcpy(copy, out->skips, out->num_skips * sizeof *copy);
        }
        cr_assert_eq(sl_split_track_add(k->track, epoch, out, copy), 0);
    }
    return 0;
}

static void books_read(void *arg, uint64_t epoch, const sl_split_t *s, uint64_t records)
{
    struct books *k = arg;
    k->reads++;
    k->read += records;
    if (k->track)
        sl_split_track_read(k->track, epoch, s, records);
}

static void books_dropped(void *arg, const sl_provenance_run_t *runs, uint64_t n)
{
    struct books *k = arg;
    for (uint64_t i = 0; i < n; i++)
        k->dropped += runs[i].count;
    if (k->track)
        sl_split_track_settle(k->track, runs, n, SL_SETTLE_DROPPED);
}

static sl_pipeline_opts_t books_opts(struct books *k)
{
    return (sl_pipeline_opts_t){.sharding = SL_SHARDING_DYNAMIC,
                                .splits = {books_next, k, books_read, books_dropped}};
}

static const sl_skip_run_t skips_a[] = {{2, 3}, {8, 2}};   /* split [0, 10): yields 0 1 5 6 7 */
static const sl_skip_run_t skips_b[] = {{10, 10}};          /* split [10, 20): all skipped */
static const sl_skip_run_t skips_c[] = {{20, 1}, {29, 1}};  /* split [20, 30): yields 21..28 */

static const sl_split_t skip_splits[] = {
    {.file_index = 0, .begin = 0, .end = 10, .split_id = 1, .skips = skips_a, .num_skips = 2},
    {.file_index = 0, .begin = 10, .end = 20, .split_id = 2, .skips = skips_b, .num_skips = 1},
    {.file_index = 0, .begin = 20, .end = 30, .split_id = 3, .skips = skips_c, .num_skips = 2},
    {.file_index = 0, .begin = 30, .end = 35, .split_id = 4},
};

Test(provenance, range_never_yields_a_skipped_record_on_either_path)
{
    static const int64_t want[] = {0, 1, 5, 6, 7, 21, 22, 23, 24, 25, 26, 27, 28, 30, 31, 32, 33, 34};
    const char *specs[] = {
        "{\"source\":" RANGE(0, 40) ",\"ops\":[{\"op\":\"batch\",\"batch_size\":4}]}",   /* bulk */
        "{\"source\":" RANGE(0, 40) ",\"ops\":[{\"op\":\"cast\",\"key\":\"value\",\"dtype\":\"int64\"},"
        "{\"op\":\"batch\",\"batch_size\":4}]}",                                            /* elements */
    };
    for (int s = 0; s < 2; s++) {
        struct books k = {skip_splits, 4, 0, NULL, 0, 0, 0};
        sl_pipeline_opts_t o = books_opts(&k);
        batches_t bs = run_spec(specs[s], &o);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        size_t n;
        int64_t *v = all_i64(&bs, "value", &n);
        cr_assert_eq(n, sizeof want / sizeof want[0], "spec %d: %zu values", s, n);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(v[i], want[i], "spec %d value %zu", s, i);
        free(v);
        cr_assert_eq(check_range(&bs, 0, 0, true), n);
        cr_assert_eq(k.reads, 4, "every split is read, the wholly skipped one too");
        cr_assert_eq(k.read, n);
        batches_free(&bs);
    }
}

Test(provenance, file_source_reads_past_skipped_records)
{
    static const sl_skip_run_t k0[] = {{3, 4}};
    static const sl_split_t splits[] = {
        {.file_index = 1, .begin = 0, .end = 10, .split_id = 7, .skips = k0, .num_skips = 1},
        {.file_index = 2, .begin = 5, .end = 8, .split_id = 8},
    };
    sl_confine_t *roots = roots_at(FIXTURES);
    struct books k = {splits, 2, 0, NULL, 0, 0, 0};
    sl_pipeline_opts_t o = books_opts(&k);
    o.roots = roots;
    batches_t bs = run_spec(specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/basic-*-of-00004.tfrecord\"},"
                                  "\"ops\":[" ID_FEATURE ",{\"op\":\"batch\",\"batch_size\":20}]}",
                                  FIXTURES),
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    size_t n;
    int64_t *v = all_i64(&bs, "id", &n);
    static const int64_t want[] = {250, 251, 252, 257, 258, 259, 505, 506, 507};
    cr_assert_eq(n, 9);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(v[i], want[i]);
    free(v);
    cr_assert_eq(bs.b[0]->prov_n, 3); /* [0,3) and [7,10) of file 1, [5,8) of file 2 */
    cr_assert_eq(k.read, 9);
    batches_free(&bs);
    sl_confine_destroy(roots);
}

/* Pulls the pipeline of spec over splits batch by batch (batch_size the
 * records each split yields): the batch holding a split's last record
 * comes out with that split read already, so the worker can send the
 * split's done notice with it, not in a later frame its client may never
 * ask for. */
static void each_split_read_with_its_last_batch(const char *spec, const sl_split_t *splits, size_t n,
                                                const sl_confine_t *roots)
{
    struct books k = {splits, n, 0, NULL, 0, 0, 0};
    sl_pipeline_opts_t o = books_opts(&k);
    o.roots = roots;
    sl_pipeline_t *p = pipeline_make(spec, &o);
    for (unsigned i = 1; i <= n; i++) {
        sl_wire_batch_t *b = NULL;
        cr_assert_eq(sl_pipeline_next(p, &b), 0, "batch %u: %s", i, sl_pipeline_errmsg(p));
        cr_assert_eq(k.reads, i, "%s: split %u is read only after the batch with its last record", spec, i);
        sl_wire_batch_free(b);
    }
    sl_wire_batch_t *b = NULL;
    cr_assert_eq(sl_pipeline_next(p, &b), 1, "%s", sl_pipeline_errmsg(p));
    cr_assert_eq(k.reads, n);
    sl_pipeline_destroy(p);
}

Test(provenance, a_split_is_read_when_the_batch_with_its_last_record_comes_out)
{
    static const sl_skip_run_t tail[] = {{8, 2}};            /* [0, 10): yields 0..7 */
    static const sl_skip_run_t both[] = {{18, 2}, {28, 2}};  /* [18, 30): yields 20..27 */
    static const sl_split_t splits[] = {
        {.file_index = 0, .begin = 0, .end = 10, .split_id = 1, .skips = tail, .num_skips = 1},
        {.file_index = 0, .begin = 10, .end = 18, .split_id = 2},
        {.file_index = 0, .begin = 18, .end = 30, .split_id = 3, .skips = both, .num_skips = 2},
    };
    /* The bulk path, then element by element. */
    each_split_read_with_its_last_batch("{\"source\":" RANGE(0, 40) ",\"ops\":[{\"op\":\"batch\",\"batch_size\":8}]}",
                                        splits, 3, NULL);
    each_split_read_with_its_last_batch("{\"source\":" RANGE(0, 40) ",\"ops\":[{\"op\":\"cast\",\"key\":\"value\","
                                        "\"dtype\":\"int64\"},{\"op\":\"batch\",\"batch_size\":8}]}",
                                        splits, 3, NULL);
    static const sl_split_t file_splits[] = {
        {.file_index = 1, .begin = 0, .end = 8, .split_id = 7},
        {.file_index = 2, .begin = 2, .end = 10, .split_id = 8},
    };
    sl_confine_t *roots = roots_at(FIXTURES);
    const char *files = specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"%s/basic-*-of-00004.tfrecord\"},"
                              "\"ops\":[" ID_FEATURE ",{\"op\":\"batch\",\"batch_size\":8}]}",
                              FIXTURES);
    each_split_read_with_its_last_batch(files, file_splits, 2, roots);
    sl_confine_destroy(roots);
}

Test(provenance, bad_skip_runs_fail_with_eproto)
{
    static const sl_skip_run_t overlap[] = {{2, 3}, {4, 1}};
    static const sl_skip_run_t outside[] = {{8, 5}};
    static const sl_skip_run_t empty[] = {{3, 0}};
    const sl_skip_run_t *bad[] = {overlap, outside, empty};
    const uint32_t nbad[] = {2, 1, 1};
    for (int i = 0; i < 3; i++) {
        sl_split_t s = {.file_index = 0, .begin = 0, .end = 10, .split_id = 9, .skips = bad[i], .num_skips = nbad[i]};
        struct books k = {&s, 1, 0, NULL, 0, 0, 0};
        sl_pipeline_opts_t o = books_opts(&k);
        batches_t bs = run_spec("{\"source\":" RANGE(0, 10) "}", &o);
        cr_assert_eq(bs.rc, SL_EPROTO, "case %d: %d", i, bs.rc);
        cr_assert(strstr(bs.errmsg, "skip run") && strstr(bs.errmsg, "split 9"), "%s", bs.errmsg);
        batches_free(&bs);
    }
}

/* The accounting the worker does, on a pipeline with shuffle, filter and
 * batch(drop_remainder) over DYNAMIC splits: every batch is "sent" as it
 * comes, and its tallies count its records split by split, one row a
 * split (half the batches are sent by those rows, half run by run); at the end every split has exactly one done notice whose delivered
 * count is its records in the batches, and batches plus drops account for
 * every record. */
Test(provenance, settling_is_exact_with_shuffle_filter_drop_remainder)
{
    enum { N = 1000, SPLIT = 37 };
    sl_split_t splits[(N + SPLIT - 1) / SPLIT];
    size_t ns = 0;
    for (uint64_t b = 0; b < N; b += SPLIT, ns++)
        splits[ns] = (sl_split_t){.begin = b, .end = b + SPLIT < N ? b + SPLIT : N, .split_id = 100 + ns};
    struct books k = {splits, ns, 0, sl_split_track_new(), 0, 0, 0};
    sl_pipeline_opts_t o = books_opts(&k);
    sl_pipeline_t *p = pipeline_make("{\"source\":" RANGE(0, 1000) ",\"ops\":["
                                     "{\"op\":\"shuffle\",\"buffer_size\":150,\"seed\":4},"
                                     "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"ge\",\"value\":90},"
                                     "{\"op\":\"batch\",\"batch_size\":32,\"drop_remainder\":true}]}",
                                     &o);
    uint64_t in_batches[(N + SPLIT - 1) / SPLIT] = {0}, sent = 0;
    unsigned done_count[(N + SPLIT - 1) / SPLIT] = {0};
    uint64_t done_delivered[(N + SPLIT - 1) / SPLIT] = {0};
    bool seen[N] = {false};
    unsigned max_tracked = 0, done_early = 0;
    sl_split_done_rec_t recs[64];
    int rc;
    for (;;) {
        sl_wire_batch_t *b = NULL;
        rc = sl_pipeline_next(p, &b);
        if (rc != 0)
            break;
        size_t n;
        uint64_t *pos = positions(b, &n);
        uint64_t in_this[(N + SPLIT - 1) / SPLIT] = {0};
        for (size_t i = 0; i < n; i++) {
            cr_assert(!seen[pos[i]], "record %lu twice", (unsigned long)pos[i]);
            seen[pos[i]] = true;
            in_batches[pos[i] / SPLIT]++;
            in_this[pos[i] / SPLIT]++;
        }
        free(pos);
        sent += n;
        sl_split_done_t tally[(N + SPLIT - 1) / SPLIT];
        cr_assert_leq(sl_split_track_size(k.track), (N + SPLIT - 1) / SPLIT);
        unsigned nt = sl_split_track_out(k.track, sl_wire_batch_prov(b), b->prov_n, tally, NULL);
        unsigned splits_in_this = 0;
        for (size_t s = 0; s < ns; s++)
            splits_in_this += in_this[s] > 0;
        cr_assert_eq(nt, splits_in_this, "a row for each split the batch reaches, once");
        for (unsigned i = 0; i < nt; i++) {
            size_t s = tally[i].split_id - 100;
            cr_assert_eq(tally[i].begin, splits[s].begin);
            cr_assert_eq(tally[i].end, splits[s].end);
            cr_assert_eq(tally[i].delivered, in_this[s], "split %zu: tallied %lu of %lu", s,
                         (unsigned long)tally[i].delivered, (unsigned long)in_this[s]);
        }
        /* Sent as the worker sends: by its rows (every other batch) or run by run. */
        if (sent / 32 % 2)
            sl_split_track_settle_rows(k.track, tally, nt, SL_SETTLE_SENT);
        else
            sl_split_track_settle(k.track, sl_wire_batch_prov(b), b->prov_n, SL_SETTLE_SENT);
        if (sl_split_track_size(k.track) > max_tracked)
            max_tracked = sl_split_track_size(k.track);
        unsigned got = sl_split_track_collect(k.track, recs, 64);
        done_early += got;
        for (unsigned i = 0; i < got; i++) {
            size_t s = recs[i].split_id - 100;
            done_count[s]++;
            done_delivered[s] = recs[i].delivered;
            /* A notice comes only after every batch with its records. */
            cr_assert_eq(recs[i].delivered, in_batches[s]);
        }
        sl_wire_batch_free(b);
    }
    cr_assert_eq(rc, 1, "%s", sl_pipeline_errmsg(p));
    sl_split_track_end(k.track);
    unsigned got = sl_split_track_collect(k.track, recs, 64);
    for (unsigned i = 0; i < got; i++) {
        size_t s = recs[i].split_id - 100;
        done_count[s]++;
        done_delivered[s] = recs[i].delivered;
    }
    cr_assert_eq(sl_split_track_size(k.track), 0);
    /* Batches and drops account for every record, each once. */
    cr_assert_eq(sent + k.dropped, N, "sent %lu dropped %lu", (unsigned long)sent, (unsigned long)k.dropped);
    cr_assert_eq(sent, (N - 90) / 32 * 32);
    for (size_t s = 0; s < ns; s++) {
        cr_assert_eq(done_count[s], 1, "split %zu: %u notices", s, done_count[s]);
        cr_assert_eq(done_delivered[s], in_batches[s], "split %zu", s);
    }
    /* Most splits were done while the pipeline ran, not at its end: the
     * table holds the splits in flight only (those the shuffle buffer
     * still has records of), never all of them. */
    cr_assert_gt(done_early, ns / 2, "%u of %zu splits done before the end", done_early, ns);
    cr_assert_lt(max_tracked, ns, "%u splits tracked at once", max_tracked);
    sl_pipeline_destroy(p);
    sl_split_track_free(k.track);
}

Test(provenance, a_run_spanning_two_splits_settles_in_both)
{
    sl_split_track_t *t = sl_split_track_new();
    sl_split_t a = {.begin = 0, .end = 10, .split_id = 1}, b = {.begin = 10, .end = 20, .split_id = 2};
    cr_assert_eq(sl_split_track_add(t, 3, &a, NULL), 0);
    cr_assert_eq(sl_split_track_add(t, 3, &b, NULL), 0);
    sl_split_track_read(t, 3, &a, 10);
    sl_split_track_read(t, 3, &b, 10);
    sl_provenance_run_t r = {3, 0, 4, 12}; /* [4, 16) */
    sl_split_track_settle(t, &r, 1, SL_SETTLE_SENT);
    sl_provenance_run_t d[] = {{3, 0, 0, 4}, {3, 0, 16, 4}, {4, 0, 0, 1} /* another epoch: ignored */};
    sl_split_track_settle(t, d, 3, SL_SETTLE_DROPPED);
    sl_split_done_rec_t out[4];
    cr_assert_eq(sl_split_track_collect(t, out, 4), 2);
    cr_assert_eq(out[0].split_id, 1);
    cr_assert_eq(out[0].delivered, 6);
    cr_assert_eq(out[0].epoch, 3);
    cr_assert_eq(out[1].split_id, 2);
    cr_assert_eq(out[1].delivered, 6);
    sl_split_track_free(t);
}

/* What a worker sends is what a client reads: the runs of shuffled,
 * repeated, interleaved batches survive the wire encoding (provwire.c),
 * each in fewer bytes than the 24 of a run in memory. */
Test(provenance, wire_encoding_round_trips_pipeline_batches)
{
    batches_t bs = run_spec("{\"source\":" RANGE(0, 3000) ",\"ops\":["
                            "{\"op\":\"repeat\",\"count\":2},"
                            "{\"op\":\"shuffle\",\"buffer_size\":512,\"seed\":9},"
                            "{\"op\":\"batch\",\"batch_size\":100}]}",
                            NULL);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 60);
    for (size_t i = 0; i < bs.n; i++) {
        const sl_wire_batch_t *b = bs.b[i];
        uint8_t *wire;
        size_t len;
        cr_assert_eq(sl_provwire_encode(sl_wire_batch_prov(b), b->prov_n, &wire, &len), 0);
        cr_assert_lt(len, b->prov_n * SL_PROV_RUN_BYTES / 4, "batch %zu: %zu bytes for %lu runs", i, len,
                     (unsigned long)b->prov_n);
        sl_provenance_run_t *runs;
        uint64_t n;
        char err[256];
        cr_assert_eq(sl_provwire_decode(wire, len, b->num_elements, &runs, &n, err, sizeof err), 0, "%s", err);
        cr_assert_eq(n, b->prov_n);
        cr_assert_eq(memcmp(runs, sl_wire_batch_prov(b), n * sizeof *runs), 0, "batch %zu", i);
        free(runs);
        free(wire);
    }
    batches_free(&bs);
}

/* The batch op's inline append of one run gives the runs sl_prov_append()
 * gives, run for run: merging contiguous runs of one epoch and file, on the
 * inline run and on the heap, full or with room (sl_prov_reserve()). */
Test(provenance, appending_one_run_inline_is_sl_prov_append)
{
    uint64_t s = 12345;
    for (int round = 0; round < 200; round++) {
        sl_element_t *a = calloc(1, sl_element_size(1)), *b = calloc(1, sl_element_size(1));
        cr_assert(a && b);
        sl_element_init(a, 1);
        sl_element_init(b, 1);
        uint64_t at = 0;
        int n = 1 + (int)(s % 3000);
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005u + 1442695040888963407u;
            unsigned d = (unsigned)(s >> 33);
            /* Mostly contiguous or near, sometimes another file or epoch. */
            at = d % 4 == 0 ? at + (d >> 8) % 50 : at;
            sl_provenance_run_t r = {d % 11 == 0, d % 13 == 0, at, 1 + (d >> 16) % 3};
            at += r.count;
            cr_assert_eq(sl_prov_append_one(a, &r), 0);
            cr_assert_eq(sl_prov_append(b, &r, 1), 0);
            if (round % 2 && sl_prov_count(a) == 2) {
                cr_assert_eq(sl_prov_reserve(a, (uint64_t)n), 0);
                cr_assert_eq(sl_prov_reserve(b, (uint64_t)n), 0);
            }
        }
        cr_assert_eq(sl_prov_count(a), sl_prov_count(b), "round %d: %u runs against %u", round, sl_prov_count(a),
                     sl_prov_count(b));
        cr_assert(memcmp(sl_prov_runs(a), sl_prov_runs(b), sl_prov_count(a) * sizeof(sl_provenance_run_t)) == 0,
                  "round %d: other runs", round);
        sl_element_clear(a);
        sl_element_clear(b);
        free(a);
        free(b);
    }
}
