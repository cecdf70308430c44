/*
 * reader.h: a sequential file reader for large streaming reads.
 *
 * Engine io_uring keeps `depth` reads of `block_size` bytes in flight ahead
 * of the consumer (4 x 256 KiB by default, small enough to stay in a core's
 * cache), each in its own buffer, so the kernel fills the next blocks while
 * the caller works on the current one.
 * Engine pread reads one block at a time with pread(2). SL_IO_AUTO takes
 * io_uring and falls back to pread when the kernel refuses to set up a ring
 * (old kernel, seccomp), with one warning per process.
 *
 * A reader belongs to one thread at a time: each has its own ring, so
 * readers in different threads never share one. A closed reader's ring,
 * drained, is kept with its buffers for the next reader opened of the
 * same depth and block size (at most 8 idle in the process, reader.c; a
 * forked child sets up its own): a source of many small files sets up a
 * ring once, not once a file. It holds depth * block_size bytes of
 * buffers (one block for pread).
 *
 * Two ways to consume: sl_reader_read() copies into the caller's buffer;
 * sl_reader_view() and sl_reader_consume() hand out the reader's own
 * buffers, with no copy.
 */
#ifndef SL_READER_H
#define SL_READER_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    SL_IO_AUTO = 0,  /* io_uring when the kernel allows it, else pread */
    SL_IO_URING = 1, /* io_uring or an error */
    SL_IO_PREAD = 2,
} sl_io_engine_t;

#define SL_IO_ENGINES 3

typedef struct {
    sl_io_engine_t engine; /* default SL_IO_AUTO */
    size_t block_size;     /* bytes per read; default 256 KiB, 4096 to 1 GiB */
    unsigned depth;        /* io_uring reads in flight; default 4, 1 to 64 */
} sl_reader_opts_t;

typedef struct sl_reader sl_reader_t;

/** Fills opts with the defaults. */
void sl_reader_opts_init(sl_reader_opts_t *opts);

/**
 * Parses "uring", "pread" or "auto".
 * @return 0, or SL_EINVAL for another name
 */
int sl_reader_engine_parse(const char *name, sl_io_engine_t *out);

/** @return "uring", "pread" or "auto", a static string */
const char *sl_reader_engine_name(sl_io_engine_t engine);

/**
 * Opens path. Reads start at the first view or read, from the offset of an
 * sl_reader_seek() made before it if any.
 * @param[in] opts NULL for the defaults; 0 in a field means its default
 * @param[out] out the reader, freed by sl_reader_close()
 * @param[out] err a message naming the path on failure
 * @return 0; -ENOENT, -EACCES, -EISDIR, ... from open; SL_EINVAL for an
 *         option out of range; an io_uring setup error (-ENOSYS, -EPERM,
 *         -ENOMEM) for SL_IO_URING
 */
int sl_reader_open(const char *path, const sl_reader_opts_t *opts, sl_reader_t **out, char *err,
                   size_t errlen);

/**
 * Copies the next bytes of the file into buf: fewer than n only at the end.
 * @param[out] buf n bytes, owned by the caller
 * @param[out] got the number of bytes copied; 0 with return 0 at the end
 * @return 0, or -errno from the read (-EIO, ...); after an error the reader
 *         returns it again on every call
 */
int sl_reader_read(sl_reader_t *r, void *buf, size_t n, size_t *got);

/**
 * Shows the next bytes of the file, in the reader's buffer, without
 * consuming them (at most one block; at least one byte before the end).
 * @param[out] data valid until the next call of sl_reader_view(),
 *             sl_reader_read(), sl_reader_seek() or sl_reader_close()
 *             (sl_reader_consume() keeps it valid)
 * @param[out] len the bytes at data; 0 at the end of the file
 * @return 0, or -errno from the read
 */
int sl_reader_view(sl_reader_t *r, const uint8_t **data, size_t *len);

/** Consumes n bytes of the last view; n must not exceed its length. */
void sl_reader_consume(sl_reader_t *r, size_t n);

/**
 * Moves to offset, which may lie past the end (reads then give EOF). Within
 * the blocks already read this costs nothing; elsewhere the reads in flight
 * are waited for and dropped and reading starts again at offset.
 * @return 0, or -errno from the reads waited for
 */
int sl_reader_seek(sl_reader_t *r, uint64_t offset);

/**
 * Reads n bytes at offset with pread(2), without touching the stream's
 * position or buffers (for walking headers).
 * @param[out] got fewer than n only at the end of the file
 * @return 0, or -errno
 */
int sl_reader_pread(sl_reader_t *r, void *buf, size_t n, uint64_t offset, size_t *got);

/** @return the file offset of the next byte the stream returns */
uint64_t sl_reader_offset(const sl_reader_t *r);

/** @return the file's size when it was opened */
uint64_t sl_reader_size(const sl_reader_t *r);

/** @return SL_IO_URING or SL_IO_PREAD: the engine in use (never AUTO) */
sl_io_engine_t sl_reader_engine(const sl_reader_t *r);

/** Waits for the reads in flight, closes the file and frees r (NULL is a no-op). */
void sl_reader_close(sl_reader_t *r);

/** @return the io_uring rings this process set up so far (readers reuse closed ones' rings) */
uint64_t sl_reader_rings_set_up(void);

/**
 * @return the bytes read from files by every reader of this process with
 *         engine (SL_IO_URING or SL_IO_PREAD; SL_IO_AUTO gives the sum),
 *         for metrics
 */
uint64_t sl_reader_bytes(sl_io_engine_t engine);

#endif
