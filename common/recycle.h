/*
 * recycle.h: a bounded stock of freed blocks of one size, for a struct of
 * a few KiB made and freed for every batch (a worker's wire batch,
 * sl_wire_batch_t, and served answer, sl_served_t; the client's batch,
 * struct sl_batch; about 6 KiB each). Such blocks are above glibc's
 * per-thread cache (1 KiB): each malloc and free went through the arena's
 * bins and its lock, and a wire batch is made on a pipeline's thread and
 * freed on the loop's (a client's batch on the iterator's and the
 * caller's), the arena's lock taken from both. A stock hands the last block
 * given back out again: a mutex and a slot.
 *
 * At most SL_RECYCLE_SLOTS blocks are kept in a stock (a task's buffer and
 * what is in flight reuse them; more go back to malloc). A stock defined
 * with SL_RECYCLER_DEFINE() is registered as the program loads: fork()
 * leaves it whole and unlocked in the child, and exit frees what it keeps
 * (sl_recycle_drain()). Under
 * AddressSanitizer a kept block is poisoned until it is handed out again,
 * so a use after sl_recycle_free() is still caught, and a block given back
 * twice aborts the process, naming it.
 */
#ifndef SL_RECYCLE_H
#define SL_RECYCLE_H

#include <pthread.h>
#include <stddef.h>

#define SL_RECYCLE_SLOTS 64

typedef struct sl_recycler {
    pthread_mutex_t mu;
    size_t size; /* every block's size */
    unsigned n;  /* blocks kept in slot[0..n) */
    void *slot[SL_RECYCLE_SLOTS];
} sl_recycler_t;

/* A stock of blocks of size bytes, for a static initializer. */
#define SL_RECYCLER_INIT(bytes) {PTHREAD_MUTEX_INITIALIZER, (bytes), 0, {0}}

/** A block of r->size bytes, not zeroed: one kept, else malloc's (NULL without memory). */
void *sl_recycle_alloc(sl_recycler_t *r);

/** Keeps p (a block of sl_recycle_alloc(r), or NULL: nothing) for the next sl_recycle_alloc(), or frees it. */
void sl_recycle_free(sl_recycler_t *r, void *p);

/** Frees every block kept. */
void sl_recycle_drain(sl_recycler_t *r);

/** @return how many blocks are kept now */
unsigned sl_recycle_kept(sl_recycler_t *r);

/* The most stocks sl_recycle_register() takes. */
#define SL_RECYCLE_STOCKS 8

/**
 * Registers r, which lives as long as the program (a static stock):
 * fork() takes r's mutex before it forks and lets it go after on both sides
 * (pthread_atfork()), so that a child forked while another thread held it (a
 * trainer that forks its data loaders while a thread streams) can use r; and
 * exit drains r. Called once per stock, as the program loads
 * (SL_RECYCLER_DEFINE()).
 * @return 0, or -1 when SL_RECYCLE_STOCKS stocks are registered already
 */
int sl_recycle_register(sl_recycler_t *r);

/* Defines the static stock name of blocks of bytes, registered as the
 * program loads (sl_recycle_register()). */
#define SL_RECYCLER_DEFINE(name, bytes)                                                                             \
    static sl_recycler_t name = SL_RECYCLER_INIT(bytes);                                                            \
    __attribute__((constructor)) static void name##_register(void)                                                   \
    {                                                                                                               \
        (void)sl_recycle_register(&name);                                                                           \
    }

#endif
