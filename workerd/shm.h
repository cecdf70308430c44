/*
 * shm.h: batches to a client on the worker's own host through shared
 * memory instead of the TCP socket (docs/protocol.md, "Shared memory").
 *
 * A lane is the worker's side of it: an abstract Unix socket with a random
 * name (one per worker, in the worker's network namespace) where clients
 * collect their regions. A region is one client connection's: a memfd of
 * --shm-mb, sealed so that nobody can shrink or grow it, mapped by the
 * worker for writing and by the client for reading. The worker offers it
 * on the client's TCP connection (the lane's name and a ticket of 16
 * random bytes); the client connects to the lane, sends the ticket and
 * gets the memfd (SCM_RIGHTS). A ticket is good once, for its region.
 *
 * The worker copies a batch's payload into a slot of the region and sends
 * the slot's place in the answer instead of the bytes. A slot goes in the
 * lowest gap between those lent that holds it; slots are given back in the
 * order they were lent: the client says how many of the slots lent on the
 * connection it is done with (the first n), so one it still holds keeps
 * those lent after it from coming back. A payload that does not fit (no
 * gap holds it, SL_SHM_MAX_SLOTS are out, or the memory budget refuses its
 * pages) goes over the socket as before: nothing waits for shared memory.
 *
 * A batch's block can also be made in the region to begin with
 * (sl_shm_region_alloc(), from a pipeline thread): served to that
 * connection, the slot is the block itself (sl_shm_region_lend()), and
 * nothing is copied. The slot holds the batch until the client gives it
 * back; the block's range is in use until the batch is freed, wherever
 * that happens (sl__big_free() finds the region: big_alloc.h), and the
 * region lives until its last block is freed.
 *
 * The region's pages count against the worker's memory budget from their
 * first use to the region's end (tmpfs keeps a page once written).
 * Everything here runs on the worker's loop thread, except
 * sl_shm_region_alloc(), sl_shm_region_ref() and sl_shm_region_unref(),
 * and the freeing of blocks, which run on any.
 */
#ifndef SL_WORKERD_SHM_H
#define SL_WORKERD_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct event_base;
struct sl_membudget;

#define SL_SHM_TICKET_LEN 16
#define SL_SHM_MAX_SLOTS 64    /* slots lent and not given back, per region */
#define SL_SHM_MAX_BLOCKS 64   /* blocks made in a region and not freed */
#define SL_SHM_MAX_RANGES (SL_SHM_MAX_SLOTS + SL_SHM_MAX_BLOCKS)
#define SL_SHM_ALIGN 4096      /* every slot starts on a page */
#define SL_SHM_NAME_MAX 64     /* the lane's name, without the abstract socket's leading NUL */
#define SL_SHM_MAX_PENDING 16  /* lane connections waiting for their ticket */
#define SL_SHM_TICKET_MS 2000  /* a lane connection sends its ticket within this */
#define SL_SHM_MAX_WAITING 64  /* regions offered and not collected yet, per worker: each holds
                                  its memfd's descriptor until then */

typedef struct sl_shm_lane sl_shm_lane_t;
typedef struct sl_shm_region sl_shm_region_t;

/**
 * Listens on a new abstract Unix socket named "sluice-shm-" and 32 random
 * hex digits. Regions of region_bytes each (a multiple of SL_SHM_ALIGN
 * after rounding up) charge their pages to budget (NULL: none).
 * @return the lane, or NULL with a message in err
 */
sl_shm_lane_t *sl_shm_lane_new(struct event_base *base, size_t region_bytes, struct sl_membudget *budget, char *err,
                               size_t errlen);
void sl_shm_lane_free(sl_shm_lane_t *l);
/** The socket's abstract name, without its leading NUL. */
const char *sl_shm_lane_name(const sl_shm_lane_t *l);

/**
 * A new region, waiting for its client to collect it with its ticket. Its
 * memfd's descriptor is closed once collected (the mappings keep it).
 * @return the region, or NULL with a message in err (memfd_create, mmap,
 *         SL_SHM_MAX_WAITING regions waiting already)
 */
sl_shm_region_t *sl_shm_region_new(sl_shm_lane_t *l, char *err, size_t errlen);
/**
 * The connection lets the region go: the slots still lent are given back,
 * no block is made in it any more, and it is unmapped (a client's mapping
 * keeps its pages) once the last reference (sl_shm_region_ref(), a block)
 * goes too.
 */
void sl_shm_region_free(sl_shm_region_t *r);
/** Another reference (a task making its blocks there), from any thread. */
void sl_shm_region_ref(sl_shm_region_t *r);
/** Drops a reference of sl_shm_region_ref(); NULL is ignored. */
void sl_shm_region_unref(sl_shm_region_t *r);
const uint8_t *sl_shm_region_ticket(const sl_shm_region_t *r);
/** Whether its client collected the memfd. */
bool sl_shm_region_collected(const sl_shm_region_t *r);

/**
 * Copies the n parts into a new slot, lent to the client.
 * @return 0 with the slot's place in *off and its length (the parts'
 *         total) in *len; -ENOSPC when it does not fit now (see above)
 */
int sl_shm_region_put(sl_shm_region_t *r, const struct iovec *parts, int n, uint64_t *off, uint64_t *len);

/**
 * A block of size bytes in the region, from any thread: page-aligned,
 * freed with sl__big_free() (on any thread); it holds a reference to the
 * region. NULL when the connection let the region go, SL_SHM_MAX_BLOCKS
 * are out, no gap holds it, or the budget refuses its pages: the caller
 * allocates elsewhere.
 */
void *sl_shm_region_alloc(sl_shm_region_t *r, size_t size);
/** Whether p lies in the region. */
bool sl_shm_region_holds(const sl_shm_region_t *r, const void *p);
/** The bytes of the block of sl_shm_region_alloc() at p (its size rounded
 *  up to SL_SHM_ALIGN); 0 when no block starts at p. */
size_t sl_shm_region_block_room(sl_shm_region_t *r, const void *p);
/**
 * Lends the len bytes at p, in a block of sl_shm_region_alloc(), to the
 * client as a slot: no copy. hold keeps the block (a reference to its
 * batch) until the client gives the slot back or the connection lets the
 * region go, and then goes to unhold (on the loop thread).
 * @return 0 with the slot's place in *off; -ENOSPC when p is not in the
 *         region or SL_SHM_MAX_SLOTS are out
 */
int sl_shm_region_lend(sl_shm_region_t *r, const void *p, size_t len, void (*unhold)(void *hold), void *hold,
                       uint64_t *off);

/**
 * The client is done with the first n slots ever lent in this region.
 * @return 0; SL_EPROTO with a message in err when n is below what it said
 *         before or above the slots lent
 */
int sl_shm_region_released(sl_shm_region_t *r, uint64_t n, char *err, size_t errlen);

/** Slots lent and not given back, and the bytes they span. */
unsigned sl_shm_region_lent(const sl_shm_region_t *r);

#endif
