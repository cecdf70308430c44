/*
 * test_store.c: the LMDB state store: records survive a reopen, an aborted
 * transaction leaves nothing, a full store refuses the write and keeps what
 * it had, and every store it must not use is refused, untouched.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sluice.h"
#include "store.h"

static const char *const tables[] = {"jobs", "splits"};
static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/sl-store-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(store, .init = make_dir, .fini = remove_dir);

static sl_store_opts_t opts(void)
{
    return (sl_store_opts_t){.tables = tables, .num_tables = 2};
}

static int open_store(sl_store_t **s, char *err, size_t errlen)
{
    sl_store_opts_t o = opts();
    return sl_store_open(dir, &o, s, err, errlen);
}

static sl_store_t *must_open(void)
{
    sl_store_t *s = NULL;
    char err[512] = "";
    cr_assert_eq(open_store(&s, err, sizeof err), 0, "%s", err);
    return s;
}

struct seen {
    int n;
    char keys[16][32];
    char vals[16][32];
};

static int visit(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct seen *s = arg;
    cr_assert_lt(s->n, 16);
    snprintf(s->keys[s->n], 32, "%.*s", (int)klen, (const char *)key);
    snprintf(s->vals[s->n], 32, "%.*s", (int)vlen, (const char *)val);
    s->n++;
    return 0;
}

static void put(sl_store_txn_t *t, int table, const char *k, const char *v)
{
    cr_assert_eq(sl_store_put(t, table, k, strlen(k), v, strlen(v)), 0);
}

static void commit(sl_store_txn_t *t)
{
    char err[256] = "";
    cr_assert_eq(sl_store_commit(t, err, sizeof err), 0, "%s", err);
}

Test(store, records_survive_a_reopen)
{
    sl_store_t *s = must_open();
    cr_assert(sl_store_is_new(s));
    sl_store_txn_t *t;
    cr_assert_eq(sl_store_begin(s, &t), 0);
    put(t, 0, "job/2", "b");
    put(t, 0, "job/1", "a");
    put(t, 1, "split/1", "x");
    commit(t);
    cr_assert_eq(sl_store_begin(s, &t), 0);
    cr_assert_eq(sl_store_del(t, 1, "split/1", 7), 0);
    cr_assert_eq(sl_store_del(t, 1, "missing", 7), 0, "deleting a missing key is not an error");
    put(t, 0, "job/1", "a2");
    commit(t);
    sl_store_stats_t st;
    sl_store_stats(s, &st);
    cr_assert_eq(st.commits, 2);
    cr_assert_eq(st.records, 2);
    sl_store_close(s);

    s = must_open();
    cr_assert_not(sl_store_is_new(s));
    struct seen seen = {0};
    cr_assert_eq(sl_store_foreach(s, 0, visit, &seen), 0);
    cr_assert_eq(seen.n, 2);
    cr_assert_str_eq(seen.keys[0], "job/1");
    cr_assert_str_eq(seen.vals[0], "a2");
    cr_assert_str_eq(seen.keys[1], "job/2");
    struct seen none = {0};
    cr_assert_eq(sl_store_foreach(s, 1, visit, &none), 0);
    cr_assert_eq(none.n, 0);
    cr_assert_eq(sl_store_foreach(s, 2, visit, &none), SL_EINVAL);
    sl_store_close(s);
}

Test(store, an_aborted_transaction_leaves_nothing)
{
    sl_store_t *s = must_open();
    sl_store_txn_t *t, *t2;
    cr_assert_eq(sl_store_begin(s, &t), 0);
    cr_assert_eq(sl_store_begin(s, &t2), SL_EINTERNAL, "one write transaction at a time");
    put(t, 0, "k", "v");
    sl_store_abort(t);
    struct seen seen = {0};
    cr_assert_eq(sl_store_foreach(s, 0, visit, &seen), 0);
    cr_assert_eq(seen.n, 0);
    /* A transaction left open is aborted by close. */
    cr_assert_eq(sl_store_begin(s, &t), 0);
    put(t, 0, "k", "v");
    sl_store_close(s);
    s = must_open();
    cr_assert_eq(sl_store_foreach(s, 0, visit, &seen), 0);
    cr_assert_eq(seen.n, 0);
    sl_store_close(s);
}

Test(store, a_full_store_refuses_the_write_and_keeps_its_records)
{
    sl_store_opts_t o = opts();
    o.map_bytes = 64 << 10;
    sl_store_t *s = NULL;
    char err[512] = "";
    cr_assert_eq(sl_store_open(dir, &o, &s, err, sizeof err), 0, "%s", err);
    sl_store_txn_t *t;
    cr_assert_eq(sl_store_begin(s, &t), 0);
    put(t, 0, "kept", "yes");
    commit(t);
    cr_assert_eq(sl_store_begin(s, &t), 0);
    char val[1000];
    memset(val, 'v', sizeof val);
    int rc = 0;
    for (int i = 0; i < 1000 && rc == 0; i++) {
        char key[16];
        snprintf(key, sizeof key, "r%04d", i);
        rc = sl_store_put(t, 1, key, strlen(key), val, sizeof val);
    }
    cr_assert_eq(rc, -ENOSPC);
    sl_store_abort(t);
    struct seen seen = {0};
    cr_assert_eq(sl_store_foreach(s, 0, visit, &seen), 0);
    cr_assert_eq(seen.n, 1);
    cr_assert_str_eq(seen.keys[0], "kept");
    /* And it still takes a small change. */
    cr_assert_eq(sl_store_begin(s, &t), 0);
    put(t, 1, "small", "1");
    commit(t);
    sl_store_close(s);
}

/* The whole file, to show a refused store was not written. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* Opens and expects the refusal code with msg in its message, the file unchanged. */
static void assert_refused(int want, const char *msg)
{
    char path[128];
    snprintf(path, sizeof path, "%s/" SL_STORE_FILE, dir);
    size_t before_len, after_len;
    char *before = slurp(path, &before_len);
    sl_store_t *s = NULL;
    char err[512] = "";
    cr_assert_eq(open_store(&s, err, sizeof err), want, "%s", err);
    cr_assert_null(s);
    cr_assert_not_null(strstr(err, msg), "\"%s\" says \"%s\"", err, msg);
    cr_assert_not_null(strstr(err, dir), "\"%s\" names the path", err);
    char *after = slurp(path, &after_len);
    cr_assert_eq(after_len, before_len);
    cr_assert(memcmp(before, after, before_len) == 0, "the refused store was not written");
    free(before);
    free(after);
}

/* Sets the format record of the store in dir, through LMDB itself. */
static void set_format(uint32_t format)
{
    char path[128];
    snprintf(path, sizeof path, "%s/" SL_STORE_FILE, dir);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi meta;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_maxdbs(env, 20), 0);
    cr_assert_eq(mdb_env_open(env, path, MDB_NOSUBDIR, 0600), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "meta", 0, &meta), 0);
    uint8_t b[4] = {format & 0xff, (format >> 8) & 0xff, (format >> 16) & 0xff, format >> 24};
    MDB_val k = {6, "format"}, v = {4, b};
    cr_assert_eq(mdb_put(txn, meta, &k, &v, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

Test(store, a_newer_format_is_refused)
{
    sl_store_close(must_open());
    set_format(SL_STORE_FORMAT + 1);
    assert_refused(SL_EVERSION, "newer format version 2");
    /* Back to ours, it opens. */
    set_format(SL_STORE_FORMAT);
    sl_store_close(must_open());
}

Test(store, garbage_and_truncated_files_are_refused)
{
    char path[128];
    snprintf(path, sizeof path, "%s/" SL_STORE_FILE, dir);
    char junk[65536];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)(i * 7 + 3);
    write_file(path, junk, sizeof junk);
    assert_refused(SL_EDATA, "cannot be opened");
    write_file(path, junk, 100);
    assert_refused(SL_EDATA, "shorter than an LMDB header");
    write_file(path, junk, 0);
    assert_refused(SL_EDATA, "shorter than an LMDB header");
}

Test(store, an_lmdb_file_that_is_not_ours_is_refused)
{
    char path[128];
    snprintf(path, sizeof path, "%s/" SL_STORE_FILE, dir);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_open(env, path, MDB_NOSUBDIR, 0600), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    MDB_val k = {3, "abc"}, v = {3, "def"};
    cr_assert_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    assert_refused(SL_EDATA, "not a sluice state store");
}

Test(store, a_dir_without_free_space_is_refused)
{
    sl_store_opts_t o = opts();
    o.min_free_bytes = SIZE_MAX / 2;
    sl_store_t *s = NULL;
    char err[512] = "";
    cr_assert_eq(sl_store_open(dir, &o, &s, err, sizeof err), -ENOSPC);
    cr_assert_not_null(strstr(err, "is full"), "%s", err);
    char path[128];
    snprintf(path, sizeof path, "%s/" SL_STORE_FILE, dir);
    cr_assert_neq(access(path, F_OK), 0, "nothing was created");
}

Test(store, an_unwritable_dir_is_refused)
{
    sl_store_close(must_open());
    /* Root writes anywhere: a child drops to nobody, so that the fixture
     * can still clean up as root. */
    cr_assert_eq(chmod(dir, 0755), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (geteuid() == 0 ? setgid(65534) != 0 || setuid(65534) != 0 : chmod(dir, 0555) != 0)
            _exit(3);
        sl_store_t *s = NULL;
        char err[512] = "";
        int rc = open_store(&s, err, sizeof err);
        _exit(rc == -EACCES && strstr(err, "is not writable") && strstr(err, dir) ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status));
    cr_assert_eq(WEXITSTATUS(status), 0, "the child was refused with -EACCES (1: another answer, 3: no drop)");
    chmod(dir, 0700);
}

/* Read-only (--check-store): no store is made where there is none; one
 * written with fewer tables reads them, the missing one as empty, and is
 * not changed (a read-write open creates the table); no transaction
 * begins. */
Test(store, a_read_only_open_reads_and_writes_nothing)
{
    static const char *const more[] = {"jobs", "splits", "newer"};
    sl_store_opts_t ro = {.tables = more, .num_tables = 3, .read_only = true};
    sl_store_t *s = NULL;
    char err[512] = "", path[128];
    cr_assert_lt(sl_store_open(dir, &ro, &s, err, sizeof err), 0);
    cr_assert_null(s);
    cr_assert(strstr(err, "cannot be read") != NULL, "%s", err);
    snprintf(path, sizeof path, "%s/state.mdb", dir);
    cr_assert_neq(access(path, F_OK), 0, "no store made");

    s = must_open();
    sl_store_txn_t *t;
    cr_assert_eq(sl_store_begin(s, &t), 0);
    put(t, 0, "job/1", "a");
    commit(t);
    sl_store_close(s);
    struct stat before, after;
    cr_assert_eq(stat(path, &before), 0);

    cr_assert_eq(sl_store_open(dir, &ro, &s, err, sizeof err), 0, "%s", err);
    struct seen seen = {0}, none = {0};
    cr_assert_eq(sl_store_foreach(s, 0, visit, &seen), 0);
    cr_assert_eq(seen.n, 1);
    cr_assert_str_eq(seen.vals[0], "a");
    cr_assert_eq(sl_store_foreach(s, 2, visit, &none), 0, "a table the store lacks reads as empty");
    cr_assert_eq(none.n, 0);
    cr_assert_neq(sl_store_begin(s, &t), 0);
    sl_store_stats_t st;
    sl_store_stats(s, &st);
    cr_assert_eq(st.records, 1);
    sl_store_close(s);
    cr_assert_eq(stat(path, &after), 0);
    cr_assert_eq(after.st_size, before.st_size);
    cr_assert_eq(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
    cr_assert_eq(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec, "nothing written");
}
