/*
 * tfrecord.h: reads TFRecord files, record by record, over sl_reader.
 *
 * A TFRecord file is a sequence of records, each
 *     uint64 length (little-endian)
 *     uint32 masked crc32c of the 8 length bytes
 *     length bytes of data
 *     uint32 masked crc32c of the data
 * optionally compressed as a whole with gzip (one or more members). Both
 * CRCs are checked on every record read. Offsets in messages are those of a
 * record's first byte in the uncompressed stream; record numbers start at 0
 * and count every record, skipped ones too, so that record k is the same
 * record for sl_tfrecord_count(), sl_tfrecord_skip_records() and
 * sl_tfrecord_next().
 *
 * Corrupt data: with SL_TFRECORD_FAIL (the default) a record whose data CRC
 * does not match, a length whose CRC does not match, and a file that ends
 * inside a record are errors (SL_EDATA). With SL_TFRECORD_SKIP a record
 * with a bad data CRC is skipped (its length, having a good CRC, says where
 * the next one starts) and counted; a bad length CRC or a truncated record
 * leaves nothing to go on, so it ends the file, counts as one skipped
 * record, and is logged as a warning. A length over max_record_bytes is an
 * error in both modes (SL_ETOOBIG), found before anything is allocated.
 */
#ifndef SL_TFRECORD_H
#define SL_TFRECORD_H

#include <stddef.h>
#include <stdint.h>

#include "reader.h"

typedef enum {
    SL_TFRECORD_NONE = 0,
    SL_TFRECORD_GZIP = 1,
} sl_tfrecord_compression_t;

typedef enum {
    SL_TFRECORD_FAIL = 0, /* a corrupt record is an error */
    SL_TFRECORD_SKIP = 1, /* a corrupt record is skipped and counted */
} sl_tfrecord_on_corrupt_t;

typedef struct {
    sl_reader_opts_t io;
    size_t max_record_bytes; /* default 64 MiB */
    sl_tfrecord_on_corrupt_t on_corrupt;
} sl_tfrecord_opts_t;

typedef struct sl_tfrecord sl_tfrecord_t;

/** Fills opts with the defaults. */
void sl_tfrecord_opts_init(sl_tfrecord_opts_t *opts);

/**
 * Parses the dataset spec's compression: "none" (or "") or "gzip".
 * @return 0, or SL_EINVAL
 */
int sl_tfrecord_compression_parse(const char *name, sl_tfrecord_compression_t *out);

/**
 * Opens a TFRecord file.
 * @param[in] opts NULL for the defaults
 * @param[out] out the reader, freed by sl_tfrecord_close()
 * @param[out] err a message naming the path on failure
 * @return 0; an error of sl_reader_open(); SL_EINVAL; -ENOMEM
 */
int sl_tfrecord_open(const char *path, sl_tfrecord_compression_t compression,
                     const sl_tfrecord_opts_t *opts, sl_tfrecord_t **out, char *err, size_t errlen);

/**
 * Reads the next record and checks both its CRCs.
 * @param[out] data the record's bytes, owned by t, valid until the next call
 *             on t; possibly unaligned
 * @param[out] len its length
 * @return 0 with a record; 1 at the end of the file; SL_EDATA (corrupt or
 *         truncated record, corrupt gzip stream), SL_ETOOBIG (length over
 *         max_record_bytes), -errno (a failed read) or -ENOMEM, with a
 *         message in sl_tfrecord_errmsg(). An error ends the file: every
 *         later call returns it again.
 */
int sl_tfrecord_next(sl_tfrecord_t *t, const uint8_t **data, size_t *len);

/**
 * Skips the next n records without checking their data CRCs (length CRCs
 * are checked), to start a split at a record. In an uncompressed file this
 * reads only the headers (with pread, in small windows) and then seeks the
 * stream once; a gzip file is inflated through. Skipped records are not
 * held to max_record_bytes: they are never allocated.
 * @return 0; 1 when the file ended first (sl_tfrecord_record_index() tells
 *         where); an error as sl_tfrecord_next() returns it
 */
int sl_tfrecord_skip_records(sl_tfrecord_t *t, uint64_t n);

/** @return the number of the record the next sl_tfrecord_next() returns */
uint64_t sl_tfrecord_record_index(const sl_tfrecord_t *t);

/** @return the records skipped as corrupt so far (SL_TFRECORD_SKIP) */
uint64_t sl_tfrecord_skipped(const sl_tfrecord_t *t);

/** @return the engine reading the file (SL_IO_URING or SL_IO_PREAD) */
sl_io_engine_t sl_tfrecord_engine(const sl_tfrecord_t *t);

/** @return the message of the last error, "" if none; valid until sl_tfrecord_close() */
const char *sl_tfrecord_errmsg(const sl_tfrecord_t *t);

/** Closes the file and frees t (NULL is a no-op). */
void sl_tfrecord_close(sl_tfrecord_t *t);

/**
 * Counts a file's records. An uncompressed file is walked header by header
 * (the headers are read with pread in small windows and the data is
 * seeked over), a gzip file is inflated through. Data CRCs are not
 * checked, length CRCs are; nothing is allocated from a length, so no
 * max_record_bytes applies.
 * @param[out] records the number of records; on SL_EDATA, the number of
 *             whole records before the defect
 * @param[out] err a message naming the file, the offset and the record
 * @return 0; SL_EDATA (bad length CRC, truncated record, corrupt or
 *         truncated gzip stream); an error of sl_tfrecord_open()
 */
int sl_tfrecord_count(const char *path, sl_tfrecord_compression_t compression, uint64_t *records,
                      char *err, size_t errlen);

/** A check between steps of a long operation: 0 to go on, or a negative
 *  code with err filled to stop it with that code. */
typedef int (*sl_tfrecord_check_fn)(void *arg, char *err, size_t errlen);

/**
 * sl_tfrecord_count() that calls check(arg, err, errlen) before every 4096
 * records and stops with its code when it returns one (a deadline, a
 * cancel); check NULL is sl_tfrecord_count(). *records is the records
 * counted before it stopped.
 */
int sl_tfrecord_count_checked(const char *path, sl_tfrecord_compression_t compression, sl_tfrecord_check_fn check,
                              void *arg, uint64_t *records, char *err, size_t errlen);

#endif
