/*
 * parallel.c: parallel stages of element-wise ops (num_parallel_calls),
 * and the pipeline's thread pool they share.
 *
 * Once a pipeline's chain is built, every run of adjacent element-wise ops
 * (those with an sl_iter_elem_t) that were given num_parallel_calls > 1 and
 * the same `deterministic` becomes one stage: a parallel iterator put above
 * the run's last op. It pulls elements from the run's input on the calling
 * (pipeline) thread, so a DYNAMIC split source is still only called there,
 * hands each element to the pool, where one thread applies every op of the
 * run to it in turn (an element crosses threads once), and yields finished
 * elements in input order, or as they finish when deterministic is false.
 * The ops of the run stay in the chain below the stage: reset and destroy
 * go through them as before; only their next() is no longer called.
 *
 * A filter (an op that may drop) ends a run, so within a stage every op
 * sees each element at the same ordinal as the stage's input, and a seeded
 * random op draws the same for any num_parallel_calls.
 *
 * Bounds: min(--threads, the largest num_parallel_calls) threads work per
 * pipeline: the pipeline thread, which runs queued elements itself rather
 * than wait, and a pool of one fewer; a stage keeps at most 2 * num_parallel_calls elements in
 * flight (pulled, not yet yielded). Errors are kept with their element and
 * surface when that element's turn comes, so the first failing element in
 * input order is the pipeline's error. Destroying or resetting a stage takes
 * its queued elements back and waits for the running ones.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iter.h"
#include "rng.h"

#define DEFAULT_THREADS 2

enum slot_state { SLOT_FREE = 0, SLOT_QUEUED, SLOT_RUNNING, SLOT_DONE };

struct par_iter;

struct slot {
    struct par_iter *stage;
    struct slot *qnext; /* in the pool's queue */
    sl_element_t *el;   /* room for SL_MAX_COMPONENTS values */
    int state;          /* enum slot_state, under the pool's mu */
    bool busy;          /* pulled and not yet yielded: the pipeline thread's alone */
    int rc;             /* what the ops made of it: 0, 1 dropped, < 0 failed */
    uint64_t ordinal;
    char err[SL_ITER_ERRBUF];
};

struct sl_pool {
    pthread_mutex_t mu;
    pthread_cond_t work;
    struct slot *head, *tail; /* queued slots, oldest first */
    bool stop;
    int n;
    pthread_t threads[];
};

struct par_iter {
    sl_iter_t base;       /* base.input: the run's last op */
    int nops;
    sl_iter_t *ops[SL_SPEC_MAX_OPS]; /* the run, first to last */
    struct sl_pool *pool;
    void **locals;        /* (pool->n + 1) * nops, thread t's local of op k at t * nops + k;
                             row pool->n is the pipeline thread's */
    unsigned cap;         /* in-flight bound */
    struct slot *slots;   /* cap */
    pthread_cond_t done;  /* a slot of this stage became DONE (pool mu) */
    uint64_t next_ordinal, head; /* pulled so far; the next to yield when deterministic */
    unsigned inflight;
    bool ended;           /* the input said end (end_rc 1) or failed (end_rc < 0) */
    int end_rc;
    char end_err[sizeof ((sl_iter_ctx_t *)0)->errmsg];
    int failed;           /* the error this stage returned, again on every call */
    bool ordered;         /* deterministic: yield in input order */
};

uint64_t sl__element_seed(uint64_t seed, uint64_t epoch, uint64_t ordinal)
{
    /* splitmix64 of the epoch seed and the ordinal: neighbouring ordinals
     * give unrelated seeds. */
    return sl_mix64(sl__epoch_seed(seed, epoch) ^ (ordinal * UINT64_C(0x9e3779b97f4a7c15)));
}

/* ---- the pool ---- */

static int thread_index(struct sl_pool *pool)
{
    pthread_t self = pthread_self();
    for (int i = 0; i < pool->n; i++) {
        if (pthread_equal(pool->threads[i], self))
            return i;
    }
    return 0;
}

static void run_slot(struct slot *s, int t)
{
    struct par_iter *pi = s->stage;
    s->err[0] = '\0';
    sl__iter_errbuf = s->err;
    int rc = 0;
    for (int k = 0; k < pi->nops && rc == 0; k++) {
        sl_iter_t *op = pi->ops[k];
        rc = op->elem->apply(op, pi->locals[t * pi->nops + k], s->ordinal, s->el);
    }
    sl__iter_errbuf = NULL;
    if (rc < 0 && s->err[0] == '\0')
        snprintf(s->err, sizeof s->err, "%s: %s", pi->base.label, sl_strerror(rc));
    s->rc = rc;
}

static void *pool_main(void *arg)
{
    struct sl_pool *pool = arg;
    pthread_mutex_lock(&pool->mu);
    /* The threads array is complete once the creator lets go of mu. */
    int t = thread_index(pool);
    for (;;) {
        while (!pool->stop && !pool->head)
            pthread_cond_wait(&pool->work, &pool->mu);
        if (!pool->head)
            break;
        struct slot *s = pool->head;
        pool->head = s->qnext;
        if (!pool->head)
            pool->tail = NULL;
        s->state = SLOT_RUNNING;
        pthread_mutex_unlock(&pool->mu);
        run_slot(s, t);
        pthread_mutex_lock(&pool->mu);
        s->state = SLOT_DONE;
        pthread_cond_broadcast(&s->stage->done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static int pool_create(sl_iter_ctx_t *ctx, int n)
{
    struct sl_pool *pool = calloc(1, sizeof *pool + (size_t)n * sizeof(pthread_t));
    if (!pool)
        return -ENOMEM;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work, NULL);
    ctx->pool = pool;
    pthread_mutex_lock(&pool->mu);
    for (int i = 0; i < n; i++) {
        int rc = pthread_create(&pool->threads[i], NULL, pool_main, pool);
        if (rc != 0) {
            pthread_mutex_unlock(&pool->mu);
            sl__parallel_pool_destroy(ctx);
            return sl__ctx_fail(ctx, -rc, "pipeline", "cannot start a pool thread: %s", strerror(rc));
        }
        pool->n = i + 1;
    }
    pthread_mutex_unlock(&pool->mu);
    return 0;
}

void sl__parallel_pool_destroy(sl_iter_ctx_t *ctx)
{
    struct sl_pool *pool = ctx->pool;
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = true;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->n; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->work);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
    ctx->pool = NULL;
}

/* ---- the stage ---- */

/* Takes the oldest queued slot of stage pi off the queue, or NULL; under mu. */
static struct slot *dequeue_own(struct sl_pool *pool, struct par_iter *pi)
{
    struct slot **pp = &pool->head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->qnext) {
        struct slot *s = *pp;
        if (s->stage != pi)
            continue;
        *pp = s->qnext;
        if (pool->tail == s)
            pool->tail = prev;
        return s;
    }
    return NULL;
}

/* Takes the stage's queued slots back and waits for its running ones;
 * then empties every slot. */
static void drain(struct par_iter *pi)
{
    struct sl_pool *pool = pi->pool;
    pthread_mutex_lock(&pool->mu);
    struct slot **pp = &pool->head, *last = NULL;
    while (*pp) {
        struct slot *s = *pp;
        if (s->stage == pi) {
            *pp = s->qnext;
            s->state = SLOT_DONE;
        } else {
            last = s;
            pp = &s->qnext;
        }
    }
    pool->tail = last;
    for (unsigned i = 0; i < pi->cap; i++) {
        while (pi->slots[i].state == SLOT_RUNNING || pi->slots[i].state == SLOT_QUEUED)
            pthread_cond_wait(&pi->done, &pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    for (unsigned i = 0; i < pi->cap; i++) {
        if (pi->slots[i].el)
            sl__iter_drop(&pi->base, pi->slots[i].el);
        pi->slots[i].state = SLOT_FREE;
        pi->slots[i].busy = false;
    }
    pi->inflight = 0;
}

/* Pulls input elements into free slots and queues them, up to cap. */
static void fill(struct par_iter *pi)
{
    struct sl_pool *pool = pi->pool;
    while (!pi->ended && pi->inflight < pi->cap) {
        struct slot *s = NULL;
        for (unsigned i = 0; i < pi->cap && !s; i++) {
            if (!pi->slots[i].busy)
                s = &pi->slots[i];
        }
        if (!s)
            return;
        /* The run's input, read through the first op's link on every
         * pull: the pipeline may put a timing stage there after the build. */
        sl_iter_t *src = pi->ops[0]->input;
        sl_element_init(s->el, src->spec.num_components);
        int rc = src->vt->next(src, s->el);
        if (rc != 0) {
            /* The input's end or failure comes after every element pulled
             * before it: keep its message until then. */
            pi->ended = true;
            pi->end_rc = rc;
            if (rc < 0) {
                snprintf(pi->end_err, sizeof pi->end_err, "%s", pi->base.ctx->errmsg);
                pi->base.ctx->errmsg[0] = '\0';
            }
            return;
        }
        s->ordinal = pi->next_ordinal++;
        s->busy = true;
        s->rc = 0;
        s->qnext = NULL;
        pthread_mutex_lock(&pool->mu);
        s->state = SLOT_QUEUED;
        if (pool->tail)
            pool->tail->qnext = s;
        else
            pool->head = s;
        pool->tail = s;
        pthread_cond_signal(&pool->work);
        pthread_mutex_unlock(&pool->mu);
        pi->inflight++;
    }
}

static int par_fail(struct par_iter *pi, int rc, const char *msg)
{
    sl_iter_ctx_t *ctx = pi->base.ctx;
    if (ctx->errmsg[0] == '\0' && msg[0])
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s", msg);
    pi->failed = rc;
    return rc;
}

static int par_next(sl_iter_t *it, sl_element_t *out)
{
    struct par_iter *pi = (struct par_iter *)it;
    struct sl_pool *pool = pi->pool;
    if (pi->failed)
        return pi->failed;
    for (;;) {
        fill(pi);
        struct slot *s = NULL;
        pthread_mutex_lock(&pool->mu);
        while (pi->inflight > 0) {
            for (unsigned i = 0; i < pi->cap; i++) {
                struct slot *c = &pi->slots[i];
                if (c->state != SLOT_DONE)
                    continue;
                if (pi->ordered ? c->ordinal == pi->head : (!s || c->ordinal < s->ordinal))
                    s = c;
                if (pi->ordered && s)
                    break;
            }
            if (s) {
                s->state = SLOT_FREE;
                break;
            }
            /* Rather than wait, the pipeline thread runs a queued element
             * of its own: min(--threads, num_parallel_calls) threads work,
             * it and the pool. */
            struct slot *q = dequeue_own(pool, pi);
            if (q) {
                q->state = SLOT_RUNNING;
                pthread_mutex_unlock(&pool->mu);
                run_slot(q, pool->n);
                pthread_mutex_lock(&pool->mu);
                q->state = SLOT_DONE;
                continue;
            }
            pthread_cond_wait(&pi->done, &pool->mu);
        }
        pthread_mutex_unlock(&pool->mu);
        if (!s) {
            /* Nothing in flight: fill() stopped at the input's end. */
            if (pi->end_rc < 0)
                return par_fail(pi, pi->end_rc, pi->end_err);
            return 1;
        }
        if (pi->ordered)
            pi->head++;
        pi->inflight--;
        int rc = s->rc;
        /* DONE: no pool thread touches the slot any more. */
        s->busy = false;
        if (rc < 0) {
            sl_element_clear(s->el);
            return par_fail(pi, rc, s->err);
        }
        if (rc == 0)
            sl_element_move(out, s->el);
        sl_element_clear(s->el);
        if (rc == 0)
            return 0;
        /* Dropped by a filter: on to the next. */
    }
}

static int par_reset(sl_iter_t *it)
{
    struct par_iter *pi = (struct par_iter *)it;
    drain(pi);
    pi->next_ordinal = pi->head = 0;
    pi->ended = false;
    pi->end_rc = 0;
    pi->end_err[0] = '\0';
    pi->failed = 0;
    return it->input->vt->reset(it->input);
}

static void par_destroy(sl_iter_t *it)
{
    struct par_iter *pi = (struct par_iter *)it;
    if (pi->slots) {
        drain(pi);
        for (unsigned i = 0; i < pi->cap; i++)
            sl_element_free(pi->slots[i].el);
        free(pi->slots);
    }
    if (pi->locals) {
        for (int t = 0; t <= pi->pool->n; t++) {
            for (int k = 0; k < pi->nops; k++) {
                sl_iter_t *op = pi->ops[k];
                if (op->elem->local_free && pi->locals[t * pi->nops + k])
                    op->elem->local_free(op, pi->locals[t * pi->nops + k]);
            }
        }
        free(pi->locals);
    }
    pthread_cond_destroy(&pi->done);
    free(pi);
}

static const sl_iter_vtbl_t par_vtbl = {par_next, par_reset, par_destroy};

void sl__parallel_opts(sl_iter_t *it, const sl_spec_op_t *op, const sl_iter_ctx_t *ctx)
{
    if (!op->has_num_parallel_calls || !it->elem)
        return;
    unsigned threads = ctx->opts.threads ? ctx->opts.threads : DEFAULT_THREADS;
    it->par_calls = op->num_parallel_calls == SL_SPEC_AUTOTUNE ? (int64_t)threads : op->num_parallel_calls;
    it->deterministic = !op->has_deterministic || op->deterministic;
}

/* Whether it can join a stage (1 runs in next(), on the pipeline's thread). */
static bool parallel(const sl_iter_t *it)
{
    return it->elem && it->par_calls > 1;
}

/* Makes the stage of run[0..n-1] (first to last) above run[n-1]. */
static int stage_create(sl_iter_ctx_t *ctx, sl_iter_t **run, int n, sl_iter_t **out)
{
    struct par_iter *pi = calloc(1, sizeof *pi);
    char label[48];
    int64_t calls = 0;
    if (!pi)
        return -ENOMEM;
    pthread_cond_init(&pi->done, NULL);
    /* "ops[3] (decode_jpeg)" .. "ops[5] (resize)" -> "ops[3..5] (parallel)" */
    const char *a = strchr(run[0]->label, '['), *b = strchr(run[n - 1]->label, '[');
    if (n > 1 && a && b)
        snprintf(label, sizeof label, "ops[%d..%d] (parallel)", atoi(a + 1), atoi(b + 1));
    else
        snprintf(label, sizeof label, "%s", run[0]->label);
    sl__iter_init(&pi->base, &par_vtbl, run[n - 1], ctx, label);
    pi->nops = n;
    for (int k = 0; k < n; k++) {
        pi->ops[k] = run[k];
        if (run[k]->par_calls > calls)
            calls = run[k]->par_calls;
    }
    pi->ordered = run[0]->deterministic;
    pi->pool = ctx->pool;
    pi->cap = (unsigned)(2 * calls);
    pi->slots = calloc(pi->cap, sizeof *pi->slots);
    pi->locals = calloc((size_t)(pi->pool->n + 1) * (size_t)n, sizeof *pi->locals);
    if (!pi->slots || !pi->locals)
        goto nomem;
    for (unsigned i = 0; i < pi->cap; i++) {
        pi->slots[i].stage = pi;
        if (!(pi->slots[i].el = sl_element_new(SL_MAX_COMPONENTS)))
            goto nomem;
    }
    for (int t = 0; t <= pi->pool->n; t++) {
        for (int k = 0; k < n; k++) {
            if (run[k]->elem->local_new && run[k]->elem->local_new(run[k], &pi->locals[t * n + k]) < 0)
                goto nomem;
        }
    }
    *out = &pi->base;
    return 0;
nomem:
    /* Not in the chain yet: destroy only the stage. */
    par_destroy(&pi->base);
    return -ENOMEM;
}

int sl__parallel_build(sl_iter_ctx_t *ctx, sl_iter_t **top)
{
    sl_iter_t *chain[SL_SPEC_MAX_OPS + 1];
    int m = 0;
    int64_t most = 0;
    for (sl_iter_t *it = *top; it && m < SL_SPEC_MAX_OPS + 1; it = it->input)
        chain[m++] = it;
    /* chain[0] is the top: walk it from the source up. */
    for (int i = 0; i < m; i++) {
        if (parallel(chain[i]) && chain[i]->par_calls > most)
            most = chain[i]->par_calls;
    }
    if (most == 0)
        return 0;
    unsigned threads = ctx->opts.threads ? ctx->opts.threads : DEFAULT_THREADS;
    /* The pipeline thread works too (par_next), so the pool has one fewer. */
    int rc = pool_create(ctx, (int)(most < (int64_t)threads ? most : (int64_t)threads) - 1);
    if (rc < 0)
        return rc;
    sl_iter_t *above = NULL; /* the iterator above chain[i], or NULL at the top */
    int i = 0;
    while (i < m) {
        if (!parallel(chain[i])) {
            above = chain[i++];
            continue;
        }
        /* chain[i] is the run's last op; extend the run downwards while the
         * op below joins it (a filter only ends a run, at its top). */
        int j = i;
        while (j + 1 < m && parallel(chain[j + 1]) && !chain[j + 1]->elem->drops &&
               chain[j + 1]->deterministic == chain[i]->deterministic)
            j++;
        sl_iter_t *run[SL_SPEC_MAX_OPS];
        int n = j - i + 1;
        for (int k = 0; k < n; k++)
            run[k] = chain[j - k];
        sl_iter_t *stage = NULL;
        rc = stage_create(ctx, run, n, &stage);
        if (rc < 0)
            return sl__ctx_fail(ctx, rc, "pipeline", "out of memory for a parallel stage");
        if (above)
            above->input = stage;
        else
            *top = stage;
        above = chain[j];
        i = j + 1;
    }
    return 0;
}
