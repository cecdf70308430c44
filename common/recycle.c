/* recycle.c: see recycle.h. */
#include "recycle.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "poison.h"

void *sl_recycle_alloc(sl_recycler_t *r)
{
    void *p = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->n > 0)
        p = r->slot[--r->n];
    pthread_mutex_unlock(&r->mu);
    if (!p)
        return malloc(r->size);
    KEPT_UNPOISON(p, r->size);
    return p;
}

void sl_recycle_free(sl_recycler_t *r, void *p)
{
    if (!p)
        return;
#if defined(__SANITIZE_ADDRESS__)
    /* Kept already: a second give-back would hand the block to two owners. */
    if (__asan_address_is_poisoned(p)) {
        fprintf(stderr, "sl_recycle_free: block %p of %zu bytes given back twice\n", p, r->size);
        abort();
    }
#endif
    KEPT_POISON(p, r->size);
    pthread_mutex_lock(&r->mu);
    bool kept = r->n < SL_RECYCLE_SLOTS;
    if (kept)
        r->slot[r->n++] = p;
    pthread_mutex_unlock(&r->mu);
    if (!kept) {
        KEPT_UNPOISON(p, r->size);
        free(p);
    }
}

void sl_recycle_drain(sl_recycler_t *r)
{
    pthread_mutex_lock(&r->mu);
    while (r->n > 0) {
        void *p = r->slot[--r->n];
        KEPT_UNPOISON(p, r->size);
        free(p);
    }
    pthread_mutex_unlock(&r->mu);
}

unsigned sl_recycle_kept(sl_recycler_t *r)
{
    pthread_mutex_lock(&r->mu);
    unsigned n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* The stocks fork() locks and exit drains, registered from constructors
 * (before threads). */
static sl_recycler_t *stocks[SL_RECYCLE_STOCKS];
static unsigned stocks_n;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* No thread holds two stocks' mutexes at once, so taking them all in a
 * row cannot deadlock. */
static void fork_prepare(void)
{
    for (unsigned i = 0; i < stocks_n; i++)
        pthread_mutex_lock(&stocks[i]->mu);
}

static void fork_release(void)
{
    for (unsigned i = stocks_n; i-- > 0;)
        pthread_mutex_unlock(&stocks[i]->mu);
}

static void fork_register(void)
{
    (void)pthread_atfork(fork_prepare, fork_release, fork_release);
}

int sl_recycle_register(sl_recycler_t *r)
{
    pthread_once(&fork_once, fork_register);
    if (stocks_n >= SL_RECYCLE_STOCKS)
        return -1;
    stocks[stocks_n++] = r;
    return 0;
}

/* What the stocks keep goes at exit, so that none of it looks leaked. */
__attribute__((destructor)) static void stocks_at_exit(void)
{
    for (unsigned i = 0; i < stocks_n; i++)
        sl_recycle_drain(stocks[i]);
}
