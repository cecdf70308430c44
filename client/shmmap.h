/*
 * shmmap.h: a worker's shared-memory region as the client maps it
 * (docs/protocol.md, "Shared memory"; the worker's side is workerd/shm.h).
 *
 * The client collects the region's memfd from the lane the worker named,
 * with the ticket it was given, and maps it (writable: a batch's tensors
 * are the caller's to change in place until it releases the batch). Each
 * answer whose payload lies in the region lends the client a slot; a batch
 * built on it holds the slot, and the map, until it is released, from any
 * thread.
 * The worker gets slots back in the order it lent them: the client tells
 * it how many of the first ones it is done with (sl__shm_released()).
 */
#ifndef SL_CLIENT_SHMMAP_H
#define SL_CLIENT_SHMMAP_H

#include <stddef.h>
#include <stdint.h>

#define SL_SHM_CLIENT_MAX_SLOTS 64 /* the worker's SL_SHM_MAX_SLOTS: more held is a protocol error */
#define SL_SHM_COLLECT_MS 1000     /* the lane answers within this, or the client goes on over TCP */
#define SL_SHM_TICKET_BYTES 16     /* GetElementResponse.shm_ticket */
#define SL_SHM_TICKET_MAX 64       /* the longest ticket a collect sends */

struct event_base;
typedef struct sl_shm_map sl_shm_map_t;
typedef struct sl_shm_fetch sl_shm_fetch_t;

/** How a collection ended: the map (one reference) and rc 0, or NULL and
 *  rc < 0 with why (valid during the call). */
typedef void (*sl_shm_fetched_fn)(sl_shm_map_t *m, int rc, const char *why, void *arg);

/**
 * Collects a region from the lane at the abstract socket name with the
 * ticket (ticket_len bytes, at most SL_SHM_TICKET_MAX) and maps it, on the
 * loop of base, a step each time the socket is ready: the loop serves
 * everything else meanwhile. A region over max_bytes, or one its worker
 * could shrink (without F_SEAL_SHRINK), is refused; the lane has timeout_ms
 * for all of it. done is called once, from the loop, after which the fetch
 * is gone; never from this call.
 * @return 0 with the fetch in *out; < 0 with why in err (no lane of that
 *         name here: -ECONNREFUSED), and done is never called
 */
int sl__shm_fetch(struct event_base *base, const char *name, const uint8_t *ticket, size_t ticket_len, int timeout_ms,
                  size_t max_bytes, sl_shm_fetched_fn done, void *arg, sl_shm_fetch_t **out, char *err,
                  size_t errlen);

/** Stops a fetch whose done has not been called: it never is. NULL is ignored. */
void sl__shm_fetch_cancel(sl_shm_fetch_t *f);

/**
 * Takes the slot of an answer: [off, off + len) must lie in the region
 * and fewer than SL_SHM_CLIENT_MAX_SLOTS be held. The map gains a
 * reference, which sl__shm_slot_done() gives back.
 * @return the slot's bytes, with its number in *seq; NULL with why in err
 */
const uint8_t *sl__shm_slot(sl_shm_map_t *m, uint64_t off, uint64_t len, uint64_t *seq, char *err, size_t errlen);

/** The caller is done with slot seq (any thread). */
void sl__shm_slot_done(sl_shm_map_t *m, uint64_t seq);

/** How many slots, from the first, the client is done with (GetElementRequest.shm_released). */
uint64_t sl__shm_released(sl_shm_map_t *m);

/** Drops a reference: the region is unmapped with the last one. NULL is ignored. */
void sl__shm_unref(sl_shm_map_t *m);

#endif
