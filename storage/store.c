/*
 * store.c: the dispatcher's LMDB state store (store.h).
 *
 * Layout: one environment file, state.mdb (MDB_NOSUBDIR), with the caller's
 * named tables and a table "meta" holding "magic" (SL_STORE_MAGIC) and
 * "format" (a 4-byte little-endian version). A file without them is not
 * ours, or not whole, and is refused.
 */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "errbuf.h"
#include "sluice.h"

#define SL_STORE_MAGIC "sluice-dispatcher-state"
#define DEFAULT_MAP_BYTES ((size_t)1 << 30)
#define DEFAULT_MIN_FREE ((size_t)16 << 20)

struct sl_store_txn {
    sl_store_t *store;
    MDB_txn *txn;
};

struct sl_store {
    MDB_env *env;
    MDB_dbi meta;
    MDB_dbi dbi[SL_STORE_MAX_TABLES];
    bool missing[SL_STORE_MAX_TABLES]; /* read_only: a table the store lacks, read as empty */
    bool read_only;
    int num_tables;
    bool is_new;
    bool in_txn;
    sl_store_txn_t txn;
    uint64_t commits;
    size_t map_bytes;
};

/* An LMDB or errno code as ours. */
static int code_of(int rc)
{
    switch (rc) {
    case 0: return 0;
    case MDB_MAP_FULL:
    case MDB_TXN_FULL:
    case ENOSPC: return -ENOSPC;
    case MDB_INVALID:
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_VERSION_MISMATCH:
    case MDB_INCOMPATIBLE:
    case MDB_BAD_DBI:
    case MDB_NOTFOUND: return SL_EDATA;
    case ENOMEM: return -ENOMEM;
    default: return rc > 0 ? -rc : SL_EDATA;
    }
}

/* Whether we may write in dir: a file created and removed says it for
 * certain (root passes access(2) on a read-only mount's directory too). */
static int check_writable(const char *dir, char *err, size_t errlen)
{
    char probe[4096];
    if ((size_t)snprintf(probe, sizeof probe, "%s/.state-write-probe", dir) >= sizeof probe)
        return sl_errf(err, errlen, -ENAMETOOLONG, "work dir %s: path too long", dir);
    FILE *f = fopen(probe, "w");
    if (!f) {
        int e = errno;
        return sl_errf(err, errlen, -e, "work dir %s is not writable: %s", dir, strerror(e));
    }
    int bad = fputc('x', f) == EOF;
    bad |= fclose(f) != 0;
    int e = errno;
    unlink(probe);
    if (bad)
        return sl_errf(err, errlen, e == ENOSPC ? -ENOSPC : -EIO, "work dir %s: cannot write a file: %s", dir,
                       strerror(e));
    return 0;
}

static int check_free(const char *dir, size_t min_free, char *err, size_t errlen)
{
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) {
        int e = errno;
        return sl_errf(err, errlen, -e, "work dir %s: %s", dir, strerror(e));
    }
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    if (avail < min_free)
        return sl_errf(err, errlen, -ENOSPC,
                       "work dir %s is full: %" PRIu64 " bytes free, the state store needs at least %zu", dir, avail,
                       min_free);
    return 0;
}

/* Reads the meta table of an existing store: ours, and a format we read. */
static int check_meta(sl_store_t *s, const char *path, char *err, size_t errlen)
{
    MDB_txn *txn = NULL;
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return sl_errf(err, errlen, code_of(rc), "state store %s cannot be read: %s", path, mdb_strerror(rc));
    MDB_val k = {strlen("magic"), "magic"}, v;
    rc = mdb_dbi_open(txn, "meta", 0, &s->meta);
    if (rc == 0)
        rc = mdb_get(txn, s->meta, &k, &v);
    if (rc || v.mv_size != strlen(SL_STORE_MAGIC) || memcmp(v.mv_data, SL_STORE_MAGIC, v.mv_size) != 0) {
        mdb_txn_abort(txn);
        return sl_errf(err, errlen, SL_EDATA, "state store %s is corrupt or not a sluice state store: %s", path,
                       rc ? mdb_strerror(rc) : "wrong magic record");
    }
    k = (MDB_val){strlen("format"), "format"};
    rc = mdb_get(txn, s->meta, &k, &v);
    if (rc || v.mv_size != 4) {
        mdb_txn_abort(txn);
        return sl_errf(err, errlen, SL_EDATA, "state store %s is corrupt: %s", path,
                       rc ? "no format record" : "a format record of the wrong size");
    }
    const uint8_t *b = v.mv_data;
    uint32_t format = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    mdb_txn_abort(txn);
    if (format > SL_STORE_FORMAT)
        return sl_errf(err, errlen, SL_EVERSION,
                       "state store %s was written by a newer format version %" PRIu32
                       " (this build reads up to version %d); use a newer sluice-dispatcher or another --work-dir",
                       path, format, SL_STORE_FORMAT);
    if (format == 0)
        return sl_errf(err, errlen, SL_EDATA, "state store %s is corrupt: format version 0", path);
    return 0;
}

static int count_records(MDB_txn *txn, MDB_dbi dbi, uint64_t *n)
{
    MDB_stat st;
    int rc = mdb_stat(txn, dbi, &st);
    if (rc == 0)
        *n += st.ms_entries;
    return rc;
}

/* The bytes of the pages a table's tree holds. */
static size_t table_bytes(MDB_txn *txn, MDB_dbi dbi)
{
    MDB_stat st;
    if (mdb_stat(txn, dbi, &st) != 0)
        return 0;
    return (st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages) * (size_t)st.ms_psize;
}

/* Opens every table; a new store gets them and its meta records, in one commit. */
static int open_tables(sl_store_t *s, const sl_store_opts_t *o, const char *path, char *err, size_t errlen)
{
    MDB_txn *txn = NULL;
    int rc = mdb_txn_begin(s->env, NULL, o->read_only ? MDB_RDONLY : 0, &txn);
    if (rc)
        return sl_errf(err, errlen, code_of(rc), "state store %s: %s", path, mdb_strerror(rc));
    for (int i = 0; i < o->num_tables && rc == 0; i++) {
        rc = mdb_dbi_open(txn, o->tables[i], o->read_only ? 0 : MDB_CREATE, &s->dbi[i]);
        if (rc == MDB_NOTFOUND && o->read_only) {
            s->missing[i] = true; /* a start would create it */
            rc = 0;
        }
    }
    if (rc == 0 && s->is_new) {
        rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &s->meta);
        uint8_t fmt[4] = {SL_STORE_FORMAT & 0xff, (SL_STORE_FORMAT >> 8) & 0xff, (SL_STORE_FORMAT >> 16) & 0xff,
                          (SL_STORE_FORMAT >> 24) & 0xff};
        MDB_val k = {strlen("magic"), "magic"}, v = {strlen(SL_STORE_MAGIC), SL_STORE_MAGIC};
        if (rc == 0)
            rc = mdb_put(txn, s->meta, &k, &v, 0);
        k = (MDB_val){strlen("format"), "format"};
        v = (MDB_val){sizeof fmt, fmt};
        if (rc == 0)
            rc = mdb_put(txn, s->meta, &k, &v, 0);
    }
    /* Read every table through once: a damaged page shows here, at start,
     * and not in the middle of serving. */
    for (int i = 0; i < o->num_tables && rc == 0; i++) {
        MDB_cursor *c = NULL;
        MDB_val k, v;
        if (s->missing[i])
            continue;
        rc = mdb_cursor_open(txn, s->dbi[i], &c);
        while (rc == 0 && (rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) == 0)
            ;
        if (rc == MDB_NOTFOUND)
            rc = 0;
        mdb_cursor_close(c);
    }
    if (rc) {
        mdb_txn_abort(txn);
        return sl_errf(err, errlen, code_of(rc), "state store %s %s: %s", path,
                       s->is_new ? "cannot be created" : "is corrupt", mdb_strerror(rc));
    }
    /* A read-only transaction's commit too keeps the tables' handles. */
    rc = mdb_txn_commit(txn);
    if (rc)
        return sl_errf(err, errlen, code_of(rc), "state store %s cannot be written: %s", path, mdb_strerror(rc));
    return 0;
}

int sl_store_open(const char *dir, const sl_store_opts_t *opts, sl_store_t **out, char *err, size_t errlen)
{
    sl_store_opts_t o = *opts;
    char path[4096];
    struct stat st;
    int rc;

    *out = NULL;
    if (o.num_tables < 1 || o.num_tables > SL_STORE_MAX_TABLES)
        return sl_errf(err, errlen, SL_EINVAL, "state store: %d tables (1 .. %d)", o.num_tables, SL_STORE_MAX_TABLES);
    if (!o.map_bytes)
        o.map_bytes = DEFAULT_MAP_BYTES;
    if (!o.min_free_bytes)
        o.min_free_bytes = DEFAULT_MIN_FREE;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, SL_STORE_FILE) >= sizeof path)
        return sl_errf(err, errlen, -ENAMETOOLONG, "work dir %s: path too long", dir);

    rc = o.read_only ? 0 : check_writable(dir, err, errlen);
    if (rc == 0 && !o.read_only)
        rc = check_free(dir, o.min_free_bytes, err, errlen);
    if (rc < 0)
        return rc;
    bool exists = stat(path, &st) == 0;
    if (!exists && o.read_only)
        return sl_errf(err, errlen, -errno, "state store %s cannot be read: %s", path, strerror(errno));
    if (exists && !S_ISREG(st.st_mode))
        return sl_errf(err, errlen, SL_EDATA, "state store %s is not a regular file", path);
    /* LMDB would make an empty (truncated) file a new store. */
    if (exists && st.st_size < 2 * 4096)
        return sl_errf(err, errlen, SL_EDATA, "state store %s is corrupt: %lld bytes, shorter than an LMDB header",
                       path, (long long)st.st_size);

    sl_store_t *s = calloc(1, sizeof *s);
    if (!s)
        return sl_errf(err, errlen, -ENOMEM, "state store: out of memory");
    s->is_new = !exists;
    s->read_only = o.read_only;
    s->num_tables = o.num_tables;
    s->map_bytes = o.map_bytes;
    rc = mdb_env_create(&s->env);
    if (rc == 0)
        rc = mdb_env_set_maxdbs(s->env, SL_STORE_MAX_TABLES + 1);
    if (rc == 0)
        rc = mdb_env_set_mapsize(s->env, o.map_bytes);
    if (rc) {
        rc = sl_errf(err, errlen, code_of(rc), "state store %s: %s", path, mdb_strerror(rc));
        goto fail;
    }
    /* MDB_NOTLS: transactions are not tied to threads; the default sync
     * mode: a commit returns once it is on disk. Read-only on read-only
     * media, LMDB reads without its lock file: nothing can write there. */
    unsigned flags = MDB_NOSUBDIR | MDB_NOTLS | (o.read_only ? MDB_RDONLY : 0);
    rc = mdb_env_open(s->env, path, flags, 0600);
    if (rc) {
        rc = sl_errf(err, errlen, code_of(rc), "state store %s cannot be opened: %s", path, mdb_strerror(rc));
        goto fail;
    }
    if (!s->is_new) {
        rc = check_meta(s, path, err, errlen);
        if (rc < 0)
            goto fail;
    }
    rc = open_tables(s, &o, path, err, errlen);
    if (rc < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    mdb_env_close(s->env);
    free(s);
    if (!exists) { /* what this call created, nothing that was there */
        char lock[4096 + 8];
        snprintf(lock, sizeof lock, "%s-lock", path);
        unlink(path);
        unlink(lock);
    }
    return rc;
}

int sl_store_is_new(const sl_store_t *s)
{
    return s->is_new;
}

void sl_store_close(sl_store_t *s)
{
    if (!s)
        return;
    if (s->in_txn)
        sl_store_abort(&s->txn);
    mdb_env_close(s->env);
    free(s);
}

int sl_store_begin(sl_store_t *s, sl_store_txn_t **out)
{
    *out = NULL;
    if (s->in_txn || s->read_only)
        return SL_EINTERNAL;
    int rc = mdb_txn_begin(s->env, NULL, 0, &s->txn.txn);
    if (rc)
        return code_of(rc);
    s->txn.store = s;
    s->in_txn = true;
    *out = &s->txn;
    return 0;
}

static int check_table(sl_store_txn_t *t, int table)
{
    return table >= 0 && table < t->store->num_tables ? 0 : SL_EINVAL;
}

int sl_store_put(sl_store_txn_t *t, int table, const void *key, size_t klen, const void *val, size_t vlen)
{
    if (check_table(t, table) < 0 || klen == 0 || klen > 511)
        return SL_EINVAL;
    MDB_val k = {klen, (void *)key}, v = {vlen, (void *)val};
    return code_of(mdb_put(t->txn, t->store->dbi[table], &k, &v, 0));
}

int sl_store_del(sl_store_txn_t *t, int table, const void *key, size_t klen)
{
    if (check_table(t, table) < 0 || klen == 0 || klen > 511)
        return SL_EINVAL;
    MDB_val k = {klen, (void *)key};
    int rc = mdb_del(t->txn, t->store->dbi[table], &k, NULL);
    return rc == MDB_NOTFOUND ? 0 : code_of(rc);
}

int sl_store_del_prefix(sl_store_txn_t *t, int table, const void *prefix, size_t plen)
{
    if (check_table(t, table) < 0 || plen == 0 || plen > 511)
        return SL_EINVAL;
    MDB_cursor *c = NULL;
    int rc = mdb_cursor_open(t->txn, t->store->dbi[table], &c);
    if (rc)
        return code_of(rc);
    MDB_val k = {plen, (void *)prefix}, v;
    rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
    while (rc == 0 && k.mv_size >= plen && memcmp(k.mv_data, prefix, plen) == 0) {
        rc = mdb_cursor_del(c, 0);
        if (rc == 0) {
            k = (MDB_val){plen, (void *)prefix};
            rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
        }
    }
    mdb_cursor_close(c);
    return rc == 0 || rc == MDB_NOTFOUND ? 0 : code_of(rc);
}

int sl_store_commit(sl_store_txn_t *t, char *err, size_t errlen)
{
    sl_store_t *s = t->store;
    int rc = mdb_txn_commit(t->txn);
    s->in_txn = false;
    if (rc)
        return sl_errf(err, errlen, code_of(rc), "state store: commit failed: %s%s", mdb_strerror(rc),
                       rc == MDB_MAP_FULL ? " (raise the store's size limit)" : "");
    s->commits++;
    return 0;
}

void sl_store_abort(sl_store_txn_t *t)
{
    if (!t)
        return;
    mdb_txn_abort(t->txn);
    t->store->in_txn = false;
}

int sl_store_foreach(sl_store_t *s, int table, sl_store_visit_fn fn, void *arg)
{
    if (table < 0 || table >= s->num_tables)
        return SL_EINVAL;
    MDB_txn *txn = NULL;
    MDB_cursor *c = NULL;
    MDB_val k, v;
    if (s->missing[table])
        return 0;
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return code_of(rc);
    rc = mdb_cursor_open(txn, s->dbi[table], &c);
    int out = rc ? code_of(rc) : 0;
    while (out == 0 && (rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) == 0)
        out = fn(k.mv_data, k.mv_size, v.mv_data, v.mv_size, arg);
    if (out == 0 && rc != MDB_NOTFOUND && rc != 0)
        out = code_of(rc);
    mdb_cursor_close(c);
    mdb_txn_abort(txn);
    return out;
}

void sl_store_stats(sl_store_t *s, sl_store_stats_t *out)
{
    MDB_txn *txn = NULL;
    MDB_envinfo info;
    MDB_stat st;
    *out = (sl_store_stats_t){.commits = s->commits, .map_bytes = s->map_bytes};
    if (mdb_env_info(s->env, &info) == 0 && mdb_env_stat(s->env, &st) == 0)
        out->used_bytes = (info.me_last_pgno + 1) * (size_t)st.ms_psize;
    if (mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn) == 0) {
        for (int i = 0; i < s->num_tables; i++) {
            if (s->missing[i])
                continue;
            count_records(txn, s->dbi[i], &out->records);
            out->live_bytes += table_bytes(txn, s->dbi[i]);
        }
        /* The meta table, the main tree that names the tables, the two meta pages. */
        out->live_bytes += table_bytes(txn, s->meta) + table_bytes(txn, 1 /* MAIN_DBI, lmdb.c */);
        MDB_stat ms;
        if (mdb_env_stat(s->env, &ms) == 0)
            out->live_bytes += 2 * (size_t)ms.ms_psize;
        mdb_txn_abort(txn);
    }
}
