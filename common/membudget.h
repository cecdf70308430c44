/*
 * membudget.h: a memory budget shared by many owners (a worker's tasks:
 * sluice-workerd --max-memory-mb), and the accounts its owners charge.
 *
 * A budget is a limit and the bytes charged against it, updated atomically
 * from any thread. What holds memory that can grow large (a shuffle buffer,
 * a batch being built, a prefetch queue, a decoded image, a task's finished
 * batches) charges its bytes before it allocates them and releases them
 * when it frees them; a charge that would take the budget over its limit is
 * refused, and counted, and the owner fails with a message that says so
 * (sl_membudget_refusal()). Memory held only for reuse (freed batch blocks
 * kept for the next batch) is charged too, and given back (reclaim) before
 * a charge is refused, so that a cache never fails a pipeline.
 *
 * An account is one owner's side: single-threaded (or under its owner's
 * lock), it reserves from the budget in granules of SL_MEMACCT_GRANULE so
 * that charging an element at a time costs an addition, not an atomic
 * operation; a charge the granule would take over the limit is retried for
 * exactly what is needed. What an account reserves beyond what it holds is
 * at most two granules, given back as it shrinks.
 *
 * A share (sl_membudget_init_share()) is one owner's part of a budget (a
 * worker's task): every charge to it is a charge to its budget, and the
 * share counts what its owner holds, so that a refusal can say who holds
 * the budget (sl_membudget_refusal()) and an operator can see it.
 *
 * A NULL budget is no limit: accounts then only count what they hold.
 */
#ifndef SL_MEMBUDGET_H
#define SL_MEMBUDGET_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sl_metric;

#define SL_MEMACCT_GRANULE ((size_t)256 << 10)

typedef struct sl_membudget {
    size_t limit;                /* bytes all owners may hold together */
    size_t used;                 /* charged now (atomic) */
    uint64_t refusals;           /* charges refused (atomic) */
    const char *option;          /* how the limit is set, for messages ("--max-memory-mb") */
    struct sl_metric *m_charged; /* optional gauge of used, in bytes */
    struct sl_metric *m_refusals; /* optional counter of refusals */
    /* How long a charge that may wait (sl_membudget_charge_wait()) waits
     * in all for others to give memory back before it is refused: 0 (the
     * default) never. Set before the owners start. */
    unsigned wait_ms;
    uint64_t waits;              /* charges that waited (atomic) */
    struct sl_metric *m_waits;   /* optional counter of waits */
    unsigned waiters;            /* charges waiting now (atomic) */
    pthread_mutex_t wait_mu;     /* with wait_cv: a release wakes the waiters */
    pthread_cond_t wait_cv;
    /* Optional: gives back memory held only for reuse (kept batch blocks,
     * big_alloc.h), called once when a charge does not fit, before it is
     * refused. It must not charge this budget. */
    void (*reclaim)(void);
    /* A share: the budget its charges go to, and its owner for messages
     * ("task 7 of job 3"); used is the share's part of parent's. NULL for
     * a budget. */
    struct sl_membudget *parent;
    char label[48];
    /* A budget's shares, listed under shares_mu; a share's neighbours. */
    struct sl_membudget *shares, *next_share, *prev_share;
    pthread_mutex_t shares_mu;
} sl_membudget_t;

/** Makes b an empty budget of limit bytes; option names how it is set (kept, not copied). */
void sl_membudget_init(sl_membudget_t *b, size_t limit, const char *option);

/**
 * Makes s a share of parent (a budget, not a share) for the owner label
 * names: charges to s charge parent, and waits wait for parent's room.
 * Listed in parent's shares until sl_membudget_share_done().
 */
void sl_membudget_init_share(sl_membudget_t *s, sl_membudget_t *parent, const char *label);

/** Takes s off its budget's list. What s still holds, which its owner
 *  should have given back, is given back, and logged as an error. */
void sl_membudget_share_done(sl_membudget_t *s);

/**
 * bytes charged to s now belong to another owner of s's budget, which
 * gives them back to that budget (a batch its holder keeps until a client
 * acknowledges it: held.h): s no longer counts them. No-op on a budget.
 */
void sl_membudget_hand_over(sl_membudget_t *s, size_t bytes);

/**
 * Charges bytes against b, from any thread.
 * @return true; false when used + bytes would exceed the limit: nothing is
 *         charged and the refusal is counted. A NULL b always charges.
 */
bool sl_membudget_charge(sl_membudget_t *b, size_t bytes);

/**
 * Charges bytes against b for memory held only for reuse: like
 * sl_membudget_charge(), but a charge that does not fit is neither counted
 * as a refusal nor makes b reclaim. A NULL b always charges.
 */
bool sl_membudget_charge_spare(sl_membudget_t *b, size_t bytes);

/**
 * Charges bytes against b, reclaim included, for an owner that waits for
 * room on its own rather than fail (a task whose own batches go back as its
 * client reads them): like sl_membudget_charge(), but a charge that does
 * not fit is not counted as a refusal. A NULL b always charges.
 */
bool sl_membudget_try_charge(sl_membudget_t *b, size_t bytes);

/* What a charge that may wait looks at while it waits. */
typedef struct sl_memwait {
    /* Stop waiting, refused, once *cancel is true (read atomically;
     * sl_membudget_wake() makes every waiter look). NULL: never. */
    const bool *cancel;
    /* The wait of the thread this one's thread works for: its cancel flag,
     * and those up from it, end this wait too (a prefetch thread's wait,
     * whose cancel is the prefetch's stop, is up to the pipeline's, the
     * task's stop; one below another prefetch, up to that one's). NULL:
     * none. */
    const struct sl_memwait *up;
    /* Bytes the owner holds that come back as its consumer reads them (a
     * task's finished batches; read atomically): while not 0 the wait goes
     * on past wait_ms, as the owner's own backpressure. NULL: none. */
    const size_t *own;
    /* While *overdraw is true (read atomically), a charge that does not
     * fit is taken anyway, past the limit: the owner must make one more
     * batch that memory it holds waits for (a coordinated task's stand-in
     * batch, whose consumer the rounds' held batches wait for). NULL: never. */
    const bool *overdraw;
} sl_memwait_t;

/**
 * Charges bytes against b for an owner that may wait (a pipeline's thread,
 * never an event loop's): like sl_membudget_charge(), but a charge that
 * does not fit waits for releases, b->wait_ms in all, before it is refused.
 * Memory others hold for a while (a finished job's task before the worker
 * drops it, batches on their way to a client) then does not fail a task
 * that fits once they are gone. While w->own is not 0, the owner's own
 * memory fills the budget as much as anyone's, and the wait has no end:
 * a trainer that pauses with its task's buffer full then does not fail its
 * job. Stops waiting, refused, once *w->cancel, or the cancel flag of a
 * wait up from w, is true; charges past the limit while *w->overdraw is. w NULL: none of
 * them. A charge larger than the whole limit is refused at once (no wait
 * can make room for it). A NULL b always charges.
 */
bool sl_membudget_charge_wait(sl_membudget_t *b, size_t bytes, const sl_memwait_t *w);

/** Whether a wait with w is told to stop: its cancel flag or that of a wait up from it. */
bool sl_memwait_cancelled(const sl_memwait_t *w);

/** Whether a charge waits for room now. */
static inline bool sl_membudget_waiting(const sl_membudget_t *b)
{
    if (b && b->parent)
        b = b->parent;
    return b && __atomic_load_n(&b->waiters, __ATOMIC_SEQ_CST) > 0;
}

/** Makes every waiting charge look at its cancel flag again. NULL b is ignored. */
void sl_membudget_wake(sl_membudget_t *b);

/** Counts a wait an owner did on its own (sluice_worker_memory_waits_total). */
void sl_membudget_count_wait(sl_membudget_t *b);

/** Gives back bytes an earlier charge took. NULL b is ignored. */
void sl_membudget_release(sl_membudget_t *b, size_t bytes);

/** @return the bytes charged now (0 for NULL); of a share, its part */
size_t sl_membudget_used(const sl_membudget_t *b);

/**
 * Writes the message of a refused charge: "needs N bytes (X MiB) for WHAT,
 * but the worker's memory budget of L bytes (Y MiB) has F bytes left
 * (OPTION)", and when the budget has shares, who holds it: "; held now by
 * task 7 of job 3 29.1 MiB, this task 0.3 MiB, others 1.2 MiB" (the three
 * shares that hold most, b's named "this task"; "others": the rest, shares
 * and what no share counts).
 */
void sl_membudget_refusal(sl_membudget_t *b, size_t bytes, const char *what, char *buf, size_t buflen);

/**
 * The default limit: half of the memory this process may use (physical
 * memory, or its cgroup's memory.max when that is lower).
 */
size_t sl_membudget_default_limit(void);

/** One owner's charges against a budget. Zero-initialized, or sl_memacct_init(). */
typedef struct sl_memacct {
    sl_membudget_t *budget; /* NULL: no limit */
    size_t held;            /* what the owner charged and did not release */
    size_t reserved;        /* taken from the budget: >= held */
} sl_memacct_t;

static inline void sl_memacct_init(sl_memacct_t *a, sl_membudget_t *budget)
{
    a->budget = budget;
    a->held = a->reserved = 0;
}

/* How sl__memacct_reserve() takes what does not fit at once. */
typedef enum sl_memacct_how {
    SL_MEMACCT_NOW,  /* refused at once, the refusal counted */
    SL_MEMACCT_TRY,  /* refused at once, not counted: the owner waits next */
    SL_MEMACCT_WAIT, /* waits as sl_membudget_charge_wait() does */
} sl_memacct_how_t;

/* sl_memacct_charge()'s slow path: reserves from the budget. */
bool sl__memacct_reserve(sl_memacct_t *a, size_t bytes, sl_memacct_how_t how, const sl_memwait_t *w);

/**
 * Charges bytes to the account.
 * @return true; false when the budget cannot give them (nothing charged)
 */
static inline bool sl_memacct_charge(sl_memacct_t *a, size_t bytes)
{
    if (bytes <= a->reserved - a->held) {
        a->held += bytes;
        return true;
    }
    return sl__memacct_reserve(a, bytes, SL_MEMACCT_NOW, NULL);
}

/** sl_memacct_charge() that waits for the budget as sl_membudget_charge_wait() does. */
static inline bool sl_memacct_charge_wait(sl_memacct_t *a, size_t bytes, const sl_memwait_t *w)
{
    if (bytes <= a->reserved - a->held) {
        a->held += bytes;
        return true;
    }
    return sl__memacct_reserve(a, bytes, SL_MEMACCT_WAIT, w);
}

/**
 * sl_memacct_charge() whose refusal is not counted, for an owner that waits
 * for room next (with sl_membudget_charge_wait() outside the lock that
 * guards the account, then sl_memacct_adopt()).
 */
static inline bool sl_memacct_try_charge(sl_memacct_t *a, size_t bytes)
{
    if (bytes <= a->reserved - a->held) {
        a->held += bytes;
        return true;
    }
    return sl__memacct_reserve(a, bytes, SL_MEMACCT_TRY, NULL);
}

/**
 * Adds bytes the owner charged to a->budget itself (a wait for room taken
 * outside the lock that guards the account) to what the account holds.
 */
static inline void sl_memacct_adopt(sl_memacct_t *a, size_t bytes)
{
    a->held += bytes;
    a->reserved += bytes;
}

/** Releases bytes of what the account holds (at most what it holds). */
void sl_memacct_release(sl_memacct_t *a, size_t bytes);

/**
 * Gives back what the account reserves beyond what it holds, for a charge
 * that waits for room (sl_membudget_waiting()) while the account's owner
 * would otherwise keep it for its next charge.
 */
void sl_memacct_trim(sl_memacct_t *a);

/** Releases everything the account holds and reserves. */
void sl_memacct_release_all(sl_memacct_t *a);

#endif
