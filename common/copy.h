/*
 * copy.h: copying a large block to memory that the copying thread does not
 * read again: an element's rows into its batch's block (the batch goes to
 * the loop's thread, which sends it), a batch into a client's shared-memory
 * slot (the client reads it, in another process).
 *
 * memcpy() goes through the cache: each line written is first read from
 * memory (to own it), and the block pushes out what the thread is working
 * on (a JPEG decoder's tables and input). glibc streams past the cache only
 * above a threshold set from the shared cache's size, which virtual
 * machines report as the host's whole cache: 190 MB where this was
 * measured, so a 38.5 MB batch of images was copied through the cache.
 * sl_copy_far() streams (non-temporal stores) from SL_COPY_FAR_MIN bytes
 * up, and is memcpy() below that, on CPUs without SSE2, and under
 * AddressSanitizer (which sees memcpy's accesses but not the stores'
 * builtins). Measured by bench/jpeg_pipeline.py (docs/architecture.md).
 */
#ifndef SL_COPY_H
#define SL_COPY_H

#include <stddef.h>

/* A row of this many bytes or more is streamed: a 224 x 224 RGB image is
 * 147 KiB as uint8, 588 KiB as float32; a batch's 8 KiB column is not. */
#define SL_COPY_FAR_MIN ((size_t)64 << 10)

/** Copies n bytes from src to dst (which do not overlap), as memcpy()
 *  does; from SL_COPY_FAR_MIN bytes on past the cache. When it returns the
 *  bytes are visible to other threads as memcpy()'s are. */
void sl_copy_far(void *dst, const void *src, size_t n);

/** Copies n bytes from src to dst past the cache whatever n (a row of an
 *  image made in a small buffer that stays in the cache, into a batch's
 *  block): whole cache lines streamed, the part before dst's first line
 *  start and after its last through the cache. The streamed bytes are
 *  visible to other threads only after sl_copy_stream_done();
 *  sl_copy_far() is both. */
void sl_copy_stream(void *dst, const void *src, size_t n);
/** Orders the streamed stores before whatever this thread does next (a
 *  store fence). */
void sl_copy_stream_done(void);

void sl_copy_stream(void *dst, const void *src, size_t n);
void sl_copy_stream_done(void);

#endif
