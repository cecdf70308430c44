/*
 * rounds.h: coordinated reads on a worker (docs/sharding.md). A task of a
 * job with num_consumers C serves in rounds: its open rounds take the
 * task's batches in round order, C each (round r the C after those of the
 * open rounds before it, even when a request for a later round finds
 * batches ready first), consumer i gets the i-th (or the one of them made
 * in its region of shared memory, sl_task_lent_to()), and the round is
 * forgotten once every consumer took its batch. Which rounds come to this
 * worker the consumers decide among themselves; the worker only keeps each
 * round's batches apart. At most SL_ROUNDS_OPEN rounds are open at once; a
 * request for another one waits until one completes, and the rounds waiting
 * open lowest first (at most SL_ROUNDS_WAITING of them are remembered; a
 * round asked for past those opens at a later try, once a place is free and
 * no remembered round waits).
 */
#ifndef SL_ROUNDS_H
#define SL_ROUNDS_H

#include <stdbool.h>
#include <stdint.h>

#include "task.h"

#define SL_ROUNDS_OPEN 16
#define SL_ROUNDS_WAITING 64
#define SL_ROUNDS_MAX_CONSUMERS SL_TASK_MAX_CONSUMERS

enum { SL_ROUNDS_TAKEN = SL_TASK_PENDING + 1 }; /* besides sl_task_take()'s codes */

typedef struct sl_rounds sl_rounds_t;

/** @return rounds for num_consumers (1 .. SL_ROUNDS_MAX_CONSUMERS) consumers, or NULL */
sl_rounds_t *sl_rounds_new(uint32_t num_consumers);

/** Frees the rounds and the batches they hold (not released to the task:
 *  call it only when the task is freed too). NULL is ignored. */
void sl_rounds_free(sl_rounds_t *r);

/**
 * Consumer's batch of round.
 * @param[out] out on SL_TASK_BATCH, the batch, owned by the caller, who
 *             hands it back with sl_task_release() as for sl_task_take()
 * @return SL_TASK_BATCH, SL_TASK_PENDING (the round's batches, or those of
 *         an open round before it, are not all made yet, or it waits for a
 *         place: SL_ROUNDS_OPEN rounds are open), SL_TASK_END (the
 *         pipeline ended before the round was full: no consumer gets it),
 *         the task's failure code, SL_ROUNDS_TAKEN with err (the
 *         consumer's batch of that round was taken already), or SL_EINVAL
 *         with err (consumer out of range)
 */
int sl_rounds_take(sl_rounds_t *r, sl_task_t *task, uint64_t round, uint32_t consumer, sl_wire_batch_t **out,
                   char *err, size_t errlen);

/** @return the batches the open rounds hold that wait for the task's next
 *  ones (a round's batches go out once all of them are made), not for a
 *  consumer */
unsigned sl_rounds_unfilled(const sl_rounds_t *r);

#define SL_ROUNDS_INFO_MISSING 32

/* What holds the rounds back, for the admin endpoint: the lowest open round
 * completes only once its batches are made and every consumer took its own. */
typedef struct sl_rounds_info {
    uint32_t consumers;
    unsigned open;         /* rounds open */
    unsigned waiting;      /* rounds asked for that wait for a place */
    bool any_open;
    uint64_t lowest;       /* the lowest open round (when any_open) */
    uint32_t lowest_made;  /* of its batches, those the pipeline made so far */
    uint32_t num_missing;  /* consumers that have not taken their batch of it */
    uint32_t missing[SL_ROUNDS_INFO_MISSING]; /* the first of those, by index */
} sl_rounds_info_t;

void sl_rounds_info(const sl_rounds_t *r, sl_rounds_info_t *out);

#endif
