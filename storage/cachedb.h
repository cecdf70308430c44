/*
 * cachedb.h: the worker's disk cache, one LMDB environment in its
 * --cache-dir that holds the elements cache ops wrote, under keys the
 * caller chooses (a hash of the dataset prefix and the sharding).
 *
 * An entry is a numbered list of records (opaque bytes) and a completion
 * marker, which is written in the same transaction as the last records:
 * an entry without its marker (a worker killed mid-epoch, a cache that
 * outgrew the map) is never read, and is removed when the worker opens the
 * cache again. Records are committed in chunks (at most
 * SL_CACHEDB_CHUNK_BYTES held in memory) so that a long epoch does not
 * hold LMDB's one write transaction.
 *
 * Only a cache this code wrote is trusted: the environment carries a format
 * number, and one with another number, or with data but no number (another
 * program's LMDB), is refused when opened. A lock file keeps a second
 * worker out of the same directory. LMDB codes never leave this module.
 */
#ifndef SL_CACHEDB_H
#define SL_CACHEDB_H

#include <stddef.h>
#include <stdint.h>

#define SL_CACHEDB_FORMAT 1u
#define SL_CACHEDB_MAX_KEY 64 /* longest key, without its NUL */
#define SL_CACHEDB_CHUNK_BYTES ((size_t)4 << 20)

typedef struct sl_cachedb sl_cachedb_t;
typedef struct sl_cachedb_writer sl_cachedb_writer_t;
typedef struct sl_cachedb_reader sl_cachedb_reader_t;

/**
 * Opens (creating it when missing) the cache in dir, a directory that
 * exists or whose parent does.
 * @param[in] map_bytes the most the cache may hold (LMDB map size)
 * @param[out] out the cache, closed by sl_cachedb_close()
 * @param[out] err why not, naming dir
 * @return 0; -EBUSY (another worker uses dir); SL_EDATA (not a cache of
 *         this format); -errno; -ENOMEM
 */
int sl_cachedb_open(const char *dir, size_t map_bytes, sl_cachedb_t **out, char *err, size_t errlen);

/** Closes the cache; every reader and writer must be closed first. NULL is ignored. */
void sl_cachedb_close(sl_cachedb_t *db);

/**
 * @param[out] count the records of the complete entry key
 * @return 0 when key has a complete entry, 1 when not, or an error (err says why)
 */
int sl_cachedb_lookup(sl_cachedb_t *db, const char *key, uint64_t *count, char *err, size_t errlen);

/**
 * Starts writing the entry key, replacing what an earlier writer left.
 * Thread-safe; one writer per key at a time.
 * @param[out] out the writer, ended by sl_cachedb_writer_finish() or _abort()
 * @return 0; -EBUSY (key is being written); SL_EINVAL (key too long); -ENOMEM
 */
int sl_cachedb_writer_begin(sl_cachedb_t *db, const char *key, sl_cachedb_writer_t **out, char *err, size_t errlen);

/**
 * Appends a record (len bytes at data, copied).
 * @return 0; -ENOSPC (the cache is full: the writer should be aborted);
 *         another error; err says why
 */
int sl_cachedb_writer_put(sl_cachedb_writer_t *w, const void *data, size_t len, char *err, size_t errlen);

/**
 * Writes what is left and the completion marker in one transaction, and
 * frees the writer (also on failure, when the partial entry is removed).
 * @return 0, -ENOSPC, another error; err says why
 */
int sl_cachedb_writer_finish(sl_cachedb_writer_t *w, char *err, size_t errlen);

/** Removes what the writer wrote and frees it; NULL is ignored. */
void sl_cachedb_writer_abort(sl_cachedb_writer_t *w);

/**
 * Opens the complete entry key for reading, in order.
 * @return 0; 1 (no complete entry); an error
 */
int sl_cachedb_reader_open(sl_cachedb_t *db, const char *key, sl_cachedb_reader_t **out, char *err, size_t errlen);

/**
 * The next record: *data valid until the next call or the reader's close.
 * @return 0; 1 after the last; SL_EDATA (a record is missing); an error
 */
int sl_cachedb_reader_next(sl_cachedb_reader_t *r, const void **data, size_t *len, char *err, size_t errlen);

/** NULL is ignored. */
void sl_cachedb_reader_close(sl_cachedb_reader_t *r);

#endif
