/*
 * sources.c: the iterators that start a pipeline.
 *
 * range: one int64 scalar per element (the file sources are in
 * sources_files.c). Under OFF it yields the whole range
 * every epoch; under DYNAMIC it yields, for its current epoch, the splits
 * next_split hands out (element indices [begin, end) of the range) until
 * the dispatcher says the epoch is over. Each reset moves it to the next
 * epoch, so epoch e is the e-th time the pipeline reads the source.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "iter.h"

struct range_iter {
    sl_iter_t base;
    int64_t start, step;
    uint64_t count;    /* elements of the range */
    uint64_t pos, end; /* next index to yield, end of the current split */
    uint64_t stop;     /* pos may run to here without meeting a skip run or the split's end */
    uint64_t epoch;
    bool dynamic;
    bool epoch_over; /* DYNAMIC: the dispatcher has no split left for epoch */
    /* DYNAMIC: the split being read, the records of it yielded so far, and
     * its next skip run. */
    bool have_split;
    sl_split_t split;
    uint64_t yielded;
    uint32_t skip_i;
};

/* DYNAMIC: the split being read is read; the split source hears it. */
static void range_split_done(struct range_iter *r)
{
    if (r->have_split) {
        r->have_split = false;
        sl__split_read(r->base.ctx, r->split.epoch, &r->split, r->yielded);
    }
}

/* Moves pos past a skip run that starts there; returns the most elements
 * that may follow from pos without meeting one. */
static uint64_t range_skip(struct range_iter *r)
{
    while (r->skip_i < r->split.num_skips) {
        const sl_skip_run_t *k = &r->split.skips[r->skip_i];
        if (r->pos < k->begin)
            return k->begin - r->pos;
        r->pos = k->begin + k->count;
        r->skip_i++;
    }
    return r->end - r->pos;
}

/* DYNAMIC: tells the split source the current split is read, then asks
 * for splits until one is not empty. 0: [pos, end) is the new split (its
 * skip runs still to be stepped over); 1: the epoch is over. */
static int range_next_split(struct range_iter *r)
{
    sl_iter_ctx_t *ctx = r->base.ctx;
    /* An empty source has no split to ask for; not asking also tells
     * repeat that another epoch would be just as empty. */
    range_split_done(r);
    if (r->epoch_over || r->count == 0) {
        r->epoch_over = true;
        return 1;
    }
    for (;;) {
        sl_split_t split = {.file_index = 0, .epoch = r->epoch};
        ctx->split_requests++;
        int rc = ctx->opts.splits.next_split(ctx->opts.splits.arg, r->epoch, &split);
        uint64_t begin = split.begin, end = split.end;
        if (rc == 1) {
            r->epoch_over = true;
            return 1;
        }
        if (rc < 0)
            return sl__iter_fail(&r->base, rc, "next_split for epoch %" PRIu64 " failed: %s", r->epoch,
                                 sl_strerror(rc));
        if (rc != 0)
            return sl__iter_fail(&r->base, SL_EINTERNAL, "next_split returned %d", rc);
        if (split.file_index != 0)
            return sl__iter_fail(&r->base, SL_EPROTO, "split of epoch %" PRIu64 " names file %" PRIu32
                                 "; a range has no files", r->epoch, split.file_index);
        if (begin > end || end > r->count)
            return sl__iter_fail(&r->base, SL_EPROTO,
                                 "split [%" PRIu64 ", %" PRIu64 ") of epoch %" PRIu64
                                 " is not inside the source's %" PRIu64 " elements",
                                 begin, end, r->epoch, r->count);
        int crc = sl__split_check_skips(&r->base, split.epoch, &split);
        if (crc < 0)
            return crc;
        r->split = split;
        r->yielded = 0;
        r->skip_i = 0;
        r->pos = begin;
        r->end = end;
        r->have_split = true;
        if (begin < end)
            return 0;
        range_split_done(r);
    }
}

/* DYNAMIC: after a yield that reached the end of what pos could run to,
 * steps over the skip runs that follow, and tells the split source the
 * split is read when nothing of it is left: now, not at the next call.
 * The batch holding the split's last record may then go out with the
 * split's done notice, rather than leave the notice for a later frame
 * that a client which has every record may never ask for. */
static void range_after_yield(struct range_iter *r)
{
    if (!r->dynamic || !r->have_split || r->pos != r->stop)
        return;
    uint64_t left = range_skip(r);
    r->stop = r->pos + left;
    if (left == 0)
        range_split_done(r);
}

/* Moves to the next element to yield, past skip runs and into the next
 * split when needed, once pos has reached stop; sets stop. 0: pos is it;
 * 1: the end of the sequence. Between stops every element is yielded as
 * it comes, under either policy. */
static int range_advance(struct range_iter *r)
{
    for (;;) {
        if (r->pos == r->end) {
            if (!r->dynamic)
                return 1;
            int rc = range_next_split(r);
            if (rc != 0)
                return rc;
        }
        uint64_t left = r->dynamic ? range_skip(r) : r->end - r->pos;
        if (left > 0) {
            r->stop = r->pos + left;
            return 0;
        }
    }
}

static int range_next(sl_iter_t *it, sl_element_t *out)
{
    struct range_iter *r = (struct range_iter *)it;
    if (r->pos == r->stop) {
        int rc = range_advance(r);
        if (rc != 0)
            return rc;
    }
    r->yielded++; /* read under DYNAMIC only */
    sl_prov_set(out, r->dynamic ? r->split.epoch : r->epoch, 0, r->pos);
    /* Every value lies between start and stop, so the sum is exact; it is
     * done in unsigned arithmetic only because the intermediate product
     * may wrap. */
    int64_t x = (int64_t)((uint64_t)r->start + r->pos * (uint64_t)r->step);
    r->pos++;
    range_after_yield(r);
    uint8_t *data = sl_value_alloc(&out->v[0], SL_DTYPE_INT64, 0, NULL, sizeof x);
    memcpy(data, &x, sizeof x); /* inline: never fails */
    out->num_elements = 1;
    return 0;
}

/* The bulk path (iter.h): one int64 per row, written in a tight loop. Like
 * range_next it asks for a split only when the current one is used up, so
 * a batch spanning splits sees the same split requests either way. */
static int range_next_bulk(sl_iter_t *it, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    struct range_iter *r = (struct range_iter *)it;
    *rows = 0;
    if (r->pos == r->stop) {
        int rc = range_advance(r);
        if (rc != 0)
            return rc;
    }
    uint64_t left = r->stop - r->pos;
    uint64_t n = left < max_rows ? left : max_rows;
    r->yielded += n;
    it->ctx->bulk_prov = (sl_provenance_run_t){(uint32_t)(r->dynamic ? r->split.epoch : r->epoch), 0, r->pos, n};
    uint64_t step = (uint64_t)r->step;
    uint64_t x = (uint64_t)r->start + r->pos * step; /* wraps as in range_next */
    uint8_t *d = dst[0];
    for (uint64_t i = 0; i < n; i++, x += step)
        memcpy(d + i * sizeof x, &x, sizeof x);
    r->pos += n;
    range_after_yield(r);
    *rows = n;
    return 0;
}

static int range_reset(sl_iter_t *it)
{
    struct range_iter *r = (struct range_iter *)it;
    range_split_done(r);
    r->epoch++;
    r->epoch_over = false;
    r->pos = 0;
    r->stop = 0;
    r->end = r->dynamic ? 0 : r->count;
    return 0;
}

static void range_destroy(sl_iter_t *it)
{
    free(it);
}

static const sl_iter_vtbl_t range_vtbl = {range_next, range_reset, range_destroy};

int sl__source_range_create(const sl_spec_t *spec, sl_iter_ctx_t *ctx, const char *label, sl_iter_t **out)
{
    const sl_spec_source_t *src = sl_spec_source(spec);
    struct range_iter *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    sl__iter_init(&r->base, &range_vtbl, NULL, ctx, label);
    r->base.next_bulk = range_next_bulk;
    r->base.spec.num_components = 1;
    memcpy(r->base.spec.c[0].name, src->name, SL_MAX_NAME);
    r->base.spec.c[0].dtype = SL_DTYPE_INT64;
    r->start = src->u.range.start;
    r->step = src->u.range.step;
    r->count = (uint64_t)sl_spec_source_cardinality(spec); /* exact for a range */
    r->dynamic = ctx->opts.sharding == SL_SHARDING_DYNAMIC;
    r->end = r->dynamic ? 0 : r->count;
    *out = &r->base;
    return 0;
}
