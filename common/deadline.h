/*
 * deadline.h: the absolute time ms milliseconds from now on a clock, as
 * pthread_cond_timedwait() takes it (on the clock its condition variable
 * was made with).
 */
#ifndef SL_DEADLINE_H
#define SL_DEADLINE_H

#include <time.h>

static inline struct timespec sl_deadline_after(clockid_t clock, unsigned long ms)
{
    struct timespec until;
    clock_gettime(clock, &until);
    until.tv_sec += (time_t)(ms / 1000);
    until.tv_nsec += (long)(ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    return until;
}

#endif
