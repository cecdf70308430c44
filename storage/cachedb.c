/*
 * cachedb.c: the worker's disk cache on LMDB (cachedb.h).
 *
 * Layout of the one unnamed database:
 *   "sluice-cache-format"  -> u32 SL_CACHEDB_FORMAT
 *   "m/<key>"              -> struct marker: the entry is complete
 *   "r/<key>/<16 hex>"     -> record i of the entry (hex sorts as numbers)
 * "/" sorts before "0", so the records of "r/<key>" end before
 * "r/<key>0": a cursor can step over an entry at once.
 */
#include "cachedb.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "sluice.h"

#define FORMAT_KEY "sluice-cache-format"
#define MARKER_MAGIC 0x4d434c53u /* "SLCM" */
#define CHUNK_RECORDS 4096
#define READS_PER_TXN 256
#define MAX_WRITERS 256

struct marker {
    uint32_t magic, format;
    uint64_t count, bytes;
};

struct sl_cachedb {
    MDB_env *env;
    MDB_dbi dbi;
    int lock_fd;
    char dir[4096];
    pthread_mutex_t mu;
    char *writing[MAX_WRITERS]; /* keys being written */
};

struct sl_cachedb_writer {
    sl_cachedb_t *db;
    char key[SL_CACHEDB_MAX_KEY + 1];
    int slot;           /* in db->writing */
    uint64_t count;     /* records put */
    uint64_t committed; /* records in LMDB */
    uint64_t bytes;
    /* Records not yet committed: lengths and bytes back to back. */
    uint8_t *pending;
    size_t pending_len, pending_cap;
    uint64_t pending_records;
};

struct sl_cachedb_reader {
    sl_cachedb_t *db;
    char key[SL_CACHEDB_MAX_KEY + 1];
    MDB_txn *txn;
    uint64_t next, count;
    unsigned reads; /* in this txn */
};

/* An LMDB code as one of ours. */
static int translate(int rc)
{
    if (rc == 0)
        return 0;
    if (rc > 0)
        return -rc;
    switch (rc) {
    case MDB_MAP_FULL: return -ENOSPC;
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND: return SL_EDATA;
    default: return SL_EINTERNAL;
    }
}

static int lmdb_fail(sl_cachedb_t *db, int rc, const char *what, char *err, size_t errlen)
{
    return sl_errf(err, errlen, translate(rc), "cache %s: %s: %s", db->dir, what, mdb_strerror(rc));
}

static void record_key(char *buf, size_t buflen, const char *key, uint64_t i)
{
    snprintf(buf, buflen, "r/%s/%016" PRIx64, key, i);
}

static MDB_val val_of(const void *p, size_t n)
{
    return (MDB_val){.mv_size = n, .mv_data = (void *)p};
}

/* Deletes the records of key (and its marker) in txn. */
static int delete_entry(sl_cachedb_t *db, MDB_txn *txn, const char *key)
{
    char k[SL_CACHEDB_MAX_KEY + 32];
    snprintf(k, sizeof k, "m/%s", key);
    MDB_val mk = val_of(k, strlen(k));
    int rc = mdb_del(txn, db->dbi, &mk, NULL);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return rc;
    MDB_cursor *c;
    rc = mdb_cursor_open(txn, db->dbi, &c);
    if (rc != 0)
        return rc;
    char prefix[SL_CACHEDB_MAX_KEY + 8];
    int plen = snprintf(prefix, sizeof prefix, "r/%s/", key);
    MDB_val ck = val_of(prefix, (size_t)plen), cv;
    rc = mdb_cursor_get(c, &ck, &cv, MDB_SET_RANGE);
    while (rc == 0 && ck.mv_size >= (size_t)plen && memcmp(ck.mv_data, prefix, (size_t)plen) == 0) {
        rc = mdb_cursor_del(c, 0);
        if (rc != 0)
            break;
        /* After a delete, MDB_NEXT gives the record that followed. */
        rc = mdb_cursor_get(c, &ck, &cv, MDB_NEXT);
    }
    mdb_cursor_close(c);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Removes the entries without a marker (left by a worker that stopped
 * while writing), and checks the format. */
static int check_and_sweep(sl_cachedb_t *db, char *err, size_t errlen)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(db->env, NULL, 0, &txn);
    if (rc != 0)
        return lmdb_fail(db, rc, "cannot begin a transaction", err, errlen);
    rc = mdb_dbi_open(txn, NULL, 0, &db->dbi);
    if (rc != 0) {
        mdb_txn_abort(txn);
        return lmdb_fail(db, rc, "cannot open the database", err, errlen);
    }
    MDB_val fk = val_of(FORMAT_KEY, strlen(FORMAT_KEY)), fv;
    rc = mdb_get(txn, db->dbi, &fk, &fv);
    if (rc == MDB_NOTFOUND) {
        MDB_stat st;
        mdb_stat(txn, db->dbi, &st);
        if (st.ms_entries > 0) {
            mdb_txn_abort(txn);
            return sl_errf(err, errlen, SL_EDATA,
                           "cache %s: holds an LMDB database that this worker did not write (no format number); "
                           "remove it or give another --cache-dir",
                           db->dir);
        }
        uint32_t f = SL_CACHEDB_FORMAT;
        fv = val_of(&f, sizeof f);
        rc = mdb_put(txn, db->dbi, &fk, &fv, 0);
        if (rc == 0)
            rc = mdb_txn_commit(txn);
        else
            mdb_txn_abort(txn);
        return rc ? lmdb_fail(db, rc, "cannot write the format number", err, errlen) : 0;
    }
    if (rc != 0) {
        mdb_txn_abort(txn);
        return lmdb_fail(db, rc, "cannot read the format number", err, errlen);
    }
    uint32_t f = 0;
    if (fv.mv_size == sizeof f)
        memcpy(&f, fv.mv_data, sizeof f);
    if (fv.mv_size != sizeof f || f != SL_CACHEDB_FORMAT) {
        mdb_txn_abort(txn);
        return sl_errf(err, errlen, SL_EDATA,
                       "cache %s: has format %" PRIu32 ", this worker writes format %u; remove it or give another "
                       "--cache-dir",
                       db->dir, f, SL_CACHEDB_FORMAT);
    }

    /* Sweep: the records of each entry that has no marker. */
    MDB_cursor *c;
    rc = mdb_cursor_open(txn, db->dbi, &c);
    char key[SL_CACHEDB_MAX_KEY + 1], k[SL_CACHEDB_MAX_KEY + 32];
    MDB_val ck = val_of("r/", 2), cv;
    int swept = 0;
    if (rc == 0)
        rc = mdb_cursor_get(c, &ck, &cv, MDB_SET_RANGE);
    while (rc == 0 && ck.mv_size > 2 && memcmp(ck.mv_data, "r/", 2) == 0) {
        const char *p = (const char *)ck.mv_data + 2, *slash = memchr(p, '/', ck.mv_size - 2);
        size_t n = slash ? (size_t)(slash - p) : 0;
        if (n == 0 || n > SL_CACHEDB_MAX_KEY) {
            rc = MDB_CORRUPTED;
            break;
        }
        memcpy(key, p, n);
        key[n] = '\0';
        snprintf(k, sizeof k, "m/%s", key);
        MDB_val mk = val_of(k, strlen(k)), mv;
        bool complete = mdb_get(txn, db->dbi, &mk, &mv) == 0;
        mdb_cursor_close(c);
        c = NULL;
        if (!complete) {
            rc = delete_entry(db, txn, key);
            swept++;
            if (rc != 0)
                break;
        }
        rc = mdb_cursor_open(txn, db->dbi, &c);
        if (rc != 0)
            break;
        snprintf(k, sizeof k, "r/%s0", key);
        ck = val_of(k, strlen(k));
        rc = mdb_cursor_get(c, &ck, &cv, MDB_SET_RANGE);
    }
    if (c)
        mdb_cursor_close(c);
    if (rc != 0 && rc != MDB_NOTFOUND) {
        mdb_txn_abort(txn);
        return lmdb_fail(db, rc, "cannot sweep unfinished entries", err, errlen);
    }
    rc = swept ? mdb_txn_commit(txn) : (mdb_txn_abort(txn), 0);
    return rc ? lmdb_fail(db, rc, "cannot sweep unfinished entries", err, errlen) : 0;
}

int sl_cachedb_open(const char *dir, size_t map_bytes, sl_cachedb_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (strlen(dir) + 16 >= sizeof ((sl_cachedb_t *)0)->dir)
        return sl_errf(err, errlen, SL_EINVAL, "cache %s: path too long", dir);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return sl_errf(err, errlen, -errno, "cache %s: cannot create it: %s", dir, strerror(errno));
    sl_cachedb_t *db = calloc(1, sizeof *db);
    if (!db)
        return -ENOMEM;
    snprintf(db->dir, sizeof db->dir, "%s", dir);
    db->lock_fd = -1;
    pthread_mutex_init(&db->mu, NULL);
    char path[sizeof db->dir + 32];
    int rc;
    snprintf(path, sizeof path, "%s/sluice-cache.lock", dir);
    db->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (db->lock_fd < 0) {
        rc = sl_errf(err, errlen, -errno, "cache %s: cannot open %s: %s", dir, path, strerror(errno));
        goto fail;
    }
    if (flock(db->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        rc = errno == EWOULDBLOCK ? sl_errf(err, errlen, -EBUSY, "cache %s: in use by another worker", dir)
                                  : sl_errf(err, errlen, -errno, "cache %s: cannot lock it: %s", dir, strerror(errno));
        goto fail;
    }
    rc = mdb_env_create(&db->env);
    if (rc == 0)
        rc = mdb_env_set_mapsize(db->env, map_bytes);
    if (rc == 0)
        rc = mdb_env_open(db->env, dir, MDB_NOTLS, 0600);
    if (rc != 0) {
        rc = sl_errf(err, errlen, translate(rc), "cache %s: cannot open it as an LMDB environment: %s", dir,
                     mdb_strerror(rc));
        goto fail;
    }
    rc = check_and_sweep(db, err, errlen);
    if (rc < 0)
        goto fail;
    *out = db;
    return 0;
fail:
    sl_cachedb_close(db);
    return rc;
}

void sl_cachedb_close(sl_cachedb_t *db)
{
    if (!db)
        return;
    if (db->env)
        mdb_env_close(db->env);
    if (db->lock_fd >= 0)
        close(db->lock_fd);
    for (int i = 0; i < MAX_WRITERS; i++)
        free(db->writing[i]);
    pthread_mutex_destroy(&db->mu);
    free(db);
}

static int read_marker(sl_cachedb_t *db, MDB_txn *txn, const char *key, struct marker *m)
{
    char k[SL_CACHEDB_MAX_KEY + 32];
    snprintf(k, sizeof k, "m/%s", key);
    MDB_val mk = val_of(k, strlen(k)), mv;
    int rc = mdb_get(txn, db->dbi, &mk, &mv);
    if (rc != 0)
        return rc;
    if (mv.mv_size != sizeof *m)
        return MDB_CORRUPTED;
    memcpy(m, mv.mv_data, sizeof *m);
    return m->magic == MARKER_MAGIC && m->format == SL_CACHEDB_FORMAT ? 0 : MDB_CORRUPTED;
}

int sl_cachedb_lookup(sl_cachedb_t *db, const char *key, uint64_t *count, char *err, size_t errlen)
{
    MDB_txn *txn;
    struct marker m;
    int rc = mdb_txn_begin(db->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0)
        return lmdb_fail(db, rc, "cannot begin a transaction", err, errlen);
    rc = read_marker(db, txn, key, &m);
    mdb_txn_abort(txn);
    if (rc == MDB_NOTFOUND)
        return 1;
    if (rc != 0)
        return lmdb_fail(db, rc, "bad marker", err, errlen);
    *count = m.count;
    return 0;
}

/* ---- writers ---- */

int sl_cachedb_writer_begin(sl_cachedb_t *db, const char *key, sl_cachedb_writer_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (strlen(key) > SL_CACHEDB_MAX_KEY || strchr(key, '/'))
        return sl_errf(err, errlen, SL_EINVAL, "cache %s: bad key \"%s\"", db->dir, key);
    sl_cachedb_writer_t *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->db = db;
    snprintf(w->key, sizeof w->key, "%s", key);
    w->slot = -1;
    int rc = 0;
    pthread_mutex_lock(&db->mu);
    for (int i = 0; i < MAX_WRITERS; i++) {
        if (db->writing[i] && strcmp(db->writing[i], key) == 0) {
            rc = sl_errf(err, errlen, -EBUSY, "cache %s: entry %s is being written by another pipeline", db->dir, key);
            break;
        }
        if (!db->writing[i] && w->slot < 0)
            w->slot = i;
    }
    if (rc == 0 && w->slot < 0)
        rc = sl_errf(err, errlen, -EBUSY, "cache %s: %d entries are being written already", db->dir, MAX_WRITERS);
    if (rc == 0 && !(db->writing[w->slot] = strdup(key)))
        rc = -ENOMEM;
    pthread_mutex_unlock(&db->mu);
    if (rc < 0) {
        free(w);
        return rc;
    }
    /* What an earlier writer of the key left goes first. */
    MDB_txn *txn;
    int mrc = mdb_txn_begin(db->env, NULL, 0, &txn);
    if (mrc == 0) {
        mrc = delete_entry(db, txn, key);
        if (mrc == 0)
            mrc = mdb_txn_commit(txn);
        else
            mdb_txn_abort(txn);
    }
    if (mrc != 0) {
        rc = lmdb_fail(db, mrc, "cannot clear an old entry", err, errlen);
        sl_cachedb_writer_abort(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* Commits the pending records, and the marker when last. */
static int flush(sl_cachedb_writer_t *w, bool last, char *err, size_t errlen)
{
    sl_cachedb_t *db = w->db;
    MDB_txn *txn;
    int rc = mdb_txn_begin(db->env, NULL, 0, &txn);
    if (rc != 0)
        return lmdb_fail(db, rc, "cannot begin a transaction", err, errlen);
    size_t off = 0;
    char k[SL_CACHEDB_MAX_KEY + 32];
    for (uint64_t i = 0; i < w->pending_records && rc == 0; i++) {
        uint64_t len;
        memcpy(&len, w->pending + off, sizeof len);
        off += sizeof len;
        record_key(k, sizeof k, w->key, w->committed + i);
        MDB_val mk = val_of(k, strlen(k)), mv = val_of(w->pending + off, (size_t)len);
        rc = mdb_put(txn, db->dbi, &mk, &mv, 0);
        off += (size_t)len;
    }
    if (rc == 0 && last) {
        struct marker m = {MARKER_MAGIC, SL_CACHEDB_FORMAT, w->count, w->bytes};
        snprintf(k, sizeof k, "m/%s", w->key);
        MDB_val mk = val_of(k, strlen(k)), mv = val_of(&m, sizeof m);
        rc = mdb_put(txn, db->dbi, &mk, &mv, 0);
    }
    if (rc == 0)
        rc = mdb_txn_commit(txn);
    else
        mdb_txn_abort(txn);
    if (rc != 0) {
        if (rc == MDB_MAP_FULL)
            return sl_errf(err, errlen, -ENOSPC,
                           "cache %s: full (--cache-disk-mb) after %" PRIu64 " records of entry %s",
                           db->dir, w->committed, w->key);
        return lmdb_fail(db, rc, "cannot write records", err, errlen);
    }
    w->committed += w->pending_records;
    w->pending_records = 0;
    w->pending_len = 0;
    return 0;
}

int sl_cachedb_writer_put(sl_cachedb_writer_t *w, const void *data, size_t len, char *err, size_t errlen)
{
    size_t need = w->pending_len + sizeof(uint64_t) + len;
    if (need > w->pending_cap) {
        size_t cap = w->pending_cap ? w->pending_cap : 65536;
        while (cap < need)
            cap *= 2;
        uint8_t *p = realloc(w->pending, cap);
        if (!p)
            return sl_errf(err, errlen, -ENOMEM, "cache %s: out of memory", w->db->dir);
        w->pending = p;
        w->pending_cap = cap;
    }
    uint64_t l = len;
    memcpy(w->pending + w->pending_len, &l, sizeof l);
    memcpy(w->pending + w->pending_len + sizeof l, data, len);
    w->pending_len = need;
    w->pending_records++;
    w->count++;
    w->bytes += len;
    if (w->pending_len >= SL_CACHEDB_CHUNK_BYTES || w->pending_records >= CHUNK_RECORDS)
        return flush(w, false, err, errlen);
    return 0;
}

static void writer_free(sl_cachedb_writer_t *w)
{
    sl_cachedb_t *db = w->db;
    if (w->slot >= 0) {
        pthread_mutex_lock(&db->mu);
        free(db->writing[w->slot]);
        db->writing[w->slot] = NULL;
        pthread_mutex_unlock(&db->mu);
    }
    free(w->pending);
    free(w);
}

int sl_cachedb_writer_finish(sl_cachedb_writer_t *w, char *err, size_t errlen)
{
    int rc = flush(w, true, err, errlen);
    if (rc < 0) {
        sl_cachedb_writer_abort(w);
        return rc;
    }
    writer_free(w);
    return 0;
}

void sl_cachedb_writer_abort(sl_cachedb_writer_t *w)
{
    if (!w)
        return;
    if (w->committed > 0) {
        MDB_txn *txn;
        if (mdb_txn_begin(w->db->env, NULL, 0, &txn) == 0) {
            if (delete_entry(w->db, txn, w->key) == 0)
                mdb_txn_commit(txn);
            else
                mdb_txn_abort(txn);
        }
    }
    writer_free(w);
}

/* ---- readers ---- */

int sl_cachedb_reader_open(sl_cachedb_t *db, const char *key, sl_cachedb_reader_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (strlen(key) > SL_CACHEDB_MAX_KEY)
        return sl_errf(err, errlen, SL_EINVAL, "cache %s: bad key \"%s\"", db->dir, key);
    sl_cachedb_reader_t *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->db = db;
    snprintf(r->key, sizeof r->key, "%s", key);
    struct marker m;
    int rc = mdb_txn_begin(db->env, NULL, MDB_RDONLY, &r->txn);
    if (rc == 0)
        rc = read_marker(db, r->txn, key, &m);
    if (rc != 0) {
        int code = rc == MDB_NOTFOUND ? 1 : lmdb_fail(db, rc, "cannot open an entry", err, errlen);
        sl_cachedb_reader_close(r);
        return code;
    }
    r->count = m.count;
    *out = r;
    return 0;
}

int sl_cachedb_reader_next(sl_cachedb_reader_t *r, const void **data, size_t *len, char *err, size_t errlen)
{
    if (r->next == r->count)
        return 1;
    /* A read transaction keeps the pages it sees alive: renew it now and
     * then so that writers can reuse freed pages. */
    if (++r->reads > READS_PER_TXN) {
        mdb_txn_reset(r->txn);
        int rc = mdb_txn_renew(r->txn);
        if (rc != 0)
            return lmdb_fail(r->db, rc, "cannot renew a transaction", err, errlen);
        r->reads = 1;
    }
    char k[SL_CACHEDB_MAX_KEY + 32];
    record_key(k, sizeof k, r->key, r->next);
    MDB_val mk = val_of(k, strlen(k)), mv;
    int rc = mdb_get(r->txn, r->db->dbi, &mk, &mv);
    if (rc == MDB_NOTFOUND)
        return sl_errf(err, errlen, SL_EDATA, "cache %s: entry %s lacks record %" PRIu64 " of %" PRIu64, r->db->dir,
                       r->key, r->next, r->count);
    if (rc != 0)
        return lmdb_fail(r->db, rc, "cannot read a record", err, errlen);
    r->next++;
    *data = mv.mv_data;
    *len = mv.mv_size;
    return 0;
}

void sl_cachedb_reader_close(sl_cachedb_reader_t *r)
{
    if (!r)
        return;
    if (r->txn)
        mdb_txn_abort(r->txn);
    free(r);
}
