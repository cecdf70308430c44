/*
 * retry.c: the backoff of retry.h.
 */
#include "retry.h"

int64_t sl__retry_doubled(int64_t min_ms, int64_t max_ms, unsigned tries)
{
    int64_t ms = min_ms << (tries < 16 ? tries : 16);
    return ms < max_ms ? ms : max_ms;
}

bool sl__retry_note(sl_retry_t *r, int64_t now, int64_t min_ms, int64_t max_ms)
{
    if (!r->since) {
        r->since = now;
        r->tries = 0;
        r->not_before = 0;
    }
    /* Requests go out only from not_before on: an answer before it comes
     * from the round that set it. */
    if (now < r->not_before)
        return false;
    r->not_before = now + sl__retry_doubled(min_ms, max_ms, r->tries++);
    return true;
}

int64_t sl__retry_timer_due(bool pending, int64_t due, int64_t at, int64_t now)
{
    return pending && due > now && due < at ? due : at;
}
