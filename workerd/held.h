/*
 * held.h: batches served to a client and held until it says it received
 * them, so that an answer lost with a broken connection is sent again.
 *
 * A client numbers its GET_ELEMENT requests of one task 1, 2, 3 ...
 * (GetElementRequest.seq) and says, in each, below which seq it received
 * every answer (acked_below). The worker keeps each batch it served under a
 * seq (an sl_served_t, shared with the sends still writing it) until a
 * request of the same client acknowledges it. When a connection breaks with
 * answers in flight, the client asks again with the same seqs on a new
 * connection and gets the same batches: the records they carry were counted
 * as sent (their splits are confirmed by later batches), and would otherwise
 * be lost. A seq asked again that is no longer held (its client was silent
 * past the hold timeout, or memory was short) is refused with SL_ECLOSED and a
 * message that says so: loud, never silent (docs/fault-tolerance.md).
 *
 * A task taken away once finished (its job ended) leaves its holders with
 * its tombstone (workerd/worker.c), which answers a seq asked again as the
 * task did; the iterator acknowledges a task's last batches with one more
 * request when the task's end comes.
 *
 * Coordinated reads number a consumer's requests by round (seq = round + 1,
 * acked_below = one more than the round below which the consumer received
 * every round) and their answers may come in any order: a round asked
 * again is sent again if held (sl_holders_ask_round()), and otherwise
 * asked of the rounds, which know whether the consumer took its batch.
 *
 * Bounds: at most SL_HELD_MAX unacknowledged seqs per client and task
 * (SL_ELIMIT beyond, which a client that keeps at most
 * SL_HELD_MAX requests in flight never sees; SL_HELD_ROUNDS rounds for
 * coordinated reads, the client's window of rounds), at most SL_HOLDERS_MAX
 * clients per task, every held byte charged to the worker's memory budget,
 * and everything a client holds dropped after the hold timeout without a
 * request from it.
 */
#ifndef SL_WORKERD_HELD_H
#define SL_WORKERD_HELD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "membudget.h"
#include "sluice.pb.h"

#define SL_HELD_MAX 16      /* unacknowledged seqs per client of a task */
#define SL_HELD_ROUNDS 64   /* the same for coordinated reads: rounds asked ahead of the last one received */
#define SL_HOLDERS_MAX 1024 /* clients of a task holding batches */
/* Bytes of notices and tallies a served batch keeps in itself: the bound of
 * two tally rows (provwire.h); more are malloc'd. */
#define SL_SERVED_NOTICES_INLINE 136

/* One batch as served: its answer, tensor bytes and notices. Shared by the
 * holder and every send still writing it (refs). */
typedef struct sl_served {
    uint64_t task_id;
    uint64_t seq; /* 0: not held */
    sluice_GetElementResponse resp;
    sl_wire_batch_t *batch;
    uint8_t *notices; /* encoded split-done notices and tallies: notices_one or malloc'd (owned) */
    size_t notices_len;
    uint8_t notices_one[SL_SERVED_NOTICES_INLINE]; /* a batch's tallies of a split or two */
    unsigned refs;
    bool released; /* its size was given back to the task's buffer */
    /* DYNAMIC: the done_below of the task's batch served before this one:
     * this one holds no record of a split below it (sl_holders_received_below());
     * and one past the largest split id its task had received when it was
     * served (UINT64_MAX: not known): none of a split at or past it. */
    uint64_t floor, ceil;
    size_t charged; /* to the memory budget while held */
    size_t handed;  /* of charged, what its task had charged (sl_holders_keep()) */
} sl_served_t;

/** A new served batch with one reference (the caller's), or NULL. */
sl_served_t *sl_served_new(uint64_t task_id, sl_wire_batch_t *batch);

/** Drops one reference; the last frees the batch. */
void sl_served_unref(sl_served_t *s);

typedef struct sl_holders sl_holders_t;

/** The holders of one task's batches; budget may be NULL (no limit). */
sl_holders_t *sl_holders_new(sl_membudget_t *budget);
void sl_holders_free(sl_holders_t *h);

/**
 * Adds the bytes the holders charge to *own from now on, and takes them
 * off as they are dropped (atomically: the task's count of what is held
 * for its clients, sl_task_own_bytes()); NULL stops it (the task goes).
 */
void sl_holders_count_own(sl_holders_t *h, size_t *own);

enum { SL_HELD_NEW = 0, SL_HELD_AGAIN = 1 };

/**
 * A request of client_id with seq (> 0) and acked_below: drops what it
 * acknowledged and says whether to serve a new batch (SL_HELD_NEW) or send
 * *again once more (SL_HELD_AGAIN; the holder keeps its reference, take one
 * for the send).
 * @return SL_HELD_NEW, SL_HELD_AGAIN, or SL_ECLOSED / SL_ELIMIT with a message
 */
int sl_holders_ask(sl_holders_t *h, uint64_t client_id, uint64_t seq, uint64_t acked_below, int64_t now_ms,
                   sl_served_t **again, char *err, size_t errlen);

/**
 * sl_holders_ask() for coordinated reads: seq is the round + 1, and a seq
 * not held is SL_HELD_NEW whether or not a later one was served (answers
 * to rounds come in any order; the rounds refuse a batch asked twice).
 * @return SL_HELD_NEW, SL_HELD_AGAIN, or SL_ELIMIT / -ENOMEM with a message
 */
int sl_holders_ask_round(sl_holders_t *h, uint64_t client_id, uint64_t seq, uint64_t acked_below, int64_t now_ms,
                         sl_served_t **again, char *err, size_t errlen);

/**
 * A request of client_id with seq that waited while an earlier one with
 * the same seq (on a connection the client left, which the worker has not
 * seen close) was served: the batch that one got, if held (SL_HELD_AGAIN),
 * SL_ECLOSED with a message when served and no longer held, else
 * SL_HELD_NEW. Acknowledges nothing.
 */
int sl_holders_recall(sl_holders_t *h, uint64_t client_id, uint64_t seq, sl_served_t **again, char *err,
                      size_t errlen);

/** Lets go of what client_id's batches below seq acked_below (an ack-only
 *  request: GetElementRequest.ack_only). */
void sl_holders_ack(sl_holders_t *h, uint64_t client_id, uint64_t acked_below);
/** The batch held for client_id under seq, or NULL (no reference taken). */
sl_served_t *sl_holders_find(sl_holders_t *h, uint64_t client_id, uint64_t seq);

/** What became of a served batch (sl_holders_keep()). */
typedef enum {
    SL_HOLD_KEPT,
    SL_HOLD_NO_ROOM, /* wanted again on a break, but not kept */
    SL_HOLD_LEFT,    /* its client left: not wanted again */
} sl_hold_t;

/**
 * Keeps s, just served to client_id under seq, until acknowledged (takes a
 * reference). `charged`: bytes of s the budget already carries for it (its
 * task's charge of the batch), which the holder takes over (s->handed, at
 * most what s holds): the budget is charged only for the rest (its
 * notices), and the caller tells the task (sl_task_hand_over()). So a
 * batch served on a full budget is kept all the same. One the budget has
 * no room for at once, or past SL_HELD_ROUNDS, is not kept (no refusal of
 * the budget's counted: it was served): a request asking for it again is
 * refused. Nor is one served to a client that acknowledged everything
 * (acked_below UINT64_MAX: its iterator closed) after its waiting requests
 * were answered: it does not want them again.
 * @return SL_HOLD_KEPT, SL_HOLD_NO_ROOM (not kept though wanted) or SL_HOLD_LEFT
 */
sl_hold_t sl_holders_keep(sl_holders_t *h, uint64_t client_id, uint64_t seq, sl_served_t *s, size_t charged,
                          int64_t now_ms);

/** Drops what clients silent for more than timeout_ms hold. @return batches dropped */
unsigned sl_holders_sweep(sl_holders_t *h, int64_t now_ms, int64_t timeout_ms);

/** Whether no batch is held now. */
bool sl_holders_empty(const sl_holders_t *h);

/**
 * DYNAMIC: below which split id every record of the task's splits went out
 * in a batch its client acknowledged, given done_below, the task's now
 * (each of those splits' records went out in a batch served already):
 * done_below, or the least floor of a batch held unacknowledged, or the
 * least floor of a batch lost: one that went out unheld
 * (sl_holders_unheld(), or not kept by sl_holders_keep()) or was let go of
 * unacknowledged (a client silent past the hold timeout, a client that
 * left with batches held). Before 2026-12-05 a batch lost made it 0 for
 * the rest of the task. *past: what it would say without the batches lost,
 * which hold records of splits below *lost_below (the largest ceil of
 * them) alone: every split from *lost_below up to *past went out whole in
 * batches their clients acknowledged. *lost_below 0: none lost (*past is
 * what it returns).
 */
uint64_t sl_holders_received_below(const sl_holders_t *h, uint64_t done_below, uint64_t *lost_below, uint64_t *past);

/** A batch with records went out without a holder (its request had no seq). */
void sl_holders_unheld(sl_holders_t *h, const sl_served_t *s);

/** Batches and bytes held now. */
void sl_holders_count(const sl_holders_t *h, unsigned *batches, size_t *bytes);

#endif
