/*
 * ops_prefetch.c: prefetch runs its input on a thread of its own, ahead of
 * the pipeline, into a bounded queue of buffer_size elements (or batches,
 * when it follows batch), as tf.data's prefetch does.
 *
 * The thread starts when the first element is asked for, and waits while
 * the queue is full: an interleave holds at most buffer_size finished
 * elements plus the one its input is making, so its memory is bounded by
 * buffer_size times the largest element (a batch is at most the worker's
 * --max-batch-mb). The end of the input and its failure travel through the
 * queue after the elements made before them, so the pipeline sees them in
 * order: every element made before an error is yielded first, then the
 * error with its own message.
 *
 * The iterators below a prefetch run on its thread, so they get a context
 * of their own (prefetch rebinds their ctx when it is built); what they
 * count (split requests, records skipped, files opened, cache overflows)
 * is published with each element and added to the pipeline's context on
 * the pipeline's thread. The DYNAMIC split source is thread-safe
 * (task.c), so splits may be asked for on the prefetch thread.
 *
 * reset() and destroy() stop the thread first (it finishes the element it
 * is making, then exits), drop what is queued, and then reset or free the
 * input on the calling thread: clean mid-stream.
 *
 * What the queued elements own is charged to the worker's memory budget
 * (opts.mem) as they enter the queue and released as they leave it. A
 * charge the budget has no room for waits as the pipeline's other charges
 * do (opts.mem_wait), without the queue's lock; a refused one ends the
 * queue with SL_ETOOBIG after the elements before it, as an error of the
 * input would. reset() and destroy() end the waits of the thread and of
 * the iterators below it (the prefetch's stop is their sl_memwait_t's
 * cancel flag), and of the threads of the prefetches below it (their
 * waits are up from this one's: this thread may wait on their queues).
 * The thread's charge that waits gives the account's spare reservation
 * back to the budget first (sl_memacct_trim()), and so does each element
 * taken while a charge waits: the thread's (flagged under the queue's
 * lock) or one below or beside it (counted by the budget).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iter.h"

struct counters {
    uint64_t requests, skipped, opened, overflows;
};

struct prefetch_iter {
    sl_iter_t base;
    sl_iter_ctx_t sub; /* the context of the iterators below */
    unsigned cap;
    sl_element_t **ring; /* cap elements */
    sl_element_t *tmp;   /* what the thread makes */
    pthread_t tid;
    bool running;
    /* Under mu. */
    pthread_mutex_t mu;
    pthread_cond_t not_full, not_empty;
    unsigned head, count;
    bool done; /* the thread has put the end or an error, final */
    int final;
    /* Also the cancel flag of the waits for memory of the thread and of the
     * iterators below it (sub.opts.mem_wait), which read it atomically
     * without mu: written atomically. */
    bool stop;
    bool charging; /* the thread waits for room without mu: takes trim */
    struct counters pub, folded;
    sl_memacct_t mem; /* what the queued elements own */
};

static const sl_iter_vtbl_t prefetch_vtbl;

static void publish(struct prefetch_iter *pf)
{
    pf->pub = (struct counters){pf->sub.split_requests, pf->sub.records_skipped, pf->sub.files_opened,
                                pf->sub.cache_overflows};
}

/* Adds what the iterators below counted since the last fold; under mu or
 * with the thread stopped. */
static void fold(struct prefetch_iter *pf)
{
    sl_iter_ctx_t *ctx = pf->base.ctx;
    ctx->split_requests += pf->pub.requests - pf->folded.requests;
    ctx->records_skipped += pf->pub.skipped - pf->folded.skipped;
    ctx->files_opened += pf->pub.opened - pf->folded.opened;
    ctx->cache_overflows += pf->pub.overflows - pf->folded.overflows;
    pf->folded = pf->pub;
}

/* Charges what the element the thread made owns as it enters the queue;
 * under mu. Memory the budget does not have at once is waited for as the
 * pipeline's other charges wait (opts.mem_wait: on while the task's own
 * batches fill the budget), without mu, so that the pipeline's thread
 * takes queued elements meanwhile; refused when the wait gives up or the
 * thread is stopped. */
static bool charge(struct prefetch_iter *pf, size_t bytes)
{
    if (sl_memacct_try_charge(&pf->mem, bytes))
        return true;
    /* The wait is for bytes from the budget: what the account reserves and
     * does not hold goes back first, and so does what each take frees while
     * the thread waits. Flagged under mu, before the thread counts as a
     * waiter: a take in between that saw no waiter kept its bytes reserved,
     * and the thread waited for ever beside them (an empty queue is taken
     * from no more). */
    pf->charging = true;
    sl_memacct_trim(&pf->mem);
    pthread_mutex_unlock(&pf->mu);
    bool ok = sl_membudget_charge_wait(pf->mem.budget, bytes, &pf->sub.opts.mem_wait);
    pthread_mutex_lock(&pf->mu);
    pf->charging = false;
    if (ok)
        sl_memacct_adopt(&pf->mem, bytes);
    return ok;
}

static void *producer_main(void *arg)
{
    struct prefetch_iter *pf = arg;
    sl_iter_t *input = pf->base.input;
    pthread_mutex_lock(&pf->mu);
    for (;;) {
        while (pf->count == pf->cap && !pf->stop)
            pthread_cond_wait(&pf->not_full, &pf->mu);
        if (pf->stop)
            break;
        pthread_mutex_unlock(&pf->mu);
        int rc = input->vt->next(input, pf->tmp);
        pthread_mutex_lock(&pf->mu);
        publish(pf);
        size_t bytes = rc == 0 ? sl_element_bytes(pf->tmp) : 0;
        if (rc == 0 && !charge(pf, bytes)) {
            sl__iter_drop(&pf->base, pf->tmp);
            if (pf->stop)
                break;
            char msg[512];
            if (sl_memwait_cancelled(&pf->sub.opts.mem_wait)) {
                /* A prefetch above stops while this thread waits: its
                 * thread, which waits on this queue, learns it and resets
                 * it next. */
                snprintf(msg, sizeof msg, "stopped while waiting for memory");
                rc = SL_ECANCELLED;
            } else {
                char what[96];
                snprintf(what, sizeof what, "element %u of a prefetch buffer (buffer_size %u)", pf->count + 1,
                         pf->cap);
                sl_membudget_refusal(pf->mem.budget, bytes, what, msg, sizeof msg);
                rc = SL_ETOOBIG;
            }
            if (pf->sub.errmsg[0] == '\0')
                snprintf(pf->sub.errmsg, sizeof pf->sub.errmsg, "%s: %s", pf->base.label, msg);
        }
        if (rc == 0) {
            sl_element_move(pf->ring[(pf->head + pf->count) % pf->cap], pf->tmp);
            pf->count++;
        } else {
            pf->final = rc;
            pf->done = true;
        }
        pthread_cond_broadcast(&pf->not_empty);
        if (pf->done)
            break;
    }
    pthread_mutex_unlock(&pf->mu);
    return NULL;
}

static void stop_thread(struct prefetch_iter *pf)
{
    if (!pf->running)
        return;
    pthread_mutex_lock(&pf->mu);
    __atomic_store_n(&pf->stop, true, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pf->not_full);
    pthread_mutex_unlock(&pf->mu);
    sl_membudget_wake(pf->mem.budget);
    pthread_join(pf->tid, NULL);
    pf->running = false;
    __atomic_store_n(&pf->stop, false, __ATOMIC_RELEASE);
}

static int prefetch_next(sl_iter_t *it, sl_element_t *out)
{
    struct prefetch_iter *pf = (struct prefetch_iter *)it;
    if (!pf->running && !pf->done) {
        int rc = pthread_create(&pf->tid, NULL, producer_main, pf);
        if (rc != 0)
            return sl__iter_fail(it, -rc, "cannot start the prefetch thread: %s", strerror(rc));
        pthread_setname_np(pf->tid, "sl-prefetch"); /* top -H, perf, gdb (docs/operations.md) */
        pf->running = true;
    }
    pthread_mutex_lock(&pf->mu);
    while (pf->count == 0 && !pf->done)
        pthread_cond_wait(&pf->not_empty, &pf->mu);
    fold(pf);
    int rc;
    if (pf->count > 0) {
        sl_memacct_release(&pf->mem, sl_element_bytes(pf->ring[pf->head]));
        /* A charge that waits for room (this queue's thread's, or one
         * below or beside it) gets what the queue no longer holds, not
         * only what it holds beyond its granules (membudget.h). */
        if (pf->charging || sl_membudget_waiting(pf->mem.budget))
            sl_memacct_trim(&pf->mem);
        sl_element_move(out, pf->ring[pf->head]);
        pf->head = (pf->head + 1) % pf->cap;
        pf->count--;
        pthread_cond_broadcast(&pf->not_full);
        rc = 0;
    } else {
        rc = pf->final;
        /* The thread wrote the message before it put the error. */
        if (rc < 0 && it->ctx->errmsg[0] == '\0') {
            if (pf->sub.errmsg[0])
                snprintf(it->ctx->errmsg, sizeof it->ctx->errmsg, "%s", pf->sub.errmsg);
            else
                sl__iter_fail(it, rc, "its input failed: %s", sl_strerror(rc));
        }
    }
    pthread_mutex_unlock(&pf->mu);
    return rc;
}

static void drop_queued(struct prefetch_iter *pf)
{
    for (; pf->count > 0; pf->count--, pf->head = (pf->head + 1) % pf->cap) {
        sl_memacct_release(&pf->mem, sl_element_bytes(pf->ring[pf->head]));
        sl__iter_drop(&pf->base, pf->ring[pf->head]);
    }
    pf->head = 0;
    sl_element_clear(pf->tmp);
}

static int prefetch_reset(sl_iter_t *it)
{
    struct prefetch_iter *pf = (struct prefetch_iter *)it;
    stop_thread(pf);
    drop_queued(pf);
    /* A message the stopped thread left (a wait for memory it gave up) is
     * no failure of what comes next; one it delivered is in ctx already. */
    pf->sub.errmsg[0] = '\0';
    pf->done = false;
    pf->final = 0;
    int rc = it->input->vt->reset(it->input);
    publish(pf);
    fold(pf);
    if (rc < 0 && it->ctx->errmsg[0] == '\0' && pf->sub.errmsg[0])
        snprintf(it->ctx->errmsg, sizeof it->ctx->errmsg, "%s", pf->sub.errmsg);
    return rc;
}

static void prefetch_destroy(sl_iter_t *it)
{
    struct prefetch_iter *pf = (struct prefetch_iter *)it;
    stop_thread(pf);
    /* The inputs are destroyed after this iterator and may still count
     * (a file source closing its file): they count in the pipeline's
     * context again. */
    for (sl_iter_t *x = it->input; x; x = x->input) {
        if (x->ctx == &pf->sub)
            x->ctx = it->ctx;
        if (x->vt == &prefetch_vtbl)
            break;
    }
    if (pf->ring) {
        for (unsigned i = 0; i < pf->cap; i++)
            sl_element_free(pf->ring[i]);
        free(pf->ring);
    }
    sl_element_free(pf->tmp);
    sl_memacct_release_all(&pf->mem);
    pthread_mutex_destroy(&pf->mu);
    pthread_cond_destroy(&pf->not_full);
    pthread_cond_destroy(&pf->not_empty);
    free(pf);
}

static const sl_iter_vtbl_t prefetch_vtbl = {prefetch_next, prefetch_reset, prefetch_destroy};

int sl__op_prefetch_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                           sl_iter_t **out)
{
    struct prefetch_iter *pf = calloc(1, sizeof *pf);
    if (!pf)
        return -ENOMEM;
    sl__iter_init(&pf->base, &prefetch_vtbl, input, ctx, label);
    pthread_mutex_init(&pf->mu, NULL);
    pthread_cond_init(&pf->not_full, NULL);
    pthread_cond_init(&pf->not_empty, NULL);
    pf->cap = (unsigned)op->u.prefetch.buffer_size;
    sl_memacct_init(&pf->mem, ctx->opts.mem);
    pf->ring = calloc(pf->cap, sizeof *pf->ring);
    pf->tmp = sl_element_new(input->spec.num_components);
    if (!pf->ring || !pf->tmp)
        goto nomem;
    for (unsigned i = 0; i < pf->cap; i++)
        if (!(pf->ring[i] = sl_element_new(input->spec.num_components)))
            goto nomem;
    /* The iterators below now run on the prefetch thread: they count in
     * sub. Below an inner prefetch they already have a context of its own. */
    pf->sub.opts = ctx->opts;
    pf->sub.opts.mem_wait.cancel = &pf->stop;
    pf->sub.opts.mem_wait.up = &ctx->opts.mem_wait;
    pf->sub.split_requests = ctx->split_requests;
    pf->sub.records_skipped = ctx->records_skipped;
    pf->sub.files_opened = ctx->files_opened;
    pf->sub.cache_overflows = ctx->cache_overflows;
    publish(pf);
    pf->folded = pf->pub;
    for (sl_iter_t *x = input; x; x = x->input) {
        x->ctx = &pf->sub;
        if (x->vt == &prefetch_vtbl) {
            /* This thread waits on that one's queue: stopping it must end
             * the waits for memory of that one's thread too (up from
             * this one's instead of the pipeline's, which this one's is
             * up to). */
            ((struct prefetch_iter *)x)->sub.opts.mem_wait.up = &pf->sub.opts.mem_wait;
            break;
        }
    }
    *out = &pf->base;
    return 0;
nomem:
    prefetch_destroy(&pf->base);
    return -ENOMEM;
}
