/*
 * test_ops_cache.c: cache (pipeline/ops_cache.c) in memory and on disk
 * (storage/cachedb.c on a real LMDB in a temp dir): later epochs are the
 * first one again and open no file (counted, and the files deleted after
 * the first epoch); a second pipeline reads a complete disk entry at once;
 * an epoch cut short is never read as complete; over its bound a cache
 * gives up without losing an element; a foreign or damaged LMDB is
 * refused; the spec's and the pipeline's refusals.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <limits.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cachedb.h"
#include "pipeline_util.h"

static char base[PATH_MAX];  /* removed by teardown */
static char dir[PATH_MAX];   /* data files */
static char cdir[PATH_MAX];  /* the cache */

static void setup(void)
{
    char tmpl[64];
    snprintf(tmpl, sizeof tmpl, "/tmp/sl-test-cache-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpl));
    cr_assert_not_null(realpath(tmpl, base));
    snprintf(dir, sizeof dir, "%s/data", base);
    snprintf(cdir, sizeof cdir, "%s/cache", base);
    cr_assert_eq(mkdir(dir, 0700), 0);
}

static void teardown(void)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(cache, .init = setup, .fini = teardown);

/* Files f0 .. f{files-1} of `lines` lines each, "f<i>-<j>" padded to pad bytes. */
static void write_files(int files, int lines, int pad)
{
    for (int i = 0; i < files; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/f%d", dir, i);
        FILE *f = fopen(p, "w");
        cr_assert_not_null(f);
        for (int j = 0; j < lines; j++)
            fprintf(f, "f%d-%0*d\n", i, pad, j);
        fclose(f);
    }
}

static void remove_files(int files)
{
    for (int i = 0; i < files; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/f%d", dir, i);
        cr_assert_eq(unlink(p), 0);
    }
}

/* The lines of the batches, one string, "|" between. */
static char *lines_of(const batches_t *bs, size_t from, size_t to)
{
    size_t cap = (size_t)8 << 20, o = 0;
    char *buf = malloc(cap);
    buf[0] = '\0';
    for (size_t k = from; k < to && k < bs->n; k++) {
        const sl_component_t *c = comp_of(bs->b[k], "line");
        uint64_t n = count_of(bs->b[k], c);
        for (uint64_t i = 0; i < n; i++) {
            size_t len;
            const uint8_t *s = str_at(bs->b[k], c, i, &len);
            cr_assert_lt(o + len + 2, cap);
            o += (size_t)snprintf(buf + o, cap - o, "|%.*s", (int)len, (const char *)s);
        }
    }
    return buf;
}

static const char *spec_of(const char *ops)
{
    return specf("{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s/f*\"]},\"ops\":[%s]}", dir, ops);
}

/* Epoch 1 from the files, then the files go, then epochs 2 and 3. */
static void second_epoch_opens_no_file(sl_pipeline_opts_t *o, const char *storage)
{
    write_files(3, 10, 3);
    char ops[256];
    snprintf(ops, sizeof ops,
             "{\"op\":\"cache\",\"storage\":\"%s\"},{\"op\":\"repeat\",\"count\":3},{\"op\":\"batch\",\"batch_size\":6}",
             storage);
    sl_pipeline_t *p = pipeline_make(spec_of(ops), o);
    batches_t bs = run_pipeline_n(p, 5); /* 30 lines: the first epoch */
    cr_assert_eq(bs.n, 5);
    cr_assert_eq(sl_pipeline_files_opened(p), 3);
    remove_files(3);
    batches_t rest = run_pipeline(p);
    cr_assert_eq(rest.rc, 1, "%s", rest.errmsg);
    cr_assert_eq(rest.n, 10);
    cr_assert_eq(sl_pipeline_files_opened(p), 3, "the cached epochs open no file");
    cr_assert_eq(sl_pipeline_cache_overflows(p), 0);
    char *first = lines_of(&bs, 0, 5), *second = lines_of(&rest, 0, 5), *third = lines_of(&rest, 5, 10);
    cr_assert_str_eq(second, first);
    cr_assert_str_eq(third, first);
    cr_assert(strncmp(first, "|f0-000|f0-001", 14) == 0, "%s", first);
    free(first);
    free(second);
    free(third);
    batches_free(&bs);
    batches_free(&rest);
    sl_pipeline_destroy(p);
}

Test(cache, memory_second_epoch_opens_no_file)
{
    sl_confine_t *roots = roots_at(dir);
    sl_pipeline_opts_t o = {.roots = roots};
    second_epoch_opens_no_file(&o, "memory");
    sl_confine_destroy(roots);
}

static sl_cache_env_t disk_env(size_t map_bytes)
{
    sl_cache_env_t env = {.mem_limit = 1 << 20};
    char err[512];
    cr_assert_eq(sl_cachedb_open(cdir, map_bytes, &env.db, err, sizeof err), 0, "%s", err);
    return env;
}

Test(cache, disk_second_epoch_opens_no_file_and_a_new_pipeline_reads_it_at_once)
{
    sl_confine_t *roots = roots_at(dir);
    sl_cache_env_t env = disk_env((size_t)16 << 20);
    sl_pipeline_opts_t o = {.roots = roots, .cache = &env};
    second_epoch_opens_no_file(&o, "disk");
    /* The entry is complete: a new pipeline of the same spec reads it from
     * its first epoch (its files, written again, are never opened). */
    write_files(3, 10, 3);
    sl_pipeline_t *p = pipeline_make(spec_of("{\"op\":\"cache\",\"storage\":\"disk\"}"), &o);
    batches_t bs = run_pipeline(p);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 30);
    cr_assert_eq(sl_pipeline_files_opened(p), 0);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    /* Another prefix is another entry. */
    p = pipeline_make(spec_of("{\"op\":\"take\",\"count\":4},{\"op\":\"cache\",\"storage\":\"disk\"}"), &o);
    bs = run_pipeline(p);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 4);
    cr_assert_eq(sl_pipeline_files_opened(p), 1);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    /* And it survives the cache being closed and opened again. */
    sl_cachedb_close(env.db);
    env = disk_env((size_t)16 << 20);
    o.cache = &env;
    p = pipeline_make(spec_of("{\"op\":\"cache\",\"storage\":\"disk\"}"), &o);
    bs = run_pipeline(p);
    cr_assert_eq(bs.n, 30);
    cr_assert_eq(sl_pipeline_files_opened(p), 0);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    sl_cachedb_close(env.db);
    sl_confine_destroy(roots);
}

Test(cache, an_epoch_cut_short_is_not_cached)
{
    write_files(2, 10, 3);
    sl_confine_t *roots = roots_at(dir);
    sl_cache_env_t env = disk_env((size_t)16 << 20);
    for (int s = 0; s < 2; s++) {
        const char *storage = s ? "disk" : "memory";
        sl_pipeline_opts_t o = {.roots = roots, .cache = &env};
        char ops[256];
        /* take cuts every epoch of the cache short: nothing is ever
         * complete, every epoch reads the first file again. */
        snprintf(ops, sizeof ops,
                 "{\"op\":\"cache\",\"storage\":\"%s\"},{\"op\":\"take\",\"count\":5},{\"op\":\"repeat\",\"count\":3}",
                 storage);
        sl_pipeline_t *p = pipeline_make(spec_of(ops), &o);
        batches_t bs = run_pipeline(p);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(bs.n, 15);
        char *all = lines_of(&bs, 0, 15);
        cr_assert_str_eq(all, "|f0-000|f0-001|f0-002|f0-003|f0-004|f0-000|f0-001|f0-002|f0-003|f0-004"
                              "|f0-000|f0-001|f0-002|f0-003|f0-004");
        free(all);
        cr_assert_eq(sl_pipeline_files_opened(p), 3, "%s", storage);
        batches_free(&bs);
        sl_pipeline_destroy(p);
    }
    cr_assert_eq(env.mem_used, 0, "a dropped cache gives its memory back");
    /* Nothing complete was written for that prefix. */
    sl_pipeline_opts_t o = {.roots = roots, .cache = &env};
    sl_pipeline_t *p = pipeline_make(spec_of("{\"op\":\"cache\",\"storage\":\"disk\"}"), &o);
    batches_t bs = run_pipeline_n(p, 1);
    cr_assert_eq(sl_pipeline_files_opened(p), 1, "read from the file, not a partial entry");
    batches_free(&bs);
    sl_pipeline_destroy(p);
    sl_cachedb_close(env.db);
    sl_confine_destroy(roots);
}

Test(cache, memory_over_its_bound_gives_up_and_loses_nothing)
{
    write_files(2, 100, 20);
    sl_confine_t *roots = roots_at(dir);
    sl_cache_env_t env = {.mem_limit = 4096};
    sl_pipeline_opts_t o = {.roots = roots, .cache = &env};
    sl_pipeline_t *p = pipeline_make(spec_of("{\"op\":\"cache\"},{\"op\":\"repeat\",\"count\":3}"), &o);
    batches_t bs = run_pipeline(p);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 600);
    char *a = lines_of(&bs, 0, 200), *b = lines_of(&bs, 200, 400), *c = lines_of(&bs, 400, 600);
    cr_assert_str_eq(a, b);
    cr_assert_str_eq(a, c);
    free(a);
    free(b);
    free(c);
    cr_assert_eq(sl_pipeline_cache_overflows(p), 1, "counted once");
    cr_assert_eq(env.overflows, 1);
    cr_assert_eq(sl_pipeline_files_opened(p), 6, "every epoch reads the files");
    cr_assert_eq(env.mem_used, 0);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    sl_confine_destroy(roots);
}

Test(cache, disk_full_gives_up_and_loses_nothing)
{
    /* 4 files of 2000 lines of 200 bytes: about 1.6 MB, in a 512 KiB map. */
    write_files(4, 2000, 200);
    sl_confine_t *roots = roots_at(dir);
    sl_cache_env_t env = disk_env((size_t)512 << 10);
    sl_pipeline_opts_t o = {.roots = roots, .cache = &env};
    sl_pipeline_t *p = pipeline_make(spec_of("{\"op\":\"cache\",\"storage\":\"disk\"},{\"op\":\"repeat\",\"count\":2},"
                                             "{\"op\":\"batch\",\"batch_size\":1000}"),
                                     &o);
    batches_t bs = run_pipeline(p);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 16);
    char *a = lines_of(&bs, 0, 8), *b = lines_of(&bs, 8, 16);
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
    cr_assert_eq(sl_pipeline_cache_overflows(p), 1);
    cr_assert_eq(sl_pipeline_files_opened(p), 8);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    /* The cache still works for what fits. */
    p = pipeline_make(spec_of("{\"op\":\"take\",\"count\":10},{\"op\":\"cache\",\"storage\":\"disk\"},"
                              "{\"op\":\"repeat\",\"count\":2}"),
                      &o);
    bs = run_pipeline(p);
    cr_assert_eq(bs.n, 20);
    cr_assert_eq(sl_pipeline_files_opened(p), 1);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    sl_cachedb_close(env.db);
    sl_confine_destroy(roots);
}

Test(cache, batches_of_numbers_and_ragged_values_round_trip)
{
    sl_confine_t *roots = roots_at(FIXTURES);
    sl_cache_env_t env = disk_env((size_t)64 << 20);
    for (int s = 0; s < 2; s++) {
        sl_pipeline_opts_t o = {.roots = roots, .cache = &env};
        const char *ops = specf(
            "{\"source\":{\"type\":\"tfrecord\",\"files\":[\"%s/varlen-00000-of-00001.tfrecord\"]},\"ops\":["
            "{\"op\":\"parse_example\",\"features\":{\"tokens\":{\"dtype\":\"int64\",\"varlen\":true}}},"
            "{\"op\":\"batch\",\"batch_size\":7},{\"op\":\"cache\",\"storage\":\"%s\"},{\"op\":\"repeat\",\"count\":2}]}",
            FIXTURES, s ? "disk" : "memory");
        sl_pipeline_t *p = pipeline_make(ops, &o);
        batches_t bs = run_pipeline(p);
        cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
        cr_assert_eq(bs.n, 30);
        for (size_t k = 0; k < 15; k++) {
            cr_assert_eq(bs.b[k]->size, bs.b[k + 15]->size);
            cr_assert_eq(memcmp(bs.b[k]->data, bs.b[k + 15]->data, bs.b[k]->size), 0, "batch %zu", k);
            const sl_component_t *c0 = comp_of(bs.b[k], "tokens"), *c1 = comp_of(bs.b[k + 15], "tokens");
            cr_assert(c0->ragged && c1->ragged);
            cr_assert_eq(count_of(bs.b[k], c0), count_of(bs.b[k + 15], c1));
        }
        cr_assert_eq(sl_pipeline_files_opened(p), 1);
        batches_free(&bs);
        sl_pipeline_destroy(p);
    }
    sl_cachedb_close(env.db);
    sl_confine_destroy(roots);
}

Test(cache, refusals)
{
    sl_confine_t *roots = roots_at(dir);
    write_files(1, 1, 1);
    sl_pipeline_opts_t o = {.roots = roots};
    sl_pipeline_t *p = NULL;
    char err[1024];
    cr_assert_eq(pipeline_try(spec_of("{\"op\":\"cache\",\"storage\":\"disk\"}"), &o, &p, err, sizeof err), SL_EINVAL);
    cr_assert_str_eq(err, "ops[0] (cache): storage \"disk\" needs a worker started with --cache-dir, and this one has none");
    split_list_t l = {NULL, 0, 0, 0};
    o = dynamic_opts(&l, roots, SL_IO_AUTO);
    cr_assert_eq(pipeline_try(spec_of("{\"op\":\"cache\"}"), &o, &p, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "ops[0] (cache): under DYNAMIC sharding a cache keeps one entry per split on disk"), "%s",
              err);
    sl_cache_env_t env = disk_env((size_t)1 << 20);
    o.cache = &env;
    cr_assert_eq(pipeline_try(spec_of("{\"op\":\"batch\",\"batch_size\":2},{\"op\":\"cache\",\"storage\":\"disk\"}"), &o,
                              &p, err, sizeof err),
                 SL_EINVAL);
    cr_assert(strstr(err, "ops[1] (cache): under DYNAMIC sharding only element-wise ops") &&
                  strstr(err, "ops[0] is batch"),
              "%s", err);
    sl_cachedb_close(env.db);
    const char *bad = "{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[{\"op\":\"cache\",\"storage\":\"tape\"}]}";
    sl_spec_t *spec = NULL;
    cr_assert_eq(sl_spec_parse(bad, strlen(bad), &spec, err, sizeof err), SL_ESPEC);
    cr_assert(strncmp(err, "$.ops[0].storage: ", 18) == 0, "%s", err);
    sl_confine_destroy(roots);
}

/* ---- the LMDB cache itself ---- */

static void lmdb_put(const char *path, const char *key, const void *val, size_t len)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mkdir(path, 0700), 0);
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_open(env, path, 0, 0600), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    MDB_val k = {strlen(key), (void *)key}, v = {len, (void *)val};
    cr_assert_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

Test(cache, foreign_or_damaged_lmdb_is_refused)
{
    sl_cachedb_t *db = NULL;
    char err[1024];
    /* Another program's LMDB. */
    lmdb_put(cdir, "hello", "world", 5);
    cr_assert_eq(sl_cachedb_open(cdir, 1 << 20, &db, err, sizeof err), SL_EDATA);
    cr_assert_null(db);
    cr_assert(strstr(err, "holds an LMDB database that this worker did not write"), "%s", err);
    cr_assert_eq(system(specf("rm -rf '%s'", cdir)), 0);
    /* Another format. */
    uint32_t f = 99;
    lmdb_put(cdir, "sluice-cache-format", &f, sizeof f);
    cr_assert_eq(sl_cachedb_open(cdir, 1 << 20, &db, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "has format 99, this worker writes format 1"), "%s", err);
    cr_assert_eq(system(specf("rm -rf '%s'", cdir)), 0);
    /* Not LMDB at all. */
    cr_assert_eq(mkdir(cdir, 0700), 0);
    FILE *fp = fopen(specf("%s/data.mdb", cdir), "w");
    for (int i = 0; i < 4096; i++)
        fputs("garbage!", fp);
    fclose(fp);
    cr_assert_lt(sl_cachedb_open(cdir, 1 << 20, &db, err, sizeof err), 0);
    cr_assert(strstr(err, "cannot open it as an LMDB environment"), "%s", err);
}

Test(cache, one_worker_per_cache_dir)
{
    sl_cachedb_t *a = NULL, *b = NULL;
    char err[1024];
    cr_assert_eq(sl_cachedb_open(cdir, 1 << 20, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_cachedb_open(cdir, 1 << 20, &b, err, sizeof err), -EBUSY);
    cr_assert(strstr(err, "in use by another worker"), "%s", err);
    sl_cachedb_close(a);
    cr_assert_eq(sl_cachedb_open(cdir, 1 << 20, &b, err, sizeof err), 0, "%s", err);
    sl_cachedb_close(b);
}

Test(cache, an_entry_is_readable_only_once_finished_and_unfinished_ones_are_swept)
{
    sl_cachedb_t *db = NULL;
    sl_cachedb_writer_t *w = NULL, *w2 = NULL;
    sl_cachedb_reader_t *r = NULL;
    char err[1024];
    uint64_t count;
    cr_assert_eq(sl_cachedb_open(cdir, 64 << 20, &db, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_cachedb_writer_begin(db, "k1", &w, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_cachedb_writer_begin(db, "k1", &w2, err, sizeof err), -EBUSY);
    /* More than a chunk: some records are committed before the end. */
    for (uint64_t i = 0; i < 10000; i++)
        cr_assert_eq(sl_cachedb_writer_put(w, &i, sizeof i, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_cachedb_lookup(db, "k1", &count, err, sizeof err), 1, "not complete yet");
    cr_assert_eq(sl_cachedb_reader_open(db, "k1", &r, err, sizeof err), 1);
    cr_assert_eq(sl_cachedb_writer_finish(w, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_cachedb_lookup(db, "k1", &count, err, sizeof err), 0);
    cr_assert_eq(count, 10000);
    cr_assert_eq(sl_cachedb_reader_open(db, "k1", &r, err, sizeof err), 0, "%s", err);
    for (uint64_t i = 0; i < 10000; i++) {
        const void *d;
        size_t len;
        cr_assert_eq(sl_cachedb_reader_next(r, &d, &len, err, sizeof err), 0, "%s", err);
        cr_assert_eq(len, 8);
        cr_assert_eq(memcmp(d, &i, 8), 0);
    }
    const void *d;
    size_t len;
    cr_assert_eq(sl_cachedb_reader_next(r, &d, &len, err, sizeof err), 1);
    sl_cachedb_reader_close(r);
    sl_cachedb_close(db);

    /* Records without a marker, as a killed worker leaves them. */
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_mapsize(env, 64 << 20), 0);
    cr_assert_eq(mdb_env_open(env, cdir, 0, 0600), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    for (int i = 0; i < 3; i++) {
        char k[64];
        snprintf(k, sizeof k, "r/k2/%016x", i);
        MDB_val mk = {strlen(k), k}, mv = {1, "x"};
        cr_assert_eq(mdb_put(txn, dbi, &mk, &mv, 0), 0);
    }
    cr_assert_eq(mdb_txn_commit(txn), 0);
    MDB_stat st;
    cr_assert_eq(mdb_env_stat(env, &st), 0);
    size_t before = st.ms_entries;
    mdb_env_close(env);
    cr_assert_eq(sl_cachedb_open(cdir, 64 << 20, &db, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_cachedb_lookup(db, "k2", &count, err, sizeof err), 1);
    cr_assert_eq(sl_cachedb_lookup(db, "k1", &count, err, sizeof err), 0, "complete entries stay");
    sl_cachedb_close(db);
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_mapsize(env, 64 << 20), 0);
    cr_assert_eq(mdb_env_open(env, cdir, MDB_RDONLY, 0600), 0);
    cr_assert_eq(mdb_env_stat(env, &st), 0);
    cr_assert_eq(st.ms_entries, before - 3, "the unfinished entry was swept");
    mdb_env_close(env);
}

Test(cache, damaged_records_fail_naming_the_cache)
{
    write_files(1, 5, 3);
    sl_confine_t *roots = roots_at(dir);
    sl_cache_env_t env = disk_env((size_t)16 << 20);
    sl_pipeline_opts_t o = {.roots = roots, .cache = &env};
    sl_pipeline_t *p = pipeline_make(spec_of("{\"op\":\"cache\",\"storage\":\"disk\"}"), &o);
    batches_t bs = run_pipeline(p);
    cr_assert_eq(bs.n, 5);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    sl_cachedb_close(env.db);
    /* Flip a byte of every record. */
    MDB_env *menv;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_cursor *c;
    MDB_val k, v;
    cr_assert_eq(mdb_env_create(&menv), 0);
    cr_assert_eq(mdb_env_set_mapsize(menv, 16 << 20), 0);
    cr_assert_eq(mdb_env_open(menv, cdir, 0, 0600), 0);
    cr_assert_eq(mdb_txn_begin(menv, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    cr_assert_eq(mdb_cursor_open(txn, dbi, &c), 0);
    int flipped = 0;
    while (mdb_cursor_get(c, &k, &v, MDB_NEXT) == 0) {
        if (k.mv_size > 2 && memcmp(k.mv_data, "r/", 2) == 0) {
            uint8_t buf[4096];
            cr_assert_leq(v.mv_size, sizeof buf);
            memcpy(buf, v.mv_data, v.mv_size);
            buf[20] ^= 0x40;
            MDB_val nv = {v.mv_size, buf};
            cr_assert_eq(mdb_cursor_put(c, &k, &nv, MDB_CURRENT), 0);
            flipped++;
        }
    }
    mdb_cursor_close(c);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(menv);
    cr_assert_eq(flipped, 5);
    env = disk_env((size_t)16 << 20);
    p = pipeline_make(spec_of("{\"op\":\"cache\",\"storage\":\"disk\"}"), &o);
    bs = run_pipeline(p);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_eq(bs.n, 0);
    cr_assert(strstr(bs.errmsg, "ops[0] (cache): cache entry ") && strstr(bs.errmsg, "checksum mismatch"), "%s",
              bs.errmsg);
    batches_free(&bs);
    sl_pipeline_destroy(p);
    sl_cachedb_close(env.db);
    sl_confine_destroy(roots);
}

/* ---- DYNAMIC: an entry per split ---- */

struct epochs {
    const sl_split_t *e[4];
    size_t n[4], next[4];
};

static int epochs_next(void *arg, uint64_t epoch, sl_split_t *out)
{
    struct epochs *x = arg;
    if (epoch >= 4 || x->next[epoch] == x->n[epoch])
        return 1;
    *out = x->e[epoch][x->next[epoch]++];
    return 0;
}

Test(cache, dynamic_splits_seen_before_come_from_the_disk)
{
    write_files(2, 10, 3);
    sl_confine_t *roots = roots_at(dir);
    sl_cache_env_t env = disk_env((size_t)16 << 20);
    const sl_split_t e01[] = {{.file_index = 0, .begin = 0, .end = 5}, {.file_index = 0, .begin = 5, .end = 10}, {.file_index = 1, .begin = 0, .end = 10}};
    const sl_split_t e2[] = {{.file_index = 0, .begin = 0, .end = 4}, {.file_index = 1, .begin = 0, .end = 10}};
    const sl_split_t e3[] = {{.file_index = 1, .begin = 0, .end = 10}, {.file_index = 0, .begin = 0, .end = 4}, {.file_index = 0, .begin = 4, .end = 6}};
    struct epochs x = {{e01, e01, e2, e3}, {3, 3, 2, 3}, {0, 0, 0, 0}};
    sl_pipeline_opts_t o = {.sharding = SL_SHARDING_DYNAMIC, .splits = {epochs_next, &x}, .roots = roots,
                            .cache = &env};
    sl_pipeline_t *p = pipeline_make(spec_of("{\"op\":\"cache\",\"storage\":\"disk\"},{\"op\":\"repeat\",\"count\":4}"),
                                     &o);
    batches_t e0 = run_pipeline_n(p, 20);
    cr_assert_eq(e0.n, 20);
    cr_assert_eq(sl_pipeline_files_opened(p), 2);
    batches_t e1 = run_pipeline_n(p, 20);
    cr_assert_eq(e1.n, 20);
    cr_assert_eq(sl_pipeline_files_opened(p), 2, "epoch 1 has the splits of epoch 0: no file opened");
    char *a = lines_of(&e0, 0, 20), *b = lines_of(&e1, 0, 20);
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
    /* Epoch 2: a new split, read from f0 and cached, then a cached one
     * that the cache queued while the source asked. */
    batches_t e2b = run_pipeline_n(p, 14);
    char *c = lines_of(&e2b, 0, 14);
    cr_assert_str_eq(c, "|f0-000|f0-001|f0-002|f0-003|f1-000|f1-001|f1-002|f1-003|f1-004|f1-005|f1-006|f1-007|f1-008"
                        "|f1-009");
    free(c);
    cr_assert_eq(sl_pipeline_files_opened(p), 3);
    /* Epoch 3: two cached splits and one new. */
    batches_t rest = run_pipeline(p);
    cr_assert_eq(rest.rc, 1, "%s", rest.errmsg);
    char *d = lines_of(&rest, 0, rest.n);
    cr_assert_str_eq(d, "|f1-000|f1-001|f1-002|f1-003|f1-004|f1-005|f1-006|f1-007|f1-008|f1-009|f0-000|f0-001"
                        "|f0-002|f0-003|f0-004|f0-005");
    free(d);
    cr_assert_eq(sl_pipeline_files_opened(p), 4);
    batches_free(&e0);
    batches_free(&e1);
    batches_free(&e2b);
    batches_free(&rest);
    sl_pipeline_destroy(p);
    sl_cachedb_close(env.db);
    sl_confine_destroy(roots);
}

Test(cache, dynamic_refuses_parallel_ops_before_it)
{
    sl_confine_t *roots = roots_at(dir);
    write_files(1, 1, 1);
    split_list_t l = {NULL, 0, 0, 0};
    sl_pipeline_opts_t o = dynamic_opts(&l, roots, SL_IO_AUTO);
    sl_cache_env_t env = disk_env((size_t)1 << 20);
    o.cache = &env;
    sl_pipeline_t *p = NULL;
    char err[1024];
    cr_assert_eq(pipeline_try("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"filter\",\"key\":"
                              "\"value\",\"cmp\":\"eq\",\"value\":1,\"num_parallel_calls\":2},{\"op\":\"cache\","
                              "\"storage\":\"disk\"}]}",
                              &o, &p, err, sizeof err),
                 SL_EINVAL);
    cr_assert(strstr(err, "ops[1] (cache): under DYNAMIC sharding the ops between the source and a cache must run "
                          "one element at a time") &&
                  strstr(err, "ops[0] (filter) has num_parallel_calls"),
              "%s", err);
    sl_cachedb_close(env.db);
    sl_confine_destroy(roots);
}
