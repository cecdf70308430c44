/*
 * retry.h: when the iterator asks a worker again after it said that it does
 * not have a task (yet, or any more): from min_ms, doubling per round of
 * requests up to max_ms. A round is the requests sent before the first
 * answer came back (up to per_worker_outstanding): their answers are one
 * try, not one each, so that four answers at once do not make the first
 * wait 40 ms where 5 were meant.
 */
#ifndef SL_CLIENT_RETRY_H
#define SL_CLIENT_RETRY_H

#include <stdbool.h>
#include <stdint.h>

typedef struct sl_retry {
    int64_t since;      /* the first such answer (ms), 0: none since the worker last served */
    int64_t not_before; /* no request to the worker before this (ms) */
    unsigned tries;     /* rounds since `since` */
} sl_retry_t;

/** min_ms doubled tries times, at most max_ms. */
int64_t sl__retry_doubled(int64_t min_ms, int64_t max_ms, unsigned tries);

/** An answer "no such task" came at now (ms).
 *  @return true when it began a new round: not_before moved, and the
 *          caller's timer must fire by then; false for another answer of
 *          the round already waiting */
bool sl__retry_note(sl_retry_t *r, int64_t now, int64_t min_ms, int64_t max_ms);

/** When a timer shared by several retries should fire, asked to fire at
 *  `at` (ms): the sooner of `at` and the time it is set for (`due`, while
 *  `pending` and not past), so that one retry's later time does not put
 *  off another's. */
int64_t sl__retry_timer_due(bool pending, int64_t due, int64_t at, int64_t now);

#endif
