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
 *
 * A stage's parallelism p is how many threads may run its elements at once:
 * the pipeline thread and at most p - 1 pool threads (pool_take() skips the
 * slots of a stage with p - 1 pool threads on it); its depth is how many
 * elements it keeps in flight. Without "autotune" they are the largest
 * num_parallel_calls and twice that. With "autotune" (any op of the run)
 * the stage measures the time of its ops per element (on every thread) and
 * the pipeline thread's time outside them (pulling the input, and the ops
 * after the stage between two of its yields), and every SL_AUTOTUNE_WINDOW
 * elements sl_autotune_decide() (autotune.h) sets p and the depth anew,
 * within min(--threads, the CPUs the worker may use).
 *
 * Map-and-batch fusion: when the iterator right above an ordered stage
 * without a filter takes its elements into rows of memory of its own (a
 * batch: sl_iter_t.dest), the stage asks it, as it pulls each element,
 * where that element will go, and runs the stage's ops with that row on
 * offer (sl__value_dest_offer()): the op that makes an image of exactly
 * the row's size writes it there (the first such one; ops after it may
 * change it in place), and the batch finds it in place instead of copying
 * it. A value left in the row that is not the row's component gets a
 * buffer of its own (rows_checked()). Such a consumer
 * detaches the stage (sl__parallel_detach()) before it frees its rows.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autotune.h"
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
    uint64_t work_ns;   /* autotune: the time its ops took */
    uint8_t *dest;      /* the row its consumer offered (stage comment), or NULL */
    size_t dest_size;
    uint32_t dest_c;
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
    sl_iter_t *consumer;  /* the iterator above that offers rows (stage comment), or NULL */
    /* Parallelism (pool mu): the pool threads running this stage's
     * elements, and at most how many may (par - 1). */
    unsigned pool_running;
    unsigned par, depth;  /* threads (the pipeline's included) and elements in flight now; depth <= cap */
    /* autotune: measured on the pipeline thread, decided every window */
    bool autotune;
    unsigned threads;     /* the configured bound: the pool's threads + 1 */
    uint64_t win_n, measured;
    double win_work, win_serial, work_ns, serial_ns; /* the window's sums; the smoothed means */
    uint64_t last_yield_ns; /* when next() last returned an element; 0: not yet */
    /* What sl_pipeline_parallel_stats() reads from any thread. */
    _Atomic unsigned st_par, st_depth, st_min, st_max, st_bound;
    _Atomic uint64_t st_decisions;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

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

/* After the ops ran with s's row on offer: only the component the row is
 * for may lie in it; any other value there gets a buffer of its own. */
static int rows_checked(struct slot *s)
{
    for (uint32_t c = 0; c < s->el->num_components; c++) {
        sl_value_t *v = &s->el->v[c];
        if (v->storage == SL_VALUE_ROW && (c != s->dest_c || v->u.ptr != s->dest) && sl__value_own(v) < 0)
            return sl__iter_fail(s->stage->ops[s->stage->nops - 1], -ENOMEM, "out of memory for %zu bytes",
                                 (size_t)v->size);
    }
    return 0;
}

static void run_slot(struct slot *s, int t)
{
    struct par_iter *pi = s->stage;
    s->err[0] = '\0';
    sl__iter_errbuf = s->err;
    int rc = 0;
    uint64_t t0 = pi->autotune ? now_ns() : 0;
    /* The row is on offer to every op of the stage: the op that makes
     * the image last is not always the last op (a resize runs the
     * normalize after it, whose own turn then does nothing). */
    if (s->dest)
        sl__value_dest_offer(s->dest, s->dest_size);
    for (int k = 0; k < pi->nops && rc == 0; k++) {
        sl_iter_t *op = pi->ops[k];
        rc = op->elem->apply(op, pi->locals[t * pi->nops + k], s->ordinal, s->el);
    }
    if (s->dest) {
        sl__value_dest_offer(NULL, 0);
        if (rc == 0)
            rc = rows_checked(s);
    }
    s->work_ns = pi->autotune ? now_ns() - t0 : 0;
    sl__iter_errbuf = NULL;
    if (rc < 0 && s->err[0] == '\0')
        snprintf(s->err, sizeof s->err, "%s: %s", pi->base.label, sl_strerror(rc));
    s->rc = rc;
}

/* Takes the oldest queued slot of a stage that has room for one more pool
 * thread (fewer than its parallelism - 1 on it) off the queue, or NULL;
 * under mu. */
static struct slot *pool_take(struct sl_pool *pool)
{
    struct slot **pp = &pool->head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->qnext) {
        struct slot *s = *pp;
        if (s->stage->pool_running + 1 >= s->stage->par)
            continue;
        *pp = s->qnext;
        if (pool->tail == s)
            pool->tail = prev;
        s->stage->pool_running++;
        return s;
    }
    return NULL;
}

static void *pool_main(void *arg)
{
    struct sl_pool *pool = arg;
    pthread_mutex_lock(&pool->mu);
    /* The threads array is complete once the creator lets go of mu. */
    int t = thread_index(pool);
    for (;;) {
        struct slot *s = NULL;
        while (!pool->stop && !(s = pool_take(pool)))
            pthread_cond_wait(&pool->work, &pool->mu);
        if (!s)
            break;
        s->state = SLOT_RUNNING;
        pthread_mutex_unlock(&pool->mu);
        run_slot(s, t);
        pthread_mutex_lock(&pool->mu);
        s->state = SLOT_DONE;
        s->stage->pool_running--;
        /* Room for a pool thread on that stage again: one that skipped its
         * queued slots may take them now. */
        if (pool->head)
            pthread_cond_signal(&pool->work);
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
        pthread_setname_np(pool->threads[i], "sl-parallel"); /* top -H, perf, gdb (docs/operations.md) */
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

/* Pulls input elements into free slots and queues them, up to depth. */
static void fill(struct par_iter *pi)
{
    struct sl_pool *pool = pi->pool;
    while (!pi->ended && pi->inflight < pi->depth) {
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
        uint64_t t0 = pi->autotune ? now_ns() : 0;
        int rc = src->vt->next(src, s->el);
        if (pi->autotune)
            pi->win_serial += (double)(now_ns() - t0);
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
        s->dest = NULL;
        if (pi->consumer && !pi->consumer->dest(pi->consumer, s->ordinal, &s->dest_c, &s->dest, &s->dest_size))
            s->dest = NULL;
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

static void publish(struct par_iter *pi, unsigned bound)
{
    atomic_store_explicit(&pi->st_par, pi->par, memory_order_relaxed);
    atomic_store_explicit(&pi->st_depth, pi->depth, memory_order_relaxed);
    atomic_store_explicit(&pi->st_bound, bound, memory_order_relaxed);
    if (pi->par < atomic_load_explicit(&pi->st_min, memory_order_relaxed))
        atomic_store_explicit(&pi->st_min, pi->par, memory_order_relaxed);
    if (pi->par > atomic_load_explicit(&pi->st_max, memory_order_relaxed))
        atomic_store_explicit(&pi->st_max, pi->par, memory_order_relaxed);
}

/* autotune: the element of slot s is yielded; every window, decide. On
 * the pipeline thread. */
static void autotune_count(struct par_iter *pi, const struct slot *s)
{
    pi->win_work += (double)s->work_ns;
    if (++pi->win_n < SL_AUTOTUNE_WINDOW)
        return;
    double w = pi->win_work / (double)pi->win_n, sr = pi->win_serial / (double)pi->win_n;
    /* Smoothed over windows: half the last mean, half this window's. */
    pi->work_ns = pi->measured ? (pi->work_ns + w) / 2 : w;
    pi->serial_ns = pi->measured ? (pi->serial_ns + sr) / 2 : sr;
    pi->measured += pi->win_n;
    pi->win_n = 0;
    pi->win_work = pi->win_serial = 0;
    sl_autotune_in_t in = {.threads = pi->threads, .cores = sl_autotune_cores(), .elements = pi->measured,
                           .work_ns = pi->work_ns, .serial_ns = pi->serial_ns};
    sl_autotune_out_t d = sl_autotune_decide(&in);
    if (d.depth > pi->cap)
        d.depth = pi->cap; /* cannot happen: cap is 2 x threads */
    struct sl_pool *pool = pi->pool;
    pthread_mutex_lock(&pool->mu);
    bool more = d.parallelism > pi->par;
    pi->par = d.parallelism;
    pi->depth = d.depth;
    if (more)
        pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    unsigned bound = sl_autotune_decide(&(sl_autotune_in_t){.threads = pi->threads, .cores = in.cores}).parallelism;
    publish(pi, bound);
    atomic_fetch_add_explicit(&pi->st_decisions, 1, memory_order_relaxed);
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
    if (pi->autotune && pi->last_yield_ns) {
        pi->win_serial += (double)(now_ns() - pi->last_yield_ns);
        pi->last_yield_ns = 0;
    }
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
        if (pi->autotune)
            autotune_count(pi, s);
        if (rc == 0) {
            if (pi->autotune)
                pi->last_yield_ns = now_ns();
            return 0;
        }
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
    pi->last_yield_ns = 0;
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

void sl__parallel_detach(sl_iter_t *stage)
{
    struct par_iter *pi = (struct par_iter *)stage;
    drain(pi);
    pi->consumer = NULL;
}

void sl__parallel_opts(sl_iter_t *it, const sl_spec_op_t *op, const sl_iter_ctx_t *ctx)
{
    if (!op->has_num_parallel_calls || !it->elem)
        return;
    unsigned threads = ctx->opts.threads ? ctx->opts.threads : DEFAULT_THREADS;
    it->autotune = op->num_parallel_calls == SL_SPEC_AUTOTUNE;
    it->par_calls = it->autotune ? (int64_t)threads : op->num_parallel_calls;
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
        pi->autotune |= run[k]->autotune;
    }
    pi->ordered = run[0]->deterministic;
    pi->pool = ctx->pool;
    pi->threads = (unsigned)pi->pool->n + 1;
    pi->cap = (unsigned)(2 * calls);
    pi->par = (unsigned)calls;
    unsigned bound = pi->par < pi->threads ? pi->par : pi->threads;
    if (pi->autotune) {
        /* Before the first measurement, as wide as the worker allows. */
        sl_autotune_in_t in = {.threads = pi->threads, .cores = sl_autotune_cores()};
        pi->par = bound = sl_autotune_decide(&in).parallelism;
    }
    pi->depth = 2 * pi->par;
    atomic_init(&pi->st_min, pi->par);
    atomic_init(&pi->st_max, pi->par);
    publish(pi, bound);
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
        if (ctx->num_par_stages < SL_SPEC_MAX_OPS)
            ctx->par_stages[ctx->num_par_stages++] = stage;
        if (above) {
            above->input = stage;
            /* Rows offered only where each element's place is known from
             * its ordinal: in order, none dropped. */
            struct par_iter *pi = (struct par_iter *)stage;
            if (above->dest && pi->ordered && !chain[i]->elem->drops) {
                pi->consumer = above;
                above->dest_stage = stage;
            }
        } else {
            *top = stage;
        }
        above = chain[j];
        i = j + 1;
    }
    return 0;
}

int sl__parallel_stats(const sl_iter_ctx_t *ctx, sl_pipeline_parallel_stats_t *out, int max)
{
    int n = 0;
    for (int i = 0; i < ctx->num_par_stages && n < max; i++, n++) {
        const struct par_iter *pi = (const struct par_iter *)ctx->par_stages[i];
        sl_pipeline_parallel_stats_t *o = &out[n];
        snprintf(o->label, sizeof o->label, "%s", pi->base.label);
        o->autotune = pi->autotune;
        o->parallelism = atomic_load_explicit(&pi->st_par, memory_order_relaxed);
        o->depth = atomic_load_explicit(&pi->st_depth, memory_order_relaxed);
        o->min_parallelism = atomic_load_explicit(&pi->st_min, memory_order_relaxed);
        o->max_parallelism = atomic_load_explicit(&pi->st_max, memory_order_relaxed);
        o->bound = atomic_load_explicit(&pi->st_bound, memory_order_relaxed);
        o->decisions = atomic_load_explicit(&pi->st_decisions, memory_order_relaxed);
    }
    return n;
}
