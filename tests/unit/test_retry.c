/*
 * test_retry.c: the iterator's backoff for a worker that does not have a
 * task (client/retry.c): one try per round of requests, however many of
 * the round's answers come; doubling to the most; a new count after the
 * worker served; a timer shared by several retries fires at the soonest.
 */
#include <criterion/criterion.h>

#include "retry.h"

Test(retry, the_answers_of_one_round_are_one_try)
{
    sl_retry_t r = {0};
    int64_t now = 1000;
    /* Four requests in flight, four answers at once: one wait of 5 ms. */
    cr_assert(sl__retry_note(&r, now, 5, 200));
    cr_assert_eq(r.not_before, now + 5);
    for (int i = 0; i < 3; i++)
        cr_assert_not(sl__retry_note(&r, now, 5, 200), "answer %d of the round", i + 2);
    cr_assert_eq(r.not_before, now + 5);
    /* Still the same round a moment later. */
    cr_assert_not(sl__retry_note(&r, now + 4, 5, 200));
    cr_assert_eq(r.since, now);
}

Test(retry, doubles_per_round_up_to_the_most)
{
    sl_retry_t r = {0};
    int64_t now = 50, want[] = {5, 10, 20, 40, 80, 160, 200, 200, 200};
    for (unsigned round = 0; round < sizeof want / sizeof want[0]; round++) {
        cr_assert(sl__retry_note(&r, now, 5, 200), "round %u", round);
        cr_assert_eq(r.not_before - now, want[round], "round %u waits %lld ms", round,
                     (long long)(r.not_before - now));
        for (int i = 0; i < 3; i++)
            cr_assert_not(sl__retry_note(&r, now + 1, 5, 200));
        now = r.not_before; /* the next round goes out when it may */
    }
    cr_assert_eq(r.since, 50, "the wait is counted from the first answer (the timeout)");
    cr_assert_eq(sl__retry_doubled(5, 200, 1000), 200, "no overflow for many tries");
}

Test(retry, counts_again_once_the_worker_served)
{
    sl_retry_t r = {0};
    for (int i = 0; i < 5; i++)
        cr_assert(sl__retry_note(&r, 100 + 1000 * i, 5, 200));
    r.since = 0; /* what the iterator does on a batch */
    cr_assert(sl__retry_note(&r, 9000, 5, 200));
    cr_assert_eq(r.not_before, 9005);
    cr_assert_eq(r.since, 9000);
}

Test(retry, a_shared_timer_fires_at_the_soonest_retry)
{
    /* Task A retries at 105, then task B asks for 140: still 105. */
    cr_assert_eq(sl__retry_timer_due(true, 105, 140, 100), 105);
    /* B asks for 102: sooner. */
    cr_assert_eq(sl__retry_timer_due(true, 105, 102, 100), 102);
    /* Not pending, or set for a time past: the new time. */
    cr_assert_eq(sl__retry_timer_due(false, 105, 140, 100), 140);
    cr_assert_eq(sl__retry_timer_due(true, 90, 140, 100), 140);
}
