/*
 * ops_basic.c: the ops that arrange elements without looking into them:
 * shuffle, take, skip, repeat and shard, with tf.data's semantics (batch
 * and padded_batch are in ops_batch.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "big_alloc.h"
#include "iter.h"
#include "rng.h"

/* ---- shuffle ----
 *
 * A buffer of up to buffer_size elements, filled from the input; each
 * output is a uniformly random buffered element, whose place is taken by
 * the last one, and the buffer is topped up before the next draw. The
 * buffer's slots grow by doubling, so a small dataset never pays for a
 * large buffer_size.
 *
 * Random numbers are xoshiro256** seeded through splitmix64. The seed of
 * epoch e (the e-th reset) is derived from (seed, e) when reshuffling, so
 * each epoch has its own order and every run with the same seed has the
 * same orders.
 *
 * Memory: the slots (charged as they grow, before they are allocated) and
 * what the buffered elements own (as each enters) are charged to the
 * worker's memory budget (opts.mem). A charge the budget refuses drops the
 * buffer, giving its memory back at once, and fails the pipeline.
 */

/* Draws made ahead of the shuffle's next outputs: their slots are
 * prefetched, since a slot drawn at random from a buffer of thousands is a
 * cache miss (three quarters of the shuffle's time without this). */
#define SHUFFLE_AHEAD 8

struct shuffle_iter {
    sl_iter_t base;
    uint64_t buffer_size;
    uint64_t seed;
    bool reshuffle;
    bool input_done;
    uint64_t epoch;
    sl_rng_t rng;
    uint8_t *slots; /* cap slots of stride bytes, the first n holding elements */
    size_t stride;
    uint64_t cap, n;
    sl_memacct_t mem; /* the slots and what the buffered elements own */
    /* The next draws made ahead, for a full buffer (see shuffle_next()):
     * ahead_n of them from ahead_head on, each with the generator's state
     * before it. While any are queued, rng is the state after the last. */
    struct {
        sl_rng_t before;
        uint64_t i;
    } ahead[SHUFFLE_AHEAD];
    unsigned ahead_head, ahead_n;
    uint64_t threshold; /* sl_rng_threshold(buffer_size): the draws ahead's */
};

static void shuffle_drop(struct shuffle_iter *s);

/* A charge was refused: gives the buffer back and fails with rc. */
static int shuffle_refused(struct shuffle_iter *s, int rc)
{
    shuffle_drop(s);
    free(s->slots);
    s->slots = NULL;
    s->cap = 0;
    sl_memacct_release_all(&s->mem);
    return rc;
}

static void shuffle_seed(struct shuffle_iter *s)
{
    s->ahead_n = 0;
    sl_rng_seed(&s->rng, s->reshuffle ? sl__epoch_seed(s->seed, s->epoch) : s->seed);
}

static sl_element_t *slot(struct shuffle_iter *s, uint64_t i)
{
    return (sl_element_t *)(s->slots + i * s->stride);
}

static int shuffle_next(sl_iter_t *it, sl_element_t *out)
{
    struct shuffle_iter *s = (struct shuffle_iter *)it;
    while (!s->input_done && s->n < s->buffer_size) {
        if (s->n == s->cap) {
            uint64_t cap = s->cap ? s->cap * 2 : 64;
            if (cap > s->buffer_size)
                cap = s->buffer_size;
            int rc = sl__iter_charge(it, &s->mem, (cap - s->cap) * s->stride,
                                     "a shuffle buffer of %" PRIu64 " elements (buffer_size %" PRIu64 ")", cap,
                                     s->buffer_size);
            if (rc < 0)
                return shuffle_refused(s, rc);
            /* A new block each time, from sl__big_alloc(): one of 4 MiB or
             * more gets huge pages, so that the random slot each output
             * reads misses the TLB less (realloc would keep 4 KiB pages).
             * The old one is freed, not kept: no batch is its size. */
            uint8_t *p = sl__big_alloc(cap * s->stride);
            if (!p)
                return sl__iter_fail(it, -ENOMEM, "out of memory for %" PRIu64 " buffered elements", cap);
            if (s->n > 0)
                memcpy(p, s->slots, s->n * s->stride);
            free(s->slots);
            s->slots = p;
            s->cap = cap;
        }
        sl_element_t *e = slot(s, s->n);
        sl_element_init(e, it->spec.num_components);
        int rc = it->input->vt->next(it->input, e);
        if (rc == 1)
            s->input_done = true;
        else if (rc < 0)
            return rc;
        else
            s->n++;
        size_t bytes = sl_element_bytes(e);
        if (bytes > 0) {
            rc = sl__iter_charge(it, &s->mem, bytes, "element %" PRIu64 " of a shuffle buffer (buffer_size %" PRIu64 ")",
                                 s->n, s->buffer_size);
            if (rc < 0) {
                sl__iter_drop(it, e);
                s->n--;
                return shuffle_refused(s, rc);
            }
        }
    }
    if (s->n == 0) {
        /* The input ended and the buffer is empty: its slots go now, not
         * when the pipeline is destroyed. A task's pipeline lives until its
         * job is collected, and under a tight --max-memory-mb the next job
         * on the worker needs the room. A reset grows them again. */
        free(s->slots);
        s->slots = NULL;
        s->cap = 0;
        sl_memacct_release_all(&s->mem);
        return 1;
    }
    /* The draw this output takes: the one made ahead for a full buffer,
     * or, when the buffer is not full (the input ended), a draw now from
     * the state before the first one made ahead. Either way the same
     * number from the same state: the order does not change. */
    uint64_t i;
    if (s->ahead_n > 0 && s->n == s->buffer_size) {
        i = s->ahead[s->ahead_head].i;
        s->ahead_head = (s->ahead_head + 1) % SHUFFLE_AHEAD;
        s->ahead_n--;
    } else {
        if (s->ahead_n > 0) {
            s->rng = s->ahead[s->ahead_head].before;
            s->ahead_n = 0;
        }
        i = sl_rng_below(&s->rng, s->n);
    }
    sl_memacct_release(&s->mem, sl_element_bytes(slot(s, i)));
    sl_element_move(out, slot(s, i));
    if (i != s->n - 1)
        sl_element_move(slot(s, i), slot(s, s->n - 1));
    s->n--;
    /* While the input lasts the buffer is full again at the next output:
     * draw ahead for it and start loading those slots. */
    if (!s->input_done && s->cap == s->buffer_size) {
        while (s->ahead_n < SHUFFLE_AHEAD) {
            unsigned k = (s->ahead_head + s->ahead_n) % SHUFFLE_AHEAD;
            s->ahead[k].before = s->rng;
            s->ahead[k].i = sl_rng_below_by(&s->rng, s->buffer_size, s->threshold);
            const uint8_t *p = (const uint8_t *)slot(s, s->ahead[k].i);
            for (size_t b = 0; b < s->stride; b += 64)
                __builtin_prefetch(p + b);
            s->ahead_n++;
        }
    }
    return 0;
}

static void shuffle_drop(struct shuffle_iter *s)
{
    for (uint64_t i = 0; i < s->n; i++) {
        sl_memacct_release(&s->mem, sl_element_bytes(slot(s, i)));
        sl__iter_drop(&s->base, slot(s, i));
    }
    s->n = 0;
}

static int shuffle_reset(sl_iter_t *it)
{
    struct shuffle_iter *s = (struct shuffle_iter *)it;
    shuffle_drop(s);
    s->input_done = false;
    s->epoch++;
    shuffle_seed(s);
    return it->input->vt->reset(it->input);
}

static void shuffle_destroy(sl_iter_t *it)
{
    struct shuffle_iter *s = (struct shuffle_iter *)it;
    shuffle_drop(s);
    free(s->slots);
    sl_memacct_release_all(&s->mem);
    free(s);
}

static const sl_iter_vtbl_t shuffle_vtbl = {shuffle_next, shuffle_reset, shuffle_destroy};

int sl__op_shuffle_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                          sl_iter_t **out)
{
    struct shuffle_iter *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    sl__iter_init(&s->base, &shuffle_vtbl, input, ctx, label);
    s->buffer_size = (uint64_t)op->u.shuffle.buffer_size;
    s->threshold = sl_rng_threshold(s->buffer_size); /* the spec's bounds: at least 1 */
    s->seed = op->u.shuffle.has_seed ? (uint64_t)op->u.shuffle.seed : sl__random_seed(s);
    s->reshuffle = op->u.shuffle.reshuffle_each_iteration;
    s->stride = sl_element_size(input->spec.num_components);
    sl_memacct_init(&s->mem, ctx->opts.mem);
    shuffle_seed(s);
    *out = &s->base;
    return 0;
}

/* ---- take, skip ----
 *
 * Both offer the bulk path when their input does, with their counts applied
 * to rows. pull() takes the next element (out set) or the next rows (out
 * NULL) from the input, so one function serves both paths.
 */

struct count_iter {
    sl_iter_t base;
    int64_t count; /* -1: all */
    int64_t done;  /* elements taken or skipped in this iteration */
};

/* Takes one element into out, or, when out is NULL, up to max_rows rows
 * into dst; *rows says how many (1 for an element). Returns what the
 * input's next or next_bulk returned. */
static inline int pull(sl_iter_t *input, sl_element_t *out, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    if (out) {
        int rc = input->vt->next(input, out);
        *rows = rc == 0;
        return rc;
    }
    return input->next_bulk(input, dst, max_rows, rows);
}

/* The rows left of count after done, or max when fewer or count is -1. */
static uint64_t count_left(const struct count_iter *t, uint64_t max)
{
    if (t->count < 0 || (uint64_t)(t->count - t->done) >= max)
        return max;
    return (uint64_t)(t->count - t->done);
}

static int take_pull(sl_iter_t *it, sl_element_t *out, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    struct count_iter *t = (struct count_iter *)it;
    *rows = 0;
    /* Stop without pulling: the input may be expensive or endless. */
    if (t->count >= 0 && t->done >= t->count)
        return 1;
    int rc = pull(it->input, out, dst, count_left(t, max_rows), rows);
    if (rc == 0)
        t->done += (int64_t)*rows;
    return rc;
}

static int skip_pull(sl_iter_t *it, sl_element_t *out, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    struct count_iter *s = (struct count_iter *)it;
    /* What is skipped goes through out, or through dst's rows, which the
     * bulk contract lets us use as scratch. */
    while (s->count < 0 || s->done < s->count) {
        int rc = pull(it->input, out, dst, count_left(s, max_rows), rows);
        if (rc != 0)
            return rc;
        if (out)
            sl__iter_drop(it, out);
        else
            sl__ctx_dropped(it->ctx, &it->ctx->bulk_prov, 1);
        s->done += (int64_t)*rows;
    }
    return pull(it->input, out, dst, max_rows, rows);
}

static int take_next(sl_iter_t *it, sl_element_t *out)
{
    uint64_t rows;
    return take_pull(it, out, NULL, 1, &rows);
}

static int take_next_bulk(sl_iter_t *it, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    return take_pull(it, NULL, dst, max_rows, rows);
}

static int skip_next(sl_iter_t *it, sl_element_t *out)
{
    uint64_t rows;
    return skip_pull(it, out, NULL, 1, &rows);
}

static int skip_next_bulk(sl_iter_t *it, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    *rows = 0;
    return skip_pull(it, NULL, dst, max_rows, rows);
}

static int count_reset(sl_iter_t *it)
{
    struct count_iter *t = (struct count_iter *)it;
    t->done = 0;
    return it->input->vt->reset(it->input);
}

static void count_destroy(sl_iter_t *it)
{
    free(it);
}

static const sl_iter_vtbl_t take_vtbl = {take_next, count_reset, count_destroy};
static const sl_iter_vtbl_t skip_vtbl = {skip_next, count_reset, count_destroy};

static int count_create(const sl_iter_vtbl_t *vt, sl_iter_bulk_fn bulk, int64_t count, sl_iter_t *input,
                        sl_iter_ctx_t *ctx, const char *label, sl_iter_t **out)
{
    struct count_iter *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    sl__iter_init(&t->base, vt, input, ctx, label);
    if (input->next_bulk)
        t->base.next_bulk = bulk;
    t->count = count;
    *out = &t->base;
    return 0;
}

int sl__op_take_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                       sl_iter_t **out)
{
    return count_create(&take_vtbl, take_next_bulk, op->u.take.count, input, ctx, label, out);
}

int sl__op_skip_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                       sl_iter_t **out)
{
    return count_create(&skip_vtbl, skip_next_bulk, op->u.skip.count, input, ctx, label, out);
}

/* ---- repeat ----
 *
 * Runs its input count times (forever for -1), resetting it in between.
 * An iteration that yields nothing ends the repeat early, since every
 * later one would be as empty and a forever repeat would spin; except
 * under DYNAMIC when the source asked the dispatcher for splits in it:
 * other workers may just have taken that epoch's splits, and the next
 * epoch may have some for this one; unless the dispatcher said no split of
 * any epoch will come (a drained task). (tf.data stops a forever repeat
 * only on an empty first iteration, and never with split providers.) But
 * not for ever: SL_REPEAT_EMPTY_MAX such iterations in a row fail the
 * pipeline, as its ops drop every element or its splits hold none (a skip
 * past the data, files without records), and it would otherwise take epoch
 * after epoch without end, each a hand-out of the dispatcher's.
 */

struct repeat_iter {
    sl_iter_t base;
    int64_t count;     /* -1: forever */
    int64_t iteration; /* 0-based */
    bool yielded;      /* this iteration yielded an element */
    bool done;
    uint64_t requests; /* ctx->split_requests when this iteration began */
    uint64_t empty;    /* iterations in a row that asked for splits and yielded nothing */
};

/* repeat_next and, when the input has it, the bulk path: out NULL pulls
 * rows into dst instead of an element into out. */
static int repeat_pull(sl_iter_t *it, sl_element_t *out, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    struct repeat_iter *r = (struct repeat_iter *)it;
    sl_iter_ctx_t *ctx = it->ctx;
    *rows = 0;
    for (;;) {
        if (r->done || (r->count >= 0 && r->iteration >= r->count)) {
            r->done = true;
            return 1;
        }
        int rc = pull(it->input, out, dst, max_rows, rows);
        if (rc == 0)
            r->yielded = true;
        if (rc != 1)
            return rc;

        bool asked = ctx->opts.sharding == SL_SHARDING_DYNAMIC && ctx->split_requests != r->requests &&
                     !(ctx->opts.splits.finished && ctx->opts.splits.finished(ctx->opts.splits.arg));
        r->iteration++;
        if ((!r->yielded && !asked) || (r->count >= 0 && r->iteration >= r->count)) {
            r->done = true;
            return 1;
        }
        r->empty = r->yielded ? 0 : r->empty + 1;
        if (r->empty >= SL_REPEAT_EMPTY_MAX)
            return sl__iter_fail(it, SL_EDATA,
                                 "%" PRIu64 " iterations in a row took splits and yielded nothing: the ops "
                                 "before it drop every element, or the data holds none (at iteration %" PRId64 ")",
                                 r->empty, r->iteration);
        rc = it->input->vt->reset(it->input);
        if (rc < 0)
            return rc;
        r->yielded = false;
        r->requests = ctx->split_requests;
    }
}

static int repeat_next(sl_iter_t *it, sl_element_t *out)
{
    uint64_t rows;
    return repeat_pull(it, out, NULL, 1, &rows);
}

static int repeat_next_bulk(sl_iter_t *it, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    return repeat_pull(it, NULL, dst, max_rows, rows);
}

static int repeat_reset(sl_iter_t *it)
{
    struct repeat_iter *r = (struct repeat_iter *)it;
    r->iteration = 0;
    r->yielded = false;
    r->done = false;
    r->empty = 0;
    int rc = it->input->vt->reset(it->input);
    r->requests = it->ctx->split_requests;
    return rc;
}

static void repeat_destroy(sl_iter_t *it)
{
    free(it);
}

static const sl_iter_vtbl_t repeat_vtbl = {repeat_next, repeat_reset, repeat_destroy};

int sl__op_repeat_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                         sl_iter_t **out)
{
    struct repeat_iter *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    sl__iter_init(&r->base, &repeat_vtbl, input, ctx, label);
    if (input->next_bulk)
        r->base.next_bulk = repeat_next_bulk;
    r->count = op->u.repeat.count;
    r->requests = ctx->split_requests;
    *out = &r->base;
    return 0;
}

/* ---- shard ----
 *
 * Keeps element k of each iteration when k % num_shards == index, as
 * tf.data's shard does; a reset starts counting again.
 */

struct shard_iter {
    sl_iter_t base;
    uint64_t num_shards, index;
    uint64_t k; /* elements of the input seen in this iteration */
};

static int shard_next(sl_iter_t *it, sl_element_t *out)
{
    struct shard_iter *s = (struct shard_iter *)it;
    for (;;) {
        int rc = it->input->vt->next(it->input, out);
        if (rc != 0)
            return rc;
        if (s->k++ % s->num_shards == s->index)
            return 0;
        sl__iter_drop(it, out);
    }
}

static int shard_reset(sl_iter_t *it)
{
    struct shard_iter *s = (struct shard_iter *)it;
    s->k = 0;
    return it->input->vt->reset(it->input);
}

static void shard_destroy(sl_iter_t *it)
{
    free(it);
}

static const sl_iter_vtbl_t shard_vtbl = {shard_next, shard_reset, shard_destroy};

int sl__op_shard_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                        sl_iter_t **out)
{
    uint64_t n = (uint64_t)op->u.shard.num_shards, index = (uint64_t)op->u.shard.index;
    /* "hint" is bound here to the worker's place among the job's workers
     * (HINT sharding); any other policy has nothing to bind it to. */
    if (op->u.shard.num_shards == SL_SPEC_SHARD_HINT) {
        if (ctx->opts.sharding != SL_SHARDING_HINT || ctx->opts.num_workers == 0 ||
            ctx->opts.worker_index >= ctx->opts.num_workers) {
            const char *name = sl_sharding_name(ctx->opts.sharding);
            return sl__ctx_fail(ctx, SL_EINVAL, label,
                                "num_shards \"hint\" is bound only by HINT sharding; this job's is %s",
                                name ? name : "(invalid)");
        }
        n = ctx->opts.num_workers;
        index = ctx->opts.worker_index;
    }
    struct shard_iter *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    sl__iter_init(&s->base, &shard_vtbl, input, ctx, label);
    s->num_shards = n;
    s->index = index;
    *out = &s->base;
    return 0;
}
