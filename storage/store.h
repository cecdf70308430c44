/*
 * store.h: the dispatcher's durable state, an LMDB environment in the
 * work dir (file state.mdb) holding named tables of opaque records.
 *
 * Opening refuses a store it must not touch, and writes nothing to it:
 *   -EACCES / -EROFS  the work dir is not writable (unless read_only)
 *   -ENOSPC           the file system has less than min_free_bytes free
 *   SL_EDATA          the file is not an LMDB environment, is truncated,
 *                     has no format record, or a table fails to read
 *   SL_EVERSION       it was written by a newer format version
 * (-EBUSY for a work dir another process uses comes from workdir.h's lock,
 * taken before.) Each refusal's message names the path and the reason.
 *
 * Writes go through one write transaction at a time; sl_store_commit()
 * returns once the change is on disk (LMDB's fsync), so a caller answers
 * its peers after the commit and a crash loses nothing it answered. One
 * transaction may carry many changes: that is the caller's group commit.
 * Called from one thread.
 */
#ifndef SL_STORE_H
#define SL_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The format this build writes and the newest it reads. */
#define SL_STORE_FORMAT 1
#define SL_STORE_MAX_TABLES 16
#define SL_STORE_FILE "state.mdb"

typedef struct sl_store sl_store_t;
typedef struct sl_store_txn sl_store_txn_t;

typedef struct sl_store_opts {
    size_t map_bytes;      /* the largest the store may grow (LMDB's map size); 0: 1 GiB */
    size_t min_free_bytes; /* free space the file system must have at open; 0: 16 MiB */
    const char *const *tables; /* the table names, created when missing */
    int num_tables;            /* 1 .. SL_STORE_MAX_TABLES */
    /* Reading only (--check-store): the store must exist; it is opened
     * read-only (LMDB's MDB_RDONLY), nothing is created or written, and
     * sl_store_begin() fails. A table it lacks reads as empty. On
     * read-only media LMDB reads without its lock file (nothing writes
     * there); elsewhere it needs to write the lock file, as readers beside
     * a writer do. No free space is asked for. */
    bool read_only;
} sl_store_opts_t;

/** Opens or creates dir/state.mdb; see the top of this file for the refusals. */
int sl_store_open(const char *dir, const sl_store_opts_t *opts, sl_store_t **out, char *err, size_t errlen);

/** @return whether the store was created by this open (no state to load) */
int sl_store_is_new(const sl_store_t *s);

/** Closes the store; an open transaction is aborted. NULL is ignored. */
void sl_store_close(sl_store_t *s);

/** Starts the write transaction (one at a time): 0, -ENOMEM, SL_EDATA. */
int sl_store_begin(sl_store_t *s, sl_store_txn_t **out);

/** Writes key -> val in table (its index in opts.tables), replacing what was there.
 *  @return 0; -ENOSPC (the store is full: the transaction must be aborted); SL_EINVAL */
int sl_store_put(sl_store_txn_t *t, int table, const void *key, size_t klen, const void *val, size_t vlen);

/** Deletes key from table; a missing key is not an error. */
int sl_store_del(sl_store_txn_t *t, int table, const void *key, size_t klen);

/** Deletes every key of table that starts with prefix (plen bytes, 1..511).
 *  @return 0 or an error code */
int sl_store_del_prefix(sl_store_txn_t *t, int table, const void *prefix, size_t plen);

/** Makes the transaction's changes durable and ends it.
 *  @return 0; -ENOSPC (full; nothing of it was written); -EIO; message in err */
int sl_store_commit(sl_store_txn_t *t, char *err, size_t errlen);

/** Drops the transaction's changes and ends it. NULL is ignored. */
void sl_store_abort(sl_store_txn_t *t);

/** Calls fn for every record of table in key order, stopping at the first
 *  non-zero return, which it returns. Values are valid during the call only. */
typedef int (*sl_store_visit_fn)(const void *key, size_t klen, const void *val, size_t vlen, void *arg);
int sl_store_foreach(sl_store_t *s, int table, sl_store_visit_fn fn, void *arg);

/** Counts what the store holds and the commits made since open. */
typedef struct sl_store_stats {
    uint64_t commits;
    uint64_t records; /* in every table */
    size_t map_bytes, used_bytes;
    size_t live_bytes; /* the pages the tables hold now: used_bytes is the file's high-water mark, and pages
                          freed below it are used again, so map_bytes - live_bytes is the room left */
} sl_store_stats_t;
void sl_store_stats(sl_store_t *s, sl_store_stats_t *out);

#endif
