/*
 * test_parallel.c: parallel stages (pipeline/parallel.c): num_parallel_calls
 * on map, filter and the built-in element-wise ops gives the sequential
 * output, in order (deterministic) or as a multiset; seeded random ops draw
 * the same for any num_parallel_calls; errors surface in input order; the
 * pool stays within --threads; reset and destroy mid-stream are clean.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autotune.h"
#include "element.h"
#include "pipeline_util.h"
#include "thread_util.h"
#include "plugin.h"

static sl_plugins_t *plugins;
static sl_confine_t *roots;

static void setup(void)
{
    const char *dirs[] = {SL_TEST_PLUGIN_DIR};
    char err[512];
    cr_assert_eq(sl_plugins_create(dirs, 1, &plugins, err, sizeof err), 0, "%s", err);
    roots = roots_at(FIXTURES);
}

static void teardown(void)
{
    sl_plugins_destroy(plugins);
    sl_confine_destroy(roots);
}

TestSuite(parallel, .init = setup, .fini = teardown);

#define MAP_DOUBLE "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"add_double\",\"output\":{\"double\":\"int64\"}"
#define EVEN "{\"op\":\"filter\",\"plugin\":\"libsltest.so\",\"function\":\"is_even\""

static batches_t run_range(int n, const char *ops, unsigned threads)
{
    sl_pipeline_opts_t o = {.plugins = plugins, .roots = roots, .threads = threads};
    return run_spec(specf("{\"source\":{\"type\":\"range\",\"stop\":%d},\"ops\":[%s]}", n, ops), &o);
}

/* Every batch's bytes, in order, as one comparable list. */
static void assert_same(const batches_t *a, const batches_t *b, const char *what)
{
    cr_assert_eq(a->rc, b->rc, "%s: %d vs %d (%s / %s)", what, a->rc, b->rc, a->errmsg, b->errmsg);
    cr_assert_eq(a->n, b->n, "%s: %zu vs %zu batches", what, a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        cr_assert_eq(a->b[i]->size, b->b[i]->size, "%s: batch %zu", what, i);
        cr_assert_eq(memcmp(a->b[i]->data, b->b[i]->data, a->b[i]->size), 0, "%s: batch %zu differs", what, i);
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

Test(parallel, map_equals_sequential_in_order)
{
    batches_t seq = run_range(300, MAP_DOUBLE "}", 4);
    cr_assert_eq(seq.rc, 1, "%s", seq.errmsg);
    cr_assert_eq(seq.n, 300);
    for (int calls = 1; calls <= 8; calls *= 2) {
        char ops[512];
        snprintf(ops, sizeof ops, MAP_DOUBLE ",\"num_parallel_calls\":%d}", calls);
        batches_t par = run_range(300, ops, 4);
        assert_same(&seq, &par, ops);
        batches_free(&par);
    }
    batches_free(&seq);
}

Test(parallel, nondeterministic_is_the_same_multiset)
{
    batches_t par = run_range(500, EVEN ",\"num_parallel_calls\":4,\"deterministic\":false}," MAP_DOUBLE
                                   ",\"num_parallel_calls\":4,\"deterministic\":false}",
                              4);
    cr_assert_eq(par.rc, 1, "%s", par.errmsg);
    cr_assert_eq(par.n, 250);
    int64_t got[250];
    for (size_t i = 0; i < par.n; i++) {
        got[i] = i64_at(par.b[i], comp_of(par.b[i], "value"), 0);
        cr_assert_eq(i64_at(par.b[i], comp_of(par.b[i], "double"), 0), 2 * got[i]);
    }
    qsort(got, par.n, sizeof got[0], cmp_i64);
    for (size_t i = 0; i < par.n; i++)
        cr_assert_eq(got[i], 2 * (int64_t)i, "each even value once");
    batches_free(&par);
}

Test(parallel, filter_and_builtins_fused_equal_sequential)
{
    const char *seq_ops = "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"ne\",\"value\":5}," MAP_DOUBLE "},"
                          "{\"op\":\"cast\",\"key\":\"double\",\"dtype\":\"float32\"},{\"op\":\"batch\",\"batch_size\":7}";
    const char *par_ops = "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"ne\",\"value\":5,\"num_parallel_calls\":3},"
                          MAP_DOUBLE ",\"num_parallel_calls\":3},"
                          "{\"op\":\"cast\",\"key\":\"double\",\"dtype\":\"float32\",\"num_parallel_calls\":\"autotune\"},"
                          "{\"op\":\"batch\",\"batch_size\":7}";
    batches_t a = run_range(200, seq_ops, 2), b = run_range(200, par_ops, 2);
    cr_assert_eq(a.rc, 1, "%s", a.errmsg);
    assert_same(&a, &b, par_ops);
    batches_free(&a);
    batches_free(&b);
}

#define IMAGES_SRC "{\"type\":\"tfrecord\",\"files\":\"" FIXTURES "/images-*.tfrecord\"}"

/* The JPEG pipeline, every element-wise op with num_parallel_calls calls
 * (0: none), over two epochs. */
static batches_t run_images(int calls, int seed)
{
    char par[64] = "";
    if (calls > 0)
        snprintf(par, sizeof par, ",\"num_parallel_calls\":%d", calls);
    sl_pipeline_opts_t o = {.roots = roots, .threads = 4};
    const char *json = specf(
        "{\"source\":" IMAGES_SRC ",\"ops\":["
        "{\"op\":\"parse_example\",\"features\":{\"id\":{\"dtype\":\"int64\"},\"image/encoded\":{\"dtype\":\"bytes\"}}%s},"
        "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"%s},"
        "{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[20,24],\"seed\":%d%s},"
        "{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":%d%s},"
        "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[16,16]%s},"
        "{\"op\":\"normalize\",\"key\":\"image/encoded\",\"mean\":[0.5,0.5,0.5],\"std\":[0.25,0.25,0.25],\"scale\":true%s},"
        "{\"op\":\"repeat\",\"count\":2}]}",
        par, par, seed, par, seed + 1, par, par, par);
    return run_spec(json, &o);
}

Test(parallel, seeded_random_ops_equal_across_num_parallel_calls)
{
    batches_t seq = run_images(0, 7);
    cr_assert_eq(seq.rc, 1, "%s", seq.errmsg);
    cr_assert_gt(seq.n, 4);
    int calls[] = {1, 2, 4};
    for (size_t i = 0; i < 3; i++) {
        batches_t par = run_images(calls[i], 7);
        char what[64];
        snprintf(what, sizeof what, "num_parallel_calls %d", calls[i]);
        assert_same(&seq, &par, what);
        batches_free(&par);
    }
    /* And the seed matters: another one crops elsewhere somewhere. */
    batches_t other = run_images(4, 8);
    bool differs = false;
    for (size_t i = 0; i < other.n && !differs; i++)
        differs = memcmp(other.b[i]->data, seq.b[i]->data, seq.b[i]->size) != 0;
    cr_assert(differs);
    batches_free(&other);
    batches_free(&seq);
}

Test(parallel, errors_surface_in_input_order)
{
    for (int calls = 2; calls <= 8; calls *= 2) {
        char ops[512];
        snprintf(ops, sizeof ops,
                 "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"fail_on_7\",\"output\":{\"double\":"
                 "\"int64\"},\"num_parallel_calls\":%d},{\"op\":\"cast\",\"key\":\"double\",\"dtype\":\"int32\","
                 "\"num_parallel_calls\":%d}",
                 calls, calls);
        batches_t bs = run_range(100, ops, 4);
        cr_assert_eq(bs.rc, SL_EDATA, "%s", bs.errmsg);
        cr_assert_eq(bs.n, 7, "the 7 elements before the failing one, in order");
        for (size_t i = 0; i < bs.n; i++) {
            const sl_component_t *c = comp_of(bs.b[i], "value");
            cr_assert_eq(i64_at(bs.b[i], c, 0), (int64_t)i);
        }
        cr_assert_not_null(strstr(bs.errmsg, "ops[0] (map): plugin \"libsltest.so\" function \"fail_on_7\" failed (7): "
                                             "value 7 is unlucky"),
                           "%s", bs.errmsg);
        batches_free(&bs);
    }
}

Test(parallel, pool_stays_within_threads)
{
    struct {
        unsigned threads;
        const char *calls;
        int want;
    } cases[] = {{2, "8", 1}, {3, "\"autotune\"", 2}, {4, "2", 1}, {1, "4", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sl_pipeline_opts_t o = {.plugins = plugins, .threads = cases[i].threads};
        int before = threads_named(NULL);
        sl_pipeline_t *p = pipeline_make(specf("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[" MAP_DOUBLE
                                               ",\"num_parallel_calls\":%s}," EVEN ",\"num_parallel_calls\":%s}]}",
                                               cases[i].calls, cases[i].calls),
                                         &o);
        /* The pipeline's thread works too: the pool has one fewer. */
        cr_assert_eq(threads_named(NULL) - before, cases[i].want, "--threads %u, num_parallel_calls %s",
                     cases[i].threads, cases[i].calls);
        cr_assert_eq(threads_named("sl-parallel"), cases[i].want, "the pool's threads say what they are");
        batches_t bs = run_pipeline(p);
        cr_assert_eq(bs.n, 5, "%s", bs.errmsg);
        batches_free(&bs);
        sl_pipeline_destroy(p);
        int after = threads_settle_to(NULL, before);
        cr_assert_eq(after, before, "the pool's threads are joined: %d threads, %d before", after, before);
    }
}

Test(parallel, sequential_ops_start_no_thread)
{
    sl_pipeline_opts_t o = {.plugins = plugins, .threads = 4};
    int before = threads_named(NULL);
    sl_pipeline_t *p = pipeline_make("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[" MAP_DOUBLE
                                     ",\"num_parallel_calls\":1}]}",
                                     &o);
    cr_assert_eq(threads_named(NULL), before);
    sl_pipeline_destroy(p);
}

Test(parallel, reset_and_destroy_mid_stream)
{
    /* Counted before any pipeline: a pool just joined may still be listed
     * under /proc/self/task, and a count taken then is never seen again. */
    int before = threads_named(NULL);
    /* take ends the stage's input early and repeat resets it with
     * elements still in flight: every epoch starts over, in order. */
    batches_t bs = run_range(1000, MAP_DOUBLE ",\"num_parallel_calls\":4},{\"op\":\"take\",\"count\":5},"
                                   "{\"op\":\"repeat\",\"count\":3}",
                             4);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 15);
    for (size_t i = 0; i < bs.n; i++)
        cr_assert_eq(i64_at(bs.b[i], comp_of(bs.b[i], "double"), 0), 2 * (int64_t)(i % 5));
    batches_free(&bs);
    cr_assert_eq(threads_settle_to(NULL, before), before, "the first pipeline's pool is joined");

    /* Destroyed after a few elements, with the stage's window full. */
    sl_pipeline_opts_t o = {.plugins = plugins, .threads = 4};
    sl_pipeline_t *p = pipeline_make("{\"source\":{\"type\":\"range\",\"stop\":100000},\"ops\":[" MAP_DOUBLE
                                     ",\"num_parallel_calls\":4,\"deterministic\":false}]}",
                                     &o);
    bs = run_pipeline_n(p, 3);
    cr_assert_eq(bs.n, 3);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    cr_assert_eq(threads_settle_to(NULL, before), before);
}

/* Plugins do not see provenance: the host keeps each element's around the
 * plugin's map and drops it with the element a plugin filter drops, in
 * order or not, sequential or parallel. */
Test(parallel, plugin_map_and_filter_keep_provenance)
{
    const char *ops[] = {
        MAP_DOUBLE "}," EVEN "},{\"op\":\"batch\",\"batch_size\":8}",
        "{\"op\":\"shuffle\",\"buffer_size\":16,\"seed\":3}," MAP_DOUBLE ",\"num_parallel_calls\":4,"
        "\"deterministic\":false}," EVEN ",\"num_parallel_calls\":3},{\"op\":\"batch\",\"batch_size\":8}",
    };
    for (int s = 0; s < 2; s++) {
        batches_t bs = run_range(200, ops[s], 4);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        size_t total = 0;
        for (size_t i = 0; i < bs.n; i++) {
            const sl_wire_batch_t *b = bs.b[i];
            const sl_component_t *v = comp_of(b, "value"), *d = comp_of(b, "double");
            const sl_provenance_run_t *r = sl_wire_batch_prov(b);
            uint64_t k = 0;
            for (uint64_t j = 0; j < b->prov_n; j++) {
                for (uint64_t x = 0; x < r[j].count; x++, k++) {
                    cr_assert_eq(i64_at(b, v, k), (int64_t)(r[j].begin + x), "ops %d batch %zu", s, i);
                    cr_assert_eq(i64_at(b, d, k), 2 * (int64_t)(r[j].begin + x));
                }
            }
            cr_assert_eq(k, b->num_elements);
            total += k;
        }
        cr_assert_eq(total, 100);
        batches_free(&bs);
    }
}

/* "autotune": the stage decides while it runs (every SL_AUTOTUNE_WINDOW
 * elements) and stays within min(--threads, the CPUs of this process),
 * whatever it measures; the output is the sequential one. */
Test(parallel, autotune_stays_within_bounds)
{
    const char *jpeg = "{\"source\":{\"type\":\"tfrecord\",\"files\":\"" FIXTURES "/images-*.tfrecord\"},\"ops\":["
                       "{\"op\":\"repeat\",\"count\":8},"
                       "{\"op\":\"parse_example\",\"features\":{\"image/encoded\":{\"dtype\":\"bytes\"}}%s},"
                       "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"%s},"
                       "{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[36,36],\"seed\":7%s},"
                       "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[32,32]%s},"
                       "{\"op\":\"batch\",\"batch_size\":4}]}";
    const char *tune = ",\"num_parallel_calls\":\"autotune\"";
    unsigned cores = sl_autotune_cores();
    int base = threads_named(NULL);
    for (unsigned threads = 1; threads <= 4; threads++) {
        sl_pipeline_opts_t o = {.plugins = plugins, .roots = roots, .threads = threads};
        unsigned bound = cores && cores < threads ? cores : threads;
        /* A cheap map over many elements, and the JPEG ops of the fixtures. */
        char cheap[512], heavy[2048], seq_heavy[2048];
        snprintf(cheap, sizeof cheap,
                 "{\"source\":{\"type\":\"range\",\"stop\":3000},\"ops\":[" MAP_DOUBLE "%s}]}", tune);
        snprintf(heavy, sizeof heavy, jpeg, tune, tune, tune, tune);
        snprintf(seq_heavy, sizeof seq_heavy, jpeg, "", "", "", "");
        const char *specs[] = {cheap, heavy};
        for (int k = 0; k < 2; k++) {
            int before = threads_settle_to(NULL, base);
            cr_assert_eq(before, base, "the last pipeline's pool is joined");
            sl_pipeline_t *p = pipeline_make(specs[k], &o);
            cr_assert_leq(threads_named(NULL) - before, (int)threads - 1, "the pool is within --threads");
            sl_pipeline_parallel_stats_t st[4];
            bool is_par = threads > 1;
            cr_assert_eq(sl_pipeline_parallel_stats(p, st, 4), is_par ? 1 : 0, "threads %u", threads);
            batches_t bs = run_pipeline(p);
            cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
            if (is_par) {
                cr_assert_eq(sl_pipeline_parallel_stats(p, st, 4), 1);
                cr_assert(st[0].autotune);
                cr_assert_gt(st[0].decisions, 0, "spec %d: it decided while it ran", k);
                cr_assert_geq(st[0].min_parallelism, 1);
                cr_assert_leq(st[0].max_parallelism, bound, "spec %d threads %u cores %u", k, threads, cores);
                cr_assert_leq(st[0].parallelism, st[0].bound);
                cr_assert_eq(st[0].depth, 2 * st[0].parallelism);
            }
            if (k == 0) {
                cr_assert_eq(bs.n, 3000);
                for (size_t i = 0; i < bs.n; i++)
                    cr_assert_eq(i64_at(bs.b[i], comp_of(bs.b[i], "double"), 0), 2 * (int64_t)i);
            } else {
                batches_t seq = run_spec(seq_heavy, &o);
                assert_same(&seq, &bs, "autotuned JPEG ops against sequential");
                cr_assert_eq(bs.n, 8 * 32 / 4);
                batches_free(&seq);
            }
            batches_free(&bs);
            sl_pipeline_destroy(p);
            cr_assert_eq(threads_settle_to(NULL, before), before);
        }
    }
}

/* A given num_parallel_calls is not tuned: the stage keeps it. */
Test(parallel, explicit_parallelism_is_kept)
{
    sl_pipeline_opts_t o = {.plugins = plugins, .threads = 4};
    sl_pipeline_t *p = pipeline_make("{\"source\":{\"type\":\"range\",\"stop\":500},\"ops\":[" MAP_DOUBLE
                                     ",\"num_parallel_calls\":3}]}",
                                     &o);
    batches_t bs = run_pipeline(p);
    cr_assert_eq(bs.n, 500, "%s", bs.errmsg);
    sl_pipeline_parallel_stats_t st;
    cr_assert_eq(sl_pipeline_parallel_stats(p, &st, 1), 1);
    cr_assert_not(st.autotune);
    cr_assert_eq(st.parallelism, 3);
    cr_assert_eq(st.min_parallelism, 3);
    cr_assert_eq(st.max_parallelism, 3);
    cr_assert_eq(st.depth, 6);
    cr_assert_eq(st.decisions, 0);
    batches_free(&bs);
    sl_pipeline_destroy(p);
}
