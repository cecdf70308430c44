/*
 * gather.h: frames held for one system call. A connection that gathers
 * (sl_conn_set_gather(), conn.c) puts the frames sent in one pass of its
 * loop after the first here instead of writing each, and writes them
 * together at the end of the pass: a worker answering the requests one
 * read brought makes two sendmsg() for them, not one each (each costs the
 * kernel a whole trip through TCP and, on loopback, a wake-up of the
 * reader).
 *
 * The room is fixed: SL_GATHER_FRAMES frames, and SL_GATHER_BYTES of the
 * parts it copies (headers and messages); referenced parts (payloads) are
 * kept as pointers until their frame is written or handed on, and then
 * released through the frame's release function, once.
 */
#ifndef SL_GATHER_H
#define SL_GATHER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>

#define SL_GATHER_FRAMES 16
#define SL_GATHER_PARTS 5 /* a frame's parts at most: header, payload, pad, two tails */
#define SL_GATHER_IOV (SL_GATHER_FRAMES * SL_GATHER_PARTS)
#define SL_GATHER_BYTES 8192

/** One part of a frame: copied into the gather (copy) or referenced. */
typedef struct sl_gather_part {
    const void *p;
    size_t n;
    bool copy;
} sl_gather_part_t;

/** What a frame's release gets: the payload and length it was sent with. */
typedef void (*sl_gather_release_fn)(const void *payload, size_t len, void *extra);

/** A frame's release: fn (may be NULL) with its arguments. */
typedef struct sl_gather_release {
    sl_gather_release_fn fn;
    const void *payload;
    size_t payload_len;
    void *extra;
} sl_gather_release_t;

typedef struct sl_gather sl_gather_t;

/** @return an empty gather, or NULL without memory */
sl_gather_t *sl_gather_new(void);

/** Frees g, releasing every frame it holds (unwritten); NULL is ignored. */
void sl_gather_free(sl_gather_t *g);

/**
 * Adds a frame of n parts (empty parts are skipped) and its release.
 * @return 0, or -ENOSPC when g has no room for it (nothing was added: a
 *         caller writes what g holds first, then sends the frame alone)
 */
int sl_gather_add(sl_gather_t *g, const sl_gather_part_t *parts, int n, const sl_gather_release_t *release);

/** @return the frames g holds */
unsigned sl_gather_frames(const sl_gather_t *g);

/** @return the bytes of the frames g holds */
size_t sl_gather_bytes(const sl_gather_t *g);

/** @return the frames' bytes in order, as *iov (valid until g changes) and its length */
int sl_gather_iov(const sl_gather_t *g, const struct iovec **iov);

/**
 * What could not be written of one frame: its parts and the bytes of them
 * already written (skip). rest() queues them elsewhere (copying the copied
 * parts: g's room is reused once sl_gather_drain() returns) and takes over
 * the release (run by rest's queue, or by rest itself on failure). A
 * release rest() runs itself runs while g is still being drained: it must
 * not add to g (a worker's releases give memory back and send nothing).
 */
typedef void (*sl_gather_rest_fn)(void *arg, const sl_gather_part_t *parts, int n, size_t skip,
                                  const sl_gather_release_t *release);

/**
 * The first `written` bytes of the frames went out. Every frame not wholly
 * written goes, in order, to rest(); then g is empty; then the releases of
 * the frames that were written run, in order (a release may add frames to
 * g again).
 */
void sl_gather_drain(sl_gather_t *g, size_t written, sl_gather_rest_fn rest, void *arg);

#endif
